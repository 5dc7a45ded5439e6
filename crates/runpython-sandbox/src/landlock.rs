//! Landlock: what the code may read, write and execute, and (ABI 6+) which signals and abstract Unix
//! sockets it may reach. The ruleset is built in the host; rules on directories that only exist inside
//! the run (its tmpfs, its `/proc`) are added by the run's init; the interpreter restricts itself last.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::sys::{cvt_long, dup_high, AtStep, Step, StepError};

/// The Landlock ABI version the kernel offers, 0 when unavailable.
pub(crate) fn abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: the version query takes no attribute pointer and returns a number or -1.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(v).unwrap_or(0).max(0)
}

/// Access bits, for rules added inside the run.
pub(crate) fn access_all(abi: i32) -> u64 {
    use landlock::Access;
    landlock::AccessFs::from_all(landlock::ABI::from(abi)).bits()
}

/// Listing directories only, for the view's own skeleton (everything in the view is allowlisted).
pub(crate) fn access_list(abi: i32) -> u64 {
    let _ = abi; // READ_DIR exists from ABI 1
    landlock::BitFlags::from(landlock::AccessFs::ReadDir).bits()
}

/// The run's own terminals (`/dev/pts`, its devpts instance): open them for reading and writing, and
/// their ioctls (ABI 5+ governs ioctls on devices); nothing is made, removed or executed there.
pub(crate) fn access_terminals(abi: i32) -> u64 {
    use landlock::{Access, AccessFs};
    let abi = landlock::ABI::from(abi);
    let wanted = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev;
    // Only the bits this ABI handles: a rule naming another is refused.
    (wanted & AccessFs::from_all(abi)).bits()
}

/// Read and execute access bits, for rules added inside the run.
pub(crate) fn access_read(abi: i32) -> u64 {
    let abi = landlock::ABI::from(abi);
    (landlock::AccessFs::from_read(abi) | landlock::AccessFs::Execute).bits()
}

/// The host-side rules: system directories, the interpreter, runpython's code and `read_dirs` readable
/// and executable; the run directory (when the run has one on the host) fully usable; a few devices
/// writable. Signals and abstract Unix sockets are scoped to the run (ABI 6+). With `tcp_guard` (ABI
/// 4+, the caller checks), TCP `bind(2)` and `connect(2)` are handled with no rule: the kernel refuses
/// every one the run makes itself, and only the host's, on the run's behalf, happen.
pub(crate) fn ruleset(
    abi: i32,
    read_dirs: &[PathBuf],
    run_dir: Option<&Path>,
    tcp_guard: bool,
) -> Result<OwnedFd, String> {
    use std::os::fd::AsFd;
    use std::os::unix::fs::OpenOptionsExt;

    use landlock::{
        Access, AccessFs, AccessNet, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
        RulesetAttr, RulesetCreatedAttr, Scope, ABI,
    };
    let abi = ABI::from(abi);
    let read = AccessFs::from_read(abi) | AccessFs::Execute;
    let system = [
        "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc", "/dev", "/proc",
    ];
    let devices = [
        "/dev/null",
        "/dev/zero",
        "/dev/full",
        "/dev/urandom",
        "/dev/random",
    ];
    let rule = |path: &Path, access| {
        PathFd::new(path)
            .ok()
            .map(|fd| PathBeneath::new(fd, access))
    };
    // The system directories and devices are opened once per process (they do not move).
    static FIXED: OnceLock<Vec<(OwnedFd, bool)>> = OnceLock::new();
    let fixed = FIXED.get_or_init(|| {
        let open = |path: &str| {
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
                .open(path)
                .ok()
                .map(OwnedFd::from)
        };
        let system = system.iter().filter_map(|p| Some((open(p)?, false)));
        let devices = devices.iter().filter_map(|p| Some((open(p)?, true)));
        system.chain(devices).collect()
    });
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(|e| e.to_string())?
        .scope(Scope::from_all(abi))
        .map_err(|e| e.to_string())?;
    if tcp_guard {
        // Not best effort: a guard the kernel would drop must fail the run's setup instead.
        ruleset = ruleset
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
            .map_err(|e| format!("the network guard: {e}"))?
            .set_compatibility(CompatLevel::BestEffort);
    }
    let mut ruleset = ruleset.create().map_err(|e| e.to_string())?;
    for (fd, device) in fixed {
        let access = if *device {
            AccessFs::from_file(abi)
        } else {
            read
        };
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd.as_fd(), access))
            .map_err(|e| e.to_string())?;
    }
    for dir in read_dirs {
        if let Some(r) = rule(dir, read) {
            ruleset = ruleset.add_rule(r).map_err(|e| e.to_string())?;
        }
    }
    if let Some(run_dir) = run_dir {
        let r =
            rule(run_dir, AccessFs::from_all(abi)).ok_or("the run directory cannot be opened")?;
        ruleset = ruleset.add_rule(r).map_err(|e| e.to_string())?;
    }
    let fd: Option<OwnedFd> = ruleset.into();
    let fd = fd.ok_or("the kernel refused the ruleset")?;
    // The child dup2s its pipes onto its fixed slots: keep the ruleset out of their way.
    dup_high(fd).map_err(|e: io::Error| e.to_string())
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: RawFd,
}

/// Adds `access` on `path` (which exists only inside the run) to `ruleset`; a missing path is skipped.
/// Async-signal-safe.
pub(crate) fn add_inner_rule(
    ruleset: &OwnedFd,
    path: &CString,
    access: u64,
) -> Result<(), StepError> {
    // SAFETY: open/close and the landlock_add_rule system call on a packed attribute.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
        if fd < 0 {
            return Ok(());
        }
        let attr = PathBeneathAttr {
            allowed_access: access,
            parent_fd: fd,
        };
        let rc = libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_raw_fd(),
            1u32, // LANDLOCK_RULE_PATH_BENEATH
            &attr as *const PathBeneathAttr,
            0u32,
        );
        libc::close(fd);
        cvt_long(rc).map(drop).at(Step::LandlockRule)
    }
}

/// Restricts the calling thread with `ruleset` (`PR_SET_NO_NEW_PRIVS` already set). Async-signal-safe.
pub(crate) fn restrict_self(ruleset: &OwnedFd) -> Result<(), StepError> {
    // SAFETY: restrict_self on our ruleset descriptor; flags 0.
    cvt_long(unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0u32) })
        .map(drop)
        .at(Step::LandlockRestrict)?;
    Ok(())
}
