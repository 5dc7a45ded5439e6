//! The isolation report: which layers were in force for a sandboxed process (a run's envelope
//! carries it as `isolation`, an install's as part of its error or `doctor`'s output). Field names are
//! a public contract; new fields may be added.

use serde::{Deserialize, Serialize};

/// Which isolation layers were in force for a run (the envelope's `isolation`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Isolation {
    /// Namespaces the code runs in: any of `user`, `pid`, `mount`, `ipc`, `uts`, `net`.
    pub namespaces: Vec<String>,
    /// `"abi-N"` when Landlock restricts the code, `"off"` when not asked for, `"unavailable"`.
    pub landlock: String,
    /// Limits set on the interpreter; `null` fields are not enforced.
    pub rlimits: RlimitReport,
    /// `"deny-list"` when the seccomp filter is installed, `"off"` when not asked for, `"unavailable"`.
    #[serde(default)]
    pub seccomp: String,
    /// `"off"` (an empty network namespace), `"allowlist"` (only what the operator's patterns name,
    /// every connection and lookup decided on the host), `"public"` (the public internet, never the
    /// host nor private networks, plus what patterns name) or `"host"` (the host's network, shared).
    /// The sandbox itself says `"mediated"` for the two modes of a policy, which whoever holds the
    /// policy names ([`Isolation::set_network_policy`]).
    pub network: String,
    /// The network policy's rules (patterns and pinned names), with `"allowlist"` or `"public"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_rules: Option<usize>,
    /// The host uid the code runs as.
    pub uid: u32,
    /// How the run's processes are ended: `"pid-namespace"` or `"process-group"`.
    pub kill: String,
    /// `"allowlist"` when the code sees a fresh root holding only allowlisted directories (the system
    /// read-only, its code and environment read-only, its scratch, a minimal `/dev`, its own `/proc`);
    /// `"host"` when it sees the host's tree (Landlock alone restricts it).
    #[serde(default)]
    pub filesystem: String,
    /// The run's total memory (every process, shared memory and tmpfs pages together) and what
    /// enforces it: `"cgroup-v2"`, `"cgroup-v1"`, or `"rlimit"` (each process's address space only;
    /// `memfd_create` and SysV shared memory are then refused).
    #[serde(default)]
    pub memory: LimitReport,
    /// Everything the run may write (its working directory, `/tmp`, `/dev/shm`) and what enforces it:
    /// `"tmpfs"`, or `"none"`.
    #[serde(default)]
    pub disk: LimitReport,
    /// The run's share of the CPU and what enforces it: `"cgroup-v2"` (`cpu.max`), `"cgroup-v1"`
    /// (`cpu.cfs_quota_us`), or `"none"` (the run can use every CPU of the host).
    #[serde(default)]
    pub cpu: CpuReport,
    /// The tool bridge's bounds: one connection, the bytes of calls the host holds at once, the calls
    /// served at once (which also bounds the run's host command-tool processes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge: Option<BridgeReport>,
    /// How the run's interpreter started: `"fresh"` (an interpreter of its own, started for the run
    /// or ahead of it by the pool) or `"template"` (forked from a warm template, taking every layer
    /// above for itself before the code ran).
    #[serde(default = "fresh")]
    pub start: String,
    /// Requested layers that were not available, each with the reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
}

/// The bounds of a run's tool bridge.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BridgeReport {
    /// Connections the run may make (always 1: an inherited socket pair).
    pub connections: u32,
    /// Bytes of tool-call arguments the host holds for the run at once.
    pub bytes_in_flight: u64,
    /// Tool calls served at once.
    pub concurrent_calls: u64,
}

/// A run's CPUs and what enforces them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuReport {
    /// CPUs the run may use at once (`1.5`: one and a half CPUs' worth of time), `null` when none
    /// holds.
    pub cpus: Option<f64>,
    /// What enforces it.
    pub enforced_by: String,
}

/// A limit on the whole run and what enforces it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitReport {
    /// The limit, `null` when none holds.
    pub bytes: Option<u64>,
    /// What enforces it.
    pub enforced_by: String,
}

/// The rlimits in force; `null` when not enforced.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RlimitReport {
    /// `RLIMIT_AS`.
    pub address_space_bytes: Option<u64>,
    /// `RLIMIT_CPU` (soft limit; the code gets SIGXCPU there, SIGKILL a second later).
    pub cpu_seconds: Option<u64>,
    /// `RLIMIT_FSIZE`.
    pub file_size_bytes: Option<u64>,
    /// `RLIMIT_NOFILE`.
    pub open_files: Option<u64>,
    /// `RLIMIT_NPROC` (counted inside the run's user namespace, or for its own uid).
    pub processes: Option<u64>,
}

fn fresh() -> String {
    "fresh".into()
}

/// What the sandbox says of a run whose network the host mediates, until the policy's holder names
/// the policy's mode ([`Isolation::set_network_policy`]).
pub(crate) const NETWORK_MEDIATED: &str = "mediated";

impl Isolation {
    /// Names the policy a mediated network is decided by: its mode (`"allowlist"`, `"public"`) and
    /// how many rules it has. Nothing changes when the run's network is not mediated (off, the host's,
    /// or a policy that could not be put in force: `missing` says why).
    pub fn set_network_policy(&mut self, mode: &str, rules: usize) {
        if self.network == NETWORK_MEDIATED {
            self.network = mode.to_owned();
            self.network_rules = Some(rules);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Sandbox;

    fn report_for(network: crate::Network) -> Isolation {
        let config = Sandbox {
            network,
            ..Sandbox::default()
        };
        crate::report(&config, std::time::Duration::from_secs(1), false).unwrap()
    }

    #[test]
    fn only_a_mediated_network_is_named_by_the_policy_holder() {
        for (network, before) in [(crate::Network::Off, "off"), (crate::Network::Host, "host")] {
            let mut report = report_for(network);
            assert_eq!(report.network, before);
            report.set_network_policy("public", 3);
            assert_eq!(
                (report.network.as_str(), report.network_rules),
                (before, None)
            );
        }
        let mut report = report_for(crate::Network::Mediated);
        // Where this kernel cannot mediate, the run has no network and `missing` says why.
        if report.network == NETWORK_MEDIATED {
            assert_eq!(report.network_rules, None);
            report.set_network_policy("allowlist", 2);
            assert_eq!(
                (report.network.as_str(), report.network_rules),
                ("allowlist", Some(2))
            );
        } else {
            assert_eq!(report.network, "off");
            assert!(
                report
                    .missing
                    .iter()
                    .any(|m| m.starts_with("network policy")),
                "{:?}",
                report.missing
            );
        }
    }
}
