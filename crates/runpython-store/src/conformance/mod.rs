//! The conformance suite: the behaviour every backend must show, run by the integration tests against
//! memory, a local directory and a real S3-compatible server.
//!
//! Each check takes a [`Store`], uses fresh ids so checks may share one store, and returns a message
//! naming what broke. [`run_all`] runs them in order. Checks that move time forward call
//! [`Store::gc`] with a future `now`, which can also collect other checks' ephemeral runs; run them
//! on a store no one else is using.
//!
//! Blobs and runs are checked here; memo entries, checkpoints, sessions and tenants in `state`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::TryStreamExt;

use crate::{
    memo_key, ArtifactKind, Computed, Error, RunFile, RunRecord, SkippedFile, Store, Tier,
};

mod state;

pub use state::{
    checkpoints_are_listed_with_their_run_and_time, memo_round_trip_and_expiry,
    memoized_computes_once_for_concurrent_callers, memoized_errors_are_shared_and_not_cached,
    memoized_results_not_kept_are_computed_again,
    session_records_and_parts_round_trip_and_are_deleted_together,
    session_snapshots_replace_whole_and_go_with_their_session, tenants_see_only_their_own,
};

type Check = Result<(), String>;

fn ensure(cond: bool, what: impl FnOnce() -> String) -> Check {
    if cond {
        Ok(())
    } else {
        Err(what())
    }
}

fn fail(context: &str) -> impl FnOnce(Error) -> String + '_ {
    move |e| format!("{context}: {e}")
}

/// A name no other check or earlier run of this suite uses.
fn unique(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let mut random = [0u8; 6];
    let _ = getrandom::fill(&mut random);
    let tail: String = random.iter().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}-{}-{tail}", N.fetch_add(1, Ordering::Relaxed))
}

fn record(run_id: &str, tier: Tier, created_at: SystemTime) -> RunRecord {
    RunRecord {
        run_id: run_id.to_owned(),
        created_at,
        tier,
        script: format!("print('hello from {run_id}')\n21 * 2"),
        stdout: format!("hello from {run_id}\n"),
        stderr: String::new(),
        return_value_json: "42".into(),
        deps: vec!["numpy==2.1.0".into()],
        env_fingerprint: "cpython-3.12.3-linux-x86_64".into(),
        isolation_json: r#"{"pid_namespace":true}"#.into(),
        files: vec![
            RunFile {
                name: "out/data.csv".into(),
                bytes: format!("a,b\n1,{run_id}\n").into_bytes(),
            },
            RunFile {
                name: "plot.png".into(),
                bytes: b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec(),
            },
        ],
        skipped_files: vec![SkippedFile {
            name: "link".into(),
            reason: "symlink (never followed)".into(),
        }],
        skipped_counts: [("symlink (never followed)".to_owned(), 1)].into(),
        stored: Vec::new(),
    }
}

/// A persistent run created now, with a script, output, a value, two files and a skipped one: the
/// fixture of the fault cases that sit beside each backend's run of this suite.
pub fn sample_run(run_id: &str) -> RunRecord {
    record(run_id, Tier::Persistent, SystemTime::now())
}

/// Runs every check, stopping at the first failure.
pub async fn run_all(store: &Store) -> Check {
    macro_rules! checks {
        ($($name:ident),* $(,)?) => {
            $( $name(store).await.map_err(|e| format!("{} on {}: {e}", stringify!($name), store.url()))?; )*
        };
    }
    checks!(
        blob_round_trip,
        streamed_blob_round_trip,
        aborted_streamed_upload_leaves_nothing_visible,
        missing_things_are_not_found,
        run_round_trip,
        expired_run_is_not_found_before_gc,
        delete_run_hides_the_run_and_gc_frees_its_blobs,
        gc_expires_ephemeral_runs_and_keeps_persistent_ones,
        gc_spares_young_unreferenced_blobs,
        memo_round_trip_and_expiry,
        memoized_computes_once_for_concurrent_callers,
        memoized_results_not_kept_are_computed_again,
        memoized_errors_are_shared_and_not_cached,
        checkpoints_are_listed_with_their_run_and_time,
        session_records_and_parts_round_trip_and_are_deleted_together,
        session_snapshots_replace_whole_and_go_with_their_session,
        tenants_see_only_their_own,
    );
    Ok(())
}

/// Blobs come back byte for byte under their blake3 hash; equal content shares one id.
pub async fn blob_round_trip(store: &Store) -> Check {
    let content = unique("blob").into_bytes();
    let id = store
        .put_blob(content.clone())
        .await
        .map_err(fail("put_blob"))?;
    ensure(id == blake3::hash(&content).to_hex().as_str(), || {
        format!("id {id} is not the blake3 hash")
    })?;
    let again = store
        .put_blob(content.clone())
        .await
        .map_err(fail("put_blob again"))?;
    ensure(again == id, || "equal content got another id".into())?;
    let got = store.get_run_artifact(&id).await.map_err(fail("get"))?;
    ensure(got[..] == content[..], || "bytes differ".into())?;
    let empty = store
        .put_blob(Vec::new())
        .await
        .map_err(fail("put empty"))?;
    let got = store
        .get_run_artifact(&empty)
        .await
        .map_err(fail("get empty"))?;
    ensure(got.is_empty(), || "empty blob came back non-empty".into())
}

/// A blob larger than one upload part streams in (multipart) and out intact.
pub async fn streamed_blob_round_trip(store: &Store) -> Check {
    let size = store.inner.options.upload_part_bytes + 1024 * 1024 + 7;
    let seed = unique("stream");
    let data: Vec<u8> = seed.bytes().cycle().take(size).collect();
    let (id, len) = store
        .put_blob_reader(&data[..])
        .await
        .map_err(fail("put_blob_reader"))?;
    ensure(len == size as u64, || format!("size {len}, wrote {size}"))?;
    ensure(id == blake3::hash(&data).to_hex().as_str(), || {
        "streamed id is not the blake3 hash".into()
    })?;
    let chunks: Vec<bytes::Bytes> = store
        .get_run_artifact_stream(&id)
        .await
        .map_err(fail("get stream"))?
        .try_collect()
        .await
        .map_err(fail("read stream"))?;
    let back: Vec<u8> = chunks.concat();
    ensure(back == data, || {
        format!("{} bytes came back, differing", back.len())
    })?;
    let staged = store
        .list(&store.layout().stagings())
        .await
        .map_err(fail("list staging"))?;
    ensure(staged.is_empty(), || {
        format!("staging objects left: {staged:?}")
    })
}

/// A source that fails after more than one part leaves no blob and no visible staging object.
pub async fn aborted_streamed_upload_leaves_nothing_visible(store: &Store) -> Check {
    let part = store.inner.options.upload_part_bytes;
    let head: Vec<u8> = unique("abort").bytes().cycle().take(part + 4096).collect();
    let failing = tokio::io::AsyncReadExt::chain(&head[..], FailingReader);
    match store.put_blob_reader(failing).await {
        Err(Error::Source { .. }) => {}
        other => return Err(format!("expected a Source error, got {other:?}")),
    }
    let id = blake3::hash(&head).to_hex().to_string();
    match store.get_run_artifact(&id).await {
        Err(Error::NotFound { .. }) => {}
        other => return Err(format!("partial upload visible as a blob: {other:?}")),
    }
    let staged = store
        .list(&store.layout().stagings())
        .await
        .map_err(fail("list staging"))?;
    ensure(staged.is_empty(), || {
        format!("aborted upload visible: {staged:?}")
    })
}

pub(super) struct FailingReader;

impl tokio::io::AsyncRead for FailingReader {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        _: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Err(std::io::Error::other("source died mid-upload")))
    }
}

/// Unknown runs and artifacts are `NotFound`; unsafe ids are `InvalidId`, never a path.
pub async fn missing_things_are_not_found(store: &Store) -> Check {
    let id = unique("missing");
    match store.get_run(&id).await {
        Err(e @ Error::NotFound { .. }) => ensure(e.to_string().contains(&id), || {
            format!("message lacks the id: {e}")
        })?,
        other => return Err(format!("get_run of a missing run: {other:?}")),
    }
    let hash = blake3::hash(id.as_bytes()).to_hex().to_string();
    match store.get_run_artifact(&hash).await {
        Err(Error::NotFound { .. }) => {}
        other => return Err(format!("get_run_artifact of a missing blob: {other:?}")),
    }
    for bad in ["../v1/runs/x", "a/b", ""] {
        match store.get_run(bad).await {
            Err(Error::InvalidId { .. }) => {}
            other => return Err(format!("get_run({bad:?}): {other:?}")),
        }
    }
    match store.get_run_artifact("../../etc/passwd").await {
        Err(Error::InvalidId { .. }) => Ok(()),
        other => Err(format!("get_run_artifact of a path: {other:?}")),
    }
}

/// A kept run comes back whole: metadata, artifacts by kind with previews, bytes by id, listings.
pub async fn run_round_trip(store: &Store) -> Check {
    let run_id = unique("run");
    let rec = record(&run_id, Tier::ephemeral(), SystemTime::now());
    let put = store.put_run(rec.clone()).await.map_err(fail("put_run"))?;
    let got = store.get_run(&run_id).await.map_err(fail("get_run"))?;
    ensure(put == got, || format!("put {put:?}\nget {got:?}"))?;
    ensure(
        got.deps == rec.deps && got.env_fingerprint == rec.env_fingerprint,
        || "deps or fingerprint lost".into(),
    )?;
    ensure(got.isolation_json == rec.isolation_json, || {
        "isolation lost".into()
    })?;
    ensure(
        got.skipped_files == rec.skipped_files && got.skipped_counts == rec.skipped_counts,
        || "skipped files lost".into(),
    )?;
    ensure(
        got.tier == Tier::ephemeral() && got.expires_at.is_some(),
        || format!("tier {:?} expires {:?}", got.tier, got.expires_at),
    )?;
    let kinds: Vec<_> = got
        .artifacts
        .iter()
        .map(|a| (a.kind, a.name.as_str()))
        .collect();
    let want = [
        (ArtifactKind::Script, "script.py"),
        (ArtifactKind::Stdout, "stdout.txt"),
        (ArtifactKind::ReturnValue, "return_value.json"),
        (ArtifactKind::File, "out/data.csv"),
        (ArtifactKind::File, "plot.png"),
    ];
    ensure(kinds == want, || format!("artifacts {kinds:?}"))?;
    let expected: [&[u8]; 5] = [
        rec.script.as_bytes(),
        rec.stdout.as_bytes(),
        b"42",
        &rec.files[0].bytes,
        &rec.files[1].bytes,
    ];
    for (a, want) in got.artifacts.iter().zip(expected) {
        let bytes = store
            .get_run_artifact(&a.id)
            .await
            .map_err(fail("get artifact"))?;
        ensure(&bytes[..] == want && a.bytes == want.len() as u64, || {
            format!("artifact {} bytes differ", a.name)
        })?;
    }
    let stdout = got.artifact(ArtifactKind::Stdout).ok_or("no stdout")?;
    ensure(stdout.preview == rec.stdout, || {
        format!("preview {:?}", stdout.preview)
    })?;
    let png = &got.artifacts[4];
    ensure(png.preview.contains("image/png"), || {
        format!("png preview {:?}", png.preview)
    })?;

    let listed = store
        .list_artifacts(Some(&run_id))
        .await
        .map_err(fail("list one"))?;
    ensure(
        listed.items.len() == 5 && listed.items.iter().all(|l| l.run_id == run_id),
        || format!("list_artifacts(Some): {listed:?}"),
    )?;
    let all = store.list_artifacts(None).await.map_err(fail("list all"))?;
    ensure(
        all.items.iter().filter(|l| l.run_id == run_id).count() == 5,
        || "list_artifacts(None) lacks the run".into(),
    )?;
    let runs = store.list_runs().await.map_err(fail("list_runs"))?;
    ensure(runs.items.iter().any(|r| r.run_id == run_id), || {
        "list_runs lacks the run".into()
    })
}

/// An ephemeral run past its lifetime is gone for readers even before gc runs.
pub async fn expired_run_is_not_found_before_gc(store: &Store) -> Check {
    let run_id = unique("stale");
    let two_hours_ago = SystemTime::now() - Duration::from_secs(7200);
    let rec = record(
        &run_id,
        Tier::Ephemeral {
            ttl: Duration::from_secs(3600),
        },
        two_hours_ago,
    );
    store.put_run(rec).await.map_err(fail("put_run"))?;
    match store.get_run(&run_id).await {
        Err(Error::NotFound { .. }) => {}
        other => return Err(format!("expired run readable: {other:?}")),
    }
    let runs = store.list_runs().await.map_err(fail("list_runs"))?;
    ensure(runs.items.iter().all(|r| r.run_id != run_id), || {
        "expired run listed".into()
    })
}

/// `delete_run` hides the run at once; gc then frees the blobs only it referenced.
pub async fn delete_run_hides_the_run_and_gc_frees_its_blobs(store: &Store) -> Check {
    let run_id = unique("deleted");
    let manifest = store
        .put_run(record(&run_id, Tier::Persistent, SystemTime::now()))
        .await
        .map_err(fail("put_run"))?;
    store
        .delete_run(&run_id)
        .await
        .map_err(fail("delete_run"))?;
    store
        .delete_run(&run_id)
        .await
        .map_err(fail("delete_run twice"))?;
    match store.get_run(&run_id).await {
        Err(Error::NotFound { .. }) => {}
        other => return Err(format!("deleted run readable: {other:?}")),
    }
    let later = SystemTime::now() + store.inner.options.gc_grace + Duration::from_secs(60);
    let report = store.gc(later).await.map_err(fail("gc"))?;
    ensure(report.deleted_blobs >= 1 && report.freed_bytes > 0, || {
        format!("gc freed nothing: {report:?}")
    })?;
    let stdout = manifest.artifact(ArtifactKind::Stdout).ok_or("no stdout")?;
    match store.get_run_artifact(&stdout.id).await {
        Err(Error::NotFound { .. }) => Ok(()),
        other => Err(format!("blob of a deleted run survived gc: {other:?}")),
    }
}

/// gc removes expired ephemeral runs and their own blobs, and keeps persistent runs whole, including
/// blobs they share with expired runs.
pub async fn gc_expires_ephemeral_runs_and_keeps_persistent_ones(store: &Store) -> Check {
    let now = SystemTime::now();
    let shared_script = unique("shared script");
    let eph_id = unique("ephemeral");
    let per_id = unique("persistent");
    let mut eph = record(
        &eph_id,
        Tier::Ephemeral {
            ttl: Duration::from_secs(3600),
        },
        now,
    );
    eph.script = shared_script.clone();
    let mut per = record(&per_id, Tier::Persistent, now);
    per.script = shared_script;
    let eph = store.put_run(eph).await.map_err(fail("put ephemeral"))?;
    let per = store.put_run(per).await.map_err(fail("put persistent"))?;

    let report = store.gc(now).await.map_err(fail("gc now"))?;
    ensure(!report.expired_runs.contains(&eph_id), || {
        format!("gc expired a live run: {report:?}")
    })?;
    store
        .get_run(&eph_id)
        .await
        .map_err(fail("ephemeral after gc(now)"))?;

    let later =
        now + Duration::from_secs(3600) + store.inner.options.gc_grace + Duration::from_secs(1);
    let report = store.gc(later).await.map_err(fail("gc later"))?;
    ensure(report.expired_runs.contains(&eph_id), || {
        format!("not expired: {report:?}")
    })?;
    ensure(!report.expired_runs.contains(&per_id), || {
        "persistent run expired".into()
    })?;
    let again = store
        .get_run(&per_id)
        .await
        .map_err(fail("persistent after gc"))?;
    ensure(again == per, || "persistent manifest changed".into())?;
    for a in &per.artifacts {
        store
            .get_run_artifact(&a.id)
            .await
            .map_err(fail("persistent artifact after gc"))?;
    }
    let eph_stdout = eph.artifact(ArtifactKind::Stdout).ok_or("no stdout")?;
    match store.get_run_artifact(&eph_stdout.id).await {
        Err(Error::NotFound { .. }) => {}
        other => return Err(format!("expired run's own blob survived: {other:?}")),
    }
    store.delete_run(&per_id).await.map_err(fail("cleanup"))
}

/// A blob no manifest references yet (its writer has not written the manifest) survives gc within
/// the grace period.
pub async fn gc_spares_young_unreferenced_blobs(store: &Store) -> Check {
    let id = store
        .put_blob(unique("young").into_bytes())
        .await
        .map_err(fail("put_blob"))?;
    store.gc(SystemTime::now()).await.map_err(fail("gc"))?;
    store
        .get_run_artifact(&id)
        .await
        .map(drop)
        .map_err(fail("young blob deleted by gc"))
}
