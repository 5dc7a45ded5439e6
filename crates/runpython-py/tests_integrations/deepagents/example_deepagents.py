"""A Deep Agent whose files and shell are a runpython session. The chat model is a fake one that emits tool
calls (no network); with a real one, pass e.g. `model="anthropic:claude-sonnet-4-5"` instead.

    pip install "runpython[deepagents]"
    python example_deepagents.py
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from deepagents import create_deep_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from runpython import RunPython
from runpython.integrations.deepagents import RunPythonBackend


class FakeModel(GenericFakeChatModel):
    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> FakeModel:
        return self


def main() -> str:
    backend = RunPythonBackend(RunPython(timeout=30))
    report = f"{backend.root_dir}/report.csv"
    model = FakeModel(messages=iter([
        AIMessage(content="", tool_calls=[{"name": "write_file", "id": "w",
                                           "args": {"file_path": report, "content": "sku,n\nkettle,7\nmug,3\n"}}]),
        AIMessage(content="", tool_calls=[{"name": "execute", "id": "e",
                                           "args": {"command": "tail -n +2 report.csv | wc -l"}}]),
        AIMessage(content="report.csv: 2 rows"),
    ]))
    agent = create_deep_agent(model=model, backend=backend)
    result = agent.invoke({"messages": [HumanMessage("Write a stock report and count its rows")]})
    backend.close()
    [counted] = [m for m in result["messages"] if isinstance(m, ToolMessage) and m.name == "execute"]
    assert str(counted.content).split()[0] == "2", counted.content  # wc ran in the sandbox, on the file
    return str(result["messages"][-1].content)


if __name__ == "__main__":
    answer = main()
    print(answer)
    assert answer == "report.csv: 2 rows", answer
