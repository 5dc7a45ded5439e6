//! Durability: what a run leaves in the store and the memo (`persist`: keeping, redaction, memo
//! keys, files and artifacts for the runner), how a suspended run continues (`resume`:
//! checkpoints and replay), and a request at rest as both checkpoints and session cells keep it
//! (`at_rest`). Sessions, durable too, live beside this in `session/`.

pub(crate) mod at_rest;
pub(crate) mod persist;
pub(crate) mod resume;
