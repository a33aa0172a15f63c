//! The payload's stdin (unless it is a terminal or /dev/null): the supervisor relays it
//! into a pipe of the cell as it arrives, hashing it on the way.
//!
//! Nothing is read before the payload starts, so an interactive protocol (an MCP or LSP
//! server in the cell, a REPL) works, a slow writer (`sleep 8 | airlock run ...`) is under
//! the run's deadline like everything else, and an endless one (`yes | airlock run ...`)
//! costs one pipe buffer and one chunk of supervisor memory, never host disk. The hash
//! covers exactly the bytes read from the caller; `eof` says whether that was all of it.

use crate::sys;
use serde::{Deserialize, Deserializer, Serialize};
use sha2::{Digest, Sha256};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

/// How much of the caller's stdin is read ahead of the payload.
const CHUNK: usize = 64 * 1024;

/// What the payload was given on stdin, recorded when the run ends.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StdinRecord {
    /// `relayed` (streamed into the cell), `terminal` (streamed into the payload's
    /// terminal, for a plan with one), `null` (the caller's stdin was /dev/null) or
    /// `none` (a terminal, or no stdin: the payload got /dev/null).
    #[serde(deserialize_with = "stdin_mode")]
    pub mode: crate::report::Name,
    /// Bytes read from the caller.
    pub bytes: u64,
    /// sha256 of those bytes; empty when nothing was relayed.
    pub sha256: String,
    /// Whether the caller's stdin reached its end. `false` when the payload ended (or
    /// closed its stdin) first: the hash then covers the part that was read.
    pub eof: bool,
}

fn stdin_mode<'de, D: Deserializer<'de>>(d: D) -> Result<&'static str, D::Error> {
    crate::report::known_name(d, &["relayed", "terminal", "null", "none"])
}

impl StdinRecord {
    pub fn none() -> StdinRecord {
        StdinRecord {
            mode: "none",
            bytes: 0,
            sha256: String::new(),
            eof: true,
        }
    }
}

pub struct StdinRelay {
    /// The caller's stdin; `None` after its EOF, or once the payload stopped reading.
    source: Option<OwnedFd>,
    /// The supervisor's (non-blocking) end of the cell's stdin pipe.
    sink: Option<OwnedFd>,
    pending: Vec<u8>,
    written: usize,
    digest: Sha256,
    bytes: u64,
    eof: bool,
    /// The sink is the master of the payload's terminal: the caller's EOF is typed as the
    /// terminal's EOF character instead of closing it (closing the master would hang the
    /// terminal up).
    into_terminal: bool,
}

/// Which `poll` entries the relay needs this round: `(source, sink)` descriptors, -1 for
/// none. The caller is only read when the last chunk has been handed on, which bounds
/// memory to one chunk.
pub struct RelayInterest {
    pub source: i32,
    pub sink: i32,
}

impl StdinRelay {
    /// A pipe for the cell's stdin: returns the relay and the read end the cell gets.
    pub fn new(source: OwnedFd) -> std::io::Result<(StdinRelay, OwnedFd)> {
        let (cell_end, sink) = sys::pipe_cloexec()?;
        // Our end only: the payload's must block as any stdin pipe does. The caller's stdin
        // is left as it is (its open file description is shared with the caller's shell).
        sys::set_nonblocking(sink.as_fd())?;
        let relay = StdinRelay {
            source: Some(source),
            sink: Some(sink),
            pending: Vec::new(),
            written: 0,
            digest: Sha256::new(),
            bytes: 0,
            eof: false,
            into_terminal: false,
        };
        Ok((relay, cell_end))
    }

    /// A relay into the master of the payload's terminal (see [`crate::terminal`]):
    /// `master` is the supervisor's own descriptor of it, which becomes non-blocking.
    pub fn into_terminal(source: OwnedFd, master: &OwnedFd) -> std::io::Result<StdinRelay> {
        let sink = master.try_clone()?;
        sys::set_nonblocking(sink.as_fd())?;
        Ok(StdinRelay {
            source: Some(source),
            sink: Some(sink),
            pending: Vec::new(),
            written: 0,
            digest: Sha256::new(),
            bytes: 0,
            eof: false,
            into_terminal: true,
        })
    }

    pub fn interest(&self) -> RelayInterest {
        let waiting = self.written < self.pending.len();
        let raw = |fd: &Option<OwnedFd>| fd.as_ref().map_or(-1, |f| f.as_raw_fd());
        RelayInterest {
            source: if waiting { -1 } else { raw(&self.source) },
            sink: if waiting { raw(&self.sink) } else { -1 },
        }
    }

    /// The caller's stdin is readable (or at EOF): read one chunk.
    pub fn on_source_ready(&mut self) {
        let Some(source) = &self.source else { return };
        self.pending.resize(CHUNK, 0);
        self.written = 0;
        match sys::read(source.as_fd(), &mut self.pending) {
            Ok(0) => {
                self.pending.clear();
                self.eof = true;
                self.source = None;
                if self.into_terminal {
                    self.type_end_of_file();
                } else {
                    // EOF travels on: the payload's read returns 0 once the pipe is empty.
                    self.sink = None;
                }
            }
            Ok(n) => {
                self.pending.truncate(n);
                self.digest.update(&self.pending);
                self.bytes += n as u64;
                self.on_sink_ready();
            }
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => self.pending.clear(),
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => self.pending.clear(),
            Err(_) => {
                // A read error ends the caller's stdin as EOF would, but it is not EOF.
                self.pending.clear();
                self.source = None;
                self.sink = None;
            }
        }
    }

    /// The cell's pipe has room (or its reader is gone): hand on what is pending.
    pub fn on_sink_ready(&mut self) {
        let Some(sink) = &self.sink else { return };
        while self.written < self.pending.len() {
            match sys::write(sink.as_fd(), &self.pending[self.written..]) {
                Ok(n) => self.written += n,
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    // EPIPE: the payload closed its stdin; stop reading the caller's.
                    self.pending.clear();
                    self.written = 0;
                    self.source = None;
                    self.sink = None;
                    return;
                }
            }
        }
    }

    /// The caller's input ended: type the terminal's EOF character (Ctrl-D), once, as a
    /// person would. Only in canonical mode, where the line discipline turns it into the
    /// end of the payload's input; in raw mode the payload asked for bytes, not lines, and
    /// only sees the input stop.
    fn type_end_of_file(&mut self) {
        let Some(sink) = &self.sink else { return };
        let Ok(modes) = sys::terminal_modes(sink.as_fd()) else {
            return;
        };
        if modes.c_lflag & libc::ICANON != 0 {
            self.pending = vec![modes.c_cc[libc::VEOF]];
            self.written = 0;
            self.on_sink_ready();
        }
    }

    /// Ends the relay (the payload is gone) and says what was read.
    pub fn finish(self) -> StdinRecord {
        StdinRecord {
            mode: if self.into_terminal {
                "terminal"
            } else {
                "relayed"
            },
            bytes: self.bytes,
            sha256: hex::encode(self.digest.finalize()),
            eof: self.eof,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    /// A relay whose caller side yields `input` (from a file, so any size is ready).
    fn relay_of(input: &[u8]) -> (StdinRelay, std::fs::File) {
        let mut source = tempfile::tempfile().unwrap();
        source.write_all(input).unwrap();
        source.rewind().unwrap();
        let (relay, cell_end) = StdinRelay::new(source.into()).unwrap();
        (relay, std::fs::File::from(cell_end))
    }

    #[test]
    fn relays_every_byte_then_eof_and_hashes_what_it_read() {
        let (mut relay, mut cell) = relay_of(b"hello cell\n");
        while relay.interest().source >= 0 || relay.interest().sink >= 0 {
            if relay.interest().sink >= 0 {
                relay.on_sink_ready();
            } else {
                relay.on_source_ready();
            }
        }
        let mut got = Vec::new();
        cell.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"hello cell\n");
        let record = relay.finish();
        assert_eq!(record.bytes, 11);
        assert!(record.eof);
        assert_eq!(record.sha256, hex::encode(Sha256::digest(b"hello cell\n")));
    }

    #[test]
    fn a_full_cell_pipe_stops_reading_the_caller() {
        // More than a pipe buffer: the relay must wait for the sink, not read on.
        let input = vec![b'y'; 1 << 20];
        let (mut relay, cell) = relay_of(&input);
        for _ in 0..64 {
            if relay.interest().source >= 0 {
                relay.on_source_ready();
            } else {
                relay.on_sink_ready();
            }
        }
        assert_eq!(
            relay.interest().source,
            -1,
            "reads only after the chunk is handed on"
        );
        assert!(relay.bytes < input.len() as u64);
        drop(cell);
        relay.on_sink_ready();
        let record = relay.finish();
        assert!(!record.eof, "the reader left before the end");
    }
}
