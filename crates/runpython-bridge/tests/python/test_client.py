"""Tests of the bridge's Python side (`src/client.py`), with plain `python3` (3.10+) and the stdlib only.

    python3 -m unittest discover -s crates/runpython-bridge/tests/python -t crates/runpython-bridge/tests/python

The client is imported by path, as the runner does, and talks to a fake host: a thread on the other end of a
socketpair (or of a path socket) that speaks the framing (u32 big-endian length, then JSON) by hand.
"""

import ast
import asyncio
import importlib.util
import builtins
import inspect
import json
import os
import pathlib
import socket
import time
import tempfile
import threading
import unittest

CLIENT_PY = pathlib.Path(__file__).resolve().parents[2] / "src" / "client.py"
TOKEN = "0123456789abcdef0123456789abcdef"
# Bound on anything the client or the fake host waits for, so a broken side fails instead of hanging.
DEADLINE = 10


def load_client():
    """A fresh copy of the module (it keeps its connection in a global)."""
    spec = importlib.util.spec_from_file_location("runpython_tools", CLIENT_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dumps(value):
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def frame(message):
    data = json.dumps(message).encode()
    return len(data).to_bytes(4, "big") + data


class FakeHost:
    """The host's end of the connection, driven by a script running on its own thread."""

    def __init__(self, sock):
        self.sock = sock
        self.sock.settimeout(DEADLINE)
        self.buf = b""
        self.error = None

    def recv(self):
        """The next message, or None at the end of the stream."""
        while True:
            if len(self.buf) >= 4:
                size = int.from_bytes(self.buf[:4], "big")
                if len(self.buf) >= 4 + size:
                    data, self.buf = self.buf[4 : 4 + size], self.buf[4 + size :]
                    return json.loads(data)
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                return None
            self.buf += chunk

    def send(self, message):
        self.sock.sendall(frame(message))

    def run(self, script):
        """Runs `script(self)` on a thread; `join()` re-raises what it raised."""

        def target():
            try:
                script(self)
            except BaseException as exc:  # reported by join
                self.error = exc

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()
        return self

    def join(self):
        self.thread.join(DEADLINE)
        if self.thread.is_alive():
            raise AssertionError("the fake host's script did not finish")
        if self.error is not None:
            raise self.error


def answer(message, result):
    return {"type": "result", "id": message["id"], "result": result}


def fail(message, kind, text):
    return {"type": "result", "id": message["id"], "error": {"type": kind, "message": text}}


def expect_hello(host):
    hello = host.recv()
    if hello != {"type": "hello", "version": 1, "token": TOKEN}:
        raise AssertionError("not the hello: %r" % (hello,))


def tool_spec(name="double", params=..., description="Twice x.", hidden=False):
    """One tool as the host sends it (every key of runpython-bridge's `ToolClientSpec`); `params=None` is a
    schemaless tool."""
    if params is ...:
        params = [{"name": "x", "required": True, "default": None}]
    return {"name": name, "description": description, "params": params, "hidden": hidden, "typed": False}


def bridge_spec(tools, fd=None, path=None, max_frame=16 << 20):
    """A bridge spec as the host sends it (every key of runpython-bridge's `ClientSpec`)."""
    return {"path": path, "fd": fd, "token": TOKEN, "max_frame": max_frame, "tools": tools}


class Connected(unittest.TestCase):
    """A client installed with its end of a socketpair, as the host hands it to the child."""

    max_frame = 16 << 20

    def setUp(self):
        self.client = load_client()
        host_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.host = FakeHost(host_end)
        self.addCleanup(host_end.close)
        self.namespace = {}
        spec = bridge_spec(
            [
                tool_spec(),
                tool_spec("echo", None, ""),  # schemaless
                tool_spec("odd-name", []),
                tool_spec("runpython_read_artifact", None, "", hidden=True),
            ],
            fd=child_end.detach(),  # the client owns it from here
            max_frame=self.max_frame,
        )
        self.client.install(spec, self.namespace, json.loads, dumps)
        self.addCleanup(self.close_client)

    def close_client(self):
        bridge = self.client._bridge
        if bridge.sock is not None:
            bridge.sock.close()
        elif bridge.fd is not None:
            socket.socket(fileno=bridge.fd).close()

    def serve(self, script):
        return self.host.run(script)


class HelloAndCalls(Connected):
    def test_the_first_call_connects_says_hello_then_calls_by_name(self):
        def script(host):
            expect_hello(host)
            call = host.recv()
            assert call == {"type": "call", "id": 1, "tool": "double", "args": [], "kwargs": {"x": 21}}, call
            host.send(answer(call, 42))

        host = self.serve(script)
        self.assertEqual(self.namespace["double"](21), 42)
        host.join()

    def test_nothing_is_sent_before_the_first_call(self):
        self.host.sock.settimeout(0.2)
        with self.assertRaises(socket.timeout):
            self.host.sock.recv(1)

    def test_the_descriptor_is_not_inherited_by_the_codes_subprocesses(self):
        self.assertFalse(os.get_inheritable(self.client._bridge.fd))

    def test_hidden_tools_are_not_defined_for_the_code(self):
        self.assertNotIn("runpython_read_artifact", self.namespace)
        self.assertNotIn("runpython_read_artifact", dir(self.namespace["tools"]))

    def test_schemaless_tools_get_args_and_kwargs_as_written(self):
        def script(host):
            expect_hello(host)
            call = host.recv()
            assert (call["args"], call["kwargs"]) == ([1, "two"], {"three": 3}), call
            host.send(answer(call, "ok"))

        host = self.serve(script)
        self.assertEqual(self.namespace["echo"](1, "two", three=3), "ok")
        host.join()

    def test_tools_are_reachable_by_attribute_and_by_odd_name(self):
        tools = self.namespace["tools"]
        self.assertIs(tools.double, self.namespace["double"])
        self.assertEqual(tools["odd-name"].__name__, "tool")
        self.assertNotIn("odd-name", self.namespace)
        with self.assertRaises(AttributeError) as caught:
            tools.missing
        self.assertIn("double", str(caught.exception))

    def test_concurrent_gather_calls_are_answered_out_of_order(self):
        def script(host):
            expect_hello(host)
            calls = [host.recv() for _ in range(3)]
            assert sorted(c["id"] for c in calls) == [1, 2, 3], calls
            for call in reversed(calls):
                host.send(answer(call, call["kwargs"]["x"] * 2))

        host = self.serve(script)
        aio = self.client._aio
        double = self.namespace["double"]

        async def main():
            return await asyncio.gather(aio(double)(1), aio(double)(2), aio(double)(3))

        self.assertEqual(asyncio.run(main()), [2, 4, 6])
        host.join()

    def test_plain_calls_from_many_threads_at_once_each_get_their_own_answer(self):
        def script(host):
            expect_hello(host)
            calls = [host.recv() for _ in range(8)]
            assert sorted(c["id"] for c in calls) == list(range(1, 9)), calls
            # Answered in reverse, and the slowest first: every thread must still get its own.
            for call in reversed(calls):
                host.send(answer(call, call["kwargs"]["x"] * 2))

        host = self.serve(script)
        double = self.namespace["double"]
        results, errors = {}, []

        def worker(x):
            try:
                results[x] = double(x)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(x,)) for x in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(DEADLINE)
        host.join()
        self.assertEqual(errors, [])
        self.assertEqual(results, {x: 2 * x for x in range(8)})

    def test_a_plain_call_inside_async_code_does_not_block_the_reader_later(self):
        def script(host):
            expect_hello(host)
            first = host.recv()
            host.send(answer(first, "plain"))
            second = host.recv()
            host.send(answer(second, "awaited"))

        host = self.serve(script)
        aio, echo = self.client._aio, self.namespace["echo"]

        async def main():
            plain = echo()
            awaited = await asyncio.wait_for(aio(echo)(), DEADLINE)
            return [plain, awaited]

        self.assertEqual(asyncio.run(main()), ["plain", "awaited"])
        host.join()

    def test_a_send_blocked_by_a_host_at_its_cap_reads_the_answers_meanwhile(self):
        # The host answers call 1 with a large result and reads nothing more until that answer is taken;
        # the client is meanwhile sending call 2, too large for the socket's buffer. Without reading while
        # it sends, each side would wait on the other forever.
        big = "r" * (4 << 20)

        def script(host):
            expect_hello(host)
            first = host.recv()
            host.send(answer(first, big))
            second = host.recv()
            host.send(answer(second, len(second["args"][0])))

        host = self.serve(script)
        aio, echo = self.client._aio, self.namespace["echo"]

        async def main():
            first = asyncio.ensure_future(aio(echo)("small"))
            await asyncio.sleep(0)  # call 1 is sent
            second = await aio(echo)("a" * (4 << 20))
            return [len(await first), second]

        done = []
        runner = threading.Thread(target=lambda: done.append(asyncio.run(main())), daemon=True)
        runner.start()
        runner.join(DEADLINE)
        self.assertFalse(runner.is_alive(), "the client and the host wait on each other")
        self.assertEqual(done, [[4 << 20, 4 << 20]])
        host.join()


class AsyncPatterns(Connected):
    """The ways models write concurrent tool calls (the issue's, and pydantic-monty's async cases with a
    host tool in place of their external function), rewritten and run as the runner does. The fake host
    reads every call before answering any: the calls are in flight together, or the test times out."""

    def run_code(self, source, calls):
        def script(host):
            expect_hello(host)
            received = [host.recv() for _ in range(calls)]
            for call in received:
                host.send(answer(call, call["kwargs"]["x"] * 2))

        host = self.serve(script)
        tree = ast.parse(source)
        self.client.rewrite_awaited_calls(tree)
        code = compile(tree, "<code>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        namespace = dict(self.namespace, asyncio=asyncio)

        async def main():
            pending = eval(code, namespace)
            if pending is not None:
                await pending

        asyncio.run(asyncio.wait_for(main(), DEADLINE))
        host.join()
        return namespace["r"]

    def test_calls_stored_in_names_then_gathered(self):
        self.assertEqual(self.run_code("t = double(1)\nd = double(2)\nr = await asyncio.gather(t, d)", 2), [2, 4])

    def test_a_call_stored_then_awaited_later_was_already_sent(self):
        self.assertEqual(self.run_code("a = double(1)\nb = double(2)\nr = [await a, await b]", 2), [2, 4])

    def test_gather_of_a_starred_comprehension(self):
        self.assertEqual(self.run_code("r = await asyncio.gather(*[double(x) for x in (1, 2, 3)])", 3), [2, 4, 6])

    def test_create_task(self):
        source = "tasks = [asyncio.create_task(double(x)) for x in (1, 2, 3)]\nr = [await t for t in tasks]"
        self.assertEqual(self.run_code(source, 3), [2, 4, 6])

    def test_wait(self):
        source = "done, _ = await asyncio.wait([double(1), double(2)])\nr = sorted(t.result() for t in done)"
        self.assertEqual(self.run_code(source, 2), [2, 4])

    def test_as_completed(self):
        source = "r = sorted([await c for c in asyncio.as_completed([double(1), double(2)])])"
        self.assertEqual(self.run_code(source, 2), [2, 4])

    @unittest.skipIf(not hasattr(asyncio, "TaskGroup"), "TaskGroup is new in Python 3.11")
    def test_task_group(self):
        source = (
            "async with asyncio.TaskGroup() as tg:\n"
            "    a = tg.create_task(double(1))\n"
            "    b = tg.create_task(double(2))\n"
            "r = [a.result(), b.result()]"
        )
        self.assertEqual(self.run_code(source, 2), [2, 4])

    def test_calls_inside_coroutines_that_are_gathered(self):
        source = (
            "async def report(x):\n"
            "    t = double(x)\n"
            "    u = double(x + 10)\n"
            "    return await t + await u\n"
            "r = await asyncio.gather(report(1), report(2))"
        )
        self.assertEqual(self.run_code(source, 4), [24, 28])

    def test_a_list_built_in_a_loop_then_gathered(self):
        source = (
            "tasks = []\n"
            "for x in (1, 2, 3):\n"
            "    task = double(x)\n"
            "    tasks.append(task)\n"
            "r = await asyncio.gather(*tasks, return_exceptions=True)"
        )
        self.assertEqual(self.run_code(source, 3), [2, 4, 6])

    def test_asyncio_run_of_a_main_that_gathers(self):
        source = (
            "async def main():\n"
            "    t = double(1)\n"
            "    d = double(2)\n"
            "    return await asyncio.gather(t, d)\n"
            "r = await main()"
        )
        self.assertEqual(self.run_code(source, 2), [2, 4])

    def test_plain_calls_beside_awaited_ones_return_values(self):
        def script(host):
            expect_hello(host)
            first = host.recv()
            host.send(answer(first, first["kwargs"]["x"] * 2))
            rest = [host.recv() for _ in range(2)]
            for call in rest:
                host.send(answer(call, call["kwargs"]["x"] * 2))

        host = self.serve(script)
        tree = ast.parse("p = double(5)\nq = p + 1\nr = [q] + await asyncio.gather(double(1), double(2))")
        self.client.rewrite_awaited_calls(tree)
        code = compile(tree, "<code>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        namespace = dict(self.namespace, asyncio=asyncio)
        asyncio.run(asyncio.wait_for(eval(code, namespace), DEADLINE))
        host.join()
        self.assertEqual(namespace["r"], [11, 2, 4])


class Errors(Connected):
    def calls_failing_with(self, *kinds, text="it broke"):
        """The exception of one call per kind, the host failing each with that kind."""

        def script(host):
            expect_hello(host)
            for kind in kinds:
                host.send(fail(host.recv(), kind, text))

        host = self.serve(script)
        raised = []
        for _ in kinds:
            try:
                self.namespace["double"](1)
            except BaseException as exc:
                raised.append(exc)
            else:
                raise AssertionError("the call did not raise")
        host.join()
        return raised

    def test_builtin_error_types_keep_their_type_and_message(self):
        kinds = ("ValueError", "KeyError", "TypeError", "TimeoutError", "NameError")
        for kind, exc in zip(kinds, self.calls_failing_with(*kinds)):
            self.assertIs(type(exc), getattr(builtins, kind))
            self.assertEqual(exc.args, ("it broke",))

    def test_other_os_errors_and_unknown_kinds_become_tool_error_subclasses(self):
        kinds = ("OSError", "PermissionError", "RateLimited")
        for kind, exc in zip(kinds, self.calls_failing_with(*kinds, text="slow down")):
            self.assertIsInstance(exc, self.client.ToolError)
            self.assertNotIsInstance(exc, OSError)
            self.assertEqual(type(exc).__name__, kind)
            self.assertEqual(str(exc), "tool 'double' failed: %s: slow down" % kind)

    def test_one_kind_is_one_class_and_odd_kinds_are_plain_tool_errors(self):
        first, second, odd = self.calls_failing_with("RateLimited", "RateLimited", "not.an-identifier")
        self.assertIs(type(first), type(second))
        self.assertIs(type(odd), self.client.ToolError)

    def test_tool_call_limit_is_a_base_exception_that_except_exception_misses(self):
        (exc,) = self.calls_failing_with("ToolCallLimit", text="the run made more than 5 tool calls")
        self.assertIsInstance(exc, self.client.ToolCallLimit)
        self.assertNotIsInstance(exc, Exception)
        self.assertIn("more than 5", str(exc))

    def test_a_host_that_closes_the_connection_raises_bridge_error(self):
        def script(host):
            expect_hello(host)
            host.recv()
            host.sock.close()

        host = self.serve(script)
        with self.assertRaises(self.client.BridgeError) as caught:
            self.namespace["double"](1)
        self.assertIn("closed", str(caught.exception))
        host.join()

    def test_a_host_that_resets_the_connection_raises_bridge_error(self):
        def script(host):
            time.sleep(0.2)  # the hello and the call arrive and are left unread: closing resets
            host.sock.close()

        host = self.serve(script)
        with self.assertRaises(self.client.BridgeError) as caught:
            self.namespace["double"](1)
        self.assertIn("closed", str(caught.exception))
        host.join()

    def test_arguments_that_are_not_json_raise_type_error_naming_the_tool(self):
        def script(host):
            expect_hello(host)

        host = self.serve(script)
        with self.assertRaises(TypeError) as caught:
            self.namespace["double"]({1, 2})
        self.assertIn("'double'", str(caught.exception))
        host.join()


class FrameCap(Connected):
    max_frame = 1000

    def test_arguments_over_the_frame_cap_raise_value_error_and_are_not_sent(self):
        def script(host):
            expect_hello(host)
            host.sock.settimeout(0.3)
            try:
                got = host.sock.recv(1)
            except socket.timeout:
                got = None
            assert got is None, "something was sent: %r" % got

        host = self.serve(script)
        with self.assertRaises(ValueError) as caught:
            self.namespace["double"]("x" * 2000)
        self.assertIn("frame limit of 1000", str(caught.exception))
        host.join()

    def test_a_host_frame_over_the_cap_raises_bridge_error(self):
        def script(host):
            expect_hello(host)
            host.recv()
            host.sock.sendall((5000).to_bytes(4, "big"))

        host = self.serve(script)
        with self.assertRaises(self.client.BridgeError) as caught:
            self.namespace["double"](1)
        self.assertIn("5000-byte frame, over the limit of 1000", str(caught.exception))
        host.join()


class InheritedDescriptor(unittest.TestCase):
    def test_a_non_blocking_descriptor_still_gives_blocking_plain_calls(self):
        client = load_client()
        host_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(host_end.close)
        child_end.setblocking(False)
        namespace = {}
        client.install(bridge_spec([tool_spec()], fd=child_end.detach()), namespace, json.loads, dumps)

        def script(host):
            expect_hello(host)
            call = host.recv()
            threading.Event().wait(0.2)  # the answer is late: a non-blocking read would find nothing
            host.send(answer(call, 6))

        host = FakeHost(host_end).run(script)
        self.assertEqual(namespace["double"](3), 6)
        host.join()
        # Blocking at the OS level, so a plain call waits in recv instead of spinning on EAGAIN.
        self.assertTrue(os.get_blocking(client._bridge.sock.fileno()))
        client._bridge.sock.close()


class PathSpec(unittest.TestCase):
    def test_without_a_descriptor_the_client_connects_to_the_path(self):
        client = load_client()
        with tempfile.TemporaryDirectory() as tmp:
            path = str(pathlib.Path(tmp) / "bridge.sock")
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.addCleanup(listener.close)
            listener.bind(path)
            listener.listen(1)
            listener.settimeout(DEADLINE)
            namespace = {}
            spec = bridge_spec([tool_spec()], path=path)
            client.install(spec, namespace, json.loads, dumps)

            def script(_):
                conn, _ = listener.accept()
                host = FakeHost(conn)
                expect_hello(host)
                call = host.recv()
                host.send(answer(call, 4))
                conn.close()

            host = FakeHost(listener).run(script)
            self.assertEqual(namespace["double"](2), 4)
            host.join()
            client._bridge.sock.close()

    def test_a_spec_with_neither_descriptor_nor_path_raises_bridge_error(self):
        client = load_client()
        namespace = {}
        client.install(bridge_spec([tool_spec()]), namespace, json.loads, dumps)
        with self.assertRaises(client.BridgeError) as caught:
            namespace["double"](1)
        self.assertIn("neither a descriptor nor a path", str(caught.exception))



class MakeTool(unittest.TestCase):
    """`_make_tool` against a stub bridge that records what would be sent."""

    def setUp(self):
        self.client = load_client()
        self.sent = []
        test = self

        class Stub:
            def call(self, name, args, kwargs):
                test.sent.append((name, list(args), dict(kwargs)))
                return "ok"

            def start(self, name, args, kwargs):
                result = self.call(name, args, kwargs)

                async def answer():
                    return result

                return answer()

        self.client._bridge = Stub()
        self.search = self.client._make_tool(
            tool_spec(
                "search",
                [
                    {"name": "query", "required": True, "default": None},
                    {"name": "limit", "required": False, "default": 10},
                    {"name": "tag", "required": False, "default": None},
                ],
                "Find things.",
            )
        )

    def test_the_signature_follows_the_schema_with_required_parameters_first(self):
        self.assertEqual(str(inspect.signature(self.search)), "(query, limit=10, tag=None)")
        self.assertEqual(self.search.__name__, "search")
        self.assertEqual(self.search.__doc__, "Find things.")

    def test_positional_arguments_and_defaults_are_sent_by_name(self):
        self.search("cats", 3)
        self.search(query="dogs")
        self.assertEqual(
            self.sent,
            [
                ("search", [], {"query": "cats", "limit": 3, "tag": None}),
                ("search", [], {"query": "dogs", "limit": 10, "tag": None}),
            ],
        )

    def test_wrong_arguments_raise_type_error_before_anything_is_sent(self):
        for call in (lambda: self.search(), lambda: self.search("q", nope=1), lambda: self.search("q", 1, 2, 3)):
            with self.assertRaises(TypeError):
                call()
        self.assertEqual(self.sent, [])

    def test_the_awaitable_flavour_sends_the_same_call_at_once(self):
        coroutine = self.client._aio(self.search)("cats")
        self.assertEqual(self.sent, [("search", [], {"query": "cats", "limit": 10, "tag": None})])
        self.assertTrue(inspect.iscoroutine(coroutine))
        self.assertEqual(asyncio.run(coroutine), "ok")
        self.assertIs(self.client._aio(len), len, "anything that is not a tool passes through")

    def test_parameter_names_that_are_keywords_or_not_identifiers_are_refused(self):
        for bad in ("class", "not-ok", "2x"):
            with self.subTest(name=bad):
                spec = tool_spec("t", [{"name": bad, "required": True, "default": None}])
                with self.assertRaises(ValueError) as caught:
                    self.client._make_tool(spec)
                self.assertIn("not a Python identifier", str(caught.exception))

    def test_a_default_is_the_schema_value_not_shared_text(self):
        tool = self.client._make_tool(
            tool_spec("t", [{"name": "opts", "required": False, "default": {"a": [1]}}])
        )
        tool()
        self.assertEqual(self.sent, [("t", [], {"opts": {"a": [1]}})])


class RewriteAwaitedCalls(unittest.TestCase):
    def setUp(self):
        self.client = load_client()

    def rewrite(self, source):
        tree = ast.parse(source)
        self.client.rewrite_awaited_calls(tree)
        return ast.unparse(tree)

    def test_an_awaited_call_is_marked(self):
        self.assertEqual(self.rewrite("await f(x)"), "await __runpython_aio__(f)(x)")

    def test_calls_written_in_gathers_arguments_are_marked_and_others_are_not(self):
        self.assertEqual(
            self.rewrite("r = asyncio.gather(f(1), g(2), *[h(i) for i in xs])\nplain(3)"),
            "r = asyncio.gather(__runpython_aio__(f)(1), __runpython_aio__(g)(2), "
            "*[__runpython_aio__(h)(i) for i in xs])\nplain(3)",
        )

    def test_every_awaitable_taker_counts_by_attribute_or_by_name(self):
        for taker in ("create_task", "ensure_future", "wait_for", "shield", "run", "tg.create_task"):
            with self.subTest(taker=taker):
                self.assertEqual(self.rewrite("%s(f())" % taker), "%s(__runpython_aio__(f)())" % taker)
                self.assertEqual(
                    self.rewrite("asyncio.%s(f())" % taker), "asyncio.%s(__runpython_aio__(f)())" % taker
                )

    def test_wait_and_as_completed_take_an_iterable_and_wait_gets_tasks(self):
        self.assertEqual(
            self.rewrite("asyncio.wait([f(1), g(2)])"),
            "asyncio.wait([__runpython_aio__(f, True)(1), __runpython_aio__(g, True)(2)])",
        )
        self.assertEqual(
            self.rewrite("asyncio.as_completed({f(i) for i in xs})"),
            "asyncio.as_completed({__runpython_aio__(f)(i) for i in xs})",
        )
        self.assertEqual(self.rewrite("asyncio.wait(f())"), "asyncio.wait(f())", "f() returns the collection")

    def test_tuples_lists_and_generators_behind_a_star_are_looked_into(self):
        self.assertEqual(
            self.rewrite("asyncio.gather(*(f(1), g(2)))"),
            "asyncio.gather(*(__runpython_aio__(f)(1), __runpython_aio__(g)(2)))",
        )
        self.assertEqual(
            self.rewrite("asyncio.gather(*(f(i) for i in xs))"),
            "asyncio.gather(*(__runpython_aio__(f)(i) for i in xs))",
        )

    def test_an_awaited_gather_marks_both_the_gather_and_its_calls(self):
        self.assertEqual(
            self.rewrite("await asyncio.gather(f(1))"),
            "await __runpython_aio__(asyncio.gather)(__runpython_aio__(f)(1))",
        )

    def test_rewriting_twice_marks_once(self):
        tree = ast.parse("await f(x)\nasyncio.gather(g(1))")
        self.client.rewrite_awaited_calls(tree)
        self.client.rewrite_awaited_calls(tree)
        self.assertEqual(ast.unparse(tree), "await __runpython_aio__(f)(x)\nasyncio.gather(__runpython_aio__(g)(1))")

    def test_marked_calls_keep_the_users_line_numbers(self):
        tree = ast.parse("x = 1\n\nawait f(\n    2)\n")
        self.client.rewrite_awaited_calls(tree)
        marked = tree.body[1].value.value.func
        self.assertEqual((marked.lineno, marked.end_lineno), (3, 3))
        compile(tree, "<code>", "exec", flags=0x2000)  # positions are complete enough to compile

    def test_calls_stored_in_names_then_gathered_are_marked(self):
        self.assertEqual(
            self.rewrite("t = get_temp(city=c)\nd = get_desc(city=c)\nawait asyncio.gather(t, d)"),
            "t = __runpython_aio__(get_temp)(city=c)\nd = __runpython_aio__(get_desc)(city=c)\n"
            "await __runpython_aio__(asyncio.gather)(t, d)",
        )
        self.assertEqual(
            self.rewrite("pending = f(1)\nresult = await pending"),
            "pending = __runpython_aio__(f)(1)\nresult = await pending",
        )
        self.assertEqual(self.rewrite("a, b = f(1), g(2)\nawait a"), "a, b = (__runpython_aio__(f)(1), g(2))\nawait a")

    def test_calls_collected_in_lists_and_dicts_then_gathered_are_marked(self):
        cases = {
            "tasks = []\nfor x in xs:\n    tasks.append(f(x))\nawait asyncio.gather(*tasks)":
                "tasks = []\nfor x in xs:\n    tasks.append(__runpython_aio__(f)(x))\n"
                "await __runpython_aio__(asyncio.gather)(*tasks)",
            "tasks = []\nfor x in xs:\n    task = f(x)\n    tasks.append(task)\nawait asyncio.gather(*tasks)":
                "tasks = []\nfor x in xs:\n    task = __runpython_aio__(f)(x)\n    tasks.append(task)\n"
                "await __runpython_aio__(asyncio.gather)(*tasks)",
            "jobs = {c: f(c) for c in cs}\nawait asyncio.gather(*jobs.values())":
                "jobs = {c: __runpython_aio__(f)(c) for c in cs}\n"
                "await __runpython_aio__(asyncio.gather)(*jobs.values())",
            "jobs = {}\njobs['a'] = f(1)\nawait jobs['a']":
                "jobs = {}\njobs['a'] = __runpython_aio__(f)(1)\nawait jobs['a']",
            "calls = [f(x) for x in xs]\nfor c in calls:\n    print(await c)":
                "calls = [__runpython_aio__(f)(x) for x in xs]\nfor c in calls:\n    print(await c)",
            "tasks = [f(x) for x in xs]\ndone, pending = await asyncio.wait(tasks)":
                "tasks = [__runpython_aio__(f, True)(x) for x in xs]\n"
                "done, pending = await __runpython_aio__(asyncio.wait)(tasks)",
        }
        for source, expected in cases.items():
            with self.subTest(source=source):
                self.assertEqual(self.rewrite(source), expected)

    def test_helpers_whose_result_is_awaited_and_parameters_that_are_awaited(self):
        self.assertEqual(
            self.rewrite("def start(x):\n    return f(x)\nawait asyncio.gather(start(1), start(2))"),
            "def start(x):\n    return __runpython_aio__(f)(x)\n"
            "await __runpython_aio__(asyncio.gather)(__runpython_aio__(start)(1), __runpython_aio__(start)(2))",
        )
        self.assertEqual(
            self.rewrite("fetch = lambda c: f(c)\nawait asyncio.gather(*[fetch(c) for c in cs])"),
            "fetch = lambda c: __runpython_aio__(f)(c)\n"
            "await __runpython_aio__(asyncio.gather)(*[__runpython_aio__(fetch)(c) for c in cs])",
        )
        self.assertEqual(
            self.rewrite("async def run_all(coros):\n    return await asyncio.gather(*coros)\n"
                         "await run_all([f(1), f(2)])"),
            "async def run_all(coros):\n    return await __runpython_aio__(asyncio.gather)(*coros)\n"
            "await __runpython_aio__(run_all)([__runpython_aio__(f)(1), __runpython_aio__(f)(2)])",
        )

    def test_a_value_used_plainly_stays_plain_and_scopes_keep_names_apart(self):
        source = (
            "def a():\n    r = f(1)\n    return r['x']\n"
            "async def b():\n    r = f(2)\n    return await r\n"
            "r = f(3)\nprint(r)"
        )
        self.assertEqual(
            self.rewrite(source),
            "def a():\n    r = f(1)\n    return r['x']\n\n"
            "async def b():\n    r = __runpython_aio__(f)(2)\n    return await r\nr = f(3)\nprint(r)",
        )

    def test_a_global_awaited_in_a_function_marks_the_module_level_call(self):
        self.assertEqual(
            self.rewrite("tasks = [f(x) for x in xs]\nasync def main():\n    return await asyncio.gather(*tasks)"),
            "tasks = [__runpython_aio__(f)(x) for x in xs]\n\n"
            "async def main():\n    return await __runpython_aio__(asyncio.gather)(*tasks)",
        )

    def test_calls_in_nested_functions_are_found(self):
        self.assertEqual(
            self.rewrite("async def main():\n    return await f()"),
            "async def main():\n    return await __runpython_aio__(f)()",
        )


if __name__ == "__main__":
    unittest.main()
