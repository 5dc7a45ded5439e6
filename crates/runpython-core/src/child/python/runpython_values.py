"""runpython's tagged JSON: Python values exactly, as JSON, both ways (standard library only).

Used in the child (the runner: inputs in, the value out; the bridge client: a typed tool's arguments
out and its result in) and on the host by the Python package (the same file, built into it).

The encoding. JSON's own values stand for themselves: None, bool, int (any size), finite float, str,
list, and dict whose keys are all str and which has no "$rp" key. Every other value is an object with
a "$rp" tag and its payload in "v":

    tuple, set, frozenset  {"$rp": "tuple", "v": [items]}
    dict (other keys)      {"$rp": "dict", "v": [[key, value], ...]}
    float (nan, inf)       {"$rp": "float", "v": "nan" | "inf" | "-inf"}
    bytes, bytearray       {"$rp": "bytes", "v": base64}
    complex                {"$rp": "complex", "v": [real, imag]}
    date, time, datetime   {"$rp": "datetime", "v": ISO 8601, "tz": IANA key, "fold": 1}
                           ("tz" when the tzinfo is a zoneinfo zone, else the offset in "v" is the
                           zone; "tzname" for a named fixed offset; "fold" only when 1)
    timedelta              {"$rp": "timedelta", "v": [days, seconds, microseconds]}
    Decimal, UUID          {"$rp": "decimal" | "uuid", "v": str}
    pathlib paths          {"$rp": "path", "v": str, "kind": "PosixPath" | "PurePosixPath" | ...}
    dataclass instance     {"$rp": "dataclass", "cls": "module:Qual.Name", "v": {field: value}}
    NamedTuple             {"$rp": "namedtuple", "cls": "module:Qual.Name", "v": {field: value}}

Decoding turns a dataclass or NamedTuple back into its class when that class is already loaded where
it is decoded (found in sys.modules: nothing is ever imported by name, since a name comes from the
other side), built as copy and pickle build one: none of the class's own code runs (and a class with a
`__del__`, whose code would run on the other side's fields when the object is collected, is not built). Otherwise: in the child, a stand-in class of the same name and fields (so `p.x` works,
and returning it gives the host its own class back); on the host, a dict of the fields with
"__class__": "module.Qual.Name".

Nesting is bounded (MAX_DEPTH), so a value holding itself is an error, not a crash; so is anything
this encoding has no form for (Unencodable), unless `default` converts it.
"""

import sys

TAG = "$rp"
MAX_DEPTH = 200

_INF = float("inf")


class Unencodable(TypeError):
    """A value this encoding has no form for."""


class TooDeep(ValueError):
    """A value nested deeper than the bound."""


class Malformed(ValueError):
    """Tagged JSON that is not what `encode` writes."""


def _qualified(cls):
    return "%s:%s" % (cls.__module__, cls.__qualname__)


def _b64(data):
    import binascii

    return binascii.b2a_base64(bytes(data), newline=False).decode("ascii")


def encode(value, default=None, max_depth=MAX_DEPTH):
    """(tagged JSON value, whether it holds a tag). `default(obj)` may convert what has no form here;
    it raises Unencodable (or returns something encodable)."""
    tagged = [False]

    def tag(name, payload, **extra):
        tagged[0] = True
        out = {TAG: name, "v": payload}
        out.update(extra)
        return out

    def enc(v, depth):
        if depth > max_depth:
            raise TooDeep("the value nests deeper than %d levels" % max_depth)
        t = type(v)
        if v is None or t is bool or t is str or t is int:
            return v
        if t is float:
            if v != v:
                return tag("float", "nan")
            if v == _INF or v == -_INF:
                return tag("float", "inf" if v > 0 else "-inf")
            return v
        d = depth + 1
        if t is list:
            return [enc(x, d) for x in v]
        if t is dict:
            if TAG not in v and all(type(k) is str for k in v):
                return {k: enc(x, d) for k, x in v.items()}
            return tag("dict", [[enc(k, d), enc(x, d)] for k, x in v.items()])
        if t is tuple:
            return tag("tuple", [enc(x, d) for x in v])
        if t is set or t is frozenset:
            return tag(t.__name__, [enc(x, d) for x in v])
        if t is bytes or t is bytearray:
            return tag(t.__name__, _b64(v))
        if t is complex:
            return tag("complex", [enc(v.real, d), enc(v.imag, d)])
        known = _known(v, t, d, enc, tag)
        if known is not _NONE:
            return known
        if isinstance(v, int):
            return int(v)  # an int subclass (IntEnum, IntFlag...) with no form of its own
        for base in (str, float, list, dict):
            if isinstance(v, base):
                return enc(base(v), depth)  # str and dict subclasses (OrderedDict...) as their base
        if default is not None:
            return enc(default(v), d)
        raise Unencodable("a value of type %r has no exact form across the boundary" % t.__name__)

    value = enc(value, 0)
    return value, tagged[0]


_NONE = object()


def _known(v, t, d, enc, tag):
    """The tagged form of values of standard-library types the code (or its libraries) imported."""
    dt = sys.modules.get("datetime")
    if dt is not None and isinstance(v, (dt.date, dt.time, dt.timedelta)):
        if isinstance(v, dt.timedelta):
            return tag("timedelta", [v.days, v.seconds, v.microseconds])
        kind = "datetime" if isinstance(v, dt.datetime) else "date" if isinstance(v, dt.date) else "time"
        extra = {}
        zone = getattr(v, "tzinfo", None)
        if zone is not None:
            key = getattr(zone, "key", None)
            if isinstance(key, str):
                extra["tz"] = key
            elif type(zone) is dt.timezone:
                name = zone.tzname(None)
                if name != dt.timezone(zone.utcoffset(None)).tzname(None):
                    extra["tzname"] = name
        if getattr(v, "fold", 0):
            extra["fold"] = 1
        if kind == "datetime" and type(v) is not dt.datetime:
            v = dt.datetime(v.year, v.month, v.day, v.hour, v.minute, v.second, v.microsecond,
                            v.tzinfo, fold=v.fold)  # pandas' Timestamp and the like, as datetimes
        return tag(kind, v.isoformat(), **extra)
    decimal = sys.modules.get("decimal")
    if decimal is not None and isinstance(v, decimal.Decimal):
        return tag("decimal", str(v))
    uuid = sys.modules.get("uuid")
    if uuid is not None and isinstance(v, uuid.UUID):
        return tag("uuid", str(v))
    pathlib = sys.modules.get("pathlib")
    if pathlib is not None and isinstance(v, pathlib.PurePath):
        return tag("path", str(v), kind=_path_kind(v, pathlib))
    if isinstance(v, tuple) and isinstance(getattr(t, "_fields", None), tuple):
        fields = t._fields
        return tag("namedtuple", {f: enc(x, d) for f, x in zip(fields, v)}, cls=_qualified(t))
    dataclasses = sys.modules.get("dataclasses")
    if dataclasses is not None and dataclasses.is_dataclass(v) and not isinstance(v, type):
        fields = dataclasses.fields(v)
        return tag("dataclass", {f.name: enc(getattr(v, f.name), d) for f in fields}, cls=_qualified(t))
    if isinstance(v, tuple):
        return tag("tuple", [enc(x, d) for x in v])
    if isinstance(v, (set, frozenset)):
        return tag("frozenset" if isinstance(v, frozenset) else "set", [enc(x, d) for x in v])
    return _NONE


_PATH_KINDS = ("PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath")


def _path_kind(v, pathlib):
    for cls in type(v).__mro__:
        if cls.__module__ == "pathlib" and cls.__name__ in _PATH_KINDS:
            return cls.__name__
    return "PurePosixPath"


def decode(value, stand_ins=False, max_depth=MAX_DEPTH):
    """The Python value of tagged JSON. `stand_ins`: a dataclass or NamedTuple whose class is not
    loaded here becomes an instance of a stand-in class (the child's way); else a dict of its fields
    with "__class__" (the host's way). Raises Malformed or TooDeep for what `encode` never writes."""

    def dec(v, depth):
        if depth > max_depth:
            raise TooDeep("the value nests deeper than %d levels" % max_depth)
        t = type(v)
        d = depth + 1
        if t is list:
            return [dec(x, d) for x in v]
        if t is not dict:
            return v
        name = v.get(TAG)
        if name is None:
            return {k: dec(x, d) for k, x in v.items()}
        payload = v.get("v")
        try:
            return _DECODERS[name](payload, v, lambda x: dec(x, d), stand_ins)
        except KeyError:
            if name not in _DECODERS:
                raise Malformed("unknown tag %r" % (name,)) from None
            raise Malformed("a %s is malformed" % name) from None
        except (Malformed, TooDeep):
            raise
        except (TypeError, ValueError, OverflowError, AttributeError, IndexError) as exc:
            raise Malformed("a %s is malformed: %s" % (name, exc)) from None

    return dec(value, 0)


def _items(payload, dec):
    if type(payload) is not list:
        raise Malformed("expected a list of items")
    return [dec(x) for x in payload]


def _dict(payload, whole, dec, stand_ins):
    out = {}
    for pair in _items(payload, lambda x: x):
        if type(pair) is not list or len(pair) != 2:
            raise Malformed("a dict item is not a [key, value] pair")
        out[dec(pair[0])] = dec(pair[1])
    return out


def _float(payload, whole, dec, stand_ins):
    if payload not in ("nan", "inf", "-inf"):
        raise Malformed("a float is nan, inf or -inf")
    return float(payload)


def _bytes(payload, whole, dec, stand_ins):
    import base64

    data = base64.b64decode(payload, validate=True)
    return bytearray(data) if whole[TAG] == "bytearray" else data


def _complex(payload, whole, dec, stand_ins):
    real, imag = _items(payload, dec)
    return complex(float(real), float(imag))


def _timed(payload, whole, dec, stand_ins):
    import datetime as dt

    kind = whole[TAG]
    if type(payload) is not str:
        raise Malformed("expected ISO 8601 text")
    value = getattr(dt, kind).fromisoformat(payload)
    key, name, fold = whole.get("tz"), whole.get("tzname"), whole.get("fold") == 1
    if kind != "date":
        if isinstance(key, str):
            zone = _zone(key)
            if zone is not None:
                value = value.replace(tzinfo=zone)
        elif isinstance(name, str) and value.tzinfo is not None:
            value = value.replace(tzinfo=dt.timezone(value.utcoffset(), name))
        if fold:
            value = value.replace(fold=1)
    return value


def _zone(key):
    """The IANA zone `key`, or None where this side has no zone data (the offset stays)."""
    try:
        import zoneinfo

        return zoneinfo.ZoneInfo(key)
    except Exception:
        return None


def _timedelta(payload, whole, dec, stand_ins):
    import datetime as dt

    days, seconds, micros = _items(payload, lambda x: x)
    if not all(type(n) is int for n in (days, seconds, micros)):
        raise Malformed("a timedelta is three ints")
    return dt.timedelta(days=days, seconds=seconds, microseconds=micros)


def _decimal(payload, whole, dec, stand_ins):
    import decimal

    if type(payload) is not str:
        raise Malformed("a Decimal is text")
    try:
        return decimal.Decimal(payload)
    except decimal.InvalidOperation:
        raise Malformed("%r is not a Decimal" % payload[:40]) from None


def _uuid(payload, whole, dec, stand_ins):
    import uuid

    return uuid.UUID(payload)


def _path(payload, whole, dec, stand_ins):
    import pathlib

    if type(payload) is not str:
        raise Malformed("a path is text")
    kind = whole.get("kind")
    if kind not in _PATH_KINDS:
        kind = "PurePosixPath"
    try:
        return getattr(pathlib, kind)(payload)
    except NotImplementedError:  # a concrete path of the other system: its pure flavour
        return getattr(pathlib, "Pure" + kind)(payload)


def _loaded_class(qualified):
    """The class named `module:Qual.Name` if its module is loaded here; never imports."""
    if type(qualified) is not str or ":" not in qualified:
        raise Malformed("a class name is module:QualName")
    module, qual = qualified.split(":", 1)
    found = sys.modules.get(module)
    for part in qual.split("."):
        if found is None:
            return None
        found = vars(found).get(part) if hasattr(found, "__dict__") else None
    if not isinstance(found, type) or _finalizes(found):
        return None
    return found


def _finalizes(cls):
    """Whether instances run code of the class's own when they are collected (`__del__`): such a class
    is never built from the other side's fields, which could aim that code (a path it deletes)."""
    return any("__del__" in vars(base) for base in cls.__mro__ if base is not object)


def _fields(payload, dec):
    if type(payload) is not dict or not all(type(k) is str for k in payload):
        raise Malformed("fields are an object")
    return {k: dec(x) for k, x in payload.items()}


def _dataclass(payload, whole, dec, stand_ins):
    fields = _fields(payload, dec)
    qualified = whole.get("cls")
    cls = _loaded_class(qualified)
    dataclasses = sys.modules.get("dataclasses")
    if cls is not None and dataclasses is not None and dataclasses.is_dataclass(cls):
        if {f.name for f in dataclasses.fields(cls)} == set(fields):
            # As copy and pickle make one: no __init__ or __post_init__ runs, since the values (and
            # the class's name) come from the other side.
            made = object.__new__(cls)
            for name, field in fields.items():
                object.__setattr__(made, name, field)
            return made
    if stand_ins:
        made = _stand_in("dataclass", qualified, list(fields))
        if made is not None:
            return made(**fields)
    return _record(qualified, fields)


def _namedtuple(payload, whole, dec, stand_ins):
    fields = _fields(payload, dec)
    qualified = whole.get("cls")
    cls = _loaded_class(qualified)
    if cls is not None and issubclass(cls, tuple) and tuple(getattr(cls, "_fields", ())) == tuple(fields):
        return tuple.__new__(cls, fields.values())  # no __new__ of the class's own runs
    if stand_ins:
        made = _stand_in("namedtuple", qualified, list(fields))
        if made is not None:
            return made(**fields)
    return _record(qualified, fields)


def _record(qualified, fields):
    record = {"__class__": qualified.replace(":", ".", 1)}
    record.update(fields)
    return record


_STAND_INS = {}


def _stand_in(kind, qualified, names):
    """A class standing in for `qualified` here, named and placed as it (so encoding an instance
    names the original); None when the names cannot be fields."""
    import keyword

    if not all(n.isidentifier() and not keyword.iskeyword(n) and not n.startswith("_") for n in names):
        return None
    key = (kind, qualified, tuple(names))
    cls = _STAND_INS.get(key)
    if cls is None:
        module, qual = qualified.split(":", 1)
        simple = qual.rsplit(".", 1)[-1]
        if not simple.isidentifier():
            return None
        if kind == "namedtuple":
            import collections

            cls = collections.namedtuple(simple, names)
        else:
            import dataclasses

            cls = dataclasses.make_dataclass(simple, names)
        cls.__module__, cls.__qualname__ = module, qual
        _STAND_INS[key] = cls
    return cls


def _container(payload, whole, dec, stand_ins):
    items = _items(payload, dec)
    return {"tuple": tuple, "set": set, "frozenset": frozenset}[whole[TAG]](items)


_DECODERS = {
    "tuple": _container,
    "set": _container,
    "frozenset": _container,
    "dict": _dict,
    "float": _float,
    "bytes": _bytes,
    "bytearray": _bytes,
    "complex": _complex,
    "date": _timed,
    "time": _timed,
    "datetime": _timed,
    "timedelta": _timedelta,
    "decimal": _decimal,
    "uuid": _uuid,
    "path": _path,
    "dataclass": _dataclass,
    "namedtuple": _namedtuple,
}
