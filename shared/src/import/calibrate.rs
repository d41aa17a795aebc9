//! The importance matrix a GGUF model gets when its tensors become Q4_0
//! and no `--imatrix` is given: the model, with its tensors of the types
//! Krafla reads as they are and the others in Q8_0, runs the first
//! `TOKENS` tokens of a built-in text (the opening of Macbeth, public
//! domain; never the text the measurements of docs/QUANT.md score), and
//! records the mean square of every matrix's input columns.
//! docs/QUANT.md: 512 tokens give most of what 4096 do, and did better
//! than 256 on two of three models.

use std::path::Path;
use std::sync::Arc;

use super::gguf::import_model;
use super::imatrix::Imatrix;
use super::{ConvertType, ImportOptions};
use crate::format::gguf::Gguf;
use crate::model::{LoadOptions, LogitsFor, Model, State};
use crate::tokenizer::Tokenizer;

/// The calibration text: the opening of Macbeth (Project Gutenberg's text).
pub const TEXT: &str = include_str!("calibration.txt");

/// Tokens of `TEXT` the model runs.
pub const TOKENS: usize = 512;

/// The importance matrix of the GGUF model at `path` over `TEXT`.
pub fn imatrix(path: &Path, tokenizer: &Tokenizer) -> Result<Imatrix, String> {
    let mlb = import_model(Gguf::open(path)?, &ImportOptions::new(ConvertType::Q8_0))?;
    let mut model = Model::from_mlb(Arc::new(mlb), LoadOptions::default())?;
    model.record_inputs();
    measure(&model, tokenizer)
}

/// The importance matrix of a model that records its inputs
/// (`Model::record_inputs`), over `TEXT`.
pub fn measure(model: &Model, tokenizer: &Tokenizer) -> Result<Imatrix, String> {
    let mut tokens = tokenizer.encode(TEXT, true);
    tokens.truncate(TOKENS.min(model.config.context_length));
    let mut state = State::new(&model.config, tokens.len())?;
    model.forward(&mut state, &tokens, LogitsFor::None)?;
    let stats = model.input_stats().ok_or("the calibration run recorded nothing")?;
    Ok(Imatrix { entries: stats.means() })
}
