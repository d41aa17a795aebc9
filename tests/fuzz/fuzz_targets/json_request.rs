//! An API request body: the JSON object, then both endpoints' request checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| krafla::fuzz_entry::json_request(data));
