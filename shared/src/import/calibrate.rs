//! The importance matrix a model gets when its tensors become Q4_0
//! and no `--imatrix` is given: the model, with its tensors of the types
//! Krafla reads as they are and the others in Q8_0, runs the first tokens
//! of a built-in text (the opening of Macbeth, public domain; never the
//! text the measurements of docs/QUANT.md score), and records the mean
//! square of every matrix's input columns.
//!
//! How many tokens (`tokens`): 512, or fewer for a large model, so that
//! the run costs at most `BUDGET` weight·token products (512 tokens of a
//! model of 256M layer weights), and never fewer than 128. docs/QUANT.md:
//! 512 tokens gave a lower KL divergence than 256 and 128 on all three
//! models measured, by 3–8 % at 128; on Qwen2.5-Coder-1.5B the 128 it
//! gets cost 3 % (and its perplexity was lower), and its load 11 s less.

use std::sync::Arc;

use super::imatrix::Imatrix;
use super::Source;
use crate::fault::Fault;
use crate::model::{LoadOptions, LogitsFor, Model, State};
use crate::tokenizer::Tokenizer;

/// The calibration text: the opening of Macbeth (Project Gutenberg's text).
pub const TEXT: &str = include_str!("calibration.txt");

/// The most tokens of `TEXT` a calibration runs.
pub const MAX_TOKENS: usize = 512;

/// The fewest, whatever the model's size.
pub const MIN_TOKENS: usize = 128;

/// The weight·token products a calibration may cost: 512 tokens of 256M
/// weights (the transformer layers' matrices; the embedding is a lookup
/// and the head does not run).
pub const BUDGET: u64 = 512 << 28;

/// Tokens of `TEXT` a model of `layer_weights` runs: `BUDGET` worth,
/// in whole multiples of 64, from `MIN_TOKENS` to `MAX_TOKENS`. Counted
/// in u64 and clamped before the cast: a small model's fit (up to `BUDGET`
/// itself) does not fit a 32-bit usize.
pub fn tokens(layer_weights: u64) -> usize {
    let fit = BUDGET / layer_weights.max(1) / 64 * 64;
    fit.clamp(MIN_TOKENS as u64, MAX_TOKENS as u64) as usize
}

/// The importance matrix of a model over `TEXT`, the
/// model loaded as it would run (with its eight-row copies: on a Q4_K_M
/// file of 1.5B weights the copy takes 0.3 s and saves 0.8 s of the
/// 128-token pass). The forward pass gives the same bits either way.
pub fn imatrix(source: &Source, tokenizer: &Tokenizer) -> Result<Imatrix, Fault> {
    let mlb = source.calibration_model()?;
    let mut model = Model::from_mlb(Arc::new(mlb), LoadOptions::default())?;
    model.record_inputs();
    measure(&model, tokenizer)
}

/// The importance matrix of a model that records its inputs
/// (`Model::record_inputs`), over the first `tokens` of `TEXT`.
pub fn measure(model: &Model, tokenizer: &Tokenizer) -> Result<Imatrix, Fault> {
    let layer_weights = model.file.tensors.iter().filter(|t| t.name.starts_with("blk.")).map(|t| t.n_elements()).sum();
    let mut tokens = tokenizer.encode(TEXT, true);
    tokens.truncate(self::tokens(layer_weights).min(model.config.context_length));
    let mut state = State::new(&model.config, tokens.len())?;
    model.forward(&mut state, &tokens, LogitsFor::None)?;
    let stats = model.input_stats().ok_or("the calibration run recorded nothing")?;
    Ok(Imatrix { entries: stats.means() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_follow_the_budget_within_their_bounds() {
        assert_eq!(tokens(0), MAX_TOKENS);
        assert_eq!(tokens(1), MAX_TOKENS); // a fit of 2^37: beyond a 32-bit usize
        assert_eq!(tokens(32), MAX_TOKENS); // 2^32: a 32-bit usize's 0
        assert_eq!(tokens(106_000_000), 512); // SmolLM2-135M's layers
        assert_eq!(tokens(256 << 20), 512);
        assert_eq!(tokens(300_000_000), 448); // 458 whole tokens, down to a multiple of 64
        assert_eq!(tokens(1_310_000_000), MIN_TOKENS); // Qwen2.5-1.5B: 104 within budget
        assert_eq!(tokens(u64::MAX), MIN_TOKENS);
    }
}
