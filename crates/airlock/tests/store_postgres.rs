//! A fleet's store end to end: `[store] url` pointing at a real Postgres this test starts
//! (crates/store/tests/pg_server), `airlock run` writing its record there (not in the
//! state directory's file), `airlock runs show` and `airlock audit verify` reading it,
//! tampering in Postgres named by `audit verify`, a database that cannot be reached
//! refusing the run, two named nodes (`[store] node`) of which a SIGKILLed and restarted
//! one aborts only its own open run, a node name held by a live process table refused to
//! another (a pid namespace of its own) until its holder dies, and records sent over
//! verified TLS to this machine's non-loopback address (a test CA made with the openssl
//! CLI) or through `localhost`.
//! Needs root (cells) and Debian's `postgresql` (.ci/run installs it).

mod common;

#[path = "../../store/tests/pg_server/mod.rs"]
mod pg_server;

use pg_server::{PgServer, ServerOptions, TestPki};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

struct Node {
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Node {
    /// A node with its own state directory and a configuration naming `url`.
    fn new(url: &str) -> Node {
        Self::with_config(&format!("[store]\nurl = \"{url}\"\n"))
    }

    /// A node named `name` in the fleet's store at `url`.
    fn named(url: &str, name: &str) -> Node {
        Self::with_config(&format!("[store]\nurl = \"{url}\"\nnode = \"{name}\"\n"))
    }

    fn with_config(text: &str) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("airlock.toml");
        std::fs::write(&config, text).unwrap();
        Node { dir, config }
    }

    /// `airlock run -- sleep 30` of this node, started and left running.
    fn start_sleeping_run(&self) -> std::process::Child {
        Command::new(common::airlock_bin())
            .arg("run")
            .arg("--state-dir")
            .arg(self.state())
            .arg("--config")
            .arg(&self.config)
            .args(["--", "sleep", "30"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// `airlock <sub> --state-dir S --config C <rest>`.
    fn airlock(&self, sub: &str, rest: &[&str]) -> Output {
        self.airlock_with(sub, rest, Some(&self.config))
    }

    fn airlock_with(&self, sub: &str, rest: &[&str], config: Option<&Path>) -> Output {
        let mut cmd = Command::new(common::airlock_bin());
        cmd.current_dir(self.dir.path())
            .arg(sub)
            .arg("--state-dir")
            .arg(self.state());
        if let Some(config) = config {
            cmd.arg("--config").arg(config);
        }
        cmd.args(rest)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .unwrap()
    }
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn a_run_is_recorded_in_postgres_verified_and_tampering_is_named() {
    require_cells!();
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db("fleet");
    let node = Node::new(&url);
    let out = node.airlock("run", &["--", "/bin/echo", "from-a-cell"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("from-a-cell"));

    // The record is in Postgres, not in the node's SQLite file.
    let id = pg.psql("fleet", "SELECT run_id FROM runs");
    assert_eq!(id.lines().count(), 1, "one run in Postgres: {id:?}");
    assert_eq!(pg.psql("fleet", "SELECT status FROM runs"), "ok");
    let local = node.airlock_with("runs", &["list", "--all-users", "--json"], None);
    assert!(local.status.success(), "{}", text(&local));
    assert!(
        !String::from_utf8_lossy(&local.stdout).contains(&id),
        "the run reached the local file too: {}",
        text(&local)
    );

    // Another node (another state directory, the same URL) reads it.
    let other = Node::new(&url);
    let shown = other.airlock("runs", &["show", &id, "--json", "--all-users"]);
    assert!(shown.status.success(), "{}", text(&shown));
    let detail: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(detail["run"]["run_id"], id.as_str());
    assert_eq!(detail["run"]["status"], "ok");

    let verify = other.airlock("audit", &["verify"]);
    assert!(verify.status.success(), "{}", text(&verify));
    assert!(String::from_utf8_lossy(&verify.stdout).contains("audit chain intact"));

    // Someone with write access to the database edits the run's exit code.
    pg.psql(
        "fleet",
        &format!("UPDATE runs SET exit_code = 7 WHERE run_id = '{id}'"),
    );
    let verify = node.airlock("audit", &["verify"]);
    assert_eq!(verify.status.code(), Some(2), "{}", text(&verify));
    let err = String::from_utf8_lossy(&verify.stderr);
    assert!(
        err.contains("FAILED") && err.contains(&id) && err.contains("exit_code"),
        "{}",
        text(&verify)
    );
}

#[test]
fn an_unreachable_fleet_store_refuses_the_run() {
    require_cells!();
    let port = common::free_port();
    let node = Node::new(&format!("postgres://airlock@127.0.0.1:{port}/fleet"));
    let marker = node.dir.path().join("ran");
    let script = format!("touch {}", marker.display());
    let out = node.airlock("run", &["--", "/bin/sh", "-c", &script]);
    // Nobody listens there: store_unavailable's own exit code (retry later), not 125.
    assert_eq!(out.status.code(), Some(122), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("store_unavailable"),
        "{}",
        text(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot be reached"),
        "{}",
        text(&out)
    );
    assert!(!marker.exists(), "the payload ran without a record");
    // Nothing fell back to the local file.
    let local = node.airlock_with("runs", &["list", "--all-users", "--json"], None);
    assert_eq!(
        String::from_utf8_lossy(&local.stdout).trim(),
        "[]",
        "{}",
        text(&local)
    );
}

#[test]
fn a_url_that_would_send_records_unverified_is_refused() {
    for (url, why) in [
        (
            "postgres://airlock@db.fleet.test:5432/fleet",
            "only over verified TLS",
        ),
        (
            "postgres://airlock@192.0.2.1:5432/fleet?sslmode=require",
            "sslmode=require: encrypts without checking who answers",
        ),
    ] {
        let node = Node::new(url);
        let out = node.airlock("audit", &["verify"]);
        assert!(!out.status.success(), "{}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(why),
            "{}",
            text(&out)
        );
    }
}

#[test]
fn two_services_on_one_fleet_store_show_each_others_runs() {
    require_cells!();
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db("fleet");
    let config = format!(
        "[server]\nlisten = [\"unix:SOCK\"]\n[server.contracts]\nsmall = \"small.yaml\"\n\
         [store]\nurl = \"{url}\"\n"
    );
    let contract = |dir: &Path| {
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/contracts/default.yaml"),
            dir.join("small.yaml"),
        )
        .unwrap();
    };
    let a = common::served::Served::start(&config, contract);
    let b = common::served::Served::start(&config, contract);
    // A run recorded by node A's command line (its own state directory, the fleet's store).
    let run = Command::new(common::airlock_bin())
        .arg("run")
        .arg("--config")
        .arg(a.path("airlock.toml"))
        .arg("--state-dir")
        .arg(a.state_dir())
        .args(["--", "/bin/echo", "node-a"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(0), "{}", text(&run));
    let id = pg.psql("fleet", "SELECT run_id FROM runs");
    for (node, service) in [("a", &a), ("b", &b)] {
        let out = service.curl_unix(&["-f", &format!("http://airlock/v1/runs/{id}")]);
        assert!(out.status.success(), "node {node}: {}", text(&out));
        let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(shown["run"]["run_id"], id.as_str(), "node {node}: {shown}");
    }
    // A run of service B (its engine's cell factory and store connections), shown by A.
    let out = b.curl_unix(&[
        "-f",
        "http://airlock/v1/runs?wait=true",
        "-H",
        "content-type: application/json",
        "-d",
        r#"{"contract": "small", "argv": ["/bin/echo", "node-b"]}"#,
    ]);
    assert!(out.status.success(), "{}\n{}", text(&out), b.log());
    let record: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(record["status"], "ok", "{record}");
    let b_run = record["run_id"].as_str().unwrap();
    let out = a.curl_unix(&["-f", &format!("http://airlock/v1/runs/{b_run}")]);
    assert!(out.status.success(), "{}", text(&out));
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["run"]["status"], "ok", "{shown}");
    assert_eq!(pg.psql("fleet", "SELECT count(*) FROM runs"), "2");

    let verify = b.cli(&["audit", "verify"]);
    assert!(verify.status.success(), "{}", text(&verify));
}

#[test]
fn a_sigkilled_airlock_run_leaves_a_verifiable_chain_in_postgres() {
    require_cells!();
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db("fleet");
    let node = Node::new(&url);
    // The schema first (any opening migrates), so the poll below can query it.
    let empty = node.airlock("audit", &["verify"]);
    assert!(empty.status.success(), "{}", text(&empty));
    let mut supervisor = Command::new(common::airlock_bin())
        .arg("run")
        .arg("--state-dir")
        .arg(node.state())
        .arg("--config")
        .arg(&node.config)
        .args(["--", "sleep", "30"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The begin record is in Postgres before the payload starts.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let id = loop {
        let running = pg.psql("fleet", "SELECT run_id FROM runs WHERE status = 'running'");
        if !running.is_empty() {
            break running;
        }
        if std::time::Instant::now() > deadline {
            let _ = supervisor.kill();
            panic!("the run never showed as running");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    std::thread::sleep(std::time::Duration::from_millis(1000));
    supervisor.kill().unwrap(); // SIGKILL, mid-run
    supervisor.wait().unwrap();

    let verify = node.airlock("audit", &["verify"]);
    assert!(verify.status.success(), "{}", text(&verify));
    // This node's next opening reaps it (its boot, its dead supervisor).
    let shown = node.airlock("runs", &["show", &id, "--json", "--all-users"]);
    assert!(shown.status.success(), "{}", text(&shown));
    let detail: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(detail["run"]["status"], "aborted", "{detail}");
    assert_eq!(pg.psql("fleet", "SELECT count(*) FROM runs"), "1");
    let verify = node.airlock("audit", &["verify"]);
    assert!(verify.status.success(), "{}", text(&verify));
}

/// The run of node `node` that is `running` in the fleet's database, once there is one.
fn running_run_of(pg: &PgServer, node: &str, supervisor: &mut std::process::Child) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let running = pg.psql(
            "fleet",
            &format!("SELECT run_id FROM runs WHERE status = 'running' AND node = '{node}'"),
        );
        if !running.is_empty() {
            return running;
        }
        if std::time::Instant::now() > deadline {
            let _ = supervisor.kill();
            panic!("the run of {node} never showed as running");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn a_restarted_node_aborts_its_open_run_and_leaves_another_nodes_running() {
    require_cells!();
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db("fleet");
    let (a, b) = (Node::named(&url, "node-a"), Node::named(&url, "node-b"));
    // The schema first (any opening migrates), so the polls below can query it.
    let empty = a.airlock("audit", &["verify"]);
    assert!(empty.status.success(), "{}", text(&empty));
    let mut supervisor_a = a.start_sleeping_run();
    let run_a = running_run_of(&pg, "node-a", &mut supervisor_a);
    let mut supervisor_b = b.start_sleeping_run();
    let run_b = running_run_of(&pg, "node-b", &mut supervisor_b);
    supervisor_a.kill().unwrap(); // SIGKILL, mid-run
    supervisor_a.wait().unwrap();

    // Node A restarts (any opening of its store): its open run is aborted, by it.
    let shown = a.airlock("runs", &["show", &run_a, "--json", "--all-users"]);
    assert!(shown.status.success(), "{}", text(&shown));
    let detail: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(detail["run"]["status"], "aborted", "{detail}");
    assert_eq!(detail["run"]["node"], "node-a", "{detail}");
    let last = detail["events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["kind"], "run.aborted", "{detail}");
    assert_eq!(last["body"]["reaped_by"], "node-a", "{detail}");
    // Node B's run is alive and is not A's to judge.
    let status_b = format!("SELECT status FROM runs WHERE run_id = '{run_b}'");
    assert_eq!(pg.psql("fleet", &status_b), "running");
    let verify = b.airlock("audit", &["verify"]);
    assert!(verify.status.success(), "{}", text(&verify));

    // Node B's service shows A's aborted run; starting it left B's own live run alone.
    let config = format!(
        "[server]\nlisten = [\"unix:SOCK\"]\n[store]\nurl = \"{url}\"\nnode = \"node-b\"\n"
    );
    let service = common::served::Served::start(&config, |_| {});
    let out = service.curl_unix(&["-f", &format!("http://airlock/v1/runs/{run_a}")]);
    assert!(out.status.success(), "{}\n{}", text(&out), service.log());
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["run"]["status"], "aborted", "{shown}");
    assert_eq!(pg.psql("fleet", &status_b), "running");

    // B's supervisor dies too; B's next opening aborts its run, and the chain holds.
    supervisor_b.kill().unwrap();
    supervisor_b.wait().unwrap();
    let verify = b.airlock("audit", &["verify"]);
    assert!(verify.status.success(), "{}", text(&verify));
    assert_eq!(pg.psql("fleet", &status_b), "aborted");
}

/// `airlock <args>` of node `node` in a pid namespace of its own (`unshare --pid`): a
/// process table that cannot see this one's processes, as another machine's cannot. No
/// test hook: the binary names its holder by its real boot id and pid namespace.
fn airlock_in_another_pid_namespace(node: &Node, args: &[&str]) -> Output {
    Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "--"])
        .arg(common::airlock_bin())
        .arg(args[0])
        .arg("--state-dir")
        .arg(node.dir.path().join("state-elsewhere"))
        .arg("--config")
        .arg(&node.config)
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn a_node_name_held_by_a_live_process_table_is_refused_to_another() {
    require_cells!();
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db("fleet");
    let a = Node::named(&url, "shared");
    let empty = a.airlock("audit", &["verify"]);
    assert!(empty.status.success(), "{}", text(&empty));
    let mut supervisor_a = a.start_sleeping_run();
    let run_a = running_run_of(&pg, "shared", &mut supervisor_a);

    // Another process table given the same name: refused while A's supervisor lives,
    // for a run and for an audit command alike, by node, holder and fix; nothing runs.
    let marker = a.dir.path().join("ran");
    let script = format!("touch {}", marker.display());
    for (args, code) in [
        (&["run", "--", "/bin/sh", "-c", &script][..], 125),
        (&["audit", "verify"], 1),
    ] {
        let out = airlock_in_another_pid_namespace(&a, args);
        let shown = text(&out);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {shown}");
        for part in [
            "store node name \"shared\" is held by boot",
            "1 live database session(s)",
            "its own [store] node",
        ] {
            assert!(shown.contains(part), "{part:?} not in {shown}");
        }
    }
    assert!(
        !marker.exists(),
        "the payload ran under a name held elsewhere"
    );
    assert_eq!(pg.psql("fleet", "SELECT count(*) FROM runs"), "1");
    let status_a = format!("SELECT status FROM runs WHERE run_id = '{run_a}'");
    assert_eq!(pg.psql("fleet", &status_a), "running");

    // A dies; the other process table takes the name, and A's run, which A can no
    // longer finish, is its to mark aborted. The chain holds.
    supervisor_a.kill().unwrap();
    supervisor_a.wait().unwrap();
    let verify = airlock_in_another_pid_namespace(&a, &["audit", "verify"]);
    assert!(verify.status.success(), "{}", text(&verify));
    assert_eq!(pg.psql("fleet", &status_a), "aborted");
    let reason = pg.psql(
        "fleet",
        &format!(
            "SELECT body_json FROM audit_log WHERE run_id = '{run_a}' AND kind = 'run.aborted'"
        ),
    );
    assert!(reason.contains("node shared's earlier holder"), "{reason}");
    let verify = a.airlock("audit", &["verify"]);
    assert!(verify.status.success(), "{}", text(&verify));
}

/// `airlock run` with `url`: the payload ran and its record is `ok` in the database.
fn assert_a_run_is_recorded(pg: &PgServer, url: &str) {
    let node = Node::new(url);
    let out = node.airlock("run", &["--", "/bin/echo", "recorded"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("recorded"));
    assert_eq!(pg.psql("fleet", "SELECT status FROM runs"), "ok");
    let verify = node.airlock("audit", &["verify"]);
    assert!(verify.status.success(), "{}", text(&verify));
}

#[test]
fn a_run_is_recorded_over_verified_tls_to_a_network_address() {
    require_cells!();
    // This machine's own non-loopback address, reachable only over TLS (hostssl); a
    // machine without one tests the loopback case (the certificate names 127.0.0.1).
    let addr = pg_server::non_loopback_ipv4()
        .map(|a| a.to_string())
        .unwrap_or_else(|| {
            eprintln!("no non-loopback IPv4 address: TLS is tested over 127.0.0.1 only");
            "127.0.0.1".into()
        });
    let pki_dir = tempfile::tempdir().unwrap();
    let pki = TestPki::make(
        pki_dir.path(),
        &[format!("IP:{addr}"), "IP:127.0.0.1".into()],
    );
    let Some(pg) = PgServer::start_with(ServerOptions {
        tls_only_addresses: vec![addr.clone()]
            .into_iter()
            .filter(|a| a != "127.0.0.1")
            .collect(),
        tls: Some(pki.server_files()),
        scram: false,
    }) else {
        return;
    };
    pg.create_db("fleet");
    let url = format!(
        "postgres://postgres@{addr}:{}/fleet?sslmode=verify-full&sslrootcert={}",
        pg.port,
        pki.ca.display()
    );
    // The cell is cloned after the TLS connection is made: rustls starts no thread.
    assert_a_run_is_recorded(&pg, &url);
    // A certificate the configured CA did not sign refuses the run before it starts.
    let other = url.replace(
        &pki.ca.display().to_string(),
        &pki.other_ca.display().to_string(),
    );
    let node = Node::new(&other);
    let marker = node.dir.path().join("ran");
    let script = format!("touch {}", marker.display());
    let out = node.airlock("run", &["--", "/bin/sh", "-c", &script]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("UnknownIssuer"),
        "{}",
        text(&out)
    );
    assert!(!marker.exists(), "the payload ran without a record");
}

#[test]
fn a_run_is_recorded_through_localhost_by_name() {
    require_cells!();
    let Some(pg) = PgServer::start() else { return };
    pg.create_db("fleet");
    // `localhost` is resolved on the calling thread (the cell is cloned after it).
    assert_a_run_is_recorded(
        &pg,
        &format!("postgres://postgres@localhost:{}/fleet", pg.port),
    );
}
