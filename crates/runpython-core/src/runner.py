"""runpython's runner: executes one piece of LLM-authored code inside the sandboxed child.

Stdlib only. The host starts the interpreter with this file's text and writes one JSON request on stdin:

    {"code": str, "inputs": {name: json}, "max_return_bytes": int,
     "bridge": null | {"client": str, "path": str, "token": str, "tools": [...], "max_frame": int}}

The result goes back as one JSON object on file descriptor 3, a pipe that only the host reads, so nothing the
code prints can forge it. stdout and stderr are the code's own. Plain `python3 runner.py 3>result.json <req`
works too, which is how the Python-side tests drive it.

Start-up cost matters (a trivial run should cost little more than starting Python), so this module imports
only builtins at the top; `asyncio` is imported only when the code awaits, `traceback` only on errors.
"""

import sys

FILENAME = "<code>"
RESULT_FD = 3
CO_COROUTINE = 0x80
PyCF_ONLY_AST = 0x400
PyCF_ALLOW_TOP_LEVEL_AWAIT = 0x2000
# Frames whose file name starts with this belong to runpython, not to the user, and are hidden.
PRIVATE_PREFIX = "<runpython-"
_RUNNER_FILE = (lambda: None).__code__.co_filename


def _read_request():
    import os

    chunks = []
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    # stdin is not the code's: point fd 0 at /dev/null so input() raises EOFError instead of hanging.
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    import json

    return json.loads(b"".join(chunks))


def _is_private(filename):
    return filename == _RUNNER_FILE or filename.startswith(PRIVATE_PREFIX)


def _json_or_repr(value, limit):
    """(encoded JSON text of the value, or of its repr when it is not JSON) and whether repr was used."""
    import json

    try:
        _check_json_keys(value, 0)
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
        return text
    except (TypeError, ValueError, RecursionError):
        pass
    try:
        shown = repr(value)
    except BaseException as exc:  # a broken __repr__ is the code's bug: say so instead of failing the run
        shown = "<%s object: repr() raised %s>" % (type(value).__name__, type(exc).__name__)
    # repr of a huge object can be huge too; encoding a slice first keeps memory bounded.
    if len(shown) > limit:
        shown = shown[: limit + 1]
    return json.dumps(shown, ensure_ascii=False)


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

    async def main():
        pending = eval(body_code, namespace)
        if pending is not None:
            await pending
        if last_code is None:
            return None
        value = eval(last_code, namespace)
        if last_code.co_flags & CO_COROUTINE:
            value = await value
        return value

    return last_code is not None, asyncio.run(main())


def _install_bridge(spec, namespace):
    module = type(sys)("runpython_tools")
    exec(compile(spec["client"], "<runpython-bridge>", "exec", dont_inherit=True), module.__dict__)
    sys.modules["runpython_tools"] = module
    module.install(spec, namespace)
    return module


def _write_result(result_fd, text):
    import os

    data = text.encode("utf-8", "surrogatepass")
    view = memoryview(data)
    while view:
        n = os.write(result_fd, view)
        view = view[n:]
    os.close(result_fd)


def main():
    import os

    os.set_inheritable(RESULT_FD, False)  # subprocesses of the code must not hold the result pipe
    request = _read_request()
    source = request["code"]
    limit = int(request.get("max_return_bytes", 1_000_000))
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
        body_code, last_code = _compile(source, bridge)
        has_value, value = _execute(body_code, last_code, namespace)
        if has_value and value is not None:
            encoded = _json_or_repr(value, limit)
            if len(encoded.encode("utf-8", "surrogatepass")) > limit:
                status = "error"
                result = {
                    "type": "ReturnValueTooLarge",
                    "message": "the last expression's value is %d bytes as JSON, over the limit of %d; "
                    "return a smaller value (a summary, a slice) or write the data to a file"
                    % (len(encoded.encode("utf-8", "surrogatepass")), limit),
                    "traceback": None,
                }
            else:
                result = (type(value).__name__, encoded)
    except SystemExit as exc:
        if exc.code is None or exc.code == 0:
            pass  # sys.exit() / sys.exit(0) is a normal end
        else:
            status, result = "error", _format_error(exc, source)
    except BaseException as exc:
        status, result = "error", _format_error(exc, source)

    import json

    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass  # the code may have closed them; the result still matters
    if status == "success" and result is not None:
        type_name, encoded = result
        text = '{"status":"success","return_type":%s,"return_value":%s}' % (json.dumps(type_name), encoded)
    elif status == "success":
        text = '{"status":"success","return_type":null,"return_value":null}'
    else:
        text = json.dumps({"status": "error", "error": result}, ensure_ascii=False)
    _write_result(RESULT_FD, text)


if __name__ == "__main__":
    main()
