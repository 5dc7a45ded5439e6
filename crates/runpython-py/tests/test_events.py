"""Started runs: events streamed with `for` and `async for`, cancellation, and asyncio cancellation."""

from __future__ import annotations

import asyncio
import time

import pytest

from runpython import CancelledError, RunPython

SLOW_PRINTER = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.2)\ndone(i)"


def done(n: int) -> str:
    """Report the end."""
    return f"done {n}"


async def adone(n: int) -> str:
    await asyncio.sleep(0.01)
    return f"adone {n}"


@pytest.fixture(scope="module")
def rp() -> RunPython:
    return RunPython(timeout=30, pool=False, tools=[done, adone])


def test_for_loop_streams_output_as_it_happens_then_tool_events(rp: RunPython) -> None:
    handle = rp.start(SLOW_PRINTER)
    seen = []
    started = time.monotonic()
    for event in handle:
        seen.append((event.kind, event.text or event.data, time.monotonic() - started))
    kinds = [k for k, _, _ in seen]
    assert kinds == ["stdout", "stdout", "stdout", "tool_call", "tool_result"], seen
    assert [t for k, t, _ in seen if k == "stdout"] == ["0\n", "1\n", "2\n"]
    assert seen[0][2] < seen[2][2] - 0.3  # the first line came before the run ended
    call, result = seen[3][1], seen[4][1]
    assert isinstance(call, dict) and isinstance(result, dict)
    assert call["name"] == "done" and call["arguments"] == {"n": 2}
    assert result["id"] == call["id"] and result["ok"] and result["result"] == "done 2"
    envelope = handle.wait()
    assert envelope.return_value == "done 2" and envelope.stdout == "0\n1\n2\n"
    assert handle.wait() == envelope  # the outcome is kept


def test_async_for_streams_events_and_await_gives_the_envelope(rp: RunPython) -> None:
    async def main() -> tuple[list[str], object]:
        handle = rp.start("print('a')\nimport sys\nprint('b', file=sys.stderr)\nadone(1)")
        kinds: list[str] = [event.kind async for event in handle]
        envelope = await handle
        return kinds, envelope.return_value

    kinds, value = asyncio.run(main())
    assert sorted(kinds[:2]) == ["stderr", "stdout"] and kinds[2:] == ["tool_call", "tool_result"]
    assert value == "adone 1"


def test_a_failing_tool_reports_its_error_in_the_event(rp: RunPython) -> None:
    handle = rp.start("done('not an int')")
    events = [e for e in handle if e.kind == "tool_result"]
    assert events[0].data is not None and events[0].data["ok"] is False
    assert events[0].data["error"]["type"] == "TypeError"
    assert handle.wait().error is not None


def test_cancel_kills_the_run_and_wait_raises_cancelled(rp: RunPython, no_children_left: None) -> None:
    handle = rp.start("import time\nprint('up', flush=True)\ntime.sleep(60)")
    first = next(iter(handle))
    assert first.text == "up\n"
    started = time.monotonic()
    handle.cancel()
    with pytest.raises(CancelledError):
        handle.wait()
    assert time.monotonic() - started < 5
    assert list(handle) == []


def test_cancel_from_another_thread_wakes_a_blocked_iteration(rp: RunPython, no_children_left: None) -> None:
    import threading

    handle = rp.start("import time\ntime.sleep(60)")
    threading.Timer(0.5, handle.cancel).start()
    started = time.monotonic()
    assert list(handle) == []  # the iteration ends when the run is stopped
    assert time.monotonic() - started < 5
    with pytest.raises(CancelledError):
        handle.wait()


def test_cancel_before_reading_anything(rp: RunPython, no_children_left: None) -> None:
    handle = rp.start("import time\ntime.sleep(60)")
    handle.cancel()

    async def main() -> None:
        with pytest.raises(CancelledError):
            await handle

    asyncio.run(main())


def test_cancelling_the_awaiting_task_stops_the_run(rp: RunPython, no_children_left: None) -> None:
    async def main() -> float:
        task = asyncio.create_task(rp.arun("import time\ntime.sleep(60)"))
        await asyncio.sleep(0.5)
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - started

    assert asyncio.run(main()) < 2


def test_dropping_a_handle_stops_the_run(rp: RunPython, no_children_left: None) -> None:
    handle = rp.start("import time\nprint('up', flush=True)\ntime.sleep(60)")
    assert next(iter(handle)).text == "up\n"
    del handle  # the fixture checks that nothing is left


def test_dependency_progress_is_streamed_before_the_code_runs(rp: RunPython) -> None:
    handle = rp.start("import six\nsix.__version__", dependencies=["six==1.16.0"])
    events = list(handle)
    steps = [e.data["step"] for e in events if e.kind == "dependencies" and e.data is not None]
    assert steps, [repr(e) for e in events]
    assert steps[-1] in ("done", "cached"), steps
    assert all(e.text for e in events if e.kind == "dependencies")
    assert handle.wait().return_value == "1.16.0"
