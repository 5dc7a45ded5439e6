//! What the host prepares for each run forked from a template: the same decision as a fresh run's
//! ([`decide`]), built into what the run takes for itself in `runpython_template.py` — its uid, its
//! cgroup, its Landlock ruleset and the rules on its own directories, its seccomp program, its
//! limits, its scratch — as a command (JSON) and the descriptors that go with it.
//!
//! The host keeps the parts a run must not be able to choose: the ruleset is built and the program
//! compiled here, the cgroup is made and its `cgroup.procs` opened here, the uid is drawn here. The
//! template only applies them, in the child, before any code runs.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use super::decide::{decide, START_TEMPLATE};
use super::layers::{cgroup_for, landlock_for, rlimits_for};
use super::sys::geteuid;
use crate::cgroup::RunCgroup;
use crate::error::Error;
use crate::plan::{cpu_seconds, host, read_dirs};
use crate::report::Isolation;
use crate::{probe, seccomp, userns, view, Sandbox};

/// One forked run's share of the sandbox, prepared in the host.
#[derive(Debug)]
pub struct ForkPlan {
    /// What is in force for the run (`start: "template"`).
    pub report: Isolation,
    /// The run's cgroup: its init writes itself into it first.
    pub cgroup: Option<RunCgroup>,
    /// The Landlock ruleset the interpreter adds its own directories to and restricts itself with.
    pub landlock: Option<OwnedFd>,
    /// The command's fields that say what the run takes (`runpython_template.py`'s `_setup`).
    pub command: serde_json::Map<String, Value>,
    /// The network policy the host enforces for the run: it then sends its resolver's and relay's
    /// sockets and its connect notifier's listener with its scratch ([`crate::EgressFds`]).
    pub egress: Option<std::sync::Arc<crate::NetworkPolicy>>,
}

impl ForkPlan {
    /// The descriptors that go with the command besides the run's pipes, named as the template
    /// expects them.
    pub fn fds(&self) -> Vec<(&'static str, RawFd)> {
        let mut fds = Vec::new();
        if let Some(ruleset) = &self.landlock {
            fds.push(("landlock", ruleset.as_raw_fd()));
        }
        if let Some(cgroup) = &self.cgroup {
            fds.extend(cgroup.procs_fds().map(|fd| ("cgroup", fd)));
        }
        fds
    }
}

/// Decides the run's layers as for a fresh run of `config` and prepares what the forked run takes:
/// `Err(TemplateUnavailable)` when this configuration cannot be forked here, `Err(IsolationUnavailable)`
/// when a required layer is missing.
pub fn prepare_fork(
    config: &Sandbox,
    program: &Path,
    reads: &[&Path],
    timeout: Duration,
) -> Result<ForkPlan, Error> {
    let read_dirs = read_dirs(config, program, true, reads);
    let mut decision = decide(config, probe::kernel(), host(), || None);
    decision
        .template_eligible(host())
        .map_err(Error::TemplateUnavailable)?;
    // A root host's run gets a uid of its own (mapped in the templates' user namespace); a non-root
    // host's runs are all its uid, each in a user namespace of its own.
    let (inside_template, host_uid) = if geteuid() == 0 {
        let uid = userns::random_run_uid();
        (Some(uid - userns::RUN_UID_BASE), uid)
    } else {
        (None, geteuid())
    };
    let (landlock, inner) = landlock_for(&mut decision, &read_dirs, None, true)?;
    let cgroup = cgroup_for(&mut decision, config);
    if config.require && !decision.missing.is_empty() {
        return Err(Error::IsolationUnavailable(decision.missing.join("; ")));
    }
    let cpu = cpu_seconds(timeout);
    let rlimits: Vec<Value> = if decision.rlimits {
        rlimits_for(config, cpu)
            .into_iter()
            .map(|(resource, value)| {
                // SIGXCPU at the soft limit, SIGKILL a second later.
                let hard = if resource == libc::RLIMIT_CPU {
                    value + 1
                } else {
                    value
                };
                json!([resource, value, hard])
            })
            .collect()
    } else {
        Vec::new()
    };
    let seccomp = decision
        .seccomp
        .then(|| seccomp::filter(decision.seccomp_extra))
        .flatten()
        .map(|filter| hex(&seccomp::program_bytes(filter)));
    let landlock_rules = landlock.as_ref().map(|_| {
        inner
            .iter()
            .map(|(path, access)| json!([path.to_string_lossy(), access]))
            .collect::<Vec<_>>()
    });
    let egress = match (&config.network, decision.egress) {
        (crate::Network::Policy(policy), true) => Some(std::sync::Arc::new(policy.clone())),
        _ => None,
    };
    let mut report = decision.report(config, host_uid, cpu);
    report.start = START_TEMPLATE.into();
    let owner = inside_template.unwrap_or(0);
    let command = json!({
        "uid": inside_template,
        "owner": owner,
        "unshare": decision.unshare & (libc::CLONE_NEWIPC | libc::CLONE_NEWUTS),
        "net": decision.unshare & libc::CLONE_NEWNET != 0,
        "userns": true,
        "inside": userns::INSIDE_ID,
        "forbid_nested": decision.forbid_nested_userns,
        "nproc": decision.nproc,
        "rlimits": rlimits,
        "landlock": landlock_rules,
        "seccomp": seccomp,
        "egress": egress.as_ref().map(|_| json!({
            "notifier": hex(&crate::egress::setup::program_bytes()),
            "relay_port": crate::egress::setup::RELAY_PORT,
            "dns_port": crate::egress::setup::DNS_PORT,
        })),
        "devpts": view::DEVPTS_OPTIONS,
        "scratch": {
            "path": view::SCRATCH,
            "size": config.disk_bytes,
            "dirs": view::SCRATCH_DIRS,
            "rebind": rebinds(&read_dirs),
        },
    });
    let Value::Object(command) = command else {
        return Err(Error::Internal("a fork command is not an object".into()));
    };
    Ok(ForkPlan {
        report,
        cgroup,
        landlock,
        command,
        egress,
    })
}

/// The directories (and files) the code reads that lie under `/tmp` or `/dev/shm` (a cache directory
/// under a `HOME` in `/tmp`): the view binds them read-only on top of the template's scratch, which the
/// run's own hides, so the run binds them again on top of its own, as `[path, is_dir]`.
fn rebinds(read_dirs: &[std::path::PathBuf]) -> Vec<Value> {
    let mut under: Vec<&std::path::PathBuf> = read_dirs
        .iter()
        .filter(|p| p.starts_with("/tmp") || p.starts_with("/dev/shm"))
        .filter(|p| p.as_os_str().len() > "/tmp".len() && p.exists())
        .collect();
    under.sort_by_key(|p| p.as_os_str().len());
    let mut kept: Vec<&std::path::PathBuf> = Vec::new();
    for path in under {
        if !kept.iter().any(|k| path.starts_with(k)) {
            kept.push(path);
        }
    }
    kept.into_iter()
        .map(|p| json!([p.to_string_lossy(), p.is_dir()]))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_lies_under_tmp_is_bound_again_once() {
        let dir = tempfile::Builder::new().tempdir_in("/tmp").unwrap();
        let inner = dir.path().join("cache");
        std::fs::create_dir(&inner).unwrap();
        let got = rebinds(&[
            std::path::PathBuf::from("/usr"),
            inner.clone(),
            dir.path().to_owned(),
            dir.path().join("missing"),
        ]);
        assert_eq!(got, vec![json!([dir.path().to_string_lossy(), true])]);
    }

    #[test]
    fn hex_is_two_lowercase_digits_per_byte() {
        assert_eq!(hex(&[0, 15, 16, 255]), "000f10ff");
    }
}
