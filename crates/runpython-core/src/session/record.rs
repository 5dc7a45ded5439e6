//! A session at rest: every cell it ran, with its tool-call journal, so any engine sharing the store can
//! rebuild the session by replaying the cells in order (tool calls answered from the journals, so side
//! effects never fire twice). postcard behind a magic and a version byte.
//!
//! Each cell is kept once, as a part of its own (`Store::put_session_part`, written before the head
//! that counts it), and a small head at `v1/sessions/<id>`: a cell costs one part and one head,
//! whatever the session's length. Part version 2 holds the cell's whole request at rest
//! ([`RequestAtRest`]: files by artifact id, exact values, environment and secret names, allowed
//! hosts, timeout), how it ended and how long it ran; version 1 parts held only its code, inputs,
//! input artifacts and dependencies, and are still read (see [`CellRecord::legacy`]). Head version 3
//! adds the record's epoch (a snapshot names the epoch it belongs to, so one left by a session that
//! was reset is never loaded for the new one) and why the latest cells have no snapshot. Version 1
//! records (every cell in one object) and version 2 heads are still read; the next cell rewrites them.

use futures_util::{StreamExt as _, TryStreamExt as _};
use runpython_bridge::Journal;
use runpython_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::durable::at_rest::RequestAtRest;
use crate::error::Error;
use crate::protocol::request::RunRequest;

const MAGIC: &[u8; 4] = b"RPSS";
const VERSION_1: u8 = 1;
const VERSION_2: u8 = 2;
const VERSION_3: u8 = 3;
/// A part: one cell.
const PART_MAGIC: &[u8; 4] = b"RPSC";
const PART_VERSION_1: u8 = 1;
const PART_VERSION_2: u8 = 2;
/// Parts fetched at once when a session is loaded.
const PARTS_AT_ONCE: usize = 16;

/// One cell as it ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct CellRecord {
    /// What it was asked to run.
    pub request: RequestAtRest,
    /// The bridge's own versioned journal record.
    pub journal: Vec<u8>,
    /// The cell's run id (a suspended cell is resumed by it).
    pub run_id: String,
    /// The cell waits for decisions on these suspensions (it is the session's last cell).
    pub suspended: Vec<String>,
    /// How it ended: `None` when it succeeded, else its error's type (`ValueError`).
    pub failed: Option<String>,
    /// How long it ran, in milliseconds: about what replaying it costs.
    pub ms: u64,
    /// Written by an older runpython (part version 1): its request lacks what that version did not
    /// keep (files, exact values, environment and secret names, allowed hosts, timeout), and how it
    /// ended is unknown.
    #[serde(skip)]
    pub legacy: bool,
}

/// A cell as part version 1 (and the whole records of version 1) held it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct CellRecordV1 {
    code: String,
    inputs: String,
    input_artifacts: Vec<(String, String)>,
    dependencies: Vec<String>,
    journal: Vec<u8>,
    run_id: String,
    suspended: Vec<String>,
}

impl From<CellRecordV1> for CellRecord {
    fn from(v1: CellRecordV1) -> Self {
        Self {
            request: RequestAtRest::of_version_1(
                v1.code,
                v1.inputs,
                v1.input_artifacts,
                v1.dependencies,
            ),
            journal: v1.journal,
            run_id: v1.run_id,
            suspended: v1.suspended,
            failed: None,
            ms: 0,
            legacy: true,
        }
    }
}

/// How a cell ran, besides its request: what its record keeps.
#[derive(Debug)]
pub(crate) struct CellRun<'a> {
    pub journal: &'a Journal,
    pub run_id: &'a str,
    pub suspended: Vec<String>,
    pub failed: Option<String>,
    pub ms: u64,
}

impl CellRecord {
    /// `request` as a cell record: files given as bytes are stored in `store` as artifacts first.
    pub(crate) async fn new(
        store: &Store,
        request: &RunRequest,
        secrets: Vec<String>,
        ran: CellRun<'_>,
    ) -> Result<Self, Error> {
        Ok(Self {
            request: RequestAtRest::keep(store, request, secrets).await?,
            journal: ran.journal.encode()?,
            run_id: ran.run_id.to_owned(),
            suspended: ran.suspended,
            failed: ran.failed,
            ms: ran.ms,
            legacy: false,
        })
    }

    pub(crate) fn journal(&self) -> Result<Journal, Error> {
        Ok(Journal::decode(&self.journal)?)
    }

    /// For a cell an older runpython recorded: what it needed that its record lacks, when that shows
    /// (inputs in runpython's tagged JSON were exact values, which that version did not mark).
    pub(crate) fn lacks(&self) -> Option<&'static str> {
        let tagged = serde_json::from_str::<Value>(&self.request.inputs)
            .is_ok_and(|inputs| holds_tags(&inputs));
        (self.legacy && tagged).then_some(
            "its inputs are exact values (runpython's tagged JSON), which that version did not record",
        )
    }
}

/// Whether `value` holds an object tagged as one of runpython's exact values (`{"$rp": ...}`).
fn holds_tags(value: &Value) -> bool {
    match value {
        Value::Object(map) => map.contains_key("$rp") || map.values().any(holds_tags),
        Value::Array(items) => items.iter().any(holds_tags),
        _ => false,
    }
}

/// A session's record.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct SessionRecord {
    pub cells: Vec<CellRecord>,
    /// Requirement specs the session gathered (defaults, explicit, detected), in the order they came.
    pub dependencies: Vec<String>,
    /// Closed or reset: nothing to restore.
    pub closed: bool,
    /// Names this record among those the session id has had (each reset starts another): a snapshot
    /// is loaded only for the epoch it was taken in. Made at the first save.
    pub epoch: String,
    /// Why the latest cells have no snapshot (the last attempt's failure), when one failed.
    pub note: Option<String>,
    /// How many of `cells` are in the store as they are here (as parts): the next save writes the
    /// others only.
    pub saved: usize,
}

/// A version 1 record: every cell in one object.
#[derive(Serialize, Deserialize)]
enum Record {
    V1(SessionRecordV1),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct SessionRecordV1 {
    cells: Vec<CellRecordV1>,
    dependencies: Vec<String>,
    closed: bool,
}

/// A version 2 head: the cells are its parts `0..cells`.
#[derive(Debug, Serialize, Deserialize)]
struct HeadV2 {
    cells: u64,
    dependencies: Vec<String>,
    closed: bool,
}

/// A version 3 head: version 2's, the record's epoch and its note.
#[derive(Debug, Serialize, Deserialize)]
struct Head {
    cells: u64,
    dependencies: Vec<String>,
    closed: bool,
    epoch: String,
    note: Option<String>,
}

/// What `v1/sessions/<id>` holds.
#[derive(Debug)]
enum Stored {
    /// Version 1: every cell.
    Whole(SessionRecord),
    /// Versions 2 and 3: the head; the cells are parts.
    Head(Head),
}

#[derive(Serialize, Deserialize)]
enum Part {
    V1(CellRecordV1),
    V2(CellRecord),
}

impl SessionRecord {
    /// Drops the last cell (a suspended cell about to run again): its part is written anew.
    pub(crate) fn pop_cell(&mut self) -> Option<CellRecord> {
        let cell = self.cells.pop();
        self.saved = self.saved.min(self.cells.len());
        cell
    }

    fn encode_head(&self) -> Result<Vec<u8>, Error> {
        let head = Head {
            cells: self.cells.len() as u64,
            dependencies: self.dependencies.clone(),
            closed: self.closed,
            epoch: self.epoch.clone(),
            note: self.note.clone(),
        };
        versioned(MAGIC, VERSION_3, &head, "session record")
    }

    /// The record in `bytes`: whole (version 1), or a head whose cells are still to be read.
    fn decode(id: &str, bytes: &[u8]) -> Result<Stored, Error> {
        let bad = |why: String| Error::InvalidInput(format!("the record of session {id} {why}"));
        if bytes.len() < 5 || &bytes[..4] != MAGIC {
            return Err(bad("is not a runpython session record".into()));
        }
        match bytes[4] {
            VERSION_1 => match postcard::from_bytes(&bytes[5..]) {
                Ok(Record::V1(record)) => Ok(Stored::Whole(SessionRecord {
                    cells: record.cells.into_iter().map(CellRecord::from).collect(),
                    dependencies: record.dependencies,
                    closed: record.closed,
                    ..SessionRecord::default()
                })),
                Err(e) => Err(bad(format!("is corrupt ({e})"))),
            },
            VERSION_2 => match postcard::from_bytes::<HeadV2>(&bytes[5..]) {
                Ok(head) => Ok(Stored::Head(Head {
                    cells: head.cells,
                    dependencies: head.dependencies,
                    closed: head.closed,
                    epoch: String::new(),
                    note: None,
                })),
                Err(e) => Err(bad(format!("is corrupt ({e})"))),
            },
            VERSION_3 => match postcard::from_bytes::<Head>(&bytes[5..]) {
                Ok(head) => Ok(Stored::Head(head)),
                Err(e) => Err(bad(format!("is corrupt ({e})"))),
            },
            newer => Err(bad(format!(
                "has version {newer}, newer than this runpython understands; upgrade runpython"
            ))),
        }
    }

    fn decode_part(id: &str, n: u64, bytes: &[u8]) -> Result<CellRecord, Error> {
        let bad =
            |why: String| Error::InvalidInput(format!("cell {n} of session {id}'s record {why}"));
        if bytes.len() < 5 || &bytes[..4] != PART_MAGIC {
            return Err(bad("is not a runpython session cell".into()));
        }
        if bytes[4] != PART_VERSION_1 && bytes[4] != PART_VERSION_2 {
            return Err(bad(format!(
                "has version {}, newer than this runpython understands; upgrade runpython",
                bytes[4]
            )));
        }
        match postcard::from_bytes(&bytes[5..]) {
            Ok(Part::V1(cell)) => Ok(cell.into()),
            Ok(Part::V2(cell)) => Ok(cell),
            Err(e) => Err(bad(format!("is corrupt ({e})"))),
        }
    }

    /// The session's record in `store`, `None` when it has none.
    pub(crate) async fn load(store: &Store, id: &str) -> Result<Option<Self>, Error> {
        let Some(bytes) = store.get_session(id).await? else {
            return Ok(None);
        };
        let head = match Self::decode(id, &bytes)? {
            Stored::Whole(record) => return Ok(Some(record)), // version 1: no part saved yet
            Stored::Head(head) => head,
        };
        let cells: Vec<CellRecord> = futures_util::stream::iter(0..head.cells)
            .map(|n| async move {
                match store.get_session_part(id, n).await? {
                    Some(bytes) => Self::decode_part(id, n, &bytes),
                    None => Err(Error::InvalidInput(format!(
                        "the record of session {id} is missing its cell {n}: the store lost it"
                    ))),
                }
            })
            .buffered(PARTS_AT_ONCE)
            .try_collect()
            .await?;
        Ok(Some(Self {
            saved: cells.len(),
            cells,
            dependencies: head.dependencies,
            closed: head.closed,
            epoch: head.epoch,
            note: head.note,
        }))
    }

    /// Writes the cells not in the store yet, each as its part, then the head that counts them (a
    /// head never counts a part that is not written).
    pub(crate) async fn save(&mut self, store: &Store, id: &str) -> Result<(), Error> {
        if self.epoch.is_empty() {
            self.epoch = crate::session::new_session_id();
        }
        for n in self.saved..self.cells.len() {
            let part = versioned(
                PART_MAGIC,
                PART_VERSION_2,
                &Part::V2(self.cells[n].clone()),
                "session cell",
            )?;
            store.put_session_part(id, n as u64, part).await?;
            self.saved = n + 1;
        }
        store.put_session(id, self.encode_head()?).await?;
        Ok(())
    }
}

/// `value` in postcard behind `magic` and `version`.
fn versioned<T: Serialize>(
    magic: &[u8; 4],
    version: u8,
    value: &T,
    what: &str,
) -> Result<Vec<u8>, Error> {
    let mut out = magic.to_vec();
    out.push(version);
    out.extend(
        postcard::to_allocvec(value)
            .map_err(|e| Error::Internal(format!("cannot encode a {what}: {e}")))?,
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn cell(code: &str) -> CellRecord {
        CellRecord {
            request: RequestAtRest::of_version_1(code.into(), "{\"n\": 2}".into(), vec![], vec![]),
            journal: Journal::default().encode().unwrap(),
            run_id: "r1".into(),
            suspended: Vec::new(),
            failed: None,
            ms: 3,
            legacy: false,
        }
    }

    fn record(cells: &[&str]) -> SessionRecord {
        SessionRecord {
            cells: cells.iter().map(|c| cell(c)).collect(),
            dependencies: vec!["six".into()],
            ..SessionRecord::default()
        }
    }

    fn v1(cell: &CellRecord) -> CellRecordV1 {
        CellRecordV1 {
            code: cell.request.code.clone(),
            inputs: cell.request.inputs.clone(),
            input_artifacts: Vec::new(),
            dependencies: Vec::new(),
            journal: cell.journal.clone(),
            run_id: cell.run_id.clone(),
            suspended: Vec::new(),
        }
    }

    #[tokio::test]
    async fn each_cell_is_written_once_and_a_record_loads_back_whole() {
        let store = Store::open("memory://").unwrap();
        let mut r = record(&["a = 1", "b = 2"]);
        r.save(&store, "s").await.unwrap();
        assert_eq!(r.saved, 2);
        assert_eq!(r.epoch.len(), 32, "the first save makes the epoch");
        let loaded = SessionRecord::load(&store, "s").await.unwrap().unwrap();
        assert_eq!(loaded, r);
        let request = loaded.cells[0].request.request(&BTreeMap::new()).unwrap();
        assert_eq!(request.inputs["n"], 2);

        // A saved cell is not written again: its part, spoiled behind the record's back, stays so.
        store
            .put_session_part("s", 0, b"spoiled".to_vec())
            .await
            .unwrap();
        r.cells.push(cell("c = 3"));
        r.save(&store, "s").await.unwrap();
        let err = SessionRecord::load(&store, "s").await.unwrap_err();
        assert!(err.to_string().contains("cell 0 of session s"), "{err}");

        // The last cell taken back and replaced: its part is written anew.
        let mut r = record(&["a = 1", "b = 2"]);
        r.save(&store, "t").await.unwrap();
        r.pop_cell();
        r.cells.push(cell("b = 20"));
        r.note = Some("why".into());
        r.save(&store, "t").await.unwrap();
        let loaded = SessionRecord::load(&store, "t").await.unwrap().unwrap();
        assert_eq!(loaded.cells[1].request.code, "b = 20");
        assert_eq!(loaded.cells.len(), 2);
        assert_eq!(
            (loaded.note.as_deref(), &loaded.epoch),
            (Some("why"), &r.epoch)
        );
    }

    #[tokio::test]
    async fn older_records_are_read_and_rewritten_as_this_version() {
        let store = Store::open("memory://").unwrap();
        // Version 1: every cell in one object.
        let old = record(&["a = 1"]);
        let whole = Record::V1(SessionRecordV1 {
            cells: old.cells.iter().map(v1).collect(),
            dependencies: old.dependencies.clone(),
            closed: false,
        });
        store
            .put_session("s", versioned(MAGIC, VERSION_1, &whole, "test").unwrap())
            .await
            .unwrap();
        let mut loaded = SessionRecord::load(&store, "s").await.unwrap().unwrap();
        assert_eq!((loaded.cells.len(), loaded.saved), (1, 0));
        assert!(loaded.cells[0].legacy && loaded.epoch.is_empty());
        loaded.cells.push(cell("b = 2"));
        loaded.save(&store, "s").await.unwrap();
        let again = SessionRecord::load(&store, "s").await.unwrap().unwrap();
        assert_eq!(again.cells.len(), 2);
        assert_eq!(again.dependencies, vec!["six".to_string()]);
        assert!(!again.epoch.is_empty());

        // Version 2: a head and parts of version 1.
        let head = HeadV2 {
            cells: 1,
            dependencies: Vec::new(),
            closed: false,
        };
        store
            .put_session("u", versioned(MAGIC, VERSION_2, &head, "test").unwrap())
            .await
            .unwrap();
        let part = versioned(
            PART_MAGIC,
            PART_VERSION_1,
            &Part::V1(v1(&cell("x = 1"))),
            "test",
        );
        store.put_session_part("u", 0, part.unwrap()).await.unwrap();
        let loaded = SessionRecord::load(&store, "u").await.unwrap().unwrap();
        assert!(loaded.cells[0].legacy);
        assert_eq!(loaded.cells[0].request.code, "x = 1");
        assert_eq!(
            loaded.cells[0].lacks(),
            None,
            "plain inputs need nothing it lacks"
        );
    }

    #[test]
    fn an_old_cell_whose_inputs_were_exact_values_says_what_its_record_lacks() {
        let mut old = cell("x");
        old.request.inputs = r#"{"x": {"$rp": "set", "items": [1]}}"#.into();
        assert_eq!(old.lacks(), None, "this version records `typed`");
        old.legacy = true;
        assert!(old.lacks().unwrap().contains("exact values"));
    }

    #[tokio::test]
    async fn what_it_does_not_know_or_lost_is_refused_with_why() {
        let store = Store::open("memory://").unwrap();
        let mut r = record(&["a = 1", "b = 2"]);
        r.save(&store, "s").await.unwrap();
        let head = store.get_session("s").await.unwrap().unwrap().to_vec();
        let mut newer = head.clone();
        newer[4] = 9;
        assert!(SessionRecord::decode("s", &newer)
            .unwrap_err()
            .to_string()
            .contains("newer"));
        assert!(SessionRecord::decode("s", b"junk").is_err());
        store
            .put_session_part("s", 1, b"RPSC\x09".to_vec())
            .await
            .unwrap();
        let err = SessionRecord::load(&store, "s").await.unwrap_err();
        assert!(err.to_string().contains("newer"), "{err}");
        store.delete_session("s").await.unwrap();
        store.put_session("s", head).await.unwrap();
        let err = SessionRecord::load(&store, "s").await.unwrap_err();
        assert!(err.to_string().contains("missing its cell 0"), "{err}");
    }
}

/// A session's large journaled values, kept with its record (`v-<digest>`, deleted with it).
#[derive(Debug)]
struct SessionSpill {
    store: Store,
    id: String,
}

impl runpython_bridge::SpillStore for SessionSpill {
    fn put(
        &self,
        digest: String,
        text: String,
    ) -> runpython_bridge::BoxFuture<'static, Result<(), String>> {
        let (store, id) = (self.store.clone(), self.id.clone());
        Box::pin(async move {
            store
                .put_session_value(&id, &digest, text.into_bytes())
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn get(&self, digest: String) -> runpython_bridge::BoxFuture<'static, Result<String, String>> {
        let (store, id) = (self.store.clone(), self.id.clone());
        Box::pin(async move {
            let bytes = store
                .get_session_value(&id, &digest)
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("value {digest} is missing from the session's record"))?;
            String::from_utf8(bytes.to_vec()).map_err(|e| e.to_string())
        })
    }
}

/// Where session `id`'s large journaled values are kept and read back (its replay).
pub(crate) fn spill_for(
    store: &Store,
    id: &str,
) -> std::sync::Arc<dyn runpython_bridge::SpillStore> {
    std::sync::Arc::new(SessionSpill {
        store: store.clone(),
        id: id.to_owned(),
    })
}
