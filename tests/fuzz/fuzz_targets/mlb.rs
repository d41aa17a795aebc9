//! An `.mlb` model file, then the configuration a load derives from it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| krafla::fuzz_entry::mlb(data));
