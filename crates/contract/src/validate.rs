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

    fn contains(&self, other: &NormalPath) -> bool {
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
    let destinations = check_network(&contract.network, &mut errors);
    check_resources(&contract.resources, &mut errors);
    check_env(&contract.env, &mut errors);
    check_credentials(&contract.credentials, &contract.env, &mut errors);
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
        })
    } else {
        Err(errors.0)
    }
}

#[derive(Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn push(&mut self, path: impl Into<String>, rule: impl Into<String>) {
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
    for (field, id) in [("identity.uid", identity.uid), ("identity.gid", identity.gid)] {
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

fn normalise(raw: &str) -> Result<NormalPath, &'static str> {
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
        Ok(target) => target,
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

fn host_source(path: &str, raw: &str, errors: &mut Errors) -> Option<NormalPath> {
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
                source.zip(target).map(|(source, target)| CheckedInput { source, target })
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
        let (target_field, raw, size_mb) = match entry {
            WritablePath::Path(raw) => (field, raw, DEFAULT_WRITABLE_SIZE_MB),
            WritablePath::Sized(sized) => {
                check_bounds(
                    &format!("{field}.size_mb"),
                    sized.size_mb,
                    WRITABLE_SIZE_MB_BOUNDS,
                    errors,
                );
                (format!("{field}.path"), &sized.path, sized.size_mb)
            }
        };
        if let Some(target) = cell_target(&target_field, raw, errors) {
            writable.push(CheckedWritable {
                target,
                size_bytes: u64::try_from(size_mb).unwrap_or(0) * MIB,
            });
            writable_fields.push(target_field);
        }
    }

    let all_mounts: Vec<(&String, &NormalPath)> = input_fields
        .iter()
        .zip(inputs.iter().map(|i| &i.target))
        .chain(writable_fields.iter().zip(writable.iter().map(|w| &w.target)))
        .collect();
    for (later, (later_field, later_target)) in all_mounts.iter().enumerate() {
        for (earlier_field, earlier_target) in &all_mounts[..later] {
            if earlier_target == later_target {
                errors.push(
                    *later_field,
                    format!(
                        "duplicates the target {} of {earlier_field}",
                        later_target.cell_path()
                    ),
                );
            } else if earlier_target.contains(later_target) || later_target.contains(earlier_target) {
                errors.push(
                    *later_field,
                    format!(
                        "{} overlaps {} of {earlier_field}: mounts may not nest",
                        later_target.cell_path(),
                        earlier_target.cell_path()
                    ),
                );
            }
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
pub(crate) fn parse_destination(entry: &str) -> Result<DestinationRule, String> {
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
            return Err(format!("label `{label}` must be at most 63 characters long"));
        }
        if !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
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
        host_pattern: if wildcard { format!("*.{name}") } else { name.to_owned() },
        ports,
    })
}

fn check_resources(resources: &Resources, errors: &mut Errors) {
    let checks = [
        ("cpu_millis", resources.cpu_millis, CPU_MILLIS_BOUNDS),
        ("memory_mb", resources.memory_mb, MEMORY_MB_BOUNDS),
        ("process_limit", resources.process_limit, PROCESS_LIMIT_BOUNDS),
        (
            "wall_time_seconds",
            resources.wall_time_seconds,
            WALL_TIME_SECONDS_BOUNDS,
        ),
        ("output_bytes", resources.output_bytes, OUTPUT_BYTES_BOUNDS),
        ("open_files", resources.open_files, OPEN_FILES_BOUNDS),
        ("file_size_mb", resources.file_size_mb, FILE_SIZE_MB_BOUNDS),
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
        && hostname.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
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

fn check_seccomp_profile(profile: &str, errors: &mut Errors) -> Option<NormalPath> {
    if profile == DEFAULT_SECCOMP_PROFILE {
        return None;
    }
    host_source("seccomp_profile", profile, errors)
}
