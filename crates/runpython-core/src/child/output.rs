//! Bounded capture of a stream: the first and last characters kept, the middle counted, memory fixed;
//! and, when runs are kept, the whole stream on its way to the store as it is read.

use std::sync::{Arc, Mutex};

use runpython_store::Redactor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::protocol::envelope::StreamTruncation;
use crate::protocol::request::Event;

/// Keeps the head and tail of a stream within `max_chars` characters, decoding UTF-8 across chunk edges.
#[derive(Debug)]
pub(crate) struct HeadTail {
    head_cap: usize,
    tail_cap: usize,
    head: String,
    head_chars: usize,
    tail: String,
    tail_chars: usize,
    total_chars: u64,
    pending: Vec<u8>,
}

impl HeadTail {
    /// A capture that keeps at most `max_chars` characters (half head, half tail).
    pub fn new(max_chars: usize) -> Self {
        let head_cap = max_chars / 2;
        Self {
            head_cap,
            tail_cap: max_chars - head_cap,
            head: String::new(),
            head_chars: 0,
            tail: String::new(),
            tail_chars: 0,
            total_chars: 0,
            pending: Vec::new(),
        }
    }

    /// Feeds raw bytes; returns the text decoded from them (for live events).
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        let mut data = std::mem::take(&mut self.pending);
        data.extend_from_slice(bytes);
        let mut text = String::new();
        let mut rest = &data[..];
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    text.push_str(s);
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid_up_to` marks a valid UTF-8 prefix, so this never falls back.
                    text.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[bad..];
                        }
                        None => {
                            // An incomplete sequence at the end: wait for the next chunk.
                            self.pending = after.to_vec();
                            break;
                        }
                    }
                }
            }
        }
        self.push_str(&text);
        text
    }

    /// Feeds decoded text.
    pub fn push_str(&mut self, s: &str) {
        let count = s.chars().count();
        self.total_chars += count as u64;
        let mut rest = s;
        let mut rest_chars = count;
        if self.head_chars < self.head_cap {
            let take = (self.head_cap - self.head_chars).min(count);
            let split = byte_index_of_char(rest, take);
            self.head.push_str(&rest[..split]);
            self.head_chars += take;
            rest = &rest[split..];
            rest_chars -= take;
        }
        if rest.is_empty() {
            return;
        }
        if rest_chars >= self.tail_cap {
            let skip = rest_chars - self.tail_cap;
            self.tail.clear();
            self.tail.push_str(&rest[byte_index_of_char(rest, skip)..]);
            self.tail_chars = self.tail_cap;
        } else {
            self.tail.push_str(rest);
            self.tail_chars += rest_chars;
            // Trim in batches so a stream of tiny writes costs amortised O(1) per character.
            if self.tail_chars > 2 * self.tail_cap.max(1024) {
                self.trim_tail();
            }
        }
    }

    fn trim_tail(&mut self) {
        if self.tail_chars > self.tail_cap {
            let skip = self.tail_chars - self.tail_cap;
            let cut = byte_index_of_char(&self.tail, skip);
            self.tail.drain(..cut);
            self.tail_chars = self.tail_cap;
        }
    }

    /// The kept text (with an explicit marker where the middle was left out) and the truncation counts.
    #[cfg(test)]
    pub fn finish(self) -> (String, Option<StreamTruncation>) {
        let max = self.head_cap + self.tail_cap;
        self.into_captured().render(max)
    }

    /// What was kept, to render at this size or smaller.
    pub fn into_captured(mut self) -> Captured {
        if !self.pending.is_empty() {
            self.pending.clear();
            self.push_str("\u{FFFD}");
        }
        self.trim_tail();
        Captured {
            head: self.head,
            tail: self.tail,
            total_chars: self.total_chars,
            stored: None,
        }
    }
}

/// The head and tail of a finished stream, and where the whole of it was kept.
#[derive(Debug, Clone, Default)]
pub(crate) struct Captured {
    head: String,
    tail: String,
    total_chars: u64,
    /// The artifact holding the whole stream, and whether it stopped at [`FULL_OUTPUT_CAP`].
    stored: Option<(String, bool)>,
}

impl Captured {
    /// The whole stream is the artifact `id` (`cut`: only its first [`FULL_OUTPUT_CAP`] bytes).
    pub fn set_stored(&mut self, id: String, cut: bool) {
        self.stored = Some((id, cut));
    }

    /// At most `max_chars` characters of the stream (half head, half tail) with an explicit marker
    /// where the middle was left out, and the counts. `max_chars` may be at most the capture's size.
    pub fn render(&self, max_chars: usize) -> (String, Option<StreamTruncation>) {
        let head_chars = self.head.chars().count();
        let tail_chars = self.tail.chars().count();
        let kept = (head_chars + tail_chars) as u64;
        if self.total_chars == kept && kept <= max_chars as u64 {
            return (format!("{}{}", self.head, self.tail), None);
        }
        let head_cap = (max_chars / 2).min(head_chars);
        let tail_cap = (max_chars - max_chars / 2).min(tail_chars);
        let head = &self.head[..byte_index_of_char(&self.head, head_cap)];
        let tail = &self.tail[byte_index_of_char(&self.tail, tail_chars - tail_cap)..];
        let omitted = self.total_chars - (head_cap + tail_cap) as u64;
        (
            format!("{head}\n…[{omitted} characters omitted]…\n{tail}"),
            Some(StreamTruncation {
                total_chars: self.total_chars,
                omitted_chars: omitted,
                artifact: self.stored.as_ref().map(|(id, _)| id.clone()),
                artifact_truncated: self.stored.as_ref().is_some_and(|(_, cut)| *cut),
            }),
        )
    }
}

fn byte_index_of_char(s: &str, n: usize) -> usize {
    s.char_indices().nth(n).map_or(s.len(), |(i, _)| i)
}

/// Counts the child's output channels that reached end of file.
#[derive(Debug, Default)]
pub(crate) struct Closed {
    count: std::sync::atomic::AtomicUsize,
    pub(crate) answered: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl Closed {
    pub(crate) fn mark(&self) {
        self.count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.notify.notify_one();
    }

    /// Resolves once `n` channels are closed and the runner wrote a result.
    pub(crate) async fn wait_for(&self, n: usize) {
        use std::sync::atomic::Ordering::SeqCst;
        while self.count.load(SeqCst) < n || !self.answered.load(SeqCst) {
            if self.count.load(SeqCst) >= n {
                return std::future::pending().await; // closed without an answer: wait for the exit
            }
            self.notify.notified().await;
        }
    }
}

/// Most of a stream kept in the store: the rest of the code's output is counted, not kept.
pub(crate) const FULL_OUTPUT_CAP: u64 = 64 << 20;

/// The whole stream on its way to the store as it is read (never held in memory: the writer is a
/// bounded pipe into `Store::put_artifact_stream`), redacted on the way, cut at [`FULL_OUTPUT_CAP`].
pub(crate) struct FullStream {
    writer: Option<tokio::io::DuplexStream>,
    redactor: Arc<Redactor>,
    carry: String,
    bytes: u64,
    cut: bool,
}

impl FullStream {
    /// A stream writing into `writer`, whose other end the store reads.
    pub fn new(writer: tokio::io::DuplexStream, redactor: Arc<Redactor>) -> Self {
        Self {
            writer: Some(writer),
            redactor,
            carry: String::new(),
            bytes: 0,
            cut: false,
        }
    }

    async fn push(&mut self, text: &str) {
        if self.writer.is_none() {
            return;
        }
        self.carry.push_str(text);
        let (done, consumed) = self.redactor.redact_prefix(&self.carry);
        let done = done.into_owned();
        self.carry.drain(..consumed);
        self.write(&done).await;
    }

    async fn write(&mut self, text: &str) {
        let Some(writer) = &mut self.writer else {
            return;
        };
        let room = FULL_OUTPUT_CAP - self.bytes;
        let mut end = text.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        // An upload that failed has dropped its end: its error is reported when it is joined.
        if writer.write_all(&text.as_bytes()[..end]).await.is_err() {
            self.writer = None;
            return;
        }
        self.bytes += end as u64;
        if end < text.len() {
            self.cut = true;
            self.writer = None; // at the cap: the store's end sees the end of the stream
        }
    }

    /// Writes what is left and ends the stream; true when it was cut at the cap.
    async fn finish(mut self) -> bool {
        let rest = self
            .redactor
            .redact(&std::mem::take(&mut self.carry))
            .into_owned();
        self.write(&rest).await;
        if let Some(mut writer) = self.writer.take() {
            let _ = writer.shutdown().await;
        }
        self.cut
    }
}

/// Reads `pipe` to its end into `sink` (head and tail), `events` (live) and `full` (the store);
/// returns whether the stored stream was cut at [`FULL_OUTPUT_CAP`].
pub(crate) async fn capture<R: tokio::io::AsyncRead + Unpin>(
    mut pipe: R,
    sink: Arc<Mutex<HeadTail>>,
    events: Option<mpsc::Sender<Event>>,
    wrap: fn(String) -> Event,
    mut full: Option<FullStream>,
) -> bool {
    let mut chunk = vec![0u8; 64 * 1024];
    let mut events = events;
    loop {
        let n = match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let text = match sink.lock() {
            Ok(mut capture) => capture.push_bytes(&chunk[..n]),
            Err(_) => break,
        };
        if let Some(full) = &mut full {
            full.push(&text).await;
        }
        if let Some(tx) = &events {
            if tx.send(wrap(text)).await.is_err() {
                events = None; // nobody listens any more; keep capturing
            }
        }
    }
    match full {
        Some(full) => full.finish().await,
        None => false,
    }
}

pub(crate) fn take_capture(capture: &Arc<Mutex<HeadTail>>) -> Captured {
    let mut guard = match capture.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    };
    std::mem::replace(&mut *guard, HeadTail::new(2)).into_captured()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_output_is_kept_whole() {
        let mut c = HeadTail::new(10);
        c.push_str("hello");
        assert_eq!(c.finish(), ("hello".to_owned(), None));
    }

    #[test]
    fn long_output_keeps_head_and_tail_with_counts() {
        let mut c = HeadTail::new(10);
        for _ in 0..100 {
            c.push_str("0123456789");
        }
        let (text, t) = c.finish();
        assert!(text.starts_with("01234\n…[990 characters omitted]…\n"));
        assert!(text.ends_with("56789"));
        assert_eq!(
            t,
            Some(StreamTruncation {
                total_chars: 1000,
                omitted_chars: 990,
                artifact: None,
                artifact_truncated: false,
            })
        );
    }

    #[test]
    fn utf8_split_across_chunks_is_decoded() {
        let mut c = HeadTail::new(100);
        let bytes = "né€".as_bytes();
        for b in bytes {
            c.push_bytes(std::slice::from_ref(b));
        }
        assert_eq!(c.finish().0, "né€");
    }

    #[test]
    fn invalid_utf8_becomes_replacement_characters() {
        let mut c = HeadTail::new(100);
        c.push_bytes(b"a\xffb");
        assert_eq!(c.finish().0, "a\u{FFFD}b");
    }

    #[test]
    fn a_capture_renders_smaller_with_consistent_counts() {
        let mut c = HeadTail::new(100);
        c.push_str(&"a".repeat(1000));
        c.push_str(&"z".repeat(1000));
        let captured = c.into_captured();
        let (text, t) = captured.render(10);
        assert!(
            text.starts_with("aaaaa\n") && text.ends_with("\nzzzzz"),
            "{text}"
        );
        assert_eq!(
            t.map(|t| (t.total_chars, t.omitted_chars)),
            Some((2000, 1990))
        );
        let (_, t) = captured.render(100);
        assert_eq!(t.map(|t| t.omitted_chars), Some(1900));
    }

    #[test]
    fn exact_limit_is_not_truncated_and_one_more_is() {
        let mut c = HeadTail::new(4);
        c.push_str("abcd");
        assert_eq!(c.finish().1, None);
        let mut c = HeadTail::new(4);
        c.push_str("ab");
        c.push_str("cde");
        let (text, t) = c.finish();
        assert_eq!(t.map(|t| t.omitted_chars), Some(1));
        assert!(text.starts_with("ab\n") && text.ends_with("\nde"), "{text}");
    }
}
