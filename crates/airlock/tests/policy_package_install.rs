//! The package-install class end to end (issue 14, item 7): a wheel built at test time
//! with `pip wheel`, served by a loopback PEP 503 simple index standing for the
//! operator's mirror; the build step (class `package-install`) reaches only the mirror,
//! installs only with `--require-hashes` (anything else is refused before a cell
//! exists), and its environment leaves as a declared artifact; the run step (class
//! `package-run`) mounts it read-only and has no network.

mod common;

use common::airlock_bin;
use sha2::{Digest, Sha256};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const PYTHON: &str = "/usr/bin/python3";

fn repo_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(name)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Builds `tinypkg-0.1-py3-none-any.whl` in `dir/dist` with `pip wheel`.
fn build_wheel(dir: &Path) -> PathBuf {
    let src = dir.join("tinypkg-src");
    std::fs::create_dir_all(src.join("tinypkg")).unwrap();
    std::fs::write(
        src.join("pyproject.toml"),
        "[build-system]\nrequires = [\"setuptools\"]\nbuild-backend = \"setuptools.build_meta\"\n\n\
         [project]\nname = \"tinypkg\"\nversion = \"0.1\"\n",
    )
    .unwrap();
    std::fs::write(
        src.join("tinypkg/__init__.py"),
        "VALUE = 'installed-from-mirror'\n",
    )
    .unwrap();
    let out = Command::new(PYTHON)
        .args([
            "-m",
            "pip",
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "--no-index",
            "-w",
        ])
        .arg(dir.join("dist"))
        .arg(&src)
        .output()
        .unwrap();
    assert!(out.status.success(), "pip wheel: {}", text(&out.stderr));
    let wheel = dir.join("dist/tinypkg-0.1-py3-none-any.whl");
    assert!(wheel.is_file(), "{}", text(&out.stdout));
    wheel
}

/// A PEP 503 simple index of the wheel, served on 127.0.0.2 by a thread; its port.
fn serve_index(wheel: &Path) -> (u16, String) {
    let bytes = std::fs::read(wheel).unwrap();
    let digest = hex::encode(Sha256::digest(&bytes));
    let name = wheel.file_name().unwrap().to_str().unwrap().to_string();
    let page = format!(
        "<!DOCTYPE html><html><body><a href=\"/files/{name}#sha256={digest}\">{name}</a></body></html>\n"
    );
    let listener = TcpListener::bind("127.0.0.2:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream);
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            let mut header = String::new();
            while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
                header.clear();
            }
            let path = request_line.split_whitespace().nth(1).unwrap_or("");
            let (status, body, kind): (&str, Vec<u8>, &str) = match path {
                "/simple/tinypkg/" | "/simple/tinypkg" => {
                    ("200 OK", page.clone().into_bytes(), "text/html")
                }
                p if p == format!("/files/{name}") => {
                    ("200 OK", bytes.clone(), "application/octet-stream")
                }
                _ => ("404 Not Found", b"not found\n".to_vec(), "text/plain"),
            };
            let mut stream = reader.into_inner();
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream
                .write_all(head.as_bytes())
                .and_then(|_| stream.write_all(&body));
        }
    });
    (port, digest)
}

struct Flow {
    dir: tempfile::TempDir,
    port: u16,
}

impl Flow {
    fn config(&self) -> String {
        self.dir.path().join("airlock.toml").display().to_string()
    }

    /// `airlock run --class CLASS [extra] -- argv` with the flow's config and state.
    fn run(&self, class: &str, extra: &[&str], argv: &[&str]) -> Output {
        let state = self.dir.path().join("state");
        Command::new(airlock_bin())
            .args(["run", "--config", &self.config(), "--state-dir"])
            .arg(&state)
            .args(["--class", class])
            .args(extra)
            .arg("--")
            .args(argv)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn request(&self, name: &str, json: String) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, json).unwrap();
        path.display().to_string()
    }
}

/// The example classes, with the mirror's port and the test's directories in place of
/// the operator's; the mirror's name resolves to the loopback index.
fn set_up() -> Flow {
    let dir = tempfile::tempdir().unwrap();
    let wheel = build_wheel(dir.path());
    let (port, digest) = serve_index(&wheel);
    let locks = dir.path().join("locks");
    std::fs::create_dir_all(&locks).unwrap();
    std::fs::write(
        locks.join("requirements.txt"),
        format!("tinypkg==0.1 --hash=sha256:{digest}\n"),
    )
    .unwrap();
    let classes = dir.path().join("classes");
    std::fs::create_dir_all(&classes).unwrap();
    let install =
        std::fs::read_to_string(repo_file("examples/classes/package-install.toml")).unwrap();
    let install = install
        .replace("pypi.mirror.test:8080", &format!("pypi.mirror.test:{port}"))
        .replace("/srv/locks", locks.to_str().unwrap());
    std::fs::write(classes.join("package-install.toml"), install).unwrap();
    let run = std::fs::read_to_string(repo_file("examples/classes/package-run.toml")).unwrap();
    let envs = dir.path().join("delivered");
    let run = run.replace("/srv/envs", envs.to_str().unwrap());
    std::fs::write(classes.join("package-run.toml"), run).unwrap();
    std::fs::write(
        dir.path().join("airlock.toml"),
        "[policy]\nclasses_dir = \"classes\"\n\n[egress]\nresolve = { \"pypi.mirror.test\" = \"127.0.0.2\", \"npm.mirror.test\" = \"127.0.0.2\" }\n\
         exempt_cidrs = [\"127.0.0.2/32\"]\n",
    )
    .unwrap();
    Flow { dir, port }
}

#[test]
fn an_install_without_hashes_is_refused_before_a_cell() {
    let flow = set_up();
    let req = flow.request(
        "req.json",
        format!(
            r#"{{"inputs": [{{"source": "{}", "target": "/lock"}}]}}"#,
            flow.dir.path().join("locks").display()
        ),
    );
    for argv in [
        &[
            "python3",
            "-m",
            "pip",
            "install",
            "-r",
            "/lock/requirements.txt",
        ][..],
        &["pip", "install", "tinypkg"],
        &[
            "sh",
            "-c",
            "pip install --require-hashes -r /lock/requirements.txt; pip install tinypkg",
        ],
    ] {
        let out = flow.run("package-install", &["--request", &req], argv);
        assert_eq!(
            out.status.code(),
            Some(125),
            "{argv:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains("policy.command_forbidden"),
            "{}",
            text(&out.stderr)
        );
    }
}

#[test]
fn the_build_step_installs_from_the_mirror_and_the_run_step_uses_it_without_network() {
    require_cells!();
    let flow = set_up();
    let locks = flow.dir.path().join("locks");
    let delivered = flow.dir.path().join("delivered");
    let build_req = flow.request(
        "build.json",
        format!(
            r#"{{"inputs": [{{"source": "{}", "target": "/lock"}}]}}"#,
            locks.display()
        ),
    );
    let index = format!("http://pypi.mirror.test:{}/simple", flow.port);
    let built = flow.run(
        "package-install",
        &[
            "--request",
            &build_req,
            "--output-dir",
            delivered.to_str().unwrap(),
        ],
        &[
            "python3",
            "-m",
            "pip",
            "install",
            "--require-hashes",
            "--no-deps",
            "-r",
            "/lock/requirements.txt",
            "--index-url",
            &index,
            "--trusted-host",
            "pypi.mirror.test",
            "--target",
            "/out/env",
        ],
    );
    assert_eq!(
        built.status.code(),
        Some(0),
        "build: {}\n{}",
        text(&built.stdout),
        text(&built.stderr)
    );
    let env = delivered.join("out/env");
    assert!(
        env.join("tinypkg/__init__.py").is_file(),
        "the environment left as an artifact"
    );

    let run_req = flow.request(
        "run.json",
        format!(
            r#"{{"inputs": [{{"source": "{}", "target": "/env"}}]}}"#,
            env.display()
        ),
    );
    let used = flow.run(
        "package-run",
        &["--request", &run_req],
        &[
            "python3",
            "-c",
            "import sys; sys.path.insert(0, '/env'); import tinypkg; print(tinypkg.VALUE)",
        ],
    );
    assert_eq!(used.status.code(), Some(0), "run: {}", text(&used.stderr));
    assert_eq!(text(&used.stdout), "installed-from-mirror\n");

    // The run step cannot reach the mirror (nor resolve its name), and cannot write the
    // environment it was given.
    let probe = format!(
        "import socket\n\
         try:\n    socket.create_connection(('127.0.0.2', {}), timeout=5); print('connected')\n\
         except OSError as e:\n    print('refused', e.errno)\n\
         try:\n    socket.getaddrinfo('pypi.mirror.test', 80); print('resolved')\n\
         except OSError:\n    print('unresolved')\n\
         try:\n    open('/env/tinypkg/x', 'w'); print('wrote')\n\
         except OSError:\n    print('read-only')\n",
        flow.port
    );
    let isolated = flow.run(
        "package-run",
        &["--request", &run_req],
        &["python3", "-c", &probe],
    );
    assert_eq!(
        isolated.status.code(),
        Some(0),
        "{}",
        text(&isolated.stderr)
    );
    let out = text(&isolated.stdout);
    assert!(out.starts_with("refused"), "{out}");
    assert!(
        out.contains("unresolved") && out.contains("read-only"),
        "{out}"
    );
}

/// `tinynpm-1.0.0.tgz`, packed at test time with `npm pack`; its `integrity` (sha512).
fn pack_npm_package(dir: &Path) -> (PathBuf, String) {
    let src = dir.join("tinynpm-src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(
        src.join("package.json"),
        r#"{"name": "tinynpm", "version": "1.0.0", "main": "index.js"}"#,
    )
    .unwrap();
    std::fs::write(
        src.join("index.js"),
        "module.exports = 'installed-from-npm-mirror';\n",
    )
    .unwrap();
    let out = Command::new("npm")
        .args(["pack", "--silent", "--pack-destination"])
        .arg(dir)
        .current_dir(&src)
        .env("npm_config_cache", dir.join("npm-cache"))
        .output()
        .expect("npm (apt install npm)");
    assert!(out.status.success(), "npm pack: {}", text(&out.stderr));
    let tarball = dir.join("tinynpm-1.0.0.tgz");
    let digest = Command::new(PYTHON)
        .args([
            "-c",
            "import base64, hashlib, sys; \
             print(base64.b64encode(hashlib.sha512(open(sys.argv[1], 'rb').read()).digest()).decode())",
        ])
        .arg(&tarball)
        .output()
        .unwrap();
    (tarball, format!("sha512-{}", text(&digest.stdout).trim()))
}

/// A registry of that one tarball, on 127.0.0.2 (a thread); its port and the paths
/// asked for.
fn serve_npm_registry(tarball: &Path) -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let bytes = std::fs::read(tarball).unwrap();
    let listener = TcpListener::bind("127.0.0.2:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = std::sync::Arc::clone(&asked);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream);
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            let mut header = String::new();
            while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
                header.clear();
            }
            let path = request_line
                .split_whitespace()
                .nth(1)
                .unwrap_or("")
                .to_string();
            log.lock().unwrap().push(path.clone());
            let (status, body) = match path.as_str() {
                "/tinynpm/-/tinynpm-1.0.0.tgz" => ("200 OK", bytes.clone()),
                _ => ("404 Not Found", b"{}".to_vec()),
            };
            let mut stream = reader.into_inner();
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream
                .write_all(head.as_bytes())
                .and_then(|_| stream.write_all(&body));
        }
    });
    (port, asked)
}

/// The example classes with the npm mirror at `port`, and a locked project needing
/// `tinynpm` in `dir/npm-lock` (its lockfile pins the tarball by `integrity`).
fn set_up_npm() -> (Flow, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let dir = tempfile::tempdir().unwrap();
    let (tarball, integrity) = pack_npm_package(dir.path());
    let (port, asked) = serve_npm_registry(&tarball);
    let lock = dir.path().join("locks/npm-lock");
    std::fs::create_dir_all(&lock).unwrap();
    std::fs::write(
        lock.join("package.json"),
        r#"{"name": "app", "version": "1.0.0", "dependencies": {"tinynpm": "1.0.0"}}"#,
    )
    .unwrap();
    let locked = serde_json::json!({
        "name": "app", "version": "1.0.0", "lockfileVersion": 3, "requires": true,
        "packages": {
            "": {"name": "app", "version": "1.0.0", "dependencies": {"tinynpm": "1.0.0"}},
            "node_modules/tinynpm": {
                "version": "1.0.0",
                "resolved": format!("http://npm.mirror.test:{port}/tinynpm/-/tinynpm-1.0.0.tgz"),
                "integrity": integrity,
            },
        },
    });
    std::fs::write(lock.join("package-lock.json"), locked.to_string()).unwrap();
    let unlocked = dir.path().join("locks/unlocked");
    std::fs::create_dir_all(&unlocked).unwrap();
    std::fs::copy(lock.join("package.json"), unlocked.join("package.json")).unwrap();
    let unhashed = dir.path().join("locks/unhashed");
    std::fs::create_dir_all(&unhashed).unwrap();
    let mut without = locked.clone();
    without["packages"]["node_modules/tinynpm"]
        .as_object_mut()
        .unwrap()
        .remove("integrity");
    std::fs::write(unhashed.join("package-lock.json"), without.to_string()).unwrap();
    let classes = dir.path().join("classes");
    std::fs::create_dir_all(&classes).unwrap();
    let install =
        std::fs::read_to_string(repo_file("examples/classes/package-install.toml")).unwrap();
    let install = install
        .replace("npm.mirror.test:8081", &format!("npm.mirror.test:{port}"))
        .replace("/srv/locks", dir.path().join("locks").to_str().unwrap());
    std::fs::write(classes.join("package-install.toml"), install).unwrap();
    let run = std::fs::read_to_string(repo_file("examples/classes/package-run.toml")).unwrap();
    let envs = dir.path().join("delivered");
    let run = run.replace("/srv/envs", envs.to_str().unwrap());
    std::fs::write(classes.join("package-run.toml"), run).unwrap();
    std::fs::write(
        dir.path().join("airlock.toml"),
        "[policy]\nclasses_dir = \"classes\"\n\n[egress]\nresolve = { \"npm.mirror.test\" = \"127.0.0.2\", \"pypi.mirror.test\" = \"127.0.0.2\" }\n\
         exempt_cidrs = [\"127.0.0.2/32\"]\n",
    )
    .unwrap();
    (Flow { dir, port }, asked)
}

/// The build step's command: the locked project into `/out/env`, then `npm ci` there.
const NPM_CI: &str =
    "mkdir -p /out/env && cp /lock/package.json /lock/package-lock.json /out/env/ \
                      && npm ci --prefix /out/env";

#[test]
fn npm_ci_without_a_lockfile_of_hashes_is_refused_before_a_cell() {
    let (flow, asked) = set_up_npm();
    for (lock, expected) in [
        ("unlocked", "npm ci needs a package-lock.json"),
        (
            "unhashed",
            "node_modules/tinynpm: no sha512/sha384 `integrity` hash",
        ),
    ] {
        let req = flow.request(
            &format!("{lock}.json"),
            format!(
                r#"{{"inputs": [{{"source": "{}", "target": "/lock"}}]}}"#,
                flow.dir.path().join("locks").join(lock).display()
            ),
        );
        let out = flow.run(
            "package-install",
            &["--request", &req],
            &["sh", "-c", NPM_CI],
        );
        assert_eq!(
            out.status.code(),
            Some(125),
            "{lock}: {}",
            text(&out.stderr)
        );
        let stderr = text(&out.stderr);
        assert!(stderr.contains("policy.lockfile_missing"), "{stderr}");
        assert!(stderr.contains(expected), "{stderr}");
    }
    let out = flow.run("package-install", &[], &["npm", "install", "tinynpm"]);
    assert!(text(&out.stderr).contains("policy.command_forbidden"));
    assert!(
        asked.lock().unwrap().is_empty(),
        "nothing reached the mirror"
    );
}

#[test]
fn npm_ci_installs_from_the_mirror_and_the_run_step_uses_node_modules_without_network() {
    require_cells!();
    let (flow, asked) = set_up_npm();
    let delivered = flow.dir.path().join("delivered");
    let build_req = flow.request(
        "build.json",
        format!(
            r#"{{"inputs": [{{"source": "{}", "target": "/lock"}}]}}"#,
            flow.dir.path().join("locks/npm-lock").display()
        ),
    );
    let built = flow.run(
        "package-install",
        &[
            "--request",
            &build_req,
            "--output-dir",
            delivered.to_str().unwrap(),
        ],
        &["sh", "-c", NPM_CI],
    );
    assert_eq!(
        built.status.code(),
        Some(0),
        "build: {}\n{}",
        text(&built.stdout),
        text(&built.stderr)
    );
    assert!(
        asked
            .lock()
            .unwrap()
            .contains(&"/tinynpm/-/tinynpm-1.0.0.tgz".to_string()),
        "the tarball came from the mirror"
    );
    let env = delivered.join("out/env");
    assert!(
        env.join("node_modules/tinynpm/index.js").is_file(),
        "node_modules left as an artifact"
    );
    let run_req = flow.request(
        "run.json",
        format!(
            r#"{{"inputs": [{{"source": "{}", "target": "/env"}}]}}"#,
            env.display()
        ),
    );
    let script = format!(
        "console.log(require('/env/node_modules/tinynpm'));\n\
         const s = require('net').connect({}, '127.0.0.2');\n\
         s.on('connect', () => {{ console.log('connected'); process.exit(0); }});\n\
         s.on('error', (e) => {{ console.log('refused ' + e.code); \
           try {{ require('fs').writeFileSync('/env/node_modules/x', 'x'); console.log('wrote'); }} \
           catch (w) {{ console.log('read-only'); }} }});\n",
        flow.port
    );
    let used = flow.run(
        "package-run",
        &["--request", &run_req],
        &["node", "-e", &script],
    );
    assert_eq!(used.status.code(), Some(0), "run: {}", text(&used.stderr));
    let out = text(&used.stdout);
    assert!(
        out.starts_with("installed-from-npm-mirror\nrefused "),
        "{out}"
    );
    assert!(out.ends_with("read-only\n"), "{out}");
}
