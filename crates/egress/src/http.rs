//! The HTTP proxy listener: absolute-form forwarding and CONNECT tunnels.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::proxy::{decide_and_connect_or_shutdown, or_shutdown, Attempt, ConnectionSlot};
use crate::request::{self, ForwardRequest, MAX_HEAD};
use crate::tunnel::{pump, relay_tunnel, Traffic, UpMode};
use crate::{reason, Decision, SharedState};

/// Headers that describe this hop only (RFC 9110 7.6.1) or the proxy itself; never
/// forwarded. `Upgrade` is dropped because the connection is used for one request only.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "upgrade",
];

pub async fn handle(
    shared: SharedState,
    mut client: TcpStream,
    over_limit: bool,
    _slot: ConnectionSlot,
) {
    let _ = client.set_nodelay(true);
    let mut attempt = Attempt::begin("http");
    let mut buf = Vec::with_capacity(4096);
    let head = match or_shutdown(&shared, read_head(&shared, &mut client, &mut buf)).await {
        Some(HeadRead::Complete(len)) => len,
        Some(HeadRead::Nothing) | None => return,
        Some(HeadRead::Refused(code)) => {
            refuse_and_record(&shared, &mut client, attempt, code).await;
            return;
        }
    };

    let req = match request::parse(&buf[..head]) {
        Ok(req) => req,
        Err(code) => {
            refuse_and_record(&shared, &mut client, attempt, code).await;
            return;
        }
    };
    let (method, target, version) = (req.method, req.target, req.version);

    if method.eq_ignore_ascii_case("CONNECT") {
        attempt.protocol = "connect";
        let Some((host, port)) = split_authority(target, None) else {
            refuse_and_record(&shared, &mut client, attempt, reason::BAD_REQUEST).await;
            return;
        };
        attempt.target(&host, port);
        if over_limit {
            refuse_and_record(&shared, &mut client, attempt, reason::LIMIT).await;
            return;
        }
        let leftover = buf[head..].to_vec();
        drop(req);
        drop(buf);
        connect_tunnel(&shared, client, attempt, &host, port, leftover).await;
        return;
    }

    // Absolute-form only: a proxy never serves origin-form requests itself.
    let Some((authority, path)) = split_absolute_http(target) else {
        refuse_and_record(&shared, &mut client, attempt, reason::BAD_REQUEST).await;
        return;
    };
    let Some((host, port)) = split_authority(authority, Some(80)) else {
        refuse_and_record(&shared, &mut client, attempt, reason::BAD_REQUEST).await;
        return;
    };
    attempt.target(&host, port);
    let target = RequestTarget {
        method,
        path,
        version,
        authority,
    };
    let request = match check_and_rewrite(&target, &req.headers, &host, port, shared.run_policy()) {
        Ok(r) => r,
        Err(code) => {
            refuse_and_record(&shared, &mut client, attempt, code).await;
            return;
        }
    };
    if over_limit {
        refuse_and_record(&shared, &mut client, attempt, reason::LIMIT).await;
        return;
    }
    let continues = crate::tunnel::expects_continue(&req.headers);
    let mut leftover = buf[head..].to_vec();
    drop(req);
    drop(buf);
    if !continues {
        let framing = &request.framing;
        crate::tunnel::read_ahead(&mut client, &mut leftover, framing, shared.idle).await;
    }
    if crate::tunnel::body_ahead_has_marker(&leftover, &request.framing) {
        let code = reason::SECRET_WRONG_DESTINATION;
        refuse_and_record(&shared, &mut client, attempt, code).await;
        return;
    }

    let mut opened = match decide_and_connect_or_shutdown(&shared, &host, port).await {
        Ok(o) => o,
        Err(refusal) => {
            attempt.address = refusal.address;
            refuse_and_record(&shared, &mut client, attempt, refusal.reason).await;
            return;
        }
    };
    attempt.address = opened.address;
    let traffic = Traffic::default();
    if !shared.consume(request.head.len()) {
        refuse_and_record(&shared, &mut client, attempt, reason::LIMIT).await;
        return;
    }
    if opened.stream.write_all(&request.head).await.is_err() {
        refuse_and_record(&shared, &mut client, attempt, reason::UPSTREAM_FAILED).await;
        return;
    }
    traffic.up.fetch_add(
        request.head.len() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
    let cut = pump(
        &shared,
        &mut client,
        &mut opened.stream,
        leftover,
        std::mem::take(&mut opened.upstream_prefix),
        UpMode::HttpBody(request.framing),
        &traffic,
    )
    .await;
    // A body that carried a placeholder was cut before it left: the request is refused.
    let decision = match cut {
        Some(reason::SECRET_WRONG_DESTINATION) => Decision::Denied,
        _ => Decision::Allowed,
    };
    attempt.finish(&shared, decision, cut, traffic.up(), traffic.down());
}

async fn connect_tunnel(
    shared: &SharedState,
    mut client: TcpStream,
    mut attempt: Attempt,
    host: &str,
    port: u16,
    leftover: Vec<u8>,
) {
    let opened = match decide_and_connect_or_shutdown(shared, host, port).await {
        Ok(o) => o,
        Err(refusal) => {
            attempt.address = refusal.address;
            refuse_and_record(shared, &mut client, attempt, refusal.reason).await;
            return;
        }
    };
    attempt.address = opened.address;
    if client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .is_err()
    {
        attempt.finish(shared, Decision::Allowed, None, 0, 0);
        return;
    }
    relay_tunnel(shared, &mut client, opened, leftover, host, attempt).await;
}

enum HeadRead {
    /// The head is `buf[..len]`.
    Complete(usize),
    /// The client closed without sending anything: not an attempt.
    Nothing,
    Refused(&'static str),
}

async fn read_head(shared: &SharedState, client: &mut TcpStream, buf: &mut Vec<u8>) -> HeadRead {
    let mut chunk = [0u8; 8192];
    loop {
        let read = tokio::time::timeout(shared.idle, client.read(&mut chunk)).await;
        let n = match read {
            Err(_) if buf.is_empty() => return HeadRead::Nothing,
            Err(_) => return HeadRead::Refused(reason::LIMIT),
            Ok(Ok(0)) | Ok(Err(_)) if buf.is_empty() => return HeadRead::Nothing,
            Ok(Ok(0)) | Ok(Err(_)) => return HeadRead::Refused(reason::BAD_REQUEST),
            Ok(Ok(n)) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = request::find_head_end(buf) {
            return HeadRead::Complete(end);
        }
        if buf.len() > MAX_HEAD {
            return HeadRead::Refused(reason::BAD_REQUEST);
        }
    }
}

/// `http://authority/path?query` -> (authority, origin-form target).
pub fn split_absolute_http(target: &str) -> Option<(&str, &str)> {
    let scheme_end = target.find("://")?;
    if !target[..scheme_end].eq_ignore_ascii_case("http") {
        return None;
    }
    let rest = &target[scheme_end + 3..];
    let path_start = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(path_start);
    if path.contains('#') {
        return None;
    }
    Some((authority, if path.is_empty() { "/" } else { path }))
}

/// `host:port`, `[v6]:port`, or `host` with a default port. Userinfo is refused.
pub fn split_authority(authority: &str, default_port: Option<u16>) -> Option<(String, u16)> {
    if authority.is_empty() || authority.contains(['@', '/', '\\', ' ', '?', '#']) {
        return None;
    }
    let (host, port) = if authority.starts_with('[') {
        let close = authority.find(']')?;
        let host = &authority[..=close];
        match &authority[close + 1..] {
            "" => (host, None),
            rest => (host, Some(rest.strip_prefix(':')?)),
        }
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() || host.contains('%') && !host.starts_with('[') {
        return None;
    }
    let port = match port {
        Some(p) => {
            if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            p.parse().ok()?
        }
        None => default_port?,
    };
    Some((host.to_string(), port))
}

struct RequestTarget<'a> {
    method: &'a str,
    /// Origin-form.
    path: &'a str,
    version: u8,
    authority: &'a str,
}

/// Check a forward-proxy request for `host:port` and write the origin-form head to send
/// upstream: hop-by-hop and proxy headers removed, framing canonical, `Connection: close`,
/// the run's secret placeholders swapped where they may be (crate::secrets).
fn check_and_rewrite(
    target: &RequestTarget<'_>,
    headers: &[httparse::Header<'_>],
    host: &str,
    port: u16,
    (injections, http_rules): (&[crate::secrets::Injection], &[crate::l7::HttpRule]),
) -> Result<ForwardRequest, &'static str> {
    let RequestTarget {
        method,
        path,
        version,
        authority,
    } = *target;
    let has_host = request::check_host(headers, version, host, port)?;
    // Tokens listed in Connection are hop-by-hop too; naming framing or Host is refused.
    let extra_hop = request::connection_tokens(headers)?;
    let framing = request::framing(headers)?;
    let canonical = crate::proxy::canonical_host(host);
    crate::l7::check(http_rules, &canonical, method, path)?;
    let swapped = crate::secrets::apply(
        injections,
        &crate::secrets::Head {
            method,
            target: path,
            headers,
            host: &canonical,
        },
    )?;

    let mut head = Vec::with_capacity(512);
    head.extend_from_slice(method.as_bytes());
    head.push(b' ');
    head.extend_from_slice(swapped.target.as_deref().unwrap_or(path).as_bytes());
    head.extend_from_slice(request::version_line(version));
    if !has_host {
        head.extend_from_slice(b"Host: ");
        head.extend_from_slice(authority.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    for (index, h) in headers.iter().enumerate() {
        let lower = h.name.to_ascii_lowercase();
        if HOP_BY_HOP.contains(&lower.as_str())
            || lower.starts_with("proxy-")
            || extra_hop.contains(&lower)
            || lower == "content-length"
            || lower == "transfer-encoding"
        {
            continue;
        }
        let value = swapped.header(index, h.value);
        request::write_header(
            &mut head,
            &httparse::Header {
                name: h.name,
                value,
            },
        );
    }
    request::write_framing(&mut head, &framing);
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(ForwardRequest { head, framing })
}

/// Answer a refused request: status, `X-Airlock-Reason`, and the code as the body. No
/// upstream detail is ever included.
/// Answers the client with the refusal `code` and records the attempt as denied by it.
async fn refuse_and_record(
    shared: &SharedState,
    client: &mut TcpStream,
    attempt: Attempt,
    code: &'static str,
) {
    refuse(client, code).await;
    attempt.deny(shared, code);
}

pub async fn refuse<S>(client: &mut S, code: &'static str)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let status = match code {
        reason::UPSTREAM_FAILED | reason::RESOLVE_FAILED | reason::UPSTREAM_CERT_INVALID => {
            "502 Bad Gateway"
        }
        reason::BAD_REQUEST | reason::AMBIGUOUS_FRAMING => "400 Bad Request",
        _ => "403 Forbidden",
    };
    let body = format!("{code}\n");
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nX-Airlock-Reason: {code}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if client.write_all(response.as_bytes()).await.is_err() {
        return;
    }
    let _ = client.shutdown().await;
    // Drain briefly so unread request bytes do not turn our close into a RST that would
    // destroy the response before the client reads it.
    let mut sink = [0u8; 4096];
    let drain = async {
        let mut total = 0usize;
        while let Ok(n) = client.read(&mut sink).await {
            if n == 0 || total > 256 * 1024 {
                break;
            }
            total += n;
        }
    };
    let _ = tokio::time::timeout(Duration::from_millis(200), drain).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities() {
        assert_eq!(
            split_authority("api.test:443", None),
            Some(("api.test".into(), 443))
        );
        assert_eq!(
            split_authority("api.test", Some(80)),
            Some(("api.test".into(), 80))
        );
        assert_eq!(split_authority("api.test", None), None);
        assert_eq!(
            split_authority("[::1]:8080", None),
            Some(("[::1]".into(), 8080))
        );
        assert_eq!(split_authority("::1:8080", None), None);
        assert_eq!(split_authority("user@api.test:80", None), None);
        assert_eq!(split_authority("api.test:+80", None), None);
        assert_eq!(split_authority("api.test:99999", None), None);
        assert_eq!(split_authority("api.test:", None), None);
    }

    #[test]
    fn absolute_targets() {
        assert_eq!(
            split_absolute_http("http://api.test/a?b"),
            Some(("api.test", "/a?b"))
        );
        assert_eq!(
            split_absolute_http("HTTP://api.test"),
            Some(("api.test", "/"))
        );
        assert_eq!(
            split_absolute_http("http://api.test?q"),
            Some(("api.test", "?q"))
        );
        assert_eq!(split_absolute_http("https://api.test/"), None);
        assert_eq!(split_absolute_http("/path"), None);
    }

    fn hdr<'a>(name: &'a str, value: &'a str) -> httparse::Header<'a> {
        httparse::Header {
            name,
            value: value.as_bytes(),
        }
    }

    fn get(path: &str) -> RequestTarget<'_> {
        RequestTarget {
            method: "GET",
            path,
            version: 1,
            authority: "api.test",
        }
    }

    #[test]
    fn rewrite_strips_proxy_headers_and_checks_host() {
        let headers = [
            hdr("Host", "API.test"),
            hdr("Proxy-Authorization", "Basic eA=="),
            hdr("Proxy-Connection", "keep-alive"),
            hdr("Connection", "keep-alive, X-Secret"),
            hdr("X-Secret", "1"),
            hdr("Accept", "*/*"),
        ];
        let r = check_and_rewrite(&get("/p"), &headers, "api.test", 80, (&[], &[])).unwrap();
        let text = String::from_utf8(r.head).unwrap();
        assert_eq!(
            text,
            "GET /p HTTP/1.1\r\nHost: API.test\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        let bad = [hdr("Host", "other.test")];
        assert_eq!(
            check_and_rewrite(&get("/"), &bad, "api.test", 80, (&[], &[])).err(),
            Some(reason::HOST_MISMATCH)
        );
        let bad_port = [hdr("Host", "api.test:8080")];
        assert_eq!(
            check_and_rewrite(&get("/"), &bad_port, "api.test", 80, (&[], &[])).err(),
            Some(reason::HOST_MISMATCH)
        );
        let two = [hdr("Host", "api.test"), hdr("Host", "other.test")];
        assert_eq!(
            check_and_rewrite(&get("/"), &two, "api.test", 80, (&[], &[])).err(),
            Some(reason::HOST_MISMATCH)
        );
        let none: [httparse::Header<'_>; 0] = [];
        assert_eq!(
            check_and_rewrite(&get("/"), &none, "api.test", 80, (&[], &[])).err(),
            Some(reason::HOST_MISMATCH)
        );
        let smuggle = [
            hdr("Host", "api.test"),
            hdr("Transfer-Encoding", "chunked"),
            hdr("Content-Length", "3"),
        ];
        assert_eq!(
            check_and_rewrite(&get("/"), &smuggle, "api.test", 80, (&[], &[])).err(),
            Some(reason::AMBIGUOUS_FRAMING)
        );
    }
}
