//! `runpython host`: an engine kept warm for `runpython run` with the same flags, from the same
//! directory and environment (what decides that, who may connect, and the frames: `crate::hosting`).
//! Each connection is one run, forked from the engine's templates; the client going away ends it.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use runpython_core::{error_report, Event, PoolConfig, RunPython};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{UnixListener, UnixStream};
use tokio::signal::unix::{signal, SignalKind};

use super::run::{request, resumable_notice};
use crate::args::HostArgs;
use crate::hosting::{self, Frame, WireRun};
use crate::settings;

/// How often the host looks at its socket (still its own?) and its idle time.
const TICK: Duration = Duration::from_secs(1);

/// How long a connection may take to send its run (a client sends it as soon as it connects): one
/// that says nothing is closed, so it can neither hold a task nor keep the host from idling out.
const REQUEST_WITHIN: Duration = Duration::from_secs(10);

/// At shutdown, how long the listener's queue is given to yield one more connection.
const DRAIN: Duration = Duration::from_millis(20);

pub(crate) async fn host(args: HostArgs) -> anyhow::Result<ExitCode> {
    let path = hosting::socket_path(&args.engine).context(
        "no private directory for the host's socket: /run/runpython as root, else \
         $XDG_RUNTIME_DIR/runpython or the user's cache directory, which must be this user's and \
         writable by no one else",
    )?;
    let idle = (args.idle > 0).then(|| Duration::from_secs(args.idle));
    // Every run forked from its environment's template, kept as long as the host is.
    let pool = PoolConfig {
        size: 1,
        idle: idle.unwrap_or(Duration::from_secs(365 * 24 * 3600)),
        warm_imports: Vec::new(),
        prestart: false,
        templates: true,
    };
    let engine = settings::builder(&args.engine).await?.pool(pool).build()?;
    let engine = settings::scoped(&args.engine, engine)?;
    settings::warm_up(&args.engine, &engine).await?;
    engine
        .start_base_template()
        .await
        .context("starting the template runs without dependencies are forked from")?;
    let listener = bind(&path)?;
    let ours = inode(&path).context("the host's socket vanished as it was made")?;
    // The one line a supervisor or test waits for, whatever the log level.
    say_err!(
        "runpython host: serving `runpython run` with these flags at {}",
        path.display()
    );
    let activity = Arc::new(Mutex::new(Activity {
        in_flight: 0,
        last: Instant::now(),
    }));
    let mut sigterm = signal(SignalKind::terminate()).context("watching for SIGTERM")?;
    let mut tick = tokio::time::interval(TICK);
    let why = loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => spawn_serve(&engine, &activity, stream),
                Err(e) => {
                    // Out of descriptors, say: the runs in flight free some.
                    say_err!("runpython host: accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = tokio::signal::ctrl_c() => break "SIGINT",
            _ = sigterm.recv() => break "SIGTERM",
            _ = tick.tick() => {
                if inode(&path).ok() != Some(ours) {
                    break "its socket was removed or another host took its place";
                }
                if let Some(idle) = idle {
                    if Activity::idle_for(&activity) >= idle {
                        break "idle";
                    }
                }
            }
        }
    };
    // New runs go back to their own processes; the ones already connected (waiting in the listener's
    // queue: their clients sent their runs) are served, and all in flight finish (a second signal
    // ends them).
    if inode(&path).ok() == Some(ours) {
        let _ = std::fs::remove_file(&path);
    }
    while let Ok(Ok((stream, _))) = tokio::time::timeout(DRAIN, listener.accept()).await {
        spawn_serve(&engine, &activity, stream);
    }
    drop(listener);
    loop {
        if Activity::in_flight(&activity) == 0 {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            _ = tokio::signal::ctrl_c() => break,
            _ = sigterm.recv() => break,
        }
    }
    say_err!("runpython host: stopped ({why})");
    Ok(ExitCode::SUCCESS)
}

/// One connection served on a task of its own, counted in `activity` until it is done (even if
/// its task ends early).
fn spawn_serve(engine: &RunPython, activity: &Arc<Mutex<Activity>>, stream: UnixStream) {
    let busy = Busy::new(activity);
    let engine = engine.clone();
    tokio::spawn(async move {
        serve(&engine, stream).await;
        drop(busy);
    });
}

/// A connection counted in flight while this lives.
struct Busy(Arc<Mutex<Activity>>);

impl Busy {
    fn new(activity: &Arc<Mutex<Activity>>) -> Self {
        Activity::begin(activity);
        Self(Arc::clone(activity))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        Activity::end(&self.0);
    }
}

/// Runs in flight, and when the last one ended.
struct Activity {
    in_flight: usize,
    last: Instant,
}

impl Activity {
    fn begin(this: &Mutex<Self>) {
        if let Ok(mut a) = this.lock() {
            a.in_flight += 1;
        }
    }

    fn end(this: &Mutex<Self>) {
        if let Ok(mut a) = this.lock() {
            a.in_flight -= 1;
            a.last = Instant::now();
        }
    }

    fn in_flight(this: &Mutex<Self>) -> usize {
        this.lock().map_or(0, |a| a.in_flight)
    }

    fn idle_for(this: &Mutex<Self>) -> Duration {
        this.lock()
            .ok()
            .filter(|a| a.in_flight == 0)
            .map_or(Duration::ZERO, |a| a.last.elapsed())
    }
}

/// The listener at `path`, made under a name of its own and renamed into place, so a client never
/// finds a socket nobody listens on yet, and a host already there is replaced at once.
fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    let pending = path.with_extension(format!("{}.new", std::process::id()));
    let _ = std::fs::remove_file(&pending);
    let listener = UnixListener::bind(&pending)
        .with_context(|| format!("listening at {}", pending.display()))?;
    let placed = std::fs::set_permissions(&pending, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&pending, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&pending);
        return Err(e).with_context(|| format!("putting the host's socket at {}", path.display()));
    }
    Ok(listener)
}

fn inode(path: &Path) -> std::io::Result<(u64, u64)> {
    std::fs::symlink_metadata(path).map(|m| (m.dev(), m.ino()))
}

/// Whether the peer may have runs here: this user, in this host's user and PID namespaces (a
/// sandboxed run never is, even one that could reach the socket).
fn check_peer(stream: &UnixStream) -> Result<(), String> {
    let cred = stream
        .peer_cred()
        .map_err(|e| format!("cannot read the connecting process's credentials: {e}"))?;
    let me = nix::unistd::geteuid().as_raw();
    if cred.uid() != me {
        return Err(format!(
            "this runpython host serves only its own user (uid {me}), not uid {}",
            cred.uid()
        ));
    }
    let pid = cred.pid().filter(|&pid| pid > 0).ok_or_else(|| {
        "the connecting process is not visible from this host's PID namespace".to_owned()
    })?;
    same_namespaces(pid)
}

/// `pid` shares this process's user and PID namespaces.
fn same_namespaces(pid: i32) -> Result<(), String> {
    for ns in ["user", "pid"] {
        let theirs = std::fs::read_link(format!("/proc/{pid}/ns/{ns}"));
        let mine = std::fs::read_link(format!("/proc/self/ns/{ns}"));
        match (theirs, mine) {
            (Ok(theirs), Ok(mine)) if theirs == mine => {}
            _ => {
                return Err(format!(
                    "this runpython host serves only processes in its own {ns} namespace (a \
                     sandboxed run is in one of its own)"
                ))
            }
        }
    }
    Ok(())
}

/// One connection: its request run, its events and envelope sent back. Returns when the run is done
/// or the client went away (the run dropped, which kills its processes).
async fn serve(engine: &RunPython, stream: UnixStream) {
    let allowed = check_peer(&stream);
    let (mut from, mut to) = stream.into_split();
    if let Err(reason) = allowed {
        say_err!("runpython host: refused a connection: {reason}");
        let _ = send(&mut to, &Frame::Failed(reason)).await;
        return;
    }
    if send(&mut to, &Frame::Ready).await.is_err() {
        return; // the client gave up waiting and runs the code itself
    }
    let wire: WireRun = match tokio::time::timeout(REQUEST_WITHIN, receive(&mut from)).await {
        Ok(Ok(Some(wire))) => wire,
        Ok(Ok(None)) => return,
        Err(_) => {
            say_err!(
                "runpython host: closed a connection that sent no run within {}s",
                REQUEST_WITHIN.as_secs()
            );
            return;
        }
        Ok(Err(e)) => {
            let _ = send(
                &mut to,
                &Frame::Failed(format!("a malformed run request: {e}")),
            )
            .await;
            return;
        }
    };
    let streaming = wire.stream;
    let request = match request(wire) {
        Ok(request) => request,
        Err(e) => {
            let _ = send(&mut to, &Frame::Failed(error_report(e.as_ref()))).await;
            return;
        }
    };
    let mut handle = engine.start(request);
    let mut extra = [0u8; 1];
    loop {
        let event = tokio::select! {
            event = handle.next_event() => event,
            // The client sends nothing after its request: readable means it went away.
            _ = from.read(&mut extra) => {
                say_err!("runpython host: a client went away; its run is stopped");
                return;
            }
        };
        let frame = match event {
            None => break,
            Some(_) if !streaming => continue,
            Some(Event::Stdout(text)) => Frame::Stdout(text),
            Some(Event::Stderr(text)) => Frame::Stderr(text),
            Some(Event::Dependencies(step)) => match step.message() {
                Some(text) => Frame::Status(text),
                None => continue,
            },
            Some(Event::Resumable { run_id }) => Frame::Notice(resumable_notice(engine, &run_id)),
            Some(_) => continue,
        };
        if send(&mut to, &frame).await.is_err() {
            return;
        }
    }
    let last = match handle.wait().await {
        Ok(envelope) => match serde_json::to_string(&envelope) {
            Ok(json) => {
                // One line per run, as `serve` logs one per call.
                say_err!(
                    "runpython host: run {} {} in {} ms",
                    envelope.run_id,
                    serde_json::to_value(envelope.status).unwrap_or_default(),
                    envelope.duration_ms
                );
                Frame::Envelope(json)
            }
            Err(e) => Frame::Failed(format!("cannot encode the envelope: {e}")),
        },
        Err(e) => Frame::Failed(error_report(&e)),
    };
    let _ = send(&mut to, &last).await;
}

async fn send(to: &mut OwnedWriteHalf, frame: &Frame) -> std::io::Result<()> {
    to.write_all(&hosting::encode(frame)?).await
}

async fn receive(from: &mut OwnedReadHalf) -> std::io::Result<Option<WireRun>> {
    let mut prefix = [0u8; 4];
    match from.read_exact(&mut prefix).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut body = vec![0u8; hosting::frame_len(prefix)?];
    from.read_exact(&mut body).await?;
    hosting::decode(&body).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_in_another_user_namespace_is_refused() {
        assert!(same_namespaces(std::process::id() as i32).is_ok());
        let mut child = match std::process::Command::new("unshare")
            .args(["--user", "--map-root-user", "sleep", "30"])
            .spawn()
        {
            Ok(child) => child,
            Err(e) => panic!("unshare: {e}"),
        };
        // The child enters its namespace right after the fork: wait for it to be there.
        let pid = child.id() as i32;
        let mine = std::fs::read_link("/proc/self/ns/user").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_link(format!("/proc/{pid}/ns/user"))
            .ok()
            .as_ref()
            == Some(&mine)
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        let refused = same_namespaces(pid);
        let _ = child.kill();
        let _ = child.wait();
        let reason = refused.unwrap_err();
        assert!(reason.contains("user namespace"), "{reason}");
    }
}
