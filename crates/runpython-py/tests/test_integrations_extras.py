"""The integrations' modules without their frameworks: importing runpython imports none of them, and a
module whose framework is missing says which extra to install. (Each integration's own tests run in a venv
with its extra: tests_integrations/, `cargo xtask integrations`.)"""

from __future__ import annotations

import importlib.util
import pathlib
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


def test_each_integration_is_an_extra_of_the_package() -> None:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the stdlib from Python 3.11")
    pyproject = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    for module, framework, extra in INTEGRATIONS:
        assert extra in extras, f"runpython.integrations.{module} has no extra {extra!r} in pyproject.toml"
        modules = pathlib.Path(__file__).resolve().parent.parent / "python/runpython/integrations"
        assert (modules / f"{module}.py").exists()
