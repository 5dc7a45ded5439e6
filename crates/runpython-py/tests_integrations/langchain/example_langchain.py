"""A LangChain agent with runpython as its code tool. The chat model is a fake one that emits a tool call
(no network); with a real one, pass e.g. `"anthropic:claude-sonnet-4-5"` to `create_agent` instead.

    pip install "runpython[langchain]" langchain
    python example_langchain.py
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage

from runpython import RunPython
from runpython.integrations.langchain import RunPythonTool


def get_order(order_id: str) -> dict[str, Any]:
    """The order with this id."""
    return {"id": order_id, "total": 120.0}


class FakeModel(GenericFakeChatModel):
    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> FakeModel:
        return self


def main() -> Any:
    rp = RunPython(timeout=30, tools=[get_order])
    code = "get_order(order_id='A-17')['total'] / 2"
    model = FakeModel(messages=iter([
        AIMessage(content="", tool_calls=[{"name": "run_python", "args": {"code": code}, "id": "c1"}]),
        AIMessage(content="Half of A-17 is 60.0."),
    ]))
    agent = create_agent(model, tools=[RunPythonTool(rp)])
    result = agent.invoke({"messages": [HumanMessage("What is half of order A-17?")]})
    tool_message = result["messages"][2]
    return tool_message.artifact["return_value"], result["messages"][-1].content


if __name__ == "__main__":
    value, answer = main()
    print(answer)
    assert value == 60.0, value
