//! The conformance suite against the memory and local-directory backends, and local fault cases. The S3
//! run (against moto) lives in the workspace's `tests/tests/store_s3.rs`, beside the moto launcher the
//! benchmarks share.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::TryStreamExt;
use runpython_store::conformance::{self, sample_run};
use runpython_store::object_store::{memory::InMemory, prefix::PrefixStore, ObjectStore};
use runpython_store::{Error, Store, StoreOptions};

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
        .put_run(sample_run("kept"))
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
    let put = store.put_run(sample_run("whole")).await.unwrap();
    // What a host killed mid-write leaves: the old object intact, and a torn `<key>#<n>` staging file
    // (object_store's LocalFileSystem writes there, then renames into place).
    std::fs::write(dir.path().join("v1/runs/whole#1"), b"RPST\x01\x01torn").unwrap();
    std::fs::write(dir.path().join("v1/runs/other#1"), b"RPST\x01\x01torn").unwrap();
    assert_eq!(store.get_run("whole").await.unwrap(), put);
    let ids: Vec<_> = store
        .list_runs()
        .await
        .unwrap()
        .items
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
    store.put_run(sample_run("future")).await.unwrap();
    let path = dir.path().join("v1/runs/future");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[5] = 3; // the version byte: newer than this build writes
    std::fs::write(&path, bytes).unwrap();
    let err = store.get_run("future").await.unwrap_err();
    assert!(
        matches!(err, Error::UnsupportedVersion { version: 3, .. }),
        "{err}"
    );
    // gc must not delete blobs whose references it cannot read.
    let later = SystemTime::now() + Duration::from_secs(86_400 * 365);
    let report = store.gc(later).await.unwrap();
    assert_eq!(report.deleted_blobs, 0, "{report:?}");
    assert_eq!(report.unreadable, ["v1/runs/future"]);
}

/// An integrator's own backend: here one shared object store, a prefix per tenant.
#[tokio::test]
async fn a_backend_built_by_the_caller_passes_the_suite_and_prefixes_keep_tenants_apart() {
    let shared = Arc::new(InMemory::new());
    let tenant = |name: &str| {
        let prefixed = PrefixStore::new(Arc::clone(&shared), format!("tenants/{name}"));
        Store::with_backend(
            format!("shared memory, tenant {name}"),
            Arc::new(prefixed),
            StoreOptions::default(),
        )
    };
    let (a, b) = (tenant("a"), tenant("b"));
    conformance::run_all(&a).await.unwrap();
    a.put_run(sample_run("only-a")).await.unwrap();

    let err = b.get_run("only-a").await.unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("shared memory, tenant b"), "{err}");
    assert!(b.list_runs().await.unwrap().items.is_empty());
    let keys: Vec<String> = shared
        .list(None)
        .map_ok(|meta| meta.location.to_string())
        .try_collect()
        .await
        .unwrap();
    assert!(
        keys.iter().any(|k| k == "tenants/a/v1/runs/only-a"),
        "{keys:?}"
    );
    assert!(
        keys.iter().all(|k| k.starts_with("tenants/a/v1/")),
        "{keys:?}"
    );
}

#[tokio::test]
async fn listings_skip_and_name_a_manifest_they_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&url_of(dir.path())).unwrap();
    store.put_run(sample_run("readable")).await.unwrap();
    store.put_run(sample_run("future")).await.unwrap();
    let path = dir.path().join("v1/runs/future");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[5] = 3; // the version byte: newer than this build writes
    std::fs::write(&path, bytes).unwrap();
    std::fs::write(dir.path().join("v1/runs/garbage"), b"not a record").unwrap();

    let runs = store.list_runs().await.unwrap();
    let ids: Vec<_> = runs.items.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(ids, ["readable"]);
    assert_eq!(runs.unreadable, ["v1/runs/future", "v1/runs/garbage"]);
    let artifacts = store.list_artifacts(None).await.unwrap();
    assert!(!artifacts.items.is_empty());
    assert!(artifacts.items.iter().all(|a| a.run_id == "readable"));
    assert_eq!(artifacts.unreadable, runs.unreadable);
    // Asked for by name, the unreadable run is still an error that says why.
    let err = store.list_artifacts(Some("future")).await.unwrap_err();
    assert!(matches!(err, Error::UnsupportedVersion { .. }), "{err}");
}

fn url_of(dir: &std::path::Path) -> String {
    std::fs::create_dir_all(dir).expect("create the store directory");
    format!("file://{}", dir.display())
}
