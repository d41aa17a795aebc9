//! The single generation worker. It owns the model, the KV cache (`State`)
//! and the ids the cache holds, and runs one job at a time from a bounded
//! queue. A job whose prompt shares a prefix with the cache evaluates only
//! the rest (the forward pass is batch-size invariant, so the logits are the
//! same bits as from a cold start). Text leaves as whole UTF-8 characters,
//! with anything that could still become a stop string held back.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, Sender, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Instant;

use crate::model::{LogitsFor, Model, State};
use crate::sampler::{Sampler, SamplerConfig};
use crate::tokenizer::Tokenizer;

/// Prompt tokens per forward call.
const PROMPT_BATCH: usize = 512;

/// Sampling and stopping settings of one request.
#[derive(Clone, Debug)]
pub struct GenParams {
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    pub min_p: f32,
    pub seed: u64,
    pub stop: Vec<String>,
    /// Some(k): report each generated token's log-probability and the top k alternatives.
    pub logprobs: Option<usize>,
}

/// Log-probability of one generated token (natural log, from the raw logits).
#[derive(Clone, Debug)]
pub struct TokenLogprob {
    pub bytes: Vec<u8>,
    pub logprob: f64,
    /// The k most likely tokens at this position: (bytes, logprob).
    pub top: Vec<(Vec<u8>, f64)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
    /// The client went away; nothing is sent.
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

/// What the worker reports back to the connection that submitted a job.
#[derive(Debug)]
pub enum Event {
    /// The job left the queue and its prompt is being evaluated.
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
    pub prompt: Vec<u32>,
    pub params: GenParams,
    pub events: Sender<Event>,
    /// Set by the connection when its client disconnects.
    pub cancel: Arc<AtomicBool>,
}

/// The submitting side of the worker's queue.
#[derive(Clone)]
pub struct Queue {
    tx: SyncSender<Job>,
    /// Jobs accepted but not yet started.
    pub waiting: Arc<AtomicUsize>,
    /// True while a job is running.
    pub busy: Arc<AtomicBool>,
}

impl Queue {
    /// Enqueues `job`; false (and the job dropped) when the queue is full.
    pub fn submit(&self, job: Job) -> bool {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        match self.tx.try_send(job) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.waiting.fetch_sub(1, Ordering::SeqCst);
                false
            }
        }
    }
}

pub struct Engine {
    model: Model,
    state: State,
    tokenizer: Arc<Tokenizer>,
    /// Token ids whose keys/values are in `state` (len == state.pos).
    cached: Vec<u32>,
    stop_ids: Vec<u32>,
}

impl Engine {
    pub fn new(model: Model, state: State, tokenizer: Arc<Tokenizer>) -> Engine {
        let stop_ids = tokenizer.eos_id().into_iter().chain(tokenizer.eot_id()).collect();
        Engine { model, state, tokenizer, cached: Vec::new(), stop_ids }
    }

    /// Starts the worker thread; up to `max_queue` jobs wait behind the running one.
    pub fn spawn(mut self, max_queue: usize) -> Result<Queue, String> {
        let (tx, rx) = sync_channel::<Job>(max_queue);
        let queue = Queue { tx, waiting: Arc::new(AtomicUsize::new(0)), busy: Arc::new(AtomicBool::new(false)) };
        let (waiting, busy) = (queue.waiting.clone(), queue.busy.clone());
        // The worker runs on a thread of the global pool, so the forward pass's
        // parallel loops start from inside the pool instead of handing work to it.
        rayon::spawn(move || self.work(rx, &waiting, &busy));
        Ok(queue)
    }

    fn work(&mut self, rx: Receiver<Job>, waiting: &AtomicUsize, busy: &AtomicBool) {
        while let Ok(job) = rx.recv() {
            busy.store(true, Ordering::SeqCst);
            waiting.fetch_sub(1, Ordering::SeqCst);
            if !job.cancel.load(Ordering::SeqCst) {
                // A panic would be a bug in the model code; it fails this request, not the server.
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run(&job)))
                    .unwrap_or_else(|_| Err("internal error during generation (see the server log)".into()));
                if let Err(e) = result {
                    // The cache may be half-written: forget it.
                    self.state.reset();
                    self.cached.clear();
                    eprintln!("krafla: request failed: {e}");
                    let _ = job.events.send(Event::Error(e));
                }
            }
            busy.store(false, Ordering::SeqCst);
        }
    }

    /// Runs one job to its end, sending events as it goes.
    fn run(&mut self, job: &Job) -> Result<(), String> {
        let t0 = Instant::now();
        let p = &job.prompt;
        let params = &job.params;
        if p.is_empty() {
            return Err("the prompt is empty".into());
        }
        if p.len() > self.state.ctx {
            return Err(format!("the prompt has {} tokens, more than the context of {}", p.len(), self.state.ctx));
        }
        // Reuse the longest cached prefix, but evaluate at least one token for logits.
        let mut common = self.cached.iter().zip(p).take_while(|(a, b)| a == b).count().min(p.len() - 1);
        self.state.truncate(common);
        common = common.min(self.state.pos); // a recurrent state starts over at 0
        self.cached.truncate(common);
        let send = |e: Event| job.events.send(e).is_ok();
        let cancelled = || job.cancel.load(Ordering::SeqCst);
        if !send(Event::Started) {
            return Ok(());
        }
        let mut logits = Vec::new();
        let rest = &p[common..];
        for chunk in rest.chunks(PROMPT_BATCH) {
            if cancelled() {
                return Ok(());
            }
            let last = chunk.as_ptr_range().end == rest.as_ptr_range().end;
            logits =
                self.model.forward(&mut self.state, chunk, if last { LogitsFor::Last } else { LogitsFor::None })?;
            self.cached.extend_from_slice(chunk);
        }
        let t1 = Instant::now();

        let mut sampler = Sampler::new(SamplerConfig {
            temperature: params.temperature,
            top_k: params.top_k,
            top_p: params.top_p,
            min_p: params.min_p,
            repeat_penalty: 1.0,
            seed: params.seed,
            ..Default::default()
        });
        let mut history = p.clone();
        let mut text = TextStream::new(params.stop.clone());
        let mut generated = 0usize;
        let mut prev: Option<u32> = None;
        let finish = loop {
            if generated >= params.max_tokens {
                break Finish::Length;
            }
            let next = sampler.sample(&logits, &history);
            if self.stop_ids.contains(&next) {
                break Finish::Stop;
            }
            let lp = params.logprobs.map(|k| self.logprobs(&logits, next, k));
            generated += 1;
            history.push(next);
            let piece = self.tokenizer.decode_piece(prev, next);
            prev = Some(next);
            let (delta, hit_stop) = text.push(&piece);
            if !send(Event::Delta { text: delta, logprobs: lp }) {
                break Finish::Cancelled;
            }
            if hit_stop {
                break Finish::Stop;
            }
            if generated >= params.max_tokens || self.state.pos >= self.state.ctx {
                break Finish::Length;
            }
            if cancelled() {
                break Finish::Cancelled;
            }
            logits = self.model.forward(&mut self.state, &[next], LogitsFor::Last)?;
            self.cached.push(next);
        };
        if finish != Finish::Cancelled {
            let tail = text.finish();
            if !tail.is_empty() {
                send(Event::Delta { text: tail, logprobs: None });
            }
            send(Event::Done { finish, prompt_tokens: p.len(), completion_tokens: generated, cached_tokens: common });
        }
        let (prompt_s, gen_s) = ((t1 - t0).as_secs_f64(), t1.elapsed().as_secs_f64());
        eprintln!(
            "krafla: prompt {} tokens ({common} cached, {:.1} tokens/s), generated {generated} tokens ({:.1} tokens/s), finish {}",
            p.len(),
            (p.len() - common) as f64 / prompt_s.max(1e-9),
            generated as f64 / gen_s.max(1e-9),
            finish.as_str()
        );
        Ok(())
    }

    /// Log-softmax of `logits` at `id`, and the `k` best tokens (ties: lower id first).
    fn logprobs(&self, logits: &[f32], id: u32, k: usize) -> TokenLogprob {
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
            bytes: self.tokenizer.decode_piece(Some(id), id),
            logprob: lp(id as usize),
            top: order.iter().map(|&t| (self.tokenizer.decode_piece(Some(t), t), lp(t as usize))).collect(),
        }
    }
}

/// Turns token bytes into text deltas: whole UTF-8 characters only (invalid
/// bytes become U+FFFD), cut at the first stop string, and holding back any
/// tail that could be the start of a stop string.
pub struct TextStream {
    stops: Vec<String>,
    pending: Vec<u8>,
    held: String,
}

impl TextStream {
    pub fn new(stops: Vec<String>) -> TextStream {
        TextStream {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: Vec::new(),
            held: String::new(),
        }
    }

    /// Adds bytes; returns the text that is now safe to send and whether a stop string was hit.
    pub fn push(&mut self, bytes: &[u8]) -> (String, bool) {
        self.pending.extend_from_slice(bytes);
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    self.held.push_str(s);
                    self.pending.clear();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    match e.error_len() {
                        None => {
                            // An incomplete character at the end: keep its bytes for later.
                            self.held.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or_default());
                            self.pending.drain(..valid);
                            break;
                        }
                        Some(bad) => {
                            let cut = valid + bad;
                            self.held.push_str(&String::from_utf8_lossy(&self.pending[..cut]));
                            self.pending.drain(..cut);
                        }
                    }
                }
            }
        }
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            let out = self.held[..at].to_string();
            self.held.clear();
            self.pending.clear();
            return (out, true);
        }
        // Hold back the longest tail that is a proper prefix of some stop string.
        let keep = self
            .stops
            .iter()
            .map(|s| {
                (1..s.len().min(self.held.len() + 1))
                    .rev()
                    .find(|&n| s.is_char_boundary(n) && self.held.ends_with(&s[..n]))
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        (out, false)
    }

    /// The rest at the end of generation (an unfinished character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let mut out = std::mem::take(&mut self.held);
        out.push_str(&String::from_utf8_lossy(&self.pending));
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&[u8]]) -> (Vec<String>, bool, String) {
        let mut t = TextStream::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = Vec::new();
        for p in pieces {
            let (s, hit) = t.push(p);
            out.push(s);
            if hit {
                return (out, true, String::new());
            }
        }
        let tail = t.finish();
        (out, false, tail)
    }

    #[test]
    fn utf8_characters_are_never_split() {
        let e = "é".as_bytes(); // 2 bytes
        let (out, hit, tail) = run(&[], &[b"a", &e[..1], &e[1..], b"b"]);
        assert_eq!(out, ["a", "", "é", "b"]);
        assert!(!hit && tail.is_empty());
        let (out, _, tail) = run(&[], &[b"x", &e[..1]]);
        assert_eq!(out, ["x", ""]);
        assert_eq!(tail, "\u{FFFD}");
        let (out, _, _) = run(&[], &[b"\xff", b"ok"]);
        assert_eq!(out, ["\u{FFFD}", "ok"]);
    }

    #[test]
    fn stop_strings_split_across_tokens_never_leak() {
        let (out, hit, _) = run(&["END"], &[b"hello E", b"N", b"D more"]);
        assert_eq!(out, ["hello ", "", ""]);
        assert!(hit);
        // A false start is released once it cannot be a stop string any more.
        let (out, hit, tail) = run(&["END"], &[b"an E", b"NVY"]);
        assert_eq!(out, ["an ", "ENVY"]);
        assert!(!hit && tail.is_empty());
        // Held text comes out at the end.
        let (out, hit, tail) = run(&["END", "xyz"], &[b"we E"]);
        assert_eq!((out, hit, tail.as_str()), (vec!["we ".to_string()], false, "E"));
        // The earliest of several stops wins, also inside one piece.
        let (out, hit, _) = run(&["b", "a"], &[b"xxabyy"]);
        assert_eq!((out, hit), (vec!["xx".to_string()], true));
        // A multi-byte stop string split inside a character.
        let s = "→!".as_bytes();
        let (out, hit, _) = run(&["→!"], &[b"go", &s[..2], &s[2..]]);
        assert_eq!((out, hit), (vec!["go".to_string(), String::new(), String::new()], true));
    }
}
