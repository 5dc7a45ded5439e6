"""runpython as a pydantic-ai toolset: `Agent(model, toolsets=[RunPythonToolset(tools=[...])])`.

    from pydantic_ai import Agent, RunContext
    from runpython.integrations.pydantic_ai import RunPythonToolset

    async def orders(ctx: RunContext[Db], customer: str) -> list[dict]:
        \"\"\"The customer's orders.\"\"\"
        return await ctx.deps.orders(customer)

    agent = Agent("anthropic:claude-sonnet-4-5", deps_type=Db,
                  toolsets=[RunPythonToolset(tools=[orders], timeout=30)])
    agent.run_sync("What did ada spend last month?", deps=db)

The toolset gives the model two tools:
- `run_python(code, session_id=None, inputs=None, dependencies=None)`: runs the code in runpython's sandbox
  and returns the envelope (a dict: status, return_value, stdout, error, artifacts, ...); with a
  `session_id`, calls with the same id share one live interpreter. Images the code displays come back
  with the envelope as `BinaryContent` parts, which pydantic-ai sends the model natively.
- `get_run_artifact(id)`: what a kept run stored (its stdout, a file it wrote), by artifact id.

`tools` are the agent's own functions (plain or `async def`, or pydantic-ai `Tool`s), carried into the
code as callables: they run here, on the host, through runpython's bridge. A function whose first
parameter is a `RunContext` gets the agent run's context, `deps` included, as pydantic-ai tools do; the
code calls it without that parameter. What the code does, an exception included, is an envelope the
model reads (`errors="envelope"`, the default). With `errors="retry"`, a failed run raises `ModelRetry`
with the envelope, which pydantic-ai shows the model as a retry prompt (a tool return whose outcome is
`retried`), counted against the toolset's `max_retries`, after which the agent run fails. runpython's
own failures raise. `runpython_options` go to `RunPython(...)`; or pass `rp=` an engine of your own (its
tools then take no `RunContext`).
"""

from __future__ import annotations

import base64
import contextvars
import functools
import inspect
import json
import typing
from collections.abc import Callable, Sequence
from typing import Any, Literal

from runpython import RunPython
from runpython import tool as _tool
from runpython.integrations._common import missing

try:
    from pydantic_ai import ModelRetry, RunContext, Tool
    from pydantic_ai.messages import BinaryContent
    from pydantic_ai.toolsets import FunctionToolset
except ImportError as _exc:
    raise missing("pydantic-ai", "pydantic-ai", _exc) from _exc

__all__ = ["RunPythonToolset"]

# The RunContext of the agent's tool call being served: the host tools called from its code read it.
_CONTEXT: contextvars.ContextVar[RunContext[Any] | None] = contextvars.ContextVar("runpython_pydantic_ai_ctx",
                                                                                  default=None)


def _takes_ctx(function: Callable[..., Any]) -> bool:
    """Whether a function's first parameter is a pydantic-ai RunContext (as pydantic-ai decides it)."""
    params = list(inspect.signature(function).parameters.values())
    if not params:
        return False
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # noqa: BLE001 - unresolvable hints: look at the raw annotation
        hints = {}
    hint = hints.get(params[0].name, params[0].annotation)
    return (typing.get_origin(hint) or hint) is RunContext


def _carried(entry: Tool[Any] | Callable[..., Any]) -> Any:
    """One of the agent's tools as a runpython tool; a RunContext parameter is filled from the agent's run."""
    name = description = None
    if isinstance(entry, Tool):
        function, name, description, takes_ctx = entry.function, entry.name, entry.description, entry.takes_ctx
    else:
        function, takes_ctx = entry, _takes_ctx(entry)
    if not takes_ctx:
        return _tool(function, name=name, description=description)
    signature = inspect.signature(function)
    rest = list(signature.parameters.values())[1:]
    hints = typing.get_type_hints(function)

    def context() -> RunContext[Any]:
        ctx = _CONTEXT.get()
        if ctx is None:
            raise RuntimeError(f"{function.__name__} needs the agent's RunContext: call it from run_python's code")
        return ctx

    wrapper: Callable[..., Any]
    if inspect.iscoroutinefunction(function):
        async def wrapper(**kwargs: Any) -> Any:
            return await function(context(), **kwargs)
    else:
        def wrapper(**kwargs: Any) -> Any:
            return function(context(), **kwargs)

    functools.update_wrapper(wrapper, function)
    delattr(wrapper, "__wrapped__")  # the code's signature is the one below, not the function's
    setattr(wrapper, "__signature__", signature.replace(
        parameters=[p.replace(annotation=hints.get(p.name, p.annotation)) for p in rest],
        return_annotation=hints.get("return", signature.return_annotation),
    ))
    return _tool(wrapper, name=name or function.__name__, description=description)


class RunPythonToolset(FunctionToolset[Any]):
    """`run_python` and `get_run_artifact` for a pydantic-ai agent, with the agent's tools in the code."""

    def __init__(
        self,
        tools: Sequence[Tool[Any] | Callable[..., Any]] = (),
        *,
        rp: RunPython | None = None,
        errors: Literal["envelope", "retry"] = "envelope",
        max_retries: int | None = None,
        id: str | None = None,
        **runpython_options: Any,
    ) -> None:
        super().__init__(id=id, max_retries=max_retries)
        if errors not in ("envelope", "retry"):
            raise ValueError(f"errors must be 'envelope' or 'retry', not {errors!r}")
        self.errors = errors
        if rp is not None and (tools or runpython_options):
            raise TypeError("pass either rp= (an engine with its own tools) or tools and RunPython options")
        self.rp = rp if rp is not None else RunPython(tools=[_carried(t) for t in tools], **runpython_options)
        specs = {spec["name"]: spec for spec in self.rp.tool_spec("anthropic")}
        self.add_function(self.run_python, takes_ctx=True, name="run_python",
                          description=specs["run_python"]["description"])
        self.add_function(self.get_run_artifact, takes_ctx=False, name="get_run_artifact",
                          description=specs["get_run_artifact"]["description"])

    async def run_python(
        self,
        ctx: RunContext[Any],
        code: str,
        session_id: str | None = None,
        inputs: dict[str, Any] | None = None,
        dependencies: list[str] | None = None,
    ) -> Any:
        """Runs the code and returns its envelope.

        Args:
            code: The Python source. The last expression is the return value.
            session_id: Keep state across calls: calls with the same id share one live interpreter.
            inputs: JSON values bound as globals before the code runs, by name.
            dependencies: Extra requirement specs, on top of what the imports need.
        """
        arguments: dict[str, Any] = {"code": code}
        for key, value in (("session_id", session_id), ("inputs", inputs), ("dependencies", dependencies)):
            if value is not None:
                arguments[key] = value
        token = _CONTEXT.set(ctx)
        try:
            blocks = await self.rp.ahandle_tool_call_content("run_python", arguments, format="anthropic")
        finally:
            _CONTEXT.reset(token)
        text = next(b["text"] for b in blocks if b["type"] == "text")
        envelope: dict[str, Any] = json.loads(text)
        if self.errors == "retry" and envelope.get("status") != "success":
            raise ModelRetry(text)  # the model sees the envelope as pydantic-ai's retry prompt
        images = [BinaryContent(data=base64.b64decode(b["source"]["data"]), media_type=b["source"]["media_type"])
                  for b in blocks if b["type"] == "image"]
        return [envelope, *images] if images else envelope

    async def get_run_artifact(self, id: str) -> Any:
        """What a kept run stored, by artifact id (from an envelope's `artifacts`).

        Args:
            id: The artifact's id.
        """
        return await self.rp.ahandle_tool_call("get_run_artifact", {"id": id})
