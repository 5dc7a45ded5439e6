//! [`RunPythonBuilder`]: every knob of an engine, checked once by `build`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use runpython_bridge::{BridgeConfig, Tool, ToolSet};
use runpython_deps::EnvProvider;
use runpython_sandbox::CollectLimits;
use runpython_store::{Store, Tier};

use crate::child::{Pool, PoolConfig, SlotSpec, Templates};
use crate::durable::persist::Keeping;
use crate::error::Error;
use crate::protocol::request::{Limits, RUN_PYTHON_TOOL};
use crate::run::deps::DepsConfig;
use crate::tools::nested::Nesting;
use crate::{Inner, RunPython};
use runpython_egress::{Network, NetworkPolicy, Sandbox, Secret};

/// Builds a [`RunPython`].
#[derive(Debug, Default)]
pub struct RunPythonBuilder {
    limits: Limits,
    env_passthrough: Vec<String>,
    python: Option<PathBuf>,
    tools: ToolSet,
    bridge: BridgeConfig,
    keep: Option<Keeping>,
    memo_ttl: Option<Duration>,
    deps: DepsConfig,
    durable: bool,
    sandbox: Sandbox,
    pool: PoolConfig,
    nested: Option<u32>,
    sessions: crate::session::SessionConfig,
    /// Secrets and upstream CAs, put into the network policy at build.
    secrets: Vec<Secret>,
    upstream_cas: Vec<Vec<u8>>,
    errors: Vec<String>,
}

impl RunPythonBuilder {
    /// Wall-clock limit of one run.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.limits.timeout = timeout;
        self
    }
    /// Longest code accepted, in characters.
    pub fn max_code_chars(mut self, n: usize) -> Self {
        self.limits.max_code_chars = n;
        self
    }
    /// Largest return value, in bytes of JSON.
    pub fn max_return_bytes(mut self, n: usize) -> Self {
        self.limits.max_return_bytes = n;
        self
    }
    /// Characters kept per output stream.
    pub fn max_output_chars(mut self, n: usize) -> Self {
        self.limits.max_output_chars = n;
        self
    }
    /// Largest return value carried inline in the envelope, in bytes of JSON.
    pub fn inline_return_bytes(mut self, n: usize) -> Self {
        self.limits.inline_return_bytes = n;
        self
    }
    /// Bytes of files a client may upload with one call (MCP's `content_base64`); default 0: files
    /// come by artifact id only.
    pub fn max_upload_bytes(mut self, n: usize) -> Self {
        self.limits.max_upload_bytes = n;
        self
    }
    /// Bytes of display images one run hands back inline for clients that show them (MCP `image`
    /// content; default 256 KiB; 0: none). See [`crate::Envelope::images`].
    pub fn max_image_bytes(mut self, n: usize) -> Self {
        self.limits.max_image_bytes = n;
        self
    }
    /// Largest envelope, in bytes of JSON.
    pub fn envelope_budget(mut self, n: usize) -> Self {
        self.limits.envelope_budget = n;
        self
    }
    /// Lets the host's environment variable `name` through to the code (everything not on the
    /// allowlist is dropped otherwise).
    pub fn env_passthrough(mut self, name: impl Into<String>) -> Self {
        self.env_passthrough.push(name.into());
        self
    }
    /// The Python interpreter to use instead of discovering one.
    pub fn python(mut self, path: impl Into<PathBuf>) -> Self {
        self.python = Some(path.into());
        self
    }
    /// Exposes a tool to the code.
    pub fn tool(mut self, tool: impl Tool + 'static) -> Self {
        if let Err(e) = self.tools.insert(tool) {
            self.errors.push(e.to_string());
        }
        self
    }
    /// Exposes every tool of a set.
    pub fn tools(mut self, tools: &ToolSet) -> Self {
        for tool in tools.iter() {
            if let Err(e) = self.tools.insert_arc(Arc::clone(tool)) {
                self.errors.push(e.to_string());
            }
        }
        self
    }
    /// Tool calls allowed per run (default 1,000).
    pub fn max_tool_calls(mut self, n: u32) -> Self {
        self.bridge.max_calls = n;
        self
    }
    /// How long one tool call may take (default 60 s).
    pub fn tool_call_timeout(mut self, timeout: Duration) -> Self {
        self.bridge.call_timeout = timeout;
        self
    }
    /// Exposes a human-approval tool under `name` (e.g. `request_approval`): calling it suspends the run
    /// until [`RunPython::resume`] supplies the decision, which the call then returns. Needs a store.
    pub fn approval(mut self, name: impl Into<String>) -> Self {
        let name = name.into();
        self.durable = true;
        if let Err(e) = self
            .tools
            .insert(crate::durable::resume::ApprovalTool::new(name))
        {
            self.errors.push(e.to_string());
        }
        self
    }
    /// Suspensions allowed over a run's life (default 10).
    pub fn max_suspensions(mut self, n: usize) -> Self {
        self.bridge.max_suspensions = n;
        self
    }
    /// Journals every tool call in the store before and after it runs, so a run whose host died can
    /// be resumed without repeating finished calls (on by default with an approval tool). Needs a store.
    pub fn durable(mut self, on: bool) -> Self {
        self.durable = on;
        self
    }
    /// Largest bridge frame either side may send (default 16 MiB).
    pub fn max_frame_bytes(mut self, n: usize) -> Self {
        self.bridge.max_frame = n;
        self
    }
    /// Tool calls of one run served at once (default 16); more wait. It also bounds how many host
    /// command-tool processes one run can have.
    pub fn max_concurrent_tool_calls(mut self, n: usize) -> Self {
        self.bridge.max_concurrent_calls = n;
        self
    }
    /// Bytes of tool-call arguments the host holds for one run at once (default 64 MiB); past it the
    /// bridge stops reading until calls finish.
    pub fn max_tool_bytes_in_flight(mut self, n: usize) -> Self {
        self.bridge.max_in_flight_bytes = n;
        self
    }
    /// The run's total memory, every process and shared memory together (default 4 GiB; see
    /// [`Sandbox::run_memory_bytes`]).
    pub fn memory_limit(mut self, bytes: u64) -> Self {
        self.sandbox.run_memory_bytes = bytes;
        self
    }
    /// Each of the run's processes' address space (`RLIMIT_AS`, default 4 GiB; see
    /// [`Sandbox::memory_bytes`]): the memory limit where the host has no cgroup for the run.
    pub fn address_space_limit(mut self, bytes: u64) -> Self {
        self.sandbox.memory_bytes = bytes;
        self
    }
    /// Everything the run may write in total (default 1 GiB; see [`Sandbox::disk_bytes`]).
    pub fn disk_limit(mut self, bytes: u64) -> Self {
        self.sandbox.disk_bytes = bytes;
        self
    }
    /// CPUs the run may use at once (default 1.0; `1.5` is one and a half CPUs' worth of time per
    /// period), enforced by its cgroup where the host has a cpu controller (see
    /// [`Sandbox::cpu_millis`]). Values under 0.01 count as 0.01.
    pub fn cpus(mut self, cpus: f64) -> Self {
        self.sandbox.cpu_millis = (cpus.max(0.01) * 1000.0).round() as u64;
        self
    }
    /// Processes and threads the run may have at once (default 256; see [`Sandbox::processes`]).
    pub fn max_processes(mut self, n: u64) -> Self {
        self.sandbox.processes = n;
        self
    }
    /// Refuse to run (an `Err`, `IsolationUnavailable`) where a layer of the sandbox is missing,
    /// instead of running with fewer and reporting them in `isolation.missing` (see
    /// [`Sandbox::require`]).
    pub fn require_isolation(mut self, on: bool) -> Self {
        self.sandbox.require = on;
        self
    }

    /// Keeps every run in `store` (script, output, return value, files the code wrote), in the
    /// ephemeral tier unless [`RunPythonBuilder::tier`] says otherwise. The envelope's `run_id` then
    /// names the kept run and `artifacts` lists what was kept.
    pub fn store(mut self, store: Store) -> Self {
        match &mut self.keep {
            Some(keep) => keep.store = store,
            None => self.keep = Some(Keeping::new(store)),
        }
        self
    }
    /// How long kept runs stay (default: ephemeral, 24 h).
    pub fn tier(mut self, tier: Tier) -> Self {
        if let Some(keep) = &mut self.keep {
            keep.tier = tier;
        } else {
            self.errors
                .push("tier() needs a store: call store() first".into());
        }
        self
    }
    /// Limits on the files kept from a run's directory.
    pub fn collect_limits(mut self, limits: CollectLimits) -> Self {
        if let Some(keep) = &mut self.keep {
            keep.collect = limits;
        } else {
            self.errors
                .push("collect_limits() needs a store: call store() first".into());
        }
        self
    }
    /// Memoizes successful runs that called no tools (or only pure ones) for `ttl`: the same code,
    /// inputs, interpreter, runner, tools and limits return the kept envelope with `cached: true` and
    /// spawn nothing. Without a store, memo entries live in a `memory://` store.
    pub fn memoize(mut self, ttl: Duration) -> Self {
        self.memo_ttl = Some(ttl);
        self
    }

    /// A requirement spec every run gets (merged with each run's own, its PEP 723 block and its imports).
    pub fn dependency(mut self, spec: impl Into<String>) -> Self {
        self.deps.defaults.push(spec.into());
        self
    }
    /// Declares a warm environment (call it once per environment): its requirements are installed
    /// once ([`RunPython::warm_up`] at start, else by the first run within it), a template imports
    /// their modules and does their first-use work (matplotlib's font list and renderer, numpy's
    /// random module, pandas' groupby and dates), and every one-shot run whose requirements (its
    /// imports, its PEP 723 block, its `dependencies`, the engine's defaults) are all within it — what
    /// it was declared with, or anything it holds — is forked from that template, each with every
    /// layer of its own, checked by the host before it gets code. Other runs keep the pooled path.
    /// e.g. `.warm_environment(["numpy", "pandas", "matplotlib"])`.
    pub fn warm_environment<I, S>(mut self, specs: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.deps
            .warm
            .push(specs.into_iter().map(Into::into).collect());
        self
    }
    /// Lets any package be built from source (its build scripts run, inside the install sandbox).
    /// By default only the operator's requirements ([`RunPythonBuilder::dependency`]) may be; what
    /// the code asks for (its imports, its PEP 723 block, a run's `dependencies`) installs wheels, and
    /// a package without one is a `DependencyError` that says how to allow it.
    pub fn allow_source_builds(mut self, allow: bool) -> Self {
        self.deps.policy.source_builds = allow;
        self
    }

    /// Adds a distribution to the packages the code may install. Without any, it may install any;
    /// with some, a package the code asks for outside them is a `DependencyError` naming it (what an
    /// allowed package depends on comes with it; the operator's own requirements are always allowed).
    pub fn allow_package(mut self, name: impl Into<String>) -> Self {
        self.deps
            .policy
            .allowed_packages
            .get_or_insert_with(Vec::new)
            .push(name.into());
        self
    }

    /// The sandbox installers run in (default: [`runpython_deps::InstallPolicy::default_sandbox`], every layer with
    /// the network, 2 GiB of scratch, 4 GiB of memory); its limits are the install's.
    pub fn install_sandbox(mut self, sandbox: Sandbox) -> Self {
        self.deps.policy.sandbox = sandbox;
        self
    }

    /// Whether imports detected in the code become dependencies (default: on). Off, only explicit specs
    /// and the PEP 723 block count.
    pub fn auto_deps(mut self, on: bool) -> Self {
        self.deps.auto = on;
        self
    }
    /// Where prepared environments live (default: `runpython/envs` under the user's cache directory).
    pub fn env_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.deps.root = Some(root.into());
        self
    }
    /// The installer (default: uv when found, else venv + pip).
    pub fn env_provider(mut self, provider: Arc<dyn EnvProvider>) -> Self {
        self.deps.provider = Some(provider);
        self
    }
    /// How long preparing an environment may take (default 10 minutes).
    pub fn prepare_timeout(mut self, timeout: Duration) -> Self {
        self.deps.timeout = Some(timeout);
        self
    }
    /// The sandbox's layers and limits (default: every layer the kernel allows, network off).
    pub fn sandbox(mut self, sandbox: Sandbox) -> Self {
        self.sandbox = sandbox;
        self
    }
    /// The pool of interpreters started ahead of their runs (default: one per environment, kept two
    /// minutes; `size: 0` turns it off), and whether runs are forked from templates instead. See
    /// [`PoolConfig`].
    pub fn pool(mut self, pool: PoolConfig) -> Self {
        self.pool = pool;
        self
    }
    /// What the code may reach (default [`Network::Off`]: an empty network namespace). A
    /// [`NetworkPolicy`] is enforced on the host for every connection and lookup of every run,
    /// session, template-forked run and nested run of this engine (the envelope's `network` says
    /// what a run did); [`Network::Host`] shares the host's network, reported as such.
    pub fn network(mut self, network: Network) -> Self {
        self.sandbox.network = network;
        self
    }

    /// Adds a secret the code may use but never read ([`Secret`]): the run's environment holds a
    /// placeholder under its name, and the host puts the value into requests to its hosts only
    /// (HTTPS to them is intercepted with a CA of the run's own, which the run trusts). Needs a
    /// [`NetworkPolicy`] (see [`RunPythonBuilder::network`]) allowing those hosts: [`build`]
    /// refuses a secret the policy would never let out.
    ///
    /// [`build`]: RunPythonBuilder::build
    pub fn secret(mut self, secret: Secret) -> Self {
        self.secrets.push(secret);
        self
    }

    /// Trusts this PEM bundle, besides the host's roots, for the TLS the host makes to a secret's
    /// hosts (a private upstream's CA, a test server's).
    pub fn upstream_ca(mut self, pem: Vec<u8>) -> Self {
        self.upstream_cas.push(pem);
        self
    }

    /// `true`: the public internet only, never the host nor its private networks
    /// ([`NetworkPolicy::public_internet`]); `false`: no network.
    pub fn allow_network(self, allow: bool) -> Self {
        self.network(if allow {
            Network::Policy(NetworkPolicy::public_internet())
        } else {
            Network::Off
        })
    }

    /// How many session interpreters live at once and how long an idle one is kept (default 16, 10
    /// minutes). See [`crate::Session`].
    pub fn sessions(mut self, config: crate::session::SessionConfig) -> Self {
        self.sessions = config;
        self
    }

    /// The largest snapshot of a session's namespace kept in the store, in bytes (default 64 MiB; 0
    /// takes none): see [`crate::SessionConfig::snapshot_max_bytes`].
    pub fn session_snapshot_max(mut self, bytes: u64) -> Self {
        self.sessions.snapshot_max_bytes = bytes;
        self
    }

    /// The time a session's restore may spend loading its snapshot and replaying cells (default 60
    /// s): see [`crate::SessionConfig::replay_budget`].
    pub fn session_replay_budget(mut self, budget: Duration) -> Self {
        self.sessions.replay_budget = budget;
        self
    }

    /// Lets the code call `run_python(code, dependencies=None, inputs=None)`, which runs more code in
    /// its own sandboxed child and returns that run's envelope as a dict, up to `depth` levels down.
    /// The inner run's timeout and tool calls come out of the outer run's remaining budget; a call
    /// from the deepest level raises `NestingLimit` in the code.
    pub fn allow_nested(mut self, depth: u32) -> Self {
        self.nested = Some(depth);
        self
    }

    /// Checks the configuration.
    pub fn build(self) -> Result<RunPython, Error> {
        let mut errors = self.errors;
        if self.limits.timeout.is_zero() {
            errors.push("the timeout must be longer than zero".into());
        }
        if self.limits.max_output_chars < 2 {
            errors.push("max_output_chars must be at least 2 (a head and a tail)".into());
        }
        if self.nested == Some(0) {
            errors.push("allow_nested needs a depth of at least 1".into());
        }
        let mut sandbox = self.sandbox;
        match &mut sandbox.network {
            Network::Policy(policy) => {
                policy.secrets.extend(self.secrets);
                policy.upstream_cas.extend(self.upstream_cas);
                if let Err(why) = policy.check_secrets() {
                    errors.push(why);
                }
            }
            _ => {
                if let Some(secret) = self.secrets.first() {
                    errors.push(format!(
                        "secret {} needs a network policy allowing its hosts (network() with a \
                         NetworkPolicy, or allow_network(true))",
                        secret.name
                    ));
                }
            }
        }
        if self.nested.is_some() && self.tools.get(RUN_PYTHON_TOOL).is_some() {
            errors
                .push("a host tool named run_python clashes with allow_nested's run_python".into());
        }
        let mut keep = self.keep;
        if let Some(ttl) = self.memo_ttl {
            if keep.is_none() {
                keep = Some(Keeping::new(Store::open("memory://")?));
            }
            if let Some(keep) = &mut keep {
                keep.memo_ttl = Some(ttl);
            }
        }
        if self.durable && keep.is_none() {
            errors.push(
                "approval tools and durable runs need a store to keep their journal: call store() first"
                    .into(),
            );
        }
        if !errors.is_empty() {
            return Err(Error::Config(errors.join("; ")));
        }
        for path in self.python.iter().chain(&sandbox.read_paths) {
            if path.as_os_str().as_encoded_bytes().contains(&0) {
                errors.push(format!(
                    "the path {} contains a NUL byte; pass a path without one",
                    path.display()
                ));
            }
        }
        if !errors.is_empty() {
            return Err(Error::Config(errors.join("; ")));
        }
        let any_warm = !self.deps.warm.is_empty();
        let spec = SlotSpec {
            sandbox: sandbox.clone(),
            timeout: self.limits.timeout,
            env_passthrough: self.env_passthrough.clone(),
        };
        Ok(RunPython {
            inner: Arc::new(Inner {
                limits: self.limits,
                env_passthrough: self.env_passthrough,
                python: self.python,
                tools: self.tools,
                bridge: self.bridge,
                keep,
                deps: self.deps.build()?,
                durable: self.durable,
                sandbox,
                templates: (self.pool.templates || any_warm).then(|| {
                    Arc::new(Templates::new(
                        spec.clone(),
                        self.pool.warm_imports.clone(),
                        self.pool.templates,
                        self.pool.idle,
                        self.pool.size,
                        crate::policy::env_vars::templates().1,
                    ))
                }),
                pool: (self.pool.size > 0).then(|| Arc::new(Pool::new(self.pool, spec))),
                interpreter: Arc::default(),
                nesting: self.nested.map(Nesting::top),
                sessions: crate::session::Registry::new(self.sessions),
                tenant: None,
                quota: None,
            }),
        })
    }
}
