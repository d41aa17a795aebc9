//! Krafla's file formats (docs/FORMAT.md): `.mlb` models and `.mlt`
//! tokenizers, both parsed with one bounds-checked byte reader. Readers
//! validate every count, length, shape and offset before use, so a
//! truncated or hostile file gives a one-line error, never a panic or an
//! allocation larger than the file.

pub mod bytes;
pub mod gguf;
pub mod mlb;
pub mod mlt;
