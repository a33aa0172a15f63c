//! A command's output on its way to clients. The payload's stdout and stderr are pipes
//! whose write ends the engine hands to the cell's supervisor; the service reads them as
//! fast as they fill, whatever the clients do, into an [`OutputLog`] (bounded: beyond
//! `max_stream_bytes` output is counted and dropped; the record's capture is the
//! contract's). Clients follow the log. So a slow or stalled client never blocks the
//! supervisor's writes, and cannot hold a cell past its deadline.
//!
//! The log's bytes are spilled to an unlinked temporary file, not held in memory: in
//! memory is only an index of chunks, and a follower reads at most [`BATCH_BYTES`] of
//! them per step. So a command streaming a gigabyte costs the service disk (page cache),
//! not resident memory (docs/benchmarks.md has the measurement).

use serde::Serialize;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};
use tokio::io::AsyncReadExt;
use tokio::sync::Notify;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One NDJSON frame of a streamed run or command (docs/api.md).
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Frame {
    Start {
        run_id: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        command_id: Option<u64>,
    },
    Stdout {
        data: String,
    },
    Stderr {
        data: String,
    },
    Exit {
        status: String,
        exit_code: Option<i32>,
        signal: Option<i32>,
        limit_fired: Option<String>,
        /// Output bytes not streamed (beyond `max_stream_bytes`).
        dropped_bytes: u64,
    },
    Result {
        record: serde_json::Value,
    },
}

impl Frame {
    pub fn line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).unwrap_or_default();
        line.push(b'\n');
        line
    }
}

/// How a command ended, for its last two frames.
#[derive(Debug, Clone)]
pub struct Ended {
    pub exit: Frame,
    pub record: serde_json::Value,
}

/// The most output one follower step reads from the spill file (its frames' data).
pub const BATCH_BYTES: usize = 1 << 20;

/// Where a chunk of output is in the spill file.
#[derive(Debug, Clone, Copy)]
struct Chunk {
    stream: Stream,
    offset: u64,
    len: usize,
}

#[derive(Default)]
struct LogState {
    run_id: Option<String>,
    chunks: Vec<Chunk>,
    /// Bytes in the spill file.
    kept: u64,
    dropped: u64,
    open_streams: u8,
    ended: Option<Ended>,
}

pub struct OutputLog {
    state: Mutex<LogState>,
    changed: Notify,
    cap: u64,
    /// The chunks' bytes (UTF-8 text), unlinked: gone with the log.
    spill: std::fs::File,
}

/// What a follower gets next.
pub enum Next {
    Frames(Vec<Frame>),
    /// Nothing new yet.
    Wait,
    Done,
}

impl OutputLog {
    /// A log keeping at most `cap` bytes, spilled to an unlinked file in `$TMPDIR`.
    pub fn new(cap: usize) -> std::io::Result<Arc<OutputLog>> {
        Ok(Arc::new(OutputLog {
            state: Mutex::new(LogState {
                open_streams: 2,
                ..LogState::default()
            }),
            changed: Notify::new(),
            cap: cap as u64,
            spill: tempfile::tempfile()?,
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_run_id(&self, run_id: &str) {
        self.lock().run_id = Some(run_id.to_string());
        self.changed.notify_waiters();
    }

    pub fn run_id(&self) -> Option<String> {
        self.lock().run_id.clone()
    }

    fn push(&self, stream: Stream, text: &str) {
        let len = text.len();
        let mut state = self.lock();
        let offset = state.kept;
        // A write the disk refuses is output not kept: counted as dropped, like output
        // beyond the cap (the record's capture is the contract's either way).
        if offset + len as u64 > self.cap
            || self.spill.write_all_at(text.as_bytes(), offset).is_err()
        {
            state.dropped += len as u64;
            return;
        }
        state.kept += len as u64;
        state.chunks.push(Chunk {
            stream,
            offset,
            len,
        });
        drop(state);
        self.changed.notify_waiters();
    }

    /// A chunk's text, read back from the spill file.
    fn text_of(&self, chunk: &Chunk) -> String {
        let mut bytes = vec![0u8; chunk.len];
        match self.spill.read_exact_at(&mut bytes, chunk.offset) {
            // Written from a `String`: valid UTF-8.
            Ok(()) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(_) => String::new(),
        }
    }

    fn stream_closed(&self) {
        self.lock().open_streams -= 1;
        self.changed.notify_waiters();
    }

    /// The command ended: its exit frame and record.
    pub fn finish(&self, ended: Ended) {
        self.lock().ended = Some(ended);
        self.changed.notify_waiters();
    }

    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    pub fn ended(&self) -> Option<Ended> {
        self.lock().ended.clone()
    }

    /// The frames of the output chunks after `cursor` (at most [`BATCH_BYTES`] of them,
    /// at least one; the cursor moves past them); the end frames once both streams
    /// closed and the command's end is known.
    pub fn next(&self, cursor: &mut usize) -> Next {
        let state = self.lock();
        if *cursor == usize::MAX {
            return Next::Done;
        }
        if *cursor < state.chunks.len() {
            let batch = batch_of(&state.chunks[*cursor..]);
            let chunks = state.chunks[*cursor..*cursor + batch].to_vec();
            *cursor += batch;
            drop(state);
            let frames = chunks
                .iter()
                .map(|chunk| {
                    let data = self.text_of(chunk);
                    match chunk.stream {
                        Stream::Stdout => Frame::Stdout { data },
                        Stream::Stderr => Frame::Stderr { data },
                    }
                })
                .collect();
            return Next::Frames(frames);
        }
        match &state.ended {
            Some(ended) if state.open_streams == 0 => {
                let mut exit = ended.exit.clone();
                if let Frame::Exit { dropped_bytes, .. } = &mut exit {
                    *dropped_bytes = state.dropped;
                }
                *cursor = usize::MAX;
                let result = Frame::Result {
                    record: ended.record.clone(),
                };
                Next::Frames(vec![exit, result])
            }
            _ => Next::Wait,
        }
    }

    /// Waits until [`OutputLog::next`] may have something new for `cursor`.
    pub async fn changed_since(&self, cursor: usize) {
        let notified = self.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if matches!(self.next(&mut cursor.clone()), Next::Wait) {
            notified.await;
        }
    }
}

/// How many of `chunks` one follower step takes: as many as fit in [`BATCH_BYTES`], and
/// at least one.
fn batch_of(chunks: &[Chunk]) -> usize {
    let mut bytes = 0;
    let fitting = chunks
        .iter()
        .take_while(|chunk| {
            bytes += chunk.len;
            bytes <= BATCH_BYTES
        })
        .count();
    fitting.max(1).min(chunks.len())
}

/// A pipe: its read end for the service, its write end for the cell's supervisor.
pub fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(std::io::Error::from)
}

/// Reads `fd` (a pipe's read end) into `log` until EOF, keeping UTF-8 sequences whole
/// across reads (what is not UTF-8 is replaced: frames are JSON text).
pub fn spawn_reader(log: Arc<OutputLog>, stream: Stream, fd: OwnedFd) {
    tokio::spawn(async move {
        if let Ok(mut pipe) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) {
            let mut buf = vec![0u8; 64 << 10];
            let mut pending: Vec<u8> = Vec::new();
            loop {
                match pipe.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        pending.extend_from_slice(&buf[..n]);
                        let text = take_text(&mut pending);
                        if !text.is_empty() {
                            log.push(stream, &text);
                        }
                    }
                }
            }
            if !pending.is_empty() {
                log.push(stream, &String::from_utf8_lossy(&pending));
            }
        }
        log.stream_closed();
    });
}

/// The text of `pending` up to an incomplete UTF-8 sequence at its end (kept for the
/// next read); invalid bytes become U+FFFD.
fn take_text(pending: &mut Vec<u8>) -> String {
    let keep = match std::str::from_utf8(pending) {
        Ok(_) => 0,
        Err(err) if err.error_len().is_none() => pending.len() - err.valid_up_to(),
        Err(_) => 0,
    };
    let rest = pending.split_off(pending.len() - keep);
    let text = String::from_utf8_lossy(pending).into_owned();
    *pending = rest;
    text
}

/// Writes `data` into `fd` (a pipe's write end, the payload's stdin) and closes it.
pub fn spawn_stdin_writer(fd: OwnedFd, data: Vec<u8>) {
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        if let Ok(mut pipe) = tokio::net::unix::pipe::Sender::from_owned_fd(fd) {
            let _ = pipe.write_all(&data).await;
        }
    });
}

/// The NDJSON body of a log: its frames as they come, from the start frame on. `held`
/// lives as long as the body: the server drops a response's body when its client goes
/// away, so a guard held here learns of a disconnect (see `runs::Hangup` and
/// `sessions::KillOnDisconnect`).
pub fn ndjson_body<H: Send + 'static>(
    log: Arc<OutputLog>,
    first: Option<Frame>,
    follow: bool,
    held: H,
) -> axum::body::Body {
    let first = first.map(|f| f.line()).unwrap_or_default();
    let stream = futures_util::stream::unfold(
        (log, 0usize, first, held),
        move |(log, mut cursor, first, held)| async move {
            if !first.is_empty() {
                let chunk = axum::body::Bytes::from(first);
                return Some((
                    Ok::<_, std::convert::Infallible>(chunk),
                    (log, cursor, Vec::new(), held),
                ));
            }
            loop {
                match log.next(&mut cursor) {
                    Next::Frames(frames) => {
                        let bytes: Vec<u8> = frames.iter().flat_map(Frame::line).collect();
                        return Some((Ok(bytes.into()), (log, cursor, Vec::new(), held)));
                    }
                    Next::Done => return None,
                    Next::Wait if !follow => return None,
                    Next::Wait => log.changed_since(cursor).await,
                }
            }
        },
    );
    axum::body::Body::from_stream(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_incomplete_utf8_sequence_waits_for_the_next_read() {
        let mut pending = "aé".as_bytes()[..2].to_vec();
        assert_eq!(take_text(&mut pending), "a");
        assert_eq!(pending, [0xc3]);
        pending.push(0xa9);
        assert_eq!(take_text(&mut pending), "é");
        assert!(pending.is_empty());
    }

    #[test]
    fn invalid_bytes_are_replaced_not_kept() {
        let mut pending = vec![b'x', 0xff, b'y'];
        assert_eq!(take_text(&mut pending), "x\u{fffd}y");
        assert!(pending.is_empty());
    }

    fn ended() -> Ended {
        Ended {
            exit: Frame::Exit {
                status: "ok".into(),
                exit_code: Some(0),
                signal: None,
                limit_fired: None,
                dropped_bytes: 0,
            },
            record: serde_json::json!({"status": "ok"}),
        }
    }

    #[test]
    fn output_beyond_the_cap_is_counted_and_dropped_and_the_end_comes_last() {
        let log = OutputLog::new(4).unwrap();
        log.push(Stream::Stdout, "abc");
        log.push(Stream::Stderr, "defg");
        log.push(Stream::Stderr, "h");
        let mut cursor = 0;
        let Next::Frames(frames) = log.next(&mut cursor) else {
            panic!("frames expected")
        };
        assert_eq!(frames.len(), 2);
        assert!(matches!(&frames[0], Frame::Stdout { data } if data == "abc"));
        assert!(matches!(&frames[1], Frame::Stderr { data } if data == "h"));
        assert!(matches!(log.next(&mut cursor), Next::Wait));
        log.finish(ended());
        // The streams are still open: their last output may be on its way.
        assert!(matches!(log.next(&mut cursor), Next::Wait));
        log.stream_closed();
        log.stream_closed();
        let Next::Frames(end) = log.next(&mut cursor) else {
            panic!("end frames expected")
        };
        assert!(matches!(
            end[0],
            Frame::Exit {
                dropped_bytes: 4,
                ..
            }
        ));
        assert!(matches!(end[1], Frame::Result { .. }));
        assert!(matches!(log.next(&mut cursor), Next::Done));
    }

    #[test]
    fn a_follower_reads_a_long_log_in_bounded_batches_and_misses_nothing() {
        let log = OutputLog::new(64 << 20).unwrap();
        let piece = "y\n".repeat(32 << 10);
        for _ in 0..100 {
            log.push(Stream::Stdout, &piece);
        }
        let (mut cursor, mut seen, mut steps) = (0, 0, 0);
        while let Next::Frames(frames) = log.next(&mut cursor) {
            let bytes: usize = frames
                .iter()
                .map(|f| match f {
                    Frame::Stdout { data } => data.len(),
                    _ => 0,
                })
                .sum();
            assert!(bytes <= BATCH_BYTES, "{bytes}");
            seen += bytes;
            steps += 1;
        }
        assert_eq!(seen, 100 * piece.len());
        assert!(steps >= 7, "{steps} steps");
    }

    #[test]
    fn one_chunk_larger_than_a_batch_still_goes_out() {
        let chunk = |len| Chunk {
            stream: Stream::Stdout,
            offset: 0,
            len,
        };
        assert_eq!(batch_of(&[chunk(BATCH_BYTES * 2), chunk(1)]), 1);
        assert_eq!(batch_of(&[chunk(10), chunk(10)]), 2);
    }
}
