//! Seccomp: a deny-list of system calls the code never needs and whose kernel code has a long record
//! of privilege escalations. Compiled to BPF once per process by `seccompiler`; installed by the
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
];

/// The deny-list compiled to BPF for this architecture, once per process; `None` where seccompiler
/// has no backend.
pub(crate) fn filter() -> Option<&'static seccompiler::BpfProgram> {
    static FILTER: OnceLock<Option<seccompiler::BpfProgram>> = OnceLock::new();
    FILTER
        .get_or_init(|| {
            use seccompiler::{SeccompAction, SeccompFilter, TargetArch};
            let arch = TargetArch::try_from(std::env::consts::ARCH).ok()?;
            // x86-64's x32 ABI reaches the same calls with bit 30 set in the number.
            let x32 = if arch == TargetArch::x86_64 {
                0x4000_0000
            } else {
                0
            };
            let rules = DENIED_SYSCALLS
                .iter()
                .flat_map(|&nr| [nr, nr | x32])
                .map(|nr| (nr, Vec::new()))
                .collect();
            let errno = u32::try_from(libc::EPERM).ok()?;
            let filter = SeccompFilter::new(
                rules,
                SeccompAction::Allow,
                SeccompAction::Errno(errno),
                arch,
            )
            .ok()?;
            filter.try_into().ok()
        })
        .as_ref()
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
