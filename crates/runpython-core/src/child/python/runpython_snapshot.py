"""A session's namespace as bytes and back, inside the session's own sandbox (`runpython_session`'s
`snapshot` and `restore` messages): the standard library's pickle, with what pickle cannot name kept by
value, and the working directory's files beside it. Functions and classes defined in cells (or anywhere
pickle could not import them from again) keep their code through `marshal` and, for their globals, the
namespace they are loaded into; modules are kept by name and imported again. What pickle cannot keep
(sockets, open files, generators, threads, locks, an enum class defined in a cell) makes `dump` fail,
naming the global that holds it: the host then keeps the session's earlier snapshot, and the cells after
it are replayed.

The host never loads these bytes. Only a session's new interpreter does (`load`), in its own sandbox,
where whatever the bytes make it run has the power the session's own cells had and no more.

Standard library only; `pickle` and `marshal` are imported when a snapshot is taken or loaded.
"""

import posix
import sys

from runpython_run import write_all

# What a snapshot's bytes start with, before the pickle: this module's format, then the interpreter's
# bytecode magic (code objects are kept as `marshal` data, which only the same bytecode reads).
FORMAT = b"RPNS\x01"
# Names every module namespace has from its creation: the new namespace has its own.
_MODULE_NAMES = frozenset(("__builtins__", "__name__", "__doc__", "__package__", "__loader__", "__spec__"))
_target = [None]  # the namespace being loaded into: the globals of the functions that lived in it


class TooLarge(Exception):
    """The snapshot passed its bound (its bytes so far)."""


class Unkept(Exception):
    """Something in the namespace that a snapshot cannot keep, and why."""


def _magic():
    return sys.modules["_frozen_importlib_external"].MAGIC_NUMBER


class _Bounded:
    """A file that counts what goes through it and refuses to pass `limit` bytes."""

    def __init__(self, raw, limit):
        self.raw, self.limit, self.size = raw, limit, 0

    def write(self, data):
        n = len(memoryview(data).cast("B"))
        self.size += n
        if self.size > self.limit:
            raise TooLarge(self.size)
        if self.raw is not None:
            self.raw.write(data)
        return n


def _user_globals(namespace):
    """The namespace's entries the user made: not the module's own names, not runpython's helpers
    (tools, `once`, the artifact helpers: the next cell installs them again)."""
    kept = {}
    for name, value in namespace.items():
        if name in _MODULE_NAMES:
            continue
        module = getattr(value, "__module__", None) if callable(value) else None
        if type(module) is str and module.startswith("runpython_"):
            continue
        kept[name] = value
    return kept


def _state(limit):
    """What a snapshot holds besides the namespace: the stand-in classes of exact values decoded so far
    (so a value decoded after a restore has the class of the ones before it), and the working
    directory's files (those cells were given and those they wrote: a replay would have made them)."""
    values = sys.modules.get("runpython_values")
    return {"stand_ins": dict(values._STAND_INS) if values is not None else {}, "files": _working_files(limit)}


def _working_files(limit):
    """The working directory's regular files and directories, by relative path: (mode, bytes) for a
    file, (mode, None) for a directory. A symbolic link or any other kind of entry cannot be kept.
    Files whose sizes add up past `limit` are not read (TooLarge)."""
    import os
    import stat

    found, size = {}, 0
    for top, dirs, files in os.walk(".", followlinks=False):
        for name in dirs + files:
            path = os.path.join(top, name)[2:]
            info = os.lstat(path)
            if stat.S_ISDIR(info.st_mode):
                found[path] = (stat.S_IMODE(info.st_mode), None)
            elif stat.S_ISREG(info.st_mode):
                size += info.st_size
                if size > limit:
                    raise TooLarge(size)
                with open(path, "rb") as f:
                    found[path] = (stat.S_IMODE(info.st_mode), f.read())
            else:
                raise Unkept("the working directory's %r is not a regular file or directory" % (path,))
    return found


def _put_files(files):
    """Writes `_working_files()`'s answer into the (new, empty) working directory: directories first
    (a path's parents sort before it), each file with its mode."""
    import os

    for path in sorted(files):
        mode, data = files[path]
        if data is None:
            os.makedirs(path, exist_ok=True)
            continue
        fd = posix.open(path, posix.O_WRONLY | posix.O_CREAT | posix.O_TRUNC | posix.O_CLOEXEC, 0o600)
        write_all(fd, data)
        posix.chmod(path, mode)
    for path in sorted((p for p, (_, data) in files.items() if data is None), reverse=True):
        posix.chmod(path, files[path][0])  # after their files: a read-only directory is written first


def dump(namespace, fd, limit):
    """Writes the namespace's snapshot to `fd` (within `limit` bytes): its size. Raises TooLarge, or
    Unkept naming the global that holds what cannot be kept."""
    import io
    import pickle

    out = io.open(fd, "wb", buffering=1 << 16, closefd=True)
    bounded = _Bounded(out, limit)
    entries = _user_globals(namespace)
    try:
        bounded.write(FORMAT + bytes((len(_magic()),)) + _magic())
        _pickler(pickle)(bounded, namespace).dump({"namespace": entries, "state": _state(limit)})
        out.flush()
    except (TooLarge, Unkept):
        raise
    except RecursionError:
        raise Unkept("the namespace is nested too deeply to keep") from None
    except Exception as exc:
        raise Unkept(_culprit(pickle, entries, namespace, exc)) from None
    finally:
        try:
            out.close()
        except BaseException:
            pass
    return bounded.size


def _culprit(pickle, entries, namespace, exc):
    """Which global holds what could not be pickled (pickled alone, in order, into nothing)."""
    for name, value in entries.items():
        try:
            _pickler(pickle)(_Bounded(None, 1 << 62), namespace).dump(value)
        except RecursionError:
            return "global %r is nested too deeply to keep" % (name,)
        except Exception as one:
            return "global %r holds %s (%s)" % (name, _what(value), describe(one))
    return describe(exc)


def _what(value):
    kind = type(value)
    name = kind.__qualname__ if kind.__module__ == "builtins" else "%s.%s" % (kind.__module__, kind.__qualname__)
    return "an object of type " + name


def describe(exc):
    """An exception as a short line: its type and message, at most 300 characters."""
    try:
        text = "%s: %s" % (type(exc).__name__, exc)
    except BaseException:
        text = type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "…"


def load(namespace, fd):
    """Reads a snapshot from `fd` into `namespace`. Raises what went wrong: the host then starts the
    session again from nothing and replays every cell (the namespace may hold part of the snapshot)."""
    import io
    import pickle

    source = io.open(fd, "rb", buffering=1 << 16, closefd=True)
    try:
        head = source.read(len(FORMAT) + 1)
        if head[: len(FORMAT)] != FORMAT:
            raise ValueError("the snapshot is not in runpython's format %r" % (FORMAT,))
        magic = source.read(head[-1])
        if magic != _magic():
            raise ValueError(
                "the snapshot was taken by a Python of another bytecode (magic %s, this one's %s)"
                % (magic.hex(), _magic().hex())
            )
        _target[0] = namespace
        try:
            snapshot = pickle.Unpickler(source).load()
        finally:
            _target[0] = None
    finally:
        source.close()
    if type(snapshot) is not dict or type(snapshot.get("namespace")) is not dict:
        raise ValueError("the snapshot does not hold a namespace")
    namespace.update(snapshot["namespace"])
    files = snapshot.get("state", {}).get("files")
    if type(files) is dict:
        _put_files(files)
    stand_ins = snapshot.get("state", {}).get("stand_ins")
    values = sys.modules.get("runpython_values")
    if values is not None and type(stand_ins) is dict:
        for key, cls in stand_ins.items():
            values._STAND_INS.setdefault(key, cls)


# ---- what pickle is told about what it cannot name ----


def _pickler(pickle):
    """A pickler that keeps by value what it could not import again (made once per process)."""
    made = _PICKLER.get("class")
    if made is None:
        made = _PICKLER["class"] = _make_pickler(pickle)
    return made


_PICKLER = {}


def _make_pickler(pickle):
    import marshal
    import types

    function, code_type, cell_type, proxy = types.FunctionType, types.CodeType, types.CellType, types.MappingProxyType

    class Pickler(pickle.Pickler):
        def __init__(self, file, namespace):
            super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
            self.namespace = namespace
            self.sentinels = _sentinels()

        def reducer_override(self, obj):
            if obj is self.namespace:
                return _namespace, ()
            kind = type(obj)
            if kind is types.ModuleType:
                return _module_reduce(obj)
            if kind is function:
                return NotImplemented if _importable(obj) else _function_reduce(obj, self.namespace, marshal)
            if kind is type:
                return NotImplemented if _importable(obj) else _class_reduce(obj)
            if isinstance(obj, type) and not _importable(obj):
                raise Unkept("class %s has the metaclass %s, which a snapshot does not keep" % (
                    obj.__qualname__, type(obj).__qualname__))
            if kind is proxy:
                return _proxy, (dict(obj),)
            if kind is classmethod or kind is staticmethod:
                return kind, (obj.__func__,)
            if kind is property:
                return property, (obj.fget, obj.fset, obj.fdel, obj.__doc__)
            if kind is code_type:
                return _code, (marshal.dumps(obj),)
            if kind is cell_type:
                raise Unkept("a closure's cell outside its function")
            name = self.sentinels.get(id(obj))
            if name is not None:
                return getattr, (sys.modules[name[0]], name[1])
            return NotImplemented

    return Pickler


def _sentinels():
    """Module-level markers compared by identity (`field.default is MISSING`): kept by name."""
    found = {}
    dataclasses = sys.modules.get("dataclasses")
    if dataclasses is not None:
        for name in ("MISSING", "KW_ONLY", "_FIELD", "_FIELD_CLASSVAR", "_FIELD_INITVAR",
                     "_HAS_DEFAULT_FACTORY", "_EMPTY_METADATA"):
            if hasattr(dataclasses, name):
                found[id(getattr(dataclasses, name))] = ("dataclasses", name)
    return found


def _importable(obj):
    """Whether pickle can name `obj` (a function or class) and find this very object again."""
    module = getattr(obj, "__module__", None)
    if module == "__main__" or type(module) is not str:
        return False
    found = sys.modules.get(module)
    for part in getattr(obj, "__qualname__", "<none>").split("."):
        if found is None or part == "<locals>":
            return False
        found = getattr(found, part, None)
    return found is obj


def _module_reduce(module):
    name = getattr(module, "__name__", None)
    if type(name) is not str or sys.modules.get(name) is not module:
        raise Unkept("module %r was not imported (made in a cell?)" % (name,))
    return _import, (name,)


class _Call:
    """Pickled as the call `fn(*args)`: how a function's globals are named (pickle keeps a dict by
    value, and would copy the namespace)."""

    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def _globals_of(func, namespace):
    """How a function's globals are kept: the namespace, a loaded module's, or (any other dict) a
    fresh one given the names the code reads."""
    found = func.__globals__
    if found is namespace:
        return _Call(_namespace, ()), None
    module = sys.modules.get(func.__module__) if type(func.__module__) is str else None
    if module is not None and getattr(module, "__dict__", None) is found:
        return _Call(_module_dict, (func.__module__,)), None
    for name, module in list(sys.modules.items()):
        if getattr(module, "__dict__", None) is found:
            return _Call(_module_dict, (name,)), None
    names = set()
    _names(func.__code__, names)
    read = {n: found[n] for n in names if n in found}
    if "__builtins__" in found:
        read["__builtins__"] = found["__builtins__"]
    return _Call(_fresh_dict, ()), read


def _names(code, into):
    into.update(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            _names(const, into)


def _function_reduce(func, namespace, marshal):
    where, read = _globals_of(func, namespace)
    cells = func.__closure__ or ()
    state = {
        "defaults": func.__defaults__,
        "kwdefaults": func.__kwdefaults__,
        "closure": [_cell_value(c) for c in cells],
        "dict": func.__dict__,
        "annotations": func.__annotations__,
        "qualname": func.__qualname__,
        "module": func.__module__,
        "doc": func.__doc__,
        "globals": read,
    }
    if hasattr(func, "__type_params__"):
        state["type_params"] = func.__type_params__
    args = (marshal.dumps(func.__code__), where, func.__name__, len(cells) if func.__closure__ is not None else None)
    return _make_function, args, state, None, None, _function_setstate


class _Empty:
    """An empty closure cell's stand-in (a class: pickle keeps it by name, so it stays itself)."""


def _cell_value(cell):
    try:
        return cell.cell_contents
    except ValueError:
        return _Empty


def _class_reduce(cls):
    attrs = dict(vars(cls))
    for name in ("__dict__", "__weakref__"):
        attrs.pop(name, None)
    made = {"__module__": attrs.pop("__module__", "__main__"), "__qualname__": cls.__qualname__,
            "__doc__": attrs.pop("__doc__", None)}
    slots = attrs.pop("__slots__", None)
    if slots is not None:
        made["__slots__"] = slots
        for slot in [slots] if isinstance(slots, str) else slots:
            attrs.pop(slot, None)  # the member descriptors the new class makes itself
    return _make_class, (cls.__name__, cls.__bases__, made), attrs, None, None, _class_setstate


# ---- what the pickle calls when it is loaded (in the session's sandbox) ----


def _namespace():
    namespace = _target[0]
    if namespace is None:
        raise ValueError("a snapshot is loaded only into a session's namespace")
    return namespace


def _import(name):
    import importlib

    return importlib.import_module(name)


def _module_dict(name):
    return vars(_import(name))


def _fresh_dict():
    return {}


def _proxy(mapping):
    import types

    return types.MappingProxyType(mapping)


def _code(data):
    import marshal

    return marshal.loads(data)


def _make_function(code, globals_, name, cells):
    import marshal
    import types

    closure = None if cells is None else tuple(types.CellType() for _ in range(cells))
    return types.FunctionType(marshal.loads(code), globals_, name, None, closure)


def _function_setstate(func, state):
    read = state.get("globals")
    if read:
        func.__globals__.update(read)
    func.__defaults__ = state["defaults"]
    func.__kwdefaults__ = state["kwdefaults"]
    for cell, value in zip(func.__closure__ or (), state["closure"]):
        if value is not _Empty:
            cell.cell_contents = value
    func.__dict__.update(state["dict"])
    func.__annotations__ = state["annotations"]
    func.__qualname__ = state["qualname"]
    func.__module__ = state["module"]
    func.__doc__ = state["doc"]
    if "type_params" in state:
        func.__type_params__ = state["type_params"]


def _make_class(name, bases, made):
    return type(name, bases, dict(made))


def _class_setstate(cls, attrs):
    for name, value in attrs.items():
        setattr(cls, name, value)
