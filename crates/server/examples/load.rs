//! The service's throughput client (scripts/bench.sh): N concurrent clients for S seconds,
//! each on its own keep-alive connection to the unix socket, running `/bin/true` through
//! `POST /v1/runs?wait=true`; prints runs/s, p50 and p99 of request-to-record, the runs
//! that were not `ok`, and the cells left alive afterwards (beyond the parked ones).
//!
//! `cargo run --release -p airlock-server --example load -- SOCKET [CLIENTS] [SECONDS] [CONTRACT]`

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// One request on `conn`; the response's status and body.
fn request(
    conn: &mut BufReader<UnixStream>,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<(u16, String)> {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: airlock\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let stream = conn.get_mut();
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    let mut status_line = String::new();
    conn.read_line(&mut status_line)?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        conn.read_line(&mut line)?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; length];
    conn.read_exact(&mut body)?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn connect(socket: &str) -> BufReader<UnixStream> {
    BufReader::new(UnixStream::connect(socket).expect("connecting to the service"))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// `name`'s value in a Prometheus text exposition (the sum over its series).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let socket = args
        .first()
        .expect("usage: load SOCKET [CLIENTS] [SECONDS] [CONTRACT]")
        .clone();
    let clients: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(16);
    let seconds: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(20);
    let contract = args.get(3).cloned().unwrap_or_else(|| "small".into());
    let body = format!(r#"{{"contract": "{contract}", "argv": ["/bin/true"]}}"#);
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds);
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            let (socket, body) = (socket.clone(), body.clone());
            std::thread::spawn(move || {
                let mut conn = connect(&socket);
                let (mut latencies, mut failed) = (Vec::new(), 0u64);
                while Instant::now() < until {
                    let t = Instant::now();
                    match request(&mut conn, "POST", "/v1/runs?wait=true", &body) {
                        Ok((200, record)) if record.contains(r#""status":"ok""#) => {
                            latencies.push(t.elapsed().as_secs_f64() * 1000.0)
                        }
                        Ok(_) => failed += 1,
                        Err(_) => {
                            failed += 1;
                            conn = connect(&socket);
                        }
                    }
                }
                (latencies, failed)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut failed = 0;
    for worker in workers {
        let (l, f) = worker.join().expect("a client thread");
        latencies.extend(l);
        failed += f;
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    // Let the last cells' teardown finish before counting what is left.
    std::thread::sleep(Duration::from_secs(2));
    let mut conn = connect(&socket);
    let (_, metrics) = request(&mut conn, "GET", "/metrics", "").unwrap_or_default();
    let left = metric(&metrics, "airlock_cells_alive") - metric(&metrics, "airlock_pool_free");
    println!(
        "service: {clients} clients x {seconds} s: {} runs, {:.1} runs/s, p50 {:.2} ms, p99 {:.2} ms, {failed} not ok, {left} cells left (beyond parked)",
        latencies.len(),
        latencies.len() as f64 / elapsed,
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
    );
}
