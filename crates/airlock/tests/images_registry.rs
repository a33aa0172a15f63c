//! `airlock image pull` against a real OCI distribution server: Debian's
//! `docker-registry`, started by the test on 127.0.0.1 with TLS from a CA the test makes
//! (openssl), images pushed to it with `skopeo copy`. Pinned pulls, the tag rule, the CA
//! rule, a tampered blob and a registry account.

mod common;

use airlock_images::layout::{write_layout, NewImage};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

struct RegistryServer {
    child: Child,
    port: u16,
    storage: PathBuf,
    ca: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for RegistryServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA and a server certificate for 127.0.0.1 signed by it.
fn make_certs(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    run_ok(
        Command::new("openssl")
            .current_dir(dir)
            .args(["req", "-x509"])
            .args(ec)
            .args([
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-subj",
                "/CN=airlock test CA",
                "-days",
                "2",
            ]),
    );
    run_ok(
        Command::new("openssl")
            .current_dir(dir)
            .args(["req"])
            .args(ec)
            .args([
                "-keyout",
                "key.pem",
                "-out",
                "req.csr",
                "-subj",
                "/CN=127.0.0.1",
            ]),
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run_ok(Command::new("openssl").current_dir(dir).args([
        "x509",
        "-req",
        "-in",
        "req.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "cert.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]));
}

/// `htpasswd` (an account `airlock`/`s3cret`) makes the registry ask for Basic auth.
fn start_registry(htpasswd: bool) -> RegistryServer {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let port = common::free_port();
    let storage = dir.path().join("storage");
    let auth = if htpasswd {
        run_ok(
            Command::new("htpasswd")
                .args(["-Bbc"])
                .arg(dir.path().join("htpasswd"))
                .args(["airlock", "s3cret"]),
        );
        format!(
            "auth:\n  htpasswd:\n    realm: test\n    path: {}\n",
            dir.path().join("htpasswd").display()
        )
    } else {
        String::new()
    };
    let config = format!(
        "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n{auth}http:\n  addr: 127.0.0.1:{port}\n  tls:\n    certificate: {}\n    key: {}\n",
        storage.display(),
        dir.path().join("cert.pem").display(),
        dir.path().join("key.pem").display(),
    );
    std::fs::write(dir.path().join("config.yml"), config).unwrap();
    let child = Command::new("docker-registry")
        .arg("serve")
        .arg(dir.path().join("config.yml"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("docker-registry (apt install docker-registry)");
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "the registry did not start listening"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    RegistryServer {
        child,
        port,
        storage,
        ca: dir.path().join("ca.pem"),
        _dir: dir,
    }
}

fn layer(path: &str, content: &str) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_ustar();
    header.set_size(content.len() as u64);
    header.set_mode(0o644);
    builder
        .append_data(&mut header, path, content.as_bytes())
        .unwrap();
    builder.into_inner().unwrap()
}

/// Pushes a two-layer image as `127.0.0.1:PORT/<repo>:1`; returns the layer blob digests.
fn push(server: &RegistryServer, repo: &str, creds: bool) -> Vec<String> {
    let src = tempfile::tempdir().unwrap();
    let image = NewImage {
        name: None,
        layers: vec![
            layer("etc/os-release", "ID=test\n"),
            layer("app/tool.py", "print(1)\n"),
        ],
        gzip: true,
        defaults: Default::default(),
    };
    let written = write_layout(src.path(), &image).unwrap();
    let mut cmd = Command::new("skopeo");
    cmd.args(["--insecure-policy", "copy", "--dest-tls-verify=false"]);
    if creds {
        cmd.args(["--dest-creds", "airlock:s3cret"]);
    }
    cmd.arg(format!("oci:{}", src.path().display()))
        .arg(format!("docker://127.0.0.1:{}/{repo}:1", server.port));
    run_ok(&mut cmd);
    written
        .layer_blobs
        .iter()
        .map(|d| d.hex().to_string())
        .collect()
}

fn airlock(state: &Path, config: &str, args: &[&str]) -> Output {
    let config_path = state.with_extension("toml");
    std::fs::write(&config_path, config).unwrap();
    Command::new(common::airlock_bin())
        .args(["image", "--state-dir", state.to_str().unwrap()])
        .args(["--config", config_path.to_str().unwrap()])
        .args(args)
        .output()
        .unwrap()
}

use common::output_text as text;

fn ca_config(server: &RegistryServer, extra: &str) -> String {
    format!(
        "[images]\nca_file = {:?}\n{extra}",
        server.ca.display().to_string()
    )
}

#[test]
fn a_tag_is_resolved_once_when_allowed_and_the_digest_pulls_without_it() {
    require_cells!();
    let server = start_registry(false);
    push(&server, "tools", false);
    let root = tempfile::tempdir().unwrap();
    let reference = format!("127.0.0.1:{}/tools:1", server.port);

    let refused = airlock(
        &root.path().join("a"),
        &ca_config(&server, ""),
        &["pull", &reference],
    );
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("a tag without a digest"),
        "{}",
        text(&refused)
    );

    let allowed = airlock(
        &root.path().join("b"),
        &ca_config(&server, "allow_tags = true\n"),
        &["pull", &reference],
    );
    assert!(allowed.status.success(), "{}", text(&allowed));
    let pinned = String::from_utf8_lossy(&allowed.stdout).trim().to_string();
    assert!(
        pinned.starts_with(&format!("127.0.0.1:{}/tools@sha256:", server.port)),
        "{pinned}"
    );

    let state = root.path().join("c");
    let by_digest = airlock(&state, &ca_config(&server, ""), &["pull", &pinned]);
    assert!(by_digest.status.success(), "{}", text(&by_digest));
    assert_eq!(String::from_utf8_lossy(&by_digest.stdout).trim(), pinned);
    let inspected = airlock(&state, &ca_config(&server, ""), &["inspect", &pinned]);
    let record: serde_json::Value = serde_json::from_slice(&inspected.stdout).unwrap();
    let layers = record["layers"].as_array().unwrap();
    let top = layers[1]["diff_id"]
        .as_str()
        .unwrap()
        .strip_prefix("sha256:")
        .unwrap();
    let tool = state.join("images/layers").join(top).join("app/tool.py");
    assert_eq!(std::fs::read_to_string(tool).unwrap(), "print(1)\n");
}

#[test]
fn a_registry_whose_certificate_the_configured_ca_did_not_sign_is_refused() {
    require_cells!();
    let server = start_registry(false);
    push(&server, "tools", false);
    let state = tempfile::tempdir().unwrap();
    let reference = format!("127.0.0.1:{}/tools:1", server.port);
    // The Mozilla roots (no ca_file) do not include the test's CA.
    let out = airlock(
        &state.path().join("s"),
        "[images]\nallow_tags = true\n",
        &["pull", &reference],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(
        stderr.contains("certificate") || stderr.contains("issuer"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_tampered_layer_blob_on_the_registry_is_refused_and_nothing_recorded() {
    require_cells!();
    let server = start_registry(false);
    let blobs = push(&server, "tools", false);
    let root = tempfile::tempdir().unwrap();
    let reference = format!("127.0.0.1:{}/tools:1", server.port);
    let first = airlock(
        &root.path().join("a"),
        &ca_config(&server, "allow_tags = true\n"),
        &["pull", &reference],
    );
    assert!(first.status.success(), "{}", text(&first));
    let pinned = String::from_utf8_lossy(&first.stdout).trim().to_string();
    let hex = &blobs[1];
    let data = server
        .storage
        .join("docker/registry/v2/blobs/sha256")
        .join(&hex[..2])
        .join(hex)
        .join("data");
    let mut bytes = std::fs::read(&data).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 1;
    std::fs::write(&data, bytes).unwrap();
    let state = root.path().join("b");
    let out = airlock(&state, &ca_config(&server, ""), &["pull", &pinned]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("blob sha256:{hex}")) && stderr.contains("refused"),
        "{}",
        text(&out)
    );
    let listed = airlock(&state, &ca_config(&server, ""), &["ls", "--json"]);
    assert_eq!(String::from_utf8_lossy(&listed.stdout).trim(), "[]");
    assert!(!state.join("images/blobs/sha256").join(hex).exists());
}

#[test]
fn a_registry_account_from_the_config_answers_the_registrys_challenge() {
    require_cells!();
    let server = start_registry(true);
    push(&server, "private/tools", true);
    let root = tempfile::tempdir().unwrap();
    let reference = format!("127.0.0.1:{}/private/tools:1", server.port);
    let anonymous = airlock(
        &root.path().join("a"),
        &ca_config(&server, "allow_tags = true\n"),
        &["pull", &reference],
    );
    assert_eq!(anonymous.status.code(), Some(1), "{}", text(&anonymous));
    assert!(
        String::from_utf8_lossy(&anonymous.stderr).contains("[images.registries]"),
        "{}",
        text(&anonymous)
    );
    let password = root.path().join("password");
    std::fs::write(&password, "s3cret\n").unwrap();
    let account = format!(
        "allow_tags = true\n[images.registries.\"127.0.0.1:{}\"]\nusername = \"airlock\"\npassword_file = {:?}\n",
        server.port,
        password.display().to_string()
    );
    let out = airlock(
        &root.path().join("b"),
        &ca_config(&server, &account),
        &["pull", &reference],
    );
    assert!(out.status.success(), "{}", text(&out));
}
