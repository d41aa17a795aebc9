//! An `.mlt` tokenizer file, then the tokenizer built from it, encoding and decoding.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| krafla::fuzz_entry::mlt(data));
