//! Property tests of the parsers the proxy runs on the cell's bytes (the same entry points
//! as the fuzz targets under fuzz/, whose invariants assert inside), and of the secret
//! rules: a placeholder never leaves in a forwarded head, the marker is found across any
//! cut, masked text holds no placeholder.

use airlock_egress::fuzzing;
use airlock_egress::secrets::{self, Injection, Placement, StreamScanner, MARKER};
use proptest::prelude::*;

fn placeholder() -> String {
    format!("{MARKER}{}", "0123456789abcdef".repeat(2))
}

fn injection() -> Injection {
    Injection {
        name: "p".into(),
        placeholder: placeholder(),
        value: "real".into(),
        hosts: vec!["api.test".into()],
        placement: Placement::Header {
            name: "Authorization".into(),
            format: "Bearer {}".into(),
        },
        methods: vec![],
        path_prefixes: vec![],
        revoke: vec![],
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn parsers_never_panic_on_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        fuzzing::http_request(&bytes);
        fuzzing::secret_headers(&bytes);
        fuzzing::sni(&bytes);
        fuzzing::dns(&bytes);
        fuzzing::socks5(&bytes);
        fuzzing::intercepted_hello(&bytes);
    }

    #[test]
    fn request_heads_with_a_placeholder_never_forward_it(
        method in "(GET|POST|PUT)",
        path in "/[a-z0-9/._%-]{0,20}",
        name in "[A-Za-z-]{1,12}",
        before in "[ -~]{0,10}",
        after in "[ -~]{0,10}",
        host in "(api|evil)\\.test",
    ) {
        let value = format!("{before}{}{after}", placeholder());
        let head = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\n{name}: {value}\r\n\r\n");
        fuzzing::http_request(head.as_bytes());
        let headers = [httparse::Header { name: &name, value: value.trim().as_bytes() }];
        let decided = secrets::apply(
            &[injection()],
            &secrets::Head { method: &method, target: &path, headers: &headers, host: &host },
        );
        match decided {
            Ok(swapped) => {
                // Only the exact placement on the secret's host is swapped.
                prop_assert_eq!(host.as_str(), "api.test");
                prop_assert!(name.eq_ignore_ascii_case("authorization"));
                prop_assert_eq!(&swapped.headers, &vec![(0, b"Bearer real".to_vec())]);
            }
            Err(code) => prop_assert!(code.starts_with("egress.")),
        }
    }

    #[test]
    fn the_marker_is_found_across_any_cuts(
        prefix in proptest::collection::vec(any::<u8>(), 0..64),
        suffix in proptest::collection::vec(any::<u8>(), 0..64),
        cuts in proptest::collection::vec(1usize..20, 1..12),
    ) {
        let mut stream = prefix;
        stream.extend_from_slice(MARKER.as_bytes());
        stream.extend_from_slice(&suffix);
        let mut scanner = StreamScanner::default();
        let mut found = false;
        let mut rest: &[u8] = &stream;
        for cut in cuts.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (chunk, tail) = rest.split_at((*cut).min(rest.len()));
            found |= scanner.feed(chunk);
            rest = tail;
        }
        prop_assert!(found);
    }

    #[test]
    fn masked_text_holds_no_placeholder(text in "[a-z.]{0,10}", upper in any::<bool>()) {
        let p = if upper { placeholder().to_uppercase() } else { placeholder() };
        let masked = secrets::mask(&format!("{text}{p}{text}"));
        prop_assert!(!secrets::contains_marker(masked.as_bytes()));
    }

    #[test]
    fn ambiguous_paths_never_match_a_prefix(
        a in "[a-z]{0,5}",
        b in "[a-z]{0,5}",
        trick in "(/\\.\\./|/\\./|%2e%2e/|%2F|\\\\)",
    ) {
        let path = format!("/v1/{a}{trick}{b}");
        prop_assert!(!secrets::path_allowed(&["/v1/".to_string()], &path));
    }
}

/// Every committed `intercepted_hello` input (real ClientHellos and what the fuzzer grew
/// from them): the SNI reader and rustls agree on the server name, and nothing panics.
#[test]
fn the_committed_hello_corpus_reads_one_server_name_in_both_readers() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus/intercepted_hello");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        fuzzing::intercepted_hello(&std::fs::read(entry.path()).unwrap());
        seen += 1;
    }
    assert!(seen > 0, "no corpus at {}", dir.display());
}
