//! A throw-away Postgres server for tests of the fleet backend (`[store] url`): initdb in
//! a temporary directory, the server on a unix socket in it and on 127.0.0.1 at a free
//! port, stopped (and its directory removed) when the guard drops, also on a panic.
//!
//! The binaries are Debian's `postgresql` package's (`/usr/lib/postgresql/<major>/bin`,
//! not on PATH; `AIRLOCK_TEST_PG_BIN` names another directory). Postgres refuses to run
//! as root, so as root the server runs as the `postgres` user (or `nobody`) through
//! `setpriv`. Without the binaries the test fails, naming the package to install, unless
//! `AIRLOCK_ALLOW_SKIPPED_ROOT_TESTS` is set and `AIRLOCK_REQUIRE_ROOT_TESTS` is not
//! (the convention of crates/airlock/tests/common).
//!
//! Shared with crates/airlock/tests through `#[path]`: std only, no crate of ours.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct PgServer {
    /// Owned by the server's user; removed after the server stopped.
    dir: PathBuf,
    pub bin: PathBuf,
    pub port: u16,
    server: Option<Child>,
    /// The postmaster's arguments, for [`PgServer::restart`].
    server_args: Vec<String>,
}

/// The directory of `initdb`, `postgres`, `psql`; `None` when Postgres is not installed.
pub fn find_bin() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("AIRLOCK_TEST_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut majors: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let major = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((major, bin))
        })
        .collect();
    majors.sort();
    majors.pop().map(|(_, bin)| bin)
}

/// Postgres's binaries, or the test's decision when there are none: a panic naming the
/// package, or `None` (skip) when skipping was asked for.
pub fn bin_or_skip() -> Option<PathBuf> {
    if let Some(bin) = find_bin() {
        return Some(bin);
    }
    let set = |v| std::env::var_os(v).is_some();
    if set("AIRLOCK_ALLOW_SKIPPED_ROOT_TESTS") && !set("AIRLOCK_REQUIRE_ROOT_TESTS") {
        eprintln!("SKIPPED: no Postgres server binaries (apt-get install postgresql)");
        return None;
    }
    panic!(
        "this test starts a Postgres server and found no binaries in /usr/lib/postgresql/*/bin \
         (apt-get install postgresql, or set AIRLOCK_TEST_PG_BIN)"
    );
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        == Some("0")
}

/// As root: the unprivileged account the server runs as, `(name, uid, gid)`.
fn server_account() -> (String, u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    for name in ["postgres", "nobody"] {
        if let Some(line) = passwd.lines().find(|l| l.starts_with(&format!("{name}:"))) {
            let f: Vec<&str> = line.split(':').collect();
            return (name.into(), f[2].parse().unwrap(), f[3].parse().unwrap());
        }
    }
    panic!("no postgres or nobody account to run the test's Postgres server as");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A test CA and a server certificate it signed, made with the openssl CLI, and a second
/// CA that signed nothing of this server's.
pub struct TestPki {
    pub ca: PathBuf,
    pub other_ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
}

/// Run openssl with `args` in `dir`; panics with its output when it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("the openssl CLI (apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl TestPki {
    /// In `dir`: `ca.pem` (and `other-ca.pem`), and `server.pem`/`server.key` for the
    /// DNS names and IP addresses `names` (`DNS:...`/`IP:...` entries of subjectAltName).
    pub fn make(dir: &Path, names: &[String]) -> TestPki {
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ];
        for ca in ["ca", "other-ca"] {
            let (key, pem, subject) = (
                format!("{ca}.key"),
                format!("{ca}.pem"),
                format!("/CN=airlock test {ca}"),
            );
            let mut args = vec!["req", "-x509"];
            args.extend(ec);
            args.extend([
                "-keyout",
                &key,
                "-out",
                &pem,
                "-days",
                "2",
                "-subj",
                &subject,
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ]);
            openssl(dir, &args);
        }
        let mut args = vec!["req"];
        args.extend(ec);
        args.extend([
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=airlock test database",
        ]);
        openssl(dir, &args);
        std::fs::write(
            dir.join("server.ext"),
            format!(
                "subjectAltName={}\nbasicConstraints=CA:FALSE\n\
                 keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
                names.join(",")
            ),
        )
        .unwrap();
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.pem",
                "-days",
                "2",
                "-extfile",
                "server.ext",
            ],
        );
        TestPki {
            ca: dir.join("ca.pem"),
            other_ca: dir.join("other-ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
        }
    }
}

/// This machine's first IPv4 address that is not a loopback one (`ip -4 -o addr`), if it
/// has one: a test can then reach its own Postgres over a real non-loopback address.
pub fn non_loopback_ipv4() -> Option<std::net::Ipv4Addr> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let cidr = l.split_whitespace().skip_while(|w| *w != "inet").nth(1)?;
            cidr.split('/').next()?.parse::<std::net::Ipv4Addr>().ok()
        })
        .find(|a| !a.is_loopback())
}

/// How a server is started beyond the defaults.
#[derive(Default)]
pub struct ServerOptions {
    /// More TCP addresses to listen on (beside 127.0.0.1), each reachable only over TLS
    /// (`hostssl` in pg_hba.conf).
    pub tls_only_addresses: Vec<String>,
    /// `ssl=on` with this server certificate.
    pub tls: Option<TlsFiles>,
    /// Clients of `tls_only_addresses` authenticate with a SCRAM password (else: trust).
    pub scram: bool,
}

pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestPki {
    pub fn server_files(&self) -> TlsFiles {
        TlsFiles {
            cert: self.server_cert.clone(),
            key: self.server_key.clone(),
        }
    }
}

impl PgServer {
    /// Start a fresh server; `None` only when the binaries are missing and skipping was
    /// asked for ([`bin_or_skip`]).
    pub fn start() -> Option<PgServer> {
        Self::start_with(ServerOptions::default())
    }

    /// [`Self::start`] with `options`.
    pub fn start_with(options: ServerOptions) -> Option<PgServer> {
        let bin = bin_or_skip()?;
        let dir = std::env::temp_dir().join(format!(
            "airlock-pg-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir(&dir).unwrap();
        let mut server = PgServer {
            dir,
            bin,
            port: free_port(),
            server: None,
            server_args: Vec::new(),
        };
        if is_root() {
            let (_, uid, gid) = server_account();
            let status = Command::new("chown")
                .arg(format!("{uid}:{gid}"))
                .arg(&server.dir)
                .status()
                .unwrap();
            assert!(status.success(), "chown of the Postgres test directory");
        }
        let data = server.dir.join("data");
        let out = server
            .as_server_user(&server.bin.join("initdb"))
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
                "-D",
            ])
            .arg(&data)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let tls_args = server.install_tls(&data, &options);
        let log = std::fs::File::create(server.dir.join("server.log")).unwrap();
        drop(log);
        if is_root() {
            let (_, uid, gid) = server_account();
            let _ = Command::new("chown")
                .arg(format!("{uid}:{gid}"))
                .arg(server.dir.join("server.log"))
                .status();
        }
        let mut args = vec![
            "-D".to_string(),
            data.display().to_string(),
            "-k".to_string(),
            server.dir.display().to_string(),
            "-p".to_string(),
            server.port.to_string(),
            "-c".to_string(),
            format!(
                "listen_addresses={}",
                std::iter::once("127.0.0.1".to_string())
                    .chain(options.tls_only_addresses.iter().cloned())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        ];
        args.extend(tls_args);
        // Small and fast: many tests start one at once, and nothing here must survive a crash.
        for setting in ["fsync=off", "max_connections=200", "shared_buffers=16MB"] {
            args.extend(["-c".to_string(), setting.to_string()]);
        }
        server.server_args = args;
        server.spawn_postmaster();
        server.wait_ready();
        Some(server)
    }

    /// Starts the postmaster with [`Self::server_args`], its output appended to the log.
    fn spawn_postmaster(&mut self) {
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.join("server.log"))
            .unwrap();
        let child = self
            .as_server_user(&self.bin.join("postgres"))
            .args(&self.server_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.server = Some(child);
    }

    /// `pg_ctl stop -m fast`: the server ends every session and stops.
    pub fn stop_fast(&mut self) {
        let out = self
            .as_server_user(&self.bin.join("pg_ctl"))
            .args(["stop", "-m", "fast", "-w", "-D"])
            .arg(self.dir.join("data"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl stop: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if let Some(mut child) = self.server.take() {
            let _ = child.wait();
        }
    }

    /// SIGKILL of the postmaster: a crash. Its backends notice and end on their own.
    pub fn kill_postmaster(&mut self) {
        if let Some(mut child) = self.server.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same data, port and socket (after [`Self::stop_fast`]
    /// or [`Self::kill_postmaster`]: a crashed one recovers first), and waits until it
    /// answers. Retried while the killed postmaster's backends still hold its shared
    /// memory.
    pub fn restart(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            self.spawn_postmaster();
            std::thread::sleep(Duration::from_millis(300));
            match self.server.as_mut().unwrap().try_wait().unwrap() {
                None => break,
                Some(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(200))
                }
                Some(status) => panic!(
                    "the Postgres test server did not restart ({status}): {}",
                    self.log()
                ),
            }
        }
        self.wait_ready();
    }

    /// The certificate and key in the data directory (the server's user owns them, the
    /// key is 0600: Postgres refuses a key others can read), `hostssl` lines for the extra
    /// addresses; the server's arguments for them.
    fn install_tls(&self, data: &Path, options: &ServerOptions) -> Vec<String> {
        use std::io::Write;
        use std::os::unix::fs::PermissionsExt;
        let mut hba = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("pg_hba.conf"))
            .unwrap();
        for addr in &options.tls_only_addresses {
            let method = if options.scram {
                "scram-sha-256"
            } else {
                "trust"
            };
            writeln!(hba, "hostssl all all {addr}/32 {method}").unwrap();
        }
        let Some(tls) = &options.tls else {
            return Vec::new();
        };
        let (cert, key) = (data.join("server.crt"), data.join("server.key"));
        std::fs::copy(&tls.cert, &cert).unwrap();
        std::fs::copy(&tls.key, &key).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        if is_root() {
            let (_, uid, gid) = server_account();
            let status = Command::new("chown")
                .arg(format!("{uid}:{gid}"))
                .arg(&cert)
                .arg(&key)
                .status()
                .unwrap();
            assert!(status.success(), "chown of the test server's certificate");
        }
        vec![
            "-c".into(),
            "ssl=on".into(),
            "-c".into(),
            format!("ssl_cert_file={}", cert.display()),
            "-c".into(),
            format!("ssl_key_file={}", key.display()),
        ]
    }

    /// The `psql` output of `sql` on `db` (see [`Self::psql`]), as a user of the server.
    pub fn tls_connections(&self, db: &str, application: &str) -> String {
        self.psql(
            db,
            &format!(
                "SELECT s.ssl, a.client_addr FROM pg_stat_ssl s JOIN pg_stat_activity a \
                 ON a.pid = s.pid WHERE a.application_name = '{application}' AND a.datname = '{db}'"
            ),
        )
    }

    fn as_server_user(&self, program: &Path) -> Command {
        if !is_root() {
            return Command::new(program);
        }
        let (_, uid, gid) = server_account();
        let mut c = Command::new("setpriv");
        c.arg(format!("--reuid={uid}"))
            .arg(format!("--regid={gid}"))
            .arg("--clear-groups")
            .arg("--")
            .arg(program)
            // The server's cwd must be readable by its user.
            .current_dir(&self.dir);
        c
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = Command::new(self.bin.join("pg_isready"))
                .arg("-h")
                .arg(&self.dir)
                .args(["-p", &self.port.to_string(), "-q"])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return;
            }
            if let Some(status) = self.server.as_mut().unwrap().try_wait().unwrap() {
                panic!("the Postgres test server exited ({status}): {}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "the Postgres test server is not ready after 60 s: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// The unix socket directory.
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    /// A URL through the unix socket.
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://postgres@/{db}?host={}&port={}",
            self.dir.display(),
            self.port
        )
    }

    /// A URL through 127.0.0.1.
    pub fn tcp_url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Run SQL with psql (on database `db`); its output, unaligned, tuples only. Panics
    /// when psql fails.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .arg("-h")
            .arg(&self.dir)
            .args(["-p", &self.port.to_string(), "-U", "postgres", "-d", db])
            .args(["-v", "ON_ERROR_STOP=1", "-X", "-A", "-t", "-c", sql])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "psql {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    /// A new, empty database.
    pub fn create_db(&self, name: &str) -> String {
        self.psql("postgres", &format!("CREATE DATABASE \"{name}\""));
        self.url(name)
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.server.take() {
            // SIGINT: Postgres's fast shutdown (no waiting for clients). setpriv execs, so
            // the child is the postmaster itself.
            let _ = Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
