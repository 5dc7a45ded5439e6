//! Snapshots of a session's namespace: when to take one (its cost against the replay it saves), taking
//! it (the interpreter pickles its namespace into a pipe, `runpython_snapshot.py`, and the host streams
//! the bytes into the session's tenant behind a head only the host reads), and loading one into a new
//! interpreter. The host never unpickles anything: it checks its own head (the record's epoch, the
//! cells covered, the Python version) and hands the rest to the new sandbox as it is.
//!
//! One snapshot per session is kept, the latest (`Store::put_session_snapshot` replaces it only once
//! the new one is whole). It is taken after a recorded cell when the time spent in cells since the
//! last attempt is at least [`WORTH`] times what the last attempt cost: snapshots then cost at most
//! about a `1/WORTH` share of a session's time, and a restore replays at most about `WORTH` snapshots'
//! worth of cells after the one it loads.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use runpython_store::Store;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _, ReadBuf};

use crate::child::protocol::ControlMessage;
use crate::error::Error;
use crate::session::Live;

const MAGIC: &[u8; 4] = b"RPSN";
const VERSION: u8 = 1;
/// A snapshot is taken once the cells since the last attempt took this many times what it costs.
pub(crate) const WORTH: u32 = 4;
/// What a first snapshot is guessed to cost (a small namespace pickled and written once).
const FIRST_GUESS: Duration = Duration::from_millis(2);
/// A snapshot attempt is interrupted past the larger of this and the time it would save.
const ATTEMPT_AT_LEAST: Duration = Duration::from_secs(2);
/// The answer on a snapshot's pipe is small JSON.
const ANSWER_CAP: usize = 64 * 1024;
/// The head's own bytes, at most (its epoch is a session id).
const HEAD_CAP: usize = 4096;

/// What the host writes before a snapshot's bytes, and alone reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Head {
    /// The record's epoch ([`crate::session::SessionRecord::epoch`]).
    epoch: String,
    /// The recorded cells the namespace holds the effects of.
    cells: u64,
    /// The interpreter's version (major, minor): its bytecode is in the snapshot.
    python: (u32, u32),
}

/// A session's snapshot policy, as its live interpreter goes.
#[derive(Debug, Default)]
pub(crate) struct Snapshots {
    /// Time spent in recorded cells since the last attempt: what replay would cost past it.
    debt: Duration,
    /// What the last attempt cost (0: none yet).
    cost: Duration,
    /// Why this session takes no more snapshots here (an attempt that had to be interrupted).
    off: Option<String>,
}

impl Snapshots {
    /// After a recorded cell that took `cell`: whether a snapshot is worth taking now.
    pub(crate) fn after_cell(&mut self, cell: Duration) -> bool {
        self.debt += cell;
        let cost = if self.cost.is_zero() {
            FIRST_GUESS
        } else {
            self.cost
        };
        self.off.is_none() && self.debt >= cost * WORTH
    }

    /// After a restore that replayed cells taking `replayed` when they ran.
    pub(crate) fn restored(replayed: Duration) -> Self {
        Self {
            debt: replayed,
            ..Self::default()
        }
    }
}

/// How an attempt ended.
#[derive(Debug)]
pub(crate) enum Taken {
    /// Kept.
    Kept,
    /// Not kept, and why (the session's note: its latest cells have no snapshot).
    Failed(String),
    /// The interpreter was killed (it would not stop pickling), and why.
    Killed(String),
}

/// The interpreter's answer to a snapshot message.
#[derive(Debug, Clone, Default, Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    bytes: Option<u64>,
    #[serde(default)]
    why: Option<String>,
    /// Milliseconds the interpreter spent on it, by its own clock.
    #[serde(default)]
    ms: Option<f64>,
}

/// After a recorded cell that ran for `ran_for`: takes a snapshot of the session when one is due,
/// and keeps in its record why the attempt failed, if it did (restores say so). `Some(why)` when the
/// interpreter had to be killed (it would not stop pickling): the session is then restored at its
/// next call.
pub(crate) async fn after_cell(
    engine: &crate::RunPython,
    keep: &crate::durable::persist::Keeping,
    e: &mut crate::session::Entry,
    live: &mut Live,
    ran_for: Duration,
) -> Option<String> {
    let max_bytes = engine.inner.sessions.config.snapshot_max_bytes;
    if max_bytes == 0 || !e.snapshots.after_cell(ran_for) {
        return None;
    }
    let python = match engine.interpreter().await {
        Ok(interpreter) => (interpreter.version.0, interpreter.version.1),
        Err(_) => return None,
    };
    let crate::session::Entry {
        id,
        record,
        snapshots,
        ..
    } = e;
    let record = record.as_mut()?;
    let cells = record.cells.len() as u64;
    let taken = take(
        live,
        &keep.store,
        id,
        &record.epoch,
        cells,
        python,
        max_bytes,
        snapshots,
    )
    .await;
    let note = match taken {
        Ok(Taken::Kept) => None,
        Ok(Taken::Failed(why)) => Some(format!("after its cell {cells}, {why}")),
        Ok(Taken::Killed(why)) => return Some(why),
        Err(err) => Some(format!(
            "after its cell {cells}, its snapshot could not be taken: {}",
            crate::error_report(&err)
        )),
    };
    if record.note != note {
        record.note = note;
        // Best effort: the note only explains a later restore's replay.
        let _ = record.save(&keep.store, id).await;
    }
    None
}

/// Takes a snapshot of `live`'s namespace into `store` as session `id`'s, covering `cells` recorded
/// cells of the record `epoch`, within `max_bytes`; `policy` learns what it cost.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn take(
    live: &mut Live,
    store: &Store,
    id: &str,
    epoch: &str,
    cells: u64,
    python: (u32, u32),
    max_bytes: u64,
    policy: &mut Snapshots,
) -> Result<Taken, Error> {
    let started = Instant::now();
    let allowed = policy.debt.max(ATTEMPT_AT_LEAST);
    policy.debt = Duration::ZERO;
    let head = encode_head(&Head {
        epoch: epoch.to_owned(),
        cells,
        python,
    })?;
    let (data, answer) = live
        .send_snapshot_message(&ControlMessage::Snapshot { max_bytes }, true)
        .await?;
    let data = tokio::net::unix::pipe::Receiver::from_owned_fd(data)
        .map_err(|e| Error::io_pathless("reading a snapshot", e))?;
    let said: Arc<Mutex<Option<Answer>>> = Arc::default();
    let (tell, told) = tokio::sync::oneshot::channel();
    let reader = {
        let said = Arc::clone(&said);
        tokio::spawn(async move {
            let answer = read_answer(answer).await;
            if let Ok(mut slot) = said.lock() {
                *slot = Some(answer.clone());
            }
            let _ = tell.send(answer);
        })
    };
    let gated = Gated {
        head: head.len() as u64,
        inner: std::io::Cursor::new(head).chain(data),
        told: Some(told),
        left: max_bytes + HEAD_CAP as u64,
        seen: 0,
    };
    let write = store.put_session_snapshot(id, gated);
    tokio::pin!(write);
    let written = tokio::select! {
        written = &mut write => Some(written),
        _ = tokio::time::sleep(allowed) => None,
    };
    let written = match written {
        Some(written) => written,
        None => {
            // Too long: interrupt the pickling (the answer then says so and the write fails).
            live.interrupt().await;
            match tokio::time::timeout(crate::session::live::INTERRUPT_GRACE, &mut write).await {
                Ok(written) => {
                    policy.off = Some(format!(
                        "snapshots of this session were stopped: one took longer than {}",
                        crate::protocol::outcome::human_duration(allowed)
                    ));
                    written
                }
                Err(_) => {
                    live.kill();
                    reader.abort();
                    return Ok(Taken::Killed(format!(
                        "pickling the session's namespace for a snapshot did not stop within {} of \
                         an interrupt, so the session's interpreter was killed",
                        crate::protocol::outcome::human_duration(crate::session::live::INTERRUPT_GRACE)
                    )));
                }
            }
        }
    };
    policy.cost = started.elapsed();
    let answer = said.lock().ok().and_then(|slot| slot.clone());
    Ok(match (written, answer) {
        (Ok(_), Some(answer)) if answer.status == "ok" => Taken::Kept,
        (_, Some(answer)) if answer.status == "too_large" => Taken::Failed(format!(
            "its namespace pickles to more than the snapshot bound of {max_bytes} bytes \
             (--session-snapshot-max)"
        )),
        (_, Some(Answer { why: Some(why), .. })) => {
            Taken::Failed(format!("its namespace could not be pickled: {why}"))
        }
        (Err(err), _) => Taken::Failed(format!(
            "the store did not keep its snapshot: {}",
            crate::error_report(&err)
        )),
        (Ok(_), _) => Taken::Failed("the interpreter did not say how its snapshot went".into()),
    })
}

/// A snapshot of `cells` (or fewer) recorded cells of record `epoch`, checked from its head, ready to
/// load: the head's cell count, and the rest of the stored bytes.
pub(crate) struct Found {
    pub cells: u64,
    rest: Vec<u8>,
    stream: futures_util::stream::BoxStream<
        'static,
        Result<runpython_store::Bytes, runpython_store::Error>,
    >,
}

/// Session `id`'s snapshot, if it can be loaded for the record `epoch` of `cells` cells on an
/// interpreter of `python`; otherwise why not (`None`: there is none).
pub(crate) async fn find(
    store: &Store,
    id: &str,
    epoch: &str,
    cells: u64,
    python: (u32, u32),
) -> Result<Result<Found, Option<String>>, Error> {
    let Some(mut stream) = store.get_session_snapshot(id).await? else {
        return Ok(Err(None));
    };
    let mut got = Vec::new();
    let head = loop {
        match decode_head(&got) {
            Ok(Some((head, used))) => {
                got.drain(..used);
                break head;
            }
            Ok(None) if got.len() <= HEAD_CAP => match stream.next().await {
                Some(chunk) => got.extend_from_slice(&chunk?),
                None => return Ok(Err(Some("its snapshot is cut short".into()))),
            },
            Ok(None) => return Ok(Err(Some("its snapshot's head is too long".into()))),
            Err(why) => return Ok(Err(Some(why))),
        }
    };
    if epoch.is_empty() || head.epoch != epoch {
        return Ok(Err(Some(
            "its snapshot belongs to an earlier life of the session (it was reset since)".into(),
        )));
    }
    if head.cells > cells {
        return Ok(Err(Some(format!(
            "its snapshot covers {} cells but its record has {cells}",
            head.cells
        ))));
    }
    if head.python != python {
        return Ok(Err(Some(format!(
            "its snapshot was taken by Python {}.{} and this host runs {}.{}",
            head.python.0, head.python.1, python.0, python.1
        ))));
    }
    Ok(Ok(Found {
        cells: head.cells,
        rest: got,
        stream,
    }))
}

/// Loads `found` into `live` (a new interpreter), with the session's environment `site_dirs`, within
/// `limit`: the milliseconds the interpreter spent loading it, by its own clock (the wait for a new
/// interpreter to be ready is not the snapshot's). `Err(why)` when it did not load: the interpreter
/// may hold part of it and must go.
pub(crate) async fn load(
    live: &mut Live,
    found: Found,
    site_dirs: Vec<&std::path::Path>,
    limit: Duration,
) -> Result<Result<Option<f64>, String>, Error> {
    let (data, answer) = live
        .send_snapshot_message(&ControlMessage::Restore { site_dirs }, false)
        .await?;
    let mut data = tokio::net::unix::pipe::Sender::from_owned_fd(data)
        .map_err(|e| Error::io_pathless("writing a snapshot", e))?;
    let Found {
        rest, mut stream, ..
    } = found;
    let feed = async move {
        data.write_all(&rest).await.map_err(|e| e.to_string())?;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| crate::error_report(&e))?;
            data.write_all(&chunk).await.map_err(|e| e.to_string())?;
        }
        Ok::<(), String>(()) // dropping `data` ends the snapshot for the interpreter
    };
    let loaded = async {
        let (fed, answer) = tokio::join!(feed, read_answer(answer));
        match (fed, answer) {
            (_, answer) if answer.status == "ok" => Ok(answer.ms),
            (Err(why), _) => Err(format!(
                "its snapshot could not be read from the store: {why}"
            )),
            (_, answer) => Err(format!(
                "its snapshot did not load: {}",
                answer
                    .why
                    .unwrap_or_else(|| "the interpreter gave no answer".into())
            )),
        }
    };
    tokio::select! {
        loaded = loaded => Ok(loaded),
        _ = tokio::time::sleep(limit) => Ok(Err(format!(
            "loading its snapshot took longer than the {} left of the replay budget",
            crate::protocol::outcome::human_duration(limit)
        ))),
    }
}

/// The interpreter's answer on `pipe`, read to its end (at most [`ANSWER_CAP`] bytes); an empty one
/// when it gave none (it died, or broke the pipe).
async fn read_answer(mut pipe: tokio::net::unix::pipe::Receiver) -> Answer {
    let mut text = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) if text.len() + n <= ANSWER_CAP => text.extend_from_slice(&chunk[..n]),
            Ok(_) => return Answer::default(),
        }
    }
    serde_json::from_slice(&text).unwrap_or_default()
}

fn encode_head(head: &Head) -> Result<Vec<u8>, Error> {
    let body = postcard::to_allocvec(head)
        .map_err(|e| Error::Internal(format!("cannot encode a snapshot's head: {e}")))?;
    let mut out = MAGIC.to_vec();
    out.push(VERSION);
    out.extend((body.len() as u32).to_be_bytes());
    out.extend(body);
    Ok(out)
}

/// The head at the start of `bytes` and its length; `None` when more bytes are needed.
fn decode_head(bytes: &[u8]) -> Result<Option<(Head, usize)>, String> {
    if bytes.len() < 9 {
        return Ok(None);
    }
    if &bytes[..4] != MAGIC {
        return Err("its snapshot is not in runpython's format".into());
    }
    if bytes[4] != VERSION {
        return Err(format!(
            "its snapshot has version {}, which this runpython does not read",
            bytes[4]
        ));
    }
    let len = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) as usize;
    if len > HEAD_CAP {
        return Err("its snapshot's head is too long".into());
    }
    if bytes.len() < 9 + len {
        return Ok(None);
    }
    postcard::from_bytes(&bytes[9..9 + len])
        .map(|head| Some((head, 9 + len)))
        .map_err(|e| format!("its snapshot's head is corrupt ({e})"))
}

/// The snapshot's bytes as the store reads them: the head, then the interpreter's pipe, ending only
/// once the interpreter said its bytes are whole and they are all there (else an error, and the
/// store keeps the earlier snapshot), and never longer than `left`.
struct Gated<R> {
    inner: R,
    told: Option<tokio::sync::oneshot::Receiver<Answer>>,
    left: u64,
    /// Bytes read so far, and the head's.
    seen: u64,
    head: u64,
}

impl<R: AsyncRead + Unpin> AsyncRead for Gated<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        use std::future::Future as _;
        let before = buf.filled().len();
        std::task::ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        let n = (buf.filled().len() - before) as u64;
        if n > 0 {
            self.seen += n;
            if self.seen > self.left {
                return Poll::Ready(Err(std::io::Error::other("the snapshot passed its bound")));
            }
            return Poll::Ready(Ok(()));
        }
        let Some(told) = self.told.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let answer = std::task::ready!(Pin::new(told).poll(cx)).unwrap_or_default();
        self.told = None;
        let whole = answer.status == "ok" && answer.bytes == Some(self.seen - self.head);
        Poll::Ready(match whole {
            true => Ok(()),
            false => Err(std::io::Error::other(
                "the interpreter did not finish its snapshot",
            )),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_is_taken_when_the_cells_since_cost_several_of_it() {
        let mut policy = Snapshots::default();
        // Cheap cells: the first guess (2 ms) times four is 8 ms of cells.
        assert!(!policy.after_cell(Duration::from_millis(3)));
        assert!(!policy.after_cell(Duration::from_millis(3)));
        assert!(policy.after_cell(Duration::from_millis(3)));
        policy.debt = Duration::ZERO;
        policy.cost = Duration::from_millis(50);
        assert!(!policy.after_cell(Duration::from_millis(150)));
        assert!(policy.after_cell(Duration::from_millis(60)));
        policy.off = Some("stopped".into());
        assert!(!policy.after_cell(Duration::from_secs(60)));
    }

    #[test]
    fn a_head_is_read_back_from_any_prefix_and_refused_when_foreign() {
        let head = Head {
            epoch: "e".into(),
            cells: 3,
            python: (3, 11),
        };
        let mut bytes = encode_head(&head).unwrap();
        let len = bytes.len();
        bytes.extend(b"pickle");
        for cut in 0..len {
            assert_eq!(decode_head(&bytes[..cut]).unwrap(), None, "{cut}");
        }
        assert_eq!(decode_head(&bytes).unwrap(), Some((head, len)));
        assert!(decode_head(b"\x80\x05pickle...").is_err());
        bytes[4] = 9;
        assert!(decode_head(&bytes).unwrap_err().contains("version 9"));
    }
}
