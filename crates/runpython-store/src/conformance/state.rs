//! The conformance checks of what a store keeps besides runs and blobs: memo entries (and
//! `memoized`'s single flight), checkpoints, session records and tenants.

use super::*;

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

/// A session's snapshot comes back as written, small (one request) or large (a multipart upload); a
/// stream that fails midway, small or large, leaves the earlier snapshot whole; deleting the session
/// removes it.
pub async fn session_snapshots_replace_whole_and_go_with_their_session(store: &Store) -> Check {
    async fn read(store: &Store, id: &str) -> Result<Option<Vec<u8>>, String> {
        let Some(stream) = store
            .get_session_snapshot(id)
            .await
            .map_err(fail("get_session_snapshot"))?
        else {
            return Ok(None);
        };
        let chunks: Vec<bytes::Bytes> = stream
            .try_collect()
            .await
            .map_err(fail("reading the snapshot"))?;
        Ok(Some(chunks.concat()))
    }
    let id = unique("snap");
    ensure(read(store, &id).await?.is_none(), || {
        "a session that never kept a snapshot has one".into()
    })?;
    let small = b"snapshot one".to_vec();
    let written = store
        .put_session_snapshot(&id, &small[..])
        .await
        .map_err(fail("put_session_snapshot"))?;
    ensure(written == small.len() as u64, || {
        format!("wrote {written} bytes")
    })?;
    ensure(read(store, &id).await?.as_ref() == Some(&small), || {
        "the snapshot came back changed".into()
    })?;
    let part = store.inner.options.upload_part_bytes;
    let large: Vec<u8> = unique("large").bytes().cycle().take(part * 2 + 7).collect();
    store
        .put_session_snapshot(&id, &large[..])
        .await
        .map_err(fail("put_session_snapshot, large"))?;
    ensure(read(store, &id).await?.as_ref() == Some(&large), || {
        "the large snapshot came back changed".into()
    })?;
    for head in [&b"short"[..], &large[..]] {
        let failing = tokio::io::AsyncReadExt::chain(head, super::FailingReader);
        match store.put_session_snapshot(&id, failing).await {
            Err(Error::Source { .. }) => {}
            other => return Err(format!("expected a Source error, got {other:?}")),
        }
        ensure(read(store, &id).await?.as_ref() == Some(&large), || {
            "a snapshot that failed midway replaced the earlier one".into()
        })?;
    }
    store
        .delete_session(&id)
        .await
        .map_err(fail("delete_session"))?;
    ensure(read(store, &id).await?.is_none(), || {
        "a deleted session's snapshot is still there".into()
    })
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
