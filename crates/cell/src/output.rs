//! Bounded capture of the payload's stdout and stderr. Whatever the payload writes, the
//! supervisor keeps at most `HEAD_BYTES + TAIL_BYTES` per stream in memory and forwards
//! at most the contract's `output_bytes` (both streams together) to the caller.

use serde::{Deserialize, Deserializer, Serialize};
use std::collections::VecDeque;

pub const HEAD_BYTES: usize = 4096;
pub const TAIL_BYTES: usize = 4096;

/// One stream's record for the result: the first and last bytes and how many were seen.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct StreamCapture {
    pub bytes_seen: u64,
    #[serde(serialize_with = "lossy", deserialize_with = "text_bytes")]
    pub head: Vec<u8>,
    #[serde(serialize_with = "lossy_deque", deserialize_with = "text_bytes")]
    pub tail: VecDeque<u8>,
}

/// The bytes of a captured text, as [`lossy`] wrote them (already lossy: what the
/// result shows).
fn text_bytes<'de, D: Deserializer<'de>, T: From<Vec<u8>>>(d: D) -> Result<T, D::Error> {
    Ok(T::from(String::deserialize(d)?.into_bytes()))
}

fn lossy<S: serde::Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&String::from_utf8_lossy(bytes))
}

fn lossy_deque<S: serde::Serializer>(bytes: &VecDeque<u8>, s: S) -> Result<S::Ok, S::Error> {
    let (a, b) = bytes.as_slices();
    s.serialize_str(&String::from_utf8_lossy(&[a, b].concat()))
}

impl StreamCapture {
    fn record(&mut self, chunk: &[u8]) {
        self.bytes_seen += chunk.len() as u64;
        let head_room = HEAD_BYTES.saturating_sub(self.head.len());
        self.head
            .extend_from_slice(&chunk[..head_room.min(chunk.len())]);
        // The tail only holds bytes not already in the head.
        let rest = &chunk[head_room.min(chunk.len())..];
        let rest = &rest[rest.len().saturating_sub(TAIL_BYTES)..];
        let overflow = (self.tail.len() + rest.len()).saturating_sub(TAIL_BYTES);
        self.tail.drain(..overflow);
        self.tail.extend(rest);
    }

    pub fn head_text(&self) -> String {
        String::from_utf8_lossy(&self.head).into_owned()
    }

    pub fn tail_text(&self) -> String {
        let (a, b) = self.tail.as_slices();
        String::from_utf8_lossy(&[a, b].concat()).into_owned()
    }
}

/// Both streams plus the shared forwarding budget.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OutputCapture {
    pub limit_bytes: u64,
    pub forwarded_bytes: u64,
    pub truncated: bool,
    pub stdout: StreamCapture,
    pub stderr: StreamCapture,
}

pub enum Stream {
    Stdout,
    Stderr,
}

impl OutputCapture {
    pub fn new(limit_bytes: u64) -> OutputCapture {
        OutputCapture {
            limit_bytes,
            forwarded_bytes: 0,
            truncated: false,
            stdout: StreamCapture::default(),
            stderr: StreamCapture::default(),
        }
    }

    /// Records `chunk` and returns the part of it that may still be forwarded.
    pub fn accept<'c>(&mut self, stream: Stream, chunk: &'c [u8]) -> &'c [u8] {
        match stream {
            Stream::Stdout => self.stdout.record(chunk),
            Stream::Stderr => self.stderr.record(chunk),
        }
        let budget = self.limit_bytes.saturating_sub(self.forwarded_bytes);
        let allowed = (chunk.len() as u64).min(budget) as usize;
        if allowed < chunk.len() {
            self.truncated = true;
        }
        self.forwarded_bytes += allowed as u64;
        &chunk[..allowed]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_head_and_tail_and_counts_everything() {
        let mut capture = OutputCapture::new(10);
        let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        let mut forwarded = 0;
        for chunk in data.chunks(777) {
            forwarded += capture.accept(Stream::Stdout, chunk).len();
        }
        assert_eq!(forwarded, 10);
        assert!(capture.truncated);
        assert_eq!(capture.stdout.bytes_seen, 20_000);
        assert_eq!(capture.stdout.head, data[..HEAD_BYTES]);
        let tail: Vec<u8> = capture.stdout.tail.iter().copied().collect();
        assert_eq!(tail, data[data.len() - TAIL_BYTES..]);
    }

    #[test]
    fn short_output_is_only_in_the_head() {
        let mut capture = OutputCapture::new(1 << 20);
        assert_eq!(capture.accept(Stream::Stderr, b"hello"), b"hello");
        assert_eq!(capture.stderr.head_text(), "hello");
        assert_eq!(capture.stderr.tail_text(), "");
        assert!(!capture.truncated);
    }
}
