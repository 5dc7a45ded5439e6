//! Egress through the CLI, against servers on loopback only: HTTPS to a server whose certificate a
//! test CA signed (the run sees the real TLS of the real server: the relay carries bytes), and the
//! host's `HTTPS_PROXY` taking every allowed connection as a `CONNECT` tunnel. The servers come from
//! `tests/egress/servers.py` (the standard library only, so any user's `python3` runs it); the test
//! CA and the server's certificate are made here with rcgen.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_runpython");

/// A server of `servers.py`, killed (by its pid) when dropped.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn python3() -> PathBuf {
    std::env::var_os("RUNPYTHON_PYTHON").map_or_else(|| PathBuf::from("python3"), PathBuf::from)
}

/// A test CA and a certificate it signed for `api.test`, written to `dir` as `ca.pem`, `cert.pem` and
/// `key.pem`; returns the CA's PEM.
fn test_certs(dir: &Path) -> String {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "runpython test CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["api.test".to_owned()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "api.test");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    // Python 3.13's default context checks strictly (VERIFY_X509_STRICT): an authority key id.
    params.use_authority_key_identifier_extension = true;
    let cert = params.signed_by(&key, &issuer).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("cert.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
    ca.pem()
}

fn server(mode: &str, arg: &Path) -> Server {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/egress/servers.py");
    let mut child = Command::new(python3())
        .arg(script)
        .arg(mode)
        .arg(arg)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{mode}: {line:?}"));
    Server { child, port }
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Value {
    let out = Command::new(BIN)
        .args(["run", "--json", "--no-store"])
        .args(args)
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .env_remove("ALL_PROXY")
        .env_remove("NO_PROXY")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "not an envelope: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Whether this host enforces network policies (else the run's network is off and says why).
fn enforced() -> bool {
    let out = Command::new(BIN)
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let doctor: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ok = doctor["kernel"]["network_policy"] == "ok";
    if !ok {
        println!("skipped: {}", doctor["kernel"]["network_policy"]);
    }
    ok
}

const FETCH: &str = "import ssl, urllib.request\n\
ctx = ssl.create_default_context(cadata=ca)\n\
urllib.request.urlopen(url, context=ctx, timeout=20).read().decode()";

#[test]
fn https_reaches_an_allowed_server_end_to_end_and_only_it() {
    if !enforced() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = test_certs(dir.path());
    let tls = server("https", dir.path());
    let inputs = [
        "--input".to_owned(),
        format!("ca={}", serde_json::to_string(&ca).unwrap()),
        "--input".to_owned(),
        format!("url=\"https://api.test:{}/hello\"", tls.port),
    ];
    let mut args: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let allow = format!("api.test:{}", tls.port);
    args.extend([
        "--resolve",
        "api.test=127.0.0.1",
        "--allow-host",
        &allow,
        "-c",
        FETCH,
    ]);
    let e = run(&args, &[]);
    assert_eq!(e["return_value"], "hello over tls", "{e}");
    assert_eq!(e["network"]["connections"], 1, "{e}");
    let seen = std::fs::read_to_string(dir.path().join("seen")).unwrap();
    assert_eq!(seen.lines().collect::<Vec<_>>(), ["/hello"]);

    // The public internet is not that server, however it is named.
    let mut public: Vec<&str> = inputs.iter().map(String::as_str).collect();
    public.extend([
        "--resolve",
        "api.test=127.0.0.1",
        "--allow-network",
        "-c",
        FETCH,
    ]);
    let e = run(&public, &[]);
    assert_eq!(e["status"], "error", "{e}");
    let seen = std::fs::read_to_string(dir.path().join("seen")).unwrap();
    assert_eq!(seen.lines().count(), 1, "{seen}");
}

#[test]
fn the_hosts_https_proxy_carries_every_allowed_connection() {
    if !enforced() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = test_certs(dir.path());
    let tls = server("https", dir.path());
    let log = dir.path().join("proxy.log");
    let proxy = server("proxy", &log);
    let ca_input = format!("ca={}", serde_json::to_string(&ca).unwrap());
    let url_input = format!("url=\"https://api.test:{}/through-the-proxy\"", tls.port);
    let allow = format!("api.test:{}", tls.port);
    let proxy_url = format!("http://127.0.0.1:{}", proxy.port);
    let e = run(
        &[
            "--input",
            &ca_input,
            "--input",
            &url_input,
            "--resolve",
            "api.test=127.0.0.1",
            "--allow-host",
            &allow,
            "-c",
            FETCH,
        ],
        &[("HTTPS_PROXY", &proxy_url)],
    );
    assert_eq!(e["return_value"], "hello over tls", "{e}");
    // The tunnel names the address the policy decided on (a proxy resolving a name again could
    // reach what nobody decided).
    let connects = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        connects.lines().collect::<Vec<_>>(),
        [format!("CONNECT 127.0.0.1:{} HTTP/1.1", tls.port)],
        "{connects}"
    );
    let seen = std::fs::read_to_string(dir.path().join("seen")).unwrap();
    assert!(seen.contains("/through-the-proxy"), "{seen}");
}

#[test]
fn a_secret_goes_to_its_host_over_https_and_the_code_holds_a_placeholder() {
    if !enforced() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    test_certs(dir.path());
    let tls = server("https", dir.path());
    let ca_file = dir.path().join("ca.pem");
    let value = "sk-cli-2f6a0c9e41b7d853aa10c2e4f9b6d7e8";
    let url_input = format!("url=\"https://api.test:{}/with-secret\"", tls.port);
    let allow = format!("api.test:{}", tls.port);
    // The code trusts the default roots: the run's bundle (the host's roots and the run's CA).
    let code = "import os, urllib.request\n\
        r = urllib.request.Request(url, headers={'Authorization': 'Bearer ' + os.environ['API_KEY']})\n\
        [os.environ['API_KEY'], urllib.request.urlopen(r, timeout=20).read().decode()]";
    let args = [
        "--input",
        &url_input,
        "--resolve",
        "api.test=127.0.0.1",
        "--allow-host",
        &allow,
        "--secret",
        "API_KEY=RUNPYTHON_TEST_KEY:api.test",
        "--upstream-ca",
        ca_file.to_str().unwrap(),
        "-c",
        code,
    ];
    let out = Command::new(BIN)
        .args(["run", "--json", "--no-store"])
        .args(args)
        .env("RUNPYTHON_TEST_KEY", value)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stdout.contains(value) && !stderr.contains(value),
        "{stdout}\n{stderr}"
    );
    let e: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(e["return_value"][1], "hello over tls", "{e}");
    let placeholder = e["return_value"][0].as_str().unwrap();
    assert_ne!(placeholder, value);
    let seen = std::fs::read_to_string(dir.path().join("seen")).unwrap();
    assert_eq!(
        seen.lines().collect::<Vec<_>>(),
        [format!("/with-secret Bearer {value}")],
        "{seen}"
    );

    // Configuration errors, before any run: an unset variable, a host the policy refuses.
    for (secret, env, says) in [
        ("API_KEY:api.test", None, "no API_KEY"),
        (
            "API_KEY=RUNPYTHON_TEST_KEY:other.test",
            Some(value),
            "other.test",
        ),
    ] {
        let mut cmd = Command::new(BIN);
        cmd.args(["run", "--json", "--no-store", "--allow-host", &allow])
            .args(["--secret", secret, "-c", "1"])
            .env_remove("API_KEY");
        if let Some(v) = env {
            cmd.env("RUNPYTHON_TEST_KEY", v);
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{secret}: {stderr}");
        assert!(stderr.contains(says), "{secret}: {stderr}");
        assert!(!stderr.contains(value), "{stderr}");
    }
    // Plain HTTP is the operator's choice per declared secret.
    let out = Command::new(BIN)
        .args(["run", "--json", "--no-store", "--allow-host", &allow])
        .args(["--secret", "API_KEY=RUNPYTHON_TEST_KEY:api.test"])
        .args(["--secret-over-http", "OTHER_KEY", "-c", "1"])
        .env("RUNPYTHON_TEST_KEY", value)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--secret-over-http OTHER_KEY: no --secret OTHER_KEY:HOSTS declares it"),
        "{stderr}"
    );
}

#[test]
fn mcp_takes_the_operators_secrets_and_the_model_gets_placeholders() {
    if !enforced() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    test_certs(dir.path());
    let tls = server("https", dir.path());
    let ca_file = dir.path().join("ca.pem");
    let value = "sk-mcp-9d1c44e0b7a25f68c3e1d0a9b8f7e6d5";
    let allow = format!("api.test:{}", tls.port);
    let code = format!(
        "import os, urllib.request\n\
         r = urllib.request.Request('https://api.test:{}/via-mcp', headers={{'Authorization': 'Bearer ' + os.environ['API_KEY']}})\n\
         [os.environ['API_KEY'][:3], urllib.request.urlopen(r, timeout=20).read().decode()]",
        tls.port
    );
    let (reply, line) = common::mcp_call(
        &[
            "--no-store",
            "--resolve",
            "api.test=127.0.0.1",
            "--allow-host",
            &allow,
            "--secret",
            "API_KEY=RUNPYTHON_TEST_KEY:api.test",
            "--upstream-ca",
            ca_file.to_str().unwrap(),
        ],
        &[("RUNPYTHON_TEST_KEY", value)],
        json!({"code": code}),
    );
    assert!(!line.contains(value), "{line}");
    let text = reply.to_string();
    assert!(
        text.contains("hello over tls") && text.contains("rp_"),
        "{text}"
    );
    let seen = std::fs::read_to_string(dir.path().join("seen")).unwrap();
    assert_eq!(
        seen.lines().collect::<Vec<_>>(),
        [format!("/via-mcp Bearer {value}")],
        "{seen}"
    );
}
