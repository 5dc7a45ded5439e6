//! The fork command: what a run forked from a template takes for itself, as the host prepared it
//! ([`super::prepare_fork`]), sent to the template with the run's descriptors. Typed here, read key
//! by key by `runpython_template.py` (`checked_command`): a key missing or unknown is refused.

use serde::Serialize;

/// What a forked run takes for itself (`runpython_template.py`'s `_setup` reads exactly these).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ForkCommand {
    /// A root host's run: its uid inside the templates' user namespace (`None`: a non-root host's
    /// runs keep the host's uid).
    pub(crate) uid: Option<u32>,
    /// Who owns the run's scratch inside the template.
    pub(crate) owner: u32,
    /// The IPC and UTS namespaces it makes (`CLONE_NEW*` flags).
    pub(crate) unshare: libc::c_int,
    /// It makes a network namespace of its own.
    pub(crate) net: bool,
    /// It makes a user namespace of its own.
    pub(crate) userns: bool,
    /// The id it has inside that namespace.
    pub(crate) inside: u32,
    /// No user namespace may be made below it.
    pub(crate) forbid_nested: bool,
    /// Its `RLIMIT_NPROC`.
    pub(crate) nproc: Option<u64>,
    /// Its other limits: `[resource, soft, hard]`.
    pub(crate) rlimits: Vec<(libc::__rlimit_resource_t, u64, u64)>,
    /// Landlock rules on its own directories, added to the host's ruleset: `[path, access]`.
    pub(crate) landlock: Option<Vec<(String, u64)>>,
    /// The seccomp program, in hex.
    pub(crate) seccomp: Option<String>,
    /// The options of the run's own devpts instance (its terminals), mounted over the template's.
    pub(crate) devpts: &'static str,
    /// With a network the host mediates: the connect notifier and the endpoints it makes.
    pub(crate) egress: Option<EgressSetup>,
    /// Its scratch.
    pub(crate) scratch: ScratchSpec,
}

/// The egress a forked run sets up in its network namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct EgressSetup {
    /// The connect notifier's seccomp program, in hex.
    pub(crate) notifier: String,
    pub(crate) relay_port: u16,
    pub(crate) dns_port: u16,
}

/// A forked run's scratch: one tmpfs of `size` at `path`, with its directories and what it binds again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ScratchSpec {
    pub(crate) path: &'static str,
    pub(crate) size: u64,
    /// `[name, mode]`.
    pub(crate) dirs: [(&'static str, u32); 5],
    /// Paths under `/tmp` or `/dev/shm` the view bound, to bind again on top: `[path, is_dir]`.
    pub(crate) rebind: Vec<(String, bool)>,
}
