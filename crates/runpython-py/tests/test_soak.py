"""A soak: 1,000 runs (half of them calling a plain Python tool, half an async one, some streamed) leave
the host's memory and open descriptors where a warm-up left them."""

from __future__ import annotations

import asyncio
import os
import time

from runpython import RunPython

RUNS = 1000
WARM_UP = 200
# Allowed RSS growth from the end of the warm-up to the end: a leak of 8 KiB per run would pass it.
RSS_SLACK_KIB = 6 * 1024


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


# The engine keeps up to 4 empty network namespaces ready (refilled in the background after each run),
# held as descriptors: their number at a given moment depends on timing, so they are counted apart.
READY_NETNS = 4


def open_fds() -> tuple[int, int]:
    """Descriptors open in this process: (all but ready network namespaces, ready network namespaces)."""
    other = netns = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the descriptor listing the directory itself, closed since
            continue
        if target.startswith("net:["):
            netns += 1
        else:
            other += 1
    return other, netns


def settled_fds(baseline: int | None) -> tuple[int, int]:
    """`open_fds()` once a finished run's background work is done (its directory is removed on a worker
    thread after the envelope is returned, holding a descriptor for a moment): waits up to 2 s for the
    count to come back to `baseline`. A leaked descriptor never does."""
    deadline = time.monotonic() + 2
    best = open_fds()
    while baseline is not None and best[0] > baseline and time.monotonic() < deadline:
        time.sleep(0.01)
        now = open_fds()
        best = min(best, now)
    return best


def inc(x: int) -> int:
    """x + 1."""
    return x + 1


async def ainc(x: int) -> int:
    """x + 1, awaited."""
    await asyncio.sleep(0)
    return x + 1


def test_a_thousand_runs_leak_no_memory_and_no_descriptors() -> None:
    # The pool off: its interpreters hold descriptors by design, refilled in the background.
    rp = RunPython(timeout=30, pool=False, tools=[inc, ainc])
    samples: list[tuple[int, int, int]] = []
    netns_seen: list[int] = []
    for i in range(RUNS):
        if i % 10 == 9:
            handle = rp.start("print(x)\ninc(x)", inputs={"x": i})
            kinds = [event.kind for event in handle]
            envelope = handle.wait()
            assert "stdout" in kinds
        elif i % 2:
            envelope = rp.run("ainc(x)", inputs={"x": i})
        else:
            envelope = rp.run("inc(x)", inputs={"x": i})
        assert envelope.return_value == i + 1, envelope.error
        if i + 1 >= WARM_UP and (i + 1) % 100 == 0:
            fds, netns = settled_fds(samples[0][2] if samples else None)
            samples.append((i + 1, rss_kib(), fds))
            netns_seen.append(netns)
    print("runs, VmRSS KiB, open fds:", samples, "ready network namespaces:", netns_seen)
    _, rss_after_warm_up, fds_after_warm_up = samples[0]
    _, rss_end, fds_end = samples[-1]
    assert rss_end - rss_after_warm_up <= RSS_SLACK_KIB, samples
    assert max(fds for _, _, fds in samples) <= fds_after_warm_up, samples
    assert fds_end <= fds_after_warm_up, samples  # one the warm-up held may have closed since
    assert max(netns_seen) <= READY_NETNS, netns_seen
