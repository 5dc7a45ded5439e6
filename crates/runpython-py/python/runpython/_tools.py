"""Python callables as runpython tools.

`describe(obj)` turns a callable (or a `Tool`) into what the engine needs: the name the code calls it by,
its description (the docstring), a JSON Schema of its parameters built from the signature and the type
hints, whether it is a coroutine function, and an invoker. The invoker checks each call's arguments
against the hints before the callable runs (a mismatch raises TypeError or ValueError in the sandboxed
code) and turns the result into JSON.

Hints understood: int, float, str, bool, None, list[X], tuple[X, ...], tuple[X, Y], set[X], dict[str, X],
Optional / Union / X | Y, Literal[...], Enum subclasses, dataclasses, TypedDicts, Annotated[X, "what it
is"] (the text becomes the parameter's description), Any; pydantic models (and anything pydantic's
TypeAdapter understands) when pydantic is installed. A parameter without a hint, or with one outside that
list, is passed through unchecked.

The engine (Rust) calls `Invoker.call` for plain callables, on a worker thread, and `Invoker.submit` for
coroutine functions, which schedules the call on an asyncio loop and reports the finished task. Either way
the call runs in its own copy of the caller's `contextvars` context, where `current_call_id()` is the
call's idempotency key.
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextvars
import dataclasses
import datetime
import decimal
import enum
import functools
import inspect
import os
import pathlib
import threading
import types
import typing
import uuid
from typing import Any, Callable, Generic, ParamSpec, TypeVar, overload

P = ParamSpec("P")
R = TypeVar("R")

_EMPTY = inspect.Parameter.empty
_NoneType: Any = type(None)
_UNION_TYPES: tuple[Any, ...] = (typing.Union, types.UnionType)
_SEQUENCES = (list, collections.abc.Sequence, collections.abc.MutableSequence, collections.abc.Iterable)
_MAPPINGS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)

# A conversion: the checked (and converted) value, or TypeError / ValueError naming `where`.
Convert = Callable[[Any, str], Any]


_CALL_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("runpython_call_id", default=None)


def current_call_id() -> str | None:
    """The idempotency key of the tool call being served, inside a tool (and whatever it calls):
    `<run id>.<ordinal>`, the same when a resumed run or a restored session makes the call again, so a
    tool with side effects can tell a repeated call from a new one. None outside a tool call."""
    return _CALL_ID.get()


class Suspend(Exception):
    """Raised by a tool to suspend the run until someone decides.

    `request` (a JSON value) is what the envelope's `suspension` shows. `RunPython.resume(run_id,
    {suspension_id: decision})` runs the code again, replaying the calls it made, and this call then
    returns `decision`. Needs an engine with a store.
    """

    def __init__(self, request: Any = None) -> None:
        super().__init__(request)
        self.request = request


class Tool(Generic[P, R]):
    """A callable with the name and description the code sees it under, and whether it is pure (its
    result depends only on its arguments and it changes nothing, so runs calling only pure tools may be
    memoized). Calling the `Tool` calls the function."""

    def __init__(
        self,
        function: Callable[P, R],
        *,
        name: str | None = None,
        description: str | None = None,
        pure: bool = False,
    ) -> None:
        if not callable(function):
            raise TypeError(f"a tool must be callable, got {type(function).__name__}")
        self.function = function
        self.name = name
        self.description = description
        self.pure = pure
        functools.update_wrapper(self, function)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tool({_tool_name(self.function, self.name)!r})"


@overload
def tool(function: Callable[P, R], /, *, name: str | None = None, description: str | None = None,
         pure: bool = False) -> Tool[P, R]: ...


@overload
def tool(function: None = None, /, *, name: str | None = None, description: str | None = None,
         pure: bool = False) -> Callable[[Callable[P, R]], Tool[P, R]]: ...


def tool(function: Any = None, /, *, name: str | None = None, description: str | None = None,
         pure: bool = False) -> Any:
    """Names a callable for the code, or overrides its description, or declares it pure:
    `@tool`, `@tool(name="search", pure=True)`, or `tool(fn, name="search")`."""
    if function is None:
        return lambda f: Tool(f, name=name, description=description, pure=pure)
    return Tool(function, name=name, description=description, pure=pure)


@dataclasses.dataclass(frozen=True)
class Described:
    """What the engine reads from a tool."""

    name: str
    description: str
    schema: dict[str, Any]
    is_async: bool
    pure: bool
    invoker: Invoker


def describe(obj: Any) -> Described:
    """The name, description, schema and invoker of a tool (a callable or a `Tool`)."""
    name = description = None
    pure = False
    if isinstance(obj, Tool):
        name, description, pure, obj = obj.name, obj.description, obj.pure, obj.function
    if not callable(obj):
        raise TypeError(f"a tool must be callable, got {type(obj).__name__}")
    name = _tool_name(obj, name)
    if not name.isidentifier():
        raise TypeError(
            f"{name!r} is not a name the code can call; give it one with runpython.tool(fn, name='...')"
        )
    if description is None:
        description = inspect.getdoc(obj) or ""
    try:
        signature = inspect.signature(obj, eval_str=True)
    except NameError as exc:
        raise TypeError(
            f"the type hints of {name} cannot be evaluated: {exc} (define the types they name at module level)"
        ) from None
    except ValueError as exc:  # builtins without a signature
        raise TypeError(f"{name} has no inspectable signature: {exc}") from None
    defs: dict[str, Any] = {}
    properties: dict[str, Any] = {}
    required: list[str] = []
    params: list[_Param] = []
    for p in signature.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            raise TypeError(
                f"{name} takes *{p.name}: the code calls tools with named arguments, so give it named "
                "parameters instead"
            )
        if p.kind is p.VAR_KEYWORD:
            continue  # not exposed: the code's signature has only the named parameters
        param_schema, convert = _converter(p.annotation, defs)
        prop = dict(param_schema)
        param = _Param(p.name, convert, p.kind is p.POSITIONAL_ONLY)
        if p.default is _EMPTY:
            required.append(p.name)
        else:
            param.has_default = True
            param.default = p.default
            json_default = _json_default(p.default)
            if json_default is _NOT_JSON:
                param.omit_if_none = True  # the code sends None; the Python default applies
            else:
                prop["default"] = json_default
                param.json_default = json_default
        properties[p.name] = prop
        params.append(param)
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    if defs:
        schema["$defs"] = defs
    is_async = _is_coroutine_function(obj)
    return Described(name, description, schema, is_async, bool(pure), Invoker(obj, name, params))


def _tool_name(function: Any, name: str | None) -> str:
    if name is not None:
        return name
    target = function.func if isinstance(function, functools.partial) else function
    found = getattr(target, "__name__", None)
    if not isinstance(found, str):
        found = type(target).__name__
    return found


def _is_coroutine_function(function: Any) -> bool:
    if inspect.iscoroutinefunction(function):
        return True
    call = getattr(function, "__call__", None)  # noqa: B004 - a callable object's method
    return call is not None and not inspect.isroutine(function) and inspect.iscoroutinefunction(call)


class _NotJson:
    pass


_NOT_JSON: Any = _NotJson()


def _json_default(value: Any) -> Any:
    """A default as JSON (tuples as lists, enums by value), or `_NOT_JSON`."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value.value if isinstance(value, enum.Enum) else value
    if isinstance(value, enum.Enum):
        return _json_default(value.value)
    if isinstance(value, (list, tuple)):
        listed = [_json_default(v) for v in value]
        return _NOT_JSON if any(i is _NOT_JSON for i in listed) else listed
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        mapped = {k: _json_default(v) for k, v in value.items()}
        return _NOT_JSON if any(v is _NOT_JSON for v in mapped.values()) else mapped
    return _NOT_JSON


class _Param:
    __slots__ = ("name", "convert", "positional_only", "has_default", "default", "json_default", "omit_if_none")

    def __init__(self, name: str, convert: Convert | None, positional_only: bool) -> None:
        self.name = name
        self.convert = convert
        self.positional_only = positional_only
        self.has_default = False
        self.default: Any = None
        self.json_default: Any = _NOT_JSON
        self.omit_if_none = False


class Invoker:
    """Calls one tool: checks the arguments against the hints, calls, makes the result JSON."""

    __slots__ = ("function", "name", "params")

    def __init__(self, function: Callable[..., Any], name: str, params: list[_Param]) -> None:
        self.function = function
        self.name = name
        self.params = params

    def bind(self, kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """The call's positional and keyword arguments, checked and converted."""
        args: list[Any] = []
        named: dict[str, Any] = {}
        for p in self.params:
            if p.name not in kwargs:
                if p.has_default:
                    continue
                raise TypeError(f"{self.name}() missing required argument {p.name!r}")
            value = kwargs.pop(p.name)
            if p.omit_if_none and value is None:
                continue  # the Python default applies
            if p.has_default and type(value) is type(p.json_default) and value == p.json_default:
                value = p.default  # the Python default itself, not its JSON copy
            elif p.convert is not None:
                value = p.convert(value, f"{self.name}() argument {p.name!r}")
            if p.positional_only:
                args.append(value)
            else:
                named[p.name] = value
        if kwargs:
            raise TypeError(f"{self.name}() got an unexpected keyword argument {next(iter(kwargs))!r}")
        return args, named

    def call(self, kwargs: dict[str, Any], loop: asyncio.AbstractEventLoop, context: Any,
             call_id: str | None) -> Any:
        """A plain callable's call, on a worker thread, inside a copy of the caller's context."""
        args, named = self.bind(kwargs)
        context.run(_CALL_ID.set, call_id)
        result = context.run(self.function, *args, **named)
        if inspect.isawaitable(result):  # a plain callable that returned an awaitable
            # Scheduled from inside the call's context, so the task awaiting it runs in a copy of it.
            result = context.run(asyncio.run_coroutine_threadsafe, awaited(result), loop).result()
        return result

    def submit(self, kwargs: dict[str, Any], loop: asyncio.AbstractEventLoop, context: Any,
               call_id: str | None, done: Callable[[asyncio.Task[Any]], object]) -> AsyncCall:
        """A coroutine function's call, scheduled on `loop`; `done(task)` is called when it ends."""
        args, named = self.bind(kwargs)
        context.run(_CALL_ID.set, call_id)
        return AsyncCall(loop, context, functools.partial(self.function, *args, **named), done)

    def jsonable(self, value: Any) -> Any:
        """The callable's result as JSON values, converting what has an obvious JSON form."""
        return _jsonable(value, f"the value {self.name}() returned")


async def awaited(awaitable: typing.Awaitable[Any]) -> Any:
    """A coroutine awaiting `awaitable` (an asyncio task needs a coroutine)."""
    return await awaitable


async def ready(value: Any) -> Any:
    """A coroutine returning `value` at once (`Session.__aenter__`)."""
    return value


async def deferred(start: Callable[[], typing.Awaitable[Any]]) -> Any:
    """What `arun` and the other async methods return: a real coroutine, which starts the call when it is
    first awaited, inside the running loop. So `asyncio.run(rp.arun(...))` and
    `asyncio.create_task(rp.arun(...))` both work."""
    return await start()


class AsyncCall:
    """One call of a coroutine function on an event loop, cancellable from any thread."""

    __slots__ = ("_loop", "_start_call", "_done", "_task", "_cancelled")

    def __init__(self, loop: asyncio.AbstractEventLoop, context: Any, start: Callable[[], Any],
                 done: Callable[[asyncio.Task[Any]], object]) -> None:
        self._loop = loop
        self._start_call = start
        self._done = done
        self._task: asyncio.Task[Any] | None = None
        self._cancelled = False
        # Started in the caller's context: the coroutine and its task see its contextvars.
        loop.call_soon_threadsafe(self._start, context=context)

    def _start(self) -> None:
        if self._cancelled:
            return
        try:
            coroutine = self._start_call()
            self._task = self._loop.create_task(awaited(coroutine))
        except BaseException as exc:  # noqa: BLE001 - reported to the code like the call's own error
            failed: asyncio.Future[Any] = self._loop.create_future()
            failed.set_exception(exc)
            self._done(failed)  # type: ignore[arg-type]
            return
        self._task.add_done_callback(self._done)

    def cancel(self) -> None:
        """Cancels the call (the run stopped waiting for it); safe from any thread."""
        self._cancelled = True
        try:
            self._loop.call_soon_threadsafe(self._cancel_task)
        except RuntimeError:  # the loop is closed: nothing runs there any more
            pass

    def _cancel_task(self) -> None:
        if self._task is not None:
            self._task.cancel()


# --- hints to schemas and conversions ------------------------------------------------------------------


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _mismatch(where: str, expected: str, value: Any) -> TypeError:
    return TypeError(f"{where} must be {expected}, got {type(value).__name__} {_short(value)}")


def _converter(hint: Any, defs: dict[str, Any]) -> tuple[dict[str, Any], Convert | None]:
    """The JSON Schema of `hint` and the conversion checking a JSON value against it (None: no check)."""
    if hint is _EMPTY or hint is Any or hint is object:
        return {}, None
    if isinstance(hint, str):  # an annotation that stayed a string (eval_str could not reach it)
        return {}, None
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Annotated:
        schema, convert = _converter(args[0], defs)
        schema = dict(schema)
        for meta in args[1:]:
            text = meta if isinstance(meta, str) else getattr(meta, "description", None)
            if isinstance(text, str):
                schema["description"] = text
                break
        return schema, convert
    if hint is None or hint is _NoneType:
        return {"type": "null"}, _check_none
    if hint is bool:
        return {"type": "boolean"}, _check_bool
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum(hint)
    if hint is int:
        return {"type": "integer"}, _check_int
    if hint is float:
        return {"type": "number"}, _check_float
    if hint is str:
        return {"type": "string"}, _check_str
    if origin is typing.Literal:
        return _literal(args)
    if origin in _UNION_TYPES:
        return _union(args, defs)
    if hint in _SEQUENCES or hint is typing.List:
        return {"type": "array"}, _check_list
    if hint in (tuple, typing.Tuple):
        return {"type": "array"}, _make_tuple
    if hint in (set, frozenset, typing.Set):
        return {"type": "array", "uniqueItems": True}, _make_set
    if hint in _MAPPINGS or hint is typing.Dict:
        return {"type": "object"}, _check_dict
    if origin in _SEQUENCES:
        return _list_of(args[0] if args else Any, defs)
    if origin is tuple:
        return _tuple_of(args, defs)
    if origin in (set, frozenset, collections.abc.Set, collections.abc.MutableSet):
        schema, convert = _list_of(args[0] if args else Any, defs)
        schema["uniqueItems"] = True
        return schema, lambda v, where: _as_set(convert(list(v) if isinstance(v, (set, frozenset)) else v, where), where)
    if origin in _MAPPINGS:
        return _dict_of(args, defs)
    pydantic = _pydantic()
    if pydantic is not None and isinstance(hint, type) and issubclass(hint, pydantic.BaseModel):
        return _pydantic_model(hint, defs, pydantic)
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _dataclass(hint, defs)
    if typing.is_typeddict(hint):
        return _typed_dict(hint, defs)
    if pydantic is not None:
        return _pydantic_adapter(hint, defs, pydantic)
    return {}, None


def _check_none(value: Any, where: str) -> Any:
    if value is not None:
        raise _mismatch(where, "None", value)
    return value


def _check_bool(value: Any, where: str) -> Any:
    if not isinstance(value, bool):
        raise _mismatch(where, "a bool", value)
    return value


def _check_int(value: Any, where: str) -> Any:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _mismatch(where, "an int", value)
    return value


def _check_float(value: Any, where: str) -> Any:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise _mismatch(where, "a number", value)
    return float(value)


def _check_str(value: Any, where: str) -> Any:
    if not isinstance(value, str):
        raise _mismatch(where, "a str", value)
    return value


def _check_list(value: Any, where: str) -> Any:
    if isinstance(value, tuple):  # exact values: the code passed a tuple where a list is hinted
        return list(value)
    if not isinstance(value, list):
        raise _mismatch(where, "a list", value)
    return value


def _make_tuple(value: Any, where: str) -> Any:
    return value if type(value) is tuple else tuple(_check_list(value, where))


def _as_set(items: Any, where: str) -> Any:
    try:
        return set(items)
    except TypeError:
        raise TypeError(f"{where} must hold hashable items (str, int, float, bool, None)") from None


def _make_set(value: Any, where: str) -> Any:
    if isinstance(value, (set, frozenset)):
        return value
    return _as_set(_check_list(value, where), where)


def _check_dict(value: Any, where: str) -> Any:
    if not isinstance(value, dict):
        raise _mismatch(where, "a dict", value)
    return value


def _enum(hint: type[enum.Enum]) -> tuple[dict[str, Any], Convert]:
    values = [member.value for member in hint]

    def convert(value: Any, where: str) -> Any:
        if isinstance(value, hint):
            return value
        try:
            return hint(value)
        except ValueError:
            raise ValueError(f"{where} must be one of {values!r}, got {_short(value)}") from None

    return {"enum": values, "title": hint.__name__}, convert


def _literal(values: tuple[Any, ...]) -> tuple[dict[str, Any], Convert]:
    plain = [v.value if isinstance(v, enum.Enum) else v for v in values]

    def convert(value: Any, where: str) -> Any:
        for allowed, original in zip(plain, values):
            if type(value) is type(allowed) and value == allowed:
                return original
        raise ValueError(f"{where} must be one of {plain!r}, got {_short(value)}")

    schema: dict[str, Any] = {"enum": plain}
    kinds = {type(v) for v in plain}
    if len(kinds) == 1:
        json_type = {str: "string", int: "integer", float: "number", bool: "boolean"}.get(kinds.pop())
        if json_type:
            schema["type"] = json_type
    return schema, convert


def _union(options: tuple[Any, ...], defs: dict[str, Any]) -> tuple[dict[str, Any], Convert | None]:
    parts = [_converter(option, defs) for option in options]
    schemas = [schema for schema, _ in parts]
    if any(convert is None for _, convert in parts):
        return {"anyOf": schemas}, None  # one option takes anything
    converts = [convert for _, convert in parts if convert is not None]
    names = " or ".join(_hint_name(option) for option in options)

    def convert(value: Any, where: str) -> Any:
        errors = []
        for option in converts:
            try:
                return option(value, where)
            except (TypeError, ValueError) as exc:
                errors.append(exc)
        if all(isinstance(e, ValueError) for e in errors):
            raise errors[0]
        raise _mismatch(where, names, value)

    return {"anyOf": schemas}, convert


def _hint_name(hint: Any) -> str:
    if hint is _NoneType or hint is None:
        return "None"
    return getattr(hint, "__name__", None) or repr(hint).replace("typing.", "")


def _list_of(item: Any, defs: dict[str, Any]) -> tuple[dict[str, Any], Convert]:
    item_schema, item_convert = _converter(item, defs)
    schema: dict[str, Any] = {"type": "array", "items": item_schema}
    if item_convert is None:
        return schema, _check_list

    def convert(value: Any, where: str) -> Any:
        _check_list(value, where)
        return [item_convert(v, f"{where}[{i}]") for i, v in enumerate(value)]

    return schema, convert


def _tuple_of(args: tuple[Any, ...], defs: dict[str, Any]) -> tuple[dict[str, Any], Convert]:
    if len(args) == 2 and args[1] is Ellipsis:
        list_schema, list_convert = _list_of(args[0], defs)
        return list_schema, lambda v, where: tuple(list_convert(v, where))
    if args == ((),):  # tuple[()]
        args = ()
    parts = [_converter(a, defs) for a in args]
    schema = {"type": "array", "prefixItems": [s for s, _ in parts], "minItems": len(args),
              "maxItems": len(args)}

    def convert(value: Any, where: str) -> Any:
        _check_list(value, where)
        if len(value) != len(parts):
            raise ValueError(f"{where} must have {len(parts)} items, got {len(value)}")
        return tuple(c(v, f"{where}[{i}]") if c else v for i, (v, (_, c)) in enumerate(zip(value, parts)))

    return schema, convert


def _dict_of(args: tuple[Any, ...], defs: dict[str, Any]) -> tuple[dict[str, Any], Convert]:
    key, value_hint = (args + (Any, Any))[:2] if len(args) < 2 else args[:2]
    if key not in (str, Any):
        return {"type": "object"}, _check_dict  # JSON keys are strings: other key types pass unchecked
    value_schema, value_convert = _converter(value_hint, defs)
    schema = {"type": "object", "additionalProperties": value_schema}
    if value_convert is None:
        return schema, _check_dict

    def convert(value: Any, where: str) -> Any:
        _check_dict(value, where)
        return {k: value_convert(v, f"{where}[{k!r}]") for k, v in value.items()}

    return schema, convert


def _dataclass(hint: type, defs: dict[str, Any]) -> tuple[dict[str, Any], Convert]:
    hints = typing.get_type_hints(hint, include_extras=True)
    properties: dict[str, Any] = {}
    required: list[str] = []
    converts: dict[str, Convert | None] = {}
    for field in dataclasses.fields(hint):
        if not field.init:
            continue
        schema, converts[field.name] = _converter(hints.get(field.name, Any), defs)
        properties[field.name] = schema
        if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            required.append(field.name)
    schema = {"type": "object", "title": hint.__name__, "properties": properties, "required": required}

    def convert(value: Any, where: str) -> Any:
        if isinstance(value, hint):
            return value
        _check_dict(value, where)
        missing = [name for name in required if name not in value]
        if missing:
            raise TypeError(f"{where} is missing {', '.join(map(repr, missing))}")
        unknown = [name for name in value if name not in converts]
        if unknown:
            raise TypeError(f"{where} has no field {unknown[0]!r}")
        fields = {k: (converts[k](v, f"{where}[{k!r}]") if converts[k] else v) for k, v in value.items()}  # type: ignore[misc]
        return hint(**fields)

    return schema, convert


def _typed_dict(hint: Any, defs: dict[str, Any]) -> tuple[dict[str, Any], Convert]:
    hints = typing.get_type_hints(hint, include_extras=True)
    required_keys = set(getattr(hint, "__required_keys__", hints))
    parts = {name: _converter(h, defs) for name, h in hints.items()}
    schema = {"type": "object", "title": hint.__name__,
              "properties": {name: s for name, (s, _) in parts.items()},
              "required": [name for name in hints if name in required_keys]}

    def convert(value: Any, where: str) -> Any:
        _check_dict(value, where)
        missing = [name for name in hints if name in required_keys and name not in value]
        if missing:
            raise TypeError(f"{where} is missing {', '.join(map(repr, missing))}")
        out = {}
        for k, v in value.items():
            if k not in parts:
                raise TypeError(f"{where} has no key {k!r}")
            c = parts[k][1]
            out[k] = c(v, f"{where}[{k!r}]") if c else v
        return out

    return schema, convert


_PYDANTIC: Any = None


def _pydantic() -> Any:
    """The pydantic module when it is installed (version 2), imported on first need."""
    global _PYDANTIC
    if _PYDANTIC is None:
        try:
            import pydantic

            _PYDANTIC = pydantic if hasattr(pydantic, "TypeAdapter") else False
        except ImportError:
            _PYDANTIC = False
    return _PYDANTIC or None


def _hoist_defs(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Moves a sub-schema's `$defs` to the tool schema's root, where its `#/$defs/...` refs point."""
    schema = dict(schema)
    defs.update(schema.pop("$defs", {}))
    return schema


def _pydantic_model(hint: Any, defs: dict[str, Any], pydantic: Any) -> tuple[dict[str, Any], Convert]:
    schema = _hoist_defs(hint.model_json_schema(), defs)

    def convert(value: Any, where: str) -> Any:
        if isinstance(value, hint):
            return value
        try:
            return hint.model_validate(value)
        except pydantic.ValidationError as exc:
            raise ValueError(f"{where} is not a valid {hint.__name__}: {exc}") from None

    return schema, convert


def _pydantic_adapter(hint: Any, defs: dict[str, Any], pydantic: Any) -> tuple[dict[str, Any], Convert | None]:
    try:
        adapter = pydantic.TypeAdapter(hint)
        schema = _hoist_defs(adapter.json_schema(), defs)
    except Exception:  # noqa: BLE001 - a hint pydantic does not understand is passed through unchecked
        return {}, None

    def convert(value: Any, where: str) -> Any:
        try:
            return adapter.validate_python(value)
        except pydantic.ValidationError as exc:
            raise ValueError(f"{where} is not valid: {exc}") from None

    return schema, convert


# --- results to JSON -----------------------------------------------------------------------------------


def _jsonable(value: Any, where: str) -> Any:
    if value is None or type(value) in (str, bool, int, float):
        return value
    if isinstance(value, enum.Enum):
        return _jsonable(value.value, where)
    if isinstance(value, (str, bool, int, float)):  # subclasses
        return value
    pydantic = _pydantic()
    if pydantic is not None and isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name), where) for f in dataclasses.fields(value)}
    if isinstance(value, collections.abc.Mapping):
        return {_json_key(k, where): _jsonable(v, where) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, where) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [_jsonable(v, where) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, (uuid.UUID, decimal.Decimal, pathlib.PurePath)):
        return str(value)
    raise TypeError(
        f"{where} is a {type(value).__name__}, which is not JSON: return dicts, lists, str, int, float, "
        "bool or None (pydantic models, dataclasses, enums, sets, dates and UUIDs are converted)"
    )


def _json_key(key: Any, where: str) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, enum.Enum):
        return _json_key(key.value, where)
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, (int, float)) or key is None:
        return "null" if key is None else str(key)
    raise TypeError(f"{where} has a dict key of type {type(key).__name__}; JSON keys are strings")


# --- the private loop for sync runs --------------------------------------------------------------------

_private: asyncio.AbstractEventLoop | None = None
_private_lock = threading.Lock()


def private_loop() -> asyncio.AbstractEventLoop:
    """The loop `async def` tools run on during sync calls (`run`, `resume`, `handle_tool_call`): one per
    process, on a daemon thread started on first use. A sync call may come from inside a running loop,
    which it blocks; a tool scheduled there would never run, so sync calls never use the caller's loop."""
    global _private
    with _private_lock:
        if _private is None or _private.is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="runpython-tools-loop", daemon=True)
            thread.start()
            _private = loop
        return _private


def _forget_private_loop() -> None:
    global _private, _private_lock
    _private = None  # its thread did not survive the fork
    _private_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_private_loop)
