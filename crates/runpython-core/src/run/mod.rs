//! One run end to end: `execute` (validate → memo → attempt → checkpoint → keep → budget),
//! `attempt` (one child from its slot to the raw outcome), `deps` (the environment it runs in), `tools`
//! (the tool set one run serves) and `budget` (the envelope fitted into its budget).

pub(crate) mod attempt;
pub(crate) mod budget;
pub(crate) mod deps;
pub(crate) mod execute;
pub(crate) mod tools;
