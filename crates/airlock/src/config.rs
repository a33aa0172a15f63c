//! The operator's configuration (`--config airlock.toml`). Trusted: it comes from whoever
//! runs airlock, never from the contract or the model.

use anyhow::Context;
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OperatorConfig {
    /// Upstream resolvers, static host map, exempt CIDRs, upstream proxy, ceilings.
    pub egress: airlock_egress::EgressConfig,
    pub store: StoreConfig,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Where the audit store lives (overridden by `--state-dir`).
    pub state_dir: Option<PathBuf>,
}

impl OperatorConfig {
    pub fn load(path: Option<&Path>) -> anyhow::Result<OperatorConfig> {
        let Some(path) = path else {
            return Ok(OperatorConfig::default());
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("config {}", path.display()))
    }

    /// `--state-dir`, else the config's, else the documented default.
    pub fn state_dir(&self, flag: Option<&Path>) -> PathBuf {
        flag.map(Path::to_path_buf)
            .or_else(|| self.store.state_dir.clone())
            .unwrap_or_else(airlock_store::default_state_dir)
    }
}
