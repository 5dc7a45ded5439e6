"""`smolagents_step_overhead_ms` for `cargo xtask bench`: the p50 of one trivial CodeAgent step (a scripted
model's `x = 1 + 1` then `final_answer(x)`, so the step is the executor's work plus the agent's
bookkeeping) through runpython's `RunPythonExecutor`, minus the same step through smolagents'
`LocalPythonExecutor`, both measured in this one process, interleaved. Run by the interpreter of a venv
with the release wheel and the `smolagents` extra; prints one JSON object.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from smolagents import CodeAgent
from smolagents.local_python_executor import LocalPythonExecutor
from smolagents.models import ChatMessage, MessageRole, Model
from smolagents.monitoring import LogLevel

from runpython.integrations.smolagents import RunPythonExecutor

ROUNDS = 200
WARMUP = 10


class OneStep(Model):  # type: ignore[misc]
    """Answers every step with the same trivial code action, which ends the run."""

    def __init__(self) -> None:
        super().__init__(model_id="bench")

    def generate(self, messages: list[ChatMessage], *args: Any, **kwargs: Any) -> ChatMessage:
        return ChatMessage(role=MessageRole.ASSISTANT, content="<code>\nx = 1 + 1\nfinal_answer(x)\n</code>")


def step_ms(agent: CodeAgent) -> float:
    started = time.perf_counter()
    answer = agent.run("add", reset=True)
    elapsed = (time.perf_counter() - started) * 1000
    assert answer == 2, answer
    return elapsed


def main() -> None:
    runpython_executor = RunPythonExecutor(timeout=30)
    agents = {
        "runpython": CodeAgent(tools=[], model=OneStep(), executor=runpython_executor, verbosity_level=LogLevel.OFF),
        "local": CodeAgent(tools=[], model=OneStep(), executor=LocalPythonExecutor([]), verbosity_level=LogLevel.OFF),
    }
    times: dict[str, list[float]] = {name: [] for name in agents}
    for i in range(WARMUP + ROUNDS):
        for name, agent in agents.items():
            ms = step_ms(agent)
            if i >= WARMUP:
                times[name].append(ms)
    runpython_executor.cleanup()
    ours, local = statistics.median(times["runpython"]), statistics.median(times["local"])
    print(json.dumps({
        "smolagents_step_runpython_ms": round(ours, 3),
        "smolagents_step_local_ms": round(local, 3),
        "smolagents_step_overhead_ms": round(ours - local, 3),
    }))


if __name__ == "__main__":
    main()
