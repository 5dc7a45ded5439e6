"""runpython's template: a warm interpreter that one-shot runs are forked from, each into its own sandbox.

Stdlib only. The host starts the template (T) like any interpreter of a run, in a base sandbox (the
allowlisted filesystem view, no network unless runs have it, a cgroup of its own), but as root of its own
user namespace and without Landlock, seccomp or limits: it needs the capabilities to make each run's
namespaces, and it never runs user code. T imports the runner, the environment and the warm modules,
stops library thread pools, and waits for commands on its control socket (its stdin, a SOCK_SEQPACKET
socket: one message is one command, with its descriptors attached):

    {"op": "fork", ...} + the run's status pipe, Landlock ruleset, cgroups
        ->  {"ok": true, "pid": G} + a pidfd of G and the host's end of the run's socket,
            or {"error": "..."}
    {"op": "stat"}  ->  {"rss": bytes, "threads": n, "forked": n}

A fork makes two processes, ahead of the run they will serve (the host keeps a few ready):

- G, PID 1 of a fresh PID namespace, made by I, a small helper T forked before its warm imports (so that
  G, which runs no code of the run, is not a copy of everything T imported). G joins the run's cgroup,
  reaps what the run orphans, and when H ends kills the rest of its namespace. G is not dumpable and keeps
  T's uid: the code, another uid without capabilities, can neither read nor signal it.
- H, the run's interpreter, forked by T into G's PID namespace (its PID 2). T reaps it and writes its wait
  status (4 bytes) to the run's status pipe. H tells G it is there (its pidfd), joins the run's cgroup, and
  takes everything of its own (`_setup`): mount, network, IPC and UTS namespaces, a fresh tmpfs scratch at
  `/runpython` with its `/tmp` and `/dev/shm`, a `/proc` of its PID namespace, the run's uid (a root host's
  templates give each run its own) inside a user namespace of its own where nested user namespaces are
  forbidden, no capability, its limits, `no_new_privs`, Landlock (the host's ruleset plus rules on the run's
  own directories) and the host's seccomp program; re-seeds what a fork would share (`_reseed`). It then
  tells the host on the run's socket: ready (`R` with its scratch's descriptor), or the step that failed
  (`E`). When its run comes, the host sends it the run's five descriptors (`G`: stdin, stdout, stderr, the
  result pipe, the bridge); H keeps those and nothing else, and continues in the runner's one-shot path. It
  never returns into T.

What a fork shares with its siblings and T, and why that is acceptable, is written in ARCHITECTURE.md
("Runs forked from a template").
"""

import posix
import sys

import runpython_runner as runner

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


class Template:
    """T: forks runs on command."""

    comm = b"python3"  # the interpreter's name before T renamed itself

    def __init__(self):
        import resource  # noqa: F401  (for the runs: each sets its limits with it)
        import signal
        import socket

        self.sys = Sys()
        self.socket = socket
        # Descriptors 0-4 stay taken (a run's own arrive above them); stderr is the host's log of T.
        null = posix.open("/dev/null", posix.O_RDWR)
        for target in (runner.RESULT_FD, runner.BRIDGE_FD):
            if target != null:
                posix.dup2(null, target, inheritable=False)
        fd = posix.dup(0)  # above 4 now
        posix.set_inheritable(fd, False)
        self.ctl = socket.socket(fileno=fd)
        self.ctl.setblocking(True)
        for target in (0, 1):
            posix.dup2(null, target, inheritable=False)
        if null > runner.BRIDGE_FD:
            posix.close(null)
        self.pid_ns = posix.open("/proc/self/ns/pid", posix.O_RDONLY | posix.O_CLOEXEC)
        self.forked = 0
        # Runs' interpreters T forked and reaps: pidfd -> (pid, the run's status pipe).
        self.runs = {}
        self.factory = None

    def start_factory(self):
        """Forks I, the maker of runs' inits, while T is still small (before its warm imports)."""
        import select  # noqa: F401  (for I and the inits it makes)
        import signal  # noqa: F401

        socket = self.socket
        t_end, i_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = posix.fork()
        if pid == 0:
            self.ctl.detach()
            t_end.detach()
            _factory(self.sys, i_end.detach(), self.pid_ns)  # never returns
        i_end.close()
        self.factory = t_end

    def quiesce(self):
        """Stops library thread pools (OpenBLAS and the like stop theirs in fork handlers: one fork does
        it) and returns the threads left besides this one, by name: a process with threads cannot be
        forked safely (a lock another thread holds stays held in the child)."""
        import gc

        pid = posix.fork()
        if pid == 0:
            posix._exit(0)
        posix.waitpid(pid, 0)
        gc.collect()
        # Objects alive now are never collected in a run: its collections leave their pages shared.
        gc.freeze()
        # This thread as /proc numbers it (its PID namespace may not be the one /proc shows).
        own = posix.readlink("/proc/thread-self").rsplit("/", 1)[-1]
        others = []
        for tid in posix.listdir("/proc/self/task"):
            if tid != own:
                try:
                    with open("/proc/self/task/%s/comm" % tid) as f:
                        others.append(f.read().strip())
                except OSError:
                    others.append(tid)
        return others

    def send(self, message, fds=()):
        data = runner.json_dumps(message).encode("utf-8")
        if fds:
            self.socket.send_fds(self.ctl, [data], list(fds))
        else:
            self.ctl.send(data)

    def serve(self):
        import select

        poller = select.poll()
        poller.register(self.ctl, select.POLLIN)
        while True:
            try:
                ready = poller.poll()
            except InterruptedError:
                continue
            for fd, _ in ready:
                if fd in self.runs:
                    self.reap(fd, poller)
                elif not self.command(poller):
                    posix._exit(0)  # the host is gone or done with this template

    def command(self, poller):
        """Serves one command; False when the control socket is closed."""
        import select

        message, fds, _, _ = self.socket.recv_fds(self.ctl, 1 << 16, 16)
        if not message:
            return False
        try:
            command = runner.json_loads(message.decode("utf-8"))
            op = command.get("op")
        except (ValueError, UnicodeDecodeError):
            command, op = None, None
        if op == "fork":
            reply, out = self.fork(command, Fds(command.get("fds") or [], fds))
            for run in self.runs:
                poller.register(run, select.POLLIN)  # registering again is harmless
        elif op == "stat":
            for fd in fds:
                posix.close(fd)
            reply, out = self.stat(), []
        else:
            for fd in fds:
                posix.close(fd)
            reply, out = {"error": "unknown command %r" % (op,)}, []
        try:
            self.send(reply, out)
        finally:
            for fd in out:
                posix.close(fd)
        return True

    def reap(self, pidfd, poller):
        """A run's interpreter ended: its wait status goes to the run's status pipe."""
        pid, status_fd = self.runs.pop(pidfd)
        poller.unregister(pidfd)
        try:
            _, status = posix.waitpid(pid, 0)
        except ChildProcessError:
            status = SIGKILL
        try:
            posix.write(status_fd, status.to_bytes(4, sys.byteorder, signed=True))
        except OSError:
            pass  # the host let go of the run
        posix.close(status_fd)
        posix.close(pidfd)

    def stat(self):
        rss = 0
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
        return {"rss": rss, "threads": len(posix.listdir("/proc/self/task")), "forked": self.forked}

    def fork(self, command, fds):
        s = self.sys
        socket = self.socket
        host_end, run_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        init_end, peer_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        init = None
        try:
            # I makes the run's init, PID 1 of a fresh PID namespace, in the run's cgroups.
            socket.send_fds(self.factory, [b"I"], fds.all("cgroup") + [init_end.fileno()])
            _, got, _, _ = socket.recv_fds(self.factory, 16, 1)
            if not got:
                raise OSError(5, "the maker of runs' inits gave none")
            init = got[0]
            # This next child (the run's interpreter) is born in the init's PID namespace; T's
            # children after it are in T's own again (the child keeps the init's for its own).
            s.setns(init, CLONE_NEWPID, "fork_run")
            try:
                pid = posix.fork()
            except OSError:
                s.libc.setns(self.pid_ns, CLONE_NEWPID)
                raise
            if pid:
                s.libc.setns(self.pid_ns, CLONE_NEWPID)
        except (StepFailed, OSError) as exc:
            fds.close()
            for end in (host_end, run_end, init_end, peer_end):
                end.close()
            if init is not None:
                posix.close(init)
            return {"error": "forking the run: %s" % (exc,)}, []
        if pid == 0:
            # Socket objects must never close their numbers, which the run reuses.
            self.ctl.detach()
            self.factory.detach()
            host_end.detach()
            init_end.detach()
            _interpreter(s, command, fds, run_end.detach(), peer_end.detach())  # never returns
        status = posix.dup(fds.one("status"))
        fds.close()
        run_end.close()
        init_end.close()
        peer_end.close()
        self.forked += 1
        try:
            self.runs[posix.pidfd_open(pid)] = (pid, status)
        except OSError:
            posix.close(status)  # gone already: the run's socket tells the host
        return {"ok": True, "pidfd": True}, [init, host_end.detach()]


def _factory(s, sock, pid_ns):
    """I: makes runs' inits on T's request. Small (forked before T's warm imports). Never returns."""
    import signal
    import socket

    try:
        _keep_only(s, [sock, pid_ns])
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the inits it makes: the kernel reaps them
        s.prctl(PR_SET_PDEATHSIG, SIGKILL, "pdeathsig")
        s.set_name(b"runpython-inits")
        conn = socket.socket(fileno=sock)
        while True:
            message, fds, _, _ = socket.recv_fds(conn, 16, 16)
            if not message:
                posix._exit(0)
            *cgroups, peer = fds
            pid = -1
            try:
                # A fresh PID namespace for the next child only: it becomes that namespace's PID 1.
                s.setns(pid_ns, CLONE_NEWPID, "fork_run")
                s.unshare(CLONE_NEWPID, "fork_run")
                pid = posix.fork()
            except (StepFailed, OSError):
                pass
            if pid == 0:
                conn.detach()
                _init(s, cgroups, peer)  # never returns
            s.libc.setns(pid_ns, CLONE_NEWPID)
            for fd in fds:
                posix.close(fd)
            try:
                out = [posix.pidfd_open(pid)] if pid > 0 else []
            except OSError:
                out = []
            socket.send_fds(conn, [b"G"], out) if out else conn.send(b"-")
            for fd in out:
                posix.close(fd)
    finally:
        posix._exit(0)


def _keep_only(s, keep):
    """Closes every descriptor but `keep` (and stdin, stdout, stderr: T's, until the run's replace them)."""
    low = 3
    for fd in sorted(set(keep)):
        if fd >= low:
            posix.closerange(low, fd)
            low = fd + 1
    s.close_from(low)


def _init(s, cgroups, peer):
    """G: PID 1 of the run's PID namespace, a copy of I. Never returns."""
    import select
    import signal
    import socket

    try:
        _keep_only(s, cgroups + [peer])
        # It is a copy of I (so of T): nothing of the run may read its memory or its /proc files.
        s.prctl(PR_SET_DUMPABLE, 0, "dumpable")
        s.prctl(PR_SET_PDEATHSIG, SIGKILL, "pdeathsig")
        # Its name in the run's /proc, as a fresh run's init is named.
        s.set_name(b"runpython-init")
        # Out of T's process group: a signal the code sends its own group reaches this run only.
        posix.setsid()
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for procs in cgroups:
            posix.write(procs, b"0")
            posix.close(procs)
        # Woken when an orphan of the run ends (to reap it) or when the interpreter does.
        wake_r, wake_w = posix.pipe2(posix.O_NONBLOCK | posix.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        conn = socket.socket(fileno=peer)
        _, got, _, _ = socket.recv_fds(conn, 16, 1)
        conn.close()
        poller = select.poll()
        poller.register(wake_r, select.POLLIN)
        for fd in got:  # the interpreter's pidfd; none: it never came, or died first
            poller.register(fd, select.POLLIN)
        while got:
            try:
                ready = [fd for fd, _ in poller.poll()]
            except InterruptedError:
                continue
            if wake_r in ready:
                try:
                    posix.read(wake_r, 4096)
                except BlockingIOError:
                    pass
                while True:
                    try:
                        if posix.waitpid(-1, posix.WNOHANG)[0] == 0:
                            break
                    except ChildProcessError:
                        break
            if got[0] in ready:
                break
        # From PID 1, -1 is every other process of this namespace and nothing outside it.
        try:
            posix.kill(-1, SIGKILL)
        except OSError:
            pass
    finally:
        posix._exit(0)


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
        posix.write(run, b"E" + runner.json_dumps({"step": step, "errno": errno, "message": message[:500]}).encode())
    except (OSError, TypeError):
        pass


def _interpreter(s, command, fds, run, peer):
    """H: tells its init it is there, takes the run's sandbox, says it is ready, waits for its run's
    descriptors, then runs the code. Never returns."""
    import socket

    sock = socket.socket(fileno=run)
    try:
        # The run's status pipe is T's to write: not kept.
        _keep_only(s, [run, peer] + [fd for name, fd in fds.pairs if name != "status"])
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
        scratch, egress_fds = _setup(s, command, fds)
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
            posix.dup2(fd, target, inheritable=target < runner.RESULT_FD)
        s.close_from(len(RUN_FDS))
        sock.detach()
    except BaseException as exc:
        _report(run, exc)
        posix._exit(125)
    try:
        runner.forked_main()
    finally:
        posix._exit(0)


def _setup(s, command, fds):
    """Everything H takes before the code runs, in order; returns the scratch's descriptor and, with a
    network policy, the descriptors of its egress for the host (the last its connect notifier's
    listener, which H must not keep)."""
    import signal

    s.set_name(Template.comm)  # the interpreter's own name, not its init's
    signal.signal(signal.SIGINT, signal.default_int_handler)
    s.prctl(PR_SET_PDEATHSIG, SIGKILL, "pdeathsig")
    flags = CLONE_NEWNS | int(command.get("unshare") or 0)
    if command.get("net"):
        flags |= CLONE_NEWNET
    s.unshare(flags)
    if flags & CLONE_NEWNET:
        _loopback_up()
    egress = command.get("egress")
    egress_fds = _egress_sockets(egress) if egress else []
    if flags & CLONE_NEWUTS:
        s.check(s.libc.sethostname(b"runpython", 9), "hostname")
    scratch = _mount_scratch(s, command["scratch"], int(command.get("owner") or 0))
    if command.get("devpts"):
        # The run's own terminals (a new devpts instance over the template's; /dev/ptmx links here).
        s.mount(b"devpts", b"/dev/pts", b"devpts", MS_NOSUID | MS_NOEXEC, command["devpts"].encode(), "mount_devpts")
    uid = command.get("uid")
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
    if command.get("userns"):
        own = posix.getuid()
        own_gid = posix.getgid()
        s.unshare(CLONE_NEWUSER)
        inside = int(command.get("inside") or 1000)
        _write("/proc/self/setgroups", b"deny", "write_setgroups")
        _write("/proc/self/uid_map", b"%d %d 1" % (inside, own), "write_uid_map")
        _write("/proc/self/gid_map", b"%d %d 1" % (inside, own_gid), "write_gid_map")
        if command.get("forbid_nested"):
            _write("/proc/sys/user/max_user_namespaces", b"0", "forbid_nested_userns")
    s.drop_capabilities()
    # Credential changes clear the parent-death signal.
    s.prctl(PR_SET_PDEATHSIG, SIGKILL, "pdeathsig")
    resource = sys.modules["resource"]  # imported by T, not once per run
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if command.get("nproc") is not None:
            n = int(command["nproc"])
            resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
        for which, soft, hard in command.get("rlimits") or ():
            resource.setrlimit(which, (soft, hard))
    except (OSError, ValueError) as exc:
        raise StepFailed("rlimit", getattr(exc, "errno", None) or 22) from None
    s.prctl(PR_SET_NO_NEW_PRIVS, 1, "no_new_privs")
    if command.get("landlock") is not None:
        s.landlock(fds.one("landlock"), command["landlock"])
    if command.get("seccomp"):
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
    for target, is_dir in spec.get("rebind") or ():
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


def serve(args):
    """T's main: warm up, quiesce, say ready (or why not), then serve forks until the host lets go."""
    template = Template()
    template.start_factory()
    runner._warm_up(args)
    s = template.sys
    with open("/proc/self/comm", "rb") as f:
        Template.comm = f.read().strip()  # its runs' interpreters take it back
    s.set_name(b"runpython-tpl")
    threads = template.quiesce()
    if threads:
        template.send({"error": "threads remain after the warm imports (%s): a process with threads cannot be forked safely" % ", ".join(threads)})
        posix._exit(1)
    template.send({"ready": True, **template.stat()})
    template.serve()
