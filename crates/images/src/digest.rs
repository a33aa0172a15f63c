//! `sha256:<hex>` digests and hashing on the way through a reader.

use crate::error::{ImageError, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::io::Read;

/// A sha256 content digest. Only sha256 is accepted: it is what every registry and
/// `docker save` produce, and one algorithm keeps the store's paths one shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest {
    hex: String,
}

impl Digest {
    pub fn parse(text: &str) -> Result<Digest> {
        let hex = text
            .strip_prefix("sha256:")
            .ok_or_else(|| ImageError::Digest(text.to_string()))?;
        Digest::from_hex(hex).ok_or_else(|| ImageError::Digest(text.to_string()))
    }

    /// 64 lowercase hex digits, else `None`: the hex becomes a file name in the store,
    /// so nothing else (no `/`, no `..`) may pass.
    pub fn from_hex(hex: &str) -> Option<Digest> {
        let ok = hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        ok.then(|| Digest {
            hex: hex.to_string(),
        })
    }

    pub fn of(bytes: &[u8]) -> Digest {
        Digest {
            hex: hex::encode(Sha256::digest(bytes)),
        }
    }

    pub fn hex(&self) -> &str {
        &self.hex
    }

    /// Refuses `actual` unless it is this digest.
    pub fn check(&self, actual: &Digest) -> Result<()> {
        if self == actual {
            Ok(())
        } else {
            Err(ImageError::DigestMismatch {
                expected: self.to_string(),
                actual: actual.to_string(),
            })
        }
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

impl TryFrom<String> for Digest {
    type Error = ImageError;
    fn try_from(text: String) -> Result<Digest> {
        Digest::parse(&text)
    }
}

impl From<Digest> for String {
    fn from(d: Digest) -> String {
        d.to_string()
    }
}

/// A reader that hashes and counts every byte it hands on, so a digest covers exactly
/// the bytes a parser consumed.
pub struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> HashingReader<R> {
    pub fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    /// Reads what the parser left (tar's trailing blocks and padding belong to the
    /// digest too), then the digest and the byte count.
    pub fn finish(mut self) -> std::io::Result<(Digest, u64)> {
        std::io::copy(&mut self, &mut std::io::sink())?;
        let hex = hex::encode(self.hasher.finalize());
        Ok((Digest { hex }, self.count))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sha256_with_64_lowercase_hex_digits_parses() {
        let hex = "a".repeat(64);
        assert_eq!(Digest::parse(&format!("sha256:{hex}")).unwrap().hex(), hex);
        for bad in [
            format!("sha512:{hex}"),
            format!("sha256:{}", "A".repeat(64)),
            format!("sha256:{}", "a".repeat(63)),
            format!("sha256:../{}", "a".repeat(61)),
            hex.clone(),
        ] {
            assert!(Digest::parse(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_hashing_reader_covers_bytes_the_parser_left_unread() {
        let data = b"hello world".to_vec();
        let mut reader = HashingReader::new(&data[..]);
        let mut first = [0u8; 5];
        reader.read_exact(&mut first).unwrap();
        let (digest, count) = reader.finish().unwrap();
        assert_eq!(digest, Digest::of(&data));
        assert_eq!(count, 11);
    }
}
