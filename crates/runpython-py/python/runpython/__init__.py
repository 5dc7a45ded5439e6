"""runpython: run the Python an AI agent writes in a sandbox, with your own functions as its tools.

    from runpython import RunPython

    def lookup(city: str) -> dict:
        \"\"\"Weather for a city.\"\"\"
        return {"city": city, "temp_c": 21}

    rp = RunPython(timeout=10, tools=[lookup])
    envelope = rp.run("lookup('Paris')['temp_c'] * 2")
    envelope.return_value  # 42

The engine is Rust (`runpython._runpython`); this package re-exports it with the pure-Python parts:
`tool` (naming a callable, declaring it pure) and `Suspend` (a tool asking for a human decision).
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
    StoreError,
    __version__,
)
from runpython._tools import Suspend, Tool, tool

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
    "StoreError",
    "Suspend",
    "Tool",
    "__version__",
    "tool",
]
