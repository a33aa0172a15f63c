//! The contract's OCI image, resolved where the contract is loaded (compile stays pure):
//! the reference against `[images]`, the record in the state directory's image store, its
//! unpacked layers, the merged view's top-level and `/etc` entries and the config's
//! process defaults, and the lease the run holds for the cell's life.

use crate::config::ImagesConfig;
use airlock_cell::report::ResultClass;
use airlock_contract::{CellIdentity, ImageDefaults, ResolvedImage};
use airlock_images::merged::{merged_entries, merged_file, MergedKind};
use airlock_images::oci::ProcessDefaults;
use airlock_images::{ImageError, ImageRef, ImageStore, Lease};
use std::path::{Path, PathBuf};

/// Why the image cannot be the cell's root, with the run's class.
pub type Refused = (ResultClass, String);

/// Resolves `image` (the contract's field) through the store of `state_dir`, and takes
/// the lease that keeps `airlock image rm` from removing it while the cell lives.
pub fn resolve(
    image: &str,
    config: &ImagesConfig,
    state_dir: &Path,
) -> Result<(ResolvedImage, Lease), Refused> {
    let registry = config.default_registry.as_deref();
    // A reference the operator's policy refuses (unpinned, malformed) is the contract's
    // fault: policy_denied. An image this host lacks is sandbox_unavailable, like an
    // allowlisted name the configuration cannot resolve: the run could work elsewhere.
    let denied = |e: ImageError| (ResultClass::PolicyDenied, format!("image: {e}"));
    let reference = ImageRef::parse(image, registry).map_err(denied)?;
    airlock_images::registry::check_pinned(&reference, config.allow_tags).map_err(denied)?;
    let unavailable = |e: ImageError| {
        (
            ResultClass::SandboxUnavailable,
            format!(
                "image {image}: {e}; fetch it first with `airlock image pull {image}` or \
                 `airlock image import FILE` (state directory {})",
                state_dir.display()
            ),
        )
    };
    let store = ImageStore::open(state_dir, config.limits()).map_err(unavailable)?;
    let record = store
        .resolve(&reference, config.allow_tags)
        .map_err(unavailable)?;
    let lease = store.lease(&record).map_err(unavailable)?;
    let layers = store.layer_dirs(&record).map_err(unavailable)?;
    let image_config = store.config(&record).map_err(unavailable)?;
    let defaults = defaults(&image_config.config, &layers).map_err(|why| {
        (
            ResultClass::SandboxUnavailable,
            format!("image {image}: {why}"),
        )
    })?;
    let listing = |dir: &str| {
        merged_entries(&layers, Path::new(dir))
            .into_iter()
            .map(|(name, kind)| match kind {
                MergedKind::Symlink(target) => (name, Some(target)),
                _ => (name, None),
            })
            .collect()
    };
    let resolved = ResolvedImage {
        reference: record.pinned(),
        digest: record.digest.to_string(),
        top_level: listing(""),
        etc: listing("etc"),
        layers,
        defaults,
    };
    Ok((resolved, lease))
}

/// The config's process defaults as the plan takes them.
fn defaults(config: &ProcessDefaults, layers: &[PathBuf]) -> Result<ImageDefaults, String> {
    let env = config
        .env
        .iter()
        .flatten()
        .filter_map(|entry| entry.split_once('='))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect();
    let user = match config.user.as_deref() {
        None | Some("") => None,
        Some(user) => Some(image_user(user, layers)?),
    };
    let command = config
        .entrypoint
        .iter()
        .flatten()
        .chain(config.cmd.iter().flatten())
        .cloned()
        .collect();
    Ok(ImageDefaults {
        user,
        env,
        working_dir: config.working_dir.as_ref().map(PathBuf::from),
        command,
    })
}

/// `User` (`uid`, `uid:gid`, `name`, `name:group`) as numeric ids: names are looked up in
/// the image's own `/etc/passwd` and `/etc/group`, never the host's.
fn image_user(user: &str, layers: &[PathBuf]) -> Result<CellIdentity, String> {
    let (user_part, group_part) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let passwd = read_db(layers, "etc/passwd");
    let (uid, primary_gid) = match user_part.parse::<u32>() {
        Ok(uid) => (uid, field_where(&passwd, 2, user_part, 3)),
        Err(_) => {
            let fields = passwd
                .iter()
                .find(|f| f.first().map(String::as_str) == Some(user_part))
                .ok_or_else(|| format!("User {user:?}: no such user in the image's /etc/passwd"))?;
            let id = |i: usize| fields.get(i).and_then(|v| v.parse::<u32>().ok());
            (
                id(2).ok_or_else(|| format!("User {user:?}: a malformed /etc/passwd entry"))?,
                id(3),
            )
        }
    };
    let gid = match group_part {
        None => primary_gid.unwrap_or(uid),
        Some(group) => match group.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => field_where(&read_db(layers, "etc/group"), 0, group, 2)
                .ok_or_else(|| format!("User {user:?}: no such group in the image's /etc/group"))?,
        },
    };
    Ok(CellIdentity { uid, gid })
}

/// A colon-separated database of the image, as fields per line.
fn read_db(layers: &[PathBuf], path: &str) -> Vec<Vec<String>> {
    let text = merged_file(layers, Path::new(path)).unwrap_or_default();
    String::from_utf8_lossy(&text)
        .lines()
        .map(|line| line.split(':').map(str::to_owned).collect())
        .collect()
}

/// Numeric field `get` of the first line whose field `key` is `value`.
fn field_where(db: &[Vec<String>], key: usize, value: &str, get: usize) -> Option<u32> {
    db.iter()
        .find(|fields| fields.get(key).map(String::as_str) == Some(value))
        .and_then(|fields| fields.get(get))
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer_with_users() -> tempfile::TempDir {
        let layer = tempfile::tempdir().unwrap();
        std::fs::create_dir(layer.path().join("etc")).unwrap();
        std::fs::write(
            layer.path().join("etc/passwd"),
            "root:x:0:0::/root:/bin/sh\ntool:x:1234:4321::/app:/bin/false\n",
        )
        .unwrap();
        std::fs::write(layer.path().join("etc/group"), "root:x:0:\nstaff:x:50:\n").unwrap();
        layer
    }

    #[test]
    fn a_user_name_is_resolved_in_the_images_own_passwd_and_group() {
        let layer = layer_with_users();
        let layers = [layer.path().to_path_buf()];
        let ids = |user: &str| image_user(user, &layers).map(|c| (c.uid, c.gid));
        assert_eq!(ids("tool"), Ok((1234, 4321)));
        assert_eq!(ids("tool:staff"), Ok((1234, 50)));
        assert_eq!(ids("1234"), Ok((1234, 4321)));
        assert_eq!(ids("1000:1000"), Ok((1000, 1000)));
        assert_eq!(ids("777"), Ok((777, 777)));
        assert!(ids("nobody-here").unwrap_err().contains("no such user"));
        assert!(ids("tool:nogroup").unwrap_err().contains("no such group"));
    }

    #[test]
    fn the_config_gives_env_workdir_and_entrypoint_then_cmd() {
        let layer = layer_with_users();
        let config = ProcessDefaults {
            user: Some("tool".into()),
            env: Some(vec!["A=1".into(), "B=x=y".into(), "broken".into()]),
            entrypoint: Some(vec!["python3".into()]),
            cmd: Some(vec!["/app/tool.py".into()]),
            working_dir: Some("/app".into()),
        };
        let defaults = defaults(&config, &[layer.path().to_path_buf()]).unwrap();
        assert_eq!(
            defaults.env,
            [
                ("A".to_owned(), "1".to_owned()),
                ("B".to_owned(), "x=y".to_owned())
            ]
        );
        assert_eq!(defaults.command, ["python3", "/app/tool.py"]);
        assert_eq!(defaults.working_dir.as_deref(), Some(Path::new("/app")));
        assert_eq!(
            defaults.user,
            Some(CellIdentity {
                uid: 1234,
                gid: 4321
            })
        );
    }
}
