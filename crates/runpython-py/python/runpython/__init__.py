"""runpython: run the Python an AI agent writes in a sandbox, with your own functions as its tools.

    from runpython import RunPython

    def lookup(city: str) -> dict:
        \"\"\"Weather for a city.\"\"\"
        return {"city": city, "temp_c": 21}

    rp = RunPython(timeout=10, tools=[lookup])
    envelope = rp.run("lookup('Paris')['temp_c'] * 2")
    envelope.return_value  # 42

Sessions keep state across cells in one sandboxed interpreter:

    with rp.session() as s:
        s.run("rows = [1, 2, 3]")
        s.run("sum(rows)").return_value  # 6

The engine is Rust (`runpython._runpython`); this package re-exports it with the pure-Python parts:
`tool` (naming a callable, declaring it pure), `Suspend` (a tool asking for a human decision) and
`current_call_id` (inside a tool: the call's idempotency key).
"""

from runpython._runpython import (
    Artifact,
    CancelledError,
    ConfigError,
    Envelope,
    ErrorInfo,
    Event,
    InternalError,
    InterpreterError,
    InvalidInputError,
    RunHandle,
    RunPython,
    RunPythonError,
    SandboxError,
    Session,
    StoreError,
    __version__,
)
from runpython._tools import Suspend, Tool, current_call_id, tool

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
