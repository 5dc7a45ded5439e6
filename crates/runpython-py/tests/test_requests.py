"""What a request carries besides code: a per-run environment, and each tool call's idempotency key; and
what the envelope says about it (session fields, `kept`, `store_error`) and a durable run's first event."""

from __future__ import annotations

import asyncio
import json
import pathlib
import shutil

import pytest

import runpython
from runpython import InvalidInputError, RunPython, current_call_id

READ_ENV = "import os\n[os.environ.get('API_TOKEN'), os.environ.get('REGION')]"


@pytest.fixture(scope="module")
def rp() -> RunPython:
    return RunPython(timeout=30, pool=False)


def test_env_reaches_the_code_for_that_run_only(rp: RunPython) -> None:
    e = rp.run(READ_ENV, env={"API_TOKEN": "s3cret=!", "REGION": "eu"})
    assert e.return_value == ["s3cret=!", "eu"], e.error
    assert rp.run(READ_ENV).return_value == [None, None]


def test_env_reaches_async_and_started_runs_and_cells(rp: RunPython) -> None:
    async def arun() -> object:
        return (await rp.arun(READ_ENV, env={"REGION": "us"})).return_value

    assert asyncio.run(arun()) == [None, "us"]
    assert rp.start(READ_ENV, env={"API_TOKEN": "t"}).wait().return_value == ["t", None]
    with rp.session() as s:
        assert s.run(READ_ENV, env={"REGION": "ap"}).return_value == [None, "ap"]


def test_env_values_are_masked_in_what_is_kept(tmp_path: pathlib.Path) -> None:
    rp = RunPython(timeout=30, pool=False, store=f"file://{tmp_path}", max_output_chars=100)
    code = "import os\nprint('x' * 5000)\nprint('token', os.environ['API_TOKEN'])"
    e = rp.run(code, env={"API_TOKEN": "hunter2-hunter2"})
    assert e.stdout.endswith("token hunter2-hunter2\n"), "the caller sees its own value"
    assert e.truncated is not None
    whole = rp.get_run_artifact(e.truncated["stdout"]["artifact"])  # the whole stream, as kept
    assert whole.startswith(b"x" * 5000) and whole.endswith(b"token [REDACTED:API_TOKEN]\n")
    stored = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert b"hunter2-hunter2" not in stored, "the value reached the store"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PORT": 8080}, "env[\"PORT\"] must be a str, got int 8080"),
        ({"DEBUG": None}, "env[\"DEBUG\"] must be a str, got NoneType None"),
        ({1: "x"}, "env names must be str, got int 1"),
        (["A=1"], "env must be a dict of str names to str values, got list"),
    ],
)
def test_env_of_the_wrong_type_is_a_type_error_naming_the_key(rp: RunPython, env: object, message: str) -> None:
    with pytest.raises(TypeError) as raised:
        rp.run("1", env=env)  # type: ignore[arg-type]
    assert message in str(raised.value)
    with rp.session() as s, pytest.raises(TypeError) as raised:
        s.run("1", env=env)  # type: ignore[arg-type]
    assert message in str(raised.value)


def test_env_names_the_environment_cannot_hold_are_invalid_input(rp: RunPython) -> None:
    with pytest.raises(InvalidInputError, match="must be non-empty, without `=`"):
        rp.run("1", env={"A=B": "x"})
    with pytest.raises(InvalidInputError, match="NUL"):
        rp.run("1", env={"A": "x\0y"})
    with rp.session() as s:
        s.run("x = 'kept'")
        with pytest.raises(InvalidInputError, match="must be non-empty, without `=`"):
            s.run("1", env={"A=B": "x"})
        e = s.run("x")
        assert (e.return_value, e.cell) == ("kept", 2), "the refused cell ended the session"


def test_a_tool_reads_its_call_id(rp: RunPython) -> None:
    seen: list[str | None] = []

    def record(tag: str) -> str | None:
        """Record the call's id."""
        seen.append(current_call_id())
        return current_call_id()

    async def arecord(tag: str) -> str | None:
        """Record the call's id, asynchronously."""
        await asyncio.sleep(0)
        seen.append(current_call_id())
        return current_call_id()

    engine = RunPython(timeout=30, pool=False, tools=[record, arecord])
    e = engine.run("[record('a'), arecord('b'), record('c')]")
    assert e.status == "success", e.error
    ids = [f"{e.run_id}.0", f"{e.run_id}.1", f"{e.run_id}.2"]
    assert e.return_value == ids and seen == ids
    assert current_call_id() is None  # outside a tool call

    async def main() -> runpython.Envelope:
        return await engine.arun("arecord('x')")

    e = asyncio.run(main())
    assert e.return_value == f"{e.run_id}.0", e.error
    with engine.session() as s:
        e = s.run("record('cell')")
        assert e.return_value == f"{e.run_id}.0", e.error


def test_a_tool_with_a_call_id_parameter_keeps_it_as_an_argument() -> None:
    def lookup(call_id: str) -> str:
        """Look up a phone call by its id."""
        return f"call {call_id}"

    engine = RunPython(timeout=30, pool=False, tools=[lookup])
    e = engine.run("lookup(call_id='C-7')")
    assert e.return_value == "call C-7", e.error


def test_session_envelopes_have_their_fields_in_every_form(rp: RunPython) -> None:
    plain = rp.run("1")
    assert (plain.session_id, plain.cell, plain.restored, plain.return_repr) == (None, None, False, None)
    assert (plain.kept, plain.store_error) == (True, None)
    assert not {"session_id", "cell", "restored", "return_repr", "kept", "store_error"} & set(plain.to_dict())
    with rp.session(id="envelope-fields") as s:
        e = s.run("'a' * 2", repr=True)
        d = e.to_dict()
        assert (d["session_id"], d["cell"], d["return_repr"]) == ("envelope-fields", 1, "'aa'")
        assert "restored" not in d  # absent unless true, as in the JSON contract
        assert json.loads(e.to_json()) == d
        assert "session_id='envelope-fields', cell=1" in repr(e)


def test_a_store_failing_after_the_code_ran_is_named_in_the_envelope(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    rp = RunPython(timeout=30, pool=False, store=f"file://{root}")
    shutil.rmtree(root)
    root.write_bytes(b"not a directory")  # the store breaks under the engine
    e = rp.run("print('did it')\n6 * 7", memo=False)
    assert e.status == "success" and e.return_value == 42 and e.stdout == "did it\n", e.error
    assert e.kept is False
    assert e.store_error is not None and str(root) in e.store_error
    d = e.to_dict()
    assert d["kept"] is False and d["store_error"] == e.store_error
    assert "kept=False" in repr(e)


def test_a_durable_run_says_its_id_before_the_code_starts(tmp_path: pathlib.Path) -> None:
    rp = RunPython(timeout=30, pool=False, store=f"file://{tmp_path}", durable=True)
    handle = rp.start("print('started', flush=True)\n7")
    events = list(handle)
    assert events and events[0].kind == "resumable", [repr(e) for e in events]
    data = events[0].data
    assert data is not None
    e = handle.wait()
    assert data["run_id"] == e.run_id and e.run_id in (events[0].text or "")
    assert [ev.kind for ev in events[1:]] == ["stdout"]


def test_calls_of_tools_that_are_not_python_callables_are_events(tmp_path: pathlib.Path) -> None:
    rp = RunPython(timeout=30, pool=False, store=f"file://{tmp_path}", approvals=["approve"])
    handle = rp.start("approve(amount=5)")
    events = [(e.kind, e.data) for e in handle]
    assert ("tool_call", {"name": "approve"}) in events, events
    assert handle.wait().status == "suspended"
