"""asyncio: many runs on one event loop, async tools on that loop, nothing blocked."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from runpython import RunPython


async def slow_square(x: int) -> int:
    """Square x after a short wait on the caller's loop."""
    await asyncio.sleep(0.2)
    return x * x


def test_sixteen_concurrent_aruns_on_one_event_loop() -> None:
    rp = RunPython(timeout=60, tools=[slow_square])
    before = threading.active_count()

    async def main() -> tuple[list[Any], float, float]:
        ticks = 0
        running = True

        async def ticker() -> None:
            nonlocal ticks
            while running:
                ticks += 1
                await asyncio.sleep(0.01)

        tick_task = asyncio.create_task(ticker())
        started = time.monotonic()
        envelopes = await asyncio.gather(*[rp.arun("slow_square(n) + n", inputs={"n": n}) for n in range(16)])
        elapsed = time.monotonic() - started
        running = False
        await tick_task
        return [e.return_value for e in envelopes], elapsed, ticks / elapsed

    values, elapsed, ticks_per_s = asyncio.run(main())
    assert values == [n * n + n for n in range(16)]
    # The loop kept turning while the 16 runs were in flight (it is never blocked by a run).
    assert ticks_per_s > 20, ticks_per_s
    # No thread per waiting run: the runtime's workers and blocking pool, not 16 more.
    assert threading.active_count() <= before + 2


def test_aresume_and_ahandle_tool_call(tmp_path) -> None:
    rp = RunPython(store=f"file://{tmp_path}", approvals=["approve"])

    async def main() -> Any:
        e = await rp.arun("approve('deploy?')")
        assert e.status == "suspended" and e.suspension is not None
        done = await rp.aresume(e.run_id, {e.suspension["id"]: "yes"})
        result = await rp.ahandle_tool_call("run_python", {"code": "6 * 7"})
        return done.return_value, result["return_value"]

    assert asyncio.run(main()) == ("yes", 42)


def test_arun_made_before_the_loop_runs_starts_when_awaited() -> None:
    rp = RunPython(tools=[slow_square])
    # The coroutine is made before asyncio.run starts the loop; it starts the run inside it.
    envelope = asyncio.run(rp.arun("slow_square(3)"))
    assert envelope.return_value == 9, envelope.error
    coroutine = rp.arun("1")
    assert asyncio.iscoroutine(coroutine)
    coroutine.close()  # never awaited: nothing was started
