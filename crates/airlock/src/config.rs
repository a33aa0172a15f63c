//! The operator's configuration (`--config airlock.toml`). Trusted: it comes from whoever
//! runs airlock, never from the contract or the model. Every key, default and bound is in
//! docs/config.md; docs/config.schema.json is generated from these types.

use airlock_cell::host_identity::HostIdRange;
use anyhow::{bail, Context};
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct OperatorConfig {
    /// Upstream resolvers, static host map, exempt CIDRs, upstream proxy, ceilings.
    pub egress: airlock_egress::EgressConfig,
    pub store: StoreConfig,
    /// OCI images as cell roots: the default registry and the unpacker's ceilings.
    pub images: ImagesConfig,
    pub host_ids: HostIdsConfig,
    /// Workload classes, the approvers of requests that need approval (docs/policy.md).
    pub policy: airlock_policy::PolicyConfig,
    /// The tool registry, the generic tools' contract and the agent loop (docs/tools.md).
    pub tools: airlock_agent::ToolsConfig,
    /// `airlock serve`: listeners, tenants, quotas, named contracts, pools (docs/api.md).
    pub server: airlock_server::ServerConfig,
    /// Secrets the egress proxy injects (`[secrets.NAME]`, docs/credentials.md): a
    /// contract names them, the cell only ever holds a per-run placeholder.
    pub secrets: std::collections::BTreeMap<String, airlock_egress::secrets::SecretDefinition>,
    /// Brokered actions (`[broker.actions.NAME]`, docs/credentials.md): structured requests
    /// a cell hands the trusted side, which performs them with its own credential.
    pub broker: airlock_broker::BrokerConfig,
    /// Variables of airlock's environment no contract credential may read
    /// (`[credentials]`, docs/credentials.md).
    pub credentials: CredentialsConfig,
}

/// `[credentials]`: the supervisor's variables that never reach a cell as a credential.
/// The well-known model keys (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`) and the agent's
/// `[tools.agent] api_key_env` are always in the list; `forbidden` adds the host's own.
#[derive(Debug, Default, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CredentialsConfig {
    /// More variables no credential may read (`from_env`), e.g. `["MY_HOST_TOKEN"]`.
    pub forbidden: Vec<String>,
    /// Per workload class (`[credentials.classes.NAME]`): forbidden variables its runs
    /// may read anyway; each run that does records the lift in its plan
    /// (`credentials_lifted`).
    pub classes: std::collections::BTreeMap<String, ClassCredentials>,
}

impl CredentialsConfig {
    /// A name that is no variable would forbid nothing: refused, so a typo fails closed.
    fn check(&self) -> anyhow::Result<()> {
        let lifts = self.classes.iter().flat_map(|(class, lift)| {
            (lift.allow_forbidden.iter())
                .map(move |name| (format!("credentials.classes.{class}.allow_forbidden"), name))
        });
        let forbidden =
            (self.forbidden.iter()).map(|name| ("credentials.forbidden".to_string(), name));
        for (key, name) in forbidden.chain(lifts) {
            let valid = !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                bail!("{key}: {name:?} must match [A-Za-z_][A-Za-z0-9_]* (docs/config.md)");
            }
        }
        Ok(())
    }
}

#[derive(Debug, Default, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ClassCredentials {
    /// Forbidden variables (model keys included) this class's credentials may read.
    pub allow_forbidden: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ImagesConfig {
    /// Registry for a reference that names none (`tools@sha256:...`), e.g.
    /// `registry.internal:5000`. Unset: such a name is a local image's.
    pub default_registry: Option<String>,
    /// Ceiling of one layer's uncompressed size, bytes.
    pub max_layer_bytes: u64,
    /// Ceiling of one file of a layer, bytes.
    pub max_file_bytes: u64,
    /// Ceiling of the entries of one layer.
    pub max_entries: u64,
    /// Whether a reference with a tag and no digest is accepted; it is resolved once to a
    /// digest, which is what records carry.
    pub allow_tags: bool,
    /// PEM file of the only CA certificates trusted for registries (unset: the Mozilla
    /// roots).
    pub ca_file: Option<PathBuf>,
    /// Registry accounts by host (`"host:port"`); they stay in airlock's process, never
    /// in a cell.
    pub registries: std::collections::BTreeMap<String, RegistryAccount>,
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RegistryAccount {
    pub username: String,
    /// File holding the password (or token), read at pull time; not the secret itself,
    /// so the configuration can be shown.
    pub password_file: PathBuf,
}

impl Default for ImagesConfig {
    fn default() -> Self {
        let limits = airlock_images::Limits::default();
        ImagesConfig {
            default_registry: None,
            max_layer_bytes: limits.max_layer_bytes,
            max_file_bytes: limits.max_file_bytes,
            max_entries: limits.max_entries,
            allow_tags: false,
            ca_file: None,
            registries: Default::default(),
        }
    }
}

impl ImagesConfig {
    /// The registry client's options: the CA file and the passwords are read here.
    pub fn client_options(&self) -> anyhow::Result<airlock_images::registry::ClientOptions> {
        let ca_pem = match &self.ca_file {
            Some(path) => std::fs::read(path)
                .with_context(|| format!("images.ca_file: reading {}", path.display()))?,
            None => Vec::new(),
        };
        let mut credentials = std::collections::BTreeMap::new();
        for (host, account) in &self.registries {
            let password = std::fs::read_to_string(&account.password_file).with_context(|| {
                format!(
                    "images.registries.{host:?}.password_file: reading {}",
                    account.password_file.display()
                )
            })?;
            credentials.insert(
                host.clone(),
                airlock_images::registry::Credentials {
                    username: account.username.clone(),
                    password: password.trim_end_matches(['\r', '\n']).to_string(),
                },
            );
        }
        Ok(airlock_images::registry::ClientOptions {
            ca_pem,
            credentials,
            allow_tags: self.allow_tags,
        })
    }

    pub fn limits(&self) -> airlock_images::Limits {
        airlock_images::Limits {
            max_layer_bytes: self.max_layer_bytes,
            max_file_bytes: self.max_file_bytes,
            max_entries: self.max_entries,
        }
    }
}

/// The host ids cells run as when airlock is root: each live cell holds one uid and the
/// gid of the same number from `count` ids starting at `base`, so kernel limits counted
/// per host user are never shared between cells (docs/threat-model.md).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HostIdsConfig {
    /// The range's first id.
    pub base: u32,
    /// How many ids: the most cells that can live at once.
    pub count: u32,
}

impl Default for HostIdsConfig {
    fn default() -> Self {
        HostIdsConfig {
            base: HostIdRange::DEFAULT_BASE,
            count: HostIdRange::DEFAULT_COUNT,
        }
    }
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Where the audit store lives (overridden by `--state-dir`).
    pub state_dir: Option<PathBuf>,
    /// A fleet's shared store: runs and the audit chain in this Postgres database instead
    /// of the state directory's SQLite file, e.g.
    /// `postgres://airlock@/airlock?host=/run/postgresql` (a unix socket) or
    /// `postgres://airlock@127.0.0.1:5432/airlock`. A host that is not a unix socket or a
    /// loopback address needs verified TLS:
    /// `?sslmode=verify-full&sslrootcert=/etc/airlock/pg-ca.pem`. A database that cannot
    /// be reached refuses runs.
    pub url: Option<String>,
    /// This node's name in the fleet's store: runs are recorded under it, and at start a
    /// node marks `aborted` only its own runs whose supervisors are gone. Default
    /// `<hostname>/<machine-id>`; set it where those are not this node's own (a container
    /// without its own machine id, two nodes on one machine). `[A-Za-z0-9._:/-]`, at most
    /// 253 characters. Held by one process table (boot id, pid namespace) at a time while
    /// its processes keep the store open: another's claim is refused.
    pub node: Option<String>,
    /// The most pending finishes kept in `<state_dir>/spool` while the store is
    /// unavailable (a run's end is written there, fsynced, and into the store once it is
    /// back); a finish past it is lost, counted and logged. Default 4096, 1 to 1000000.
    pub spool_max_files: Option<usize>,
}

/// One bounded numeric key: its name, value and inclusive range.
struct Bound {
    key: &'static str,
    value: u64,
    min: u64,
    max: u64,
}

/// The bounds of docs/config.md. A zero connection limit or timeout would make every
/// allowlisted run fail inside the cell; a huge one would let one cell hold the proxy.
/// Host ids stay above the host's own users (uid 0 among them) and at or below 2^31 - 1
/// (see airlock_cell::host_identity).
fn bounds(config: &OperatorConfig) -> [Bound; 10] {
    let (egress, images, ids) = (&config.egress, &config.images, &config.host_ids);
    [
        // No spool would lose every finish of an outage; past a million it bounds nothing.
        Bound {
            key: "store.spool_max_files",
            value: config.spool_max_files() as u64,
            min: 1,
            max: 1_000_000,
        },
        Bound {
            key: "egress.max_connections",
            value: u64::from(egress.max_connections),
            min: 1,
            max: 4096,
        },
        Bound {
            key: "egress.max_bytes",
            value: egress.max_bytes,
            min: 1,
            max: 1 << 40,
        },
        Bound {
            key: "egress.idle_timeout_ms",
            value: egress.idle_timeout_ms,
            min: 1,
            max: 3_600_000,
        },
        Bound {
            key: "egress.connect_timeout_ms",
            value: egress.connect_timeout_ms,
            min: 1,
            max: 600_000,
        },
        // A zero ceiling would refuse every layer; over 1 TiB is no ceiling.
        Bound {
            key: "images.max_layer_bytes",
            value: images.max_layer_bytes,
            min: 1,
            max: 1 << 40,
        },
        Bound {
            key: "images.max_file_bytes",
            value: images.max_file_bytes,
            min: 1,
            max: 1 << 40,
        },
        Bound {
            key: "images.max_entries",
            value: images.max_entries,
            min: 1,
            max: 100_000_000,
        },
        Bound {
            key: "host_ids.base",
            value: u64::from(ids.base),
            min: u64::from(HostIdRange::MIN_BASE),
            max: u64::from(HostIdRange::MAX_ID),
        },
        Bound {
            key: "host_ids.count",
            value: u64::from(ids.count),
            min: 1,
            // The range ends at MAX_ID at most (a base out of bounds is reported first).
            max: (u64::from(HostIdRange::MAX_ID) + 1)
                .saturating_sub(u64::from(ids.base))
                .max(1),
        },
    ]
}

impl OperatorConfig {
    pub fn load(path: Option<&Path>) -> anyhow::Result<OperatorConfig> {
        let Some(path) = path else {
            return Ok(OperatorConfig::default());
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config {}", path.display()))?;
        // Editors on some systems write a byte-order mark; it is not part of the TOML.
        let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
        let config: OperatorConfig = toml::from_str(text)
            .map_err(|err| anyhow::anyhow!("{}", err.to_string().trim_end()))
            .with_context(|| format!("config {}", path.display()))?;
        config
            .check()
            .with_context(|| format!("config {}", path.display()))?;
        Ok(config)
    }

    fn check(&self) -> anyhow::Result<()> {
        for bound in bounds(self) {
            if !(bound.min..=bound.max).contains(&bound.value) {
                bail!(
                    "{} = {}: must be between {} and {} (docs/config.md)",
                    bound.key,
                    bound.value,
                    bound.min,
                    bound.max
                );
            }
        }
        if let Some(registry) = &self.images.default_registry {
            if registry.is_empty() || registry.contains(['/', '@']) {
                bail!(
                    "images.default_registry = {registry:?}: a registry host, with a port if \
                     any (registry.internal:5000)"
                );
            }
        }
        self.policy.check()?;
        self.credentials.check()?;
        self.server.check().map_err(|e| anyhow::anyhow!(e))?;
        for (name, secret) in &self.secrets {
            secret.check(name)?;
        }
        airlock_broker::Broker::new(&self.broker)?;
        self.store_postgres()?;
        if let Some(dir) = &self.store.state_dir {
            if !dir.is_absolute() {
                bail!(
                    "store.state_dir = {:?}: must be an absolute path",
                    dir.display()
                );
            }
        }
        Ok(())
    }

    /// The range cells' host ids come from; [`OperatorConfig::check`] passed.
    pub fn host_id_range(&self) -> anyhow::Result<HostIdRange> {
        Ok(HostIdRange::new(self.host_ids.base, self.host_ids.count)?)
    }

    /// The egress configuration the engine gets: `[egress]` with the operator's secrets.
    /// The engine's configuration for `state_dir`: the egress with the operator's secrets,
    /// the host ids, the broker actions and the quarantine cap. One place for every front
    /// end (`run`, `serve`, `tool`/`mcp`/`agent`), so none of them runs with less of the
    /// operator's configuration than another.
    pub fn engine_config(
        &self,
        state_dir: PathBuf,
    ) -> anyhow::Result<airlock_engine::EngineConfig> {
        let mut engine = airlock_engine::EngineConfig::new(state_dir, self.engine_egress());
        engine.host_ids = self.host_id_range()?;
        engine.broker = self.engine_broker()?;
        engine.quarantine_max_bytes = self.policy.quarantine_max_bytes;
        engine.store_postgres = self.store_postgres()?;
        engine.store_spool_max_files = self.spool_max_files();
        engine.credential_rules = self.credential_rules();
        Ok(engine)
    }

    /// The credentials rule every door's engine decides with: the model keys, the agent's
    /// key variable and `[credentials] forbidden`, with the classes' lifts.
    pub fn credential_rules(&self) -> airlock_contract::CredentialRules {
        let extra = (self.credentials.forbidden.iter().cloned())
            .chain(std::iter::once(self.tools.agent.api_key_env.clone()));
        let mut rules = airlock_contract::CredentialRules::with_model_keys(extra);
        rules.lifted_for_class = (self.credentials.classes.iter())
            .map(|(class, lift)| {
                (
                    class.clone(),
                    lift.allow_forbidden.iter().cloned().collect(),
                )
            })
            .collect();
        rules
    }

    /// `[store] url` and `[store] node`, checked: the fleet's store and this node's name in
    /// it (`[store] node`, else this machine's default name). A node name is checked even
    /// without a URL, so a typo does not wait for the day a fleet store is configured.
    pub fn store_postgres(&self) -> anyhow::Result<Option<airlock_store::FleetStore>> {
        let node = self
            .store
            .node
            .as_deref()
            .map(airlock_store::NodeName::parse)
            .transpose()?;
        let Some(url) = self.store.url.as_deref() else {
            return Ok(None);
        };
        let url = airlock_store::PostgresUrl::parse(url)?;
        let node = match node {
            Some(node) => node,
            None => airlock_store::NodeName::of_this_machine()?,
        };
        Ok(Some(airlock_store::FleetStore { url, node }))
    }

    /// Where runs and the audit chain are: the state directory (`--state-dir`, else the
    /// config's, else the default) and `[store] url`.
    pub fn store_location(
        &self,
        flag: Option<&Path>,
    ) -> anyhow::Result<airlock_store::StoreLocation> {
        Ok(airlock_store::StoreLocation {
            state_dir: self.state_dir(flag),
            postgres: self.store_postgres()?,
            spool_max_files: self.spool_max_files(),
        })
    }

    /// `[store] spool_max_files`, else the store's default.
    pub fn spool_max_files(&self) -> usize {
        self.store
            .spool_max_files
            .unwrap_or(airlock_store::spool::DEFAULT_MAX_FILES)
    }

    pub fn engine_egress(&self) -> airlock_egress::EgressConfig {
        let mut egress = self.egress.clone();
        egress.secrets = self.secrets.clone();
        egress
    }

    /// The broker actions the engine serves; [`OperatorConfig::check`] passed, so they
    /// compile.
    pub fn engine_broker(&self) -> anyhow::Result<std::sync::Arc<airlock_broker::Broker>> {
        Ok(std::sync::Arc::new(airlock_broker::Broker::new(
            &self.broker,
        )?))
    }

    /// `--state-dir`, else the config's, else the documented default.
    pub fn state_dir(&self, flag: Option<&Path>) -> PathBuf {
        flag.map(Path::to_path_buf)
            .or_else(|| self.store.state_dir.clone())
            .unwrap_or_else(airlock_store::default_state_dir)
    }
}

/// The JSON Schema of the operator configuration (docs/config.schema.json).
pub fn config_json_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(OperatorConfig))
        .expect("a generated schema always serialises")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> OperatorConfig {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn the_credentials_rule_holds_the_model_keys_the_agents_key_and_the_operators() {
        let loaded = config(
            "[tools.agent]\napi_key_env = \"MY_MODEL_KEY\"\n[credentials]\n\
             forbidden = [\"MY_HOST_TOKEN\"]\n[credentials.classes.c]\n\
             allow_forbidden = [\"OPENAI_API_KEY\"]\n",
        );
        loaded.check().unwrap();
        let rules = loaded.credential_rules();
        for name in [
            "OPENAI_API_KEY",
            "ANTHROPIC_API_KEY",
            "MY_MODEL_KEY",
            "MY_HOST_TOKEN",
        ] {
            assert!(rules.forbidden.contains(name), "{name}");
        }
        assert!(rules.lifted_for_class["c"].contains("OPENAI_API_KEY"));
        // A name that is no variable would forbid nothing: the configuration is refused.
        for bad in ["9X", "", "A-B"] {
            let text = format!("[credentials]\nforbidden = [{bad:?}]\n");
            let err = config(&text).check().unwrap_err().to_string();
            assert!(err.contains("credentials.forbidden"), "{err}");
        }
    }

    #[test]
    fn bounds_name_the_key_and_the_range() {
        let err = config("[egress]\nmax_connections = 0\n")
            .check()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "egress.max_connections = 0: must be between 1 and 4096 (docs/config.md)"
        );
        let err = config("[store]\nstate_dir = \"rel\"\n")
            .check()
            .unwrap_err();
        assert!(
            err.to_string().contains("must be an absolute path"),
            "{err}"
        );
    }

    #[test]
    fn the_fleet_store_names_its_node_and_refuses_an_odd_name() {
        let url = "postgres://airlock@127.0.0.1:5432/fleet";
        let named = config(&format!("[store]\nurl = \"{url}\"\nnode = \"worker-3\"\n"));
        let fleet = named.store_postgres().unwrap().unwrap();
        assert_eq!(fleet.node.as_str(), "worker-3");
        // A bad name is refused at load, with or without a URL.
        for text in [
            format!("[store]\nurl = \"{url}\"\nnode = \"worker 3\"\n"),
            "[store]\nnode = \"\"\n".to_string(),
        ] {
            let err = config(&text).check().unwrap_err().to_string();
            assert!(err.contains("store node name"), "{text}: {err}");
        }
        // Without `node`: this machine's name (where it has a machine id).
        if std::path::Path::new("/etc/machine-id").exists() {
            let default = config(&format!("[store]\nurl = \"{url}\"\n"));
            let node = default.store_postgres().unwrap().unwrap().node;
            assert_eq!(node, airlock_store::NodeName::of_this_machine().unwrap());
        }
    }

    #[test]
    fn host_ids_stay_above_the_hosts_users_and_at_or_below_2_pow_31_minus_1() {
        let err = config("[host_ids]\nbase = 0\n").check().unwrap_err();
        assert_eq!(
            err.to_string(),
            "host_ids.base = 0: must be between 65536 and 2147483647 (docs/config.md)"
        );
        let err = config("[host_ids]\nbase = 2147483000\ncount = 1000\n")
            .check()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "host_ids.count = 1000: must be between 1 and 648 (docs/config.md)"
        );
        let err = config("[host_ids]\ncount = 0\n").check().unwrap_err();
        assert!(err.to_string().starts_with("host_ids.count = 0:"), "{err}");
        let ok = config("[host_ids]\nbase = 2147483000\ncount = 648\n");
        ok.check().unwrap();
        assert_eq!(ok.host_id_range().unwrap().last(), 2_147_483_647);
    }

    #[test]
    fn the_default_configuration_is_within_its_bounds() {
        OperatorConfig::default().check().unwrap();
    }

    fn repo_file(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(name)
    }

    /// `AIRLOCK_BLESS=1 cargo test -p airlock config` rewrites docs/config.schema.json.
    #[test]
    fn checked_in_config_schema_matches_the_types() {
        let path = repo_file("docs/config.schema.json");
        let expected = serde_json::to_string_pretty(&config_json_schema()).unwrap() + "\n";
        if std::env::var_os("AIRLOCK_BLESS").is_some_and(|v| v == "1") {
            std::fs::write(&path, &expected).unwrap();
            return;
        }
        let actual = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            actual == expected,
            "docs/config.schema.json is out of date; regenerate it with \
             `AIRLOCK_BLESS=1 cargo test -p airlock config`"
        );
    }

    #[test]
    fn config_reference_documents_every_key() {
        let doc = std::fs::read_to_string(repo_file("docs/config.md")).unwrap();
        let schema = config_json_schema();
        let mut missing = Vec::new();
        for (table, def) in [
            ("egress", "EgressConfig"),
            ("store", "StoreConfig"),
            ("images", "ImagesConfig"),
            ("host_ids", "HostIdsConfig"),
            ("tools", "ToolsConfig"),
            ("tools.agent", "AgentSettings"),
        ] {
            let properties = schema["$defs"][def]["properties"].as_object().unwrap();
            for key in properties.keys() {
                if !doc.contains(&format!("`{table}.{key}`")) {
                    missing.push(format!("{table}.{key}"));
                }
            }
        }
        assert!(missing.is_empty(), "docs/config.md lacks {missing:?}");
    }
}
