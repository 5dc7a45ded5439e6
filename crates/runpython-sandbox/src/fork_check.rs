//! The host's check of a run forked from a template, from outside, before the run is handed its
//! code. A forked run takes its layers itself, in Python code that lives in its template
//! (`runpython_template.py`), and a template has imported its environment's packages: a package
//! that replaced that code could fork runs with a layer missing. So the host does not take the
//! run's word for it. Once the run says it is ready, the host reads what the kernel says of the
//! run's interpreter (the process that sent the word, named by the kernel's credentials on the
//! message, never by the template): `/proc/<pid>/status` (no-new-privs, capabilities, seccomp and
//! its filter count), its namespaces (its own, not its template's and not another run's), its id
//! maps, its limits, and the cgroups it sits in. A run that fails any of these is not handed code.
//!
//! What cannot be read from outside is not checked here: Landlock (the kernel shows no process's
//! domain) and the filesystem view. docs/security.md says what a warm package can still do.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use crate::error::Error;

/// The namespaces a forked run must have of its own, by their name under `/proc/<pid>/ns`.
const NAMESPACES: [&str; 6] = ["mnt", "pid", "user", "net", "ipc", "uts"];

/// What the host expects of a forked run's interpreter, prepared with its share of the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForkCheck {
    /// Namespaces (names under `/proc/<pid>/ns`) the run must have of its own.
    pub(crate) own_namespaces: Vec<&'static str>,
    /// Its one uid and gid mapping as the host sees it: `(inside, outside)`.
    pub(crate) uid_map: (u32, u32),
    pub(crate) gid_map: (u32, u32),
    /// `NoNewPrivs` set.
    pub(crate) no_new_privs: bool,
    /// Seccomp filters installed (none expected: not checked).
    pub(crate) seccomp_filters: Option<u32>,
    /// Limits by their row in `/proc/<pid>/limits`: `(name, soft, hard)`.
    pub(crate) limits: Vec<(&'static str, u64, u64)>,
}

/// A forked run's namespaces, by inode, as the host recorded them when it checked the run: no run
/// checked while it lives may share one. Each is held open: a namespace's number is the kernel's to
/// give to the next namespace made once this one is freed, which happens when the run's processes
/// exit, before the host lets go of the run. Held, the number stays this run's (a burst of forked
/// runs otherwise found a new run "in another run's namespace" and failed it).
#[derive(Debug)]
struct RunNamespaces(Vec<(&'static str, u64, std::os::fd::OwnedFd)>);

/// The namespaces of every checked run of this process that is still held ([`VerifiedRun`]).
static LIVE: std::sync::Mutex<Vec<std::sync::Weak<RunNamespaces>>> =
    std::sync::Mutex::new(Vec::new());

/// A forked run that passed [`ForkCheck::verify`]: while it is held, no other run may be found in
/// one of its namespaces. Hold it as long as the run lives.
#[derive(Debug)]
pub struct VerifiedRun {
    _namespaces: std::sync::Arc<RunNamespaces>,
}

impl RunNamespaces {
    /// Whether `other` shares any namespace with these.
    fn shares_with(&self, other: &RunNamespaces) -> Option<&'static str> {
        self.0
            .iter()
            .find(|(name, ino, _)| other.0.iter().any(|(n, i, _)| n == name && i == ino))
            .map(|(name, _, _)| *name)
    }
}

impl ForkCheck {
    /// Checks the interpreter `pid` (in the host's PID namespace) of a forked run whose init is
    /// `init_pid` and whose parent is its template's interpreter, in `cgroup_dirs` (the run's
    /// cgroups), against every run checked before it that is still held.
    pub fn verify(
        &self,
        pid: i32,
        init_pid: i32,
        cgroup_dirs: &[PathBuf],
    ) -> Result<VerifiedRun, Error> {
        let proc = PathBuf::from(format!("/proc/{pid}"));
        let read = |file: &str| {
            std::fs::read_to_string(proc.join(file))
                .map_err(|e| Error::io("reading a forked run's state", proc.join(file), e))
        };
        let status = read("status")?;
        let field = |name: &str| status_field(&status, name);
        let parent: i32 = field("PPid")
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| failed("its parent", "no PPid in its status"))?;

        if self.no_new_privs && field("NoNewPrivs") != Some("1") {
            return Err(failed("no_new_privs", "NoNewPrivs is not set"));
        }
        for caps in ["CapEff", "CapPrm", "CapAmb"] {
            match field(caps).map(|v| u64::from_str_radix(v, 16)) {
                Some(Ok(0)) => {}
                Some(Ok(set)) => {
                    return Err(failed(
                        "capabilities",
                        &format!("{caps} is {set:#x}, not empty"),
                    ))
                }
                _ => return Err(failed("capabilities", &format!("no {caps} in its status"))),
            }
        }
        if let Some(filters) = self.seccomp_filters {
            if field("Seccomp") != Some("2") {
                return Err(failed(
                    "seccomp",
                    &format!(
                        "seccomp mode is {}, not filter (2)",
                        field("Seccomp").unwrap_or("unknown")
                    ),
                ));
            }
            let got = field("Seccomp_filters").and_then(|n| n.parse::<u32>().ok());
            if got != Some(filters) {
                return Err(failed(
                    "seccomp",
                    &format!(
                        "{} filters installed, not the run's {filters}",
                        got.map_or("an unknown number of".into(), |n| n.to_string())
                    ),
                ));
            }
        }

        let ns_of = |pid: i32, name: &str| {
            std::fs::metadata(format!("/proc/{pid}/ns/{name}"))
                .map(|m| m.ino())
                .map_err(|e| failed("namespaces", &format!("cannot read {name} of {pid}: {e}")))
        };
        // The run's PID namespace is its init's, and the init is not the template.
        if ns_of(pid, "pid")? != ns_of(init_pid, "pid")? {
            return Err(failed(
                "namespaces",
                "the interpreter is not in its init's PID namespace",
            ));
        }
        let mut own = Vec::with_capacity(self.own_namespaces.len());
        for &name in &self.own_namespaces {
            let held = std::fs::File::open(format!("/proc/{pid}/ns/{name}"))
                .and_then(|f| Ok((f.metadata()?.ino(), std::os::fd::OwnedFd::from(f))))
                .map_err(|e| failed("namespaces", &format!("cannot open {name} of {pid}: {e}")))?;
            let (ino, fd) = held;
            if ino == ns_of(parent, name)? {
                return Err(failed(
                    "namespaces",
                    &format!("its {name} namespace is its template's"),
                ));
            }
            own.push((name, ino, fd));
        }
        let own = std::sync::Arc::new(RunNamespaces(own));
        {
            let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
            live.retain(|other| other.strong_count() > 0);
            let shared = live
                .iter()
                .filter_map(std::sync::Weak::upgrade)
                .find_map(|other| own.shares_with(&other));
            if let Some(name) = shared {
                return Err(failed(
                    "namespaces",
                    &format!("its {name} namespace is another run's"),
                ));
            }
            live.push(std::sync::Arc::downgrade(&own));
        }

        for (file, (inside, outside)) in [("uid_map", self.uid_map), ("gid_map", self.gid_map)] {
            let map = read(file)?;
            if parse_id_map(&map) != vec![(inside, outside, 1)] {
                return Err(failed(
                    "user namespace",
                    &format!("its {file} is {:?}, not {inside} {outside} 1", map.trim()),
                ));
            }
        }

        let limits = parse_limits(&read("limits")?);
        for (name, soft, hard) in &self.limits {
            match limits.iter().find(|(n, _, _)| n == name) {
                Some((_, s, h)) if s == soft && h == hard => {}
                Some((_, s, h)) => {
                    return Err(failed(
                        "rlimits",
                        &format!("{name} is {s}/{h}, not {soft}/{hard}"),
                    ))
                }
                None => return Err(failed("rlimits", &format!("no {name} in its limits"))),
            }
        }

        for dir in cgroup_dirs {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs"))
                .map_err(|e| Error::io("reading a run's cgroup", dir.join("cgroup.procs"), e))?;
            if !procs.lines().any(|line| line.trim() == pid.to_string()) {
                return Err(failed(
                    "cgroup",
                    &format!("the interpreter is not in its cgroup {}", dir.display()),
                ));
            }
        }
        Ok(VerifiedRun { _namespaces: own })
    }
}

/// A check that failed, named by the layer.
fn failed(layer: &str, why: &str) -> Error {
    Error::ForkUnverified(format!("{layer}: {why}"))
}

/// The value of `name:` in a `/proc/<pid>/status` text.
fn status_field<'a>(status: &'a str, name: &str) -> Option<&'a str> {
    status.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key == name).then(|| value.trim())
    })
}

/// The lines of a `uid_map` or `gid_map`: `(inside, outside, count)`.
fn parse_id_map(text: &str) -> Vec<(u32, u32, u32)> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace().map(|f| f.parse::<u32>().ok());
            Some((fields.next()??, fields.next()??, fields.next()??))
        })
        .collect()
}

/// The rows of `/proc/<pid>/limits`: `(name, soft, hard)`, `unlimited` as `u64::MAX`.
fn parse_limits(text: &str) -> Vec<(String, u64, u64)> {
    let value = |v: &str| match v {
        "unlimited" => Some(u64::MAX),
        n => n.parse().ok(),
    };
    text.lines()
        .skip(1)
        .filter_map(|line| {
            // The name is a column of its own, padded to 26 characters.
            let name = line.get(..26)?.trim();
            let mut rest = line.get(26..)?.split_whitespace();
            Some((name.to_owned(), value(rest.next()?)?, value(rest.next()?)?))
        })
        .collect()
}

/// The row of `/proc/<pid>/limits` that shows `resource`.
pub(crate) fn limit_row(resource: libc::__rlimit_resource_t) -> Option<&'static str> {
    Some(match resource {
        libc::RLIMIT_CPU => "Max cpu time",
        libc::RLIMIT_FSIZE => "Max file size",
        libc::RLIMIT_DATA => "Max data size",
        libc::RLIMIT_STACK => "Max stack size",
        libc::RLIMIT_CORE => "Max core file size",
        libc::RLIMIT_NPROC => "Max processes",
        libc::RLIMIT_NOFILE => "Max open files",
        libc::RLIMIT_MEMLOCK => "Max locked memory",
        libc::RLIMIT_AS => "Max address space",
        _ => return None,
    })
}

/// Every namespace of the run's that its configuration makes: `mnt`, `pid` and `user` always, and
/// `net`, `ipc`, `uts` when it unshares them.
pub(crate) fn own_namespaces(unshare: libc::c_int) -> Vec<&'static str> {
    NAMESPACES
        .into_iter()
        .filter(|name| match *name {
            "net" => unshare & libc::CLONE_NEWNET != 0,
            "ipc" => unshare & libc::CLONE_NEWIPC != 0,
            "uts" => unshare & libc::CLONE_NEWUTS != 0,
            _ => true,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read_by_their_name() {
        let status =
            "Name:\tpython3\nPPid:\t12\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t3\n";
        assert_eq!(status_field(status, "PPid"), Some("12"));
        assert_eq!(status_field(status, "Seccomp"), Some("2"));
        assert_eq!(status_field(status, "Seccomp_filters"), Some("3"));
        assert_eq!(status_field(status, "CapEff"), None);
    }

    #[test]
    fn id_maps_and_limits_parse_as_the_kernel_writes_them() {
        assert_eq!(
            parse_id_map("      1000 1073741825          1\n"),
            vec![(1000, 1_073_741_825, 1)]
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              11                   12                   seconds   \n\
                      Max open files            1024                 1024                 files     \n\
                      Max address space         unlimited            unlimited            bytes     \n";
        assert_eq!(
            parse_limits(limits),
            vec![
                ("Max cpu time".into(), 11, 12),
                ("Max open files".into(), 1024, 1024),
                ("Max address space".into(), u64::MAX, u64::MAX),
            ]
        );
    }

    #[test]
    fn a_process_is_read_from_outside() {
        // This process itself: not one of a run's, so each check names what it lacks.
        let me = std::process::id() as i32;
        let check = ForkCheck {
            own_namespaces: vec!["mnt"],
            uid_map: (0, 0),
            gid_map: (0, 0),
            no_new_privs: false,
            seccomp_filters: None,
            limits: Vec::new(),
        };
        // Its parent (the test harness's) shares its mount namespace.
        let err = check.verify(me, me, &[]).unwrap_err().to_string();
        assert!(
            err.contains("capabilities") || err.contains("its mnt namespace is its template's"),
            "{err}"
        );
    }

    #[test]
    fn two_runs_sharing_a_namespace_are_told_apart() {
        let held = || std::os::fd::OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let runs = |inos: [(&'static str, u64); 2]| {
            RunNamespaces(inos.into_iter().map(|(n, i)| (n, i, held())).collect())
        };
        let a = runs([("mnt", 1), ("net", 2)]);
        let b = runs([("mnt", 3), ("net", 2)]);
        let c = runs([("mnt", 4), ("net", 5)]);
        assert_eq!(a.shares_with(&b), Some("net"));
        assert_eq!(a.shares_with(&c), None);
    }
}
