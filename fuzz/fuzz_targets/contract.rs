#![no_main]
//! The contract parser and validator on any text, in each of its three formats (the
//! first byte picks the format). Parsing may refuse; it must never panic.

use airlock_contract::{parse_contract, ContractFormat};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((first, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let format = match first % 3 {
        0 => ContractFormat::Yaml,
        1 => ContractFormat::Toml,
        _ => ContractFormat::Json,
    };
    let _ = parse_contract(text, format);
});
