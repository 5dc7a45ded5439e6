"""Shared helpers for the runpython package's tests. They run against the installed wheel (cargo xtask ci
builds it, installs it into a fresh venv and runs pytest there)."""

from __future__ import annotations

import os
import time

import pytest


def children_of(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces: fields follow the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[1]) == pid:
            found.append(int(entry))
    return found


def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.fixture
def no_children_left():
    """Asserts, after the test, that no process the test's runs started is left (the engines the test
    uses must have the pool off: pooled interpreters are children that wait on purpose)."""
    yield
    assert wait_until(lambda: children_of(os.getpid()) == []), children_of(os.getpid())
