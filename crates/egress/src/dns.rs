//! The cell's resolver: a DNS responder that answers only the names of the transparent
//! path, each with the loopback address its listeners were bound on, and never forwards
//! anything. A query for any other name is answered NXDOMAIN (or refused, when it is not
//! a well-formed single-question query) and recorded as [`reason::DNS_REFUSED`]: the
//! query name is the only data a cell can put in a DNS packet, and it stops here.
//!
//! Hand-written on purpose: the responder needs the header and one question, nothing of
//! a general DNS library, and a few dozen lines are easier to audit than the parser of
//! one. Deliberately strict where real stub resolvers never stray: exactly one
//! question, no compression in it, queries of at most [`MAX_QUERY`] bytes.
//!
//! [`reason::DNS_REFUSED`]: crate::reason::DNS_REFUSED

use std::net::Ipv4Addr;

use crate::destination::{parse_host, ParsedHost};

/// Longest query answered: a classic (non-EDNS) DNS message. One question of a name of
/// at most 255 bytes, plus an EDNS OPT record, fits many times over.
pub const MAX_QUERY: usize = 512;

/// Answers hand out a fixed address for the whole run; the TTL only saves the cell's
/// own caches a round trip.
const TTL_SECONDS: u32 = 300;

const HEADER_LEN: usize = 12;
const TYPE_A: u16 = 1;
const TYPE_ANY: u16 = 255;
const CLASS_IN: u16 = 1;
const FLAG_QR: u16 = 0x8000;
const FLAG_AA: u16 = 0x0400;
const FLAG_RD: u16 = 0x0100;
const OPCODE_MASK: u16 = 0x7800;

/// Response codes (RFC 1035 4.1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rcode {
    NoError = 0,
    FormErr = 1,
    NxDomain = 3,
    NotImp = 4,
    Refused = 5,
}

/// What to do with one datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The datagram to send back (`None`: too broken to answer, e.g. no header).
    pub reply: Option<Vec<u8>>,
    /// `Some(name)` when the query was refused (`""` when no name could be read); such a
    /// query becomes a denial record.
    pub refused: Option<String>,
}

/// The one question of a query.
struct Question<'a> {
    /// Labels joined with `.`, exactly as sent (case kept, for the echo).
    name: Vec<u8>,
    qtype: u16,
    qclass: u16,
    /// The question's bytes, echoed in the reply.
    wire: &'a [u8],
}

/// Decide and build the reply to `packet`; `lookup` gives the address of a name
/// (normalised: lower case, no trailing dot) or `None` if it must not resolve.
pub fn respond(packet: &[u8], lookup: impl Fn(&str) -> Option<Ipv4Addr>) -> Outcome {
    let Some(header) = packet.get(..HEADER_LEN) else {
        return refused(None, String::new());
    };
    let id = [header[0], header[1]];
    let flags = u16::from_be_bytes([header[2], header[3]]);
    let qdcount = u16::from_be_bytes([header[4], header[5]]);
    if flags & FLAG_QR != 0 {
        // A response sent to us: answering could start a loop.
        return refused(None, String::new());
    }
    let error = |rcode| refused(Some(reply(id, flags, rcode, None, None)), String::new());
    if flags & OPCODE_MASK != 0 {
        return error(Rcode::NotImp);
    }
    if packet.len() > MAX_QUERY || qdcount != 1 {
        return error(Rcode::FormErr);
    }
    let Some(question) = parse_question(&packet[HEADER_LEN..]) else {
        return error(Rcode::FormErr);
    };
    let shown = printable(&question.name);
    let answer_for = |rcode, address| Some(reply(id, flags, rcode, Some(question.wire), address));
    if question.qclass != CLASS_IN {
        return refused(answer_for(Rcode::Refused, None), shown);
    }
    let address =
        std::str::from_utf8(&question.name)
            .ok()
            .and_then(|name| match parse_host(name) {
                ParsedHost::Name(name) => lookup(&name),
                _ => None,
            });
    let Some(address) = address else {
        return refused(answer_for(Rcode::NxDomain, None), shown);
    };
    // The name exists; only A has data. AAAA (and everything else) is answered with no
    // data, so clients fall back to the IPv4 address instead of failing.
    let data = matches!(question.qtype, TYPE_A | TYPE_ANY).then_some(address);
    Outcome {
        reply: answer_for(Rcode::NoError, data),
        refused: None,
    }
}

fn refused(reply: Option<Vec<u8>>, name: String) -> Outcome {
    Outcome {
        reply,
        refused: Some(name),
    }
}

/// The question at the start of `body` (the bytes after the header).
fn parse_question(body: &[u8]) -> Option<Question<'_>> {
    let mut name = Vec::new();
    let mut at = 0;
    loop {
        let len = *body.get(at)? as usize;
        at += 1;
        if len == 0 {
            break;
        }
        // 0xC0: a compression pointer, 0x40/0x80: reserved label types. A stub
        // resolver's single question never uses them.
        if len > 63 {
            return None;
        }
        let label = body.get(at..at + len)?;
        at += len;
        if !name.is_empty() {
            name.push(b'.');
        }
        name.extend_from_slice(label);
        if name.len() > 253 {
            return None;
        }
    }
    let fixed = body.get(at..at + 4)?;
    Some(Question {
        name,
        qtype: u16::from_be_bytes([fixed[0], fixed[1]]),
        qclass: u16::from_be_bytes([fixed[2], fixed[3]]),
        wire: &body[..at + 4],
    })
}

/// The reply: the query's id and RD bit, authoritative (no recursion is offered), the
/// question echoed, and the A record when there is an address.
fn reply(
    id: [u8; 2],
    query_flags: u16,
    rcode: Rcode,
    question: Option<&[u8]>,
    address: Option<Ipv4Addr>,
) -> Vec<u8> {
    let flags = FLAG_QR | FLAG_AA | (query_flags & FLAG_RD) | rcode as u16;
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&id);
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&u16::from(question.is_some()).to_be_bytes());
    out.extend_from_slice(&u16::from(address.is_some()).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    if let Some(question) = question {
        out.extend_from_slice(question);
    }
    if let Some(address) = address {
        // The name as a pointer to the question's (offset 12).
        out.extend_from_slice(&[0xc0, 0x0c]);
        out.extend_from_slice(&TYPE_A.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&TTL_SECONDS.to_be_bytes());
        out.extend_from_slice(&4u16.to_be_bytes());
        out.extend_from_slice(&address.octets());
    }
    out
}

/// A query name as it goes into a record: lower case, anything but printable ASCII
/// shown as `?` (the name is the cell's data; it must not steer a terminal or a log).
fn printable(name: &[u8]) -> String {
    name.iter()
        .map(|&b| match b {
            0x21..=0x7e => b.to_ascii_lowercase() as char,
            _ => '?',
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const API: Ipv4Addr = Ipv4Addr::new(127, 100, 0, 1);

    fn lookup(name: &str) -> Option<Ipv4Addr> {
        (name == "api.test").then_some(API)
    }

    fn encode_name(name: &str) -> Vec<u8> {
        let mut out = Vec::new();
        for label in name.split('.').filter(|l| !l.is_empty()) {
            out.push(label.len() as u8);
            out.extend_from_slice(label.as_bytes());
        }
        out.push(0);
        out
    }

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut q = vec![0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        q.extend(encode_name(name));
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&CLASS_IN.to_be_bytes());
        q
    }

    fn rcode(reply: &[u8]) -> u16 {
        u16::from_be_bytes([reply[2], reply[3]]) & 0x000f
    }

    fn answers(reply: &[u8]) -> u16 {
        u16::from_be_bytes([reply[6], reply[7]])
    }

    #[test]
    fn an_allowlisted_name_gets_its_address() {
        let q = query("API.Test.", TYPE_A);
        let out = respond(&q, lookup);
        assert_eq!(out.refused, None);
        let r = out.reply.unwrap();
        assert_eq!(&r[..2], &[0xab, 0xcd], "the id is echoed");
        assert_eq!(u16::from_be_bytes([r[2], r[3]]), 0x8500, "QR AA RD NOERROR");
        assert_eq!(answers(&r), 1);
        assert_eq!(&r[12..q.len()], &q[12..], "the question is echoed as sent");
        assert_eq!(&r[r.len() - 4..], &API.octets());
    }

    #[test]
    fn aaaa_for_an_allowlisted_name_is_no_data_not_an_error() {
        let out = respond(&query("api.test", 28), lookup);
        assert_eq!(out.refused, None);
        let r = out.reply.unwrap();
        assert_eq!(rcode(&r), Rcode::NoError as u16);
        assert_eq!(answers(&r), 0);
    }

    #[test]
    fn any_other_name_is_nxdomain_and_recorded() {
        for name in [
            "evil.test",
            "sub.api.test",
            "api.test.evil.test",
            "localhost",
        ] {
            let out = respond(&query(name, TYPE_A), lookup);
            assert_eq!(out.refused.as_deref(), Some(name));
            let r = out.reply.unwrap();
            assert_eq!(rcode(&r), Rcode::NxDomain as u16, "{name}");
            assert_eq!(answers(&r), 0, "{name}");
        }
    }

    #[test]
    fn an_exfiltration_label_is_refused_and_recorded_whole() {
        let name = format!("{}.evil.test", "c2VjcmV0LWRhdGE".repeat(4));
        let out = respond(&query(&name, 16), lookup);
        assert_eq!(out.refused, Some(name.to_ascii_lowercase()));
        assert_eq!(rcode(&out.reply.unwrap()), Rcode::NxDomain as u16);
    }

    #[test]
    fn an_ip_literal_name_is_not_resolved() {
        let out = respond(&query("127.100.0.1", TYPE_A), |_| Some(API));
        assert_eq!(rcode(&out.reply.unwrap()), Rcode::NxDomain as u16);
    }

    #[test]
    fn malformed_packets_are_refused_without_an_answer() {
        // Too short for a header: nothing to answer to.
        let out = respond(&[0x12, 0x34, 0x01], lookup);
        assert_eq!((out.reply, out.refused), (None, Some(String::new())));
        // Truncated inside a label, inside the type/class, an over-long label.
        let full = query("api.test", TYPE_A);
        for cut in [13, 16, full.len() - 1] {
            let out = respond(&full[..cut], lookup);
            assert_eq!(
                rcode(&out.reply.unwrap()),
                Rcode::FormErr as u16,
                "cut {cut}"
            );
            assert!(out.refused.is_some());
        }
        let mut long = vec![0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 64];
        long.extend_from_slice(&[b'a'; 64]);
        long.extend_from_slice(&[0, 0, 1, 0, 1]);
        assert_eq!(rcode(&respond(&long, lookup).reply.unwrap()), 1);
    }

    #[test]
    fn compression_pointers_in_the_question_are_refused() {
        // A pointer to itself (a loop) and a pointer into the header.
        for pointer in [[0xc0, 0x0c], [0xc0, 0x00]] {
            let mut q = vec![0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
            q.extend_from_slice(&pointer);
            q.extend_from_slice(&[0, 1, 0, 1]);
            let out = respond(&q, |_| Some(API));
            assert_eq!(rcode(&out.reply.unwrap()), Rcode::FormErr as u16);
            assert!(out.refused.is_some());
        }
    }

    #[test]
    fn several_or_no_questions_are_refused() {
        for count in [0u16, 2] {
            let mut q = query("api.test", TYPE_A);
            q[4..6].copy_from_slice(&count.to_be_bytes());
            q.extend(encode_name("api.test"));
            q.extend_from_slice(&[0, 1, 0, 1]);
            let out = respond(&q, lookup);
            let r = out.reply.unwrap();
            assert_eq!(rcode(&r), Rcode::FormErr as u16, "{count} questions");
            assert_eq!(answers(&r), 0);
            assert!(out.refused.is_some());
        }
    }

    #[test]
    fn huge_packets_and_long_names_are_refused() {
        let mut q = query("api.test", TYPE_A);
        q.resize(MAX_QUERY + 1, 0);
        assert_eq!(rcode(&respond(&q, lookup).reply.unwrap()), 1);
        let long = vec!["a".repeat(63); 5].join(".");
        let out = respond(&query(&long, TYPE_A), |_| Some(API));
        assert_eq!(rcode(&out.reply.unwrap()), Rcode::FormErr as u16);
    }

    #[test]
    fn responses_other_opcodes_and_classes_are_not_answered_with_data() {
        let mut response = query("api.test", TYPE_A);
        response[2] |= 0x80;
        assert_eq!(respond(&response, lookup).reply, None);
        let mut notify = query("api.test", TYPE_A);
        notify[2] |= 0x20; // opcode 4
        assert_eq!(rcode(&respond(&notify, lookup).reply.unwrap()), 4);
        let mut chaos = query("api.test", TYPE_A);
        let n = chaos.len();
        chaos[n - 1] = 3;
        let out = respond(&chaos, lookup);
        assert_eq!(rcode(&out.reply.unwrap()), Rcode::Refused as u16);
        assert_eq!(out.refused.as_deref(), Some("api.test"));
    }

    #[test]
    fn recorded_names_are_printable() {
        let mut q = vec![0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 3, 0x1b, b'[', b'X', 0];
        q.extend_from_slice(&[0, 1, 0, 1]);
        assert_eq!(respond(&q, lookup).refused.as_deref(), Some("?[x"));
    }

    #[test]
    fn every_prefix_of_a_query_is_handled_without_panic() {
        let q = query("api.test", TYPE_A);
        for cut in 0..q.len() {
            let _ = respond(&q[..cut], lookup);
        }
    }
}
