//! The engine's settings as Python gives them: the tier, the pool, the sessions, the network and the
//! sandbox (dicts of knobs, strings, lists), each read into the core's configuration with an error that
//! names the knob.

use pyo3::prelude::*;
use pyo3::types::PyString;
use runpython_core::{PoolConfig, Sandbox, SessionConfig, Tier};

use crate::convert::{boolean, count, dict, seconds, short_repr, strings, type_name};
use crate::errors::config;

pub(crate) fn parse_tier(value: &Bound<'_, PyAny>) -> PyResult<Tier> {
    if value.is_instance_of::<PyString>() {
        return match value.extract::<String>()?.as_str() {
            "persistent" => Ok(Tier::Persistent),
            "ephemeral" => Ok(Tier::ephemeral()),
            other => Err(config(format!(
                "tier must be \"ephemeral\", \"persistent\" or a lifetime in seconds, got {other:?}"
            ))),
        };
    }
    Ok(Tier::Ephemeral {
        ttl: seconds("tier", value)?,
    })
}

pub(crate) fn parse_pool(value: &Bound<'_, PyAny>) -> PyResult<PoolConfig> {
    let mut pool = PoolConfig::default();
    if value.is_instance_of::<pyo3::types::PyBool>() {
        if !boolean("pool", value)? {
            pool.size = 0;
        }
        return Ok(pool);
    }
    if value.is_instance_of::<pyo3::types::PyInt>() {
        pool.size = count("pool", value)?;
        return Ok(pool);
    }
    let settings = dict("pool", value).map_err(|_| {
        config(
            "pool must be a bool, a size, or a dict of size, idle, warm_imports, prestart, templates",
        )
    })?;
    for (key, v) in settings.iter() {
        let key: String = key.extract()?;
        let name = format!("pool[{key:?}]");
        match key.as_str() {
            "size" => pool.size = count(&name, &v)?,
            "idle" => pool.idle = seconds(&name, &v)?,
            "warm_imports" => pool.warm_imports = strings(&name, &v)?,
            "prestart" => pool.prestart = boolean(&name, &v)?,
            "templates" => pool.templates = boolean(&name, &v)?,
            _ => {
                return Err(config(format!(
                "pool has no setting {key:?}; the settings are size, idle, warm_imports, prestart, \
                 templates"
            )))
            }
        }
    }
    Ok(pool)
}

pub(crate) fn parse_sessions(value: &Bound<'_, PyAny>) -> PyResult<SessionConfig> {
    let settings = dict("sessions", value).map_err(|_| {
        config(format!(
            "sessions must be a dict of settings (max_live, idle, snapshot_max_bytes, \
             replay_budget), got {} {}",
            type_name(value),
            short_repr(value)
        ))
    })?;
    let mut sessions = SessionConfig::default();
    for (key, v) in settings.iter() {
        let key: String = key.extract()?;
        let name = format!("sessions[{key:?}]");
        match key.as_str() {
            "max_live" => sessions.max_live = count(&name, &v)?,
            "idle" => sessions.idle = seconds(&name, &v)?,
            "snapshot_max_bytes" => sessions.snapshot_max_bytes = count(&name, &v)?,
            "replay_budget" => sessions.replay_budget = seconds(&name, &v)?,
            _ => {
                return Err(config(format!(
                    "sessions has no setting {key:?}; the settings are max_live, idle, \
                     snapshot_max_bytes, replay_budget"
                )))
            }
        }
    }
    Ok(sessions)
}

const SANDBOX_KEYS: &str = "memory, disk, max_processes, cpus, namespaces, landlock, rlimits, seccomp, drop_privileges, \
                            require, allow_network, memory_bytes, run_memory_bytes, disk_bytes, cgroups, file_size_bytes, \
                            open_files, processes, read_paths";

/// `network=`: `"off"`, `"public"` (the public internet only), `"host"` (the host's network,
/// shared), a list of patterns (only these), or a dict `{"allow": [...], "public": bool, "resolve":
/// {name: ip}}`.
pub(crate) fn parse_network(value: &Bound<'_, PyAny>) -> PyResult<runpython_core::Network> {
    use runpython_core::{Network, NetworkPolicy};
    const FORMS: &str =
        "network must be \"off\", \"public\", \"host\", a list of host patterns, or a dict \
                         with \"allow\" (patterns), \"public\" (bool) and \"resolve\" ({name: ip})";
    if let Ok(mode) = value.extract::<String>() {
        return match mode.as_str() {
            "off" => Ok(Network::Off),
            "public" => Ok(Network::Policy(NetworkPolicy::public_internet())),
            "host" => Ok(Network::Host),
            other => Err(config(format!("{FORMS}; not {other:?}"))),
        };
    }
    if let Ok(d) = value.cast::<pyo3::types::PyDict>() {
        let mut policy = NetworkPolicy::default();
        for (key, v) in d.iter() {
            let key: String = key.extract()?;
            match key.as_str() {
                "allow" => policy.allow = patterns("network[\"allow\"]", &v)?,
                "public" => policy.public = boolean("network[\"public\"]", &v)?,
                "resolve" => {
                    let pins = dict("network[\"resolve\"]", &v)?;
                    for (name, ip) in pins.iter() {
                        let name: String = name.extract()?;
                        let ip: String = ip.extract()?;
                        let ip =
                            ip.trim_matches(|c| c == '[' || c == ']')
                                .parse()
                                .map_err(|_| {
                                    config(format!(
                                    "network[\"resolve\"][{name:?}]: {ip:?} is not an IP address"
                                ))
                                })?;
                        policy.resolve.push((name.to_ascii_lowercase(), ip));
                    }
                }
                other => return Err(config(format!("{FORMS}; unknown key {other:?}"))),
            }
        }
        return Ok(Network::Policy(policy));
    }
    if value.cast::<pyo3::types::PyList>().is_ok() || value.cast::<pyo3::types::PyTuple>().is_ok() {
        return Ok(Network::Policy(NetworkPolicy {
            allow: patterns("network", value)?,
            ..NetworkPolicy::default()
        }));
    }
    Err(config(FORMS.to_owned()))
}

/// Host patterns from a list of strings.
fn patterns(name: &str, v: &Bound<'_, PyAny>) -> PyResult<Vec<runpython_core::HostPattern>> {
    strings(name, v)?
        .into_iter()
        .map(|p| {
            p.parse::<runpython_core::HostPattern>()
                .map_err(|e| config(format!("{name}: {e}")))
        })
        .collect()
}

/// `secrets=`: `{"NAME": ("value", ["host", ...])}`, or per name a dict with `value`, `hosts`,
/// `in_query` (bool), `body_limit` (bytes) and `over_http` (bool). Errors never hold a value.
pub(crate) fn parse_secrets(value: &Bound<'_, PyAny>) -> PyResult<Vec<runpython_core::Secret>> {
    const FORMS: &str = "secrets= takes {\"NAME\": (\"value\", [\"api.example.com\"])} or \
        {\"NAME\": {\"value\": ..., \"hosts\": [...], \"in_query\": bool, \"body_limit\": int, \
        \"over_http\": bool}}";
    let d = dict("secrets", value)?;
    let mut out = Vec::new();
    for (name, spec) in d.iter() {
        let name: String = name
            .extract()
            .map_err(|_| config(format!("{FORMS}; a name is not a string")))?;
        let knob = format!("secrets[{name:?}]");
        let (secret_value, hosts, in_query, body_limit, over_http) = if let Ok(spec) =
            spec.cast::<pyo3::types::PyDict>()
        {
            let mut parts = (None, None, false, None, false);
            for (key, v) in spec.iter() {
                let key: String = key.extract()?;
                match key.as_str() {
                    "value" => parts.0 = Some(v),
                    "hosts" => parts.1 = Some(v),
                    "in_query" => parts.2 = boolean(&format!("{knob}[\"in_query\"]"), &v)?,
                    "body_limit" => parts.3 = Some(count(&format!("{knob}[\"body_limit\"]"), &v)?),
                    "over_http" => parts.4 = boolean(&format!("{knob}[\"over_http\"]"), &v)?,
                    other => return Err(config(format!("{knob}: unknown key {other:?}"))),
                }
            }
            match parts {
                (Some(v), Some(h), q, b, o) => (v, h, q, b, o),
                _ => return Err(config(format!("{knob} needs \"value\" and \"hosts\""))),
            }
        } else if let Ok(pair) = spec.cast::<pyo3::types::PyTuple>() {
            if pair.len() != 2 {
                return Err(config(format!("{knob}: {FORMS}")));
            }
            (pair.get_item(0)?, pair.get_item(1)?, false, None, false)
        } else {
            return Err(config(format!("{knob}: {FORMS}")));
        };
        let secret_value: String = secret_value
            .extract()
            .map_err(|_| config(format!("{knob}: the value must be a string")))?;
        let hosts = if hosts.extract::<String>().is_ok() {
            return Err(config(format!(
                "{knob}: the hosts are a list of patterns, as [\"api.example.com\"]"
            )));
        } else {
            patterns(&format!("{knob} hosts"), &hosts)?
        };
        let mut secret = runpython_core::Secret::new(name, secret_value, hosts);
        secret.in_query = in_query;
        secret.body_limit = body_limit;
        secret.over_http = over_http;
        out.push(secret);
    }
    Ok(out)
}

pub(crate) fn parse_sandbox(value: &Bound<'_, PyAny>) -> PyResult<Sandbox> {
    parse_sandbox_from("sandbox", value, Sandbox::default())
}

/// A size: an int of bytes or a string as `512M`, `2G`.
fn size(name: &str, value: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Ok(text) = value.extract::<String>() {
        return runpython_core::parse_size(&text).map_err(|e| config(format!("{name}: {e}")));
    }
    let bytes: u64 = count(name, value)?;
    if bytes < 4096 {
        return Err(config(format!(
            "{name} is {bytes} bytes: give at least 4096, or a size as \"512M\""
        )));
    }
    Ok(bytes)
}

/// `sandbox=` or `install_sandbox=`: a bool (every layer, or none) or a dict of settings over `base`.
pub(crate) fn parse_sandbox_from(
    knob: &str,
    value: &Bound<'_, PyAny>,
    base: Sandbox,
) -> PyResult<Sandbox> {
    if value.is_instance_of::<pyo3::types::PyBool>() {
        return Ok(if boolean(knob, value)? {
            base
        } else {
            Sandbox::off()
        });
    }
    let settings = dict(knob, value).map_err(|_| {
        config(format!(
            "{knob} must be a bool or a dict of settings ({SANDBOX_KEYS})"
        ))
    })?;
    let mut sandbox = base;
    for (key, v) in settings.iter() {
        let key: String = key.extract()?;
        let name = format!("{knob}[{key:?}]");
        match key.as_str() {
            // What a person sets: the run's memory (its total, and each process's address space,
            // which is the limit where the host has no cgroup), its disk, its processes.
            "memory" => {
                let bytes = size(&name, &v)?;
                sandbox.run_memory_bytes = bytes;
                sandbox.memory_bytes = bytes;
            }
            "disk" => sandbox.disk_bytes = size(&name, &v)?,
            "max_processes" => sandbox.processes = count(&name, &v)?,
            "cpus" => {
                let cpus: f64 = v.extract().map_err(|_| {
                    config(format!(
                        "{name} must be a number of CPUs, got {}",
                        type_name(&v)
                    ))
                })?;
                if !cpus.is_finite() || cpus < 0.01 {
                    return Err(config(format!(
                        "{name} must be at least 0.01 CPUs, got {cpus}"
                    )));
                }
                sandbox.cpu_millis = (cpus * 1000.0).round() as u64;
            }
            "namespaces" => sandbox.namespaces = boolean(&name, &v)?,
            "landlock" => sandbox.landlock = boolean(&name, &v)?,
            "rlimits" => sandbox.rlimits = boolean(&name, &v)?,
            "seccomp" => sandbox.seccomp = boolean(&name, &v)?,
            "drop_privileges" => sandbox.drop_privileges = boolean(&name, &v)?,
            "require" => sandbox.require = boolean(&name, &v)?,
            "allow_network" => {
                sandbox.network = if boolean(&name, &v)? {
                    runpython_core::Network::Policy(runpython_core::NetworkPolicy::public_internet())
                } else {
                    runpython_core::Network::Off
                }
            }
            "memory_bytes" => sandbox.memory_bytes = count(&name, &v)?,
            "file_size_bytes" => sandbox.file_size_bytes = count(&name, &v)?,
            "open_files" => sandbox.open_files = count(&name, &v)?,
            "processes" => sandbox.processes = count(&name, &v)?,
            "run_memory_bytes" => sandbox.run_memory_bytes = count(&name, &v)?,
            "disk_bytes" => sandbox.disk_bytes = count(&name, &v)?,
            "cgroups" => sandbox.cgroups = boolean(&name, &v)?,
            "read_paths" => {
                sandbox.read_paths = strings(&name, &v)?.into_iter().map(Into::into).collect()
            }
            _ => {
                return Err(config(format!(
                    "{knob} has no setting {key:?}; the settings are {SANDBOX_KEYS}"
                )))
            }
        }
    }
    Ok(sandbox)
}

/// `warm=`: a list of environments, each a list of requirement specs or one str of them separated by
/// commas (`["numpy,pandas,matplotlib"]` or `[["numpy", "pandas"]]`).
pub(crate) fn warm_environments(value: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<String>>> {
    if value.is_instance_of::<PyString>() {
        return Err(config(
            "warm must be a list of environments, each a list of specs or one str of them separated \
             by commas, as warm=[\"numpy,pandas,matplotlib\"]; wrap the str in a list",
        ));
    }
    let mut out = Vec::new();
    for item in value
        .try_iter()
        .map_err(|_| config("warm must be a list of environments"))?
    {
        let item = item?;
        let specs = match item.extract::<String>() {
            Ok(text) => text
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            Err(_) => strings("warm", &item)?,
        };
        out.push(specs);
    }
    Ok(out)
}
