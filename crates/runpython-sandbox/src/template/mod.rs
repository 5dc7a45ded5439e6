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

mod command;

pub use command::ForkCommand;

/// The Python a template runs, stdlib only, as `(file name, source)`: `runpython_template.py` (T, the
/// template, and the inits it makes) and `runpython_forked.py` (each forked run taking its sandbox).
/// The caller writes both beside its own child modules and calls `runpython_template.serve(args,
/// warm_up, run)`.
pub const TEMPLATE_MODULES: [(&str, &str); 2] = [
    (
        "runpython_template.py",
        include_str!("runpython_template.py"),
    ),
    ("runpython_forked.py", include_str!("runpython_forked.py")),
];
use command::{EgressSetup, ScratchSpec};

use super::decide::{decide, START_TEMPLATE};
use super::layers::{cgroup_for, landlock_for, rlimits_for};
use super::sys::{getegid, geteuid};
use crate::cgroup::RunCgroup;
use crate::error::Error;
use crate::fork_check::{limit_row, own_namespaces, ForkCheck};
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
    /// What the run takes (`runpython_template.py`'s `_setup`), sent with the fork.
    pub command: ForkCommand,
    /// The host mediates the run's network: the run then sends its resolver's and relay's sockets
    /// and its connect notifier's listener with its scratch ([`crate::EgressFds`]), for the caller
    /// to serve with its policy.
    pub egress: bool,
    /// The guard is in force for the run's network ([`crate::EgressFds::guarded`]).
    pub egress_guarded: bool,
    /// What the host checks of the run's interpreter from outside before it gets code.
    pub check: ForkCheck,
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
    let limits: Vec<(libc::__rlimit_resource_t, u64, u64)> = if decision.rlimits {
        rlimits_for(config, cpu)
            .into_iter()
            .map(|(resource, value)| {
                // SIGXCPU at the soft limit, SIGKILL a second later.
                let hard = if resource == libc::RLIMIT_CPU {
                    value + 1
                } else {
                    value
                };
                (resource, value, hard)
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
            .map(|(path, access)| (path.to_string_lossy().into_owned(), *access))
            .collect::<Vec<_>>()
    });
    let egress = decision.egress;
    let egress_guarded = decision.egress_guard;
    let host_gid = if geteuid() == 0 { host_uid } else { getegid() };
    let check = ForkCheck {
        own_namespaces: own_namespaces(decision.unshare),
        uid_map: (userns::INSIDE_ID, host_uid),
        gid_map: (userns::INSIDE_ID, host_gid),
        no_new_privs: true,
        seccomp_filters: Some(u32::from(seccomp.is_some()) + u32::from(egress)).filter(|n| *n > 0),
        limits: limits
            .iter()
            .copied()
            .chain(decision.nproc.map(|n| (libc::RLIMIT_NPROC, n, n)))
            .chain([(libc::RLIMIT_CORE, 0, 0)])
            .filter_map(|(resource, soft, hard)| Some((limit_row(resource)?, soft, hard)))
            .collect(),
    };
    let mut report = decision.report(config, host_uid, cpu);
    report.start = START_TEMPLATE.into();
    let owner = inside_template.unwrap_or(0);
    let command = ForkCommand {
        uid: inside_template,
        owner,
        unshare: decision.unshare & (libc::CLONE_NEWIPC | libc::CLONE_NEWUTS),
        net: decision.unshare & libc::CLONE_NEWNET != 0,
        userns: true,
        inside: userns::INSIDE_ID,
        forbid_nested: decision.forbid_nested_userns,
        nproc: decision.nproc,
        rlimits: limits,
        landlock: landlock_rules,
        seccomp,
        devpts: view::DEVPTS_OPTIONS,
        egress: egress.then(|| EgressSetup {
            notifier: hex(&crate::egress::setup::program_bytes(egress_guarded)),
            relay_port: crate::egress::setup::RELAY_PORT,
            dns_port: crate::egress::setup::DNS_PORT,
        }),
        scratch: ScratchSpec {
            path: view::SCRATCH,
            size: config.disk_bytes,
            dirs: view::SCRATCH_DIRS,
            rebind: rebinds(&read_dirs),
        },
    };
    Ok(ForkPlan {
        report,
        cgroup,
        landlock,
        command,
        egress,
        egress_guarded,
        check,
    })
}

/// The directories (and files) the code reads that lie under `/tmp` or `/dev/shm` (a cache directory
/// under a `HOME` in `/tmp`): the view binds them read-only on top of the template's scratch, which the
/// run's own hides, so the run binds them again on top of its own, as `[path, is_dir]`.
fn rebinds(read_dirs: &[std::path::PathBuf]) -> Vec<(String, bool)> {
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
        .map(|p| (p.to_string_lossy().into_owned(), p.is_dir()))
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
        assert_eq!(got, vec![(dir.path().to_string_lossy().into_owned(), true)]);
    }

    #[test]
    fn hex_is_two_lowercase_digits_per_byte() {
        assert_eq!(hex(&[0, 15, 16, 255]), "000f10ff");
    }
}
