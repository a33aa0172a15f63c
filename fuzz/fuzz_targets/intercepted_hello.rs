#![no_main]
//! See crates/egress/src/fuzzing.rs for what this target feeds and checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    airlock_egress::fuzzing::intercepted_hello(data);
});
