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

import json
import posix
import sys

from runpython_forked import (
    CLONE_NEWPID,
    PR_SET_DUMPABLE,
    PR_SET_PDEATHSIG,
    SIGKILL,
    BRIDGE_FD,
    RESULT_FD,
    Fds,
    StepFailed,
    Sys,
    keep_only,
    interpreter,
)


# What a forked run continues into once its sandbox is taken (the runner's one-shot path), given by the
# entry module that started the template (`serve`): this module knows nothing of the runner.
_continue_run = None

# The host's commands, key by key as runpython-core's `TemplateCommand` and runpython-sandbox's
# `ForkCommand` send them: a key missing or unknown is refused, never a default.
FORK_KEYS = frozenset(
    ("op", "fds", "uid", "owner", "unshare", "net", "userns", "inside", "forbid_nested", "nproc", "rlimits",
     "landlock", "seccomp", "devpts", "egress", "scratch")
)
EGRESS_KEYS = frozenset(("notifier", "relay_port", "dns_port"))
SCRATCH_KEYS = frozenset(("path", "size", "dirs", "rebind"))
COMMANDS = {"fork": FORK_KEYS, "stat": frozenset(("op",))}


def checked_command(command):
    """`command` if it is one of the host's commands with exactly its keys; else ValueError naming why."""
    if type(command) is not dict or command.get("op") not in COMMANDS:
        raise ValueError("unknown command %r" % (command.get("op") if type(command) is dict else command,))
    parts = [(command, COMMANDS[command["op"]], "the %s command" % command["op"])]
    if command["op"] == "fork":
        parts.append((command["scratch"] if "scratch" in command else {}, SCRATCH_KEYS, "its scratch"))
        if command.get("egress") is not None:
            parts.append((command["egress"], EGRESS_KEYS, "its egress"))
    for value, keys, what in parts:
        if type(value) is not dict:
            raise ValueError("%s is not an object" % what)
        for key in sorted(keys):
            if key not in value:
                raise ValueError("%s: missing key %r" % (what, key))
        for key in value:
            if key not in keys:
                raise ValueError("%s: unknown key %r" % (what, key))
    return command


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
        for target in (RESULT_FD, BRIDGE_FD):
            if target != null:
                posix.dup2(null, target, inheritable=False)
        fd = posix.dup(0)  # above 4 now
        posix.set_inheritable(fd, False)
        self.ctl = socket.socket(fileno=fd)
        self.ctl.setblocking(True)
        for target in (0, 1):
            posix.dup2(null, target, inheritable=False)
        if null > BRIDGE_FD:
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
        data = json.dumps(message, separators=(",", ":")).encode("utf-8")
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
            command = checked_command(json.loads(message.decode("utf-8")))
            op = command["op"]
        except (ValueError, UnicodeDecodeError) as exc:
            command, op, why = None, None, str(exc)
        if op == "fork":
            reply, out = self.fork(command, Fds(command["fds"], fds))
            for run in self.runs:
                poller.register(run, select.POLLIN)  # registering again is harmless
        elif op == "stat":
            for fd in fds:
                posix.close(fd)
            reply, out = self.stat(), []
        else:
            for fd in fds:
                posix.close(fd)
            reply, out = {"error": "runpython's host and template disagree: %s" % (why,)}, []
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
        # The kernel names the run's sender on what it says to the host, which checks that process.
        host_end.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
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
            interpreter(
                s, command, fds, run_end.detach(), peer_end.detach(), _continue_run, Template.comm
            )  # never returns
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
        keep_only(s, [sock, pid_ns])
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


def _init(s, cgroups, peer):
    """G: PID 1 of the run's PID namespace, a copy of I. Never returns."""
    import select
    import signal
    import socket

    try:
        keep_only(s, cgroups + [peer])
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


def serve(args, warm_up, run):
    """T's main: warm up (`warm_up(args)`: the environment and the warm imports), quiesce, say ready (or
    why not), then serve forks until the host lets go. Each forked run, its sandbox taken, calls `run()`."""
    global _continue_run
    _continue_run = run
    template = Template()
    template.start_factory()
    warm_up(args)
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
