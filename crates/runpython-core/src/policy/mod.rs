//! Who may see what: tenants apart in one store (`tenancy`), and the environment variables runpython
//! itself reads (`env_vars`). Secrets the code uses but never reads are runpython-egress's.

pub(crate) mod env_vars;
pub(crate) mod tenancy;
