"""A pydantic-ai agent with `RunPythonToolset`, driven by `FunctionModel`: the agent's own tool (taking its
RunContext deps) called from the code, a session across two calls, an error and an image the model sees."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from example_runner import run_example
from sandbox_png import PNG_CODE, png_size

from runpython.integrations.pydantic_ai import RunPythonToolset


@dataclasses.dataclass
class Shop:
    prices: dict[str, float]
    asked: list[str]


async def price(ctx: RunContext[Shop], item: str) -> float:
    """The price of an item, from the agent's deps."""
    ctx.deps.asked.append(item)
    return ctx.deps.prices[item]


def plain_double(x: int) -> int:
    """Doubles, without a context."""
    return 2 * x


CALLS = [
    {"code": "total = await price(item='kettle') + plain_double(x=3)\ntotal", "session_id": "pa-1"},
    {"code": "total * 2", "session_id": "pa-1"},
    {"code": "raise ValueError('no such shelf')"},
    {"code": PNG_CODE},
]


def returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [p for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, ToolReturnPart)]


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    assert {t.name for t in info.function_tools} == {"run_python", "get_run_artifact"}
    done = len(returns(messages))
    if done < len(CALLS):
        return ModelResponse(parts=[ToolCallPart("run_python", CALLS[done], tool_call_id=f"p{done}")])
    return ModelResponse(parts=[TextPart("done")])


def images_sent(messages: list[ModelMessage]) -> list[BinaryContent]:
    found: list[BinaryContent] = []
    for m in messages:
        if isinstance(m, ModelRequest):
            for part in m.parts:
                content = getattr(part, "content", None)
                items = content if isinstance(content, list) else [content]
                found += [c for c in items if isinstance(c, BinaryContent)]
    return found


def test_an_agent_runs_code_that_calls_its_own_tools_with_deps() -> None:
    shop = Shop(prices={"kettle": 24.0}, asked=[])
    agent = Agent(FunctionModel(model), deps_type=Shop, toolsets=[RunPythonToolset(tools=[price, plain_double],
                                                                                   timeout=20)])
    result = agent.run_sync("prices", deps=shop)
    assert result.output == "done"
    assert shop.asked == ["kettle"]  # the tool ran on the host, with the run's deps
    first, second, failed, drawn = [r.content for r in returns(result.all_messages())]
    assert first["return_value"] == 30.0 and first["session_id"] == "pa-1"
    assert second["return_value"] == 60.0  # the session kept `total`
    assert failed["status"] == "error" and failed["error"]["type"] == "ValueError"
    assert "no such shelf" in failed["error"]["message"]
    # The image went to the model as binary content, after the envelope.
    [image] = images_sent(result.all_messages())
    assert image.media_type == "image/png" and png_size(image.data) == (3, 2)
    assert "drawn" in str(drawn)


def test_the_code_sees_the_tools_without_their_context_parameter() -> None:
    toolset = RunPythonToolset(tools=[price], timeout=20)
    description = toolset.rp.tool_spec("anthropic")[0]["description"]
    assert "price(item: str)" in description and "ctx" not in description
    envelope = toolset.rp.run("price(item='kettle')")
    # Outside an agent's run there is no RunContext: the code gets the tool's error, not a crash.
    assert envelope.status == "error" and "RunContext" in envelope.error.message  # type: ignore[union-attr]


def test_get_run_artifact_reads_what_a_kept_run_stored() -> None:
    toolset = RunPythonToolset(timeout=20, store="memory://")

    async def go() -> Any:
        envelope = await toolset.rp.arun("print('x' * 50_000)")
        [stdout] = [a for a in envelope.artifacts if a.kind == "stdout"]
        return await toolset.get_run_artifact(stdout.id)

    fetched = asyncio.run(go())
    assert fetched["text"] == "x" * 50_000 + "\n"  # whole, where the envelope kept only head and tail


def test_the_example_runs_and_prints_its_answer() -> None:
    assert run_example(__file__).strip().splitlines()[-1] == '100 USD is 92.0 EUR.'


def test_with_errors_retry_a_failed_run_is_pydantic_ais_retry_prompt() -> None:
    def retrying(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        # pydantic-ai's retry prompt: the tool's return, with the outcome 'retried'.
        retries = [p for p in returns(messages) if p.outcome == "retried"]
        if not retries:
            return ModelResponse(parts=[ToolCallPart("run_python", {"code": "int('x')"}, tool_call_id="r1")])
        return ModelResponse(parts=[TextPart(f"retried after: {retries[0].content}")])

    agent = Agent(FunctionModel(retrying), toolsets=[RunPythonToolset(timeout=20, errors="retry", max_retries=2)])
    output = agent.run_sync("parse").output
    assert output.startswith("retried after: ") and '"type":"ValueError"' in output and "invalid literal" in output
