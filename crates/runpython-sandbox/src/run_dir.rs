//! Run directories: a private 0700 directory per run under the temp directory, named for its host's
//! pid; removed off the run's critical path when the run ends, and swept when their host is gone (once
//! per process, and at most once a minute across a user's processes).

use std::path::Path;
use std::time::Duration;

use crate::error::Error;

/// A fresh private run directory with its `work` (the code's cwd without a view), `saved` and `home`.
pub fn create_run_dir() -> Result<(tempfile::TempDir, std::path::PathBuf), Error> {
    sweep_stale_run_dirs();
    let tmp = std::env::temp_dir();
    let run_dir = tempfile::Builder::new()
        .prefix(&format!("{RUN_DIR_PREFIX}{}-", std::process::id()))
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir_in(&tmp)
        .map_err(|source| Error::io("creating the run directory", &tmp, source))?;
    // Without a filesystem view the code works here; with one, these stay empty (its scratch, with
    // the same layout, is a tmpfs inside the view).
    for (dir, mode) in crate::view::SCRATCH_DIRS {
        if dir == "tmp" || dir == "shm" {
            continue;
        }
        let path = run_dir.path().join(dir);
        std::fs::create_dir(&path)
            .and_then(|()| {
                std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode))
            })
            .map_err(|source| Error::io("creating the run directory", &path, source))?;
    }
    let work_dir = run_dir.path().join("work");
    Ok((run_dir, work_dir))
}

/// Run directories are `<tmp>/runpython-<host pid>-<random>`.
const RUN_DIR_PREFIX: &str = "runpython-";

/// A run directory whose host is gone is removed once it is this old: a host killed with SIGKILL (or
/// one that exits without dropping its pooled interpreters) cannot remove its own.
const STALE_RUN_DIR_AGE: Duration = Duration::from_secs(3600);

/// How often stale run directories are looked for across a user's processes: a host starting many short
/// processes (`runpython run` in a loop) would otherwise list the temp directory in every one.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Once per process, when due (see [`SWEEP_EVERY`]), on a thread of its own: removes the run directories of hosts that are gone
/// (their pid no longer exists) and that are older than [`STALE_RUN_DIR_AGE`] (a pid from another
/// PID namespace sharing this `/tmp` looks gone too; the age keeps its live runs safe). Only
/// directories this user made are touched: its own uid's, or as root the uids runs are given.
fn sweep_stale_run_dirs() {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| {
        if !crate::per_boot::due("run-dirs-swept", SWEEP_EVERY) {
            return;
        }
        let _ = std::thread::Builder::new()
            .name("runpython-sweep".into())
            .spawn(|| sweep_run_dirs_in(&std::env::temp_dir(), STALE_RUN_DIR_AGE));
    });
}

/// [`sweep_stale_run_dirs`] in `dir`; returns how many were removed.
fn sweep_run_dirs_in(dir: &Path, min_age: Duration) -> usize {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let euid = nix::unistd::geteuid().as_raw();
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(RUN_DIR_PREFIX))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        // The entry itself, not a symlink's target; a directory; this user's (or, as root, a run uid's).
        let Ok(meta) = entry.path().symlink_metadata() else {
            continue;
        };
        let ours = meta.uid() == euid || (euid == 0 && crate::userns::is_run_uid(meta.uid()));
        let old = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age >= min_age);
        // SAFETY: kill with signal 0 only checks that the process exists.
        let gone = pid > 0
            && unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if meta.is_dir() && ours && old && gone && std::fs::remove_dir_all(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Removes a finished run's directory off the run's critical path: renamed aside at once (its path is
/// gone when the run returns), deleted by a blocking task, which a runtime shutting down still waits
/// for. Where the rename fails, or outside a runtime (an engine dropped by a thread of its own, as the
/// Python package drops one), it is deleted in place.
pub fn discard_run_dir(run_dir: tempfile::TempDir) {
    let path = run_dir.keep();
    let mut trash = path.clone().into_os_string();
    trash.push(".done");
    let trash = std::path::PathBuf::from(trash);
    let runtime = tokio::runtime::Handle::try_current();
    match runtime {
        Ok(runtime) if std::fs::rename(&path, &trash).is_ok() => {
            // The task owns a guard that deletes on drop: a runtime shutting down drops the blocking
            // tasks it has not started yet (a one-shot process exiting right after its run), and the
            // guard then deletes the directory there instead of leaving it for the next host's sweep.
            let trash = Trash(trash, crate::cleanup::Pending::new());
            runtime.spawn_blocking(move || drop(trash));
        }
        _ => {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// A finished run's directory, deleted when this is dropped; pending until then
/// ([`crate::cleanup::settle`]).
struct Trash(std::path::PathBuf, crate::cleanup::Pending);

impl Drop for Trash {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_run_dir_is_removed_outside_a_runtime_too() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_owned();
        std::fs::write(path.join("f"), b"x").unwrap();
        discard_run_dir(dir); // no runtime here: it must not panic
        assert!(!path.exists());
    }

    #[test]
    fn a_run_dir_is_removed_when_the_runtime_stops_before_its_removal_started() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(1)
            .build()
            .unwrap();
        let (started, wait) = std::sync::mpsc::channel();
        // The one blocking thread is busy, so the removal waits in the queue until the runtime stops.
        runtime.spawn_blocking(move || {
            started.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
        });
        wait.recv().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_owned();
        std::fs::write(path.join("f"), b"x").unwrap();
        runtime.block_on(async { discard_run_dir(dir) });
        drop(runtime);
        let mut trash = path.clone().into_os_string();
        trash.push(".done");
        assert!(!path.exists());
        assert!(
            !std::path::Path::new(&trash).exists(),
            "the renamed run directory was left behind"
        );
    }

    #[test]
    fn only_old_run_dirs_of_gone_hosts_are_swept() {
        let tmp = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let alive = std::process::id();
        let two_hours_ago = std::time::SystemTime::now() - Duration::from_secs(7200);
        let make = |name: &str, old: bool| {
            let path = tmp.path().join(name);
            std::fs::create_dir(&path).unwrap();
            std::fs::write(path.join("f"), b"x").unwrap();
            if old {
                std::fs::File::open(&path)
                    .unwrap()
                    .set_modified(two_hours_ago)
                    .unwrap();
            }
            path
        };
        let stale = make(&format!("runpython-{dead}-abc"), true);
        let stale_trash = make(&format!("runpython-{dead}-abc.done"), true);
        let young = make(&format!("runpython-{dead}-young"), false);
        let live_host = make(&format!("runpython-{alive}-live"), true);
        let other_name = make("runpython-legacy", true);
        let not_ours = make(&format!("python-{dead}-abc"), true);
        let file = tmp.path().join(format!("runpython-{dead}-file"));
        std::fs::write(&file, b"x").unwrap();
        let link = tmp.path().join(format!("runpython-{dead}-link"));
        std::os::unix::fs::symlink(&live_host, &link).unwrap();

        assert_eq!(sweep_run_dirs_in(tmp.path(), Duration::from_secs(3600)), 2);
        assert!(!stale.exists() && !stale_trash.exists());
        for kept in [&young, &live_host, &other_name, &not_ours, &file, &link] {
            assert!(kept.exists(), "{} was removed", kept.display());
        }
        assert!(live_host.join("f").exists(), "a symlink was followed");
    }
}
