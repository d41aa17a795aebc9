//! Krafla inference core, laid out by layer along the data path (each
//! layer uses only the ones above it; docs/ARCHITECTURE.md):
//!
//! * `fault`: whose fault an error is (input, resource, internal);
//! * `pool`: the inference thread pool the forward pass's parallel regions
//!   run on (workers that spin between regions and keep their cores);
//! * `quant`: the quantised block layouts (weights as stored, activations);
//! * `format`: the `.mlb`, `.mlt` and GGUF files, over one bounds-checked
//!   reader;
//! * `kernels`: the per-ISA kernels behind one trait, chosen when compiling,
//!   and the matrix multiply;
//! * `tokenizer`: byte-level and SentencePiece BPE;
//! * `model`: configuration, weights, KV cache and the one forward pass;
//! * `import`: a GGUF model and its tokenizer made into `.mlb` and `.mlt`
//!   ones at load time (conversion on all threads; the importance matrix
//!   measured by running the model on a text, `import::calibrate`);
//! * `grammar`: constrained decoding (JSON Schema, GBNF) as token masks;
//! * `sampler`, `generate`: picking tokens, and the one generation loop
//!   (prompt in batches, decoding, stop tokens, UTF-8 text);
//! * `chat`: chat templates;
//! * `app`: the applications over them: the CLI, `--bench` and
//!   `--perplexity`, the OpenAI-compatible server.
pub mod app;
pub mod chat;
pub mod fault;
pub mod format;
#[doc(hidden)]
pub mod fuzz_entry;
pub mod generate;
pub mod grammar;
pub mod import;
pub mod kernels;
pub mod model;
pub mod pool;
pub mod quant;
pub mod sampler;
#[cfg(test)]
mod test_rng;
pub mod tokenizer;
