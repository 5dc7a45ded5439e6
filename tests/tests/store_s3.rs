//! The store's conformance suite against a real S3-compatible server (moto, started and stopped by the
//! test on a loopback port), and what happens when that server freezes or dies.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps; helpers outside #[test] too

use std::process::Command;
use std::time::{Duration, Instant};

use runpython_store::conformance::{self, sample_run};
use runpython_store::{Error, Store, StoreOptions};
use runpython_tests::Moto;

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
    let acked = store.put_run(sample_run("acknowledged")).await.unwrap();

    // Fault 1: the server freezes (SIGSTOP). Operations time out with a clear error, no hang.
    let frozen = Store::open_with(&url, impatient()).unwrap();
    signal(moto.child.id(), "STOP").unwrap();
    let started = Instant::now();
    let put = tokio::time::timeout(NO_HANG, frozen.put_run(sample_run("during-fault"))).await;
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
