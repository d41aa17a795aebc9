//! The single generation worker. It owns the generator (the model, the KV
//! cache and the ids the cache holds) and runs one job at a time from a
//! bounded queue. A job whose prompt shares a prefix with the cache
//! evaluates only the rest (`Generator::reuse_prefix`; the forward pass is
//! batch-size invariant, so the logits are the same bits as from a cold
//! start). Text leaves as whole UTF-8 characters, with anything that could
//! still become a stop string held back (`generate::TextStream`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, Sender, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Instant;

use crate::generate::{DecodeParams, Finish, Generator, Token};
use crate::model::LogitsFor;
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
}

/// Log-probability of one generated token (natural log, from the raw logits).
#[derive(Clone, Debug)]
pub struct TokenLogprob {
    pub bytes: Vec<u8>,
    pub logprob: f64,
    /// The k most likely tokens at this position: (bytes, logprob).
    pub top: Vec<(Vec<u8>, f64)>,
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
    generator: Generator,
    tokenizer: Arc<Tokenizer>,
    stop_ids: Vec<u32>,
}

impl Engine {
    pub fn new(generator: Generator, tokenizer: Arc<Tokenizer>) -> Engine {
        let stop_ids = tokenizer.eos_id().into_iter().chain(tokenizer.eot_id()).collect();
        Engine { generator, tokenizer, stop_ids }
    }

    /// Starts the worker on a thread of `pool` (so the forward pass's
    /// parallel loops start from inside the pool); up to `max_queue` jobs
    /// wait behind the running one.
    pub fn spawn(mut self, pool: &rayon::ThreadPool, max_queue: usize) -> Queue {
        let (tx, rx) = sync_channel::<Job>(max_queue);
        let queue = Queue { tx, waiting: Arc::new(AtomicUsize::new(0)), busy: Arc::new(AtomicBool::new(false)) };
        let (waiting, busy) = (queue.waiting.clone(), queue.busy.clone());
        pool.spawn(move || self.work(rx, &waiting, &busy));
        queue
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
                    self.generator.reset();
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
        let ctx = self.generator.state().ctx;
        if p.is_empty() {
            return Err("the prompt is empty".into());
        }
        if p.len() > ctx {
            return Err(format!("the prompt has {} tokens, more than the context of {ctx}", p.len()));
        }
        let send = |e: Event| job.events.send(e).is_ok();
        let cancelled = || job.cancel.load(Ordering::SeqCst);
        let cached = self.generator.reuse_prefix(p);
        if !send(Event::Started) {
            return Ok(());
        }
        let Some(logits) = self.generator.prefill(&p[cached..], LogitsFor::Last, &cancelled)? else {
            return Ok(());
        };
        let t1 = Instant::now();

        let decode = DecodeParams {
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
            stop_ids: self.stop_ids.clone(),
            stop_strings: params.stop.clone(),
        };
        let tokenizer = self.tokenizer.clone();
        let done = self.generator.decode(logits, p, &decode, Some(&tokenizer), &mut |t: Token| {
            let logprobs = params.logprobs.map(|k| logprobs(&tokenizer, t.logits, t.id, k));
            send(Event::Delta { text: t.text.to_string(), logprobs }) && !cancelled()
        })?;
        let generated = done.tokens.len();
        if done.finish != Finish::Cancelled {
            if !done.tail.is_empty() {
                send(Event::Delta { text: done.tail, logprobs: None });
            }
            send(Event::Done {
                finish: done.finish,
                prompt_tokens: p.len(),
                completion_tokens: generated,
                cached_tokens: cached,
            });
        }
        let (prompt_s, gen_s) = ((t1 - t0).as_secs_f64(), t1.elapsed().as_secs_f64());
        eprintln!(
            "krafla: prompt {} tokens ({cached} cached, {:.1} tokens/s), generated {generated} tokens ({:.1} tokens/s), finish {}",
            p.len(),
            (p.len() - cached) as f64 / prompt_s.max(1e-9),
            generated as f64 / gen_s.max(1e-9),
            done.finish.as_str()
        );
        Ok(())
    }
}

/// Log-softmax of `logits` at `id`, and the `k` best tokens (ties: lower id first).
fn logprobs(tokenizer: &Tokenizer, logits: &[f32], id: u32, k: usize) -> TokenLogprob {
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
        logprob: lp(id as usize),
        top: order.iter().map(|&t| (tokenizer.decode_piece(Some(t), t), lp(t as usize))).collect(),
    }
}
