//! Moving a joined connection's bytes: the kernel's `splice(2)` from one socket through a pipe
//! into the other, so no byte is copied into the host's memory, or a copy through a buffer where
//! the bytes must be read (the code's, scanned for its secrets' placeholders) or no pipe can be
//! had. Each direction counts what it moved; one that ends shuts the other socket's writing side,
//! as a half-close passes, and an error in either ends both.
//!
//! Measured against the copy it replaced, interleaved (BENCHMARKS.md, egress): the host spends
//! less CPU per byte, and a 1 MiB pipe moves about a third more bytes per second than the
//! default 64 KiB one, so a pipe is grown to 1 MiB while the process holds fewer than
//! [`MAX_BIG_PIPES`] such (each can pin 1 MiB of pages; past them, the default size). Making a
//! pipe costs about as much as a small request, so a direction that ended with its pipe empty
//! gives it back for the next connection ([`MAX_IDLE_PIPES`] kept; one that failed, holding bytes
//! of its connection, is closed).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use tokio::io::Interest;
use tokio::net::TcpStream;

use super::secrets::Scanner;

/// The copy's buffer, and the most one `splice` moves through a pipe of the default size.
const CHUNK: usize = 64 << 10;

/// The size a pipe is grown to.
const BIG_PIPE: usize = 1 << 20;

/// Pipes of [`BIG_PIPE`] the process holds at most (64 MiB of pages together).
const MAX_BIG_PIPES: usize = 64;

/// Pipes of [`BIG_PIPE`] held now.
static BIG_PIPES: AtomicUsize = AtomicUsize::new(0);

/// Empty pipes kept for the next connections, at most.
const MAX_IDLE_PIPES: usize = 32;

/// Empty pipes kept for the next connections.
static IDLE_PIPES: Mutex<Vec<Pipe>> = Mutex::new(Vec::new());

/// Told which secret's placeholder a scanned direction found.
pub(super) type Found = Box<dyn FnMut(String) + Send>;

/// How a direction treats the bytes it moves.
pub(super) enum Way {
    /// Through a pipe, never read by the host.
    Splice,
    /// Read and scanned: a placeholder found ends the connection before its chunk is written.
    Scanned(Scanner, Found),
}

/// Moves bytes both ways between `a` and `b` until both ends closed or either failed: `a` to `b`
/// as `a_to_b` says, counted by `sent`, and `b` to `a` spliced, counted by `received`.
pub(super) async fn both(
    a: &TcpStream,
    b: &TcpStream,
    a_to_b: Way,
    sent: impl Fn(u64),
    received: impl Fn(u64),
) -> io::Result<()> {
    tokio::try_join!(
        one_way(a, b, a_to_b, sent),
        one_way(b, a, Way::Splice, received)
    )?;
    Ok(())
}

/// Moves `from`'s bytes to `to` until `from` ends (then `to`'s writing side is shut).
async fn one_way(
    from: &TcpStream,
    to: &TcpStream,
    way: Way,
    count: impl Fn(u64),
) -> io::Result<()> {
    match way {
        Way::Splice => match Pipe::take() {
            Ok(pipe) => {
                splice(from, to, &pipe, count).await?;
                pipe.give_back();
            }
            // Out of descriptors or pipe pages: the bytes still pass, through the host.
            Err(_) => copy(from, to, None, count).await?,
        },
        Way::Scanned(scanner, found) => copy(from, to, Some((scanner, found)), count).await?,
    }
    // SAFETY: shutdown on a socket this connection holds; an error (the peer gone) changes nothing.
    unsafe { libc::shutdown(to.as_raw_fd(), libc::SHUT_WR) };
    Ok(())
}

/// A pipe's two ends, non-blocking.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// Bytes it holds at most.
    capacity: usize,
    /// Whether it counts among [`BIG_PIPES`].
    big: bool,
}

impl Pipe {
    /// An idle pipe, or a new one.
    fn take() -> io::Result<Pipe> {
        let idle = IDLE_PIPES.lock().unwrap_or_else(|p| p.into_inner()).pop();
        idle.map_or_else(Pipe::new, Ok)
    }

    /// Keeps the pipe for another connection if it is empty (else closes it).
    fn give_back(self) {
        let mut held: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int: the bytes the pipe holds.
        let read = unsafe { libc::ioctl(self.read.as_raw_fd(), libc::FIONREAD, &mut held) };
        if read != 0 || held != 0 {
            return;
        }
        let mut idle = IDLE_PIPES.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE_PIPES {
            idle.push(self);
        }
    }

    fn new() -> io::Result<Pipe> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: pipe2 writes two descriptors into the array.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: two new descriptors owned by nobody else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let mut pipe = Pipe {
            read,
            write,
            capacity: CHUNK,
            big: false,
        };
        if BIG_PIPES.fetch_add(1, Ordering::Relaxed) < MAX_BIG_PIPES {
            // SAFETY: F_SETPIPE_SZ on our pipe; refused (the user's pipe pages spent), it keeps
            // the default size.
            let size = unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, BIG_PIPE as libc::c_int) };
            if size >= BIG_PIPE as libc::c_int {
                pipe.capacity = BIG_PIPE;
                pipe.big = true;
            }
        }
        if !pipe.big {
            BIG_PIPES.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(pipe)
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        if self.big {
            BIG_PIPES.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// `splice(2)` from `from` to `to`, up to `len` bytes: how many moved (0: `from` ended).
fn splice_fd(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    let flags = libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK;
    loop {
        // SAFETY: splice between two descriptors this connection holds, no offsets.
        let n = unsafe {
            libc::splice(
                from,
                std::ptr::null_mut(),
                to,
                std::ptr::null_mut(),
                len,
                flags,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// From the socket into the pipe while it is empty, then out of the pipe into the other socket.
async fn splice(
    from: &TcpStream,
    to: &TcpStream,
    pipe: &Pipe,
    count: impl Fn(u64),
) -> io::Result<()> {
    let (pipe_in, pipe_out) = (pipe.write.as_raw_fd(), pipe.read.as_raw_fd());
    loop {
        let mut held = loop {
            from.readable().await?;
            match from.try_io(Interest::READABLE, || {
                splice_fd(from.as_raw_fd(), pipe_in, pipe.capacity)
            }) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        };
        if held == 0 {
            return Ok(());
        }
        count(held as u64);
        while held > 0 {
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || {
                splice_fd(pipe_out, to.as_raw_fd(), held)
            }) {
                Ok(n) => held -= n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Through a buffer of the host's, each chunk scanned first when there is a scanner.
async fn copy(
    from: &TcpStream,
    to: &TcpStream,
    mut scan: Option<(Scanner, Found)>,
    count: impl Fn(u64),
) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = loop {
            from.readable().await?;
            match from.try_read(&mut buf) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            return Ok(());
        }
        if let Some((scanner, found)) = &mut scan {
            if let Some(secret) = scanner.feed(&buf[..n]) {
                found(secret);
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "a secret's placeholder sent where it may not go",
                ));
            }
        }
        count(n as u64);
        let mut written = 0;
        while written < n {
            to.writable().await?;
            match to.try_write(&buf[written..n]) {
                Ok(w) => written += w,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A connected pair of loopback sockets.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let connecting = TcpStream::connect(listener.local_addr().unwrap());
        let (a, b) = tokio::join!(connecting, listener.accept());
        (a.unwrap(), b.unwrap().0)
    }

    #[tokio::test]
    async fn spliced_bytes_pass_whole_both_ways_counted_and_half_closes_pass() {
        // client ⇄ (a | b) ⇄ server, the middle joined by `both`.
        let (mut client, a) = pair().await;
        let (b, mut server) = pair().await;
        let (out, inn) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (o, i) = (Arc::clone(&out), Arc::clone(&inn));
        let joined = tokio::spawn(async move {
            both(
                &a,
                &b,
                Way::Splice,
                |n| {
                    o.fetch_add(n, Ordering::Relaxed);
                },
                |n| {
                    i.fetch_add(n, Ordering::Relaxed);
                },
            )
            .await
        });
        let up: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let down: Vec<u8> = (0..5_000_000u32).map(|i| (i % 241) as u8).collect();
        let (up2, down2) = (up.clone(), down.clone());
        let serving = tokio::spawn(async move {
            let mut got = Vec::new();
            server.read_to_end(&mut got).await.unwrap(); // the client's half-close reached it
            server.write_all(&down2).await.unwrap();
            drop(server);
            got
        });
        client.write_all(&up2).await.unwrap();
        client.shutdown().await.unwrap();
        let mut back = Vec::new();
        client.read_to_end(&mut back).await.unwrap();
        assert!(
            serving.await.unwrap() == up,
            "the upload changed on its way"
        );
        assert!(back == down, "the download changed on its way");
        joined.await.unwrap().unwrap();
        assert_eq!(out.load(Ordering::Relaxed), up.len() as u64);
        assert_eq!(inn.load(Ordering::Relaxed), down.len() as u64);
        // The directions ended cleanly: their pipes, empty, wait for the next connection.
        assert!(!IDLE_PIPES.lock().unwrap().is_empty());
    }

    #[test]
    fn a_pipe_holding_bytes_is_never_kept_for_another_connection() {
        let pipe = Pipe::new().unwrap();
        // SAFETY: a one-byte write from a live buffer into a pipe this test owns.
        let wrote = unsafe { libc::write(pipe.write.as_raw_fd(), b"x".as_ptr().cast(), 1) };
        assert_eq!(wrote, 1);
        let before = IDLE_PIPES.lock().unwrap().len();
        pipe.give_back();
        assert!(IDLE_PIPES.lock().unwrap().len() <= before);
    }
}
