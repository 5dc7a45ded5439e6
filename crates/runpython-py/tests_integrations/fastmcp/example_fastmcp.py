"""A FastMCP server in code mode whose code runs in runpython's sandbox, called in memory by FastMCP's
client. Serve it with `mcp.run()` to give an MCP client the same `execute` tool.

    pip install "runpython[fastmcp]"
    python example_fastmcp.py
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastmcp import Client, FastMCP
from fastmcp.experimental.transforms.code_mode import CodeMode

from runpython.integrations.fastmcp import RunPythonSandbox

mcp = FastMCP("weather")


@mcp.tool
def temperature(city: str) -> float:
    """Today's temperature in a city, in °C."""
    return {"Paris": 21.0, "Oslo": 9.0}[city]


mcp.add_transform(CodeMode(sandbox_provider=RunPythonSandbox(timeout=30)))

CODE = """
import asyncio
temps = await asyncio.gather(*[call_tool('temperature', {'city': c}) for c in ('Paris', 'Oslo')])
return max(t['result'] for t in temps)
"""


async def main() -> Any:
    async with Client(mcp) as client:
        result = await client.call_tool("execute", {"code": CODE})
        return json.loads(result.content[0].text)


if __name__ == "__main__":
    warmest = asyncio.run(main())
    print(warmest)
    assert warmest == 21.0, warmest
