"""Two `runpython serve` hosts sharing one S3 store (moto on loopback), driven by the official MCP
Python SDK client: hosts keep no state but the store, so a run suspended on host A resumes on host B
after A has stopped, a run memoized on A is a memo hit on B, and a session started on A is restored on
B once A has stopped."""

import socket

import anyio
import httpx2
from moto.server import ThreadedMotoServer

from common import Serve, envelope_of, new_token, ok


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def main():
    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    try:
        bucket = "runpython-hosts"
        async with httpx2.AsyncClient() as http:
            r = await http.put(f"http://127.0.0.1:{port}/{bucket}")
            assert r.status_code == 200, r.text
        store = (f"s3://{bucket}/e2e?endpoint=http://127.0.0.1:{port}&allow_http=true&region=us-east-1"
                 "&access_key_id=test&secret_access_key=test")
        args = ["--store", store, "--approval", "request_approval", "--memo", "--timeout", "60"]
        tokens = {"agent": new_token()}
        with Serve(*args, tokens=tokens) as a, Serve(*args, tokens=tokens) as b:
            memo_code = "sum(i * i for i in range(1000))"
            async with a.client("agent") as on_a:
                first = envelope_of(await on_a.call_tool("run_python", {"code": memo_code}))
                assert first["cached"] is False and first["return_value"] == 332833500, first
                suspended = envelope_of(await on_a.call_tool(
                    "run_python", {"code": "ok = request_approval('deploy?')\n'deployed' if ok else 'held'"}))
                assert suspended["status"] == "suspended", suspended
                cell = envelope_of(await on_a.call_tool("run_python", {"code": "rows = [1, 2, 3]", "session_id": "analysis"}))
                assert cell["status"] == "success", cell
            assert a.stop() == 0, a.read_log()
            ok("host A suspended a run and stopped")
            async with b.client("agent") as on_b:
                hit = envelope_of(await on_b.call_tool("run_python", {"code": memo_code}))
                assert hit["cached"] is True and hit["return_value"] == 332833500, hit
                ok("a run memoized on host A is a memo hit on host B")
                resumed = envelope_of(await on_b.call_tool("resume", {
                    "run_id": suspended["run_id"], "decisions": {suspended["suspension"]["id"]: True}}))
                assert resumed["status"] == "success" and resumed["return_value"] == "deployed", resumed
                assert resumed["run_id"] == suspended["run_id"], resumed
                ok("a run suspended on host A resumes on host B")
                cell = envelope_of(await on_b.call_tool("run_python", {"code": "sum(rows)", "session_id": "analysis"}))
                assert cell["return_value"] == 6 and cell["restored"] is True, cell
                ok("a session started on host A is restored on host B")
    finally:
        moto.stop()


if __name__ == "__main__":
    anyio.run(main)
