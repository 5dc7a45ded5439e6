//! The run's view of the filesystem, built from an allowlist (as bubblewrap and nsjail do), never the
//! host's tree with holes punched in it.
//!
//! A fresh tmpfs becomes the run's root. Into it go, read-only, the system directories (`/usr`, `/etc`,
//! `/lib*`, `/bin`, `/sbin`; not `/sys`), the interpreter's prefix, runpython's code dir, the run's prepared
//! environment and any `read_paths`; a minimal `/dev` (null, zero, full, random, urandom, the
//! `/proc/self/fd` links, and the run's own terminals: a new devpts instance at `/dev/pts` with
//! `/dev/ptmx` linking to its `ptmx`); the run's own `/proc` (mounted by its init). Everything the code may write is
//! one more tmpfs of `disk_bytes`, the *scratch*, mounted at [`SCRATCH`]: `work/` (the code's cwd),
//! `tmp/` (bound onto `/tmp`), `shm/` (bound onto `/dev/shm`) and `saved/` (what `save_artifact` hands
//! the host). Nothing else of the host exists in the view: no `/run`, `/var`, `/home`, `/root`, so no
//! host Unix socket can be named. The host keeps a descriptor of the scratch, handed over by the run's
//! first process before any code runs, and reads the run's files beneath it.
//!
//! The plan is built in the host ([`plan`]); `mounts.rs` builds and enters it between fork and exec,
//! with plain system calls on its precomputed C strings.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use crate::error::Error;

/// Where the scratch is mounted inside the view.
pub const SCRATCH: &str = "/runpython";

/// The directories of the scratch, relative to it: the code's cwd, `/tmp`, `/dev/shm`, saved
/// artifacts, and `HOME` (with the caches and configuration libraries write, never collected).
pub const SCRATCH_DIRS: [(&str, u32); 5] = [
    ("work", 0o700),
    ("tmp", 0o1777),
    ("shm", 0o1777),
    ("saved", 0o700),
    ("home", 0o700),
];

/// System directories bound read-only (or re-created as the same symlink, for a merged `/usr`). Not
/// `/sys`: Python and its libraries fall back to `/proc` and `sysconf`, and a recursive bind of it
/// copies every mount below it (the cgroup hierarchies) into each run.
const SYSTEM: [&str; 8] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];

/// Device nodes bound into the view's `/dev`.
const DEVICES: [&str; 5] = ["null", "zero", "full", "random", "urandom"];

/// The run's own terminals: a new devpts instance at `/dev/pts` (never the host's ptys), whose
/// `ptmx` anyone in the run may open (`/dev/ptmx` links to it), each pty its opener's. At most 128
/// at once: the kernel's ptys are shared by every run (`kernel.pty.max` less the host's reserve),
/// so one run must not take them all.
pub(crate) const DEVPTS_OPTIONS: &str = "newinstance,ptmxmode=0666,mode=0620,max=128";

/// One step of building the view, in order.
#[derive(Debug)]
pub(super) enum Op {
    /// A fresh tmpfs over `target`.
    Tmpfs { target: CString, data: CString },
    /// A new devpts instance over `target` ([`DEVPTS_OPTIONS`]).
    Devpts { target: CString, data: CString },
    /// A directory (an existing one is fine), then exactly `mode`.
    Mkdir { path: CString, mode: u32 },
    /// Hands `path` to the run's uid (a root host builds the view before dropping to it).
    Chown(CString),
    /// An empty file to bind a file or device onto.
    File(CString),
    /// A symbolic link `path` -> `target`.
    Symlink { target: CString, path: CString },
    /// The host path `sources[source]` (opened before anything is mounted) bound onto `target`.
    Bind {
        source: usize,
        target: CString,
        readonly: bool,
    },
    /// A tmpfs of ours made read-only once everything is mounted in it.
    ReadOnly(CString),
}

/// The run's filesystem view, planned in the host.
#[derive(Debug, Default)]
pub(crate) struct View {
    /// Host paths bound into the view, opened (`O_PATH`) before the first mount.
    pub(super) sources: Vec<CString>,
    pub(super) ops: Vec<Op>,
    /// The host directory the new root is mounted on.
    pub(super) root: CString,
    /// The scratch inside the view (for the descriptor handed to the host) and the cwd.
    pub(super) scratch: CString,
    pub(super) work: CString,
    /// The run's uid and gid when the view is built as root before dropping to them.
    pub(super) owner: Option<(u32, u32)>,
}

/// What the view is built from.
#[derive(Debug)]
pub(crate) struct ViewSpec<'a> {
    /// An empty host directory to mount the new root on.
    pub root: &'a Path,
    /// Directories (or files) the code reads: bound read-only at their own paths.
    pub read_paths: &'a [PathBuf],
    /// Size of the scratch (everything the code may write).
    pub disk_bytes: u64,
    /// The run's uid and gid, when a root host builds the view before dropping to them.
    pub owner: Option<(u32, u32)>,
    /// The run has its own PID namespace (its init mounts a fresh `/proc`); else the host's is bound.
    pub pid_ns: bool,
    /// The host's network is shared: its resolver configuration is bound too.
    pub host_network: bool,
    /// A resolver configuration of the run's own (naming the host's resolver inside the run's
    /// network namespace), bound over `/etc/resolv.conf` (or where that link leads).
    pub resolver: Option<&'a Path>,
    /// A hosts file of the run's own (its name and `localhost` on its own loopback), bound over
    /// `/etc/hosts`.
    pub hosts: Option<&'a Path>,
}

/// A path as a C string; a NUL byte in it is the caller's error, named.
pub(crate) fn cstring(path: &Path) -> Result<CString, Error> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        Error::InvalidInput(format!(
            "the path {} contains a NUL byte; pass a path without one",
            path.display()
        ))
    })
}

/// The outermost ancestor of `dir` (or `dir` itself) that others cannot search.
pub(crate) fn first_untraversable(dir: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    dir.ancestors()
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .find(|a| {
            std::fs::metadata(a)
                .map(|m| m.permissions().mode() & 0o001 == 0)
                .unwrap_or(false)
        })
        .map(Path::to_owned)
}

/// Plans the view.
pub(crate) fn plan(spec: &ViewSpec<'_>) -> Result<View, Error> {
    let mut b = Planner {
        root: spec.root.to_owned(),
        view: View {
            root: cstring(spec.root)?,
            scratch: cstring(Path::new(SCRATCH))?,
            work: cstring(&Path::new(SCRATCH).join("work"))?,
            owner: spec.owner,
            ..View::default()
        },
        made: Vec::new(),
        bound: Vec::new(),
    };
    b.tmpfs(Path::new("/"), "mode=0755,size=4m,nr_inodes=4096")?;
    // The scratch: everything writable, one size limit.
    let scratch = Path::new(SCRATCH);
    b.mkdir(scratch, 0o755)?;
    let mut data = format!("mode=0700,size={}", spec.disk_bytes.max(4096));
    if let Some((uid, gid)) = spec.owner {
        data.push_str(&format!(",uid={uid},gid={gid}"));
    }
    b.tmpfs(scratch, &data)?;
    for (dir, mode) in SCRATCH_DIRS {
        b.mkdir(&scratch.join(dir), mode)?;
        b.chown(&scratch.join(dir))?;
    }
    b.mkdir(Path::new("/tmp"), 0o1777)?;
    b.bind_inside(&scratch.join("tmp"), Path::new("/tmp"))?;
    // A minimal /dev.
    let dev = Path::new("/dev");
    b.mkdir(dev, 0o755)?;
    b.tmpfs(dev, "mode=0755,size=64k,nr_inodes=64")?;
    for name in DEVICES {
        let host = Path::new("/dev").join(name);
        if host.exists() {
            b.file(&host)?;
            b.bind(&host, &host, false)?;
        }
    }
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        b.symlink(target, &dev.join(link))?;
    }
    b.mkdir(&dev.join("shm"), 0o1777)?;
    b.bind_inside(&scratch.join("shm"), &dev.join("shm"))?;
    b.mkdir(&dev.join("pts"), 0o755)?;
    b.devpts(&dev.join("pts"))?;
    b.symlink("pts/ptmx", &dev.join("ptmx"))?;
    b.read_only(dev)?;
    // The system, read-only.
    for dir in SYSTEM {
        let path = Path::new(dir);
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(path) {
                    b.symlink_path(&target, path)?;
                }
            }
            Ok(meta) if meta.is_dir() => {
                b.mkdir(path, 0o755)?;
                b.bind(path, path, true)?;
            }
            _ => {}
        }
    }
    b.mkdir(Path::new("/proc"), 0o555)?;
    if !spec.pid_ns {
        // No PID namespace, no fresh /proc: the host's (the isolation report says so).
        b.bind(Path::new("/proc"), Path::new("/proc"), false)?;
    }
    // What the code reads: bound read-only at its own path, parents first.
    let mut reads: Vec<PathBuf> = spec.read_paths.to_vec();
    if let Some(resolver) = spec.resolver {
        // None at all: glibc then asks 127.0.0.1, the run's resolver, by default.
        b.over_etc(resolver, Path::new("/etc/resolv.conf"))?;
    }
    if let Some(hosts) = spec.hosts {
        b.over_etc(hosts, Path::new("/etc/hosts"))?;
    }
    if spec.host_network {
        if let Ok(target) = std::fs::canonicalize("/etc/resolv.conf") {
            if !target.starts_with("/etc") {
                reads.push(target);
            }
        }
    }
    // A path through a system directory that is a link in the view (`/bin/sh` on a merged `/usr`)
    // is reached through that link: what it leads to is bound (a mount point cannot be made
    // beneath a link).
    let mut reads: Vec<PathBuf> = reads
        .into_iter()
        .filter_map(|p| match through_system_link(&p) {
            true => std::fs::canonicalize(p).ok(),
            false => Some(p),
        })
        .collect();
    reads.sort_by_key(|p| p.as_os_str().len());
    reads.dedup();
    for path in reads {
        if !path.is_absolute() || b.covered(&path) || !path.exists() {
            continue;
        }
        b.mkdir_parents(&path)?;
        if path.is_dir() {
            b.mkdir(&path, 0o755)?;
        } else {
            b.file(&path)?;
        }
        b.bind(&path, &path, true)?;
    }
    b.read_only(Path::new("/"))?;
    Ok(b.view)
}

/// Whether `path` lies beneath one of the [`SYSTEM`] directories that is a symbolic link on this host
/// (and so in the view).
fn through_system_link(path: &Path) -> bool {
    SYSTEM.iter().any(|dir| {
        path.starts_with(dir)
            && std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink())
    })
}

/// Builds a [`View`]'s operations with paths inside the new root.
struct Planner {
    root: PathBuf,
    view: View,
    /// Directories already made in the view.
    made: Vec<PathBuf>,
    /// Paths bound read-only (what lies beneath is covered).
    bound: Vec<PathBuf>,
}

impl Planner {
    /// `inside` (an absolute path in the view) as a host path under the new root.
    fn host(&self, inside: &Path) -> Result<CString, Error> {
        let rel = inside.strip_prefix("/").unwrap_or(inside);
        if rel.as_os_str().is_empty() {
            return cstring(&self.root);
        }
        cstring(&self.root.join(rel))
    }

    fn covered(&self, path: &Path) -> bool {
        self.bound.iter().any(|b| path.starts_with(b))
            || [Path::new("/proc"), Path::new("/dev"), Path::new(SCRATCH)]
                .iter()
                .any(|p| path.starts_with(p))
    }

    fn tmpfs(&mut self, inside: &Path, data: &str) -> Result<(), Error> {
        let op = Op::Tmpfs {
            target: self.host(inside)?,
            data: CString::new(data).map_err(|e| Error::Internal(e.to_string()))?,
        };
        self.view.ops.push(op);
        Ok(())
    }

    /// Binds the host file `source` over the file `etc` of the view's `/etc` (bound already), or
    /// over where it leads when it is a link out of `/etc` (systemd-resolved's `resolv.conf`), made
    /// in the view. Nothing when the host has no such file.
    fn over_etc(&mut self, source: &Path, etc: &Path) -> Result<(), Error> {
        match std::fs::canonicalize(etc) {
            // Inside /etc: over the file itself, a mount point that exists.
            Ok(target) if target.starts_with("/etc") => self.bind(source, &target, true),
            Ok(target) => {
                self.mkdir_parents(&target)?;
                self.file(&target)?;
                self.bind(source, &target, true)
            }
            Err(_) => Ok(()),
        }
    }

    fn devpts(&mut self, inside: &Path) -> Result<(), Error> {
        let op = Op::Devpts {
            target: self.host(inside)?,
            data: CString::new(DEVPTS_OPTIONS).map_err(|e| Error::Internal(e.to_string()))?,
        };
        self.view.ops.push(op);
        Ok(())
    }

    fn mkdir(&mut self, inside: &Path, mode: u32) -> Result<(), Error> {
        if self.made.iter().any(|m| m == inside) {
            return Ok(());
        }
        let op = Op::Mkdir {
            path: self.host(inside)?,
            mode,
        };
        self.view.ops.push(op);
        self.made.push(inside.to_owned());
        Ok(())
    }

    fn mkdir_parents(&mut self, inside: &Path) -> Result<(), Error> {
        let parents: Vec<PathBuf> = inside
            .ancestors()
            .skip(1)
            .filter(|a| a.parent().is_some())
            .map(Path::to_owned)
            .collect();
        for parent in parents.into_iter().rev() {
            self.mkdir(&parent, 0o755)?;
        }
        Ok(())
    }

    fn chown(&mut self, inside: &Path) -> Result<(), Error> {
        if self.view.owner.is_some() {
            let op = Op::Chown(self.host(inside)?);
            self.view.ops.push(op);
        }
        Ok(())
    }

    fn file(&mut self, inside: &Path) -> Result<(), Error> {
        let op = Op::File(self.host(inside)?);
        self.view.ops.push(op);
        Ok(())
    }

    fn symlink(&mut self, target: &str, inside: &Path) -> Result<(), Error> {
        self.symlink_path(Path::new(target), inside)
    }

    fn symlink_path(&mut self, target: &Path, inside: &Path) -> Result<(), Error> {
        let op = Op::Symlink {
            target: cstring(target)?,
            path: self.host(inside)?,
        };
        self.view.ops.push(op);
        Ok(())
    }

    /// Binds the host path `source` onto `inside`.
    fn bind(&mut self, source: &Path, inside: &Path, readonly: bool) -> Result<(), Error> {
        let op = Op::Bind {
            source: self.view.sources.len(),
            target: self.host(inside)?,
            readonly,
        };
        self.view.sources.push(cstring(source)?);
        self.view.ops.push(op);
        if readonly {
            self.bound.push(inside.to_owned());
        }
        Ok(())
    }

    /// Binds a path of the view onto another path of the view (scratch subdirectories): its source is
    /// opened when bound, since it exists only once the scratch is mounted.
    fn bind_inside(&mut self, from: &Path, inside: &Path) -> Result<(), Error> {
        let source = self.host(from)?;
        let op = Op::Bind {
            source: self.view.sources.len() + INSIDE_SOURCE,
            target: self.host(inside)?,
            readonly: false,
        };
        self.view.sources.push(source);
        self.view.ops.push(op);
        Ok(())
    }

    fn read_only(&mut self, inside: &Path) -> Result<(), Error> {
        let op = Op::ReadOnly(self.host(inside)?);
        self.view.ops.push(op);
        Ok(())
    }
}

/// Bind sources at or above this index (less it) are paths inside the new root, opened when used
/// (they exist only once the scratch is mounted) rather than before the first mount.
pub(super) const INSIDE_SOURCE: usize = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_untraversable_finds_the_outermost_closed_directory() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let closed = dir.path().join("closed");
        std::fs::create_dir_all(closed.join("inner")).unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(first_untraversable(&closed.join("inner")), Some(closed));
    }

    #[test]
    fn a_nul_byte_in_a_path_is_the_callers_error() {
        use std::os::unix::ffi::OsStrExt;
        let path = Path::new(std::ffi::OsStr::from_bytes(b"/tmp/a\0b"));
        let e = cstring(path).unwrap_err();
        assert!(matches!(e, Error::InvalidInput(_)), "{e}");
    }

    fn targets(view: &View) -> Vec<String> {
        view.ops
            .iter()
            .filter_map(|op| match op {
                Op::Bind {
                    target, readonly, ..
                } => Some(format!(
                    "{}{}",
                    target.to_str().unwrap(),
                    if *readonly { " ro" } else { "" }
                )),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_view_holds_the_allowlist_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let code = dir.path().join("code");
        std::fs::create_dir(&code).unwrap();
        let root = dir.path().join("root");
        let view = plan(&ViewSpec {
            root: &root,
            read_paths: &[code.clone(), PathBuf::from("/usr/lib")],
            disk_bytes: 1 << 30,
            owner: None,
            pid_ns: true,
            host_network: false,
            resolver: None,
            hosts: None,
        })
        .unwrap();
        let r = root.display().to_string();
        let binds = targets(&view);
        assert!(binds.contains(&format!("{r}/tmp")), "{binds:?}");
        assert!(binds.contains(&format!("{r}/dev/shm")), "{binds:?}");
        assert!(binds.contains(&format!("{r}/dev/null")), "{binds:?}");
        assert!(
            binds.contains(&format!("{r}{} ro", code.display())),
            "{binds:?}"
        );
        // /usr/lib is under /usr, bound already; nothing of /run, /var, /home or /root.
        assert!(!binds.iter().any(|b| b.contains("/usr/lib")), "{binds:?}");
        for absent in ["/run", "/var", "/home", "/root", "/proc"] {
            assert!(
                !binds.iter().any(
                    |b| b == &format!("{r}{absent}") || b.starts_with(&format!("{r}{absent}/"))
                ),
                "{absent} is in the view: {binds:?}"
            );
        }
        // Without a PID namespace the host's /proc is bound instead of a fresh one.
        let view = plan(&ViewSpec {
            root: &root,
            read_paths: &[],
            disk_bytes: 1 << 20,
            owner: Some((5, 5)),
            pid_ns: false,
            host_network: false,
            resolver: None,
            hosts: None,
        })
        .unwrap();
        assert!(targets(&view).contains(&format!("{r}/proc")));
        assert!(view.ops.iter().any(|op| matches!(op, Op::Chown(_))));
    }

    #[test]
    fn a_read_path_through_a_linked_system_dir_is_bound_where_it_leads() {
        use std::os::unix::ffi::OsStrExt;
        let Ok(bin) = std::fs::read_link("/bin") else {
            eprintln!("skipped: /bin is not a link on this host (no merged /usr)");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let view = plan(&ViewSpec {
            root: &root,
            read_paths: &[PathBuf::from("/bin/sh"), PathBuf::from("/bin")],
            disk_bytes: 1 << 20,
            owner: None,
            pid_ns: true,
            host_network: false,
            resolver: None,
            hosts: None,
        })
        .unwrap();
        // Nothing is made beneath the view's /bin, a link (the kernel refuses a mount point there);
        // /bin/sh is reached through it, in /usr, bound already.
        let beneath = root.join("bin/");
        let made: Vec<&Op> = view
            .ops
            .iter()
            .filter(|op| match op {
                Op::Mkdir { path, .. } | Op::File(path) => {
                    Path::new(std::ffi::OsStr::from_bytes(path.as_bytes())).starts_with(&beneath)
                }
                Op::Bind { target, .. } => {
                    Path::new(std::ffi::OsStr::from_bytes(target.as_bytes())).starts_with(&beneath)
                }
                _ => false,
            })
            .collect();
        assert!(made.is_empty(), "/bin -> {bin:?}: {made:?}");
    }

    #[test]
    fn the_view_has_terminals_and_a_hosts_file_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let hosts = dir.path().join("hosts");
        std::fs::write(&hosts, "127.0.0.1 localhost runpython\n").unwrap();
        let view = plan(&ViewSpec {
            root: &root,
            read_paths: &[],
            disk_bytes: 1 << 20,
            owner: None,
            pid_ns: true,
            host_network: false,
            resolver: None,
            hosts: Some(&hosts),
        })
        .unwrap();
        let r = root.display().to_string();
        // A new devpts instance, never a bind of the host's, with ptmx a link into it, mounted
        // before /dev is made read-only (a mount point of its own stays writable).
        let devpts = view
            .ops
            .iter()
            .position(|op| {
                matches!(op, Op::Devpts { target, data }
                if target.to_str().unwrap() == format!("{r}/dev/pts")
                    && data.to_str().unwrap().contains("newinstance"))
            })
            .expect("no devpts of its own");
        let dev_read_only = view
            .ops
            .iter()
            .position(
                |op| matches!(op, Op::ReadOnly(t) if t.to_str().unwrap() == format!("{r}/dev")),
            )
            .unwrap();
        assert!(devpts < dev_read_only);
        assert!(view.ops.iter().any(|op| matches!(op, Op::Symlink { target, path }
            if target.to_str() == Ok("pts/ptmx") && path.to_str().unwrap() == format!("{r}/dev/ptmx"))));
        assert!(
            !targets(&view).iter().any(|b| b.contains("/dev/pts")),
            "the host's ptys are bound"
        );
        if std::path::Path::new("/etc/hosts").exists() {
            let at = std::fs::canonicalize("/etc/hosts").unwrap();
            assert!(
                targets(&view).contains(&format!("{r}{} ro", at.display())),
                "{:?}",
                targets(&view)
            );
        }
    }
}
