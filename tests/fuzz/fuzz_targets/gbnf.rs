//! A GBNF grammar of `--grammar` or a request's `grammar`: compiled, its masks and matching.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| krafla::fuzz_entry::gbnf(data));
