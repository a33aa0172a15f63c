//! [`Stage`]: a failed step of the cell's setup. Its own module because the launcher,
//! the rootfs, the protocol and the Landlock setup all report in it, and none of them
//! should depend on another just for the type.

use std::path::Path;

/// A failed setup step: its name, what went wrong and whether it means the host cannot
/// provide the control (as opposed to an error of airlock itself).
#[derive(Debug)]
pub struct Stage {
    pub name: String,
    pub message: String,
    pub unavailable: bool,
}

impl Stage {
    pub fn new(name: &str, message: String) -> Stage {
        Stage {
            name: name.into(),
            message,
            unavailable: false,
        }
    }

    /// A step that failed because the host cannot provide the control.
    pub fn unavailable(name: &str, message: String) -> Stage {
        Stage {
            unavailable: true,
            ..Stage::new(name, message)
        }
    }

    pub fn io(name: &str, path: &Path, err: std::io::Error) -> Stage {
        Stage::new(name, format!("{}: {err}", path.display()))
    }

    pub fn errno(name: &str, err: std::io::Error) -> Stage {
        Stage::new(name, err.to_string())
    }
}
