//! The flags turned into what they configure: the engine (a `RunPythonBuilder` from `EngineArgs`
//! and its flag groups: network and secrets, the sandbox's limits, installs, command tools, the
//! store), the stores the operator commands act on, and `serve`'s `runpython_mcp::ServeConfig`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context};
use runpython_core::{
    default_local_url, error_report, CommandTool, InstallPolicy, McpServer, Network, NetworkPolicy,
    PoolConfig, RunPython, RunPythonBuilder, Store, Tier,
};
use serde_json::Value;

use crate::args::network_flags::NetworkArgs;
use crate::args::sandbox_flags::{InstallArgs, SandboxArgs};
use crate::args::store_flags::StoreArgs;
use crate::args::{EngineArgs, ServeArgs};

/// How many bytes of a request body `--secret-in-body` buffers to put a value in.
const SECRET_BODY_LIMIT: usize = 1 << 20;

/// One entry of a `--tools-file`: a JSON array of these.
const TOOLS_FILE_SHAPE: &str = r#"[{"name": "get_weather", "command": "./weather.sh", "description": "Current weather of a city.", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]"#;

/// The engine these flags describe, as `--tenant`'s when given.
pub(crate) async fn engine(args: &EngineArgs) -> anyhow::Result<RunPython> {
    scoped(args, builder(args).await?.build()?)
}

/// The engine of a server (`mcp`, `serve`), not yet scoped to `--tenant`: a server answers many
/// runs, so interpreters started ahead of them pay off. At least `ready` are kept (unless the pool
/// is off): `serve` keeps one more than a token's share of runs, so one tenant's runs taking them
/// as fast as they are admitted still leave another's run a ready one.
pub(crate) async fn server_engine(args: &EngineArgs, ready: usize) -> anyhow::Result<RunPython> {
    let mut pool = PoolConfig::default();
    if pool.size > 0 {
        pool.size = pool.size.max(ready);
    }
    Ok(builder(args).await?.pool(pool).build()?)
}

/// Prepares the environments `--warm` declared before the command serves anything: installs them
/// (progress on the status line), starts their templates.
pub(crate) async fn warm_up(args: &EngineArgs, engine: &RunPython) -> anyhow::Result<()> {
    if args.warm.is_empty() {
        return Ok(());
    }
    let status = std::sync::Mutex::new(crate::human::StatusLine::new());
    let warmed = engine
        .warm_up(|step| {
            if let Ok(mut status) = status.lock() {
                status.show(&step);
            }
        })
        .await;
    if let Ok(mut status) = status.lock() {
        status.clear();
    }
    warmed.context("preparing the warm environments (--warm)")
}

/// `engine` as `--tenant`'s, when given.
pub(crate) fn scoped(args: &EngineArgs, engine: RunPython) -> anyhow::Result<RunPython> {
    match &args.store.tenant {
        Some(name) => engine
            .tenant(name)
            .with_context(|| format!("--tenant {name:?}")),
        None => Ok(engine),
    }
}

/// The builder these flags describe, with the MCP servers' tools connected. One-shot commands
/// start no interpreter pool (it would only be killed at exit); `mcp` turns it back on.
pub(crate) async fn builder(args: &EngineArgs) -> anyhow::Result<RunPythonBuilder> {
    let mut builder = RunPython::builder().pool(PoolConfig {
        size: 0,
        ..PoolConfig::default()
    });
    if let Some(timeout) = args.timeout {
        builder = builder.timeout(timeout);
    }
    if let Some(n) = args.max_output_chars {
        builder = builder.max_output_chars(usize::try_from(n).unwrap_or(usize::MAX));
    }
    if let Some(n) = args.max_upload_bytes {
        builder = builder.max_upload_bytes(usize::try_from(n).unwrap_or(usize::MAX));
    }
    if let Some(n) = args.max_image_bytes {
        builder = builder.max_image_bytes(usize::try_from(n).unwrap_or(usize::MAX));
    }
    for name in &args.env_passthrough {
        builder = builder.env_passthrough(name);
    }
    if let Some(python) = &args.python {
        builder = builder.python(python);
    }
    if args.no_auto_deps {
        builder = builder.auto_deps(false);
    }
    for tool in command_tools(
        &args.tools,
        &args.tool_docs,
        &args.tool_schemas,
        args.tools_file.as_deref(),
    )? {
        builder = builder.tool(tool);
    }
    for spec in &args.deps {
        builder = builder.dependency(spec);
    }
    for specs in &args.warm {
        builder = builder.warm_environment(specs.iter().cloned());
    }
    for command in &args.mcp_servers {
        let server = McpServer::connect(command).await?;
        builder = builder.tools(&server.tools());
    }
    if let Some(depth) = args.allow_nested {
        builder = builder.allow_nested(depth);
    }
    if let Some(bytes) = args.session_snapshot_max {
        builder = builder.session_snapshot_max(bytes);
    }
    if let Some(budget) = args.session_replay_budget {
        builder = builder.session_replay_budget(budget);
    }
    builder = with_network(builder, &args.network).map_err(anyhow::Error::msg)?;
    builder = with_limits(builder, &args.limits);
    builder = with_installs(builder, &args.installs)?;
    if !args.no_store {
        match store_base(&args.store) {
            Ok(store) => {
                builder = builder.store(store);
                if args.persistent {
                    builder = builder.tier(Tier::Persistent);
                }
            }
            // An explicit store must work; the default one is a convenience and may be unavailable,
            // unless an approval tool needs it.
            Err(e) if args.store.store.is_some() || !args.approvals.is_empty() || args.durable => {
                return Err(e)
            }
            Err(e) => say_err!(
                "runpython: not keeping this run: {}",
                error_report(e.as_ref())
            ),
        }
    }
    for name in &args.approvals {
        builder = builder.approval(name);
    }
    if args.durable {
        builder = builder.durable(true);
    }
    if args.memo {
        builder = builder.memoize(args.memo_ttl);
    }
    Ok(builder)
}

/// The network these flags describe.
fn network(args: &NetworkArgs) -> Network {
    match args.network.as_deref() {
        Some("host") => return Network::Host,
        Some(_) => return Network::Off,
        None => {}
    }
    if !args.allow_network && args.allow_hosts.is_empty() {
        return Network::Off;
    }
    Network::Policy(NetworkPolicy {
        public: args.allow_network,
        allow: args.allow_hosts.clone(),
        resolve: args.resolve.clone(),
        ..NetworkPolicy::default()
    })
}

/// The network and the secrets, on `builder` (which checks them against each other).
fn with_network(
    mut builder: RunPythonBuilder,
    args: &NetworkArgs,
) -> Result<RunPythonBuilder, String> {
    builder = builder.network(network(args));
    let options = [
        ("--secret-in-query", &args.secret_in_query),
        ("--secret-in-body", &args.secret_in_body),
        ("--secret-over-http", &args.secret_over_http),
    ];
    for (flag, names) in options {
        if let Some(name) = names
            .iter()
            .find(|name| !args.secrets.iter().any(|s| &s.name == *name))
        {
            return Err(format!(
                "{flag} {name}: no --secret {name}:HOSTS declares it; declare the secret first"
            ));
        }
    }
    for secret in &args.secrets {
        let mut secret = secret.clone();
        secret.in_query = args.secret_in_query.contains(&secret.name);
        secret.over_http = args.secret_over_http.contains(&secret.name);
        if args.secret_in_body.contains(&secret.name) {
            secret.body_limit = Some(SECRET_BODY_LIMIT);
        }
        builder = builder.secret(secret);
    }
    for path in &args.upstream_cas {
        let pem = std::fs::read(path)
            .map_err(|e| format!("--upstream-ca {}: cannot read it ({e})", path.display()))?;
        if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
            return Err(format!(
                "--upstream-ca {}: not a PEM bundle (no BEGIN CERTIFICATE line)",
                path.display()
            ));
        }
        builder = builder.upstream_ca(pem);
    }
    Ok(builder)
}

/// The run's limits, on `builder`.
fn with_limits(mut builder: RunPythonBuilder, args: &SandboxArgs) -> RunPythonBuilder {
    if let Some(bytes) = args.memory {
        builder = builder.memory_limit(bytes).address_space_limit(bytes);
    }
    if let Some(bytes) = args.disk {
        builder = builder.disk_limit(bytes);
    }
    if let Some(n) = args.max_processes {
        builder = builder.max_processes(n);
    }
    if let Some(cpus) = args.cpus {
        builder = builder.cpus(cpus);
    }
    if args.require_isolation {
        builder = builder.require_isolation(true);
    }
    builder
}

/// What installs may do, on `builder`.
fn with_installs(
    mut builder: RunPythonBuilder,
    args: &InstallArgs,
) -> anyhow::Result<RunPythonBuilder> {
    if args.allow_source_builds {
        builder = builder.allow_source_builds(true);
    }
    for name in &args.allow_packages {
        builder = builder.allow_package(name);
    }
    if let Some(path) = &args.packages_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the packages file {}", path.display()))?;
        for line in text.lines() {
            let name = line.split('#').next().unwrap_or_default().trim();
            if !name.is_empty() {
                builder = builder.allow_package(name);
            }
        }
    }
    if let Some(timeout) = args.install_timeout {
        builder = builder.prepare_timeout(timeout);
    }
    if args.install_memory.is_some()
        || args.install_disk.is_some()
        || !args.install_allow_hosts.is_empty()
        || args.install_host_network
    {
        let mut sandbox = InstallPolicy::default_sandbox();
        if let Some(bytes) = args.install_memory {
            sandbox.run_memory_bytes = bytes;
        }
        if let Some(bytes) = args.install_disk {
            sandbox.disk_bytes = bytes;
        }
        if let runpython_core::Network::Policy(policy) = &mut sandbox.network {
            policy
                .allow
                .extend(args.install_allow_hosts.iter().cloned());
        }
        if args.install_host_network {
            sandbox.network = runpython_core::Network::Host;
        }
        builder = builder.install_sandbox(sandbox);
    }
    Ok(builder)
}

/// The command tools these flags describe, in the order given (the file's first).
fn command_tools(
    tools: &[(String, String)],
    docs: &[(String, String)],
    schemas: &[(String, String)],
    tools_file: Option<&Path>,
) -> anyhow::Result<Vec<CommandTool>> {
    let mut out = match tools_file {
        Some(path) => read_tools_file(path)?,
        None => Vec::new(),
    };
    let mut docs: BTreeMap<&str, &str> =
        docs.iter().map(|(n, t)| (n.as_str(), t.as_str())).collect();
    let mut schemas: BTreeMap<&str, &str> = schemas
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    for (name, command) in tools {
        let mut tool = CommandTool::new(name, command);
        if let Some(doc) = docs.remove(name.as_str()) {
            tool = tool.with_description(doc);
        }
        if let Some(json) = schemas.remove(name.as_str()) {
            let schema: Value = serde_json::from_str(json).with_context(|| {
                format!("--tool-schema {name}=...: the schema is not JSON; give an object schema like {{\"type\": \"object\", \"properties\": {{...}}}}")
            })?;
            tool = tool.with_input_schema(schema)?;
        }
        out.push(tool);
    }
    if let Some(name) = docs.keys().chain(schemas.keys()).next() {
        bail!("--tool-doc or --tool-schema names {name:?}, but no --tool {name}=COMMAND is given");
    }
    Ok(out)
}

fn read_tools_file(path: &Path) -> anyhow::Result<Vec<CommandTool>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the tools file {}", path.display()))?;
    let entries: Vec<Value> = serde_json::from_str(&text).with_context(|| {
        format!(
            "the tools file {} is not a JSON array of tools like {TOOLS_FILE_SHAPE}",
            path.display()
        )
    })?;
    let mut tools = Vec::with_capacity(entries.len());
    for (index, entry) in entries.into_iter().enumerate() {
        let text_field = |field: &str| entry.get(field).and_then(Value::as_str);
        let (Some(name), Some(command)) = (text_field("name"), text_field("command")) else {
            bail!(
                "tool {index} of {} needs a string `name` and `command`, like {TOOLS_FILE_SHAPE}",
                path.display()
            );
        };
        let mut tool = CommandTool::new(name, command);
        match entry.get("description") {
            None | Some(Value::Null) => {}
            Some(Value::String(doc)) => tool = tool.with_description(doc),
            Some(other) => bail!("the description of tool {name:?} must be a string, not {other}"),
        }
        if let Some(schema) = entry.get("input_schema").filter(|s| !s.is_null()) {
            tool = tool.with_input_schema(schema.clone())?;
        }
        tools.push(tool);
    }
    Ok(tools)
}

/// The store as a whole (the default tenant's, from which the others are reached).
pub(crate) fn store_base(args: &StoreArgs) -> anyhow::Result<Store> {
    let url = match &args.store {
        Some(url) => url.clone(),
        None => default_local_url()
            .context("cannot find the default store directory; pass --store URL")?,
    };
    Store::open(&url).with_context(|| format!("cannot open the store {url}"))
}

/// The store, scoped to `--tenant` when given.
pub(crate) fn store(args: &StoreArgs) -> anyhow::Result<Store> {
    let store = store_base(args)?;
    match &args.tenant {
        Some(name) => store
            .tenant(name)
            .with_context(|| format!("--tenant {name:?}")),
        None => Ok(store),
    }
}

/// What an operator command acts on: `--tenant`'s store, else every tenant's.
pub(crate) async fn stores(args: &StoreArgs) -> anyhow::Result<Vec<Store>> {
    let store = store(args)?;
    if args.tenant.is_some() {
        return Ok(vec![store]);
    }
    store
        .every_tenant()
        .await
        .context("cannot list the store's tenants")
}

/// `serve`'s configuration from its flags (the engine's come from `EngineArgs`).
pub(crate) fn serve_config(args: &ServeArgs) -> runpython_mcp::ServeConfig {
    let max_runs_in_flight = args.max_runs_in_flight.unwrap_or_else(|| {
        4 * std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
    });
    runpython_mcp::ServeConfig {
        bind: args.bind,
        tokens_file: args.tokens_file.clone(),
        // By default one token alone never fills the host: another's run finds a place at once.
        max_runs_per_token: args.max_runs_per_token.unwrap_or(match max_runs_in_flight {
            0 => 4,
            n => (n / 2).clamp(1, 4),
        }),
        max_runs_in_flight,
        drain_timeout: args.drain_timeout,
        allowed_hosts: args.allowed_hosts.clone(),
        max_connections: args.max_connections,
        max_connections_per_token: args.max_connections_per_token,
        max_sessions_per_token: args.max_sessions_per_token,
        header_timeout: args.header_timeout,
        body_timeout: args.body_timeout,
        max_stored_bytes_per_token: args.max_stored_bytes_per_token,
        oauth: args.jwks.clone().map(|jwks| runpython_mcp::OAuthConfig {
            jwks,
            issuer: args.jwt_issuer.clone().unwrap_or_default(),
            audience: args.jwt_audience.clone().unwrap_or_default(),
            tenant_claim: args.jwt_tenant_claim.clone(),
            resource: args.resource_url.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runpython_core::Tool;

    fn pair(name: &str, value: &str) -> (String, String) {
        (name.into(), value.into())
    }

    #[test]
    fn docs_and_schemas_attach_to_their_tool_and_strays_are_refused() {
        let tools = command_tools(
            &[pair("weather", "./w.sh --token=abc")],
            &[pair("weather", "Current weather.")],
            &[pair(
                "weather",
                r#"{"type": "object", "properties": {"city": {"type": "string"}}}"#,
            )],
            None,
        )
        .unwrap();
        assert_eq!(tools[0].description(), "Current weather.");
        assert!(tools[0].input_schema().is_some());
        let stray = command_tools(&[], &[pair("nope", "x")], &[], None).unwrap_err();
        assert!(
            stray.to_string().contains("no --tool nope=COMMAND"),
            "{stray}"
        );
        let bad = command_tools(&[pair("t", "c")], &[], &[pair("t", "[1]")], None).unwrap_err();
        assert!(format!("{bad:#}").contains("object schema"), "{bad:#}");
    }

    #[test]
    fn a_tools_file_gives_names_commands_descriptions_and_schemas() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tools.json");
        std::fs::write(&path, TOOLS_FILE_SHAPE).unwrap();
        let tools = command_tools(&[], &[], &[], Some(&path)).unwrap();
        assert_eq!(tools[0].name(), "get_weather");
        assert_eq!(tools[0].description(), "Current weather of a city.");
        std::fs::write(&path, r#"[{"name": "x"}]"#).unwrap();
        let e = command_tools(&[], &[], &[], Some(&path)).unwrap_err();
        assert!(e.to_string().contains("`command`"), "{e}");
    }
}
