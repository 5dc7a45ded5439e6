"""runpython as the code tool of a pydantic-ai agent. The model is pydantic-ai's `FunctionModel` (scripted,
no network): it writes code that fans out to an async host function with asyncio.gather, then answers
from the envelope. With a real model, pass its name to `Agent` instead.

    pip install pydantic-ai-slim
    python examples/pydantic_ai_agent.py
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable, Coroutine

from pydantic_ai import Agent, Tool
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runpython import RunPython

PRICES = {"kettle": 24.0, "teapot": 18.5, "mug": 6.25}


async def price(item: str) -> float:
    """The price of an item, from the (slow) catalogue service."""
    await asyncio.sleep(0.05)  # runs on the agent's own event loop
    return PRICES[item]


def runpython_tools(rp: RunPython) -> list[Tool[None]]:
    """runpython's tools for a model (run_python, get_run_artifact, resume) as pydantic-ai tools."""

    def caller(name: str) -> Callable[..., Coroutine[Any, Any, Any]]:
        async def call(**arguments: Any) -> Any:
            return await rp.ahandle_tool_call(name, arguments)

        return call

    return [
        Tool.from_schema(caller(spec["name"]), name=spec["name"], description=spec["description"],
                         json_schema=spec["input_schema"])
        for spec in rp.tool_spec("anthropic")
    ]


CODE = """
import asyncio
items = ["kettle", "teapot", "mug", "mug"]
prices = await asyncio.gather(*[price(i) for i in items])
{"items": len(items), "total": sum(prices)}
"""


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    assert "run_python" in [t.name for t in info.function_tools]
    returns = [p for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]
    if not returns:
        return ModelResponse(parts=[ToolCallPart("run_python", {"code": CODE})])
    content: Any = returns[-1].content  # the envelope, as the tool returned it (a dict)
    envelope: dict[str, Any] = json.loads(content) if isinstance(content, str) else dict(content)
    value = envelope["return_value"]
    return ModelResponse(parts=[TextPart(f"{value['items']} items cost {value['total']:.2f} in all.")])


async def main() -> str:
    rp = RunPython(timeout=30, tools=[price])
    agent = Agent(FunctionModel(model), tools=runpython_tools(rp))
    result = await agent.run("What do a kettle, a teapot and two mugs cost?")
    return result.output


if __name__ == "__main__":
    answer = asyncio.run(main())
    print(answer)
    assert answer == "4 items cost 55.00 in all.", answer
