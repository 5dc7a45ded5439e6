//! The command line as clap reads it: every command's arguments and the flag groups they share
//! (`EngineArgs`: how runs are made; `network_flags`, `sandbox_flags`, `run_flags`, `tool_flags`,
//! `store_flags`). Plain data: `crate::settings` turns it into an engine or a server's configuration.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use runpython_core::ToolFormat;

pub(crate) mod network_flags;
pub(crate) mod run_flags;
pub(crate) mod sandbox_flags;
pub(crate) mod store_flags;
pub(crate) mod tool_flags;

use store_flags::{ArtifactsCommand, StoreArgs};

/// Run LLM-authored Python safely and get a compact JSON envelope back.
#[derive(Debug, Parser)]
#[command(name = "runpython", version, about)]
pub(crate) struct Cli {
    /// More log lines on stderr: -v for each call and the server's steps, -vv for debugging
    /// (RUST_LOG, when set, decides instead).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub(crate) verbose: u8,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run Python code from a file, from -c, or from stdin (`-`).
    Run(RunArgs),
    /// Keep an engine warm for `runpython run`: runs with the same flags, from the same directory and
    /// environment, are forked from its templates instead of starting an interpreter each (stops on
    /// SIGINT/SIGTERM, after --idle, or when another host takes its place).
    Host(HostArgs),
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
pub(crate) struct DoctorArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// A Python file to run, or `-` to read the code from stdin.
    #[arg(value_name = "FILE", conflicts_with = "code")]
    pub(crate) file: Option<PathBuf>,
    /// The code to run (any code: `-c -100` is the code `-100`).
    #[arg(short = 'c', value_name = "CODE", allow_hyphen_values = true)]
    pub(crate) code: Option<String>,
    /// Print the JSON envelope instead of the code's output.
    #[arg(long)]
    pub(crate) json: bool,
    /// A global visible to the code, as NAME=JSON, or NAME=@ARTIFACT_ID to pass a stored artifact by
    /// reference (parsed as JSON or CSV where it can be) (repeatable).
    #[arg(long = "input", value_name = "NAME=JSON", value_parser = run_flags::parse_input)]
    pub(crate) inputs: Vec<(String, run_flags::Input)>,
    /// An environment variable for this run only, as NAME=VALUE (repeatable). Its value is masked
    /// wherever the run is kept, like --env-passthrough values.
    #[arg(long = "env", value_name = "NAME=VALUE", value_parser = run_flags::parse_env)]
    pub(crate) env: Vec<(String, String)>,
    /// A host file put, read-only, in the run's working directory (repeatable): PATH (as its own
    /// name) or PATH=NAME, read here before the run; @ARTIFACT_ID=NAME for a stored one (from
    /// `runpython artifacts put`). Files over 64 MiB go through the store: put them first.
    #[arg(long = "file", value_name = "PATH[=NAME]", value_parser = run_flags::parse_file)]
    pub(crate) files: Vec<(String, run_flags::RunFile)>,
    /// Neither serve this run from the memo nor record it there.
    #[arg(long)]
    pub(crate) no_cache: bool,
    /// Run in this process even when a `runpython host` serves these flags.
    #[arg(long)]
    pub(crate) no_host: bool,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
}

#[derive(Debug, Args)]
pub(crate) struct HostArgs {
    /// Stop after this many seconds without a run (0: never).
    #[arg(long, value_name = "SECONDS", default_value_t = 1800)]
    pub(crate) idle: u64,
    /// The flags of the runs this host serves: `runpython run` with the same ones, from the same
    /// directory and environment, hands its run here.
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
}

/// How runs are made: limits, tools, store. Shared by `run` and `resume`.
#[derive(Debug, Args)]
pub(crate) struct EngineArgs {
    /// Wall-clock limit in seconds.
    #[arg(long, value_name = "SECONDS", value_parser = parse_timeout, allow_negative_numbers = true)]
    pub(crate) timeout: Option<Duration>,
    /// Characters kept per output stream (head and tail).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(2..))]
    pub(crate) max_output_chars: Option<u64>,
    /// Bytes of files an MCP client may upload with one call (`files: [{name, content_base64}]`),
    /// as 512K, 4M (default: none; files come by artifact id).
    #[arg(long, value_name = "SIZE", value_parser = run_flags::parse_upload_size)]
    pub(crate) max_upload_bytes: Option<u64>,
    /// Bytes of a call's display images (charts) MCP returns as `image` content, besides their
    /// links, as 256K (the default), 1M, or 0 for none.
    #[arg(long, value_name = "SIZE", value_parser = run_flags::parse_upload_size)]
    pub(crate) max_image_bytes: Option<u64>,
    /// Let this environment variable through to the code (repeatable).
    #[arg(long = "env-passthrough", value_name = "NAME")]
    pub(crate) env_passthrough: Vec<String>,
    /// A tool backed by a host command, as NAME=COMMAND (repeatable). The command gets
    /// {"args": [...], "kwargs": {...}} on stdin and prints the JSON result. The model never sees the
    /// command: describe the tool with --tool-doc and --tool-schema.
    #[arg(long = "tool", value_name = "NAME=COMMAND", value_parser = tool_flags::parse_tool)]
    pub(crate) tools: Vec<(String, String)>,
    /// What the command tool NAME does, for the model, as NAME=TEXT (repeatable).
    #[arg(long = "tool-doc", value_name = "NAME=TEXT", value_parser = |s: &str| tool_flags::name_and_value(s, "NAME=TEXT"))]
    pub(crate) tool_docs: Vec<(String, String)>,
    /// The JSON Schema of the command tool NAME's input, as NAME=JSON (repeatable): the code gets a
    /// function with those parameters, which reach the command in "kwargs".
    #[arg(long = "tool-schema", value_name = "NAME=JSON", value_parser = |s: &str| tool_flags::name_and_value(s, "NAME=JSON"))]
    pub(crate) tool_schemas: Vec<(String, String)>,
    /// Command tools from a JSON file: an array of {"name", "command", "description", "input_schema"}.
    #[arg(long = "tools-file", value_name = "FILE")]
    pub(crate) tools_file: Option<PathBuf>,
    /// Journal every tool call in the store, so that a run whose host stops can be found
    /// (`runpython runs`) and resumed (`runpython resume`) without making finished calls again
    /// (--approval implies it).
    #[arg(long)]
    pub(crate) durable: bool,
    /// A human-approval tool under NAME (e.g. request_approval): calling it suspends the run until
    /// `runpython resume RUN_ID --decision JSON` (repeatable).
    #[arg(long = "approval", value_name = "NAME")]
    pub(crate) approvals: Vec<String>,
    /// A dependency to install before each run, as a requirement spec (`six==1.15.0`,
    /// `pkg[extra]>=2`, `name @ URL`) (repeatable). Imports the code makes are detected and installed too.
    #[arg(long = "dep", value_name = "SPEC")]
    pub(crate) deps: Vec<String>,
    /// A warm environment, as SPEC[,SPEC...] (repeatable: one environment each), e.g.
    /// `--warm numpy,pandas,matplotlib`: installed at start, its packages imported (and their
    /// first-use work done) by a template, and each run whose imports are all within it forked from
    /// that template, every layer its own, checked from outside before it gets code.
    #[arg(long = "warm", value_name = "SPEC[,SPEC...]", value_parser = run_flags::parse_warm)]
    pub(crate) warm: Vec<Vec<String>>,
    /// Do not install what the code imports; only --dep specs and a PEP 723 `# /// script` block count.
    #[arg(long)]
    pub(crate) no_auto_deps: bool,
    /// The Python interpreter to use (default: discovered; also RUNPYTHON_PYTHON).
    #[arg(long, value_name = "PATH")]
    pub(crate) python: Option<PathBuf>,
    /// Another MCP server whose tools the code can call, as the command that starts it (stdio)
    /// (repeatable).
    #[arg(long = "mcp-server", value_name = "COMMAND")]
    pub(crate) mcp_servers: Vec<String>,
    /// Let the code call run_python(code, dependencies=None, inputs=None) for nested runs, up to
    /// DEPTH levels down (default 2). Inner runs share the outer run's time and tool-call budget.
    #[arg(long, value_name = "DEPTH", num_args = 0..=1, require_equals = true, default_missing_value = "2",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) allow_nested: Option<u32>,
    /// The largest snapshot of a session's namespace kept in the store, as 64M (the default), 1G, or
    /// 0 for none: a session whose namespace pickles to more is restored by replaying its cells.
    #[arg(long, value_name = "SIZE", value_parser = run_flags::parse_upload_size)]
    pub(crate) session_snapshot_max: Option<u64>,
    /// Seconds a session's restore may spend loading its snapshot and replaying cells (default 60);
    /// past it the restore fails and the session's record is kept.
    #[arg(long, value_name = "SECONDS", value_parser = parse_timeout)]
    pub(crate) session_replay_budget: Option<Duration>,
    #[command(flatten)]
    pub(crate) network: network_flags::NetworkArgs,
    #[command(flatten)]
    pub(crate) limits: sandbox_flags::SandboxArgs,
    #[command(flatten)]
    pub(crate) installs: sandbox_flags::InstallArgs,
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// Do not keep this run in a store.
    #[arg(long, conflicts_with_all = ["store", "persistent", "memo", "approvals", "durable"])]
    pub(crate) no_store: bool,
    /// Keep the run until deleted instead of for 24 hours.
    #[arg(long)]
    pub(crate) persistent: bool,
    /// Memoize: a later run of the same code, inputs, interpreter and tools returns the kept envelope
    /// with `cached: true` without running anything (only successful runs that called no tools).
    #[arg(long)]
    pub(crate) memo: bool,
    /// How long a memoized envelope stays valid.
    #[arg(long, value_name = "SECONDS", value_parser = parse_timeout, default_value = "86400", requires = "memo")]
    pub(crate) memo_ttl: Duration,
}

#[derive(Debug, Args)]
pub(crate) struct ResumeArgs {
    /// The suspended run (the envelope's `run_id`).
    pub(crate) run_id: String,
    /// The decision, as JSON, for the suspension the run waits on; or ID=JSON for a given suspension
    /// (repeatable).
    #[arg(long = "decision", value_name = "JSON")]
    pub(crate) decisions: Vec<String>,
    /// Print the JSON envelope.
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
}

pub(crate) fn parse_timeout(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !secs.is_finite() || secs <= 0.0 {
        return Err(format!("{s} must be a positive number of seconds"));
    }
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{s}: {e}"))
}

#[derive(Debug, Args)]
pub(crate) struct ToolSpecArgs {
    /// The provider's shape: anthropic, openai or mcp.
    #[arg(long, value_name = "FORMAT", default_value = "anthropic", value_parser = parse_format)]
    pub(crate) format: ToolFormat,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
}

#[derive(Debug, Args)]
pub(crate) struct McpArgs {
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
}

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on (loopback unless you say otherwise).
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:8750")]
    pub(crate) bind: std::net::SocketAddr,
    /// Bearer tokens, one NAME:TOKEN per line (also RUNPYTHON_TOKENS, comma-separated).
    #[arg(long, value_name = "FILE")]
    pub(crate) tokens_file: Option<PathBuf>,
    /// Runs one token may have in flight at once (0: no limit; default: half of
    /// --max-runs-in-flight, at most 4, so one token alone never fills the host).
    #[arg(long, value_name = "N")]
    pub(crate) max_runs_per_token: Option<usize>,
    /// Runs this host may have in flight at once, all tokens together (0: no limit; default: 4 per
    /// CPU core). When it is full, a token holding fewer than its share (the capacity divided among
    /// the tokens running or waiting) waits for the next place, given in turn; one holding its
    /// share is refused at once: 503, Retry-After, JSON-RPC `over_capacity`.
    #[arg(long, value_name = "N")]
    pub(crate) max_runs_in_flight: Option<usize>,
    /// On SIGTERM/SIGINT, how long runs in flight may take to finish before they are stopped.
    #[arg(long, value_name = "SECONDS", value_parser = parse_timeout, default_value = "30")]
    pub(crate) drain_timeout: Duration,
    /// A Host header value to accept besides loopback names (repeatable; default with a
    /// non-loopback --bind: any).
    #[arg(long = "allowed-host", value_name = "HOST")]
    pub(crate) allowed_hosts: Vec<String>,
    /// Connections at once (fewer when the descriptor limit leaves less room; half of them at most
    /// before an authenticated request, the oldest of those that has sent nothing closed for a new
    /// one). When full, an idle connection of the token holding the most is closed for a new one;
    /// never one in the middle of a request.
    #[arg(long, value_name = "N", default_value = "4096")]
    pub(crate) max_connections: usize,
    /// Connections one token may hold (default: a quarter of --max-connections; 0: no limit). At
    /// it, the token's oldest idle connection is closed for its new one; with all of them busy,
    /// the new one's request gets 429.
    #[arg(long, value_name = "N")]
    pub(crate) max_connections_per_token: Option<usize>,
    /// Live MCP sessions one token may have (0: no limit); past it an `initialize` gets 429. A
    /// session is its token's for as long as it lives (idle ones end after 5 minutes).
    #[arg(long, value_name = "N", default_value = "1000")]
    pub(crate) max_sessions_per_token: usize,
    /// A request's headers must arrive within this, and a connection must make an authenticated
    /// request within it.
    #[arg(long, value_name = "SECONDS", value_parser = parse_timeout, default_value = "10")]
    pub(crate) header_timeout: Duration,
    /// A request's body must arrive whole within this of its headers (else 408, and the
    /// connection is closed).
    #[arg(long, value_name = "SECONDS", value_parser = parse_timeout, default_value = "30")]
    pub(crate) body_timeout: Duration,
    /// Bytes each token may keep in the store (e.g. 5G); over it, runs still run and are not kept
    /// (`kept: false` says why).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub(crate) max_stored_bytes_per_token: Option<u64>,
    /// Accept OAuth access tokens (JWTs) signed by a key of this JWKS (a file or an http(s) URL),
    /// besides the static tokens. Needs --jwt-issuer and --jwt-audience.
    #[arg(long, value_name = "FILE|URL", requires_all = ["jwt_issuer", "jwt_audience"])]
    pub(crate) jwks: Option<String>,
    /// The issuer access tokens must name (`iss`), listed as the authorization server.
    #[arg(long, value_name = "URL", requires = "jwks")]
    pub(crate) jwt_issuer: Option<String>,
    /// The audience access tokens must name (`aud`): this server's resource identifier.
    #[arg(long, value_name = "AUDIENCE", requires = "jwks")]
    pub(crate) jwt_audience: Option<String>,
    /// The access token claim that names the tenant (its runs are `jwt:<claim>`'s).
    #[arg(long, value_name = "CLAIM", default_value = "sub", requires = "jwks")]
    pub(crate) jwt_tenant_claim: String,
    /// This server's MCP endpoint as clients reach it, for the resource metadata (default: the
    /// audience when it is a URL, else http://HOST/mcp with the request's Host).
    #[arg(long, value_name = "URL", requires = "jwks")]
    pub(crate) resource_url: Option<String>,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    runpython_core::parse_size(s)
}

fn parse_format(s: &str) -> Result<ToolFormat, String> {
    s.parse().map_err(|e: runpython_core::Error| e.to_string())
}
