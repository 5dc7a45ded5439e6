"""A session's interpreter in the child: cells arrive on the control socket with their own streams,
result pipe and bridge connection; one `__main__` namespace and one event loop live across cells.

Standard library only, imported by the runner (`--session`) from runpython's code directory; one run's
machinery is `runpython_run`'s.
"""

import posix
import sys

import runpython_snapshot
from runpython_display import _install_display, _save_open_figures
from runpython_json import json_dumps, json_loads
from runpython_protocol import ProtocolError, control_message
from runpython_run import (
    BRIDGE_FD,
    FILENAME,
    RESULT_FD,
    add_sites,
    bind_inputs,
    env_now,
    format_error,
    new_main_module,
    protocol_error,
    restore_env,
    result_text,
    run_code,
    set_code_dir,
    set_env,
    warm_up,
    write_result,
    write_trust_bundle,
)

class _Session:
    """A session's interpreter: cells arrive on the control socket (its stdin) with their own stdout,
    stderr, result pipe and bridge connection as descriptors; one `__main__` namespace and one event
    loop live across cells. A thread reads the control socket so that an interrupt can reach a running
    cell (as SIGINT: a KeyboardInterrupt in the code)."""

    def __init__(self):
        import socket
        import threading

        fd = posix.dup(0)
        posix.set_inheritable(fd, False)
        self.ctl = socket.socket(fileno=fd)
        self.ctl.setblocking(True)
        null = posix.open("/dev/null", posix.O_RDWR)
        for target in (0, 1, 2, RESULT_FD, BRIDGE_FD):
            posix.dup2(null, target, inheritable=target < 3)
        posix.close(null)
        self.cells = []
        self.lock = threading.Lock()
        self.ready = threading.Condition(self.lock)
        self.running = False
        # Messages are numbered as they arrive: `current` is the one taken last, and an interrupt that
        # came before it began marks every message up to `interrupt_upto`.
        self.received = 0
        self.current = 0
        self.current_begun = True
        self.interrupt_upto = 0
        self.closed = False
        self.loop = None
        self.main_thread = threading.main_thread().ident
        threading.Thread(target=self._read, name="runpython-session", daemon=True).start()

    def _read_exact(self, n, fds):
        import socket

        data = b""
        while len(data) < n:
            chunk, got, _, _ = socket.recv_fds(self.ctl, n - len(data), 8)
            if not chunk:
                return None
            fds.extend(got)
            data += chunk
        return data

    def _read(self):
        while True:
            fds = []
            header = self._read_exact(4, fds)
            if header is None:
                break
            payload = self._read_exact(int.from_bytes(header, "big"), fds)
            if payload is None:
                break
            try:
                message = control_message(json_loads(payload.decode("utf-8")))
            except ProtocolError as exc:
                # Answered on the cell's result pipe, when the frame brought one; else the host times out.
                if len(fds) > 2:
                    write_result(fds.pop(2), protocol_error(exc))
                for fd in fds:
                    posix.close(fd)
                continue
            if message["type"] == "interrupt":
                for fd in fds:
                    posix.close(fd)
                self._interrupt()
                continue
            with self.lock:
                self.received += 1
                self.cells.append((message, fds))
                self.ready.notify()
        with self.lock:
            self.closed = True
            self.ready.notify()

    def _interrupt(self):
        """The host's interrupt: a KeyboardInterrupt in the running cell, or, for one received and not
        begun yet (on a loaded machine the host's timeout can pass before the cell starts), at its start."""
        with self.lock:
            if self.running:
                # SIGINT to the main thread itself (a signal to the process may land on this thread
                # and leave a sleeping cell asleep): a KeyboardInterrupt in the cell.
                import signal

                signal.pthread_kill(self.main_thread, signal.SIGINT)
            elif self.cells or not self.current_begun:
                self.interrupt_upto = self.received

    def _begin(self):
        """The message taken last begins (interruptible from here), or raises KeyboardInterrupt when the
        host interrupted it before it began."""
        with self.lock:
            self.current_begun = True
            if self.current <= self.interrupt_upto:
                raise KeyboardInterrupt
            self.running = True

    def next_cell(self):
        with self.lock:
            while not self.cells and not self.closed:
                self.ready.wait()
            if self.cells:
                self.current += 1
                self.current_begun = False
                return self.cells.pop(0)
            return None, None

    def run_cell(self, request, fds, namespace, sites):
        out, err, res = fds[0], fds[1], fds[2]
        bridge_fd = fds[3] if len(fds) > 3 else None
        for fd, target in ((out, 1), (err, 2)):
            posix.dup2(fd, target)
            posix.close(fd)
        if bridge_fd is not None:
            posix.dup2(bridge_fd, BRIDGE_FD, inheritable=False)
            posix.close(bridge_fd)
        set_code_dir(request["code_dir"])
        add_sites(request["site_dirs"], sites)
        write_trust_bundle(request["trust_bundle"])
        env = request["env"]
        previous = env_now(env)
        set_env(env)
        bind_inputs(request, namespace)
        try:
            self._begin()
            status, result, summary = run_code(request, namespace, self._loop)
        except KeyboardInterrupt as exc:  # the interrupt came as the cell ended
            status, result, summary = "error", format_error(exc, request["code"]), None
        finally:
            with self.lock:
                self.running = False
        try:
            _save_open_figures()
            plt = sys.modules.get("matplotlib.pyplot")
            if plt is not None:
                plt.close("all")  # saved with this cell's files; the next cell starts without them
        except BaseException:
            pass
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        write_result(res, result_text(status, result, summary))
        try:
            restore_env(previous)  # the next cell does not see this cell's variables
        except BaseException:
            pass
        # This cell's bridge connection ends with it: the client lets go of descriptor 4 without closing
        # it (the next cell's connection takes that number).
        tools = sys.modules.get("runpython_tools")
        if tools is not None and tools._bridge is not None:
            sock = getattr(tools._bridge, "sock", None)
            if sock is not None:
                sock.detach()
            tools._bridge = None
        # The cell's streams end here: the host reads them to end of file.
        null = posix.open("/dev/null", posix.O_RDWR)
        for target in (1, 2):
            posix.dup2(null, target)
        posix.dup2(null, BRIDGE_FD, inheritable=False)
        posix.close(null)

    def snapshot(self, request, fds, namespace):
        """Writes the namespace's snapshot into the pipe `fds[0]` (within `max_bytes`) and says how it
        went on `fds[1]`; the host keeps the bytes only when this says "ok"."""
        data, res = fds[0], fds[1]
        for fd in fds[2:]:
            posix.close(fd)

        def dump():
            return {"status": "ok", "bytes": runpython_snapshot.dump(namespace, data, request["max_bytes"])}

        write_result(res, json_dumps(self._timed(dump)))

    def restore(self, request, fds, namespace, sites):
        """Loads a snapshot from the pipe `fds[0]` into the (new, empty) namespace and says how it went on
        `fds[1]`. A failed load leaves part of it behind: the host then starts another interpreter."""
        data, res = fds[0], fds[1]
        for fd in fds[2:]:
            posix.close(fd)
        add_sites(request["site_dirs"], sites)  # a snapshot of a DataFrame imports pandas

        def load():
            runpython_snapshot.load(namespace, data)
            return {"status": "ok"}

        write_result(res, json_dumps(self._timed(load)))

    def _timed(self, step):
        """`step()`'s answer with how long it took; a failure as the answer that names it. The host may
        interrupt it (a snapshot that takes too long)."""
        import time

        started = time.perf_counter()
        try:
            self._begin()
            answer = step()
        except runpython_snapshot.TooLarge as exc:
            answer = {"status": "too_large", "bytes": exc.args[0]}
        except runpython_snapshot.Unkept as exc:
            answer = {"status": "failed", "why": str(exc)}
        except KeyboardInterrupt:
            answer = {"status": "failed", "why": "interrupted by the host: it took too long"}
        except BaseException as exc:
            answer = {"status": "failed", "why": runpython_snapshot.describe(exc)}
        finally:
            with self.lock:
                self.running = False
        answer["ms"] = (time.perf_counter() - started) * 1000
        return answer

    def _loop(self):
        if self.loop is None:
            import asyncio

            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
        return self.loop


def main():
    import signal

    # The host's interrupt is a SIGINT: a host started in the background (its SIGINT ignored, which
    # an exec keeps and Python then leaves alone) must not make a session's cells uninterruptible.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    warm_up(sys.argv[2:])  # "--session 1" is a pair it skips
    sys.argv = [FILENAME]
    session = _Session()
    sys.stdout.reconfigure(line_buffering=True)
    namespace = new_main_module()
    _install_display()
    sites = []
    while True:
        try:
            request, fds = session.next_cell()
            if request is None:
                break
            kind = request["type"]
            if kind == "snapshot":
                session.snapshot(request, fds, namespace)
            elif kind == "restore":
                session.restore(request, fds, namespace, sites)
            else:
                session.run_cell(request, fds, namespace, sites)
        except KeyboardInterrupt:
            continue  # an interrupt that arrived between cells
    posix._exit(0)
