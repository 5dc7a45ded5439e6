"""A FastMCP server in code mode with `RunPythonSandbox`, in memory (`Client(server)`): the model's code calls
the server's tools through `call_tool`, an error and an image reach the MCP client as FastMCP shows them."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
from fastmcp import Client, FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.experimental.transforms.code_mode import CodeMode
from example_runner import run_example
from sandbox_png import PNG_CODE, png_size

from runpython.integrations.fastmcp import RunPythonSandbox

CALLS: list[str] = []


def server() -> FastMCP:
    mcp = FastMCP("shop")

    @mcp.tool
    def price(item: str) -> float:
        """The price of an item."""
        CALLS.append(item)
        return {"kettle": 24.0, "mug": 6.25}[item]

    mcp.add_transform(CodeMode(sandbox_provider=RunPythonSandbox(timeout=20)))
    return mcp


async def execute(code: str, raise_on_error: bool = True) -> Any:
    async with Client(server()) as client:
        tools = {t.name for t in await client.list_tools()}
        assert "execute" in tools and "price" not in tools  # code mode hides the tools behind execute
        return await client.call_tool("execute", {"code": code}, raise_on_error=raise_on_error)


def test_the_code_calls_the_servers_tools_and_returns_at_top_level() -> None:
    CALLS.clear()
    code = ("import asyncio\n"
            "k, m = await asyncio.gather(call_tool('price', {'item': 'kettle'}), call_tool('price', {'item': 'mug'}))\n"
            "return {'total': k['result'] + 2 * m['result']}")  # a float tool's structured result
    result = asyncio.run(execute(code))
    assert sorted(CALLS) == ["kettle", "mug"]  # the tools ran in the server, called from the sandbox
    assert json.loads(result.content[0].text) == {"total": 36.5}


def test_a_last_expression_is_the_result_too() -> None:
    result = asyncio.run(execute("(await call_tool('price', {'item': 'mug'}))['result'] * 4"))
    assert json.loads(result.content[0].text) == 25.0


def test_a_return_inside_a_function_is_not_a_top_level_one() -> None:
    result = asyncio.run(execute("def f():\n    return 3\n\nf() * 2"))
    assert json.loads(result.content[0].text) == 6


def test_an_error_in_the_code_is_the_tools_error() -> None:
    with pytest.raises(ToolError, match="ZeroDivisionError"):
        asyncio.run(execute("x = 1\nreturn x / 0"))
    result = asyncio.run(execute("return 1 / 0", raise_on_error=False))
    assert result.is_error and "division by zero" in result.content[0].text


def test_a_failed_tool_call_reaches_the_code_as_an_exception() -> None:
    code = ("try:\n    await call_tool('price', {'item': 'spoon'})\n"
            "except Exception as e:\n    return type(e).__name__ + ': ' + str(e)\n")
    result = asyncio.run(execute(code))
    assert "spoon" in result.content[0].text


def test_an_image_display_comes_back_as_image_content() -> None:
    result = asyncio.run(execute(PNG_CODE))
    text, image = result.content
    assert json.loads(text.text) == "drawn"
    assert image.type == "image" and image.mime_type == "image/png"
    assert png_size(base64.b64decode(image.data)) == (3, 2)


def test_the_example_runs_and_prints_its_answer() -> None:
    assert run_example(__file__).strip().splitlines()[-1] == '21.0'
