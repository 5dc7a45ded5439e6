//! Who may see what: secrets the code uses but never reads (`secrets`), tenants apart in one store
//! (`tenancy`), and the environment variables runpython itself reads (`env_vars`).

pub(crate) mod env_vars;
pub(crate) mod secrets;
pub(crate) mod tenancy;
