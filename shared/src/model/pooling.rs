//! Embeddings: the hidden states after the output norm (`LogitsFor::Hidden`)
//! pooled into one vector per text, as the GGUF's `pooling_type` says (or
//! `--pooling`), and normalised to unit length, as llama-server's
//! `/v1/embeddings` and OpenAI's answer. The sums run over positions in
//! order, in f64, so a text's embedding is the same bits for any `--batch`
//! and thread count (each position's hidden state is).

use super::{LogitsFor, Model, Segment, State};

/// How a text's positions become one vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over every position.
    Mean,
    /// The first position (BERT's `[CLS]`).
    Cls,
    /// The last position (causal embedding models: Qwen3-Embedding, e5-mistral).
    Last,
}

impl Pooling {
    pub const ALL: [Pooling; 3] = [Pooling::Mean, Pooling::Cls, Pooling::Last];

    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }

    /// llama.cpp's `pooling_type` numbers (1 mean, 2 cls, 3 last); None for
    /// 0 (none) and the others (rank).
    pub fn from_gguf(v: i64) -> Option<Pooling> {
        match v {
            1 => Some(Pooling::Mean),
            2 => Some(Pooling::Cls),
            3 => Some(Pooling::Last),
            _ => None,
        }
    }

    pub fn gguf_number(self) -> i64 {
        match self {
            Pooling::Mean => 1,
            Pooling::Cls => 2,
            Pooling::Last => 3,
        }
    }
}

/// A text's embedding as its hidden states arrive, chunk by chunk.
#[derive(Debug)]
pub struct Pooled {
    pooling: Pooling,
    d: usize,
    n_tokens: usize,
    /// Positions seen so far.
    seen: usize,
    sum: Vec<f64>,
}

impl Pooled {
    /// For a text of `n_tokens` positions of `d` values each.
    pub fn new(pooling: Pooling, d: usize, n_tokens: usize) -> Pooled {
        Pooled { pooling, d, n_tokens, seen: 0, sum: vec![0.0; d] }
    }

    /// The next positions' hidden states ([n][d]); an error if one is not finite.
    pub fn add(&mut self, hidden: &[f32]) -> Result<(), String> {
        if hidden.iter().any(|v| !v.is_finite()) {
            return Err("the hidden states are not finite (a weight that is not, or an overflow)".into());
        }
        for row in hidden.chunks_exact(self.d) {
            let take = match self.pooling {
                Pooling::Mean => true,
                Pooling::Cls => self.seen == 0,
                Pooling::Last => self.seen + 1 == self.n_tokens,
            };
            if take {
                self.sum.iter_mut().zip(row).for_each(|(s, &v)| *s += f64::from(v));
            }
            self.seen += 1;
        }
        Ok(())
    }

    /// The embedding, of unit length when `normalize`.
    pub fn finish(mut self, normalize: bool) -> Vec<f32> {
        if self.pooling == Pooling::Mean && self.seen > 0 {
            let n = self.seen as f64;
            self.sum.iter_mut().for_each(|s| *s /= n);
        }
        let norm = self.sum.iter().map(|v| v * v).sum::<f64>().sqrt();
        let scale = match normalize {
            true if norm > 0.0 => 1.0 / norm,
            true => 0.0,
            false => 1.0,
        };
        self.sum.iter().map(|v| (v * scale) as f32).collect()
    }
}

impl Model {
    /// The embedding of `tokens` by `pooling`, of unit length when
    /// `normalize` (else the pooled vector as it is), evaluated `batch`
    /// tokens at a time in `st` from position 0 (`st` is reset first and
    /// holds the text afterwards).
    pub fn embed(
        &self,
        st: &mut State,
        tokens: &[u32],
        pooling: Pooling,
        normalize: bool,
        batch: usize,
    ) -> Result<Vec<f32>, String> {
        if tokens.is_empty() {
            return Err("an embedding needs at least one token".into());
        }
        st.reset();
        let mut pooled = Pooled::new(pooling, self.config.hidden_size, tokens.len());
        for chunk in tokens.chunks(batch.max(1)) {
            let mut seg = [Segment { state: &mut *st, tokens: chunk, want: LogitsFor::Hidden }];
            let hidden = self.forward_batch(&mut seg)?.pop().unwrap_or_default();
            if let Err(e) = pooled.add(&hidden) {
                st.reset();
                return Err(e);
            }
        }
        Ok(pooled.finish(normalize))
    }
}
