//! `runpython`: the thin command line over runpython-core. The only crate that prints.
//!
//! Exit status: 0 when the envelope's status is `success`, 1 for any other status, 2 for usage or
//! infrastructure errors (a one-line reason on stderr).

/// `println!` that never panics: a reader that went away (`runpython ... | head`) is not a crash.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `eprintln!` that never panics on a closed stderr.
macro_rules! say_err {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `eprint!` that never panics on a closed stderr.
macro_rules! say_err_raw {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr(), $($arg)*);
    }};
}

mod human;
mod network_flags;
mod repl;
mod run_flags;
mod runs;
mod sandbox_flags;
mod store_commands;
mod tool_flags;

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use human::{finish, for_terminal, StatusLine};
use runpython_core::{
    error_report, Event, McpServer, PoolConfig, RunPython, RunPythonBuilder, RunRequest, Tier,
    ToolFormat,
};
use serde_json::Value;
use store_commands::{artifacts, gc, ArtifactsCommand, StoreArgs};

/// Run LLM-authored Python safely and get a compact JSON envelope back.
#[derive(Debug, Parser)]
#[command(name = "runpython", version, about)]
struct Cli {
    /// More log lines on stderr: -v for each call and the server's steps, -vv for debugging
    /// (RUST_LOG, when set, decides instead).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run Python code from a file, from -c, or from stdin (`-`).
    Run(RunArgs),
    /// Continue a suspended run with a decision.
    Resume(ResumeArgs),
    /// Print the tool definitions (run_python, get_run_artifact, resume) for a model provider.
    ToolSpec(ToolSpecArgs),
    /// Serve run_python, get_run_artifact and resume over MCP on stdio.
    Mcp(McpArgs),
    /// An interactive sandboxed Python session: each input a cell, state kept, values shown as Python
    /// shows them.
    Repl(McpArgs),
    /// Serve the same MCP server over Streamable HTTP at /mcp, with bearer tokens.
    Serve(ServeArgs),
    /// List or fetch what kept runs produced.
    Artifacts {
        #[command(subcommand)]
        command: ArtifactsCommand,
    },
    /// Remove expired runs and the blobs no run references.
    Gc(StoreArgs),
    /// List the runs that can be resumed: suspended ones, and durable ones whose host stopped.
    Runs {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// What this host gives runs: what the kernel allows, the isolation layers a run gets, where the
    /// caches and the store live, whether uv is found.
    Doctor(DoctorArgs),
}

#[derive(Debug, Args)]
struct DoctorArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    engine: EngineArgs,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// A Python file to run, or `-` to read the code from stdin.
    #[arg(value_name = "FILE", conflicts_with = "code")]
    file: Option<PathBuf>,
    /// The code to run (any code: `-c -100` is the code `-100`).
    #[arg(short = 'c', value_name = "CODE", allow_hyphen_values = true)]
    code: Option<String>,
    /// Print the JSON envelope instead of the code's output.
    #[arg(long)]
    json: bool,
    /// A global visible to the code, as NAME=JSON, or NAME=@ARTIFACT_ID to pass a stored artifact by
    /// reference (parsed as JSON or CSV where it can be) (repeatable).
    #[arg(long = "input", value_name = "NAME=JSON", value_parser = run_flags::parse_input)]
    inputs: Vec<(String, run_flags::Input)>,
    /// An environment variable for this run only, as NAME=VALUE (repeatable). Its value is masked
    /// wherever the run is kept, like --env-passthrough values.
    #[arg(long = "env", value_name = "NAME=VALUE", value_parser = run_flags::parse_env)]
    env: Vec<(String, String)>,
    /// A host file put, read-only, in the run's working directory (repeatable): PATH (as its own
    /// name) or PATH=NAME, read here before the run; @ARTIFACT_ID=NAME for a stored one (from
    /// `runpython artifacts put`). Files over 64 MiB go through the store: put them first.
    #[arg(long = "file", value_name = "PATH[=NAME]", value_parser = run_flags::parse_file)]
    files: Vec<(String, run_flags::RunFile)>,
    /// Neither serve this run from the memo nor record it there.
    #[arg(long)]
    no_cache: bool,
    #[command(flatten)]
    engine: EngineArgs,
}

/// How runs are made: limits, tools, store. Shared by `run` and `resume`.
#[derive(Debug, Args)]
struct EngineArgs {
    /// Wall-clock limit in seconds.
    #[arg(long, value_name = "SECONDS", value_parser = parse_timeout, allow_negative_numbers = true)]
    timeout: Option<Duration>,
    /// Characters kept per output stream (head and tail).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(2..))]
    max_output_chars: Option<u64>,
    /// Bytes of files an MCP client may upload with one call (`files: [{name, content_base64}]`),
    /// as 512K, 4M (default: none; files come by artifact id).
    #[arg(long, value_name = "SIZE", value_parser = run_flags::parse_upload_size)]
    max_upload_bytes: Option<u64>,
    /// Bytes of a call's display images (charts) MCP returns as `image` content, besides their
    /// links, as 256K (the default), 1M, or 0 for none.
    #[arg(long, value_name = "SIZE", value_parser = run_flags::parse_upload_size)]
    max_image_bytes: Option<u64>,
    /// Let this environment variable through to the code (repeatable).
    #[arg(long = "env-passthrough", value_name = "NAME")]
    env_passthrough: Vec<String>,
    /// A tool backed by a host command, as NAME=COMMAND (repeatable). The command gets
    /// {"args": [...], "kwargs": {...}} on stdin and prints the JSON result. The model never sees the
    /// command: describe the tool with --tool-doc and --tool-schema.
    #[arg(long = "tool", value_name = "NAME=COMMAND", value_parser = tool_flags::parse_tool)]
    tools: Vec<(String, String)>,
    /// What the command tool NAME does, for the model, as NAME=TEXT (repeatable).
    #[arg(long = "tool-doc", value_name = "NAME=TEXT", value_parser = |s: &str| tool_flags::name_and_value(s, "NAME=TEXT"))]
    tool_docs: Vec<(String, String)>,
    /// The JSON Schema of the command tool NAME's input, as NAME=JSON (repeatable): the code gets a
    /// function with those parameters, which reach the command in "kwargs".
    #[arg(long = "tool-schema", value_name = "NAME=JSON", value_parser = |s: &str| tool_flags::name_and_value(s, "NAME=JSON"))]
    tool_schemas: Vec<(String, String)>,
    /// Command tools from a JSON file: an array of {"name", "command", "description", "input_schema"}.
    #[arg(long = "tools-file", value_name = "FILE")]
    tools_file: Option<PathBuf>,
    /// Journal every tool call in the store, so that a run whose host stops can be found
    /// (`runpython runs`) and resumed (`runpython resume`) without making finished calls again
    /// (--approval implies it).
    #[arg(long)]
    durable: bool,
    /// A human-approval tool under NAME (e.g. request_approval): calling it suspends the run until
    /// `runpython resume RUN_ID --decision JSON` (repeatable).
    #[arg(long = "approval", value_name = "NAME")]
    approvals: Vec<String>,
    /// A dependency to install before each run, as a requirement spec (`six==1.15.0`,
    /// `pkg[extra]>=2`, `name @ URL`) (repeatable). Imports the code makes are detected and installed too.
    #[arg(long = "dep", value_name = "SPEC")]
    deps: Vec<String>,
    /// Do not install what the code imports; only --dep specs and a PEP 723 `# /// script` block count.
    #[arg(long)]
    no_auto_deps: bool,
    /// The Python interpreter to use (default: discovered; also RUNPYTHON_PYTHON).
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,
    /// Another MCP server whose tools the code can call, as the command that starts it (stdio)
    /// (repeatable).
    #[arg(long = "mcp-server", value_name = "COMMAND")]
    mcp_servers: Vec<String>,
    /// Let the code call run_python(code, dependencies=None, inputs=None) for nested runs, up to
    /// DEPTH levels down (default 2). Inner runs share the outer run's time and tool-call budget.
    #[arg(long, value_name = "DEPTH", num_args = 0..=1, require_equals = true, default_missing_value = "2",
          value_parser = clap::value_parser!(u32).range(1..))]
    allow_nested: Option<u32>,
    #[command(flatten)]
    network: network_flags::NetworkArgs,
    #[command(flatten)]
    limits: sandbox_flags::SandboxArgs,
    #[command(flatten)]
    installs: sandbox_flags::InstallArgs,
    #[command(flatten)]
    store: StoreArgs,
    /// Do not keep this run in a store.
    #[arg(long, conflicts_with_all = ["store", "persistent", "memo", "approvals", "durable"])]
    no_store: bool,
    /// Keep the run until deleted instead of for 24 hours.
    #[arg(long)]
    persistent: bool,
    /// Memoize: a later run of the same code, inputs, interpreter and tools returns the kept envelope
    /// with `cached: true` without running anything (only successful runs that called no tools).
    #[arg(long)]
    memo: bool,
    /// How long a memoized envelope stays valid.
    #[arg(long, value_name = "SECONDS", value_parser = parse_timeout, default_value = "86400", requires = "memo")]
    memo_ttl: Duration,
}

#[derive(Debug, Args)]
struct ResumeArgs {
    /// The suspended run (the envelope's `run_id`).
    run_id: String,
    /// The decision, as JSON, for the suspension the run waits on; or ID=JSON for a given suspension
    /// (repeatable).
    #[arg(long = "decision", value_name = "JSON")]
    decisions: Vec<String>,
    /// Print the JSON envelope.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    engine: EngineArgs,
}

fn parse_timeout(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !secs.is_finite() || secs <= 0.0 {
        return Err(format!("{s} must be a positive number of seconds"));
    }
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{s}: {e}"))
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    init_logging(cli.verbose, matches!(cli.command, Command::Serve(_)));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say_err!("runpython: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let outcome = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run(args).await,
            Command::Resume(args) => resume(args).await,
            Command::ToolSpec(args) => tool_spec(args).await,
            Command::Mcp(args) => serve_mcp(args).await,
            Command::Repl(args) => repl::repl(args.engine.build().await?).await,
            Command::Serve(args) => serve_http(args).await,
            Command::Artifacts { command } => artifacts(command).await,
            Command::Gc(store) => gc(store).await,
            Command::Doctor(args) => doctor(args).await,
            Command::Runs { json, store } => runs::list(json, store).await,
        }
    });
    match outcome {
        Ok(code) => code,
        Err(e) => {
            // Each cause once: store errors carry theirs in their own text already.
            say_err!("runpython: {}", error_report(e.as_ref()));
            ExitCode::from(2)
        }
    }
}

async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let code = match (&args.code, &args.file) {
        (Some(code), _) => code.clone(),
        (None, Some(path)) if path.as_os_str() == "-" => {
            let mut code = String::new();
            std::io::stdin()
                .read_to_string(&mut code)
                .context("cannot read the code from stdin")?;
            code
        }
        (None, Some(path)) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?,
        (None, None) => bail!("no code given: pass a FILE, -c CODE, or - to read stdin"),
    };
    let python = args.engine.build().await?;
    let mut request = RunRequest::new(code);
    if args.no_cache {
        request = request.no_memo();
    }
    for (name, value) in args.env {
        request = request.env(name, value);
    }
    for (name, input) in args.inputs {
        request = match input {
            run_flags::Input::Json(value) => request.input(name, value),
            run_flags::Input::Artifact(id) => request.input_artifact(name, id),
        };
    }
    for (name, file) in args.files {
        request = match file {
            run_flags::RunFile::Path(path) => {
                let bytes = run_flags::read_run_file(&path)?;
                request.file(name, bytes)
            }
            run_flags::RunFile::Artifact(id) => request.file_artifact(name, id),
        };
    }

    let json = args.json;
    let envelope = if json {
        python.run(request).await?
    } else {
        let mut handle = python.start(request);
        let mut status = StatusLine::new();
        while let Some(event) = handle.next_event().await {
            if !matches!(event, Event::Dependencies(_)) {
                status.clear();
            }
            match event {
                Event::Dependencies(step) => status.show(&step),
                Event::Stdout(text) => {
                    let mut out = std::io::stdout().lock();
                    let text = for_terminal(&text, std::io::stdout().is_terminal());
                    let _ = out.write_all(text.as_bytes());
                    let _ = out.flush();
                }
                Event::Stderr(text) => {
                    let text = for_terminal(&text, std::io::stderr().is_terminal());
                    let _ = std::io::stderr().lock().write_all(text.as_bytes());
                }
                Event::Resumable { run_id } => {
                    let store = python.store().map_or("", |s| s.url());
                    say_err!(
                        "runpython: durable run {run_id}; if this host stops, `runpython runs` lists it \
                         and `{}` (with this run's tool flags) continues it",
                        runs::resume_command(&run_id, store, python.tenant_name(), false)
                    );
                }
                _ => {}
            }
        }
        handle.wait().await?
    };
    finish(&envelope, args.json)
}

/// Prints the envelope; the exit status is the code's (a store that failed after the code ran is
/// named in the envelope, `kept: false`, and in human mode on stderr).
impl EngineArgs {
    async fn build(&self) -> anyhow::Result<RunPython> {
        self.scoped(self.builder().await?.build()?)
    }

    /// `engine` as `--tenant`'s, when given.
    fn scoped(&self, engine: RunPython) -> anyhow::Result<RunPython> {
        match &self.store.tenant {
            Some(name) => engine
                .tenant(name)
                .with_context(|| format!("--tenant {name:?}")),
            None => Ok(engine),
        }
    }

    /// The builder these flags describe, with the MCP servers' tools connected. One-shot commands
    /// start no interpreter pool (it would only be killed at exit); `mcp` turns it back on.
    async fn builder(&self) -> anyhow::Result<RunPythonBuilder> {
        let mut builder = RunPython::builder().pool(PoolConfig {
            size: 0,
            ..PoolConfig::default()
        });
        if let Some(timeout) = self.timeout {
            builder = builder.timeout(timeout);
        }
        if let Some(n) = self.max_output_chars {
            builder = builder.max_output_chars(usize::try_from(n).unwrap_or(usize::MAX));
        }
        if let Some(n) = self.max_upload_bytes {
            builder = builder.max_upload_bytes(usize::try_from(n).unwrap_or(usize::MAX));
        }
        if let Some(n) = self.max_image_bytes {
            builder = builder.max_image_bytes(usize::try_from(n).unwrap_or(usize::MAX));
        }
        for name in &self.env_passthrough {
            builder = builder.env_passthrough(name);
        }
        if let Some(python) = &self.python {
            builder = builder.python(python);
        }
        if self.no_auto_deps {
            builder = builder.auto_deps(false);
        }
        for tool in tool_flags::command_tools(
            &self.tools,
            &self.tool_docs,
            &self.tool_schemas,
            self.tools_file.as_deref(),
        )? {
            builder = builder.tool(tool);
        }
        for spec in &self.deps {
            builder = builder.dependency(spec);
        }
        for command in &self.mcp_servers {
            let server = McpServer::connect(command).await?;
            builder = builder.tools(&server.tools());
        }
        if let Some(depth) = self.allow_nested {
            builder = builder.allow_nested(depth);
        }
        builder = self.network.apply(builder).map_err(anyhow::Error::msg)?;
        builder = self.limits.apply(builder);
        builder = self.installs.apply(builder)?;
        if !self.no_store {
            match self.store.open_base() {
                Ok(store) => {
                    builder = builder.store(store);
                    if self.persistent {
                        builder = builder.tier(Tier::Persistent);
                    }
                }
                // An explicit store must work; the default one is a convenience and may be unavailable,
                // unless an approval tool needs it.
                Err(e)
                    if self.store.store.is_some() || !self.approvals.is_empty() || self.durable =>
                {
                    return Err(e)
                }
                Err(e) => say_err!(
                    "runpython: not keeping this run: {}",
                    error_report(e.as_ref())
                ),
            }
        }
        for name in &self.approvals {
            builder = builder.approval(name);
        }
        if self.durable {
            builder = builder.durable(true);
        }
        if self.memo {
            builder = builder.memoize(self.memo_ttl);
        }
        Ok(builder)
    }
}

#[derive(Debug, Args)]
struct ToolSpecArgs {
    /// The provider's shape: anthropic, openai or mcp.
    #[arg(long, value_name = "FORMAT", default_value = "anthropic", value_parser = parse_format)]
    format: ToolFormat,
    #[command(flatten)]
    engine: EngineArgs,
}

#[derive(Debug, Args)]
struct McpArgs {
    #[command(flatten)]
    engine: EngineArgs,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Address to listen on (loopback unless you say otherwise).
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:8750")]
    bind: std::net::SocketAddr,
    /// Bearer tokens, one NAME:TOKEN per line (also RUNPYTHON_TOKENS, comma-separated).
    #[arg(long, value_name = "FILE")]
    tokens_file: Option<PathBuf>,
    /// Runs one token may have in flight at once (0: no limit).
    #[arg(long, value_name = "N", default_value = "4")]
    max_runs_per_token: usize,
    /// Runs this host may have in flight at once, all tokens together (0: no limit; default: 4 per
    /// CPU core). Over it a call is refused at once: 503, Retry-After, JSON-RPC `over_capacity`.
    #[arg(long, value_name = "N")]
    max_runs_in_flight: Option<usize>,
    /// On SIGTERM/SIGINT, how long runs in flight may take to finish before they are stopped.
    #[arg(long, value_name = "SECONDS", value_parser = parse_timeout, default_value = "30")]
    drain_timeout: Duration,
    /// A Host header value to accept besides loopback names (repeatable; default with a
    /// non-loopback --bind: any).
    #[arg(long = "allowed-host", value_name = "HOST")]
    allowed_hosts: Vec<String>,
    /// Connections at once (fewer when the descriptor limit leaves less room; half of them at most
    /// before an authenticated request, the oldest of those closed to admit a new one).
    #[arg(long, value_name = "N", default_value = "4096")]
    max_connections: usize,
    /// A request's headers must arrive within this, and a connection must make an authenticated
    /// request within it.
    #[arg(long, value_name = "SECONDS", value_parser = parse_timeout, default_value = "10")]
    header_timeout: Duration,
    /// A request's body must arrive within this.
    #[arg(long, value_name = "SECONDS", value_parser = parse_timeout, default_value = "30")]
    body_timeout: Duration,
    /// Bytes each token may keep in the store (e.g. 5G); over it, runs still run and are not kept
    /// (`kept: false` says why).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    max_stored_bytes_per_token: Option<u64>,
    /// Accept OAuth access tokens (JWTs) signed by a key of this JWKS (a file or an http(s) URL),
    /// besides the static tokens. Needs --jwt-issuer and --jwt-audience.
    #[arg(long, value_name = "FILE|URL", requires_all = ["jwt_issuer", "jwt_audience"])]
    jwks: Option<String>,
    /// The issuer access tokens must name (`iss`), listed as the authorization server.
    #[arg(long, value_name = "URL", requires = "jwks")]
    jwt_issuer: Option<String>,
    /// The audience access tokens must name (`aud`): this server's resource identifier.
    #[arg(long, value_name = "AUDIENCE", requires = "jwks")]
    jwt_audience: Option<String>,
    /// The access token claim that names the tenant (its runs are `jwt:<claim>`'s).
    #[arg(long, value_name = "CLAIM", default_value = "sub", requires = "jwks")]
    jwt_tenant_claim: String,
    /// This server's MCP endpoint as clients reach it, for the resource metadata (default: the
    /// audience when it is a URL, else http://HOST/mcp with the request's Host).
    #[arg(long, value_name = "URL", requires = "jwks")]
    resource_url: Option<String>,
    #[command(flatten)]
    engine: EngineArgs,
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    runpython_core::parse_size(s)
}

/// Logs go to stderr through `tracing`: `RUST_LOG` when set, else warnings (`serve`: one line per
/// call too), `-v` info, `-vv` debug.
fn init_logging(verbose: u8, serving: bool) {
    use tracing_subscriber::EnvFilter;
    let default = match (verbose, serving) {
        // rmcp logs every error reply as a warning: a client's mistake, not the server's.
        (0, false) => "warn,rmcp=error",
        (0, true) | (1, _) => "warn,rmcp=error,runpython=info",
        _ => "info,runpython=debug",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

fn parse_format(s: &str) -> Result<ToolFormat, String> {
    s.parse().map_err(|e: runpython_core::Error| e.to_string())
}

async fn tool_spec(args: ToolSpecArgs) -> anyhow::Result<ExitCode> {
    let python = args.engine.build().await?;
    // MCP's shape as `tools/list` serves it (with MCP's transport hints); the providers' from core.
    let spec = match args.format {
        ToolFormat::Mcp => runpython_mcp::tool_list(&python),
        format => python.tool_spec(format),
    };
    say!("{}", serde_json::to_string_pretty(&spec)?);
    Ok(ExitCode::SUCCESS)
}

async fn serve_mcp(args: McpArgs) -> anyhow::Result<ExitCode> {
    // A server answers many runs: interpreters started ahead of them pay off.
    let engine = args
        .engine
        .builder()
        .await?
        .pool(PoolConfig::default())
        .build()?;
    runpython_mcp::serve_stdio(args.engine.scoped(engine)?).await?;
    Ok(ExitCode::SUCCESS)
}

async fn serve_http(args: ServeArgs) -> anyhow::Result<ExitCode> {
    if args.engine.store.tenant.is_some() {
        anyhow::bail!(
            "serve gives each token a tenant of its own (its name, or jwt:<claim>); --tenant is for \
             the local commands"
        );
    }
    let engine = args
        .engine
        .builder()
        .await?
        .pool(PoolConfig::default())
        .build()?;
    let server = runpython_mcp::HttpServer::bind(
        engine,
        runpython_mcp::ServeConfig {
            bind: args.bind,
            tokens_file: args.tokens_file,
            max_runs_per_token: args.max_runs_per_token,
            max_runs_in_flight: args.max_runs_in_flight.unwrap_or_else(|| {
                4 * std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
            }),
            drain_timeout: args.drain_timeout,
            allowed_hosts: args.allowed_hosts,
            max_connections: args.max_connections,
            header_timeout: args.header_timeout,
            body_timeout: args.body_timeout,
            max_stored_bytes_per_token: args.max_stored_bytes_per_token,
            oauth: args.jwks.map(|jwks| runpython_mcp::OAuthConfig {
                jwks,
                issuer: args.jwt_issuer.unwrap_or_default(),
                audience: args.jwt_audience.unwrap_or_default(),
                tenant_claim: args.jwt_tenant_claim,
                resource: args.resource_url,
            }),
        },
    )
    .await?;
    // The one line a supervisor or test waits for, whatever the log level.
    say_err!(
        "runpython serve: listening on http://{}",
        server.local_addr()
    );
    server.run().await?;
    Ok(ExitCode::SUCCESS)
}

async fn resume(args: ResumeArgs) -> anyhow::Result<ExitCode> {
    let python = args.engine.build().await?;
    let pending = python.pending_suspensions(&args.run_id).await?;
    let mut decisions = std::collections::HashMap::new();
    for text in &args.decisions {
        // ID=JSON names the suspension; a bare JSON value answers the one the run waits on.
        let (id, json) = match text.split_once('=') {
            Some((id, json))
                if id.starts_with('s') && id[1..].chars().all(|c| c.is_ascii_digit()) =>
            {
                (id.to_owned(), json)
            }
            _ => match pending.as_slice() {
                [only] => (only.clone(), text.as_str()),
                [] => bail!(
                    "run {} waits on no suspension; pass no --decision, or check the run id",
                    args.run_id
                ),
                many => bail!(
                    "run {} waits on several suspensions ({}); pass --decision ID=JSON",
                    args.run_id,
                    many.join(", ")
                ),
            },
        };
        let value: Value = serde_json::from_str(json).with_context(|| {
            format!("the decision {json:?} is not JSON; quote strings, e.g. '\"yes\"'")
        })?;
        decisions.insert(id, value);
    }
    let envelope = python.resume(&args.run_id, decisions).await?;
    if !args.json {
        human::print_streams(&envelope); // a resumed run's output is not streamed: its envelope has it
    }
    finish(&envelope, args.json)
}

async fn doctor(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let report = args.engine.build().await?.doctor().await;
    if args.json {
        say!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        human::print_doctor(&report);
    }
    Ok(ExitCode::SUCCESS)
}
