"""`runpython serve` (Streamable HTTP) driven by the official MCP Python SDK client: bearer tokens
(401), health, structured results, progress, per-token run limits, MCP sessions scoped per token,
cancellation, the log line per call, and a graceful drain on SIGTERM."""

import json
import signal
import time

import anyio
import httpx2
from mcp.shared.exceptions import MCPError

from common import Serve, busy_code, envelope_of, new_token, ok, processes_with_marker, rpc_error, wait_for

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def auth_and_health(serve):
    async with httpx2.AsyncClient(timeout=30) as http:
        for headers in [{}, {"Authorization": "Bearer " + new_token()}, {"Authorization": "Basic abc"}]:
            r = await http.post(serve.url, json=INIT, headers={**ACCEPT, **headers})
            assert r.status_code == 401, (headers, r.status_code, r.text)
            assert r.headers["www-authenticate"].startswith("Bearer"), r.headers
            assert r.json()["error"]["code"] == "unauthorized", r.text
        ok("a request without a valid bearer token gets 401")
        r = await http.get(serve.base + "/healthz")
        assert r.status_code == 200 and r.json()["status"] == "ok", r.text
        ok("GET /healthz answers without a token")

        # An MCP session belongs to the token that made it.
        r = await http.post(serve.url, json=INIT, headers={**ACCEPT, "Authorization": f"Bearer {serve.tokens['alice']}"})
        assert r.status_code == 200, (r.status_code, r.text)
        session = r.headers["mcp-session-id"]
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        common = {**ACCEPT, "mcp-session-id": session, "mcp-protocol-version": "2025-11-25"}
        r = await http.post(serve.url, json=listing, headers={**common, "Authorization": f"Bearer {serve.tokens['bob']}"})
        assert r.status_code == 404, (r.status_code, r.text)
        r = await http.post(serve.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                            headers={**common, "Authorization": f"Bearer {serve.tokens['alice']}"})
        assert r.status_code in (200, 202), (r.status_code, r.text)
        ok("an MCP session made with one token is unknown to another (404)")


async def calls(serve):
    async with serve.client("alice") as alice:
        tools = {t.name for t in (await alice.list_tools()).tools}
        assert tools == {"run_python", "get_run_artifact", "close_session"}, tools
        envelope = envelope_of(await alice.call_tool("run_python", {"code": "6 * 7"}))
        assert envelope["return_value"] == 42, envelope
        ok("run_python over HTTP returns the envelope as structured content")

        seen = []

        async def on_progress(progress, total, message):
            seen.append(message)

        code = "import time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.3)\n'done'"
        result = await alice.call_tool("run_python", {"code": code}, progress_callback=on_progress)
        assert envelope_of(result)["return_value"] == "done"
        assert any(m.startswith("output: tick") for m in seen), seen
        ok(f"progress notifications over HTTP ({len(seen)})")

        log = await wait_for(lambda: "tenant=alice tool=run_python status=success" in serve.read_log(), 5)
        assert log, serve.read_log()
        ok("one log line per call names the token, tool, status and time")

        async with serve.client("bob") as bob:
            results = {}

            async def long_alice():
                results["alice"] = await alice.call_tool("run_python", {"code": "import time\ntime.sleep(3)\n'slow'"})

            async with anyio.create_task_group() as tg:
                tg.start_soon(long_alice)
                await anyio.sleep(1.0)
                refused = await alice.call_tool("run_python", {"code": "1"})
                assert refused.is_error and refused.structured_content["error"]["code"] == "too_many_runs", refused
                other = envelope_of(await bob.call_tool("run_python", {"code": "'bob'"}))
                assert other["return_value"] == "bob"
            assert envelope_of(results["alice"])["return_value"] == "slow"
        ok("a token over its concurrent-run limit is refused (too_many_runs); other tokens are not")

        marker = f"rpmark-httpcancel-{time.monotonic_ns()}"
        try:
            await alice.call_tool("run_python", {"code": busy_code(marker)}, read_timeout_seconds=2)
            raise AssertionError("the busy loop returned")
        except MCPError as e:
            pass
        gone = await wait_for(lambda: not processes_with_marker(marker), 1.0)
        assert gone, f"processes still running 1 s after the cancel: {processes_with_marker(marker)}"
        ok("a run cancelled over HTTP leaves no process within a second")


async def drain(serve):
    async with serve.client("alice") as alice:
        results = {}

        async def in_flight():
            results["run"] = await alice.call_tool("run_python", {"code": "import time\ntime.sleep(2)\n'drained'"})

        async with anyio.create_task_group() as tg:
            tg.start_soon(in_flight)
            await anyio.sleep(0.7)
            serve.proc.send_signal(signal.SIGTERM)
            await anyio.sleep(0.3)
            async with httpx2.AsyncClient(timeout=10) as http:
                r = await http.get(serve.base + "/healthz")
                assert r.status_code == 503 and r.json()["status"] == "draining", r.text
            async with serve.client("bob") as bob:
                refused = await bob.call_tool("run_python", {"code": "1"})
                assert refused.is_error and refused.structured_content["error"]["code"] == "shutting_down", refused
        assert envelope_of(results["run"])["return_value"] == "drained", results
    code = await anyio.to_thread.run_sync(lambda: serve.proc.wait(30))
    assert code == 0, (code, serve.read_log())
    ok("SIGTERM drains: health says draining, new runs are refused, the run in flight finishes, exit 0")


async def main():
    tokens = {"alice": new_token(), "bob": new_token()}
    with Serve("--store", "memory://", "--max-runs-per-token", "1", "--timeout", "60", tokens=tokens) as serve:
        await auth_and_health(serve)
        await calls(serve)
        await drain(serve)


if __name__ == "__main__":
    anyio.run(main)
