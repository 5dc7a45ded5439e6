//! Secrets the code can use but never read. Every server here is a loopback recorder this test
//! started (`runpython_tests::recorder`); names are pinned to 127.0.0.1 with `--resolve`'s library
//! form, so no lookup or packet leaves the host. Each check runs for one-shot runs, session cells
//! and runs forked from a template.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

use std::time::Duration;

use runpython_core::{
    Envelope, Network, NetworkPolicy, RunPython, RunRequest, Secret, Status, Store,
};
use runpython_tests::recorder::{Recorder, TestCa};
use runpython_tests::ways::Way;
use serde_json::{json, Value};

/// A value no run could guess, and long like a real key.
fn value() -> String {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).unwrap();
    format!(
        "sk-test-{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

struct Setup {
    plain: Recorder,
    tls: Recorder,
    other: Recorder,
    value: String,
    ca: TestCa,
}

impl Setup {
    async fn new() -> Setup {
        let ca = TestCa::new(&["api.test", "other.test"]).unwrap();
        Setup {
            plain: Recorder::start(None).await.unwrap(),
            tls: Recorder::start(Some(&ca)).await.unwrap(),
            other: Recorder::start(None).await.unwrap(),
            value: value(),
            ca,
        }
    }

    /// An engine with the secret `API_KEY` for `api.test`: over verified TLS only, or (`over_http`)
    /// over plain HTTP too.
    fn engine_with(&self, way: Way, store: Option<Store>, over_http: bool) -> RunPython {
        let allow = [
            format!("api.test:{}", self.plain.port),
            format!("api.test:{}", self.tls.port),
            format!("other.test:{}", self.other.port),
        ];
        let network = Network::Policy(NetworkPolicy {
            allow: allow.iter().map(|p| p.parse().unwrap()).collect(),
            resolve: vec![
                ("api.test".into(), "127.0.0.1".parse().unwrap()),
                ("other.test".into(), "127.0.0.1".parse().unwrap()),
            ],
            ..NetworkPolicy::default()
        });
        let mut secret = Secret::new(
            "API_KEY",
            self.value.clone(),
            vec!["api.test".parse().unwrap()],
        );
        secret.over_http = over_http;
        let mut builder = way.serve(
            RunPython::builder()
                .timeout(Duration::from_secs(60))
                .network(network)
                .secret(secret)
                .upstream_ca(self.ca.ca_pem.clone().into_bytes()),
        );
        if let Some(store) = store {
            builder = builder.store(store);
        }
        builder.build().unwrap()
    }

    /// An engine whose secret goes over verified TLS only (the default).
    fn engine(&self, way: Way, store: Option<Store>) -> RunPython {
        self.engine_with(way, store, false)
    }

    /// The run's code: requests to the secret's host (HTTP, HTTPS, Basic auth) and to another
    /// allowed host, then a search of everything the run can read for the value, by its first
    /// eight characters (which the code is given) and a hash of what follows each of them.
    fn request(&self) -> RunRequest {
        RunRequest::new(CODE)
            .input("plain", json!(self.plain.port))
            .input("tls", json!(self.tls.port))
            .input("other", json!(self.other.port))
            .input("prefix", json!(&self.value[..8]))
            .input("tail", json!(self.value.len() - 8))
    }

    fn tail_hash(&self) -> String {
        use sha2::Digest as _;
        sha2::Sha256::digest(&self.value.as_bytes()[8..])
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

const CODE: &str = r#"
import base64, hashlib, os, urllib.error, urllib.request
key = os.environ["API_KEY"]

def get(url, headers):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=20) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception as e:
        return type(e).__name__

basic = base64.b64encode(("user:" + key).encode()).decode()
out = {
    "placeholder": key,
    "http": get(f"http://api.test:{plain}/plain", {"Authorization": "Bearer " + key}),
    "https": get(f"https://api.test:{tls}/tls", {"Authorization": "Bearer " + key}),
    "basic": get(f"https://api.test:{tls}/basic", {"Authorization": "Basic " + basic}),
    "other": get(f"http://other.test:{other}/other", {"X-Key": key}),
}

p = prefix.encode()
found, hits = set(), 0
def scan(data):
    global hits
    i = data.find(p)
    while i >= 0:
        hits += 1
        found.add(hashlib.sha256(data[i + len(p):i + len(p) + tail]).hexdigest())
        i = data.find(p, i + 1)

for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                scan(f.read())
        except OSError:
            pass
for top in ("/tmp", os.getcwd(), os.path.expanduser("~")):
    for root, dirs, files in os.walk(top):
        for name in files:
            try:
                with open(os.path.join(root, name), "rb") as f:
                    scan(f.read())
            except OSError:
                pass
fd = os.open("/proc/self/mem", os.O_RDONLY)
with open("/proc/self/maps") as maps:
    for line in maps.read().splitlines():
        addr, perms = line.split()[:2]
        if perms[0] != "r" or "[vvar" in line or "[vsyscall" in line:
            continue
        start, end = (int(x, 16) for x in addr.split("-"))
        try:
            scan(os.pread(fd, end - start, start))
        except OSError:
            pass
os.close(fd)
out["hits"] = hits
out["found"] = sorted(found)
out
"#;

async fn run(engine: &RunPython, way: Way, request: RunRequest) -> Envelope {
    let e = match way {
        Way::Cell => {
            let session = engine.session();
            // A first cell, so the checked one is a later cell of a live session.
            session.run("1").await.unwrap();
            session.run(request).await.unwrap()
        }
        _ => engine.run(request).await.unwrap(),
    };
    assert_eq!(
        e.status,
        Status::Success,
        "{way:?}: {:?} {}",
        e.error,
        e.stderr
    );
    e
}

fn enforced() -> bool {
    let engine = RunPython::builder()
        .network(Network::Policy(NetworkPolicy::public_internet()))
        .build()
        .unwrap();
    let ok = engine.isolation_report().unwrap().network == "public";
    if !ok {
        eprintln!("skipped: no network policy can be enforced here");
    }
    ok
}

async fn the_value_reaches_its_host_only_and_never_the_run(way: Way) {
    if !enforced() {
        return;
    }
    let setup = Setup::new().await;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&format!("file://{}", dir.path().display())).unwrap();
    let engine = setup.engine(way, Some(store));
    let e = run(&engine, way, setup.request()).await;
    let v = &e.return_value;
    let placeholder = v["placeholder"].as_str().unwrap().to_owned();
    assert_ne!(placeholder, setup.value);
    assert!(placeholder.len() >= 32, "{placeholder}");
    // The secret's host got the value over HTTPS (verified for it), in a bearer token and in Basic
    // auth; over plain HTTP the request was refused before anything was sent, and reported.
    assert_eq!(v["https"], 200, "{way:?}: {v}");
    assert_eq!(v["basic"], 200, "{way:?}: {v}");
    assert_eq!(v["http"], 403, "{way:?}: {v}");
    let plain = setup.plain.seen().join("\n");
    assert!(
        plain.is_empty(),
        "{way:?}: a plaintext listener got {plain}"
    );
    let tls = setup.tls.seen().join("\n");
    assert!(
        tls.contains(&format!("Bearer {}", setup.value)),
        "{way:?}: {tls}"
    );
    use base64::Engine as _;
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("user:{}", setup.value));
    assert!(tls.contains(&basic), "{way:?}: {tls}");
    assert!(!plain.contains(&placeholder) && !tls.contains(&placeholder));
    // Another allowed host got neither the value nor the placeholder: the request was refused,
    // and the report names the secret and the host.
    assert_ne!(v["other"], 200, "{way:?}: {v}");
    let other = setup.other.seen().join("\n");
    assert!(
        !other.contains(&placeholder) && !other.contains(&setup.value),
        "{way:?}: {other}"
    );
    let network = serde_json::to_value(&e.network).unwrap();
    let refused = network["refused"].as_array().cloned().unwrap_or_default();
    let reported = |host: &str, says: &str| {
        refused.iter().any(|r| {
            let reason = r["reason"].as_str().unwrap_or("");
            r["host"] == host && reason.contains("API_KEY") && reason.contains(says)
        })
    };
    assert!(
        reported("other.test", "other.test"),
        "{way:?}: {network} {v}"
    );
    assert!(reported("api.test", "plaintext"), "{way:?}: {network} {v}");
    // Nowhere the run can read holds the value: its environment and every process's, its files,
    // its memory. The scan did look (the prefix it was given is in its own memory).
    assert!(v["hits"].as_u64().unwrap() >= 1, "{v}");
    let found: Vec<String> = serde_json::from_value(v["found"].clone()).unwrap();
    assert!(
        !found.contains(&setup.tail_hash()),
        "{way:?}: the value is readable in the run"
    );
    // Nor the envelope, nor anything kept of the run.
    let text = serde_json::to_string(&e).unwrap();
    assert!(!text.contains(&setup.value), "{way:?}: {text}");
    for entry in walk(dir.path()) {
        let bytes = std::fs::read(&entry).unwrap();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(&setup.value),
            "{way:?}: {} holds the value",
            entry.display()
        );
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_one_shot_run_uses_the_secret_without_reading_it() {
    the_value_reaches_its_host_only_and_never_the_run(Way::Fresh).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_cell_uses_the_secret_without_reading_it() {
    the_value_reaches_its_host_only_and_never_the_run(Way::Cell).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forked_run_uses_the_secret_without_reading_it() {
    the_value_reaches_its_host_only_and_never_the_run(Way::Forked).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn each_cell_gets_a_placeholder_of_its_own_and_the_old_one_stops_working() {
    if !enforced() {
        return;
    }
    let setup = Setup::new().await;
    // Plain HTTP (allowed for this secret), so the recorder reads what was sent.
    let engine = setup.engine_with(Way::Fresh, None, true);
    let session = engine.session();
    let first = session
        .run("import os\nos.environ['API_KEY']")
        .await
        .unwrap();
    let code = format!(
        "import os, urllib.request\n\
         def get(key):\n\
         \x20   r = urllib.request.Request('http://api.test:{}/', headers={{'Authorization': 'Bearer ' + key}})\n\
         \x20   return urllib.request.urlopen(r, timeout=20).status\n\
         [os.environ['API_KEY'], get(old), get(os.environ['API_KEY'])]",
        setup.plain.port
    );
    let second = session
        .run(RunRequest::new(code).input("old", first.return_value.clone()))
        .await
        .unwrap();
    assert_eq!(second.status, Status::Success, "{:?}", second.error);
    let old = first.return_value.as_str().unwrap();
    let new = second.return_value[0].as_str().unwrap();
    assert_ne!(old, new);
    let seen = setup.plain.seen();
    // The old placeholder went out as it was (it is no longer the value's stand-in); the new one
    // became the value.
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen[0].contains(&format!("Bearer {old}")), "{seen:?}");
    assert!(
        seen[1].contains(&format!("Bearer {}", setup.value)),
        "{seen:?}"
    );
}

#[test]
fn a_secret_for_a_host_the_policy_refuses_is_a_configuration_error() {
    let err = RunPython::builder()
        .network(Network::Policy(
            NetworkPolicy::allowing(["api.example.com"]).unwrap(),
        ))
        .secret(Secret::new(
            "API_KEY",
            "sk-never-shown",
            vec!["other.example.com".parse().unwrap()],
        ))
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("API_KEY") && err.contains("other.example.com"),
        "{err}"
    );
    assert!(!err.contains("sk-never-shown"), "{err}");
    let err = RunPython::builder()
        .secret(Secret::new(
            "API_KEY",
            "sk-never-shown",
            vec!["api.example.com".parse().unwrap()],
        ))
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("network policy"), "{err}");
    let _ = Value::Null;
}
