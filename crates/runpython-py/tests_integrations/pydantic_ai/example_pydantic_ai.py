"""A pydantic-ai agent with runpython's toolset: the agent's own tool, which reads its deps from the
RunContext, is a callable in the code. The model is pydantic-ai's `FunctionModel` (scripted, no network);
with a real one, pass its name to `Agent` instead.

    pip install "runpython[pydantic-ai]"
    python example_pydantic_ai.py
"""

from __future__ import annotations

from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runpython.integrations.pydantic_ai import RunPythonToolset


def rate(ctx: RunContext[dict[str, float]], currency: str) -> float:
    """Today's rate of a currency to EUR."""
    return ctx.deps[currency]


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    done = [p for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, ToolReturnPart)]
    if not done:
        code = "round(100 * rate(currency='USD'), 2)"
        return ModelResponse(parts=[ToolCallPart("run_python", {"code": code})])
    envelope: Any = done[-1].content  # the envelope as run_python returned it
    assert isinstance(envelope, dict), envelope
    return ModelResponse(parts=[TextPart(f"100 USD is {envelope['return_value']} EUR.")])


def main() -> str:
    agent = Agent(FunctionModel(model), deps_type=dict[str, float],
                  toolsets=[RunPythonToolset(tools=[rate], timeout=30)])
    return agent.run_sync("How much is 100 USD in EUR?", deps={"USD": 0.92}).output


if __name__ == "__main__":
    answer = main()
    print(answer)
    assert answer == "100 USD is 92.0 EUR.", answer
