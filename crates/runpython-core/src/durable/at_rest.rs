//! A request at rest: everything of a [`RunRequest`] that changes what its code sees, as the records
//! that run it again keep it (a resumable run's checkpoint, a session's cell). Values of environment
//! variables and secrets are never in it (their names are), and neither are files' bytes (their
//! artifact ids are: bytes given inline are stored as artifacts first).

use std::collections::BTreeMap;

use runpython_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::Error;
use crate::protocol::request::{FileSource, RunRequest};

/// What a request was, at rest (postcard: fields are positional, so a change is a new record version
/// of the records that hold it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct RequestAtRest {
    pub code: String,
    /// JSON text of the inputs object (postcard cannot carry `serde_json::Value`).
    pub inputs: String,
    pub input_artifacts: Vec<(String, String)>,
    pub dependencies: Vec<String>,
    /// Inputs are runpython's tagged JSON ([`RunRequest::typed`]).
    pub typed: bool,
    /// The value's repr was asked for too.
    pub repr: bool,
    /// Files put in the working directory, by name.
    pub files: Vec<(String, FileAtRest)>,
    /// The names of the request's own environment variables ([`RunRequest::env`]); never their values.
    pub env: Vec<String>,
    /// [`RunRequest::allow_hosts`], each pattern as its text.
    pub allow_hosts: Option<Vec<String>>,
    /// [`RunRequest::timeout`], in milliseconds.
    pub timeout_ms: Option<u64>,
    /// The names of the engine's secrets the run had (their placeholders in its environment).
    pub secrets: Vec<String>,
}

/// A file put in a run, at rest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum FileAtRest {
    /// A stored artifact, by id.
    Artifact(String),
    /// Its bytes: only in checkpoints of version 2, read and never written.
    Bytes(Vec<u8>),
}

impl RequestAtRest {
    /// `request` at rest in `store`: files given as bytes are stored as artifacts (content-addressed:
    /// the same bytes are one artifact) and named by id. `secrets` are the engine's secrets' names.
    pub(crate) async fn keep(
        store: &Store,
        request: &RunRequest,
        secrets: Vec<String>,
    ) -> Result<Self, Error> {
        let mut files = Vec::with_capacity(request.files.len());
        for (name, source) in &request.files {
            let id = match source {
                FileSource::Artifact(id) => id.clone(),
                FileSource::Bytes(bytes) | FileSource::Upload(bytes) => {
                    store.put_blob(bytes.clone()).await?
                }
            };
            files.push((name.clone(), FileAtRest::Artifact(id)));
        }
        Ok(Self {
            code: request.code.clone(),
            inputs: Value::Object(request.inputs.clone()).to_string(),
            input_artifacts: request.input_artifacts.clone(),
            dependencies: request.dependencies.clone(),
            typed: request.typed,
            repr: request.repr,
            files,
            env: request.env.keys().cloned().collect(),
            allow_hosts: request
                .allow_hosts
                .as_ref()
                .map(|hosts| hosts.iter().map(ToString::to_string).collect()),
            timeout_ms: request
                .timeout
                .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            secrets,
        })
    }

    /// What a record of an older version held (code, inputs, input artifacts, dependencies), the rest
    /// as a request without them has it.
    pub(crate) fn of_version_1(
        code: String,
        inputs: String,
        input_artifacts: Vec<(String, String)>,
        dependencies: Vec<String>,
    ) -> Self {
        Self {
            code,
            inputs,
            input_artifacts,
            dependencies,
            typed: false,
            repr: false,
            files: Vec::new(),
            env: Vec::new(),
            allow_hosts: None,
            timeout_ms: None,
            secrets: Vec::new(),
        }
    }

    /// The recorded environment variables `given` lacks a value for.
    pub(crate) fn missing_env<'a>(&'a self, given: &BTreeMap<String, String>) -> Vec<&'a str> {
        self.env
            .iter()
            .filter(|name| !given.contains_key(*name))
            .map(String::as_str)
            .collect()
    }

    /// The recorded secrets an engine holding `secrets` lacks.
    pub(crate) fn missing_secrets<'a>(&'a self, secrets: &[String]) -> Vec<&'a str> {
        self.secrets
            .iter()
            .filter(|name| !secrets.contains(name))
            .map(String::as_str)
            .collect()
    }

    /// The request again (never memoized): each recorded environment variable with its value from
    /// `env`, where `env` has one (values are never at rest).
    pub(crate) fn request(&self, env: &BTreeMap<String, String>) -> Result<RunRequest, Error> {
        let corrupt = |what: &str, why: String| {
            Error::InvalidInput(format!(
                "a stored request's {what} cannot be read ({why}); the record is corrupt"
            ))
        };
        let inputs: Map<String, Value> =
            serde_json::from_str(&self.inputs).map_err(|e| corrupt("inputs", e.to_string()))?;
        let mut request = RunRequest::new(self.code.clone()).no_memo();
        request.inputs = inputs;
        request.input_artifacts = self.input_artifacts.clone();
        request.dependencies = self.dependencies.clone();
        request.typed = self.typed;
        request.repr = self.repr;
        request.files = self
            .files
            .iter()
            .map(|(name, file)| {
                let source = match file {
                    FileAtRest::Artifact(id) => FileSource::Artifact(id.clone()),
                    // Bytes a client uploaded were bounded when they came; running again re-sends them.
                    FileAtRest::Bytes(bytes) => FileSource::Bytes(bytes.clone()),
                };
                (name.clone(), source)
            })
            .collect();
        request.env = self
            .env
            .iter()
            .filter_map(|name| Some((name.clone(), env.get(name)?.clone())))
            .collect();
        request.allow_hosts = match &self.allow_hosts {
            None => None,
            Some(hosts) => Some(
                hosts
                    .iter()
                    .map(|h| {
                        h.parse()
                            .map_err(|e| corrupt("allowed hosts", format!("{e}")))
                    })
                    .collect::<Result<_, _>>()?,
            ),
        };
        request.timeout = self.timeout_ms.map(std::time::Duration::from_millis);
        Ok(request)
    }
}

/// The names of the secrets an engine's runs get (their placeholders in the environment).
pub(crate) fn secret_names(sandbox: &runpython_egress::Sandbox) -> Vec<String> {
    match &sandbox.network {
        runpython_egress::Network::Policy(policy) => {
            policy.secrets.iter().map(|s| s.name.clone()).collect()
        }
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_request_comes_back_with_everything_but_values_and_files_by_artifact_id() {
        let store = Store::open("memory://").unwrap();
        let request = RunRequest::new("open('a.txt').read()")
            .input("when", serde_json::json!({"$rp": "set", "items": [1]}))
            .typed()
            .file("a.txt", b"hello".to_vec())
            .file_artifact("b.bin", "0".repeat(64))
            .env("TOKEN", "s3cret")
            .allow_hosts(vec!["127.0.0.1:8080".parse().unwrap()])
            .timeout(Duration::from_millis(1500))
            .dependency("six");
        let kept = RequestAtRest::keep(&store, &request, vec!["API_KEY".into()])
            .await
            .unwrap();
        // No value and no byte of a file is at rest.
        let encoded = postcard::to_allocvec(&kept).unwrap();
        assert!(!encoded.windows(6).any(|w| w == b"s3cret"));
        assert!(!encoded.windows(5).any(|w| w == b"hello"));
        let FileAtRest::Artifact(id) = &kept.files[0].1 else {
            panic!("bytes at rest: {kept:?}")
        };
        assert_eq!(&store.get_run_artifact(id).await.unwrap()[..], b"hello");

        assert_eq!(kept.missing_env(&BTreeMap::new()), vec!["TOKEN"]);
        assert_eq!(kept.missing_secrets(&[]), vec!["API_KEY"]);
        let given = BTreeMap::from([("TOKEN".to_owned(), "again".to_owned())]);
        let back = kept.request(&given).unwrap();
        assert!(back.typed && !back.use_memo);
        assert_eq!(back.inputs, request.inputs);
        assert_eq!(back.env, given);
        assert_eq!(back.allow_hosts, request.allow_hosts);
        assert_eq!(back.timeout, Some(Duration::from_millis(1500)));
        assert_eq!(back.dependencies, vec!["six".to_owned()]);
        assert_eq!(
            back.files,
            vec![
                ("a.txt".to_owned(), FileSource::Artifact(id.clone())),
                ("b.bin".to_owned(), FileSource::Artifact("0".repeat(64))),
            ]
        );
        // Without the values, the names stay unset.
        assert!(kept.request(&BTreeMap::new()).unwrap().env.is_empty());
    }
}
