//! The conformance suite: the behaviour every backend must show, run by the integration tests against
//! memory, a local directory and a real S3-compatible server.
//!
//! Each check takes a [`Store`], uses fresh ids so checks may share one store, and returns a message
//! naming what broke. [`run_all`] runs them in order. Checks that move time forward call
//! [`Store::gc`] with a future `now`, which can also collect other checks' ephemeral runs; run them
//! on a store no one else is using.
//!
//! Why this file is long: it is one job, the suite every backend must pass, one function per
//! property (runs, blobs, listings, memo entries, checkpoints, sessions, tenants).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::TryStreamExt;

use crate::{
    memo_key, ArtifactKind, Computed, Error, RunFile, RunRecord, SkippedFile, Store, Tier,
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

struct FailingReader;

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

/// Memo entries come back from memory and from the store, and vanish when expired.
pub async fn memo_round_trip_and_expiry(store: &Store) -> Check {
    let key = memo_key([unique("memo").as_bytes(), b"deps"]);
    ensure(
        store
            .get_memo(&key)
            .await
            .map_err(fail("get absent"))?
            .is_none(),
        || "absent memo found".into(),
    )?;
    store
        .put_memo(
            &key,
            r#"{"status":"success"}"#,
            Some(Duration::from_secs(3600)),
        )
        .await
        .map_err(fail("put_memo"))?;
    let hit = store.get_memo(&key).await.map_err(fail("get_memo"))?;
    ensure(hit.as_deref() == Some(r#"{"status":"success"}"#), || {
        format!("{hit:?}")
    })?;
    // Drop the memory copy: the store must have it too.
    store
        .inner
        .memo
        .invalidate(&store.cache_slot(key.as_str()))
        .await;
    let hit = store
        .get_memo(&key)
        .await
        .map_err(fail("get_memo from store"))?;
    ensure(hit.is_some(), || "memo entry missing from the store".into())?;

    let short = memo_key([unique("short").as_bytes()]);
    store
        .put_memo(&short, "{}", Some(Duration::from_millis(1)))
        .await
        .map_err(fail("put short"))?;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let hit = store.get_memo(&short).await.map_err(fail("get expired"))?;
    ensure(hit.is_none(), || "expired memo returned".into())?;
    let report = store.gc(SystemTime::now()).await.map_err(fail("gc"))?;
    ensure(report.expired_memos >= 1, || {
        format!("expired memo not collected: {report:?}")
    })?;
    store.delete_memo(&key).await.map_err(fail("delete_memo"))?;
    let hit = store.get_memo(&key).await.map_err(fail("get deleted"))?;
    ensure(hit.is_none(), || "deleted memo returned".into())
}

/// Concurrent identical lookups compute once; later lookups are hits.
pub async fn memoized_computes_once_for_concurrent_callers(store: &Store) -> Check {
    let key = memo_key([unique("once").as_bytes()]);
    let calls = Arc::new(AtomicUsize::new(0));
    let call = || {
        let calls = Arc::clone(&calls);
        let key = key.clone();
        async move {
            store
                .memoized(&key, Some(Duration::from_secs(3600)), || async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok::<_, Error>(Computed::keep(r#"{"v":1}"#))
                })
                .await
        }
    };
    let results = futures_util::future::join_all((0..8).map(|_| call())).await;
    ensure(calls.load(Ordering::SeqCst) == 1, || {
        format!("computed {} times", calls.load(Ordering::SeqCst))
    })?;
    let mut computed = 0;
    for r in results {
        let m = r.map_err(|e| format!("memoized: {e}"))?;
        ensure(&*m.json == r#"{"v":1}"#, || format!("{m:?}"))?;
        computed += usize::from(!m.cached);
    }
    ensure(computed == 1, || {
        format!("{computed} callers saw cached: false")
    })?;
    let m = call().await.map_err(|e| format!("memoized again: {e}"))?;
    ensure(m.cached && calls.load(Ordering::SeqCst) == 1, || {
        "later lookup recomputed".into()
    })
}

/// A result the caller chose not to keep is returned but computed again next time.
pub async fn memoized_results_not_kept_are_computed_again(store: &Store) -> Check {
    let key = memo_key([unique("not kept").as_bytes()]);
    for round in 0..2 {
        let m = store
            .memoized(&key, None, || async {
                Ok::<_, Error>(Computed::once("{}"))
            })
            .await
            .map_err(|e| format!("memoized: {e}"))?;
        ensure(!m.cached, || {
            format!("round {round}: not-kept result served from cache")
        })?;
    }
    let stored = store.get_memo(&key).await.map_err(fail("get_memo"))?;
    ensure(stored.is_none(), || "not-kept result was stored".into())
}

/// A failed computation reaches every waiter and is not cached.
pub async fn memoized_errors_are_shared_and_not_cached(store: &Store) -> Check {
    let key = memo_key([unique("error").as_bytes()]);
    let failing = store
        .memoized(&key, None, || async {
            Err::<Computed, _>(Error::InvalidId {
                what: "test",
                value: "x".into(),
                reason: "injected",
            })
        })
        .await;
    ensure(failing.is_err(), || "error swallowed".into())?;
    let m = store
        .memoized(&key, None, || async {
            Ok::<_, Error>(Computed::keep("{}"))
        })
        .await
        .map_err(|e| format!("memoized after error: {e}"))?;
    ensure(!m.cached, || "error was cached".into())
}

/// Checkpoints are found by listing, with their run id, bytes and time of the last write; a deleted
/// run's checkpoint is gone from the listing.
pub async fn checkpoints_are_listed_with_their_run_and_time(store: &Store) -> Check {
    let run_id = unique("ckpt");
    let before = SystemTime::now() - Duration::from_secs(60);
    store
        .put_checkpoint(&run_id, b"first".to_vec())
        .await
        .map_err(fail("put_checkpoint"))?;
    store
        .put_checkpoint(&run_id, b"second".to_vec())
        .await
        .map_err(fail("put_checkpoint again"))?;
    let listed = store
        .list_checkpoints()
        .await
        .map_err(fail("list_checkpoints"))?;
    let found: Vec<_> = listed.iter().filter(|c| c.run_id == run_id).collect();
    ensure(found.len() == 1, || {
        format!("{} listings of checkpoint {run_id}", found.len())
    })?;
    ensure(&found[0].bytes[..] == b"second", || {
        "the listing has an old checkpoint".into()
    })?;
    ensure(found[0].updated_at > before, || {
        format!("updated_at {:?} is not recent", found[0].updated_at)
    })?;
    store
        .delete_run(&run_id)
        .await
        .map_err(fail("delete_run"))?;
    let listed = store
        .list_checkpoints()
        .await
        .map_err(fail("list_checkpoints after delete"))?;
    ensure(listed.iter().all(|c| c.run_id != run_id), || {
        "a deleted run's checkpoint is still listed".into()
    })
}

/// A session's record and its parts come back as written (a part rewritten replaces the old one), and
/// deleting the session removes them all; another session's parts are untouched. The other id is as
/// long as an id may be (128 characters).
pub async fn session_records_and_parts_round_trip_and_are_deleted_together(store: &Store) -> Check {
    let id = unique("sess");
    let other = format!("{:x<128}", unique("sess:other"));
    store
        .put_session(&id, b"head".to_vec())
        .await
        .map_err(fail("put_session"))?;
    for n in 0..3u64 {
        store
            .put_session_part(&id, n, format!("part {n}").into_bytes())
            .await
            .map_err(fail("put_session_part"))?;
    }
    store
        .put_session_part(&id, 2, b"part 2, again".to_vec())
        .await
        .map_err(fail("put_session_part again"))?;
    store
        .put_session_part(&other, 0, b"other".to_vec())
        .await
        .map_err(fail("put_session_part of another session"))?;
    let head = store.get_session(&id).await.map_err(fail("get_session"))?;
    ensure(head.as_deref() == Some(&b"head"[..]), || {
        format!("the record came back as {head:?}")
    })?;
    for (n, want) in [
        (0u64, &b"part 0"[..]),
        (1, b"part 1"),
        (2, b"part 2, again"),
    ] {
        let got = store
            .get_session_part(&id, n)
            .await
            .map_err(fail("get_session_part"))?;
        ensure(got.as_deref() == Some(want), || {
            format!("part {n} came back as {got:?}")
        })?;
    }
    store
        .delete_session(&id)
        .await
        .map_err(fail("delete_session"))?;
    let head = store.get_session(&id).await.map_err(fail("get_session"))?;
    ensure(head.is_none(), || {
        "a deleted session's record is still there".into()
    })?;
    for n in 0..3u64 {
        let got = store
            .get_session_part(&id, n)
            .await
            .map_err(fail("get_session_part"))?;
        ensure(got.is_none(), || {
            format!("part {n} of a deleted session is still there")
        })?;
    }
    let kept = store
        .get_session_part(&other, 0)
        .await
        .map_err(fail("get_session_part of another session"))?;
    ensure(kept.is_some(), || {
        "deleting a session removed another session's part".into()
    })?;
    store
        .delete_session(&other)
        .await
        .map_err(fail("delete_session"))
}

/// Two tenants of one backend, and its default tenant: each reads only what it wrote. Another tenant's
/// run, artifact, checkpoint, session and memo entry read exactly as missing ones do (the error differs
/// from a never-stored id's only in the id), a blob both stored is each one's own, listings hold only
/// the tenant's own, and operator listings find every tenant.
pub async fn tenants_see_only_their_own(store: &Store) -> Check {
    let (alice_name, bob_name) = (unique("alice"), unique("bob"));
    let alice = store.tenant(&alice_name).map_err(fail("tenant alice"))?;
    let bob = store.tenant(&bob_name).map_err(fail("tenant bob"))?;
    let run_id = unique("tenant-run");
    let manifest = alice
        .put_run(record(&run_id, Tier::Persistent, SystemTime::now()))
        .await
        .map_err(fail("alice put_run"))?;
    let secret = alice
        .put_blob(b"alice's secret".to_vec())
        .await
        .map_err(fail("alice put_blob"))?;
    let shared = alice
        .put_blob(b"content both tenants hold".to_vec())
        .await
        .map_err(fail("alice put_blob shared"))?;
    let key = memo_key([unique("tenant-memo").as_bytes()]);
    alice
        .put_memo(&key, r#"{"status":"success"}"#, None)
        .await
        .map_err(fail("alice put_memo"))?;
    alice
        .put_checkpoint(&run_id, b"alice's checkpoint".to_vec())
        .await
        .map_err(fail("alice put_checkpoint"))?;
    let session = unique("tenant-session");
    alice
        .put_session(&session, b"alice's session".to_vec())
        .await
        .map_err(fail("alice put_session"))?;
    // Never stored anywhere: what a missing id reads as.
    let nowhere = blake3::hash(unique("nowhere").as_bytes())
        .to_hex()
        .to_string();
    let missing = match bob.get_run_artifact(&nowhere).await {
        Err(Error::NotFound { what, store, .. }) => (what, store),
        other => return Err(format!("a never-stored artifact: {other:?}")),
    };
    for other in [&bob, store] {
        match other.get_run_artifact(&secret).await {
            Err(Error::NotFound { what, id, store }) => {
                ensure((what, store) == missing && id == secret, || {
                    "another tenant's artifact reads unlike a missing one".into()
                })?
            }
            got => return Err(format!("another tenant read alice's artifact: {got:?}")),
        }
        ensure(
            matches!(other.get_run(&run_id).await, Err(Error::NotFound { .. })),
            || "another tenant read alice's run".into(),
        )?;
        ensure(
            other
                .get_checkpoint(&run_id)
                .await
                .map_err(fail("get_checkpoint"))?
                .is_none(),
            || "another tenant read alice's checkpoint".into(),
        )?;
        ensure(
            other
                .get_session(&session)
                .await
                .map_err(fail("get_session"))?
                .is_none(),
            || "another tenant read alice's session".into(),
        )?;
        ensure(
            other
                .get_memo(&key)
                .await
                .map_err(fail("get_memo"))?
                .is_none(),
            || "another tenant hit alice's memo entry".into(),
        )?;
        let runs = other.list_runs().await.map_err(fail("list_runs"))?;
        ensure(runs.items.iter().all(|r| r.run_id != run_id), || {
            "another tenant lists alice's run".into()
        })?;
        let checkpoints = other
            .list_checkpoints()
            .await
            .map_err(fail("list_checkpoints"))?;
        ensure(checkpoints.iter().all(|c| c.run_id != run_id), || {
            "another tenant lists alice's checkpoint".into()
        })?;
    }
    // A blob both hold is each one's own copy: bob reads his, and deleting nothing of alice's.
    ensure(bob.get_run_artifact(&shared).await.is_err(), || {
        "bob read a blob only alice stored".into()
    })?;
    let bobs = bob
        .put_blob(b"content both tenants hold".to_vec())
        .await
        .map_err(fail("bob put_blob shared"))?;
    ensure(bobs == shared, || "one content, two ids".into())?;
    ensure(
        bob.get_run_artifact(&shared)
            .await
            .map_err(fail("bob get shared"))?[..]
            == b"content both tenants hold"[..],
        || "bob's copy of the shared blob".into(),
    )?;
    // Alice reads all of hers.
    ensure(
        alice
            .get_run(&run_id)
            .await
            .map_err(fail("alice get_run"))?
            == manifest,
        || "alice's run changed".into(),
    )?;
    ensure(
        alice
            .get_memo(&key)
            .await
            .map_err(fail("alice get_memo"))?
            .is_some(),
        || "alice's memo entry is gone".into(),
    )?;
    let listed = alice.list_runs().await.map_err(fail("alice list_runs"))?;
    ensure(listed.items.iter().any(|r| r.run_id == run_id), || {
        "alice does not list her run".into()
    })?;
    // Operators find every tenant, by name.
    let names: Vec<Option<String>> = store
        .every_tenant()
        .await
        .map_err(fail("every_tenant"))?
        .iter()
        .map(|s| s.tenant_name().map(str::to_owned))
        .collect();
    ensure(
        names.contains(&None)
            && names.contains(&Some(alice_name.clone()))
            && names.contains(&Some(bob_name.clone())),
        || format!("every_tenant found {names:?}"),
    )?;
    let used = alice
        .stored_bytes(Duration::ZERO)
        .await
        .map_err(fail("stored_bytes"))?;
    ensure(used > 0, || "alice's stored bytes are 0".into())?;
    alice
        .delete_run(&run_id)
        .await
        .map_err(fail("alice delete_run"))?;
    alice
        .delete_session(&session)
        .await
        .map_err(fail("alice delete_session"))
}
