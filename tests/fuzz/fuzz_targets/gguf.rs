//! A GGUF file, then its tokenizer and model import.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| krafla::fuzz_entry::gguf(data));
