//! A short input scaled up (P A^n M C^n S) for the parsers of request text: deep nesting on a
//! connection thread's stack, and long runs of one construct within a second.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| krafla::fuzz_entry::scaled(data));
