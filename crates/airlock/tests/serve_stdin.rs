//! `POST /v1/runs/stream` through the real binary and real clients: curl uploads a JSON
//! line and 3 MB of stdin and the record hashes exactly what the payload read; a writer
//! slower than `body_timeout_ms` is served (its stdin is under the run's deadline), a
//! writer that never ends its body is cut off at the run's deadline, a JSON line that
//! stalls is 408 before any cell, and a line with its own `stdin` or over the size bound
//! is refused.

mod common;

use common::served::Served;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};

/// The service of these tests: the unix socket only, a 1 s body bound and a 4 KiB body.
fn start() -> Served {
    let config = "[server]\nlisten = [\"unix:SOCK\"]\nbody_timeout_ms = 1000\n\
                  max_body_bytes = 4096\n[server.contracts]\nsmall = \"small.yaml\"\n";
    Served::start(config, |dir| {
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/contracts/default.yaml"),
            dir.join("small.yaml"),
        )
        .unwrap();
    })
}

fn run_count(service: &Served) -> usize {
    let out = service.curl_unix(&["http://airlock/v1/runs"]);
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    list["runs"].as_array().unwrap().len()
}

/// The Python client below, over the unix socket: its JSON answer.
fn python(service: &Served, scenario: &str, line: &str) -> Value {
    let out = Command::new("python3")
        .args(["-c", CLIENT, scenario, line])
        .arg(service.sock())
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {} {} {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            service.log()
        )
    })
}

/// A raw HTTP/1.1 client with a chunked body: `slow` sends the line, then three pieces
/// of stdin 700 ms apart (longer in all than body_timeout_ms) and ends the body; `open`
/// sends the line and one piece and never ends the body; `stall` sends the head and half
/// a line. It prints {"status", "seconds", "body"}.
const CLIENT: &str = r#"
import json, socket, sys, time
scenario, line, path = sys.argv[1], sys.argv[2], sys.argv[3]
sock = socket.socket(socket.AF_UNIX)
sock.connect(path)
sock.settimeout(60)
def chunk(data):
    # A refused line closes the connection: what is left unsent is the server's choice.
    try:
        sock.sendall(b"%x\r\n%s\r\n" % (len(data), data))
    except (BrokenPipeError, ConnectionResetError):
        pass
sock.sendall(b"POST /v1/runs/stream?wait=true HTTP/1.1\r\nHost: airlock\r\n"
             b"Transfer-Encoding: chunked\r\nContent-Type: application/octet-stream\r\n\r\n")
start = time.monotonic()
if scenario == "stall":
    chunk(line.encode()[: len(line) // 2])
else:
    chunk(line.encode() + b"\n")
    if scenario == "slow":
        for piece in (b"one ", b"two ", b"three"):
            time.sleep(0.7)
            chunk(piece)
        chunk(b"")
    else:
        chunk(b"partial")
answer = b""
while b"\r\n\r\n" not in answer or not answer.endswith(b"\n"):
    data = sock.recv(65536)
    if not data:
        break
    answer += data
head, _, body = answer.partition(b"\r\n\r\n")
if b"chunked" in head.lower():
    out, rest = b"", body
    while rest:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out, rest = out + rest[:n], rest[n + 2:]
    body = out
print(json.dumps({"status": int(head.split()[1]), "seconds": time.monotonic() - start,
                  "body": body.decode()}))
"#;

fn sha256_of(bytes: &[u8]) -> String {
    common::sha256_hex(bytes)
}

#[test]
fn the_body_after_the_json_line_is_the_payloads_stdin_as_it_arrives() {
    require_cells!();
    let service = start();

    // curl streams 3 MB after the line; the payload hashes what it read, and so does
    // the record.
    let data: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
    let mut upload = br#"{"contract": "small", "argv": ["sha256sum"]}"#.to_vec();
    upload.push(b'\n');
    upload.extend_from_slice(&data);
    let mut curl = Command::new("curl")
        .args(["-sS", "--max-time", "120", "--unix-socket"])
        .arg(service.sock())
        .args([
            "-T",
            "-",
            "-X",
            "POST",
            "http://airlock/v1/runs/stream?wait=true",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut curl.stdin.take().unwrap(), &upload).unwrap();
    let out = curl.wait_with_output().unwrap();
    let record: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {} {}",
            String::from_utf8_lossy(&out.stdout),
            service.log()
        )
    });
    let digest = sha256_of(&data);
    assert_eq!(record["status"], "ok", "{record}");
    assert!(
        record["output"]["stdout"]["head"]
            .as_str()
            .unwrap()
            .starts_with(&digest),
        "{record}"
    );
    assert_eq!(record["stdin"]["sha256"], digest.as_str(), "{record}");
    assert_eq!(record["stdin"]["bytes"], data.len(), "{record}");
    assert_eq!(record["stdin"]["eof"], true, "{record}");

    // A writer slower in all than body_timeout_ms (1 s) is served: the bound is on the
    // line, and the stdin after it is under the run's deadline.
    let slow = python(
        &service,
        "slow",
        r#"{"contract": "small", "argv": ["cat"]}"#,
    );
    assert_eq!(slow["status"], 200, "{slow}");
    let record: Value = serde_json::from_str(slow["body"].as_str().unwrap()).unwrap();
    assert_eq!(record["status"], "ok", "{record}");
    assert_eq!(
        record["output"]["stdout"]["head"], "one two three",
        "{record}"
    );
    assert!(slow["seconds"].as_f64().unwrap() >= 2.0, "{slow}");
}

#[test]
fn a_body_that_never_ends_is_cut_off_at_the_runs_deadline_and_bad_lines_start_nothing() {
    require_cells!();
    let service = start();

    // The body never ends: the run's deadline (1.5 s) kills the payload, and the client
    // gets the record while its body is still open.
    let open = python(
        &service,
        "open",
        r#"{"contract": "small", "argv": ["cat"], "deadline_ms": 1500}"#,
    );
    assert_eq!(open["status"], 200, "{open}");
    let record: Value = serde_json::from_str(open["body"].as_str().unwrap()).unwrap();
    assert_eq!(record["limit_fired"], "wall_time", "{record}");
    assert_eq!(record["output"]["stdout"]["head"], "partial", "{record}");
    assert_eq!(record["stdin"]["eof"], false, "{record}");
    assert!(open["seconds"].as_f64().unwrap() < 30.0, "{open}");
    let runs = run_count(&service);
    assert_eq!(runs, 1);

    // Half a line, then nothing: 408 at body_timeout_ms, and no cell.
    let stall = python(
        &service,
        "stall",
        r#"{"contract": "small", "argv": ["cat"]}"#,
    );
    assert_eq!(stall["status"], 408, "{stall}");
    assert!(
        stall["body"]
            .as_str()
            .unwrap()
            .contains("request.body_timeout"),
        "{stall}"
    );
    assert!(stall["seconds"].as_f64().unwrap() < 10.0, "{stall}");

    // Its own `stdin` field, or a line beyond max_body_bytes (4096): refused, no cell.
    let refused = |line: &str| {
        let answer = python(&service, "slow", line);
        let body: Value = serde_json::from_str(answer["body"].as_str().unwrap()).unwrap();
        (answer["status"].clone(), body["reason"].clone())
    };
    assert_eq!(
        refused(r#"{"contract": "small", "argv": ["cat"], "stdin": "x"}"#),
        (400.into(), "stdin.conflict".into())
    );
    let long = format!(
        r#"{{"contract": "small", "argv": ["echo", "{}"]}}"#,
        "x".repeat(5000)
    );
    assert_eq!(refused(&long), (413.into(), "request.too_large".into()));
    assert_eq!(run_count(&service), runs, "a refused line started a run");
}
