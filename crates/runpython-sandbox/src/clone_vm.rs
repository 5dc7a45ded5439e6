//! Helpers born with `CLONE_VM`: the network namespaces made ahead for non-root hosts and the user
//! namespace of a root host's templates are made by a child that shares the host's memory.

use std::io;

/// Runs `entry(arg)` in a child that shares this process's memory (`CLONE_VM`, plus `flags`) on a
/// stack of its own: no copy of the host's page tables, and no copy-on-write faults in the host
/// afterwards, which a fork would cost. Returns the child's pid and its stack, to be freed only once
/// the child has exited.
///
/// # Safety
/// `entry` must make system calls only (it runs on the host's memory beside the host's threads), and
/// `arg` must stay valid until the child has exited.
pub(crate) unsafe fn clone_vm_helper(
    entry: extern "C" fn(*mut libc::c_void) -> libc::c_int,
    flags: libc::c_int,
    arg: *mut libc::c_void,
) -> io::Result<(libc::pid_t, Vec<u8>)> {
    const STACK: usize = 64 * 1024;
    let mut stack = vec![0u8; STACK];
    // SAFETY: the child runs `entry` on the top of `stack` (16-byte aligned), which the caller keeps
    // until the child has exited, with `arg`, valid as long by the caller's contract.
    let pid = unsafe {
        let top = stack.as_mut_ptr().add(STACK) as usize & !15;
        libc::clone(
            entry,
            top as *mut libc::c_void,
            libc::CLONE_VM | flags | libc::SIGCHLD,
            arg,
        )
    };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((pid, stack))
}
