"""Three `runpython serve` hosts sharing one S3 store (moto on loopback) behind a load balancer of
deploy/ (HAProxy or Envoy, `load_balanced.py haproxy|envoy`), driven by the official MCP Python SDK
client through the proxy, as hosts come and go:

- each MCP session's calls land on one host (the hosts' log lines name the session), and the
  sessions are spread over the hosts;
- that host is killed (SIGKILL): the session's next call fails at once (another host answers 404
  for the session it does not know), and after re-initializing the client's `session_id` state is
  restored from the store (`restored: true`), a run suspended through the dead host resumes, and a
  run it memoized is a hit;
- a stateless (2026-07-28) client needs no stickiness and mirrors `session_id` into
  `Mcp-Param-Session-Id`, and its calls that a full host refuses are sent to another host;
- a host drained with SIGTERM gets no new sessions once the proxy sees /healthz turn 503, while its
  call in flight finishes;
- over a host's `--max-runs-in-flight`, a call gets the retryable `over_capacity` error within a
  second (the runs holding the places take seconds)."""

import base64
import contextlib
import hashlib
import re
import signal
import sys
import time

import logging

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from moto.server import ThreadedMotoServer

from common import Serve, envelope_of, new_token, ok, rpc_error
from proxies import PROXIES, free_port

CAPACITY = 2
logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
SLOW = "import time\ntime.sleep({s})\n'{tag}'"
MEMO_CODE = "sum(i * i for i in range(3000))"


class Seen:
    """What one client's HTTP traffic showed: the MCP session id it was given, the headers it sent."""

    def __init__(self):
        self.session = None
        self.sent = []

    async def on_request(self, request):
        self.sent.append(dict(request.headers))

    async def on_response(self, response):
        sid = response.headers.get("mcp-session-id")
        if sid:
            self.session = sid


def client(lb, token, mode="legacy"):
    """An SDK client through the proxy, and what it saw."""
    seen = Seen()
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120,
                              event_hooks={"request": [seen.on_request], "response": [seen.on_response]})
    return Client(streamable_http_client(lb.url, http_client=http), mode=mode), seen


def host_session(sid):
    """The id the host minted, of the one the client holds: behind Envoy's stateful-session envelope
    that is `base64(host address);UV:base64(host's id)`."""
    if ";UV:" in sid:
        return base64.b64decode(sid.split(";UV:", 1)[1]).decode()
    return sid


def session_tag(sid):
    """How a host's log names a session: never by its id (a capability), by its digest."""
    return "s-" + hashlib.sha256(sid.encode()).hexdigest()[:12]


def served(hosts, seen):
    """{host index: calls it logged} for the client's MCP session."""
    tag = session_tag(host_session(seen.session))
    counts = {}
    for i, host in enumerate(hosts):
        n = len(re.findall(rf"tool=\S+ .*mcp_session={re.escape(tag)}\b", host.read_log()))
        if n:
            counts[i] = n
    return counts


def logged_sessions(host):
    return sorted(set(re.findall(r"mcp_session=(\S+)", host.read_log())))


def health(host):
    return httpx2.get(host.base + "/healthz", timeout=5)


async def wait_until(predicate, seconds, what):
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        await anyio.sleep(0.05)


async def failover(lb, hosts, token):
    """Stickiness, then the session's host killed: re-initialize, restore, resume, memo hit."""
    async with contextlib.AsyncExitStack() as stack:
        # Enough sessions that a proxy choosing at random among idle hosts (Envoy's least-request
        # picks two at random) puts them on one host only once in thousands of runs.
        pairs = [client(lb, token) for _ in range(8)]
        clients = [await stack.enter_async_context(c) for c, _ in pairs]
        seens = [s for _, s in pairs]
        for step in ["n = 1", "n += 1", "n"]:
            for i, c in enumerate(clients):
                envelope = envelope_of(await c.call_tool("run_python", {"code": step, "session_id": f"cells-{i}"}))
                assert envelope["status"] == "success", envelope
        spread = [served(hosts, s) for s in seens]
        for counts in spread:
            assert len(counts) == 1 and list(counts.values()) == [3], (
                counts, spread, [s.session for s in seens], [logged_sessions(h) for h in hosts])
        assert len({next(iter(c)) for c in spread}) >= 2, f"every session on one host: {spread}"
        ok(f"each MCP session's calls land on one host, sessions spread over hosts {sorted({next(iter(c)) for c in spread})}")

        main, seen = clients[0], seens[0]
        # A file given to a cell (uploaded as bytes): a restore on another host puts it back.
        given = {"name": "data.csv", "content_base64": base64.b64encode(b"a,b\n1,2\n").decode()}
        cell = envelope_of(await main.call_tool("run_python", {
            "code": "import time\ntime.sleep(0.05)\ntext = open('data.csv').read()", "session_id": "cells-0",
            "files": [given]}))
        assert cell["status"] == "success", cell
        first = envelope_of(await main.call_tool("run_python", {"code": MEMO_CODE}))
        assert first["cached"] is False, first
        suspended = envelope_of(await main.call_tool(
            "run_python", {"code": "ok = request_approval('deploy?')\n'deployed' if ok else 'held'"}))
        assert suspended["status"] == "suspended", suspended
        (dead,) = served(hosts, seen).keys()
        assert served(hosts, seen)[dead] == 6, served(hosts, seen)
        hosts[dead].proc.send_signal(signal.SIGKILL)
        hosts[dead].proc.wait()
        started = time.monotonic()
        try:
            await main.call_tool("run_python", {"code": "n", "session_id": "cells-0"}, read_timeout_seconds=30)
            raise AssertionError("a call on the dead host's MCP session succeeded")
        except MCPError as e:
            code, message, _ = rpc_error(e)
        failed_in = time.monotonic() - started
        assert failed_in < 30, "the call on the dead session hung"
        ok(f"host {dead} killed (SIGKILL): its session's next call fails in {failed_in * 1000:.0f} ms ({code}: {message})")

    fresh, seen = client(lb, token)
    async with fresh:
        cell = envelope_of(await fresh.call_tool(
            "run_python", {"code": "[n, text, open('data.csv').read()]", "session_id": "cells-0"}))
        assert cell["return_value"] == [2, "a,b\n1,2\n", "a,b\n1,2\n"] and cell["restored"] is True, cell
        assert cell["restore"]["from"] in ("snapshot", "replay"), cell
        ok(f"after re-initializing, the session_id state and its files are restored from the store on another "
           f"host ({cell['restore']['from']}: {cell['restore']['replayed']} cells replayed)")
        resumed = envelope_of(await fresh.call_tool("resume", {
            "run_id": suspended["run_id"], "decisions": {suspended["suspension"]["id"]: True}}))
        assert resumed["status"] == "success" and resumed["return_value"] == "deployed", resumed
        ok("a run suspended through the dead host resumes through the proxy")
        hit = envelope_of(await fresh.call_tool("run_python", {"code": MEMO_CODE}))
        assert hit["cached"] is True and hit["return_value"] == first["return_value"], hit
        counts = served(hosts, seen)
        assert dead not in counts and sum(counts.values()) == 3, counts
        ok(f"a run memoized through the dead host is a hit through host {next(iter(counts))}")
    return dead


async def stateless(lb, hosts, token):
    """A 2026-07-28 client: no MCP session, `session_id` mirrored into a header."""
    c, seen = client(lb, token, mode="2026-07-28")
    async with c:
        await c.list_tools()  # the client learns the x-mcp-header annotations from the listing
        envelope_of(await c.call_tool("run_python", {"code": "k = 41", "session_id": "stateless"}))
        cell = envelope_of(await c.call_tool("run_python", {"code": "k + 1", "session_id": "stateless"}))
        assert cell["return_value"] == 42, cell
    assert seen.session is None, seen.session
    mirrored = [h.get("mcp-param-session-id") for h in seen.sent if h.get("mcp-param-session-id")]
    assert mirrored == ["stateless", "stateless"], mirrored
    ok("a stateless (2026-07-28) client needs no MCP session and sends session_id as Mcp-Param-Session-Id")


async def retried_elsewhere(lb, hosts, token, full):
    """A stateless call refused by a full host is sent by the proxy to another host."""
    holders = []
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(CAPACITY):
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120)
            holders.append(await stack.enter_async_context(
                Client(streamable_http_client(hosts[full].url, http_client=http), mode="legacy")))
        done = []

        async def hold(c, i):
            done.append(envelope_of(await c.call_tool("run_python", {"code": SLOW.format(s=10, tag=f"held-{i}")})))

        async with anyio.create_task_group() as tg:
            for i, c in enumerate(holders):
                tg.start_soon(hold, c, i)
            await wait_until(lambda: health(hosts[full]).json()["runs_in_flight"] == CAPACITY, 30, "the host full")
            before = hosts[full].read_log().count("refused a run: over capacity")
            c, _ = client(lb, token, mode="2026-07-28")
            async with c:
                for i in range(10):
                    envelope = envelope_of(await c.call_tool("run_python", {"code": f"{i} * 2"}))
                    assert envelope["return_value"] == i * 2, envelope
            refused = hosts[full].read_log().count("refused a run: over capacity") - before
        assert len(done) == CAPACITY, done
    assert refused >= 1, "no call reached the full host: the retry was not exercised"
    ok(f"stateless calls a full host refused ({refused} of 10) were sent by the proxy to another host and served")


async def drain(lb, hosts, token):
    """SIGTERM: out of the proxy's rotation, no new sessions, the call in flight finishes."""
    c, seen = client(lb, token)
    async with c:
        await c.call_tool("run_python", {"code": "0"})
        (draining,) = served(hosts, seen).keys()
        result = {}

        async def in_flight():
            result["envelope"] = envelope_of(await c.call_tool("run_python", {"code": SLOW.format(s=10, tag="drained")}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(in_flight)
            await wait_until(lambda: health(hosts[draining]).json()["runs_in_flight"] == 1, 20, "the run started")
            hosts[draining].proc.send_signal(signal.SIGTERM)
            await anyio.to_thread.run_sync(lambda: lb.wait_states({draining: False}))
            assert "envelope" not in result, "the slow run finished before the check"
            for _ in range(3):
                other, other_seen = client(lb, token)
                async with other:
                    envelope_of(await other.call_tool("run_python", {"code": "1"}))
                counts = served(hosts, other_seen)
                assert draining not in counts and len(counts) == 1, counts
        assert result["envelope"]["return_value"] == "drained", result
    code = await anyio.to_thread.run_sync(lambda: hosts[draining].proc.wait(60))
    assert code == 0, (code, hosts[draining].read_log()[-3000:])
    ok(f"host {draining} drained (SIGTERM): no new sessions once the proxy took it out, its call in flight finished")
    return draining


async def capacity(lb, hosts, token, last):
    """Over --max-runs-in-flight: the retryable error, at once."""
    holders = [client(lb, token) for _ in range(CAPACITY)]
    async with contextlib.AsyncExitStack() as stack:
        held = [await stack.enter_async_context(c) for c, _ in holders]
        results = []

        async def hold(c, i):
            results.append(envelope_of(await c.call_tool("run_python", {"code": SLOW.format(s=8, tag=f"held-{i}")})))

        async with anyio.create_task_group() as tg:
            for i, c in enumerate(held):
                tg.start_soon(hold, c, i)
            await wait_until(lambda: health(hosts[last]).json()["runs_in_flight"] == CAPACITY, 30, "the host full")
            over, _ = client(lb, token)
            async with over:
                await over.list_tools()
                started = time.monotonic()
                try:
                    await over.call_tool("run_python", {"code": "1"}, read_timeout_seconds=30)
                    raise AssertionError("a call over capacity was served")
                except MCPError as e:
                    code, message, data = rpc_error(e)
                waited = time.monotonic() - started
            assert not results, "the runs holding the places finished before the refusal"
            assert health(hosts[last]).json()["runs_in_flight"] == CAPACITY
        assert code == -32010 and data["code"] == "over_capacity" and data["retry_after_s"] >= 1, (code, message, data)
        assert "--max-runs-in-flight" in message, message
        assert waited < 1.0, f"the refusal took {waited:.2f} s"
        assert sorted(r["return_value"] for r in results) == [f"held-{i}" for i in range(CAPACITY)], results
    ok(f"over capacity, a call gets the retryable over_capacity error in {waited * 1000:.0f} ms while runs of 8 s hold the places")


async def main(kind):
    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    try:
        bucket = "runpython-lb"
        async with httpx2.AsyncClient() as http:
            r = await http.put(f"http://127.0.0.1:{port}/{bucket}")
            assert r.status_code == 200, r.text
        store = (f"s3://{bucket}/{kind}?endpoint=http://127.0.0.1:{port}&allow_http=true&region=us-east-1"
                 "&access_key_id=test&secret_access_key=test")
        args = ["--store", store, "--approval", "request_approval", "--memo", "--timeout", "60",
                "--max-runs-per-token", "0", "--max-runs-in-flight", str(CAPACITY), "--max-upload-bytes", "1M"]
        tokens = {"agent": new_token()}
        token = tokens["agent"]
        with contextlib.ExitStack() as stack:
            hosts = [stack.enter_context(Serve(*args, tokens=tokens)) for _ in range(3)]
            lb = stack.enter_context(PROXIES[kind](hosts))
            await anyio.to_thread.run_sync(lambda: lb.wait_states({0: True, 1: True, 2: True}))
            ok(f"{kind} in front of three hosts, all healthy")
            dead = await failover(lb, hosts, token)
            await stateless(lb, hosts, token)
            await retried_elsewhere(lb, hosts, token, full=[i for i in range(3) if i != dead][0])
            draining = await drain(lb, hosts, token)
            (last,) = [i for i in range(3) if i not in (dead, draining)]
            await capacity(lb, hosts, token, last)
    finally:
        moto.stop()


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in PROXIES:
        sys.exit(f"usage: load_balanced.py {'|'.join(PROXIES)}")
    anyio.run(main, sys.argv[1])
