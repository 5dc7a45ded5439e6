"""runpython inside the agent frameworks, each behind an extra (nothing here imports a framework):

- `runpython.integrations.smolagents` (`pip install "runpython[smolagents]"`): `RunPythonExecutor`, a
  `PythonExecutor` for `CodeAgent(executor=...)`.
- `runpython.integrations.langchain` (`runpython[langchain]`): `RunPythonTool`, a LangChain `BaseTool`.
- `runpython.integrations.deepagents` (`runpython[deepagents]`): `RunPythonBackend`, a Deep Agents sandbox
  backend on a runpython session.
- `runpython.integrations.pydantic_ai` (`runpython[pydantic-ai]`): `RunPythonToolset`.
- `runpython.integrations.openai_agents` (`runpython[openai-agents]`): `run_python_tool(rp)`.
- `runpython.integrations.fastmcp` (`runpython[fastmcp]`): `RunPythonSandbox`, a CodeMode
  `SandboxProvider`.

Importing one of them without its framework raises an ImportError that names the extra to install.
"""
