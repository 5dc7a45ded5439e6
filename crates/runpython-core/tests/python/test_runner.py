"""Tests of the runner (`src/child/python/runpython_runner.py` and its sibling modules), with plain `python3` (3.10+) and the stdlib only.

    python3 -m unittest discover -s crates/runpython-core/tests/python -t crates/runpython-core/tests/python

Each test drives the runner as its docstring says, `python3 runpython_runner.py 3>result <request.json`: a real
interpreter (`-I -S`, as the host starts it), the request on stdin, the result read from descriptor 3.
"""

import base64
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import unittest

# The harness reads and writes integers past int()'s default digit limit; longer ones than this stay text
# (int() is quadratic in their length).
sys.set_int_max_str_digits(0)
EXACT_INT_DIGITS = 20_000


class Digits(str):
    """A JSON integer too long for the harness to convert, as its text."""


def parse_int(text):
    return int(text) if len(text) <= EXACT_INT_DIGITS else Digits(text)


# The runner and its sibling modules, as the host writes them into the code directory.
CODE_DIR = str(pathlib.Path(__file__).resolve().parents[2] / "src" / "child" / "python")
RUNNER_PY = pathlib.Path(CODE_DIR, "runpython_runner.py")
# Bound on one run, so a runner that hangs fails its test instead of the suite.
DEADLINE = 60


class Ran:
    """What one run of the runner produced."""

    def __init__(self, result, stdout, stderr, returncode):
        self.result = result
        self.stdout = stdout
        self.stderr = stderr
        self.returncode = returncode

    @property
    def error(self):
        return self.result.get("error")


def full_request(code, **fields):
    """A request with every key the host sends (`RunnerRequest`), `fields` replacing the defaults."""
    request = {
        "code_dir": CODE_DIR, "code": code, "inputs": {}, "typed": False, "env": {}, "trust_bundle": None,
        "input_artifacts": {}, "files": {}, "artifact_helpers": False, "network_reasons": False, "max_return_bytes": 1_000_000,
        "inline_return_bytes": 4096, "image_budget": 0, "site_dirs": [], "saved_dir": "saved", "repr": False,
        "bridge": None,
    }
    unknown = set(fields) - set(request)
    if unknown:
        raise AssertionError("not a key of the request: %s" % sorted(unknown))
    request.update(fields)
    return request


def run(code, raw_request=None, cwd=None, **fields):
    """Runs `code` through the runner (in `cwd`) with `fields` replacing the request's defaults (or exactly
    `raw_request`); the parsed result and the streams."""
    request = full_request(code, **fields) if raw_request is None else raw_request
    with tempfile.TemporaryFile() as result:
        fd = result.fileno()
        # The shell puts the result file at descriptor 3, whatever number it has here.
        proc = subprocess.run(
            ["/bin/sh", "-c", 'exec "$@" 3>&%d' % fd, "sh", sys.executable, "-I", "-S", str(RUNNER_PY)],
            input=json.dumps(request).encode(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(fd,),
            timeout=DEADLINE,
            cwd=cwd,
        )
        result.seek(0)
        text = result.read().decode()
    if not text:
        raise AssertionError("no result on fd 3 (exit %d): %s" % (proc.returncode, proc.stderr.decode()))
    return Ran(json.loads(text, parse_int=parse_int), proc.stdout.decode(), proc.stderr.decode(), proc.returncode)


class Values(unittest.TestCase):
    def test_the_last_expression_is_the_value_with_its_type(self):
        ran = run("x = 20\nx + 22")
        self.assertEqual(
            ran.result, {"status": "success", "return_type": "int", "return_preview": None, "return_value": 42}
        )
        self.assertEqual(ran.returncode, 0)

    def test_code_ending_in_a_statement_has_no_value(self):
        for code in ("x = 1", "", "def f():\n    return 1", "for i in range(3):\n    i"):
            with self.subTest(code=code):
                self.assertEqual(
                    run(code).result, {"status": "success", "return_type": None, "return_value": None}
                )

    def test_a_last_expression_that_is_none_has_no_value_and_still_runs(self):
        ran = run("print('side effect')")
        self.assertEqual(ran.result["return_value"], None)
        self.assertEqual(ran.stdout, "side effect\n")

    def test_json_values_come_back_as_json(self):
        value = {"a": [1, 2.5, None, True], "b": {"nested": "text ü"}, "c": []}
        ran = run(json.dumps(value).replace("null", "None").replace("true", "True"))
        self.assertEqual(ran.result["return_value"], value)
        self.assertEqual(ran.result["return_type"], "dict")

    def test_values_that_are_not_json_come_back_as_their_repr(self):
        cases = {
            "{1, 2}": ("set", "{1, 2}"),
            "{1: 'a'}": ("dict", "{1: 'a'}"),
            "float('nan')": ("float", "nan"),
            "b'\\x00ab'": ("bytes", "AGFi"),  # bytes and dates have a JSON form: base64, ISO 8601
            "import datetime\ndatetime.datetime(2024, 1, 2, 3, 4)": ("datetime", "2024-01-02T03:04:00"),
            "import datetime\n[datetime.date(2024, 1, 2), bytearray(b'a')]": ("list", ["2024-01-02", "YQ=="]),
            "import datetime\n[datetime.date(2024, 1, 2), {1}]": ("list", "[datetime.date(2024, 1, 2), {1}]"),
            "(1, (2, 3))": ("tuple", [1, [2, 3]]),
            "class Point:\n    def __repr__(self):\n        return 'Point(1, 2)'\nPoint()": ("Point", "Point(1, 2)"),
        }
        for code, (type_name, value) in cases.items():
            with self.subTest(code=code):
                result = run(code).result
                self.assertEqual((result["return_type"], result["return_value"]), (type_name, value))

    def test_a_typed_request_gets_the_exact_value_beside_the_json(self):
        ran = run("(1, {2}, b'x')", typed=True).result
        self.assertEqual(ran["return_value"], "(1, {2}, b'x')")
        self.assertEqual(ran["return_typed"], {"$rp": "tuple", "v": [
            1, {"$rp": "set", "v": [2]}, {"$rp": "bytes", "v": "eA=="}]})
        self.assertNotIn("return_typed", run("[1, 'a']", typed=True).result)  # plain JSON: no copy
        self.assertNotIn("return_typed", run("(1, 2)").result)  # not asked for

    def test_a_typed_request_decodes_its_inputs(self):
        tagged = {"$rp": "tuple", "v": [1, {"$rp": "date", "v": "2024-01-02"}]}
        ran = run("type(x).__name__, type(x[1]).__name__", inputs={"x": tagged}, typed=True).result
        self.assertEqual(ran["return_value"], ["tuple", "date"])
        # Not typed: the same JSON is just a dict.
        self.assertEqual(run("type(x).__name__", inputs={"x": tagged}).result["return_value"], "dict")

    def test_a_typed_value_too_deep_is_an_error_that_says_so(self):
        ran = run("v = 0\nfor _ in range(300):\n    v = (v,)\nv", typed=True).result
        self.assertEqual(ran["status"], "error")
        self.assertEqual(ran["error"]["type"], "ReturnValueTooDeep")

    def test_a_broken_repr_gives_no_value_and_a_preview_saying_why(self):
        ran = run("class Bad:\n    def __repr__(self):\n        raise RuntimeError('no')\nBad()")
        self.assertEqual(ran.result["status"], "success")
        self.assertEqual((ran.result["return_type"], ran.result["return_value"]), ("Bad", None))
        self.assertEqual(ran.result["return_preview"], {"type": "Bad", "repr_error": "repr() raised RuntimeError: no"})

    def test_integers_of_any_size_come_back_exactly(self):
        for code in ("2**100", "-(3**5000)", "[1, 2**64, {'k': 10**4300 + 1}]"):
            with self.subTest(code=code):
                expected = eval(code)
                self.assertEqual(run(code, inline_return_bytes=1 << 20).result["return_value"], expected)

    def test_integers_of_any_size_go_in_exactly(self):
        big = 7**6000  # 5,071 digits: past int()'s default limit
        ran = run("x == 7**6000 and type(x) is int", inputs={"x": big})
        self.assertEqual(ran.result["return_value"], True, ran.result)

    def test_an_integer_past_the_return_limit_is_too_large_with_digits_head_and_tail(self):
        ran = run("2 ** 10_000_000")
        self.assertEqual(ran.result["status"], "error")
        self.assertEqual(ran.error["type"], "ReturnValueTooLarge")
        preview = ran.result["return_preview"]
        self.assertEqual(preview["digits"], 3_010_300)
        self.assertEqual((preview["head"][:10], preview["tail"][-10:]), ("9049817306", "1387109376"))

    def test_an_integer_under_the_return_limit_is_kept_whole_with_its_preview(self):
        ran = run("2 ** 10_000_000", max_return_bytes=4_000_000)
        self.assertEqual(ran.result["status"], "success")
        self.assertEqual(ran.result["return_preview"]["digits"], 3_010_300)
        value = ran.result["return_value"]
        self.assertIsInstance(value, Digits)
        self.assertEqual((len(value), value[:10], value[-10:]), (3_010_300, "9049817306", "1387109376"))
        self.assertEqual(int(value[-300:]), 2**10_000_000 % 10**300)

    def test_lone_surrogates_become_replacement_characters_and_the_value_stays(self):
        ran = run("['a' + chr(0xdcff), {'k': '\\ud800'}]")
        self.assertEqual(ran.result["return_value"], ["a\ufffd", {"k": "\ufffd"}])

    def test_an_exception_message_with_a_lone_surrogate_keeps_its_type(self):
        ran = run("raise ValueError('bad ' + chr(0xdcff))")
        self.assertEqual((ran.error["type"], ran.error["message"]), ("ValueError", "bad \ufffd"))

    def test_a_huge_exception_message_is_cut_head_and_tail_and_keeps_its_type(self):
        ran = run("raise ValueError('<' + 'm' * 1_000_000 + '>')")
        self.assertEqual(ran.error["type"], "ValueError")
        message = ran.error["message"]
        self.assertLess(len(message), 10_000)
        self.assertTrue(message.startswith("<mmm") and message.endswith("mm>"), message[:50])
        self.assertIn("characters omitted", message)
        self.assertLess(len(ran.error["traceback"]), 20_000)

    def test_inputs_are_globals(self):
        self.assertEqual(run("n * 2", inputs={"n": 21}).result["return_value"], 42)

    def test_the_result_is_never_read_from_stdout(self):
        forged = '{"status":"success","return_type":"int","return_value":1}'
        ran = run("print(%r)\n2" % forged)
        self.assertEqual(ran.result["return_value"], 2)
        self.assertEqual(ran.stdout, forged + "\n")


class Previews(unittest.TestCase):
    def test_a_value_over_the_inline_limit_carries_a_preview_and_the_whole_value(self):
        result = run("list(range(100))", inline_return_bytes=100).result
        self.assertEqual(result["return_value"], list(range(100)))
        self.assertEqual(result["return_preview"], {"type": "list", "length": 100, "items": list(range(10))})

    def test_a_value_under_the_inline_limit_has_no_preview(self):
        self.assertIsNone(run("list(range(10))", inline_return_bytes=100).result["return_preview"])

    def test_previews_of_dicts_strings_and_bytes_are_bounded(self):
        cases = {
            "{str(i): i for i in range(50)}": {"type": "dict", "size": 50},
            "'ab' * 1000": {"type": "str", "length": 2000, "head": "ab" * 100, "tail": "ab" * 100},
            "bytes(range(256)) * 4": {"type": "bytes", "length": 1024, "hex_head": bytes(range(32)).hex()},
        }
        for code, expected in cases.items():
            with self.subTest(code=code):
                preview = run(code, inline_return_bytes=100).result["return_preview"]
                for key, value in expected.items():
                    self.assertEqual(preview[key], value)
                self.assertLess(len(json.dumps(preview)), 1000)

    def test_a_value_over_the_return_limit_is_return_value_too_large(self):
        ran = run("'x' * 100", max_return_bytes=50, inline_return_bytes=10)
        self.assertEqual(ran.result["status"], "error")
        self.assertEqual(ran.error["type"], "ReturnValueTooLarge")
        self.assertIn("more than 50 bytes as JSON, over the limit of 50", ran.error["message"])
        self.assertEqual(ran.result["return_preview"]["length"], 100)

    def test_a_huge_repr_is_cut_before_it_is_encoded(self):
        ran = run("{i for i in range(200000)}", max_return_bytes=1000)
        self.assertEqual(ran.error["type"], "ReturnValueTooLarge")
        self.assertIn("more than 1000 bytes", ran.error["message"])


class Errors(unittest.TestCase):
    def test_an_exception_shows_only_user_frames_with_user_line_numbers(self):
        ran = run("x = 1\n\ndef f():\n    raise ValueError('bad value')\n\nf()")
        self.assertEqual(ran.result["status"], "error")
        self.assertEqual(ran.error["type"], "ValueError")
        self.assertEqual(ran.error["message"], "bad value")
        traceback = ran.error["traceback"]
        self.assertIn('File "<code>", line 6, in <module>', traceback)
        self.assertIn('File "<code>", line 4, in f', traceback)
        self.assertIn("raise ValueError('bad value')", traceback, "the source line is shown")
        self.assertNotIn("runner", traceback)
        self.assertTrue(traceback.rstrip().endswith("ValueError: bad value"), traceback)

    def test_an_error_in_the_last_expression_is_reported_at_its_line(self):
        ran = run("a = 1\n\n\n1 / 0")
        self.assertEqual(ran.error["type"], "ZeroDivisionError")
        self.assertIn('File "<code>", line 4', ran.error["traceback"])

    def test_chained_exceptions_keep_both_and_hide_the_runner_in_each(self):
        ran = run("try:\n    {}['k']\nexcept KeyError as e:\n    raise RuntimeError('wrapped') from e")
        traceback = ran.error["traceback"]
        self.assertIn("KeyError: 'k'", traceback)
        self.assertIn("direct cause", traceback)
        self.assertNotIn("runner", traceback)

    def test_a_key_error_message_is_the_keys_repr(self):
        self.assertEqual(run("{}['missing']").error["message"], "'missing'")

    def test_a_syntax_error_names_the_users_line(self):
        ran = run("x = 1\ny = (\n")
        self.assertEqual(ran.error["type"], "SyntaxError")
        self.assertIn("line 2", ran.error["traceback"])
        self.assertNotIn("runner", ran.error["traceback"])

    def test_system_exit_zero_or_none_is_a_normal_end(self):
        for code in ("import sys\nsys.exit()", "import sys\nsys.exit(0)", "raise SystemExit"):
            with self.subTest(code=code):
                self.assertEqual(run(code + "\n").result["status"], "success")

    def test_system_exit_with_a_failure_code_is_an_error(self):
        ran = run("import sys\nsys.exit(3)")
        self.assertEqual(ran.error["type"], "SystemExit")
        self.assertEqual(ran.error["message"], "3")

    def test_an_error_after_output_keeps_the_output(self):
        ran = run("print('before')\nraise KeyError('k')")
        self.assertEqual(ran.stdout, "before\n")
        self.assertEqual(ran.error["type"], "KeyError")


class TopLevelAwait(unittest.TestCase):
    def test_top_level_await_runs_and_its_value_is_the_result(self):
        ran = run("import asyncio\nawait asyncio.sleep(0)\nasync def f():\n    return 7\nawait f()")
        self.assertEqual(ran.result["return_value"], 7)

    def test_gather_at_top_level(self):
        code = "import asyncio\nasync def sq(x):\n    await asyncio.sleep(0)\n    return x * x\n"
        code += "await asyncio.gather(*(sq(i) for i in range(4)))"
        self.assertEqual(run(code).result["return_value"], [0, 1, 4, 9])

    def test_an_exception_in_awaited_code_shows_user_frames_only(self):
        ran = run("import asyncio\nasync def f():\n    raise OSError('io')\nawait f()")
        self.assertEqual(ran.error["type"], "OSError")
        self.assertIn('File "<code>", line 3, in f', ran.error["traceback"])
        self.assertNotIn("asyncio", ran.error["traceback"].replace("import asyncio", ""))

    def test_code_without_await_does_not_import_asyncio(self):
        self.assertEqual(run("import sys\n'asyncio' in sys.modules").result["return_value"], False)


class Stdin(unittest.TestCase):
    def test_stdin_is_at_dev_null_so_input_raises_eof_error(self):
        ran = run("input()")
        self.assertEqual(ran.error["type"], "EOFError")

    def test_reading_stdin_gives_nothing(self):
        self.assertEqual(run("import sys\nsys.stdin.read()").result["return_value"], "")

    def test_the_request_ends_at_its_line_so_the_code_runs_while_stdin_is_still_open(self):
        # A process the host forks while a run starts holds the write end of that run's stdin until it
        # execs: the runner must not wait for stdin's end.
        request = full_request("6 * 7")
        read_end, write_end = os.pipe()
        proc = subprocess.Popen(
            ["/bin/sh", "-c", 'exec "$@" 3>&%d' % write_end, "sh", sys.executable, "-I", "-S", str(RUNNER_PY)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(write_end,),
        )
        os.close(write_end)
        try:
            proc.stdin.write(json.dumps(request).encode() + b"\n")
            proc.stdin.flush()  # and left open
            self.assertEqual(proc.wait(timeout=DEADLINE), 0)
            with open(read_end, "rb") as result:
                self.assertEqual(json.loads(result.read())["return_value"], 42)
        finally:
            proc.kill()
            proc.stdin.close()


def b64(data):
    return base64.b64encode(data).decode()


class Protocol(unittest.TestCase):
    def test_a_request_with_a_key_missing_or_unknown_runs_nothing_and_names_the_key(self):
        missing = full_request("open('ran', 'w')")
        del missing["typed"]
        unknown = dict(full_request("open('ran', 'w')"), site_dir=None)
        for request, said in ((missing, "missing key 'typed'"), (unknown, "unknown key 'site_dir'")):
            with self.subTest(said=said), tempfile.TemporaryDirectory() as cwd:
                ran = run(None, raw_request=request, cwd=cwd)
                self.assertEqual(ran.result["status"], "error")
                self.assertEqual(ran.error["type"], "SandboxError")
                self.assertIn(said, ran.error["message"])
                self.assertFalse(os.path.exists(os.path.join(cwd, "ran")), "the code ran")

    def test_the_repr_is_sent_back_when_asked(self):
        self.assertEqual(run("{1, 2}", repr=True).result["return_repr"], "{1, 2}")


class InputArtifacts(unittest.TestCase):
    def test_input_artifacts_are_parsed_by_what_they_hold(self):
        artifacts = {
            "data": b64(b'{"k": [1, 2]}'),
            "table": b64(b"a,b\n1,x\n2,y\n"),
            "tabs": b64(b"a\tb\n1\t2\n"),
            "text": b64("héllo".encode()),
            "blob": b64(b"\xff\x00\x01"),
        }
        ran = run("[data, table, tabs, text, type(blob).__name__, list(blob)]", input_artifacts=artifacts)
        self.assertEqual(
            ran.result["return_value"],
            [
                {"k": [1, 2]},
                [{"a": "1", "b": "x"}, {"a": "2", "b": "y"}],
                [{"a": "1", "b": "2"}],
                "héllo",
                "bytes",
                [255, 0, 1],
            ],
        )

    def test_one_line_with_commas_is_text_not_a_table(self):
        ran = run("line", input_artifacts={"line": b64(b"a,b,c")})
        self.assertEqual(ran.result["return_value"], "a,b,c")


class Process(unittest.TestCase):
    def test_a_child_the_code_forks_does_not_write_a_second_result(self):
        ran = run("import os\npid = os.fork()\nif pid == 0:\n    pass\nelse:\n    os.waitpid(pid, 0)\n'parent'")
        self.assertEqual(ran.result["return_value"], "parent")

    def test_the_result_descriptor_is_not_inherited_by_subprocesses(self):
        code = "import subprocess, sys\n"
        code += "subprocess.run([sys.executable, '-c', 'import os; os.fstat(3)'], close_fds=False).returncode"
        self.assertEqual(run(code).result["return_value"], 1)


class Environment(unittest.TestCase):
    def test_the_environments_bin_comes_first_on_path(self):
        with tempfile.TemporaryDirectory() as site:
            os.mkdir(os.path.join(site, "bin"))
            ran = run("import os\nos.environ['PATH']", site_dirs=[site], env={"PATH": "/usr/bin:/bin"})
            self.assertEqual(ran.result["return_value"], site + "/bin:/usr/bin:/bin", ran.error)

    def test_an_environment_without_bin_leaves_path_as_it_was(self):
        with tempfile.TemporaryDirectory() as site:
            ran = run("import os\nos.environ['PATH']", site_dirs=[site], env={"PATH": "/usr/bin:/bin"})
            self.assertEqual(ran.result["return_value"], "/usr/bin:/bin", ran.error)


if __name__ == "__main__":
    unittest.main()


class NetworkMessages(unittest.TestCase):
    """A refused connect's reason, asked of the run's resolver (runpython-egress's `why.rs`)."""

    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, CODE_DIR)
        import runpython_run

        cls.run_module = runpython_run

    def resolver(self, reason):
        """A UDP resolver on loopback answering every why-question with `reason` (None: NXDOMAIN);
        the names it was asked, and its address."""
        import socket
        import struct
        import threading

        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        asked = []

        def serve():
            query, peer = sock.recvfrom(2048)
            at, labels = 12, []
            while query[at]:
                labels.append(query[at + 1 : at + 1 + query[at]].decode())
                at += 1 + query[at]
            asked.append(labels)
            question = query[12 : at + 5]
            if reason is None:
                sock.sendto(query[:2] + b"\x81\x83\x00\x01\x00\x00\x00\x00\x00\x00" + question, peer)
                return
            text = reason.encode()
            rdata = b"".join(bytes((len(text[i : i + 255]),)) + text[i : i + 255] for i in range(0, len(text), 255))
            answer = b"\xc0\x0c" + struct.pack("!HHIH", 16, 1, 0, len(rdata)) + rdata
            sock.sendto(query[:2] + b"\x81\x80\x00\x01\x00\x01\x00\x00\x00\x00" + question + answer, peer)

        threading.Thread(target=serve, daemon=True).start()
        self.addCleanup(sock.close)
        return asked, sock.getsockname()

    def test_the_reason_is_asked_by_the_host_in_hex_and_the_port_and_read_whole(self):
        reason = "93.184.215.14:443 (api.test) is not on the allowlist; " + "x" * 400
        asked, address = self.resolver(reason)
        said = self.run_module._refusal_reason("api.test", 443, address)
        self.assertEqual(said, reason)
        self.assertEqual(asked, [["443", "api.test".encode().hex(), "why", "runpython", "invalid"]])

    def test_no_reason_or_no_answer_is_none(self):
        _, address = self.resolver(None)
        self.assertIsNone(self.run_module._refusal_reason("::1", 80, address))
        import socket

        silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        silent.bind(("127.0.0.1", 0))
        self.addCleanup(silent.close)
        self.assertIsNone(self.run_module._refusal_reason("10.0.0.1", 80, silent.getsockname()))
