"""Sessions: state kept across cells, isolated from other sessions, reset, closed, restored from a store on
another engine; sync, async and as context managers."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import decimal
import pathlib
import time

import pytest

from runpython import ConfigError, Envelope, InvalidInputError, RunPython, Session


@pytest.fixture(scope="module")
def rp() -> RunPython:
    return RunPython(timeout=30, pool=False)


def test_state_is_kept_across_cells(rp: RunPython) -> None:
    with rp.session() as s:
        first = s.run("import json\nx = 41\ndef bump(v):\n    return v + 1\nprint('one')")
        assert first.status == "success", first.error
        assert (first.stdout, first.cell, first.session_id) == ("one\n", 1, s.id)
        second = s.run("print('two')\n[bump(x), json.dumps(1)]")
        assert second.return_value == [42, "1"], second.error
        assert (second.stdout, second.cell) == ("two\n", 2)
        assert second.restored is False


def test_an_exception_keeps_the_state(rp: RunPython) -> None:
    with rp.session() as s:
        e = s.run("data = [1, 2]\nraise ValueError('boom')")
        assert e.status == "error" and e.error is not None and e.error.type == "ValueError"
        assert s.run("len(data)").return_value == 2


def test_two_sessions_never_see_each_other(rp: RunPython) -> None:
    with rp.session() as a, rp.session() as b:
        assert a.id != b.id
        a.run("secret = 'a-only'\nopen('mine.txt', 'w').write('a')")
        e = b.run("import os\n['secret' in globals(), os.path.exists('mine.txt')]")
        assert e.return_value == [False, False], e.error
        assert a.run("secret").return_value == "a-only"


def test_reset_forgets_the_state_and_numbers_cells_from_one(rp: RunPython) -> None:
    with rp.session() as s:
        s.run("x = 1")
        s.run("y = 2")
        s.reset()
        e = s.run("'x' in globals()")
        assert (e.return_value, e.cell) == (False, 1), e.error


def test_a_cell_after_close_starts_a_new_empty_session(rp: RunPython) -> None:
    s = rp.session()
    s.run("x = 1")
    s.close()
    e = s.run("'x' in globals()")
    assert (e.return_value, e.cell, e.session_id) == (False, 1, s.id), e.error
    s.close()


def test_leaving_the_with_block_closes_the_session(rp: RunPython) -> None:
    with rp.session(id="with-block-closes") as s:
        s.run("x = 1")
    # The same id again: a new, empty session, since the block closed the first.
    again = rp.session(id="with-block-closes")
    e = again.run("'x' in globals()")
    assert (e.return_value, e.cell) == (False, 1), e.error
    again.close()


def test_an_exception_in_the_with_block_propagates_and_the_session_is_closed(rp: RunPython) -> None:
    with pytest.raises(KeyError):
        with rp.session(id="raised-in-block") as s:
            s.run("x = 1")
            raise KeyError("from the block")
    assert rp.session(id="raised-in-block").run("'x' in globals()").return_value is False
    rp.session(id="raised-in-block").close()


def test_async_cells_and_async_with(rp: RunPython) -> None:
    async def main() -> tuple[Envelope, Envelope, str]:
        async with rp.session() as s:
            first = await s.arun("import asyncio\nasync def twice(v):\n    await asyncio.sleep(0)\n    return 2 * v")
            second = await s.arun("await twice(21)")
            await s.areset()
            third = await s.arun("'twice' in globals()")
            sid = s.id
        after = await rp.session(id=sid).arun("'twice' in globals()")
        await rp.session(id=sid).aclose()
        assert first.status == "success", first.error
        return second, third, str(after.return_value)

    second, third, after = asyncio.run(main())
    assert second.return_value == 42 and second.cell == 2, second.error
    assert third.return_value is False and third.cell == 1
    assert after == "False"


def test_started_cells_stream_their_output_and_keep_the_state(rp: RunPython) -> None:
    with rp.session() as s:
        s.run("n = 3")
        handle = s.start("for i in range(n):\n    print(i, flush=True)\nn * 2")
        seen = [event.text or "" for event in handle if event.kind == "stdout"]
        e = handle.wait()
        assert "".join(seen) == "0\n1\n2\n"
        assert (e.return_value, e.cell, e.session_id) == (6, 2, s.id), e.error


def test_cells_take_inputs_and_report_their_repr_when_asked(rp: RunPython) -> None:
    with rp.session() as s:
        e = s.run("x * 2", inputs={"x": "ab"}, repr=True)
        assert (e.return_value, e.return_repr) == ("abab", "'abab'"), e.error
        assert s.run("x").return_repr is None  # only when asked


def test_a_session_is_restored_from_a_file_store_on_a_second_engine(tmp_path: pathlib.Path) -> None:
    calls: list[int] = []

    def charge(amount: int) -> int:
        """Charge once per call."""
        calls.append(amount)
        return len(calls)

    url = f"file://{tmp_path}"
    first = RunPython(timeout=30, pool=False, store=url, tools=[charge])
    s = first.session(id="restored-on-a-second-engine")
    assert s.run("x = 41\nreceipt = charge(amount=5)").status == "success"
    assert s.run("y = x + 1").cell == 2
    del s, first  # the first host is gone, and its interpreter with it

    second = RunPython(timeout=30, pool=False, store=url, tools=[charge])
    e = second.session(id="restored-on-a-second-engine").run("[y, receipt]")
    assert e.status == "success", e.error
    assert e.restored is True and e.cell == 3
    assert e.return_value == [42, 1]
    assert calls == [5], "the replay answered the tool call from its journal instead of calling again"
    d = e.to_dict()
    assert (d["session_id"], d["cell"], d["restored"]) == ("restored-on-a-second-engine", 3, True)
    # Not restored again: the interpreter is live now.
    assert second.session(id="restored-on-a-second-engine").run("y").restored is False
    second.session(id="restored-on-a-second-engine").close()


@dataclasses.dataclass
class Point:
    x: int
    y: int


SUMMARY = "[open('data.csv').read(), repr(kept), [type(v).__name__ for v in kept], str(amount * 3)]"


@pytest.mark.parametrize("snapshots", [True, False])
def test_files_and_exact_values_survive_a_restore_on_a_second_engine(tmp_path: pathlib.Path, snapshots: bool) -> None:
    url = f"file://{tmp_path}"
    sessions = {"replay_budget": 30} if snapshots else {"snapshot_max_bytes": 0, "replay_budget": 30}
    first = RunPython(timeout=30, pool=False, store=url, sessions=sessions)  # type: ignore[arg-type]
    s = first.session(id="exact")
    inputs = {
        "when": datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.timezone.utc),
        "amount": decimal.Decimal("1.10"),
        "tags": {3, 1},
        "point": Point(1, 2),
    }
    cell = "import time\ntime.sleep(0.05)\nkept = (when, amount, tags, point)"
    assert s.run(cell, inputs=inputs, files={"data.csv": b"a,b\n1,2\n"}).status == "success"
    expected = s.run(SUMMARY)
    assert expected.status == "success", expected.error
    assert expected.return_value[2] == ["datetime", "Decimal", "set", "Point"]
    del s, first  # the first host is gone, and its interpreter with it

    second = RunPython(timeout=30, pool=False, store=url, sessions=sessions)  # type: ignore[arg-type]
    e = second.session(id="exact").run(SUMMARY)
    assert e.status == "success", e.error
    assert e.return_value == expected.return_value
    assert e.restore is not None and e.restore["from"] == ("snapshot" if snapshots else "replay"), e.restore
    assert e.to_dict()["restore"] == e.restore
    second.session(id="exact").close()


def test_closing_a_session_ends_its_interpreter(no_children_left: None) -> None:
    engine = RunPython(timeout=30, pool=False)
    s = engine.session()
    assert s.run("import time\nstarted = time.time()").status == "success"
    s.close()  # the fixture checks that no process of it is left


def test_a_session_idle_past_its_setting_says_it_was_lost() -> None:
    rp = RunPython(timeout=30, pool=False, sessions={"idle": 0.5, "max_live": 4})
    s = rp.session()
    s.run("x = 1")
    time.sleep(1.5)  # past `idle`: the interpreter is expired, and the next cell says so
    e = s.run("x")
    assert e.status == "error" and e.error is not None and e.error.type == "SessionLost", e
    s.close()


def test_bad_session_ids_and_settings_are_refused(rp: RunPython) -> None:
    with pytest.raises(InvalidInputError, match="session id"):
        rp.session(id="has spaces")
    with pytest.raises(TypeError):
        rp.session(id=7)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match='sessions has no setting "idel"'):
        RunPython(sessions={"idel": 5})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="snapshot_max_bytes"):
        RunPython(sessions={"snapshot_max_bytes": -1})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="sessions must be a dict"):
        RunPython(sessions=3)  # type: ignore[arg-type]


def test_session_repr_and_type(rp: RunPython) -> None:
    s = rp.session(id="named-session")
    assert isinstance(s, Session)
    assert s.id == "named-session" and repr(s) == "Session(id='named-session')"
