//! Item 1 and 2 of issue 33: a tenant's cell makes FIFOs, unix sockets and symlinks in its
//! writable path, and the tenant aims the session files API at them. No request may hang
//! a thread, no other tenant may slow down, every count comes back, and a drain ends
//! within its grace, recording what it ended as ended by the operator.

use crate::common::served::Served;
use crate::common::sha256_hex;
use serde_json::{json, Value};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const A: &str = "tenant-a-key";
const B: &str = "tenant-b-key";
/// The FIFOs and the sockets A's command makes: 300 of each, 600 PUTs.
const EACH: usize = 300;
const B_RUNS: usize = 300;
const GRACE_MS: u64 = 3000;

fn config() -> String {
    format!(
        r#"[server]
listen = ["unix:SOCK", "tcp:127.0.0.1:PORT"]
max_blocking_per_tenant = 8
file_op_timeout_ms = 5000
drain_grace_ms = {GRACE_MS}
[server.contracts]
small = "small.yaml"
[server.pools]
small = 2
[server.tenants.a]
api_key_sha256 = ["{a}"]
max_sessions = 2
[server.tenants.b]
api_key_sha256 = ["{b}"]
max_cells = 16
runs_per_minute = 100000
"#,
        a = sha256_hex(A),
        b = sha256_hex(B),
    )
}

fn start() -> Served {
    Served::start(&config(), |dir| {
        std::fs::copy(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../examples/contracts/default.yaml"),
            dir.join("small.yaml"),
        )
        .unwrap();
    })
}

/// A's session, and what its command made in /tmp: `p0..` FIFOs, `s0..` bound unix
/// sockets, and `pr`, a FIFO a background command holds open for reading and writing (so
/// an `O_NONBLOCK` open for writing alone would succeed on it).
fn session_with_special_files(served: &Served) -> String {
    let (code, session) = served.call(
        A,
        "POST",
        "/v1/sessions",
        Some(&json!({"contract": "small"})),
    );
    assert_eq!(code, 201, "{session}");
    let id = session["session_id"].as_str().unwrap().to_string();
    let script = format!(
        "i=0; while [ $i -lt {EACH} ]; do mkfifo /tmp/p$i; i=$((i+1)); done; \
         python3 -c 'import socket\nfor i in range({EACH}): socket.socket(socket.AF_UNIX).bind(\"/tmp/s%d\" % i)'; \
         mkfifo /tmp/pr; mkdir /tmp/a; echo real > /tmp/a/real.txt; \
         ln -s /tmp/a /tmp/abs; ln -s /etc /tmp/etc-link; ln -s /tmp/a/real.txt /tmp/lnk; \
         ls /tmp | wc -l"
    );
    let (code, frames) = served.call(
        A,
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(&json!({"argv": ["sh", "-c", script]})),
    );
    assert_eq!(code, 200, "{frames}");
    let stdout: String = frames
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["type"] == "stdout")
        .map(|f| f["data"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(stdout.trim(), (2 * EACH + 5).to_string(), "{frames}");
    let (code, view) = served.call(
        A,
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(&json!({"argv": ["sh", "-c", "exec 3<>/tmp/pr; sleep 58"], "background": true})),
    );
    assert_eq!(code, 202, "{view}");
    id
}

/// B's load, from a real HTTP client (httpx, asyncio): its runs of `/bin/true`, four at
/// a time, each one's latency. Its findings as JSON.
const LOAD: &str = r#"
import asyncio, json, sys, time
import httpx

cfg = json.load(sys.stdin)
base = f"http://127.0.0.1:{cfg['port']}"

async def b_runs(client, out):
    sem = asyncio.Semaphore(4)
    async def one(i):
        async with sem:
            t = time.monotonic()
            try:
                r = await client.post(base + "/v1/runs?wait=true",
                    headers={"Authorization": "Bearer " + cfg["b"]},
                    json={"contract": "small", "argv": ["/bin/true"]}, timeout=30)
                ok = r.status_code == 200 and r.json().get("status") == "ok"
                if not ok:
                    out["b_failures"].append(f"{r.status_code} {r.text[:300]}")
            except Exception as e:
                out["b_failures"].append(repr(e))
            out["b_latencies"].append(time.monotonic() - t)
    await asyncio.gather(*(one(i) for i in range(cfg["b_runs"])))

async def main():
    out = {"b_latencies": [], "b_failures": []}
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(limits=limits) as client:
        await b_runs(client, out)
    print(json.dumps(out))

asyncio.run(main())
"#;

fn b_load(served: &Served) -> std::process::Child {
    let mut child = Command::new("python3")
        .args(["-c", LOAD])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let cfg = json!({"port": served.port, "b": B, "b_runs": B_RUNS});
    child
        .stdin
        .take()
        .unwrap()
        .write_all(cfg.to_string().as_bytes())
        .unwrap();
    child
}

/// A's attack: curl (`--parallel`, 64 at once: a C client, so that on a small host the
/// attacker's own CPU is not what slows B) PUTs 1 KiB onto every FIFO and socket, and
/// onto the FIFO held open. Each answer's status, `Retry-After` and time on its stdout,
/// its body in `dir` (one file per path, beside what it must name).
fn a_attack(served: &Served, session: &str, dir: &std::path::Path) -> std::process::Child {
    let mut targets: Vec<(String, &str)> = Vec::new();
    for i in 0..EACH {
        targets.push((format!("/tmp/p{i}"), "a FIFO"));
        targets.push((format!("/tmp/s{i}"), "a unix socket"));
    }
    targets.push(("/tmp/pr".into(), "a FIFO"));
    let mut config = String::new();
    for (n, (path, kind)) in targets.iter().enumerate() {
        config += &format!(
            "url = \"http://127.0.0.1:{}/v1/sessions/{session}/files{path}\"\noutput = \"{}\"\n",
            served.port,
            dir.join(format!("{n}")).display()
        );
        std::fs::write(dir.join(format!("{n}.want")), format!("{path}\n{kind}")).unwrap();
    }
    std::fs::write(dir.join("curl.cfg"), config).unwrap();
    Command::new("curl")
        .args([
            "-sS",
            "--parallel",
            "--parallel-max",
            "64",
            "--max-time",
            "30",
        ])
        .args(["-X", "PUT", "--data-binary", &"x".repeat(1024)])
        .args(["-H", &format!("Authorization: Bearer {A}")])
        .args([
            "-w",
            "%{http_code} %header{retry-after} %{time_total} %{filename_effective}\n",
        ])
        .arg("-K")
        .arg(dir.join("curl.cfg"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A's answers: each must be 400 `path.kind` naming its path and type, or 429
/// `quota.blocking` with `Retry-After`. (answers by status and reason, wrong ones,
/// unanswered count, slowest seconds)
fn a_findings(child: std::process::Child) -> Value {
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut answers = serde_json::Map::new();
    let mut wrong = Vec::new();
    let mut slowest = 0.0f64;
    let mut answered = 0;
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let [code, retry_after, time, file] = fields[..] else {
            wrong.push(format!("unparsed: {line}"));
            continue;
        };
        answered += 1;
        slowest = slowest.max(time.parse().unwrap_or(f64::MAX));
        let want = std::fs::read_to_string(format!("{file}.want")).unwrap();
        let (path, kind) = want.split_once('\n').unwrap();
        let body: Value =
            serde_json::from_slice(&std::fs::read(file).unwrap_or_default()).unwrap_or(Value::Null);
        let reason = body["reason"].as_str().unwrap_or("").to_string();
        let error = body["error"].as_str().unwrap_or("");
        let good = match code {
            "400" => reason == "path.kind" && error.contains(&format!("{path}: {kind}")),
            "429" => reason == "quota.blocking" && !retry_after.is_empty(),
            _ => false,
        };
        if !good {
            wrong.push(format!("{path}: {code} {body}"));
        }
        let key = format!("{code} {reason}");
        let n = answers.get(&key).and_then(Value::as_u64).unwrap_or(0);
        answers.insert(key, json!(n + 1));
    }
    json!({"answers": answers, "wrong": wrong, "answered": answered,
        "slowest": slowest, "curl_stderr": String::from_utf8_lossy(&out.stderr)})
}

fn findings(child: std::process::Child) -> Value {
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the load client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn p99(found: &Value) -> f64 {
    let mut all: Vec<f64> = found["b_latencies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(all.len(), B_RUNS, "{found}");
    all.sort_by(|x, y| x.partial_cmp(y).unwrap());
    all[(all.len() * 99).div_ceil(100) - 1]
}

/// What a stuck request leaks, read from outside the service: its threads, its open
/// descriptors, and the cells it counts alive.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Counts {
    threads: usize,
    fds: usize,
    cells_alive: u64,
}

fn counts(served: &Served) -> Counts {
    let pid = served.pid().unwrap();
    let entries = |dir: &str| {
        std::fs::read_dir(format!("/proc/{pid}/{dir}"))
            .unwrap()
            .count()
    };
    let metrics = served.curl_unix(&["http://airlock/metrics"]);
    let text = String::from_utf8_lossy(&metrics.stdout).into_owned();
    let cells_alive = text
        .lines()
        .find(|l| l.starts_with("airlock_cells_alive"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no airlock_cells_alive in {text}")) as u64;
    Counts {
        threads: entries("task"),
        fds: entries("fd"),
        cells_alive,
    }
}

/// Waits for the counts to come back to `baseline`, with no tolerance above it, only
/// time: tokio keeps an idle blocking thread for 10 s before it ends it, so the wait is up
/// to 20 s.
fn back_to(served: &Served, baseline: Counts) -> Counts {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = counts(served);
        let back = now.threads <= baseline.threads
            && now.fds <= baseline.fds
            && now.cells_alive == baseline.cells_alive;
        if back || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn pid_gone(pid: u32) -> bool {
    // The child is not reaped by anyone until Served drops it: a zombie has ended.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn puts_onto_fifos_and_sockets_neither_hang_nor_slow_another_tenant_and_sigterm_drains() {
    let _load = crate::exclusive();
    crate::require_cells!();
    let mut served = start();
    let session = session_with_special_files(&served);

    // B alone, then the baseline of what leaks.
    let quiet = findings(b_load(&served));
    assert_eq!(quiet["b_failures"], json!([]), "{quiet}");
    let quiet_p99 = p99(&quiet);
    std::thread::sleep(Duration::from_secs(11));
    let baseline = counts(&served);

    // B again while A sends its 600 PUTs (and one onto the FIFO held open).
    let dir = tempfile::tempdir().unwrap();
    let attack = a_attack(&served, &session, dir.path());
    let attacked = findings(b_load(&served));
    let attack = a_findings(attack);
    assert_eq!(attacked["b_failures"], json!([]), "{attacked}");
    assert_eq!(attack["wrong"], json!([]), "{attack}");
    assert_eq!(
        attack["answered"],
        2 * EACH + 1,
        "none unanswered: {attack}"
    );
    let attacked_p99 = p99(&attacked);
    eprintln!(
        "B p99: quiet {quiet_p99:.3} s, under attack {attacked_p99:.3} s; A's answers {}, \
         slowest {:.3} s",
        attack["answers"], attack["slowest"]
    );
    assert!(
        attacked_p99 <= 2.0 * quiet_p99,
        "B's p99 under attack {attacked_p99:.3} s, quiet {quiet_p99:.3} s"
    );
    // Back to the baseline: no more threads or fds than before it (fewer is not a leak:
    // an idle connection the baseline saw may be gone), the same cells alive.
    let after = back_to(&served, baseline);
    eprintln!("baseline {baseline:?}, after the attack {after:?}");
    assert!(
        after.threads <= baseline.threads
            && after.fds <= baseline.fds
            && after.cells_alive == baseline.cells_alive,
        "threads, fds, cells_alive after the attack {after:?}, before {baseline:?}"
    );

    // SIGTERM while A attacks again and a background command of its session runs: the
    // drain ends within the grace (the runtime's own shutdown bound of 1 s on top).
    let (code, view) = served.call(
        A,
        "POST",
        &format!("/v1/sessions/{session}/exec"),
        Some(&json!({"argv": ["sh", "-c", "sleep 30"], "background": true})),
    );
    assert_eq!(code, 202, "{view}");
    let again = tempfile::tempdir().unwrap();
    let attack = a_attack(&served, &session, again.path());
    std::thread::sleep(Duration::from_millis(300));
    let pid = served.pid().unwrap();
    let sent = Instant::now();
    assert!(Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    while !pid_gone(pid) && sent.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let drained = sent.elapsed();
    let _ = attack.wait_with_output();
    eprintln!("drained in {drained:?} (grace {GRACE_MS} ms)");
    assert!(
        drained <= Duration::from_millis(GRACE_MS + 1500),
        "the drain took {drained:?}: {}",
        served.log()
    );
    served.kill();
    assert!(
        served.log().contains("airlock serve: stopped"),
        "{}",
        served.log()
    );

    // The session and its command that ran are recorded as ended by the operator.
    let shown = served.cli(&["runs", "show", &session, "--json", "--all-users"]);
    assert!(shown.status.success(), "{shown:?}");
    let record: Value = serde_json::from_slice(&shown.stdout).unwrap();
    let run = if record.get("run").is_some() {
        &record["run"]
    } else {
        &record
    };
    assert_eq!(run["status"], "capacity_exceeded", "{record}");
    let listed = served.cli(&[
        "runs",
        "list",
        "--json",
        "--all-users",
        "--session",
        &session,
    ]);
    let commands: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let sleeper = commands
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c.to_string().contains("sleep 30"))
        .unwrap_or_else(|| panic!("{commands}"));
    assert_eq!(sleeper["status"], "capacity_exceeded", "{sleeper}");
    for ended in [run, sleeper] {
        let error = ended["result"]["error"].as_str().unwrap_or("");
        assert!(
            error.starts_with("server.drained: ended by the operator"),
            "{ended}"
        );
    }
}

#[test]
fn gets_lists_symlinks_and_nul_paths_are_answered_as_the_cell_sees_them() {
    let _load = crate::exclusive();
    crate::require_cells!();
    let served = start();
    let session = session_with_special_files(&served);
    let files = |path: &str| format!("/v1/sessions/{session}/files{path}");
    let get = |path: &str| served.call(A, "GET", &files(path), None);
    let put = |path: &str| served.call_text(A, "PUT", &files(path), Some("new"));
    let refused = |(code, body): (u16, Value), status: u16, reason: &str, says: &str| {
        assert_eq!(code, status, "{body}");
        assert_eq!(body["reason"], reason, "{body}");
        let error = body["error"].as_str().unwrap();
        assert!(error.contains(says), "{error:?} should say {says:?}");
    };
    let as_value =
        |(code, text): (u16, String)| (code, serde_json::from_str(&text).unwrap_or(Value::Null));

    // GET of a FIFO (with and without a peer) and of a socket: refused at once, named.
    let began = Instant::now();
    refused(
        get("/tmp/p0"),
        400,
        "path.kind",
        "/tmp/p0: a FIFO, not a regular file",
    );
    refused(get("/tmp/pr"), 400, "path.kind", "/tmp/pr: a FIFO");
    refused(get("/tmp/s0"), 400, "path.kind", "/tmp/s0: a unix socket");
    refused(as_value(put("/tmp/pr")), 400, "path.kind", "a FIFO");
    assert!(began.elapsed() < Duration::from_secs(5));
    // A listing shows them without opening them; listing one is refused.
    let (code, list) = get("?dir=/tmp&limit=1000");
    assert_eq!(code, 200, "{list}");
    let entries = list["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2 * EACH + 5, "{list}");
    let p0 = entries.iter().find(|e| e["name"] == "p0").unwrap();
    assert_eq!(p0["kind"], "other");
    let (code, body) = served.call(
        A,
        "GET",
        &format!("/v1/sessions/{session}/files?dir=/tmp/p0"),
        None,
    );
    refused((code, body), 400, "path.kind", "a FIFO, not a directory");

    // Symlinks resolve as in the cell: /tmp/abs -> /tmp/a (absolute) reaches the file the
    // cell sees there (it once resolved against the writable mount: /tmp/tmp/a).
    let (code, body) = served.call_text(A, "GET", &files("/tmp/abs/real.txt"), None);
    assert_eq!((code, body.as_str()), (200, "real\n"));
    // Into the cell's read-only /etc: not a writable path, read or written.
    refused(
        get("/tmp/etc-link/passwd"),
        403,
        "path.escapes",
        "/tmp/etc-link/passwd",
    );
    refused(
        as_value(put("/tmp/etc-link/evil")),
        403,
        "path.escapes",
        "outside",
    );
    assert!(!std::path::Path::new("/etc/evil").exists());
    // A symlink as the last component is never followed, read or written.
    refused(get("/tmp/lnk"), 400, "path.kind", "a symbolic link");
    refused(
        as_value(put("/tmp/lnk")),
        400,
        "path.kind",
        "a symbolic link",
    );
    let (code, body) = served.call_text(A, "GET", &files("/tmp/a/real.txt"), None);
    assert_eq!(
        (code, body.as_str()),
        (200, "real\n"),
        "not written through"
    );
    // A write through a symlinked directory lands where the cell would put it.
    let (code, body) = put("/tmp/abs/new.txt");
    assert_eq!(code, 201, "{body}");
    let (code, body) = served.call_text(A, "GET", &files("/tmp/a/new.txt"), None);
    assert_eq!((code, body.as_str()), (200, "new"));

    // A NUL byte anywhere in a path: 422, nothing opened or created.
    refused(as_value(put("/tmp/x%00y")), 422, "path.invalid", "NUL");
    refused(get("/tmp/a%00/real.txt"), 422, "path.invalid", "NUL");
    let (code, body) = served.call(
        A,
        "GET",
        &format!("/v1/sessions/{session}/files?dir=/tmp%00"),
        None,
    );
    refused((code, body), 422, "path.invalid", "NUL");
    let (_, list) = get("?dir=/tmp");
    assert!(!list.to_string().contains("\"x"), "nothing created: {list}");
}
