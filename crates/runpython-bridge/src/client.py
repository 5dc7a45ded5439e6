"""runpython's tool bridge, the child's side. Stdlib only.

The runner executes this text as the module `runpython_tools` when the host exposes tools, then calls
`install(spec, namespace)`, which defines one global function per tool with a real signature. Calls go to the
host over one Unix socket connection, as frames of a u32 big-endian length then JSON: the child's end of a
socket pair inherited as descriptor `spec["fd"]`, or else a connection to the path `spec["path"]`. The first
frame is a handshake with the protocol version and the per-run token. Requests carry ids, so the awaited calls
of an `asyncio.gather` are in flight together on the one connection. The host stops reading while it serves
its cap of calls; a send that would block meanwhile reads the host's answers, so neither side waits on the
other forever.

A tool function is plain when called plainly (`double(21)` blocks and returns 42) and awaitable where the code
awaits it (`await double(21)`, `asyncio.gather(double(1), double(2))`): the runner asks `rewrite_awaited_calls`
to mark those call sites in the syntax tree before compiling, so there is no guessing at run time.
"""

PROTOCOL_VERSION = 1
_AIO_NAME = "__runpython_aio__"
# Callables whose arguments are awaitables: calls written directly in their arguments are made awaitable.
_AWAITABLE_TAKERS = {"gather", "create_task", "ensure_future", "wait_for", "shield", "wait", "as_completed", "run"}


class ToolError(Exception):
    """A tool failed on the host. Subclasses are named after the host's error type."""


class ToolCallLimit(BaseException):
    """The run used up its tool-call budget. A BaseException, so `except Exception` does not swallow it."""


class BridgeError(Exception):
    """The connection to the host broke or the host answered something unreadable."""


_error_classes = {}


def _error_for(tool, remote):
    kind = str(remote.get("type") or "ToolError")
    message = str(remote.get("message") or "")
    if kind == "ToolCallLimit":
        return ToolCallLimit(message)
    import builtins

    builtin = getattr(builtins, kind, None)
    # OSError and its kin describe the code's own system calls, not a tool's: those become ToolErrors. The
    # host's call timeout is the exception: `except TimeoutError` catches it.
    if (isinstance(builtin, type) and issubclass(builtin, Exception)
            and (builtin is TimeoutError or not issubclass(builtin, OSError))):
        try:
            return builtin(message)
        except Exception:
            pass
    cls = _error_classes.get(kind)
    if cls is None:
        name = kind if kind.isidentifier() else "ToolError"
        cls = ToolError if name == "ToolError" else type(name, (ToolError,), {"__module__": "runpython_tools"})
        _error_classes[kind] = cls
    return cls("tool %r failed: %s: %s" % (tool, kind, message))


class _Bridge:
    def __init__(self, path, fd, token, max_frame, loads, dumps):
        self.loads = loads
        self.dumps = dumps
        self.path = path
        self.fd = fd
        self.token = token
        self.max_frame = max_frame
        self.sock = None
        self.next_id = 0
        self.buf = bytearray()
        self.done = {}
        self.futures = {}
        self.reader_loop = None
        self.dontwait = 0

    def _connect(self):
        import socket  # only when a tool is first called: it costs start-up time

        if self.fd is not None:
            sock = socket.socket(fileno=self.fd)
        elif self.path:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(self.path)
        else:
            raise BridgeError("the bridge spec names neither a descriptor nor a path")
        sock.set_inheritable(False)
        sock.setblocking(True)  # whatever the inherited descriptor's mode: sends opt out per call
        self.sock = sock
        self.dontwait = socket.MSG_DONTWAIT
        self._send({"type": "hello", "version": PROTOCOL_VERSION, "token": self.token})

    def _send(self, message):
        data = self.dumps(message).encode("utf-8", "surrogatepass")
        if len(data) > self.max_frame:
            raise ValueError("tool call arguments are %d bytes as JSON, over the bridge's frame limit of %d"
                             % (len(data), self.max_frame))
        view = memoryview(len(data).to_bytes(4, "big") + data)
        while view:
            try:
                view = view[self.sock.send(view, self.dontwait):]
            except BlockingIOError:
                # The host is not reading (it serves its cap of calls): take its answers meanwhile.
                import select

                readable, _, _ = select.select([self.sock], [self.sock], [])
                if readable:
                    self._read_frames(block=False)
            except OSError as exc:  # a reset or a broken pipe: the host hung up
                raise BridgeError("the host closed the tool bridge (%s)" % exc) from None

    def _request(self, name, args, kwargs):
        if self.sock is None:
            self._connect()
        self.next_id += 1
        call_id = self.next_id
        try:
            self._send({"type": "call", "id": call_id, "tool": name, "args": list(args), "kwargs": kwargs})
        except TypeError as exc:
            raise TypeError("arguments of tool %r must be JSON values: %s" % (name, exc)) from None
        return call_id

    def _read_frames(self, block=True):
        """Read what the socket has (blocking for at least one byte unless `block` is false) and dispatch
        every complete frame."""
        try:
            chunk = self.sock.recv(1 << 16, 0 if block else self.dontwait)
        except BlockingIOError:
            return  # already read by a send that waited for the host
        if not chunk:
            raise BridgeError("the host closed the tool bridge")
        self.buf += chunk
        while len(self.buf) >= 4:
            size = int.from_bytes(self.buf[:4], "big")
            if size > self.max_frame:
                raise BridgeError("the host sent a %d-byte frame, over the limit of %d" % (size, self.max_frame))
            if len(self.buf) < 4 + size:
                break
            frame = bytes(self.buf[4 : 4 + size])
            del self.buf[: 4 + size]
            message = self.loads(frame.decode("utf-8"))
            call_id = message.get("id")
            future = self.futures.pop(call_id, None)
            if future is not None:
                if not future.done():
                    future.set_result(message)
            else:
                self.done[call_id] = message

    def call(self, name, args, kwargs):
        call_id = self._request(name, args, kwargs)
        while call_id not in self.done:
            self._read_frames()
        return _unwrap(name, self.done.pop(call_id))

    async def call_async(self, name, args, kwargs):
        import asyncio

        loop = asyncio.get_running_loop()
        call_id = self._request(name, args, kwargs)
        if call_id in self.done:  # answered while a plain call was reading
            return _unwrap(name, self.done.pop(call_id))
        future = loop.create_future()
        self.futures[call_id] = future
        if self.reader_loop is not loop:
            loop.add_reader(self.sock.fileno(), self._on_readable)
            self.reader_loop = loop
        try:
            message = await future
        finally:
            self.futures.pop(call_id, None)
            if not self.futures and self.reader_loop is not None:
                self.reader_loop.remove_reader(self.sock.fileno())
                self.reader_loop = None
        return _unwrap(name, message)

    def _on_readable(self):
        try:
            self._read_frames(block=False)
        except BaseException as exc:
            for future in self.futures.values():
                if not future.done():
                    future.set_exception(exc)
            self.futures.clear()


def _unwrap(name, message):
    if "error" in message:
        raise _error_for(name, message["error"])
    return message.get("result")


_bridge = None


def call(tool, /, **kwargs):
    """Calls a host tool by name (the runner's artifact helpers use this for the host's hidden tools)."""
    return _bridge.call(tool, (), kwargs)


def once(function):
    """`function()`'s value, journaled: a run resumed after a suspension gets the value recorded the first
    time instead of a new one (for time, randomness, anything that differs between runs)."""
    return _bridge.call("runpython_once", (), {"value": function()})


def _aio(function):
    """Used by rewritten call sites: the awaitable flavour of a tool, anything else unchanged."""
    return getattr(function, "_runpython_async", function)


def install(spec, namespace, loads, dumps):
    """Defines the tool functions in `namespace`; `loads`/`dumps` are the runner's strict JSON codec."""
    global _bridge
    fd = spec.get("fd")
    if fd is not None:
        import posix

        try:
            posix.set_inheritable(fd, False)  # the code's subprocesses must not hold the bridge
        except OSError:
            pass  # not open: the first call says so
    _bridge = _Bridge(spec.get("path"), fd, spec["token"], int(spec.get("max_frame", 16 << 20)), loads, dumps)
    registry = {}
    for tool in spec["tools"]:
        if tool.get("hidden"):
            continue  # the host's plumbing, reached through the runner's helpers
        function = _make_tool(tool)
        registry[tool["name"]] = function
        if tool["name"].isidentifier() and not _is_keyword(tool["name"]):
            namespace[tool["name"]] = function
    namespace["tools"] = _Tools(registry)
    namespace[_AIO_NAME] = _aio
    namespace["once"] = once


def _is_keyword(name):
    import keyword

    return keyword.iskeyword(name)


class _Tools:
    """`tools.<name>` and `tools["odd-name"]`, for names that are not identifiers."""

    def __init__(self, registry):
        self.__dict__["_registry"] = registry

    def __getattr__(self, name):
        try:
            return self._registry[name]
        except KeyError:
            raise AttributeError("no tool named %r; the tools are %s" % (name, sorted(self._registry))) from None

    __getitem__ = __getattr__

    def __dir__(self):
        return sorted(self._registry)

    def __repr__(self):
        return "<tools %s>" % ", ".join(sorted(self._registry))


def _make_tool(tool):
    """A function with the schema's signature that forwards its arguments by name (or as given, schemaless)."""
    name = tool["name"]
    params = tool.get("params")
    doc = tool.get("description") or ""
    if params is None:
        def function(*args, **kwargs):
            return _bridge.call(name, args, kwargs)

        async def function_async(*args, **kwargs):
            return await _bridge.call_async(name, args, kwargs)
    else:
        required = [p for p in params if p.get("required")]
        optional = [p for p in params if not p.get("required")]
        pieces, defaults = [], {}
        for p in required:
            pieces.append(p["name"])
        for i, p in enumerate(optional):
            key = "_d%d" % i
            defaults[key] = p.get("default")
            pieces.append("%s=%s" % (p["name"], key))
        if any(not p["name"].isidentifier() or _is_keyword(p["name"]) for p in params):
            raise ValueError("tool %r has a parameter name that is not a Python identifier" % name)
        names = [p["name"] for p in params]
        kwargs_text = "{%s}" % ", ".join("%r: %s" % (n, n) for n in names)
        source = (
            "def {fn}({sig}):\n    return _call({name!r}, (), {kw})\n"
            "async def {fn}_async({sig}):\n    return await _acall({name!r}, (), {kw})\n"
        ).format(fn="function", sig=", ".join(pieces), name=name, kw=kwargs_text)
        scope = dict(defaults, _call=lambda *a: _bridge.call(*a), _acall=lambda *a: _bridge.call_async(*a))
        exec(compile(source, "<runpython-bridge>", "exec"), scope)
        function, function_async = scope["function"], scope["function_async"]
    for f in (function, function_async):
        f.__name__ = name if name.isidentifier() else "tool"
        f.__qualname__ = f.__name__
        f.__doc__ = doc
    function._runpython_async = function_async
    return function


def rewrite_awaited_calls(tree):
    """Mark call sites in awaitable position so the tool there returns a coroutine: `await f(x)` and calls
    written directly in the arguments of `asyncio.gather`/`create_task`/... become `__runpython_aio__(f)(x)`.
    Anything that is not a tool passes through `__runpython_aio__` unchanged."""
    import _ast

    def wrap(call):
        if isinstance(call.func, _ast.Call) and isinstance(call.func.func, _ast.Name) and call.func.func.id == _AIO_NAME:
            return
        func = call.func
        call.func = _ast.Call(func=_ast.Name(id=_AIO_NAME, ctx=_ast.Load()), args=[func], keywords=[])
        for node in (call.func, call.func.func):
            node.lineno, node.col_offset = func.lineno, func.col_offset
            node.end_lineno, node.end_col_offset = func.end_lineno, func.end_col_offset

    def awaitable_position(node):
        if isinstance(node, _ast.Call):
            wrap(node)
        elif isinstance(node, _ast.Starred):
            awaitable_position(node.value)
        elif isinstance(node, (_ast.List, _ast.Tuple, _ast.Set)):
            for element in node.elts:
                awaitable_position(element)
        elif isinstance(node, (_ast.ListComp, _ast.GeneratorExp, _ast.SetComp)):
            awaitable_position(node.elt)

    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, _ast.Await):
            awaitable_position(node.value)
        elif isinstance(node, _ast.Call):
            func = node.func
            if isinstance(func, _ast.Call) and isinstance(func.func, _ast.Name) and func.func.id == _AIO_NAME:
                func = func.args[0]  # already marked as awaited: look at what it wraps
            taker = func.attr if isinstance(func, _ast.Attribute) else func.id if isinstance(func, _ast.Name) else None
            if taker in _AWAITABLE_TAKERS:
                for arg in node.args:
                    awaitable_position(arg)
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, list):
                stack.extend(v for v in value if isinstance(v, _ast.AST))
            elif isinstance(value, _ast.AST):
                stack.append(value)
