//! Stable reason codes for egress denials.
//!
//! These strings are part of the product's external contract: they appear verbatim in the
//! HTTP refusal body, the `X-Airlock-Reason` header, the [`crate::ConnectionRecord`], the
//! audit store and metrics. Never rename one; add a new constant instead.

/// The destination host (or host:port pair) is not on the contract's allowlist.
pub const NOT_ALLOWLISTED: &str = "egress.not_allowlisted";
/// The destination was given as an IP literal and `allow_ip_literals` is off.
pub const IP_LITERAL: &str = "egress.ip_literal";
/// A resolved (or literal) address is loopback, private, link-local, metadata, one of the
/// host's own addresses, or another non-public range.
pub const PRIVATE_ADDRESS: &str = "egress.private_address";
/// The name could not be resolved (not in the static map and no upstream resolvers, or
/// the upstream resolvers returned nothing usable).
pub const RESOLVE_FAILED: &str = "egress.resolve_failed";
/// A TLS ClientHello named a server other than the tunnel's destination.
pub const SNI_MISMATCH: &str = "egress.sni_mismatch";
/// A plain-HTTP request's `Host` header differs from its absolute request target.
pub const HOST_MISMATCH: &str = "egress.host_mismatch";
/// A per-cell ceiling fired: concurrent connections, total bytes, or idle timeout.
pub const LIMIT: &str = "egress.limit";
/// The proxy could not connect to the (allowed) destination.
pub const UPSTREAM_FAILED: &str = "egress.upstream_failed";
/// The client spoke something the proxy does not accept (malformed request, unsupported
/// scheme, SOCKS command or authentication method, malformed TLS ClientHello, ...).
pub const BAD_REQUEST: &str = "egress.bad_request";
/// A plain-HTTP request whose message framing or routing two HTTP parsers could read
/// differently - the shape of request smuggling: both `Content-Length` and
/// `Transfer-Encoding`, more than one `Content-Length`, a non-numeric length, a transfer
/// coding other than exactly `chunked`, `Connection` naming `Content-Length`,
/// `Transfer-Encoding` or `Host`, obs-fold, a bare CR or LF, or a header name with
/// whitespace before the colon. Kept apart from [`BAD_REQUEST`] so the audit trail can
/// tell a smuggling attempt from a clumsy client.
pub const AMBIGUOUS_FRAMING: &str = "egress.ambiguous_framing";
/// A CONNECT or SOCKS5 tunnel whose first client bytes are neither a TLS ClientHello nor
/// an HTTP/1.x request, to a destination the operator has not listed in
/// `opaque_tunnels`: nothing in such a stream can be checked against the allowlisted name.
pub const PLAINTEXT_TUNNEL: &str = "egress.plaintext_tunnel";
/// The cell's resolver refused a DNS query: a name without a transparent address (not
/// allowlisted, a wildcard's sub-domain, a data-carrying label), or a packet that is no
/// well-formed single-question query. Nothing is ever forwarded.
pub const DNS_REFUSED: &str = "egress.dns_refused";

/// A request carried a live secret placeholder somewhere its secret may not go: a host
/// the secret is not for, a header, path or query parameter other than its placement,
/// a body, a destination or DNS name (docs/credentials.md).
pub const SECRET_WRONG_DESTINATION: &str = "egress.secret_wrong_destination";
/// A request carried something shaped like a secret placeholder that this run did not
/// issue: a placeholder of a run or session that has ended, or a guess.
pub const SECRET_UNKNOWN: &str = "egress.secret_unknown";
/// The request's method is not one its secret's (or destination's) rule allows.
pub const METHOD_NOT_ALLOWED: &str = "egress.method_not_allowed";
/// The request's path is not under a prefix its secret's (or destination's) rule allows,
/// or could be read as another path (dot segments, encoded slashes or dots).
pub const PATH_NOT_ALLOWED: &str = "egress.path_not_allowed";
/// A TLS tunnel to a domain with an HTTP rule when the proxy has no run CA to
/// intercept it (a library caller that gave none): the rule cannot be checked inside
/// TLS, so the tunnel is refused rather than relayed unchecked.
pub const TLS_UNINSPECTABLE: &str = "egress.tls_uninspectable";
/// An intercepted tunnel whose TLS handshake with the cell failed: the client does not
/// trust the run's CA, offered no protocol but h2, or sent a hello the proxy's TLS
/// refused.
pub const TLS_HANDSHAKE_FAILED: &str = "egress.tls_handshake_failed";
/// The upstream of an intercepted tunnel presented a certificate the configured roots do
/// not verify (unknown issuer, wrong name, expired): refused, never relayed unverified.
pub const UPSTREAM_CERT_INVALID: &str = "egress.upstream_cert_invalid";

/// Every reason code, for documentation and exhaustiveness tests.
pub const ALL: &[&str] = &[
    NOT_ALLOWLISTED,
    IP_LITERAL,
    PRIVATE_ADDRESS,
    RESOLVE_FAILED,
    SNI_MISMATCH,
    HOST_MISMATCH,
    LIMIT,
    UPSTREAM_FAILED,
    BAD_REQUEST,
    AMBIGUOUS_FRAMING,
    PLAINTEXT_TUNNEL,
    DNS_REFUSED,
    SECRET_WRONG_DESTINATION,
    SECRET_UNKNOWN,
    METHOD_NOT_ALLOWED,
    PATH_NOT_ALLOWED,
    TLS_UNINSPECTABLE,
    TLS_HANDSHAKE_FAILED,
    UPSTREAM_CERT_INVALID,
];
