"""runpython as a Deep Agents sandbox backend: `create_deep_agent(backend=RunPythonBackend(rp))`.

    from deepagents import create_deep_agent
    from runpython import RunPython
    from runpython.integrations.deepagents import RunPythonBackend
    from runpython.integrations.langchain import RunPythonTool

    rp = RunPython(timeout=60, tools=[get_order])          # your functions: the Python code's tools
    backend = RunPythonBackend(rp)
    agent = create_deep_agent(model="anthropic:claude-sonnet-4-5", backend=backend,
                              tools=[RunPythonTool(rp)])   # optional: Python in the same sandbox
    agent.invoke({"messages": [("user", "Write and test a CSV report of order A-17")]})

`RunPythonBackend` implements deepagents' `BaseSandbox` on one runpython session: `execute(command)` runs
the shell command line from the session's interpreter (`subprocess`, stdout and stderr merged, bounded
and marked truncated as runpython bounds a run's output), and `upload_files`/`download_files` write and
read bytes there; deepagents builds `ls`, `read_file`, `write_file`, `edit_file`, `grep` and `glob` on
those. Everything happens inside runpython's sandbox, under every isolation layer of the engine, with
its limits and network policy. The filesystem the agent sees is runpython's: system directories
read-only, and writable only the session's working directory (`root_dir`, where commands start and the
agent's relative paths land) and its private `/tmp`; both last as long as the session. A
`RunPythonTool(rp)` of the same engine given `session_id=backend.id` runs Python in that same
interpreter, next to the agent's files, and its code calls your host functions through the bridge.
"""

from __future__ import annotations

import base64
from typing import Any

from runpython import Envelope, RunPython, Session
from runpython.integrations._common import missing

try:
    from deepagents.backends.protocol import ExecuteResponse, FileDownloadResponse, FileUploadResponse
    from deepagents.backends.sandbox import BaseSandbox
except ImportError as _exc:
    raise missing("deepagents", "deepagents", _exc) from _exc

__all__ = ["RunPythonBackend"]

# Cells the backend runs in the session; their inputs are `_deepagents_*` globals of the session.
_EXECUTE = """
import subprocess as _dg_sp
try:
    _dg_done = _dg_sp.run(_deepagents_command, shell=True, stdout=_dg_sp.PIPE, stderr=_dg_sp.STDOUT,
                          timeout=_deepagents_timeout, cwd=_deepagents_root)
    print(_dg_done.stdout.decode('utf-8', 'replace'), end='')
    _dg_code = _dg_done.returncode
except _dg_sp.TimeoutExpired as _dg_e:
    print((_dg_e.output or b'').decode('utf-8', 'replace'), end='')
    print(f'\\n[timed out after {_deepagents_timeout} s]')
    _dg_code = 124
_dg_code
"""

_ERRORS = """
def _deepagents_error(e):
    kinds = {FileNotFoundError: 'file_not_found', IsADirectoryError: 'is_directory',
             PermissionError: 'permission_denied', ValueError: 'invalid_path'}
    for kind, name in kinds.items():
        if isinstance(e, kind):
            return name
    return f'{type(e).__name__}: {e}'
"""

_UPLOAD = _ERRORS + """
import base64 as _dg_b64, os as _dg_os
_dg_results = []
for _dg_path, _dg_data in _deepagents_files:
    try:
        _dg_path = _dg_os.path.join(_deepagents_root, _dg_path)
        _dg_os.makedirs(_dg_os.path.dirname(_dg_path) or '.', exist_ok=True)
        with open(_dg_path, 'wb') as _dg_f:
            _dg_f.write(_dg_b64.b64decode(_dg_data))
        _dg_results.append(None)
    except Exception as _dg_e:
        _dg_results.append(_deepagents_error(_dg_e))
_dg_results
"""

_DOWNLOAD = _ERRORS + """
import base64 as _dg_b64, os as _dg_os
_dg_results = []
for _dg_path in _deepagents_paths:
    try:
        with open(_dg_os.path.join(_deepagents_root, _dg_path), 'rb') as _dg_f:
            _dg_results.append([_dg_b64.b64encode(_dg_f.read()).decode(), None])
    except Exception as _dg_e:
        _dg_results.append([None, _deepagents_error(_dg_e)])
_dg_results
"""


class RunPythonBackend(BaseSandbox):
    """deepagents' sandbox backend on a runpython session (`rp.session(session_id)`; None: a new one)."""

    def __init__(self, rp: RunPython, *, session_id: str | None = None, command_timeout: int = 120) -> None:
        self.rp = rp
        self.session: Session = rp.session(session_id)
        self.command_timeout = command_timeout
        envelope = self.session.run("import os as _dg_os\n_dg_os.getcwd()")
        self._check(envelope, "find the session's working directory")
        self.root_dir: str = envelope.return_value

    @property
    def id(self) -> str:
        """The runpython session's id (give it to `RunPythonTool` calls as `session_id`)."""
        return self.session.id

    def _cell(self, code: str, what: str, **inputs: Any) -> Envelope:
        envelope = self.session.run(code, inputs={"_deepagents_root": self.root_dir, **inputs})
        self._check(envelope, what)
        return envelope

    @staticmethod
    def _check(envelope: Envelope, what: str) -> None:
        if envelope.status != "success":
            error = envelope.error
            detail = envelope.status if error is None else f"{error.type}: {error.message}"
            raise RuntimeError(f"runpython could not {what}: {detail}")

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        envelope = self._cell(_EXECUTE, "run the command", _deepagents_command=command,
                              _deepagents_timeout=timeout or self.command_timeout)
        output = envelope.stdout + envelope.stderr
        return ExecuteResponse(output=output, exit_code=envelope.return_value,
                               truncated=envelope.truncated is not None)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        payload = [[path, base64.b64encode(data).decode()] for path, data in files]
        errors = self._cell(_UPLOAD, "write the files", _deepagents_files=payload).return_value
        return [FileUploadResponse(path=path, error=error) for (path, _), error in zip(files, errors)]

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        results = self._cell(_DOWNLOAD, "read the files", _deepagents_paths=list(paths)).return_value
        return [
            FileDownloadResponse(path=path, content=base64.b64decode(data) if data is not None else None, error=error)
            for path, (data, error) in zip(paths, results)
        ]

    def close(self) -> None:
        """Ends the session (its working directory and /tmp go with it)."""
        self.session.close()
