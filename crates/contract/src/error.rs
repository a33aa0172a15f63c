use std::fmt;
use std::path::PathBuf;

/// The three document formats a contract may be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContractFormat {
    Yaml,
    Toml,
    Json,
}

impl ContractFormat {
    /// The format a file name's extension implies, if any.
    pub fn from_extension(extension: &str) -> Option<Self> {
        match extension.to_ascii_lowercase().as_str() {
            "yaml" | "yml" => Some(Self::Yaml),
            "toml" => Some(Self::Toml),
            "json" => Some(Self::Json),
            _ => None,
        }
    }
}

impl fmt::Display for ContractFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Yaml => "YAML",
            Self::Toml => "TOML",
            Self::Json => "JSON",
        })
    }
}

/// One violated rule, addressed by the dotted path of the offending field
/// (`filesystem.readonly_inputs[0].target`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub path: String,
    pub rule: String,
}

impl FieldError {
    pub fn new(path: impl Into<String>, rule: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            rule: rule.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.rule)
    }
}

/// Displays a list of violations one per line, so a caller can show all of them at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldErrors<'a>(pub &'a [FieldError]);

impl fmt::Display for FieldErrors<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, error) in self.0.iter().enumerate() {
            if index > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ContractError {
    /// The text is not a well-formed document of its format, or does not have the shape of
    /// a contract at all (empty document, not a mapping).
    #[error("{format} contract does not parse: {message}")]
    Parse {
        format: ContractFormat,
        message: String,
    },
    /// The document is a contract, but breaks one or more rules. Every violation found is
    /// listed, so one round trip fixes them all.
    #[error("{}", FieldErrors(.0))]
    Invalid(Vec<FieldError>),
    /// The contract is valid but asks for something this runtime cannot provide; it is
    /// refused rather than run with weaker isolation.
    #[error("{path}: {message}")]
    Unsupported { path: String, message: String },
    #[error("cannot read contract {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The contract's custom seccomp profile could not be read.
    #[error("seccomp_profile: cannot read {}: {source}", .path.display())]
    ProfileIo {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl ContractError {
    /// The failure class (docs/architecture.md, "Result classes") a run refused with this error ends in.
    pub fn class(&self) -> &'static str {
        match self {
            Self::Parse { .. } => "policy_denied",
            Self::Invalid(_) => "policy_denied",
            Self::Unsupported { .. } => "sandbox_unavailable",
            // The contract file is supplied by the trusted side; failing to read it is
            // airlock's own failure, not a decision about the payload.
            Self::Io { .. } | Self::ProfileIo { .. } => "runtime_fault",
        }
    }

    pub(crate) fn invalid(path: impl Into<String>, rule: impl Into<String>) -> Self {
        Self::Invalid(vec![FieldError::new(path, rule)])
    }
}
