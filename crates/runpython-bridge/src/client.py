"""runpython's tool bridge, the child's side. Stdlib only.

The runner executes this text as the module `runpython_tools` when the host exposes tools, then calls
`install(spec, namespace)`, which defines one global function per tool with a real signature. Calls go to the
host over one Unix socket connection, as frames of a u32 big-endian length then JSON: the child's end of a
socket pair inherited as descriptor `spec["fd"]`, or else a connection to the path `spec["path"]`. The first
frame is a handshake with the protocol version and the per-run token. Requests carry ids, so the awaited calls
of an `asyncio.gather` are in flight together on the one connection. The host stops reading while it serves
its cap of calls; a send that would block meanwhile reads the host's answers, so neither side waits on the
other forever.

A tool function blocks and returns its value (`double(21)` is 42), except where the code treats its result
as an awaitable: written after `await`, handed to asyncio (`gather`, `create_task`, `wait`, `as_completed`,
`ensure_future`, `wait_for`, `shield`, `run`, a TaskGroup's `create_task`), or stored in a variable, list or
dict that the same function awaits or hands to asyncio (`t = f(); await asyncio.gather(t, g())`,
`tasks.append(f(x))`, a helper whose result is awaited). Those calls are marked in the syntax tree before
compiling (`rewrite_awaited_calls`), so there is no guessing at run time; a marked call sends its request
at once and returns an awaitable for the answer, so calls made before one awaits them run concurrently.
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
    """One connection to the host. Plain calls may come from many threads at once: one thread at a
    time sends a frame (`send_lock`, which also guards connecting) and one at a time reads
    (`read_lock`); the reader dispatches every answer it reads, and while other threads wait it reads
    in short slices so the lock passes to them (`_thread`'s locks: `threading` costs milliseconds to
    import)."""

    def __init__(self, path, fd, token, max_frame, loads, dumps):
        import _thread

        self.send_lock = _thread.allocate_lock()
        self.read_lock = _thread.allocate_lock()
        self.waiting = 0
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
                # The host is not reading (it serves its cap of calls): take its answers meanwhile,
                # unless another thread is reading them.
                import select

                if self.read_lock.acquire(False):
                    try:
                        readable, _, _ = select.select([self.sock], [self.sock], [])
                        if readable:
                            self._read_frames(block=False)
                    finally:
                        self.read_lock.release()
                else:
                    select.select([], [self.sock], [], 0.01)
            except OSError as exc:  # a reset or a broken pipe: the host hung up
                raise BridgeError("the host closed the tool bridge (%s)" % exc) from None

    def _request(self, name, args, kwargs, waits=False):
        with self.send_lock:
            if self.sock is None:
                self._connect()
            self.next_id += 1
            call_id = self.next_id
            if waits:
                self.waiting += 1
            try:
                if name in _typed:
                    args = [_values.encode(a)[0] for a in args]
                    kwargs = {k: _values.encode(v)[0] for k, v in kwargs.items()}
                self._send({"type": "call", "id": call_id, "tool": name, "args": list(args), "kwargs": kwargs})
            except BaseException as exc:
                if waits:
                    self.waiting -= 1
                if name in _typed and isinstance(exc, (TypeError, ValueError)):
                    raise type(exc)("an argument of tool %r cannot cross to the host: %s" % (name, exc)) from None
                if isinstance(exc, TypeError):
                    raise TypeError("arguments of tool %r must be JSON values: %s" % (name, exc)) from None
                raise
        return call_id

    def _read_frames(self, block=True, slice_seconds=None):
        """Read what the socket has (blocking for at least one byte unless `block` is false, or for at
        most `slice_seconds`) and dispatch every complete frame."""
        if slice_seconds is not None:
            import select

            if not select.select([self.sock], [], [], slice_seconds)[0]:
                return
        try:
            chunk = self.sock.recv(1 << 16, 0 if block else self.dontwait)
        except BlockingIOError:
            return  # already read by a send that waited for the host
        except OSError as exc:  # a reset: the host hung up before its answer
            raise BridgeError("the host closed the tool bridge (%s)" % exc) from None
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
        call_id = self._request(name, args, kwargs, waits=True)
        try:
            while call_id not in self.done:
                with self.read_lock:
                    if call_id in self.done:
                        break
                    # Alone, block; with other threads waiting, read in slices so they get their turn.
                    self._read_frames(slice_seconds=0.02 if self.waiting > 1 else None)
        finally:
            with self.send_lock:
                self.waiting -= 1
        return _unwrap(name, self.done.pop(call_id))

    def start(self, name, args, kwargs):
        """Sends the call now and returns a coroutine for its answer: calls started before one is
        awaited are in flight together."""
        return self._answer(name, self._request(name, args, kwargs))

    async def _answer(self, name, call_id):
        import asyncio

        if call_id in self.done:  # answered while something else was reading
            return _unwrap(name, self.done.pop(call_id))
        loop = asyncio.get_running_loop()
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
    if name in _typed:
        return _values.decode(message.get("result"), stand_ins=True)
    return message.get("result")


_bridge = None
# The tagged codec, and the tools whose arguments and results go through it (a host's Python callables:
# a tuple stays a tuple, a datetime a datetime); other tools take and give plain JSON.
_values = None
_typed = set()


def call(tool, /, **kwargs):
    """Calls a host tool by name (the runner's artifact helpers use this for the host's hidden tools)."""
    return _bridge.call(tool, (), kwargs)


def once(function):
    """`function()`'s value, journaled: a run resumed after a suspension gets the value recorded the first
    time instead of a new one (for time, randomness, anything that differs between runs)."""
    return _bridge.call("runpython_once", (), {"value": function()})


def _aio(function, task=False):
    """Used by rewritten call sites: the awaitable flavour of a tool (a Task when `task`, for
    `asyncio.wait`, which refuses coroutines), anything else unchanged."""
    flavour = _flavours.get(id(function))
    if flavour is None or flavour[0] is not function:
        return function
    if not task:
        return flavour[1]

    def as_task(*args, **kwargs):
        import asyncio

        awaitable = flavour[1](*args, **kwargs)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return awaitable  # no loop yet: the code runs it later (asyncio.run)
        return asyncio.ensure_future(awaitable)

    return as_task


# id(tool function) -> (the function, its awaitable flavour); by identity, so any object can be looked up.
_flavours = {}


def install(spec, namespace, loads, dumps, values=None):
    """Defines the tool functions in `namespace`; `loads`/`dumps` are the runner's strict JSON codec,
    `values` its tagged codec (runpython_values) for tools that take and give exact values."""
    global _bridge, _values
    _check_spec(spec)
    fd = spec["fd"]
    if fd is not None:
        import posix

        try:
            posix.set_inheritable(fd, False)  # the code's subprocesses must not hold the bridge
        except OSError:
            pass  # not open: the first call says so
    _bridge = _Bridge(spec["path"], fd, spec["token"], spec["max_frame"], loads, dumps)
    registry = {}
    _values = values
    _typed.clear()
    _typed.update(t["name"] for t in spec["tools"] if t["typed"] and values is not None)
    for tool in spec["tools"]:
        if tool["hidden"]:
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


# The keys of what the host sends (runpython-bridge's `ClientSpec`, `ToolClientSpec` and `Param`): one
# missing or unknown is the host's and this client's disagreement, said at once, never a default.
_SPEC_KEYS = frozenset(("path", "fd", "token", "max_frame", "tools"))
_TOOL_KEYS = frozenset(("name", "description", "params", "hidden", "typed"))
_PARAM_KEYS = frozenset(("name", "required", "default"))


def _check_keys(value, keys, what):
    if type(value) is not dict:
        raise BridgeError("%s is not an object" % what)
    for key in sorted(keys):
        if key not in value:
            raise BridgeError("%s: missing key %r" % (what, key))
    for key in value:
        if key not in keys:
            raise BridgeError("%s: unknown key %r" % (what, key))


def _check_spec(spec):
    _check_keys(spec, _SPEC_KEYS, "the bridge spec")
    for tool in spec["tools"]:
        _check_keys(tool, _TOOL_KEYS, "the bridge spec's tool")
        for param in tool["params"] or ():
            _check_keys(param, _PARAM_KEYS, "the parameter of tool %r" % (tool["name"],))


def _make_tool(tool):
    """A function with the schema's signature that forwards its arguments by name (or as given, schemaless)."""
    name = tool["name"]
    params = tool["params"]
    doc = tool["description"]
    if params is None:
        def function(*args, **kwargs):
            return _bridge.call(name, args, kwargs)

        def function_async(*args, **kwargs):
            return _bridge.start(name, args, kwargs)
    else:
        required = [p for p in params if p["required"]]
        optional = [p for p in params if not p["required"]]
        pieces, defaults = [], {}
        for p in required:
            pieces.append(p["name"])
        for i, p in enumerate(optional):
            key = "_d%d" % i
            defaults[key] = p["default"]
            pieces.append("%s=%s" % (p["name"], key))
        if any(not p["name"].isidentifier() or _is_keyword(p["name"]) for p in params):
            raise ValueError("tool %r has a parameter name that is not a Python identifier" % name)
        names = [p["name"] for p in params]
        kwargs_text = "{%s}" % ", ".join("%r: %s" % (n, n) for n in names)
        source = (
            "def {fn}({sig}):\n    return _call({name!r}, (), {kw})\n"
            "def {fn}_async({sig}):\n    return _start({name!r}, (), {kw})\n"
        ).format(fn="function", sig=", ".join(pieces), name=name, kw=kwargs_text)
        scope = dict(defaults, _call=lambda *a: _bridge.call(*a), _start=lambda *a: _bridge.start(*a))
        exec(compile(source, "<runpython-bridge>", "exec"), scope)
        function, function_async = scope["function"], scope["function_async"]
    for f in (function, function_async):
        f.__name__ = name if name.isidentifier() else "tool"
        f.__qualname__ = f.__name__
        f.__doc__ = doc
    _flavours[id(function)] = (function, function_async)
    return function


def rewrite_awaited_calls(tree):
    """Marks the call sites whose result the code treats as an awaitable, so the tool called there returns
    one: `f(x)` becomes `__runpython_aio__(f)(x)` (`__runpython_aio__(f, True)(x)` where `asyncio.wait`
    needs a Task). Anything that is not a tool passes through `__runpython_aio__` unchanged.

    A call's result is awaitable where it is awaited, handed to asyncio (`_TAKE_*`), or flows there in the
    same function: through a variable (`t = f()` ... `await t`), a list, set or dict (literal,
    comprehension, `.append`/`.add`/`.extend`/`.insert`, `d[k] = f()`, `*tasks`, `d.values()`), a `for`
    loop that awaits its target, a helper function whose result is awaited (its `return` values), or a
    parameter of a function that awaits it. Names are resolved by scope (a module, a function, a lambda),
    so one function's `r = f()` is not another's."""
    if _awaits_anything(tree):
        _Rewrite(tree).run()


def _awaits_anything(tree):
    """Whether the code awaits or calls an asyncio taker anywhere (else every call is plain)."""
    import _ast

    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, _ast.Await):
            return True
        if isinstance(node, _ast.Call):
            func = node.func
            name = func.attr if isinstance(func, _ast.Attribute) else func.id if isinstance(func, _ast.Name) else None
            if name in _TAKE_ALL or name in _TAKE_FIRST or name in _TAKE_MANY:
                return True
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, list):
                stack.extend(v for v in value if isinstance(v, _ast.AST))
            elif isinstance(value, _ast.AST):
                stack.append(value)
    return False


_VALUE, _ITER, _TASK = 1, 2, 4
# asyncio callables whose arguments are awaitables, by how: all positional (gather), the first
# (create_task, ...), or the first as an iterable of them (wait: Tasks; as_completed).
_TAKE_ALL = {"gather"}
_TAKE_FIRST = {"create_task", "ensure_future", "wait_for", "shield", "run", "run_until_complete",
               "run_coroutine_threadsafe"}
_TAKE_MANY = {"wait": _TASK, "as_completed": 0}
# Methods that put their argument into a collection, and how (one item, or an iterable of them).
_ADDERS = {"append": _VALUE, "add": _VALUE, "appendleft": _VALUE, "put_nowait": _VALUE, "extend": _ITER}
_COPIERS = {"list", "tuple", "set", "sorted", "reversed", "iter"}


class _Scope:
    def __init__(self, node, parent):
        self.node, self.parent = node, parent
        self.bound, self.declared = set(), set()
        self.facts = {}  # name -> _VALUE | _ITER | _TASK bits, for names this scope binds
        self.params = []
        self.nodes = []  # the nodes evaluated in this scope, in order
        self.defs = {}  # name -> the scope of a function defined here under that name


class _Rewrite:
    def __init__(self, tree):
        import _ast

        self.ast = _ast
        self.tree = tree
        self.scopes = []
        self.changed = False
        self._collect(tree, None)

    def run(self):
        # Facts only grow, and each is a name in a finite tree: the passes end.
        while True:
            self.changed = False
            for scope in self.scopes:
                self._pass(scope)
            if not self.changed:
                return

    # ---- scopes ----

    def _scope_nodes(self):
        a = self.ast
        return (a.FunctionDef, a.AsyncFunctionDef, a.Lambda)

    def _own_nodes(self, scope):
        """The nodes evaluated in `scope` (nested functions' bodies excluded, their names included)."""
        a = self.ast
        node = scope.node
        stack = [node.body] if isinstance(node, a.Lambda) else list(reversed(node.body))
        while stack:
            current = stack.pop()
            yield current
            if isinstance(current, self._scope_nodes()):
                continue
            children = []
            for field in current._fields:
                value = getattr(current, field, None)
                if isinstance(value, list):
                    children.extend(v for v in value if isinstance(v, a.AST))
                elif isinstance(value, a.AST):
                    children.append(value)
            stack.extend(reversed(children))

    def _collect(self, node, parent):
        a = self.ast
        scope = _Scope(node, parent)
        self.scopes.append(scope)
        if isinstance(node, self._scope_nodes()):
            args = node.args
            for arg in args.posonlyargs + args.args:
                scope.params.append(arg.arg)
            for arg in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
                if arg is not None:
                    scope.bound.add(arg.arg)
        scope.nodes = list(self._own_nodes(scope))
        for current in scope.nodes:
            if isinstance(current, a.Name) and not isinstance(current.ctx, a.Load):
                scope.bound.add(current.id)
            elif isinstance(current, (a.FunctionDef, a.AsyncFunctionDef, a.ClassDef)):
                scope.bound.add(current.name)
            elif isinstance(current, (a.Import, a.ImportFrom)):
                for alias in current.names:
                    scope.bound.add((alias.asname or alias.name).split(".")[0])
            elif isinstance(current, a.ExceptHandler) and current.name:
                scope.bound.add(current.name)
            elif isinstance(current, (a.Global, a.Nonlocal)):
                scope.declared.update(current.names)
            if isinstance(current, self._scope_nodes()):
                child = self._collect(current, scope)
                if isinstance(current, (a.FunctionDef, a.AsyncFunctionDef)):
                    scope.defs[current.name] = child
        scope.bound -= scope.declared
        return scope

    def _owner(self, scope, name):
        while scope is not None:
            if name in scope.bound:
                return scope
            scope = scope.parent
        return self.scopes[0]

    def _facts(self, scope, name):
        return self._owner(scope, name).facts.get(name, 0)

    def _learn(self, scope, name, bits):
        owner = self._owner(scope, name)
        old = owner.facts.get(name, 0)
        if old | bits != old:
            owner.facts[name] = old | bits
            self.changed = True

    def _function(self, scope, name):
        while scope is not None:
            if name in scope.bound:
                return scope.defs.get(name)
            scope = scope.parent
        return None

    # ---- one pass over a scope ----

    def _pass(self, scope):
        a = self.ast
        node = scope.node
        # A (non-async) function or lambda whose result is awaited: its results are awaitables.
        if isinstance(node, (a.FunctionDef, a.Lambda)) and scope.parent is not None:
            name = getattr(node, "name", None) or self._lambda_name(scope)
            wanted = self._facts(scope.parent, name) if name else 0
            if wanted and isinstance(node, a.Lambda):
                self._mark(scope, node.body, wanted)
        else:
            wanted = 0
        for current in scope.nodes:
            if isinstance(current, a.Await):
                self._mark(scope, current.value, _VALUE)
            elif isinstance(current, a.Return) and wanted and current.value is not None:
                self._mark(scope, current.value, wanted)
            elif isinstance(current, a.Call):
                self._call(scope, current)
            elif isinstance(current, a.Assign):
                for target in current.targets:
                    self._flow(scope, target, current.value)
            elif isinstance(current, (a.AnnAssign, a.NamedExpr)) and current.value is not None:
                self._flow(scope, current.target, current.value)
            elif isinstance(current, a.AugAssign) and isinstance(current.target, a.Name):
                if self._facts(scope, current.target.id) & _ITER:
                    self._mark(scope, current.value, _ITER | (self._facts(scope, current.target.id) & _TASK))
            elif isinstance(current, (a.For, a.comprehension)) and isinstance(current.target, a.Name):
                bits = self._facts(scope, current.target.id)
                if bits & _VALUE:
                    self._mark(scope, current.iter, _ITER | (bits & _TASK))

    def _lambda_name(self, scope):
        """The name a lambda is assigned to (`fetch = lambda c: f(c)`), if any."""
        a = self.ast
        for current in scope.parent.nodes:
            if isinstance(current, a.Assign) and current.value is scope.node:
                for target in current.targets:
                    if isinstance(target, a.Name):
                        return target.id
        return None

    def _call(self, scope, call):
        a = self.ast
        func = self._unwrapped(call.func)
        name = func.attr if isinstance(func, a.Attribute) else func.id if isinstance(func, a.Name) else None
        if name in _TAKE_ALL:
            for arg in call.args:
                self._item(scope, arg, 0)
        elif name in _TAKE_FIRST and call.args:
            self._mark(scope, call.args[0], _VALUE)
        elif name in _TAKE_MANY:
            first = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "fs"), None)
            if first is not None:
                self._mark(scope, first, _ITER | _TAKE_MANY[name])
        elif isinstance(func, a.Attribute) and isinstance(func.value, a.Name):
            bits = self._facts(scope, func.value.id)
            if bits & _ITER and name in _ADDERS and call.args:
                self._mark(scope, call.args[-1], _ADDERS[name] | (bits & _TASK))
            elif bits & _ITER and name in ("insert", "setdefault") and len(call.args) == 2:
                self._mark(scope, call.args[1], _VALUE | (bits & _TASK))
        elif isinstance(func, a.Name):
            target = self._function(scope, func.id)
            if target is not None:
                self._arguments(scope, target, call)

    def _arguments(self, scope, target, call):
        """Arguments passed to parameters the called function awaits or hands to asyncio."""
        a = self.ast
        for index, arg in enumerate(call.args):
            if isinstance(arg, a.Starred) or index >= len(target.params):
                break
            bits = target.facts.get(target.params[index], 0)
            if bits:
                self._mark(scope, arg, bits)
        for keyword in call.keywords:
            if keyword.arg is not None:
                bits = target.facts.get(keyword.arg, 0)
                if bits:
                    self._mark(scope, keyword.value, bits)

    def _flow(self, scope, target, value):
        """What the code assigns to a name it awaits is awaitable."""
        a = self.ast
        if isinstance(target, a.Name):
            bits = self._facts(scope, target.id)
            if bits:
                self._mark(scope, value, bits)
        elif isinstance(target, (a.Tuple, a.List)):
            elements = target.elts
            if isinstance(value, (a.Tuple, a.List)) and len(value.elts) == len(elements) and not any(
                isinstance(e, a.Starred) for e in elements + value.elts
            ):
                for element, item in zip(elements, value.elts):
                    self._flow(scope, element, item)
            else:
                for element in elements:
                    element = element.value if isinstance(element, a.Starred) else element
                    if isinstance(element, a.Name) and self._facts(scope, element.id) & _VALUE:
                        self._mark(scope, value, _ITER | (self._facts(scope, element.id) & _TASK))
        elif isinstance(target, a.Subscript) and isinstance(target.value, a.Name):
            bits = self._facts(scope, target.value.id)
            if bits & _ITER:
                self._mark(scope, value, _VALUE | (bits & _TASK))

    def _item(self, scope, node, task):
        """An argument of gather: an awaitable, or `*iterable` of them."""
        if isinstance(node, self.ast.Starred):
            self._mark(scope, node.value, _ITER | task)
        else:
            self._mark(scope, node, _VALUE | task)

    def _mark(self, scope, node, bits):
        """`node` evaluates to an awaitable (`_VALUE`) or to a collection of them (`_ITER`)."""
        a = self.ast
        task = bits & _TASK
        if isinstance(node, a.IfExp):
            self._mark(scope, node.body, bits)
            self._mark(scope, node.orelse, bits)
        elif isinstance(node, a.NamedExpr):
            self._learn(scope, node.target.id, bits)
            self._mark(scope, node.value, bits)
        elif isinstance(node, a.Name):
            self._learn(scope, node.id, bits)
        elif bits & _VALUE:
            if isinstance(node, a.Call):
                self._wrap(node, task)
                func = self._unwrapped(node.func)
                if isinstance(func, a.Name):  # a helper whose result is awaited
                    self._learn(scope, func.id, _VALUE | task)
            elif isinstance(node, a.Subscript):
                self._mark(scope, node.value, _ITER | task)
        elif bits & _ITER:
            if isinstance(node, (a.List, a.Tuple, a.Set)):
                for element in node.elts:
                    self._item(scope, element, task)
            elif isinstance(node, (a.ListComp, a.SetComp, a.GeneratorExp)):
                self._mark(scope, node.elt, _VALUE | task)
            elif isinstance(node, a.DictComp):
                self._mark(scope, node.value, _VALUE | task)
            elif isinstance(node, a.Dict):
                for value in node.values:
                    self._mark(scope, value, _VALUE | task)
            elif isinstance(node, a.BinOp) and isinstance(node.op, a.Add):
                self._mark(scope, node.left, bits)
                self._mark(scope, node.right, bits)
            elif isinstance(node, a.Subscript) and isinstance(node.slice, a.Slice):
                self._mark(scope, node.value, bits)
            elif isinstance(node, a.Call):
                func = self._unwrapped(node.func)
                if isinstance(func, a.Attribute) and func.attr in ("values", "copy"):
                    self._mark(scope, func.value, bits)
                elif isinstance(func, a.Name) and func.id in _COPIERS and node.args:
                    self._mark(scope, node.args[0], bits)
                elif isinstance(func, a.Name):  # a helper that returns the collection
                    self._learn(scope, func.id, bits)

    def _unwrapped(self, func):
        a = self.ast
        if isinstance(func, a.Call) and isinstance(func.func, a.Name) and func.func.id == _AIO_NAME:
            return func.args[0]
        return func

    def _wrap(self, call, task):
        a = self.ast
        func = call.func
        if isinstance(func, a.Call) and isinstance(func.func, a.Name) and func.func.id == _AIO_NAME:
            if task and len(func.args) == 1:
                func.args.append(self._positioned(a.Constant(value=True), func))
                self.changed = True
            return
        marker = a.Call(func=a.Name(id=_AIO_NAME, ctx=a.Load()), args=[func], keywords=[])
        if task:
            marker.args.append(a.Constant(value=True))
        call.func = self._positioned(marker, func)
        self.changed = True

    def _positioned(self, node, like):
        """`node` (and the nodes it holds) at `like`'s place in the user's code."""
        nodes = [node]
        if isinstance(node, self.ast.Call):
            nodes.append(node.func)
            nodes.extend(arg for arg in node.args if not hasattr(arg, "lineno"))
        for child in nodes:
            child.lineno, child.col_offset = like.lineno, like.col_offset
            child.end_lineno, child.end_col_offset = like.end_lineno, like.end_col_offset
        return node
