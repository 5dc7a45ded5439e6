//! What the kernel allows this host process to do, probed once per process, each refusal with the step
//! and errno that failed (for `isolation.missing`).

use std::sync::OnceLock;

use super::sys::{cvt, getegid, geteuid, in_forked_child, AtStep, Step, StepError};
use super::userns::{drop_ids, forbid_nested_user_namespaces, IdMaps, RUN_UID_BASE};
use super::{mounts, netns, per_boot, seccomp};

/// Every namespace flag the sandbox uses.
pub(crate) const ALL_NS: libc::c_int = libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS;

/// Namespace flags and their names in the `isolation` report.
pub(crate) const NS_NAMES: [(libc::c_int, &str); 6] = [
    (libc::CLONE_NEWUSER, "user"),
    (libc::CLONE_NEWPID, "pid"),
    (libc::CLONE_NEWNS, "mount"),
    (libc::CLONE_NEWNET, "net"),
    (libc::CLONE_NEWIPC, "ipc"),
    (libc::CLONE_NEWUTS, "uts"),
];

/// What the kernel allows. Plain data, so [`super::decide`] can be tested over every combination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Kernel {
    /// Namespace flags that work (including `CLONE_NEWUSER`), 0 when user namespaces do not.
    pub ns_flags: libc::c_int,
    /// Why each refused flag (or user namespaces as a whole) was refused.
    pub ns_refused: Vec<(libc::c_int, String)>,
    /// A fresh `/proc` can be mounted in a new PID + mount namespace, or why not.
    pub proc_mount: Result<(), String>,
    /// A new user namespace can forbid user namespaces below it, or why not.
    pub userns_limit: Result<(), String>,
    /// A non-root host can hand runs network namespaces made ahead of time.
    pub owned_netns: bool,
    /// The seccomp filter installs and refuses a denied call, or why not.
    pub seccomp: Result<(), String>,
    /// Landlock ABI version, 0 when unavailable.
    pub landlock_abi: i32,
    /// The cgroup hierarchy runs get cgroups in, or why there is none.
    pub cgroup: Result<&'static str, String>,
    /// Run cgroups get a CPU quota, or why not.
    pub cgroup_cpu: Result<(), String>,
    /// The host can be handed a run's connects (seccomp user notifications), or why not.
    pub egress: Result<(), String>,
}

impl Kernel {
    /// A kernel that allows everything (for tests of [`super::decide`]).
    #[cfg(test)]
    pub(crate) fn permissive() -> Self {
        Self {
            ns_flags: ALL_NS,
            ns_refused: Vec::new(),
            proc_mount: Ok(()),
            userns_limit: Ok(()),
            owned_netns: true,
            seccomp: Ok(()),
            landlock_abi: 7,
            cgroup: Ok("cgroup-v1"),
            cgroup_cpu: Ok(()),
            egress: Ok(()),
        }
    }
}

/// What this host's kernel allows runpython's sandbox, as `runpython doctor` prints it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KernelReport {
    /// Namespaces a run can get (`user`, `pid`, `mount`, `net`, `ipc`, `uts`).
    pub namespaces: Vec<String>,
    /// Namespaces the kernel refused, each with the step and error.
    pub refused: Vec<String>,
    /// `"ok"`, or why a fresh `/proc` cannot be mounted for a run.
    pub proc_mount: String,
    /// `"ok"`, or why a run's user namespace cannot forbid user namespaces below it.
    pub nested_userns_limit: String,
    /// `"ok"`, or why the seccomp filter cannot be installed.
    pub seccomp: String,
    /// The Landlock ABI version, `null` when Landlock is unavailable.
    pub landlock_abi: Option<i32>,
    /// The cgroup hierarchy runs get cgroups in, or why there is none.
    pub cgroup: String,
    /// `"ok"`, or why runs get no CPU quota.
    pub cgroup_cpu: String,
    /// `"ok"`, or why a network policy cannot be enforced (the host is handed each connect by a
    /// seccomp user notification).
    pub network_policy: String,
}

impl Kernel {
    pub(crate) fn report(&self) -> KernelReport {
        let name = |flag: libc::c_int| {
            NS_NAMES
                .iter()
                .find(|(f, _)| *f == flag)
                .map_or("user namespaces", |(_, n)| n)
        };
        let ok = |r: &Result<(), String>| r.as_ref().map_or_else(Clone::clone, |()| "ok".into());
        KernelReport {
            namespaces: NS_NAMES
                .iter()
                .filter(|(flag, _)| self.ns_flags & flag != 0)
                .map(|(_, n)| (*n).to_owned())
                .collect(),
            refused: self
                .ns_refused
                .iter()
                .map(|(flag, why)| format!("{}: {why}", name(*flag)))
                .collect(),
            proc_mount: ok(&self.proc_mount),
            nested_userns_limit: ok(&self.userns_limit),
            seccomp: ok(&self.seccomp),
            landlock_abi: (self.landlock_abi > 0).then_some(self.landlock_abi),
            cgroup: match &self.cgroup {
                Ok(kind) => (*kind).to_owned(),
                Err(why) => why.clone(),
            },
            cgroup_cpu: ok(&self.cgroup_cpu),
            network_policy: ok(&self.egress),
        }
    }
}

/// The probe, run once per process: the forked probes' answer from the per-boot cache when it holds
/// one for this process (see [`super::per_boot`]), else probed now and kept.
pub(crate) fn kernel() -> &'static Kernel {
    static KERNEL: OnceLock<Kernel> = OnceLock::new();
    KERNEL.get_or_init(|| {
        let forked = per_boot::load().unwrap_or_else(|| {
            let forked = forked();
            per_boot::store(&forked);
            forked
        });
        with_live(forked)
    })
}

/// Probes everything now, cache or not, and keeps the answer for the processes after this one (for
/// `runpython doctor`).
pub(crate) fn kernel_afresh() -> Kernel {
    let forked = forked();
    per_boot::store(&forked);
    with_live(forked)
}

fn reason(e: StepError) -> String {
    e.to_string()
}

fn passed(failure: Option<String>) -> Result<(), String> {
    failure.map_or(Ok(()), Err)
}

/// The forked answer completed with what is cheap to ask every time (Landlock's ABI, the cgroups).
fn with_live(forked: per_boot::Forked) -> Kernel {
    Kernel {
        ns_flags: forked.ns_flags,
        ns_refused: forked.ns_refused,
        proc_mount: passed(forked.proc_mount),
        userns_limit: passed(forked.userns_limit),
        owned_netns: forked.owned_netns,
        seccomp: passed(forked.seccomp),
        landlock_abi: super::landlock::abi(),
        cgroup: match super::cgroup::hierarchy() {
            Ok(h) => Ok(h.name()),
            Err(why) => Err(why.clone()),
        },
        cgroup_cpu: match super::cgroup::hierarchy() {
            Ok(h) => h.cpu(),
            Err(why) => Err(why.clone()),
        },
        egress: passed(forked.egress),
    }
}

/// What only a forked child can find out: which namespaces, a fresh `/proc`, the nested-namespace
/// limit, a network namespace a non-root host owns, the seccomp filter, the connect notifier.
fn forked() -> per_boot::Forked {
    let probe_uid = (geteuid() == 0).then_some(RUN_UID_BASE - 1);
    let try_flags = |flags| try_namespaces(flags, probe_uid, false, false);
    let mut ns_refused = Vec::new();
    let ns_flags = if try_namespaces(ALL_NS, probe_uid, true, false).is_ok() {
        ALL_NS
    } else if let Err(e) = try_flags(libc::CLONE_NEWUSER) {
        ns_refused.push((libc::CLONE_NEWUSER, reason(e)));
        0
    } else {
        let mut flags = libc::CLONE_NEWUSER;
        for f in [
            libc::CLONE_NEWPID | libc::CLONE_NEWNS,
            libc::CLONE_NEWNS,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWUTS,
        ] {
            match try_flags(libc::CLONE_NEWUSER | f) {
                Ok(()) => flags |= f,
                Err(e) => ns_refused.push((f, reason(e))),
            }
        }
        flags
    };
    let pid_mnt = libc::CLONE_NEWPID | libc::CLONE_NEWNS;
    let proc_mount = if ns_flags == ALL_NS {
        Ok(())
    } else if ns_flags & pid_mnt != pid_mnt {
        Err("no PID and mount namespaces".into())
    } else {
        try_namespaces(libc::CLONE_NEWUSER | pid_mnt, probe_uid, true, false).map_err(reason)
    };
    let userns_limit = if ns_flags == 0 {
        Err("no user namespaces".into())
    } else {
        try_namespaces(libc::CLONE_NEWUSER, probe_uid, false, true).map_err(reason)
    };
    let owned_netns = ns_flags == ALL_NS
        && geteuid() != 0
        && netns::new_owned_netns().is_ok_and(|ready| netns::probe_owned(&ready).is_ok());
    let seccomp = match seccomp::filter(seccomp::Extra {
        shared_memory: true,
        vsock: true,
    }) {
        None => Err("no seccomp filter for this architecture".into()),
        Some(filter) => seccomp::probe(filter).map_err(reason),
    };
    per_boot::Forked {
        ns_flags,
        ns_refused,
        proc_mount: proc_mount.err(),
        userns_limit: userns_limit.err(),
        owned_netns,
        seccomp: seccomp.err(),
        egress: probe_egress().err(),
    }
}

/// Whether a process can install the connect notifier (and so hand the host its connects): the
/// guarded program, the longer of the two, which uses nothing the other does not.
fn probe_egress() -> Result<(), String> {
    let program = super::egress::filter::program(true);
    let (host, child) = super::fd::pass::seqpacket_pair().map_err(|e| e.to_string())?;
    let result = in_forked_child(Step::Fork, || {
        // SAFETY: prctl with integer arguments.
        cvt(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) }).at(Step::NoNewPrivs)?;
        super::egress::setup::install_notifier(std::os::fd::AsRawFd::as_raw_fd(&child), program)
    })
    .map_err(reason);
    drop((host, child));
    result
}

/// Forks, and in the child tries what a run does: drop to `uid` (when root), unshare `flags`, write
/// the id maps, with `limit` forbid nested user namespaces, and with `proc` mount a fresh `/proc`
/// from PID 1 of the new namespace.
fn try_namespaces(
    flags: libc::c_int,
    uid: Option<u32>,
    proc: bool,
    limit: bool,
) -> Result<(), StepError> {
    let ids = IdMaps::new(uid.unwrap_or_else(geteuid), uid.unwrap_or_else(getegid));
    in_forked_child(Step::Fork, || {
        if let Some(uid) = uid {
            drop_ids(uid, uid)?;
        }
        // SAFETY: unshare with the flags being probed.
        cvt(unsafe { libc::unshare(flags) }).at(Step::Unshare)?;
        ids.write()?;
        if limit {
            forbid_nested_user_namespaces()?;
        }
        // The first child of the new PID namespace is its PID 1, which may mount its `/proc`.
        if proc {
            in_forked_child(Step::Fork, || mounts::mount_proc(c"/proc"))?;
        }
        Ok(())
    })
}
