"""runpython's runner: executes one piece of LLM-authored code inside the sandboxed child.

Stdlib only. The host imports this module (as `runpython_runner`, from runpython's code directory, so its
bytecode is cached) and writes one JSON request on stdin, on one line:

    {"code": str, "inputs": {name: json}, "env": {name: str}, "max_return_bytes": int, "inline_return_bytes": int,
     "trust_bundle": null | {"path": str, "pem": str},
     "code_dir": str | null, "site_dir": str | null,
     "input_artifacts": {name: base64 | {"id": str, "bytes": int}}, "artifact_helpers": bool,
     "files": {name: base64 | {"id": str, "bytes": int}},
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
BRIDGE_FD = 4
CO_COROUTINE = 0x80
PyCF_ONLY_AST = 0x400
PyCF_ALLOW_TOP_LEVEL_AWAIT = 0x2000
# Longest error message and traceback the child reports (the host fits them into the envelope's budget).
MAX_MESSAGE_CHARS = 8_000
MAX_TRACEBACK_CHARS = 16_000
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


class _BigScanContext(_ScanContext):
    def parse_int(text):
        return int_from_text(text)


_scan = _json.make_scanner(_ScanContext)
_big_scan = None  # made on first use: only JSON holding an integer past int()'s digit limit needs it
_WHITESPACE = " \t\n\r"
# Integers of more bits than this may be refused by int <-> str (sys.get_int_max_str_digits, 4300 digits
# by default): the codec converts those itself, exactly and in subquadratic time.
_SAFE_INT_BITS = 3 * 640
# U+FFFD for each lone surrogate (chr(0xdcff), surrogateescape'd bytes): JSON leaving the child is UTF-8,
# which cannot carry them. Registered on first use.
_REPLACE = "runpython.replace-surrogates"


def _scan_all(scan, text):
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = scan(text, start)
    except StopIteration as stop:
        raise ValueError("invalid JSON at character %d" % stop.value) from None
    if text[end:].strip(_WHITESPACE):
        raise ValueError("extra data after JSON at character %d" % end)
    return value


def json_loads(text):
    """Strict JSON text to a value, with the C scanner (no `json` module import). Integers of any size
    are read exactly."""
    global _big_scan
    try:
        return _scan_all(_scan, text)
    except ValueError:
        # int() refuses long digit strings; read again converting them exactly (or fail the same way).
        if _big_scan is None:
            _big_scan = _json.make_scanner(_BigScanContext)
        return _scan_all(_big_scan, text)


def _refuse(value):
    raise TypeError("%s is not JSON serializable" % type(value).__name__)


def json_dumps(value, default=_refuse):
    """Compact JSON, non-ASCII kept, NaN refused, cycles refused (fresh markers on every call). Integers
    of any size are written exactly; lone surrogates become U+FFFD, so the text always encodes as UTF-8.
    `default` converts what JSON has no form for (by default: refused)."""
    encoder = _json.make_encoder({}, default, _json.encode_basestring, None, ":", ",", False, False, False)
    try:
        text = "".join(encoder(value, 0))
    except ValueError:
        text = _dumps_big_ints(value, encoder)
        if text is None:
            raise  # not about integers
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", _replace_handler()).decode("utf-8")
    return text


def _replace_handler():
    import _codecs

    try:
        _codecs.lookup_error(_REPLACE)
    except LookupError:
        _codecs.register_error(_REPLACE, lambda e: ("\ufffd".encode() * (e.end - e.start), e.end))
    return _REPLACE


def _dumps_big_ints(value, encoder):
    """JSON of a value holding integers int() cannot show: each becomes a marker string for the C
    encoder, then the marker's JSON is replaced by the integer's exact digits."""
    found = []
    nonce = "%x" % id(found)
    copy = _swap_big_ints(value, found, "\x00" + nonce + ":", 0)
    if not found:
        return None
    pieces = "".join(encoder(copy, 0)).split('"\\u0000' + nonce + ":")
    out = [pieces[0]]
    for piece in pieces[1:]:
        index, rest = piece.split('"', 1)
        out.append(int_text(found[int(index)]))
        out.append(rest)
    return "".join(out)


def _swap_big_ints(value, found, prefix, depth):
    if depth > 500:
        raise RecursionError("the value is nested too deeply to encode")
    if isinstance(value, int) and not isinstance(value, bool):
        if value.bit_length() <= _SAFE_INT_BITS:
            return value
        found.append(value)
        return prefix + str(len(found) - 1)
    if isinstance(value, dict):
        return {k: _swap_big_ints(v, found, prefix, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_swap_big_ints(v, found, prefix, depth + 1) for v in value]
    return value


_last_int_text = (None, None)


def int_text(n):
    """The exact decimal digits of any integer, whatever sys.get_int_max_str_digits() says: halves
    converted through `decimal` (its multiplication is subquadratic, int.__str__'s is not), so
    `2 ** 10_000_000` takes under a second. The last answer is kept (a preview asks again)."""
    global _last_int_text
    if _last_int_text[0] is n:
        return _last_int_text[1]
    original, n = n, int(n)
    if n.bit_length() <= _SAFE_INT_BITS:
        return str(n)
    import decimal

    powers = {}

    def two_to(bits):
        power = powers.get(bits)
        if power is None:
            half = bits >> 1
            power = decimal.Decimal(2) ** bits if bits <= 512 else two_to(half) * two_to(bits - half)
            powers[bits] = power
        return power

    def convert(m, bits):
        if bits <= 512:
            return decimal.Decimal(m)
        half = bits >> 1
        high = m >> half
        return convert(m - (high << half), half) + convert(high, bits - half) * two_to(half)

    with decimal.localcontext() as context:
        context.prec = decimal.MAX_PREC
        context.Emax = decimal.MAX_EMAX
        context.Emin = decimal.MIN_EMIN
        context.traps[decimal.Inexact] = True
        digits = str(convert(abs(n), abs(n).bit_length()))
    text = "-" + digits if n < 0 else digits
    _last_int_text = (original, text)
    return text


def int_from_text(text):
    """int(text) for decimal digit strings of any length (int() refuses those past its digit limit):
    halves joined by one multiplication each (Karatsuba), cached powers of ten."""
    if len(text) <= 600:
        return int(text)
    negative = text[0] == "-"
    digits = text[1:] if negative else text.lstrip("+")
    powers = {}

    def ten_to(k):
        power = powers.get(k)
        if power is None:
            power = powers[k] = 10**k
        return power

    def convert(s):
        if len(s) <= 600:
            return int(s)
        low = len(s) // 2
        return convert(s[:-low]) * ten_to(low) + convert(s[-low:])

    n = convert(digits)
    return -n if negative else n


def _read_request():
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
    return json_loads(b"".join(chunks).decode("utf-8"))


def _is_private(filename):
    return (
        filename == _RUNNER_FILE
        or filename.startswith(PRIVATE_PREFIX)
        or (_code_dir is not None and filename.startswith(_code_dir))
    )


def _json_or_repr(value, limit):
    """The value as JSON text: plain JSON when it is JSON; tables and arrays the code's own libraries know
    (pandas, numpy, polars) in their JSON form; else its repr as a JSON string."""
    try:
        _check_json_keys(value, 0)
        return json_dumps(value)
    except (TypeError, ValueError, RecursionError):
        pass
    try:
        tabular = _library_json(value)
        if tabular is not None:
            return tabular
    except Exception:
        pass  # a library's own serialisation failed: fall back to repr
    try:
        _check_json_keys(value, 0)
        return json_dumps(value, _iso_or_base64)
    except (TypeError, ValueError, RecursionError):
        pass
    shown = _repr(value)
    # repr of a huge object can be huge too; encoding a slice first keeps memory bounded.
    if len(shown) > limit:
        shown = shown[: limit + 1]
    return json_dumps(shown)


def _iso_or_base64(value):
    """The JSON form of dates and times (ISO 8601 text) and of bytes (base64 text); `return_type` and
    the exact value (for requests that ask for it) say what they were."""
    if isinstance(value, (bytes, bytearray)):
        import binascii

        return binascii.b2a_base64(value, newline=False).decode("ascii")
    dt = sys.modules.get("datetime")
    if dt is not None and isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    return _refuse(value)


class Unshowable(Exception):
    """The value has no JSON and its repr() raised: the run says so instead of returning a wrong value."""


# Digits repr() may show for an integer inside a value that is not JSON (a set of big integers): a
# bound, because int.__str__ is quadratic (int_text is not, but repr() of a container cannot use it).
_REPR_INT_DIGITS = 100_000


def _repr(value):
    limit = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 0
    try:
        if 0 < limit < _REPR_INT_DIGITS:
            sys.set_int_max_str_digits(_REPR_INT_DIGITS)
        return repr(value)
    except BaseException as exc:  # a broken __repr__ is the code's bug: say so instead of failing the run
        raise Unshowable("repr() raised %s: %s" % (type(exc).__name__, _clip(_str_or_type(exc)))) from None
    finally:
        if limit:
            sys.set_int_max_str_digits(limit)


def _str_or_type(exc):
    try:
        return str(exc)
    except BaseException:
        return type(exc).__name__


def _module_of(value, module):
    """The module `module` if the code imported it and `value` comes from it; never imports anything."""
    lib = sys.modules.get(module)
    if lib is None or not type(value).__module__.startswith(module):
        return None
    return lib


def _library_json(value):
    pd = _module_of(value, "pandas")
    if pd is not None and isinstance(value, (pd.DataFrame, pd.Series)):
        return value.to_json(orient="split", date_format="iso", default_handler=str)
    np = _module_of(value, "numpy")
    if np is not None and isinstance(value, np.ndarray):
        return json_dumps(_finite(value.tolist()))
    if np is not None and isinstance(value, np.generic):
        return json_dumps(_finite(value.item()))
    pl = _module_of(value, "polars")
    if pl is not None and isinstance(value, pl.DataFrame):
        return json_dumps({"columns": value.columns, "data": [list(r) for r in value.rows()]})
    return None


def _finite(value):
    # NaN and infinities are not JSON; numpy data is full of them. They become null.
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


PREVIEW_ITEMS = 10
PREVIEW_CHARS = 200
PREVIEW_COLUMNS = 20
PREVIEW_ROWS = 5
PREVIEW_DIGITS = 50


def _clip(text, n=PREVIEW_CHARS):
    return text if len(text) <= n else text[:n] + "…"


def _scalar(value, n):
    """A JSON scalar for a preview: numbers, bools and None as they are (a long integer as its first and
    last digits), text clipped, anything else a short repr."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        text = int_text(value)
        return "%s…%s (%d digits)" % (text[:20], text[-20:], len(text.lstrip("-")))
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return _finite(value)
    if isinstance(value, str):
        return _clip(value, n)
    try:
        return _clip(repr(value), n)
    except BaseException:
        return "<%s>" % type(value).__name__


def preview(value, depth=0):
    """A bounded, plain-JSON summary of `value`, computed where its type is known."""
    name = type(value).__name__
    if isinstance(value, int) and not isinstance(value, bool):
        text = int_text(value)
        return {"type": name, "digits": len(text.lstrip("-")), "head": text[:PREVIEW_DIGITS], "tail": text[-PREVIEW_DIGITS:]}
    pd = _module_of(value, "pandas")
    if pd is not None and isinstance(value, pd.DataFrame):
        rows, cols = value.shape
        head = value.iloc[:PREVIEW_ROWS, :PREVIEW_COLUMNS]
        return {
            "type": "DataFrame",
            "shape": [rows, cols],
            "columns": [{"name": _clip(str(c), 60), "dtype": str(t)} for c, t in head.dtypes.items()],
            "columns_omitted": max(0, cols - PREVIEW_COLUMNS),
            "head": [[_scalar(v, 60) for v in row] for row in head.itertuples(index=False, name=None)],
        }
    if pd is not None and isinstance(value, pd.Series):
        return {
            "type": "Series",
            "name": _scalar(value.name, 60),
            "length": len(value),
            "dtype": str(value.dtype),
            "head": [_scalar(v, 60) for v in value.iloc[:PREVIEW_ITEMS].tolist()],
        }
    np = _module_of(value, "numpy")
    if np is not None and isinstance(value, np.ndarray):
        out = {
            "type": "ndarray",
            "shape": list(value.shape),
            "dtype": str(value.dtype),
            "head": [_scalar(v, 60) for v in value.ravel()[:PREVIEW_ITEMS].tolist()],
        }
        if value.size and value.dtype.kind in "biuf":
            with np.errstate(all="ignore"):
                out["min"] = _scalar(np.nanmin(value).item(), 60)
                out["max"] = _scalar(np.nanmax(value).item(), 60)
        return out
    pl = _module_of(value, "polars")
    if pl is not None and isinstance(value, pl.DataFrame):
        rows, cols = value.shape
        return {
            "type": "DataFrame",
            "library": "polars",
            "shape": [rows, cols],
            "columns": [{"name": _clip(c, 60), "dtype": str(t)} for c, t in list(value.schema.items())[:PREVIEW_COLUMNS]],
            "columns_omitted": max(0, cols - PREVIEW_COLUMNS),
            "head": [[_scalar(v, 60) for v in row[:PREVIEW_COLUMNS]] for row in value.head(PREVIEW_ROWS).rows()],
        }
    if isinstance(value, (list, tuple, set, frozenset)):
        items = []
        for i, item in enumerate(value):
            if i == PREVIEW_ITEMS:
                break
            items.append(_item(item, depth))
        return {"type": name, "length": len(value), "items": items}
    if isinstance(value, dict):
        items = {}
        for i, (k, v) in enumerate(value.items()):
            if i == PREVIEW_ITEMS:
                break
            items[_clip(k if isinstance(k, str) else repr(k), 60)] = _item(v, depth)
        return {"type": name, "size": len(value), "items": items}
    if isinstance(value, str):
        return {"type": name, "length": len(value), "head": value[:PREVIEW_CHARS], "tail": value[-PREVIEW_CHARS:]}
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value[:32])
        return {"type": name, "length": len(value), "hex_head": data.hex()}
    return {"type": name, "repr": _scalar(value, PREVIEW_CHARS)}


def _item(value, depth):
    if value is None or isinstance(value, (bool, int, float, str)):
        return _scalar(value, 100)
    if depth >= 1:
        try:
            size = len(value)
        except Exception:
            return {"type": type(value).__name__}
        return {"type": type(value).__name__, "length": size}
    return preview(value, depth + 1)


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
    typed = spec is not None and any(t.get("typed") for t in spec["tools"])
    tools.install(spec, namespace, json_loads, json_dumps, _values() if typed else None)
    return tools


def _write_result(result_fd, text):
    view = memoryview(text.encode("utf-8"))
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


# Displays: what `display(obj)` showed, the last expression's rich forms and matplotlib's figures, for
# the envelope's `displays`. Text forms stay inline within these bounds; binary ones become files in
# the working directory (and so artifacts of a kept run), named by the entry.
_DISPLAYS = []
_IMAGES = {"budget": 0, "used": 0}  # bytes of images handed back inline, per run or cell
DISPLAY_TEXT = {"text/plain": 500, "text/markdown": 1500, "text/html": 1500, "text/latex": 1000, "application/json": 1500}
DISPLAY_FILES = {"image/png": "png", "image/jpeg": "jpg", "image/svg+xml": "svg", "application/pdf": "pdf",
                 "application/vnd.plotly.v1+json": "plotly.json", "application/vnd.vegalite.v5+json": "vl.json",
                 "application/vnd.vegalite.v4+json": "vl.json"}
# File forms that are JSON: written as their UTF-8 text (a dict is encoded first).
_JSON_FILES = ("application/vnd.plotly.v1+json", "application/vnd.vegalite.v5+json", "application/vnd.vegalite.v4+json")
DISPLAY_TEXT_TOTAL = 4000  # inline text over every display of a run or cell
MAX_DISPLAYS = 50
_REPR_METHODS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_pdf_", "application/pdf"),
)


def _mime_bundle(obj):
    """The object's formats by MIME type, as IPython asks for them: `_repr_mimebundle_`, then each
    `_repr_*_` method, matplotlib figures as PNG, and `repr` as text/plain."""
    data = {}
    if isinstance(obj, type):
        return {"text/plain": repr(obj)}
    module = type(obj).__module__ or ""
    if module.startswith("plotly") and hasattr(obj, "to_json"):
        return _plotly_bundle(obj)
    if module.startswith("altair") and hasattr(obj, "to_dict"):
        try:
            data[_VEGA_LITE] = obj.to_dict()
        except Exception:
            pass  # a chart altair cannot validate: its repr stands
        data["text/plain"] = repr(obj)
        return data
    method = getattr(obj, "_repr_mimebundle_", None)
    if callable(method):
        try:
            got = method(include=None, exclude=None)
        except TypeError:
            got = method()
        if isinstance(got, tuple):
            got = got[0]
        if isinstance(got, dict):
            data.update(got)
    for name, mime in _REPR_METHODS:
        if mime in data:
            continue
        method = getattr(obj, name, None)
        if callable(method):
            got = method()
            if isinstance(got, tuple):
                got = got[0]
            if got is not None:
                data[mime] = got
    module = type(obj).__module__ or ""
    if module.startswith("pandas") and "text/markdown" not in data:
        try:
            data["text/markdown"] = _markdown_table(obj)
        except Exception:
            pass  # not a table after all: its other forms stand
    if "image/png" not in data and module.startswith("matplotlib") and hasattr(obj, "savefig"):
        import io

        buffer = io.BytesIO()
        obj.savefig(buffer, format="png")
        data["image/png"] = buffer.getvalue()
    if "text/plain" not in data:
        data["text/plain"] = repr(obj)
    return data


_PLOTLY = "application/vnd.plotly.v1+json"
_VEGA_LITE = "application/vnd.vegalite.v5+json"
MARKDOWN_ROWS = 10
MARKDOWN_COLUMNS = 12


def _plotly_bundle(fig):
    """A plotly figure: its JSON (data and layout) as a file, a PNG when kaleido can draw one, and
    what it shows as text; never plotly's renderers, which may open a browser."""
    data = {_PLOTLY: fig.to_json().encode("utf-8")}
    try:
        data["image/png"] = fig.to_image(format="png")
    except Exception:
        pass  # no kaleido (or no browser for it): the figure's JSON says what it shows
    try:
        layout = fig.layout
        title = layout.title.text if layout.title is not None else None
        kinds = sorted({getattr(trace, "type", "?") for trace in fig.data})
        data["text/plain"] = "plotly Figure%s: %d trace(s) (%s)" % (
            " %r" % title if title else "", len(fig.data), ", ".join(kinds))
    except Exception:
        data["text/plain"] = repr(fig)[:500]
    return data


def _markdown_table(table):
    """A pandas DataFrame or Series as a Markdown table: its first rows and columns, then its shape."""
    frame = table.to_frame() if hasattr(table, "to_frame") and not hasattr(table, "columns") else table
    rows, cols = frame.shape
    shown = frame.iloc[:MARKDOWN_ROWS, :MARKDOWN_COLUMNS]

    def cell(v):
        return str(v).replace("|", "\\|").replace("\n", " ")[:40]

    lines = ["| %s |" % " | ".join([cell(frame.index.name or "")] + [cell(c) for c in shown.columns])]
    lines.append("|" + "---|" * (len(shown.columns) + 1))
    for index, row in zip(shown.index, shown.itertuples(index=False)):
        lines.append("| %s |" % " | ".join([cell(index)] + [cell(v) for v in row]))
    if rows > MARKDOWN_ROWS or cols > MARKDOWN_COLUMNS:
        lines.append("")
        lines.append("%d rows × %d columns" % (rows, cols))
    return "\n".join(lines)


def _display_cut(text, limit):
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    return text[:head] + "\n[... %d characters cut ...]\n" % (len(text) - limit) + text[len(text) - (limit - head):]


def _png_size(data):
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    return None


def _display_file(stem, ext, payload):
    name = "%s.%s" % (stem, ext)
    n = 1
    while True:
        try:
            fd = posix.open(name, posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL | posix.O_CLOEXEC, 0o644)
            break
        except FileExistsError:
            n += 1
            name = "%s_%d.%s" % (stem, n, ext)
    try:
        view = memoryview(payload).cast("B")
        while view:
            view = view[posix.write(fd, view):]
    finally:
        posix.close(fd)
    return name


CHART_POINTS = 20  # points listed per series; past them, a summary


def _num(v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    if f != f or f in (float("inf"), float("-inf")):
        return None
    return int(f) if f.is_integer() and abs(f) < 2**53 else round(f, 6)


def _series(xs, ys):
    """Points of a series, all of them when few, else a summary a model can read."""
    pts = [[_num(x), _num(y)] for x, y in zip(xs, ys)]
    if len(pts) <= CHART_POINTS:
        return {"points": pts}
    values = [p[1] for p in pts if isinstance(p[1], (int, float))]
    out = {"count": len(pts), "first": pts[0], "last": pts[-1]}
    if values:
        out["min"], out["max"] = min(values), max(values)
    step = max(1, len(pts) // 10)
    out["sample"] = pts[::step][:10]
    return out


def _axes_chart(ax):
    """One axes as data: its kind, title, labels, scales and elements."""
    from matplotlib.container import BarContainer
    from matplotlib.collections import PathCollection
    from matplotlib.patches import Wedge

    elements, kinds = [], []
    wedges = [p for p in ax.patches if isinstance(p, Wedge)]
    if wedges:
        kinds.append("pie")
        total = sum(abs(w.theta2 - w.theta1) for w in wedges) or 1.0
        labels = [t.get_text() for t in ax.texts]
        for i, w in enumerate(wedges):
            elements.append({"type": "slice", "label": w.get_label() if not w.get_label().startswith("_") else (labels[i] if i < len(labels) else None), "fraction": round(abs(w.theta2 - w.theta1) / total, 4)})
    ticks = {round(float(t), 6): l.get_text() for t, l in zip(ax.get_xticks(), ax.get_xticklabels())}
    histograms = ax.__dict__.get("_runpython_hist", set())
    for stats in ax.__dict__.get("_runpython_boxes", []):
        kinds.append("box")
        item = {"type": "box", "label": stats.get("label")}
        for key, name in (("whislo", "min"), ("q1", "q1"), ("med", "median"), ("q3", "q3"), ("whishi", "max"), ("mean", "mean")):
            if key in stats:
                item[name] = _num(stats[key])
        fliers = list(stats.get("fliers", []))
        item["outliers"] = [_num(f) for f in fliers[:CHART_POINTS]]
        if len(fliers) > CHART_POINTS:
            item["outliers_total"] = len(fliers)
        if item["label"] is None:
            item.pop("label")
        elements.append(item)
    boxed = ax.__dict__.get("_runpython_box_artists", set())
    for container in ax.containers:
        if isinstance(container, BarContainer) and id(container) in histograms:
            kinds.append("histogram")
            group = container.get_label()
            for patch in container.patches:
                start = patch.get_x()
                elements.append({"type": "bin", "group": None if str(group).startswith("_") else group,
                                 "start": _num(start), "end": _num(start + patch.get_width()),
                                 "count": _num(patch.get_height())})
            continue
        if isinstance(container, BarContainer):
            kinds.append("bar")
            group = container.get_label()
            for patch in container.patches:
                x = round(patch.get_x() + patch.get_width() / 2, 6)
                elements.append({"type": "bar", "label": ticks.get(x) or _num(x), "group": None if str(group).startswith("_") else group, "value": _num(patch.get_height())})
    for collection in ax.collections:
        if isinstance(collection, PathCollection):
            kinds.append("scatter")
            offsets = collection.get_offsets()
            label = collection.get_label()
            item = {"type": "scatter", "label": None if str(label).startswith("_") else label}
            item.update(_series([o[0] for o in offsets], [o[1] for o in offsets]))
            elements.append(item)
    for line in ax.get_lines():
        if id(line) in boxed:
            continue  # a box plot's whiskers, caps and medians: its statistics say them
        label = line.get_label()
        xs, ys = line.get_xdata(), line.get_ydata()
        if len(xs) < 2 and not wedges:
            continue
        kinds.append("line")
        item = {"type": "line", "label": None if str(label).startswith("_") else label}
        item.update(_series(list(xs), list(ys)))
        elements.append(item)
    kind = kinds[0] if len(set(kinds)) == 1 else ("composite" if kinds else "empty")
    return {
        "type": kind,
        "title": ax.get_title() or None,
        "x_label": ax.get_xlabel() or None,
        "y_label": ax.get_ylabel() or None,
        "x_scale": ax.get_xscale(),
        "y_scale": ax.get_yscale(),
        "elements": elements[:50],
        "elements_total": len(elements),
    }


def _chart(fig):
    """A matplotlib figure as data: one axes' chart, or a composite of several."""
    axes = [_axes_chart(ax) for ax in fig.get_axes()]
    title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else None
    if len(axes) == 1:
        chart = axes[0]
        if title and not chart["title"]:
            chart["title"] = title
        return chart
    return {"type": "composite", "title": title, "axes": axes[:8]}


# The last expression's value is already in the envelope (its value or preview): its automatic display
# adds only what that lacks, an HTML form as long as this at most (a DataFrame's table markup would
# cost a model kilobytes for what the preview says), and no text/plain.
LAST_VALUE_HTML = 500


def _add_display(obj, stem=None, last_value=False):
    """One entry of `displays` for `obj`; for the last expression's value (`last_value`), only the
    forms its return value lacks, and nothing when none remains."""
    if len(_DISPLAYS) >= MAX_DISPLAYS:
        return
    import binascii

    bundle = _mime_bundle(obj)
    if last_value:
        bundle.pop("text/plain", None)
        if (type(obj).__module__ or "").startswith("pandas"):
            bundle.pop("text/markdown", None)  # the value's preview already shows the table
        html = bundle.get("text/html")
        if isinstance(html, str) and len(html) > LAST_VALUE_HTML:
            del bundle["text/html"]
        if not bundle:
            return
    used = sum(len(v) for d in _DISPLAYS for v in d["formats"].values() if isinstance(v, str))
    formats = {}
    for mime, value in bundle.items():
        if mime in DISPLAY_FILES:
            if mime in _JSON_FILES and not isinstance(value, (bytes, bytearray, str)):
                value = json_dumps(value, _iso_or_base64)
            if isinstance(value, str):
                text_form = mime == "image/svg+xml" or mime in _JSON_FILES
                value = value.encode("utf-8") if text_form else binascii.a2b_base64(value)
            if not isinstance(value, (bytes, bytearray)):
                continue
            file = _display_file(stem or "display_%d" % (len(_DISPLAYS) + 1), DISPLAY_FILES[mime], value)
            entry = {"file": file, "bytes": len(value)}
            if mime in ("image/png", "image/jpeg") and _IMAGES["used"] + len(value) <= _IMAGES["budget"]:
                _IMAGES["used"] += len(value)
                entry["data"] = binascii.b2a_base64(value, newline=False).decode("ascii")
            size = _png_size(value) if mime == "image/png" else None
            if size:
                entry["width"], entry["height"] = size
            formats[mime] = entry
        elif mime in DISPLAY_TEXT:
            text = value if isinstance(value, str) else json_dumps(value)
            room = max(0, min(DISPLAY_TEXT[mime], DISPLAY_TEXT_TOTAL - used))
            if room < 40 and mime != "text/plain":
                continue
            text = _display_cut(text, max(room, 40))
            used += len(text)
            formats[mime] = text
    entry = {"formats": formats}
    if (type(obj).__module__ or "").startswith("matplotlib") and hasattr(obj, "get_axes"):
        try:
            entry["chart"] = _chart(obj)
        except Exception:
            pass  # a figure this cannot read is still shown
    _DISPLAYS.append(entry)


def display(*objs, **kwargs):
    """Shows each object in the run's envelope (`displays`), as IPython's display() does: its richest
    forms (html, markdown, images, ...) and its text."""
    for obj in objs:
        _add_display(obj)


def _rich(value):
    """Whether the last expression's value has forms beyond its repr (then it is displayed too)."""
    if isinstance(value, type):
        return False
    if any(callable(getattr(value, name, None)) for name, _ in _REPR_METHODS) or callable(
        getattr(value, "_repr_mimebundle_", None)
    ):
        return True
    return (type(value).__module__ or "").startswith("matplotlib") and hasattr(value, "savefig")


class _PyplotHook:
    """Patches `matplotlib.pyplot.show` when the code imports pyplot: it displays the open figures
    and closes them, as a notebook's inline backend does."""

    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib.pyplot":
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            module.show = _pyplot_show
            _record_chart_calls()
            loader.exec_module = original

        loader.exec_module = exec_module
        return spec


def _pyplot_show(*args, **kwargs):
    _show_open_figures()


def _record_chart_calls():
    """Wraps `Axes.hist` and `Axes.bxp` (behind `boxplot`) so a chart knows its histograms' bars
    and its boxes' statistics exactly, instead of guessing them from the drawn shapes."""
    axes = sys.modules.get("matplotlib.axes")
    cls = getattr(axes, "Axes", None)
    if cls is None or getattr(cls, "_runpython_wrapped", False):
        return
    hist, bxp = cls.hist, cls.bxp

    def recording_hist(self, *args, **kwargs):
        result = hist(self, *args, **kwargs)
        patches = result[2]
        containers = patches if isinstance(patches, list) else [patches]
        self.__dict__.setdefault("_runpython_hist", set()).update(id(c) for c in containers)
        return result

    def recording_bxp(self, bxpstats, *args, **kwargs):
        artists = bxp(self, bxpstats, *args, **kwargs)
        boxes = self.__dict__.setdefault("_runpython_boxes", [])
        boxes.extend(dict(stats) for stats in bxpstats)
        drawn = self.__dict__.setdefault("_runpython_box_artists", set())
        for group in artists.values():
            drawn.update(id(a) for a in group)
        return artists

    cls.hist, cls.bxp, cls._runpython_wrapped = recording_hist, recording_bxp, True


def _show_open_figures():
    """Every open figure displayed (as figure_N.png), in order, then closed."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    for number in plt.get_fignums():
        try:
            _add_display(plt.figure(number), stem="figure_%d" % number)
        except Exception:
            pass  # a figure that cannot be drawn is the code's problem, not the run's
    plt.close("all")


def _install_display():
    import builtins

    builtins.display = display
    module = type(sys)("runpython_display")
    module.display = display
    sys.modules["runpython_display"] = module
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:  # imported ahead (a template's warm imports)
        plt.show = _pyplot_show
        _record_chart_calls()
    else:
        sys.meta_path.insert(0, _PyplotHook())


def _save_open_figures():
    """Figures the code drew but did not close are displayed, and so become PNG files in the run
    directory (and artifacts)."""
    _show_open_figures()


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


def _report_value(value, limit, inline_limit, typed=False):
    """(status, result, preview) for the code's value: its JSON, with a preview when it is over the
    inline limit (the full value is kept aside), or `ReturnValueTooLarge` (with the preview) over the
    limit. A value with no JSON whose repr() raises has no value, and its preview says why. `typed`:
    also its exact form (tagged JSON, `return_typed`) when that differs from the JSON."""
    name = type(value).__name__
    exact = None
    if typed:
        values = _values()
        try:
            tagged, has_tags = values.encode(value)
            if has_tags:
                exact = json_dumps(tagged)
        except values.TooDeep as exc:
            return "error", {"type": "ReturnValueTooDeep", "message": "the last expression's value %s; "
                             "return a flatter value" % str(exc)[len("the value "):], "traceback": None}, None
        except (values.Unencodable, TypeError, ValueError, RecursionError):
            exact = None  # no exact form (a DataFrame, an object): the JSON form is all there is
    try:
        encoded = _json_or_repr(value, limit)
    except Unshowable as exc:
        return "success", (name, "null", {"type": name, "repr_error": str(exc)}, None), None
    size = max(len(encoded.encode("utf-8")), len(exact.encode("utf-8")) if exact else 0)
    summary = _safe_preview(value) if size > inline_limit else None
    if size > limit:
        return "error", _too_large(size, limit), summary
    return "success", (name, encoded, summary, exact), summary


def _values():
    """runpython's tagged JSON codec (runpython_values, beside this module)."""
    module = sys.modules.get("runpython_values")
    if module is None:
        if _code_dir is not None:
            sys.path.insert(0, _code_dir)
        try:
            import runpython_values as module
        finally:
            if _code_dir is not None and _code_dir in sys.path:
                sys.path.remove(_code_dir)
    return module


def _safe_preview(value):
    try:
        return preview(value)
    except Exception as exc:  # a preview is a courtesy: its failure must not fail the run
        return {"type": type(value).__name__, "preview_error": "%s: %s" % (type(exc).__name__, _clip(str(exc)))}


def _write_trust_bundle(bundle):
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


def _set_env(env):
    """The run's own environment variables, set after start-up (a pooled interpreter started before its
    run was known): in `os.environ` if `os` is already imported, else where `os` will read them."""
    os = sys.modules.get("os")
    for name, value in env.items():
        if os is not None:
            os.environ[name] = value
        else:
            posix.putenv(name, value)
            posix.environ[name.encode("utf-8", "surrogateescape")] = value.encode("utf-8", "surrogateescape")


def _env_now(names):
    """The current values of `names` (None where unset), as `_set_env` would read them back."""
    os = sys.modules.get("os")
    if os is not None:
        return {name: os.environ.get(name) for name in names}
    found = {}
    for name in names:
        value = posix.environ.get(name.encode("utf-8", "surrogateescape"))
        found[name] = None if value is None else value.decode("utf-8", "surrogateescape")
    return found


def _restore_env(previous):
    """Puts back what `_env_now` saw: a session cell's variables are that cell's only."""
    os = sys.modules.get("os")
    for name, value in previous.items():
        if value is not None:
            _set_env({name: value})
        elif os is not None:
            os.environ.pop(name, None)
        else:
            posix.unsetenv(name)
            posix.environ.pop(name.encode("utf-8", "surrogateescape"), None)


def _warm_up(args):
    """A pooled interpreter prepares before its run arrives: `--site DIR` adds the environment and
    `--warm a,b` imports modules the pool declares warm (a failed import is left for the run to see)."""
    while len(args) >= 2:
        flag, value = args[0], args[1]
        args = args[2:]
        if flag == "--site":
            import site

            site.addsitedir(value)
        elif flag == "--warm":
            for name in value.split(","):
                try:
                    __import__(name)
                except Exception:
                    pass


_network_spec = None


def _network_messages(spec):
    """A connect refused by runpython's network policy fails with EACCES; the PermissionError then
    says which rule refused it (asked of the host) instead of only "Permission denied"."""
    import errno
    import socket

    global _network_spec
    _network_spec = spec  # a session's cells each bring their own bridge
    if getattr(socket.socket.connect, "_runpython", False):
        return
    connect = socket.socket.connect

    def why(address):
        try:
            tools = sys.modules.get("runpython_tools")
            if tools is None or tools._bridge is None:
                tools = _install_bridge(_network_spec, {})
            return tools.call("runpython_network_refusal", host=str(address[0]), port=int(address[1]))
        except BaseException:
            return None

    def checked_connect(self, address):
        try:
            return connect(self, address)
        except PermissionError as exc:
            if exc.errno != errno.EACCES or self.family not in (socket.AF_INET, socket.AF_INET6):
                raise
            reason = why(address)
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
    files = request.get("files")
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
        try:
            view = memoryview(data)
            while view:
                view = view[posix.write(fd, view):]
        finally:
            posix.close(fd)


def _bind_inputs(request, namespace):
    _IMAGES["budget"], _IMAGES["used"] = int(request.get("image_budget") or 0), 0
    _write_files(request)
    inputs = request.get("inputs") or {}
    if request.get("typed") and inputs:
        inputs = _values().decode(inputs, stand_ins=True)  # the host's exact values
    for name, value in inputs.items():
        namespace[name] = value
    if request.get("input_artifacts"):
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


def _run(request, namespace, loop=None):
    """Runs the request's code in `namespace`; returns (status, result, summary) for `_result_text`."""
    source = request["code"]
    limit = int(request.get("max_return_bytes", 1_000_000))
    inline_limit = int(request.get("inline_return_bytes", 4096))
    status, result, summary = "success", None, None
    try:
        spec = request.get("bridge")
        # Only the host's hidden tools (artifact access): the client is installed on first use.
        visible = spec is not None and any(not t.get("hidden") for t in spec["tools"])
        bridge = _install_bridge(spec, namespace) if visible else None
        if request.get("artifact_helpers") and spec is not None:
            _artifact_helpers(namespace, spec, request.get("saved_dir") or "saved")
        if spec is not None and any(t.get("name") == "runpython_network_refusal" for t in spec["tools"]):
            _network_messages(spec)
        code_dir = request.get("code_dir")
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
            status, result, summary = _report_value(value, limit, inline_limit, bool(request.get("typed")))
            if status == "success":
                shown = None
                if request.get("repr"):  # what a REPL prints, as well as the value
                    try:
                        shown = repr(value)[:10000]
                    except BaseException:
                        shown = None
                result = result + (shown,)
    except SystemExit as exc:
        if exc.code is not None and exc.code != 0:  # sys.exit() and sys.exit(0) are a normal end
            status, result = "error", _format_error(exc, source)
    except BaseException as exc:
        status, result = "error", _format_error(exc, source)
    return status, result, summary


def _result_text(status, result, summary):
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


def _new_main_module():
    main_module = type(sys)("__main__")
    namespace = main_module.__dict__
    namespace["__builtins__"] = __builtins__
    sys.modules["__main__"] = main_module
    return namespace


def _add_sites(dirs, added):
    for site_dir in dirs or ():
        if site_dir and site_dir not in added:
            import site  # with -S its import adds nothing by itself; addsitedir also reads .pth files

            site.addsitedir(site_dir)
            added.append(site_dir)


def main():
    posix.set_inheritable(RESULT_FD, False)  # subprocesses of the code must not hold the result pipe
    try:
        posix.set_inheritable(BRIDGE_FD, False)  # nor the tool bridge
    except OSError:
        pass
    if "--session" in sys.argv[2:]:
        return _session_main()
    if "--template" in sys.argv[2:]:
        # A template: it forks runs, each of which comes back to `forked_main`.
        import runpython_template

        return runpython_template.serve(sys.argv[2:])
    _warm_up(sys.argv[2:])
    _one_shot()


def forked_main():
    """A run forked from a template, its sandbox taken (`runpython_template`): the one-shot path."""
    posix.set_inheritable(RESULT_FD, False)
    posix.set_inheritable(BRIDGE_FD, False)
    _one_shot()


def _one_shot():
    """Reads the request on stdin, runs it, answers on the result pipe, closes the streams."""
    global _code_dir
    pid = posix.getpid()
    request = _read_request()
    code_dir = request.get("code_dir")
    if code_dir:
        _code_dir = code_dir.rstrip("/") + "/"
    sys.argv = [FILENAME]
    _write_trust_bundle(request.get("trust_bundle"))
    _set_env(request.get("env") or {})
    sys.stdout.reconfigure(line_buffering=True)
    _add_sites([request.get("site_dir")], [])
    namespace = _new_main_module()
    _install_display()
    _bind_inputs(request, namespace)
    status, result, summary = _run(request, namespace)

    _save_open_figures()
    _finish_like_exit(namespace)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass  # the code may have closed them; the result still matters
    if posix.getpid() != pid:  # a process the code forked: only the runner itself reports
        posix._exit(0 if status == "success" else 1)
    _write_result(RESULT_FD, _result_text(status, result, summary))
    # The answer is complete: closing the streams tells the host so before the interpreter has exited.
    for fd in (1, 2):
        try:
            posix.close(fd)
        except OSError:
            pass


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
            message = json_loads(payload.decode("utf-8"))
            if message.get("type") == "interrupt":
                for fd in fds:
                    posix.close(fd)
                with self.lock:
                    if self.running:
                        # SIGINT to the main thread itself (a signal to the process may land on this
                        # thread and leave a sleeping cell asleep): a KeyboardInterrupt in the cell.
                        import signal

                        signal.pthread_kill(self.main_thread, signal.SIGINT)
                continue
            with self.lock:
                self.cells.append((message, fds))
                self.ready.notify()
        with self.lock:
            self.closed = True
            self.ready.notify()

    def next_cell(self):
        with self.lock:
            while not self.cells and not self.closed:
                self.ready.wait()
            if self.cells:
                return self.cells.pop(0)
            return None, None

    def run_cell(self, request, fds, namespace, sites):
        global _code_dir
        out, err, res = fds[0], fds[1], fds[2]
        bridge_fd = fds[3] if len(fds) > 3 else None
        for fd, target in ((out, 1), (err, 2)):
            posix.dup2(fd, target)
            posix.close(fd)
        if bridge_fd is not None:
            posix.dup2(bridge_fd, BRIDGE_FD, inheritable=False)
            posix.close(bridge_fd)
        code_dir = request.get("code_dir")
        if code_dir:
            _code_dir = code_dir.rstrip("/") + "/"
        _add_sites(request.get("site_dirs"), sites)
        _write_trust_bundle(request.get("trust_bundle"))
        env = request.get("env") or {}
        previous = _env_now(env)
        _set_env(env)
        _bind_inputs(request, namespace)
        with self.lock:
            self.running = True
        try:
            status, result, summary = _run(request, namespace, self._loop)
        except KeyboardInterrupt as exc:  # the interrupt came as the cell ended
            status, result, summary = "error", _format_error(exc, request["code"]), None
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
        _write_result(res, _result_text(status, result, summary))
        try:
            _restore_env(previous)  # the next cell does not see this cell's variables
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

    def _loop(self):
        if self.loop is None:
            import asyncio

            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
        return self.loop


def _session_main():
    _warm_up(sys.argv[2:])  # "--session 1" is a pair it skips
    sys.argv = [FILENAME]
    session = _Session()
    sys.stdout.reconfigure(line_buffering=True)
    namespace = _new_main_module()
    _install_display()
    sites = []
    while True:
        try:
            request, fds = session.next_cell()
            if request is None:
                break
            session.run_cell(request, fds, namespace, sites)
        except KeyboardInterrupt:
            continue  # an interrupt that arrived between cells
    posix._exit(0)


if __name__ in ("__main__", "runpython_runner"):
    main()
