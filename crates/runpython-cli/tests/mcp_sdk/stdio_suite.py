"""`runpython mcp` (stdio) driven by the official MCP Python SDK client: structured results, schemas and
annotations, per-call timeouts, argument errors, progress, resources, charts as data and images,
cancellation, and what rmcp's
stdio transport used to drop in silence (oversized and malformed messages)."""

import asyncio
import json
import subprocess
import time

import anyio
from mcp.shared.exceptions import MCPError

from common import (BIN, busy_code, envelope_of, ok, processes_with_marker, rpc_error, stdio_client,
                    wait_for)


async def tools_and_results():
    async with stdio_client("--store", "memory://", "--timeout", "30") as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert sorted(tools) == ["close_session", "get_run_artifact", "run_python"], sorted(tools)
        ok("resume is not listed without an approval tool")
        run = tools["run_python"]
        assert run.output_schema["properties"]["status"]["enum"] == ["success", "error", "timeout", "suspended"]
        assert run.input_schema["properties"]["timeout"]["type"] == "number"
        assert run.annotations.read_only_hint is False and run.annotations.destructive_hint is False
        art = tools["get_run_artifact"]
        assert art.annotations.read_only_hint is True and art.annotations.idempotent_hint is True
        ok("outputSchema and annotations are declared")

        result = await client.call_tool("run_python", {
            "code": "print('hi')\nopen('table.csv', 'w').write('a,b\\n1,2\\n')\nn * 7", "inputs": {"n": 6}})
        envelope = envelope_of(result)
        assert envelope["return_value"] == 42 and envelope["stdout"] == "hi\n", envelope
        ok("the envelope is structuredContent (validated against outputSchema) and the same JSON text")

        links = [c for c in result.content if c.type == "resource_link"]
        csv = [l for l in links if l.name == "table.csv"]
        assert csv and str(csv[0].uri).startswith("runpython://artifact/") and csv[0].mime_type == "text/csv", links
        ok("artifacts are resource links")
        read = await client.read_resource(str(csv[0].uri))
        assert read.contents[0].text == "a,b\n1,2\n", read
        ok("resources/read returns an artifact")
        listed = (await client.list_resources()).resources
        assert any(str(r.uri) == str(csv[0].uri) for r in listed), listed
        ok("resources/list lists recent runs' artifacts")
        try:
            await client.read_resource("runpython://artifact/" + "0" * 64)
            raise AssertionError("an unknown artifact was read")
        except MCPError as e:
            # -32002 before the 2026-07-28 protocol, -32602 since (rmcp maps it per version).
            assert e.code in (-32002, -32602) and e.data["code"] == "not_found", rpc_error(e)
        ok("an unknown artifact is resource-not-found")

        failed = envelope_of(await client.call_tool("run_python", {"code": "1/0"}))
        assert failed["status"] == "error" and failed["error"]["type"] == "ZeroDivisionError", failed
        ok("the code failing is an outcome, not a tool error")

        started = time.monotonic()
        slow = envelope_of(await client.call_tool("run_python", {"code": "import time\ntime.sleep(20)", "timeout": 1}))
        assert slow["status"] == "timeout" and time.monotonic() - started < 10, slow
        ok("a per-call timeout stops the run")

        for args, what in [({"source": "1"}, "missing code"), ({"code": "1", "sesion": "x"}, "unknown argument"),
                           ({"code": 1}, "wrong type"), ({"code": "1", "timeout": -1}, "negative timeout")]:
            try:
                await client.call_tool("run_python", args)
                raise AssertionError(f"{what} was accepted")
            except MCPError as e:
                assert e.code == -32602, (what, rpc_error(e))
        try:
            await client.call_tool("no_such_tool", {})
            raise AssertionError("an unknown tool was accepted")
        except MCPError as e:
            assert e.code == -32602, rpc_error(e)
        ok("arguments outside the declared schema and unknown tools get -32602")

        missing = await client.call_tool("get_run_artifact", {"id": "0" * 64})
        assert missing.is_error and missing.structured_content["error"]["code"] == "not_found", missing
        ok("a call that cannot be served carries a machine-readable code")


async def progress():
    async with stdio_client("--no-store", "--tool", "lookup=cat") as client:
        seen = []

        async def on_progress(progress, total, message):
            seen.append((progress, message))

        code = "for i in range(3):\n    print('line', i, flush=True)\n    import time; time.sleep(0.3)\nlookup(q=1)\n'done'"
        result = await client.call_tool("run_python", {"code": code}, progress_callback=on_progress)
        assert envelope_of(result)["return_value"] == "done"
        messages = [m for _, m in seen]
        assert any(m.startswith("output: line") for m in messages), seen
        assert "calling lookup" in messages, seen
        assert [p for p, _ in seen] == sorted(p for p, _ in seen), seen
        ok(f"progress notifications for output and tool calls ({len(seen)})")


async def approvals():
    async with stdio_client("--store", "memory://", "--approval", "request_approval") as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert "resume" in tools and '"s0"' in tools["resume"].input_schema["properties"]["decisions"]["description"]
        suspended = envelope_of(await client.call_tool("run_python", {"code": "'yes' if request_approval('ship?') else 'no'"}))
        assert suspended["status"] == "suspended", suspended
        sid = suspended["suspension"]["id"]
        assert sid == "s0", suspended  # the code's first tool call, as the example says
        resumed = envelope_of(await client.call_tool("resume", {"run_id": suspended["run_id"], "decisions": {sid: True}}))
        assert resumed["return_value"] == "yes", resumed
        ok("resume is listed with an approval tool, its example ids are real (s0), and it resumes")


async def sessions(tmp):
    store = f"file://{tmp}"
    async with stdio_client("--store", store) as client:
        first = envelope_of(await client.call_tool("run_python", {"code": "x = 41", "session_id": "work"}))
        assert first["status"] == "success" and first["cell"] == 1, first
        assert first["session_id"] == "work", first
        again = envelope_of(await client.call_tool("run_python", {"code": "x", "session_id": "work"}))
        assert again["return_value"] == 41 and again["cell"] == 2, again
        ok("calls with one session_id share one interpreter, and the envelope names the id passed")
    # The server is gone with its interpreter; a new one on the same store restores the session.
    async with stdio_client("--store", store) as client:
        restored = envelope_of(await client.call_tool("run_python", {"code": "x + 1", "session_id": "work"}))
        assert restored["return_value"] == 42 and restored["restored"] is True, restored
        assert restored["session_id"] == "work", restored
        ok("after a restart on the same store, x + 1 gives 42 with restored: true")
        fresh = envelope_of(await client.call_tool(
            "run_python", {"code": "'x' in globals()", "session_id": "work", "reset": True}))
        assert fresh["return_value"] is False, fresh
        closed = await client.call_tool("close_session", {"session_id": "work"})
        assert closed.structured_content == {"closed": True}, closed
        ok("reset starts a session over, close_session ends it")


async def cancellation():
    marker = f"rpmark-cancel-{time.monotonic_ns()}"
    async with stdio_client("--no-store", "--timeout", "120") as client:
        try:
            # The SDK sends notifications/cancelled when its own timeout fires.
            await client.call_tool("run_python", {"code": busy_code(marker)}, read_timeout_seconds=2)
            raise AssertionError("the busy loop returned")
        except MCPError as e:
            assert "timed out" in e.message.lower() or e.code == 408, rpc_error(e)
        started = time.monotonic()
        left = await wait_for(lambda: not processes_with_marker(marker), 1.0)
        assert left, f"processes still running 1 s after the cancel: {processes_with_marker(marker)}"
        ok(f"a cancelled run's processes are gone within a second ({time.monotonic() - started:.2f} s)")
        again = envelope_of(await client.call_tool("run_python", {"code": "1 + 1"}))
        assert again["return_value"] == 2
        ok("the server serves on after a cancellation")


async def oversized():
    async with stdio_client("--no-store") as client:
        try:
            await client.call_tool("run_python", {"code": "x = '" + "a" * (17 * 1024 * 1024) + "'"},
                                   read_timeout_seconds=60)
            raise AssertionError("a 17 MiB request was accepted")
        except MCPError as e:
            code, message, data = rpc_error(e)
            assert code == -32600 and "16777216" in message, (code, message[:300])
            assert data["code"] == "request_too_large", data
        ok("a request over 16 MiB gets a JSON-RPC error stating the limit")
        again = envelope_of(await client.call_tool("run_python", {"code": "2 + 2"}))
        assert again["return_value"] == 4
        ok("the server serves on after an oversized request")


def raw_protocol_errors():
    """What no SDK sends: malformed JSON and non-requests, answered rather than ignored."""
    proc = subprocess.Popen([BIN, "mcp", "--no-store"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    try:
        def ask(line):
            proc.stdin.write(line + b"\n")
            proc.stdin.flush()
            return json.loads(proc.stdout.readline())

        reply = ask(b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"')
        assert reply["error"]["code"] == -32700 and reply["id"] is None, reply
        reply = ask(b'{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": 5}}')
        assert reply["error"]["code"] == -32602 and reply["id"] == 2, reply
        reply = ask(b'[1, 2, 3]')
        assert reply["error"]["code"] == -32600, reply
        ok("malformed JSON gets -32700, malformed params -32602, a non-request -32600")
    finally:
        proc.stdin.close()
        proc.wait(10)


async def charts():
    # matplotlib comes from the index through runpython's own dependency path (detected from the import).
    async with stdio_client("--store", "memory://", "--timeout", "300") as client:
        code = ("import matplotlib.pyplot as plt\n"
                "plt.figure(figsize=(4, 3), dpi=50)\n"
                "plt.plot([1, 2, 3], [2, 4, 3]); plt.title('Load'); plt.xlabel('hour'); plt.ylabel('%')\n"
                "plt.show()")
        result = await client.call_tool("run_python", {"code": code})
        envelope = envelope_of(result)
        assert envelope["status"] == "success", envelope
        chart = envelope["displays"][0]["chart"]
        assert (chart["type"], chart["title"], chart["x_label"], chart["y_label"]) == ("line", "Load", "hour", "%"), chart
        assert chart["elements"][0]["points"] == [[1, 2], [2, 4], [3, 3]], chart
        ok("a line chart comes as data: its type, labels and points")
        images = [c for c in result.content if c.type == "image"]
        assert len(images) == 1 and images[0].mime_type == "image/png", result.content
        import base64
        import struct
        png = base64.b64decode(images[0].data)
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (200, 150)
        ok("the chart reaches the client as an image block: a PNG of the figure's size")


async def warm_chart_cell():
    # The data cell agents send, through `runpython mcp --warm` with the bench's pinned stack: each
    # call a fresh run forked from the warm environment's template.
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[4]
    cell = (root / "tests/benches/chart_cell.py").read_text()
    pins = [line.strip() for line in (root / "tests/benches/chart_requirements.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    async with stdio_client("--store", "memory://", "--timeout", "300", "--warm", ",".join(pins)) as client:
        for round in range(2):
            # Another text each round: the same code would be a memo hit, not a run.
            result = await client.call_tool("run_python", {"code": f"# round {round}\n{cell}"})
            envelope = envelope_of(result)
            assert envelope["status"] == "success" and not envelope["cached"], envelope
            assert envelope["return_value"]["rows"] == 20_000 and envelope["return_value"]["days"] == 90, envelope
            assert envelope["displays"][0]["chart"]["type"] == "line", envelope["displays"]
            assert "font cache" not in envelope["stderr"], envelope["stderr"]
            images = [c for c in result.content if c.type == "image"]
            assert len(images) == 1 and images[0].mime_type == "image/png", result.content
    ok("runpython mcp --warm: the chart cell comes back with its value, a line chart and its PNG, no font-cache message")


async def main():
    await tools_and_results()
    await charts()
    await warm_chart_cell()
    await progress()
    await approvals()
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        await sessions(tmp)
    await cancellation()
    await oversized()
    raw_protocol_errors()


if __name__ == "__main__":
    anyio.run(main)
