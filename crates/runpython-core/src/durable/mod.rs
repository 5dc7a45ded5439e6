//! Durability: what a run leaves in the store and the memo (`persist`: keeping, redaction, memo
//! keys, files and artifacts for the runner) and how a suspended run continues (`resume`:
//! checkpoints and replay). Sessions, durable too, live beside this in `session/`.

pub(crate) mod persist;
pub(crate) mod resume;
