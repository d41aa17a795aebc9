//! The bytes of an HTTP request: head, framing and body.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| krafla::fuzz_entry::http_head(data));
