"""A smolagents CodeAgent whose code runs in runpython, driven by a scripted model: host tools, state across
steps, an error and an image shown to the model, and the final answer."""

from __future__ import annotations

from typing import Any

import PIL.Image
import pytest
from example_runner import run_example
from sandbox_png import PNG_CODE
from smolagents import CodeAgent, Tool
from smolagents.models import ChatMessage, MessageRole, Model
from smolagents.utils import AgentError

from runpython.integrations.smolagents import RunPythonExecutor

CALLS: list[str] = []


class PriceTool(Tool):  # type: ignore[misc]
    name = "get_price"
    description = "The price of an item, from a catalogue only the host can reach."
    inputs = {"item": {"type": "string", "description": "the item's name"}}
    output_type = "number"

    def forward(self, item: str) -> float:
        CALLS.append(item)
        return {"kettle": 24.0, "mug": 6.25}[item]


class ScriptedModel(Model):  # type: ignore[misc]
    """Answers each step with the next code block, and keeps the messages it was shown."""

    def __init__(self, steps: list[str]) -> None:
        super().__init__(model_id="scripted")
        self.steps = list(steps)
        self.seen: list[list[ChatMessage]] = []

    def generate(self, messages: list[ChatMessage], stop_sequences: list[str] | None = None,
                 response_format: Any = None, tools_to_call_from: Any = None, **kwargs: Any) -> ChatMessage:
        self.seen.append(list(messages))
        code = self.steps.pop(0)
        return ChatMessage(role=MessageRole.ASSISTANT, content=f"Thought: next.\n<code>\n{code}\n</code>")


def texts(messages: list[ChatMessage]) -> str:
    return "\n".join(str(part.get("text", "")) for m in messages if isinstance(m.content, list) for part in m.content
                     if isinstance(part, dict))


def images(messages: list[ChatMessage]) -> list[PIL.Image.Image]:
    return [part["image"] for m in messages if isinstance(m.content, list) for part in m.content
            if isinstance(part, dict) and part.get("type") == "image"]


@pytest.fixture
def executor() -> Any:
    ex = RunPythonExecutor(timeout=20)
    yield ex
    ex.cleanup()


def test_a_code_agent_runs_its_steps_in_one_session_with_host_tools(executor: RunPythonExecutor) -> None:
    CALLS.clear()
    model = ScriptedModel([
        "total = get_price(item='kettle') * 2\nprint('total is', total)",
        "1 / 0",
        PNG_CODE,
        "final_answer(total + get_price(item='mug'))",
    ])
    agent = CodeAgent(tools=[PriceTool()], model=model, executor=executor, max_steps=6,
                      step_callbacks=[executor.attach_images])
    assert agent.run("What do two kettles and a mug cost?") == 54.25
    # The tool ran here, on the host, once per call the code made.
    assert CALLS == ["kettle", "mug"]
    step1, step2, step3 = model.seen[1], model.seen[2], model.seen[3]
    assert "total is 48.0" in texts(step1)
    # The error reached the model as smolagents shows a failed step.
    assert "ZeroDivisionError" in texts(step2) and "division by zero" in texts(step2)
    # The displayed image reached the model as a PIL image of the step.
    [image] = images(step3)
    assert isinstance(image, PIL.Image.Image) and image.size == (3, 2)
    assert image.convert("RGB").getpixel((0, 0)) == (255, 0, 0)
    assert "drawn" in texts(step3)


def test_the_session_keeps_variables_across_agent_runs(executor: RunPythonExecutor) -> None:
    first = CodeAgent(tools=[PriceTool()], model=ScriptedModel(["seen = ['first']\nfinal_answer(len(seen))"]),
                      executor=executor)
    assert first.run("one") == 1
    second = CodeAgent(tools=[PriceTool()], model=ScriptedModel(["seen.append('second')\nfinal_answer(seen)"]),
                       executor=executor)
    assert second.run("two", reset=False) == ["first", "second"]


def test_final_answer_stops_the_code_even_inside_a_broad_except(executor: RunPythonExecutor) -> None:
    code = "try:\n    final_answer('done')\nexcept Exception:\n    print('swallowed')\nprint('after')"
    agent = CodeAgent(tools=[], model=ScriptedModel([code]), executor=executor)
    assert agent.run("finish") == "done"
    output = executor("x = 1\nx + 1")
    assert (output.output, output.is_final_answer) == (2, False)


def test_the_agents_state_is_bound_in_the_session(executor: RunPythonExecutor) -> None:
    agent = CodeAgent(tools=[], model=ScriptedModel(["final_answer(city.upper())"]), executor=executor)
    assert agent.run("shout the city", additional_args={"city": "oslo"}) == "OSLO"


def test_authorized_imports_are_the_packages_installs_may_bring() -> None:
    ex = RunPythonExecutor(["numpy.*", "pandas"], timeout=20)
    output = ex("import json, os, statistics\nstatistics.median([3, 1, 2])")  # any stdlib module
    assert output.output == 2
    # An import outside the authorized ones is refused by runpython's install policy, before any install.
    with pytest.raises(AgentError, match="pyfiglet.*not in the allowed packages"):
        ex("import pyfiglet")
    ex.cleanup()
    closed = RunPythonExecutor(timeout=20)  # no additional imports: nothing is installed
    with pytest.raises(AgentError, match="ModuleNotFoundError"):
        closed("import pyfiglet")
    closed.cleanup()
    with pytest.raises(TypeError, match="CodeAgent"):
        RunPythonExecutor(tools=[len])


def test_the_example_runs_and_prints_its_answer() -> None:
    assert run_example(__file__).strip().splitlines()[-1] == '155.5'
