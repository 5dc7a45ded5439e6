//! The warm host `runpython run` hands its runs to: what both ends share. `runpython host` (in
//! `commands/host.rs`) keeps an engine with its templates and serves runs over a Unix socket;
//! `runpython run` (in `commands/run.rs`) connects when one is there for it and prints what it
//! answers, so the process that prints starts no interpreter, no engine and no async runtime.
//!
//! **Which host serves which run.** A host serves only runs that would have been made exactly as
//! it makes them: the socket's name is a digest of everything an engine built by `runpython run`
//! depends on, read by each end for itself ([`socket_path`]): the program's file, the user, the
//! working directory, the engine's flags as parsed and the environment (all of it but the shell's
//! bookkeeping: `PWD`, `OLDPWD`, `SHLVL`, `_`). Anything different and `run` finds no socket and
//! runs in its own process, as without a host. A host keeps what it read when it started (its
//! flags' files, the interpreter it found); start it again after changing them.
//!
//! **Who may use it.** The socket lives in the user's private runtime directory
//! ([`runpython_core::runtime_dir`]: `0700`, owned by the user, checked without following links).
//! The host serves a peer only with its own user id, user namespace and PID namespace (so never a
//! sandboxed run, which is in namespaces of its own even where it could reach the socket), and a
//! run's request carries only what `runpython run`'s own flags put in a request, never the engine's
//! policy: whoever reaches the socket gets runs confined exactly as the host's flags say. The client
//! connects only to a socket its own user owns and a host whose peer credentials are its own user.
//!
//! **The protocol.** One connection per run. Frames are a little-endian `u32` length and a postcard
//! body. The host says `Ready` (or `Failed`, refusing the peer) as it accepts; only then does the
//! client send its one [`WireRun`], so a client that gave up waiting runs the code itself and the
//! host never runs it too. The host answers with [`Frame`]s, the last an `Envelope` or `Failed`. The
//! client going away (its process killed, Ctrl-C) ends the run: the host watches the connection and
//! drops the run, which kills its processes.

use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::args::EngineArgs;

/// Bumped whenever the frames change meaning; part of the socket's name, so an older host is never
/// asked by a newer client.
const PROTOCOL: u32 = 2;

/// How long a client waits for the host's `Ready` before it runs the code itself. A host accepts at
/// once unless it is stopped (Ctrl-Z in its terminal) or starved; the client then must not hang, and
/// since it has sent nothing yet, the host can never run that code as well.
const READY_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// The largest frame either end reads: a run's request holds its `--file`s (each up to
/// [`runpython_core::MAX_INLINE_FILE`]), and an envelope is bounded by the engine's limits.
pub(crate) const MAX_FRAME: usize = 1 << 30;

/// Variables the shell changes on its own, which no engine reads.
const SHELL_BOOKKEEPING: [&str; 4] = ["PWD", "OLDPWD", "SHLVL", "_"];

/// One run, as `runpython run`'s flags describe it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct WireRun {
    pub code: String,
    pub no_memo: bool,
    pub env: Vec<(String, String)>,
    pub inputs: Vec<(String, WireInput)>,
    pub files: Vec<(String, WireFile)>,
    /// Whether the client prints the code's output as it comes (human mode) or only the envelope.
    pub stream: bool,
}

/// A global, as `--input` gives it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum WireInput {
    /// JSON text (postcard cannot carry a self-describing value; the text keeps numbers exact).
    Json(String),
    Artifact(String),
}

/// A file put in the run, as `--file` gives it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum WireFile {
    Bytes(Vec<u8>),
    Artifact(String),
}

/// What the host answers, in order.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Frame {
    /// The connection is accepted: send the run. The first frame.
    Ready,
    /// A dependency step, as the status line shows it.
    Status(String),
    Stdout(String),
    Stderr(String),
    /// A line for stderr (a durable run's id and how to resume it).
    Notice(String),
    /// The run's envelope as JSON; the last frame.
    Envelope(String),
    /// What went wrong before there was an envelope (exit status 2); the last frame.
    Failed(String),
}

/// Where the host for runs with these flags, from this directory and environment, listens; `None`
/// where there is no private runtime directory (then there is no host).
pub(crate) fn socket_path(engine: &EngineArgs) -> Option<PathBuf> {
    let dir = runpython_core::runtime_dir()?;
    Some(dir.join(format!("host-{}.sock", fingerprint(engine)?)))
}

/// A digest of what an engine built from `engine` depends on; `None` without a working directory.
fn fingerprint(engine: &EngineArgs) -> Option<String> {
    let mut hasher = blake3::Hasher::new();
    let mut field = |name: &str, value: &[u8]| {
        // Length-prefixed, so no two different inputs hash the same bytes.
        for part in [name.as_bytes(), value] {
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
    };
    field("protocol", &PROTOCOL.to_le_bytes());
    field("version", env!("CARGO_PKG_VERSION").as_bytes());
    field("code", runpython_core::code_identity().as_bytes());
    field("uid", &nix::unistd::geteuid().as_raw().to_le_bytes());
    let cwd = std::env::current_dir().ok()?;
    field("cwd", cwd.as_os_str().as_encoded_bytes());
    field("flags", format!("{engine:?}").as_bytes());
    let mut vars: Vec<_> = std::env::vars_os()
        .filter(|(name, _)| !SHELL_BOOKKEEPING.iter().any(|skip| name == skip))
        .collect();
    vars.sort();
    for (name, value) in vars {
        field("var", name.as_encoded_bytes());
        field("value", value.as_encoded_bytes());
    }
    let digest = hasher.finalize();
    Some(digest.to_hex()[..32].to_string())
}

/// A connection to the host at `path`, ready for a run, when one is there: the socket is this
/// user's, so is the process listening on it, and it said `Ready` within [`READY_WITHIN`]. `None`
/// otherwise (no host, one that stopped or does not answer, one to distrust): the caller runs the
/// code itself. `Some(Err(reason))`: the host refused this process.
pub(crate) fn connect(path: &std::path::Path) -> Option<Result<UnixStream, String>> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    let me = nix::unistd::geteuid().as_raw();
    if !meta.file_type().is_socket() || meta.uid() != me {
        return None;
    }
    let stream = UnixStream::connect(path).ok()?;
    let peer =
        nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials).ok()?;
    if peer.uid() != me {
        return None;
    }
    stream.set_read_timeout(Some(READY_WITHIN)).ok()?;
    let answer = receive::<Frame>(&stream);
    stream.set_read_timeout(None).ok()?;
    match answer.ok()?? {
        Frame::Ready => Some(Ok(stream)),
        Frame::Failed(reason) => Some(Err(reason)),
        _ => None,
    }
}

/// `value` as one frame.
pub(crate) fn encode<T: Serialize>(value: &T) -> std::io::Result<Vec<u8>> {
    let body = postcard::to_stdvec(value).map_err(std::io::Error::other)?;
    let len = u32::try_from(body.len())
        .ok()
        .filter(|&len| len as usize <= MAX_FRAME)
        .ok_or_else(|| std::io::Error::other(format!("a frame over {MAX_FRAME} bytes")))?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// A frame's body, checked against [`MAX_FRAME`]; `len` is its prefix.
pub(crate) fn frame_len(prefix: [u8; 4]) -> std::io::Result<usize> {
    let len = u32::from_le_bytes(prefix) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::other(format!(
            "a frame of {len} bytes, over the {MAX_FRAME} this protocol allows"
        )));
    }
    Ok(len)
}

pub(crate) fn decode<T: for<'de> Deserialize<'de>>(body: &[u8]) -> std::io::Result<T> {
    postcard::from_bytes(body).map_err(|e| std::io::Error::other(format!("a malformed frame: {e}")))
}

/// Writes one frame (blocking).
pub(crate) fn send<T: Serialize>(mut to: impl Write, value: &T) -> std::io::Result<()> {
    to.write_all(&encode(value)?)?;
    to.flush()
}

/// Reads one frame (blocking); `None` at a clean end of the stream before a frame starts.
pub(crate) fn receive<T: for<'de> Deserialize<'de>>(
    mut from: impl Read,
) -> std::io::Result<Option<T>> {
    let mut prefix = [0u8; 4];
    match from.read_exact(&mut prefix) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut body = vec![0u8; frame_len(prefix)?];
    from.read_exact(&mut body)?;
    decode(&body).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_a_huge_prefix_is_refused_before_allocating() {
        let run = WireRun {
            code: "print(1)".into(),
            no_memo: true,
            env: vec![("A".into(), "b".into())],
            inputs: vec![(
                "x".into(),
                WireInput::Json("12345678901234567890123".into()),
            )],
            files: vec![("f.bin".into(), WireFile::Bytes(vec![0, 1, 2]))],
            stream: false,
        };
        let bytes = encode(&run).unwrap();
        let back: WireRun = receive(&bytes[..]).unwrap().unwrap();
        assert_eq!(back.code, "print(1)");
        assert!(matches!(&back.inputs[0].1, WireInput::Json(t) if t == "12345678901234567890123"));
        assert!(matches!(&back.files[0].1, WireFile::Bytes(b) if b == &[0, 1, 2]));
        let huge = [0xff, 0xff, 0xff, 0xff];
        let err = receive::<WireRun>(&huge[..]).unwrap_err();
        assert!(err.to_string().contains("over the"), "{err}");
        assert!(receive::<WireRun>(&[][..]).unwrap().is_none());
        let truncated = &bytes[..bytes.len() - 1];
        assert!(receive::<WireRun>(truncated).is_err());
    }
}
