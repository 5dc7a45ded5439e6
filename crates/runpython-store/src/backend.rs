//! Choosing an `object_store` backend from a URL.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;

use crate::error::{Error, Result};

/// How a [`Store`](crate::Store) talks to its backend and keeps its cache.
///
/// The request limits apply to network backends (S3): every operation either succeeds or fails within
/// `retry_timeout + request_timeout` at most, never hangs. Retries start only within one request
/// timeout of the first attempt, so a request that timed out is not made again: against a store that
/// accepts connections and never answers, an operation fails after one request timeout (30 s by
/// default). An S3 URL's `timeout=`, `connect_timeout=` (and any other client option object_store
/// knows) override these, e.g. `s3://bucket/runs?timeout=5s`.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Bytes of memoized envelopes kept in memory in front of the store.
    pub memo_cache_bytes: u64,
    /// gc never deletes a blob or staged upload younger than this: writers put blobs before the
    /// manifest that references them, and a manifest is written within this window.
    pub gc_grace: Duration,
    /// Streamed uploads buffer this much before switching to a multipart upload (S3 needs ≥ 5 MiB).
    pub upload_part_bytes: usize,
    /// Time limit of one HTTP request.
    pub request_timeout: Duration,
    /// Time limit to connect.
    pub connect_timeout: Duration,
    /// Retries of a failed request.
    pub max_retries: usize,
    /// No retry starts after this much time since the first attempt (capped at the request timeout).
    pub retry_timeout: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            memo_cache_bytes: 64 * 1024 * 1024,
            gc_grace: Duration::from_secs(60 * 60),
            upload_part_bytes: 8 * 1024 * 1024,
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            max_retries: 3,
            retry_timeout: Duration::from_secs(30),
        }
    }
}

/// `file://` URL of the default local store: `$XDG_DATA_HOME/runpython/store`, else
/// `~/.local/share/runpython/store`. The directory is created when a store is opened on it.
pub fn default_local_url() -> Result<String> {
    local_url_from(std::env::var_os("XDG_DATA_HOME"), std::env::var_os("HOME"))
}

fn local_url_from(
    xdg_data_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Result<String> {
    let non_empty = |v: Option<std::ffi::OsString>| v.filter(|v| !v.is_empty());
    let dir = match (non_empty(xdg_data_home), non_empty(home)) {
        (Some(data), _) => PathBuf::from(data).join("runpython/store"),
        (None, Some(home)) => PathBuf::from(home).join(".local/share/runpython/store"),
        (None, None) => return Err(Error::NoDefaultLocation),
    };
    url::Url::from_directory_path(&dir)
        .map(String::from)
        .map_err(|()| Error::InvalidUrl {
            url: dir.display().to_string(),
            reason: "the default store directory is not an absolute path".into(),
        })
}

/// The backend for `url`, and the URL as shown in errors (query options dropped: they may hold keys).
pub(crate) fn open(url: &str, options: &StoreOptions) -> Result<(Arc<dyn ObjectStore>, String)> {
    let invalid = |reason: &str| Error::InvalidUrl {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let parsed = url::Url::parse(url).map_err(|e| invalid(&e.to_string()))?;
    let mut shown = parsed.clone();
    shown.set_query(None);
    let shown = String::from(shown);
    match parsed.scheme() {
        "memory" => Ok((Arc::new(object_store::memory::InMemory::new()), shown)),
        "file" => {
            if parsed.query().is_some() {
                return Err(invalid("file:// URLs take no options"));
            }
            let dir = parsed
                .to_file_path()
                .map_err(|()| invalid("not an absolute local path"))?;
            std::fs::create_dir_all(&dir).map_err(|source| Error::CreateDir {
                path: dir.clone(),
                source,
            })?;
            // LocalFileSystem writes `<key>#<n>` then renames it into place, so readers never see a
            // torn object and a killed writer leaves the old object (plus a staging file that listing
            // ignores).
            let fs =
                object_store::local::LocalFileSystem::new_with_prefix(&dir).map_err(|source| {
                    Error::Configure {
                        url: url.to_owned(),
                        source: Box::new(source),
                    }
                })?;
            Ok((Arc::new(fs), shown))
        }
        "s3" | "s3a" => open_s3(url, &parsed, shown, options),
        other => Err(invalid(&format!("unknown scheme `{other}`"))),
    }
}

#[cfg(feature = "s3")]
fn open_s3(
    url: &str,
    parsed: &url::Url,
    shown: String,
    options: &StoreOptions,
) -> Result<(Arc<dyn ObjectStore>, String)> {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
    use object_store::{BackoffConfig, ClientConfigKey, ClientOptions, RetryConfig};

    let configure = |source| Error::Configure {
        url: shown.clone(),
        source: Box::new(source),
    };
    let bucket = parsed.host_str().unwrap_or_default();
    if bucket.is_empty() {
        return Err(Error::InvalidUrl {
            url: shown.clone(),
            reason: "no bucket: write s3://bucket or s3://bucket/prefix".into(),
        });
    }
    // object_store's `with_client_options` replaces every client option at once, so the defaults go
    // in first and the environment (AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_ALLOW_HTTP,
    // ...) and then the URL's query options (`timeout=2s`, `connect_timeout=1s`, `allow_http=true`,
    // ...) are applied over them, each key overriding the one before.
    let defaults = ClientOptions::new()
        .with_timeout(options.request_timeout)
        .with_connect_timeout(options.connect_timeout);
    let mut builder = AmazonS3Builder::new().with_client_options(defaults);
    let from_env = std::env::vars().filter(|(k, _)| k.starts_with("AWS_"));
    for (k, v) in from_env {
        if let Ok(key) = k.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() {
            builder = builder.with_config(key, normalized(&key, v));
        }
    }
    builder = builder.with_bucket_name(bucket);
    for (k, v) in parsed.query_pairs() {
        let key: AmazonS3ConfigKey = k.parse().map_err(configure)?;
        builder = builder.with_config(key, normalized(&key, v.into_owned()));
    }
    // A request that timed out is not tried again (it would only time out again, silently
    // multiplying the wait): retries start only within one request timeout of the first attempt,
    // so quick failures (refused, 503) are retried and a store that never answers fails an
    // operation after one request timeout.
    let request_timeout = builder
        .get_config_value(&AmazonS3ConfigKey::Client(ClientConfigKey::Timeout))
        .and_then(|v| humantime::parse_duration(&v).ok())
        .unwrap_or(options.request_timeout);
    let retry = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            base: 2.0,
        },
        max_retries: options.max_retries,
        retry_timeout: options.retry_timeout.min(request_timeout),
    };
    let s3 = builder.with_retry(retry).build().map_err(configure)?;
    let prefix = parsed.path().trim_matches('/');
    let store: Arc<dyn ObjectStore> = if prefix.is_empty() {
        Arc::new(s3)
    } else {
        let prefix = object_store::path::Path::parse(prefix).map_err(|e| Error::InvalidUrl {
            url: url.to_owned(),
            reason: format!("bad key prefix: {e}"),
        })?;
        Arc::new(object_store::prefix::PrefixStore::new(s3, prefix))
    };
    Ok((store, shown))
}

/// `allow_http=1` as object_store reads it (`true`).
#[cfg(feature = "s3")]
fn normalized(key: &object_store::aws::AmazonS3ConfigKey, value: String) -> String {
    use object_store::aws::AmazonS3ConfigKey;
    use object_store::ClientConfigKey;
    match key {
        AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp) if value == "1" => "true".into(),
        _ => value,
    }
}

#[cfg(not(feature = "s3"))]
fn open_s3(
    _url: &str,
    _parsed: &url::Url,
    shown: String,
    _options: &StoreOptions,
) -> Result<(Arc<dyn ObjectStore>, String)> {
    Err(Error::FeatureDisabled {
        url: shown,
        feature: "s3",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_schemes_and_relative_paths_are_rejected_with_the_url() {
        let o = StoreOptions::default();
        for url in ["ftp://x/y", "not a url", "file://relative/x"] {
            let err = open(url, &o).unwrap_err().to_string();
            assert!(err.contains("store URL"), "{err}");
        }
    }

    #[test]
    fn default_local_url_prefers_xdg_data_home_then_home() {
        let url = local_url_from(Some("/data".into()), Some("/home/u".into())).unwrap();
        assert_eq!(url, "file:///data/runpython/store/");
        let url = local_url_from(Some("".into()), Some("/home/u".into())).unwrap();
        assert_eq!(url, "file:///home/u/.local/share/runpython/store/");
        assert!(matches!(
            local_url_from(None, None),
            Err(Error::NoDefaultLocation)
        ));
    }

    #[test]
    fn file_urls_create_their_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b/store");
        let url = url::Url::from_directory_path(&dir).unwrap();
        open(url.as_str(), &StoreOptions::default()).unwrap();
        assert!(dir.is_dir());
    }

    #[cfg(feature = "s3")]
    #[test]
    fn s3_query_options_never_appear_in_the_shown_url() {
        let url = "s3://bucket/pre?endpoint=http://127.0.0.1:1&allow_http=true&secret_access_key=hush&access_key_id=a&region=us-east-1";
        let (_, shown) = open(url, &StoreOptions::default()).unwrap();
        assert_eq!(shown, "s3://bucket/pre");
    }

    #[cfg(feature = "s3")]
    #[test]
    fn unknown_s3_options_are_configuration_errors() {
        let err = open("s3://bucket?colour=red", &StoreOptions::default()).unwrap_err();
        assert!(matches!(err, Error::Configure { .. }), "{err}");
    }
}
