//! The layers a run takes that the host builds for it, shared by a fresh run's plan ([`super::prepare`])
//! and a forked run's ([`super::prepare_fork`]): its Landlock ruleset and the rules on its own
//! directories, its cgroup, its rlimits.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use super::cgroup::{self, RunCgroup};
use super::decide::Decision;
use super::view::{self, cstring};
use super::{landlock, Sandbox};
use crate::error::Error;

/// Landlock rules a run adds on directories only it has: (path, access bits).
pub(super) type InnerRules = Vec<(CString, u64)>;

/// The run's Landlock ruleset, built in the host (with `run_dir`, the host directory a run without
/// a view works in), and the rules the run adds on directories only it has (its scratch, `/tmp`,
/// `/dev/shm`, its terminals, the view's skeleton, its `/proc`). A ruleset the kernel refuses is missing, with why.
/// A run whose network the host mediates gets the network guard where the ABI has it (4+), and the
/// decision says so (`egress_guard`).
pub(super) fn landlock_for(
    decision: &mut Decision,
    read_dirs: &[PathBuf],
    run_dir: Option<&Path>,
    view: bool,
) -> Result<(Option<OwnedFd>, InnerRules), Error> {
    let mut inner = Vec::new();
    let Some(abi) = decision.landlock_abi else {
        return Ok((None, inner));
    };
    let guard = decision.egress && abi >= 4;
    match landlock::ruleset(abi, read_dirs, run_dir, guard) {
        Ok(fd) => {
            decision.egress_guard = guard;
            let (all, read) = (landlock::access_all(abi), landlock::access_read(abi));
            if view {
                for dir in [view::SCRATCH, "/tmp", "/dev/shm"] {
                    inner.push((cstring(Path::new(dir))?, all));
                }
                inner.push((c"/dev/pts".to_owned(), landlock::access_terminals(abi)));
                // The view holds only what is allowlisted: its directories may be listed.
                inner.push((c"/".to_owned(), landlock::access_list(abi)));
            }
            if decision.pid_ns {
                inner.push((c"/proc".to_owned(), read));
            }
            Ok((Some(fd), inner))
        }
        Err(e) => {
            decision.missing.push(format!("landlock: {e}"));
            decision.landlock_abi = None;
            Ok((None, inner))
        }
    }
}

/// The run's cgroup, when the decision gives it one; one that cannot be made is missing, with why
/// (and shared memory is then refused instead).
pub(super) fn cgroup_for(decision: &mut Decision, config: &Sandbox) -> Option<RunCgroup> {
    match (decision.cgroup, cgroup::hierarchy()) {
        (Some(_), Ok(h)) => match RunCgroup::create(
            h,
            config.run_memory_bytes,
            config.processes,
            config.cpu_millis,
        ) {
            Ok(made) => Some(made),
            Err(e) => {
                // The hierarchy was usable a moment ago: say why this run has no cgroup.
                decision.missing.push(format!(
                    "memory limit for the whole run: the run's cgroup could not be made ({e})"
                ));
                decision.cgroup = None;
                decision.seccomp_extra.shared_memory = true;
                None
            }
        },
        _ => None,
    }
}

/// The rlimits of the interpreter (`RLIMIT_NPROC` aside, set once in the run's user namespace).
pub(super) fn rlimits_for(config: &Sandbox, cpu: u64) -> Vec<(libc::__rlimit_resource_t, u64)> {
    vec![
        (libc::RLIMIT_AS, config.memory_bytes),
        (libc::RLIMIT_CPU, cpu),
        (libc::RLIMIT_FSIZE, config.file_size_bytes),
        (libc::RLIMIT_NOFILE, config.open_files),
    ]
}
