//! Every rule a contract must satisfy, checked in one pass that collects all violations.
//! The result carries the normalised paths and destinations, so `compile` never re-derives
//! (and can never disagree with) what validation accepted.

use crate::contract::*;
use crate::error::FieldError;
use crate::plan::DestinationRule;
use std::collections::BTreeMap;

/// Cell directories the runtime itself provides; a contract mount there would shadow the
/// system (e.g. a writable `/usr/bin` or a fake `/etc/passwd`).
pub const RESERVED_CELL_DIRS: &[&str] = &[
    "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "proc", "dev", "sys",
];

/// Proxy variables airlock sets itself for allowlisted runs; letting a contract set them
/// would let it point the payload past (or around) the egress proxy.
pub const RESERVED_ENV_NAMES: &[&str] = &["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"];

/// Variables every cell gets (see `compile`); a credential may not hide behind one of them.
pub const BASE_ENV_NAMES: &[&str] = &["PATH", "HOME", "LANG", "TMPDIR"];

pub const DEFAULT_PORTS: [u16; 2] = [443, 80];

const MIB: u64 = 1 << 20;

/// A path split into normal components: no `.`, `..`, empty components or NUL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NormalPath {
    pub absolute: bool,
    pub components: Vec<String>,
}

impl NormalPath {
    /// The path as seen inside the cell, where every contract path is rooted at `/`.
    pub fn cell_path(&self) -> String {
        format!("/{}", self.components.join("/"))
    }

    /// The path as written on the host side: absolute, or relative to the contract's
    /// directory.
    pub fn host_path(&self) -> String {
        let joined = self.components.join("/");
        if self.absolute {
            format!("/{joined}")
        } else {
            joined
        }
    }

    pub(crate) fn contains(&self, other: &NormalPath) -> bool {
        other.components.len() > self.components.len()
            && other.components[..self.components.len()] == self.components[..]
    }
}

pub(crate) struct CheckedInput {
    pub source: NormalPath,
    pub target: NormalPath,
}

pub(crate) struct CheckedWritable {
    pub target: NormalPath,
    pub size_bytes: u64,
    pub exec: bool,
}

/// A contract that passed validation, with its paths and destinations normalised.
pub(crate) struct CheckedContract {
    pub inputs: Vec<CheckedInput>,
    pub writable: Vec<CheckedWritable>,
    pub output_allowlist: Vec<String>,
    pub destinations: Vec<DestinationRule>,
    pub workdir: String,
    /// `None` for the built-in profile.
    pub seccomp_profile: Option<NormalPath>,
    pub etc_files: Vec<crate::etc::CheckedEtcFile>,
}

impl CheckedContract {
    pub fn tmp_is_writable(&self) -> bool {
        self.writable.iter().any(|w| w.target.components == ["tmp"])
    }
}

pub(crate) fn check(contract: &Contract) -> Result<CheckedContract, Vec<FieldError>> {
    let mut errors = Errors::default();

    check_image(&contract.image, &mut errors);
    check_identity(&contract.identity, &mut errors);
    let (inputs, writable, output_allowlist) = check_filesystem(&contract.filesystem, &mut errors);
    let etc_files = crate::etc::check_etc_files(&contract.filesystem.etc_files, &mut errors);
    let destinations = check_network(&contract.network, &mut errors);
    check_http_rules(&contract.network.http_rules, &destinations, &mut errors);
    check_resources(&contract.resources, &mut errors);
    check_env(&contract.env, &mut errors);
    check_credentials(&contract.credentials, &contract.env, &mut errors);
    check_secrets(contract, &mut errors);
    check_broker_actions(&contract.broker_actions, &mut errors);
    check_isolation(contract, &mut errors);
    check_cleanup(&contract.cleanup, &mut errors);
    check_hostname(&contract.hostname, &mut errors);
    let workdir = check_workdir(contract.workdir.as_deref(), &inputs, &writable, &mut errors);
    let seccomp_profile = check_seccomp_profile(&contract.seccomp_profile, &mut errors);

    if errors.0.is_empty() {
        Ok(CheckedContract {
            inputs,
            writable,
            output_allowlist,
            destinations,
            workdir,
            seccomp_profile,
            etc_files,
        })
    } else {
        Err(errors.0)
    }
}

#[derive(Default)]
pub(crate) struct Errors(Vec<FieldError>);

impl Errors {
    pub(crate) fn push(&mut self, path: impl Into<String>, rule: impl Into<String>) {
        self.0.push(FieldError::new(path, rule));
    }
}

fn check_image(image: &str, errors: &mut Errors) {
    if image.trim().is_empty() {
        errors.push("image", "must not be empty");
    } else if image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        errors.push("image", "must not contain whitespace or control characters");
    }
}

fn check_identity(identity: &Identity, errors: &mut Errors) {
    for (field, id) in [
        ("identity.uid", identity.uid),
        ("identity.gid", identity.gid),
    ] {
        if id == 0 {
            errors.push(field, "must not be 0: the cell identity is never root");
        } else {
            check_bounds(field, id, UID_BOUNDS, errors);
        }
    }
}

fn check_bounds(path: &str, value: i64, bounds: Bounds, errors: &mut Errors) {
    if value < bounds.min {
        errors.push(path, format!("must be at least {}", bounds.min));
    } else if value > bounds.max {
        errors.push(path, format!("must be at most {}", bounds.max));
    }
}

pub(crate) fn normalise(raw: &str) -> Result<NormalPath, &'static str> {
    if raw.is_empty() {
        return Err("must not be empty");
    }
    if raw.contains('\0') {
        return Err("must not contain NUL");
    }
    let mut components = Vec::new();
    for component in raw.split('/') {
        match component {
            "" | "." => {}
            ".." => return Err("must not contain `..`"),
            normal => components.push(normal.to_owned()),
        }
    }
    Ok(NormalPath {
        absolute: raw.starts_with('/'),
        components,
    })
}

/// A cell path a contract may mount on: not `/`, not a directory the runtime provides.
fn cell_target(path: &str, raw: &str, errors: &mut Errors) -> Option<NormalPath> {
    let target = match normalise(raw) {
        // Every cell path is rooted at `/`, written with a leading `/` or not.
        Ok(target) => NormalPath {
            absolute: true,
            ..target
        },
        Err(rule) => {
            errors.push(path, rule);
            return None;
        }
    };
    let Some(first) = target.components.first() else {
        errors.push(path, "must not be `/`");
        return None;
    };
    if RESERVED_CELL_DIRS.contains(&first.as_str()) {
        errors.push(
            path,
            format!("must not be or lie under /{first}: the runtime provides it"),
        );
        return None;
    }
    Some(target)
}

pub(crate) fn host_source(path: &str, raw: &str, errors: &mut Errors) -> Option<NormalPath> {
    match normalise(raw) {
        Ok(source) if source.components.is_empty() => {
            errors.push(path, "must name a file or directory below `/`");
            None
        }
        Ok(source) => Some(source),
        Err(rule) => {
            errors.push(path, rule);
            None
        }
    }
}

fn check_filesystem(
    filesystem: &Filesystem,
    errors: &mut Errors,
) -> (Vec<CheckedInput>, Vec<CheckedWritable>, Vec<String>) {
    let mut inputs = Vec::new();
    let mut input_fields = Vec::new();
    for (index, input) in filesystem.readonly_inputs.iter().enumerate() {
        let field = format!("filesystem.readonly_inputs[{index}]");
        let checked = match input {
            ReadonlyInput::Path(raw) => host_source(&field, raw, errors).and_then(|source| {
                let target = cell_target(&field, raw, errors)?;
                Some(CheckedInput { source, target })
            }),
            ReadonlyInput::Mapped(mapped) => {
                let source = host_source(&format!("{field}.source"), &mapped.source, errors);
                let target = cell_target(&format!("{field}.target"), &mapped.target, errors);
                source
                    .zip(target)
                    .map(|(source, target)| CheckedInput { source, target })
            }
        };
        if let Some(checked) = checked {
            let target_field = match input {
                ReadonlyInput::Path(_) => field,
                ReadonlyInput::Mapped(_) => format!("{field}.target"),
            };
            inputs.push(checked);
            input_fields.push(target_field);
        }
    }

    let mut writable = Vec::new();
    let mut writable_fields = Vec::new();
    for (index, entry) in filesystem.writable_paths.iter().enumerate() {
        let field = format!("filesystem.writable_paths[{index}]");
        let (target_field, raw, size_mb, exec) = match entry {
            WritablePath::Path(raw) => {
                (field, raw, DEFAULT_WRITABLE_SIZE_MB, DEFAULT_WRITABLE_EXEC)
            }
            WritablePath::Detailed(detailed) => {
                check_bounds(
                    &format!("{field}.size_mb"),
                    detailed.size_mb,
                    WRITABLE_SIZE_MB_BOUNDS,
                    errors,
                );
                (
                    format!("{field}.path"),
                    &detailed.path,
                    detailed.size_mb,
                    detailed.exec,
                )
            }
        };
        if let Some(target) = cell_target(&target_field, raw, errors) {
            writable.push(CheckedWritable {
                target,
                size_bytes: u64::try_from(size_mb).unwrap_or(0) * MIB,
                exec,
            });
            writable_fields.push(target_field);
        }
    }

    let all_mounts: Vec<(&String, &NormalPath)> = input_fields
        .iter()
        .zip(inputs.iter().map(|i| &i.target))
        .chain(
            writable_fields
                .iter()
                .zip(writable.iter().map(|w| &w.target)),
        )
        .collect();
    // Nesting is refused as well as equality: a tmpfs over an input hides it, and a mount
    // point inside a read-only bind cannot be created.
    for (later, (later_field, later_target)) in all_mounts.iter().enumerate() {
        let conflict = all_mounts[..later]
            .iter()
            .find_map(|(earlier_field, earlier_target)| {
                if earlier_target == later_target {
                    Some(format!(
                        "duplicates the target {} of {earlier_field}",
                        later_target.cell_path()
                    ))
                } else if earlier_target.contains(later_target)
                    || later_target.contains(earlier_target)
                {
                    Some(format!(
                        "{} overlaps {} of {earlier_field}: mounts may not nest",
                        later_target.cell_path(),
                        earlier_target.cell_path()
                    ))
                } else {
                    None
                }
            });
        if let Some(rule) = conflict {
            errors.push(*later_field, rule);
        }
    }

    let mut output_allowlist = Vec::new();
    for (index, raw) in filesystem.output_allowlist.iter().enumerate() {
        let field = format!("filesystem.output_allowlist[{index}]");
        match normalise(raw) {
            Err(rule) => errors.push(field, rule),
            Ok(glob) if !writable.iter().any(|w| w.target.contains(&glob)) => {
                let writable_list: Vec<String> =
                    writable.iter().map(|w| w.target.cell_path()).collect();
                errors.push(
                    field,
                    format!(
                        "must lie inside a writable path ({})",
                        if writable_list.is_empty() {
                            "there are none".to_owned()
                        } else {
                            writable_list.join(", ")
                        }
                    ),
                );
            }
            Ok(glob) => output_allowlist.push(glob.cell_path()),
        }
    }

    (inputs, writable, output_allowlist)
}

fn check_network(network: &Network, errors: &mut Errors) -> Vec<DestinationRule> {
    match network.mode {
        NetworkMode::Deny if !network.allowed_domains.is_empty() => {
            errors.push(
                "network.allowed_domains",
                "must be empty when network.mode is deny",
            );
            return Vec::new();
        }
        // The pod's CNI and NetworkPolicy decide where a pod's traffic goes; an allowlist
        // here would read as a promise airlock's proxy does not keep there.
        NetworkMode::Pod if !network.allowed_domains.is_empty() => {
            errors.push(
                "network.allowed_domains",
                "must be empty when network.mode is pod (the pod's NetworkPolicy governs \
                 its egress, not airlock's proxy)",
            );
            return Vec::new();
        }
        NetworkMode::Allowlist if network.allowed_domains.is_empty() => errors.push(
            "network.allowed_domains",
            "must name at least one destination when network.mode is allowlist",
        ),
        _ => {}
    }
    let mut destinations: Vec<DestinationRule> = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (index, entry) in network.allowed_domains.iter().enumerate() {
        let field = format!("network.allowed_domains[{index}]");
        match parse_destination(entry) {
            Err(rule) => errors.push(field, rule),
            Ok(rule) => {
                if let Some(first) = seen.insert(rule.host_pattern.clone(), index) {
                    errors.push(
                        field,
                        format!(
                            "{} is already allowed by network.allowed_domains[{first}]: list its ports once",
                            rule.host_pattern
                        ),
                    );
                } else {
                    destinations.push(rule);
                }
            }
        }
    }
    destinations
}

/// `name`, `*.name`, either optionally with `:port`. Deliberately narrow: anything the
/// egress proxy could read more than one way (URLs, IP literals, bare `*`) is refused.
pub fn parse_destination(entry: &str) -> Result<DestinationRule, String> {
    if entry.is_empty() {
        return Err("must not be empty".to_owned());
    }
    if entry.chars().any(char::is_whitespace) {
        return Err("must not contain spaces".to_owned());
    }
    if entry.contains("://") || entry.contains('/') {
        return Err("must be a host name, not a URL".to_owned());
    }
    if entry.contains('[') || entry.matches(':').count() > 1 {
        return Err("must be a DNS name, not an IP address literal".to_owned());
    }
    let lower = entry.to_ascii_lowercase();
    let (host, ports) = match lower.split_once(':') {
        None => (lower.as_str(), DEFAULT_PORTS.to_vec()),
        Some((host, port)) => match port.parse::<u16>() {
            // `parse` alone would also take `+443`.
            Ok(number) if number > 0 && port.bytes().all(|b| b.is_ascii_digit()) => {
                (host, vec![number])
            }
            _ => return Err(format!("port `{port}` must be a number from 1 to 65535")),
        },
    };
    let (wildcard, name) = match host.strip_prefix("*.") {
        Some(name) => (true, name),
        None => (false, host),
    };
    if name.contains('*') {
        return Err("`*` is only allowed as a single leading `*.` label".to_owned());
    }
    if name.len() > 253 {
        return Err("must be at most 253 characters long".to_owned());
    }
    let labels: Vec<&str> = name.split('.').collect();
    for label in &labels {
        if label.is_empty() {
            return Err("must not have an empty label".to_owned());
        }
        if label.len() > 63 {
            return Err(format!(
                "label `{label}` must be at most 63 characters long"
            ));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(format!(
                "label `{label}` may contain only letters, digits and `-`"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!("label `{label}` must not start or end with `-`"));
        }
    }
    if labels
        .last()
        .is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err("must be a DNS name, not an IP address literal".to_owned());
    }
    if wildcard && labels.len() < 2 {
        return Err("a `*.` wildcard must cover a domain of at least two labels".to_owned());
    }
    Ok(DestinationRule {
        host_pattern: if wildcard {
            format!("*.{name}")
        } else {
            name.to_owned()
        },
        ports,
    })
}

fn check_resources(resources: &Resources, errors: &mut Errors) {
    let checks = [
        ("cpu_millis", resources.cpu_millis, CPU_MILLIS_BOUNDS),
        ("memory_mb", resources.memory_mb, MEMORY_MB_BOUNDS),
        (
            "process_limit",
            resources.process_limit,
            PROCESS_LIMIT_BOUNDS,
        ),
        (
            "wall_time_seconds",
            resources.wall_time_seconds,
            WALL_TIME_SECONDS_BOUNDS,
        ),
        ("output_bytes", resources.output_bytes, OUTPUT_BYTES_BOUNDS),
        ("open_files", resources.open_files, OPEN_FILES_BOUNDS),
        ("file_size_mb", resources.file_size_mb, FILE_SIZE_MB_BOUNDS),
        ("shm_mb", resources.shm_mb, SHM_MB_BOUNDS),
    ];
    for (name, value, bounds) in checks {
        check_bounds(&format!("resources.{name}"), value, bounds, errors);
    }
}

pub(crate) fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn is_reserved_env_name(name: &str) -> bool {
    RESERVED_ENV_NAMES
        .iter()
        .any(|reserved| reserved.eq_ignore_ascii_case(name))
}

/// The rule an environment variable name breaks, if any.
fn env_name_rule(name: &str) -> Option<&'static str> {
    if !is_env_name(name) {
        Some("must match [A-Za-z_][A-Za-z0-9_]*")
    } else if is_reserved_env_name(name) {
        Some("is reserved: airlock sets the proxy variables itself")
    } else {
        None
    }
}

fn check_env(env: &BTreeMap<String, EnvValue>, errors: &mut Errors) {
    for (name, value) in env {
        let field = format!("env.{name}");
        if let Some(rule) = env_name_rule(name) {
            errors.push(&field, rule);
        }
        if value.value().contains('\0') {
            errors.push(field, "must not contain NUL");
        }
    }
}

fn check_credentials(
    credentials: &[Credential],
    env: &BTreeMap<String, EnvValue>,
    errors: &mut Errors,
) {
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    let mut targets: BTreeMap<&str, usize> = BTreeMap::new();
    for (index, credential) in credentials.iter().enumerate() {
        let field = format!("credentials[{index}]");
        let name_ok = !credential.name.is_empty()
            && credential
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
        if !name_ok {
            errors.push(
                format!("{field}.name"),
                "must be non-empty and contain only letters, digits, `_`, `.` and `-`",
            );
        } else if let Some(first) = names.insert(&credential.name, index) {
            errors.push(
                format!("{field}.name"),
                format!("duplicates credentials[{first}].name"),
            );
        }

        let env_field = format!("{field}.env");
        if let Some(rule) = env_name_rule(&credential.env) {
            errors.push(&env_field, rule);
        } else if BASE_ENV_NAMES.contains(&credential.env.as_str())
            || env.contains_key(&credential.env)
        {
            errors.push(&env_field, "is already set by the cell's environment");
        } else if let Some(first) = targets.insert(&credential.env, index) {
            errors.push(&env_field, format!("duplicates credentials[{first}].env"));
        }

        if !is_env_name(&credential.from_env) {
            errors.push(
                format!("{field}.from_env"),
                "must match [A-Za-z_][A-Za-z0-9_]*",
            );
        }
    }
}

/// HTTP rules: each for one allowed domain, once, with upper-case method tokens and
/// path prefixes starting with `/`.
fn check_http_rules(rules: &[HttpRule], destinations: &[DestinationRule], errors: &mut Errors) {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (index, rule) in rules.iter().enumerate() {
        let field = format!("network.http_rules[{index}]");
        let host = rule.host.to_ascii_lowercase();
        if !destinations.iter().any(|d| d.host_pattern == host) {
            errors.push(
                format!("{field}.host"),
                "must be a host of network.allowed_domains (without its port)",
            );
        } else if let Some(first) = seen.insert(host, index) {
            errors.push(
                format!("{field}.host"),
                format!("duplicates network.http_rules[{first}].host"),
            );
        }
        let method_ok = |m: &String| !m.is_empty() && m.bytes().all(|b| b.is_ascii_uppercase());
        if !rule.methods.iter().all(method_ok) {
            errors.push(
                format!("{field}.methods"),
                "each must be an upper-case method name",
            );
        }
        if !rule.path_prefixes.iter().all(|p| p.starts_with('/')) {
            errors.push(format!("{field}.path_prefixes"), "each must start with `/`");
        }
    }
}

/// Secret uses: a known-good name, an unreserved variable nobody else sets, and a network
/// that goes through the proxy (the only place a placeholder becomes its value).
fn check_secrets(contract: &Contract, errors: &mut Errors) {
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    let mut targets: BTreeMap<&str, usize> = BTreeMap::new();
    for (index, secret) in contract.secrets.iter().enumerate() {
        let field = format!("secrets[{index}]");
        if !is_record_name(&secret.name) {
            errors.push(
                format!("{field}.name"),
                "must be non-empty and contain only letters, digits, `_`, `.` and `-`",
            );
        } else if let Some(first) = names.insert(&secret.name, index) {
            errors.push(
                format!("{field}.name"),
                format!("duplicates secrets[{first}].name"),
            );
        }
        let env_field = format!("{field}.env");
        let credential = contract.credentials.iter().any(|c| c.env == secret.env);
        if let Some(rule) = env_name_rule(&secret.env) {
            errors.push(&env_field, rule);
        } else if BASE_ENV_NAMES.contains(&secret.env.as_str())
            || contract.env.contains_key(&secret.env)
            || credential
        {
            errors.push(&env_field, "is already set by the cell's environment");
        } else if let Some(first) = targets.insert(&secret.env, index) {
            errors.push(&env_field, format!("duplicates secrets[{first}].env"));
        }
    }
    if !contract.secrets.is_empty() && contract.network.mode != NetworkMode::Allowlist {
        errors.push(
            "secrets",
            "needs network.mode allowlist: only the egress proxy can use a secret",
        );
    }
}

/// What the gVisor tier cannot enforce as asked (yet) is an error, never a silently
/// weaker run: a terminal is built for a run without a route out only (no network, no
/// broker), and a pod's network and image root are not built (docs/threat-model.md,
/// "Tiers"). A custom seccomp profile is translated for gVisor's kernel
/// (crates/oci/src/seccomp.rs). Secrets and broker actions are: the proxy and the broker
/// are the native cell's, reached through the tier's forwarders
/// (crates/cell/src/gvisor/route.rs), and the run CA's bundle is an `/etc` entry the
/// bundle binds like any other.
fn check_isolation(contract: &Contract, errors: &mut Errors) {
    if contract.isolation != Isolation::Gvisor {
        return;
    }
    let unsupported = [
        (
            contract.terminal
                && (contract.network.mode != NetworkMode::Deny
                    || !contract.broker_actions.is_empty()),
            "terminal",
            "a terminal with a network or broker actions (its payload then runs behind a \
             forwarder)",
        ),
        (
            contract.network.mode == NetworkMode::Pod,
            "network.mode",
            "network.mode pod",
        ),
    ];
    for (used, field, what) in unsupported {
        if used {
            errors.push(field, format!("isolation gvisor does not support {what}"));
        }
    }
}

/// Broker action names: known-good names, each once (whether the operator defines them
/// is checked where the configuration is known, in the engine).
fn check_broker_actions(actions: &[String], errors: &mut Errors) {
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    for (index, name) in actions.iter().enumerate() {
        let field = format!("broker_actions[{index}]");
        if !is_record_name(name) {
            errors.push(
                field,
                "must be non-empty and contain only letters, digits, `_`, `.` and `-`",
            );
        } else if let Some(first) = names.insert(name, index) {
            errors.push(field, format!("duplicates broker_actions[{first}]"));
        }
    }
}

fn is_record_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

fn check_cleanup(cleanup: &Cleanup, errors: &mut Errors) {
    if !cleanup.destroy_runtime {
        errors.push(
            "cleanup.destroy_runtime",
            "must be true: cells are always destroyed",
        );
    }
    if !cleanup.retain_outputs_only {
        errors.push(
            "cleanup.retain_outputs_only",
            "must be true: only allowlisted outputs leave a cell",
        );
    }
}

fn check_hostname(hostname: &str, errors: &mut Errors) {
    let valid = (1..=63).contains(&hostname.len())
        && hostname
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !hostname.starts_with('-')
        && !hostname.ends_with('-');
    if !valid {
        errors.push(
            "hostname",
            "must be an RFC 1123 label: 1-63 letters, digits or `-`, not starting or ending with `-`",
        );
    }
}

fn check_workdir(
    workdir: Option<&str>,
    inputs: &[CheckedInput],
    writable: &[CheckedWritable],
    errors: &mut Errors,
) -> String {
    let Some(raw) = workdir else {
        let tmp_writable = writable.iter().any(|w| w.target.components == ["tmp"]);
        return if tmp_writable { "/tmp" } else { "/" }.to_owned();
    };
    let path = match normalise(raw) {
        Ok(path) if path.absolute => path,
        Ok(_) => {
            errors.push("workdir", "must be an absolute path");
            return String::new();
        }
        Err(rule) => {
            errors.push("workdir", rule);
            return String::new();
        }
    };
    let inside_a_mount = inputs
        .iter()
        .map(|i| &i.target)
        .chain(writable.iter().map(|w| &w.target))
        .any(|target| *target == path || target.contains(&path));
    if !path.components.is_empty() && !inside_a_mount {
        errors.push(
            "workdir",
            "must be `/` or lie inside a readonly input or writable path",
        );
    }
    path.cell_path()
}

pub(crate) fn check_seccomp_profile(profile: &str, errors: &mut Errors) -> Option<NormalPath> {
    if profile == DEFAULT_SECCOMP_PROFILE {
        return None;
    }
    host_source("seccomp_profile", profile, errors)
}

#[cfg(test)]
mod tests {
    use super::parse_destination;
    use crate::{parse_contract, ContractError, ContractFormat};

    /// The displayed violations of a YAML contract, which must be invalid.
    fn violations(yaml: &str) -> Vec<String> {
        match parse_contract(yaml, ContractFormat::Yaml) {
            Err(ContractError::Invalid(errors)) => errors.iter().map(ToString::to_string).collect(),
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    fn assert_valid(yaml: &str) {
        if let Err(error) = parse_contract(yaml, ContractFormat::Yaml) {
            panic!("expected a valid contract, got: {error}");
        }
    }

    #[test]
    fn memory_below_minimum() {
        assert_eq!(
            violations("resources:\n  memory_mb: 0\n"),
            ["resources.memory_mb: must be at least 4"]
        );
    }

    #[test]
    fn negative_numbers_are_field_errors() {
        assert_eq!(
            violations("resources:\n  wall_time_seconds: -1\n  output_bytes: -100\n"),
            [
                "resources.wall_time_seconds: must be at least 1",
                "resources.output_bytes: must be at least 1",
            ]
        );
        assert_eq!(
            violations("identity:\n  uid: -1\n"),
            ["identity.uid: must be at least 1"]
        );
    }

    #[test]
    fn every_resource_has_both_bounds() {
        assert_eq!(
            violations(
                "resources:\n  cpu_millis: 9\n  memory_mb: 65537\n  process_limit: 4097\n  \
                 wall_time_seconds: 86401\n  output_bytes: 1073741825\n  open_files: 15\n  \
                 file_size_mb: 16385\n  shm_mb: 65537\n"
            ),
            [
                "resources.cpu_millis: must be at least 10",
                "resources.memory_mb: must be at most 65536",
                "resources.process_limit: must be at most 4096",
                "resources.wall_time_seconds: must be at most 86400",
                "resources.output_bytes: must be at most 1073741824",
                "resources.open_files: must be at least 16",
                "resources.file_size_mb: must be at most 16384",
                "resources.shm_mb: must be at most 65536",
            ]
        );
        assert_valid(
            "resources:\n  cpu_millis: 64000\n  memory_mb: 4\n  process_limit: 1\n  \
             wall_time_seconds: 1\n  output_bytes: 1073741824\n  open_files: 65536\n  \
             file_size_mb: 1\n  shm_mb: 65536\n",
        );
        assert_eq!(
            violations("resources:\n  shm_mb: 0\n"),
            ["resources.shm_mb: must be at least 1"]
        );
    }

    #[test]
    fn all_violations_are_reported_together() {
        let errors = violations(
            "identity: { uid: 0 }\nresources: { memory_mb: 0 }\ncleanup: { destroy_runtime: false }\n",
        );
        assert_eq!(errors.len(), 3, "{errors:?}");
        let displayed = ContractError::Invalid(
            errors
                .iter()
                .map(|e| {
                    let (path, rule) = e.split_once(": ").unwrap();
                    crate::FieldError::new(path, rule)
                })
                .collect(),
        )
        .to_string();
        assert_eq!(displayed.lines().count(), 3);
    }

    #[test]
    fn root_identity_is_refused() {
        assert_eq!(
            violations("identity:\n  uid: 0\n  gid: 0\n"),
            [
                "identity.uid: must not be 0: the cell identity is never root",
                "identity.gid: must not be 0: the cell identity is never root",
            ]
        );
        assert_eq!(
            violations("identity:\n  uid: 65535\n"),
            ["identity.uid: must be at most 65534"]
        );
    }

    #[test]
    fn cleanup_cannot_be_disabled() {
        assert_eq!(
            violations("cleanup:\n  destroy_runtime: false\n  retain_outputs_only: false\n"),
            [
                "cleanup.destroy_runtime: must be true: cells are always destroyed",
                "cleanup.retain_outputs_only: must be true: only allowlisted outputs leave a cell",
            ]
        );
    }

    #[test]
    fn parent_components_are_refused_everywhere() {
        assert_eq!(
            violations(
                "filesystem:\n  readonly_inputs:\n    - ../secrets\n    - { source: a, target: /in/../etc }\n  \
                 writable_paths: [out/../../x]\n"
            ),
            [
                "filesystem.readonly_inputs[0]: must not contain `..`",
                "filesystem.readonly_inputs[1].target: must not contain `..`",
                "filesystem.writable_paths[0]: must not contain `..`",
            ]
        );
        assert_eq!(
            violations("seccomp_profile: ../profile.json\n"),
            ["seccomp_profile: must not contain `..`"]
        );
    }

    #[test]
    fn system_directories_and_root_are_not_mount_targets() {
        assert_eq!(
            violations(
                "filesystem:\n  readonly_inputs:\n    - /etc/passwd\n    - { source: x, target: /usr/local/bin/tool }\n  \
                 writable_paths: [/, /proc/self, lib64/]\n"
            ),
            [
                "filesystem.readonly_inputs[0]: must not be or lie under /etc: the runtime provides it",
                "filesystem.readonly_inputs[1].target: must not be or lie under /usr: the runtime provides it",
                "filesystem.writable_paths[0]: must not be `/`",
                "filesystem.writable_paths[1]: must not be or lie under /proc: the runtime provides it",
                "filesystem.writable_paths[2]: must not be or lie under /lib64: the runtime provides it",
            ]
        );
        // Only whole components count: /etcetera is not /etc.
        assert_valid("filesystem:\n  writable_paths: [/etcetera, /tmp]\n");
    }

    #[test]
    fn paths_are_normalised_before_comparison() {
        assert_eq!(
            violations("filesystem:\n  writable_paths: [tmp/, //tmp, { path: ./tmp//, size_mb: 8 }]\n"),
            [
                "filesystem.writable_paths[1]: duplicates the target /tmp of filesystem.writable_paths[0]",
                "filesystem.writable_paths[2].path: duplicates the target /tmp of filesystem.writable_paths[0]",
            ]
        );
    }

    #[test]
    fn duplicate_targets_are_refused() {
        assert_eq!(
            violations(
                "filesystem:\n  readonly_inputs:\n    - data/a.csv\n    - { source: other/a.csv, target: /data/a.csv }\n"
            ),
            ["filesystem.readonly_inputs[1].target: duplicates the target /data/a.csv of filesystem.readonly_inputs[0]"]
        );
    }

    #[test]
    fn inputs_may_not_overlap_writable_paths() {
        assert_eq!(
            violations("filesystem:\n  readonly_inputs: [output/template.txt]\n  writable_paths: [output/]\n"),
            ["filesystem.writable_paths[0]: /output overlaps /output/template.txt of filesystem.readonly_inputs[0]: mounts may not nest"]
        );
        assert_eq!(
            violations("filesystem:\n  readonly_inputs: [input/]\n  writable_paths: [input]\n"),
            ["filesystem.writable_paths[0]: duplicates the target /input of filesystem.readonly_inputs[0]"]
        );
    }

    #[test]
    fn output_allowlist_must_lie_inside_a_writable_path() {
        assert_eq!(
            violations(
                "filesystem:\n  writable_paths: [output/, tmp/]\n  \
                 output_allowlist: [output/*.pdf, input/report.pdf, output, /outputs/x]\n"
            ),
            [
                "filesystem.output_allowlist[1]: must lie inside a writable path (/output, /tmp)",
                "filesystem.output_allowlist[2]: must lie inside a writable path (/output, /tmp)",
                "filesystem.output_allowlist[3]: must lie inside a writable path (/output, /tmp)",
            ]
        );
        assert_eq!(
            violations("filesystem:\n  writable_paths: []\n  output_allowlist: [out/x]\n"),
            ["filesystem.output_allowlist[0]: must lie inside a writable path (there are none)"]
        );
    }

    #[test]
    fn a_double_star_glob_is_accepted_inside_a_writable_path_only() {
        assert_eq!(
            violations(
                "filesystem:\n  writable_paths: [output/]\n  \
                 output_allowlist: ['output/**', 'output/**/*.txt', '**', '/**/x']\n"
            ),
            [
                "filesystem.output_allowlist[2]: must lie inside a writable path (/output)",
                "filesystem.output_allowlist[3]: must lie inside a writable path (/output)",
            ]
        );
    }

    #[test]
    fn writable_size_is_bounded() {
        assert_eq!(
            violations("filesystem:\n  writable_paths:\n    - { path: /out, size_mb: 0 }\n    - { path: /big, size_mb: 4097 }\n"),
            [
                "filesystem.writable_paths[0].size_mb: must be at least 1",
                "filesystem.writable_paths[1].size_mb: must be at most 4096",
            ]
        );
    }

    #[test]
    fn writable_exec_is_a_bool_and_nothing_else() {
        assert_valid("filesystem:\n  writable_paths:\n    - { path: /out, exec: false }\n");
        let error = parse_contract(
            "filesystem:\n  writable_paths:\n    - { path: /out, exec: sometimes }\n",
            ContractFormat::Yaml,
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("writable_paths"), "{error}");
        let error = parse_contract(
            "filesystem:\n  writable_paths:\n    - { path: /out, executable: true }\n",
            ContractFormat::Yaml,
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("executable: unknown field"), "{error}");
    }

    #[test]
    fn deny_mode_takes_no_domains() {
        assert_eq!(
            violations("network:\n  mode: deny\n  allowed_domains: [example.org]\n"),
            ["network.allowed_domains: must be empty when network.mode is deny"]
        );
    }

    #[test]
    fn allowlist_mode_needs_domains() {
        assert_eq!(
            violations("network:\n  mode: allowlist\n"),
            ["network.allowed_domains: must name at least one destination when network.mode is allowlist"]
        );
    }

    #[test]
    fn bad_domain_patterns_are_refused_with_a_reason() {
        let cases = [
            ("", "must not be empty"),
            ("exa mple.org", "must not contain spaces"),
            ("https://example.org", "must be a host name, not a URL"),
            ("example.org/path", "must be a host name, not a URL"),
            ("10.0.0.1", "must be a DNS name, not an IP address literal"),
            (
                "169.254.169.254:80",
                "must be a DNS name, not an IP address literal",
            ),
            ("[::1]:443", "must be a DNS name, not an IP address literal"),
            ("::1", "must be a DNS name, not an IP address literal"),
            ("example..org", "must not have an empty label"),
            ("example.org.", "must not have an empty label"),
            ("*", "`*` is only allowed as a single leading `*.` label"),
            ("*.", "must not have an empty label"),
            (
                "*.*.example.org",
                "`*` is only allowed as a single leading `*.` label",
            ),
            (
                "api.*.example.org",
                "`*` is only allowed as a single leading `*.` label",
            ),
            (
                "*example.org",
                "`*` is only allowed as a single leading `*.` label",
            ),
            (
                "*.org",
                "a `*.` wildcard must cover a domain of at least two labels",
            ),
            (
                "exa_mple.org",
                "label `exa_mple` may contain only letters, digits and `-`",
            ),
            ("-bad.org", "label `-bad` must not start or end with `-`"),
            ("example.org:0", "port `0` must be a number from 1 to 65535"),
            (
                "example.org:65536",
                "port `65536` must be a number from 1 to 65535",
            ),
            (
                "example.org:+443",
                "port `+443` must be a number from 1 to 65535",
            ),
            ("example.org:", "port `` must be a number from 1 to 65535"),
        ];
        for (pattern, reason) in cases {
            assert_eq!(
                parse_destination(pattern)
                    .as_ref()
                    .err()
                    .map(String::as_str),
                Some(reason),
                "{pattern:?}"
            );
        }
        assert_eq!(
            violations(
                "network:\n  mode: allowlist\n  allowed_domains: [ok.test, 'https://x.test']\n"
            ),
            ["network.allowed_domains[1]: must be a host name, not a URL"]
        );
    }

    #[test]
    fn good_domain_patterns_are_lower_cased_with_ports() {
        let rule = parse_destination("API.Test").unwrap();
        assert_eq!(
            (rule.host_pattern.as_str(), rule.ports),
            ("api.test", vec![443, 80])
        );
        let rule = parse_destination("*.Pkg.test:8443").unwrap();
        assert_eq!(
            (rule.host_pattern.as_str(), rule.ports),
            ("*.pkg.test", vec![8443])
        );
        assert!(parse_destination("localhost").is_ok());
        assert!(parse_destination("x1.example-2.org").is_ok());
    }

    #[test]
    fn the_same_domain_twice_is_refused() {
        assert_eq!(
            violations("network:\n  mode: allowlist\n  allowed_domains: [a.test, A.test:8080]\n"),
            ["network.allowed_domains[1]: a.test is already allowed by network.allowed_domains[0]: list its ports once"]
        );
    }

    #[test]
    fn reserved_env_names_are_refused_in_either_case() {
        assert_eq!(
            violations("env:\n  HTTPS_PROXY: http://evil\n  no_proxy: '*'\n  Lang: C\n"),
            [
                "env.HTTPS_PROXY: is reserved: airlock sets the proxy variables itself",
                "env.no_proxy: is reserved: airlock sets the proxy variables itself",
            ]
        );
    }

    #[test]
    fn env_names_and_values_are_checked() {
        assert_eq!(
            violations("env:\n  1ST: x\n  A-B: x\n  OK: \"a\\0b\"\n"),
            [
                "env.1ST: must match [A-Za-z_][A-Za-z0-9_]*",
                "env.A-B: must match [A-Za-z_][A-Za-z0-9_]*",
                "env.OK: must not contain NUL",
            ]
        );
        assert_valid("env:\n  _X1: a\n  TOKEN: { value: s3cret, secret: true }\n");
    }

    #[test]
    fn http_rules_are_checked() {
        let network = "network:\n  mode: allowlist\n  allowed_domains: [\"api.test:8080\", \"*.pypi.test\"]\n  http_rules:\n";
        assert_eq!(
            violations(&format!(
                "{network}    - {{ host: other.test, methods: [GET] }}\n    - {{ host: API.test, methods: [get], path_prefixes: [v1] }}\n    - {{ host: api.test }}\n"
            )),
            [
                "network.http_rules[0].host: must be a host of network.allowed_domains (without its port)",
                "network.http_rules[1].methods: each must be an upper-case method name",
                "network.http_rules[1].path_prefixes: each must start with `/`",
                "network.http_rules[2].host: duplicates network.http_rules[1].host",
            ]
        );
        assert_valid(&format!(
            "{network}    - {{ host: '*.pypi.test', methods: [GET], path_prefixes: [/simple/] }}\n"
        ));
    }

    #[test]
    fn secret_uses_are_checked() {
        assert_eq!(
            violations(
                "network:\n  mode: allowlist\n  allowed_domains: [api.test]\n\
                 credentials:\n  - { name: store, env: STORE_TOKEN, from_env: X }\n\
                 secrets:\n  - { name: api, env: API_TOKEN }\n  - { name: api, env: STORE_TOKEN }\n  \
                 - { name: 'a b', env: API_TOKEN }\n  - { name: c, env: https_proxy }\n"
            ),
            [
                "secrets[1].name: duplicates secrets[0].name",
                "secrets[1].env: is already set by the cell's environment",
                "secrets[2].name: must be non-empty and contain only letters, digits, `_`, `.` and `-`",
                "secrets[2].env: duplicates secrets[0].env",
                "secrets[3].env: is reserved: airlock sets the proxy variables itself",
            ]
        );
        assert_eq!(
            violations("secrets:\n  - { name: api, env: API_TOKEN }\n"),
            ["secrets: needs network.mode allowlist: only the egress proxy can use a secret"]
        );
        assert_valid(
            "network:\n  mode: allowlist\n  allowed_domains: [api.test]\nsecrets:\n  - { name: api, env: API_TOKEN }\n",
        );
    }

    #[test]
    fn credentials_are_checked() {
        assert_eq!(
            violations(
                "env:\n  API: x\ncredentials:\n  - { name: store, env: STORE_TOKEN, from_env: AIRLOCK_STORE_TOKEN }\n  \
                 - { name: store, env: HTTP_PROXY, from_env: X }\n  - { name: 'a b', env: API, from_env: '9' }\n  \
                 - { name: c, env: STORE_TOKEN, from_env: FROM }\n  - { name: d, env: PATH, from_env: FROM }\n"
            ),
            [
                "credentials[1].name: duplicates credentials[0].name",
                "credentials[1].env: is reserved: airlock sets the proxy variables itself",
                "credentials[2].name: must be non-empty and contain only letters, digits, `_`, `.` and `-`",
                "credentials[2].env: is already set by the cell's environment",
                "credentials[2].from_env: must match [A-Za-z_][A-Za-z0-9_]*",
                "credentials[3].env: duplicates credentials[0].env",
                "credentials[4].env: is already set by the cell's environment",
            ]
        );
    }

    #[test]
    fn hostname_is_an_rfc_1123_label() {
        for bad in ["", "-cell", "cell-", "a.b", "under_score", &"x".repeat(64)] {
            let yaml = format!("hostname: '{bad}'\n");
            assert_eq!(
                violations(&yaml),
                ["hostname: must be an RFC 1123 label: 1-63 letters, digits or `-`, not starting or ending with `-`"],
                "{bad:?}"
            );
        }
        assert_valid("hostname: build-7\n");
    }

    #[test]
    fn workdir_must_be_absolute_and_inside_a_mount() {
        assert_eq!(
            violations("workdir: tmp\n"),
            ["workdir: must be an absolute path"]
        );
        assert_eq!(
            violations("workdir: /home/agent\n"),
            ["workdir: must be `/` or lie inside a readonly input or writable path"]
        );
        assert_valid("workdir: /\n");
        assert_valid("workdir: /tmp/work/\n");
    }

    #[test]
    fn image_must_be_named() {
        assert_eq!(violations("image: ''\n"), ["image: must not be empty"]);
        assert_eq!(
            violations("image: 'a b'\n"),
            ["image: must not contain whitespace or control characters"]
        );
    }
}
