//! What a run returns: the [`crate::Envelope`] (`envelope`) and the runner's answer applied to it
//! (`outcome`).

pub(crate) mod envelope;
pub(crate) mod outcome;
