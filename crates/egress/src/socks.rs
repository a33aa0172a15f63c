//! The SOCKS5 listener (RFC 1928): no authentication, CONNECT only.

use std::net::{Ipv4Addr, Ipv6Addr};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::proxy::{decide_and_connect_or_shutdown, or_shutdown, Attempt, ConnectionSlot};
use crate::tunnel::relay_tunnel;
use crate::{reason, SharedState};

const REPLY_SUCCEEDED: u8 = 0x00;
const REPLY_GENERAL_FAILURE: u8 = 0x01;
const REPLY_NOT_ALLOWED: u8 = 0x02;
const REPLY_HOST_UNREACHABLE: u8 = 0x04;
const REPLY_COMMAND_NOT_SUPPORTED: u8 = 0x07;
const REPLY_ATYP_NOT_SUPPORTED: u8 = 0x08;

/// The reply code for a refusal. Upstream failures all map to "general failure" so the
/// cell learns nothing about why (refused, timed out, unreachable).
fn reply_code(code: &'static str) -> u8 {
    match code {
        reason::RESOLVE_FAILED => REPLY_HOST_UNREACHABLE,
        reason::UPSTREAM_FAILED => REPLY_GENERAL_FAILURE,
        reason::BAD_REQUEST => REPLY_GENERAL_FAILURE,
        _ => REPLY_NOT_ALLOWED,
    }
}

async fn reply<S: AsyncWrite + Unpin>(client: &mut S, code: u8) {
    // BND.ADDR/BND.PORT are zero: the proxy's upstream address is none of the cell's business.
    let _ = client
        .write_all(&[0x05, code, 0x00, 0x01, 0, 0, 0, 0, 0, 0])
        .await;
}

#[derive(Debug)]
pub(crate) enum Request {
    Connect {
        host: String,
        port: u16,
    },
    /// Refuse with this reply code after recording `host:port` if known.
    Unsupported {
        reply: u8,
        host: String,
        port: u16,
    },
}

pub async fn handle(
    shared: SharedState,
    mut client: TcpStream,
    over_limit: bool,
    _slot: ConnectionSlot,
) {
    let _ = client.set_nodelay(true);
    let mut attempt = Attempt::begin("socks5");
    let negotiation = tokio::time::timeout(shared.idle, negotiate(&mut client));
    let request = match or_shutdown(&shared, negotiation).await {
        None => return,
        Some(Ok(Ok(Some(r)))) => r,
        Some(Ok(Ok(None))) => return,
        Some(Ok(Err(code))) => {
            attempt.deny(&shared, code);
            return;
        }
        Some(Err(_)) => {
            attempt.deny(&shared, reason::LIMIT);
            return;
        }
    };
    let (host, port) = match request {
        Request::Connect { host, port } => (host, port),
        Request::Unsupported {
            reply: r,
            host,
            port,
        } => {
            attempt.target(&host, port);
            reply(&mut client, r).await;
            attempt.deny(&shared, reason::BAD_REQUEST);
            return;
        }
    };
    attempt.target(&host, port);
    if over_limit {
        reply(&mut client, reply_code(reason::LIMIT)).await;
        attempt.deny(&shared, reason::LIMIT);
        return;
    }
    let opened = match decide_and_connect_or_shutdown(&shared, &host, port).await {
        Ok(o) => o,
        Err(refusal) => {
            attempt.address = refusal.address;
            reply(&mut client, reply_code(refusal.reason)).await;
            attempt.deny(&shared, refusal.reason);
            return;
        }
    };
    attempt.address = opened.address;
    reply(&mut client, REPLY_SUCCEEDED).await;
    relay_tunnel(&shared, &mut client, opened, Vec::new(), &host, attempt).await;
}

/// Method negotiation and the request. `Ok(None)`: the client went away before saying
/// anything (not an attempt). `Err(code)`: malformed, already answered where possible.
pub(crate) async fn negotiate<S: AsyncRead + AsyncWrite + Unpin>(
    client: &mut S,
) -> Result<Option<Request>, &'static str> {
    let mut greeting = [0u8; 2];
    match client.read(&mut greeting[..1]).await {
        Ok(0) | Err(_) => return Ok(None),
        Ok(_) => {}
    }
    let io = |_| reason::BAD_REQUEST;
    client.read_exact(&mut greeting[1..]).await.map_err(io)?;
    if greeting[0] != 0x05 {
        return Err(reason::BAD_REQUEST);
    }
    let mut methods = vec![0u8; greeting[1] as usize];
    client.read_exact(&mut methods).await.map_err(io)?;
    if !methods.contains(&0x00) {
        let _ = client.write_all(&[0x05, 0xff]).await;
        return Err(reason::BAD_REQUEST);
    }
    client.write_all(&[0x05, 0x00]).await.map_err(io)?;

    let mut head = [0u8; 4];
    client.read_exact(&mut head).await.map_err(io)?;
    if head[0] != 0x05 {
        return Err(reason::BAD_REQUEST);
    }
    let host = match head[3] {
        0x01 => {
            let mut a = [0u8; 4];
            client.read_exact(&mut a).await.map_err(io)?;
            Ipv4Addr::from(a).to_string()
        }
        0x04 => {
            let mut a = [0u8; 16];
            client.read_exact(&mut a).await.map_err(io)?;
            format!("[{}]", Ipv6Addr::from(a))
        }
        0x03 => {
            let mut len = [0u8; 1];
            client.read_exact(&mut len).await.map_err(io)?;
            let mut name = vec![0u8; len[0] as usize];
            client.read_exact(&mut name).await.map_err(io)?;
            // Non-UTF-8 names cannot match any rule; keep a lossy form for the record.
            String::from_utf8_lossy(&name).into_owned()
        }
        _ => {
            reply(client, REPLY_ATYP_NOT_SUPPORTED).await;
            return Err(reason::BAD_REQUEST);
        }
    };
    let mut port = [0u8; 2];
    client.read_exact(&mut port).await.map_err(io)?;
    let port = u16::from_be_bytes(port);
    if head[1] != 0x01 {
        return Ok(Some(Request::Unsupported {
            reply: REPLY_COMMAND_NOT_SUPPORTED,
            host,
            port,
        }));
    }
    Ok(Some(Request::Connect { host, port }))
}
