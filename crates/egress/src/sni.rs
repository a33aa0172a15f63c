//! Minimal TLS ClientHello inspection: just enough to read the `server_name` extension.
//!
//! The proxy only needs one fact from the client's first flight: which server name it asks
//! for. A hand-written, bounds-checked parser keeps the trusted side free of a TLS stack.
//! Handshake messages may be fragmented over several TLS records and several reads; the
//! caller keeps feeding the growing prefix until a verdict is reached or
//! [`MAX_CLIENT_HELLO`] bytes were seen.

/// Larger than any real ClientHello (post-quantum key shares are ~1.3 KiB) by a wide margin.
pub const MAX_CLIENT_HELLO: usize = 64 * 1024;

const CONTENT_HANDSHAKE: u8 = 0x16;
const HANDSHAKE_CLIENT_HELLO: u8 = 0x01;
const EXT_SERVER_NAME: u16 = 0x0000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inspection {
    /// The stream does not start like TLS (the tunnel then checks it as plaintext).
    NotTls,
    /// Looks like TLS, but the ClientHello is not complete yet.
    NeedMore,
    /// A complete ClientHello; `server_name` is the SNI host name when present.
    ClientHello { server_name: Option<String> },
    /// Starts like TLS but is not a well-formed ClientHello.
    Malformed,
}

/// Inspect the first bytes a client sent into a tunnel.
pub fn inspect(prefix: &[u8]) -> Inspection {
    if prefix.is_empty() {
        return Inspection::NeedMore;
    }
    if prefix[0] != CONTENT_HANDSHAKE {
        return Inspection::NotTls;
    }
    if prefix.len() >= 2 && prefix[1] != 0x03 {
        return Inspection::NotTls;
    }
    // Reassemble the handshake payload from consecutive handshake records.
    let mut handshake = Vec::new();
    let mut rest = prefix;
    loop {
        if rest.len() < 5 {
            return need_more_or_malformed(prefix);
        }
        if rest[0] != CONTENT_HANDSHAKE || rest[1] != 0x03 {
            return Inspection::Malformed;
        }
        let len = u16::from_be_bytes([rest[3], rest[4]]) as usize;
        if len == 0 || len > (1 << 14) + 2048 {
            return Inspection::Malformed;
        }
        if rest.len() < 5 + len {
            return need_more_or_malformed(prefix);
        }
        handshake.extend_from_slice(&rest[5..5 + len]);
        rest = &rest[5 + len..];
        if handshake.len() >= 4 {
            if handshake[0] != HANDSHAKE_CLIENT_HELLO {
                return Inspection::Malformed;
            }
            let body_len =
                u32::from_be_bytes([0, handshake[1], handshake[2], handshake[3]]) as usize;
            if body_len > MAX_CLIENT_HELLO {
                return Inspection::Malformed;
            }
            if handshake.len() >= 4 + body_len {
                return match parse_client_hello(&handshake[4..4 + body_len]) {
                    Some(server_name) => Inspection::ClientHello { server_name },
                    None => Inspection::Malformed,
                };
            }
        }
    }
}

fn need_more_or_malformed(prefix: &[u8]) -> Inspection {
    if prefix.len() >= MAX_CLIENT_HELLO {
        Inspection::Malformed
    } else {
        Inspection::NeedMore
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()? as usize;
        self.take(n)
    }
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()? as usize;
        self.take(n)
    }
}

/// `Some(sni)` for a well-formed ClientHello body, `None` if malformed.
fn parse_client_hello(body: &[u8]) -> Option<Option<String>> {
    let mut r = Reader(body);
    let _legacy_version = r.u16()?;
    let _random = r.take(32)?;
    let session_id = r.vec8()?;
    if session_id.len() > 32 {
        return None;
    }
    let suites = r.vec16()?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return None;
    }
    let compression = r.vec8()?;
    if compression.is_empty() {
        return None;
    }
    if r.0.is_empty() {
        // Extensions are optional in very old clients: no SNI.
        return Some(None);
    }
    let mut exts = Reader(r.vec16()?);
    if !r.0.is_empty() {
        return None;
    }
    let mut server_name = None;
    let mut seen_sni = false;
    while !exts.0.is_empty() {
        let ext_type = exts.u16()?;
        let data = exts.vec16()?;
        if ext_type != EXT_SERVER_NAME {
            continue;
        }
        if seen_sni {
            // Duplicate extensions are illegal (RFC 8446 4.2) and a classic parser confusion.
            return None;
        }
        seen_sni = true;
        let mut list = Reader(data);
        let mut names = Reader(list.vec16()?);
        if !list.0.is_empty() || names.0.is_empty() {
            return None;
        }
        while !names.0.is_empty() {
            let name_type = names.u8()?;
            let name = names.vec16()?;
            if name_type != 0 {
                continue;
            }
            if server_name.is_some() || name.is_empty() {
                return None;
            }
            if !name
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
            {
                return None;
            }
            server_name = Some(String::from_utf8(name.to_vec()).ok()?);
        }
    }
    Some(server_name)
}

/// Build a syntactically valid TLS 1.3-style ClientHello (used by tests and the benchmark).
pub fn build_client_hello(server_name: Option<&str>) -> Vec<u8> {
    let mut exts = Vec::new();
    if let Some(name) = server_name {
        let name = name.as_bytes();
        let mut entry = vec![0u8];
        entry.extend_from_slice(&(name.len() as u16).to_be_bytes());
        entry.extend_from_slice(name);
        let mut data = (entry.len() as u16).to_be_bytes().to_vec();
        data.extend_from_slice(&entry);
        exts.extend_from_slice(&EXT_SERVER_NAME.to_be_bytes());
        exts.extend_from_slice(&(data.len() as u16).to_be_bytes());
        exts.extend_from_slice(&data);
    }
    // supported_versions: TLS 1.3, 1.2
    exts.extend_from_slice(&[0x00, 0x2b, 0x00, 0x05, 0x04, 0x03, 0x04, 0x03, 0x03]);
    // supported_groups: x25519
    exts.extend_from_slice(&[0x00, 0x0a, 0x00, 0x04, 0x00, 0x02, 0x00, 0x1d]);
    // key_share: x25519 with a 32-byte key
    exts.extend_from_slice(&[0x00, 0x33, 0x00, 0x26, 0x00, 0x24, 0x00, 0x1d, 0x00, 0x20]);
    exts.extend_from_slice(&[0x42; 32]);
    // signature_algorithms: ecdsa_secp256r1_sha256, rsa_pss_rsae_sha256
    exts.extend_from_slice(&[0x00, 0x0d, 0x00, 0x06, 0x00, 0x04, 0x04, 0x03, 0x08, 0x04]);

    let mut body = vec![0x03, 0x03];
    body.extend_from_slice(&[0x11; 32]);
    body.push(32);
    body.extend_from_slice(&[0x22; 32]);
    body.extend_from_slice(&[0x00, 0x06, 0x13, 0x01, 0x13, 0x02, 0x13, 0x03]);
    body.extend_from_slice(&[0x01, 0x00]);
    body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    body.extend_from_slice(&exts);

    let mut hs = vec![HANDSHAKE_CLIENT_HELLO];
    hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&body);

    let mut rec = vec![CONTENT_HANDSHAKE, 0x03, 0x01];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sni() {
        let hello = build_client_hello(Some("api.test"));
        assert_eq!(
            inspect(&hello),
            Inspection::ClientHello {
                server_name: Some("api.test".into())
            }
        );
        assert_eq!(
            inspect(&build_client_hello(None)),
            Inspection::ClientHello { server_name: None }
        );
    }

    #[test]
    fn every_prefix_needs_more() {
        let hello = build_client_hello(Some("api.test"));
        for cut in 0..hello.len() {
            assert_eq!(inspect(&hello[..cut]), Inspection::NeedMore, "cut at {cut}");
        }
    }

    #[test]
    fn fragmented_over_records() {
        let hello = build_client_hello(Some("other.test"));
        let hs = &hello[5..];
        let mut split = Vec::new();
        for chunk in hs.chunks(7) {
            split.extend_from_slice(&[0x16, 0x03, 0x01]);
            split.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
            split.extend_from_slice(chunk);
        }
        assert_eq!(
            inspect(&split),
            Inspection::ClientHello {
                server_name: Some("other.test".into())
            }
        );
    }

    #[test]
    fn non_tls_and_malformed() {
        assert_eq!(inspect(b"GET / HTTP/1.1\r\n"), Inspection::NotTls);
        assert_eq!(inspect(b"SSH-2.0-x\r\n"), Inspection::NotTls);
        assert_eq!(inspect(&[0x16, 0x01]), Inspection::NotTls);
        // ServerHello type instead of ClientHello
        let mut hello = build_client_hello(Some("a.test"));
        hello[5] = 0x02;
        assert_eq!(inspect(&hello), Inspection::Malformed);
        // an alert record in the middle
        assert_eq!(
            inspect(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28]),
            Inspection::NotTls
        );
        // truncated extension block inside a complete record
        let mut hello = build_client_hello(Some("a.test"));
        // extensions length: record 5 + handshake header 4 + body offset 77
        hello[86] = 0xff;
        assert_eq!(inspect(&hello), Inspection::Malformed);
        // oversized handshake claims are refused, not buffered forever
        let huge = [0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0xff, 0xff, 0xff];
        assert_eq!(inspect(&huge), Inspection::Malformed);
    }

    #[test]
    fn duplicate_sni_is_malformed() {
        let hello = build_client_hello(Some("a.test"));
        // Re-build with two server_name extensions by hand.
        let sni_ext: Vec<u8> = {
            let name = b"a.test";
            let mut v = vec![
                0x00,
                0x00,
                0x00,
                (name.len() + 5) as u8,
                0x00,
                (name.len() + 3) as u8,
                0x00,
                0x00,
                name.len() as u8,
            ];
            v.extend_from_slice(name);
            v
        };
        let body_start = 9;
        let mut body = hello[body_start..].to_vec();
        // extensions length is at offset 2+32+1+32+8+2 = 77
        let ext_len_at = 77;
        let ext_len =
            u16::from_be_bytes([body[ext_len_at], body[ext_len_at + 1]]) as usize + sni_ext.len();
        body[ext_len_at..ext_len_at + 2].copy_from_slice(&(ext_len as u16).to_be_bytes());
        body.extend_from_slice(&sni_ext);
        let mut hs = vec![0x01];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        let mut rec = vec![0x16, 0x03, 0x01];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        assert_eq!(inspect(&rec), Inspection::Malformed);
    }
}
