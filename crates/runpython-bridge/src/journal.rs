//! The call journal: every tool call of a run, by ordinal, so a resumed run replays what already happened
//! instead of doing it again (the durable-execution pattern).
//!
//! Each entry is keyed by its ordinal, the tool's name and a hash of its canonical JSON arguments. It is
//! written `Executing` before the tool runs and `Applied` with the result after; a tool that asks for a
//! human decision leaves a `Suspended` entry. At rest the journal is a postcard record behind a magic and a
//! version byte (postcard does not tolerate added fields, so new layouts get a new variant).
//!
//! What the journal holds is bounded whatever a run passes through it: the arguments are kept as their
//! hash and a head of their text ([`ARGS_KEPT`]), and a result over the bridge's spill threshold is
//! kept by its digest ([`Journaled::Spilled`]), its text handed to the run's [`crate::SpillStore`] (a
//! durable run's, a session's) or, for a run that is never replayed, to no one.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::tool::{ToolArgs, ToolError};
use crate::Error;

/// The built-in tool behind `once(...)`: journals a value the code computed, matched by name only (the
/// value is expected to differ between attempts; the recorded one wins).
pub(crate) const ONCE_TOOL: &str = "runpython_once";

const MAGIC: &[u8; 4] = b"RPJN";
const VERSION_1: u8 = 1;
const VERSION_2: u8 = 2;

/// A journal entry keeps at most this much of its arguments' text (for divergence reports); the
/// arguments are matched by their hash.
pub const ARGS_KEPT: usize = 1024;

/// A result as the journal holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Journaled {
    /// The JSON text itself.
    Inline(String),
    /// Kept aside by its blake3 `digest` (hex), `bytes` long: in the run's spill store when it has
    /// one, else nowhere (a run that is never replayed).
    Spilled {
        /// blake3 of the text, hex.
        digest: String,
        /// Its length.
        bytes: u64,
    },
}

impl Journaled {
    /// Inline when at most `threshold` bytes, else spilled by digest (the caller keeps the text).
    pub(crate) fn of(text: &str, threshold: usize) -> Self {
        if text.len() <= threshold {
            Self::Inline(text.to_owned())
        } else {
            Self::Spilled {
                digest: blake3::hash(text.as_bytes()).to_hex().to_string(),
                bytes: text.len() as u64,
            }
        }
    }
}

/// Where a journaled call stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CallState {
    /// Started; the tool may or may not have acted (the host may have died during it).
    Executing,
    /// Finished; `Ok` holds the result (JSON text, or its digest), `Err` the error raised in the code.
    Applied(Result<Journaled, ToolError>),
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
    /// The head of the arguments' canonical JSON text, at most [`ARGS_KEPT`] bytes (for divergence
    /// reports).
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

/// Version 1's shapes: results were always inline text.
mod v1 {
    use serde::{Deserialize, Serialize};

    use crate::tool::ToolError;

    #[derive(Serialize, Deserialize)]
    pub(super) enum CallState {
        Executing,
        Applied(Result<String, ToolError>),
        Decided { id: String, decision: String },
        Suspended { id: String, request: String },
    }

    #[derive(Serialize, Deserialize)]
    pub(super) struct JournalEntry {
        pub ordinal: u32,
        pub tool: String,
        pub args_hash: String,
        pub args: String,
        pub state: CallState,
    }

    #[derive(Serialize, Deserialize)]
    pub(super) struct Journal {
        pub entries: Vec<JournalEntry>,
    }

    #[derive(Serialize, Deserialize)]
    pub(super) enum JournalRecord {
        V1(Journal),
    }

    impl From<JournalEntry> for super::JournalEntry {
        fn from(e: JournalEntry) -> Self {
            Self {
                ordinal: e.ordinal,
                tool: e.tool,
                args_hash: e.args_hash,
                args: e.args,
                state: match e.state {
                    CallState::Executing => super::CallState::Executing,
                    CallState::Applied(r) => {
                        super::CallState::Applied(r.map(super::Journaled::Inline))
                    }
                    CallState::Decided { id, decision } => {
                        super::CallState::Decided { id, decision }
                    }
                    CallState::Suspended { id, request } => {
                        super::CallState::Suspended { id, request }
                    }
                },
            }
        }
    }
}

#[derive(Serialize, Deserialize)]
enum JournalRecord {
    V2(Journal),
}

impl Journal {
    /// The record at rest: magic, version byte, postcard.
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        // Calls refused before they were journaled (over budget, unknown tool) leave placeholders.
        let kept = Journal {
            entries: self
                .entries
                .iter()
                .filter(|e| e.ordinal != u32::MAX)
                .cloned()
                .collect(),
        };
        encode_record(&JournalRecord::V2(kept))
    }

    /// Reads a record written by [`Journal::encode`] (or by a runpython whose journal was version
    /// 1); a newer version is a clear error.
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        let (version, body) = record_body(bytes)?;
        match version {
            VERSION_1 => match postcard::from_bytes(body) {
                Ok(v1::JournalRecord::V1(journal)) => Ok(Journal {
                    entries: journal.entries.into_iter().map(Into::into).collect(),
                }),
                Err(e) => Err(Error::Malformed(format!("corrupt journal record: {e}"))),
            },
            _ => match postcard::from_bytes(body) {
                Ok(JournalRecord::V2(journal)) => Ok(journal),
                Err(e) => Err(Error::Malformed(format!("corrupt journal record: {e}"))),
            },
        }
    }

    /// Sets the entry at its ordinal (the journal's entries sit at their ordinals' indexes), as a
    /// journal read back from appended entries is rebuilt.
    pub fn apply(&mut self, entry: JournalEntry) {
        let index = entry.ordinal as usize;
        if self.entries.len() <= index {
            self.entries
                .resize_with(index + 1, JournalEntry::placeholder);
        }
        self.entries[index] = entry;
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

impl JournalEntry {
    /// Where a call refused before it was journaled (over budget, unknown tool) would be: nothing.
    pub(crate) fn placeholder() -> Self {
        Self {
            ordinal: u32::MAX,
            tool: String::new(),
            args_hash: String::new(),
            args: String::new(),
            state: CallState::Executing,
        }
    }

    /// One entry as a record at rest (what a durable run appends for each change of a call).
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        encode_record(&EntryRecord::V2(self.clone()))
    }

    /// Reads a record written by [`JournalEntry::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        match record_body(bytes)? {
            (VERSION_2, body) => match postcard::from_bytes(body) {
                Ok(EntryRecord::V2(entry)) => Ok(entry),
                Err(e) => Err(Error::Malformed(format!("corrupt journal entry: {e}"))),
            },
            (version, _) => Err(Error::Malformed(format!(
                "journal entry version {version} is not one this runpython reads (2)"
            ))),
        }
    }
}

#[derive(Serialize, Deserialize)]
enum EntryRecord {
    V2(JournalEntry),
}

fn encode_record<T: Serialize>(record: &T) -> Result<Vec<u8>, Error> {
    let mut out = MAGIC.to_vec();
    out.push(VERSION_2);
    let body = postcard::to_allocvec(record)
        .map_err(|e| Error::Malformed(format!("cannot encode the journal: {e}")))?;
    out.extend(body);
    Ok(out)
}

/// The version byte and body of a journal record; a record of an unknown version is a clear error.
fn record_body(bytes: &[u8]) -> Result<(u8, &[u8]), Error> {
    if bytes.len() < 5 || &bytes[..4] != MAGIC {
        return Err(Error::Malformed("not a runpython journal record".into()));
    }
    if bytes[4] > VERSION_2 || bytes[4] == 0 {
        return Err(Error::Malformed(format!(
            "journal record version {} is newer than this runpython understands ({VERSION_2}); upgrade runpython",
            bytes[4]
        )));
    }
    Ok((bytes[4], &bytes[5..]))
}

/// The head of `text`, at most `max` bytes on a character boundary, with `…` when cut.
pub(crate) fn head(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &text[..cut])
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
                    state: CallState::Applied(Ok(Journaled::Inline("42".into()))),
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
        newer[4] = 3;
        assert!(Journal::decode(&newer)
            .unwrap_err()
            .to_string()
            .contains("newer"));
        assert_eq!(journal.suspensions().count(), 1);
    }

    #[test]
    fn a_version_1_journal_reads_as_inline_results() {
        let old = v1::Journal {
            entries: vec![v1::JournalEntry {
                ordinal: 0,
                tool: "pay".into(),
                args_hash: "h".into(),
                args: "{}".into(),
                state: v1::CallState::Applied(Ok("42".into())),
            }],
        };
        let mut bytes = MAGIC.to_vec();
        bytes.push(VERSION_1);
        bytes.extend(postcard::to_allocvec(&v1::JournalRecord::V1(old)).unwrap());
        let journal = Journal::decode(&bytes).unwrap();
        assert_eq!(
            journal.entries[0].state,
            CallState::Applied(Ok(Journaled::Inline("42".into())))
        );
    }

    #[test]
    fn large_values_are_kept_by_digest_and_entries_round_trip() {
        assert_eq!(Journaled::of("12", 4), Journaled::Inline("12".into()));
        let big = "x".repeat(100);
        let Journaled::Spilled { digest, bytes } = Journaled::of(&big, 4) else {
            panic!("not spilled");
        };
        assert_eq!((digest.len(), bytes), (64, 100));
        let entry = JournalEntry {
            ordinal: 3,
            tool: "t".into(),
            args_hash: "h".into(),
            args: head(&big, 10),
            state: CallState::Applied(Ok(Journaled::of(&big, 4))),
        };
        assert_eq!(entry.args, format!("{}…", "x".repeat(10)));
        assert_eq!(
            JournalEntry::decode(&entry.encode().unwrap()).unwrap(),
            entry
        );
        let mut journal = Journal::default();
        journal.apply(entry.clone());
        assert_eq!(journal.entries.len(), 4);
        assert_eq!(journal.entries[3], entry);
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
