"""Shared helpers of the MCP end-to-end scripts: they drive `runpython mcp` and `runpython serve` with
the official MCP Python SDK client, as agents' MCP clients do. Run by `tests/mcp_sdk.rs` with the tools
venv's python; the binary comes from RUNPYTHON_BIN. Each check prints `ok: ...`; a failure raises."""

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from contextlib import asynccontextmanager

import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

BIN = os.environ["RUNPYTHON_BIN"]


def ok(what):
    print(f"ok: {what}", flush=True)


def stdio_client(*args, **kwargs):
    """A Client talking to `runpython mcp ARGS` over stdio."""
    params = StdioServerParameters(command=BIN, args=["mcp", *args], env=dict(os.environ))
    return Client(params, **kwargs)


def http_client(url, token, **kwargs):
    """A Client talking to `runpython serve` at URL with a bearer token."""
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120)
    return Client(streamable_http_client(url, http_client=http), **kwargs)


def new_token():
    return secrets.token_hex(16)


class Serve:
    """A `runpython serve` process on a free loopback port; stopped (by pid) on exit."""

    def __init__(self, *args, tokens, env=None):
        self.tokens = tokens
        self.log = open(os.path.join(os.environ.get("TMPDIR", "/tmp"), f"serve-{os.getpid()}-{time.monotonic_ns()}.log"), "w+")
        full_env = dict(os.environ, **(env or {}))
        full_env["RUNPYTHON_TOKENS"] = ",".join(f"{n}:{t}" for n, t in tokens.items())
        self.proc = subprocess.Popen(
            [BIN, "serve", "--bind", "127.0.0.1:0", *args],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, env=full_env,
        )
        deadline = time.monotonic() + 60
        while True:
            found = re.search(r"listening on (http://\S+)", self.read_log())
            if found:
                self.base = found.group(1)
                self.url = self.base + "/mcp"
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited with {self.proc.returncode}: {self.read_log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"serve did not start in 60 s: {self.read_log()}")
            time.sleep(0.05)

    def read_log(self):
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def client(self, name, **kwargs):
        return http_client(self.url, self.tokens[name], **kwargs)

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"serve did not stop within {timeout} s of {sig!r}")
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def processes_with_marker(marker):
    """Pids of live (not zombie) processes whose command line holds `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry))
    return found


async def wait_for(predicate, seconds, step=0.02):
    """Polls `predicate` for up to `seconds` without blocking the event loop (the client's messages,
    a cancellation notice among them, are sent from it)."""
    import anyio

    deadline = time.monotonic() + seconds
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        await anyio.sleep(step)


def busy_code(marker):
    """Code that replaces the runner with a busy loop carrying `marker` in its argv."""
    return (
        "import os, sys\n"
        f"os.execv(sys.executable, [sys.executable, '-c', 'while True: pass', {marker!r}])\n"
    )


def envelope_of(result):
    """The envelope of a run_python/resume result, checked to be the same as structured and as text."""
    assert not result.is_error, result
    structured = result.structured_content
    assert isinstance(structured, dict), result
    text = [c.text for c in result.content if c.type == "text"]
    assert text and json.loads(text[0]) == structured, result
    return structured


def rpc_error(excinfo):
    """(code, message, data) of an MCPError."""
    err = getattr(excinfo, "error", None)
    if err is not None:
        return err.code, err.message, err.data
    return getattr(excinfo, "code", None), str(excinfo), getattr(excinfo, "data", None)
