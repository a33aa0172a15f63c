//! Brokered actions of runs made through `airlock serve` (the engine's threaded path: the
//! cell comes from the factory, the broker thread from the service's engine): the action
//! is authorized against the run's tenant, the file lands in storage, and the run's record
//! carries the broker's records (`?wait=true` answers the run's result). On the gVisor
//! tier the service's thread supervises the sandbox itself, and the tier's unix forwarder
//! carries the socket (crates/cell/src/gvisor/broker.rs).

mod common;

use common::tier::Tier;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ALICE: &str = "alice-broker-key";
const BOB: &str = "bob-broker-key";

/// Sends argv[1] (one request line) to `$AIRLOCK_BROKER` and prints the reply.
const CLIENT_PY: &str = r#"
import os, sys, socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(os.environ["AIRLOCK_BROKER"])
s.sendall(sys.argv[1].encode() + b"\n")
data = b""
while not data.endswith(b"\n"):
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
print(data.decode().strip())
"#;

struct Service {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
    tier: Tier,
}

impl Service {
    fn start(tier: Tier) -> Service {
        let dir = tempfile::tempdir().unwrap();
        let port = common::free_port();
        std::fs::create_dir(dir.path().join("storage")).unwrap();
        let contract = tier.contract(Some("broker_actions: [store_case_document]\n"));
        std::fs::write(dir.path().join("brokered.yaml"), contract.unwrap()).unwrap();
        let config = format!(
            r#"[server]
listen = ["tcp:127.0.0.1:{port}"]
[server.contracts]
brokered = "brokered.yaml"
[server.tenants.alice]
api_key_sha256 = ["{alice}"]
[server.tenants.bob]
api_key_sha256 = ["{bob}"]

[broker.actions.store_case_document]
description = "store a document for a case"
contract = true
tenants = ["alice"]
schema = {{ type = "object", required = ["case_id", "file_name", "content"] }}
handler = {{ kind = "store_artifact", directory = "{storage}", name_field = "file_name", group_field = "case_id", encoding = "text" }}
"#,
            alice = common::sha256_hex(ALICE),
            bob = common::sha256_hex(BOB),
            storage = dir.path().join("storage").display(),
        );
        std::fs::write(dir.path().join("airlock.toml"), config).unwrap();
        let child = Command::new(common::airlock_bin())
            .arg("serve")
            .arg("--config")
            .arg(dir.path().join("airlock.toml"))
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("serve.log")).unwrap())
            .spawn()
            .unwrap();
        let service = Service {
            child,
            dir,
            port,
            tier,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "no service: {}", service.log());
            std::thread::sleep(Duration::from_millis(100));
        }
        service
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default()
    }

    fn storage(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    /// `POST /v1/runs?wait=true` of the client with `line`, as the tenant of `key`.
    fn run(&self, key: &str, line: &str) -> Value {
        let body = json!({
            "contract": "brokered",
            "argv": ["/usr/bin/python3", "-c", CLIENT_PY, line],
        })
        .to_string();
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "120", "-X", "POST"])
            .args(["-H", &format!("Authorization: Bearer {key}")])
            .args([
                "-H",
                "content-type: application/json",
                "--data-binary",
                &body,
            ])
            .arg(format!("http://127.0.0.1:{}/v1/runs?wait=true", self.port))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let record: Value =
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("{text}\n{}", self.log()));
        self.assert_ran_on_its_tier(&record);
        record
    }

    /// The run's stored plan names the service's tier; on gVisor, the run having ended
    /// (`wait=true`), nothing of its sandbox is left while the service lives.
    fn assert_ran_on_its_tier(&self, record: &Value) {
        let run_id = record["run_id"]
            .as_str()
            .unwrap_or_else(|| panic!("{record}"));
        let out = Command::new(common::airlock_bin())
            .args(["runs", "show", run_id, "--json", "--state-dir"])
            .arg(self.dir.path().join("state"))
            .output()
            .unwrap();
        let shown: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| panic!("{}", common::output_text(&out)));
        assert_eq!(
            shown["run"]["plan"]["isolation"],
            self.tier.name(),
            "{shown}"
        );
        if self.tier == Tier::Gvisor {
            let service = common::host::Supervisor::of(&self.child);
            common::tier::assert_sandboxes_of_left_nothing(&service, &record.to_string());
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn store_line(name: &str) -> String {
    json!({"action": "store_case_document",
           "request": {"case_id": "4821", "file_name": name, "content": "case notes\n"}})
    .to_string()
}

fn reply_of(record: &Value) -> Value {
    let stdout = record["output"]["stdout"]["head"]
        .as_str()
        .unwrap_or_default();
    serde_json::from_str(stdout.trim()).unwrap_or_else(|_| panic!("{record}"))
}

both_tiers! {
fn a_service_run_is_brokered_for_its_tenant_only(tier) {
    require_cells!();
    let service = Service::start(tier);
    let alice = service.run(ALICE, &store_line("notes.txt"));
    assert_eq!(alice["status"], "ok", "{alice}\n{}", service.log());
    assert_eq!(reply_of(&alice)["ok"], true, "{alice}");
    let stored = std::fs::read_to_string(service.storage().join("4821/notes.txt")).unwrap();
    assert_eq!(stored, "case notes\n");
    assert_eq!(alice["broker"][0]["decision"], "granted");

    let bob = service.run(BOB, &store_line("bob.txt"));
    assert_eq!(bob["status"], "ok", "{bob}");
    assert_eq!(
        reply_of(&bob)["error"]["reason"],
        "broker.tenant_not_allowed",
        "{bob}"
    );
    assert_eq!(bob["broker"][0]["reason"], "broker.tenant_not_allowed");
    assert!(!service.storage().join("4821/bob.txt").exists());
    assert!(!Path::new(&service.storage().join("bob.txt")).exists());
}
}
