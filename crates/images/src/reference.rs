//! OCI image references: `registry/name@sha256:...`, `name@sha256:...` against the
//! operator's default registry, and tags (which only the operator may allow, and which
//! are resolved once to a digest).

use crate::digest::Digest;
use crate::error::{ImageError, Result};
use serde::{Deserialize, Serialize};

/// A parsed reference. `registry` is `None` for a name given without one when the
/// operator configured no default registry (an image only ever imported locally).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRef {
    pub registry: Option<String>,
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<Digest>,
}

impl ImageRef {
    /// Parses `text`; a reference without a registry part takes `default_registry`.
    pub fn parse(text: &str, default_registry: Option<&str>) -> Result<ImageRef> {
        let refuse = |reason: &str| ImageError::Reference {
            reference: text.to_string(),
            reason: reason.to_string(),
        };
        let (rest, digest) = match text.split_once('@') {
            Some((rest, digest)) => (rest, Some(Digest::parse(digest)?)),
            None => (text, None),
        };
        let (rest, tag) = split_tag(rest);
        if let Some(tag) = tag {
            if !valid_tag(tag) {
                return Err(refuse(
                    "a tag is 1-128 of [A-Za-z0-9_.-], not starting with . or -",
                ));
            }
        }
        let (registry, repository) = split_registry(rest);
        if !valid_repository(repository) {
            return Err(refuse(
                "the name is lowercase [a-z0-9] components separated by one of . _ - or /",
            ));
        }
        if tag.is_none() && digest.is_none() {
            return Err(refuse(
                "give a digest (name@sha256:...) or a tag (name:tag)",
            ));
        }
        Ok(ImageRef {
            registry: registry.or(default_registry).map(str::to_string),
            repository: repository.to_string(),
            tag: tag.map(str::to_string),
            digest,
        })
    }

    /// `registry/repository`, or the repository alone without a registry.
    pub fn name(&self) -> String {
        match &self.registry {
            Some(registry) => format!("{registry}/{}", self.repository),
            None => self.repository.clone(),
        }
    }

    /// The reference with `digest` as its pin (what records carry once a tag is resolved).
    pub fn pinned(&self, digest: Digest) -> ImageRef {
        ImageRef {
            digest: Some(digest),
            ..self.clone()
        }
    }
}

impl std::fmt::Display for ImageRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// A `:` after the last `/` starts a tag; one before it is a registry's port.
fn split_tag(text: &str) -> (&str, Option<&str>) {
    let after_slash = text.rfind('/').map_or(0, |i| i + 1);
    match text[after_slash..].rfind(':') {
        Some(i) => (&text[..after_slash + i], Some(&text[after_slash + i + 1..])),
        None => (text, None),
    }
}

/// The first component is a registry when it looks like a host: it has a `.` or a `:`
/// (a port), or is `localhost` (the rule docker and the distribution spec's clients use).
fn split_registry(text: &str) -> (Option<&str>, &str) {
    match text.split_once('/') {
        Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" => {
            (Some(first), rest)
        }
        _ => (None, text),
    }
}

fn valid_tag(tag: &str) -> bool {
    (1..=128).contains(&tag.len())
        && !tag.starts_with(['.', '-'])
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fn valid_repository(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name.split('/').all(|component| {
            let bytes = component.as_bytes();
            !bytes.is_empty()
                && bytes[0].is_ascii_alphanumeric()
                && bytes[bytes.len() - 1].is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b".-_".contains(b))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest() -> String {
        format!("sha256:{}", "0".repeat(64))
    }

    #[test]
    fn a_name_without_a_registry_takes_the_default_one() {
        let r = ImageRef::parse(
            &format!("document-tools@{}", digest()),
            Some("reg.test:5000"),
        )
        .unwrap();
        assert_eq!(r.registry.as_deref(), Some("reg.test:5000"));
        assert_eq!(r.repository, "document-tools");
        assert_eq!(
            r.to_string(),
            format!("reg.test:5000/document-tools@{}", digest())
        );
    }

    #[test]
    fn a_host_like_first_component_is_the_registry() {
        for (text, registry, repository) in [
            ("127.0.0.1:5000/tools/py", "127.0.0.1:5000", "tools/py"),
            ("localhost/py", "localhost", "py"),
            ("ghcr.io/org/py", "ghcr.io", "org/py"),
        ] {
            let r = ImageRef::parse(&format!("{text}@{}", digest()), None).unwrap();
            assert_eq!(r.registry.as_deref(), Some(registry), "{text}");
            assert_eq!(r.repository, repository, "{text}");
        }
        let r = ImageRef::parse(&format!("org/py@{}", digest()), None).unwrap();
        assert_eq!((r.registry, r.repository.as_str()), (None, "org/py"));
    }

    #[test]
    fn a_port_is_not_a_tag_but_a_colon_after_the_last_slash_is() {
        let r = ImageRef::parse("127.0.0.1:5000/py:3.12", None).unwrap();
        assert_eq!(r.registry.as_deref(), Some("127.0.0.1:5000"));
        assert_eq!(r.tag.as_deref(), Some("3.12"));
        assert_eq!(r.digest, None);
    }

    #[test]
    fn a_bare_name_an_uppercase_name_and_a_bad_digest_are_refused() {
        for bad in [
            "py".to_string(),
            format!("Py@{}", digest()),
            "py@sha256:abc".to_string(),
            format!("py/../x@{}", digest()),
            "py:-x".to_string(),
            format!("@{}", digest()),
        ] {
            assert!(ImageRef::parse(&bad, None).is_err(), "{bad}");
        }
    }
}
