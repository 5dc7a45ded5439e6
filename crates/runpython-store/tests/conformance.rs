//! The conformance suite against every backend: memory, a local directory, and a real S3-compatible
//! server (moto, started and stopped by the test on a loopback port).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use runpython_store::{conformance, Error, RunFile, RunRecord, Store, StoreOptions, Tier};

fn run(run_id: &str) -> RunRecord {
    RunRecord {
        run_id: run_id.into(),
        created_at: SystemTime::now(),
        tier: Tier::Persistent,
        script: format!("'{run_id}'"),
        stdout: format!("out {run_id}\n"),
        stderr: "warning\n".into(),
        return_value_json: format!("\"{run_id}\""),
        deps: vec![],
        env_fingerprint: "fp".into(),
        isolation_json: "{}".into(),
        files: vec![RunFile {
            name: "f.bin".into(),
            bytes: vec![0, 1, 2, 3],
        }],
        skipped_files: vec![],
    }
}

#[tokio::test]
async fn memory_store_passes_the_conformance_suite() {
    let store = Store::open("memory://").unwrap();
    conformance::run_all(&store).await.unwrap();
}

#[tokio::test]
async fn local_store_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let url = url_of(&dir.path().join("store"));
    let store = Store::open(&url).unwrap();
    conformance::run_all(&store).await.unwrap();
}

#[tokio::test]
async fn local_store_keeps_acknowledged_runs_across_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let url = url_of(dir.path());
    let put = Store::open(&url)
        .unwrap()
        .put_run(run("kept"))
        .await
        .unwrap();
    let reopened = Store::open(&url).unwrap();
    assert_eq!(reopened.get_run("kept").await.unwrap(), put);
    for a in &put.artifacts {
        reopened.get_run_artifact(&a.id).await.unwrap();
    }
}

#[tokio::test]
async fn local_store_ignores_the_staging_file_of_a_writer_killed_mid_write() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&url_of(dir.path())).unwrap();
    let put = store.put_run(run("whole")).await.unwrap();
    // What a host killed mid-write leaves: the old object intact, and a torn `<key>#<n>` staging file
    // (object_store's LocalFileSystem writes there, then renames into place).
    std::fs::write(dir.path().join("v1/runs/whole#1"), b"RPST\x01\x01torn").unwrap();
    std::fs::write(dir.path().join("v1/runs/other#1"), b"RPST\x01\x01torn").unwrap();
    assert_eq!(store.get_run("whole").await.unwrap(), put);
    let ids: Vec<_> = store
        .list_runs()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.run_id)
        .collect();
    assert_eq!(ids, ["whole"]);
    assert!(matches!(
        store.get_run("other").await,
        Err(Error::NotFound { .. })
    ));
}

#[tokio::test]
async fn local_store_reports_a_record_from_a_newer_version_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&url_of(dir.path())).unwrap();
    store.put_run(run("future")).await.unwrap();
    let path = dir.path().join("v1/runs/future");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[5] = 2; // the version byte
    std::fs::write(&path, bytes).unwrap();
    let err = store.get_run("future").await.unwrap_err();
    assert!(
        matches!(err, Error::UnsupportedVersion { version: 2, .. }),
        "{err}"
    );
    // gc must not delete blobs whose references it cannot read.
    let later = SystemTime::now() + Duration::from_secs(86_400 * 365);
    let report = store.gc(later).await.unwrap();
    assert_eq!(report.deleted_blobs, 0, "{report:?}");
    assert_eq!(report.unreadable, ["v1/runs/future"]);
}

fn url_of(dir: &std::path::Path) -> String {
    std::fs::create_dir_all(dir).expect("create the store directory");
    format!("file://{}", dir.display())
}

// ---- S3 through moto ----

/// A moto server this test started; killed (by pid) and reaped on drop.
struct Moto {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Moto {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // A frozen process still dies of SIGKILL; CONT only lets it go quietly if it was stopped.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Moto {
    /// `Ok(None)` when moto is not installed and this is not CI.
    fn start() -> Result<Option<Self>, String> {
        let Some(bin) = find_moto() else {
            let reason = "moto_server not found in $RUNPYTHON_TOOLS_BIN or on PATH \
                          (install with: pip install 'moto[server]')";
            if std::env::var_os("CI").is_some() {
                return Err(format!("{reason}; CI must provide it"));
            }
            println!("skipped: {reason}");
            return Ok(None);
        };
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free loopback port: {e}"))?
            .port();
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let log = dir.path().join("moto.log");
        let out = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(&bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let mut moto = Self {
            child,
            port,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = moto.child.try_wait() {
                return Err(format!(
                    "moto_server exited with {status}: {}",
                    moto.log_tail()
                ));
            }
            if moto
                .http("GET", "/")
                .is_ok_and(|r| r.starts_with("HTTP/1.1 200") || r.starts_with("HTTP/1.0 200"))
            {
                return Ok(Some(moto));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "moto_server did not answer within 60 s: {}",
                    moto.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A bare HTTP/1.1 request (moto accepts unsigned requests); returns the status line and headers.
    fn http(&self, method: &str, path: &str) -> std::io::Result<String> {
        let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )?;
        let mut response = String::new();
        s.read_to_string(&mut response)?;
        Ok(response)
    }

    fn create_bucket(&self, bucket: &str) -> Result<(), String> {
        let r = self
            .http("PUT", &format!("/{bucket}"))
            .map_err(|e| format!("PUT /{bucket}: {e}"))?;
        if r.contains(" 200 ") {
            Ok(())
        } else {
            Err(format!(
                "PUT /{bucket} answered: {}",
                r.lines().next().unwrap_or("")
            ))
        }
    }

    fn url(&self, bucket: &str, prefix: &str) -> String {
        format!(
            "s3://{bucket}/{prefix}?endpoint=http://127.0.0.1:{}&region=us-east-1&allow_http=true\
             &access_key_id=testing&secret_access_key=testing",
            self.port
        )
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<_> = log.lines().rev().take(20).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}

fn find_moto() -> Option<PathBuf> {
    let from_tools =
        std::env::var_os("RUNPYTHON_TOOLS_BIN").map(|d| PathBuf::from(d).join("moto_server"));
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("moto_server"));
    from_tools.into_iter().chain(on_path).find(|p| p.is_file())
}

/// `kill -<sig> <pid>` for the one process this test started.
fn signal(pid: u32, sig: &str) -> std::io::Result<()> {
    let status = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "kill -{sig} {pid}: {status}"
        )))
    }
}

/// Bounded request settings, so a dead or frozen server turns into an error within seconds.
fn impatient() -> StoreOptions {
    StoreOptions {
        request_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(1),
        max_retries: 1,
        retry_timeout: Duration::from_secs(3),
        ..StoreOptions::default()
    }
}

/// The longest any failing operation may take with [`impatient`] settings before it counts as a hang.
const NO_HANG: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_store_passes_the_conformance_suite_and_fails_clearly_when_the_server_stops() {
    let moto = match Moto::start() {
        Ok(Some(m)) => m,
        Ok(None) => return,
        Err(e) => panic!("{e}"),
    };
    moto.create_bucket("runpython-test").unwrap();
    let url = moto.url("runpython-test", "conformance");
    let store = Store::open(&url).unwrap();
    conformance::run_all(&store).await.unwrap();

    // Something acknowledged before the fault.
    let acked = store.put_run(run("acknowledged")).await.unwrap();

    // Fault 1: the server freezes (SIGSTOP). Operations time out with a clear error, no hang.
    let frozen = Store::open_with(&url, impatient()).unwrap();
    signal(moto.child.id(), "STOP").unwrap();
    let started = Instant::now();
    let put = tokio::time::timeout(NO_HANG, frozen.put_run(run("during-fault"))).await;
    let get = tokio::time::timeout(NO_HANG, frozen.get_run("acknowledged")).await;
    signal(moto.child.id(), "CONT").unwrap();
    let put = put.expect("put_run hung on a frozen server");
    let get = get.expect("get_run hung on a frozen server");
    for (what, err) in [
        ("put_run", put.map(drop).unwrap_err()),
        ("get_run", get.map(drop).unwrap_err()),
    ] {
        // A timeout must never read as "not found".
        assert!(matches!(err, Error::Backend { .. }), "{what}: {err}");
        let msg = err.to_string();
        println!("{what} on a frozen server: {msg}");
        assert!(
            msg.contains("s3://runpython-test/conformance") && msg.contains("v1/"),
            "{what} error lacks store or key: {msg}"
        );
        assert!(
            !msg.contains("testing"),
            "{what} error shows credentials: {msg}"
        );
    }
    println!("frozen-server errors arrived after {:?}", started.elapsed());

    // Nothing acknowledged was lost: once the server resumes, the earlier run reads back whole.
    let back = store.get_run("acknowledged").await.unwrap();
    assert_eq!(back, acked);
    for a in &acked.artifacts {
        store.get_run_artifact(&a.id).await.unwrap();
    }

    // Fault 2: the server dies. Connections are refused; errors are quick and clear.
    let mut moto = moto;
    moto.child.kill().unwrap();
    moto.child.wait().unwrap();
    let err = tokio::time::timeout(NO_HANG, frozen.get_run("acknowledged"))
        .await
        .expect("get_run hung on a dead server")
        .unwrap_err();
    assert!(matches!(err, Error::Backend { .. }), "{err}");
    let err = tokio::time::timeout(NO_HANG, frozen.put_blob(b"x".to_vec()))
        .await
        .expect("put_blob hung on a dead server")
        .unwrap_err();
    assert!(err.to_string().contains("put `v1/blobs/"), "{err}");
}
