//! Speculative decoding: guesses of the next tokens (drafts), checked by the
//! target model in one forward pass over all of them.
//!
//! A draft comes from prompt lookup (the last `ngram` tokens found earlier
//! in the context: what followed them there is the guess) or from a small
//! draft model of the same vocabulary. The target evaluates the pending
//! token and the draft together; position i's logits decide token i + 1
//! (`Decoding::next_given_draft`), and the first refused draft ends the
//! pass, so one pass yields between one token and all the drafts plus one.
//! The forward pass is batch-size invariant, so each position's logits are
//! the bits of a one-token step, and the sampler draws the n-th token of the
//! output with the n-th random number of its seed: the output is identical
//! with and without speculation, greedy or with temperature, whatever the
//! number of guesses per pass. A draft model guesses with the same random
//! numbers (from its own distribution), so that its guesses are the
//! target's tokens as often as the two distributions allow.
//!
//! How many tokens to draft is chosen each time (`Pacer`) from the measured
//! cost of a pass over n tokens and the acceptance rate seen so far:
//! the number that maximises expected tokens per second, zero (no draft)
//! when guessing does not pay.

use std::sync::Arc;
use std::time::Instant;

use super::{Decoding, Sequence};
use crate::model::{LogitsFor, Model};
use crate::sampler::{Sampler, SamplerConfig};

/// Where drafts come from.
pub enum Source {
    /// Prompt lookup with n-grams of this many tokens.
    Lookup { ngram: usize },
    /// A draft model and its sequence (its own KV cache).
    Model(Box<DraftModel>),
}

/// A small model of the target's vocabulary that guesses the next tokens.
pub struct DraftModel {
    model: Arc<Model>,
    seq: Sequence,
    /// Prompt tokens per forward call when catching up with the context.
    batch: usize,
    sampler: Sampler,
}

impl DraftModel {
    pub fn new(model: Arc<Model>, seq: Sequence, batch: usize) -> DraftModel {
        DraftModel { model, seq, batch, sampler: Sampler::new(SamplerConfig::default()) }
    }

    /// Brings the draft model's cache up to `context` (a prompt just read).
    fn catch_up(&mut self, context: &[u32]) -> Result<(), String> {
        if context.len() > self.seq.state().ctx {
            return Ok(());
        }
        let kept = self.seq.reuse_prefix(context);
        for chunk in context[kept..].chunks(self.batch) {
            self.model.forward_one(&mut self.seq, chunk, LogitsFor::None)?;
        }
        Ok(())
    }

    /// Up to `max` tokens after `context`, the first at output position
    /// `position`: each drawn by the target's sampler settings from the draft
    /// model's logits, with the random number the target draws there.
    fn propose(
        &mut self,
        context: &[u32],
        max: usize,
        config: &SamplerConfig,
        position: u64,
    ) -> Result<Vec<u32>, String> {
        if &self.sampler.config != config {
            self.sampler = Sampler::new(config.clone());
        }
        let room = self.seq.state().ctx;
        if context.len() + max > room {
            return Ok(Vec::new());
        }
        let kept = self.seq.reuse_prefix(context);
        let mut logits = Vec::new();
        for chunk in context[kept..].chunks(self.batch) {
            logits = self.model.forward_one(&mut self.seq, chunk, LogitsFor::Last)?;
        }
        let vocab = self.model.config.vocab_size;
        let mut history = context.to_vec();
        let mut ids = Vec::new();
        for i in 0..max {
            let id = self.sampler.sample(&logits[logits.len() - vocab..], &history, position + i as u64);
            ids.push(id);
            history.push(id);
            if i + 1 < max {
                logits = self.model.forward_one(&mut self.seq, &[id], LogitsFor::Last)?;
            }
        }
        Ok(ids)
    }
}

impl Model {
    /// One forward call on a `Sequence`, which records the tokens.
    fn forward_one(&self, seq: &mut Sequence, tokens: &[u32], want: LogitsFor) -> Result<Vec<f32>, String> {
        let logits = self.forward(&mut seq.state, tokens, want)?;
        seq.cached.extend_from_slice(tokens);
        Ok(logits)
    }
}

/// Guesses of the tokens after the pending one.
#[derive(Default)]
pub struct Draft {
    pub ids: Vec<u32>,
}

/// Drafted and accepted tokens, and the verification passes with a draft.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    pub drafted: usize,
    pub accepted: usize,
    pub passes: usize,
}

impl SpecStats {
    pub fn add(&mut self, other: SpecStats) {
        self.drafted += other.drafted;
        self.accepted += other.accepted;
        self.passes += other.passes;
    }

    /// "drafted D, accepted A (R %)".
    pub fn summary(&self) -> String {
        let rate = if self.drafted == 0 { 0.0 } else { 100.0 * self.accepted as f64 / self.drafted as f64 };
        format!("drafted {}, accepted {} ({rate:.0} %)", self.drafted, self.accepted)
    }
}

/// One sequence's speculation: the source of drafts, the longest draft, and
/// the pacing.
pub struct Speculator {
    source: Source,
    /// Fewest and most guesses per pass: as configured, and for now.
    configured: (usize, usize),
    sizes: (usize, usize),
    pacer: Pacer,
    pub stats: SpecStats,
}

impl Speculator {
    /// `sizes`: the fewest guesses per pass when guessing does not seem to
    /// pay (0: none then), and the most.
    pub fn new(source: Source, sizes: (usize, usize)) -> Speculator {
        Speculator { source, configured: sizes, sizes, pacer: Pacer::new(sizes.1), stats: SpecStats::default() }
    }

    /// Other sizes for the next sequence (None: as configured); at most the
    /// configured most, and the fewest at most the most.
    pub fn limit(&mut self, sizes: (Option<usize>, Option<usize>)) {
        let max = sizes.1.unwrap_or(self.configured.1).min(self.configured.1);
        self.sizes = (sizes.0.unwrap_or(self.configured.0).min(max), max);
    }

    /// Reads a prompt (`context`: all the sequence holds) into the draft
    /// model's cache, so that the first draft does not pay for it.
    pub fn prepare(&mut self, context: &[u32]) -> Result<(), String> {
        match &mut self.source {
            Source::Lookup { .. } => Ok(()),
            Source::Model(m) => m.catch_up(context),
        }
    }

    /// A draft of the tokens after `pending`, the token sampled last for
    /// `seq`: no more than fit in its context and in `decoding`'s token limit.
    pub fn draft_after(&mut self, seq: &Sequence, pending: u32, decoding: &Decoding) -> Result<Draft, String> {
        // positions left after the pending token's, and tokens left after it
        let room = (seq.state.ctx - seq.state.pos - 1).min(decoding.remaining().saturating_sub(1));
        if room == 0 {
            return Ok(Draft::default());
        }
        let mut context = seq.cached.clone();
        context.push(pending);
        // the pending token is the output's last so far: the guesses follow it
        self.draft(&context, room, decoding.sampler_config(), decoding.generated() as u64)
    }

    /// A draft of at most `room` tokens to follow `context` (the tokens the
    /// target holds and the pending one), the first at output position `position`.
    fn draft(&mut self, context: &[u32], room: usize, config: &SamplerConfig, position: u64) -> Result<Draft, String> {
        let limit = self.sizes.1.min(room);
        let k = self.pacer.choose(limit).max(self.sizes.0.min(limit));
        if k == 0 {
            return Ok(Draft::default());
        }
        match &mut self.source {
            Source::Lookup { ngram } => Ok(Draft { ids: lookup(context, *ngram, k) }),
            Source::Model(m) => {
                let t0 = Instant::now();
                let ids = m.propose(context, k, config, position)?;
                self.pacer.draft_time(ids.len(), t0.elapsed().as_secs_f64());
                Ok(Draft { ids })
            }
        }
    }

    /// A verification pass over `tokens` tokens took `secs`, and `accepted`
    /// of its `drafted` guesses were kept.
    pub fn record(&mut self, tokens: usize, secs: f64, drafted: usize, accepted: usize) {
        self.pacer.pass(tokens, secs, drafted, accepted);
        if drafted > 0 {
            self.stats.add(SpecStats { drafted, accepted, passes: 1 });
        }
    }
}

/// The tokens that followed the most recent earlier occurrence of the last
/// `ngram` tokens of `context`, at most `max`.
pub fn lookup(context: &[u32], ngram: usize, max: usize) -> Vec<u32> {
    let n = ngram.max(1);
    if context.len() <= n || max == 0 {
        return Vec::new();
    }
    let tail = &context[context.len() - n..];
    // Starts of earlier occurrences, latest first; the tail itself excluded.
    for start in (0..context.len() - n).rev() {
        if &context[start..start + n] == tail {
            let from = start + n;
            let to = (from + max).min(context.len());
            return context[from..to].to_vec();
        }
    }
    Vec::new()
}

/// Chooses the draft length: the k that maximises expected tokens per
/// second, (1 − a^(k+1)) / (1 − a) tokens for one pass over k + 1 tokens
/// plus k draft tokens, with a the acceptance rate of one guess (a moving
/// average) and the costs measured as passes run. When no draft pays, it
/// drafts nothing, except for a probe of one token every `PROBE` passes so
/// that it notices when guessing starts to pay (text that repeats).
struct Pacer {
    /// Seconds of a pass over n tokens (index n), a moving average; 0 = not yet seen.
    pass_secs: Vec<f64>,
    /// Seconds per drafted token (a draft model's), a moving average.
    draft_secs: f64,
    /// Acceptance rate of one guess, a moving average.
    accept: f64,
    /// Passes since the last draft.
    idle: usize,
}

const PROBE: usize = 16;
const SMOOTHING: f64 = 0.25;

impl Pacer {
    fn new(max: usize) -> Pacer {
        Pacer { pass_secs: vec![0.0; max + 2], draft_secs: 0.0, accept: 0.75, idle: 0 }
    }

    /// The cost of a pass over `n` tokens: measured, or while unmeasured
    /// interpolated from the nearest measured sizes (optimistic above: the
    /// cost below plus a tenth per token, so that long drafts get tried;
    /// pessimistic below: in proportion to the tokens).
    fn cost(&self, n: usize) -> f64 {
        if self.pass_secs[n] > 0.0 {
            return self.pass_secs[n];
        }
        let below = (1..n).rev().find(|&m| self.pass_secs[m] > 0.0);
        let above = (n + 1..self.pass_secs.len()).find(|&m| self.pass_secs[m] > 0.0);
        match (below, above) {
            (Some(b), Some(a)) => {
                let f = (n - b) as f64 / (a - b) as f64;
                self.pass_secs[b] + f * (self.pass_secs[a] - self.pass_secs[b])
            }
            (Some(b), None) => self.pass_secs[b] * (1.0 + 0.1 * (n - b) as f64),
            // pessimistic below (as if cost grew with every token), so that a
            // pass without a draft gets measured before guessing is kept up
            (None, Some(a)) => self.pass_secs[a] * n as f64 / a as f64,
            (None, None) => 1.0 + 0.1 * (n - 1) as f64,
        }
    }

    /// The draft length with the best expected tokens per second at
    /// acceptance rate `a`, and that rate.
    fn best(&self, limit: usize, a: f64) -> (usize, f64) {
        let mut best = (0, 1.0 / self.cost(1));
        let mut expected = 1.0;
        for k in 1..=limit {
            expected += a.powi(k as i32);
            let rate = expected / (self.cost(k + 1) + k as f64 * self.draft_secs);
            if rate > best.1 {
                best = (k, rate);
            }
        }
        best
    }

    fn choose(&mut self, limit: usize) -> usize {
        let k = self.best(limit, self.accept.clamp(0.0, 0.99)).0;
        // Probe only where guessing could pay: not when even guesses that
        // are always right would not (a draft model as slow as the model).
        if k == 0 && limit > 0 && self.best(limit, 0.99).0 > 0 {
            self.idle += 1;
            if self.idle >= PROBE {
                self.idle = 0;
                return 1;
            }
        } else {
            self.idle = 0;
        }
        k
    }

    fn pass(&mut self, tokens: usize, secs: f64, drafted: usize, accepted: usize) {
        if tokens < self.pass_secs.len() {
            let old = self.pass_secs[tokens];
            self.pass_secs[tokens] = if old > 0.0 { old + SMOOTHING * (secs - old) } else { secs };
        }
        if drafted > 0 {
            // Guesses are tried in order until one is refused: `accepted`
            // successes and (unless all were kept) one failure.
            let tried = (accepted + usize::from(accepted < drafted)) as f64;
            let rate = accepted as f64 / tried;
            let weight = SMOOTHING * tried.min(4.0) / 4.0;
            self.accept += weight * (rate - self.accept);
        }
    }

    fn draft_time(&mut self, tokens: usize, secs: f64) {
        if tokens > 0 {
            let per = secs / tokens as f64;
            self.draft_secs =
                if self.draft_secs > 0.0 { self.draft_secs + SMOOTHING * (per - self.draft_secs) } else { per };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_copies_what_followed_the_latest_match() {
        let ctx = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3];
        assert_eq!(lookup(&ctx, 3, 2), vec![7, 8]);
        assert_eq!(lookup(&ctx, 3, 10), vec![7, 8, 5, 1, 2, 3]);
        assert!(lookup(&ctx, 4, 3).is_empty(), "5, 1, 2, 3 occurs only at the end");
        assert_eq!(lookup(&ctx, 1, 3), vec![7, 8, 5]);
        assert!(lookup(&[1, 2, 3], 3, 4).is_empty());
        assert!(lookup(&[4, 5, 6, 7], 2, 4).is_empty());
    }

    #[test]
    fn pacer_stops_drafting_when_guesses_fail_and_probes_again() {
        let mut p = Pacer::new(8);
        // one token 30 ms, four 45 ms, nine 90 ms
        for _ in 0..4 {
            p.pass(1, 0.030, 0, 0);
            p.pass(4, 0.045, 3, 3);
            p.pass(9, 0.090, 8, 8);
        }
        assert!(p.choose(8) >= 3, "good guesses: draft");
        for _ in 0..40 {
            p.pass(2, 0.040, 1, 0);
        }
        let choices: Vec<usize> = (0..PROBE).map(|_| p.choose(8)).collect();
        assert_eq!(choices.iter().filter(|&&k| k > 0).count(), 1, "{choices:?}");
        // a draft model that costs as much as the model: never worth a probe
        p.draft_time(1, 0.030);
        assert!((0..3 * PROBE).all(|_| p.choose(8) == 0));
    }

    #[test]
    fn pacer_measures_a_pass_without_a_draft_before_it_keeps_drafting() {
        // only long passes seen: one token is taken to cost its share of them, not all of it
        let mut p = Pacer::new(8);
        p.draft_time(8, 8.0 * 0.030);
        p.pass(9, 0.120, 8, 8);
        assert!((p.cost(1) - 0.120 / 9.0).abs() < 1e-12);
        assert_eq!(p.choose(8), 0, "a draft model as slow as the model does not pay");
    }
}
