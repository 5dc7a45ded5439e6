"""A LangChain agent (`create_agent`) with `RunPythonTool`, driven by a fake chat model that emits tool calls:
a host tool, a session across two calls, an error and an image as the model receives them."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatResult
from example_runner import run_example
from sandbox_png import PNG_CODE, png_size

from runpython import RunPython
from runpython.integrations.langchain import RunPythonTool

CALLS: list[tuple[int, int]] = []


def add(a: int, b: int) -> int:
    """Adds two numbers, on the host."""
    CALLS.append((a, b))
    return a + b


class ScriptedChatModel(GenericFakeChatModel):
    """GenericFakeChatModel that takes tools (an agent binds them) and keeps what it was sent."""

    seen: list[list[BaseMessage]] = []

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        return self

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        self.seen.append(list(messages))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)


def call(code: str, n: int, **more: Any) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": "run_python", "args": {"code": code, **more}, "id": f"c{n}"}])


def script(messages: list[AIMessage]) -> Iterator[AIMessage]:
    yield from messages


@pytest.fixture(scope="module")
def rp() -> RunPython:
    return RunPython(timeout=20, tools=[add])


def test_an_agent_runs_code_with_host_tools_sessions_errors_and_images(rp: RunPython) -> None:
    CALLS.clear()
    model = ScriptedChatModel(messages=script([
        call("total = add(a=2, b=3)\ntotal", 1, session_id="lc-s1"),
        call("total * 10", 2, session_id="lc-s1"),
        call("1 / 0", 3),
        call(PNG_CODE, 4),
        AIMessage(content="All done."),
    ]))
    model.seen = []
    agent = create_agent(model, tools=[RunPythonTool(rp)])
    result = agent.invoke({"messages": [("user", "compute")]})
    assert result["messages"][-1].content == "All done."
    assert CALLS == [(2, 3)]
    replies = [m for m in model.seen[-1] if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in replies] == ["c1", "c2", "c3", "c4"]
    first, second, failed, drawn = replies
    # The compact text is the envelope's JSON; the artifact is the envelope itself.
    assert json.loads(first.content)["return_value"] == 5 and first.artifact["status"] == "success"
    assert second.artifact["return_value"] == 50 and second.artifact["session_id"] == "lc-s1"
    assert failed.artifact["status"] == "error"
    assert failed.artifact["error"]["type"] == "ZeroDivisionError"
    assert "ZeroDivisionError" in failed.content
    # LangChain's own mark of a failed call, which providers pass on (Anthropic's is_error).
    assert failed.status == "error" and first.status == second.status == drawn.status == "success"
    # The image reached the model as a standard image content block after the text.
    text, image = drawn.content
    assert json.loads(text["text"])["return_value"] == "drawn"
    assert image["type"] == "image" and image["mime_type"] == "image/png"
    assert png_size(base64.b64decode(image["base64"])) == (3, 2)


def test_the_tool_runs_asynchronously_too(rp: RunPython) -> None:
    tool = RunPythonTool(rp)
    message = asyncio.run(tool.ainvoke({"type": "tool_call", "name": "run_python", "id": "a1",
                                        "args": {"code": "add(a=40, b=2)"}}))
    assert isinstance(message, ToolMessage)
    assert message.artifact["return_value"] == 42


def test_the_tool_shows_the_model_runpythons_schema(rp: RunPython) -> None:
    tool = RunPythonTool(rp)
    schema = tool.tool_call_schema if isinstance(tool.tool_call_schema, dict) else tool.args
    assert "code" in json.dumps(schema) and "session_id" in json.dumps(schema)
    assert "add(" in tool.description


def test_the_example_runs_and_prints_its_answer() -> None:
    assert run_example(__file__).strip().splitlines()[-1] == 'Half of A-17 is 60.0.'
