//! What a cell's `/etc` holds: the files the runtime generates, the vetted host entries
//! every cell gets, the host entries it deliberately does not get, the ones no cell ever
//! gets (secrets and the host's identity), and the checks of a contract's own additions
//! (`filesystem.etc_files`).
//!
//! A fixed list, not a scan of the host: the cell's start is measured in tenths of a
//! millisecond. `crates/airlock/tests/cell_environment.rs` walks the host's `/usr` and
//! fails when a symlink there points into `/etc` at something neither provided nor
//! excluded here with a reason.

use crate::contract::EtcFile;
use crate::plan::EtcEntry;
use crate::validate::{host_source, normalise, Errors, NormalPath};
use std::path::PathBuf;

/// Written by the runtime for every cell (see the cell's `rootfs.rs`); a contract cannot
/// replace them.
pub const ETC_GENERATED: &[&str] = &[
    "passwd",
    "group",
    "hosts",
    "hostname",
    "nsswitch.conf",
    "resolv.conf",
];

/// Host `/etc` entries (relative to `/etc`) every cell gets read-only, when the host has
/// them: configuration that programs need to work at all, none of it a secret or specific
/// to the host's identity. The loader cache, `alternatives` (many `/usr/bin` commands are
/// symlinks through it), TLS (CA certificates, `openssl.cnf`), the time zone, the OS's
/// identification, the network databases (`getent services http`), MIME types, locale
/// aliases, the JDK's configuration (`java.security`: without it `javac` fails), Python's
/// `sitecustomize`, fontconfig, ImageMagick's policy, XML catalogs, `man`'s configuration
/// and Maven's launcher. Each present entry is one mount at every start (about 10 µs),
/// so what programs merely *may* read (readline, editor and shell defaults, `gai.conf`,
/// `ld.so.conf`) is left out; a contract adds it with `filesystem.etc_files`.
pub const HOST_ETC_ENTRIES: &[&str] = &[
    "ld.so.cache",
    "alternatives",
    "ssl/certs",
    "ssl/openssl.cnf",
    "localtime",
    "timezone",
    "os-release",
    "debian_version",
    "lsb-release",
    "services",
    "protocols",
    "mime.types",
    "locale.alias",
    "java-11-openjdk",
    "java-17-openjdk",
    "java-21-openjdk",
    "java-25-openjdk",
    "python3.11",
    "python3.12",
    "python3.13",
    "fonts",
    "ImageMagick-6",
    "ImageMagick-7",
    "xml",
    "manpath.config",
    "maven/m2.conf",
    "maven/logging",
    "mtab",
];

/// Host `/etc` entries software on the host points at (a symlink from `/usr`) that a cell
/// does not get by default, and why. A contract can add the harmless ones with
/// `filesystem.etc_files`.
pub const HOST_ETC_EXCLUDED: &[(&str, &str)] = &[
    (
        "environment",
        "the host's login environment: the cell's environment is exactly the plan's",
    ),
    (
        "profile",
        "login shells would replace the plan's PATH and environment",
    ),
    (
        "X11",
        "X server and session configuration: a cell has no display",
    ),
    (
        "maven/settings.xml",
        "may hold repository credentials (`<servers>`)",
    ),
    (
        "gitconfig",
        "may name credential helpers and URL rewrites that carry tokens",
    ),
    (
        "groff",
        "local groff macros: groff and man work without them",
    ),
    (
        "maven/toolchains.xml",
        "the host's registry of JDKs: host-specific, and Maven works without it",
    ),
    ("pip.conf", "may hold package index credentials"),
    ("npmrc", "may hold registry tokens"),
    ("wgetrc", "may hold proxy credentials"),
];

/// Never in a cell, and no contract may add them, replace a directory holding them or
/// take them as a source: secrets (password hashes, keys, credentials) and the host's
/// identity (`machine-id`).
pub const ETC_DENIED: &[&str] = &[
    "shadow",
    "shadow-",
    "gshadow",
    "gshadow-",
    "passwd-",
    "group-",
    ".pwd.lock",
    "subuid",
    "subgid",
    "sudoers",
    "sudoers.d",
    "doas.conf",
    "ssh",
    "ssl/private",
    "pki",
    "security",
    "pam.d",
    "krb5.keytab",
    "machine-id",
    "hostid",
    "apt/auth.conf",
    "apt/auth.conf.d",
    "docker",
    "containerd",
    "NetworkManager",
    "wpa_supplicant",
    "ppp",
    "ipsec.secrets",
    "ldap.secret",
    "libvirt",
    "credstore",
    "credstore.encrypted",
    "airlock",
];

/// A contract's `/etc` addition that passed validation.
pub(crate) struct CheckedEtcFile {
    /// Index in `filesystem.etc_files`, for error messages.
    index: usize,
    pub source: NormalPath,
    pub target: NormalPath,
}

/// Components of `name` (relative to `/etc`) as a cell path.
fn etc_path(name: &str) -> Vec<String> {
    std::iter::once("etc")
        .chain(name.split('/'))
        .map(str::to_owned)
        .collect()
}

/// `a` equals `b` or lies inside it.
fn within(a: &[String], b: &[String]) -> bool {
    a.len() >= b.len() && a[..b.len()] == b[..]
}

/// Why `path` (components, `etc` first) may not appear in a cell, if it may not.
fn denied_rule(path: &[String]) -> Option<String> {
    let denied = ETC_DENIED
        .iter()
        .map(|name| etc_path(name))
        .find(|denied| within(path, denied) || within(denied, path))?;
    let shown = format!("/{}", denied.join("/"));
    Some(if within(path, &denied) {
        format!("{shown} is a secret or the host's identity: never given to a cell")
    } else {
        format!(
            "would bring {shown}, a secret or the host's identity, into the cell: name the files needed instead"
        )
    })
}

/// The rule a contract's `/etc` target breaks, if any.
fn target_rule(target: &NormalPath) -> Option<String> {
    let components = &target.components;
    if components.first().map(String::as_str) != Some("etc") {
        return Some("must lie under /etc".to_owned());
    }
    if components.len() == 1 {
        return Some("must name a file below /etc, not /etc itself".to_owned());
    }
    if let Some(generated) = ETC_GENERATED
        .iter()
        .find(|name| within(components, &etc_path(name)))
    {
        return Some(format!(
            "/etc/{generated} is generated by the runtime and cannot be replaced"
        ));
    }
    if let Some(rule) = denied_rule(components) {
        return Some(rule);
    }
    HOST_ETC_ENTRIES
        .iter()
        .map(|name| etc_path(name))
        .find(|host| within(components, host) && components.len() > host.len())
        .map(|host| {
            format!(
                "lies inside /{}, which the cell gets from the host: replace it whole or choose another path",
                host.join("/")
            )
        })
}

/// The rule a contract's host source breaks, if any: under the host's `/etc`, the deny
/// list applies to what is read as well as to where it goes.
fn source_rule(source: &NormalPath) -> Option<String> {
    if !source.absolute || source.components.first().map(String::as_str) != Some("etc") {
        return None;
    }
    denied_rule(&source.components)
}

/// Checks `filesystem.etc_files`: targets under `/etc`, none generated, denied, inside a
/// vetted host directory, or overlapping another.
pub(crate) fn check_etc_files(files: &[EtcFile], errors: &mut Errors) -> Vec<CheckedEtcFile> {
    let mut checked: Vec<CheckedEtcFile> = Vec::new();
    for (index, file) in files.iter().enumerate() {
        let field = format!("filesystem.etc_files[{index}]");
        let (source_field, target_field, source, target) = match file {
            EtcFile::Path(raw) => {
                let parsed = match normalise(raw) {
                    Ok(path) if path.absolute => Some(path),
                    Ok(_) => {
                        errors.push(&field, "must be an absolute host path under /etc");
                        None
                    }
                    Err(rule) => {
                        errors.push(&field, rule);
                        None
                    }
                };
                (field.clone(), field, parsed.clone(), parsed)
            }
            EtcFile::Mapped(mapped) => {
                let source_field = format!("{field}.source");
                let target_field = format!("{field}.target");
                let source = host_source(&source_field, &mapped.source, errors);
                let target = match normalise(&mapped.target) {
                    Ok(target) => Some(NormalPath {
                        absolute: true,
                        ..target
                    }),
                    Err(rule) => {
                        errors.push(&target_field, rule);
                        None
                    }
                };
                (source_field, target_field, source, target)
            }
        };
        let (Some(source), Some(target)) = (source, target) else {
            continue;
        };
        if let Some(rule) = target_rule(&target) {
            errors.push(&target_field, rule);
            continue;
        }
        if let Some(rule) = source_rule(&source) {
            errors.push(&source_field, rule);
            continue;
        }
        if let Some(rule) = overlap_rule(&checked, &target) {
            errors.push(&target_field, rule);
            continue;
        }
        checked.push(CheckedEtcFile {
            index,
            source,
            target,
        });
    }
    checked
}

fn overlap_rule(earlier: &[CheckedEtcFile], target: &NormalPath) -> Option<String> {
    earlier.iter().find_map(|other| {
        let index = other.index;
        let (a, b) = (&target.components, &other.target.components);
        if a == b {
            Some(format!(
                "duplicates the target {} of filesystem.etc_files[{index}]",
                target.cell_path()
            ))
        } else if within(a, b) || within(b, a) {
            Some(format!(
                "{} overlaps {} of filesystem.etc_files[{index}]: entries may not nest",
                target.cell_path(),
                other.target.cell_path()
            ))
        } else {
            None
        }
    })
}

/// The cell's `/etc` entries: the vetted host entries a contract entry does not replace
/// (the same path, or one inside a contract directory), then the contract's entries.
pub(crate) fn etc_plan(
    files: &[CheckedEtcFile],
    host_path: impl Fn(&str) -> PathBuf,
) -> Vec<EtcEntry> {
    let host = HOST_ETC_ENTRIES
        .iter()
        .filter(|name| {
            let path = etc_path(name);
            !files.iter().any(|f| within(&path, &f.target.components))
        })
        .map(|name| EtcEntry::Host {
            path: PathBuf::from(format!("/etc/{name}")),
        });
    let added = files.iter().map(|file| EtcEntry::Contract {
        source: host_path(&file.source.host_path()),
        target: PathBuf::from(file.target.cell_path()),
    });
    host.chain(added).collect()
}

/// The `/etc` of a cell with an OCI image root: the image's own entries (never the
/// host's) except the generated ones and those a contract entry replaces, then the
/// contract's entries. The image's `shadow`, if it has one, is the image's.
pub(crate) fn image_etc_plan(
    files: &[CheckedEtcFile],
    image_etc: &[(String, Option<PathBuf>)],
    host_path: impl Fn(&str) -> PathBuf,
) -> Vec<EtcEntry> {
    let image = image_etc
        .iter()
        .filter(|(name, _)| !ETC_GENERATED.contains(&name.as_str()))
        .filter(|(name, _)| {
            let path = etc_path(name);
            !files.iter().any(|f| within(&path, &f.target.components))
        })
        .map(|(name, link)| EtcEntry::Image {
            path: PathBuf::from(format!("/etc/{name}")),
            link: link.clone(),
        });
    let added = files.iter().map(|file| EtcEntry::Contract {
        source: host_path(&file.source.host_path()),
        target: PathBuf::from(file.target.cell_path()),
    });
    image.chain(added).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conflicts(list: &[&str], other: &[&str]) -> Vec<String> {
        let mut found = Vec::new();
        for a in list {
            for b in other {
                let (pa, pb) = (etc_path(a), etc_path(b));
                if within(&pa, &pb) || within(&pb, &pa) {
                    found.push(format!("{a} / {b}"));
                }
            }
        }
        found
    }

    #[test]
    fn no_vetted_host_entry_is_denied_generated_or_excluded() {
        let excluded: Vec<&str> = HOST_ETC_EXCLUDED.iter().map(|(name, _)| *name).collect();
        assert_eq!(
            conflicts(HOST_ETC_ENTRIES, ETC_DENIED),
            Vec::<String>::new()
        );
        assert_eq!(
            conflicts(HOST_ETC_ENTRIES, ETC_GENERATED),
            Vec::<String>::new()
        );
        assert_eq!(conflicts(HOST_ETC_ENTRIES, &excluded), Vec::<String>::new());
    }

    fn violations(yaml: &str) -> Vec<String> {
        match crate::parse_contract(yaml, crate::ContractFormat::Yaml) {
            Err(crate::ContractError::Invalid(errors)) => {
                errors.iter().map(ToString::to_string).collect()
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    fn plan_of(yaml: &str) -> Vec<EtcEntry> {
        let contract = crate::parse_contract(yaml, crate::ContractFormat::Yaml).unwrap();
        let argv = ["true".to_owned()];
        let input = crate::CompileInput::new(std::path::Path::new("/jobs/7"), &argv);
        crate::compile(&contract, &input).unwrap().etc
    }

    #[test]
    fn a_contract_cannot_add_secrets_generated_files_or_paths_outside_etc() {
        assert_eq!(
            violations(
                "filesystem:\n  etc_files:\n    - /etc/shadow\n    - /etc/ssh/ssh_config\n    \
                 - { source: files/passwd, target: /etc/passwd }\n    - /srv/app.conf\n    \
                 - { source: x.conf, target: /usr/x.conf }\n    - /etc\n    - etc/pip.conf\n    \
                 - { source: /etc/shadow, target: /etc/not-a-secret }\n    \
                 - { source: /etc/ssl, target: /etc/myssl }\n    - /etc/ssl/certs/extra.pem\n"
            ),
            [
                "filesystem.etc_files[0]: /etc/shadow is a secret or the host's identity: never given to a cell",
                "filesystem.etc_files[1]: /etc/ssh is a secret or the host's identity: never given to a cell",
                "filesystem.etc_files[2].target: /etc/passwd is generated by the runtime and cannot be replaced",
                "filesystem.etc_files[3]: must lie under /etc",
                "filesystem.etc_files[4].target: must lie under /etc",
                "filesystem.etc_files[5]: must name a file below /etc, not /etc itself",
                "filesystem.etc_files[6]: must be an absolute host path under /etc",
                "filesystem.etc_files[7].source: /etc/shadow is a secret or the host's identity: never given to a cell",
                "filesystem.etc_files[8].source: would bring /etc/ssl/private, a secret or the host's identity, into the cell: name the files needed instead",
                "filesystem.etc_files[9]: lies inside /etc/ssl/certs, which the cell gets from the host: replace it whole or choose another path",
            ]
        );
    }

    #[test]
    fn contract_etc_files_may_not_repeat_or_nest() {
        assert_eq!(
            violations(
                "filesystem:\n  etc_files:\n    - /etc/pip.conf\n    - { source: a, target: /etc/pip.conf }\n    \
                 - { source: d, target: /etc/app }\n    - { source: f, target: etc/app/f.conf }\n"
            ),
            [
                "filesystem.etc_files[1].target: duplicates the target /etc/pip.conf of filesystem.etc_files[0]",
                "filesystem.etc_files[3].target: /etc/app/f.conf overlaps /etc/app of filesystem.etc_files[2]: entries may not nest",
            ]
        );
    }

    #[test]
    fn the_plan_has_the_vetted_host_entries_then_the_contracts() {
        let plan = plan_of("{}");
        let expected: Vec<EtcEntry> = HOST_ETC_ENTRIES
            .iter()
            .map(|name| EtcEntry::Host {
                path: PathBuf::from(format!("/etc/{name}")),
            })
            .collect();
        assert_eq!(plan, expected);
        let plan = plan_of(
            "filesystem:\n  etc_files:\n    - /etc/gitconfig\n    - { source: conf/java, target: /etc/java-17-openjdk }\n    \
             - { source: /srv/services, target: /etc/services }\n",
        );
        let replaced = plan.iter().filter(|entry| {
            matches!(entry, EtcEntry::Host { path }
                if path.ends_with("java-17-openjdk") || path.ends_with("services"))
        });
        assert_eq!(replaced.count(), 0, "replaced host entries stay out");
        assert_eq!(plan.len(), HOST_ETC_ENTRIES.len() + 1);
        assert_eq!(
            plan[plan.len() - 3..],
            [
                EtcEntry::Contract {
                    source: "/etc/gitconfig".into(),
                    target: "/etc/gitconfig".into()
                },
                EtcEntry::Contract {
                    source: "/jobs/7/conf/java".into(),
                    target: "/etc/java-17-openjdk".into()
                },
                EtcEntry::Contract {
                    source: "/srv/services".into(),
                    target: "/etc/services".into()
                },
            ]
        );
    }

    #[test]
    fn vetted_host_entries_are_unique_and_do_not_nest() {
        for (i, a) in HOST_ETC_ENTRIES.iter().enumerate() {
            for b in &HOST_ETC_ENTRIES[i + 1..] {
                let (pa, pb) = (etc_path(a), etc_path(b));
                assert!(!within(&pa, &pb) && !within(&pb, &pa), "{a} / {b}");
            }
        }
    }
}
