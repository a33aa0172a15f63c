//! Byte pumping between the cell's client and the upstream, with the per-cell ceilings
//! (byte budget, idle timeout), shutdown, and the in-band checks (SNI, HTTP body framing).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use std::os::fd::OwnedFd;

use rustix::pipe::{fcntl_setpipe_size, pipe_with, splice, PipeFlags, SpliceFlags};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::TcpStream;

use crate::destination::same_host;
use crate::proxy::{canonical_host, shutdown_requested, Attempt, Opened, Shared};
use crate::reason;
use crate::request::{self, Plaintext, MAX_HEAD};
use crate::sni::{self, Inspection};
use crate::Decision;

/// Per-direction copy buffer: starts small (most connections move little data) and doubles
/// whenever a read fills it, up to `MAX_BUF`. Large buffers keep the syscall count per
/// byte low, which is what bulk tunnel throughput on loopback is bound by.
const START_BUF: usize = 16 * 1024;
const MAX_BUF: usize = 512 * 1024;

/// Bytes forwarded on one connection, readable after the pump was cancelled.
#[derive(Default)]
pub struct Traffic {
    pub up: AtomicU64,
    pub down: AtomicU64,
    /// Bumped on every read; the idle watchdog only looks at whether it moved.
    activity: AtomicU64,
    /// Set once a tunnel's first bytes were read as HTTP: its refusals can be answered
    /// in-band with an HTTP response.
    http: std::sync::atomic::AtomicBool,
}

impl Traffic {
    pub fn up(&self) -> u64 {
        self.up.load(Ordering::Relaxed)
    }
    pub fn down(&self) -> u64 {
        self.down.load(Ordering::Relaxed)
    }
}

/// What the client-to-upstream direction does.
pub enum UpMode<'a> {
    /// A tunnel to `host:port` (`host` canonical). A TLS ClientHello's server name must
    /// match `host`; plain HTTP is read request by request and each `Host` must match
    /// `host:port`; anything else needs `opaque` (the operator's `opaque_tunnels`).
    Tunnel {
        host: &'a str,
        port: u16,
        opaque: bool,
    },
    /// A plain-HTTP request body with the given framing; once it is forwarded the client
    /// side is no longer read (one request per connection), and the exchange ends when the
    /// upstream finishes its response.
    HttpBody(BodyFraming),
}

pub(crate) enum DirEnd {
    Closed,
    Deny(&'static str),
}

/// Relays an opened CONNECT or SOCKS5 tunnel to `host:port` (with `client_prefix`, bytes
/// the client sent early), applies the first-flight checks, and records how it ended.
///
/// Why every non-TLS tunnel is checked: the proxy connected to an address it checked for
/// `host`, but a shared front end at that address routes plain HTTP by the `Host` header,
/// so a tunnel of unread plaintext would reach every name that front end serves.
pub async fn relay_tunnel(
    shared: &Shared,
    client: &mut TcpStream,
    opened: Opened,
    client_prefix: Vec<u8>,
    host: &str,
    attempt: Attempt,
) {
    let expect = canonical_host(host);
    if let Some(interceptor) = shared.interceptor_for(&expect) {
        let traffic = Traffic::default();
        // The idle ceiling holds while the hello is awaited (pump's watchdog is not
        // running yet); a client-first protocol lets nothing flow the other way meanwhile.
        let read = first_flight(client, client_prefix, &expect, false, &traffic);
        let Ok(flight) = tokio::time::timeout(shared.idle, read).await else {
            return attempt.finish(shared, Decision::Allowed, Some(reason::LIMIT), 0, 0);
        };
        match flight {
            Ok(Some((Flight::Tls, hello))) => {
                let tunnel = Intercepted {
                    interceptor,
                    host: &expect,
                    hello,
                };
                return crate::intercept::relay(shared, client, opened, tunnel, attempt).await;
            }
            // Plain HTTP (or anything else) takes the ordinary tunnel's checks, which
            // classify the bytes already read at once.
            Ok(Some((_, prefix))) => {
                return relay_unintercepted(shared, client, opened, prefix, &expect, attempt).await
            }
            Ok(None) => return attempt.finish(shared, Decision::Allowed, None, 0, 0),
            Err(code) => return attempt.finish(shared, Decision::Denied, Some(code), 0, 0),
        }
    }
    relay_unintercepted(shared, client, opened, client_prefix, &expect, attempt).await
}

/// A TLS tunnel the proxy terminates: the run's interceptor, the tunnel's canonical host
/// and the ClientHello already read.
pub struct Intercepted<'a> {
    pub interceptor: &'a crate::tls::Interceptor,
    pub host: &'a str,
    pub hello: Vec<u8>,
}

/// [`relay_tunnel`] for a tunnel whose bytes are relayed as they are (after the
/// first-flight checks); `expect` is the canonical host.
async fn relay_unintercepted(
    shared: &Shared,
    client: &mut TcpStream,
    mut opened: Opened,
    client_prefix: Vec<u8>,
    expect: &str,
    attempt: Attempt,
) {
    let traffic = Traffic::default();
    let host = expect;
    let port = attempt.port;
    let cut = pump(
        shared,
        client,
        &mut opened.stream,
        client_prefix,
        std::mem::take(&mut opened.upstream_prefix),
        UpMode::Tunnel {
            host: expect,
            port,
            opaque: shared.allows_opaque_tunnel(host, port),
        },
        &traffic,
    )
    .await;
    let (up, down) = (traffic.up(), traffic.down());
    let decision = decision_for(cut);
    // An HTTP client refused before anything was relayed gets the same refusal the forward
    // proxy gives; later in the stream a response could interleave with the upstream's, so
    // the tunnel is only closed.
    if let Some(code) = cut {
        let http = traffic.http.load(Ordering::Relaxed);
        if decision == Decision::Denied && http && up == 0 && down == 0 {
            crate::http::refuse(client, code).await;
        }
    }
    attempt.finish(shared, decision, cut, up, down);
}

/// How a tunnel cut short by `cut` is recorded: a policy refusal is a denial; a limit, a
/// closed or failed upstream leaves it allowed (what was relayed was allowed).
pub fn decision_for(cut: Option<&'static str>) -> Decision {
    match cut {
        Some(
            reason::SNI_MISMATCH
            | reason::BAD_REQUEST
            | reason::HOST_MISMATCH
            | reason::AMBIGUOUS_FRAMING
            | reason::PLAINTEXT_TUNNEL
            | reason::SECRET_WRONG_DESTINATION
            | reason::SECRET_UNKNOWN
            | reason::METHOD_NOT_ALLOWED
            | reason::PATH_NOT_ALLOWED
            | reason::TLS_UNINSPECTABLE
            | reason::TLS_HANDSHAKE_FAILED
            | reason::UPSTREAM_CERT_INVALID,
        ) => Decision::Denied,
        _ => Decision::Allowed,
    }
}

/// Pump until both directions are closed (tunnel) or the response ended (HTTP).
/// Returns the reason code if the exchange was cut short by policy.
#[allow(clippy::too_many_arguments)]
pub async fn pump(
    shared: &Shared,
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    client_prefix: Vec<u8>,
    upstream_prefix: Vec<u8>,
    mode: UpMode<'_>,
    traffic: &Traffic,
) -> Option<&'static str> {
    let http = matches!(mode, UpMode::HttpBody(_));
    let (mut client_r, mut client_w) = client.split();
    let (mut up_r, mut up_w) = upstream.split();
    let up = async {
        match mode {
            UpMode::Tunnel { host, port, opaque } => {
                let flight =
                    first_flight(&mut client_r, client_prefix, host, opaque, traffic).await;
                match flight {
                    Ok(None) => {
                        let _ = up_w.shutdown().await;
                        DirEnd::Closed
                    }
                    Err(code) => DirEnd::Deny(code),
                    Ok(Some((Flight::Http, prefix))) => {
                        traffic.http.store(true, Ordering::Relaxed);
                        let dest = (host, port);
                        relay_requests(shared, &mut client_r, &mut up_w, prefix, dest, traffic)
                            .await
                    }
                    Ok(Some((Flight::Other, _))) if !opaque => {
                        DirEnd::Deny(reason::PLAINTEXT_TUNNEL)
                    }
                    Ok(Some((Flight::Tls, _)))
                        if crate::l7::rule_for(&shared.http_rules, host).is_some() =>
                    {
                        DirEnd::Deny(reason::TLS_UNINSPECTABLE)
                    }
                    Ok(Some((Flight::Tls | Flight::Other, prefix))) => {
                        copy(
                            shared,
                            &mut client_r,
                            &mut up_w,
                            prefix,
                            &traffic.up,
                            traffic,
                        )
                        .await
                    }
                }
            }
            UpMode::HttpBody(framing) => {
                copy_body(
                    shared,
                    &mut client_r,
                    &mut up_w,
                    client_prefix,
                    framing,
                    traffic,
                )
                .await
            }
        }
    };
    let down = copy(
        shared,
        &mut up_r,
        &mut client_w,
        upstream_prefix,
        &traffic.down,
        traffic,
    );
    drive(shared, up, down, http, traffic).await
}

/// Runs both directions of an exchange under the per-cell idle ceiling and the proxy's
/// shutdown, until both are closed (`http`: until the response ended) or one is refused.
pub(crate) async fn drive<U, D>(
    shared: &Shared,
    up: U,
    down: D,
    http: bool,
    traffic: &Traffic,
) -> Option<&'static str>
where
    U: std::future::Future<Output = DirEnd>,
    D: std::future::Future<Output = DirEnd>,
{
    tokio::pin!(up, down);

    let mut shutdown = shared.shutdown_signal();
    let tick = (shared.idle / 4).max(Duration::from_millis(1));
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen = traffic.activity.load(Ordering::Relaxed);
    let mut last_change = Instant::now();
    let (mut up_done, mut down_done) = (false, false);
    loop {
        tokio::select! {
            end = &mut up, if !up_done => {
                up_done = true;
                if let DirEnd::Deny(code) = end {
                    return Some(code);
                }
            }
            end = &mut down, if !down_done => {
                down_done = true;
                if let DirEnd::Deny(code) = end {
                    return Some(code);
                }
                if http {
                    return None;
                }
            }
            _ = ticker.tick() => {
                let now = traffic.activity.load(Ordering::Relaxed);
                if now != seen {
                    seen = now;
                    last_change = Instant::now();
                } else if last_change.elapsed() >= shared.idle {
                    return Some(reason::LIMIT);
                }
            }
            _ = shutdown_requested(&mut shutdown) => return None,
        }
        if up_done && down_done {
            return None;
        }
    }
}

/// What a tunnel's client sent first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flight {
    /// A TLS ClientHello whose server name (if any) matches the tunnel host.
    Tls,
    /// An HTTP/1.x request line.
    Http,
    /// Anything else (only relayed to an operator-listed opaque destination).
    Other,
}

/// Read the client's first flight until it is classified. `Ok(Some((flight, bytes)))`:
/// the bytes still need handling; `Ok(None)`: the client closed before a verdict.
///
/// A hello without SNI is allowed: the tunnel can only reach the address that was resolved
/// and checked for the allowlisted name, and without a name in the hello there is no
/// second virtual host to ask for. For an `opaque` destination a non-TLS stream is not
/// waited on (a client of a line protocol may send a few bytes and wait for an answer).
pub(crate) async fn first_flight<R: AsyncRead + Unpin>(
    reader: &mut R,
    mut acc: Vec<u8>,
    expect: &str,
    opaque: bool,
    traffic: &Traffic,
) -> Result<Option<(Flight, Vec<u8>)>, &'static str> {
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        let verdict = match sni::inspect(&acc) {
            Inspection::NotTls if opaque => Some(Flight::Other),
            Inspection::NotTls => match request::classify_plaintext(&acc) {
                Plaintext::NeedMore => None,
                Plaintext::Http => Some(Flight::Http),
                Plaintext::Other => Some(Flight::Other),
            },
            Inspection::ClientHello { server_name: None } => Some(Flight::Tls),
            Inspection::ClientHello {
                server_name: Some(name),
            } if crate::secrets::contains_marker(name.as_bytes()) => {
                return Err(reason::SECRET_WRONG_DESTINATION)
            }
            Inspection::ClientHello {
                server_name: Some(name),
            } if same_host(&name, expect) => Some(Flight::Tls),
            Inspection::ClientHello { .. } => return Err(reason::SNI_MISMATCH),
            Inspection::Malformed => return Err(reason::BAD_REQUEST),
            Inspection::NeedMore => None,
        };
        if let Some(flight) = verdict {
            return Ok(Some((flight, acc)));
        }
        let room = sni::MAX_CLIENT_HELLO
            .saturating_sub(acc.len())
            .min(chunk.len());
        let n = match reader.read(&mut chunk[..room]).await {
            Ok(0) | Err(_) => return Ok(None),
            Ok(n) => n,
        };
        traffic.activity.fetch_add(1, Ordering::Relaxed);
        acc.extend_from_slice(&chunk[..n]);
    }
}

/// A plaintext tunnel carrying HTTP: every request is read whole, checked as the forward
/// proxy checks one (Host against the tunnel's destination, framing), and only then
/// forwarded, head rewritten from what was checked, body exactly as framed. Keep-alive and
/// pipelining work; a request that fails ends the tunnel before any of its bytes leave.
pub(crate) async fn relay_requests<R, W>(
    shared: &Shared,
    reader: &mut R,
    writer: &mut W,
    mut pending: Vec<u8>,
    (host, port): (&str, u16),
    traffic: &Traffic,
) -> DirEnd
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let end = loop {
            if let Some(end) = request::find_head_end(&pending) {
                break end;
            }
            if pending.len() > MAX_HEAD {
                return DirEnd::Deny(reason::BAD_REQUEST);
            }
            if !read_more(reader, &mut buf, &mut pending, traffic).await {
                // A partial head is dropped, never forwarded.
                let _ = writer.shutdown().await;
                return DirEnd::Closed;
            }
        };
        let checked = request::parse(&pending[..end]).and_then(|head| {
            let continues = expects_continue(&head.headers);
            request::tunnel_request(&head, host, port, shared.run_policy()).map(|r| (r, continues))
        });
        let (forward_request, continues) = match checked {
            Ok(r) => r,
            Err(code) => return DirEnd::Deny(code),
        };
        let mut body = pending.split_off(end);
        if !continues {
            read_ahead(reader, &mut body, &forward_request.framing, shared.idle).await;
        }
        if body_ahead_has_marker(&body, &forward_request.framing) {
            return DirEnd::Deny(reason::SECRET_WRONG_DESTINATION);
        }
        pending.append(&mut body);
        if let Err(e) = forward(shared, writer, &forward_request.head, &traffic.up).await {
            return e;
        }
        pending.drain(..end);
        let framing = forward_request.framing;
        if let Err(e) = forward_body(shared, reader, writer, &mut pending, framing, traffic).await {
            return e;
        }
    }
}

/// Read once more into `pending`; `false` when the client closed.
async fn read_more<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut [u8],
    pending: &mut Vec<u8>,
    traffic: &Traffic,
) -> bool {
    match reader.read(buf).await {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            traffic.activity.fetch_add(1, Ordering::Relaxed);
            pending.extend_from_slice(&buf[..n]);
            true
        }
    }
}

async fn forward<W: AsyncWrite + Unpin>(
    shared: &Shared,
    writer: &mut W,
    bytes: &[u8],
    counter: &AtomicU64,
) -> Result<(), DirEnd> {
    if bytes.is_empty() {
        return Ok(());
    }
    if !shared.consume(bytes.len()) {
        return Err(DirEnd::Deny(reason::LIMIT));
    }
    writer.write_all(bytes).await.map_err(|_| DirEnd::Closed)?;
    counter.fetch_add(bytes.len() as u64, Ordering::Relaxed);
    Ok(())
}

async fn copy(
    shared: &Shared,
    reader: &mut ReadHalf<'_>,
    writer: &mut WriteHalf<'_>,
    prefix: Vec<u8>,
    counter: &AtomicU64,
    traffic: &Traffic,
) -> DirEnd {
    if let Err(end) = forward(shared, writer, &prefix, counter).await {
        return end;
    }
    drop(prefix);
    // Zero-copy first: bytes move socket -> pipe -> socket inside the kernel, so the proxy
    // adds no user-space copies (the difference between ~45% and ~90% of direct loopback
    // throughput on a 2-core host). Fall back to a buffer if no pipe can be made.
    if let Ok((pipe_r, pipe_w)) = pipe_with(PipeFlags::NONBLOCK | PipeFlags::CLOEXEC) {
        let _ = fcntl_setpipe_size(&pipe_w, PIPE_SIZE);
        return splice_loop(shared, reader, writer, &pipe_r, &pipe_w, counter, traffic).await;
    }
    let mut buf = vec![0u8; START_BUF];
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => {
                // Propagate the half-close so request/response protocols still finish.
                let _ = writer.shutdown().await;
                return DirEnd::Closed;
            }
            Ok(n) => n,
        };
        traffic.activity.fetch_add(1, Ordering::Relaxed);
        if let Err(end) = forward(shared, writer, &buf[..n], counter).await {
            return end;
        }
        if n == buf.len() && buf.len() < MAX_BUF {
            buf.resize(buf.len() * 2, 0);
        }
    }
}

/// [`copy`] for streams that cannot splice (a TLS session): a growing buffer.
pub(crate) async fn copy_stream<R, W>(
    shared: &Shared,
    reader: &mut R,
    writer: &mut W,
    counter: &AtomicU64,
    traffic: &Traffic,
) -> DirEnd
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; START_BUF];
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = writer.shutdown().await;
                return DirEnd::Closed;
            }
            Ok(n) => n,
        };
        traffic.activity.fetch_add(1, Ordering::Relaxed);
        if let Err(end) = forward(shared, writer, &buf[..n], counter).await {
            return end;
        }
        if n == buf.len() && buf.len() < MAX_BUF {
            buf.resize(buf.len() * 2, 0);
        }
    }
}

const PIPE_SIZE: usize = 1024 * 1024;

async fn splice_loop(
    shared: &Shared,
    reader: &mut ReadHalf<'_>,
    writer: &mut WriteHalf<'_>,
    pipe_r: &OwnedFd,
    pipe_w: &OwnedFd,
    counter: &AtomicU64,
    traffic: &Traffic,
) -> DirEnd {
    let flags = SpliceFlags::MOVE | SpliceFlags::NONBLOCK;
    loop {
        // Socket -> pipe. The pipe is empty here, so only the socket can block.
        let src: &TcpStream = reader.as_ref();
        let n = loop {
            if src.readable().await.is_err() {
                return DirEnd::Closed;
            }
            match src.try_io(Interest::READABLE, || {
                splice(src, None, pipe_w, None, PIPE_SIZE, flags).map_err(std::io::Error::from)
            }) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(_) => break 0,
            }
        };
        if n == 0 {
            let _ = writer.shutdown().await;
            return DirEnd::Closed;
        }
        traffic.activity.fetch_add(1, Ordering::Relaxed);
        if !shared.consume(n) {
            return DirEnd::Deny(reason::LIMIT);
        }
        // Pipe -> socket until the pipe is drained.
        let dst: &TcpStream = writer.as_ref();
        let mut left = n;
        while left > 0 {
            if dst.writable().await.is_err() {
                return DirEnd::Closed;
            }
            match dst.try_io(Interest::WRITABLE, || {
                splice(pipe_r, None, dst, None, left, flags).map_err(std::io::Error::from)
            }) {
                Ok(0) => return DirEnd::Closed,
                Ok(m) => {
                    left -= m;
                    counter.fetch_add(m as u64, Ordering::Relaxed);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(_) => return DirEnd::Closed,
            }
        }
    }
}

/// The forward proxy's one request body; whatever follows it (a pipelined request) is
/// dropped: one request per connection, so it never reaches the upstream unchecked.
async fn copy_body<R, W>(
    shared: &Shared,
    reader: &mut R,
    writer: &mut W,
    prefix: Vec<u8>,
    framing: BodyFraming,
    traffic: &Traffic,
) -> DirEnd
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut pending = prefix;
    match forward_body(shared, reader, writer, &mut pending, framing, traffic).await {
        Ok(()) | Err(DirEnd::Closed) => DirEnd::Closed,
        Err(deny) => deny,
    }
}

/// Forward the body `framing` describes, starting with `pending`; on success `pending`
/// holds what the client sent after the body.
async fn forward_body<R, W>(
    shared: &Shared,
    reader: &mut R,
    writer: &mut W,
    pending: &mut Vec<u8>,
    mut framing: BodyFraming,
    traffic: &Traffic,
) -> Result<(), DirEnd>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 64 * 1024];
    // No secret placeholder may leave in a body (crate::secrets): a chunk holding the
    // marker ends the request before it is forwarded.
    let mut scanner = crate::secrets::StreamScanner::default();
    loop {
        let take = framing
            .feed(pending)
            .map_err(|()| DirEnd::Deny(reason::BAD_REQUEST))?;
        if scanner.feed(&pending[..take]) {
            return Err(DirEnd::Deny(reason::SECRET_WRONG_DESTINATION));
        }
        forward(shared, writer, &pending[..take], &traffic.up).await?;
        pending.drain(..take);
        if framing.done() {
            return Ok(());
        }
        if !read_more(reader, &mut buf, pending, traffic).await {
            return Err(DirEnd::Closed);
        }
    }
}

/// How much of a request body is read before its head is forwarded, so that a body
/// carrying a secret placeholder is refused before any of the request leaves.
pub const READ_AHEAD: usize = 64 * 1024;

/// Read the start of the body `framing` describes into `pending`: until the body is
/// complete, [`READ_AHEAD`] bytes of it are there, the client pauses for `idle`, or it
/// closes. A client that asked for `100-continue` waits for the upstream, so the caller
/// does not read ahead for it; its body is still scanned as it streams (forward_body).
pub async fn read_ahead<R: AsyncRead + Unpin>(
    reader: &mut R,
    pending: &mut Vec<u8>,
    framing: &BodyFraming,
    idle: Duration,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let mut probe = framing.clone();
        let Ok(take) = probe.feed(pending) else {
            return;
        };
        if probe.done() || take >= READ_AHEAD {
            return;
        }
        match tokio::time::timeout(idle, reader.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => pending.extend_from_slice(&buf[..n]),
            _ => return,
        }
    }
}

/// Whether the part of `pending` that belongs to the body holds a secret placeholder.
pub fn body_ahead_has_marker(pending: &[u8], framing: &BodyFraming) -> bool {
    let mut probe = framing.clone();
    let take = probe.feed(pending).unwrap_or(pending.len());
    crate::secrets::contains_marker(&pending[..take])
}

/// Whether a request head asks for `Expect: 100-continue`.
pub fn expects_continue(headers: &[httparse::Header<'_>]) -> bool {
    headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("expect") && h.value.eq_ignore_ascii_case(b"100-continue")
    })
}

/// How a request body is delimited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyFraming {
    Empty,
    Length(u64),
    Chunked(ChunkedScanner),
}

impl BodyFraming {
    /// [`BodyFraming::feed`], for crate::fuzzing.
    pub(crate) fn feed_for_fuzzing(&mut self, bytes: &[u8]) -> Result<usize, ()> {
        self.feed(bytes)
    }

    /// How many of `bytes` belong to the body (stops at its end).
    fn feed(&mut self, bytes: &[u8]) -> Result<usize, ()> {
        match self {
            BodyFraming::Empty => Ok(0),
            BodyFraming::Length(rem) => {
                let take = (*rem).min(bytes.len() as u64);
                *rem -= take;
                Ok(take as usize)
            }
            BodyFraming::Chunked(scanner) => scanner.feed(bytes),
        }
    }

    fn done(&self) -> bool {
        match self {
            BodyFraming::Empty => true,
            BodyFraming::Length(rem) => *rem == 0,
            BodyFraming::Chunked(scanner) => scanner.state == ChunkState::Done,
        }
    }
}

/// Finds the end of a chunked body without decoding it (bytes are forwarded verbatim).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChunkedScanner {
    state: ChunkState,
    line_len: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum ChunkState {
    #[default]
    SizeStart,
    Size(u64),
    Extension(u64),
    SizeLf(u64),
    Data(u64),
    DataCr,
    DataLf,
    /// In the trailer section; `true` at the start of a line.
    Trailer(bool),
    TrailerLf(bool),
    Done,
}

const MAX_CHUNK_LINE: usize = 4096;

impl ChunkedScanner {
    fn feed(&mut self, bytes: &[u8]) -> Result<usize, ()> {
        use ChunkState::*;
        let mut i = 0;
        while i < bytes.len() && self.state != Done {
            if let Data(rem) = self.state {
                let take = rem.min((bytes.len() - i) as u64);
                i += take as usize;
                self.state = if rem == take {
                    DataCr
                } else {
                    Data(rem - take)
                };
                continue;
            }
            let b = bytes[i];
            i += 1;
            self.line_len += 1;
            if self.line_len > MAX_CHUNK_LINE {
                return Err(());
            }
            self.state = match (self.state, b) {
                (SizeStart, _) => Size(hex(b).ok_or(())?),
                (Size(n), b'\r') => SizeLf(n),
                (Size(n), b';' | b' ' | b'\t') => Extension(n),
                (Size(n), _) => {
                    let d = hex(b).ok_or(())?;
                    Size(n.checked_mul(16).and_then(|v| v.checked_add(d)).ok_or(())?)
                }
                (Extension(n), b'\r') => SizeLf(n),
                // Bare LF line endings are refused (request-smuggling territory).
                (Extension(_), b'\n') => return Err(()),
                (Extension(n), _) => Extension(n),
                (SizeLf(n), b'\n') => {
                    self.line_len = 0;
                    if n == 0 {
                        Trailer(true)
                    } else {
                        Data(n)
                    }
                }
                (DataCr, b'\r') => DataLf,
                (DataLf, b'\n') => {
                    self.line_len = 0;
                    SizeStart
                }
                (Trailer(at_start), b'\r') => TrailerLf(at_start),
                // A bare LF here would let a lenient upstream end the message early and
                // read the rest of the "trailer" as a second request.
                (Trailer(_), b'\n') => return Err(()),
                (Trailer(_), _) => Trailer(false),
                (TrailerLf(at_start), b'\n') => {
                    self.line_len = 0;
                    if at_start {
                        Done
                    } else {
                        Trailer(true)
                    }
                }
                _ => return Err(()),
            };
        }
        Ok(i)
    }
}

fn hex(b: u8) -> Option<u64> {
    (b as char).to_digit(16).map(u64::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(input: &[u8], step: usize) -> Result<(usize, bool), ()> {
        let mut s = ChunkedScanner::default();
        let mut consumed = 0;
        for chunk in input.chunks(step) {
            let n = s.feed(chunk)?;
            consumed += n;
            if s.state == ChunkState::Done {
                break;
            }
        }
        Ok((consumed, s.state == ChunkState::Done))
    }

    #[test]
    fn chunked_body_end_found_at_any_split() {
        let body =
            b"4\r\nWiki\r\n5;ext=1\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nX-T: 1\r\n\r\n";
        let mut with_next = body.to_vec();
        with_next.extend_from_slice(b"GET http://other.test/ HTTP/1.1\r\n\r\n");
        for step in 1..=with_next.len() {
            assert_eq!(
                scan(&with_next, step),
                Ok((body.len(), true)),
                "step {step}"
            );
        }
    }

    #[test]
    fn chunked_rejects_garbage() {
        assert!(scan(b"zz\r\n", 100).is_err());
        assert!(scan(b"4\nWiki", 100).is_err());
        assert!(scan(b"4\r\nWikiXX", 100).is_err());
        assert!(scan(b"ffffffffffffffffff\r\n", 100).is_err());
        assert!(scan(b"0\r\nX: y\n\nGET /smuggled HTTP/1.1\r\n\r\n", 100).is_err());
        assert_eq!(scan(b"0\r\n\r\n", 1), Ok((5, true)));
    }

    #[test]
    fn an_interception_refusal_is_a_denial_and_a_limit_is_not() {
        for code in [
            reason::UPSTREAM_CERT_INVALID,
            reason::TLS_HANDSHAKE_FAILED,
            reason::SECRET_WRONG_DESTINATION,
        ] {
            assert_eq!(decision_for(Some(code)), Decision::Denied, "{code}");
        }
        assert_eq!(decision_for(Some(reason::LIMIT)), Decision::Allowed);
        assert_eq!(decision_for(None), Decision::Allowed);
    }

    #[test]
    fn length_framing() {
        let mut f = BodyFraming::Length(5);
        assert_eq!(f.feed(b"abc"), Ok(3));
        assert!(!f.done());
        assert_eq!(f.feed(b"defgh"), Ok(2));
        assert!(f.done());
    }
}
