"""Human in the loop: approval tools and Python tools that suspend, resumed from a file store."""

from __future__ import annotations

import pytest

import runpython
from runpython import InvalidInputError, RunPython


def charge(amount: float) -> dict[str, float]:
    """Charge a card; amounts over 100 need a person's approval."""
    if amount > 100:
        raise runpython.Suspend({"question": f"charge {amount}?"})
    return {"charged": amount}


def test_an_approval_suspends_and_resume_continues_with_the_decision(tmp_path) -> None:
    store = f"file://{tmp_path}"
    rp = RunPython(store=store, approvals=["request_approval"])
    e = rp.run("print('before')\nok = request_approval({'action': 'delete', 'rows': 3})\n['after', ok]")
    assert e.status == "suspended"
    assert e.suspension is not None
    assert e.suspension["tool"] == "request_approval"
    assert rp.pending_suspensions(e.run_id) == [e.suspension["id"]]
    # Another engine on the same store resumes it: nothing but the store is shared.
    other = RunPython(store=store, approvals=["request_approval"])
    done = other.resume(e.run_id, {e.suspension["id"]: {"approved": True}})
    assert done.status == "success" and done.run_id == e.run_id
    assert done.return_value == ["after", {"approved": True}]
    with pytest.raises(InvalidInputError, match="already finished"):
        other.resume(e.run_id, {e.suspension["id"]: True})


def test_resume_with_an_unknown_suspension_id_is_invalid_input(tmp_path) -> None:
    rp = RunPython(store=f"file://{tmp_path}", approvals=["request_approval"])
    e = rp.run("request_approval('x')")
    with pytest.raises(InvalidInputError, match="has no suspension"):
        rp.resume(e.run_id, {"nope": True})


def test_a_python_tool_can_suspend_the_run(tmp_path) -> None:
    rp = RunPython(store=f"file://{tmp_path}", durable=True, tools=[charge])
    e = rp.run("[charge(20), charge(500)]")
    assert e.status == "suspended", e.error
    assert e.suspension is not None
    assert e.suspension["tool"] == "charge" and e.suspension["args"] == {"question": "charge 500.0?"}
    done = rp.resume(e.run_id, {e.suspension["id"]: {"charged": 500, "approved_by": "ada"}})
    assert done.return_value == [{"charged": 20.0}, {"charged": 500, "approved_by": "ada"}], done.error


def test_resume_without_a_store_is_a_config_error() -> None:
    with pytest.raises(runpython.ConfigError, match="resume needs the store"):
        RunPython().resume("r1", {})
