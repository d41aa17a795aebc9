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
//!
//! The parts, for callers that run several sequences at once (the server's
//! batch): `Sequence` (a state and the ids it holds), `forward_sequences`
//! (one forward pass over new tokens of several sequences) and `Decoding`
//! (one sequence's sampling and text, a token at a time).

mod speculative;
mod text;

use std::sync::Arc;
use std::time::Instant;

pub use speculative::{Draft, DraftModel, Source, SpecStats, Speculator};
pub use text::TextStream;

use crate::grammar::{allowed, Constrained, Constraint};
use crate::model::{LogitsFor, Model, Segment, State};
use crate::sampler::{Distribution, Sampler, SamplerConfig};
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
    /// A grammar the output must match (`--json-schema`, `--grammar`,
    /// `response_format`): tokens that cannot continue it are never
    /// sampled, and decoding stops when the output is complete.
    pub constrained: Option<Constrained>,
}

/// What the CLI and the server say when `Decoded::grammar_cut`.
pub const GRAMMAR_CUT: &str =
    "the grammar is too ambiguous to follow further (its parse was cut), so the output is incomplete";

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
    /// The output's grammar was too ambiguous to follow (its parse was cut:
    /// `grammar::Constraint::overflowed`), so decoding ended before the
    /// grammar was matched: the output is incomplete (`finish` says `Length`).
    pub grammar_cut: bool,
}

/// What `Decoding::next` made of a position's logits.
pub enum Next {
    /// A token, the text now safe to show, and whether decoding ends with it.
    Token { id: u32, text: String, finish: Option<Finish> },
    /// Decoding ended without a token (a stop id, or no tokens left).
    End(Finish),
}

/// One sequence's decoding, a token at a time: the sampler, the history for
/// its penalties, the text so far, and when to stop.
pub struct Decoding {
    sampler: Sampler,
    history: Vec<u32>,
    text: TextStream,
    tokens: Vec<u32>,
    max_tokens: usize,
    stop_ids: Vec<u32>,
    constraint: Option<Constraint>,
}

impl Decoding {
    /// `history`: the tokens before (the prompt), for the repetition penalty.
    pub fn new(history: &[u32], params: &DecodeParams) -> Decoding {
        Decoding {
            sampler: Sampler::new(params.sampler.clone()),
            history: history.to_vec(),
            text: TextStream::new(params.stop_strings.clone()),
            tokens: Vec::new(),
            max_tokens: params.max_tokens,
            stop_ids: params.stop_ids.clone(),
            constraint: params.constrained.as_ref().map(|c| Constraint::new(c.grammar.clone(), c.vocab.clone())),
        }
    }

    /// Samples the token after `logits`; `room` says whether the sequence
    /// has a position left to run it (else the token is the last). The
    /// sampler draws the n-th token with the n-th random number of its seed,
    /// so the token is the same whether a drafter guessed it or not: a guess
    /// is kept when it is this token (`verify`), and a seed fixes the output
    /// with or without speculative decoding.
    pub fn next(&mut self, logits: &[f32], tokenizer: Option<&Tokenizer>, room: bool) -> Next {
        if self.tokens.len() >= self.max_tokens {
            return Next::End(Finish::Length);
        }
        // rows beyond the tokenizer (vocabulary padding) have no text: never sampled
        let n = tokenizer.map_or(logits.len(), |t| t.vocab_size().min(logits.len()));
        let dist = match self.constraint.is_some() {
            false => self.sampler.distribution(&logits[..n], &self.history),
            true => match self.constrained_distribution(&logits[..n]) {
                Some(d) => d,
                None => return Next::End(Finish::Length),
            },
        };
        let id = self.sampler.draw_at(&dist, self.tokens.len() as u64);
        if self.stop_ids.contains(&id) {
            return Next::End(Finish::Stop);
        }
        if let Some(c) = &mut self.constraint {
            let taken = c.accept(id);
            debug_assert!(taken, "a token the grammar refuses was sampled");
        }
        let prev = self.tokens.last().copied();
        self.tokens.push(id);
        self.history.push(id);
        let (text, hit_stop) = match tokenizer {
            Some(tok) => self.text.push(&tok.decode_piece(prev, id)),
            None => (String::new(), false),
        };
        let complete = self.constraint.as_ref().is_some_and(|c| c.complete());
        let finish = if hit_stop || complete {
            Some(Finish::Stop)
        } else if self.tokens.len() >= self.max_tokens || !room {
            Some(Finish::Length)
        } else {
            None
        };
        Next::Token { id, text, finish }
    }

    /// The distribution to draw from under the grammar (None: no token can
    /// continue the output). The sampler's filters (top-k, top-p, min-p)
    /// pick the candidates from the model's distribution as without a
    /// grammar, and the grammar keeps those that can continue the output
    /// (checked token by token, or by the mask when there are many); greedy
    /// takes the first of the 64 best tokens it allows (the argmax of the
    /// masked logits: the same order and ties). Only when it keeps none are the logits masked first (every
    /// token that cannot continue the output at −∞) and the filters applied
    /// to what is left. End-of-text ids may follow only a whole match.
    fn constrained_distribution(&mut self, logits: &[f32]) -> Option<Distribution> {
        let c = self.constraint.as_mut().expect("constrained");
        let stop_ok = c.accepting();
        let stop_ids = &self.stop_ids;
        let mut mask: Option<std::sync::Arc<Vec<u64>>> = None;
        let mut ok = |c: &mut Constraint, id: u32, many: bool| {
            if stop_ids.contains(&id) {
                return stop_ok;
            }
            if many {
                return allowed(mask.get_or_insert_with(|| c.mask()), id);
            }
            c.allows(id)
        };
        match self.sampler.distribution(logits, &self.history) {
            Distribution::Greedy(id) if ok(c, id, false) => return Some(Distribution::Greedy(id)),
            Distribution::Greedy(_) => {
                // the best allowed token is the masked logits' argmax
                let best = self.sampler.best(logits, &self.history, CHECKED_ONE_BY_ONE);
                if let Some(id) = best.into_iter().find(|&id| ok(c, id, false)) {
                    return Some(Distribution::Greedy(id));
                }
            }
            Distribution::Weights(w) => {
                let many = w.len() > CHECKED_ONE_BY_ONE;
                let kept: Vec<(u32, f64)> = w.into_iter().filter(|&(id, _)| ok(c, id, many)).collect();
                if !kept.is_empty() {
                    return Some(Distribution::Weights(kept));
                }
            }
        }
        let mut masked = logits.to_vec();
        let mut any = false;
        for (id, v) in masked.iter_mut().enumerate() {
            if ok(c, id as u32, true) {
                any = true;
            } else {
                *v = f32::NEG_INFINITY;
            }
        }
        any.then(|| self.sampler.distribution(&masked, &self.history))
    }

    /// Tokens sampled so far (the next one is at this position of the output).
    pub fn generated(&self) -> usize {
        self.tokens.len()
    }

    /// Tokens still allowed after the ones sampled so far.
    pub fn remaining(&self) -> usize {
        self.max_tokens.saturating_sub(self.tokens.len())
    }

    pub fn sampler_config(&self) -> &SamplerConfig {
        &self.sampler.config
    }

    /// The end: what was held back (nothing after a cancel), and the tokens.
    pub fn finish(mut self, finish: Finish) -> Decoded {
        let tail = if finish == Finish::Cancelled { String::new() } else { self.text.finish() };
        let grammar_cut = self.constraint.as_ref().is_some_and(|c| c.overflowed());
        Decoded { finish, tokens: self.tokens, tail, grammar_cut }
    }
}

/// Candidates up to this many are checked against the grammar one by one;
/// more, by the whole vocabulary's mask.
const CHECKED_ONE_BY_ONE: usize = 64;

/// One sequence's state and the ids whose keys and values it holds.
pub struct Sequence {
    state: State,
    /// len == state.pos
    cached: Vec<u32>,
}

impl Sequence {
    pub fn new(state: State) -> Sequence {
        Sequence { state, cached: Vec::new() }
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    /// The ids the state holds.
    pub fn cached(&self) -> &[u32] {
        &self.cached
    }

    /// True while the state has a position left.
    pub fn has_room(&self) -> bool {
        self.state.pos < self.state.ctx
    }

    /// Forgets the sequence: back to position 0.
    pub fn reset(&mut self) {
        self.state.reset();
        self.cached.clear();
    }

    /// Keeps the first `pos` positions (`State::truncate`).
    pub fn truncate(&mut self, pos: usize) {
        self.state.truncate(pos);
        self.cached.truncate(self.state.pos);
    }

    /// How many leading ids of `tokens` the state holds.
    pub fn common_prefix(&self, tokens: &[u32]) -> usize {
        self.cached.iter().zip(tokens).take_while(|(a, b)| a == b).count()
    }

    /// Keeps the longest cached prefix of `tokens`, but at most
    /// `tokens.len() − 1` so that at least one token is evaluated for
    /// logits; returns how many tokens it kept. A recurrent (DeltaNet) state
    /// cannot rewind, so it keeps all or nothing.
    pub fn reuse_prefix(&mut self, tokens: &[u32]) -> usize {
        let common = self.common_prefix(tokens);
        self.state.truncate(common.min(tokens.len().saturating_sub(1)));
        self.cached.truncate(self.state.pos);
        self.state.pos
    }
}

/// One forward pass over new tokens of several sequences (each with the
/// logits it wants); every sequence's logits are the same bits as from a
/// pass of its own. Returns the logits per part, in order.
pub fn forward_sequences(
    model: &Model,
    parts: &mut [(&mut Sequence, &[u32], LogitsFor)],
) -> Result<Vec<Vec<f32>>, String> {
    let mut segs: Vec<Segment> =
        parts.iter_mut().map(|(seq, tokens, want)| Segment { state: &mut seq.state, tokens, want: *want }).collect();
    let logits = model.forward_batch(&mut segs)?;
    for (seq, tokens, _) in parts.iter_mut() {
        seq.cached.extend_from_slice(tokens);
    }
    Ok(logits)
}

/// A model and the state of one sequence.
pub struct Generator {
    model: Arc<Model>,
    seq: Sequence,
    /// Prompt tokens per forward call.
    batch: usize,
}

impl Generator {
    pub fn new(model: Arc<Model>, state: State, batch: usize) -> Generator {
        assert!(batch > 0, "a prompt batch holds at least one token");
        Generator { model, seq: Sequence::new(state), batch }
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn state(&self) -> &State {
        &self.seq.state
    }

    /// Forgets the sequence: back to position 0.
    pub fn reset(&mut self) {
        self.seq.reset();
    }

    /// `Sequence::reuse_prefix`.
    pub fn reuse_prefix(&mut self, tokens: &[u32]) -> usize {
        self.seq.reuse_prefix(tokens)
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
            let out = self.model.forward(&mut self.seq.state, chunk, chunk_want)?;
            self.seq.cached.extend_from_slice(chunk);
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
        let logits = self.model.forward(&mut self.seq.state, &[token], LogitsFor::Last)?;
        self.seq.cached.push(token);
        Ok(logits)
    }

    /// Generates from `logits` (the prompt's last position), `history` being
    /// the tokens before (for the repetition penalty). Each token goes to
    /// `on` with its text (no text without a tokenizer); `on` returning
    /// false stops decoding (`Finish::Cancelled`). With a `speculator`, each
    /// forward pass also checks its draft of the tokens after the pending
    /// one (`verify`); the tokens are the same as without (greedy) or
    /// follow the same distribution (with temperature).
    pub fn decode(
        &mut self,
        logits: Vec<f32>,
        history: &[u32],
        params: &DecodeParams,
        tokenizer: Option<&Tokenizer>,
        mut speculator: Option<&mut Speculator>,
        on: &mut dyn FnMut(Token) -> bool,
    ) -> Result<Decoded, String> {
        let mut decoding = Decoding::new(history, params);
        let vocab = self.model.config.vocab_size;
        let left = self.seq.state.ctx - self.seq.state.pos;
        let mut pending = match verify(&mut decoding, &logits, vocab, &Draft::default(), tokenizer, left, on).next {
            Ok(id) => id,
            Err(finish) => return Ok(decoding.finish(finish)),
        };
        let finish = loop {
            let draft = match speculator.as_deref_mut() {
                Some(s) => s.draft_after(&self.seq, pending, &decoding)?,
                None => Draft::default(),
            };
            let mut tokens = vec![pending];
            tokens.extend_from_slice(&draft.ids);
            let want = if draft.ids.is_empty() { LogitsFor::Last } else { LogitsFor::All };
            let t0 = Instant::now();
            let rows = self.model.forward(&mut self.seq.state, &tokens, want)?;
            let secs = t0.elapsed().as_secs_f64();
            self.seq.cached.extend_from_slice(&tokens);
            let base = self.seq.state.pos - tokens.len();
            let left = self.seq.state.ctx - self.seq.state.pos;
            let verdict = verify(&mut decoding, &rows, vocab, &draft, tokenizer, left, on);
            self.seq.truncate(base + 1 + verdict.accepted);
            if let Some(s) = speculator.as_deref_mut() {
                s.record(tokens.len(), secs, draft.ids.len(), verdict.accepted);
            }
            match verdict.next {
                Ok(id) => pending = id,
                Err(finish) => break finish,
            }
        };
        Ok(decoding.finish(finish))
    }
}

/// What a verification pass decided.
pub struct Verdict {
    /// Guesses kept.
    pub accepted: usize,
    /// The next pending token, or how decoding ended.
    pub next: Result<u32, Finish>,
}

/// Samples the tokens after a forward pass: `rows` are the logits of its
/// last positions (`vocab` wide; the pending token's and the draft's, or a
/// prompt's last), and `left` is how many positions the state has left
/// after the pass. Row i gives the next token; the draft's guess i is kept
/// when the sampler picks it, and the first other token ends the pass as
/// the next pending one. Each token goes to `on`.
pub fn verify(
    decoding: &mut Decoding,
    rows: &[f32],
    vocab: usize,
    draft: &Draft,
    tokenizer: Option<&Tokenizer>,
    left: usize,
    on: &mut dyn FnMut(Token) -> bool,
) -> Verdict {
    // row i's token goes to the position `rows − 1 − i` before the end
    let room = left + rows.len() / vocab - 1;
    let mut accepted = 0;
    for i in 0..=draft.ids.len() {
        let logits = &rows[i * vocab..(i + 1) * vocab];
        let guess = draft.ids.get(i).copied();
        let next = decoding.next(logits, tokenizer, i < room);
        match next {
            Next::End(finish) => return Verdict { accepted, next: Err(finish) },
            Next::Token { id, text, finish } => {
                if !on(Token { id, text: &text, logits }) {
                    return Verdict { accepted, next: Err(Finish::Cancelled) };
                }
                if let Some(finish) = finish {
                    return Verdict { accepted, next: Err(finish) };
                }
                if guess == Some(id) {
                    accepted += 1;
                } else {
                    return Verdict { accepted, next: Ok(id) };
                }
            }
        }
    }
    unreachable!("the last row has no guess, so its token ends the loop")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::grammar::{schema, Vocab};
    use crate::test_rng::Rng;

    /// Decoding under a JSON Schema over a vocabulary of the ASCII bytes and
    /// a few longer pieces, on random logits: greedy takes the argmax of the
    /// masked logits (the first of the highest, as `argmax`), sampling only
    /// ever takes allowed tokens (with top-k, and over the whole vocabulary),
    /// and the output is complete when decoding stops.
    #[test]
    fn constrained_decoding_takes_the_masked_argmax_and_only_allowed_tokens() {
        let mut pieces: Vec<Box<[u8]>> = (0u8..128).map(|b| vec![b].into_boxed_slice()).collect();
        for p in ["{\"", "\":", "\",\"", "true", "false", "12", "\"}", "}"] {
            pieces.push(p.as_bytes().into());
        }
        let n = pieces.len();
        let vocab = Arc::new(Vocab::from_pieces(pieces, false));
        let s = serde_json::json!({"type": "object", "properties": {"a": {"type": "boolean"},
            "b": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}}, "required": ["a"]});
        let grammar = Arc::new(schema::compile(&s).unwrap());
        let mut rng = Rng(5);
        for (temperature, top_k) in [(0.0, 40), (1.0, 40), (1.0, 0)] {
            for round in 0..20 {
                let params = DecodeParams {
                    max_tokens: 200,
                    sampler: SamplerConfig {
                        temperature,
                        top_k,
                        top_p: 1.0,
                        min_p: 0.0,
                        seed: round,
                        ..Default::default()
                    },
                    stop_ids: Vec::new(),
                    stop_strings: Vec::new(),
                    constrained: Some(Constrained { grammar: grammar.clone(), vocab: vocab.clone() }),
                };
                let mut d = Decoding::new(&[], &params);
                let mut shadow = Constraint::new(grammar.clone(), vocab.clone());
                let mut done = false;
                for _ in 0..200 {
                    let logits: Vec<f32> = (0..n).map(|_| rng.f32() * 4.0).collect();
                    let mask = shadow.mask();
                    let masked: Vec<f32> = logits
                        .iter()
                        .enumerate()
                        .map(|(i, &v)| if allowed(&mask, i as u32) { v } else { f32::NEG_INFINITY })
                        .collect();
                    match d.next(&logits, None, true) {
                        Next::Token { id, finish, .. } => {
                            assert!(allowed(&mask, id), "token {id} is not allowed");
                            if temperature == 0.0 {
                                assert_eq!(id, crate::sampler::argmax(&masked));
                            }
                            assert!(shadow.accept(id));
                            if finish.is_some() {
                                assert_eq!(finish, Some(Finish::Stop));
                                done = true;
                                break;
                            }
                        }
                        Next::End(f) => panic!("ended without a token: {f:?}"),
                    }
                }
                assert!(done && shadow.complete(), "the output ends when it is complete");
            }
        }
    }
}
