"""runpython as FastMCP CodeMode's sandbox: `CodeMode(sandbox_provider=RunPythonSandbox())`.

    from fastmcp import FastMCP
    from fastmcp.experimental.transforms.code_mode import CodeMode
    from runpython.integrations.fastmcp import RunPythonSandbox

    mcp = FastMCP("shop", transforms=[CodeMode(sandbox_provider=RunPythonSandbox(timeout=30))])

    @mcp.tool
    def price(item: str) -> float: ...

    mcp.run()

`RunPythonSandbox` implements CodeMode's `SandboxProvider` (`async run(code, *, inputs, external_functions)`):
the model's code runs in runpython's sandbox (a CPython subprocess under every isolation layer, not an
interpreter in the server's process), `inputs` are its globals, and the external functions (CodeMode's
`call_tool`, which calls the server's own tools) are runpython tools: they run in the server, reached from
the code through the bridge with `await call_tool(...)`. The code may end with a top-level `return`, as
CodeMode's description tells the model to; its value (else the last expression's) is the result. An
exception in the code, a timeout or a failed tool call raises FastMCP's `ToolError` with the type, message
and traceback, which the MCP client sees as the tool's error. Images the code displays come back as MCP
image content after the value's JSON. `runpython_options` go to `RunPython(...)`.
"""

from __future__ import annotations

import ast
import contextvars
import inspect
import json
import textwrap
import threading
from collections.abc import Callable
from typing import Any

from runpython import Envelope, RunPython
from runpython import tool as _tool
from runpython.integrations._common import missing

try:
    from fastmcp.exceptions import ToolError
    from fastmcp.tools.base import ToolResult
    from mcp_types import ImageContent, TextContent
except ImportError as _exc:
    raise missing("fastmcp", "fastmcp", _exc) from _exc

__all__ = ["RunPythonSandbox"]

# The external functions of the run being served: one engine serves every run whose functions have the
# same names and signatures, and its tools look the run's own functions up here.
_FUNCTIONS: contextvars.ContextVar[dict[str, Callable[..., Any]]] = contextvars.ContextVar("runpython_fastmcp_fns")


def _has_top_level_return(code: str) -> bool:
    """Whether the code has a `return` outside any function (CPython's parser accepts one; its compiler
    refuses it)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False  # the run reports it, with the code's own line numbers
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Return):
            return True
        pending += [child for child in ast.iter_child_nodes(node) if not isinstance(child, scopes)]
    return False


def _as_function(code: str) -> str:
    """Code that ends in a top-level `return` as the body of a coroutine whose result is the last value."""
    return f"async def __codemode__():\n{textwrap.indent(code, '    ')}\n    return None\n\nawait __codemode__()\n"


class RunPythonSandbox:
    """CodeMode's `SandboxProvider` backed by runpython (`runpython_options` go to `RunPython(...)`)."""

    def __init__(self, **runpython_options: Any) -> None:
        if "tools" in runpython_options:
            raise TypeError("RunPythonSandbox's tools are CodeMode's external functions; give the server tools")
        self.runpython_options = runpython_options
        self._engines: dict[tuple[tuple[str, str], ...], RunPython] = {}
        self._lock = threading.Lock()

    def _engine(self, functions: dict[str, Callable[..., Any]]) -> RunPython:
        key = tuple(sorted((name, str(inspect.signature(fn))) for name, fn in functions.items()))
        with self._lock:
            engine = self._engines.get(key)
            if engine is None:
                engine = RunPython(tools=[self._proxy(n, f) for n, f in functions.items()], **self.runpython_options)
                self._engines[key] = engine
            return engine

    @staticmethod
    def _proxy(name: str, function: Callable[..., Any]) -> Any:
        """A tool with `function`'s signature that calls the function of the run being served."""

        async def call(*args: Any, **kwargs: Any) -> Any:
            result = _FUNCTIONS.get()[name](*args, **kwargs)
            return await result if inspect.isawaitable(result) else result

        call.__signature__ = inspect.signature(function)  # type: ignore[attr-defined]
        call.__name__ = name
        return _tool(call, name=name, description=inspect.getdoc(function) or f"CodeMode's {name}.")

    async def run(
        self,
        code: str,
        *,
        inputs: dict[str, Any] | None = None,
        external_functions: dict[str, Callable[..., Any]] | None = None,
    ) -> Any:
        functions = dict(external_functions or {})
        engine = self._engine(functions)
        source = _as_function(code) if _has_top_level_return(code) else code
        token = _FUNCTIONS.set(functions)
        try:
            envelope = await engine.arun(source, inputs=inputs or None)
        finally:
            _FUNCTIONS.reset(token)
        return self._result(envelope)

    @staticmethod
    def _result(envelope: Envelope) -> Any:
        if envelope.status != "success":
            error = envelope.error
            detail = envelope.status if error is None else f"{error.type}: {error.message}\n{error.traceback or ''}"
            output = f"\n[stdout]\n{envelope.stdout}" if envelope.stdout else ""
            raise ToolError(f"the code failed: {detail.rstrip()}{output}")
        if not envelope.images:
            return envelope.return_value
        content: list[Any] = [TextContent(type="text", text=json.dumps(envelope.return_value))]
        content += [ImageContent(type="image", data=i["data"], mime_type=i["mime"]) for i in envelope.images]
        return ToolResult(content=content)
