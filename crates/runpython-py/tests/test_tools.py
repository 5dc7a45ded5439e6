"""Python callables as tools: schemas and stubs from hints, arguments checked before the callable runs,
exceptions crossing in both directions, sync and async callables."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import enum
import threading
from typing import Annotated, Any, Literal, Optional, TypedDict

import pytest

import runpython
from runpython import RunPython

calls: list[tuple[str, Any]] = []


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass
class Point:
    x: float
    y: float = 0.0


class Box(TypedDict):
    width: int
    label: str


def search(query: str, limit: int = 3, exact: bool = False) -> list[str]:
    """Search the catalogue."""
    calls.append(("search", (query, limit, exact)))
    return [f"{query}-{i}" for i in range(limit)]


def typed(
    n: int,
    ratio: float,
    tags: list[str],
    scores: dict[str, int],
    mode: Literal["fast", "slow"] = "fast",
    note: Optional[str] = None,
    color: Color = Color.RED,
    pair: tuple[int, str] = (1, "a"),
    where: Annotated[Point, "a point on the map"] = Point(0, 0),
    box: Box | None = None,
) -> dict[str, Any]:
    """Echo its arguments with their Python types."""
    return {
        "n": [n, type(n).__name__],
        "ratio": [ratio, type(ratio).__name__],
        "tags": tags,
        "scores": scores,
        "mode": mode,
        "note": note,
        "color": color,  # an Enum: made JSON by value
        "pair": [list(pair), type(pair).__name__],
        "where": where,  # a dataclass: crosses as itself (a stand-in in the run)
        "box": box,
    }


class InventoryError(Exception):
    pass


def reserve(item: str, count: int) -> int:
    """Reserve items."""
    if count > 5:
        raise InventoryError(f"only 5 {item} left")
    if count < 0:
        raise ValueError("count must not be negative")
    return count


async def fetch(url: str, delay: float = 0.01) -> dict[str, Any]:
    """Fetch a page (async)."""
    await asyncio.sleep(delay)
    loop = asyncio.get_running_loop()
    return {"url": url, "loop": id(loop), "thread": threading.get_ident()}


async def broken(reason: str) -> None:
    """Always fails (async)."""
    await asyncio.sleep(0)
    raise RuntimeError(reason)


def not_json() -> object:
    return object()


request_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_var", default="unset")


def whoami() -> str:
    return request_var.get()


async def awhoami() -> str:
    return request_var.get()


@pytest.fixture(scope="module")
def rp() -> RunPython:
    return RunPython(
        timeout=30,
        tools=[search, typed, reserve, fetch, broken, not_json, whoami, awhoami,
               runpython.tool(search, name="lookup", description="Find things.", pure=True)],
    )


def test_the_stub_and_schema_come_from_the_signature_and_hints(rp: RunPython) -> None:
    spec = {t["name"]: t for t in rp.tool_spec("anthropic")}
    description = spec["run_python"]["description"]
    assert 'def search(query: str, limit: int = 3, exact: bool = False) -> Any:\n    """Search the catalogue."""' in description
    assert 'def lookup(query: str, limit: int = 3, exact: bool = False) -> Any:\n    """Find things."""' in description
    assert "mode: Literal[\"fast\", \"slow\"] = \"fast\"" in description
    assert "note: str | None = None" in description
    assert "tags: list[str]" in description
    assert sorted(rp.tools) == sorted(["search", "typed", "reserve", "fetch", "broken", "not_json", "whoami",
                                       "awhoami", "lookup"])


def test_schema_details(rp: RunPython) -> None:
    from runpython._tools import describe

    schema = describe(typed).schema
    props = schema["properties"]
    assert schema["required"] == ["n", "ratio", "tags", "scores"]
    assert schema["additionalProperties"] is False
    assert props["n"] == {"type": "integer"}
    assert props["ratio"] == {"type": "number"}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["scores"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert props["mode"] == {"enum": ["fast", "slow"], "type": "string", "default": "fast"}
    assert props["note"] == {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}
    assert props["color"] == {"enum": ["red", "blue"], "title": "Color", "default": "red"}
    assert props["pair"]["prefixItems"] == [{"type": "integer"}, {"type": "string"}]
    assert props["where"]["description"] == "a point on the map"
    assert props["where"]["properties"] == {"x": {"type": "number"}, "y": {"type": "number"}}
    assert "default" not in props["where"]  # a dataclass instance is not a JSON default
    assert props["box"]["anyOf"][0]["required"] == ["width", "label"]
    assert describe(fetch).is_async and not describe(search).is_async


def test_sync_tool_with_positional_keyword_and_defaults(rp: RunPython) -> None:
    e = rp.run("[search('cat'), search('dog', limit=1), search(query='x', limit=0, exact=True)]")
    assert e.return_value == [["cat-0", "cat-1", "cat-2"], ["dog-0"], []], e.error


def test_arguments_are_converted_to_their_hinted_types(rp: RunPython) -> None:
    e = rp.run(
        "typed(1, 2, ['a'], {'k': 1}, mode='slow', note='n', color='blue', pair=[2, 'b'], "
        "where={'x': 1.5}, box={'width': 3, 'label': 'l'})"
    )
    assert e.ok, e.error
    assert e.return_value == {
        "n": [1, "int"],
        "ratio": [2.0, "float"],  # an int where a float is hinted becomes a float
        "tags": ["a"],
        "scores": {"k": 1},
        "mode": "slow",
        "note": "n",
        "color": "blue",
        "pair": [[2, "b"], "tuple"],
        "where": Point(1.5, 0.0),  # back on the host, the run's stand-in is the host's class again
        "box": {"width": 3, "label": "l"},
    }
    e = rp.run("typed(1, 2.5, [], {})")  # defaults, including ones that are not JSON
    assert e.ok, e.error
    assert e.return_value["where"] == Point(0, 0) and e.return_value["color"] == "red"


@pytest.mark.parametrize(
    ("call", "kind", "message"),
    [
        ("typed('1', 2, [], {})", "TypeError", "typed() argument 'n' must be an int, got str '1'"),
        ("typed(True, 2, [], {})", "TypeError", "argument 'n' must be an int, got bool True"),
        ("typed(1, 'x', [], {})", "TypeError", "argument 'ratio' must be a number"),
        ("typed(1, 2, [1], {})", "TypeError", "argument 'tags'[0] must be a str, got int 1"),
        ("typed(1, 2, [], {'k': 'v'})", "TypeError", "argument 'scores'['k'] must be an int"),
        ("typed(1, 2, [], {}, mode='medium')", "ValueError", "argument 'mode' must be one of ['fast', 'slow']"),
        ("typed(1, 2, [], {}, note=3)", "TypeError", "argument 'note' must be str or None, got int 3"),
        ("typed(1, 2, [], {}, color='green')", "ValueError", "argument 'color' must be one of ['red', 'blue']"),
        ("typed(1, 2, [], {}, pair=[1])", "ValueError", "argument 'pair' must have 2 items, got 1"),
        ("typed(1, 2, [], {}, where={'y': 1})", "TypeError", "argument 'where' is missing 'x'"),
        ("typed(1, 2, [], {}, box={'width': 1})", "TypeError", "box"),
        ("search()", "TypeError", "missing 1 required positional argument"),  # the code's own signature
    ],
)
def test_arguments_are_checked_against_the_hints_before_the_call(
    rp: RunPython, call: str, kind: str, message: str
) -> None:
    calls.clear()
    e = rp.run(call)
    assert e.error is not None, e
    assert e.error.type == kind, e.error
    assert message in e.error.message, e.error.message
    assert calls == []


def test_a_tool_exception_reaches_the_code_with_its_type_and_message(rp: RunPython) -> None:
    e = rp.run(
        "out = []\n"
        "for n in (2, 9, -1):\n"
        "    try:\n"
        "        out.append(reserve('apples', n))\n"
        "    except Exception as exc:\n"
        "        out.append([type(exc).__name__, isinstance(exc, ValueError), str(exc)])\n"
        "out"
    )
    assert e.ok, e.error
    assert e.return_value[0] == 2
    assert e.return_value[1][0] == "InventoryError" and "only 5 apples left" in e.return_value[1][2]
    assert e.return_value[2] == ["ValueError", True, "count must not be negative"]
    # Uncaught, it is the envelope's error, named after the tool's exception.
    e = rp.run("reserve('pears', 10)")
    assert e.status == "error" and e.error is not None
    assert e.error.type == "InventoryError" and "only 5 pears left" in e.error.message


def test_an_async_tool_exception_reaches_the_code(rp: RunPython) -> None:
    e = rp.run("try:\n    broken('no access')\nexcept RuntimeError as exc:\n    r = str(exc)\nr")
    assert e.return_value == "no access", e.error


def test_a_result_that_is_not_json_raises_type_error_in_the_code(rp: RunPython) -> None:
    e = rp.run("not_json()")
    assert e.error is not None and e.error.type == "TypeError"
    assert "returned is a object, which is not JSON" in e.error.message


def test_async_tools_in_a_sync_run_use_the_private_loop_concurrently(rp: RunPython) -> None:
    e = rp.run(
        "import asyncio, time\n"
        "t = time.perf_counter()\n"
        "pages = await asyncio.gather(*[fetch(f'u{i}', delay=0.3) for i in range(5)])\n"
        "[len({p['loop'] for p in pages}), time.perf_counter() - t]"
    )
    assert e.ok, e.error
    loops, elapsed = e.return_value
    assert loops == 1
    assert elapsed < 1.2  # five 0.3 s calls overlapped
    from runpython._tools import private_loop

    assert rp.run("fetch('x')['loop']").return_value == id(private_loop())


def test_async_tools_in_arun_run_on_the_callers_loop(rp: RunPython) -> None:
    async def main() -> tuple[Any, int, int]:
        e = await rp.arun("fetch('x')")
        return e.return_value, id(asyncio.get_running_loop()), threading.get_ident()

    value, loop_id, thread = asyncio.run(main())
    assert value["loop"] == loop_id and value["thread"] == thread


def test_tools_see_the_callers_contextvars(rp: RunPython) -> None:
    token = request_var.set("req-42")
    try:
        assert rp.run("[whoami(), awhoami()]").return_value == ["req-42", "req-42"]

        async def main() -> Any:
            request_var.set("req-async")
            return (await rp.arun("[whoami(), awhoami()]")).return_value

        assert asyncio.run(main()) == ["req-async", "req-async"]
    finally:
        request_var.reset(token)


def test_a_sync_run_from_inside_a_running_loop_does_not_deadlock_async_tools(rp: RunPython) -> None:
    async def main() -> Any:
        return rp.run("fetch('inner')['url']").return_value  # blocks this loop on purpose

    assert asyncio.run(main()) == "inner"


def test_hints_that_cannot_be_evaluated_are_a_config_error() -> None:
    def f(x: Undefined) -> int:  # type: ignore[name-defined]  # noqa: F821
        return 1

    with pytest.raises(runpython.ConfigError, match="the type hints of f cannot be evaluated"):
        RunPython(tools=[f])


def test_var_positional_callables_are_refused() -> None:
    def spread(*items: int) -> int:
        return sum(items)

    with pytest.raises(runpython.ConfigError, match=r"takes \*items"):
        RunPython(tools=[spread])


def test_tool_decorator_keeps_the_function_callable() -> None:
    @runpython.tool(name="add_numbers", pure=True)
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    assert add(2, 3) == 5 and add.name == "add_numbers" and add.pure
    rp = RunPython(tools=[add])
    assert rp.run("add_numbers(2, b=40)").return_value == 42


try:
    import pydantic

    class Address(pydantic.BaseModel):
        city: str
        zip: str = pydantic.Field(pattern=r"^\d{5}$")

    class Customer(pydantic.BaseModel):
        name: str
        address: Address

    def register(customer: Customer) -> Customer:
        """Register a customer."""
        return customer.model_copy(update={"name": customer.name.upper()})

except ImportError:
    pydantic = None  # type: ignore[assignment]


@pytest.mark.skipif(pydantic is None, reason="pydantic is not installed")
def test_pydantic_models_become_schemas_and_are_validated() -> None:
    from runpython._tools import describe

    schema = describe(register).schema
    assert schema["properties"]["customer"]["title"] == "Customer"
    assert "Address" in schema["$defs"]  # nested models' definitions at the root, where refs point
    rp = RunPython(tools=[register])
    e = rp.run("register({'name': 'ada', 'address': {'city': 'Paris', 'zip': '75001'}})")
    assert e.return_value == {"name": "ADA", "address": {"city": "Paris", "zip": "75001"}}, e.error
    e = rp.run("register({'name': 'ada', 'address': {'city': 'Paris', 'zip': 'nope'}})")
    assert e.error is not None and e.error.type == "ValueError"
    assert "is not a valid Customer" in e.error.message and "zip" in e.error.message


def test_python_tool_calls_are_journaled_like_any_tool_call(tmp_path) -> None:
    # A resumed run replays the journal: the host callable is not called again for applied calls.
    seen: list[int] = []

    def record(n: int) -> int:
        seen.append(n)
        return n * 10

    rp = RunPython(store=f"file://{tmp_path}", approvals=["approve"], tools=[record])
    e = rp.run("a = record(1)\nok = approve({'a': a})\n[a, ok, record(2)]")
    assert e.status == "suspended", e.error
    assert seen == [1]
    assert e.suspension is not None
    done = rp.resume(e.run_id, {e.suspension["id"]: True})
    assert done.return_value == [10, True, 20], done.error
    assert seen == [1, 2]
