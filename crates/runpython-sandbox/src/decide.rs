//! Deciding a run's layers: a pure function of the configuration, what the kernel allows and who the
//! host is. No system call, no file: the plan is data, printed by `isolation_report` and unit-tested
//! over the matrix of probe results and requested layers.

use std::path::PathBuf;

use super::probe::{Kernel, NS_NAMES};
use super::seccomp::Extra;
use super::{Network, Sandbox};
use crate::report::{CpuReport, Isolation, LimitReport, RlimitReport, NETWORK_MEDIATED};

/// Who the host is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Host {
    pub euid: u32,
    pub egid: u32,
}

/// The layers a run gets, and what was requested but is missing (with why).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decision {
    /// `unshare` flags (a network namespace made ahead of time may later replace `CLONE_NEWNET`).
    pub unshare: libc::c_int,
    /// A PID namespace whose init is the run.
    pub pid_ns: bool,
    /// A root host runs the code as a fresh uid.
    pub drop_privileges: bool,
    /// The run's user namespace forbids user namespaces below it.
    pub forbid_nested_userns: bool,
    /// Landlock at this ABI.
    pub landlock_abi: Option<i32>,
    /// The seccomp deny-list.
    pub seccomp: bool,
    /// The rlimits (memory, CPU, file size, open files).
    pub rlimits: bool,
    /// `RLIMIT_NPROC`, when it can be enforced.
    pub nproc: Option<u64>,
    /// The code sees a filesystem view built from an allowlist, with a size-capped scratch.
    pub view: bool,
    /// The run gets a cgroup of this hierarchy (`"cgroup-v2"`, `"cgroup-v1"`).
    pub cgroup: Option<&'static str>,
    /// Its cgroup holds it to its CPUs.
    pub cpu: bool,
    /// What the seccomp filter refuses on top of the deny-list.
    pub seccomp_extra: Extra,
    /// The host decides the run's connections and lookups (its network policy is in force).
    pub egress: bool,
    /// The guard is in force for the run's network (Landlock, ABI 4+, refuses the run's own TCP
    /// bind and connect; its notifier takes the guarded program): set when the ruleset is built.
    pub egress_guard: bool,
    /// Requested layers that are not available, each with the reason.
    pub missing: Vec<String>,
}

impl Decision {
    /// The `isolation` report for a run that runs as `uid`, with `cpu_seconds` of CPU.
    pub(crate) fn report(&self, config: &Sandbox, uid: u32, cpu_seconds: u64) -> Isolation {
        let namespaces = NS_NAMES
            .iter()
            .filter(|(flag, _)| self.unshare & flag != 0)
            .map(|(_, name)| (*name).to_owned())
            .collect();
        let rlimits = if self.rlimits {
            RlimitReport {
                address_space_bytes: Some(config.memory_bytes),
                cpu_seconds: Some(cpu_seconds),
                file_size_bytes: Some(config.file_size_bytes),
                open_files: Some(config.open_files),
                processes: self.nproc,
            }
        } else {
            RlimitReport::default()
        };
        Isolation {
            namespaces,
            landlock: match (self.landlock_abi, config.landlock) {
                (Some(abi), _) => format!("abi-{abi}"),
                (None, false) => "off".into(),
                (None, true) => "unavailable".into(),
            },
            rlimits,
            seccomp: match (self.seccomp, config.seccomp) {
                (true, _) => "deny-list".into(),
                (false, false) => "off".into(),
                (false, true) => "unavailable".into(),
            },
            // The policy's mode and rules are its holder's to name (`Isolation::set_network_policy`).
            network: match self.egress {
                true => NETWORK_MEDIATED.into(),
                false if self.unshare & libc::CLONE_NEWNET != 0 => "off".into(),
                false => "host".into(),
            },
            network_rules: None,
            uid,
            kill: if self.pid_ns {
                "pid-namespace"
            } else {
                "process-group"
            }
            .into(),
            filesystem: if self.view { "allowlist" } else { "host" }.into(),
            memory: match (self.cgroup, self.rlimits) {
                (Some(kind), _) => LimitReport {
                    bytes: Some(config.run_memory_bytes),
                    enforced_by: kind.into(),
                },
                (None, true) => LimitReport {
                    bytes: Some(config.memory_bytes),
                    enforced_by: "rlimit".into(),
                },
                (None, false) => LimitReport {
                    bytes: None,
                    enforced_by: "none".into(),
                },
            },
            disk: if self.view {
                LimitReport {
                    bytes: Some(config.disk_bytes),
                    enforced_by: "tmpfs".into(),
                }
            } else {
                LimitReport {
                    bytes: None,
                    enforced_by: "none".into(),
                }
            },
            cpu: match (self.cpu, self.cgroup) {
                (true, Some(kind)) => CpuReport {
                    cpus: Some(config.cpu_millis as f64 / 1000.0),
                    enforced_by: kind.into(),
                },
                _ => CpuReport {
                    cpus: None,
                    enforced_by: "none".into(),
                },
            },
            bridge: None,
            start: START_FRESH.into(),
            missing: self.missing.clone(),
        }
    }

    /// Whether runs can be forked from a template under this decision, or why not. A template makes
    /// each run's PID, mount and user namespaces from its own user namespace, and the run's scratch
    /// lives in its filesystem view; a root host's template gives each run its own uid.
    pub(crate) fn template_eligible(&self, host: Host) -> Result<(), String> {
        if self.unshare & libc::CLONE_NEWUSER == 0 {
            return Err("templates need user namespaces".into());
        }
        if !self.pid_ns {
            return Err("templates need a PID namespace with its own /proc".into());
        }
        if !self.view {
            return Err("templates need a mount namespace for the run's filesystem view".into());
        }
        if host.euid == 0 && !self.drop_privileges {
            return Err(
                "a root host's templates run the code as a uid of its own: drop_privileges must be on"
                    .into(),
            );
        }
        Ok(())
    }
}

/// `isolation.start` of a run that got an interpreter of its own (cold or pooled).
pub(crate) const START_FRESH: &str = "fresh";

/// `isolation.start` of a run forked from a template.
pub(crate) const START_TEMPLATE: &str = "template";

/// Decides the layers. `closed_read_dir` is asked only when a dropped uid would run without a mount
/// namespace: the first directory the code must read that other users cannot traverse.
pub(crate) fn decide(
    config: &Sandbox,
    kernel: &Kernel,
    host: Host,
    closed_read_dir: impl FnOnce() -> Option<PathBuf>,
) -> Decision {
    let mut missing = Vec::new();
    let root = host.euid == 0;
    let mut drop_privileges = root && config.drop_privileges;

    let mut unshare = 0;
    if config.namespaces {
        if kernel.ns_flags == 0 {
            let why = kernel
                .ns_refused
                .iter()
                .find(|(f, _)| *f == libc::CLONE_NEWUSER)
                .map_or("not available to this user", |(_, why)| why.as_str());
            missing.push(format!("namespaces: user namespaces are refused: {why}"));
        } else {
            unshare = kernel.ns_flags;
            let host_network = matches!(config.network, Network::Host);
            if host_network {
                unshare &= !libc::CLONE_NEWNET;
            }
            for (flag, name) in NS_NAMES {
                if kernel.ns_flags & flag == 0 && (flag != libc::CLONE_NEWNET || !host_network) {
                    let why = kernel
                        .ns_refused
                        .iter()
                        .find(|(f, _)| f & flag != 0)
                        .map_or("refused by the kernel", |(_, why)| why.as_str());
                    missing.push(format!("{name} namespace: {why}"));
                }
            }
        }
    }
    let pid_mnt = libc::CLONE_NEWPID | libc::CLONE_NEWNS;
    let pid_ns = unshare & pid_mnt == pid_mnt && kernel.proc_mount.is_ok();
    if unshare & libc::CLONE_NEWPID != 0 && !pid_ns {
        let why = kernel.proc_mount.as_ref().err().map_or("", String::as_str);
        missing.push(format!(
            "pid namespace: a fresh /proc cannot be mounted: {why}"
        ));
        unshare &= !libc::CLONE_NEWPID;
    }
    let forbid_nested_userns = unshare & libc::CLONE_NEWUSER != 0 && kernel.userns_limit.is_ok();
    if unshare & libc::CLONE_NEWUSER != 0 && !forbid_nested_userns {
        missing.push(format!(
            "user namespace: nested user namespaces cannot be forbidden (no per-namespace \
             max_user_namespaces: {}), so the code can gain capabilities in namespaces of its own",
            kernel
                .userns_limit
                .as_ref()
                .err()
                .map_or("", String::as_str)
        ));
    }

    // Without a mount namespace a dropped uid can only use what others may traverse.
    if drop_privileges && unshare & libc::CLONE_NEWNS == 0 {
        if let Some(closed) = closed_read_dir() {
            missing.push(format!(
                "dropped uid: {} is closed to other users and there is no mount namespace to bind it",
                closed.display()
            ));
            drop_privileges = false;
        }
    }
    let uid_is_root = root && !drop_privileges;

    let landlock_abi = if !config.landlock {
        None
    } else if kernel.landlock_abi == 0 {
        missing.push("landlock: not supported or not enabled by the kernel".into());
        None
    } else {
        Some(kernel.landlock_abi)
    };

    let mut nproc = None;
    if config.rlimits {
        // The count is per user namespace (or per uid): enforceable for a run's own user namespace or
        // its own uid, never for root (exempt) nor for a shared uid without a namespace.
        if !uid_is_root && (unshare & libc::CLONE_NEWUSER != 0 || drop_privileges) {
            nproc = Some(config.processes);
        } else {
            missing.push(if uid_is_root {
                "processes limit: not enforced for root (enable drop_privileges)".into()
            } else {
                "processes limit: needs a user namespace or a dropped uid".into()
            });
        }
    }

    let seccomp = config.seccomp && kernel.seccomp.is_ok();
    if config.seccomp && !seccomp {
        missing.push(format!(
            "seccomp: {}",
            kernel.seccomp.as_ref().err().map_or("", String::as_str)
        ));
    }

    // The filesystem view and its size-capped scratch need a mount namespace.
    let view = unshare & libc::CLONE_NEWNS != 0;
    if config.namespaces && !view {
        missing.push(
            "filesystem view: needs a mount namespace, so the code sees the host's tree (Landlock \
             alone restricts it) and nothing caps what it writes"
                .into(),
        );
    }

    let cgroup = match (&kernel.cgroup, config.cgroups) {
        (Ok(kind), true) => Some(*kind),
        (Err(why), true) => {
            missing.push(format!(
                "memory limit for the whole run: no cgroup ({why}); each process's address space is \
                 limited instead, and memfd_create and SysV shared memory are refused"
            ));
            None
        }
        (_, false) => None,
    };
    let cpu = cgroup.is_some() && kernel.cgroup_cpu.is_ok();
    if let (Some(_), Err(why)) = (cgroup, &kernel.cgroup_cpu) {
        missing.push(format!(
            "cpu share: {why}; the run can use every CPU of the host"
        ));
    }
    // A policy needs the run's own network namespace (its only way out is the host's relay) and the
    // kernel's connect notifications; without either the run has no network at all.
    let egress = match &config.network {
        Network::Mediated => {
            let netns = unshare & (libc::CLONE_NEWNET | libc::CLONE_NEWUSER)
                == libc::CLONE_NEWNET | libc::CLONE_NEWUSER;
            match (&kernel.egress, netns) {
                (Ok(()), true) => true,
                (Err(why), _) => {
                    missing.push(format!("network policy: {why}; the run has no network"));
                    false
                }
                (Ok(()), false) => {
                    missing.push(
                        "network policy: needs user and network namespaces; the run has no network"
                            .into(),
                    );
                    false
                }
            }
        }
        _ => false,
    };
    let seccomp_extra = Extra {
        shared_memory: cgroup.is_none(),
        vsock: unshare & libc::CLONE_NEWNET != 0,
    };

    Decision {
        unshare,
        pid_ns,
        drop_privileges,
        forbid_nested_userns,
        landlock_abi,
        seccomp,
        rlimits: config.rlimits,
        nproc,
        view,
        cgroup,
        cpu,
        seccomp_extra,
        egress,
        egress_guard: false,
        missing,
    }
}

#[cfg(test)]
mod tests {
    use super::super::probe::ALL_NS;
    use super::*;

    const ROOT: Host = Host { euid: 0, egid: 0 };
    const USER: Host = Host {
        euid: 1000,
        egid: 1000,
    };

    fn open() -> Option<PathBuf> {
        None
    }

    #[test]
    fn everything_allowed_gives_every_layer_and_misses_nothing() {
        for host in [ROOT, USER] {
            let d = decide(&Sandbox::default(), &Kernel::permissive(), host, open);
            assert_eq!(d.unshare, ALL_NS);
            assert!(d.pid_ns && d.forbid_nested_userns && d.seccomp && d.rlimits);
            assert_eq!(d.landlock_abi, Some(7));
            assert_eq!(d.nproc, Some(256));
            assert_eq!(d.drop_privileges, host == ROOT);
            assert!(d.missing.is_empty(), "{:?}", d.missing);
            let report = d.report(&Sandbox::default(), 5, 61);
            assert_eq!(
                report.namespaces,
                ["user", "pid", "mount", "net", "ipc", "uts"]
            );
            assert_eq!(
                (report.network.as_str(), report.kill.as_str()),
                ("off", "pid-namespace")
            );
        }
    }

    #[test]
    fn templates_need_user_pid_and_mount_namespaces_and_a_run_uid_as_root() {
        let d = decide(&Sandbox::default(), &Kernel::permissive(), USER, open);
        assert_eq!(d.template_eligible(USER), Ok(()));
        assert_eq!(d.report(&Sandbox::default(), 1, 1).start, "fresh");
        let off = decide(&Sandbox::off(), &Kernel::permissive(), USER, open);
        assert_eq!(
            off.template_eligible(USER),
            Err("templates need user namespaces".into())
        );
        let no_proc = Kernel {
            proc_mount: Err("EPERM".into()),
            ..Kernel::permissive()
        };
        let d = decide(&Sandbox::default(), &no_proc, USER, open);
        assert!(d
            .template_eligible(USER)
            .unwrap_err()
            .contains("PID namespace"));
        let keep_root = Sandbox {
            drop_privileges: false,
            ..Sandbox::default()
        };
        let d = decide(&keep_root, &Kernel::permissive(), ROOT, open);
        assert!(d
            .template_eligible(ROOT)
            .unwrap_err()
            .contains("drop_privileges"));
        let d = decide(&Sandbox::default(), &Kernel::permissive(), ROOT, open);
        assert_eq!(d.template_eligible(ROOT), Ok(()));
    }

    #[test]
    fn layers_turned_off_are_off_not_missing() {
        let d = decide(&Sandbox::off(), &Kernel::permissive(), USER, open);
        assert_eq!(d.unshare, 0);
        assert!(!d.pid_ns && !d.seccomp && !d.rlimits);
        assert_eq!(d.landlock_abi, None);
        assert!(d.missing.is_empty(), "{:?}", d.missing);
        let report = d.report(&Sandbox::off(), 1000, 61);
        assert_eq!(report.landlock, "off");
        assert_eq!(report.seccomp, "off");
        assert_eq!(report.network, "host");
        assert_eq!(report.kill, "process-group");
    }

    #[test]
    fn allowing_the_network_keeps_the_host_network_without_calling_it_missing() {
        let config = Sandbox {
            network: Network::Host,
            ..Sandbox::default()
        };
        let kernel = Kernel {
            ns_flags: ALL_NS & !libc::CLONE_NEWNET,
            ns_refused: vec![(libc::CLONE_NEWNET, "EPERM".into())],
            ..Kernel::permissive()
        };
        let d = decide(&config, &kernel, USER, open);
        assert_eq!(d.unshare & libc::CLONE_NEWNET, 0);
        assert!(d.missing.is_empty(), "{:?}", d.missing);
        assert_eq!(d.report(&config, 1000, 1).network, "host");
    }

    #[test]
    fn no_user_namespaces_misses_namespaces_and_the_process_limit_with_the_reason() {
        let kernel = Kernel {
            ns_flags: 0,
            ns_refused: vec![(
                libc::CLONE_NEWUSER,
                "writing /proc/self/uid_map failed: EPERM".into(),
            )],
            proc_mount: Err("no PID and mount namespaces".into()),
            userns_limit: Err("no user namespaces".into()),
            ..Kernel::permissive()
        };
        let d = decide(&Sandbox::default(), &kernel, USER, open);
        assert_eq!(d.unshare, 0);
        assert!(!d.pid_ns);
        assert_eq!(d.nproc, None);
        assert_eq!(
            d.missing,
            [
                "namespaces: user namespaces are refused: writing /proc/self/uid_map failed: EPERM",
                "processes limit: needs a user namespace or a dropped uid",
                "filesystem view: needs a mount namespace, so the code sees the host's tree (Landlock \
                 alone restricts it) and nothing caps what it writes",
            ]
        );
        let report = d.report(&Sandbox::default(), 1000, 1);
        assert_eq!(
            (report.filesystem.as_str(), report.disk.enforced_by.as_str()),
            ("host", "none")
        );
        // As root, the dropped uid alone still enforces the process limit.
        let d = decide(&Sandbox::default(), &kernel, ROOT, open);
        assert!(d.drop_privileges);
        assert_eq!(d.nproc, Some(256));
    }

    #[test]
    fn a_refused_namespace_is_missing_with_the_probes_reason() {
        let kernel = Kernel {
            ns_flags: ALL_NS & !libc::CLONE_NEWIPC,
            ns_refused: vec![(
                libc::CLONE_NEWIPC,
                "creating the run's namespaces (unshare) failed: EINVAL".into(),
            )],
            ..Kernel::permissive()
        };
        let d = decide(&Sandbox::default(), &kernel, USER, open);
        assert_eq!(d.unshare & libc::CLONE_NEWIPC, 0);
        assert_eq!(
            d.missing,
            ["ipc namespace: creating the run's namespaces (unshare) failed: EINVAL"]
        );
    }

    #[test]
    fn no_fresh_proc_drops_the_pid_namespace() {
        let kernel = Kernel {
            proc_mount: Err("mounting the run's /proc failed: EPERM".into()),
            ..Kernel::permissive()
        };
        let d = decide(&Sandbox::default(), &kernel, USER, open);
        assert!(!d.pid_ns);
        assert_eq!(d.unshare & libc::CLONE_NEWPID, 0);
        assert_eq!(
            d.missing,
            ["pid namespace: a fresh /proc cannot be mounted: mounting the run's /proc failed: EPERM"]
        );
        assert_eq!(d.report(&Sandbox::default(), 1, 1).kill, "process-group");
    }

    #[test]
    fn nested_user_namespaces_that_cannot_be_forbidden_are_reported() {
        let kernel = Kernel {
            userns_limit: Err("EACCES".into()),
            ..Kernel::permissive()
        };
        let d = decide(&Sandbox::default(), &kernel, USER, open);
        assert!(!d.forbid_nested_userns);
        assert_eq!(d.missing.len(), 1);
        assert!(
            d.missing[0].starts_with("user namespace: nested user namespaces cannot be forbidden")
        );
    }

    #[test]
    fn a_root_host_without_drop_privileges_cannot_limit_processes() {
        let config = Sandbox {
            drop_privileges: false,
            ..Sandbox::default()
        };
        let d = decide(&config, &Kernel::permissive(), ROOT, open);
        assert!(!d.drop_privileges);
        assert_eq!(d.nproc, None);
        assert_eq!(
            d.missing,
            ["processes limit: not enforced for root (enable drop_privileges)"]
        );
    }

    #[test]
    fn a_closed_directory_without_a_mount_namespace_keeps_root() {
        let config = Sandbox {
            namespaces: false,
            ..Sandbox::default()
        };
        let d = decide(&config, &Kernel::permissive(), ROOT, || {
            Some(PathBuf::from("/root/.cache"))
        });
        assert!(!d.drop_privileges);
        assert_eq!(
            d.missing,
            [
                "dropped uid: /root/.cache is closed to other users and there is no mount namespace to bind it",
                "processes limit: not enforced for root (enable drop_privileges)",
            ]
        );
        // With a mount namespace the closed directory is bound in: the question is never asked.
        let d = decide(&Sandbox::default(), &Kernel::permissive(), ROOT, || {
            panic!("asked with a mount namespace")
        });
        assert!(d.drop_privileges);
    }

    #[test]
    fn without_a_cpu_controller_the_run_is_said_to_use_every_cpu() {
        let kernel = Kernel {
            cgroup_cpu: Err("no writable cgroup v1 cpu hierarchy".into()),
            ..Kernel::permissive()
        };
        let d = decide(&Sandbox::default(), &kernel, USER, open);
        assert!(!d.cpu);
        assert!(
            d.missing
                .iter()
                .any(|m| m.starts_with("cpu share: no writable cgroup v1 cpu hierarchy")),
            "{:?}",
            d.missing
        );
        let report = d.report(&Sandbox::default(), 1000, 61);
        assert_eq!(
            (report.cpu.cpus, report.cpu.enforced_by.as_str()),
            (None, "none")
        );
        let d = decide(&Sandbox::default(), &Kernel::permissive(), USER, open);
        let report = d.report(
            &Sandbox {
                cpu_millis: 1500,
                ..Sandbox::default()
            },
            1000,
            61,
        );
        assert_eq!(report.cpu.cpus, Some(1.5));
    }

    #[test]
    fn no_cgroup_limits_each_process_and_refuses_shared_memory_instead() {
        let kernel = Kernel {
            cgroup: Err(
                "cgroup v1 memory at /sys/fs/cgroup/memory is not writable by this user".into(),
            ),
            ..Kernel::permissive()
        };
        let d = decide(&Sandbox::default(), &kernel, USER, open);
        assert_eq!(d.cgroup, None);
        assert!(d.seccomp_extra.shared_memory && d.seccomp_extra.vsock);
        assert_eq!(d.missing.len(), 1);
        assert!(
            d.missing[0].starts_with("memory limit for the whole run: no cgroup (cgroup v1"),
            "{:?}",
            d.missing
        );
        let report = d.report(&Sandbox::default(), 1000, 1);
        assert_eq!(report.memory.enforced_by, "rlimit");
        // With a cgroup the run's whole memory is limited and shared memory is allowed.
        let d = decide(&Sandbox::default(), &Kernel::permissive(), USER, open);
        assert!(!d.seccomp_extra.shared_memory);
        let report = d.report(&Sandbox::default(), 1000, 1);
        assert_eq!(
            (report.memory.enforced_by.as_str(), report.memory.bytes),
            ("cgroup-v1", Some(4 << 30))
        );
        assert_eq!(
            (report.filesystem.as_str(), report.disk.bytes),
            ("allowlist", Some(1 << 30))
        );
    }

    #[test]
    fn the_network_allowed_lets_vsock_through() {
        let config = Sandbox {
            network: Network::Host,
            ..Sandbox::default()
        };
        let d = decide(&config, &Kernel::permissive(), USER, open);
        assert!(!d.seccomp_extra.vsock);
    }

    #[test]
    fn missing_landlock_and_seccomp_say_why() {
        let kernel = Kernel {
            landlock_abi: 0,
            seccomp: Err("no seccomp filter for this architecture".into()),
            ..Kernel::permissive()
        };
        let d = decide(&Sandbox::default(), &kernel, USER, open);
        assert_eq!(
            d.missing,
            [
                "landlock: not supported or not enabled by the kernel",
                "seccomp: no seccomp filter for this architecture",
            ]
        );
        let report = d.report(&Sandbox::default(), 1, 1);
        assert_eq!(
            (report.landlock.as_str(), report.seccomp.as_str()),
            ("unavailable", "unavailable")
        );
    }
}
