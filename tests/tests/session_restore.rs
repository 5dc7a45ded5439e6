//! Sessions that come back exactly and fast on another host (issue 42): every cell's request kept
//! (files, exact values, allowed hosts), a snapshot of the namespace loaded instead of replaying
//! every cell, a replay bounded in time, and what cannot be pickled falling back to replay.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::time::Duration;

use runpython_core::{Envelope, Store};
use runpython_core::{Network, NetworkPolicy, RunPython, RunPythonBuilder, RunRequest, Status};
use serde_json::json;

fn builder(url: &str) -> RunPythonBuilder {
    RunPython::builder()
        .timeout(Duration::from_secs(30))
        .store(Store::open(url).unwrap())
}

/// A loopback HTTP server answering every connection: its port.
fn server() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = stream.read(&mut [0u8; 1024]);
            let _ = write!(
                stream,
                "HTTP/1.0 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
            );
        }
    });
    port
}

/// A policy that lets runs reach `one.test` and `two.test` (both this host's loopback) on `ports`.
fn network(ports: (u16, u16)) -> Network {
    Network::Policy(NetworkPolicy {
        public: false,
        allow: vec![
            format!("one.test:{}", ports.0).parse().unwrap(),
            format!("two.test:{}", ports.1).parse().unwrap(),
        ],
        resolve: [("one.test", "127.0.0.1"), ("two.test", "127.0.0.1")]
            .iter()
            .map(|(n, ip)| ((*n).to_owned(), ip.parse().unwrap()))
            .collect(),
        ..NetworkPolicy::default()
    })
}

/// Whether this host enforces a network policy (not where namespaces are missing).
fn enforced() -> bool {
    let mut public = network((1, 2));
    if let Network::Policy(policy) = &mut public {
        policy.public = true;
    }
    let report = RunPython::builder()
        .network(public)
        .build()
        .unwrap()
        .isolation_report()
        .unwrap();
    report.network == "public"
}

fn ok(e: &Envelope) {
    assert_eq!(e.status, Status::Success, "{:?} {}", e.error, e.stderr);
}

const SUMMARY: &str = "[open('data.csv').read(), text, repr(kept), kinds, str(amount * 3), \
                       sorted(tags | {9}), when.isoformat(), reached]";

/// A session whose cells had a file, exact values and (where the network is enforced) hosts of
/// their own, its first host gone: its next cell on a second engine returns what it would have on the
/// first. `snapshots`: restored from a snapshot, else by replaying every cell.
async fn restores_exactly(url: &str, snapshots: bool) {
    let net = enforced().then(|| (server(), server()));
    if net.is_none() {
        eprintln!("allowed hosts not tested: this host enforces no network policy");
    }
    let engine = || {
        let mut b = builder(url);
        if let Some(ports) = net {
            b = b.network(network(ports));
        }
        if !snapshots {
            b = b.session_snapshot_max(0);
        }
        b.build().unwrap()
    };
    let first = engine();
    let s = first.session();
    ok(&s
        .run("from dataclasses import dataclass\n@dataclass\nclass Point:\n    x: int\n    y: int")
        .await
        .unwrap());
    let cell = RunRequest::new(
        "text = open('data.csv').read()\nkept = (when, amount, tags, point)\n\
         kinds = [type(v).__name__ for v in kept]\nreached = None",
    )
    .file("data.csv", b"a,b\n1,2\n".to_vec())
    .input(
        "when",
        json!({"$rp": "datetime", "v": "2024-05-06T07:08:09.123456+02:00"}),
    )
    .input("amount", json!({"$rp": "decimal", "v": "1.10"}))
    .input("tags", json!({"$rp": "set", "v": [3, 1]}))
    .input(
        "point",
        json!({"$rp": "dataclass", "cls": "__main__:Point", "v": {"x": 1, "y": 2}}),
    )
    .typed();
    ok(&s.run(cell).await.unwrap());
    if let Some(ports) = net {
        // Only one.test for this cell: two.test, which the engine allows, is refused to it.
        let code = format!(
            "import socket\ndef attempt(host, port):\n    try:\n        \
             socket.create_connection((host, port), timeout=10).close()\n        \
             return 'connected'\n    except OSError as e:\n        return type(e).__name__\n\
             reached = [attempt('one.test', {}), attempt('two.test', {})]",
            ports.0, ports.1
        );
        let hosts = vec![format!("one.test:{}", ports.0).parse().unwrap()];
        ok(&s
            .run(RunRequest::new(code).allow_hosts(hosts))
            .await
            .unwrap());
    }
    let expected = s.run(SUMMARY).await.unwrap();
    ok(&expected);
    eprintln!("before the kill: {}", expected.return_value);
    let kinds = json!(["datetime", "Decimal", "set", "Point"]);
    assert_eq!(expected.return_value[3], kinds);
    if net.is_some() {
        assert_eq!(
            expected.return_value[7],
            json!(["connected", "PermissionError"])
        );
    }
    let id = s.id().to_owned();
    drop(s);
    drop(first); // the first host is gone, its interpreter with it

    let second = engine();
    let e = second
        .session_with_id(&id)
        .unwrap()
        .run(SUMMARY)
        .await
        .unwrap();
    ok(&e);
    assert_eq!(e.return_value, expected.return_value);
    let restore = e.restore.expect("a restored cell says how it came back");
    let cells = 3 + u64::from(net.is_some());
    if snapshots {
        assert_eq!(restore.from, "snapshot", "{restore:?}");
        let covered = restore.snapshot_cells.unwrap();
        assert_eq!(covered + restore.replayed, cells, "{restore:?}");
    } else {
        assert_eq!(restore.from, "replay", "{restore:?}");
        assert_eq!(restore.replayed, cells, "{restore:?}");
        assert!(restore.why.is_some(), "{restore:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn files_exact_values_and_hosts_survive_a_restore_by_replay() {
    let dir = tempfile::tempdir().unwrap();
    restores_exactly(&format!("file://{}", dir.path().display()), false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn files_exact_values_and_hosts_survive_a_restore_from_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    restores_exactly(&format!("file://{}", dir.path().display()), true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn files_exact_values_and_hosts_survive_a_restore_on_a_shared_s3_store() {
    let moto = match runpython_tests::Moto::start() {
        Ok(Some(m)) => m,
        Ok(None) => return,
        Err(e) => panic!("{e}"),
    };
    moto.create_bucket("runpython-restore").unwrap();
    for (prefix, snapshots) in [("replay", false), ("snapshot", true)] {
        restores_exactly(&moto.url("runpython-restore", prefix), snapshots).await;
    }
}

/// The bytes of session `id`'s snapshot in `store`.
async fn snapshot_bytes(store: &Store, id: &str) -> Vec<u8> {
    use futures_util::TryStreamExt as _;
    let stream = store
        .get_session_snapshot(id)
        .await
        .unwrap()
        .expect("no snapshot");
    let chunks: Vec<runpython_store::Bytes> = stream.try_collect().await.unwrap();
    chunks.concat()
}

/// Session `id` of `engine` after its interpreter is gone: a second engine sharing the store (built
/// by `again`) runs `code` there.
async fn next_on(again: &RunPython, id: &str, code: &str) -> Envelope {
    again.session_with_id(id).unwrap().run(code).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fifty_cell_session_comes_back_from_its_snapshot_replaying_almost_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let first = builder(&url).build().unwrap();
    let s = first.session();
    ok(&s.run("import time\nrows = []").await.unwrap());
    for _ in 0..50 {
        ok(&s
            .run("time.sleep(0.2)\nrows.append(len(rows))")
            .await
            .unwrap());
    }
    let id = s.id().to_owned();
    drop((s, first));
    let e = next_on(
        &builder(&url).build().unwrap(),
        &id,
        "rows == list(range(50))",
    )
    .await;
    ok(&e);
    assert_eq!(e.return_value, json!(true));
    let restore = e.restore.unwrap();
    assert_eq!(restore.from, "snapshot", "{restore:?}");
    // A snapshot is taken after a cell once the cells since cost several times the last snapshot:
    // with cells of 0.2 s, after nearly every one. What is left to replay is a cell or two, never 50.
    assert!(restore.replayed <= 2, "{restore:?}");
    assert_eq!(restore.snapshot_cells.unwrap() + restore.replayed, 51);
    assert!(restore.snapshot_ms.is_some(), "{restore:?}");
    eprintln!("restored: {restore:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_holding_a_socket_falls_back_to_replay_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let first = builder(&url).build().unwrap();
    let s = first.session();
    ok(&s
        .run("import socket, time\ntime.sleep(0.05)\nn = 1")
        .await
        .unwrap());
    let snapshot = snapshot_bytes(first.store().unwrap(), s.id()).await;
    ok(&s
        .run("conn = socket.socket()\ntime.sleep(0.05)\nn += 1")
        .await
        .unwrap());
    ok(&s.run("time.sleep(0.05)\nn += 1").await.unwrap());
    // The snapshot after the first cell is still the one kept: the later ones could not be taken.
    assert_eq!(
        snapshot_bytes(first.store().unwrap(), s.id()).await,
        snapshot
    );
    let id = s.id().to_owned();
    drop((s, first));
    let e = next_on(
        &builder(&url).build().unwrap(),
        &id,
        "[n, type(conn).__name__]",
    )
    .await;
    ok(&e);
    assert_eq!(e.return_value, json!([3, "socket"]));
    let restore = e.restore.unwrap();
    assert_eq!(
        (
            restore.from.as_str(),
            restore.snapshot_cells,
            restore.replayed
        ),
        ("snapshot", Some(1), 2),
        "{restore:?}"
    );
    let why = restore.why.unwrap();
    assert!(why.contains("'conn'") && why.contains("socket"), "{why}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_past_its_bound_is_not_kept_and_the_restore_replays() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let first = builder(&url).session_snapshot_max(4096).build().unwrap();
    let s = first.session();
    ok(&s
        .run("import time\ntime.sleep(0.05)\nblob = 'x' * 100_000")
        .await
        .unwrap());
    let store = first.store().unwrap().clone();
    assert!(store.get_session_snapshot(s.id()).await.unwrap().is_none());
    let id = s.id().to_owned();
    drop((s, first));
    let e = next_on(&builder(&url).build().unwrap(), &id, "len(blob)").await;
    ok(&e);
    assert_eq!(e.return_value, json!(100_000));
    let restore = e.restore.unwrap();
    assert_eq!((restore.from.as_str(), restore.replayed), ("replay", 1));
    let why = restore.why.unwrap();
    assert!(why.contains("snapshot bound of 4096 bytes"), "{why}");
}

/// What a snapshot's bytes are up to its pickle: the host's head, then the child's format and the
/// interpreter's bytecode magic.
fn before_pickle(snapshot: &[u8]) -> &[u8] {
    let head = 9 + u32::from_be_bytes(snapshot[5..9].try_into().unwrap()) as usize;
    let format = head + 5; // b"RPNS\x01"
    &snapshot[..format + 1 + snapshot[format] as usize]
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tampered_snapshot_runs_only_in_the_sessions_own_sandbox_and_never_on_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let first = builder(&url).build().unwrap();
    let s = first.session();
    ok(&s.run("import time\ntime.sleep(0.05)\nn = 7").await.unwrap());
    let store = first.store().unwrap().clone();
    let snapshot = snapshot_bytes(&store, s.id()).await;
    // A pickle that, loaded anywhere, writes a file on the host's disk: the host never loads it, and
    // the session's sandbox cannot write there.
    let marker = dir.path().join("unpickled-here");
    let payload = format!(
        "cbuiltins\nexec\n(S'open({:?}, \"w\").write(\"x\")'\ntR.",
        marker.display().to_string()
    );
    let mut tampered = before_pickle(&snapshot).to_vec();
    tampered.extend(payload.as_bytes());
    store
        .put_session_snapshot(s.id(), &tampered[..])
        .await
        .unwrap();
    let id = s.id().to_owned();
    drop((s, first));
    let e = next_on(&builder(&url).build().unwrap(), &id, "n").await;
    ok(&e);
    assert_eq!(e.return_value, json!(7));
    let restore = e.restore.unwrap();
    assert_eq!((restore.from.as_str(), restore.replayed), ("replay", 1));
    let why = restore.why.unwrap();
    assert!(why.contains("did not load"), "{why}");
    assert!(!marker.exists(), "a tampered snapshot wrote on the host");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_of_one_tenants_session_is_never_loaded_for_another() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let first = builder(&url).build().unwrap();
    let (a, b) = (first.tenant("a").unwrap(), first.tenant("b").unwrap());
    let id = "shared-name";
    let sa = a.session_with_id(id).unwrap();
    ok(&sa
        .run("import time\ntime.sleep(0.05)\nsecret = 'of a'")
        .await
        .unwrap());
    let sb = b.session_with_id(id).unwrap();
    ok(&sb
        .run("import time\ntime.sleep(0.05)\nmine = 'of b'")
        .await
        .unwrap());
    // Tenant b's store given tenant a's snapshot, as if b's prefix had been written with a's bytes.
    let a_snapshot = snapshot_bytes(a.store().unwrap(), id).await;
    b.store()
        .unwrap()
        .put_session_snapshot(id, &a_snapshot[..])
        .await
        .unwrap();
    drop((sa, sb, a, b, first));

    let second = builder(&url).build().unwrap();
    let e = next_on(
        &second.tenant("b").unwrap(),
        id,
        "['secret' in globals(), mine]",
    )
    .await;
    ok(&e);
    assert_eq!(e.return_value, json!([false, "of b"]));
    let restore = e.restore.unwrap();
    assert_eq!((restore.from.as_str(), restore.replayed), ("replay", 1));
    assert!(restore.why.unwrap().contains("earlier life"));
    let e = next_on(&second.tenant("a").unwrap(), id, "secret").await;
    assert_eq!(e.return_value, json!("of a"));
    assert_eq!(e.restore.unwrap().from, "snapshot");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_past_its_budget_fails_naming_the_session_and_keeps_its_record() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let first = builder(&url).session_snapshot_max(0).build().unwrap();
    let s = first.session();
    for _ in 0..3 {
        ok(&s
            .run("import time\ntime.sleep(0.5)\nk = globals().get('k', 0) + 1")
            .await
            .unwrap());
    }
    let id = s.id().to_owned();
    drop((s, first));
    let tight = builder(&url)
        .session_replay_budget(Duration::from_millis(800))
        .build()
        .unwrap();
    let e = next_on(&tight, &id, "k").await;
    assert_eq!(e.status, Status::Error);
    let (kind, message) = error(&e);
    assert_eq!(kind, "SessionLost");
    assert!(
        message.contains(&id) && message.contains("replay budget"),
        "{message}"
    );
    assert!(message.contains("record is kept"), "{message}");
    // The record was kept: with budget enough, the session comes back whole.
    let e = next_on(&builder(&url).build().unwrap(), &id, "k").await;
    ok(&e);
    assert_eq!(e.return_value, json!(3));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_that_calls_a_tool_differently_names_the_cell_and_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let engine = || {
        builder(&url)
            .session_snapshot_max(0)
            .tool(runpython_core::tool_fn(
                "stamp",
                "Returns its argument.",
                None,
                |args| async move { Ok(args.get("at").cloned().unwrap_or_default()) },
            ))
            .build()
            .unwrap()
    };
    let first = engine();
    let s = first.session();
    ok(&s.run("a = 1").await.unwrap());
    ok(&s
        .run("import time\nt = stamp(at=time.time_ns())")
        .await
        .unwrap());
    let id = s.id().to_owned();
    drop((s, first));
    let e = next_on(&engine(), &id, "t").await;
    let (kind, message) = error(&e);
    assert_eq!(kind, "ReplayDiverged");
    assert!(
        message.contains(&format!("session {id} failed at its cell 2")),
        "{message}"
    );
    assert!(message.contains("stamp("), "{message}");
}

/// The kind and message of `e`'s error.
fn error(e: &Envelope) -> (String, String) {
    let err = e.error.as_ref().expect("an error");
    (err.kind.clone(), err.message.clone())
}
