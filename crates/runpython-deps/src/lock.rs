//! One exclusive file lock per environment key, so concurrent preparers build it once.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use tokio::time::Instant;

use crate::layout::LOCKS;
use crate::Error;

const POLL: Duration = Duration::from_millis(25);

/// A held lock; released on drop (and by the kernel if the process dies).
#[derive(Debug)]
pub(crate) struct KeyLock {
    _held: Flock<File>,
}

fn lock_path(root: &Path, name: &str) -> PathBuf {
    root.join(LOCKS).join(format!("{name}.lock"))
}

impl KeyLock {
    /// Takes the lock if it is free; `None` if someone holds it.
    pub(crate) fn try_acquire(root: &Path, name: &str) -> Result<Option<Self>, Error> {
        let path = lock_path(root, name);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::io("create the locks directory", dir, e))?;
        }
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io("open the lock file", &path, e))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(held) => Ok(Some(Self { _held: held })),
            Err((_, Errno::EWOULDBLOCK)) => Ok(None),
            Err((_, errno)) => Err(Error::io(
                "lock",
                &path,
                std::io::Error::from_raw_os_error(errno as i32),
            )),
        }
    }

    /// Waits (asynchronously, polling) for the lock until `deadline`. `on_wait` is called once if the
    /// lock is busy at first.
    pub(crate) async fn acquire(
        root: &Path,
        name: &str,
        deadline: Instant,
        on_wait: &(dyn Fn() + Send + Sync),
    ) -> Result<Self, Error> {
        let mut waited = false;
        loop {
            if let Some(lock) = Self::try_acquire(root, name)? {
                return Ok(lock);
            }
            if !waited {
                on_wait();
                waited = true;
            }
            if Instant::now() + POLL > deadline {
                return Err(Error::LockTimeout {
                    path: lock_path(root, name),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_held_lock_is_refused_until_released_then_taken() {
        let root = tempfile::tempdir().unwrap();
        let first = KeyLock::try_acquire(root.path(), "k").unwrap().unwrap();
        assert!(KeyLock::try_acquire(root.path(), "k").unwrap().is_none());
        let deadline = Instant::now() + Duration::from_millis(100);
        let err = KeyLock::acquire(root.path(), "k", deadline, &|| {})
            .await
            .unwrap_err();
        assert!(matches!(err, Error::LockTimeout { .. }), "{err}");
        drop(first);
        let deadline = Instant::now() + Duration::from_secs(5);
        KeyLock::acquire(root.path(), "k", deadline, &|| {})
            .await
            .unwrap();
    }
}
