//! The bridge server in process, driven by a Rust client that speaks the wire format by hand (u32
//! big-endian length, then JSON): over a socket pair, and over a path socket for `bind`.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps; helpers outside #[test] too

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use runpython_bridge::{
    socket_pair, tool_fn, Bridge, BridgeConfig, Error, Stop, ToolSet, PROTOCOL_VERSION,
};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Long enough for the server to act on what it was sent; only ever waited for in checks that
/// something does NOT happen, so a slow machine can make them pass late, never fail.
const SETTLE: Duration = Duration::from_millis(300);
/// Bound on anything that must happen, so a broken server fails the test instead of hanging it.
const DEADLINE: Duration = Duration::from_secs(10);

/// The child's side of the wire, by hand.
struct Client {
    stream: UnixStream,
}

impl Client {
    fn from_fd(fd: OwnedFd) -> Self {
        let std = std::os::unix::net::UnixStream::from(fd);
        std.set_nonblocking(true).unwrap();
        Self {
            stream: UnixStream::from_std(std).unwrap(),
        }
    }

    async fn send(&mut self, message: &Value) {
        let payload = serde_json::to_vec(message).unwrap();
        let mut frame = u32::try_from(payload.len()).unwrap().to_be_bytes().to_vec();
        frame.extend(payload);
        self.stream.write_all(&frame).await.unwrap();
    }

    async fn hello(&mut self, token: &str) {
        self.send(&json!({"type": "hello", "version": PROTOCOL_VERSION, "token": token}))
            .await;
    }

    async fn call(&mut self, id: u64, tool: &str, kwargs: Value) {
        self.send(&json!({"type": "call", "id": id, "tool": tool, "kwargs": kwargs}))
            .await;
    }

    /// The next frame, or `None` at the end of the stream.
    async fn recv(&mut self) -> Option<Value> {
        let read = async {
            let mut header = [0u8; 4];
            if self.stream.read_exact(&mut header).await.is_err() {
                return None;
            }
            let mut payload = vec![0u8; u32::from_be_bytes(header) as usize];
            self.stream.read_exact(&mut payload).await.ok()?;
            Some(serde_json::from_slice(&payload).unwrap())
        };
        tokio::time::timeout(DEADLINE, read)
            .await
            .expect("no frame and no end of stream in time")
    }
}

/// A door the test opens: calls to `wait` block until then.
struct Gate {
    open: watch::Sender<bool>,
    /// Calls of `wait` running now, and the most ever at once.
    running: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

impl Gate {
    fn open(&self) {
        self.open.send_replace(true);
    }

    /// Waits until `n` calls of `wait` are running.
    async fn until_running(&self, n: usize) {
        let running = Arc::clone(&self.running);
        tokio::time::timeout(DEADLINE, async move {
            while running.load(Ordering::SeqCst) < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{n} calls never ran at once"));
    }
}

/// `echo(value)` returns its argument; `wait(value)` returns it once the gate opens.
fn tools() -> (ToolSet, Gate) {
    let (open, opened) = watch::channel(false);
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut set = ToolSet::new();
    set.insert(tool_fn("echo", "", None, |args| async move {
        Ok(args.get("value").cloned().unwrap_or(Value::Null))
    }))
    .unwrap();
    let (r, m) = (Arc::clone(&running), Arc::clone(&most));
    set.insert(tool_fn("wait", "", None, move |args| {
        let mut opened = opened.clone();
        let (running, most) = (Arc::clone(&r), Arc::clone(&m));
        async move {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            let _ = opened.wait_for(|open| *open).await;
            running.fetch_sub(1, Ordering::SeqCst);
            Ok(args.get("value").cloned().unwrap_or(Value::Null))
        }
    }))
    .unwrap();
    (
        set,
        Gate {
            open,
            running,
            most,
        },
    )
}

/// A bridge over a socket pair, serving on a task; its token and the client on the child's end.
fn served_pair(config: BridgeConfig) -> (JoinHandle<Stop>, String, Client, Gate, Bridged) {
    let (tools, gate) = tools();
    let (host, child) = socket_pair().unwrap();
    let bridge = Bridge::new(host, tools, config).unwrap();
    let token = bridge.client_spec_fd(4).token.to_owned();
    let stats = bridge.stats();
    let serving = tokio::spawn(bridge.serve());
    (
        serving,
        token,
        Client::from_fd(child),
        gate,
        Bridged { stats },
    )
}

struct Bridged {
    stats: Arc<runpython_bridge::BridgeStats>,
}

/// The stop `serving` ended with.
async fn stop_of(serving: JoinHandle<Stop>) -> Stop {
    tokio::time::timeout(DEADLINE, serving)
        .await
        .expect("the bridge did not stop")
        .unwrap()
}

/// Asserts `serving` has not ended: the run goes on.
async fn still_serving(serving: &mut JoinHandle<Stop>) {
    if let Ok(ended) = tokio::time::timeout(SETTLE, &mut *serving).await {
        panic!("the bridge stopped: {ended:?}");
    }
}

fn failed_message(stop: Stop) -> String {
    match stop {
        Stop::Failed(e) => e.to_string(),
        other => panic!("expected a protocol failure, got {other:?}"),
    }
}

#[tokio::test]
async fn a_wrong_token_drops_the_connection_and_serves_no_call() {
    let (mut serving, _token, mut client, _gate, bridged) = served_pair(BridgeConfig::default());
    client.hello("not-the-token").await;
    client.call(1, "echo", json!({"value": 1})).await;
    assert_eq!(client.recv().await, None, "the connection is closed");
    assert_eq!(bridged.stats.calls(), 0);
    still_serving(&mut serving).await;
    serving.abort();
}

#[tokio::test]
async fn a_wrong_protocol_version_drops_the_connection() {
    let (mut serving, token, mut client, _gate, bridged) = served_pair(BridgeConfig::default());
    client
        .send(&json!({"type": "hello", "version": PROTOCOL_VERSION + 1, "token": token}))
        .await;
    client.call(1, "echo", json!({"value": 1})).await;
    assert_eq!(client.recv().await, None);
    assert_eq!(bridged.stats.calls(), 0);
    still_serving(&mut serving).await;
    serving.abort();
}

#[tokio::test]
async fn a_call_before_the_hello_drops_the_connection() {
    let (mut serving, _token, mut client, _gate, bridged) = served_pair(BridgeConfig::default());
    client.call(1, "echo", json!({"value": 1})).await;
    assert_eq!(client.recv().await, None);
    assert_eq!(bridged.stats.calls(), 0);
    still_serving(&mut serving).await;
    serving.abort();
}

#[tokio::test]
async fn the_hello_on_the_pair_may_come_long_after_serving_starts() {
    let config = BridgeConfig {
        handshake_timeout: Duration::from_millis(50),
        ..BridgeConfig::default()
    };
    let (mut serving, token, mut client, _gate, _) = served_pair(config);
    tokio::time::sleep(SETTLE).await; // the code runs a while before its first tool call
    client.hello(&token).await;
    client.call(1, "echo", json!({"value": "late"})).await;
    assert_eq!(client.recv().await.unwrap()["result"], "late");
    still_serving(&mut serving).await;
    serving.abort();
}

#[tokio::test]
async fn concurrent_calls_are_answered_as_they_finish_by_id() {
    let (mut serving, token, mut client, gate, _) = served_pair(BridgeConfig::default());
    client.hello(&token).await;
    client.call(1, "wait", json!({"value": "slow"})).await;
    gate.until_running(1).await;
    client.call(2, "echo", json!({"value": "fast"})).await;
    assert_eq!(
        client.recv().await,
        Some(json!({"type": "result", "id": 2, "result": "fast"}))
    );
    gate.open();
    assert_eq!(
        client.recv().await,
        Some(json!({"type": "result", "id": 1, "result": "slow"}))
    );
    still_serving(&mut serving).await;
    serving.abort();
}

#[tokio::test]
async fn reusing_an_id_still_in_flight_stops_the_run() {
    let (serving, token, mut client, gate, _) = served_pair(BridgeConfig::default());
    client.hello(&token).await;
    client.call(7, "wait", json!({})).await;
    gate.until_running(1).await;
    client.call(7, "echo", json!({})).await;
    let message = failed_message(stop_of(serving).await);
    assert!(message.contains("call id 7 reused"), "{message}");
}

#[tokio::test]
async fn a_call_over_the_budget_gets_tool_call_limit_and_is_counted() {
    let config = BridgeConfig {
        max_calls: 2,
        ..BridgeConfig::default()
    };
    let (mut serving, token, mut client, _gate, bridged) = served_pair(config);
    client.hello(&token).await;
    for id in 1..=3 {
        client.call(id, "echo", json!({"value": id})).await;
        let reply = client.recv().await.unwrap();
        assert_eq!(reply["id"], json!(id));
        if id <= 2 {
            assert_eq!(reply["result"], json!(id));
        } else {
            assert_eq!(reply["error"]["type"], "ToolCallLimit", "{reply}");
            let message = reply["error"]["message"].as_str().unwrap();
            assert!(message.contains("more than 2 tool calls"), "{message}");
        }
    }
    assert_eq!(bridged.stats.calls(), 3);
    assert!(bridged.stats.limit_exceeded());
    assert_eq!(
        bridged.stats.impure_calls(),
        2,
        "the refused call ran nothing"
    );
    still_serving(&mut serving).await;
    serving.abort();
}

#[tokio::test]
async fn an_oversized_frame_stops_the_run_naming_the_limit() {
    let config = BridgeConfig {
        max_frame: 1000,
        ..BridgeConfig::default()
    };
    let (serving, token, mut client, _gate, bridged) = served_pair(config);
    client.hello(&token).await;
    // Only the length prefix: the server must refuse it without waiting for the body.
    client
        .stream
        .write_all(&5000u32.to_be_bytes())
        .await
        .unwrap();
    let stop = stop_of(serving).await;
    assert!(
        matches!(
            stop,
            Stop::Failed(Error::FrameTooLarge {
                len: 5000,
                max: 1000
            })
        ),
        "{stop:?}"
    );
    let message = failed_message(stop);
    assert!(message.contains("limit of 1000 bytes"), "{message}");
    assert_eq!(bridged.stats.calls(), 0);
}

#[tokio::test]
async fn garbage_json_stops_the_run_as_malformed() {
    let (serving, token, mut client, _gate, _) = served_pair(BridgeConfig::default());
    client.hello(&token).await;
    client
        .stream
        .write_all(b"\x00\x00\x00\x05{oops")
        .await
        .unwrap();
    let stop = stop_of(serving).await;
    assert!(
        matches!(stop, Stop::Failed(Error::Malformed(_))),
        "{stop:?}"
    );
    let message = failed_message(stop);
    assert!(message.contains("{oops"), "{message}");
}

#[tokio::test]
async fn a_second_hello_on_the_open_connection_stops_the_run() {
    let (serving, token, mut client, _gate, _) = served_pair(BridgeConfig::default());
    client.hello(&token).await;
    client.hello(&token).await;
    let message = failed_message(stop_of(serving).await);
    assert!(message.contains("second handshake"), "{message}");
}

#[tokio::test]
async fn no_more_than_max_concurrent_calls_are_in_flight_and_the_rest_are_served_after() {
    let config = BridgeConfig {
        max_concurrent_calls: 3,
        ..BridgeConfig::default()
    };
    let (mut serving, token, mut client, gate, bridged) = served_pair(config);
    client.hello(&token).await;
    for id in 1..=10 {
        client.call(id, "wait", json!({"value": id})).await;
    }
    gate.until_running(3).await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(gate.running.load(Ordering::SeqCst), 3);
    assert_eq!(bridged.stats.calls(), 3, "the other frames were not read");
    gate.open();
    let mut answered: Vec<u64> = Vec::new();
    for _ in 1..=10 {
        let reply = client.recv().await.unwrap();
        assert_eq!(reply["result"], reply["id"], "{reply}");
        answered.push(reply["id"].as_u64().unwrap());
    }
    answered.sort_unstable();
    assert_eq!(answered, (1..=10).collect::<Vec<_>>());
    assert_eq!(gate.most.load(Ordering::SeqCst), 3);
    still_serving(&mut serving).await;
    serving.abort();
}

#[tokio::test]
async fn the_bytes_of_calls_in_flight_stay_under_the_cap() {
    // Each call's frame is a little over 1,000 bytes: two fit in 2,500, a third does not.
    let config = BridgeConfig {
        max_in_flight_bytes: 2_500,
        ..BridgeConfig::default()
    };
    let (mut serving, token, mut client, gate, bridged) = served_pair(config);
    client.hello(&token).await;
    let padding = "x".repeat(1_000);
    for id in 1..=5 {
        client
            .call(id, "wait", json!({"value": id, "padding": padding}))
            .await;
    }
    gate.until_running(2).await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(gate.running.load(Ordering::SeqCst), 2);
    assert_eq!(bridged.stats.calls(), 2);
    gate.open();
    for _ in 1..=5 {
        assert!(client.recv().await.unwrap()["result"].is_u64());
    }
    assert_eq!(gate.most.load(Ordering::SeqCst), 2);
    still_serving(&mut serving).await;
    serving.abort();
}

#[tokio::test]
async fn a_frame_larger_than_the_bytes_cap_is_served_alone() {
    let config = BridgeConfig {
        max_in_flight_bytes: 100,
        ..BridgeConfig::default()
    };
    let (mut serving, token, mut client, _gate, _) = served_pair(config);
    client.hello(&token).await;
    let big = "y".repeat(1_000);
    client.call(1, "echo", json!({"value": big})).await;
    client.call(2, "echo", json!({"value": big})).await;
    for id in 1..=2 {
        let reply = client.recv().await.unwrap();
        assert_eq!(reply["id"], json!(id));
        assert_eq!(reply["result"], json!(big));
    }
    still_serving(&mut serving).await;
    serving.abort();
}

#[tokio::test]
async fn the_end_of_the_connection_is_not_a_stop() {
    let (mut serving, token, mut client, _gate, _) = served_pair(BridgeConfig::default());
    client.hello(&token).await;
    client.call(1, "echo", json!({"value": 1})).await;
    assert!(client.recv().await.is_some());
    drop(client);
    still_serving(&mut serving).await;
    serving.abort();
}

#[tokio::test]
async fn calls_in_flight_when_the_child_stops_writing_are_still_answered() {
    let (mut serving, token, mut client, gate, _) = served_pair(BridgeConfig::default());
    client.hello(&token).await;
    client.call(1, "wait", json!({"value": "late"})).await;
    gate.until_running(1).await;
    client.stream.shutdown().await.unwrap(); // the child's side of the stream ends
    gate.open();
    assert_eq!(client.recv().await.unwrap()["result"], "late");
    still_serving(&mut serving).await;
    serving.abort();
}

#[tokio::test]
async fn both_ends_of_the_pair_are_close_on_exec_and_the_spec_names_the_descriptor() {
    let (host, child) = socket_pair().unwrap();
    assert!(close_on_exec(child.as_raw_fd()), "the child's end");
    let bridge = Bridge::new(host, ToolSet::new(), BridgeConfig::default()).unwrap();
    let spec = bridge.client_spec_fd(4);
    assert_eq!(spec.fd, Some(4));
    assert_eq!(spec.path, None, "{spec:?}");
    assert_eq!(spec.token.len(), 32);
    assert_eq!(bridge.client_spec().path, None);
    // The host's end: every descriptor this process holds besides stdio is close-on-exec.
    for entry in std::fs::read_dir("/proc/self/fd").unwrap() {
        let fd: i32 = entry
            .unwrap()
            .file_name()
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let is_socket = std::fs::read_link(format!("/proc/self/fd/{fd}"))
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
        if is_socket {
            assert!(close_on_exec(fd), "socket descriptor {fd} is inheritable");
        }
    }
}

/// `O_CLOEXEC` in the descriptor's flags, as `/proc/self/fdinfo` shows them (octal).
fn close_on_exec(fd: i32) -> bool {
    const O_CLOEXEC: u32 = 0o2_000_000;
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap();
    let flags = info
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .map(|f| u32::from_str_radix(f.trim(), 8).unwrap())
        .unwrap();
    flags & O_CLOEXEC != 0
}

/// A bridge bound to a path in a fresh directory, serving on a task.
fn served_path(dir: &tempfile::TempDir) -> (JoinHandle<Stop>, String, std::path::PathBuf) {
    let (tools, _gate) = tools();
    let path = dir.path().join("bridge.sock");
    let bridge = Bridge::bind(&path, tools, BridgeConfig::default()).unwrap();
    let spec = bridge.client_spec();
    assert_eq!(spec.path.as_deref(), path.to_str());
    let token = spec.token;
    (tokio::spawn(bridge.serve()), token, path)
}

async fn connect(path: &std::path::Path) -> std::io::Result<Client> {
    Ok(Client {
        stream: UnixStream::connect(path).await?,
    })
}

#[tokio::test]
async fn bind_serves_one_connection_and_refuses_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let (mut serving, token, path) = served_path(&dir);
    let mut first = connect(&path).await.unwrap();
    first.hello(&token).await;
    first.call(1, "echo", json!({"value": "one"})).await;
    assert_eq!(first.recv().await.unwrap()["result"], "one");
    // The listener is closed once the first connection passed the handshake.
    let refused = match connect(&path).await {
        Err(_) => true,
        Ok(mut second) => {
            second.hello(&token).await;
            second.call(1, "echo", json!({"value": "two"})).await;
            second.recv().await.is_none()
        }
    };
    assert!(refused, "a second connection was served");
    first.call(2, "echo", json!({"value": "still"})).await;
    assert_eq!(first.recv().await.unwrap()["result"], "still");
    still_serving(&mut serving).await;
    serving.abort();
}

#[tokio::test]
async fn bind_drops_a_connection_without_the_token_and_serves_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let (mut serving, token, path) = served_path(&dir);
    let mut intruder = connect(&path).await.unwrap();
    intruder.hello("guess").await;
    intruder.call(1, "echo", json!({"value": 1})).await;
    assert_eq!(intruder.recv().await, None);
    let mut child = connect(&path).await.unwrap();
    child.hello(&token).await;
    child.call(1, "echo", json!({"value": "served"})).await;
    assert_eq!(child.recv().await.unwrap()["result"], "served");
    still_serving(&mut serving).await;
    serving.abort();
}

#[tokio::test]
async fn bind_does_not_wait_on_a_silent_connection_to_serve_the_child() {
    let dir = tempfile::tempdir().unwrap();
    let (mut serving, token, path) = served_path(&dir);
    let _silent = connect(&path).await.unwrap(); // connects, never says hello
    let mut child = connect(&path).await.unwrap();
    child.hello(&token).await;
    child.call(1, "echo", json!({"value": "served"})).await;
    assert_eq!(child.recv().await.unwrap()["result"], "served");
    still_serving(&mut serving).await;
    serving.abort();
}

/// A bridge for run `r1` whose `key(n)` tool answers its call id, or never answers while `stall`
/// is set; `plan` replays an earlier attempt.
fn keyed_pair(
    stall: &Arc<std::sync::atomic::AtomicBool>,
    plan: Option<runpython_bridge::ReplayPlan>,
) -> (
    JoinHandle<Stop>,
    String,
    Client,
    Arc<std::sync::Mutex<runpython_bridge::Journal>>,
) {
    let mut tools = ToolSet::new();
    let stalling = Arc::clone(stall);
    tools
        .insert(tool_fn("key", "", None, move |args| {
            let stalls = stalling.load(Ordering::SeqCst);
            async move {
                if stalls {
                    std::future::pending::<()>().await;
                }
                Ok(json!(args.call_id))
            }
        }))
        .unwrap();
    let (host, child) = socket_pair().unwrap();
    let mut bridge = Bridge::new(host, tools, BridgeConfig::default())
        .unwrap()
        .with_run_id("r1");
    if let Some(plan) = plan {
        bridge = bridge.with_replay(plan);
    }
    let token = bridge.client_spec_fd(4).token.to_owned();
    let journal = bridge.journal();
    (
        tokio::spawn(bridge.serve()),
        token,
        Client::from_fd(child),
        journal,
    )
}

#[tokio::test]
async fn call_ids_are_the_run_and_the_ordinal_and_a_call_made_again_keeps_its_id() {
    let stall = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (serving, token, mut client, journal) = keyed_pair(&stall, None);
    client.hello(&token).await;
    client.call(1, "key", json!({"n": 1})).await;
    assert_eq!(client.recv().await.unwrap()["result"], "r1.0");
    // The host "dies" during the second call: it is journaled as started, never finished.
    stall.store(true, Ordering::SeqCst);
    client.call(2, "key", json!({"n": 2})).await;
    tokio::time::sleep(SETTLE).await;
    serving.abort();
    let journal = journal.lock().unwrap().clone();
    assert_eq!(journal.entries.len(), 2, "{journal:?}");

    // The resumed attempt makes the unfinished call first: it runs again under its old id; a call the
    // journal does not have gets an id no journaled call has; the finished one is answered from the
    // journal.
    stall.store(false, Ordering::SeqCst);
    let plan = runpython_bridge::ReplayPlan {
        journal: journal.clone(),
        decisions: Default::default(),
        complete: false,
    };
    let complete = runpython_bridge::ReplayPlan {
        complete: true,
        ..plan.clone()
    };
    let (serving, token, mut client, journal) = keyed_pair(&stall, Some(plan));
    client.hello(&token).await;
    client.call(1, "key", json!({"n": 2})).await;
    assert_eq!(client.recv().await.unwrap()["result"], "r1.1");
    client.call(2, "key", json!({"n": 3})).await;
    assert_eq!(client.recv().await.unwrap()["result"], "r1.2");
    client.call(3, "key", json!({"n": 1})).await;
    assert_eq!(client.recv().await.unwrap()["result"], "r1.0");
    serving.abort();
    // The new journal keeps each call under the ordinal of its id, for the next resume.
    let ordinals: Vec<(u32, String)> = journal
        .lock()
        .unwrap()
        .entries
        .iter()
        .map(|e| (e.ordinal, e.args.clone()))
        .collect();
    assert_eq!(
        ordinals,
        [
            (0, r#"{"args":[],"kwargs":{"n":1}}"#.to_owned()),
            (1, r#"{"args":[],"kwargs":{"n":2}}"#.to_owned()),
            (2, r#"{"args":[],"kwargs":{"n":3}}"#.to_owned()),
        ]
    );

    // Replaying a whole attempt (a session's cell), a call past the journal's end is a divergence
    // (above it was made live): the tool is not called, and the bridge stops naming the call.
    let (serving, token, mut client, _) = keyed_pair(&stall, Some(complete));
    client.hello(&token).await;
    client.call(1, "key", json!({"n": 1})).await;
    assert_eq!(client.recv().await.unwrap()["result"], "r1.0");
    client.call(2, "key", json!({"n": 2})).await;
    assert_eq!(client.recv().await.unwrap()["result"], "r1.1");
    client.call(3, "key", json!({"n": 3})).await;
    match serving.await.unwrap() {
        Stop::Diverged {
            step,
            recorded,
            called,
        } => {
            assert_eq!(step, 2);
            assert!(called.contains(r#""n":3"#), "{called}");
            assert_eq!(recorded, "no further call");
        }
        other => panic!("{other:?}"),
    }
}
