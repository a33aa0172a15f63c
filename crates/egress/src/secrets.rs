//! Secrets injected at the proxy: the cell holds only a per-run placeholder, the proxy
//! swaps it for the real value on a request to an allowed destination, in the one place
//! the operator said the value goes, and refuses every other use.
//!
//! A placeholder is [`MARKER`] followed by 32 lower-case hex digits (128 random bits): a
//! valid DNS label, a valid header and query value, recognisable in any of them. Every
//! occurrence of the marker in a request is accounted for: a live placeholder in its
//! configured placement, on an allowed host, method and path is swapped; anything else
//! (another header, the path, another query parameter, a body, a host name, a dead
//! placeholder of an earlier run) refuses the request. The proxy of a run knows only that
//! run's placeholders, so a placeholder outlives neither its run nor its session.

use std::fmt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::reason;

/// What every placeholder starts with.
pub const MARKER: &str = "airlock-secret-";
/// Hex digits after the marker.
const PLACEHOLDER_HEX: usize = 32;
/// Every placeholder's length.
pub const PLACEHOLDER_LEN: usize = MARKER.len() + PLACEHOLDER_HEX;
/// What a placeholder is replaced with in records (host names, DNS names).
pub const MASK: &str = "[PLACEHOLDER]";
/// The most bytes a secret source may produce.
const MAX_SECRET_BYTES: usize = 64 * 1024;

/// One operator-defined secret (`[secrets.NAME]`): where its value comes from and where
/// it may be used. Never from the contract: a contract only names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretDefinition {
    /// Where the trusted side reads the value, at the start of each run.
    pub source: SecretSource,
    /// Destination hosts the value may be sent to: exact names or `*.` sub-domain
    /// wildcards (not the apex). The contract's allowlist still applies first.
    pub hosts: Vec<String>,
    /// Where in the request the value goes.
    pub placement: Placement,
    /// Methods the value may be sent with (upper case); empty: any.
    #[serde(default)]
    pub methods: Vec<String>,
    /// Path prefixes (of the path without its query) the value may be sent to; empty: any.
    #[serde(default)]
    pub path_prefixes: Vec<String>,
}

/// Where a secret's value is read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum SecretSource {
    /// An environment variable of the airlock process.
    Env(String),
    /// A file (trailing line endings removed).
    File(PathBuf),
    /// A command run by the trusted side (argv, no shell); its stdout, trailing line
    /// endings removed, is the value. A non-zero exit is an error.
    Command(Vec<String>),
    /// A short-lived token: `command` runs at each run's start with
    /// `AIRLOCK_TOKEN_TTL_SECONDS` (the run's deadline, rounded up, plus 60 s) and
    /// `AIRLOCK_SECRET_NAME` in its environment and prints
    /// `{"token": "...", "expires_at_unix": N}`; a token that expires before the run's
    /// deadline refuses the run. `revoke`, when set, runs when the run (or session) ends,
    /// the token on its stdin.
    Provider {
        command: Vec<String>,
        #[serde(default)]
        revoke: Vec<String>,
    },
}

/// Where the proxy puts the value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum Placement {
    /// A header whose whole value is `format` with `{}` standing for the secret, e.g.
    /// `{ name = "Authorization", format = "Bearer {}" }`. The cell sends the same header
    /// with the placeholder where the secret goes.
    Header { name: String, format: String },
    /// `Authorization: Basic`, the secret as the password. `username`, when set, must be
    /// the user the cell sends.
    BasicAuth {
        #[serde(default)]
        username: Option<String>,
    },
    /// A query parameter whose whole value is the placeholder (`?name=<placeholder>`).
    Query { name: String },
}

/// One secret as a run uses it: its placeholder, value and rules. Travels only between
/// airlock's own trusted processes; its `Debug` leaves the value and placeholder out.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Injection {
    pub name: String,
    pub placeholder: String,
    pub value: String,
    pub hosts: Vec<String>,
    pub placement: Placement,
    pub methods: Vec<String>,
    pub path_prefixes: Vec<String>,
    /// The provider's revoke command (empty: nothing to revoke).
    #[serde(default)]
    pub revoke: Vec<String>,
}

impl fmt::Debug for Injection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Injection")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// Why a secret could not be made ready for a run. Never carries the value.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("secret {name:?} is not defined in the operator's [secrets]")]
    Undefined { name: String },
    #[error("secret {name:?}: {why}")]
    Source { name: String, why: String },
    #[error("secret {name:?}: {why}")]
    Definition { name: String, why: &'static str },
}

impl SecretDefinition {
    /// Whether the value is a provider's short-lived token (revoked at the end): the only
    /// kind a contract may have delivered into the cell's environment.
    pub fn is_provider(&self) -> bool {
        matches!(self.source, SecretSource::Provider { .. })
    }

    /// The definition's own consistency (checked when the run asks for it).
    pub fn check(&self, name: &str) -> Result<(), SecretError> {
        let bad = |why| {
            Err(SecretError::Definition {
                name: name.to_string(),
                why,
            })
        };
        if self.hosts.is_empty() {
            return bad("hosts is empty: the secret could be sent nowhere");
        }
        if self.hosts.iter().any(|h| !valid_host_pattern(h)) {
            return bad("hosts: each must be a host name or `*.` followed by one");
        }
        match &self.placement {
            Placement::Header { name, format } => {
                if format.matches("{}").count() != 1 {
                    return bad("placement.header.format must contain `{}` exactly once");
                }
                if name.is_empty() || !name.bytes().all(is_tchar) {
                    return bad("placement.header.name is not a header name");
                }
            }
            Placement::Query { name } if name.is_empty() => {
                return bad("placement.query.name is empty")
            }
            _ => {}
        }
        if self.path_prefixes.iter().any(|p| !p.starts_with('/')) {
            return bad("path_prefixes: each must start with `/`");
        }
        Ok(())
    }

    /// Reads the value and makes a fresh placeholder: the run's [`Injection`]. `lifetime`
    /// is how long the run may last (a provider's token must outlive it).
    pub fn prepare(&self, name: &str, lifetime: Duration) -> Result<Injection, SecretError> {
        self.check(name)?;
        let value =
            read_source(&self.source, name, lifetime).map_err(|why| SecretError::Source {
                name: name.to_string(),
                why,
            })?;
        if value.is_empty() || value.bytes().any(|b| b.is_ascii_control()) {
            return Err(SecretError::Source {
                name: name.to_string(),
                why: "the value is empty or holds control characters".into(),
            });
        }
        Ok(Injection {
            name: name.to_string(),
            placeholder: new_placeholder().map_err(|why| SecretError::Source {
                name: name.to_string(),
                why,
            })?,
            value,
            hosts: self.hosts.clone(),
            placement: self.placement.clone(),
            methods: self.methods.clone(),
            path_prefixes: self.path_prefixes.clone(),
            revoke: match &self.source {
                SecretSource::Provider { revoke, .. } => revoke.clone(),
                _ => Vec::new(),
            },
        })
    }
}

impl Injection {
    /// Runs the provider's revoke command, the token on its stdin. The error names the
    /// secret and the command, never the token.
    pub fn revoke(&self) -> Result<(), String> {
        let Some((program, args)) = self.revoke.split_first() else {
            return Ok(());
        };
        let failed = |why: String| format!("revoking secret {:?}: {program}: {why}", self.name);
        let mut child = Command::new(program)
            .args(args)
            .env("AIRLOCK_SECRET_NAME", &self.name)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| failed(e.kind().to_string()))?;
        if let Some(mut stdin) = child.stdin.take() {
            use std::io::Write;
            let _ = stdin.write_all(self.value.as_bytes());
        }
        let status = child.wait().map_err(|e| failed(e.kind().to_string()))?;
        if status.success() {
            Ok(())
        } else {
            Err(failed(format!("exited with {status}")))
        }
    }
}

/// The TTL a provider is asked for: the run's lifetime rounded up, plus a minute for
/// the run's start and completion.
pub fn token_ttl(lifetime: Duration) -> u64 {
    lifetime.as_secs() + u64::from(lifetime.subsec_nanos() > 0) + 60
}

/// A provider's answer.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IssuedToken {
    token: String,
    expires_at_unix: u64,
}

fn ask_provider(argv: &[String], name: &str, lifetime: Duration) -> Result<String, String> {
    let ttl = token_ttl(lifetime);
    let output = run_command(
        argv,
        &[
            ("AIRLOCK_TOKEN_TTL_SECONDS", &ttl.to_string()),
            ("AIRLOCK_SECRET_NAME", name),
        ],
    )?;
    let issued: IssuedToken = serde_json::from_str(&output).map_err(|_| {
        "the provider printed no {\"token\", \"expires_at_unix\"} object".to_string()
    })?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let deadline = now + lifetime.as_secs() + u64::from(lifetime.subsec_nanos() > 0);
    if issued.expires_at_unix < deadline {
        return Err(format!(
            "the provider's token expires at {} (unix), before the run's deadline {deadline}",
            issued.expires_at_unix
        ));
    }
    Ok(issued.token)
}

fn valid_host_pattern(pattern: &str) -> bool {
    let name = pattern.strip_prefix("*.").unwrap_or(pattern);
    matches!(
        crate::destination::parse_host(name),
        crate::destination::ParsedHost::Name(_)
    )
}

fn read_source(source: &SecretSource, name: &str, lifetime: Duration) -> Result<String, String> {
    let raw = match source {
        SecretSource::Provider { command, .. } => ask_provider(command, name, lifetime)?,
        SecretSource::Env(var) => {
            std::env::var(var).map_err(|_| format!("environment variable {var} is not set"))?
        }
        SecretSource::File(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {}", path.display(), e.kind()))?,
        SecretSource::Command(argv) => run_command(argv, &[])?,
    };
    if raw.len() > MAX_SECRET_BYTES {
        return Err(format!("the value is longer than {MAX_SECRET_BYTES} bytes"));
    }
    Ok(raw.trim_end_matches(['\r', '\n']).to_string())
}

/// Runs an operator command and returns its stdout (its stderr goes to airlock's, which
/// the operator reads; the value never does).
fn run_command(argv: &[String], env: &[(&str, &str)]) -> Result<String, String> {
    let (program, args) = argv.split_first().ok_or("the command is empty")?;
    let output = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running {program}: {}", e.kind()))?;
    if !output.status.success() {
        return Err(format!("{program} exited with {}", output.status));
    }
    String::from_utf8(output.stdout).map_err(|_| format!("{program} printed no UTF-8"))
}

fn new_placeholder() -> Result<String, String> {
    let mut bytes = [0u8; PLACEHOLDER_HEX / 2];
    getrandom::getrandom(&mut bytes).map_err(|e| format!("no randomness: {e}"))?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("{MARKER}{hex}"))
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Whether `text` holds the marker in any letter case.
pub fn contains_marker(text: &[u8]) -> bool {
    find_marker(text, 0).is_some()
}

fn find_marker(text: &[u8], from: usize) -> Option<usize> {
    let needle = MARKER.as_bytes();
    if text.len() < needle.len() {
        return None;
    }
    (from..=text.len() - needle.len())
        .find(|&i| text[i..i + needle.len()].eq_ignore_ascii_case(needle))
}

/// `text` with every marker and the hex after it replaced by [`MASK`]: what a record may
/// hold of a name that carried a placeholder.
pub fn mask(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while let Some(start) = find_marker(bytes, at) {
        out.push_str(&text[at..start]);
        out.push_str(MASK);
        let hex_end = start
            + MARKER.len()
            + bytes[start + MARKER.len()..]
                .iter()
                .take_while(|b| b.is_ascii_hexdigit())
                .count();
        at = hex_end;
    }
    out.push_str(&text[at..]);
    out
}

/// What the proxy forwards instead of what the cell sent: a new target and new header
/// values (by index), where a placeholder was swapped.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swapped {
    pub target: Option<String>,
    pub headers: Vec<(usize, Vec<u8>)>,
}

impl Swapped {
    /// The value to forward for header `index`.
    pub fn header<'a>(&'a self, index: usize, original: &'a [u8]) -> &'a [u8] {
        self.headers
            .iter()
            .find(|(i, _)| *i == index)
            .map_or(original, |(_, v)| v.as_slice())
    }
}

/// One request head as the proxy is about to forward it.
pub struct Head<'a> {
    pub method: &'a str,
    /// Origin-form target (`/path?query`) or what the cell sent.
    pub target: &'a str,
    pub headers: &'a [httparse::Header<'a>],
    /// The canonical destination host.
    pub host: &'a str,
}

/// Decide on a request head: swap each live placeholder found in its placement on an
/// allowed destination, refuse any other occurrence of the marker.
pub fn apply(injections: &[Injection], head: &Head<'_>) -> Result<Swapped, &'static str> {
    let mut swapped = Swapped::default();
    if contains_marker(head.method.as_bytes()) {
        return Err(reason::SECRET_WRONG_DESTINATION);
    }
    if contains_marker(head.target.as_bytes()) {
        swapped.target = Some(swap_query(injections, head)?);
    }
    for (index, header) in head.headers.iter().enumerate() {
        if contains_marker(header.name.as_bytes()) {
            return Err(reason::SECRET_WRONG_DESTINATION);
        }
        if let Some(value) = swap_header(injections, head, header)? {
            swapped.headers.push((index, value));
        }
    }
    Ok(swapped)
}

/// The live injection whose placeholder is exactly `token`; a marker that is no live
/// placeholder (an earlier run's, a guess) is refused as [`reason::SECRET_UNKNOWN`].
fn live<'a>(injections: &'a [Injection], token: &[u8]) -> Result<&'a Injection, &'static str> {
    injections
        .iter()
        .find(|i| i.placeholder.as_bytes() == token)
        .ok_or(reason::SECRET_UNKNOWN)
}

/// The placement-independent rules of one swap: host, method, path.
fn check_destination(injection: &Injection, head: &Head<'_>) -> Result<(), &'static str> {
    if !injection.hosts.iter().any(|p| host_matches(p, head.host)) {
        return Err(reason::SECRET_WRONG_DESTINATION);
    }
    if !injection.methods.is_empty()
        && !injection
            .methods
            .iter()
            .any(|m| m.eq_ignore_ascii_case(head.method))
    {
        return Err(reason::METHOD_NOT_ALLOWED);
    }
    if !injection.path_prefixes.is_empty() && !path_allowed(&injection.path_prefixes, head.target) {
        return Err(reason::PATH_NOT_ALLOWED);
    }
    Ok(())
}

/// Whether `pattern` (exact or `*.` wildcard, any case) names `host` (canonical).
pub fn host_matches(pattern: &str, host: &str) -> bool {
    let pattern = crate::destination::normalize_name(pattern);
    match pattern.strip_prefix("*.") {
        Some(apex) => host
            .strip_suffix(apex)
            .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
        None => pattern == host,
    }
}

/// Whether the path of `target` starts with one of `prefixes`. A path that a server
/// could read as another one (dot segments, encoded dots or slashes, a backslash) never
/// matches: the prefix would be checked on one path and served on another.
pub fn path_allowed(prefixes: &[String], target: &str) -> bool {
    let path = target.split(['?', '#']).next().unwrap_or("");
    let lower = path.to_ascii_lowercase();
    let ambiguous = path.contains('\\')
        || lower.contains("%2e")
        || lower.contains("%2f")
        || lower.contains("%5c")
        || path.split('/').any(|seg| seg == "." || seg == "..");
    !ambiguous && path.starts_with('/') && prefixes.iter().any(|p| path.starts_with(p.as_str()))
}

/// The target with the placeholder of a `Query` placement swapped; any other marker in the
/// target is refused.
fn swap_query(injections: &[Injection], head: &Head<'_>) -> Result<String, &'static str> {
    let (path, query) = head
        .target
        .split_once('?')
        .ok_or(reason::SECRET_WRONG_DESTINATION)?;
    if contains_marker(path.as_bytes()) {
        return Err(reason::SECRET_WRONG_DESTINATION);
    }
    let mut parts = Vec::new();
    for pair in query.split('&') {
        if !contains_marker(pair.as_bytes()) {
            parts.push(pair.to_string());
            continue;
        }
        let (key, value) = pair
            .split_once('=')
            .ok_or(reason::SECRET_WRONG_DESTINATION)?;
        let injection = live(injections, value.as_bytes())?;
        match &injection.placement {
            Placement::Query { name } if name == key => {}
            _ => return Err(reason::SECRET_WRONG_DESTINATION),
        }
        check_destination(injection, head)?;
        parts.push(format!("{key}={}", percent_encode(&injection.value)));
    }
    Ok(format!("{path}?{}", parts.join("&")))
}

/// RFC 3986 unreserved characters stay, everything else is `%XX`.
fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The header's value to forward when it carried a placeholder (`None`: unchanged).
fn swap_header(
    injections: &[Injection],
    head: &Head<'_>,
    header: &httparse::Header<'_>,
) -> Result<Option<Vec<u8>>, &'static str> {
    if let Some(decoded) = basic_credentials(header) {
        if !contains_marker(&decoded) {
            return Ok(None);
        }
        return swap_basic(injections, head, &decoded).map(Some);
    }
    if !contains_marker(header.value) {
        return Ok(None);
    }
    for injection in injections {
        let Placement::Header { name, format } = &injection.placement else {
            continue;
        };
        let expected = format.replacen("{}", &injection.placeholder, 1);
        if header.name.eq_ignore_ascii_case(name) && header.value == expected.as_bytes() {
            check_destination(injection, head)?;
            return Ok(Some(
                format.replacen("{}", &injection.value, 1).into_bytes(),
            ));
        }
    }
    // Which refusal: a dead placeholder, or a live one out of place.
    let start = find_marker(header.value, 0).unwrap_or(0);
    let end = (start + PLACEHOLDER_LEN).min(header.value.len());
    live(injections, &header.value[start..end])?;
    Err(reason::SECRET_WRONG_DESTINATION)
}

/// The decoded `user:password` of an `Authorization: Basic` header.
fn basic_credentials(header: &httparse::Header<'_>) -> Option<Vec<u8>> {
    if !header.name.eq_ignore_ascii_case("authorization") {
        return None;
    }
    let value = std::str::from_utf8(header.value).ok()?.trim();
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()
}

fn swap_basic(
    injections: &[Injection],
    head: &Head<'_>,
    decoded: &[u8],
) -> Result<Vec<u8>, &'static str> {
    let colon = decoded
        .iter()
        .position(|b| *b == b':')
        .ok_or(reason::SECRET_WRONG_DESTINATION)?;
    let (user, password) = (&decoded[..colon], &decoded[colon + 1..]);
    if contains_marker(user) {
        return Err(reason::SECRET_WRONG_DESTINATION);
    }
    let injection = live(injections, password)?;
    let Placement::BasicAuth { username } = &injection.placement else {
        return Err(reason::SECRET_WRONG_DESTINATION);
    };
    if username.as_ref().is_some_and(|u| u.as_bytes() != user) {
        return Err(reason::SECRET_WRONG_DESTINATION);
    }
    check_destination(injection, head)?;
    let mut plain = user.to_vec();
    plain.push(b':');
    plain.extend_from_slice(injection.value.as_bytes());
    let encoded = base64::engine::general_purpose::STANDARD.encode(plain);
    Ok(format!("Basic {encoded}").into_bytes())
}

/// Finds the marker in a byte stream cut into chunks at arbitrary points: it keeps the
/// last `MARKER.len() - 1` bytes of what it has seen.
#[derive(Debug, Default, Clone)]
pub struct StreamScanner {
    carry: Vec<u8>,
}

impl StreamScanner {
    /// Whether the stream so far, ending with `chunk`, holds the marker.
    pub fn feed(&mut self, chunk: &[u8]) -> bool {
        let mut window = std::mem::take(&mut self.carry);
        window.extend_from_slice(chunk);
        let found = contains_marker(&window);
        let keep = MARKER.len() - 1;
        let from = window.len().saturating_sub(keep);
        self.carry = window.split_off(from);
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn injection(placement: Placement) -> Injection {
        Injection {
            name: "api".into(),
            placeholder: format!("{MARKER}{}", "ab".repeat(16)),
            value: "real-value/+1".into(),
            hosts: vec!["api.test".into(), "*.models.test".into()],
            placement,
            methods: vec!["POST".into()],
            path_prefixes: vec!["/v1/".into()],
            revoke: vec![],
        }
    }

    fn bearer() -> Injection {
        injection(Placement::Header {
            name: "Authorization".into(),
            format: "Bearer {}".into(),
        })
    }

    fn hdr<'a>(name: &'a str, value: &'a str) -> httparse::Header<'a> {
        httparse::Header {
            name,
            value: value.as_bytes(),
        }
    }

    fn decide(
        inj: &Injection,
        method: &str,
        target: &str,
        host: &str,
        headers: &[httparse::Header<'_>],
    ) -> Result<Swapped, &'static str> {
        apply(
            std::slice::from_ref(inj),
            &Head {
                method,
                target,
                headers,
                host,
            },
        )
    }

    #[test]
    fn a_placeholder_in_its_header_on_an_allowed_request_becomes_the_value() {
        let inj = bearer();
        let value = format!("Bearer {}", inj.placeholder);
        let headers = [hdr("Accept", "*/*"), hdr("authorization", &value)];
        let swapped = decide(&inj, "POST", "/v1/chat", "api.test", &headers).unwrap();
        assert_eq!(swapped.headers, vec![(1, b"Bearer real-value/+1".to_vec())]);
        assert_eq!(swapped.header(0, b"*/*"), b"*/*");
        let sub = decide(&inj, "POST", "/v1/x", "eu.models.test", &headers);
        assert!(sub.is_ok());
    }

    #[test]
    fn a_placeholder_elsewhere_is_refused_with_its_reason() {
        let inj = bearer();
        let good = format!("Bearer {}", inj.placeholder);
        let headers = [hdr("Authorization", &good)];
        let cases: Vec<(&str, String, &str, Vec<httparse::Header<'_>>, &str)> = vec![
            (
                "POST",
                "/v1/a".into(),
                "other.test",
                headers.to_vec(),
                reason::SECRET_WRONG_DESTINATION,
            ),
            (
                "POST",
                "/v1/a".into(),
                "models.test",
                headers.to_vec(),
                reason::SECRET_WRONG_DESTINATION,
            ),
            (
                "GET",
                "/v1/a".into(),
                "api.test",
                headers.to_vec(),
                reason::METHOD_NOT_ALLOWED,
            ),
            (
                "POST",
                "/admin".into(),
                "api.test",
                headers.to_vec(),
                reason::PATH_NOT_ALLOWED,
            ),
            (
                "POST",
                "/v1/../admin".into(),
                "api.test",
                headers.to_vec(),
                reason::PATH_NOT_ALLOWED,
            ),
            (
                "POST",
                format!("/v1/{}", inj.placeholder),
                "api.test",
                vec![],
                reason::SECRET_WRONG_DESTINATION,
            ),
            (
                "POST",
                "/v1/a".into(),
                "api.test",
                vec![hdr("X-Token", &inj.placeholder)],
                reason::SECRET_WRONG_DESTINATION,
            ),
        ];
        for (method, target, host, headers, code) in cases {
            assert_eq!(
                decide(&inj, method, &target, host, &headers).err(),
                Some(code),
                "{method} {target} {host}"
            );
        }
    }

    #[test]
    fn a_placeholder_this_run_does_not_know_is_refused() {
        let inj = bearer();
        let stale = format!("Bearer {MARKER}{}", "cd".repeat(16));
        let headers = [hdr("Authorization", &stale)];
        assert_eq!(
            decide(&inj, "POST", "/v1/a", "api.test", &headers).err(),
            Some(reason::SECRET_UNKNOWN)
        );
        let upper = format!("Bearer {}", inj.placeholder.to_uppercase());
        let headers = [hdr("Authorization", &upper)];
        assert!(decide(&inj, "POST", "/v1/a", "api.test", &headers).is_err());
    }

    #[test]
    fn basic_auth_and_query_placements_swap_only_there() {
        let basic = injection(Placement::BasicAuth {
            username: Some("bot".into()),
        });
        let b64 = |s: String| base64::engine::general_purpose::STANDARD.encode(s);
        let value = format!("Basic {}", b64(format!("bot:{}", basic.placeholder)));
        let headers = [hdr("Authorization", &value)];
        let swapped = decide(&basic, "POST", "/v1/", "api.test", &headers).unwrap();
        let expected = format!("Basic {}", b64("bot:real-value/+1".into()));
        assert_eq!(swapped.headers, vec![(0, expected.into_bytes())]);
        let wrong_user = format!("Basic {}", b64(format!("eve:{}", basic.placeholder)));
        let headers = [hdr("Authorization", &wrong_user)];
        assert!(decide(&basic, "POST", "/v1/", "api.test", &headers).is_err());

        let query = injection(Placement::Query { name: "key".into() });
        let target = format!("/v1/q?a=1&key={}", query.placeholder);
        let swapped = decide(&query, "POST", &target, "api.test", &[]).unwrap();
        assert_eq!(
            swapped.target.as_deref(),
            Some("/v1/q?a=1&key=real-value%2F%2B1")
        );
        let other = format!("/v1/q?k2={}", query.placeholder);
        assert_eq!(
            decide(&query, "POST", &other, "api.test", &[]).err(),
            Some(reason::SECRET_WRONG_DESTINATION)
        );
    }

    #[test]
    fn the_stream_scanner_finds_the_marker_across_any_cut() {
        let text = format!("prefix {MARKER}00 suffix");
        for cut in 0..text.len() {
            let mut s = StreamScanner::default();
            let (a, b) = text.as_bytes().split_at(cut);
            assert!(s.feed(a) || s.feed(b), "cut {cut}");
        }
        let mut s = StreamScanner::default();
        assert!(!s.feed(b"airlock-secre") && !s.feed(b"t without the dash"));
    }

    #[test]
    fn masking_removes_every_placeholder() {
        let p = format!("{MARKER}{}", "ab".repeat(16));
        assert_eq!(mask(&format!("{p}.evil.test")), "[PLACEHOLDER].evil.test");
        assert_eq!(mask("plain.test"), "plain.test");
    }

    #[test]
    fn wildcards_match_sub_domains_only() {
        assert!(host_matches("*.Models.test", "a.models.test"));
        assert!(!host_matches("*.models.test", "models.test"));
        assert!(!host_matches("*.models.test", "evilmodels.test"));
        assert!(host_matches("API.test.", "api.test"));
    }

    #[test]
    fn definitions_are_checked() {
        let mut def = SecretDefinition {
            source: SecretSource::Env("X".into()),
            hosts: vec!["api.test".into()],
            placement: Placement::Header {
                name: "Authorization".into(),
                format: "Bearer".into(),
            },
            methods: vec![],
            path_prefixes: vec![],
        };
        assert!(def.check("a").is_err());
        def.placement = Placement::Query { name: "k".into() };
        assert!(def.check("a").is_ok());
        def.hosts = vec!["bad host".into()];
        assert!(def.check("a").is_err());
    }

    #[test]
    fn prepared_values_come_from_the_source_and_placeholders_are_fresh() {
        let dir = tempfile_dir("sources");
        let file = dir.join("token");
        std::fs::write(&file, "from-file\n").unwrap();
        let def = SecretDefinition {
            source: SecretSource::File(file),
            hosts: vec!["api.test".into()],
            placement: Placement::Query { name: "k".into() },
            methods: vec![],
            path_prefixes: vec![],
        };
        let a = def.prepare("a", Duration::from_secs(5)).unwrap();
        let b = def.prepare("a", Duration::from_secs(5)).unwrap();
        assert_eq!(a.value, "from-file");
        assert_ne!(a.placeholder, b.placeholder);
        assert_eq!(a.placeholder.len(), PLACEHOLDER_LEN);
        assert!(!format!("{a:?}").contains("from-file"));
        let cmd = SecretDefinition {
            source: SecretSource::Command(vec![
                "/bin/sh".into(),
                "-c".into(),
                "echo fromcmd".into(),
            ]),
            ..def.clone()
        };
        assert_eq!(
            cmd.prepare("a", Duration::from_secs(5)).unwrap().value,
            "fromcmd"
        );
        let failing = SecretDefinition {
            source: SecretSource::Command(vec!["/bin/false".into()]),
            ..def
        };
        assert!(failing.prepare("a", Duration::from_secs(5)).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_provider_token_must_outlive_the_run_and_is_revoked_with_it() {
        let dir = tempfile_dir("provider");
        std::fs::create_dir_all(&dir).unwrap();
        let revoked = dir.join("revoked");
        let sh = |script: String| vec!["/bin/sh".to_string(), "-c".to_string(), script];
        let provider = |expires: &str| {
            SecretDefinition {
            source: SecretSource::Provider {
                command: sh(format!(
                    "echo \"{{\\\"token\\\": \\\"tok-$AIRLOCK_TOKEN_TTL_SECONDS\\\", \\\"expires_at_unix\\\": {expires}}}\""
                )),
                revoke: sh(format!("cat > {}", revoked.display())),
            },
            hosts: vec!["api.test".into()],
            placement: Placement::Query { name: "k".into() },
            methods: vec![],
            path_prefixes: vec![],
        }
        };
        let far = "99999999999";
        let injection = provider(far)
            .prepare("p", Duration::from_millis(1500))
            .unwrap();
        assert_eq!(injection.value, "tok-62");
        injection.revoke().unwrap();
        assert_eq!(std::fs::read_to_string(&revoked).unwrap(), "tok-62");
        let short = provider("1").prepare("p", Duration::from_secs(30));
        let err = short.unwrap_err().to_string();
        assert!(err.contains("before the run's deadline"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A directory of one test's own (tests run in parallel in one process).
    fn tempfile_dir(test: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("airlock-secrets-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
