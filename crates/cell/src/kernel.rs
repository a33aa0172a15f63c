//! The seam between the launch sequence and the kernel: the cell's root filesystem and its
//! Landlock ruleset are built through [`Kernel`], which [`RealKernel`] implements with the
//! `sys` wrappers and the tests with a recording fake, so the order and arguments of every
//! mount and Landlock rule are unit-tested as plain data, without root. Generic (static
//! dispatch): the cold start pays nothing for the seam.

use crate::stage::Stage;
use crate::sys;
use landlock::{
    AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope,
};
use std::ffi::CStr;
use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// What the launch sequence asks of the kernel while it builds the cell's root and
/// restricts itself.
pub trait Kernel {
    /// The running detach of the host's root (see [`Kernel::start_detach`]).
    type Detach;

    fn mount(
        &mut self,
        source: Option<&Path>,
        target: &Path,
        fstype: Option<&CStr>,
        flags: libc::c_ulong,
        data: Option<&CStr>,
    ) -> io::Result<()>;
    /// Creates `path` and missing parents (mode 0755); an existing directory is fine.
    fn mkdirs(&mut self, path: &Path) -> io::Result<()>;
    fn symlink(&mut self, target: &Path, link: &Path) -> io::Result<()>;
    fn write_file(&mut self, path: &Path, text: &str) -> io::Result<()>;
    /// Creates an empty file (a mount point for a file).
    fn create_file(&mut self, path: &Path) -> io::Result<()>;
    fn chdir(&mut self, path: &Path) -> io::Result<()>;
    fn current_dir(&mut self) -> io::Result<PathBuf>;
    /// `pivot_root(".", ".")`: the working directory becomes the root.
    fn pivot_root_to_cwd(&mut self) -> io::Result<()>;
    /// Starts detaching the old root, stacked on the new one after the pivot.
    fn start_detach(&mut self) -> io::Result<Self::Detach>;
    /// `move_mount` of a detached tree (from the supervisor) to `target`.
    fn attach_tree(&mut self, tree: OwnedFd, target: &Path) -> io::Result<()>;
    /// Clones the mount at `path` with its submounts, sets `attrs` (`MOUNT_ATTR_*`) on the
    /// clone recursively and attaches it over `path`.
    fn rebind_restricted(&mut self, path: &Path, attrs: u64) -> io::Result<()>;
    /// Sets `attrs` on the root mount alone.
    fn restrict_root(&mut self, attrs: u64) -> io::Result<()>;
    /// Whether `path` is a directory; `None` when it does not exist.
    fn is_dir(&mut self, path: &Path) -> Option<bool>;
    /// Creates a ruleset handling `handled` (`LANDLOCK_ACCESS_FS_*` bits) and the scopes.
    fn landlock_create_ruleset(
        &mut self,
        handled: u64,
        scope_signals: bool,
        scope_abstract_unix_sockets: bool,
    ) -> Result<(), Stage>;
    fn landlock_add_rule(&mut self, path: &Path, access: u64) -> Result<(), Stage>;
    /// Enforces the ruleset on this process; anything short of full enforcement fails.
    fn landlock_restrict_self(&mut self) -> Result<(), Stage>;
}

/// The running kernel, through the `sys` wrappers and the landlock crate.
#[derive(Default)]
pub struct RealKernel {
    ruleset: Option<RulesetCreated>,
}

fn open_path(path: &Path, follow: bool) -> io::Result<fs::File> {
    let mut flags = libc::O_PATH | libc::O_CLOEXEC;
    if !follow {
        flags |= libc::O_NOFOLLOW;
    }
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
}

fn unavailable(stage: &str, err: impl std::fmt::Display) -> Stage {
    Stage::unavailable(stage, err.to_string())
}

impl Kernel for RealKernel {
    type Detach = sys::BackgroundDetach;

    fn mount(
        &mut self,
        source: Option<&Path>,
        target: &Path,
        fstype: Option<&CStr>,
        flags: libc::c_ulong,
        data: Option<&CStr>,
    ) -> io::Result<()> {
        sys::mount(source, target, fstype, flags, data)
    }

    /// Tries the leaf first: parents usually exist, and every avoided syscall is paid
    /// back on every cell start.
    fn mkdirs(&mut self, path: &Path) -> io::Result<()> {
        match fs::DirBuilder::new().mode(0o755).create(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(()),
            Err(_) => {}
        }
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(path)
    }

    fn symlink(&mut self, target: &Path, link: &Path) -> io::Result<()> {
        std::os::unix::fs::symlink(target, link)
    }

    fn write_file(&mut self, path: &Path, text: &str) -> io::Result<()> {
        fs::write(path, text)
    }

    fn create_file(&mut self, path: &Path) -> io::Result<()> {
        fs::File::create(path).map(drop)
    }

    fn chdir(&mut self, path: &Path) -> io::Result<()> {
        std::env::set_current_dir(path)
    }

    fn current_dir(&mut self) -> io::Result<PathBuf> {
        std::env::current_dir()
    }

    fn pivot_root_to_cwd(&mut self) -> io::Result<()> {
        sys::pivot_root_to_cwd()
    }

    fn start_detach(&mut self) -> io::Result<sys::BackgroundDetach> {
        sys::BackgroundDetach::start()
    }

    fn attach_tree(&mut self, tree: OwnedFd, target: &Path) -> io::Result<()> {
        sys::attach_mount(tree.as_fd(), target)
    }

    fn rebind_restricted(&mut self, path: &Path, attrs: u64) -> io::Result<()> {
        let file = open_path(path, false)?;
        let tree = sys::clone_mount_tree(file.as_fd())?;
        sys::set_mount_attributes(tree.as_fd(), attrs, true)?;
        sys::attach_mount(tree.as_fd(), path)
    }

    fn restrict_root(&mut self, attrs: u64) -> io::Result<()> {
        let root = open_path(Path::new("/"), true)?;
        sys::set_mount_attributes(root.as_fd(), attrs, false)
    }

    fn is_dir(&mut self, path: &Path) -> Option<bool> {
        fs::metadata(path).ok().map(|m| m.is_dir())
    }

    fn landlock_create_ruleset(
        &mut self,
        handled: u64,
        scope_signals: bool,
        scope_abstract_unix_sockets: bool,
    ) -> Result<(), Stage> {
        let access = BitFlags::<AccessFs>::from_bits(handled)
            .map_err(|e| Stage::new("landlock.ruleset", e.to_string()))?;
        let mut scopes = BitFlags::<Scope>::empty();
        if scope_signals {
            scopes |= Scope::Signal;
        }
        if scope_abstract_unix_sockets {
            scopes |= Scope::AbstractUnixSocket;
        }
        let ruleset = Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(access)
            .and_then(|r| r.scope(scopes))
            .map_err(|e| unavailable("landlock.ruleset", e))?;
        self.ruleset = Some(
            ruleset
                .create()
                .map_err(|e| unavailable("landlock.create", e))?,
        );
        Ok(())
    }

    fn landlock_add_rule(&mut self, path: &Path, access: u64) -> Result<(), Stage> {
        let failed = |e: &dyn std::fmt::Display| {
            Stage::new("landlock.add_rule", format!("{}: {e}", path.display()))
        };
        let access = BitFlags::<AccessFs>::from_bits(access).map_err(|e| failed(&e))?;
        let fd = PathFd::new(path).map_err(|e| failed(&e))?;
        let ruleset = self
            .ruleset
            .take()
            .ok_or_else(|| failed(&"no ruleset was created"))?;
        self.ruleset = Some(
            ruleset
                .add_rule(PathBeneath::new(fd, access))
                .map_err(|e| failed(&e))?,
        );
        Ok(())
    }

    fn landlock_restrict_self(&mut self) -> Result<(), Stage> {
        let ruleset = self
            .ruleset
            .take()
            .ok_or_else(|| Stage::new("landlock.restrict_self", "no ruleset was created".into()))?;
        let status = ruleset
            .restrict_self()
            .map_err(|e| unavailable("landlock.restrict_self", e))?;
        match status.ruleset {
            RulesetStatus::FullyEnforced => Ok(()),
            RulesetStatus::PartiallyEnforced => Err(unavailable(
                "landlock.restrict_self",
                "the kernel enforced only part of the Landlock ruleset",
            )),
            _ => Err(unavailable(
                "landlock.restrict_self",
                "the kernel did not enforce the Landlock ruleset",
            )),
        }
    }
}

/// A fake kernel that records every call as plain data and succeeds (tests only).
#[cfg(test)]
pub mod recording {
    use super::*;
    use std::collections::BTreeMap;
    use std::ffi::CString;

    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Call {
        Mount {
            source: Option<PathBuf>,
            target: PathBuf,
            fstype: Option<CString>,
            flags: libc::c_ulong,
            data: Option<CString>,
        },
        Mkdirs(PathBuf),
        Symlink {
            target: PathBuf,
            link: PathBuf,
        },
        WriteFile {
            path: PathBuf,
            text: String,
        },
        CreateFile(PathBuf),
        Chdir(PathBuf),
        PivotRoot,
        StartDetach,
        AttachTree(PathBuf),
        RebindRestricted {
            path: PathBuf,
            attrs: u64,
        },
        RestrictRoot(u64),
        LandlockCreateRuleset {
            handled: u64,
            scope_signals: bool,
            scope_abstract_unix_sockets: bool,
        },
        LandlockAddRule {
            path: PathBuf,
            access: u64,
        },
        LandlockRestrictSelf,
    }

    /// Records calls; paths are directories unless listed in `files` or `missing`.
    #[derive(Default)]
    pub struct RecordingKernel {
        pub calls: Vec<Call>,
        pub kinds: BTreeMap<PathBuf, Option<bool>>,
        cwd: PathBuf,
    }

    impl RecordingKernel {
        pub fn with_files(files: &[&str], missing: &[&str]) -> RecordingKernel {
            let mut kernel = RecordingKernel::default();
            for file in files {
                kernel.kinds.insert(PathBuf::from(file), Some(false));
            }
            for path in missing {
                kernel.kinds.insert(PathBuf::from(path), None);
            }
            kernel
        }
    }

    impl Kernel for RecordingKernel {
        type Detach = ();

        fn mount(
            &mut self,
            source: Option<&Path>,
            target: &Path,
            fstype: Option<&CStr>,
            flags: libc::c_ulong,
            data: Option<&CStr>,
        ) -> io::Result<()> {
            self.calls.push(Call::Mount {
                source: source.map(Path::to_path_buf),
                target: target.to_path_buf(),
                fstype: fstype.map(CStr::to_owned),
                flags,
                data: data.map(CStr::to_owned),
            });
            Ok(())
        }
        fn mkdirs(&mut self, path: &Path) -> io::Result<()> {
            self.calls.push(Call::Mkdirs(path.to_path_buf()));
            Ok(())
        }
        fn symlink(&mut self, target: &Path, link: &Path) -> io::Result<()> {
            self.calls.push(Call::Symlink {
                target: target.to_path_buf(),
                link: link.to_path_buf(),
            });
            Ok(())
        }
        fn write_file(&mut self, path: &Path, text: &str) -> io::Result<()> {
            self.calls.push(Call::WriteFile {
                path: path.to_path_buf(),
                text: text.to_owned(),
            });
            Ok(())
        }
        fn create_file(&mut self, path: &Path) -> io::Result<()> {
            self.calls.push(Call::CreateFile(path.to_path_buf()));
            Ok(())
        }
        fn chdir(&mut self, path: &Path) -> io::Result<()> {
            self.cwd = path.to_path_buf();
            self.calls.push(Call::Chdir(path.to_path_buf()));
            Ok(())
        }
        fn current_dir(&mut self) -> io::Result<PathBuf> {
            Ok(self.cwd.clone())
        }
        fn pivot_root_to_cwd(&mut self) -> io::Result<()> {
            self.calls.push(Call::PivotRoot);
            Ok(())
        }
        fn start_detach(&mut self) -> io::Result<()> {
            self.calls.push(Call::StartDetach);
            Ok(())
        }
        fn attach_tree(&mut self, _tree: OwnedFd, target: &Path) -> io::Result<()> {
            self.calls.push(Call::AttachTree(target.to_path_buf()));
            Ok(())
        }
        fn rebind_restricted(&mut self, path: &Path, attrs: u64) -> io::Result<()> {
            self.calls.push(Call::RebindRestricted {
                path: path.to_path_buf(),
                attrs,
            });
            Ok(())
        }
        fn restrict_root(&mut self, attrs: u64) -> io::Result<()> {
            self.calls.push(Call::RestrictRoot(attrs));
            Ok(())
        }
        fn is_dir(&mut self, path: &Path) -> Option<bool> {
            self.kinds.get(path).copied().unwrap_or(Some(true))
        }
        fn landlock_create_ruleset(
            &mut self,
            handled: u64,
            scope_signals: bool,
            scope_abstract_unix_sockets: bool,
        ) -> Result<(), Stage> {
            self.calls.push(Call::LandlockCreateRuleset {
                handled,
                scope_signals,
                scope_abstract_unix_sockets,
            });
            Ok(())
        }
        fn landlock_add_rule(&mut self, path: &Path, access: u64) -> Result<(), Stage> {
            self.calls.push(Call::LandlockAddRule {
                path: path.to_path_buf(),
                access,
            });
            Ok(())
        }
        fn landlock_restrict_self(&mut self) -> Result<(), Stage> {
            self.calls.push(Call::LandlockRestrictSelf);
            Ok(())
        }
    }
}
