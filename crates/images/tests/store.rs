//! The image store through its public API: import of OCI layouts (directory and tar) and
//! legacy `docker save` archives, digest verification of every blob, platform selection,
//! leases against `remove`, and `gc`.

use airlock_images::import::import;
use airlock_images::layout::{write_blobs, write_index, write_layout, NewImage};
use airlock_images::oci::{self, Descriptor, Index, Platform};
use airlock_images::{Digest, ImageError, ImageRef, ImageStore, Limits};
use std::fs;
use std::path::Path;

fn require_root() -> bool {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        == Some("0");
    if !root && std::env::var_os("AIRLOCK_ALLOW_SKIPPED_ROOT_TESTS").is_none() {
        panic!("the store unpacks layers (ownership, whiteouts) and needs root; set AIRLOCK_ALLOW_SKIPPED_ROOT_TESTS=1 to skip");
    }
    root
}

/// An honest layer: files with contents and modes.
fn layer(files: &[(&str, &str, u32)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, content, mode) in files {
        let mut header = tar::Header::new_ustar();
        header.set_size(content.len() as u64);
        header.set_mode(*mode);
        header.set_mtime(1_700_000_000);
        builder
            .append_data(&mut header, path, content.as_bytes())
            .unwrap();
    }
    builder.into_inner().unwrap()
}

fn image(name: &str, layers: Vec<Vec<u8>>) -> NewImage {
    NewImage {
        name: Some(name.to_string()),
        layers,
        gzip: true,
        defaults: Default::default(),
    }
}

fn store(state: &Path) -> ImageStore {
    ImageStore::open(state, Limits::default()).unwrap()
}

#[test]
fn an_oci_layout_directory_is_imported_once_and_its_layers_unpacked() {
    if !require_root() {
        return;
    }
    let (state, src) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let base = layer(&[("etc/os-release", "ID=test\n", 0o644)]);
    let top = layer(&[("app/tool.py", "print(1)\n", 0o755)]);
    let written = write_layout(src.path(), &image("reg.test/tools:1", vec![base, top])).unwrap();
    let s = store(state.path());
    let records = import(&s, src.path(), None).unwrap();
    assert_eq!(records.len(), 1);
    let record = &records[0];
    assert_eq!(record.name, "reg.test/tools");
    assert_eq!(record.tags, ["1"]);
    assert_eq!(record.digest, written.manifest);
    let dirs: Vec<_> = record
        .layers
        .iter()
        .map(|l| s.layer_dir(&l.diff_id))
        .collect();
    assert_eq!(
        fs::read_to_string(dirs[0].join("etc/os-release")).unwrap(),
        "ID=test\n"
    );
    assert_eq!(
        fs::read_to_string(dirs[1].join("app/tool.py")).unwrap(),
        "print(1)\n"
    );
    // Again: the same one record, nothing unpacked twice.
    import(&s, src.path(), None).unwrap();
    assert_eq!(s.list().unwrap().len(), 1);
    assert_eq!(s.find(&record.pinned()).unwrap(), *record);
    assert_eq!(s.find("reg.test/tools:1").unwrap(), *record);
}

#[test]
fn a_tar_of_a_layout_imports_like_the_directory() {
    if !require_root() {
        return;
    }
    let (state, src) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let layout = src.path().join("layout");
    let written = write_layout(
        &layout,
        &image("reg.test/t:2", vec![layer(&[("x", "y", 0o644)])]),
    )
    .unwrap();
    let archive = src.path().join("image.tar");
    let mut builder = tar::Builder::new(fs::File::create(&archive).unwrap());
    builder.append_dir_all(".", &layout).unwrap();
    builder.finish().unwrap();
    let s = store(state.path());
    let records = import(&s, &archive, None).unwrap();
    assert_eq!(records[0].digest, written.manifest);
    let blobs = fs::read_dir(s.root().join("blobs/sha256")).unwrap().count();
    assert_eq!(
        blobs, 3,
        "the manifest, config and layer; the archive's index.json is not kept"
    );
}

#[test]
fn a_legacy_docker_save_archive_is_imported_under_its_repo_tag() {
    if !require_root() {
        return;
    }
    let (state, src) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let tar_layer = layer(&[("bin/hello", "#!hello", 0o755)]);
    let diff_id = Digest::of(&tar_layer);
    let host = Platform::host();
    let config = serde_json::json!({
        "architecture": host.architecture, "os": "linux",
        "config": {"Cmd": ["/bin/hello"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id.to_string()]},
    })
    .to_string();
    let manifest = serde_json::json!([{
        "Config": "abc.json", "RepoTags": ["hello:latest"], "Layers": ["l1/layer.tar"],
    }])
    .to_string();
    let archive = src.path().join("save.tar");
    let mut builder = tar::Builder::new(fs::File::create(&archive).unwrap());
    for (path, bytes) in [
        ("manifest.json", manifest.as_bytes()),
        ("abc.json", config.as_bytes()),
        ("l1/layer.tar", &tar_layer[..]),
    ] {
        let mut header = tar::Header::new_ustar();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        builder.append_data(&mut header, path, bytes).unwrap();
    }
    builder.finish().unwrap();
    drop(builder);
    let s = store(state.path());
    let records = import(&s, &archive, None).unwrap();
    assert_eq!(
        (records[0].name.as_str(), records[0].tags.as_slice()),
        ("hello", &["latest".to_string()][..])
    );
    let config = s.config(&records[0]).unwrap();
    assert_eq!(config.config.cmd, Some(vec!["/bin/hello".to_string()]));
    let dir = s.layer_dir(&diff_id);
    assert_eq!(
        fs::read_to_string(dir.join("bin/hello")).unwrap(),
        "#!hello"
    );
}

#[test]
fn a_layout_blob_that_does_not_match_its_digest_is_refused_and_nothing_recorded() {
    if !require_root() {
        return;
    }
    let (state, src) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let written = write_layout(
        src.path(),
        &image("reg.test/t:1", vec![layer(&[("a", "good", 0o644)])]),
    )
    .unwrap();
    let blob = src
        .path()
        .join("blobs/sha256")
        .join(written.layer_blobs[0].hex());
    let mut bytes = fs::read(&blob).unwrap();
    let last = bytes.len() - 9;
    bytes[last] ^= 0xff;
    fs::write(&blob, &bytes).unwrap();
    let s = store(state.path());
    let err = import(&s, src.path(), None).unwrap_err();
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err}");
    assert!(s.list().unwrap().is_empty());
    assert!(!s.has_blob(&written.layer_blobs[0]));
    assert!(
        !s.has_blob(&Digest::of(&bytes)),
        "the tampered bytes stay nowhere"
    );
}

#[test]
fn a_layer_whose_content_is_not_its_diff_id_is_refused_and_not_unpacked() {
    if !require_root() {
        return;
    }
    let (state, src) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let good = layer(&[("a", "good", 0o644)]);
    let written = write_layout(src.path(), &image("reg.test/t:1", vec![good.clone()])).unwrap();
    // Swap the layer's content (and so its blob digest in the manifest) for another tar,
    // keeping the config's diff id: what a registry serving a different layer would do.
    let evil = layer(&[("a", "evil", 0o644)]);
    let manifest_path = src.path().join("blobs/sha256").join(written.manifest.hex());
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(&manifest_path).unwrap()).unwrap();
    let evil_digest = Digest::of(&evil);
    fs::write(
        src.path().join("blobs/sha256").join(evil_digest.hex()),
        &evil,
    )
    .unwrap();
    manifest["layers"][0] = serde_json::json!({
        "mediaType": oci::OCI_LAYER_TAR, "digest": evil_digest.to_string(), "size": evil.len(),
    });
    let manifest_bytes = serde_json::to_vec(&manifest).unwrap();
    let new_manifest = Digest::of(&manifest_bytes);
    fs::write(
        src.path().join("blobs/sha256").join(new_manifest.hex()),
        &manifest_bytes,
    )
    .unwrap();
    let mut entry = Descriptor {
        media_type: oci::OCI_MANIFEST.to_string(),
        digest: new_manifest,
        size: manifest_bytes.len() as u64,
        platform: None,
        annotations: Default::default(),
    };
    entry
        .annotations
        .insert("io.containerd.image.name".into(), "reg.test/t:1".into());
    write_index(src.path(), vec![entry]).unwrap();
    let s = store(state.path());
    let err = import(&s, src.path(), None).unwrap_err();
    assert!(matches!(err, ImageError::DiffIdMismatch { .. }), "{err}");
    assert!(s.list().unwrap().is_empty());
    assert!(!s.layer_dir(&Digest::of(&good)).exists());
    assert!(!s.layer_dir(&evil_digest).exists());
    assert_eq!(fs::read_dir(s.root().join("layers")).unwrap().count(), 0);
}

#[test]
fn a_stored_blob_changed_on_disk_is_refused_and_removed_on_read() {
    if !require_root() {
        return;
    }
    let (state, src) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write_layout(
        src.path(),
        &image("reg.test/t:1", vec![layer(&[("a", "b", 0o644)])]),
    )
    .unwrap();
    let s = store(state.path());
    let record = import(&s, src.path(), None).unwrap().remove(0);
    fs::write(s.blob_path(&record.config), b"{}").unwrap();
    let err = s.config(&record).unwrap_err();
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err}");
    assert!(!s.has_blob(&record.config));
}

#[test]
fn a_multi_platform_index_imports_the_hosts_manifest() {
    if !require_root() {
        return;
    }
    let (state, src) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut ours, written) = write_blobs(
        src.path(),
        &image("x", vec![layer(&[("a", "ours", 0o644)])]),
    )
    .unwrap();
    ours.annotations.clear();
    let (mut foreign, _) = write_blobs(
        src.path(),
        &image("x", vec![layer(&[("a", "s390x", 0o644)])]),
    )
    .unwrap();
    foreign.annotations.clear();
    foreign.platform = Some(Platform {
        architecture: "s390x".into(),
        os: "linux".into(),
        variant: None,
    });
    let nested = Index {
        schema_version: 2,
        media_type: Some(oci::OCI_INDEX.to_string()),
        manifests: vec![foreign, ours],
    };
    let bytes = serde_json::to_vec(&nested).unwrap();
    let digest = Digest::of(&bytes);
    fs::write(src.path().join("blobs/sha256").join(digest.hex()), &bytes).unwrap();
    let mut entry = Descriptor {
        media_type: oci::OCI_INDEX.to_string(),
        digest,
        size: bytes.len() as u64,
        platform: None,
        annotations: Default::default(),
    };
    entry
        .annotations
        .insert("io.containerd.image.name".into(), "reg.test/multi:1".into());
    write_index(src.path(), vec![entry]).unwrap();
    let s = store(state.path());
    let record = import(&s, src.path(), None).unwrap().remove(0);
    assert_eq!(record.digest, written.manifest);
    let dir = s.layer_dir(&record.layers[0].diff_id);
    assert_eq!(fs::read_to_string(dir.join("a")).unwrap(), "ours");
}

#[test]
fn an_image_a_live_cell_holds_is_not_removed_and_gc_keeps_shared_layers() {
    if !require_root() {
        return;
    }
    let (state, a_src, b_src) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let shared = layer(&[("usr/lib/libshared", "shared", 0o644)]);
    write_layout(
        a_src.path(),
        &image(
            "reg.test/a:1",
            vec![shared.clone(), layer(&[("a", "a", 0o644)])],
        ),
    )
    .unwrap();
    write_layout(
        b_src.path(),
        &image(
            "reg.test/b:1",
            vec![shared.clone(), layer(&[("b", "b", 0o644)])],
        ),
    )
    .unwrap();
    let s = store(state.path());
    let a = import(&s, a_src.path(), None).unwrap().remove(0);
    let b = import(&s, b_src.path(), None).unwrap().remove(0);
    let lease = s.lease(&a).unwrap();
    let err = s.remove("reg.test/a:1").unwrap_err();
    assert!(matches!(err, ImageError::InUse(_)), "{err}");
    assert_eq!(s.gc().unwrap().layers, 0);
    drop(lease);
    s.remove("reg.test/a:1").unwrap();
    let report = s.gc().unwrap();
    assert_eq!(
        (report.layers, report.blobs),
        (1, 3),
        "a's own layer, its blob, config and manifest"
    );
    for layer in &b.layers {
        assert!(s.layer_dir(&layer.diff_id).is_dir());
        assert!(s.has_blob(&layer.blob));
    }
    assert!(!s.layer_dir(&a.layers[1].diff_id).exists());
    assert!(matches!(s.lease(&a), Err(ImageError::NotFound(_))));
}

#[test]
fn a_reference_names_the_registry_the_store_records() {
    let r = ImageRef::parse(
        &format!("tools@sha256:{}", "1".repeat(64)),
        Some("127.0.0.1:5000"),
    )
    .unwrap();
    assert_eq!(r.name(), "127.0.0.1:5000/tools");
}

#[test]
fn a_typed_reference_resolves_by_digest_and_a_tag_only_when_allowed() {
    if !require_root() {
        return;
    }
    let (state, src) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let base = layer(&[("base", "1", 0o644)]);
    let top = layer(&[("top", "2", 0o644)]);
    write_layout(
        src.path(),
        &image("reg.test/tools:1", vec![base.clone(), top.clone()]),
    )
    .unwrap();
    let s = store(state.path());
    let record = import(&s, src.path(), None).unwrap().remove(0);
    let pinned = ImageRef::parse(&record.pinned(), None).unwrap();
    assert_eq!(s.resolve(&pinned, false).unwrap(), record);
    let tagged = ImageRef::parse("reg.test/tools:1", None).unwrap();
    let err = s.resolve(&tagged, false).unwrap_err();
    assert!(err.to_string().contains("images.allow_tags"), "{err}");
    assert_eq!(s.resolve(&tagged, true).unwrap(), record);
    let other = ImageRef::parse(&format!("reg.test/other@{}", record.digest), None).unwrap();
    assert!(matches!(
        s.resolve(&other, false),
        Err(ImageError::NotFound(_))
    ));
    let dirs = s.layer_dirs(&record).unwrap();
    assert_eq!(
        dirs,
        [
            s.layer_dir(&Digest::of(&top)),
            s.layer_dir(&Digest::of(&base))
        ]
    );
    fs::remove_dir_all(&dirs[1]).unwrap();
    assert!(
        s.layer_dirs(&record).is_err(),
        "a missing layer is never left out"
    );
}
