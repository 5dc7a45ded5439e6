//! The call journal: every tool call of a run, by ordinal, so a resumed run replays what already happened
//! instead of doing it again (the durable-execution pattern).
//!
//! Each entry is keyed by its ordinal, the tool's name and a hash of its canonical JSON arguments. It is
//! written `Executing` before the tool runs and `Applied` with the result after; a tool that asks for a
//! human decision leaves a `Suspended` entry. At rest the journal is a postcard record behind a magic and a
//! version byte (postcard does not tolerate added fields, so new layouts get a new variant).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::tool::{ToolArgs, ToolError};
use crate::Error;

/// The built-in tool behind `once(...)`: journals a value the code computed, matched by name only (the
/// value is expected to differ between attempts; the recorded one wins).
pub(crate) const ONCE_TOOL: &str = "runpython_once";

const MAGIC: &[u8; 4] = b"RPJN";
const VERSION_1: u8 = 1;

/// Where a journaled call stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CallState {
    /// Started; the tool may or may not have acted (the host may have died during it).
    Executing,
    /// Finished; `Ok` holds the result as JSON text, `Err` the error raised in the code.
    Applied(Result<String, ToolError>),
    /// The tool asked for a decision and a person gave it (JSON text): the call's result.
    Decided {
        /// The suspension's id.
        id: String,
        /// The decision as JSON text.
        decision: String,
    },
    /// The tool asked for a decision; the run stopped here.
    Suspended {
        /// The suspension's id, unique within the run.
        id: String,
        /// What the tool asked (JSON text), shown to the person deciding.
        request: String,
    },
}

/// One journaled call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// Position among the run's calls, from 0, in the order the host received them.
    pub ordinal: u32,
    /// The tool called.
    pub tool: String,
    /// blake3 of the canonical JSON arguments.
    pub args_hash: String,
    /// The arguments as canonical JSON text (for divergence reports and suspension requests).
    pub args: String,
    /// Where it stands.
    pub state: CallState,
}

/// The calls of a run, in ordinal order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Journal {
    /// The entries.
    pub entries: Vec<JournalEntry>,
}

#[derive(Serialize, Deserialize)]
enum JournalRecord {
    V1(Journal),
}

impl Journal {
    /// The record at rest: magic, version byte, postcard.
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        let mut out = MAGIC.to_vec();
        out.push(VERSION_1);
        // Calls refused before they were journaled (over budget, unknown tool) leave placeholders.
        let kept = Journal {
            entries: self
                .entries
                .iter()
                .filter(|e| e.ordinal != u32::MAX)
                .cloned()
                .collect(),
        };
        let body = postcard::to_allocvec(&JournalRecord::V1(kept))
            .map_err(|e| Error::Malformed(format!("cannot encode the journal: {e}")))?;
        out.extend(body);
        Ok(out)
    }

    /// Reads a record written by [`Journal::encode`]; a newer version is a clear error.
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        if bytes.len() < 5 || &bytes[..4] != MAGIC {
            return Err(Error::Malformed("not a runpython journal record".into()));
        }
        if bytes[4] != VERSION_1 {
            return Err(Error::Malformed(format!(
                "journal record version {} is newer than this runpython understands (1); upgrade runpython",
                bytes[4]
            )));
        }
        match postcard::from_bytes(&bytes[5..]) {
            Ok(JournalRecord::V1(journal)) => Ok(journal),
            Err(e) => Err(Error::Malformed(format!("corrupt journal record: {e}"))),
        }
    }

    /// Suspensions still waiting for a decision, in order.
    pub fn suspensions(&self) -> impl Iterator<Item = &JournalEntry> {
        self.entries
            .iter()
            .filter(|e| matches!(e.state, CallState::Suspended { .. }))
    }

    /// Suspensions over the run's life: decided ones and waiting ones.
    pub(crate) fn suspension_count(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| {
                matches!(
                    e.state,
                    CallState::Suspended { .. } | CallState::Decided { .. }
                )
            })
            .count()
    }
}

/// JSON text with object keys sorted, so equal values give equal text whatever their key order.
pub fn canonical_json(value: &Value) -> String {
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<_> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                Value::Object(
                    entries
                        .into_iter()
                        .map(|(k, v)| (k.clone(), sorted(v)))
                        .collect(),
                )
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(value).to_string()
}

/// Canonical JSON of a call's arguments and its blake3 hash.
pub(crate) fn canonical_args(args: &ToolArgs) -> (String, String) {
    let text = canonical_json(&serde_json::json!({"args": args.args, "kwargs": args.kwargs}));
    let hash = blake3::hash(text.as_bytes()).to_hex().to_string();
    (text, hash)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_journal_round_trips_and_refuses_newer_versions() {
        let journal = Journal {
            entries: vec![
                JournalEntry {
                    ordinal: 0,
                    tool: "pay".into(),
                    args_hash: "h".into(),
                    args: "{}".into(),
                    state: CallState::Applied(Ok("42".into())),
                },
                JournalEntry {
                    ordinal: 1,
                    tool: "approve".into(),
                    args_hash: "h2".into(),
                    args: "{}".into(),
                    state: CallState::Suspended {
                        id: "s1".into(),
                        request: "{}".into(),
                    },
                },
            ],
        };
        let bytes = journal.encode().unwrap();
        assert_eq!(Journal::decode(&bytes).unwrap(), journal);
        let mut newer = bytes.clone();
        newer[4] = 2;
        assert!(Journal::decode(&newer)
            .unwrap_err()
            .to_string()
            .contains("newer"));
        assert_eq!(journal.suspensions().count(), 1);
    }

    #[test]
    fn argument_order_in_objects_does_not_change_the_hash() {
        let a = ToolArgs {
            args: vec![],
            kwargs: serde_json::from_value(json!({"a": 1, "b": {"y": 2, "x": 1}})).unwrap(),
            call_id: Some("run.0".into()),
        };
        let b = ToolArgs {
            args: vec![],
            kwargs: serde_json::from_value(json!({"b": {"x": 1, "y": 2}, "a": 1})).unwrap(),
            call_id: None,
        };
        assert_eq!(canonical_args(&a), canonical_args(&b));
    }
}
