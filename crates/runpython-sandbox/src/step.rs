//! The named setup steps that failures report. A failure carries its [`Step`] and errno as a
//! [`StepError`], a `Copy` value that crosses a pipe as 8 bytes (from G or H) or std's exec-error
//! channel as one `i32` (from S), so the host can say which step failed instead of a bare errno.

use std::fmt;
use std::io;

/// A step of the sandbox's setup (or of a probe), named in errors and in `isolation.missing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
#[allow(missing_docs)]
#[non_exhaustive]
pub enum Step {
    Unshare = 1,
    WriteSetgroups,
    WriteUidMap,
    WriteGidMap,
    ForbidNestedUserns,
    DropIds,
    Pdeathsig,
    Dumpable,
    Hostname,
    JoinOwnerUserns,
    JoinNetns,
    MountPrivate,
    OpenBindSource,
    MountTmpfs,
    MakeMountPoint,
    BindMount,
    MountProc,
    Chdir,
    Rlimit,
    NoNewPrivs,
    LandlockRule,
    LandlockRestrict,
    Seccomp,
    SharedPage,
    ReportPipe,
    ChildStacks,
    CloneInit,
    CloneInterpreter,
    Exec,
    Fork,
    InitDied,
    SeccompRefused,
    ReadOnlyBind,
    PivotRoot,
    HandOverScratch,
    JoinCgroup,
    CloseDescriptors,
    DropCapabilities,
    ForkRun,
    ForkedSetup,
    TemplateUserns,
    LoopbackUp,
    EgressSockets,
    EgressNotifier,
    MountDevpts,
}

impl Step {
    pub(crate) const ALL: [Step; 45] = [
        Step::Unshare,
        Step::WriteSetgroups,
        Step::WriteUidMap,
        Step::WriteGidMap,
        Step::ForbidNestedUserns,
        Step::DropIds,
        Step::Pdeathsig,
        Step::Dumpable,
        Step::Hostname,
        Step::JoinOwnerUserns,
        Step::JoinNetns,
        Step::MountPrivate,
        Step::OpenBindSource,
        Step::MountTmpfs,
        Step::MakeMountPoint,
        Step::BindMount,
        Step::MountProc,
        Step::Chdir,
        Step::Rlimit,
        Step::NoNewPrivs,
        Step::LandlockRule,
        Step::LandlockRestrict,
        Step::Seccomp,
        Step::SharedPage,
        Step::ReportPipe,
        Step::ChildStacks,
        Step::CloneInit,
        Step::CloneInterpreter,
        Step::Exec,
        Step::Fork,
        Step::InitDied,
        Step::SeccompRefused,
        Step::ReadOnlyBind,
        Step::PivotRoot,
        Step::HandOverScratch,
        Step::JoinCgroup,
        Step::CloseDescriptors,
        Step::DropCapabilities,
        Step::ForkRun,
        Step::ForkedSetup,
        Step::TemplateUserns,
        Step::LoopbackUp,
        Step::EgressSockets,
        Step::EgressNotifier,
        Step::MountDevpts,
    ];

    /// What the step does, for a person.
    pub fn describe(self) -> &'static str {
        match self {
            Step::Unshare => "creating the run's namespaces (unshare)",
            Step::WriteSetgroups => "writing /proc/self/setgroups",
            Step::WriteUidMap => "writing /proc/self/uid_map",
            Step::WriteGidMap => "writing /proc/self/gid_map",
            Step::ForbidNestedUserns => "forbidding nested user namespaces (max_user_namespaces)",
            Step::DropIds => "dropping to the run's uid and gid",
            Step::Pdeathsig => "setting the parent-death signal",
            Step::Dumpable => "setting the dumpable flag",
            Step::Hostname => "setting the run's host name",
            Step::JoinOwnerUserns => "joining the user namespace that owns the network namespace",
            Step::JoinNetns => "joining the run's network namespace",
            Step::MountPrivate => "making the mount tree private",
            Step::OpenBindSource => "opening a directory to bind into the run",
            Step::MountTmpfs => "mounting a tmpfs",
            Step::MakeMountPoint => "creating a mount point",
            Step::BindMount => "bind-mounting a directory into the run",
            Step::MountProc => "mounting the run's /proc",
            Step::Chdir => "entering the run's working directory",
            Step::Rlimit => "setting a resource limit",
            Step::NoNewPrivs => "setting no_new_privs",
            Step::LandlockRule => "adding a Landlock rule",
            Step::LandlockRestrict => "restricting the interpreter with Landlock",
            Step::Seccomp => "installing the seccomp filter",
            Step::SharedPage => "mapping the status page shared with the run's init",
            Step::ReportPipe => "creating the setup report pipe",
            Step::ChildStacks => "mapping the stacks of the run's init and interpreter",
            Step::CloneInit => "starting the run's init process (PID 1 of its namespace)",
            Step::CloneInterpreter => "starting the interpreter process",
            Step::Exec => "executing the interpreter",
            Step::Fork => "forking a probe",
            Step::InitDied => "waiting for the run's init to finish setting up (it died)",
            Step::SeccompRefused => "checking that the seccomp filter refuses a denied call",
            Step::ReadOnlyBind => "making a directory of the run's view read-only",
            Step::PivotRoot => "entering the run's filesystem view (pivot_root)",
            Step::HandOverScratch => "handing the run's scratch directory to the host",
            Step::JoinCgroup => "joining the run's cgroup",
            Step::CloseDescriptors => "closing the host's descriptors",
            Step::DropCapabilities => "dropping every capability",
            Step::ForkRun => "forking the run from its template",
            Step::ForkedSetup => "setting up a run forked from a template",
            Step::TemplateUserns => "making or entering the user namespace templates live in",
            Step::LoopbackUp => "bringing up the loopback of the run's network namespace",
            Step::EgressSockets => "making the run's resolver and relay sockets for the host",
            Step::EgressNotifier => {
                "installing the filter that hands the run's connects to the host"
            }
            Step::MountDevpts => "mounting the run's own terminals (devpts) at /dev/pts",
        }
    }

    /// The step a run forked from a template names in its report (`runpython_template.py` uses
    /// these names); [`Step::ForkedSetup`] for a name it does not know.
    pub fn from_name(name: &str) -> Step {
        match name {
            "unshare" => Step::Unshare,
            "write_setgroups" => Step::WriteSetgroups,
            "write_uid_map" => Step::WriteUidMap,
            "write_gid_map" => Step::WriteGidMap,
            "forbid_nested_userns" => Step::ForbidNestedUserns,
            "drop_ids" => Step::DropIds,
            "pdeathsig" => Step::Pdeathsig,
            "dumpable" => Step::Dumpable,
            "hostname" => Step::Hostname,
            "join_netns" => Step::JoinNetns,
            "mount_tmpfs" => Step::MountTmpfs,
            "make_mount_point" => Step::MakeMountPoint,
            "bind_mount" => Step::BindMount,
            "mount_proc" => Step::MountProc,
            "chdir" => Step::Chdir,
            "rlimit" => Step::Rlimit,
            "no_new_privs" => Step::NoNewPrivs,
            "landlock_rule" => Step::LandlockRule,
            "landlock_restrict" => Step::LandlockRestrict,
            "seccomp" => Step::Seccomp,
            "hand_over_scratch" => Step::HandOverScratch,
            "join_cgroup" => Step::JoinCgroup,
            "close_descriptors" => Step::CloseDescriptors,
            "drop_capabilities" => Step::DropCapabilities,
            "fork_run" => Step::ForkRun,
            "loopback_up" => Step::LoopbackUp,
            "egress_sockets" => Step::EgressSockets,
            "egress_notifier" => Step::EgressNotifier,
            "mount_devpts" => Step::MountDevpts,
            _ => Step::ForkedSetup,
        }
    }

    fn from_code(code: u16) -> Option<Step> {
        Step::ALL.into_iter().find(|s| *s as u16 == code)
    }
}

/// A setup step that failed, with the errno it failed with. `Copy` and allocation-free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepError {
    /// The step.
    pub step: Step,
    /// The errno it failed with.
    pub errno: i32,
}

/// Codes at or above this in an `io::Error` from S's pre-exec hook carry a step (see [`StepError::to_io`]).
const STEP_SHIFT: u32 = 16;

impl StepError {
    pub fn new(step: Step, errno: i32) -> Self {
        Self { step, errno }
    }

    /// `step` failed with the calling thread's errno.
    pub(crate) fn last(step: Step) -> Self {
        Self::new(step, errno_of(&io::Error::last_os_error()))
    }

    pub(crate) fn encode(self) -> [u8; 8] {
        let mut out = [0u8; 8];
        out[..4].copy_from_slice(&u32::from(self.step as u16).to_ne_bytes());
        out[4..].copy_from_slice(&self.errno.to_ne_bytes());
        out
    }

    pub(crate) fn decode(bytes: [u8; 8]) -> Option<Self> {
        let mut code = [0u8; 4];
        code.copy_from_slice(&bytes[..4]);
        let mut errno = [0u8; 4];
        errno.copy_from_slice(&bytes[4..]);
        let step = u16::try_from(u32::from_ne_bytes(code))
            .ok()
            .and_then(Step::from_code)?;
        Some(Self::new(step, i32::from_ne_bytes(errno)))
    }

    /// For std's pre-exec hook, whose error reaches `spawn` as one raw OS error code: the step goes in
    /// the high bits (errno values stay far below 2^16).
    pub(crate) fn to_io(self) -> io::Error {
        let code = (i32::from(self.step as u16) << STEP_SHIFT) | (self.errno & 0xffff);
        io::Error::from_raw_os_error(code)
    }

    /// The inverse of `StepError::to_io`; `None` for a plain OS error.
    pub fn from_io(error: &io::Error) -> Option<Self> {
        let code = error.raw_os_error()?;
        let step = u16::try_from(code >> STEP_SHIFT)
            .ok()
            .and_then(Step::from_code)?;
        Some(Self::new(step, code & 0xffff))
    }

    /// The errno as an `io::Error`.
    pub fn source(self) -> io::Error {
        io::Error::from_raw_os_error(self.errno)
    }
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}", self.step.describe(), self.source())
    }
}

/// Attaching a [`Step`] to an `io::Result`.
pub(crate) trait AtStep<T> {
    fn at(self, step: Step) -> Result<T, StepError>;
}

impl<T> AtStep<T> for io::Result<T> {
    fn at(self, step: Step) -> Result<T, StepError> {
        self.map_err(|e| StepError::new(step, errno_of(&e)))
    }
}

pub(crate) fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().filter(|&n| n != 0).unwrap_or(libc::EIO)
}
