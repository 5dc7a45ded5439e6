"""Exact values across the boundary: what Python hands a run, a run returns, and a tool takes and
gives comes back as the same objects (runpython's tagged JSON), while the JSON envelope stays JSON."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import pathlib
import typing
import uuid
import zoneinfo
from typing import Any

import pytest

from runpython import InvalidInputError, RunPython


@dataclasses.dataclass
class Point:
    x: int
    y: tuple[int, ...] = (0,)


@dataclasses.dataclass(frozen=True)
class Frozen:
    name: str
    when: datetime.date


class Pair(typing.NamedTuple):
    left: int
    right: str


PARIS = zoneinfo.ZoneInfo("Europe/Paris")
NEW_YORK = zoneinfo.ZoneInfo("America/New_York")

# Every type the issue lists, alone and nested.
VALUES: list[Any] = [
    (1, "a"),
    (),
    {1, 2, 3},
    frozenset({"x"}),
    b"\x00\xffbytes",
    bytearray(b"mutable"),
    datetime.date(2024, 2, 29),
    datetime.time(23, 59, 58, 123456),
    datetime.time(1, 2, tzinfo=datetime.timezone(datetime.timedelta(hours=-3))),
    datetime.datetime(2024, 6, 1, 12, 30, tzinfo=PARIS),
    datetime.datetime(2021, 11, 7, 1, 30, tzinfo=NEW_YORK, fold=1),  # the second 1:30 of that night
    datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=5, minutes=30), "IST")),
    datetime.datetime(2024, 1, 1, 8, 0, 0, 1),
    datetime.timedelta(days=-2, seconds=3, microseconds=4),
    decimal.Decimal("3.14159265358979323846264338327950288"),
    decimal.Decimal("-0.00"),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    complex(1.5, -2),
    pathlib.PurePosixPath("/data/in.csv"),
    pathlib.Path("relative/out.txt"),
    float("inf"),
    {1: "one", (2, 3): "pair", None: "none", 1.5: "float"},
    {"$rp": "a dict that looks like a tag"},
    [(1, 2), {"k": {b"v"}}],
    2**200,
]


def _same(a: Any, b: Any) -> bool:
    """Equal, of the same type all the way down, and for datetimes the same zone and fold."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (datetime.datetime, datetime.time)):
        return a == b and a.tzinfo == b.tzinfo and a.fold == b.fold and a.tzname() == b.tzname()
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) and a != a:
        return b != b
    return bool(a == b)


@pytest.fixture(scope="module")
def rp() -> RunPython:
    return RunPython(timeout=30)


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_an_input_comes_back_as_itself(rp: RunPython, value: Any) -> None:
    e = rp.run("value", inputs={"value": value})
    assert e.ok, e.error
    assert _same(e.return_value, value), (e.return_value, value)
    assert e.return_type == type(value).__name__


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_a_tool_takes_and_gives_exact_values(value: Any) -> None:
    seen: list[Any] = []

    def echo(item: Any) -> Any:
        seen.append(item)
        return item

    rp = RunPython(timeout=30, tools=[echo])
    # The code checks, in the run, what the tool gave back; the host checks what the tool got.
    e = rp.run("back = echo(value)\nassert type(back) is type(value), (type(back), type(value))\nback",
               inputs={"value": value})
    assert e.ok, e.error
    assert len(seen) == 1 and _same(seen[0], value), seen
    assert _same(e.return_value, value)


def test_values_the_code_makes_are_returned_exactly(rp: RunPython) -> None:
    e = rp.run(
        "import datetime, decimal, uuid, pathlib, zoneinfo\n"
        "(datetime.datetime(2024, 6, 1, 12, tzinfo=zoneinfo.ZoneInfo('Europe/Paris')), {1, 2}, (3,),"
        " decimal.Decimal('1.10'), uuid.UUID(int=7), pathlib.PurePosixPath('/x'), 2j, b'raw',"
        " {(1, 2): frozenset({3})}, datetime.timedelta(hours=1))"
    )
    assert e.ok, e.error
    expected = (datetime.datetime(2024, 6, 1, 12, tzinfo=PARIS), {1, 2}, (3,), decimal.Decimal("1.10"),
                uuid.UUID(int=7), pathlib.PurePosixPath("/x"), 2j, b"raw", {(1, 2): frozenset({3})},
                datetime.timedelta(hours=1))
    assert _same(e.return_value, expected)


def test_dataclasses_and_namedtuples_come_back_as_their_class(rp: RunPython) -> None:
    values = {"p": Point(1, (2, 3)), "f": Frozen("a", datetime.date(2024, 1, 1)), "t": Pair(1, "b")}
    e = rp.run("# the run has stand-ins with the fields as attributes\n"
               "assert p.x == 1 and f.when.year == 2024 and t.right == 'b' and t[0] == 1\n"
               "[p, f, t]", inputs=values)
    assert e.ok, e.error
    p, f, t = e.return_value
    assert type(p) is Point and p == Point(1, (2, 3))
    assert type(f) is Frozen and f == values["f"]
    assert type(t) is Pair and t == Pair(1, "b")


def test_a_class_the_host_does_not_have_is_a_dict_with_its_name(rp: RunPython) -> None:
    e = rp.run("import dataclasses, typing\n"
               "@dataclasses.dataclass\nclass Only:\n    a: int\n    b: tuple\n"
               "class Row(typing.NamedTuple):\n    n: int\n"
               "[Only(1, (2,)), Row(5)]")
    assert e.ok, e.error
    only, row = e.return_value
    assert only == {"__class__": "__main__.Only", "a": 1, "b": (2,)}
    assert row == {"__class__": "__main__.Row", "n": 5}


CALLS: list[str] = []


@dataclasses.dataclass
class Watched:
    v: int

    def __post_init__(self) -> None:
        CALLS.append("post_init")


def test_building_a_class_runs_none_of_its_code(rp: RunPython) -> None:
    e = rp.run("w", inputs={"w": Watched(4)})
    assert e.ok, e.error
    CALLS.clear()
    got = e.return_value
    assert CALLS == []  # built as copy and pickle build one: no __init__, no __post_init__
    assert type(got) is Watched and got.v == 4


def test_the_json_envelope_stays_json(rp: RunPython) -> None:
    e = rp.run("import datetime\n[datetime.datetime(2024, 5, 6, 7, 8, 9), datetime.date(2024, 1, 2), b'\\x00\\x01']")
    assert e.return_json == ["2024-05-06T07:08:09", "2024-01-02", "AAE="]
    assert e.to_dict()["return_value"] == ["2024-05-06T07:08:09", "2024-01-02", "AAE="]
    assert "return_typed" not in e.to_dict() and "return_typed" not in e.to_json()
    assert e.return_value == [datetime.datetime(2024, 5, 6, 7, 8, 9), datetime.date(2024, 1, 2), b"\x00\x01"]
    # Plain JSON needs no tagged copy, and a tuple keeps DESIGN's JSON form (a list).
    plain = rp.run("{'a': [1, 2.5, None]}")
    assert plain.return_value == {"a": [1, 2.5, None]} and plain.return_json == plain.return_value
    assert rp.run("(1, 'a')").return_json == [1, "a"]


def test_a_session_keeps_exact_values_across_cells(rp: RunPython) -> None:
    with rp.session() as s:
        first = s.run("seen = when\nkept = (1, {2})\nNone", inputs={"when": datetime.date(2020, 2, 2)})
        assert first.ok, first.error
        second = s.run("(seen, kept)")
        assert second.ok, second.error
        assert _same(second.return_value, (datetime.date(2020, 2, 2), (1, {2})))


def test_too_deep_is_a_clear_error_both_ways(rp: RunPython) -> None:
    deep: Any = 0
    for _ in range(300):
        deep = (deep,)
    with pytest.raises(InvalidInputError, match="deeper than 200"):
        rp.run("x", inputs={"x": deep})
    e = rp.run("v = 0\nfor _ in range(300):\n    v = (v,)\nv")
    assert e.status == "error" and e.error is not None
    assert e.error.type == "ReturnValueTooDeep" and "flatter" in e.error.message
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(InvalidInputError, match="deeper than 200"):
        rp.run("x", inputs={"x": cyclic})


def test_a_value_with_no_exact_form_is_refused_as_an_input(rp: RunPython) -> None:
    with pytest.raises(InvalidInputError, match="cannot cross into the run"):
        rp.run("x", inputs={"x": object()})


def test_a_value_with_no_exact_form_is_returned_as_json(rp: RunPython) -> None:
    e = rp.run("class Opaque:\n    def __repr__(self):\n        return 'Opaque()'\n[Opaque(), (1,)]")
    assert e.ok, e.error
    assert e.return_value == "[Opaque(), (1,)]"  # no exact form: DESIGN's repr, as before


def test_a_tampered_tag_from_the_run_does_not_break_the_host(rp: RunPython) -> None:
    # A dict the code builds to look like a tag is escaped, so it comes back as that dict.
    e = rp.run("{'$rp': 'dataclass', 'cls': 'os:system', 'v': {}}")
    assert e.return_value == {"$rp": "dataclass", "cls": "os:system", "v": {}}


def test_a_tool_argument_with_no_exact_form_is_a_clear_error_in_the_run() -> None:
    def take(item: Any) -> int:
        return 1

    rp = RunPython(timeout=30, tools=[take])
    e = rp.run("try:\n    take(object())\nexcept TypeError as exc:\n    message = str(exc)\nmessage")
    assert e.ok, e.error
    assert "cannot cross to the host" in e.return_value and "take" in e.return_value


def test_hinted_tool_parameters_take_exact_values() -> None:
    got: list[Any] = []

    def hinted(items: list[int], pair: tuple[int, str], tags: set[str], when: datetime.date) -> str:
        got.append((items, pair, tags, when))
        return "ok"

    rp = RunPython(timeout=30, tools=[hinted])
    e = rp.run("import datetime\nhinted((1, 2), (3, 'x'), {'a'}, datetime.date(2024, 1, 1))")
    assert e.ok, e.error
    assert got == [([1, 2], (3, "x"), {"a"}, datetime.date(2024, 1, 1))]
    assert type(got[0][0]) is list and type(got[0][1]) is tuple
