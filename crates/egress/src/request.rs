//! Strict reading of plain-HTTP/1.x request heads, shared by the forward proxy and by
//! plaintext tunnels.
//!
//! The proxy decides on a request (its `Host`, where its body ends) and then hands the
//! bytes to an upstream that parses them again. Request smuggling lives in the gap between
//! those two readings, so the proxy accepts only heads that every RFC 9112 parser reads
//! the same way, refuses the rest with [`reason::AMBIGUOUS_FRAMING`], and always forwards
//! a head it wrote itself from what it checked (canonical framing headers, CRLF endings).

use crate::destination::{parse_host, ParsedHost};
use crate::http::{split_absolute_http, split_authority};
use crate::proxy::canonical_host;
use crate::reason;
use crate::tunnel::{BodyFraming, ChunkedScanner};

/// Upper bound of a request head (request line and fields).
pub const MAX_HEAD: usize = 64 * 1024;
const MAX_HEADERS: usize = 100;

/// Headers that route or delimit the request: removing one on the proxy's say-so (a
/// `Connection` token) would make the upstream read a different request than was checked.
const FRAMING_AND_ROUTING: &[&str] = &["content-length", "transfer-encoding", "host"];

/// A request head that passed the syntax checks. Framing and Host are checked by the
/// caller, against the destination it already decided on.
pub struct RequestHead<'h> {
    pub method: &'h str,
    pub target: &'h str,
    /// The minor version: `0` for HTTP/1.0, `1` for HTTP/1.1.
    pub version: u8,
    pub headers: Vec<httparse::Header<'h>>,
}

/// A request as it will be written upstream, and how its body is delimited.
pub struct ForwardRequest {
    pub head: Vec<u8>,
    pub framing: BodyFraming,
}

/// Where the head in `buf` ends: just past the first empty line. A bare-LF empty line also
/// ends it, so a bare-LF head is refused at once instead of waiting for a CRLF.
pub fn find_head_end(buf: &[u8]) -> Option<usize> {
    let mut line_start = 0;
    for (i, b) in buf.iter().enumerate() {
        if *b == b'\n' {
            let line = &buf[line_start..i];
            if line.is_empty() || line == b"\r" {
                return Some(i + 1);
            }
            line_start = i + 1;
        }
    }
    None
}

/// Parse a complete head (as delimited by [`find_head_end`]).
pub fn parse(head: &[u8]) -> Result<RequestHead<'_>, &'static str> {
    check_syntax(head)?;
    let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut storage);
    match req.parse(head) {
        Ok(httparse::Status::Complete(len)) if len == head.len() => {}
        _ => return Err(reason::BAD_REQUEST),
    }
    Ok(RequestHead {
        method: req.method.unwrap_or(""),
        target: req.path.unwrap_or(""),
        version: req.version.unwrap_or(1),
        headers: req.headers.to_vec(),
    })
}

/// The line-level rules httparse is lenient about, each a known smuggling vector: bare CR
/// or LF line endings, obs-fold continuation lines, whitespace (or anything but a token)
/// before the colon, and HTAB inside a framing header (`chunked\t` is read as `chunked`
/// by some servers and as an unknown coding by others).
fn check_syntax(head: &[u8]) -> Result<(), &'static str> {
    let body = head
        .strip_suffix(b"\r\n\r\n")
        .ok_or(reason::AMBIGUOUS_FRAMING)?;
    let lines: Vec<&[u8]> = body.split(|b| *b == b'\n').collect();
    let last = lines.len() - 1;
    for (i, raw) in lines.iter().enumerate() {
        let line = if i < last {
            raw.strip_suffix(b"\r").ok_or(reason::AMBIGUOUS_FRAMING)?
        } else {
            raw
        };
        if line.contains(&b'\r') {
            return Err(reason::AMBIGUOUS_FRAMING);
        }
        if i > 0 {
            check_field_line(line)?;
        }
    }
    Ok(())
}

fn check_field_line(line: &[u8]) -> Result<(), &'static str> {
    if line.starts_with(b" ") || line.starts_with(b"\t") {
        return Err(reason::AMBIGUOUS_FRAMING);
    }
    let colon = line
        .iter()
        .position(|b| *b == b':')
        .ok_or(reason::AMBIGUOUS_FRAMING)?;
    let name = &line[..colon];
    if name.is_empty() || !name.iter().all(|b| is_tchar(*b)) {
        return Err(reason::AMBIGUOUS_FRAMING);
    }
    let framing = name.eq_ignore_ascii_case(b"content-length")
        || name.eq_ignore_ascii_case(b"transfer-encoding");
    if framing && line.contains(&b'\t') {
        return Err(reason::AMBIGUOUS_FRAMING);
    }
    Ok(())
}

/// RFC 9110 5.6.2 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The body framing of a request (RFC 9112 6.3), refusing every combination two parsers
/// could disagree on: both headers, more than one of either (even if equal), a length
/// that is not plain digits, or a coding list other than exactly `chunked` (any case).
pub fn framing(headers: &[httparse::Header<'_>]) -> Result<BodyFraming, &'static str> {
    let values = |name: &str| -> Vec<&[u8]> {
        headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
            .collect()
    };
    let te = values("transfer-encoding");
    let cl = values("content-length");
    match (te.as_slice(), cl.as_slice()) {
        ([], []) => Ok(BodyFraming::Empty),
        ([], [length]) => content_length(length).map(BodyFraming::Length),
        ([coding], []) if trim_sp(coding).eq_ignore_ascii_case(b"chunked") => {
            Ok(BodyFraming::Chunked(ChunkedScanner::default()))
        }
        _ => Err(reason::AMBIGUOUS_FRAMING),
    }
}

fn content_length(value: &[u8]) -> Result<u64, &'static str> {
    let digits = trim_sp(value);
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(reason::AMBIGUOUS_FRAMING);
    }
    std::str::from_utf8(digits)
        .ok()
        .and_then(|d| d.parse().ok())
        .ok_or(reason::AMBIGUOUS_FRAMING)
}

fn trim_sp(value: &[u8]) -> &[u8] {
    let start = value.iter().position(|b| *b != b' ').unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|b| *b != b' ')
        .map_or(start, |e| e + 1);
    &value[start..end]
}

/// The tokens of every `Connection` header, lower case: the headers the client declares
/// hop-by-hop. Naming a framing or routing header there is refused rather than obeyed or
/// ignored: no real client does it, and obeying it is how the body of one request becomes
/// a second request upstream.
pub fn connection_tokens(headers: &[httparse::Header<'_>]) -> Result<Vec<String>, &'static str> {
    let mut tokens = Vec::new();
    for h in headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"))
    {
        let value = std::str::from_utf8(h.value).map_err(|_| reason::AMBIGUOUS_FRAMING)?;
        tokens.extend(value.split(',').map(|t| t.trim().to_ascii_lowercase()));
    }
    if tokens
        .iter()
        .any(|t| FRAMING_AND_ROUTING.contains(&t.as_str()))
    {
        return Err(reason::AMBIGUOUS_FRAMING);
    }
    Ok(tokens)
}

/// `Host` must name `host:port` (port 80 when omitted). HTTP/1.0 may omit it; `Ok(false)`
/// then, and the caller supplies one so the upstream routes by the checked name.
pub fn check_host(
    headers: &[httparse::Header<'_>],
    version: u8,
    host: &str,
    port: u16,
) -> Result<bool, &'static str> {
    let hosts: Vec<&httparse::Header<'_>> = headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"))
        .collect();
    match hosts.as_slice() {
        [] if version == 0 => Ok(false),
        [one] => {
            let value = std::str::from_utf8(one.value).map_err(|_| reason::HOST_MISMATCH)?;
            if !authority_is(value.trim(), host, port) {
                return Err(reason::HOST_MISMATCH);
            }
            Ok(true)
        }
        _ => Err(reason::HOST_MISMATCH),
    }
}

/// Whether `authority` (`name[:port]`, port 80 by default) names exactly `host:port`.
fn authority_is(authority: &str, host: &str, port: u16) -> bool {
    match split_authority(authority, Some(80)) {
        Some((h, p)) => {
            canonical_host(&h) == canonical_host(host)
                && p == port
                && !matches!(parse_host(&h), ParsedHost::Invalid)
        }
        None => false,
    }
}

/// Append `Content-Length` or `Transfer-Encoding` in canonical form, so the upstream
/// reads exactly the framing that was checked, whatever spelling the client used.
pub fn write_framing(head: &mut Vec<u8>, framing: &BodyFraming) {
    match framing {
        BodyFraming::Empty => {}
        BodyFraming::Length(n) => {
            head.extend_from_slice(format!("Content-Length: {n}\r\n").as_bytes())
        }
        BodyFraming::Chunked(_) => head.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
    }
}

/// Check a request read inside a plaintext tunnel to `host:port` and write the head to
/// forward. Exactly the forward proxy's rules (Host, framing, `Connection`), plus: the
/// target may not name another authority (RFC 9112 3.2.2: a server routes an
/// absolute-form request by its target, not its `Host`); CONNECT is refused (the upstream
/// may itself be a proxy); `Upgrade` is dropped so the upstream never switches the
/// connection to a protocol whose bytes the proxy cannot check.
pub fn tunnel_request(
    request: &RequestHead<'_>,
    host: &str,
    port: u16,
    (injections, http_rules): (&[crate::secrets::Injection], &[crate::l7::HttpRule]),
) -> Result<ForwardRequest, &'static str> {
    if request.method.eq_ignore_ascii_case("CONNECT") {
        return Err(reason::BAD_REQUEST);
    }
    check_tunnel_target(request.method, request.target, host, port)?;
    let has_host = check_host(&request.headers, request.version, host, port)?;
    connection_tokens(&request.headers)?;
    let framing = framing(&request.headers)?;
    let canonical = canonical_host(host);
    crate::l7::check(http_rules, &canonical, request.method, request.target)?;
    let swapped = crate::secrets::apply(
        injections,
        &crate::secrets::Head {
            method: request.method,
            target: request.target,
            headers: &request.headers,
            host: &canonical,
        },
    )?;

    let mut head = Vec::with_capacity(512);
    head.extend_from_slice(request.method.as_bytes());
    head.push(b' ');
    head.extend_from_slice(
        swapped
            .target
            .as_deref()
            .unwrap_or(request.target)
            .as_bytes(),
    );
    head.extend_from_slice(version_line(request.version));
    if !has_host {
        // `host` is canonical: an IPv6 literal comes without its brackets.
        let name = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_string()
        };
        let authority = if port == 80 {
            name
        } else {
            format!("{name}:{port}")
        };
        head.extend_from_slice(format!("Host: {authority}\r\n").as_bytes());
    }
    for (index, h) in request.headers.iter().enumerate() {
        let drop = ["content-length", "transfer-encoding", "upgrade"]
            .iter()
            .any(|n| h.name.eq_ignore_ascii_case(n));
        if !drop {
            let value = swapped.header(index, h.value);
            write_header(
                &mut head,
                &httparse::Header {
                    name: h.name,
                    value,
                },
            );
        }
    }
    write_framing(&mut head, &framing);
    head.extend_from_slice(b"\r\n");
    Ok(ForwardRequest { head, framing })
}

fn check_tunnel_target(
    method: &str,
    target: &str,
    host: &str,
    port: u16,
) -> Result<(), &'static str> {
    if target.starts_with('/') || (target == "*" && method.eq_ignore_ascii_case("OPTIONS")) {
        return Ok(());
    }
    let (authority, _) = split_absolute_http(target).ok_or(reason::BAD_REQUEST)?;
    if authority_is(authority, host, port) {
        Ok(())
    } else {
        Err(reason::HOST_MISMATCH)
    }
}

pub fn version_line(version: u8) -> &'static [u8] {
    if version == 0 {
        b" HTTP/1.0\r\n"
    } else {
        b" HTTP/1.1\r\n"
    }
}

pub fn write_header(head: &mut Vec<u8>, h: &httparse::Header<'_>) {
    head.extend_from_slice(h.name.as_bytes());
    head.extend_from_slice(b": ");
    head.extend_from_slice(h.value);
    head.extend_from_slice(b"\r\n");
}

/// What the first bytes of a non-TLS tunnel are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plaintext {
    NeedMore,
    /// A request line (`token SP ... HTTP/`): read and checked as HTTP from here on.
    Http,
    /// Neither TLS nor HTTP.
    Other,
}

const MAX_METHOD: usize = 32;
const MAX_REQUEST_LINE: usize = 8 * 1024;

/// Classify a non-TLS tunnel's first bytes. Deliberately generous about what counts as
/// HTTP (leading empty lines, any case of `HTTP/`): whatever is called HTTP here meets the
/// strict parser next, so a near-miss is refused rather than relayed.
pub fn classify_plaintext(prefix: &[u8]) -> Plaintext {
    let Some(start) = prefix.iter().position(|b| !matches!(b, b'\r' | b'\n')) else {
        return undecided(prefix);
    };
    let line = &prefix[start..];
    let method_len = line.iter().take_while(|b| is_tchar(**b)).count();
    if method_len == line.len() && method_len <= MAX_METHOD {
        return undecided(prefix);
    }
    if method_len == 0 || method_len > MAX_METHOD || line[method_len] != b' ' {
        return Plaintext::Other;
    }
    let rest = &line[method_len..];
    match rest.iter().position(|b| *b == b'\n') {
        None => undecided(prefix),
        Some(lf) if contains_ignore_case(&rest[..lf], b" http/") => Plaintext::Http,
        Some(_) => Plaintext::Other,
    }
}

fn undecided(prefix: &[u8]) -> Plaintext {
    if prefix.len() > MAX_REQUEST_LINE {
        Plaintext::Other
    } else {
        Plaintext::NeedMore
    }
}

fn contains_ignore_case(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framing_of(head: &str) -> Result<BodyFraming, &'static str> {
        let parsed = parse(head.as_bytes())?;
        connection_tokens(&parsed.headers)?;
        framing(&parsed.headers)
    }

    fn req(fields: &str) -> String {
        format!("POST /a HTTP/1.1\r\nHost: api.test\r\n{fields}\r\n")
    }

    #[test]
    fn unambiguous_framing_is_read() {
        assert_eq!(framing_of(&req("")), Ok(BodyFraming::Empty));
        assert_eq!(
            framing_of(&req("Content-Length: 48\r\n")),
            Ok(BodyFraming::Length(48))
        );
        assert_eq!(
            framing_of(&req("Content-Length:  007 \r\n")),
            Ok(BodyFraming::Length(7))
        );
        for coding in ["chunked", "Chunked", "CHUNKED", " chunked "] {
            assert!(
                matches!(
                    framing_of(&req(&format!("Transfer-Encoding:{coding}\r\n"))),
                    Ok(BodyFraming::Chunked(_))
                ),
                "{coding:?}"
            );
        }
    }

    #[test]
    fn ambiguous_framing_is_refused() {
        let cases = [
            "Content-Length: 6\r\nTransfer-Encoding: chunked\r\n",
            "Transfer-Encoding: chunked\r\nContent-Length: 6\r\n",
            "Content-Length: 48\r\nContent-Length: 48\r\n",
            "Content-Length: 0\r\nContent-Length: 48\r\n",
            "Content-Length: 48, 48\r\n",
            "Content-Length: +48\r\n",
            "Content-Length: -1\r\n",
            "Content-Length: 0x30\r\n",
            "Content-Length: 4 8\r\n",
            "Content-Length: \r\n",
            "Content-Length: 99999999999999999999\r\n",
            "Content-Length: 48\t\r\n",
            "Transfer-Encoding: xchunked\r\n",
            "Transfer-Encoding: chunked, identity\r\n",
            "Transfer-Encoding: identity\r\n",
            "Transfer-Encoding: gzip, chunked\r\n",
            "Transfer-Encoding: \"chunked\"\r\n",
            "Transfer-Encoding:\tchunked\r\n",
            "Transfer-Encoding: chunked\t\r\n",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: x\r\n",
            "Transfer-Encoding : chunked\r\n",
            "Transfer-Encoding\t: chunked\r\n",
            "X-Note: a\r\n Transfer-Encoding: chunked\r\n",
            "X-Note: a\r\n\tContent-Length: 4\r\n",
            "X-Note: a\nContent-Length: 4\r\n",
            "X-Note: a\rContent-Length: 4\r\n",
            "Connection: content-length\r\nContent-Length: 4\r\n",
            "Connection: keep-alive, Transfer-Encoding\r\nTransfer-Encoding: chunked\r\n",
            "Connection: HOST\r\n",
            "no colon here\r\n",
        ];
        for fields in cases {
            assert_eq!(
                framing_of(&req(fields)).err(),
                Some(reason::AMBIGUOUS_FRAMING),
                "{fields:?}"
            );
        }
    }

    #[test]
    fn head_ends_at_the_first_empty_line_of_either_ending() {
        assert_eq!(
            find_head_end(b"GET / HTTP/1.1\r\nA: b\r\n\r\nrest"),
            Some(24)
        );
        assert_eq!(find_head_end(b"GET / HTTP/1.1\nA: b\n\nrest"), Some(21));
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\nA: b\r\n"), None);
        assert_eq!(find_head_end(b"\r\nGET / HTTP/1.1\r\n\r\n"), Some(2));
        assert_eq!(
            parse(b"GET / HTTP/1.1\nHost: a\n\n").err(),
            Some(reason::AMBIGUOUS_FRAMING)
        );
    }

    fn tunnel(head: &str) -> Result<String, &'static str> {
        let parsed = parse(head.as_bytes())?;
        tunnel_request(&parsed, "api.test", 8080, (&[], &[]))
            .map(|r| String::from_utf8(r.head).unwrap())
    }

    #[test]
    fn tunnel_requests_must_stay_on_the_tunnel_host() {
        assert_eq!(
            tunnel("GET /x HTTP/1.1\r\nHost: API.test:8080\r\nUpgrade: h2c\r\nTransfer-Encoding: CHUNKED\r\n\r\n"),
            Ok("GET /x HTTP/1.1\r\nHost: API.test:8080\r\nTransfer-Encoding: chunked\r\n\r\n".into())
        );
        assert_eq!(
            tunnel("GET /x HTTP/1.0\r\n\r\n"),
            Ok("GET /x HTTP/1.0\r\nHost: api.test:8080\r\n\r\n".into())
        );
        let v6 = parse(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        let head = tunnel_request(&v6, "::1", 80, (&[], &[])).unwrap().head;
        assert_eq!(head, b"GET / HTTP/1.0\r\nHost: [::1]\r\n\r\n");
        let refused = [
            (
                "GET /x HTTP/1.1\r\nHost: forbidden.test\r\n\r\n",
                reason::HOST_MISMATCH,
            ),
            (
                "GET /x HTTP/1.1\r\nHost: api.test\r\n\r\n",
                reason::HOST_MISMATCH,
            ),
            ("GET /x HTTP/1.1\r\n\r\n", reason::HOST_MISMATCH),
            (
                "GET http://forbidden.test/ HTTP/1.1\r\nHost: api.test:8080\r\n\r\n",
                reason::HOST_MISMATCH,
            ),
            (
                "CONNECT forbidden.test:443 HTTP/1.1\r\nHost: api.test:8080\r\n\r\n",
                reason::BAD_REQUEST,
            ),
            (
                "GET * HTTP/1.1\r\nHost: api.test:8080\r\n\r\n",
                reason::BAD_REQUEST,
            ),
        ];
        for (head, code) in refused {
            assert_eq!(tunnel(head).err(), Some(code), "{head:?}");
        }
        assert!(
            tunnel("GET http://api.test:8080/ HTTP/1.1\r\nHost: api.test:8080\r\n\r\n").is_ok()
        );
    }

    #[test]
    fn plaintext_classification() {
        use Plaintext::*;
        assert_eq!(classify_plaintext(b"GET /x HTTP/1.1\r\n"), Http);
        assert_eq!(classify_plaintext(b"\r\nget /x http/1.1\n"), Http);
        assert_eq!(classify_plaintext(b"GET /x HT"), NeedMore);
        assert_eq!(classify_plaintext(b"GE"), NeedMore);
        assert_eq!(classify_plaintext(b"SSH-2.0-test\r\n"), Other);
        assert_eq!(classify_plaintext(b"EHLO a.test\r\n"), Other);
        assert_eq!(classify_plaintext(&[0, 0, 0, 8]), Other);
        assert_eq!(classify_plaintext(&[b'Z'; 40]), Other);
        assert_eq!(
            classify_plaintext(&vec![b'\n'; MAX_REQUEST_LINE + 1]),
            Other
        );
    }
}
