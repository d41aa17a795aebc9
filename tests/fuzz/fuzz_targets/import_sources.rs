//! The readers of config.json, .safetensors, tokenizer.json, llama2.c's tokenizer.bin and
//! llama2.c checkpoints (the first byte chooses), and what an import does next with each.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| krafla::fuzz_entry::import_sources(data));
