"""Runs an integration's example as a user runs it (`python example_<module>.py`)."""

from __future__ import annotations

import pathlib
import subprocess
import sys


def run_example(test_file: str) -> str:
    """Runs the example beside `test_file` and returns what it printed; it asserts its own answer."""
    here = pathlib.Path(test_file).resolve().parent
    [example] = here.glob("example_*.py")
    done = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=120, cwd=here)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout
