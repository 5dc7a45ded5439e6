"""An OpenAI Agents SDK agent with runpython as a function tool. The model is a fake `Model` that calls
`run_python` once, then answers (no network); with a real one, pass e.g. `model="gpt-5"` instead.

    pip install "runpython[openai-agents]"
    python example_openai_agents.py
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, Model, ModelResponse, Runner, Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from runpython import RunPython
from runpython.integrations.openai_agents import run_python_tool


def stock(sku: str) -> int:
    """Units in stock."""
    return {"kettle": 7}[sku]


class OneCall(Model):
    async def get_response(self, system_instructions: str | None, input: Any, *args: Any,
                           **kwargs: Any) -> ModelResponse:
        if not any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in input):
            args_json = json.dumps({"code": "stock(sku='kettle') * 3"})
            call = ResponseFunctionToolCall(type="function_call", call_id="c1", name="run_python",
                                            arguments=args_json, id="f1", status="completed")
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        text = ResponseOutputText(type="output_text", text="21 kettles across three shops.", annotations=[])
        return ModelResponse(output=[ResponseOutputMessage(type="message", id="m1", role="assistant",
                                                           status="completed", content=[text])],
                             usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


def main() -> str:
    agent = Agent(name="stock", model=OneCall(), tools=[run_python_tool(RunPython(timeout=30, tools=[stock]))])
    return str(Runner.run_sync(agent, "Kettles in three shops?").final_output)


if __name__ == "__main__":
    answer = main()
    print(answer)
    assert answer == "21 kettles across three shops.", answer
