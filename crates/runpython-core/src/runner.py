"""runpython's runner: executes one piece of LLM-authored code inside the sandboxed child.

Stdlib only. The host imports this module (as `runpython_runner`, from runpython's code directory, so its
bytecode is cached) and writes one JSON request on stdin:

    {"code": str, "inputs": {name: json}, "max_return_bytes": int, "code_dir": str | null,
     "bridge": null | {"path": str, "token": str, "tools": [...], "max_frame": int}}

The result goes back as one JSON object on file descriptor 3, a pipe that only the host reads, so nothing the
code prints can forge it. stdout and stderr are the code's own. Plain `python3 runner.py 3>result.json <req`
works too, which is how the Python-side tests drive it.

Start-up cost matters (a trivial run should cost little more than starting Python), so this module imports
only built-in modules: `posix` instead of `os` (1.3 ms), the `_json` accelerator instead of `json` (8 ms: it
pulls in `re`). `asyncio` is imported only when the code awaits, `traceback` only on errors.
"""

import posix
import sys

import _json

FILENAME = "<code>"
RESULT_FD = 3
CO_COROUTINE = 0x80
PyCF_ONLY_AST = 0x400
PyCF_ALLOW_TOP_LEVEL_AWAIT = 0x2000
# Frames whose file name starts with this belong to runpython, not to the user, and are hidden.
PRIVATE_PREFIX = "<runpython-"
_RUNNER_FILE = (lambda: None).__code__.co_filename
_code_dir = None  # where runpython's own modules were imported from (their frames are hidden too)


class _ScanContext:
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    def parse_constant(name):
        raise ValueError("%s is not valid JSON" % name)


_scan = _json.make_scanner(_ScanContext)
_WHITESPACE = " \t\n\r"


def json_loads(text):
    """Strict JSON text to a value, with the C scanner (no `json` module import)."""
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _scan(text, start)
    except StopIteration as stop:
        raise ValueError("invalid JSON at character %d" % stop.value) from None
    if text[end:].strip(_WHITESPACE):
        raise ValueError("extra data after JSON at character %d" % end)
    return value


def _refuse(value):
    raise TypeError("%s is not JSON serializable" % type(value).__name__)


def json_dumps(value):
    """Compact JSON, non-ASCII kept, NaN refused, cycles refused (fresh markers on every call)."""
    encoder = _json.make_encoder({}, _refuse, _json.encode_basestring, None, ":", ",", False, False, False)
    return "".join(encoder(value, 0))


def _read_request():
    chunks = []
    while True:
        chunk = posix.read(0, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    # stdin is not the code's: point fd 0 at /dev/null so input() raises EOFError instead of hanging.
    null = posix.open("/dev/null", posix.O_RDONLY)
    posix.dup2(null, 0)
    posix.close(null)
    return json_loads(b"".join(chunks).decode("utf-8"))


def _is_private(filename):
    return (
        filename == _RUNNER_FILE
        or filename.startswith(PRIVATE_PREFIX)
        or (_code_dir is not None and filename.startswith(_code_dir))
    )


def _json_or_repr(value, limit):
    """The value as JSON text, or its repr as a JSON string when it is not JSON."""
    try:
        _check_json_keys(value, 0)
        return json_dumps(value)
    except (TypeError, ValueError, RecursionError):
        pass
    try:
        shown = repr(value)
    except BaseException as exc:  # a broken __repr__ is the code's bug: say so instead of failing the run
        shown = "<%s object: repr() raised %s>" % (type(value).__name__, type(exc).__name__)
    # repr of a huge object can be huge too; encoding a slice first keeps memory bounded.
    if len(shown) > limit:
        shown = shown[: limit + 1]
    return json_dumps(shown)


def _check_json_keys(value, depth):
    # json.dumps silently turns non-str dict keys into strings; a dict like {1: 'a'} is not JSON as written.
    if depth > 200:
        raise RecursionError
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError
            _check_json_keys(v, depth + 1)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _check_json_keys(v, depth + 1)


def _format_error(exc, source):
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
    except BaseException:
        message = "<str() of the exception raised>"
    if isinstance(exc, KeyError) and len(exc.args) == 1:
        message = repr(exc.args[0])
    return {"type": type(exc).__name__, "message": message, "traceback": "".join(te.format())}


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


def _execute(body_code, last_code, namespace):
    """Run the code; returns (has_value, value)."""
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

    return last_code is not None, asyncio.run(run_module())


def _install_bridge(spec, namespace):
    import runpython_tools  # the bridge's client module, beside this one

    runpython_tools.install(spec, namespace, json_loads, json_dumps)
    return runpython_tools


def _write_result(result_fd, text):
    view = memoryview(text.encode("utf-8", "surrogatepass"))
    while view:
        view = view[posix.write(result_fd, view) :]
    posix.close(result_fd)


def _too_large(size, limit):
    return {
        "type": "ReturnValueTooLarge",
        "message": "the last expression's value is %s bytes as JSON, over the limit of %d; "
        "return a smaller value (a summary, a slice) or write the data to a file"
        % ("more than %d" % limit if size > limit else size, limit),
        "traceback": None,
    }


def main():
    global _code_dir
    posix.set_inheritable(RESULT_FD, False)  # subprocesses of the code must not hold the result pipe
    pid = posix.getpid()
    request = _read_request()
    source = request["code"]
    limit = int(request.get("max_return_bytes", 1_000_000))
    code_dir = request.get("code_dir")
    if code_dir:
        _code_dir = code_dir.rstrip("/") + "/"
    sys.argv = [FILENAME]
    sys.stdout.reconfigure(line_buffering=True)

    main_module = type(sys)("__main__")
    namespace = main_module.__dict__
    namespace["__builtins__"] = __builtins__
    sys.modules["__main__"] = main_module
    for name, value in (request.get("inputs") or {}).items():
        namespace[name] = value

    status, result = "success", None
    try:
        bridge = _install_bridge(request["bridge"], namespace) if request.get("bridge") else None
        if code_dir in sys.path:
            sys.path.remove(code_dir)  # it was only needed to import runpython's own modules
        body_code, last_code = _compile(source, bridge)
        has_value, value = _execute(body_code, last_code, namespace)
        if has_value and value is not None:
            encoded = _json_or_repr(value, limit)
            size = len(encoded.encode("utf-8", "surrogatepass"))
            if size > limit:
                status, result = "error", _too_large(size, limit)
            else:
                result = (type(value).__name__, encoded)
    except SystemExit as exc:
        if exc.code is not None and exc.code != 0:  # sys.exit() and sys.exit(0) are a normal end
            status, result = "error", _format_error(exc, source)
    except BaseException as exc:
        status, result = "error", _format_error(exc, source)

    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass  # the code may have closed them; the result still matters
    if posix.getpid() != pid:  # a process the code forked: only the runner itself reports
        posix._exit(0 if status == "success" else 1)
    if status == "success" and result is not None:
        type_name, encoded = result
        text = '{"status":"success","return_type":%s,"return_value":%s}' % (json_dumps(type_name), encoded)
    elif status == "success":
        text = '{"status":"success","return_type":null,"return_value":null}'
    else:
        text = json_dumps({"status": "error", "error": result})
    _write_result(RESULT_FD, text)


if __name__ in ("__main__", "runpython_runner"):
    main()
