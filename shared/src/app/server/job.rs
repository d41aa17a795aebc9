//! What passes between a connection and the generation worker: a job (the
//! prompt, its settings and the channel back) and the events the worker
//! sends on it. The request parser fills `GenParams`; the answer's shapes
//! read `TokenLogprob`; neither sees the worker.

use std::sync::atomic::AtomicBool;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Instant;

use crate::fault::Fault;
use crate::generate::Finish;
use crate::grammar::Grammar;
use crate::model::Pooling;

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
    /// An embedding job's vector (before its `Done`).
    Embedding(Vec<f32>),
    /// The job failed: the request's fault (400), or the server's: the
    /// model's or the machine's (500, 503).
    Error(Fault),
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
    /// An embedding (`/v1/embeddings`): the prompt's hidden states pooled,
    /// unit length, instead of generating.
    pub embed: Option<Pooling>,
}

impl Job {
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.params.timeout.map(|s| self.received + std::time::Duration::from_secs_f64(s))
    }
}
