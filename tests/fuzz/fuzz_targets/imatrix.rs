//! An importance matrix (`--imatrix`): the parse, the round trip, and Q4_0 weighted by it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| krafla::fuzz_entry::imatrix(data));
