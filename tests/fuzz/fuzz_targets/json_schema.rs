//! A JSON Schema of `response_format` or `--json-schema`: the grammar, its masks and matching.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| krafla::fuzz_entry::json_schema(data));
