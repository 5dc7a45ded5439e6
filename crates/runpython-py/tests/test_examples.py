"""The examples run as a user runs them, and print their answers."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str) -> str:
    done = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_plain_agent_loop_refunds_through_host_tools() -> None:
    assert run_example("agent_loop.py").strip() == "Done: refunded 60.0 to ada (refund 60.0)."


@pytest.mark.skipif(importlib.util.find_spec("pydantic_ai") is None, reason="pydantic-ai is not installed")
def test_the_pydantic_ai_agent_fans_out_to_an_async_tool() -> None:
    assert run_example("pydantic_ai_agent.py").strip() == "4 items cost 55.00 in all."
