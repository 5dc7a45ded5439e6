"""An OpenAI Agents SDK agent with `run_python_tool`, driven by a fake `Model`: a host tool, a session
across two calls, an error and an image as the model receives them."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, FunctionTool, Model, ModelResponse, Runner, Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText
from example_runner import run_example
from sandbox_png import PNG_CODE, png_size

from runpython import RunPython
from runpython.integrations.openai_agents import run_python_tool

CALLS: list[str] = []


def greet(name: str) -> str:
    """A greeting, made on the host."""
    CALLS.append(name)
    return f"hello {name}"


SCRIPT = [
    {"code": "g = greet(name='ada')\ng", "session_id": "oa-1"},
    {"code": "g.upper()", "session_id": "oa-1"},
    {"code": "{}['missing']"},
    {"code": PNG_CODE},
]


class ScriptedModel(Model):
    """Calls run_python with each scripted argument in turn, then answers; keeps the inputs it was sent."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    async def get_response(self, system_instructions: str | None, input: Any, *args: Any,
                           **kwargs: Any) -> ModelResponse:
        self.seen.append(input)
        outputs = [i for i in input if isinstance(i, dict) and i.get("type") == "function_call_output"] \
            if isinstance(input, list) else []
        if len(outputs) < len(SCRIPT):
            n = len(outputs)
            call = ResponseFunctionToolCall(type="function_call", call_id=f"o{n}", name="run_python",
                                            arguments=json.dumps(SCRIPT[n]), id=f"fc{n}", status="completed")
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        text = ResponseOutputText(type="output_text", text="finished", annotations=[])
        message = ResponseOutputMessage(type="message", id="m1", role="assistant", status="completed",
                                        content=[text])
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the test runs without streaming")


def outputs(model: ScriptedModel) -> list[Any]:
    last = model.seen[-1]
    return [i["output"] for i in last if isinstance(i, dict) and i.get("type") == "function_call_output"]


def text_of(output: Any) -> str:
    parts = output if isinstance(output, list) else [output]
    return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in parts)


def test_an_agent_runs_code_with_a_host_tool_a_session_an_error_and_an_image() -> None:
    CALLS.clear()
    rp = RunPython(timeout=20, tools=[greet])
    tool = run_python_tool(rp)
    assert isinstance(tool, FunctionTool) and "greet(name: str)" in tool.description
    model = ScriptedModel()
    agent = Agent(name="coder", model=model, tools=[tool])
    result = Runner.run_sync(agent, "greet ada loudly")
    assert result.final_output == "finished"
    assert CALLS == ["ada"]
    first, second, failed, drawn = outputs(model)
    assert json.loads(text_of(first))["return_value"] == "hello ada"
    assert json.loads(text_of(second))["return_value"] == "HELLO ADA"  # the session kept `g`
    error = json.loads(text_of(failed))
    assert error["status"] == "error" and error["error"]["type"] == "KeyError"
    # The image reached the model as image input after the envelope's text.
    [image] = [p for p in drawn if isinstance(p, dict) and p.get("type") == "input_image"]
    prefix = "data:image/png;base64,"
    assert image["image_url"].startswith(prefix)
    assert png_size(base64.b64decode(image["image_url"][len(prefix):])) == (3, 2)


def test_a_malformed_call_reaches_the_model_as_text() -> None:
    import asyncio

    tool = run_python_tool(RunPython(timeout=20))
    answer = asyncio.run(tool.on_invoke_tool(None, json.dumps({"kode": "1"})))  # type: ignore[arg-type]
    assert isinstance(answer, str) and "wrongly" in answer


def test_the_example_runs_and_prints_its_answer() -> None:
    assert run_example(__file__).strip().splitlines()[-1] == '21 kettles across three shops.'
