//! Krafla inference core: file formats, tokenizer, model, sampler and the CLI
//! shared by every executable. ISA-free: the kernels this build uses are
//! chosen in `kernels` by `cfg(target_feature)`.
pub mod chat;
pub mod cli;
pub mod kernels;
pub mod kvcache;
pub mod measure;
pub mod mlb;
pub mod model;
pub mod quant;
pub mod sampler;
pub mod server;
pub mod tokenizer;
