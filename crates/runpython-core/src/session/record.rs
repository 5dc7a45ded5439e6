//! A session at rest: every cell it ran, with its tool-call journal, so any engine sharing the store can
//! rebuild the session by replaying the cells in order (tool calls answered from the journals, so side
//! effects never fire twice). postcard behind a magic and a version byte.
//!
//! Version 2 keeps each cell once, as a part of its own (`Store::put_session_part`, written before
//! the head that counts it), and a small head at `v1/sessions/<id>`: a cell costs one part and one
//! head, whatever the session's length (version 1 rewrote every cell, journals included, on every
//! cell). Version 1 records are still read; the next cell rewrites them as version 2.

use futures_util::{StreamExt as _, TryStreamExt as _};
use runpython_bridge::Journal;
use runpython_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::Error;
use crate::protocol::request::RunRequest;

const MAGIC: &[u8; 4] = b"RPSS";
const VERSION_1: u8 = 1;
const VERSION_2: u8 = 2;
/// A part: one cell.
const PART_MAGIC: &[u8; 4] = b"RPSC";
const PART_VERSION_1: u8 = 1;
/// Parts fetched at once when a session is loaded.
const PARTS_AT_ONCE: usize = 16;

/// One cell as it ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct CellRecord {
    pub code: String,
    /// JSON text of the inputs object (postcard cannot carry `serde_json::Value`).
    pub inputs: String,
    pub input_artifacts: Vec<(String, String)>,
    pub dependencies: Vec<String>,
    /// The bridge's own versioned journal record.
    pub journal: Vec<u8>,
    /// The cell's run id (a suspended cell is resumed by it).
    pub run_id: String,
    /// The cell waits for decisions on these suspensions (it is the session's last cell).
    pub suspended: Vec<String>,
}

impl CellRecord {
    pub(crate) fn new(
        request: &RunRequest,
        journal: &Journal,
        run_id: &str,
        suspended: Vec<String>,
    ) -> Result<Self, Error> {
        Ok(Self {
            code: request.code.clone(),
            inputs: Value::Object(request.inputs.clone()).to_string(),
            input_artifacts: request.input_artifacts.clone(),
            dependencies: request.dependencies.clone(),
            journal: journal.encode()?,
            run_id: run_id.to_owned(),
            suspended,
        })
    }

    /// The request the cell was.
    pub(crate) fn request(&self) -> Result<RunRequest, Error> {
        let inputs: Map<String, Value> = serde_json::from_str(&self.inputs)
            .map_err(|e| Error::Internal(format!("a session cell's inputs are not JSON: {e}")))?;
        let mut request = RunRequest::new(self.code.clone()).no_memo();
        request.inputs = inputs;
        request.input_artifacts = self.input_artifacts.clone();
        request.dependencies = self.dependencies.clone();
        Ok(request)
    }

    pub(crate) fn journal(&self) -> Result<Journal, Error> {
        Ok(Journal::decode(&self.journal)?)
    }
}

/// A session's record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct SessionRecord {
    pub cells: Vec<CellRecord>,
    /// Requirement specs the session gathered (defaults, explicit, detected), in the order they came.
    pub dependencies: Vec<String>,
    /// Closed or reset: nothing to restore.
    pub closed: bool,
    /// How many of `cells` are in the store as they are here (as parts): the next save writes the
    /// others only.
    #[serde(skip)]
    pub saved: usize,
}

#[derive(Serialize, Deserialize)]
enum Record {
    V1(SessionRecord),
}

/// A version 2 head: the cells are its parts `0..cells`.
#[derive(Debug, Serialize, Deserialize)]
struct Head {
    cells: u64,
    dependencies: Vec<String>,
    closed: bool,
}

/// What `v1/sessions/<id>` holds.
#[derive(Debug)]
enum Stored {
    /// Version 1: every cell.
    Whole(SessionRecord),
    /// Version 2: the head; the cells are parts.
    Head(Head),
}

#[derive(Serialize, Deserialize)]
enum Part {
    V1(CellRecord),
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
        };
        versioned(MAGIC, VERSION_2, &head, "session record")
    }

    /// Version 1: the whole record in one (what earlier runpython wrote; kept for the tests that
    /// prove it is still read).
    #[cfg(test)]
    fn encode_v1(&self) -> Result<Vec<u8>, Error> {
        versioned(
            MAGIC,
            VERSION_1,
            &Record::V1(self.clone()),
            "session record",
        )
    }

    /// The record in `bytes`: whole (version 1), or a head whose cells are still to be read.
    fn decode(id: &str, bytes: &[u8]) -> Result<Stored, Error> {
        let bad = |why: String| Error::InvalidInput(format!("the record of session {id} {why}"));
        if bytes.len() < 5 || &bytes[..4] != MAGIC {
            return Err(bad("is not a runpython session record".into()));
        }
        match bytes[4] {
            VERSION_1 => match postcard::from_bytes(&bytes[5..]) {
                Ok(Record::V1(record)) => Ok(Stored::Whole(record)),
                Err(e) => Err(bad(format!("is corrupt ({e})"))),
            },
            VERSION_2 => match postcard::from_bytes::<Head>(&bytes[5..]) {
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
        if bytes[4] != PART_VERSION_1 {
            return Err(bad(format!(
                "has version {}, newer than this runpython understands; upgrade runpython",
                bytes[4]
            )));
        }
        match postcard::from_bytes(&bytes[5..]) {
            Ok(Part::V1(cell)) => Ok(cell),
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
        }))
    }

    /// Writes the cells not in the store yet, each as its part, then the head that counts them (a
    /// head never counts a part that is not written).
    pub(crate) async fn save(&mut self, store: &Store, id: &str) -> Result<(), Error> {
        for n in self.saved..self.cells.len() {
            let part = versioned(
                PART_MAGIC,
                PART_VERSION_1,
                &Part::V1(self.cells[n].clone()),
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

    fn cell(code: &str) -> CellRecord {
        let request = RunRequest::new(code).input("n", serde_json::json!(2));
        CellRecord::new(&request, &Journal::default(), "r1", Vec::new()).unwrap()
    }

    fn record(cells: &[&str]) -> SessionRecord {
        SessionRecord {
            cells: cells.iter().map(|c| cell(c)).collect(),
            dependencies: vec!["six".into()],
            closed: false,
            saved: 0,
        }
    }

    #[tokio::test]
    async fn each_cell_is_written_once_and_a_record_loads_back_whole() {
        let store = Store::open("memory://").unwrap();
        let mut r = record(&["a = 1", "b = 2"]);
        r.save(&store, "s").await.unwrap();
        assert_eq!(r.saved, 2);
        let loaded = SessionRecord::load(&store, "s").await.unwrap().unwrap();
        assert_eq!((loaded.cells.clone(), loaded.saved), (r.cells.clone(), 2));
        assert_eq!(loaded.cells[0].request().unwrap().inputs["n"], 2);

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
        r.save(&store, "t").await.unwrap();
        let loaded = SessionRecord::load(&store, "t").await.unwrap().unwrap();
        assert_eq!(loaded.cells[1].code, "b = 20");
        assert_eq!(loaded.cells.len(), 2);
    }

    #[tokio::test]
    async fn a_version_1_record_is_read_and_rewritten_as_parts() {
        let store = Store::open("memory://").unwrap();
        let mut old = record(&["a = 1"]);
        store
            .put_session("s", old.encode_v1().unwrap())
            .await
            .unwrap();
        let mut loaded = SessionRecord::load(&store, "s").await.unwrap().unwrap();
        assert_eq!((loaded.cells.clone(), loaded.saved), (old.cells.clone(), 0));
        loaded.cells.push(cell("b = 2"));
        loaded.save(&store, "s").await.unwrap();
        old.cells.push(cell("b = 2"));
        let again = SessionRecord::load(&store, "s").await.unwrap().unwrap();
        assert_eq!(again.cells, old.cells);
        assert_eq!(again.dependencies, vec!["six".to_string()]);
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
