//! Seccomp: a deny-list of system calls the code never needs and whose kernel code has a long record
//! of privilege escalations (or that reach another process: `pidfd_getfd`), the terminal ioctls
//! `TIOCSTI` and `TIOCSETD`, and `SO_PEERPIDFD` (a pidfd of a Unix socket's peer: the bridge's is the
//! host). Compiled to BPF once per process by `seccompiler`; installed by the
//! interpreter process last, just before exec.

use std::io;
use std::sync::OnceLock;

use super::sys::{in_forked_child, Step, StepError};

/// System calls that fail with `EPERM` for the code. Python and its libraries do not need them, and
/// their kernel code is where unprivileged exploits keep being found; the other layers (no
/// capability, no new namespace, Landlock) already refuse mounts, module loading and the like.
const DENIED_SYSCALLS: &[libc::c_long] = &[
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_bpf,
    libc::SYS_userfaultfd,
    libc::SYS_perf_event_open,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_kexec_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_acct,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    // Another process's descriptors, and its memory's advice: the code has no business with either,
    // and with a pidfd of the host (see `SO_PEERPIDFD` below) the first would take the host's files
    // where nothing else stops it (an unprivileged host, whose runs share its uid, without Landlock).
    libc::SYS_pidfd_getfd,
    libc::SYS_process_madvise,
];

/// `SO_PEERPIDFD` (Linux 6.5): a pidfd of a Unix socket's peer. The run's bridge is a socket pair the
/// host made, so its peer is the host: refused, so the code never holds a handle on the host process.
/// (`SO_PEERCRED` still answers: the pid it names reads 0 in the run's namespace.)
const SO_PEERPIDFD: u64 = 77;

/// What the deny-list adds for one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Extra {
    /// Refuse `memfd_create` and SysV `shmget`: without a memory cgroup nothing else counts the memory
    /// they hold (`RLIMIT_AS` sees only what is mapped).
    pub shared_memory: bool,
    /// Refuse `AF_VSOCK` sockets: vsock is not network-namespaced, so with the network off it would be
    /// a way out.
    pub vsock: bool,
}

/// The deny-list (with `extra`) compiled to BPF for this architecture, once per process and variant;
/// `None` where seccompiler has no backend.
pub(crate) fn filter(extra: Extra) -> Option<&'static seccompiler::BpfProgram> {
    static FILTERS: [OnceLock<Option<seccompiler::BpfProgram>>; 4] = [
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
    ];
    let slot = usize::from(extra.shared_memory) * 2 + usize::from(extra.vsock);
    FILTERS[slot].get_or_init(|| compile(extra)).as_ref()
}

fn compile(extra: Extra) -> Option<seccompiler::BpfProgram> {
    use seccompiler::{
        SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
        SeccompRule, TargetArch,
    };
    let arch = TargetArch::try_from(std::env::consts::ARCH).ok()?;
    // x86-64's x32 ABI reaches the same calls with bit 30 set in the number.
    let x32 = if arch == TargetArch::x86_64 {
        0x4000_0000
    } else {
        0
    };
    let mut denied: Vec<libc::c_long> = DENIED_SYSCALLS.to_vec();
    if extra.shared_memory {
        denied.extend([libc::SYS_memfd_create, libc::SYS_shmget]);
    }
    let mut rules: std::collections::BTreeMap<i64, Vec<SeccompRule>> = denied
        .iter()
        .flat_map(|&nr| [nr, nr | x32])
        .map(|nr| (nr, Vec::new()))
        .collect();
    if extra.vsock {
        let condition = SeccompCondition::new(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            libc::AF_VSOCK as u64,
        )
        .ok()?;
        let rule = SeccompRule::new(vec![condition]).ok()?;
        for nr in [libc::SYS_socket, libc::SYS_socket | x32] {
            rules.insert(nr, vec![rule.clone()]);
        }
    }
    // Two terminal ioctls a run's terminals (its devpts) never need. TIOCSTI pushes bytes into a
    // terminal's input as if typed there: no terminal is ever typed into from a run. TIOCSETD swaps
    // the line discipline (and loads its module where `dev.tty.ldisc_autoload` allows): n_gsm,
    // n_hdlc and the others are kernel code with a record of use-after-frees reachable from a pty.
    // The command is compared as the kernel reads it, 32 bits.
    let mut terminal = Vec::new();
    let commands: [u64; 2] = [libc::TIOCSTI, libc::TIOCSETD];
    for command in commands {
        let condition =
            SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, command).ok()?;
        terminal.push(SeccompRule::new(vec![condition]).ok()?);
    }
    for nr in [libc::SYS_ioctl, libc::SYS_ioctl | x32] {
        rules.insert(nr, terminal.clone());
    }
    let peer_pidfd = SeccompRule::new(vec![
        SeccompCondition::new(
            1,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            libc::SOL_SOCKET as u64,
        )
        .ok()?,
        SeccompCondition::new(2, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, SO_PEERPIDFD).ok()?,
    ])
    .ok()?;
    for nr in [libc::SYS_getsockopt, libc::SYS_getsockopt | x32] {
        rules.insert(nr, vec![peer_pidfd.clone()]);
    }
    let errno = u32::try_from(libc::EPERM).ok()?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno),
        arch,
    )
    .ok()?;
    filter.try_into().ok()
}

/// `filter` as the bytes of its `struct sock_filter` array (native byte order), for a process that
/// installs it itself: a run forked from a template.
pub(crate) fn program_bytes(filter: &seccompiler::BpfProgram) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(filter.len() * 8);
    for insn in filter {
        bytes.extend_from_slice(&insn.code.to_ne_bytes());
        bytes.push(insn.jt);
        bytes.push(insn.jf);
        bytes.extend_from_slice(&insn.k.to_ne_bytes());
    }
    bytes
}

/// Installs `filter` on the calling thread (`PR_SET_NO_NEW_PRIVS` is already set). Async-signal-safe.
pub(crate) fn install(filter: &seccompiler::BpfProgram) -> Result<(), StepError> {
    seccompiler::apply_filter(filter).map_err(|_| {
        StepError::new(
            Step::Seccomp,
            super::sys::errno_of(&io::Error::last_os_error()),
        )
    })
}

/// Whether the kernel installs `filter` and it refuses a denied call: tried once in a forked child.
pub(crate) fn probe(filter: &seccompiler::BpfProgram) -> Result<(), StepError> {
    in_forked_child(Step::Fork, || {
        // SAFETY: prctl and a keyctl with integer arguments.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(StepError::last(Step::NoNewPrivs));
            }
            install(filter)?;
            if libc::syscall(libc::SYS_keyctl, 0, 0, 0, 0, 0) >= 0
                || io::Error::last_os_error().raw_os_error() != Some(libc::EPERM)
            {
                return Err(StepError::new(Step::SeccompRefused, libc::EINVAL));
            }
        }
        Ok(())
    })
}
