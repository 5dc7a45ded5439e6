//! Files in: host bytes and stored artifacts put, read-only, in the run's working directory before
//! the code runs; for one-shot runs, session cells (which keep them) and runs forked from a
//! template; another tenant's id refused like a missing one; names that could climb refused.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

use std::time::Duration;

use runpython_core::{Error, RunPython, RunRequest, Status, Store};
use runpython_tests::ways::forking_pool;
use serde_json::json;

const CSV: &[u8] = b"name,age\nada,36\nalan,41\n";

const READ: &str = r#"import csv, os
rows = list(csv.DictReader(open('people.csv')))
try:
    open('people.csv', 'a').write('x')
    writable = True
except OSError:
    writable = False
[[r['name'] for r in rows], writable, os.path.getsize('people.csv')]"#;

fn engine(store: Option<Store>, forked: bool) -> RunPython {
    let mut builder = RunPython::builder().timeout(Duration::from_secs(30));
    if forked {
        builder = builder.pool(forking_pool());
    }
    if let Some(store) = store {
        builder = builder.store(store);
    }
    builder.build().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn bytes_become_a_read_only_file_in_every_kind_of_run() {
    for forked in [false, true] {
        let python = engine(None, forked);
        let e = python
            .run(RunRequest::new(READ).file("people.csv", CSV))
            .await
            .unwrap();
        assert_eq!(e.status, Status::Success, "{:?}", e.error);
        assert_eq!(e.return_value, json!([["ada", "alan"], false, CSV.len()]));
    }
    // A session's cells see the file a cell was given, and a later cell may replace it.
    let python = engine(None, false);
    let session = python.session();
    session
        .run(RunRequest::new("1").file("people.csv", CSV))
        .await
        .unwrap();
    let e = session.run(READ).await.unwrap();
    assert_eq!(e.return_value, json!([["ada", "alan"], false, CSV.len()]));
    let e = session
        .run(RunRequest::new("open('people.csv').read()").file("people.csv", &b"new"[..]))
        .await
        .unwrap();
    assert_eq!(e.return_value, json!("new"), "{:?}", e.error);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stored_artifact_comes_in_by_id_small_or_large_and_only_for_its_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&format!("file://{}", dir.path().display())).unwrap();
    let alice = engine(Some(store.clone()), false).tenant("alice").unwrap();
    let bob = engine(Some(store), false).tenant("bob").unwrap();
    let small = alice
        .store()
        .unwrap()
        .put_artifact_stream("people.csv", CSV)
        .await
        .unwrap();
    // Larger than a request carries inline: copied in through the host in slices.
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let large = alice
        .store()
        .unwrap()
        .put_artifact_stream("big.bin", &big[..])
        .await
        .unwrap();
    let e = alice
        .run(
            RunRequest::new(
                "import hashlib\n[open('people.csv').read(), hashlib.sha256(open('big.bin','rb').read()).hexdigest()]",
            )
            .file_artifact("people.csv", &small.id)
            .file_artifact("big.bin", &large.id),
        )
        .await
        .unwrap();
    assert_eq!(e.status, Status::Success, "{:?}", e.error);
    assert_eq!(e.return_value[0], json!(String::from_utf8_lossy(CSV)));
    let want = {
        use sha2::Digest as _;
        sha2::Sha256::digest(&big)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    assert_eq!(e.return_value[1], json!(want));
    // Bob's reading of alice's id is the reading of a missing id.
    let foreign = bob
        .run(RunRequest::new("1").file_artifact("people.csv", &small.id))
        .await
        .unwrap_err()
        .to_string();
    let missing = bob
        .run(RunRequest::new("1").file_artifact("people.csv", "0".repeat(64)))
        .await
        .unwrap_err()
        .to_string();
    assert!(foreign.contains("no artifact"), "{foreign}");
    assert_eq!(
        foreign.replace(&small.id, "ID"),
        missing.replace(&"0".repeat(64), "ID")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn names_that_could_leave_the_working_directory_are_refused() {
    let python = engine(None, false);
    for name in ["../x", "a/b", "..", ".", "", "x\0y"] {
        let err = python
            .run(RunRequest::new("1").file(name, &b"x"[..]))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidInput(_)), "{name:?}: {err}");
    }
    let err = python
        .run(
            RunRequest::new("1")
                .file("a", &b"x"[..])
                .file("a", &b"y"[..]),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("twice"), "{err}");
    // A file needs no store; a stored one does, and says so.
    let err = python
        .run(RunRequest::new("1").file_artifact("a", "abc"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no store"), "{err}");
}
