//! A chat template (Jinja): compiled, then rendered with a conversation as a request would be.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| krafla::fuzz_entry::chat_template(data));
