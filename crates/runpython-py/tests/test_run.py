"""Running code: the envelope as an object, outcomes as statuses, configuration errors as exceptions."""

from __future__ import annotations

import datetime
import json
import pathlib

import pytest

import runpython
from runpython import ConfigError, InvalidInputError, RunPython


@pytest.fixture(scope="module")
def rp() -> RunPython:
    return RunPython(timeout=20)


def test_run_returns_an_envelope_with_attribute_access(rp: RunPython) -> None:
    e = rp.run("print('hi')\nx * 2", inputs={"x": 21})
    assert e.status == "success" and e.ok
    assert e.return_value == 42 and e.return_type == "int"
    assert e.stdout == "hi\n" and e.stderr == ""
    assert e.error is None and e.suspension is None and e.truncated is None
    assert isinstance(e.run_id, str) and e.run_id
    assert e.cached is False and e.duration_ms >= 0
    assert e.isolation is not None and "kill" in e.isolation


def test_to_dict_and_to_json_are_the_v1_contract(rp: RunPython) -> None:
    e = rp.run("{'a': [1, 2.5, None, True]}")
    d = e.to_dict()
    assert d["status"] == "success"
    assert d["return_value"] == {"a": [1, 2.5, None, True]}
    assert set(d) >= {"status", "return_value", "return_type", "stdout", "stderr", "truncated", "error",
                      "artifacts", "run_id", "cached", "duration_ms", "suspension"}
    assert json.loads(e.to_json()) == d
    assert json.loads(e.to_json(indent=2)) == d and "\n  " in e.to_json(indent=2)
    assert "status='success'" in repr(e)


def test_what_the_code_does_is_an_envelope_not_an_exception(rp: RunPython) -> None:
    e = rp.run("def f():\n    return 1 / 0\nf()")
    assert e.status == "error" and not e.ok
    assert e.error is not None
    assert e.error.type == "ZeroDivisionError"
    assert "division by zero" in e.error.message
    assert e.error.traceback is not None and 'line 2, in f' in e.error.traceback
    assert str(e.error) == f"ZeroDivisionError: {e.error.message}"
    assert e.error.to_dict()["type"] == "ZeroDivisionError"


def test_a_timeout_is_a_status() -> None:
    e = RunPython(timeout=datetime.timedelta(seconds=1), pool=False).run("while True: pass")
    assert e.status == "timeout"
    assert e.error is not None and e.error.type == "Timeout"


def test_output_is_bounded_by_max_output_chars() -> None:
    e = RunPython(max_output_chars=100, pool=False).run("print('x' * 10_000)")
    assert len(e.stdout) < 400
    assert e.truncated is not None and e.truncated["stdout"]["total_chars"] == 10_001


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout": 0}, "the timeout must be longer than zero"),
        ({"timeout": -1}, "timeout must be a finite number of seconds"),
        ({"timeout": "10"}, "timeout must be a number of seconds, got str '10'"),
        ({"max_output_chars": 1}, "max_output_chars must be at least 2"),
        ({"max_output_chars": 1.5}, "max_output_chars must be a whole number"),
        ({"approvals": ["ok"]}, "need a store"),
        ({"approvals": "ok"}, "approvals must be a list of str"),
        ({"allow_nested": 0}, "allow_nested needs a depth of at least 1"),
        ({"store": "ftp://nowhere"}, "store 'ftp://nowhere'".replace("'", '"')),
        ({"tier": "forever"}, 'tier must be "ephemeral", "persistent"'),
        ({"sandbox": {"landlok": False}}, 'sandbox has no setting "landlok"'),
        ({"sandbox": {"network": True}}, "require, allow_network, memory_bytes"),
        ({"sandbox": {"memory": "lots"}}, 'sandbox["memory"]: "lots" is not a size'),
        ({"install_sandbox": {"disk": 1}}, 'install_sandbox["disk"]'),
        ({"allowed_packages": "numpy"}, "allowed_packages must be a list of str"),
        ({"pool": {"sise": 2}}, 'pool has no setting "sise"'),
        ({"allow_network": "yes"}, "allow_network must be a bool"),
        ({"tools": print}, "tools must be a list of callables"),
        ({"tools": [42]}, "cannot be a tool"),
        ({"tools": [lambda x: x]}, "give it one with runpython.tool"),
    ],
)
def test_bad_settings_raise_config_error_with_the_message(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=None) as raised:
        RunPython(**kwargs)
    assert message in str(raised.value)
    assert isinstance(raised.value, runpython.RunPythonError)


def test_runs_can_be_forked_from_a_template_and_say_so() -> None:
    forked = RunPython(timeout=30, pool={"size": 1, "templates": True})
    report = forked.isolation_report()
    e = forked.run("1 + 1")
    assert e.return_value == 2
    isolation = e.isolation
    assert isolation is not None
    # Where the kernel allows templates, the run was forked from one, as the report said it would be.
    assert isolation["start"] == report["start"]
    assert isolation["start"] in ("template", "fresh")
    assert RunPython(timeout=30, pool=False).run("1").isolation["start"] == "fresh"  # type: ignore[index]


def test_bad_requests_raise_invalid_input_error(rp: RunPython) -> None:
    with pytest.raises(InvalidInputError, match='input "x" is a object that cannot cross into the run'):
        rp.run("x", inputs={"x": object()})
    assert rp.run("sorted(x)", inputs={"x": {2, 1}}).return_value == [1, 2]
    assert rp.run("type(x).__name__", inputs={"x": {2, 1}}).return_value == "set"  # exact values
    with pytest.raises(InvalidInputError, match="not-an-identifier"):
        rp.run("1", inputs={"not-an-identifier": 1})
    with pytest.raises(InvalidInputError, match="code must be a str"):
        rp.run(b"1+1")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="unknown tool format"):
        rp.tool_spec("gemini")  # type: ignore[arg-type]


def test_memo_serves_a_second_identical_run_from_the_cache() -> None:
    rp = RunPython(memo=True, pool=False)
    first = rp.run("sum(range(10))")
    second = rp.run("sum(range(10))")
    assert not first.cached and second.cached and second.return_value == 45
    assert not rp.run("sum(range(10))", memo=False).cached


def test_store_keeps_artifacts_readable_by_id(tmp_path) -> None:
    rp = RunPython(store=f"file://{tmp_path}", pool=False)
    e = rp.run("open('out.csv', 'w').write('a,b\\n1,2\\n')\n'done'")
    files = [a for a in e.artifacts if a.name == "out.csv"]
    assert files and files[0].kind == "file" and files[0].bytes == 8
    assert rp.get_run_artifact(files[0].id) == b"a,b\n1,2\n"
    assert files[0].to_dict()["name"] == "out.csv"


def test_reading_artifacts_without_a_store_is_a_config_error(rp: RunPython) -> None:
    with pytest.raises(ConfigError, match="configure a store"):
        rp.get_run_artifact("0" * 64)


def test_sandbox_sizes_are_written_as_people_write_them_and_reported() -> None:
    rp = RunPython(pool=False, sandbox={"memory": "512M", "disk": "64M", "max_processes": 64})
    report = rp.isolation_report()
    assert report["memory"]["bytes"] == 512 << 20
    assert report["disk"]["bytes"] == 64 << 20
    if report["rlimits"]["processes"] is not None:
        assert report["rlimits"]["processes"] == 64
    e = rp.run("open('big', 'wb').write(b'x' * (100 << 20))")
    assert e.status == "error" and e.error is not None and e.error.type == "OSError"


def test_a_package_outside_the_allowlist_is_refused_before_any_install() -> None:
    rp = RunPython(pool=False, allowed_packages=["tabulate"])
    e = rp.run("import yaml")
    assert e.status == "error" and e.error is not None and e.error.type == "DependencyError"
    assert "--allow-package pyyaml" in e.error.message
    assert e.dependencies == {
        "refused": [{"name": "pyyaml", "source": "mapping", "reason": "not allowed"}]
    }
    assert rp.run("1 + 1").dependencies is None


def test_isolation_report_and_repr(rp: RunPython) -> None:
    report = rp.isolation_report()
    assert report["kill"] in ("pid-namespace", "process-group")
    assert repr(rp).startswith("RunPython(timeout=20")
    assert rp.timeout == 20.0


def _loopback_server():
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    seen = []

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            seen.append(1)
            conn.sendall(b"hi")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return server, seen


def test_network_policies_decide_what_the_code_reaches():
    server, seen = _loopback_server()
    port = server.getsockname()[1]
    code = (
        "import socket\n"
        "try:\n"
        f"    r = socket.create_connection(('127.0.0.1', {port}), timeout=5).recv(2).decode()\n"
        "except OSError as e:\n"
        "    r = type(e).__name__\n"
        "r\n"
    )
    probe = RunPython(network="public", pool=False).isolation_report()
    if probe["network"] != "public":
        pytest.skip("no network policy on this host: %s" % probe.get("missing"))
    named = RunPython(network=[f"127.0.0.1:{port}"], pool=False).run(code)
    assert named.return_value == "hi" and named.network["connections"] == 1, named
    assert RunPython(network="public", pool=False).run(code).return_value != "hi"
    assert RunPython(pool=False).run(code).return_value != "hi"
    assert len(seen) == 1
    with pytest.raises(ConfigError, match="public suffix"):
        RunPython(network=["*.com"])
    with pytest.raises(ConfigError):
        RunPython(network="everything")
    server.close()


def _recording_http_server():
    import http.server
    import threading

    heads = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            heads.append(str(self.headers))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, heads


def test_secrets_reach_their_hosts_as_values_and_the_code_as_placeholders():
    probe = RunPython(network="public", pool=False).isolation_report()
    if probe["network"] != "public":
        pytest.skip("no network policy on this host: %s" % probe.get("missing"))
    server, heads = _recording_http_server()
    port = server.server_address[1]
    value = "sk-py-" + __import__("secrets").token_hex(20)
    network = {"allow": [f"api.test:{port}"], "resolve": {"api.test": "127.0.0.1"}}
    # Plain HTTP (this server's): the operator's opt-in, over_http.
    secret = {"value": value, "hosts": ["api.test"], "over_http": True}
    rp = RunPython(pool=False, network=network, secrets={"API_KEY": secret})
    code = (
        "import os, urllib.error, urllib.request\n"
        "key = os.environ['API_KEY']\n"
        f"r = urllib.request.Request('http://api.test:{port}/', headers={{'Authorization': 'Bearer ' + key}})\n"
        "try:\n"
        "    status = urllib.request.urlopen(r, timeout=20).status\n"
        "except urllib.error.HTTPError as e:\n"
        "    status = e.code\n"
        "[key, status]\n"
    )
    e = rp.run(code)
    placeholder, status = e.return_value
    assert status == 200, e
    assert placeholder != value and value not in repr(e)
    assert heads and f"Bearer {value}" in heads[-1]
    # By default a secret goes only over TLS that verifies for its host: plaintext is refused.
    sent = len(heads)
    tls_only = RunPython(pool=False, network=network, secrets={"API_KEY": (value, ["api.test"])})
    e = tls_only.run(code)
    assert e.return_value[1] == 403, e
    assert len(heads) == sent and "plaintext" in repr(e.network)
    server.shutdown()
    with pytest.raises(ConfigError, match="API_KEY") as raised:
        RunPython(network=["api.test"], secrets={"API_KEY": (value, ["other.test"])})
    assert value not in str(raised.value)
    with pytest.raises(ConfigError, match="hosts"):
        RunPython(network="public", secrets={"API_KEY": {"value": value}})


def test_files_reach_the_run_read_only_and_a_session_keeps_them(tmp_path):
    csv = tmp_path / "people.csv"
    csv.write_bytes(b"name,age\nada,36\nalan,41\n")
    rp = RunPython(pool=False)
    code = (
        "import csv, os\n"
        "rows = list(csv.DictReader(open('people.csv')))\n"
        "try:\n"
        "    open('people.csv', 'a').write('x')\n"
        "    writable = True\n"
        "except OSError:\n"
        "    writable = False\n"
        "[[r['name'] for r in rows], open('raw.bin', 'rb').read().hex(), writable]\n"
    )
    e = rp.run(code, files={"people.csv": csv, "raw.bin": b"\x00\xff"})
    assert e.return_value == [["ada", "alan"], "00ff", False], e
    s = rp.session()
    s.run("1", files={"people.csv": str(csv)})
    assert s.run("open('people.csv').read().splitlines()[1]").return_value == "ada,36"
    with pytest.raises(InvalidInputError, match="plain file name"):
        rp.run("1", files={"../escape": b"x"})
    with pytest.raises(TypeError, match="bytes or a path"):
        rp.run("1", files={"x": 1})


def test_a_csv_given_as_a_file_is_read_by_pandas_in_the_run(tmp_path: pathlib.Path) -> None:
    # pandas comes from the index through runpython's own dependency path (detected from the import).
    csv = tmp_path / "sales.csv"
    csv.write_text("city,amount\nOslo,3\nRome,4\n")
    e = RunPython(timeout=300).run("import pandas as pd\nint(pd.read_csv('sales.csv')['amount'].sum())",
                                   files={"sales.csv": csv})
    assert e.ok, e.error
    assert e.return_value == 7
