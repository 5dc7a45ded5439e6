//! A session at rest: every cell it ran, with its tool-call journal, so any engine sharing the store can
//! rebuild the session by replaying the cells in order (tool calls answered from the journals, so side
//! effects never fire twice). postcard behind a magic and a version byte, at `v1/sessions/<id>`.

use runpython_bridge::Journal;
use runpython_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::Error;
use crate::request::RunRequest;

const MAGIC: &[u8; 4] = b"RPSS";
const VERSION_1: u8 = 1;

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
}

#[derive(Serialize, Deserialize)]
enum Record {
    V1(SessionRecord),
}

impl SessionRecord {
    fn encode(&self) -> Result<Vec<u8>, Error> {
        let mut out = MAGIC.to_vec();
        out.push(VERSION_1);
        out.extend(
            postcard::to_allocvec(&Record::V1(self.clone()))
                .map_err(|e| Error::Internal(format!("cannot encode a session record: {e}")))?,
        );
        Ok(out)
    }

    fn decode(id: &str, bytes: &[u8]) -> Result<Self, Error> {
        let bad = |why: String| Error::InvalidInput(format!("the record of session {id} {why}"));
        if bytes.len() < 5 || &bytes[..4] != MAGIC {
            return Err(bad("is not a runpython session record".into()));
        }
        if bytes[4] != VERSION_1 {
            return Err(bad(format!(
                "has version {}, newer than this runpython understands; upgrade runpython",
                bytes[4]
            )));
        }
        match postcard::from_bytes(&bytes[5..]) {
            Ok(Record::V1(record)) => Ok(record),
            Err(e) => Err(bad(format!("is corrupt ({e})"))),
        }
    }

    /// The session's record in `store`, `None` when it has none.
    pub(crate) async fn load(store: &Store, id: &str) -> Result<Option<Self>, Error> {
        match store.get_session(id).await? {
            Some(bytes) => Ok(Some(Self::decode(id, &bytes)?)),
            None => Ok(None),
        }
    }

    pub(crate) async fn save(&self, store: &Store, id: &str) -> Result<(), Error> {
        store.put_session(id, self.encode()?).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_refuses_what_it_does_not_know() {
        let request = RunRequest::new("x = 1").input("n", serde_json::json!(2));
        let cell = CellRecord::new(&request, &Journal::default(), "r1", Vec::new()).unwrap();
        let record = SessionRecord {
            cells: vec![cell.clone()],
            dependencies: vec!["six".into()],
            closed: false,
        };
        let bytes = record.encode().unwrap();
        assert_eq!(SessionRecord::decode("s", &bytes).unwrap(), record);
        assert_eq!(cell.request().unwrap().inputs["n"], 2);
        let mut newer = bytes.clone();
        newer[4] = 9;
        assert!(SessionRecord::decode("s", &newer)
            .unwrap_err()
            .to_string()
            .contains("newer"));
        assert!(SessionRecord::decode("s", b"junk").is_err());
    }
}
