"""The integrations' modules without their frameworks: importing runpython imports none of them, and a
module whose framework is missing says which extra to install. (Each integration's own tests run in a venv
with its extra: tests_integrations/, `cargo xtask integrations`.)"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

# (module, the framework's import name, the extra)
INTEGRATIONS = [
    ("smolagents", "smolagents", "smolagents"),
    ("langchain", "langchain_core", "langchain"),
    ("deepagents", "deepagents", "deepagents"),
    ("pydantic_ai", "pydantic_ai", "pydantic-ai"),
    ("openai_agents", "agents", "openai-agents"),
    ("fastmcp", "fastmcp", "fastmcp"),
]


def test_importing_runpython_imports_no_framework() -> None:
    frameworks = [framework for _, framework, _ in INTEGRATIONS]
    code = ("import sys, runpython, runpython.integrations\n"
            f"print([m for m in {frameworks!r} if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("module,framework,extra", INTEGRATIONS)
def test_a_missing_framework_names_its_extra(module: str, framework: str, extra: str) -> None:
    if importlib.util.find_spec(framework) is not None:
        pytest.skip(f"{framework} is installed in this venv, so its module imports")
    with pytest.raises(ImportError, match=rf'pip install "runpython\[{extra}\]"'):
        importlib.import_module(f"runpython.integrations.{module}")
