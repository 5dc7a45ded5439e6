"""runpython as smolagents' code executor: `CodeAgent(tools=..., model=..., executor=RunPythonExecutor())`.

    from smolagents import CodeAgent, InferenceClientModel
    from runpython.integrations.smolagents import RunPythonExecutor

    executor = RunPythonExecutor(additional_authorized_imports=["numpy"], timeout=30)
    agent = CodeAgent(tools=[...], model=InferenceClientModel(), executor=executor,
                      step_callbacks=[executor.attach_images])
    agent.run("...")

- One runpython session per executor (so per agent): variables live across steps and across runs.
- The agent's tools (and managed agents) stay on the host: each is a runpython tool, a Python callable the
  sandboxed code calls through the bridge. Nothing is shipped as source, so their credentials never enter
  the sandbox.
- `final_answer(x)` runs the agent's own final-answer tool on the host, then stops the code; the step's
  `CodeOutput` has `is_final_answer=True` and the tool's result.
- Authorized imports: the sandbox is the boundary, so every stdlib module may be imported.
  `additional_authorized_imports` become runpython's dependency policy: the packages named there (top-level
  names, `pkg.*` included) are the only ones an import may install (`allowed_packages`); `"*"` lets the
  imports install what they need. Without any, nothing is installed. runpython's allowlist holds
  distribution names: where an import's distribution is named otherwise (`sklearn`, `PIL`, `yaml`), pass
  `allowed_packages=["scikit-learn", ...]` yourself.
- Logs are the run's stdout (and stderr); an error in the code raises smolagents' `AgentError` with the
  logs, the exception's type, message and traceback, which the agent shows the model as a step error.
- Images the code displays (`display(obj)`, `_repr_png_`, matplotlib) become PIL images: `last_images`,
  the step's output when the code returned nothing, and `observations_images` of the step through the
  `attach_images` step callback, which is how smolagents shows images to the model.
- `send_variables` binds the agent's state (`additional_args`) in the session; values that are not JSON
  are skipped with a warning (runpython's inputs are JSON).
"""

from __future__ import annotations

import inspect
import io
import json
import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from runpython import Envelope, RunPython, Session
from runpython import tool as _tool
from runpython.integrations._common import image_bytes, missing

try:
    import PIL.Image

    # smolagents ships no type information (no py.typed): its names are Any here.
    from smolagents.local_python_executor import (  # type: ignore[import-untyped]
        BASE_BUILTIN_MODULES,
        CodeOutput,
        PythonExecutor,
    )
    from smolagents.memory import ActionStep  # type: ignore[import-untyped]
    from smolagents.monitoring import AgentLogger, LogLevel  # type: ignore[import-untyped]
    from smolagents.utils import AgentError  # type: ignore[import-untyped]
except ImportError as _exc:
    raise missing("smolagents", "smolagents", _exc) from _exc

__all__ = ["RunPythonExecutor"]

# smolagents' input types as Python hints (the schema the code's stubs show, and the checks runpython makes).
_HINTS: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
}

_FINAL_TOOL = "_runpython_final_answer"
# Defined in the session before the first step: `final_answer` runs the agent's tool on the host (which
# records its result there), then stops the code with an exception the code's `except Exception` lets pass.
_PRELUDE = f"""
class FinalAnswerException(BaseException):
    pass

def final_answer(answer):
    import json as _json
    try:
        _json.dumps(answer)
    except (TypeError, ValueError):
        answer = repr(answer)
    {_FINAL_TOOL}(answer=answer)
    raise FinalAnswerException()
"""


def _jsonable(value: Any) -> Any:
    """A tool's result as JSON for the code: itself when it is JSON, else its `str` (an AgentText, an
    AgentImage's path)."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


class RunPythonExecutor(PythonExecutor):  # type: ignore[misc]
    """A smolagents `PythonExecutor` that runs each code action as a cell of one runpython session.

    `runpython_options` go to `RunPython(...)` (`timeout`, `sandbox`, `network`, `store`, ...), except
    `tools`, which come from the agent. `allowed_packages` and `auto_deps` come from
    `additional_authorized_imports` unless given here.
    """

    def __init__(
        self,
        additional_authorized_imports: Sequence[str] = (),
        *,
        logger: AgentLogger | None = None,
        session_id: str | None = None,
        **runpython_options: Any,
    ) -> None:
        if "tools" in runpython_options:
            raise TypeError("RunPythonExecutor's tools are the agent's: give them to CodeAgent(tools=...)")
        self.additional_authorized_imports = list(additional_authorized_imports)
        self.authorized_imports = sorted(set(BASE_BUILTIN_MODULES) | set(self.additional_authorized_imports))
        self.logger = logger or AgentLogger(level=LogLevel.OFF)
        self.session_id = session_id
        self.runpython_options = runpython_options
        self.last_images: list[PIL.Image.Image] = []
        self._tools: dict[str, Any] = {}
        self._tool_names: tuple[str, ...] | None = None
        self._engine: RunPython | None = None
        self._session: Session | None = None
        self._variables: dict[str, Any] = {}
        self._final: list[Any] = []
        self._lock = threading.Lock()

    # --- the engine and its session -------------------------------------------------------------------

    def _dependency_policy(self) -> dict[str, Any]:
        imports = self.additional_authorized_imports
        if "*" in imports:
            return {"auto_deps": True}
        packages = sorted({name.split(".")[0] for name in imports if name.split(".")[0] != "*"})
        if not packages:
            return {"auto_deps": False}
        return {"auto_deps": True, "allowed_packages": packages}

    def _host_tool(self, name: str, smol_tool: Any) -> Any:
        """The agent's tool as a runpython tool: a callable with the tool's signature that looks the tool
        up at call time (so a later `send_tools` with the same names needs no new engine)."""
        params = []
        inputs: Mapping[str, Any] = getattr(smol_tool, "inputs", None) or {}
        for arg, spec in inputs.items():
            hint = _HINTS.get(str(spec.get("type")), Any)
            if spec.get("nullable"):
                hint = hint | None if hint is not Any else Any
            default = None if spec.get("nullable") else inspect.Parameter.empty
            params.append(inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint))

        def call(**kwargs: Any) -> Any:
            return _jsonable(self._tools[name](**kwargs))

        call.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        call.__name__ = name
        return _tool(call, name=name, description=str(getattr(smol_tool, "description", "") or ""))

    def _final_answer(self, answer: Any = None) -> None:
        tool = self._tools.get("final_answer")
        self._final.append(tool(answer=answer) if tool is not None else answer)

    def _build(self) -> Session:
        names = tuple(sorted(self._tools))
        if self._session is not None and names == self._tool_names:
            return self._session
        if self._session is not None:
            self.logger.log("runpython: the agent's tools changed, starting a new session", level=LogLevel.INFO)
            self._session.close()
        host_tools = [self._host_tool(n, t) for n, t in self._tools.items() if n != "final_answer"]
        host_tools.append(_tool(self._final_answer, name=_FINAL_TOOL, description="The agent's final answer."))
        options = {**self._dependency_policy(), **self.runpython_options}
        self._engine = RunPython(tools=host_tools, **options)
        self._session = self._engine.session(self.session_id)
        self._tool_names = names
        self._cell(_PRELUDE, inputs=self._variables or None)
        return self._session

    def _cell(self, code: str, inputs: dict[str, Any] | None = None) -> Envelope:
        assert self._session is not None
        envelope = self._session.run(code, inputs=inputs)
        if envelope.status != "success":
            raise AgentError(f"runpython could not set up the session: {self._error_text(envelope)}", self.logger)
        return envelope

    @staticmethod
    def _error_text(envelope: Envelope) -> str:
        error = envelope.error
        if error is None:
            return envelope.status
        return f"{error.type}\n{error.message}\n{error.traceback or ''}".rstrip()

    # --- PythonExecutor ----------------------------------------------------------------------------------

    def send_tools(self, tools: dict[str, Any]) -> None:
        with self._lock:
            self._tools = dict(tools)
            self._build()

    def send_variables(self, variables: dict[str, Any]) -> None:
        jsonable = {}
        for name, value in variables.items():
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                warnings.warn(f"RunPythonExecutor: {name!r} is a {type(value).__name__}, not JSON; not sent to the "
                              "sandbox", stacklevel=2)
                continue
            if name.isidentifier():
                jsonable[name] = value
        with self._lock:
            self._variables.update(jsonable)
            if self._session is not None and jsonable:
                self._cell("pass", inputs=jsonable)

    def __call__(self, code_action: str) -> CodeOutput:
        with self._lock:
            session = self._build()
            self._final.clear()
            envelope = session.run(code_action)
        logs = envelope.stdout + (f"\n[stderr]\n{envelope.stderr}" if envelope.stderr else "")
        self.last_images = [PIL.Image.open(io.BytesIO(data)) for _, data in image_bytes(envelope)]
        error = envelope.error
        if error is not None and error.type == "FinalAnswerException" and self._final:
            return CodeOutput(output=self._final[-1], logs=logs, is_final_answer=True)
        if envelope.status != "success":
            raise AgentError(f"{logs}\nExecuting code yielded an error:\n{self._error_text(envelope)}", self.logger)
        output = envelope.return_value
        if output is None and self.last_images:
            output = self.last_images[-1]  # as smolagents' remote executors return a displayed figure
        return CodeOutput(output=output, logs=logs, is_final_answer=False)

    # --- the rest -----------------------------------------------------------------------------------------

    def attach_images(self, memory_step: Any, agent: Any = None) -> None:
        """A step callback (`CodeAgent(step_callbacks=[executor.attach_images])`): puts the step's displayed
        images in `observations_images`, which smolagents sends the model with the next step."""
        if isinstance(memory_step, ActionStep) and self.last_images:
            memory_step.observations_images = list(self.last_images)
            self.last_images = []

    @property
    def engine(self) -> RunPython | None:
        """The runpython engine, once the agent has sent its tools."""
        return self._engine

    def cleanup(self) -> None:
        """Ends the session (`CodeAgent.cleanup()` and `with CodeAgent(...)` call this)."""
        with self._lock:
            if self._session is not None:
                self._session.close()
            self._session = None
            self._tool_names = None
