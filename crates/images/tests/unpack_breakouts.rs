//! The public layer-unpacking breakouts, each as a layer this test builds: containerd's
//! `TestBreakouts` cases, CVE-2021-32760 (chmod through a symlink), umoci's
//! CVE-2021-29136 (a symlink replacing the root), and the Rust `tar` crate's advisories
//! (RUSTSEC-2018-0002, RUSTSEC-2021-0080, RUSTSEC-2026-0067, CVE-2026-33055). Each layer
//! is unpacked into `layer/` next to `outside/`, which holds a `etc/shadow` and a
//! `victim/` directory: every case is refused or contained, and `outside/` is unchanged.

use airlock_images::{unpack_layer, Digest, Limits};
use std::fs;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tar::{EntryType, Header};

fn require_root() -> bool {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        == Some("0");
    if !root && std::env::var_os("AIRLOCK_ALLOW_SKIPPED_ROOT_TESTS").is_none() {
        panic!("unpacking needs root (ownership, whiteout nodes); set AIRLOCK_ALLOW_SKIPPED_ROOT_TESTS=1 to skip");
    }
    root
}

/// A layer built entry by entry with raw names, so the test can write what no honest
/// tar writer would (`..`, absolute names, whiteouts of the root).
#[derive(Default)]
struct Layer {
    bytes: Vec<u8>,
}

impl Layer {
    fn entry(mut self, kind: EntryType, name: &[u8], link: &[u8], data: &[u8], mode: u32) -> Self {
        let mut header = Header::new_ustar();
        header.as_old_mut().name[..name.len()].copy_from_slice(name);
        header.as_old_mut().linkname[..link.len()].copy_from_slice(link);
        header.set_entry_type(kind);
        header.set_size(data.len() as u64);
        header.set_mode(mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(1_700_000_000);
        header.set_cksum();
        // Raw blocks: a tar::Builder would end the archive on each finish.
        self.bytes.extend_from_slice(header.as_bytes());
        self.bytes.extend_from_slice(data);
        let padding = (512 - data.len() % 512) % 512;
        self.bytes.extend(std::iter::repeat_n(0u8, padding));
        self
    }
    fn dir(self, name: &str, mode: u32) -> Self {
        self.entry(EntryType::Directory, name.as_bytes(), b"", b"", mode)
    }
    fn file(self, name: &str, data: &str) -> Self {
        self.entry(
            EntryType::Regular,
            name.as_bytes(),
            b"",
            data.as_bytes(),
            0o644,
        )
    }
    fn symlink(self, name: &str, target: &str) -> Self {
        self.entry(
            EntryType::Symlink,
            name.as_bytes(),
            target.as_bytes(),
            b"",
            0o777,
        )
    }
    fn hardlink(self, name: &str, target: &str) -> Self {
        self.entry(
            EntryType::Link,
            name.as_bytes(),
            target.as_bytes(),
            b"",
            0o644,
        )
    }
    /// A PAX extended header whose records apply to the next entry.
    fn pax(self, records: &[(&str, &[u8])]) -> Self {
        let mut data = Vec::new();
        for (key, value) in records {
            let body = 1 + key.len() + 1 + value.len() + 1;
            let mut len = body + body.to_string().len();
            if len.to_string().len() + body != len {
                len += 1;
            }
            data.extend_from_slice(format!("{len} {key}=").as_bytes());
            data.extend_from_slice(value);
            data.push(b'\n');
        }
        self.entry(EntryType::XHeader, b"pax", b"", &data, 0o644)
    }
    fn finish(self) -> Vec<u8> {
        let mut bytes = self.bytes;
        bytes.extend_from_slice(&[0u8; 1024]);
        bytes
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    top: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path().to_path_buf();
        fs::create_dir_all(top.join("outside/etc")).unwrap();
        fs::write(top.join("outside/etc/shadow"), "host-secret").unwrap();
        fs::set_permissions(
            top.join("outside/etc/shadow"),
            fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        fs::create_dir(top.join("outside/victim")).unwrap();
        fs::set_permissions(
            top.join("outside/victim"),
            fs::Permissions::from_mode(0o700),
        )
        .unwrap();
        fs::create_dir(top.join("layer")).unwrap();
        Fixture { _dir: dir, top }
    }
    fn outside(&self) -> String {
        self.top.join("outside").display().to_string()
    }
    fn layer(&self) -> PathBuf {
        self.top.join("layer")
    }
    fn unpack_with(
        &self,
        layer: Vec<u8>,
        limits: &Limits,
    ) -> airlock_images::Result<airlock_images::Unpacked> {
        let root = fs::File::open(self.layer()).unwrap();
        unpack_layer(&layer[..], root.as_fd(), limits)
    }
    fn unpack(&self, layer: Layer) -> airlock_images::Result<airlock_images::Unpacked> {
        self.unpack_with(layer.finish(), &Limits::default())
    }
    /// Nothing outside `layer/` changed: the same names at the top, the secret's content
    /// and mode, the victim's mode, nothing new in `outside/`.
    fn assert_unbroken(&self) {
        let names = |p: &Path| {
            let mut v: Vec<_> = fs::read_dir(p)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(&self.top), ["layer", "outside"]);
        assert_eq!(names(&self.top.join("outside")), ["etc", "victim"]);
        assert_eq!(names(&self.top.join("outside/etc")), ["shadow"]);
        assert!(names(&self.top.join("outside/victim")).is_empty());
        let shadow = self.top.join("outside/etc/shadow");
        assert_eq!(fs::read_to_string(&shadow).unwrap(), "host-secret");
        let meta = fs::symlink_metadata(&shadow).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o600);
        assert_eq!(meta.nlink(), 1, "a hardlink to the secret was made");
        let victim = fs::symlink_metadata(self.top.join("outside/victim")).unwrap();
        assert_eq!(victim.mode() & 0o7777, 0o700);
    }
    fn refused(&self, layer: Layer, why: &str) {
        let err = self.unpack(layer).expect_err("the layer was accepted");
        assert!(err.to_string().contains(why), "{err}");
        self.assert_unbroken();
    }
}

#[test]
fn a_file_written_through_an_absolute_symlink_is_refused() {
    if !require_root() {
        return;
    }
    let f = Fixture::new();
    let layer = Layer::default()
        .symlink("evil", &format!("{}/etc", f.outside()))
        .file("evil/shadow", "pwned");
    f.refused(layer, "a parent is a symlink");
}

#[test]
fn a_file_written_through_a_relative_symlink_up_and_out_is_refused() {
    if !require_root() {
        return;
    }
    let f = Fixture::new();
    let layer = Layer::default()
        .symlink("evil", "../outside/etc")
        .file("evil/shadow", "pwned");
    f.refused(layer, "a parent is a symlink");
}

#[test]
fn dotdot_and_absolute_names_are_refused() {
    if !require_root() {
        return;
    }
    let f = Fixture::new();
    f.refused(
        Layer::default().file("../outside/etc/shadow", "pwned"),
        "`..`",
    );
    let absolute = format!("{}/etc/shadow", f.outside());
    f.refused(
        Layer::default().file(&absolute, "pwned"),
        "an absolute name",
    );
}

#[test]
fn hardlinks_to_host_files_are_refused() {
    if !require_root() {
        return;
    }
    let f = Fixture::new();
    let absolute = format!("{}/etc/shadow", f.outside());
    f.refused(
        Layer::default().hardlink("x", &absolute),
        "an absolute name",
    );
    f.refused(
        Layer::default().hardlink("x", "/etc/shadow"),
        "an absolute name",
    );
    f.refused(
        Layer::default().hardlink("x", "../outside/etc/shadow"),
        "`..`",
    );
    // containerd's HardlinkSymlinkAbsolute / HardlinkSymlinkRelative.
    let via_symlink = Layer::default()
        .symlink("s", &format!("{}/etc", f.outside()))
        .hardlink("x", "s/shadow");
    f.refused(via_symlink, "a hardlink through a symlink");
    // HardlinkSymlinkBeforeCreateTarget: the target does not exist in the layer.
    f.refused(
        Layer::default().hardlink("x", "etc/shadow"),
        "does not have",
    );
}

/// CVE-2021-32760 (containerd's HardlinkSymlinkChmod): a symlink to a host file, a
/// hardlink to that symlink, then a file entry of the hardlink's name with setuid bits.
#[test]
fn a_chmod_through_a_hardlinked_symlink_never_reaches_the_host_file() {
    if !require_root() {
        return;
    }
    let f = Fixture::new();
    let layer = Layer::default()
        .symlink("s", &format!("{}/etc/shadow", f.outside()))
        .hardlink("h", "s")
        .entry(EntryType::Regular, b"h", b"", b"x", 0o4777);
    f.unpack(layer).unwrap();
    f.assert_unbroken();
    let h = fs::symlink_metadata(f.layer().join("h")).unwrap();
    assert!(h.file_type().is_file());
    assert_eq!(
        h.mode() & 0o7777,
        0o777,
        "setuid dropped, the file is the layer's own"
    );
    assert!(fs::symlink_metadata(f.layer().join("s"))
        .unwrap()
        .file_type()
        .is_symlink());
}

/// RUSTSEC-2026-0067 / CVE-2026-33056: a symlink to a host directory, then a directory
/// entry of the same name with mode 0777 — a follow-the-symlink unpacker chmods the host's.
#[test]
fn a_directory_entry_over_a_symlink_replaces_the_symlink_and_chmods_nothing_outside() {
    if !require_root() {
        return;
    }
    let f = Fixture::new();
    let layer = Layer::default()
        .symlink("foo", &format!("{}/victim", f.outside()))
        .dir("foo", 0o777)
        .file("foo/x", "inside");
    f.unpack(layer).unwrap();
    f.assert_unbroken();
    let foo = fs::symlink_metadata(f.layer().join("foo")).unwrap();
    assert!(foo.is_dir());
    assert_eq!(foo.mode() & 0o7777, 0o777);
    assert_eq!(
        fs::read_to_string(f.layer().join("foo/x")).unwrap(),
        "inside"
    );
}

/// umoci's CVE-2021-29136: a symlink named `.` (or `./`) replaces the root, and later
/// entries land wherever it points.
#[test]
fn an_entry_that_would_replace_the_layer_root_is_refused() {
    if !require_root() {
        return;
    }
    let f = Fixture::new();
    for name in [".", "./", ""] {
        let layer = Layer::default()
            .symlink(name, &f.outside())
            .file("etc/shadow", "pwned");
        f.refused(layer, "replaces the layer root");
    }
    let f = Fixture::new();
    f.refused(
        Layer::default().symlink("/", &f.outside()),
        "an absolute name",
    );
}

/// containerd's Whiteout* cases: a whiteout of the root, of its parent, through a
/// symlink, or with `..` in its path.
#[test]
fn whiteouts_that_would_reach_outside_the_layer_are_refused() {
    if !require_root() {
        return;
    }
    let f = Fixture::new();
    f.refused(
        Layer::default().file(".wh..", ""),
        "a whiteout of the directory itself",
    );
    f.refused(
        Layer::default().file(".wh...", ""),
        "a whiteout of the directory itself",
    );
    f.refused(Layer::default().file("../.wh.outside", ""), "`..`");
    f.refused(Layer::default().file("a/../../.wh.outside", ""), "`..`");
    let through_symlink = Layer::default()
        .symlink("s", &format!("{}/etc", f.outside()))
        .file("s/.wh.shadow", "");
    f.refused(through_symlink, "a parent is a symlink");
    let dead_parent = Layer::default()
        .symlink("d", "/nonexistent")
        .file("d/.wh.x", "");
    f.refused(dead_parent, "a parent is a symlink");
}

#[test]
fn whiteouts_and_opaque_directories_become_overlayfs_markers_inside_the_layer() {
    if !require_root() {
        return;
    }
    let f = Fixture::new();
    let layer = Layer::default()
        .file(".wh.gone", "")
        .dir("d", 0o755)
        .file("d/.wh..wh..opq", "");
    f.unpack(layer).unwrap();
    f.assert_unbroken();
    let gone = fs::symlink_metadata(f.layer().join("gone")).unwrap();
    assert!(gone.file_type().is_char_device());
    assert_eq!(gone.rdev(), 0);
    let value = read_xattr(&f.layer().join("d"), "trusted.overlay.opaque");
    assert_eq!(value.as_deref(), Some(&b"y"[..]));
    assert!(!f.layer().join("d/.wh..wh..opq").exists());
}

fn read_xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let mut buf = [0u8; 64];
    rustix::fs::lgetxattr(path, name, &mut buf[..])
        .ok()
        .map(|n| buf[..n].to_vec())
}

/// RUSTSEC-2021-0080: `sym -> ..`, then `sym/exploit/foo/bar` made the directories
/// outside before any check.
#[test]
fn no_directory_is_created_through_a_symlink_to_the_parent() {
    if !require_root() {
        return;
    }
    let f = Fixture::new();
    let layer = Layer::default()
        .symlink("sym", "..")
        .file("sym/exploit/foo/bar", "x");
    f.refused(layer, "a parent is a symlink");
    assert!(!f.top.join("exploit").exists());
}

/// RUSTSEC-2018-0002 (and containerd's SymlinkOverride*): a symlink, then a file of the
/// same name: the file replaces the link, it is never written through it.
#[test]
fn a_file_after_a_symlink_of_the_same_name_replaces_the_link() {
    if !require_root() {
        return;
    }
    let f = Fixture::new();
    let layer = Layer::default()
        .symlink("f", &format!("{}/etc/shadow", f.outside()))
        .file("f", "the layer's");
    f.unpack(layer).unwrap();
    f.assert_unbroken();
    assert_eq!(
        fs::read_to_string(f.layer().join("f")).unwrap(),
        "the layer's"
    );
}

#[test]
fn a_directory_is_never_replaced_by_a_symlink_entries_below_stay_inside() {
    if !require_root() {
        return;
    }
    let f = Fixture::new();
    let layer = Layer::default()
        .dir("d", 0o755)
        .symlink("d", &format!("{}/etc", f.outside()))
        .file("d/shadow", "pwned");
    f.refused(layer, "replaces a directory");
}

#[test]
fn device_nodes_and_fifos_are_refused() {
    if !require_root() {
        return;
    }
    let f = Fixture::new();
    f.refused(
        Layer::default().entry(EntryType::Char, b"null", b"", b"", 0o666),
        "a device node",
    );
    f.refused(
        Layer::default().entry(EntryType::Block, b"sda", b"", b"", 0o666),
        "a device node",
    );
    f.refused(
        Layer::default().entry(EntryType::Fifo, b"p", b"", b"", 0o666),
        "a FIFO",
    );
}

#[test]
fn setuid_setgid_and_file_capabilities_are_dropped() {
    if !require_root() {
        return;
    }
    let f = Fixture::new();
    let layer = Layer::default()
        .entry(EntryType::Regular, b"su", b"", b"#!", 0o4755)
        .entry(EntryType::Regular, b"sg", b"", b"#!", 0o2755)
        // A PAX xattr record is how a layer carries `security.capability` (here a
        // cap_setuid+ep v2 blob) or any other extended attribute.
        .pax(&[
            (
                "SCHILY.xattr.security.capability",
                &[1, 0, 0, 2, 128, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            ),
            ("SCHILY.xattr.user.note", b"x"),
        ])
        .entry(EntryType::Regular, b"cap", b"", b"#!", 0o755);
    f.unpack(layer).unwrap();
    let mode = |n: &str| fs::metadata(f.layer().join(n)).unwrap().mode() & 0o7777;
    assert_eq!((mode("su"), mode("sg"), mode("cap")), (0o755, 0o755, 0o755));
    assert_eq!(
        read_xattr(&f.layer().join("cap"), "security.capability"),
        None
    );
    assert_eq!(read_xattr(&f.layer().join("cap"), "user.note"), None);
}

#[test]
fn an_empty_symlink_target_is_refused() {
    if !require_root() {
        return;
    }
    let f = Fixture::new();
    f.refused(
        Layer::default().symlink("s", ""),
        "a symlink without a target",
    );
}

#[test]
fn a_hardlink_inside_the_layer_is_the_same_file() {
    if !require_root() {
        return;
    }
    let f = Fixture::new();
    let layer = Layer::default()
        .file("bin/a", "x")
        .hardlink("bin/b", "./bin/a");
    f.unpack(layer).unwrap();
    let a = fs::metadata(f.layer().join("bin/a")).unwrap();
    let b = fs::metadata(f.layer().join("bin/b")).unwrap();
    assert_eq!((a.ino(), a.nlink()), (b.ino(), 2));
}

#[test]
fn the_entry_count_file_size_and_layer_size_are_capped() {
    if !require_root() {
        return;
    }
    let many = || {
        Layer::default()
            .file("a", "1")
            .file("b", "2")
            .file("c", "3")
    };
    let f = Fixture::new();
    let err = f
        .unpack_with(
            many().finish(),
            &Limits {
                max_entries: 2,
                ..Limits::default()
            },
        )
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("the entry count exceeds the limit of 2"),
        "{err}"
    );
    let f = Fixture::new();
    let big = Layer::default().file("big", &"x".repeat(10_000)).finish();
    let err = f
        .unpack_with(
            big.clone(),
            &Limits {
                max_file_bytes: 9_999,
                ..Limits::default()
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("a file's size"), "{err}");
    let f = Fixture::new();
    let err = f
        .unpack_with(
            big,
            &Limits {
                max_layer_bytes: 5_000,
                ..Limits::default()
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("uncompressed size"), "{err}");
}

/// A gzip bomb: a few KB that inflate to 64 MB; the cap stops the inflation, not the disk.
#[test]
fn a_decompression_bomb_stops_at_the_layer_cap() {
    if !require_root() {
        return;
    }
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&vec![0u8; 64 << 20]).unwrap();
    let bomb = gz.finish().unwrap();
    assert!(bomb.len() < 200_000);
    let f = Fixture::new();
    let root = fs::File::open(f.layer()).unwrap();
    let limits = Limits {
        max_layer_bytes: 1 << 20,
        ..Limits::default()
    };
    let err = unpack_layer(
        flate2::read::GzDecoder::new(&bomb[..]),
        root.as_fd(),
        &limits,
    )
    .unwrap_err();
    assert!(err.to_string().contains("exceeds the limit"), "{err}");
}

/// CVE-2026-33055 / TARmageddon: a PAX `size` that disagrees with the ustar header's. The
/// data then hides a second header (a symlink out and a file through it) that a parser
/// honouring the other size would see. Whichever way it is read, nothing leaves.
#[test]
fn a_pax_size_that_disagrees_with_the_header_smuggles_nothing_out() {
    if !require_root() {
        return;
    }
    let f = Fixture::new();
    let hidden = Layer::default()
        .symlink("evil", &format!("{}/etc", f.outside()))
        .file("evil/shadow", "pwned")
        .bytes;
    let layer = Layer::default().pax(&[("size", b"0")]).entry(
        EntryType::Regular,
        b"cover",
        b"",
        &hidden,
        0o644,
    );
    let bytes = layer.finish();
    let result = f.unpack_with(bytes.clone(), &Limits::default());
    f.assert_unbroken();
    if let Ok(unpacked) = result {
        assert_eq!(unpacked.diff_id, Digest::of(&bytes));
    }
}

#[test]
fn the_diff_id_is_the_digest_of_the_whole_stream_and_ownership_is_kept() {
    if !require_root() {
        return;
    }
    let f = Fixture::new();
    let mut header = Header::new_ustar();
    header.set_path("home/user/notes").unwrap();
    header.set_size(2);
    header.set_mode(0o600);
    header.set_uid(1000);
    header.set_gid(1000);
    header.set_cksum();
    let mut builder = tar::Builder::new(Vec::new());
    builder.append(&header, &b"hi"[..]).unwrap();
    let bytes = builder.into_inner().unwrap();
    let unpacked = f.unpack_with(bytes.clone(), &Limits::default()).unwrap();
    assert_eq!(unpacked.diff_id, Digest::of(&bytes));
    assert_eq!(unpacked.entries, 1);
    let meta = fs::metadata(f.layer().join("home/user/notes")).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o777),
        (1000, 1000, 0o600)
    );
}
