//! The one generation loop, used by the CLI, the server, `--bench` and
//! `--perplexity`: a model with one sequence's state and the ids it holds.
//! A prompt goes through the model `batch` tokens per forward call
//! (`prefill`), after the longest prefix already in the cache where the
//! caller asks for that (`reuse_prefix`); decoding samples a token, stops at
//! a stop id, a stop string, the token limit or a full context, and turns
//! the tokens into text (`text::TextStream`).
//!
//! The forward pass gives the same logits bits for any batch size, so a
//! prompt evaluated in chunks, or after a reused prefix, decodes exactly as
//! from a cold start.

mod text;

use std::sync::Arc;

pub use text::TextStream;

use crate::model::{LogitsFor, Model, State};
use crate::sampler::{Sampler, SamplerConfig};
use crate::tokenizer::Tokenizer;

/// How decoding runs and when it stops.
#[derive(Clone, Debug)]
pub struct DecodeParams {
    /// Tokens to generate at most.
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    /// Token ids that end generation (not part of the output).
    pub stop_ids: Vec<u32>,
    /// Strings that end generation (cut from the text).
    pub stop_strings: Vec<String>,
}

/// Why decoding ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// A stop id or a stop string.
    Stop,
    /// The token limit, or the context is full.
    Length,
    /// The consumer asked to stop (a client that went away).
    Cancelled,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::Cancelled => "cancelled",
        }
    }
}

/// One generated token, as decoding hands it to its consumer.
pub struct Token<'a> {
    pub id: u32,
    /// The text that is now safe to show (possibly empty: an unfinished
    /// character, or what could still be a stop string, is held back).
    pub text: &'a str,
    /// The logits the token was sampled from.
    pub logits: &'a [f32],
}

/// The end of a decode.
pub struct Decoded {
    pub finish: Finish,
    pub tokens: Vec<u32>,
    /// Text held back until the end (empty after a cancel; a stop string
    /// and what follows it are never shown).
    pub tail: String,
}

/// A model and the state of one sequence.
pub struct Generator {
    model: Arc<Model>,
    state: State,
    /// Prompt tokens per forward call.
    batch: usize,
    /// The ids whose keys and values `state` holds (len == state.pos).
    cached: Vec<u32>,
}

impl Generator {
    pub fn new(model: Arc<Model>, state: State, batch: usize) -> Generator {
        assert!(batch > 0, "a prompt batch holds at least one token");
        Generator { model, state, batch, cached: Vec::new() }
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    /// Forgets the sequence: back to position 0.
    pub fn reset(&mut self) {
        self.state.reset();
        self.cached.clear();
    }

    /// Keeps the longest cached prefix of `tokens`, but at most
    /// `tokens.len() − 1` so that at least one token is evaluated for
    /// logits; returns how many tokens it kept. A recurrent (DeltaNet) state
    /// cannot rewind, so it keeps all or nothing.
    pub fn reuse_prefix(&mut self, tokens: &[u32]) -> usize {
        let common = self.cached.iter().zip(tokens).take_while(|(a, b)| a == b).count();
        self.state.truncate(common.min(tokens.len().saturating_sub(1)));
        self.cached.truncate(self.state.pos);
        self.state.pos
    }

    /// Evaluates `tokens` after what the state holds, `batch` at a time, and
    /// returns the logits asked for: the last position's (`Last`), every
    /// position's (`All`) or none. `cancelled` is asked before each batch;
    /// Ok(None) when it said yes.
    pub fn prefill(
        &mut self,
        tokens: &[u32],
        want: LogitsFor,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Option<Vec<f32>>, String> {
        let mut logits = Vec::new();
        let n_chunks = tokens.len().div_ceil(self.batch);
        for (i, chunk) in tokens.chunks(self.batch).enumerate() {
            if cancelled() {
                return Ok(None);
            }
            let last = i + 1 == n_chunks;
            let chunk_want = match want {
                LogitsFor::All => LogitsFor::All,
                LogitsFor::Last if last => LogitsFor::Last,
                _ => LogitsFor::None,
            };
            let out = self.model.forward(&mut self.state, chunk, chunk_want)?;
            self.cached.extend_from_slice(chunk);
            if want == LogitsFor::All {
                logits.extend_from_slice(&out);
            } else if last {
                logits = out;
            }
        }
        Ok(Some(logits))
    }

    /// Appends `token` and returns the logits of the position after it.
    pub fn step(&mut self, token: u32) -> Result<Vec<f32>, String> {
        let logits = self.model.forward(&mut self.state, &[token], LogitsFor::Last)?;
        self.cached.push(token);
        Ok(logits)
    }

    /// Generates from `logits` (the prompt's last position), `history` being
    /// the tokens before (for the repetition penalty). Each token goes to
    /// `on` with its text (no text without a tokenizer); `on` returning
    /// false stops decoding (`Finish::Cancelled`).
    pub fn decode(
        &mut self,
        logits: Vec<f32>,
        history: &[u32],
        params: &DecodeParams,
        tokenizer: Option<&Tokenizer>,
        on: &mut dyn FnMut(Token) -> bool,
    ) -> Result<Decoded, String> {
        let mut sampler = Sampler::new(params.sampler.clone());
        let mut history = history.to_vec();
        let mut text = TextStream::new(params.stop_strings.clone());
        let mut tokens: Vec<u32> = Vec::new();
        let mut logits = logits;
        let finish = loop {
            if tokens.len() >= params.max_tokens {
                break Finish::Length;
            }
            // rows beyond the tokenizer (vocabulary padding) have no text: never sampled
            let n = tokenizer.map_or(logits.len(), |t| t.vocab_size().min(logits.len()));
            let next = sampler.sample(&logits[..n], &history);
            if params.stop_ids.contains(&next) {
                break Finish::Stop;
            }
            let prev = tokens.last().copied();
            tokens.push(next);
            history.push(next);
            let (delta, hit_stop) = match tokenizer {
                Some(tok) => text.push(&tok.decode_piece(prev, next)),
                None => (String::new(), false),
            };
            if !on(Token { id: next, text: &delta, logits: &logits }) {
                break Finish::Cancelled;
            }
            if hit_stop {
                break Finish::Stop;
            }
            if tokens.len() >= params.max_tokens || self.state.pos >= self.state.ctx {
                break Finish::Length;
            }
            logits = self.step(next)?;
        };
        let tail = if finish == Finish::Cancelled { String::new() } else { text.finish() };
        Ok(Decoded { finish, tokens, tail })
    }
}
