"""A run forked from a template taking its own sandbox (H), in the template's Python: the system calls
it makes through ctypes (`Sys`), the descriptors it is handed (`Fds`), and every layer, in order
(`_setup`), before it tells the host it is ready and continues into the run.

Stdlib only; imported by `runpython_template` (T), which forks the processes that run this. It knows
nothing of the runner: what a run continues into is handed to `interpreter`.
"""

import json
import posix
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_BIND = 0x1000
MS_REC = 0x4000
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NAME = 15
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
LINUX_CAPABILITY_VERSION_3 = 0x20080522
# The same numbers on every architecture (the generic system call table).
SYS_CLOSE_RANGE = 436
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_RULE_PATH_BENEATH = 1
SIGKILL = 9
# seccomp(2): its number per architecture, and the connect notifier's flags (NEW_LISTENER,
# WAIT_KILLABLE_RECV).
SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}
SECCOMP_SET_MODE_FILTER = 1
NOTIFIER_FLAGS = (1 << 3) | (1 << 5)
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP_RUNNING = 0x1 | 0x40
# Descriptors a run keeps: stdin, stdout, stderr, the result pipe, the bridge.
RUN_FDS = ("stdin", "stdout", "stderr", "result", "bridge")
RESULT_FD, BRIDGE_FD = 3, 4


class StepFailed(Exception):
    """A setup step failed with an errno; `step` is the host's name for it (its `Step` in `sys.rs`)."""

    def __init__(self, step, errno):
        super().__init__("%s failed: errno %d" % (step, errno))
        self.step = step
        self.errno = errno


class Sys:
    """The system calls a template and its runs make, through ctypes on libc, set up once in T."""

    def __init__(self):
        import ctypes

        self.ct = ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        self.libc = libc
        libc.syscall.restype = ctypes.c_long
        libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
        libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
        libc.unshare.argtypes = (ctypes.c_int,)
        libc.setns.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.sethostname.argtypes = (ctypes.c_char_p, ctypes.c_size_t)

        class CapHeader(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        class CapData(ctypes.Structure):
            _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

        class SockFprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        self.CapHeader, self.CapData, self.SockFprog = CapHeader, CapData, SockFprog

    def set_name(self, name):
        """The calling thread's name (`comm`, in `/proc` and `ps`)."""
        self.libc.prctl(PR_SET_NAME, self.ct.addressof(self.ct.create_string_buffer(name)), 0, 0, 0)

    def check(self, rc, step):
        if rc < 0:
            raise StepFailed(step, self.ct.get_errno())
        return rc

    def syscall(self, number, *args):
        c_long = self.ct.c_long
        return self.libc.syscall(c_long(number), *(c_long(a) for a in args))

    def prctl(self, option, arg, step):
        return self.check(self.libc.prctl(option, arg, 0, 0, 0), step)

    def unshare(self, flags, step="unshare"):
        return self.check(self.libc.unshare(flags), step)

    def setns(self, fd, kind, step):
        return self.check(self.libc.setns(fd, kind), step)

    def mount(self, source, target, fstype, flags, data, step):
        return self.check(self.libc.mount(source, target, fstype, flags, data), step)

    def close_from(self, first):
        """Closes every descriptor from `first` up."""
        if self.syscall(SYS_CLOSE_RANGE, first, 0xFFFFFFFF, 0) < 0:
            posix.closerange(first, 1 << 20)

    def drop_capabilities(self):
        """Empties every capability set of the calling thread (ambient, effective, permitted, inheritable)."""
        self.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, "drop_capabilities")
        header = self.CapHeader(LINUX_CAPABILITY_VERSION_3, 0)
        data = (self.CapData * 2)()
        self.check(self.libc.capset(self.ct.byref(header), data), "drop_capabilities")

    def landlock(self, ruleset, rules):
        """Adds `rules` ([path, access bits]) on directories of the run to the host's `ruleset`, then
        restricts the calling thread with it (`no_new_privs` is set already)."""
        ct = self.ct
        for path, access in rules:
            try:
                fd = posix.open(path, posix.O_PATH | posix.O_CLOEXEC)
            except OSError:
                continue  # a directory this run does not have
            attr = ct.create_string_buffer(access.to_bytes(8, sys.byteorder) + fd.to_bytes(4, sys.byteorder, signed=True), 12)
            rc = self.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, ct.addressof(attr), 0)
            posix.close(fd)
            self.check(rc, "landlock_rule")
        self.check(self.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock_restrict")

    def notifier(self, program):
        """Installs the connect notifier (a classic BPF program returning USER_NOTIF for connect) with
        a listener for the host; returns the listener's descriptor."""
        ct = self.ct
        buf = ct.create_string_buffer(program, len(program))
        fprog = self.SockFprog(len(program) // 8, ct.addressof(buf))
        number = SYS_SECCOMP.get(posix.uname().machine)
        if number is None:
            raise StepFailed("egress_notifier", 38)  # ENOSYS
        return self.check(
            self.syscall(number, SECCOMP_SET_MODE_FILTER, NOTIFIER_FLAGS, ct.addressof(fprog)), "egress_notifier"
        )

    def seccomp(self, program):
        """Installs a classic BPF program (`struct sock_filter`s, 8 bytes each, as the host compiled it)."""
        ct = self.ct
        buf = ct.create_string_buffer(program, len(program))
        fprog = self.SockFprog(len(program) // 8, ct.addressof(buf))
        self.check(self.libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ct.addressof(fprog), 0, 0), "seccomp")


def _write(path, data, step):
    try:
        fd = posix.open(path, posix.O_WRONLY | posix.O_CLOEXEC)
        try:
            posix.write(fd, data)
        finally:
            posix.close(fd)
    except OSError as exc:
        raise StepFailed(step, exc.errno or 5) from None


class Fds:
    """A command's descriptors by name (a name may repeat: the run's cgroups)."""

    def __init__(self, names, fds):
        self.pairs = list(zip(names, fds))

    def one(self, name):
        for n, fd in self.pairs:
            if n == name:
                return fd
        return None

    def all(self, name):
        return [fd for n, fd in self.pairs if n == name]

    def close(self):
        for _, fd in self.pairs:
            try:
                posix.close(fd)
            except OSError:
                pass


def keep_only(s, keep):
    """Closes every descriptor but `keep` (and stdin, stdout, stderr: T's, until the run's replace them)."""
    low = 3
    for fd in sorted(set(keep)):
        if fd >= low:
            posix.closerange(low, fd)
            low = fd + 1
    s.close_from(low)


def _report(run, exc):
    """Tells the host which setup step failed (`E` + JSON on the run's socket)."""
    if isinstance(exc, StepFailed):
        step, errno = exc.step, exc.errno
    elif isinstance(exc, OSError):
        step, errno = "forked_setup", exc.errno or 5
    else:
        step, errno = "forked_setup", 5
    message = "%s: %s" % (type(exc).__name__, exc)
    try:
        posix.write(run, b"E" + json.dumps({"step": step, "errno": errno, "message": message[:500]}, separators=(",", ":")).encode())
    except (OSError, TypeError):
        pass


def interpreter(s, command, fds, run, peer, continue_run, comm):
    """H: tells its init it is there, takes the run's sandbox, says it is ready, waits for its run's
    descriptors, then continues into the run (`continue_run`, named `comm` as the interpreter was).
    Never returns."""
    import socket

    sock = socket.socket(fileno=run)
    try:
        # The run's status pipe is T's to write: not kept.
        keep_only(s, [run, peer] + [fd for name, fd in fds.pairs if name != "status"])
        # Its own session and process group (T's reaches T, I and every other run of T's).
        posix.setsid()
        for procs in fds.all("cgroup"):
            try:
                posix.write(procs, b"0")
            except OSError as exc:
                raise StepFailed("join_cgroup", exc.errno or 5) from None
        me = posix.pidfd_open(posix.getpid())
        init = socket.socket(fileno=peer)
        socket.send_fds(init, [b"H"], [me])
        init.close()
        posix.close(me)
        scratch, egress_fds = _setup(s, command, fds, comm)
        _reseed()
        socket.send_fds(sock, [b"R"], [scratch] + egress_fds)
        for fd in [scratch] + egress_fds:
            posix.close(fd)
        message, got, _, _ = socket.recv_fds(sock, 16, len(RUN_FDS) + 1)
        if message != b"G" or len(got) != len(RUN_FDS):
            # The host let go of this run (an engine dropped, an idle one discarded).
            posix._exit(0)
        # The run's five descriptors, and nothing else of T's (its control socket included).
        for target, fd in enumerate(got):
            posix.dup2(fd, target, inheritable=target < RESULT_FD)
        s.close_from(len(RUN_FDS))
        sock.detach()
    except BaseException as exc:
        _report(run, exc)
        posix._exit(125)
    try:
        continue_run()
    finally:
        posix._exit(0)


def _setup(s, command, fds, comm):
    """Everything H takes before the code runs, in order; returns the scratch's descriptor and, with a
    network policy, the descriptors of its egress for the host (the last its connect notifier's
    listener, which H must not keep)."""
    import signal

    s.set_name(comm)  # the interpreter's own name, not its init's
    signal.signal(signal.SIGINT, signal.default_int_handler)
    s.prctl(PR_SET_PDEATHSIG, SIGKILL, "pdeathsig")
    flags = CLONE_NEWNS | command["unshare"]
    if command["net"]:
        flags |= CLONE_NEWNET
    s.unshare(flags)
    if flags & CLONE_NEWNET:
        _loopback_up()
    egress = command["egress"]
    egress_fds = _egress_sockets(egress) if egress else []
    if flags & CLONE_NEWUTS:
        s.check(s.libc.sethostname(b"runpython", 9), "hostname")
    scratch = _mount_scratch(s, command["scratch"], command["owner"])
    # The run's own terminals (a new devpts instance over the template's; /dev/ptmx links here).
    s.mount(b"devpts", b"/dev/pts", b"devpts", MS_NOSUID | MS_NOEXEC, command["devpts"].encode(), "mount_devpts")
    uid = command["uid"]
    if uid is not None:
        # A root host's template maps the run uids: this run's own, without a capability left.
        try:
            posix.setgroups([])
            posix.setresgid(uid, uid, uid)
            posix.setresuid(uid, uid, uid)
        except OSError as exc:
            raise StepFailed("drop_ids", exc.errno or 5) from None
        # A credential change makes the process undumpable, which would make its /proc files root's.
        s.prctl(PR_SET_DUMPABLE, 1, "dumpable")
    if command["userns"]:
        own = posix.getuid()
        own_gid = posix.getgid()
        s.unshare(CLONE_NEWUSER)
        inside = command["inside"]
        _write("/proc/self/setgroups", b"deny", "write_setgroups")
        _write("/proc/self/uid_map", b"%d %d 1" % (inside, own), "write_uid_map")
        _write("/proc/self/gid_map", b"%d %d 1" % (inside, own_gid), "write_gid_map")
        if command["forbid_nested"]:
            _write("/proc/sys/user/max_user_namespaces", b"0", "forbid_nested_userns")
    s.drop_capabilities()
    # Credential changes clear the parent-death signal.
    s.prctl(PR_SET_PDEATHSIG, SIGKILL, "pdeathsig")
    resource = sys.modules["resource"]  # imported by T, not once per run
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if command["nproc"] is not None:
            n = int(command["nproc"])
            resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
        for which, soft, hard in command["rlimits"]:
            resource.setrlimit(which, (soft, hard))
    except (OSError, ValueError) as exc:
        raise StepFailed("rlimit", getattr(exc, "errno", None) or 22) from None
    s.prctl(PR_SET_NO_NEW_PRIVS, 1, "no_new_privs")
    if command["landlock"] is not None:
        s.landlock(fds.one("landlock"), command["landlock"])
    if command["seccomp"]:
        s.seccomp(bytes.fromhex(command["seccomp"]))
    if egress:
        # Last: from here on every connect of the run is the host's to decide.
        egress_fds.append(s.notifier(bytes.fromhex(egress["notifier"])))
    return scratch, egress_fds


def _loopback_up():
    """The run's fresh network namespace gets its own loopback up (127.0.0.1 and ::1), while H still
    holds the capabilities there."""
    import fcntl
    import socket
    import struct

    ifreq = "16sH22x"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            flags = struct.unpack(ifreq, fcntl.ioctl(probe.fileno(), SIOCGIFFLAGS, struct.pack(ifreq, b"lo", 0)))[1]
            fcntl.ioctl(probe.fileno(), SIOCSIFFLAGS, struct.pack(ifreq, b"lo", flags | IFF_UP_RUNNING))
    except OSError as exc:
        raise StepFailed("loopback_up", exc.errno or 5) from None


def _egress_sockets(spec):
    """With a network policy, in the run's fresh network namespace (its loopback up) while H still
    holds the capabilities there: the host's endpoints in it (the resolver's UDP socket and TCP
    listener, the relay's listeners). Returns their descriptors, for the host."""
    import socket

    dns, relay = int(spec["dns_port"]), int(spec["relay_port"])
    made = []
    try:
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        made.append(udp)
        udp.bind(("127.0.0.1", dns))
        for port, backlog in ((dns, 64), (relay, 4096)):
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            made.append(listener)
            listener.bind(("127.0.0.1", port))
            listener.listen(backlog)
    except OSError as exc:
        for sock in made:
            sock.close()
        raise StepFailed("egress_sockets", exc.errno or 5) from None
    try:
        six = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        try:
            six.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            six.bind(("::1", relay))
            six.listen(4096)
            made.append(six)
        except OSError:
            six.close()  # no IPv6 in the namespace: the relay serves IPv4 sockets only
    except OSError:
        pass
    return [sock.detach() for sock in made]


def _mount_scratch(s, spec, owner):
    """The run's scratch: a fresh tmpfs at `spec["path"]` with its directories (owned by the run), its
    `tmp` on `/tmp` and `shm` on `/dev/shm`; and a `/proc` of the run's PID namespace. The working
    directory becomes its `work`. Returns an `O_PATH` descriptor of it."""
    path = spec["path"]
    root = path.encode()
    # What the view bound under /tmp (a code directory or an environment under a HOME there) sits on
    # the template's /tmp, which the run's own hides: held now, bound again on top of the run's.
    held = []
    for target, is_dir in spec["rebind"]:
        try:
            held.append((target, is_dir, posix.open(target, posix.O_PATH | posix.O_CLOEXEC)))
        except OSError:
            pass
    data = b"mode=0700,size=%d,uid=%d,gid=%d" % (max(int(spec["size"]), 4096), owner, owner)
    s.mount(b"tmpfs", root, b"tmpfs", MS_NOSUID | MS_NODEV, data, "mount_tmpfs")
    for name, mode in spec["dirs"]:
        sub = path + "/" + name
        try:
            posix.mkdir(sub, 0o700)
            posix.chmod(sub, mode)
            if owner:
                posix.chown(sub, owner, owner)
        except OSError as exc:
            raise StepFailed("make_mount_point", exc.errno or 5) from None
    for name, target in (("tmp", b"/tmp"), ("shm", b"/dev/shm")):
        s.mount(root + b"/" + name.encode(), target, None, MS_BIND | MS_REC, None, "bind_mount")
    for target, is_dir, fd in held:
        try:
            parts = target.split("/")
            for i in range(2, len(parts)):
                try:
                    posix.mkdir("/".join(parts[:i]), 0o755)
                except FileExistsError:
                    pass
            if is_dir:
                posix.mkdir(target, 0o755)
            else:
                posix.close(posix.open(target, posix.O_CREAT | posix.O_WRONLY | posix.O_CLOEXEC, 0o644))
        except OSError as exc:
            raise StepFailed("make_mount_point", exc.errno or 5) from None
        # A copy of the template's read-only bind: read-only too.
        s.mount(b"/proc/self/fd/%d" % fd, target.encode(), None, MS_BIND | MS_REC, None, "bind_mount")
        posix.close(fd)
    # The run's PID namespace's /proc (this process is in it), over T's.
    s.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None, "mount_proc")
    try:
        fd = posix.open(path, posix.O_PATH | posix.O_DIRECTORY | posix.O_CLOEXEC)
        posix.chdir(path + "/work")
    except OSError as exc:
        raise StepFailed("chdir", exc.errno or 5) from None
    return fd


def _reseed():
    """What a fork would otherwise share with its siblings: the state of random number generators.
    `random` re-seeds itself in a forked child (its `register_at_fork` hook) and again here; numpy's
    global generator (the legacy `numpy.random.*` functions) does not, so it is re-seeded from the OS
    when numpy is loaded. `os.urandom`, `secrets` and `uuid4` read the kernel at each call."""
    rnd = sys.modules.get("random")
    if rnd is not None:
        rnd.seed()
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        try:
            np_random.seed()
        except Exception:
            pass
