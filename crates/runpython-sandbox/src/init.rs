//! Between fork and exec: the run's processes S, G and H and the steps each takes.
//!
//! ```text
//! host ── S (tokio's child: host PID ns, own process group; waits, replicates the status)
//!          └─ G (PID 1 of the run's PID ns: mounts /proc, reaps orphans, reports H's status)
//!               └─ H (the Python interpreter)
//! ```
//!
//! S is std's fork of the host; G and H share S's memory (`CLONE_VM`, H vfork-style until it execs),
//! so the host's page tables are copied once per run, not three times. Everything here makes plain
//! system calls on values the host prepared ([`Plan`]); a failure names its [`Step`].

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use super::fd::pass::send_fd;
use super::plan::Exec;
use super::sys::{
    cloexec_from, close_from, cvt, exit_like, read_exact_fd, set_pdeathsig, set_rlimit,
    write_all_fd, zero_host_args, AtStep, Step, StepError,
};
use super::userns::{drop_ids, forbid_nested_user_namespaces};
use super::{cgroup, landlock, mounts, netns, seccomp, Plan};

/// Runs in tokio's forked child (S) before exec. Returns `Ok` only in the process that must exec the
/// interpreter; S and G (with a PID namespace) wait there and `_exit` with the interpreter's status.
/// A failure reaches the host's `spawn` as an `io::Error` that [`StepError::from_io`] decodes.
///
/// # Safety
///
/// Only between fork and exec, in the child: it unshares, mounts, changes credentials and may
/// never return from a process that is a copy of the host.
pub(crate) unsafe fn enter(plan: &Plan) -> io::Result<()> {
    enter_steps(plan).map_err(StepError::to_io)
}

fn enter_steps(plan: &Plan) -> Result<(), StepError> {
    // First of all, so every process of the run is counted (and limited) by its cgroup.
    let procs: &[RawFd] = match plan.cgroup_procs.iter().position(|&fd| fd < 0) {
        Some(n) => &plan.cgroup_procs[..n],
        None => &plan.cgroup_procs,
    };
    cgroup::join(procs)?;
    // Replicating a crash signal must not write a core file.
    set_rlimit(libc::RLIMIT_CORE, 0, 0).at(Step::Rlimit)?;
    let pid_ns = plan.unshare & libc::CLONE_NEWPID != 0;
    if plan.view_as_root {
        // A root host builds the view as root (it can open what the run's uid cannot traverse, like
        // `/root/.pyenv`), in mount and PID namespaces owned by the host's user namespace: the new
        // root is then not a locked mount, and the init mounts the run's /proc before the pivot.
        // The user namespace (with IPC and UTS) comes after, entered by the last process standing
        // before the interpreter.
        // (A template keeps the early PID namespace too: its init is that one's PID 1.)
        let early = plan.unshare
            & (libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWNET)
            & !(plan.template_late() & libc::CLONE_NEWNET);
        // SAFETY: unshare with flags the probe found to work.
        cvt(unsafe { libc::unshare(early | libc::CLONE_NEWNS) }).at(Step::Unshare)?;
        if early & libc::CLONE_NEWNET != 0 {
            netns::loopback_up()?;
        }
        join_netns(plan)?;
        egress_sockets(plan)?;
        if let Some(view) = &plan.view {
            mounts::build(view, &mounts::open_sources(view)?)?;
        }
        if pid_ns {
            return start_init(plan, exec_of(plan)?);
        }
        enter_view(plan, false)?;
        enter_userns(plan, plan.unshare & !early)?;
        set_nproc(plan)?;
    } else {
        join_netns(plan)?;
        if plan.netns.is_some() {
            // Root of the user namespace that owns the namespace made ahead of time.
            egress_sockets(plan)?;
        }
        if let Some((uid, gid)) = plan.drop_to {
            drop_ids(uid, gid)?;
        }
        enter_userns(plan, plan.unshare)?;
        if plan.netns.is_none() {
            // The run's own user namespace owns its network namespace; its capabilities last until
            // the exec.
            egress_sockets(plan)?;
        }
        if let Some(view) = &plan.view {
            mounts::build(view, &mounts::open_sources(view)?)?;
        }
        set_nproc(plan)?;
        if pid_ns {
            return start_init(plan, exec_of(plan)?);
        }
        enter_view(plan, false)?;
    }
    inner_setup(plan)?;
    // H: the interpreter.
    restrict_interpreter(plan)
}

fn exec_of(plan: &Plan) -> Result<&Exec, StepError> {
    plan.exec
        .as_ref()
        .ok_or(StepError::new(Step::Exec, libc::EINVAL))
}

/// Joins the network namespace made ahead of time (and, for a non-root host, the user namespace that
/// owns it).
fn join_netns(plan: &Plan) -> Result<(), StepError> {
    if let Some(netns) = &plan.netns {
        if let Some(owner) = &netns.owner {
            // SAFETY: setns into a user namespace the host's uid owns; S is single-threaded.
            cvt(unsafe { libc::setns(owner.as_raw_fd(), libc::CLONE_NEWUSER) })
                .at(Step::JoinOwnerUserns)?;
        }
        // SAFETY: setns on a namespace descriptor the host prepared; root, or its owner's root.
        cvt(unsafe { libc::setns(netns.net.as_raw_fd(), libc::CLONE_NEWNET) })
            .at(Step::JoinNetns)?;
    }
    Ok(())
}

/// With a mediated network: the host's endpoints in the run's network namespace (see
/// [`crate::egress::setup`]), made by a process that still holds the capabilities there.
fn egress_sockets(plan: &Plan) -> Result<(), StepError> {
    match (plan.egress, &plan.egress_sock) {
        (true, Some(sock)) => crate::egress::setup::make_sockets(sock.as_raw_fd()),
        _ => Ok(()),
    }
}

/// Unshares `flags` and, when they make a user namespace, maps its ids, forbids namespaces below it
/// and names the host. A root host drops to the run's ids first; a root host's template enters the
/// templates' user namespace instead of making one, as its root.
fn enter_userns(plan: &Plan, mut flags: libc::c_int) -> Result<(), StepError> {
    if plan.view_as_root {
        if let Some((uid, gid)) = plan.drop_to {
            drop_ids(uid, gid)?;
        }
    }
    if let Some(userns) = &plan.join_userns {
        // G of a root host's template (its memory its own: setns refuses a process sharing it), its
        // view entered, enters the user namespace the host made for templates; the namespaces it
        // makes next (network, IPC, UTS) are that namespace's, as are those its runs make.
        // SAFETY: setns on a descriptor the host prepared; G is single-threaded.
        cvt(unsafe { libc::setns(userns.as_raw_fd(), libc::CLONE_NEWUSER) })
            .at(Step::TemplateUserns)?;
        // Root inside: the capabilities to make each run's namespaces stay through exec.
        drop_ids(0, 0)?;
        flags &= !libc::CLONE_NEWUSER;
    }
    if flags == 0 {
        return Ok(());
    }
    // SAFETY: unshare with flags the probe found to work.
    cvt(unsafe { libc::unshare(flags) }).at(Step::Unshare)?;
    if flags & libc::CLONE_NEWNET != 0 {
        // The capabilities over the new namespace last until the exec.
        netns::loopback_up()?;
    }
    if flags & libc::CLONE_NEWUSER != 0 {
        plan.ids.write()?;
        if plan.forbid_nested_userns {
            forbid_nested_user_namespaces()?;
        }
        // Entering a user namespace changed the credentials.
        set_pdeathsig().at(Step::Pdeathsig)?;
    }
    if flags & libc::CLONE_NEWUTS != 0 {
        let name = b"runpython";
        // SAFETY: a live buffer and its length.
        cvt(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) }).at(Step::Hostname)?;
    }
    Ok(())
}

fn set_nproc(plan: &Plan) -> Result<(), StepError> {
    if let Some(n) = plan.nproc {
        // Set after entering the user namespace: the limit then counts the run's own processes.
        set_rlimit(libc::RLIMIT_NPROC, n, n).at(Step::Rlimit)?;
    }
    Ok(())
}

/// With a view (the working directory is its new root): mounts the run's `/proc` when this is the
/// run's init, enters the view, and hands the scratch to the host before any code runs.
fn enter_view(plan: &Plan, proc: bool) -> Result<(), StepError> {
    let Some(view) = &plan.view else {
        return Ok(());
    };
    if proc {
        // Before the pivot, while the host's /proc is still in this mount namespace: the kernel
        // allows a new proc only where one is already fully visible.
        mounts::mount_proc(c"proc")?;
    }
    let scratch = mounts::pivot(view)?;
    let sent = match &plan.handoff {
        Some(sock) => send_fd(sock.as_raw_fd(), scratch).at(Step::HandOverScratch),
        None => Ok(()),
    };
    // SAFETY: closing the descriptor pivot opened.
    unsafe { libc::close(scratch) };
    sent
}

/// H's last steps before exec: parent-death signal, rlimits, no new privileges, Landlock, seccomp.
fn restrict_interpreter(plan: &Plan) -> Result<(), StepError> {
    set_pdeathsig().at(Step::Pdeathsig)?;
    for &(resource, value) in &plan.rlimits {
        let hard = if resource == libc::RLIMIT_CPU {
            value + 1 // SIGXCPU at the soft limit, SIGKILL a second later
        } else {
            value
        };
        set_rlimit(resource, value, hard).at(Step::Rlimit)?;
    }
    if plan.no_new_privs {
        // SAFETY: prctl with integer arguments.
        cvt(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) }).at(Step::NoNewPrivs)?;
    }
    if let Some(ruleset) = &plan.landlock {
        landlock::restrict_self(ruleset)?;
    }
    if let Some(filter) = plan.seccomp {
        seccomp::install(filter)?;
    }
    if let (true, Some(sock)) = (plan.egress, &plan.egress_sock) {
        // Last: from here on every connect of the run is the host's to decide.
        if !plan.no_new_privs {
            // SAFETY: prctl with integer arguments.
            cvt(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) })
                .at(Step::NoNewPrivs)?;
        }
        crate::egress::setup::install_notifier(sock.as_raw_fd(), plan.notifier)?;
    }
    // The interpreter gets stdin, stdout, stderr, the result pipe and the bridge, nothing else.
    cloexec_from(5).at(Step::CloseDescriptors)
}

/// In the innermost namespace, after `/proc` is mounted: Landlock rules on the run's own tmpfs and
/// `/proc`, and the working directory again (the /tmp it was in is now the private one).
fn inner_setup(plan: &Plan) -> Result<(), StepError> {
    if let Some(ruleset) = &plan.landlock {
        for (path, access) in &plan.landlock_inner {
            landlock::add_inner_rule(ruleset, path, *access)?;
        }
    }
    if plan.view.is_none() && plan.unshare & libc::CLONE_NEWNS != 0 {
        // SAFETY: chdir to a NUL-terminated path.
        cvt(unsafe { libc::chdir(plan.work_dir.as_ptr()) }).at(Step::Chdir)?;
    }
    Ok(())
}

/// Stack of G and of H (each), which run on their own stacks in S's memory.
const CHILD_STACK: usize = 256 << 10;

/// What G and H read when they start (copied: S's stack may change once S moves on).
#[derive(Clone, Copy)]
struct InitArgs {
    plan: *const Plan,
    exec: *const Exec,
    /// The shared status page (never unmapped).
    page: *mut libc::c_int,
    /// Write end of the pipe through which G and H report a setup failure (a [`StepError`]); nothing
    /// is written on success (the pipe closes when H execs and G closes its copies).
    report: RawFd,
    h_stack_top: *mut libc::c_void,
}

/// S with a PID namespace and a prepared exec: starts G (and G starts H) sharing S's memory, so
/// neither copies the host's page tables nor takes copy-on-write faults, and H execs directly. S
/// returns only on a setup failure; otherwise it supervises G.
fn start_init(plan: &Plan, exec: &Exec) -> Result<(), StepError> {
    // G shares this memory, which is a copy of the host's: its `/proc/1/cmdline` must not show the
    // host's command line (inputs, tool commands, store URLs).
    zero_host_args(plan.host_args);
    let page = SharedStatus::new()?;
    let mut fds = [-1; 2];
    // SAFETY: pipe2 into a live array; mmap of anonymous private memory.
    let stacks = unsafe {
        cvt(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC)).at(Step::ReportPipe)?;
        let stacks = libc::mmap(
            std::ptr::null_mut(),
            2 * CHILD_STACK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        );
        if stacks == libc::MAP_FAILED {
            return Err(StepError::last(Step::ChildStacks));
        }
        stacks.cast::<u8>()
    };
    let [read_end, write_end] = fds;
    let args = InitArgs {
        plan,
        exec,
        page: page.0,
        report: write_end,
        // SAFETY: both offsets stay within (or one past) the mapping.
        h_stack_top: unsafe { stacks.add(2 * CHILD_STACK) }.cast(),
    };
    page.arm();
    // A root host's template enters its user namespace in G, which `setns` allows only to a process
    // with memory of its own: that G is a copy of S (once per template) instead of sharing it.
    let share_memory = if plan.join_userns.is_some() {
        0
    } else {
        libc::CLONE_VM
    };
    // SAFETY: G runs `init_main` on its own stack in our memory (or a copy of it) and only makes
    // system calls; `args` outlives its first reads (S blocks on the pipe until G and H are done with
    // setup). The kernel clears and wakes the page's `alive` word when G exits (CLONE_CHILD_CLEARTID:
    // the page is shared either way).
    let init = unsafe {
        libc::clone(
            init_main,
            stacks.add(CHILD_STACK).cast(),
            share_memory | libc::CLONE_CHILD_CLEARTID | libc::SIGCHLD,
            std::ptr::addr_of!(args).cast_mut().cast(),
            std::ptr::null_mut::<libc::pid_t>(),
            std::ptr::null_mut::<libc::c_void>(),
            page.alive(),
        )
    };
    // SAFETY: closing our copy of the write end.
    unsafe { libc::close(write_end) };
    // A report is a failure; end of file with G alive means H exec'd and G is reaping.
    let reported = read_exact_fd::<8>(read_end);
    // SAFETY: closing the read end.
    unsafe { libc::close(read_end) };
    if init < 0 {
        return Err(StepError::last(Step::CloneInit));
    }
    match reported.and_then(StepError::decode) {
        Some(failure) => Err(failure),
        None if page.released_without_report() => Err(StepError::new(Step::InitDied, libc::ECHILD)),
        None => supervise(init, &page),
    }
}

/// G: PID 1 of the run. Mounts `/proc`, starts H (suspended until H has exec'd), then reaps.
extern "C" fn init_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` points at S's `InitArgs`, live until G reports; the plan and page outlive G.
    let args = unsafe { *arg.cast::<InitArgs>() };
    // SAFETY: as above.
    let plan = unsafe { &*args.plan };
    let setup = || -> Result<libc::pid_t, StepError> {
        set_pdeathsig().at(Step::Pdeathsig)?;
        // G holds a copy of the host's memory: nothing in the run may read it through /proc/1.
        // SAFETY: prctl with integer arguments (the flag belongs to the memory S and G share).
        cvt(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) }).at(Step::Dumpable)?;
        // Its name in the run's /proc is its own, not the host binary's.
        // SAFETY: prctl with a NUL-terminated constant.
        unsafe { libc::prctl(libc::PR_SET_NAME, c"runpython-init".as_ptr(), 0, 0, 0) };
        if plan.view.is_some() {
            enter_view(plan, true)?;
        } else {
            mounts::mount_proc(c"/proc")?;
        }
        if plan.view_as_root {
            let late = plan.unshare
                & (libc::CLONE_NEWUSER | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS)
                | plan.template_late();
            enter_userns(plan, late)?;
            // The credentials changed: G must stay undumpable (it holds a copy of the host's memory).
            // SAFETY: prctl with integer arguments.
            cvt(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) }).at(Step::Dumpable)?;
            set_nproc(plan)?;
        }
        inner_setup(plan)?;
        let mut h_args = args;
        // SAFETY: H runs `interpreter_main` on its own stack; we are suspended until it execs or
        // exits (CLONE_VFORK), so `h_args` outlives its use.
        cvt(unsafe {
            libc::clone(
                interpreter_main,
                args.h_stack_top,
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                std::ptr::addr_of_mut!(h_args).cast(),
            )
        })
        .at(Step::CloneInterpreter)
    };
    match setup() {
        Ok(python) => {
            // A failed exec already wrote H's report; S reads it, or end of file once G closes all.
            reap(python, &SharedStatus(args.page))
        }
        Err(e) => {
            write_all_fd(args.report, &e.encode());
            // SAFETY: _exit ends G only.
            unsafe { libc::_exit(125) }
        }
    }
}

/// H: the interpreter. Restricts itself and execs; on failure reports the step and exits.
extern "C" fn interpreter_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` points at G's copy of the arguments; G is suspended until we exec or exit.
    let args = unsafe { *arg.cast::<InitArgs>() };
    // SAFETY: as above; the plan and exec outlive H's use of them.
    let (plan, exec) = unsafe { (&*args.plan, &*args.exec) };
    // A session of its own, without a controlling terminal: the host's terminal (when the host has
    // one) is not the run's, and no terminal but the run's own ptys can become its. It leaves S's
    // process group; its PID namespace still ends with G.
    // SAFETY: setsid takes no argument.
    unsafe { libc::setsid() };
    let error = match restrict_interpreter(plan) {
        // SAFETY: execve with NUL-terminated strings and NULL-terminated arrays prepared in the host.
        Ok(()) => unsafe {
            libc::execve(
                exec.program.as_ptr(),
                exec.argv.as_ptr(),
                exec.envp.as_ptr(),
            );
            StepError::last(Step::Exec)
        },
        Err(e) => e,
    };
    write_all_fd(args.report, &error.encode());
    // SAFETY: _exit ends H only.
    unsafe { libc::_exit(127) }
}

/// A page shared between S and G through which G reports the interpreter's wait status: word 0 is
/// set once word 1 holds the status; word 2 (`alive`) is cleared, with a futex wake, when G has
/// reported or has exited.
struct SharedStatus(*mut libc::c_int);

impl SharedStatus {
    fn new() -> Result<Self, StepError> {
        // SAFETY: an anonymous shared mapping; never unmapped (the processes _exit).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(StepError::last(Step::SharedPage));
        }
        Ok(Self(ptr.cast()))
    }

    fn set(&self, status: libc::c_int) {
        // SAFETY: the mapping is live and holds three ints.
        unsafe {
            self.0.add(1).write_volatile(status);
            self.0.write_volatile(1);
        }
    }

    fn alive(&self) -> *mut libc::c_int {
        // SAFETY: within the page.
        unsafe { self.0.add(2) }
    }

    fn arm(&self) {
        // SAFETY: as above.
        unsafe { self.alive().write_volatile(1) }
    }

    /// True when G has gone (its `alive` word cleared) without reporting a status: it died during setup.
    fn released_without_report(&self) -> bool {
        // SAFETY: as above.
        unsafe { self.alive().read_volatile() == 0 && self.0.read_volatile() != 1 }
    }

    /// G: the status is set; wake S.
    fn release(&self) {
        // SAFETY: as above; a (process-shared) futex wake on the page.
        unsafe {
            self.alive().write_volatile(0);
            libc::syscall(libc::SYS_futex, self.alive(), libc::FUTEX_WAKE, 1);
        }
    }

    /// S: sleeps until G has reported or exited.
    fn wait_released(&self) {
        // SAFETY: as above; a futex wait that returns at once when the word is already 0.
        unsafe {
            while self.alive().read_volatile() != 0 {
                libc::syscall(
                    libc::SYS_futex,
                    self.alive(),
                    libc::FUTEX_WAIT,
                    1,
                    std::ptr::null::<libc::timespec>(),
                );
            }
        }
    }

    fn get(&self) -> Option<libc::c_int> {
        // SAFETY: as above.
        unsafe { (self.0.read_volatile() == 1).then(|| self.0.add(1).read_volatile()) }
    }
}

/// S: waits for G's report and leaves with the interpreter's status (same exit code, or the same
/// signal) at once. G, which shares S's memory and namespaces, is still alive then, so S's exit is
/// cheap and the host hears of the end before the run's memory and namespaces are torn down; that
/// teardown happens in G, which S's exit kills (PDEATHSIG).
fn supervise(init: libc::pid_t, page: &SharedStatus) -> ! {
    close_from(0);
    page.wait_released();
    let mut status = 0;
    // SAFETY: waitpid/kill/signal/_exit on our own processes.
    unsafe {
        let status = match page.get() {
            Some(status) => status,
            None => {
                // G ended without a report (killed): leave with its status.
                while libc::waitpid(init, &mut status, 0) < 0
                    && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
                {
                }
                status
            }
        };
        exit_like(status)
    }
}

/// G: reaps every process of the run (orphans are re-parented to it) until the interpreter ends, then
/// kills whatever is left in the namespace, reports the interpreter's status and waits for S's exit
/// to kill it (the kernel then tears the run's namespaces down).
fn reap(python: libc::pid_t, page: &SharedStatus) -> ! {
    close_from(0);
    let mut status = 0;
    // SAFETY: waitpid, kill, nanosleep and _exit.
    unsafe {
        loop {
            let r = libc::waitpid(-1, &mut status, 0);
            if r == python {
                break;
            }
            if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                libc::_exit(1); // no report: S leaves with this status
            }
        }
        // From PID 1, -1 is every other process of this PID namespace and nothing outside it.
        libc::kill(-1, libc::SIGKILL);
        page.set(status);
        page.release();
        // S's exit kills G (PDEATHSIG); should that never come, G leaves by itself.
        let second = libc::timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        libc::nanosleep(&second, std::ptr::null_mut());
        libc::_exit(0)
    }
}
