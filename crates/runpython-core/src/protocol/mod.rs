//! What goes in and out of the engine, as data: a run's request and its limits and events
//! (`request`), the envelope that comes back (`envelope`), how a child's ending becomes one
//! (`outcome`), and what a model is told of the tools and how its calls are read (`tool_spec`).
//! A leaf: nothing here runs anything.

pub(crate) mod envelope;
pub(crate) mod outcome;
pub(crate) mod request;
pub(crate) mod tool_spec;
