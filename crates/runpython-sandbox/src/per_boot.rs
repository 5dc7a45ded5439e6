//! What a host keeps per boot, in a directory only its user can write (root: `/run/runpython`; else
//! `$XDG_RUNTIME_DIR/runpython`, else the user's cache directory), checked without following links; a
//! directory that fails the check is neither read nor written, and everything here is then done afresh.
//!
//! - **The forked half of the kernel probe.** A one-shot process (`runpython run`) would otherwise fork
//!   five children (one making a network namespace) before its run, ~4 ms of a 20 ms start. What the
//!   answer depends on is read fresh by every process and is the entry's key: the boot, the code that
//!   probed, the process's ids, namespaces, confinement (seccomp, capabilities, LSM label) and the
//!   sysctls that gate namespaces. Any difference and the probe runs again. A spawn failing at a setup
//!   step forgets the entry ([`forget`]), and `runpython doctor` always probes afresh.
//! - **When stale run directories were last swept** ([`due`]), so that many short processes do not
//!   each list the temp directory.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::sys::{getegid, geteuid};

/// Bumped whenever what the probe records or how it decides changes meaning.
const FORMAT: u32 = 1;

const FILE: &str = "kernel-probe.json";

/// What the forked probes found (`None`: it works; `Some(why)`: it does not).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Forked {
    pub ns_flags: libc::c_int,
    pub ns_refused: Vec<(libc::c_int, String)>,
    pub proc_mount: Option<String>,
    pub userns_limit: Option<String>,
    pub owned_netns: bool,
    pub seccomp: Option<String>,
    pub egress: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct Entry {
    key: String,
    forked: Forked,
}

/// The directory the entries live in, created (0700) if missing and checked once per process; `None`
/// where there is none this user alone can write. Also where a warm host's socket lives
/// (`runpython host`): a directory no other user can enter or write.
pub fn runtime_dir() -> Option<&'static Path> {
    dir()
}

fn dir() -> Option<&'static Path> {
    static DIR: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let base = if geteuid() == 0 {
            PathBuf::from("/run")
        } else if let Some(run) = std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
            PathBuf::from(run)
        } else {
            std::env::var_os("XDG_CACHE_HOME")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?
        };
        if !base.is_absolute() {
            return None;
        }
        let dir = base.join("runpython");
        let _ = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir);
        private_dir(&dir).then_some(dir)
    })
    .as_deref()
}

/// `dir` is a directory itself (not a link to one), owned by this user, writable by no one else.
fn private_dir(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir).is_ok_and(|m| {
        m.file_type().is_dir() && m.uid() == geteuid() && m.permissions().mode() & 0o022 == 0
    })
}

/// The entry's key: everything the forked probes' answer depends on, read now.
fn key() -> String {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let mut key = format!(
        "format={FORMAT} version={} code={} boot={} ids={}:{}",
        env!("CARGO_PKG_VERSION"),
        code_identity(),
        read("/proc/sys/kernel/random/boot_id").trim(),
        geteuid(),
        getegid(),
    );
    for ns in ["user", "mnt", "pid", "net", "ipc", "uts", "cgroup"] {
        let link = std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap_or_default();
        key.push_str(&format!(" {}", link.display()));
    }
    let status = read("/proc/self/status");
    for line in status.lines() {
        let confinement = [
            "NoNewPrivs:",
            "Seccomp:",
            "Seccomp_filters:",
            "CapEff:",
            "CapPrm:",
            "CapBnd:",
        ];
        if confinement.iter().any(|field| line.starts_with(field)) {
            key.push(' ');
            key.push_str(&line.split_whitespace().collect::<String>());
        }
    }
    key.push_str(&format!(
        " lsm={:?}",
        read("/proc/self/attr/current").trim()
    ));
    for sysctl in [
        "user/max_user_namespaces",
        "user/max_net_namespaces",
        "user/max_mnt_namespaces",
        "user/max_pid_namespaces",
        "kernel/unprivileged_userns_clone",
        "kernel/apparmor_restrict_unprivileged_userns",
        "kernel/apparmor_restrict_unprivileged_unconfined",
    ] {
        key.push_str(&format!(
            " {sysctl}={}",
            read(&format!("/proc/sys/{sysctl}")).trim()
        ));
    }
    key
}

/// The file holding this code (the executable, or the shared object the Python package loads), as
/// device, inode, size and modification time: a rebuilt or upgraded runpython probes again. The
/// loader names the main program as it was started (possibly relative, or not at all), so anything
/// but an absolute path is read through `/proc/self/exe`.
pub fn code_identity() -> String {
    // SAFETY: dladdr only reads the loader's tables; `info` is plain data it fills.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let here = code_identity as *const libc::c_void;
    // SAFETY: `here` is an address in this object; `info` outlives the call.
    let named = unsafe { libc::dladdr(here, &mut info) } != 0 && !info.dli_fname.is_null();
    let path = named
        .then(|| {
            // SAFETY: dladdr set dli_fname to a NUL-terminated path the loader keeps.
            let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
            PathBuf::from(
                <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name.to_bytes()),
            )
        })
        .filter(|path| path.is_absolute())
        .unwrap_or_else(|| PathBuf::from("/proc/self/exe"));
    match std::fs::metadata(&path) {
        Ok(m) => format!(
            "{}:{}:{}:{}.{}",
            m.dev(),
            m.ino(),
            m.size(),
            m.mtime(),
            m.mtime_nsec()
        ),
        Err(_) => "unknown".into(),
    }
}

/// The entry for this process, if one was kept under the same key.
pub(crate) fn load() -> Option<Forked> {
    load_in(dir()?, &key())
}

/// Keeps `forked` for the processes after this one (best effort: one that cannot be kept only costs
/// the next process the probe).
pub(crate) fn store(forked: &Forked) {
    if let Some(dir) = dir() {
        store_in(dir, &key(), forked);
    }
}

/// Whether the task `stamp` names is due, at most once per `every` across this user's processes on
/// this boot: `true` marks it done now. Where there is no private directory it is always due.
pub(crate) fn due(stamp: &str, every: std::time::Duration) -> bool {
    let Some(dir) = dir() else { return true };
    due_in(dir, stamp, every)
}

fn due_in(dir: &Path, stamp: &str, every: std::time::Duration) -> bool {
    let path = dir.join(stamp);
    let recent = std::fs::symlink_metadata(&path).is_ok_and(|m| {
        m.file_type().is_file()
            && m.modified()
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age < every)
    });
    if recent {
        return false;
    }
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path);
    true
}

/// Drops the entry: a spawn failed at a step, so the next process probes again.
pub(crate) fn forget() {
    if let Some(dir) = dir() {
        let _ = std::fs::remove_file(dir.join(FILE));
    }
}

fn load_in(dir: &Path, key: &str) -> Option<Forked> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.join(FILE))
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.file_type().is_file() || meta.uid() != geteuid() || meta.mode() & 0o022 != 0 {
        return None;
    }
    if meta.len() > 64 * 1024 {
        return None;
    }
    let entry: Entry = serde_json::from_reader(std::io::BufReader::new(file)).ok()?;
    (entry.key == key).then_some(entry.forked)
}

fn store_in(dir: &Path, key: &str, forked: &Forked) {
    let entry = Entry {
        key: key.to_owned(),
        forked: forked.clone(),
    };
    let Ok(text) = serde_json::to_vec(&entry) else {
        return;
    };
    let tmp = dir.join(format!(".{FILE}.{}", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .and_then(|mut f| f.write_all(&text));
    if written.is_err() || std::fs::rename(&tmp, dir.join(FILE)).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn sample() -> Forked {
        Forked {
            ns_flags: libc::CLONE_NEWUSER | libc::CLONE_NEWPID,
            ns_refused: vec![(libc::CLONE_NEWNET, "unshare: EPERM".into())],
            proc_mount: None,
            userns_limit: Some("no user namespaces".into()),
            owned_netns: false,
            seccomp: None,
            egress: Some("EINVAL".into()),
        }
    }

    #[test]
    fn an_entry_is_read_back_under_its_own_key_only() {
        let dir = tempfile::tempdir().unwrap();
        store_in(dir.path(), "k1", &sample());
        assert_eq!(load_in(dir.path(), "k1"), Some(sample()));
        assert_eq!(load_in(dir.path(), "k2"), None);
    }

    #[test]
    fn the_key_is_stable_within_a_process_and_names_what_it_depends_on() {
        let (a, b) = (key(), key());
        assert_eq!(a, b);
        for part in [
            "format=",
            "boot=",
            "ids=",
            "user:[",
            "Seccomp:",
            "CapEff:",
            "max_user_namespaces=",
        ] {
            assert!(a.contains(part), "{part} missing from {a}");
        }
    }

    #[test]
    fn a_file_others_may_write_or_a_link_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        store_in(dir.path(), "k", &sample());
        let file = dir.path().join(FILE);
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(
            load_in(dir.path(), "k"),
            None,
            "a world-writable entry was read"
        );

        let elsewhere = tempfile::tempdir().unwrap();
        store_in(elsewhere.path(), "k", &sample());
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(elsewhere.path().join(FILE), &file).unwrap();
        assert_eq!(
            load_in(dir.path(), "k"),
            None,
            "an entry was read through a link"
        );
    }

    #[test]
    fn a_task_is_due_once_per_period() {
        let dir = tempfile::tempdir().unwrap();
        let every = std::time::Duration::from_secs(60);
        assert!(due_in(dir.path(), "swept", every));
        assert!(!due_in(dir.path(), "swept", every));
        let long_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(120);
        std::fs::File::options()
            .write(true)
            .open(dir.path().join("swept"))
            .unwrap()
            .set_modified(long_ago)
            .unwrap();
        assert!(due_in(dir.path(), "swept", every));
        assert!(!due_in(dir.path(), "swept", every));
    }

    #[test]
    fn only_a_private_directory_of_this_user_is_used() {
        let dir = tempfile::tempdir().unwrap();
        let own = dir.path().join("own");
        std::fs::DirBuilder::new().mode(0o700).create(&own).unwrap();
        assert!(private_dir(&own));
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(!private_dir(&open));
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&own, &link).unwrap();
        assert!(!private_dir(&link));
        if geteuid() == 0 {
            let foreign = dir.path().join("foreign");
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&foreign)
                .unwrap();
            std::os::unix::fs::chown(&foreign, Some(12345), Some(12345)).unwrap();
            assert!(!private_dir(&foreign));
        }
    }
}
