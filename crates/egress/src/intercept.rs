//! An intercepted TLS tunnel (crate::tls): the cell's TLS is terminated with the run CA's
//! leaf for the tunnel's host, the upstream's is verified, and the plain HTTP between
//! them runs through exactly the checks of a plain-HTTP tunnel
//! (`tunnel::relay_requests`: Host, framing, HTTP rules, secret swaps and refusals).

use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::proxy::{Attempt, Opened, Shared};
use crate::reason;
use crate::tls::{self, Replay};
use crate::tunnel::{copy_stream, decision_for, drive, relay_requests, Intercepted, Traffic};
use crate::Decision;

/// Terminates, checks and relays one intercepted tunnel, and records how it ended.
pub async fn relay(
    shared: &Shared,
    client: &mut TcpStream,
    mut opened: Opened,
    tunnel: Intercepted<'_>,
    attempt: Attempt,
) {
    let Intercepted {
        interceptor,
        host,
        hello,
    } = tunnel;
    let config = match interceptor.server_config(host) {
        Ok(config) => config,
        Err(_) => {
            return attempt.finish(
                shared,
                Decision::Denied,
                Some(reason::TLS_HANDSHAKE_FAILED),
                0,
                0,
            )
        }
    };
    let accept = TlsAcceptor::from(config).accept(Replay::new(hello, &mut *client));
    // A cell that does not trust the run CA, or offers only h2, fails here.
    let cell = match tokio::time::timeout(shared.idle, accept).await {
        Ok(Ok(stream)) => stream,
        _ => {
            return attempt.finish(
                shared,
                Decision::Denied,
                Some(reason::TLS_HANDSHAKE_FAILED),
                0,
                0,
            )
        }
    };
    let Some(name) = tls::server_name(host) else {
        return refuse(shared, cell, reason::BAD_REQUEST, attempt).await;
    };
    let prefix = std::mem::take(&mut opened.upstream_prefix);
    let connect = TlsConnector::from(interceptor.upstream())
        .connect(name, Replay::new(prefix, &mut opened.stream));
    let upstream = match tokio::time::timeout(shared.connect_timeout, connect).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(err)) if tls::is_certificate_failure(&err) => {
            return refuse(shared, cell, reason::UPSTREAM_CERT_INVALID, attempt).await
        }
        _ => return refuse(shared, cell, reason::UPSTREAM_FAILED, attempt).await,
    };

    let traffic = Traffic::default();
    let (mut cell_r, mut cell_w) = tokio::io::split(cell);
    let (mut up_r, mut up_w) = tokio::io::split(upstream);
    let port = attempt.port;
    let up = relay_requests(
        shared,
        &mut cell_r,
        &mut up_w,
        Vec::new(),
        (host, port),
        &traffic,
    );
    let down = copy_stream(shared, &mut up_r, &mut cell_w, &traffic.down, &traffic);
    let cut = drive(shared, up, down, false, &traffic).await;
    let (sent, received) = (traffic.up(), traffic.down());
    let decision = decision_for(cut);
    // As in a plain tunnel: a refusal before anything was relayed is answered in-band.
    if let Some(code) = cut.filter(|_| decision == Decision::Denied && sent == 0 && received == 0) {
        let mut cell = cell_r.unsplit(cell_w);
        crate::http::refuse(&mut cell, code).await;
    }
    attempt.finish(shared, decision, cut, sent, received);
}

/// Answers the cell's first request over its (terminated) TLS with the refusal, and
/// records it; `UPSTREAM_FAILED` is recorded as the forward proxy records it.
async fn refuse<S>(shared: &Shared, mut cell: S, code: &'static str, attempt: Attempt)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    crate::http::refuse(&mut cell, code).await;
    attempt.finish(shared, Decision::Denied, Some(code), 0, 0);
}
