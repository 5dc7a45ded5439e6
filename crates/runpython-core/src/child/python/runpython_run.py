"""One run's machinery in the child: reading the host's request, binding inputs, compiling and executing the
code (top-level await included), reporting its value or its exception, and answering on the result pipe.

A library: the entry modules import it (`runpython_runner` for a one-shot run and the dispatch to the other
modes, `runpython_session` for a session's cells, `runpython_template` for a template and the runs it forks),
and it imports none of them. Stdlib only, with its siblings in runpython's code directory:
`runpython_protocol` (the host's messages, checked key by key), `runpython_json` (values as JSON,
previews), `runpython_display` (the display protocol, charts as data), `runpython_values` (exact values).

The request is one line of JSON on stdin (its keys: `runpython_protocol.RUN_REQUEST`, sent by the host's
`RunnerRequest`); the result goes back as one JSON object on file descriptor 3, a pipe that only the host
reads, so nothing the code prints can forge it. stdout and stderr are the code's own.

Start-up cost matters (a trivial run should cost little more than starting Python), so these modules import
only built-in modules: `posix` instead of `os` (1.3 ms), the `_json` accelerator instead of `json` (8 ms: it
pulls in `re`). `asyncio` is imported only when the code awaits, `traceback` only on errors.
"""

import posix
import sys

import runpython_protocol
import runpython_values
from runpython_display import (
    _DISPLAYS,
    _IMAGES,
    _add_display,
    _install_display,
    _rich,
    _save_open_figures,
)
from runpython_json import _report_value, _repr, json_dumps, json_loads

FILENAME = "<code>"
RESULT_FD = 3
BRIDGE_FD = 4
CO_COROUTINE = 0x80
PyCF_ONLY_AST = 0x400
PyCF_ALLOW_TOP_LEVEL_AWAIT = 0x2000
# Longest error message and traceback the child reports (the host fits them into the envelope's budget).
MAX_MESSAGE_CHARS = 8_000
MAX_TRACEBACK_CHARS = 16_000
# Frames whose file name starts with this belong to runpython, not to the user, and are hidden.
PRIVATE_PREFIX = "<runpython-"
# runpython's own modules, by the file their code came from: their frames are hidden in tracebacks.
_RUN_FILE = (lambda: None).__code__.co_filename
_HERE = _RUN_FILE.rpartition("/")[0] + "/"
_PRIVATE_FILES = frozenset(
    [_RUN_FILE, json_dumps.__code__.co_filename, _add_display.__code__.co_filename,
     runpython_values.encode.__code__.co_filename]
    + [_HERE + name + ".py" for name in ("runpython_runner", "runpython_session", "runpython_template")]
)
_code_dir = None  # where runpython's own modules were imported from (their frames are hidden too)


def read_request():
    # The request is one line (compact JSON holds no newline): reading up to it, not to stdin's end,
    # starts the code without waiting for every copy of the pipe's write end to close (a process the host
    # forks meanwhile holds one until it execs).
    chunks = []
    while True:
        chunk = posix.read(0, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
        if b"\n" in chunk:
            break
    # stdin is not the code's: point fd 0 at /dev/null so input() raises EOFError instead of hanging.
    null = posix.open("/dev/null", posix.O_RDONLY)
    posix.dup2(null, 0)
    posix.close(null)
    return runpython_protocol.run_request(json_loads(b"".join(chunks).decode("utf-8")))


def _is_private(filename):
    return (
        filename in _PRIVATE_FILES
        or filename.startswith(PRIVATE_PREFIX)
        or (_code_dir is not None and filename.startswith(_code_dir))
    )


def format_error(exc, source):
    """{type, message, traceback} with only the user's frames."""
    import linecache
    import traceback

    linecache.cache[FILENAME] = (len(source), None, source.splitlines(True), FILENAME)
    tb = exc.__traceback__
    # Drop the plumbing before the first frame of user code (runner, asyncio internals).
    probe = tb
    while probe is not None and probe.tb_frame.f_code.co_filename != FILENAME:
        probe = probe.tb_next
    if probe is not None:
        tb = probe
    te = traceback.TracebackException(type(exc), exc, tb, compact=True)
    _strip_private(te, set())
    try:
        message = str(exc)
        if isinstance(exc, KeyError) and len(exc.args) == 1:
            message = _repr(exc.args[0])
    except BaseException:
        message = "<str() of the exception raised>"
    # Whatever its size, the error reaches the host with its type: message and traceback are cut
    # (head and tail) here, before they could make the result record too large to read.
    return {
        "type": type(exc).__name__,
        "message": _cut(message, MAX_MESSAGE_CHARS),
        "traceback": _cut(_format_traceback(te), MAX_TRACEBACK_CHARS),
    }


def _format_traceback(te):
    try:
        return "".join(te.format())
    except BaseException as exc:  # an exception whose str() raises, or one too big to show
        return "<the traceback could not be formatted: %s>" % type(exc).__name__


def _cut(text, limit):
    """`text` within `limit` characters: its head and tail around a marker saying how much was left out."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return "%s\n…[%d characters omitted]…\n%s" % (text[:half], len(text) - 2 * half, text[-half:])


def _strip_private(te, seen):
    import traceback

    if te is None or id(te) in seen:
        return
    seen.add(id(te))
    te.stack = traceback.StackSummary.from_list([f for f in te.stack if not _is_private(f.filename)])
    _strip_private(te.__cause__, seen)
    _strip_private(te.__context__, seen)


def _compile(source, bridge_module):
    """Split the code into its body and its last expression statement, both allowing top-level await."""
    import _ast

    tree = compile(source, FILENAME, "exec", PyCF_ONLY_AST, dont_inherit=True)
    if bridge_module is not None:
        bridge_module.rewrite_awaited_calls(tree)
    body, last = tree.body, None
    if body and isinstance(body[-1], _ast.Expr):
        last = _ast.Expression(body=body[-1].value)
        body = body[:-1]
    flags = PyCF_ALLOW_TOP_LEVEL_AWAIT
    body_code = compile(_ast.Module(body=body, type_ignores=[]), FILENAME, "exec", flags, dont_inherit=True)
    last_code = compile(last, FILENAME, "eval", flags, dont_inherit=True) if last is not None else None
    return body_code, last_code


def _execute(body_code, last_code, namespace, loop=None):
    """Run the code; returns (has_value, value). `loop()` gives a session's event loop (kept across
    cells); a one-shot run gets its own."""
    needs_loop = body_code.co_flags & CO_COROUTINE or (last_code is not None and last_code.co_flags & CO_COROUTINE)
    if not needs_loop:
        exec(body_code, namespace)
        if last_code is None:
            return False, None
        return True, eval(last_code, namespace)

    import asyncio

    async def run_module():
        pending = eval(body_code, namespace)
        if pending is not None:
            await pending
        if last_code is None:
            return None
        value = eval(last_code, namespace)
        if last_code.co_flags & CO_COROUTINE:
            value = await value
        return value

    if loop is not None:
        return last_code is not None, loop().run_until_complete(run_module())
    return last_code is not None, asyncio.run(run_module())


def _install_bridge(spec, namespace):
    tools = sys.modules.get("runpython_tools")
    if tools is None:
        # The bridge's client module sits beside this one, in runpython's code directory (which is
        # not on the code's sys.path once the code runs).
        if _code_dir is not None:
            sys.path.insert(0, _code_dir)
        try:
            import runpython_tools
        finally:
            if _code_dir is not None and _code_dir in sys.path:
                sys.path.remove(_code_dir)

    tools = sys.modules["runpython_tools"]
    typed = spec is not None and any(t["typed"] for t in spec["tools"])
    tools.install(spec, namespace, json_loads, json_dumps, runpython_values if typed else None)
    return tools


def write_all(fd, data):
    """Writes all of `data` to `fd`, then closes it."""
    try:
        view = memoryview(data)
        while view:
            view = view[posix.write(fd, view):]
    finally:
        posix.close(fd)


def write_result(result_fd, text):
    view = memoryview(text.encode("utf-8"))
    while view:
        view = view[posix.write(result_fd, view) :]
    posix.close(result_fd)


def _parse_artifact(data):
    """Artifact bytes as the code most likely wants them: JSON parsed, CSV as a list of row dicts, other
    text as str, anything else as bytes."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data
    try:
        return json_loads(text)
    except ValueError:
        pass
    first = text.split("\n", 1)[0]
    if "\n" in text.strip() and ("," in first or "\t" in first):
        import csv
        import io

        return list(csv.DictReader(io.StringIO(text), delimiter="\t" if "\t" in first else ","))
    return text


READ_SLICE = 8 << 20


def _read_slices(call, id, offset=0, length=None):
    """`length` bytes of artifact `id` from `offset` (to its end without one), read through the host in
    slices of at most READ_SLICE: the host holds one slice at a time, never the whole artifact."""
    import binascii

    parts = []
    while length is None or length > 0:
        want = READ_SLICE if length is None else min(length, READ_SLICE)
        part = binascii.a2b_base64(call("runpython_read_artifact", id=id, offset=offset, length=want))
        parts.append(part)
        offset += len(part)
        if length is not None:
            length -= len(part)
        if len(part) < want:
            break
    return b"".join(parts)


def _artifact_helpers(namespace, spec, saved_dir):
    """read_artifact / load_artifact / save_artifact: data by reference through the host's store. The
    bridge client is imported on their first use, so a run that never touches artifacts pays nothing."""

    def call(tool, **kwargs):
        tools = sys.modules.get("runpython_tools")
        if tools is None:
            tools = _install_bridge(spec, {})
        return tools.call(tool, **kwargs)

    def read_artifact(id, offset=0, length=None):
        """The bytes of artifact `id` (or `length` bytes from `offset`); more than 8 MiB is read in slices."""
        return _read_slices(call, id, offset, length)

    def load_artifact(id):
        """Artifact `id` parsed: JSON as values, CSV as a list of row dicts, text as str, else bytes."""
        return _parse_artifact(read_artifact(id))

    def save_artifact(name, data):
        """Keeps `data` (bytes, str, or a JSON value) as an artifact of this run; returns its id."""
        if not isinstance(name, str) or not name or "/" in name or name in (".", "..") or len(name) > 200:
            raise ValueError("artifact name %r must be 1-200 characters without slashes" % (name,))
        if isinstance(data, (bytes, bytearray, memoryview)):
            payload = data
        elif isinstance(data, str):
            payload = data.encode("utf-8")
        else:
            payload = json_dumps(data).encode("utf-8")
        # The data goes to the run's `saved/` directory; the host streams it from there into the store
        # (it never crosses the bridge, and the host never holds it in memory).
        fd = posix.open(saved_dir + "/" + name, posix.O_WRONLY | posix.O_CREAT | posix.O_TRUNC | posix.O_NOFOLLOW, 0o600)
        try:
            view = memoryview(payload).cast("B")
            while view:
                view = view[posix.write(fd, view) :]
        finally:
            posix.close(fd)
        return call("runpython_save_artifact", name=name)

    for helper in (read_artifact, load_artifact, save_artifact):
        namespace[helper.__name__] = helper


def _finish_like_exit(namespace):
    """Does now what the interpreter's exit would do for the code: wait for its non-daemon threads, run
    its exit handlers, release its globals (closing and flushing the files it left open). The host may
    then take the answer, and the files, without waiting for the interpreter to exit."""
    threading = sys.modules.get("threading")
    if threading is not None:
        current = threading.current_thread()
        for thread in threading.enumerate():
            if thread is not current and not thread.daemon:
                try:
                    thread.join()
                except BaseException:
                    pass
    try:
        import atexit

        atexit._run_exitfuncs()
    except BaseException:
        pass  # a failing handler has reported itself on stderr, as at a normal exit
    try:
        namespace.clear()
    except BaseException:
        pass


def write_trust_bundle(bundle):
    """The run's trust bundle (the host's roots and the run's own CA, which signs what the host shows
    for a secret's hosts), written read-only where the trust variables in its environment point."""
    if not bundle:
        return
    path = bundle["path"]
    try:
        posix.unlink(path)
    except OSError:
        pass
    fd = posix.open(path, posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL | posix.O_CLOEXEC, 0o444)
    try:
        data = bundle["pem"].encode("ascii")
        while data:
            data = data[posix.write(fd, data):]
    finally:
        posix.close(fd)


def set_env(env):
    """The run's own environment variables, set after start-up (a pooled interpreter started before its
    run was known): in `os.environ` if `os` is already imported, else where `os` will read them."""
    os = sys.modules.get("os")
    for name, value in env.items():
        if os is not None:
            os.environ[name] = value
        else:
            posix.putenv(name, value)
            posix.environ[name.encode("utf-8", "surrogateescape")] = value.encode("utf-8", "surrogateescape")


def env_now(names):
    """The current values of `names` (None where unset), as `set_env` would read them back."""
    os = sys.modules.get("os")
    if os is not None:
        return {name: os.environ.get(name) for name in names}
    found = {}
    for name in names:
        value = posix.environ.get(name.encode("utf-8", "surrogateescape"))
        found[name] = None if value is None else value.decode("utf-8", "surrogateescape")
    return found


def restore_env(previous):
    """Puts back what `env_now` saw: a session cell's variables are that cell's only."""
    os = sys.modules.get("os")
    for name, value in previous.items():
        if value is not None:
            set_env({name: value})
        elif os is not None:
            os.environ.pop(name, None)
        else:
            posix.unsetenv(name)
            posix.environ.pop(name.encode("utf-8", "surrogateescape"), None)


def warm_up(args):
    """An interpreter prepares before its run arrives: `--site DIR` adds the environment, `--warm a,b`
    imports modules the pool declares warm (a failed import is left for the run to see), and `--prime
    a,b` (a template of a warm environment) does those packages' first-use work (`runpython_warm`)."""
    while len(args) >= 2:
        flag, value = args[0], args[1]
        args = args[2:]
        if flag == "--site":
            add_sites([value], [])
        elif flag == "--warm":
            for name in value.split(","):
                try:
                    __import__(name)
                except Exception:
                    pass
        elif flag == "--prime":
            import runpython_warm

            runpython_warm.prime(value.split(","))


def _refusal_reason(host, port, resolver=("127.0.0.1", 53)):
    """Why runpython's network policy refused a connect to `host`:`port`, asked of the run's own
    resolver (a TXT question in why.runpython.invalid, answered from the host's memory of the run's
    refusals: no tool call, nothing leaves the host); None when it does not say."""
    import os
    import socket
    import struct

    try:
        hexed = str(host).encode().hex()
        labels = [b"%d" % int(port)] + [hexed[i : i + 62].encode() for i in range(0, len(hexed), 62)]
        labels += [b"why", b"runpython", b"invalid"]
        qname = b"".join(bytes((len(label),)) + label for label in labels) + b"\0"
        if len(qname) > 255:
            return None
        qid = os.urandom(2)
        # One question (TXT, IN), recursion desired, and an EDNS record offering 1232 bytes.
        query = qid + b"\x01\x00\x00\x01\x00\x00\x00\x00\x00\x01" + qname + b"\x00\x10\x00\x01"
        query += b"\x00\x00\x29\x04\xd0\x00\x00\x00\x00\x00\x00"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(2)
            s.sendto(query, resolver)
            while True:
                answer = s.recv(2048)
                if answer[:2] == qid:
                    break
        flags, qdcount, ancount = struct.unpack("!HHH", answer[2:8])
        if flags & 0x000F or not ancount:
            return None
        at = 12 + len(qname) + 4  # the question, echoed
        while answer[at] & 0xC0 != 0xC0 and answer[at]:  # the answer's name: a pointer, or labels
            at += answer[at] + 1
        at += 2 if answer[at] & 0xC0 == 0xC0 else 1
        rtype, _, _, rdlength = struct.unpack("!HHIH", answer[at : at + 10])
        if rtype != 16:
            return None
        rdata, parts = answer[at + 10 : at + 10 + rdlength], []
        while rdata:
            parts.append(rdata[1 : 1 + rdata[0]])
            rdata = rdata[1 + rdata[0] :]
        return b"".join(parts).decode("utf-8", "replace") or None
    except (OSError, ValueError, IndexError, struct.error):
        return None


def _network_messages():
    """A connect refused by runpython's network policy fails with EACCES; the PermissionError then
    says which rule refused it (asked of the run's resolver) instead of only "Permission denied"."""
    import errno
    import socket

    if getattr(socket.socket.connect, "_runpython", False):
        return
    connect = socket.socket.connect

    def checked_connect(self, address):
        try:
            return connect(self, address)
        except PermissionError as exc:
            if exc.errno != errno.EACCES or self.family not in (socket.AF_INET, socket.AF_INET6):
                raise
            reason = _refusal_reason(address[0], address[1])
            if not reason:
                raise
            raise PermissionError(
                errno.EACCES, "runpython's network policy refused %s:%s: %s" % (address[0], address[1], reason)
            ) from None

    checked_connect.__doc__ = connect.__doc__
    checked_connect.__name__ = "connect"
    checked_connect.__qualname__ = "socket.connect"
    checked_connect._runpython = True
    socket.socket.connect = checked_connect


def _write_files(request):
    """The request's files, written read-only into the working directory (a session's stay for its
    later cells; a name given again replaces the file)."""
    files = request["files"]
    if not files:
        return
    import binascii

    for name, given in files.items():
        if isinstance(given, dict):
            spec = request["bridge"]

            def call(tool, **kwargs):
                tools = sys.modules.get("runpython_tools") or _install_bridge(spec, {})
                return tools.call(tool, **kwargs)

            data = _read_slices(call, given["id"])
        else:
            data = binascii.a2b_base64(given)
        try:
            posix.unlink(name)
        except OSError:
            pass
        fd = posix.open(name, posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL | posix.O_CLOEXEC, 0o444)
        write_all(fd, data)


def bind_inputs(request, namespace):
    _IMAGES["budget"], _IMAGES["used"] = request["image_budget"], 0
    _write_files(request)
    inputs = request["inputs"]
    if request["typed"] and inputs:
        inputs = runpython_values.decode(inputs, stand_ins=True)  # the host's exact values
    for name, value in inputs.items():
        namespace[name] = value
    if request["input_artifacts"]:
        import binascii

        for name, given in request["input_artifacts"].items():
            if isinstance(given, dict):
                # Too large to come with the request: read through the host in slices.
                spec = request["bridge"]

                def call(tool, **kwargs):
                    tools = sys.modules.get("runpython_tools") or _install_bridge(spec, {})
                    return tools.call(tool, **kwargs)

                namespace[name] = _parse_artifact(_read_slices(call, given["id"]))
            else:
                namespace[name] = _parse_artifact(binascii.a2b_base64(given))


def run_code(request, namespace, loop=None):
    """Runs the request's code in `namespace`; returns (status, result, summary) for `result_text`."""
    source = request["code"]
    limit = request["max_return_bytes"]
    inline_limit = request["inline_return_bytes"]
    status, result, summary = "success", None, None
    try:
        spec = request["bridge"]
        # Only the host's hidden tools (artifact access): the client is installed on first use.
        visible = spec is not None and any(not t["hidden"] for t in spec["tools"])
        bridge = _install_bridge(spec, namespace) if visible else None
        if request["artifact_helpers"] and spec is not None:
            _artifact_helpers(namespace, spec, request["saved_dir"])
        if request["network_reasons"]:
            _network_messages()
        code_dir = request["code_dir"]
        if code_dir in sys.path:
            sys.path.remove(code_dir)  # it was only needed to import runpython's own modules
        body_code, last_code = _compile(source, bridge)
        has_value, value = _execute(body_code, last_code, namespace, loop)
        if has_value and value is not None:
            try:
                if _rich(value):
                    _add_display(value, last_value=True)
            except Exception:
                pass  # a value that cannot show itself is still returned
            status, result, summary = _report_value(value, limit, inline_limit, request["typed"])
            if status == "success":
                shown = None
                if request["repr"]:  # what a REPL prints, as well as the value
                    try:
                        shown = repr(value)[:10000]
                    except BaseException:
                        shown = None
                result = result + (shown,)
    except SystemExit as exc:
        if exc.code is not None and exc.code != 0:  # sys.exit() and sys.exit(0) are a normal end
            status, result = "error", format_error(exc, source)
    except BaseException as exc:
        status, result = "error", format_error(exc, source)
    return status, result, summary


def result_text(status, result, summary):
    text = _result_core(status, result, summary)
    if not _DISPLAYS:
        return text
    displays = json_dumps(_DISPLAYS)
    del _DISPLAYS[:]
    return text[:-1] + ',"displays":' + displays + "}"


def _result_core(status, result, summary):
    if status == "success" and result is not None:
        type_name, encoded, summary, exact, shown = result
        text = '{"status":"success","return_type":%s,"return_preview":%s,"return_value":%s' % (
            json_dumps(type_name),
            json_dumps(summary),
            encoded,
        )
        if exact is not None:
            text += ',"return_typed":%s' % exact
        if shown is not None:
            text += ',"return_repr":%s' % json_dumps(shown)
        return text + "}"
    if status == "success":
        return '{"status":"success","return_type":null,"return_value":null}'
    return json_dumps({"status": "error", "error": result, "return_preview": summary})


def new_main_module():
    main_module = type(sys)("__main__")
    namespace = main_module.__dict__
    namespace["__builtins__"] = __builtins__
    sys.modules["__main__"] = main_module
    return namespace


def add_sites(dirs, added):
    for site_dir in dirs or ():
        if site_dir and site_dir not in added:
            import site  # with -S its import adds nothing by itself; addsitedir also reads .pth files

            site.addsitedir(site_dir)
            bin_first(site_dir)
            added.append(site_dir)


def bin_first(site_dir):
    """The environment's `bin` (its console scripts), where it has one, first on `PATH`."""
    bin_dir = site_dir.rstrip("/") + "/bin"
    try:
        if posix.stat(bin_dir).st_mode & 0o170000 != 0o040000:  # not a directory
            return
    except OSError:
        return
    path = env_now(["PATH"])["PATH"]
    entries = [p for p in (path or "").split(":") if p and p != bin_dir]
    set_env({"PATH": ":".join([bin_dir] + entries)})


def protocol_error(exc):
    """The result record for a message from the host that does not follow the protocol."""
    return json_dumps({"status": "error", "error": {
        "type": "SandboxError", "message": "runpython's host and runner disagree: %s" % (exc,), "traceback": None}})


def forked_main():
    """A run forked from a template, its sandbox taken (`runpython_template`): the one-shot path."""
    posix.set_inheritable(RESULT_FD, False)
    posix.set_inheritable(BRIDGE_FD, False)
    one_shot()


def set_code_dir(code_dir):
    """Where runpython's modules are (their frames are hidden; the bridge client is imported from there)."""
    global _code_dir
    if code_dir:
        _code_dir = code_dir.rstrip("/") + "/"


def one_shot():
    """Reads the request on stdin, runs it, answers on the result pipe, closes the streams."""
    pid = posix.getpid()
    try:
        request = read_request()
    except runpython_protocol.ProtocolError as exc:
        # The host and this runner disagree on the protocol: runpython's fault, named, before any code.
        write_result(RESULT_FD, protocol_error(exc))
        return
    set_code_dir(request["code_dir"])
    sys.argv = [FILENAME]
    write_trust_bundle(request["trust_bundle"])
    set_env(request["env"])
    sys.stdout.reconfigure(line_buffering=True)
    add_sites(request["site_dirs"], [])
    namespace = new_main_module()
    _install_display()
    bind_inputs(request, namespace)
    status, result, summary = run_code(request, namespace)

    _save_open_figures()
    _finish_like_exit(namespace)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass  # the code may have closed them; the result still matters
    if posix.getpid() != pid:  # a process the code forked: only the runner itself reports
        posix._exit(0 if status == "success" else 1)
    write_result(RESULT_FD, result_text(status, result, summary))
    # The answer is complete: closing the streams tells the host so before the interpreter has exited.
    for fd in (1, 2):
        try:
            posix.close(fd)
        except OSError:
            pass
