//! `linux.cgroupsPath` of a container's spec -> where its cgroup is, relative to each
//! hierarchy's root (pure). Two forms, as runc reads them:
//!
//! - cgroupfs (the default): an absolute path below each hierarchy's root
//!   (`/kubepods/burstable/pod<uid>/<id>`, containerd's `/<namespace>/<id>`). runc reads
//!   a relative path as relative to its own cgroup; airlock refuses it instead: the
//!   runtime's own cgroup is the shim's, which is no place the caller can mean.
//! - systemd (the global `--systemd-cgroup`): `slice:prefix:name`, the scope
//!   `<prefix>-<name>.scope` in the slice, whose path systemd derives from its name
//!   (`kubepods-burstable-pod1.slice` -> `kubepods.slice/kubepods-burstable.slice/
//!   kubepods-burstable-pod1.slice`). airlock does not ask systemd over D-Bus for the
//!   scope: it makes the same directories itself.
//!
//! Refused: `..` or `.` components (the path must stay below the root), the root cgroup
//! itself, an empty component, a newline (it would forge a line of `/proc/<pid>/cgroup`),
//! and a systemd form that is not three fields or whose slice systemd would not accept.

use std::path::PathBuf;

/// Why a `linux.cgroupsPath` is refused; the message names the path and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config.json linux.cgroupsPath ({path}): {rule}")]
pub struct CgroupsPathRefusal {
    pub path: String,
    pub rule: String,
}

/// The container's cgroup below each hierarchy's root (no leading `/`, never empty).
pub fn container_cgroup(path: &str, systemd: bool) -> Result<PathBuf, CgroupsPathRefusal> {
    let refuse = |rule: &str| CgroupsPathRefusal {
        path: path.to_owned(),
        rule: rule.to_owned(),
    };
    if path.contains('\n') || path.contains('\0') {
        return Err(refuse("a newline or NUL in a cgroup path is refused"));
    }
    let relative = if systemd {
        systemd_path(path).map_err(|rule| refuse(&rule))?
    } else {
        cgroupfs_path(path).map_err(|rule| refuse(&rule))?
    };
    if relative.is_empty() {
        return Err(refuse(
            "the root cgroup is never a container's (it holds the host's processes)",
        ));
    }
    Ok(relative.iter().collect())
}

/// The components of an absolute cgroupfs path.
fn cgroupfs_path(path: &str) -> Result<Vec<String>, String> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err(
            "a relative cgroup path (relative to the runtime's own cgroup, as runc reads it) is refused: give an absolute one".into(),
        );
    };
    let components: Vec<&str> = rest.split('/').filter(|c| !c.is_empty()).collect();
    for component in &components {
        if *component == ".." || *component == "." {
            return Err(format!(
                "the component `{component}` is refused: the path must stay below the hierarchy's root as written"
            ));
        }
    }
    Ok(components.into_iter().map(str::to_owned).collect())
}

/// `slice:prefix:name` -> the slice's path, then `<prefix>-<name>.scope`.
fn systemd_path(path: &str) -> Result<Vec<String>, String> {
    let fields: Vec<&str> = path.split(':').collect();
    let [slice, prefix, name] = fields.as_slice() else {
        return Err("with --systemd-cgroup the path is `slice:prefix:name`".into());
    };
    if name.is_empty() {
        return Err("the name (third field) is empty".into());
    }
    for (what, field) in [("prefix", prefix), ("name", name)] {
        if field.contains('/') || matches!(*field, ".." | ".") {
            return Err(format!("the {what} `{field}` is not a unit name"));
        }
    }
    if name.ends_with(".slice") {
        return Err(
            "a slice as the container's unit is not supported: give a name for a scope".into(),
        );
    }
    let mut components = expand_slice(if slice.is_empty() {
        "system.slice"
    } else {
        slice
    })?;
    components.push(match prefix.is_empty() {
        true => format!("{name}.scope"),
        false => format!("{prefix}-{name}.scope"),
    });
    Ok(components)
}

/// A slice's path as systemd makes it: every dash-separated prefix is a parent slice
/// (`a-b-c.slice` -> `a.slice/a-b.slice/a-b-c.slice`); `-.slice` is the root.
pub fn expand_slice(slice: &str) -> Result<Vec<String>, String> {
    let invalid = || format!("`{slice}` is not a slice name systemd accepts");
    let Some(stem) = slice.strip_suffix(".slice") else {
        return Err(invalid());
    };
    if slice == "-.slice" {
        return Ok(Vec::new());
    }
    if stem.is_empty()
        || slice.contains('/')
        || stem.starts_with('-')
        || stem.ends_with('-')
        || stem.contains("--")
    {
        return Err(invalid());
    }
    let mut components = Vec::new();
    let mut prefix = String::new();
    for part in stem.split('-') {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        components.push(format!("{prefix}.slice"));
    }
    Ok(components)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn rule(path: &str, systemd: bool) -> String {
        container_cgroup(path, systemd).unwrap_err().to_string()
    }

    #[test]
    fn a_cgroupfs_path_is_taken_below_each_hierarchys_root() {
        assert_eq!(
            container_cgroup("/kubepods/burstable/pod1/abc", false).unwrap(),
            Path::new("kubepods/burstable/pod1/abc")
        );
        assert_eq!(
            container_cgroup("/default//c1/", false).unwrap(),
            Path::new("default/c1"),
            "empty components are the same directory, as the kernel reads them"
        );
    }

    #[test]
    fn dot_dot_a_relative_path_and_the_root_are_refused() {
        let error = rule("/kubepods/../../etc", false);
        assert!(
            error.contains("linux.cgroupsPath (/kubepods/../../etc)"),
            "{error}"
        );
        assert!(error.contains("`..` is refused"), "{error}");
        assert!(rule("/a/./b", false).contains("`.` is refused"));
        assert!(rule("kubepods/c1", false).contains("relative cgroup path"));
        for root in ["/", "//", "///"] {
            assert!(rule(root, false).contains("root cgroup"), "{root}");
        }
        assert!(rule("/a\nb", false).contains("newline"));
    }

    #[test]
    fn a_systemd_path_is_the_scope_in_the_expanded_slice() {
        assert_eq!(
            container_cgroup("kubepods-burstable-pod1.slice:cri-containerd:abc", true).unwrap(),
            Path::new(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-abc.scope"
            )
        );
        assert_eq!(
            container_cgroup(":runc:c1", true).unwrap(),
            Path::new("system.slice/runc-c1.scope"),
            "no slice: system.slice, as runc"
        );
        assert_eq!(
            container_cgroup("-.slice::c1", true).unwrap(),
            Path::new("c1.scope"),
            "the root slice, no prefix"
        );
    }

    #[test]
    fn systemd_paths_systemd_would_not_accept_are_refused() {
        assert!(rule("/kubepods/c1", true).contains("slice:prefix:name"));
        assert!(rule("a.slice:p", true).contains("slice:prefix:name"));
        assert!(rule("a.slice:p:", true).contains("name (third field) is empty"));
        for slice in [
            "kubepods",
            "-a.slice",
            "a-.slice",
            "a--b.slice",
            "a/b.slice",
            ".slice",
        ] {
            let error = rule(&format!("{slice}:p:c1"), true);
            assert!(error.contains("not a slice name"), "{slice}: {error}");
        }
        assert!(rule("a.slice:p:..", true).contains("not a unit name"));
        assert!(rule("a.slice:../x:c1", true).contains("not a unit name"));
        assert!(rule("a.slice:p:b.slice", true).contains("not supported"));
    }
}
