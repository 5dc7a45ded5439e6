//! `RunPython`: the builder's knobs as keyword arguments, and the engine's entry points, sync and async.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use runpython_core::{
    InstallPolicy, RunPython, RunPythonBuilder, RunRequest, Sandbox, Store, ToolFormat,
};
use serde_json::Value;

use crate::convert::{
    boolean, count, mapping, path, seconds, short_repr, string, strings, to_json, to_py, type_name,
};
use crate::envelope::PyEnvelope;
use crate::errors::{config, invalid, py_err};
use crate::handle::{PyRunHandle, Shared};
use crate::request::{request, RequestArgs};
use crate::runtime::{block_on, deferred, runtime, InRuntime, RunContext};
use crate::session::PySession;
use crate::settings::{
    parse_network, parse_pool, parse_sandbox, parse_sandbox_from, parse_sessions, parse_tier,
};
use crate::tools::PyTool;
use pyo3_async_runtimes::tokio::future_into_py;

/// Memo lifetime when `memo=True`.
const DEFAULT_MEMO_TTL: Duration = Duration::from_secs(3600);

/// Runs LLM-authored Python in a sandboxed CPython subprocess and returns an `Envelope`.
#[pyclass(frozen, module = "runpython", name = "RunPython")]
pub(crate) struct PyRunPython {
    engine: InRuntime<RunPython>,
    /// The Python callables' tool names: their calls are reported by the tools themselves (with
    /// arguments and results), so a started run's handle drops the core's bare announcement of them.
    tool_names: Arc<[String]>,
    store_url: Option<String>,
}

#[pymethods]
impl PyRunPython {
    #[new]
    #[pyo3(signature = (
        *,
        timeout = None,
        tools = None,
        store = None,
        tier = None,
        memo = None,
        dependencies = None,
        warm = None,
        auto_deps = None,
        approvals = None,
        durable = None,
        allow_network = None,
        network = None,
        python = None,
        max_output_chars = None,
        max_code_chars = None,
        max_return_bytes = None,
        inline_return_bytes = None,
        envelope_budget = None,
        env_passthrough = None,
        max_tool_calls = None,
        tool_call_timeout = None,
        max_suspensions = None,
        max_frame_bytes = None,
        env_root = None,
        prepare_timeout = None,
        allow_nested = None,
        pool = None,
        sandbox = None,
        sessions = None,
        allow_source_builds = None,
        allowed_packages = None,
        install_sandbox = None,
        secrets = None,
        upstream_cas = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        timeout: Option<&Bound<'_, PyAny>>,
        tools: Option<&Bound<'_, PyAny>>,
        store: Option<&Bound<'_, PyAny>>,
        tier: Option<&Bound<'_, PyAny>>,
        memo: Option<&Bound<'_, PyAny>>,
        dependencies: Option<&Bound<'_, PyAny>>,
        warm: Option<&Bound<'_, PyAny>>,
        auto_deps: Option<&Bound<'_, PyAny>>,
        approvals: Option<&Bound<'_, PyAny>>,
        durable: Option<&Bound<'_, PyAny>>,
        allow_network: Option<&Bound<'_, PyAny>>,
        network: Option<&Bound<'_, PyAny>>,
        python: Option<&Bound<'_, PyAny>>,
        max_output_chars: Option<&Bound<'_, PyAny>>,
        max_code_chars: Option<&Bound<'_, PyAny>>,
        max_return_bytes: Option<&Bound<'_, PyAny>>,
        inline_return_bytes: Option<&Bound<'_, PyAny>>,
        envelope_budget: Option<&Bound<'_, PyAny>>,
        env_passthrough: Option<&Bound<'_, PyAny>>,
        max_tool_calls: Option<&Bound<'_, PyAny>>,
        tool_call_timeout: Option<&Bound<'_, PyAny>>,
        max_suspensions: Option<&Bound<'_, PyAny>>,
        max_frame_bytes: Option<&Bound<'_, PyAny>>,
        env_root: Option<&Bound<'_, PyAny>>,
        prepare_timeout: Option<&Bound<'_, PyAny>>,
        allow_nested: Option<&Bound<'_, PyAny>>,
        pool: Option<&Bound<'_, PyAny>>,
        sandbox: Option<&Bound<'_, PyAny>>,
        sessions: Option<&Bound<'_, PyAny>>,
        allow_source_builds: Option<&Bound<'_, PyAny>>,
        allowed_packages: Option<&Bound<'_, PyAny>>,
        install_sandbox: Option<&Bound<'_, PyAny>>,
        secrets: Option<&Bound<'_, PyAny>>,
        upstream_cas: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let mut b = RunPython::builder();
        if let Some(v) = given(timeout) {
            b = b.timeout(seconds("timeout", &v)?);
        }
        if let Some(v) = given(max_output_chars) {
            b = b.max_output_chars(count("max_output_chars", &v)?);
        }
        if let Some(v) = given(max_code_chars) {
            b = b.max_code_chars(count("max_code_chars", &v)?);
        }
        if let Some(v) = given(max_return_bytes) {
            b = b.max_return_bytes(count("max_return_bytes", &v)?);
        }
        if let Some(v) = given(inline_return_bytes) {
            b = b.inline_return_bytes(count("inline_return_bytes", &v)?);
        }
        if let Some(v) = given(envelope_budget) {
            b = b.envelope_budget(count("envelope_budget", &v)?);
        }
        if let Some(v) = given(env_passthrough) {
            for name in strings("env_passthrough", &v)? {
                b = b.env_passthrough(name);
            }
        }
        if let Some(v) = given(python) {
            b = b.python(path("python", &v)?);
        }
        let mut tool_names = Vec::new();
        if let Some(v) = given(tools) {
            if v.is_instance_of::<PyString>() || v.is_callable() {
                return Err(config(format!(
                    "tools must be a list of callables, got {} {}; wrap it in a list",
                    type_name(&v),
                    short_repr(&v)
                )));
            }
            let iter = v.try_iter().map_err(|_| {
                config(format!(
                    "tools must be a list of callables, got {}",
                    type_name(&v)
                ))
            })?;
            for item in iter {
                let tool = PyTool::from_python(&item?)?;
                tool_names.push(runpython_core::Tool::name(&tool).to_owned());
                b = b.tool(tool);
            }
        }
        if let Some(v) = given(max_tool_calls) {
            b = b.max_tool_calls(count("max_tool_calls", &v)?);
        }
        if let Some(v) = given(tool_call_timeout) {
            b = b.tool_call_timeout(seconds("tool_call_timeout", &v)?);
        }
        if let Some(v) = given(max_frame_bytes) {
            b = b.max_frame_bytes(count("max_frame_bytes", &v)?);
        }
        // The store before what needs one (tier, approvals, durable), as the builder wants.
        let mut store_url = None;
        if let Some(v) = given(store) {
            let url = string("store", &v)?;
            let opened = Store::open(&url).map_err(|e| config(format!("store {url:?}: {e}")))?;
            b = b.store(opened);
            store_url = Some(url);
        }
        if let Some(v) = given(tier) {
            b = b.tier(parse_tier(&v)?);
        }
        if let Some(v) = given(memo) {
            if v.is_instance_of::<pyo3::types::PyBool>() {
                if boolean("memo", &v)? {
                    b = b.memoize(DEFAULT_MEMO_TTL);
                }
            } else {
                b = b.memoize(seconds("memo", &v)?);
            }
        }
        if let Some(v) = given(approvals) {
            for name in strings("approvals", &v)? {
                b = b.approval(name);
            }
        }
        if let Some(v) = given(max_suspensions) {
            b = b.max_suspensions(count("max_suspensions", &v)?);
        }
        if let Some(v) = given(durable) {
            b = b.durable(boolean("durable", &v)?);
        }
        if let Some(v) = given(dependencies) {
            for spec in strings("dependencies", &v)? {
                b = b.dependency(spec);
            }
        }
        if let Some(v) = given(warm) {
            for specs in crate::settings::warm_environments(&v)? {
                b = b.warm_environment(specs);
            }
        }
        if let Some(v) = given(auto_deps) {
            b = b.auto_deps(boolean("auto_deps", &v)?);
        }
        if let Some(v) = given(env_root) {
            b = b.env_root(path("env_root", &v)?);
        }
        if let Some(v) = given(prepare_timeout) {
            b = b.prepare_timeout(seconds("prepare_timeout", &v)?);
        }
        if let Some(v) = given(allow_nested) {
            b = b.allow_nested(count("allow_nested", &v)?);
        }
        if let Some(v) = given(pool) {
            b = b.pool(parse_pool(&v)?);
        }
        if let Some(v) = given(sessions) {
            b = b.sessions(parse_sessions(&v)?);
        }
        let mut sandbox_config = Sandbox::default();
        if let Some(v) = given(sandbox) {
            sandbox_config = parse_sandbox(&v)?;
        }
        if let Some(v) = given(allow_network) {
            sandbox_config.network = if boolean("allow_network", &v)? {
                runpython_core::Network::Policy(runpython_core::NetworkPolicy::public_internet())
            } else {
                runpython_core::Network::Off
            };
        }
        if let Some(v) = given(network) {
            sandbox_config.network = parse_network(&v)?;
        }
        b = b.sandbox(sandbox_config);
        if let Some(v) = given(secrets) {
            for secret in crate::settings::parse_secrets(&v)? {
                b = b.secret(secret);
            }
        }
        if let Some(v) = given(upstream_cas) {
            for pem in strings("upstream_cas", &v)? {
                b = b.upstream_ca(pem.into_bytes());
            }
        }
        if let Some(v) = given(allow_source_builds) {
            b = b.allow_source_builds(boolean("allow_source_builds", &v)?);
        }
        if let Some(v) = given(allowed_packages) {
            for name in strings("allowed_packages", &v)? {
                b = b.allow_package(name);
            }
        }
        if let Some(v) = given(install_sandbox) {
            b = b.install_sandbox(parse_sandbox_from(
                "install_sandbox",
                &v,
                InstallPolicy::default_sandbox(),
            )?);
        }
        Ok(Self {
            engine: InRuntime::new(build(b)?),
            tool_names: tool_names.into(),
            store_url,
        })
    }

    /// Runs `code` to its end and returns the envelope. What the code does (raise, time out, exit)
    /// is the envelope's status, never an exception. The GIL is released while the run goes on;
    /// `async def` tools run on a private event loop thread.
    #[pyo3(signature = (
        code, *, inputs = None, dependencies = None, input_artifacts = None, memo = true, env = None,
        files = None
    ))]
    #[allow(clippy::too_many_arguments)] // one parameter per Python keyword argument
    fn run(
        &self,
        py: Python<'_>,
        code: &Bound<'_, PyAny>,
        inputs: Option<&Bound<'_, PyAny>>,
        dependencies: Option<&Bound<'_, PyAny>>,
        input_artifacts: Option<&Bound<'_, PyAny>>,
        memo: bool,
        env: Option<&Bound<'_, PyAny>>,
        files: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyEnvelope> {
        let request = run_request(
            code,
            inputs,
            dependencies,
            input_artifacts,
            memo,
            env,
            files,
        )?;
        let context = RunContext::private(py)?;
        let engine = self.engine.clone();
        block_on(py, context.scope(async move { engine.run(request).await }))?
            .map(PyEnvelope::from)
            .map_err(py_err)
    }

    /// `run` for asyncio: awaits the envelope without holding a thread; `async def` tools run on the
    /// caller's event loop. Cancelling the awaiting task stops the run.
    #[pyo3(signature = (
        code, *, inputs = None, dependencies = None, input_artifacts = None, memo = true, env = None,
        files = None
    ))]
    #[allow(clippy::too_many_arguments)] // one parameter per Python keyword argument
    fn arun<'py>(
        &self,
        py: Python<'py>,
        code: &Bound<'py, PyAny>,
        inputs: Option<&Bound<'py, PyAny>>,
        dependencies: Option<&Bound<'py, PyAny>>,
        input_artifacts: Option<&Bound<'py, PyAny>>,
        memo: bool,
        env: Option<&Bound<'py, PyAny>>,
        files: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let request = run_request(
            code,
            inputs,
            dependencies,
            input_artifacts,
            memo,
            env,
            files,
        )?;
        let engine = self.engine.clone();
        deferred(py, move |py| {
            let context = RunContext::here(py, None)?;
            future_into_py(py, async move {
                context
                    .scope(engine.run(request))
                    .await
                    .map(PyEnvelope::from)
                    .map_err(py_err)
            })
        })
    }

    /// Starts `code` and returns a handle: iterate it (`for` or `async for`) for events, `wait()` or
    /// `await` it for the envelope, `cancel()` it to stop the run.
    #[pyo3(signature = (
        code, *, inputs = None, dependencies = None, input_artifacts = None, memo = true, env = None,
        files = None
    ))]
    #[allow(clippy::too_many_arguments)] // one parameter per Python keyword argument
    fn start(
        &self,
        py: Python<'_>,
        code: &Bound<'_, PyAny>,
        inputs: Option<&Bound<'_, PyAny>>,
        dependencies: Option<&Bound<'_, PyAny>>,
        input_artifacts: Option<&Bound<'_, PyAny>>,
        memo: bool,
        env: Option<&Bound<'_, PyAny>>,
        files: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyRunHandle> {
        let request = run_request(
            code,
            inputs,
            dependencies,
            input_artifacts,
            memo,
            env,
            files,
        )?;
        let (events, tool_events) = tokio::sync::mpsc::unbounded_channel();
        let context = RunContext::here(py, Some(events))?;
        let _entered = runtime().enter();
        let core = self.engine.start_in(request, move |run| context.scope(run));
        Ok(PyRunHandle::new(Shared::new(
            core,
            tool_events,
            Arc::clone(&self.tool_names),
        )))
    }

    /// A session: cells run in one long-lived sandboxed interpreter that keeps their state. `id`
    /// (1-128 letters, digits, `-`, `_`, `.`, `:`) names one: the same id on an engine sharing this
    /// one's store restores it; without `id`, a new session with a fresh id.
    #[pyo3(signature = (id = None))]
    fn session(&self, id: Option<String>) -> PyResult<PySession> {
        let session = match id {
            Some(id) => self.engine.session_with_id(id).map_err(py_err)?,
            None => self.engine.session(),
        };
        Ok(PySession::new(
            RunPython::clone(&self.engine),
            session,
            Arc::clone(&self.tool_names),
        ))
    }

    /// Continues a suspended run with a decision per suspension id (`envelope.suspension["id"]`).
    fn resume(
        &self,
        py: Python<'_>,
        run_id: String,
        decisions: &Bound<'_, PyAny>,
    ) -> PyResult<PyEnvelope> {
        let decisions = decisions_map(decisions)?;
        let context = RunContext::private(py)?;
        let engine = self.engine.clone();
        block_on(
            py,
            context.scope(async move { engine.resume(&run_id, decisions).await }),
        )?
        .map(PyEnvelope::from)
        .map_err(py_err)
    }

    /// `resume` for asyncio.
    fn aresume<'py>(
        &self,
        py: Python<'py>,
        run_id: String,
        decisions: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let decisions = decisions_map(decisions)?;
        let engine = self.engine.clone();
        deferred(py, move |py| {
            let context = RunContext::here(py, None)?;
            future_into_py(py, async move {
                context
                    .scope(engine.resume(&run_id, decisions))
                    .await
                    .map(PyEnvelope::from)
                    .map_err(py_err)
            })
        })
    }

    /// Prepares the warm environments given with `warm=` now (installs them, starts their templates)
    /// rather than at the first run within each; raises `DependencyError` when an install fails.
    fn warm_up(&self, py: Python<'_>) -> PyResult<()> {
        let engine = self.engine.clone();
        block_on(py, async move { engine.warm_up(|_| {}).await })?.map_err(py_err)
    }

    /// The suspension ids a suspended run waits on.
    fn pending_suspensions(&self, py: Python<'_>, run_id: String) -> PyResult<Vec<String>> {
        let engine = self.engine.clone();
        block_on(py, async move { engine.pending_suspensions(&run_id).await })?.map_err(py_err)
    }

    /// The tools a model is given to drive this engine (`run_python`, `get_run_artifact`, `resume`),
    /// in the provider's shape: `"anthropic"`, `"openai"` or `"mcp"`. `run_python`'s description lists
    /// the Python stubs of this engine's tools.
    #[pyo3(signature = (format = "anthropic"))]
    fn tool_spec(&self, py: Python<'_>, format: &str) -> PyResult<Py<PyAny>> {
        let format = ToolFormat::from_str(format).map_err(py_err)?;
        to_py(py, &self.engine.tool_spec(format))
    }

    /// Answers a model's call of one of `tool_spec`'s tools: `arguments` is a dict, or the JSON text
    /// of one (OpenAI's shape). Returns the result as JSON values (for `run_python`, the envelope as a
    /// dict, whatever its status). Raises `InvalidInputError` for bad arguments.
    #[pyo3(signature = (name, arguments = None))]
    fn handle_tool_call(
        &self,
        py: Python<'_>,
        name: String,
        arguments: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let input = tool_arguments(arguments)?;
        let context = RunContext::private(py)?;
        let engine = self.engine.clone();
        let value = block_on(
            py,
            context.scope(async move { engine.handle_tool_call(&name, &input).await }),
        )?
        .map_err(py_err)?;
        to_py(py, &value)
    }

    /// Like `handle_tool_call`, as tool-result content in the provider's shape (`"anthropic"`,
    /// `"openai"` or `"mcp"`): a list of blocks, the result as text first, then each image the run
    /// displayed (within the engine's `max_image_bytes`) as an image block, so a model sees its charts.
    #[pyo3(signature = (name, arguments = None, format = "anthropic"))]
    fn handle_tool_call_content(
        &self,
        py: Python<'_>,
        name: String,
        arguments: Option<&Bound<'_, PyAny>>,
        format: &str,
    ) -> PyResult<Py<PyAny>> {
        let format = ToolFormat::from_str(format).map_err(py_err)?;
        let input = tool_arguments(arguments)?;
        let context = RunContext::private(py)?;
        let engine = self.engine.clone();
        let value = block_on(
            py,
            context
                .scope(async move { engine.handle_tool_call_content(&name, &input, format).await }),
        )?
        .map_err(py_err)?;
        to_py(py, &value)
    }

    /// `handle_tool_call_content` for asyncio.
    #[pyo3(signature = (name, arguments = None, format = "anthropic"))]
    fn ahandle_tool_call_content<'py>(
        &self,
        py: Python<'py>,
        name: String,
        arguments: Option<&Bound<'py, PyAny>>,
        format: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let format = ToolFormat::from_str(format).map_err(py_err)?;
        let input = tool_arguments(arguments)?;
        let engine = self.engine.clone();
        deferred(py, move |py| {
            let context = RunContext::here(py, None)?;
            future_into_py(py, async move {
                let value = context
                    .scope(engine.handle_tool_call_content(&name, &input, format))
                    .await
                    .map_err(py_err)?;
                Python::attach(|py| to_py(py, &value))
            })
        })
    }

    /// `handle_tool_call` for asyncio.
    #[pyo3(signature = (name, arguments = None))]
    fn ahandle_tool_call<'py>(
        &self,
        py: Python<'py>,
        name: String,
        arguments: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let input = tool_arguments(arguments)?;
        let engine = self.engine.clone();
        deferred(py, move |py| {
            let context = RunContext::here(py, None)?;
            future_into_py(py, async move {
                let value = context
                    .scope(engine.handle_tool_call(&name, &input))
                    .await
                    .map_err(py_err)?;
                Python::attach(|py| to_py(py, &value))
            })
        })
    }

    /// This engine for tenant `name`: what its runs keep (runs, artifacts, checkpoints, sessions,
    /// memo entries) is the tenant's own, and every read by id finds only the tenant's, so another
    /// tenant's id reads like a missing one. Shares this engine's interpreters and settings.
    #[pyo3(signature = (name, *, max_stored_bytes = None))]
    fn tenant(&self, name: String, max_stored_bytes: Option<u64>) -> PyResult<Self> {
        let mut engine = self.engine.tenant(&name).map_err(py_err)?;
        if let Some(bytes) = max_stored_bytes {
            engine = engine.with_stored_bytes_quota(bytes);
        }
        Ok(Self {
            engine: InRuntime::new(engine),
            tool_names: Arc::clone(&self.tool_names),
            store_url: self.store_url.clone(),
        })
    }

    /// The tenant this engine's runs belong to; None for the default one.
    #[getter]
    fn tenant_name(&self) -> Option<String> {
        self.engine.tenant_name().map(str::to_owned)
    }

    /// The bytes of an artifact a kept run stored (an `id` from `envelope.artifacts`).
    fn get_run_artifact<'py>(&self, py: Python<'py>, id: String) -> PyResult<Bound<'py, PyBytes>> {
        let engine = self.engine.clone();
        let bytes =
            block_on(py, async move { engine.get_run_artifact(&id).await })?.map_err(py_err)?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Which isolation layers runs get on this machine, as a dict (probed once per process).
    fn isolation_report(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let report = self.engine.isolation_report().map_err(py_err)?;
        crate::convert::serialize_to_py(py, &report)
    }

    /// The names of the tools the code can call (Python callables, approval tools).
    #[getter]
    fn tools(&self) -> Vec<String> {
        self.engine
            .tools()
            .iter()
            .filter(|t| !t.is_hidden())
            .map(|t| t.name().to_owned())
            .collect()
    }

    /// The run timeout, in seconds.
    #[getter]
    fn timeout(&self) -> f64 {
        self.engine.limits().timeout.as_secs_f64()
    }

    fn __repr__(&self) -> String {
        let mut text = format!("RunPython(timeout={}", self.timeout());
        if !self.tool_names.is_empty() {
            text.push_str(&format!(", tools={:?}", self.tool_names));
        }
        if let Some(url) = &self.store_url {
            text.push_str(&format!(", store={url:?}"));
        }
        text.push(')');
        text
    }
}

/// A request from the arguments `run`, `arun` and `start` share.
fn run_request(
    code: &Bound<'_, PyAny>,
    inputs: Option<&Bound<'_, PyAny>>,
    dependencies: Option<&Bound<'_, PyAny>>,
    input_artifacts: Option<&Bound<'_, PyAny>>,
    memo: bool,
    env: Option<&Bound<'_, PyAny>>,
    files: Option<&Bound<'_, PyAny>>,
) -> PyResult<RunRequest> {
    let request = request(
        code,
        RequestArgs {
            inputs,
            dependencies,
            input_artifacts,
            env,
            files,
        },
    )?;
    Ok(if memo { request } else { request.no_memo() })
}

/// Absent and None mean "the engine's default" alike.
fn given<'py>(value: Option<&Bound<'py, PyAny>>) -> Option<Bound<'py, PyAny>> {
    value.filter(|v| !v.is_none()).cloned()
}

fn build(builder: RunPythonBuilder) -> PyResult<RunPython> {
    builder.build().map_err(|e| match e {
        // Whatever the builder refuses is a configuration problem, with the core's message.
        runpython_core::Error::Config(message) => config(message),
        other => config(other.to_string()),
    })
}

fn decisions_map(decisions: &Bound<'_, PyAny>) -> PyResult<HashMap<String, Value>> {
    let decisions = mapping(decisions).ok_or_else(|| {
        invalid(format!(
            "decisions must be a dict of suspension id to decision, got {}",
            type_name(decisions)
        ))
    })?;
    let mut out = HashMap::new();
    for (id, decision) in decisions.iter() {
        let id: String = id.extract().map_err(|_| {
            invalid(format!(
                "suspension ids must be str, got {}",
                short_repr(&id)
            ))
        })?;
        let value = to_json(&decision)
            .map_err(|e| invalid(format!("the decision for {id:?} is not a JSON value: {e}")))?;
        out.insert(id, value);
    }
    Ok(out)
}

fn tool_arguments(arguments: Option<&Bound<'_, PyAny>>) -> PyResult<Value> {
    let Some(arguments) = arguments.filter(|v| !v.is_none()) else {
        return Ok(Value::Null);
    };
    if arguments.is_instance_of::<PyString>() {
        let text: String = arguments.extract()?;
        return serde_json::from_str(&text)
            .map_err(|e| invalid(format!("the arguments are not valid JSON text: {e}")));
    }
    to_json(arguments).map_err(|e| invalid(format!("the arguments are not JSON values: {e}")))
}
