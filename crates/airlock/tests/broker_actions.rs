//! Brokered actions through the real binary (docs/credentials.md, "The broker"): a cell
//! hands the trusted side a structured request over its run's unix socket; the trusted
//! side authorizes it against the operator's action, performs it outside the cell and
//! records it. The cell never reaches the storage directory or the handler's credential.
//!
//! The payload is a python3 client (the host image's): it sends each request line it is
//! given on its own connection to `$AIRLOCK_BROKER` and prints the replies as JSON.

mod common;

use common::tier::Tier;
use common::CellRun;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Sends each request line of argv[1] (a JSON list of strings) on its own connection and
/// prints `{"replies": [...], "probes": {...}}`. With argv[2] (a host path) it first tries
/// to list and to write that path directly, to remove its socket and to bind another
/// beside it; with argv[3] (a secret value) it looks for
/// it (given reversed) in its environment and in every /proc/*/environ and /proc/*/cmdline
/// it can read.
const CLIENT_PY: &str = r#"
import os, sys, json, socket, glob
probes = {}
if len(sys.argv) > 2 and sys.argv[2]:
    storage = sys.argv[2]
    for what, attempt in [("list", lambda: os.listdir(storage)),
                          ("write", lambda: open(os.path.join(storage, "direct.pdf"), "wb").write(b"x")),
                          ("write_group", lambda: open(os.path.join(storage, "4821", "direct.pdf"), "wb").write(b"x")),
                          ("unlink_socket", lambda: os.unlink(os.environ["AIRLOCK_BROKER"])),
                          ("bind_beside", lambda: socket.socket(socket.AF_UNIX).bind("/run/airlock/other.sock"))]:
        try:
            attempt()
            probes[what] = "reached"
        except OSError as e:
            probes[what] = e.__class__.__name__
if len(sys.argv) > 3:
    # Given reversed, so that no command line in the cell holds it as it is.
    secret = sys.argv[3][::-1].encode()
    hits = [k.decode() for k, v in os.environb.items() if secret in k + b"=" + v]
    for path in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline"):
        try:
            data = open(path, "rb").read()
        except OSError:
            continue
        if secret in data:
            hits.append(path)
    probes["secret_hits"] = hits
replies = []
for line in json.loads(sys.argv[1]):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ["AIRLOCK_BROKER"])
    s.sendall(line.encode() + b"\n")
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    replies.append(json.loads(data))
print(json.dumps({"replies": replies, "probes": probes}))
"#;

/// A generated PDF (its bytes, base64): what the seed's agent wants stored for case 4821.
const PDF_BASE64: &str = "JVBERi0xLjQKJSBnZW5lcmF0ZWQgZm9yIGNhc2UgNDgyMQolJUVPRgo=";
const PDF_BYTES: &[u8] = b"%PDF-1.4\n% generated for case 4821\n%%EOF\n";

struct Setup {
    dir: tempfile::TempDir,
    tier: Tier,
}

impl Setup {
    fn new(tier: Tier) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let storage = dir.path().join("storage");
        std::fs::create_dir(&storage).unwrap();
        let received = dir.path().join("received.json");
        let config = CONFIG
            .replace("STORAGE", &storage.display().to_string())
            .replace("RECEIVED", &received.display().to_string())
            + &class_bounds(tier, "[policy.classes.casework.bounds]");
        std::fs::write(dir.path().join("airlock.toml"), config).unwrap();
        Setup { dir, tier }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn config(&self) -> String {
        self.path("airlock.toml").display().to_string()
    }

    fn state(&self) -> String {
        self.path("state").display().to_string()
    }

    /// `airlock run` of the client with `lines`, under the class or a contract.
    fn run(&self, how: How<'_>, lines: &[String], probe: &[&str]) -> CellRun {
        let lines = serde_json::to_string(lines).unwrap();
        let mut argv = vec!["/usr/bin/python3", "-c", CLIENT_PY, &lines];
        argv.extend(probe);
        let (config, state) = (self.config(), self.state());
        let mut extra = vec!["--config", config.as_str(), "--state-dir", state.as_str()];
        match how {
            // The class's bounds put its runs on the tier (`class_bounds`).
            How::Class => {
                extra.extend(["--class", "casework"]);
                self.tier
                    .run_as_given_in(self.dir.path(), None, &extra, &argv)
            }
            How::Contract(yaml) => self.tier.run_in(self.dir.path(), Some(yaml), &extra, &argv),
        }
    }

    /// The payload's printed report.
    fn replies(run: &CellRun) -> Value {
        let line = run.stdout();
        serde_json::from_str(line.trim()).unwrap_or_else(|_| panic!("{}", run.describe()))
    }

    fn export(&self) -> String {
        let out = Command::new(common::airlock_bin())
            .args(["audit", "export", "--state-dir", &self.state()])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", common::output_text(&out));
        String::from_utf8(out.stdout).unwrap()
    }

    /// The `broker.action` events of the audit export, in order.
    fn broker_events(&self) -> Vec<Value> {
        self.export()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["kind"] == "broker.action")
            .collect()
    }
}

/// The bounds table `header` of a class whose runs must use `tier`.
fn class_bounds(tier: Tier, header: &str) -> String {
    format!("\n{header}\nisolation = \"{}\"\n", tier.name())
}

enum How<'a> {
    Class,
    Contract(&'a str),
}

/// `store_case_document` (store_artifact, for the class and contracts), `class_only`
/// (the class only), `notify` (a command with a secret of its own).
const CONFIG: &str = r#"
[policy]
approvers = ["uid:0"]

[policy.classes.casework]
description = "case work: may store documents for a case"

[policy.classes.casework.template]
broker_actions = ["store_case_document"]

[policy.classes.casework.commands]
default = "forbidden"
unmatched = "allow"

[[policy.classes.casework.commands.rules]]
pattern = ["rm", "-rf"]
decision = "forbidden"
match = ["rm -rf /"]
not_match = ["rm x"]

[broker.actions.store_case_document]
description = "store a generated document for a case"
classes = ["casework"]
contract = true
max_request_bytes = 4096

[broker.actions.store_case_document.schema]
type = "object"
required = ["case_id", "file_name", "content"]
additionalProperties = false
properties.case_id = { type = "string", pattern = "^[0-9]{1,10}$" }
properties.file_name = { type = "string", maxLength = 200 }
properties.content = { type = "string" }

[broker.actions.store_case_document.handler]
kind = "store_artifact"
directory = "STORAGE"
name_field = "file_name"
group_field = "case_id"

[broker.actions.class_only]
description = "only the casework class may ask"
classes = ["casework"]
schema = { type = "object" }
handler = { kind = "store_artifact", directory = "STORAGE" }

[broker.actions.notify]
description = "tell the case system a document is ready"
contract = true
schema = { type = "object", required = ["case_id"], properties.case_id = { type = "string" } }

[broker.actions.notify.handler]
kind = "command"
argv = ["/bin/sh", "-c", "cat > RECEIVED; printf '{\"token_chars\":%d}' \"${#CASE_TOKEN}\""]
env = { CASE_TOKEN = "tok-HANDLER-SECRET-1f6b" }
"#;

const HANDLER_SECRET: &str = "tok-HANDLER-SECRET-1f6b";

fn store_line(case_id: &str, file_name: &str, content: &str) -> String {
    json!({"action": "store_case_document",
           "request": {"file_name": file_name, "content": content, "case_id": case_id}})
    .to_string()
}

fn records(run: &CellRun) -> Vec<Value> {
    run.result["broker"].as_array().cloned().unwrap_or_default()
}

both_tiers! {
fn a_generated_pdf_lands_in_storage_through_the_broker_while_the_cell_cannot_reach_storage(tier) {
    require_cells!();
    let setup = Setup::new(tier);
    let storage = setup.path("storage");
    // The group directory exists, so the cell's direct write there is a real attempt.
    std::fs::create_dir(storage.join("4821")).unwrap();
    let line = store_line("4821", "report.pdf", PDF_BASE64);
    let storage_arg = storage.display().to_string();
    let run = setup.run(How::Class, &[line], &[&storage_arg]);
    assert_eq!(run.status(), "ok", "{}", run.describe());
    let printed = Setup::replies(&run);
    let reply = &printed["replies"][0];
    assert_eq!(reply["ok"], true, "{}", run.describe());
    assert_eq!(reply["result"]["stored"], "4821/report.pdf");
    assert_eq!(
        std::fs::read(storage.join("4821/report.pdf")).unwrap(),
        PDF_BYTES
    );
    for probe in [
        "list",
        "write",
        "write_group",
        "unlink_socket",
        "bind_beside",
    ] {
        assert_ne!(
            printed["probes"][probe],
            "reached",
            "the cell reached the storage directory or changed its socket ({probe}): {}",
            run.describe()
        );
    }
    assert!(!storage.join("direct.pdf").exists());
    assert!(!storage.join("4821/direct.pdf").exists());
    // Recorded with the hash of the canonical request (keys sorted, no whitespace).
    let canonical =
        format!(r#"{{"case_id":"4821","content":"{PDF_BASE64}","file_name":"report.pdf"}}"#);
    let record = &records(&run)[0];
    assert_eq!(record["decision"], "granted");
    assert_eq!(record["action"], "store_case_document");
    assert_eq!(record["request_sha256"], common::sha256_hex(&canonical));
    assert_eq!(record["stored_as"], "4821/report.pdf");
    assert_eq!(record["bytes"], PDF_BYTES.len());
    let events = setup.broker_events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        events[0]["body"]["request_sha256"],
        common::sha256_hex(&canonical)
    );
}
}

both_tiers! {
fn refused_requests_are_answered_with_their_reason_and_recorded(tier) {
    require_cells!();
    let setup = Setup::new(tier);
    let contract = "broker_actions: [store_case_document, class_only]\n";
    let lines = [
        store_line("48/21", "report.pdf", PDF_BASE64),
        json!({"action": "class_only", "request": {}}).to_string(),
        json!({"action": "drop_all_tables", "request": {}}).to_string(),
        // Defined by the operator, but not named by this run's contract.
        json!({"action": "notify", "request": {"case_id": "4821"}}).to_string(),
        store_line("4821", "../escape.pdf", PDF_BASE64),
        store_line("4821", "big.pdf", &"A".repeat(5000)),
        "this is not json".to_string(),
    ];
    let run = setup.run(How::Contract(contract), &lines, &[]);
    assert_eq!(run.status(), "ok", "{}", run.describe());
    let expected = [
        "broker.schema_invalid",
        "broker.class_not_allowed",
        "broker.unknown_action",
        "broker.not_named",
        "broker.name_invalid",
        "broker.too_large",
        "broker.malformed",
    ];
    let printed = Setup::replies(&run);
    let records = records(&run);
    let events = setup.broker_events();
    assert_eq!(records.len(), expected.len(), "{}", run.describe());
    assert_eq!(events.len(), expected.len(), "{events:?}");
    for (i, reason) in expected.iter().enumerate() {
        let reply = &printed["replies"][i];
        assert_eq!(reply["ok"], false, "{reply}");
        assert_eq!(reply["error"]["reason"], *reason, "{reply}");
        assert_eq!(records[i]["decision"], "denied");
        assert_eq!(records[i]["reason"], *reason);
        assert_eq!(events[i]["body"]["reason_code"], *reason);
        assert_eq!(events[i]["run_id"], run.result["run_id"]);
    }
    // None passes unseen: the run's summary line on stderr counts them.
    assert!(
        run.stderr()
            .contains("broker: 0 granted, 7 denied (broker.class_not_allowed x1"),
        "{}",
        run.describe()
    );
    let stored: Vec<_> = std::fs::read_dir(setup.path("storage")).unwrap().collect();
    assert!(stored.is_empty(), "nothing was stored: {stored:?}");
    assert!(!setup.path("escape.pdf").exists());
    assert!(
        !setup.path("received.json").exists(),
        "the unnamed action's handler never ran"
    );
}
}

both_tiers! {
fn the_command_handler_gets_the_validated_json_and_its_secret_never_reaches_the_cell(tier) {
    require_cells!();
    let setup = Setup::new(tier);
    let line = r#"{ "request": {"case_id": "4821"}, "action": "notify" }"#.to_string();
    let run = setup.run(
        How::Contract("broker_actions: [notify]\n"),
        &[line],
        &["", &HANDLER_SECRET.chars().rev().collect::<String>()],
    );
    assert_eq!(run.status(), "ok", "{}", run.describe());
    let printed = Setup::replies(&run);
    let reply = &printed["replies"][0];
    assert_eq!(reply["ok"], true, "{}", run.describe());
    // The handler saw its own variable (its length only comes back)...
    assert_eq!(
        reply["result"]["output"]["token_chars"],
        HANDLER_SECRET.len()
    );
    // ...and the canonical request on its stdin.
    let received = std::fs::read_to_string(setup.path("received.json")).unwrap();
    assert_eq!(received, "{\"case_id\":\"4821\"}\n");
    // The cell never held it: not in its environment, nor any /proc it could read.
    assert_eq!(
        printed["probes"]["secret_hits"],
        json!([]),
        "{}",
        run.describe()
    );
    let record = &records(&run)[0];
    assert_eq!(record["decision"], "granted");
    assert_eq!(record["exit_code"], 0);
    let everything = format!(
        "{}{}",
        serde_json::to_string(&run.result).unwrap(),
        setup.export()
    );
    assert!(
        !everything.contains(HANDLER_SECRET),
        "the secret is in a record"
    );
}
}

both_tiers! {
fn a_connection_after_the_run_ended_fails(tier) {
    require_cells!();
    let setup = Setup::new(tier);
    let run = setup.run(How::Contract("broker_actions: [notify]\n"), &[], &[]);
    assert_eq!(run.status(), "ok", "{}", run.describe());
    let socket = run.result["plan"]["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["kind"] == "broker_socket")
        .map(|m| PathBuf::from(m["source"].as_str().unwrap()))
        .unwrap_or_else(|| panic!("no broker socket in the plan: {}", run.describe()));
    assert!(!socket.exists(), "{} outlived its run", socket.display());
    assert!(std::os::unix::net::UnixStream::connect(&socket).is_err());
    let dir = socket.parent().unwrap();
    assert!(!dir.exists(), "{} outlived its run", dir.display());
    assert!(Path::new(&setup.state()).join("broker").is_dir());
}
}

both_tiers! {
fn a_run_whose_contract_names_no_action_has_no_socket_in_its_cell(tier) {
    require_cells!();
    let setup = Setup::new(tier);
    let script = "import os, json; print(json.dumps([os.path.exists('/run/airlock'), \
                  os.environ.get('AIRLOCK_BROKER')]))";
    let dir = setup.dir.path();
    let (config, state) = (setup.config(), setup.state());
    let extra = ["--config", config.as_str(), "--state-dir", state.as_str()];
    let run = tier.run_in(dir, None, &extra, &["/usr/bin/python3", "-c", script]);
    assert_eq!(run.status(), "ok", "{}", run.describe());
    assert_eq!(run.stdout().trim(), "[false, null]", "{}", run.describe());
    assert!(run.result["broker"].is_null(), "{}", run.describe());
}
}

both_tiers! {
fn a_contract_naming_an_action_the_operator_never_defined_is_refused(tier) {
    require_cells!();
    let setup = Setup::new(tier);
    let run = setup.run(How::Contract("broker_actions: [wire_money]\n"), &[], &[]);
    assert_eq!(run.status(), "policy_denied", "{}", run.describe());
    let error = run.result["error"].as_str().unwrap_or_default();
    assert!(error.contains("wire_money"), "{error}");
}
}

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

both_tiers! {
fn the_example_class_stores_the_example_payloads_pdf_for_case_4821(tier) {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let cases = dir.path().join("cases");
    std::fs::create_dir(&cases).unwrap();
    // The example class, its bounds putting its runs on this tier.
    let classes = dir.path().join("classes");
    std::fs::create_dir(&classes).unwrap();
    let class = std::fs::read_to_string(repo_file("examples/classes/case-documents.toml"))
        .unwrap()
        + &class_bounds(tier, "[bounds]");
    std::fs::write(classes.join("case-documents.toml"), class).unwrap();
    let config = std::fs::read_to_string(repo_file("examples/broker/airlock.toml"))
        .unwrap()
        .replace("/var/lib/airlock-cases", &cases.display().to_string())
        .replace(
            "classes_dir = \"../classes\"",
            &format!("classes_dir = {:?}", classes.display().to_string()),
        );
    let config_path = dir.path().join("airlock.toml");
    std::fs::write(&config_path, config).unwrap();
    let script =
        std::fs::read_to_string(repo_file("examples/broker/store_case_document.py")).unwrap();
    let (config, state) = (
        config_path.display().to_string(),
        dir.path().join("state").display().to_string(),
    );
    let extra = [
        "--config",
        config.as_str(),
        "--state-dir",
        state.as_str(),
        "--class",
        "case-documents",
    ];
    let argv = ["/usr/bin/python3", "-c", script.as_str(), "4821"];
    let run = tier.run_as_given_in(dir.path(), None, &extra, &argv);
    assert_eq!(run.status(), "ok", "{}", run.describe());
    let stored = std::fs::read(cases.join("4821/summary-4821.pdf")).unwrap();
    assert!(stored.starts_with(b"%PDF-1.4\n"), "{}", run.describe());
    assert!(stored.ends_with(b"%%EOF\n"));
    assert_eq!(records(&run)[0]["stored_as"], "4821/summary-4821.pdf");
}
}

/// gVisor only: this tests the tier's own route to the broker (its unix forwarder, with
/// `--host-uds=none` kept), which the native cell does not have (it binds the host socket
/// itself). With the broker's route up, the payload reaches no other host unix socket (a
/// live 0777 one in a read-only input), nor the broker's host socket by its host path;
/// it can neither kill the forwarder (the sandbox's root) nor replace its socket, and
/// the broker still answers afterwards. Every attempt that succeeds prints BREACH; the
/// script exits 0 only then.
#[test]
fn on_gvisor_the_broker_route_reaches_the_broker_and_no_other_host_socket() {
    require_cells!();
    let tier = Tier::Gvisor;
    let setup = Setup::new(tier);
    // Outside /tmp, which is a writable path of the sandbox.
    let inputs_dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let host_socket = inputs_dir.path().join("host.sock");
    let listener = std::os::unix::net::UnixListener::bind(&host_socket).unwrap();
    listener.set_nonblocking(true).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&host_socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    let broker_dir = Path::new(&setup.state()).join("broker");
    let script = format!(
        r#"
import os, signal, socket, sys, json
breach = False
def connect(path):
    s = socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect(path); return s
for path in ['{host}']:
    try:
        connect(path); print('BREACH host socket', path); breach = True
    except OSError as e:
        print('refused', path, e)
try:
    print('BREACH broker dir listed', os.listdir('{broker_dir}')); breach = True
except OSError as e:
    print('no broker dir', e)
pids = [p for p in os.listdir('/proc') if p.isdigit()
        and open('/proc/%s/cmdline' % p, 'rb').read().split(b'\0')[1:2] == [b'--airlock-gvisor-forward-unix']]
print('forwarders', pids)
if not pids:
    print('BREACH no forwarder found'); sys.exit(0)
for p in pids:
    try:
        os.kill(int(p), signal.SIGKILL); print('BREACH killed the forwarder'); breach = True
    except OSError as e:
        print('kill refused', e)
for what, attempt in [('unlink', lambda: os.unlink(os.environ['AIRLOCK_BROKER'])),
                      ('rename', lambda: os.rename(os.environ['AIRLOCK_BROKER'], '/run/airlock/x')),
                      ('chmod', lambda: os.chmod('/run/airlock', 0o777))]:
    try:
        attempt(); print('BREACH', what); breach = True
    except OSError as e:
        print(what, 'refused', e)
s = connect(os.environ['AIRLOCK_BROKER'])
s.sendall(b'{{"action": "notify", "request": {{"case_id": "4821"}}}}\n')
print('reply', s.makefile().readline().strip())
sys.exit(0 if breach else 1)
"#,
        host = host_socket.display(),
        broker_dir = broker_dir.display(),
    );
    let contract = format!(
        "broker_actions: [notify]\nfilesystem:\n  readonly_inputs:\n    - {}\n",
        inputs_dir.path().display()
    );
    let (config, state) = (setup.config(), setup.state());
    let extra = ["--config", config.as_str(), "--state-dir", state.as_str()];
    let run = tier.run_in(
        setup.dir.path(),
        Some(&contract),
        &extra,
        &["/usr/bin/python3", "-c", &script],
    );
    assert_eq!(
        run.code(),
        1,
        "a way around the broker:\n{}",
        run.describe()
    );
    assert!(!run.stdout().contains("BREACH"), "{}", run.describe());
    assert!(
        run.stdout().contains("reply {\"ok\": true") || run.stdout().contains("reply {\"ok\":true"),
        "the broker answered after the attempts: {}",
        run.describe()
    );
    assert!(
        listener.accept().is_err(),
        "a connection reached the host socket"
    );
    assert_eq!(records(&run).len(), 1, "{}", run.describe());
}
