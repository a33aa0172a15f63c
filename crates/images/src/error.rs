use std::path::PathBuf;

/// Everything that can go wrong with an image: a bad reference, a blob that does not
/// match its digest, a layer the unpacker refuses, the store's own I/O.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("image reference {reference:?}: {reason}")]
    Reference { reference: String, reason: String },
    #[error("digest {0:?}: not sha256:<64 lowercase hex digits>")]
    Digest(String),
    #[error("blob {expected}: content hashes to {actual}; refused and removed")]
    DigestMismatch { expected: String, actual: String },
    #[error("blob {digest}: {size} bytes, but its descriptor says {expected}")]
    SizeMismatch {
        digest: String,
        size: u64,
        expected: u64,
    },
    #[error("layer {layer}: uncompressed content hashes to {actual}, the config says {expected}")]
    DiffIdMismatch {
        layer: String,
        expected: String,
        actual: String,
    },
    #[error("layer entry {entry:?}: {reason}")]
    Unsafe { entry: String, reason: String },
    #[error("layer: {what} exceeds the limit of {limit}")]
    Limit { what: &'static str, limit: u64 },
    #[error("image {path}: {reason}")]
    Format { path: String, reason: String },
    #[error("no image matches {0:?}")]
    NotFound(String),
    #[error("{reference:?} matches {count} images; give more of the digest")]
    Ambiguous { reference: String, count: usize },
    #[error("image {0} is in use by a running cell; not removed")]
    InUse(String),
    #[error("{context} {path}: {source}")]
    Io {
        context: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl ImageError {
    pub(crate) fn io(
        context: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> ImageError {
        let path = path.into();
        move |source| ImageError::Io {
            context,
            path,
            source,
        }
    }

    pub(crate) fn unsafe_entry(entry: &str, reason: impl Into<String>) -> ImageError {
        ImageError::Unsafe {
            entry: entry.to_string(),
            reason: reason.into(),
        }
    }

    pub(crate) fn format(path: &str, reason: impl Into<String>) -> ImageError {
        ImageError::Format {
            path: path.to_string(),
            reason: reason.into(),
        }
    }
}

pub type Result<T> = std::result::Result<T, ImageError>;
