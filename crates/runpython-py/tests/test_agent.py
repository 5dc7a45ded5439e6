"""Agent loops: tool definitions per provider, and one call that answers them."""

from __future__ import annotations

import json

import pytest

from runpython import InvalidInputError, RunPython


def weather(city: str) -> dict[str, object]:
    """Today's weather in a city."""
    return {"city": city, "temp_c": 18}


@pytest.fixture(scope="module")
def rp() -> RunPython:
    return RunPython(tools=[weather])


@pytest.mark.parametrize(
    ("format", "key"), [("anthropic", "input_schema"), ("openai", "parameters"), ("mcp", "inputSchema")]
)
def test_tool_spec_in_each_providers_shape(rp: RunPython, format: str, key: str) -> None:
    spec = rp.tool_spec(format)  # type: ignore[arg-type]
    tools = [t["function"] if format == "openai" else t for t in spec]
    # `resume` is offered only by an engine that can suspend (approvals, a store).
    assert [t["name"] for t in tools] == ["run_python", "get_run_artifact", "close_session"]
    assert "def weather(city: str) -> Any:" in tools[0]["description"]
    assert tools[0][key]["required"] == ["code"]


def test_handle_tool_call_takes_a_dict_or_json_text(rp: RunPython) -> None:
    out = rp.handle_tool_call("run_python", {"code": "weather(city)['temp_c'] + 1", "inputs": {"city": "Oslo"}})
    assert out["status"] == "success" and out["return_value"] == 19
    out = rp.handle_tool_call("run_python", json.dumps({"code": "1/0"}))
    assert out["status"] == "error" and out["error"]["type"] == "ZeroDivisionError"  # an outcome, not raised


def test_handle_tool_call_keeps_a_session_until_close_session(rp: RunPython) -> None:
    first = rp.handle_tool_call("run_python", {"code": "total = 40", "session_id": "agent-loop"})
    assert first["status"] == "success" and first["session_id"] == "agent-loop" and first["cell"] == 1
    second = rp.handle_tool_call("run_python", {"code": "total + 2", "session_id": "agent-loop"})
    assert (second["return_value"], second["cell"]) == (42, 2), second
    assert rp.handle_tool_call("close_session", {"session_id": "agent-loop"}) == {"closed": True}
    after = rp.handle_tool_call("run_python", {"code": "'total' in globals()", "session_id": "agent-loop"})
    assert (after["return_value"], after["cell"]) == (False, 1), after
    rp.handle_tool_call("close_session", {"session_id": "agent-loop"})


def test_handle_tool_call_rejects_bad_calls(rp: RunPython) -> None:
    with pytest.raises(InvalidInputError):
        rp.handle_tool_call("run_python", {})
    with pytest.raises(InvalidInputError, match="not valid JSON"):
        rp.handle_tool_call("run_python", "{not json")
    with pytest.raises(InvalidInputError):
        rp.handle_tool_call("no_such_tool", {})
