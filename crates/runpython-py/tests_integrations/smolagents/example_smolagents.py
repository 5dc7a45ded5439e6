"""A smolagents CodeAgent whose code runs in runpython's sandbox, with a host tool. The model is scripted
(no network); with a real one, pass e.g. `InferenceClientModel()` or `LiteLLMModel("...")` instead.

    pip install "runpython[smolagents]"
    python example_smolagents.py
"""

from __future__ import annotations

from typing import Any

# smolagents ships no type information: its names are Any to mypy.
from smolagents.agents import CodeAgent  # type: ignore[import-untyped]
from smolagents.models import ChatMessage, MessageRole, Model  # type: ignore[import-untyped]
from smolagents.tools import tool  # type: ignore[import-untyped]

from runpython.integrations.smolagents import RunPythonExecutor


@tool  # type: ignore[untyped-decorator]
def balance(account: str) -> float:
    """The balance of an account, read with a credential that stays on the host.

    Args:
        account: the account's id
    """
    return {"ada": 120.0, "bob": 35.5}[account]


class Scripted(Model):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__(model_id="scripted")
        self.steps = ["both = [balance(account=a) for a in ('ada', 'bob')]", "final_answer(sum(both))"]

    def generate(self, messages: list[ChatMessage], *args: Any, **kwargs: Any) -> ChatMessage:
        return ChatMessage(role=MessageRole.ASSISTANT, content=f"<code>\n{self.steps.pop(0)}\n</code>")


def main() -> Any:
    executor = RunPythonExecutor(timeout=30)
    with CodeAgent(tools=[balance], model=Scripted(), executor=executor,
                   step_callbacks=[executor.attach_images]) as agent:
        return agent.run("What do ada and bob hold together?")


if __name__ == "__main__":
    answer = main()
    print(answer)
    assert answer == 155.5, answer
