//! Periodic verification in `airlock serve` (`[server.verify]`, docs/verify.md): every
//! configured class is verified at start-up and then every `interval_s`, each by
//! `airlock verify --class NAME` of this binary (the same suite an operator runs), and the
//! outcome goes to the service's board (crates/server/src/verification.rs), which holds
//! `/readyz` and refuses the class's runs while a failure is unacknowledged.

use airlock_server::verification::Verifications;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub struct Schedule {
    pub classes: Vec<String>,
    pub every: Duration,
    /// The service's configuration and store: the verifications use the same.
    pub config: Option<PathBuf>,
    pub state_dir: PathBuf,
}

impl Schedule {
    /// Every class to verify is a class of the configuration.
    pub fn check<T>(&self, classes: &BTreeMap<String, T>) -> anyhow::Result<()> {
        for class in &self.classes {
            if !classes.contains_key(class) {
                anyhow::bail!("server.verify.classes: no workload class {class} in [policy]");
            }
        }
        Ok(())
    }

    /// Verifies on a thread of its own, for the life of the service.
    pub fn start(self, board: Arc<Verifications>) {
        board.expect(&self.classes);
        std::thread::spawn(move || loop {
            let round = Instant::now();
            for class in &self.classes {
                let (passed, failed) = self.verify(class);
                board.record(class, passed, failed, now_ms());
            }
            std::thread::sleep(self.every.saturating_sub(round.elapsed()));
        });
    }

    /// One `airlock verify --class`: whether it passed, and the checks that failed (or
    /// why it could not run, which is a failure too).
    fn verify(&self, class: &str) -> (bool, Vec<String>) {
        let mut cmd = Command::new(match std::env::current_exe() {
            Ok(exe) => exe,
            Err(err) => return (false, vec![format!("airlock verify: {err}")]),
        });
        cmd.args([
            "verify",
            "--json",
            "--local",
            "--class",
            class,
            "--state-dir",
        ])
        .arg(&self.state_dir);
        if let Some(config) = &self.config {
            cmd.arg("--config").arg(config);
        }
        let out = cmd.stdin(Stdio::null()).stderr(Stdio::piped()).output();
        let out = match out {
            Ok(out) => out,
            Err(err) => return (false, vec![format!("airlock verify: {err}")]),
        };
        let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let failed: Vec<String> = (summary["checks"].as_array().into_iter().flatten())
            .filter(|c| c["verdict"] == "fail")
            .filter_map(|c| c["check"].as_str().map(str::to_string))
            .collect();
        let passed = out.status.success() && summary["passed"] == true;
        if !passed && failed.is_empty() {
            let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
            return (false, vec![format!("airlock verify did not run: {why}")]);
        }
        (passed, failed)
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
