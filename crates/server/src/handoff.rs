//! `airlock run` handed to the service (crates/engine/src/handoff.rs): a unix connection
//! whose first bytes are [`HANDOFF_MAGIC`] is not HTTP but a hand-off client. It is served
//! by the engine's `serve_connection` on a blocking thread, as the peer's tenant and
//! within its quotas, exactly like `POST /v1/runs`.

use crate::quota::Work;
use crate::state::Shared;
use crate::tenants::Peer;
use airlock_cell::report::ResultClass;
use airlock_engine::handoff::{
    serve_connection, HandoffAdmission, HandoffGate, HandoffPeer, HandoffRefusal, HANDOFF_MAGIC,
};
use axum::http::StatusCode;
use std::time::Duration;
use tokio::net::UnixStream;

/// The service's tenant and quota check for hand-off clients.
pub struct ServiceGate {
    pub state: Shared,
}

impl HandoffGate for ServiceGate {
    fn admit(&self, peer: &HandoffPeer) -> Result<HandoffAdmission, HandoffRefusal> {
        let refusal = |err: crate::error::ApiError| HandoffRefusal {
            class: match err.status {
                StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
                    ResultClass::CapacityExceeded
                }
                _ => ResultClass::PolicyDenied,
            },
            error: format!("{}: {}", err.body.reason, err.body.error),
        };
        let unix = Peer::Unix {
            uid: peer.uid,
            pid: Some(peer.pid),
        };
        let tenant = self.state.tenants.resolve(unix, None).map_err(refusal)?;
        let permit = self.state.admit(&tenant, Work::Run).map_err(refusal)?;
        Ok(HandoffAdmission {
            tenant: Some(tenant.name),
            guard: Box::new(permit),
        })
    }

    fn image(&self, reference: &str) -> Option<airlock_engine::handoff::LeasedImage> {
        self.state.contracts.leased_image(reference)
    }
}

/// What a unix connection's first bytes say it is.
#[derive(Debug, PartialEq, Eq)]
pub enum Protocol {
    Handoff,
    Http,
}

/// The pure decision on the bytes seen so far: `None` while they could still become the
/// magic (and the peer has not hung up).
pub fn protocol_of(seen: &[u8], ended: bool) -> Option<Protocol> {
    let n = seen.len().min(HANDOFF_MAGIC.len());
    if seen[..n] != HANDOFF_MAGIC[..n] {
        return Some(Protocol::Http);
    }
    if n == HANDOFF_MAGIC.len() {
        return Some(Protocol::Handoff);
    }
    ended.then_some(Protocol::Http)
}

/// Peeks (without consuming) until the first bytes decide, within `within`. A peer that
/// sends nothing in time is served as HTTP, whose own header timeout then ends it.
pub async fn sniff(stream: &UnixStream, within: Duration) -> Protocol {
    let sniffing = async {
        let mut buf = [0u8; 8];
        loop {
            if stream.readable().await.is_err() {
                return Protocol::Http;
            }
            let peeked = stream.try_io(tokio::io::Interest::READABLE, || {
                rustix::net::recv(stream, &mut buf, rustix::net::RecvFlags::PEEK)
                    .map(|(n, _)| n)
                    .map_err(std::io::Error::from)
            });
            match peeked {
                Ok(n) => {
                    if let Some(protocol) = protocol_of(&buf[..n], n == 0) {
                        return protocol;
                    }
                    // Part of the magic so far: wait a moment for the rest.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return Protocol::Http,
            }
        }
    };
    tokio::time::timeout(within, sniffing)
        .await
        .unwrap_or(Protocol::Http)
}

/// Serves a hand-off client on a blocking thread: the engine's hand-off is synchronous
/// and lasts as long as the run.
pub fn serve(stream: UnixStream, state: Shared) {
    let Ok(stream) = stream
        .into_std()
        .and_then(|s| s.set_nonblocking(false).map(|()| s))
    else {
        return;
    };
    tokio::task::spawn_blocking(move || {
        let engine = std::sync::Arc::clone(&state.engine);
        let gate = ServiceGate { state };
        let _ = serve_connection(stream, &engine, &gate);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_magic_decides_and_anything_else_is_http() {
        assert_eq!(protocol_of(b"ALHAND01", false), Some(Protocol::Handoff));
        assert_eq!(protocol_of(b"ALHA", false), None);
        assert_eq!(protocol_of(b"ALHA", true), Some(Protocol::Http));
        assert_eq!(protocol_of(b"GET / HT", false), Some(Protocol::Http));
        assert_eq!(protocol_of(b"P", false), Some(Protocol::Http));
        assert_eq!(protocol_of(b"", true), Some(Protocol::Http));
        assert_eq!(protocol_of(b"", false), None);
    }
}
