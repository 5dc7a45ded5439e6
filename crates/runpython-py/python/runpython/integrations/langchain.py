"""runpython as a LangChain tool: `RunPythonTool(rp)`, a `BaseTool` for any LangChain or LangGraph agent.

    from langchain.agents import create_agent
    from runpython import RunPython
    from runpython.integrations.langchain import RunPythonTool

    rp = RunPython(timeout=30, tools=[get_order, refund])    # your functions: the code's tools, on the host
    agent = create_agent("anthropic:claude-sonnet-4-5", tools=[RunPythonTool(rp)])
    agent.invoke({"messages": [("user", "Refund half of order A-17")]})

The tool takes `run_python`'s arguments (`code`, `session_id` to keep state across calls, `inputs`,
`dependencies`, ...) and answers with `response_format="content_and_artifact"`: the content is the compact
envelope JSON for the model, followed by the images the code displayed as standard image content blocks
(for models that take images), and the `ToolMessage.artifact` is the envelope as a dict (status,
return_value, stdout, error, artifacts, ...). What the code does, an exception included, is an envelope the
model reads (`"status": "error"` with the type, message and traceback), and the `ToolMessage` has
`status="error"`, LangChain's mark of a failed call; runpython's own failures (a bad argument) raise.

Deep Agents: `runpython.integrations.deepagents.RunPythonBackend` is its sandbox backend (extra
`runpython[deepagents]`); this tool can run Python in that backend's session (`session_id=backend.id`).
"""

from __future__ import annotations

import json
from typing import Any

from runpython import RunPython
from runpython.integrations._common import missing

try:
    from langchain_core.messages import ToolMessage
    from langchain_core.messages.content import create_image_block
    from langchain_core.tools import BaseTool
    from pydantic import ConfigDict
except ImportError as _exc:
    raise missing("langchain-core", "langchain", _exc) from _exc

__all__ = ["RunPythonTool"]


def _mark_failed(output: Any) -> Any:
    """A ToolMessage whose envelope is not a success gets `status="error"`, LangChain's mark of a failed
    tool call (providers pass it on, e.g. as Anthropic's `is_error`); content and artifact stay."""
    if isinstance(output, ToolMessage) and isinstance(output.artifact, dict):
        if output.artifact.get("status") not in (None, "success"):
            output.status = "error"
    return output


def _spec(rp: RunPython) -> dict[str, Any]:
    [spec] = [s for s in rp.tool_spec("anthropic") if s["name"] == "run_python"]
    return spec


class RunPythonTool(BaseTool):
    """`run_python` as a LangChain tool: content for the model (the envelope's JSON, then image blocks),
    the envelope dict as the artifact."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    rp: RunPython
    name: str = "run_python"
    description: str = ""
    args_schema: Any = None
    response_format: Any = "content_and_artifact"

    def __init__(self, rp: RunPython, **kwargs: Any) -> None:
        spec = _spec(rp)
        kwargs.setdefault("description", spec["description"])
        kwargs.setdefault("args_schema", spec["input_schema"])
        super().__init__(rp=rp, **kwargs)

    def _run(self, **arguments: Any) -> tuple[str | list[Any], dict[str, Any]]:
        arguments.pop("run_manager", None)
        arguments.pop("config", None)
        return self._answer(self.rp.handle_tool_call_content("run_python", arguments, format="anthropic"))

    async def _arun(self, **arguments: Any) -> tuple[str | list[Any], dict[str, Any]]:
        arguments.pop("run_manager", None)
        arguments.pop("config", None)
        blocks = await self.rp.ahandle_tool_call_content("run_python", arguments, format="anthropic")
        return self._answer(blocks)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return _mark_failed(super().run(*args, **kwargs))

    async def arun(self, *args: Any, **kwargs: Any) -> Any:
        return _mark_failed(await super().arun(*args, **kwargs))

    @staticmethod
    def _answer(blocks: list[dict[str, Any]]) -> tuple[str | list[Any], dict[str, Any]]:
        """runpython's tool-result blocks (Anthropic's shape) as LangChain content, and the envelope."""
        text = next(b["text"] for b in blocks if b["type"] == "text")
        envelope: dict[str, Any] = json.loads(text)
        images = [
            create_image_block(base64=b["source"]["data"], mime_type=b["source"]["media_type"])
            for b in blocks
            if b["type"] == "image"
        ]
        if not images:
            return text, envelope
        return [{"type": "text", "text": text}, *images], envelope
