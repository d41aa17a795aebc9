//! The generation worker: `--parallel` slots, each a sequence with its own
//! KV cache, run together (continuous batching). Each step is one forward
//! pass over the next token of every decoding slot plus up to `--batch`
//! prompt tokens of the slots still reading their prompts (chunked
//! prefill, oldest request first), so a long prompt does not stop the
//! streams already running. A request that ends frees its slot at once; a
//! cancelled one (its client went away) or one past its deadline is let go
//! before the next step.
//!
//! A new request goes to the free slot whose cache its prompt continues (a
//! conversation picks up where its last turn left off), else to the slot
//! idle longest, and evaluates only what the slot does not hold. The forward pass is
//! batch-size invariant and each sequence attends only to its own cache, so
//! a request's logits are the same bits whatever shares the batch and
//! whatever its slot held. Text leaves as whole UTF-8 characters, with
//! anything that could still become a stop string held back
//! (`generate::TextStream`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use super::metrics::Metrics;
use crate::generate::{
    forward_sequences, verify, DecodeParams, Decoding, Draft, Finish, Sequence, SpecStats, Speculator, TextStream,
    Token,
};
use crate::grammar::{Constrained, Grammar, Vocab};
use crate::model::{LogitsFor, Model};
use crate::sampler::SamplerConfig;
use crate::tokenizer::Tokenizer;

/// Sampling and stopping settings of one request.
#[derive(Clone, Debug)]
pub struct GenParams {
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub seed: u64,
    pub stop: Vec<String>,
    /// Some(k): report each generated token's log-probability and the top k alternatives.
    pub logprobs: Option<usize>,
    /// Generate past the end-of-text and end-of-turn tokens (llama.cpp's `ignore_eos`).
    pub ignore_eos: bool,
    /// Seconds the request may take, from its arrival to its last token.
    pub timeout: Option<f64>,
    /// Fewest and most tokens drafted per pass, where the server drafts
    /// (llama.cpp's `speculative.n_min`, `speculative.n_max`); None: the
    /// server's `--draft-min`, `--draft-max`.
    pub draft_sizes: (Option<usize>, Option<usize>),
    /// The grammar the output must match (`response_format`).
    pub grammar: Option<Arc<Grammar>>,
}

/// Log-probability of one generated token (natural log, from the raw logits).
#[derive(Clone, Debug)]
pub struct TokenLogprob {
    pub bytes: Vec<u8>,
    /// Where the token starts in the generated text, in characters (Unicode
    /// code points, as a Python or JSON client counts them): the characters
    /// completed by the tokens before it. A token that starts inside a
    /// character has that character's offset; the character belongs to the
    /// token that completes it, as in the streamed deltas.
    pub text_offset: usize,
    pub logprob: f64,
    /// The k most likely tokens at this position: (bytes, logprob).
    pub top: Vec<(Vec<u8>, f64)>,
}

/// What the worker reports back to the connection that submitted a job.
#[derive(Debug)]
pub enum Event {
    /// The job has a slot and its prompt is being evaluated.
    Started,
    /// New text (possibly empty) and the logprobs of the token that produced it.
    Delta {
        text: String,
        logprobs: Option<TokenLogprob>,
    },
    Done {
        finish: Finish,
        prompt_tokens: usize,
        completion_tokens: usize,
        cached_tokens: usize,
    },
    Error(String),
}

pub struct Job {
    /// The request's id, for the access log.
    pub id: String,
    pub prompt: Vec<u32>,
    /// The prompt's text for the access log (`--log-prompts`), else None.
    pub prompt_text: Option<String>,
    pub params: GenParams,
    pub events: Sender<Event>,
    /// Set by the connection when its client disconnects (or its deadline
    /// passed while it waited).
    pub cancel: Arc<AtomicBool>,
    /// True while the job waits in the queue; the first to clear it (the
    /// worker taking it, or its connection withdrawing it) counts it out of
    /// the queue.
    pub queued: Arc<AtomicBool>,
    pub received: Instant,
}

impl Job {
    fn deadline(&self) -> Option<Instant> {
        self.params.timeout.map(|s| self.received + std::time::Duration::from_secs_f64(s))
    }
}

/// The submitting side of the worker's queue.
#[derive(Clone)]
pub struct Queue {
    tx: Sender<Job>,
    /// Jobs accepted and not yet ended (waiting or in a slot), at most
    /// slots + `max_queue`.
    accepted: Arc<AtomicUsize>,
    limit: usize,
    pub metrics: Arc<Metrics>,
}

impl Queue {
    /// Enqueues `job`; false (and the job dropped) when every slot is busy
    /// and `max_queue` jobs wait.
    pub fn submit(&self, job: Job) -> bool {
        let admitted =
            self.accepted.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < self.limit).then_some(n + 1));
        if admitted.is_err() {
            return false;
        }
        self.metrics.waiting.fetch_add(1, Ordering::SeqCst);
        if self.tx.send(job).is_err() {
            self.metrics.waiting.fetch_sub(1, Ordering::SeqCst);
            self.accepted.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// A waiting job leaves the queue now (its deadline passed or its client
    /// went away), so that its place goes to the next request rather than
    /// waiting for a slot to free; the worker drops it when it comes to it.
    pub fn withdraw(&self, queued: &AtomicBool) {
        if queued.swap(false, Ordering::SeqCst) {
            self.metrics.waiting.fetch_sub(1, Ordering::SeqCst);
            self.accepted.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A request in a slot.
struct Active {
    job: Job,
    /// Admission order: the oldest request's prompt goes first.
    order: u64,
    /// Prompt tokens reused from the slot's cache.
    cached: usize,
    /// Where the next prompt chunk starts (== prompt length once it is in).
    next_prompt: usize,
    /// Once the prompt is in: sampling and text.
    decoding: Option<Decoding>,
    /// The token sampled last, to run in the next step.
    pending: Option<u32>,
    admitted: Instant,
    prompt_done: Option<Instant>,
    last_token: Option<Instant>,
    /// For the logprobs' text offsets: the characters of the generated bytes
    /// so far (the same holdback as the text), and the token before.
    chars: TextStream,
    n_chars: usize,
    prev: Option<u32>,
    /// Guesses drafted and kept for this request.
    spec: SpecStats,
}

struct Slot {
    seq: Sequence,
    /// Drafts of the tokens after the pending one (`--lookup`, `--draft`).
    speculator: Option<Speculator>,
    /// When it last finished a request (a step count): the idle longest is reused first.
    idle_since: u64,
    active: Option<Active>,
}

/// What one slot puts into a step: a prompt chunk, or the pending token
/// and its draft.
struct Part {
    slot: usize,
    tokens: Vec<u32>,
    want: LogitsFor,
    draft: Draft,
}

pub struct Engine {
    model: Arc<Model>,
    slots: Vec<Slot>,
    /// Prompt tokens per step, over all slots.
    batch: usize,
    tokenizer: Arc<Tokenizer>,
    /// The vocabulary as constrained decoding reads it, made at the first
    /// request with a grammar.
    grammar_vocab: Option<Arc<Vocab>>,
    stop_ids: Vec<u32>,
    metrics: Arc<Metrics>,
    /// The queue's count of accepted jobs: a job that ends leaves it.
    accepted: Arc<AtomicUsize>,
    steps: u64,
    admitted: u64,
}

impl Engine {
    /// One slot per sequence in `sequences`, each with its speculator if
    /// there are any (`speculators`: one per sequence, or empty).
    pub fn new(
        model: Arc<Model>,
        sequences: Vec<Sequence>,
        speculators: Vec<Speculator>,
        batch: usize,
        tokenizer: Arc<Tokenizer>,
    ) -> Engine {
        assert!(batch > 0 && !sequences.is_empty());
        assert!(speculators.is_empty() || speculators.len() == sequences.len());
        let stop_ids = tokenizer.eos_id().into_iter().chain(tokenizer.eot_id()).collect();
        let metrics = Arc::new(Metrics::new(sequences.len()));
        let mut speculators = speculators.into_iter();
        let slots = sequences
            .into_iter()
            .map(|seq| Slot { seq, speculator: speculators.next(), idle_since: 0, active: None })
            .collect();
        let accepted = Arc::new(AtomicUsize::new(0));
        Engine {
            model,
            slots,
            batch,
            tokenizer,
            grammar_vocab: None,
            stop_ids,
            metrics,
            accepted,
            steps: 0,
            admitted: 0,
        }
    }

    /// Starts the worker on a thread of `pool` (so the forward pass's
    /// parallel loops start from inside the pool); up to `max_queue` jobs
    /// wait while every slot is busy.
    pub fn spawn(mut self, pool: &rayon::ThreadPool, max_queue: usize) -> Queue {
        let (tx, rx) = channel::<Job>();
        let limit = self.slots.len() + max_queue;
        let queue = Queue { tx, accepted: self.accepted.clone(), limit, metrics: self.metrics.clone() };
        pool.spawn(move || self.work(rx));
        queue
    }

    fn work(&mut self, rx: Receiver<Job>) {
        loop {
            // Wait for work when there is none; else take what fits without waiting.
            if self.slots.iter().all(|s| s.active.is_none()) {
                match rx.recv() {
                    Ok(job) => self.admit(job),
                    Err(_) => return,
                }
            }
            while self.slots.iter().any(|s| s.active.is_none()) {
                match rx.try_recv() {
                    Ok(job) => self.admit(job),
                    Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                }
            }
            self.let_go();
            self.step();
        }
    }

    /// Puts `job` into the free slot whose cache its prompt continues, else the slot idle longest.
    fn admit(&mut self, job: Job) {
        if !job.queued.swap(false, Ordering::SeqCst) {
            // withdrawn by its connection, which counted it out
            return;
        }
        self.metrics.waiting.fetch_sub(1, Ordering::SeqCst);
        if job.cancel.load(Ordering::SeqCst) {
            self.accepted.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        let ctx = self.slots[0].seq.state().ctx;
        let p = &job.prompt;
        if p.is_empty() || p.len() > ctx {
            let e = if p.is_empty() {
                "the prompt is empty".to_string()
            } else {
                format!("the prompt has {} tokens, more than the context of {ctx}", p.len())
            };
            self.accepted.fetch_sub(1, Ordering::SeqCst);
            let _ = job.events.send(Event::Error(e));
            return;
        }
        // A slot continues a conversation when the prompt covers at least half of what it
        // holds (llama.cpp's --slot-prompt-similarity 0.5): the longest such prefix wins.
        // Otherwise the slot idle longest (an empty one first), so that a new
        // conversation does not evict the cache of one that shares only a few tokens.
        let free = (0..self.slots.len()).filter(|&i| self.slots[i].active.is_none());
        let continues = free
            .clone()
            .map(|i| (self.slots[i].seq.common_prefix(p), i))
            .filter(|&(n, i)| n > 0 && 2 * n >= self.slots[i].seq.cached().len())
            .max_by_key(|&(n, i)| (n, std::cmp::Reverse(self.slots[i].idle_since)));
        let oldest = free.min_by_key(|&i| (!self.slots[i].seq.cached().is_empty(), self.slots[i].idle_since));
        let Some(i) = continues.map(|(_, i)| i).or(oldest) else {
            unreachable!("admit is called only with a free slot");
        };
        if job.events.send(Event::Started).is_err() {
            self.accepted.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        let slot = &mut self.slots[i];
        if let Some(s) = &mut slot.speculator {
            s.limit(job.params.draft_sizes);
        }
        let cached = slot.seq.reuse_prefix(p);
        self.admitted += 1;
        slot.active = Some(Active {
            job,
            order: self.admitted,
            cached,
            next_prompt: cached,
            decoding: None,
            pending: None,
            admitted: Instant::now(),
            prompt_done: None,
            last_token: None,
            chars: TextStream::new(Vec::new()),
            n_chars: 0,
            prev: None,
            spec: SpecStats::default(),
        });
        self.metrics.busy.fetch_add(1, Ordering::SeqCst);
    }

    /// Frees the slots of requests whose client went away or whose deadline passed.
    fn let_go(&mut self) {
        let now = Instant::now();
        for i in 0..self.slots.len() {
            let Some(a) = &self.slots[i].active else { continue };
            if a.job.cancel.load(Ordering::SeqCst) {
                self.end(i, Finish::Cancelled);
            } else if a.job.deadline().is_some_and(|d| now >= d) {
                // Like llama.cpp's time limit: the answer so far, cut as by a token limit.
                self.end(i, Finish::Length);
            }
        }
    }

    /// One forward pass: every decoding slot's next token, then prompt
    /// chunks of the others, oldest request first, up to `batch` tokens.
    fn step(&mut self) {
        let mut order: Vec<(u64, usize)> =
            self.slots.iter().enumerate().filter_map(|(i, s)| s.active.as_ref().map(|a| (a.order, i))).collect();
        order.sort_unstable();
        let mut parts = Vec::new();
        let mut budget = self.batch;
        for &(_, i) in &order {
            let slot = &mut self.slots[i];
            let a = slot.active.as_ref().expect("listed as active");
            if let Some(t) = a.pending {
                let draft = match (&mut slot.speculator, &a.decoding) {
                    // a draft model that fails costs only the guesses
                    (Some(s), Some(d)) => s.draft_after(&slot.seq, t, d).unwrap_or_else(|e| {
                        super::log(&format!("krafla: drafting failed: {e}"));
                        Draft::default()
                    }),
                    _ => Draft::default(),
                };
                let mut tokens = vec![t];
                tokens.extend_from_slice(&draft.ids);
                let want = if draft.ids.is_empty() { LogitsFor::Last } else { LogitsFor::All };
                parts.push(Part { slot: i, tokens, want, draft });
            } else if a.decoding.is_none() && budget > 0 {
                let end = a.job.prompt.len().min(a.next_prompt + budget);
                let want = if end == a.job.prompt.len() { LogitsFor::Last } else { LogitsFor::None };
                budget -= end - a.next_prompt;
                let tokens = a.job.prompt[a.next_prompt..end].to_vec();
                parts.push(Part { slot: i, tokens, want, draft: Draft::default() });
            }
        }
        if parts.is_empty() {
            return;
        }
        self.metrics.step(parts.len());
        self.steps += 1;
        let t0 = Instant::now();
        let result = {
            let mut seqs: Vec<Option<&mut Sequence>> = self.slots.iter_mut().map(|s| Some(&mut s.seq)).collect();
            let mut batch: Vec<(&mut Sequence, &[u32], LogitsFor)> = parts
                .iter()
                .map(|p| (seqs[p.slot].take().expect("one part per slot"), &p.tokens[..], p.want))
                .collect();
            let model = &self.model;
            // A panic would be a bug in the model code; it fails these requests, not the server.
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| forward_sequences(model, &mut batch)))
                .unwrap_or_else(|_| Err("internal error during generation (see the server log)".into()))
        };
        match result {
            Ok(logits) => {
                let secs = t0.elapsed().as_secs_f64();
                for (part, logits) in parts.iter().zip(logits) {
                    // logits that are not finite fail their request only
                    let rows = logits.len() / self.model.config.vocab_size.max(1);
                    match self.model.check_logits(&logits, self.slots[part.slot].seq.state().pos - rows) {
                        Ok(()) => self.advance(part, logits, secs),
                        Err(e) => self.fail(part.slot, &e),
                    }
                }
            }
            Err(e) => {
                super::log(&format!("krafla: a step of {} sequences failed: {e}", parts.len()));
                for part in &parts {
                    // The caches may be half-written: forget them.
                    self.slots[part.slot].seq.reset();
                    if let Some(a) = self.slots[part.slot].active.take() {
                        self.metrics.busy.fetch_sub(1, Ordering::SeqCst);
                        self.accepted.fetch_sub(1, Ordering::SeqCst);
                        let _ = a.job.events.send(Event::Error(e.clone()));
                    }
                }
            }
        }
    }

    /// Ends slot `i`'s request with the error `e` (an HTTP 500, or an error
    /// event when streaming) and forgets what its cache holds.
    fn fail(&mut self, i: usize, e: &str) {
        let slot = &mut self.slots[i];
        slot.seq.reset();
        slot.idle_since = self.steps;
        if let Some(a) = slot.active.take() {
            self.metrics.busy.fetch_sub(1, Ordering::SeqCst);
            self.accepted.fetch_sub(1, Ordering::SeqCst);
            super::log(&format!("krafla: request {}: {e}", a.job.id));
            let _ = a.job.events.send(Event::Error(e.to_string()));
        }
    }

    /// A slot's part of the step ran (taking `secs`): the next prompt
    /// chunk, or tokens to sample: after the prompt's last position, or
    /// after the pending token and each guess of its draft (`verify`).
    fn advance(&mut self, part: &Part, logits: Vec<f32>, secs: f64) {
        let now = Instant::now();
        let ignore_eos = self.slots[part.slot].active.as_ref().is_some_and(|a| a.job.params.ignore_eos);
        let stop_ids = if ignore_eos { Vec::new() } else { self.stop_ids.clone() };
        let wants_grammar = self.slots[part.slot].active.as_ref().is_some_and(|a| a.job.params.grammar.is_some());
        if wants_grammar && self.grammar_vocab.is_none() {
            self.grammar_vocab = Some(Arc::new(Vocab::new(&self.tokenizer)));
        }
        let grammar_vocab = self.grammar_vocab.clone();
        let (metrics, tokenizer) = (self.metrics.clone(), self.tokenizer.clone());
        let vocab = self.model.config.vocab_size;
        let slot = &mut self.slots[part.slot];
        let a = slot.active.as_mut().expect("a part comes from an active slot");
        let decoding_part = a.decoding.is_some();
        if a.decoding.is_none() {
            a.next_prompt += part.tokens.len();
            if part.want == LogitsFor::None {
                return;
            }
            a.decoding = Some(Decoding::new(&a.job.prompt, &decode_params(&a.job.params, stop_ids, grammar_vocab)));
            a.prompt_done = Some(now);
        }
        a.pending = None;
        let mut decoding = a.decoding.take().expect("set above");
        let rows = logits.len() / vocab;
        let (ctx, end) = (slot.seq.state().ctx, slot.seq.state().pos);
        let mut on = |t: Token| {
            let logprobs = a.job.params.logprobs.map(|k| {
                let lp = logprobs(&tokenizer, t.logits, t.id, k, a.n_chars);
                a.n_chars += a.chars.push(&tokenizer.decode_piece(a.prev, t.id)).0.chars().count();
                lp
            });
            a.prev = Some(t.id);
            match a.last_token {
                None => {
                    let prompt_took = now - a.admitted;
                    let evaluated = a.job.prompt.len() - a.cached;
                    metrics.prompt_done(evaluated, a.cached, prompt_took, now - a.job.received);
                    metrics.first_token();
                }
                Some(t) => metrics.token(now - t),
            }
            a.last_token = Some(now);
            let sent = a.job.events.send(Event::Delta { text: t.text.to_string(), logprobs }).is_ok();
            sent && !a.job.cancel.load(Ordering::SeqCst)
        };
        let verdict = verify(&mut decoding, &logits, vocab, &part.draft, Some(&tokenizer), ctx - end, &mut on);
        slot.seq.truncate(end + 1 - rows + verdict.accepted);
        if let (Some(s), true) = (&mut slot.speculator, decoding_part) {
            s.record(part.tokens.len(), secs, part.draft.ids.len(), verdict.accepted);
        }
        if !part.draft.ids.is_empty() {
            a.spec.add(SpecStats { drafted: part.draft.ids.len(), accepted: verdict.accepted, passes: 1 });
            metrics.drafted(part.draft.ids.len(), verdict.accepted);
        }
        a.decoding = Some(decoding);
        match verdict.next {
            Ok(id) => a.pending = Some(id),
            Err(finish) => self.end(part.slot, finish),
        }
    }

    /// Ends slot `i`'s request: the held-back text and the usage (unless
    /// cancelled), the access log line; the slot is free again.
    fn end(&mut self, i: usize, finish: Finish) {
        let slot = &mut self.slots[i];
        let Some(a) = slot.active.take() else { return };
        slot.idle_since = self.steps;
        // Free before the answer ends, so that the client's next request finds room.
        self.metrics.busy.fetch_sub(1, Ordering::SeqCst);
        self.accepted.fetch_sub(1, Ordering::SeqCst);
        let p_len = a.job.prompt.len();
        let (generated, tail) = match a.decoding {
            Some(d) => {
                let done = d.finish(finish);
                (done.tokens.len(), done.tail)
            }
            None => (0, String::new()),
        };
        if finish != Finish::Cancelled {
            if !tail.is_empty() {
                let _ = a.job.events.send(Event::Delta { text: tail, logprobs: None });
            }
            let _ = a.job.events.send(Event::Done {
                finish,
                prompt_tokens: p_len,
                completion_tokens: generated,
                cached_tokens: a.cached,
            });
        }
        let now = Instant::now();
        let ttft = a.prompt_done.map_or("-".to_string(), |t| format!("{:.3} s", (t - a.job.received).as_secs_f64()));
        let rate = match (a.prompt_done, a.last_token) {
            (Some(first), Some(last)) if generated > 1 => {
                format!("{:.1}", (generated - 1) as f64 / (last - first).as_secs_f64().max(1e-9))
            }
            _ => "-".to_string(),
        };
        let prompt = a.job.prompt_text.as_ref().map_or(String::new(), |t| format!(", prompt {t:?}"));
        let spec =
            if slot.speculator.is_some() { format!(", speculative: {}", a.spec.summary()) } else { String::new() };
        super::log(&format!(
            "krafla: request {}: prompt {p_len} tokens ({} cached), generated {generated} tokens, ttft {ttft}, \
             {rate} tokens/s, total {:.3} s, finish {}{spec}{prompt}",
            a.job.id,
            a.cached,
            (now - a.job.received).as_secs_f64(),
            finish.as_str()
        ));
    }
}

fn decode_params(params: &GenParams, stop_ids: Vec<u32>, vocab: Option<Arc<Vocab>>) -> DecodeParams {
    DecodeParams {
        max_tokens: params.max_tokens,
        sampler: SamplerConfig {
            temperature: params.temperature,
            top_k: params.top_k,
            top_p: params.top_p,
            min_p: params.min_p,
            repeat_penalty: params.repeat_penalty,
            seed: params.seed,
            ..Default::default()
        },
        stop_ids,
        stop_strings: params.stop.clone(),
        constrained: params.grammar.clone().zip(vocab).map(|(grammar, vocab)| Constrained { grammar, vocab }),
    }
}

/// Log-softmax of `logits` at `id`, and the `k` best tokens (ties: lower id
/// first); `text_offset` is where the token starts in the text.
fn logprobs(tokenizer: &Tokenizer, logits: &[f32], id: u32, k: usize, text_offset: usize) -> TokenLogprob {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let sum: f64 = logits.iter().map(|&v| (v as f64 - max).exp()).sum();
    let norm = max + sum.ln();
    let lp = |i: usize| logits[i] as f64 - norm;
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let k = k.min(order.len());
    let cmp = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
    if k > 0 && k < order.len() {
        order.select_nth_unstable_by(k - 1, cmp);
    }
    order.truncate(k);
    order.sort_by(cmp);
    TokenLogprob {
        bytes: tokenizer.decode_piece(Some(id), id),
        text_offset,
        logprob: lp(id as usize),
        top: order.iter().map(|&t| (tokenizer.decode_piece(Some(t), t), lp(t as usize))).collect(),
    }
}
