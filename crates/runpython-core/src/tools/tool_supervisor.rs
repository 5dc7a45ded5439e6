//! The process that stands between the host and a command tool's process group, so that a host
//! killed with SIGKILL leaves none of the command's processes running.
//!
//! ```text
//! host ── P (std's fork of the host: leader of the call's process group; watches the host)
//!          └─ C (`sh -c COMMAND`, and everything it starts, in P's group)
//! ```
//!
//! Why not `PR_SET_PDEATHSIG` on the command alone (what the tool had): it is cleared in the children
//! of the process it is set on, so the `sh -c` died with the host but the programs it had started ran
//! on; and it fires when the *thread* that forked the process exits, not the host process, so it is
//! only as reliable as the thread a tool's future happens to be polled on. P watches the host
//! *process* through a pidfd (readable once every thread of the host is gone, however it died) and
//! then kills its whole process group. Otherwise it waits for C and leaves with C's status, so the
//! host sees what it would have seen without it. It is a fork of the host that never execs: it
//! only makes system calls and owns no descriptor but its two pidfds.
//!
//! What it cannot catch is what the group cannot: a process the command moved into a session of its
//! own (`setsid`). Without pidfds (Linux before 5.3) there is no P, and the command keeps only
//! `PR_SET_PDEATHSIG`.

use std::sync::OnceLock;

use runpython_sandbox::{close_from, exit_like, set_pdeathsig};

/// Makes `cmd` end with the host: it starts under a supervisor when the kernel has pidfds, else with
/// a parent-death signal alone. Call it after the command's own `pre_exec` hooks, with
/// `process_group(0)` set: P is the process tokio spawns (its pid is the group's id), C is what
/// execs the command.
pub(crate) fn supervise(cmd: &mut tokio::process::Command) {
    if !pidfds_work() {
        // SAFETY: prctl with integer arguments, between fork and exec.
        unsafe { cmd.pre_exec(set_pdeathsig) };
        return;
    }
    // SAFETY: getpid in the host.
    let host = unsafe { libc::getpid() };
    // SAFETY: the hook runs between fork and exec in std's child (P, single-threaded) and only makes
    // async-signal-safe system calls (fork, prctl, getppid, close_range, pidfd_open, poll, waitpid,
    // kill, _exit) on values prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let supervisor = libc::getpid();
            match libc::fork() {
                -1 => Err(std::io::Error::last_os_error()),
                0 => {
                    // C: dies with P (P is single-threaded: the thread that forked C is P), then
                    // goes on to exec the command.
                    set_pdeathsig()?;
                    if libc::getppid() != supervisor {
                        libc::_exit(137);
                    }
                    Ok(())
                }
                command => watch(host, command),
            }
        });
    }
}

/// P: closes everything it inherited (so only C holds the call's pipes and std's exec-error pipe,
/// whose end of file tells the host the exec happened), then waits for whichever ends first: the
/// host (kill the group) or C (leave with its status).
fn watch(host: libc::pid_t, command: libc::pid_t) -> ! {
    close_from(0);
    // SAFETY: prctl with a NUL-terminated constant; pidfd_open, getppid, poll, waitpid, kill and
    // _exit on our own processes and descriptors.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, c"runpython-tool".as_ptr(), 0, 0, 0);
        let host_fd = pidfd_open(host);
        // Opened after the fork: if the host died before, it is no longer our parent.
        if host_fd < 0 || libc::getppid() != host {
            libc::kill(0, libc::SIGKILL);
            libc::_exit(137);
        }
        let command_fd = pidfd_open(command);
        if command_fd < 0 {
            // Cannot happen for our own child; if it did, C is waited for without watching the host.
            wait_and_exit_like(command);
        }
        let mut fds = [
            libc::pollfd {
                fd: host_fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: command_fd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        loop {
            let ready = libc::poll(fds.as_mut_ptr(), 2, -1);
            if ready < 0 {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                break;
            }
            if fds[0].revents != 0 {
                // The host is gone: so is everything it started for this call.
                libc::kill(0, libc::SIGKILL);
                libc::_exit(137);
            }
            if fds[1].revents != 0 {
                break;
            }
        }
    }
    wait_and_exit_like(command)
}

/// P: reaps C and leaves with its status.
fn wait_and_exit_like(command: libc::pid_t) -> ! {
    let mut status = 0;
    // SAFETY: waitpid on our own child, _exit.
    unsafe {
        while libc::waitpid(command, &mut status, 0) < 0 {
            if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                libc::_exit(1);
            }
        }
    }
    exit_like(status)
}

/// A pidfd for `pid`, or -1.
fn pidfd_open(pid: libc::pid_t) -> libc::c_int {
    // SAFETY: pidfd_open takes a pid and flags; it returns a new descriptor or -1.
    unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) as libc::c_int }
}

/// Whether this kernel has `pidfd_open` (Linux 5.3), probed once per process.
fn pidfds_work() -> bool {
    static WORKS: OnceLock<bool> = OnceLock::new();
    *WORKS.get_or_init(|| {
        // SAFETY: getpid, and closing the descriptor pidfd_open returned.
        unsafe {
            let fd = pidfd_open(libc::getpid());
            if fd >= 0 {
                libc::close(fd);
            }
            fd >= 0
        }
    })
}
