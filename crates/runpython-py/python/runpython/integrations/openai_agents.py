"""runpython as an OpenAI Agents SDK tool: `Agent(tools=[run_python_tool(rp)])`.

    from agents import Agent, Runner
    from runpython import RunPython
    from runpython.integrations.openai_agents import run_python_tool

    rp = RunPython(timeout=30, tools=[get_order, refund])    # your functions: the code's tools, on the host
    agent = Agent(name="ops", model="gpt-5", tools=[run_python_tool(rp)])
    Runner.run_sync(agent, "Refund half of order A-17").final_output

`run_python_tool(rp)` is a `FunctionTool` with `run_python`'s schema (`code`, `session_id` to keep state
across calls, `inputs`, `dependencies`, ...). Its output is the compact envelope JSON as a
`ToolOutputText`, followed by each image the code displayed as a `ToolOutputImage` (a data URL), which the
SDK sends the model as image input. What the code does, an exception included, is an envelope the model
reads (`"status": "error"` with the type, message and traceback). A malformed call (arguments that are not
JSON, an unknown field) comes back to the model as the SDK's tool-error text.
"""

from __future__ import annotations

from typing import Any

from runpython import InvalidInputError, RunPython
from runpython.integrations._common import missing

try:
    from agents import FunctionTool, RunContextWrapper, ToolOutputImage, ToolOutputText
except ImportError as _exc:
    raise missing("openai-agents", "openai-agents", _exc) from _exc

__all__ = ["run_python_tool"]


def run_python_tool(rp: RunPython, *, name: str = "run_python") -> FunctionTool:
    """`run_python` for an OpenAI Agents SDK agent, on the engine `rp` (its tools are the code's)."""
    [function] = [s["function"] for s in rp.tool_spec("openai") if s["function"]["name"] == "run_python"]

    async def invoke(ctx: RunContextWrapper[Any], arguments: str) -> list[ToolOutputText | ToolOutputImage] | str:
        try:
            blocks = await rp.ahandle_tool_call_content("run_python", arguments or "{}", format="openai")
        except InvalidInputError as exc:
            return f"run_python was called wrongly: {exc}"
        out: list[ToolOutputText | ToolOutputImage] = []
        for block in blocks:
            if block["type"] == "input_image":
                out.append(ToolOutputImage(image_url=block["image_url"]))
            else:
                out.append(ToolOutputText(text=block["text"]))
        return out

    return FunctionTool(
        name=name,
        description=function["description"],
        params_json_schema=function["parameters"],
        on_invoke_tool=invoke,
        # runpython's schema has optional fields, which strict mode would make required.
        strict_json_schema=False,
    )
