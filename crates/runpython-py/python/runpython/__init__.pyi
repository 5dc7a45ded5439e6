"""Type stubs for runpython (the native engine and the pure-Python helpers it is re-exported with)."""

import datetime
import os
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator, Iterator, Mapping, Sequence
from typing import Any, Generic, Literal, ParamSpec, TypedDict, TypeVar, final, overload

__all__ = [
    "Artifact",
    "CancelledError",
    "ConfigError",
    "Envelope",
    "ErrorInfo",
    "Event",
    "InternalError",
    "InterpreterError",
    "InvalidInputError",
    "RunHandle",
    "RunPython",
    "RunPythonError",
    "SandboxError",
    "Session",
    "StoreError",
    "Suspend",
    "Tool",
    "__version__",
    "current_call_id",
    "tool",
]

__version__: str

_P = ParamSpec("_P")
_R = TypeVar("_R")

_Json = Any
"""A JSON value as Python sees it: dict (str keys), list, str, int, float, bool or None."""

_Seconds = float | int | datetime.timedelta
_Status = Literal["success", "error", "timeout", "suspended"]
_ToolFormat = Literal["anthropic", "openai", "mcp"]

class RunPythonError(Exception):
    """Base class of runpython's own failures; what the code does is an envelope, never one of these."""

class ConfigError(RunPythonError):
    """A keyword argument of RunPython is wrong, or an operation needs a setting (a store)."""

class InvalidInputError(RunPythonError):
    """A request is malformed: an input that is not JSON or not an identifier, an unknown run."""

class SandboxError(RunPythonError):
    """The sandboxed child could not be started or supervised, or a required layer is missing."""

class StoreError(RunPythonError):
    """The store failed: keeping a run, reading an artifact or a checkpoint."""

class InterpreterError(RunPythonError):
    """No usable Python interpreter for the sandboxed child."""

class CancelledError(RunPythonError):
    """The run was cancelled through its handle."""

class InternalError(RunPythonError):
    """A bug in runpython."""

@final
class ErrorInfo:
    """What went wrong in a run: the exception the code raised, or one of runpython's kinds."""

    @property
    def type(self) -> str: ...
    @property
    def message(self) -> str: ...
    @property
    def traceback(self) -> str | None: ...
    @property
    def exit_code(self) -> int | None: ...
    @property
    def signal(self) -> int | None: ...
    def to_dict(self) -> dict[str, Any]: ...

@final
class Artifact:
    """Something a kept run stored; read its bytes with RunPython.get_run_artifact(id)."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> Literal["script", "stdout", "stderr", "return_value", "file"]: ...
    @property
    def bytes(self) -> int: ...
    @property
    def preview(self) -> str: ...
    def to_dict(self) -> dict[str, Any]: ...

class _Image(TypedDict):
    display: int
    mime: str
    data: str

@final
class Envelope:
    """What a run returned (envelope v1)."""

    @property
    def status(self) -> _Status: ...
    @property
    def ok(self) -> bool: ...
    @property
    def return_value(self) -> Any:
        """The value exactly: tuples, sets, frozensets, bytes, dates and times with their zones,
        timedelta, Decimal, UUID, complex, paths, dataclasses and NamedTuples (their own class when it
        is loaded here, else a dict with "__class__"), dicts with any keys; else the JSON form."""
    @property
    def return_json(self) -> _Json:
        """The value as the JSON envelope shows it to a model (ISO dates, base64 bytes, lists)."""
    @property
    def return_type(self) -> str | None: ...
    @property
    def return_preview(self) -> dict[str, Any] | None: ...
    @property
    def stdout(self) -> str: ...
    @property
    def stderr(self) -> str: ...
    @property
    def truncated(self) -> dict[str, Any] | None: ...
    @property
    def error(self) -> ErrorInfo | None: ...
    @property
    def artifacts(self) -> list[Artifact]: ...
    @property
    def run_id(self) -> str: ...
    @property
    def cached(self) -> bool: ...
    @property
    def duration_ms(self) -> int: ...
    @property
    def suspension(self) -> dict[str, Any] | None: ...
    @property
    def isolation(self) -> dict[str, Any] | None: ...
    @property
    def dependencies(self) -> dict[str, Any] | None:
        """What the run's environment holds (`installed`) or what an install refused (`refused`)."""
    @property
    def displays(self) -> list[dict[str, Any]]:
        """What the code displayed (`display(obj)`, rich last values, matplotlib figures), in order:
        each `{"formats": {mime: text, or {"file", "bytes", "width", "height", "artifact_id"}}}`."""
    @property
    def images(self) -> list[_Image]:
        """The displayed images that fit the engine's `max_image_bytes`, inline (base64); never in
        `to_dict`/`to_json`, which link them by artifact id."""
    @property
    def network(self) -> dict[str, Any] | None:
        """With a network policy, when the run used the network: `mode`, `connections`, `bytes_out`,
        `bytes_in`, `lookups`, and the first `refused` (host, port, reason)."""
    @property
    def session_id(self) -> str | None:
        """The session a cell ran in; None for a run of its own."""
    @property
    def cell(self) -> int | None:
        """The cell's number in its session, from 1; None for a run of its own."""
    @property
    def restored(self) -> bool:
        """True when the session was rebuilt from the store (its snapshot loaded, cells replayed) before
        this cell ran."""
    @property
    def restore(self) -> dict[str, Any] | None:
        """With `restored`: how the session came back ("from": "snapshot" or "replay", "snapshot_cells",
        "replayed", "why", "ms", "snapshot_ms"); None otherwise."""
    @property
    def return_repr(self) -> str | None:
        """The value as a REPL prints it, when the cell asked for it (`repr=True`)."""
    @property
    def kept(self) -> bool:
        """False when the store failed to keep the run after the code ran; `store_error` says how."""
    @property
    def store_error(self) -> str | None: ...
    def to_dict(self) -> dict[str, Any]:
        """The v1 JSON as a dict; the session fields, `kept` and `store_error` only where they apply."""
    def to_json(self, indent: int | None = None) -> str: ...

@final
class Event:
    """One event of a started run."""

    @property
    def kind(
        self,
    ) -> Literal["stdout", "stderr", "dependencies", "resumable", "tool_call", "tool_result", "other"]: ...
    @property
    def text(self) -> str | None: ...
    @property
    def data(self) -> dict[str, Any] | None: ...

@final
class RunHandle:
    """A run in progress: iterate it for events, wait or await it for the envelope, cancel it."""

    def __iter__(self) -> Iterator[Event]: ...
    def __next__(self) -> Event: ...
    def __aiter__(self) -> AsyncIterator[Event]: ...
    def __anext__(self) -> Awaitable[Event]: ...
    def __await__(self) -> Generator[Any, None, Envelope]: ...
    def cancel(self) -> None: ...
    def wait(self) -> Envelope: ...

class _PoolSettings(TypedDict, total=False):
    size: int
    idle: _Seconds
    warm_imports: list[str]
    prestart: bool
    templates: bool

class _SessionSettings(TypedDict, total=False):
    max_live: int
    idle: _Seconds
    snapshot_max_bytes: int
    replay_budget: _Seconds

class _NetworkSettings(TypedDict, total=False):
    allow: Sequence[str]
    public: bool
    resolve: Mapping[str, str]

class _SecretSettings(TypedDict, total=False):
    value: str
    hosts: Sequence[str]
    in_query: bool
    body_limit: int
    over_http: bool

class _SandboxSettings(TypedDict, total=False):
    memory: int | str
    disk: int | str
    max_processes: int
    cpus: float
    namespaces: bool
    landlock: bool
    rlimits: bool
    seccomp: bool
    drop_privileges: bool
    require: bool
    allow_network: bool
    memory_bytes: int
    run_memory_bytes: int
    disk_bytes: int
    cgroups: bool
    file_size_bytes: int
    open_files: int
    processes: int
    read_paths: list[str]

class Tool(Generic[_P, _R]):
    """A callable with the name and description the code sees it under, and whether it is pure."""

    function: Callable[_P, _R]
    name: str | None
    description: str | None
    pure: bool
    def __init__(
        self,
        function: Callable[_P, _R],
        *,
        name: str | None = None,
        description: str | None = None,
        pure: bool = False,
    ) -> None: ...
    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R: ...

@overload
def tool(
    function: Callable[_P, _R], /, *, name: str | None = None, description: str | None = None, pure: bool = False
) -> Tool[_P, _R]: ...
@overload
def tool(
    function: None = None, /, *, name: str | None = None, description: str | None = None, pure: bool = False
) -> Callable[[Callable[_P, _R]], Tool[_P, _R]]: ...

def current_call_id() -> str | None:
    """Inside a tool (and whatever it calls): the call's idempotency key, `<run id>.<ordinal>`, the same
    when a resumed run or a restored session makes the call again. None outside a tool call."""

class Suspend(Exception):
    """Raised by a tool to suspend the run until someone decides; resume() supplies the decision,
    which the call then returns."""

    request: _Json
    def __init__(self, request: _Json = None) -> None: ...

@final
class RunPython:
    """Runs LLM-authored Python in a sandboxed CPython subprocess and returns an Envelope."""

    def __new__(
        cls,
        *,
        timeout: _Seconds | None = None,
        tools: Sequence[Callable[..., Any]] | None = None,
        store: str | None = None,
        tier: Literal["ephemeral", "persistent"] | _Seconds | None = None,
        memo: bool | _Seconds | None = None,
        dependencies: Sequence[str] | None = None,
        warm: Sequence[str | Sequence[str]] | None = None,
        auto_deps: bool | None = None,
        approvals: Sequence[str] | None = None,
        durable: bool | None = None,
        allow_network: bool | None = None,
        network: Literal["off", "public", "host"] | Sequence[str] | _NetworkSettings | None = None,
        python: str | os.PathLike[str] | None = None,
        max_output_chars: int | None = None,
        max_code_chars: int | None = None,
        max_return_bytes: int | None = None,
        inline_return_bytes: int | None = None,
        envelope_budget: int | None = None,
        env_passthrough: Sequence[str] | None = None,
        max_tool_calls: int | None = None,
        tool_call_timeout: _Seconds | None = None,
        max_suspensions: int | None = None,
        max_frame_bytes: int | None = None,
        env_root: str | os.PathLike[str] | None = None,
        prepare_timeout: _Seconds | None = None,
        allow_nested: int | None = None,
        pool: bool | int | _PoolSettings | None = None,
        sandbox: bool | _SandboxSettings | None = None,
        sessions: _SessionSettings | None = None,
        allow_source_builds: bool | None = None,
        allowed_packages: Sequence[str] | None = None,
        install_sandbox: bool | _SandboxSettings | None = None,
        secrets: Mapping[str, tuple[str, Sequence[str]] | _SecretSettings] | None = None,
        upstream_cas: Sequence[str] | None = None,
    ) -> RunPython: ...
    def run(
        self,
        code: str,
        *,
        inputs: Mapping[str, _Json] | None = None,
        dependencies: Sequence[str] | None = None,
        input_artifacts: Mapping[str, str] | None = None,
        memo: bool = True,
        env: Mapping[str, str] | None = None,
        files: Mapping[str, bytes | str | os.PathLike[str]] | None = None,
    ) -> Envelope:
        """Runs `code` to its end with the GIL released and returns the envelope; what the code does
        (raise, time out, exit) is its status, never an exception. `async def` tools run on a private
        event loop thread (this call blocks the caller's loop, if any); plain ones on worker threads.
        `env` sets environment variables for this run only (str to str; masked wherever the run is
        kept, never stored). `files` puts files in the run's working directory, read-only: bytes, or
        a path on this side read before the run."""

    def arun(
        self,
        code: str,
        *,
        inputs: Mapping[str, _Json] | None = None,
        dependencies: Sequence[str] | None = None,
        input_artifacts: Mapping[str, str] | None = None,
        memo: bool = True,
        env: Mapping[str, str] | None = None,
        files: Mapping[str, bytes | str | os.PathLike[str]] | None = None,
    ) -> Coroutine[Any, Any, Envelope]:
        """`run` for asyncio: a coroutine that holds no thread while it waits; `async def` tools run on
        the caller's event loop. Cancelling the awaiting task stops the run and kills its processes."""

    def start(
        self,
        code: str,
        *,
        inputs: Mapping[str, _Json] | None = None,
        dependencies: Sequence[str] | None = None,
        input_artifacts: Mapping[str, str] | None = None,
        memo: bool = True,
        env: Mapping[str, str] | None = None,
        files: Mapping[str, bytes | str | os.PathLike[str]] | None = None,
    ) -> RunHandle:
        """Starts `code`: iterate the handle (`for` / `async for`) for stdout, stderr, dependency and
        tool-call events, `wait()` or `await` it for the envelope, `cancel()` it to stop the run."""

    def session(self, id: str | None = None) -> Session:
        """A session: cells run in one long-lived sandboxed interpreter that keeps their state. `id`
        names one (the same id on an engine sharing the store restores it); None: a new one."""

    def resume(self, run_id: str, decisions: Mapping[str, _Json]) -> Envelope:
        """Continues a suspended run: `decisions` maps suspension ids (`envelope.suspension["id"]`)
        to the values the suspended calls return."""

    def aresume(self, run_id: str, decisions: Mapping[str, _Json]) -> Coroutine[Any, Any, Envelope]: ...
    def warm_up(self) -> None:
        """Prepares the `warm=` environments now (installs them, starts their templates) rather than at
        the first run within each; raises `DependencyError` when an install fails."""
    def pending_suspensions(self, run_id: str) -> list[str]: ...
    def tool_spec(self, format: _ToolFormat = "anthropic") -> list[dict[str, Any]]:
        """The tools a model is given (`run_python`, `get_run_artifact`, `resume`) in a provider's
        shape; `run_python`'s description lists the stubs of this engine's tools."""

    def handle_tool_call(self, name: str, arguments: Mapping[str, _Json] | str | None = None) -> _Json:
        """Answers a model's call of one of `tool_spec`'s tools (`arguments`: a dict or its JSON text);
        `run_python` gives the envelope as a dict whatever its status. Bad calls raise InvalidInputError."""

    def ahandle_tool_call(
        self, name: str, arguments: Mapping[str, _Json] | str | None = None
    ) -> Coroutine[Any, Any, _Json]: ...
    def handle_tool_call_content(
        self,
        name: str,
        arguments: Mapping[str, _Json] | str | None = None,
        format: Literal["anthropic", "openai", "mcp"] = "anthropic",
    ) -> list[dict[str, Any]]:
        """`handle_tool_call` as tool-result content blocks in the provider's shape: the result as
        text, then each displayed image (within `max_image_bytes`) as an image block."""

    def ahandle_tool_call_content(
        self,
        name: str,
        arguments: Mapping[str, _Json] | str | None = None,
        format: Literal["anthropic", "openai", "mcp"] = "anthropic",
    ) -> Coroutine[Any, Any, list[dict[str, Any]]]: ...
    def get_run_artifact(self, id: str) -> bytes: ...
    def tenant(self, name: str, *, max_stored_bytes: int | None = None) -> RunPython:
        """This engine for tenant `name`: its runs, artifacts, checkpoints, sessions and memo entries
        are the tenant's own, and another tenant's ids read like missing ones. Over
        `max_stored_bytes` kept, runs still run and are not kept (`envelope.kept` is False)."""

    @property
    def tenant_name(self) -> str | None: ...
    def isolation_report(self) -> dict[str, Any]: ...
    @property
    def tools(self) -> list[str]: ...
    @property
    def timeout(self) -> float: ...

@final
class Session:
    """State kept across cells in one long-lived sandboxed interpreter (`RunPython.session()`). Use it
    as a context manager (`with` / `async with`) to close it on exit."""

    @property
    def id(self) -> str: ...
    def run(
        self,
        code: str,
        *,
        inputs: Mapping[str, _Json] | None = None,
        dependencies: Sequence[str] | None = None,
        input_artifacts: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        repr: bool = False,
        files: Mapping[str, bytes | str | os.PathLike[str]] | None = None,
    ) -> Envelope:
        """Runs a cell to its end; its envelope has `session_id`, `cell` and `restored`. `repr=True`
        also returns the value as a REPL prints it (`return_repr`)."""

    def arun(
        self,
        code: str,
        *,
        inputs: Mapping[str, _Json] | None = None,
        dependencies: Sequence[str] | None = None,
        input_artifacts: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        repr: bool = False,
        files: Mapping[str, bytes | str | os.PathLike[str]] | None = None,
    ) -> Coroutine[Any, Any, Envelope]: ...
    def start(
        self,
        code: str,
        *,
        inputs: Mapping[str, _Json] | None = None,
        dependencies: Sequence[str] | None = None,
        input_artifacts: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        repr: bool = False,
        files: Mapping[str, bytes | str | os.PathLike[str]] | None = None,
    ) -> RunHandle: ...
    def reset(self) -> None:
        """Forgets the state (the interpreter is killed, the record removed); the next cell is cell 1."""

    def areset(self) -> Coroutine[Any, Any, None]: ...
    def close(self) -> None:
        """Ends the session (like reset, and the engine forgets the id); a cell after it starts a new,
        empty session under the same id."""

    def aclose(self) -> Coroutine[Any, Any, None]: ...
    def __enter__(self) -> Session: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> Literal[False]: ...
    def __aenter__(self) -> Coroutine[Any, Any, Session]: ...
    def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> Coroutine[Any, Any, Literal[False]]: ...
