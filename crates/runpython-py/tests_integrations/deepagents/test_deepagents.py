"""A Deep Agent on `RunPythonBackend`, driven by a fake chat model that emits tool calls: its file tools and
`execute` in runpython's sandbox, state across steps, a failing command, and Python (with a host tool) in
the same session through `RunPythonTool`."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from deepagents import create_deep_agent
from example_runner import run_example
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatResult

from runpython import RunPython
from runpython.integrations.deepagents import RunPythonBackend
from runpython.integrations.langchain import RunPythonTool

CALLS: list[str] = []


def secret_suffix(name: str) -> str:
    """A value only the host knows."""
    CALLS.append(name)
    return name + "-42"


class ScriptedChatModel(GenericFakeChatModel):
    seen: list[list[BaseMessage]] = []

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        return self

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        self.seen.append(list(messages))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)


def call(name: str, n: int, **args: Any) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"d{n}"}])


def script(messages: list[AIMessage]) -> Iterator[AIMessage]:
    yield from messages


def test_a_deep_agent_works_in_a_runpython_session() -> None:
    CALLS.clear()
    rp = RunPython(timeout=30, tools=[secret_suffix])
    backend = RunPythonBackend(rp)
    root = backend.root_dir
    model = ScriptedChatModel(messages=script([
        call("write_file", 1, file_path=f"{root}/hello.py", content="print('hello from', __name__)\n"),
        call("execute", 2, command="python3 hello.py && ls"),
        call("execute", 3, command="echo oops >&2; exit 3"),
        call("run_python", 4, code="name = open('hello.py').read().split()[0]\nsecret_suffix(name=name)",
             session_id=backend.id),
        call("read_file", 5, file_path=f"{root}/hello.py"),
        AIMessage(content="done"),
    ]))
    model.seen = []
    agent = create_deep_agent(model=model, backend=backend, tools=[RunPythonTool(rp)])
    result = agent.invoke({"messages": [HumanMessage("write and run hello.py")]})
    assert result["messages"][-1].content == "done"
    replies = {m.tool_call_id: m for m in model.seen[-1] if isinstance(m, ToolMessage)}
    assert set(replies) == {"d1", "d2", "d3", "d4", "d5"}
    # The file written in step 1 is there for the command in step 2: one session's working directory.
    assert "hello from __main__" in str(replies["d2"].content) and "hello.py" in str(replies["d2"].content)
    # A failing command reaches the model with its output and exit code.
    assert "oops" in str(replies["d3"].content) and "3" in str(replies["d3"].content)
    # Python in the same session reads the agent's file and calls the host's function.
    assert json.loads(replies["d4"].content)["return_value"] == "print('hello-42"
    assert CALLS == ["print('hello"]
    assert "hello from" in str(replies["d5"].content)
    backend.close()


def test_files_go_in_and_out_with_per_file_errors() -> None:
    backend = RunPythonBackend(RunPython(timeout=30))
    root = backend.root_dir
    up = backend.upload_files([(f"{root}/a/b.bin", b"\x00\x01bytes"), ("/proc/nope/x", b"no")])
    assert up[0].error is None and up[1].error is not None
    down = backend.download_files([f"{root}/a/b.bin", f"{root}/missing", f"{root}/a"])
    assert down[0].content == b"\x00\x01bytes"
    assert [d.error for d in down[1:]] == ["file_not_found", "is_directory"]
    done = backend.execute("sleep 5", timeout=1)
    assert done.exit_code == 124 and "timed out" in done.output
    backend.close()


def test_the_example_runs_and_prints_its_answer() -> None:
    assert run_example(__file__).strip().splitlines()[-1] == "report.csv: 2 rows"
