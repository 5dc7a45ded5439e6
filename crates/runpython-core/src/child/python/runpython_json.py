"""Values as JSON in the child: the strict codec (integers of any size, lone surrogates made valid),
the JSON form of what the code returns (plain JSON; a library's own table; ISO 8601 dates and base64
bytes; else its repr), previews of values too large to inline, and the report of a returned value.

Standard library only (built-in modules), imported by the runner from runpython's code directory.
"""

import sys

import _json
import runpython_values

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


def _too_large(size, limit):
    return {
        "type": "ReturnValueTooLarge",
        "message": "the last expression's value is %s bytes as JSON, over the limit of %d; "
        "return a smaller value (a summary, a slice) or write the data to a file"
        % ("more than %d" % limit if size > limit else size, limit),
        "traceback": None,
    }


def _report_value(value, limit, inline_limit, typed=False):
    """(status, result, preview) for the code's value: its JSON, with a preview when it is over the
    inline limit (the full value is kept aside), or `ReturnValueTooLarge` (with the preview) over the
    limit. A value with no JSON whose repr() raises has no value, and its preview says why. `typed`:
    also its exact form (tagged JSON, `return_typed`) when that differs from the JSON."""
    name = type(value).__name__
    exact = None
    if typed:
        values = runpython_values
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


def _safe_preview(value):
    try:
        return preview(value)
    except Exception as exc:  # a preview is a courtesy: its failure must not fail the run
        return {"type": type(value).__name__, "preview_error": "%s: %s" % (type(exc).__name__, _clip(str(exc)))}
