//! `--type q4_mixed`: which of the matrices that `q4_0` makes Q4_0 stay in
//! Q8_0 instead, within a byte budget, by measured sensitivity.
//!
//! Each candidate t gets a score: its kind's share of the output error
//! (`KIND_SHARE`: the KL divergence each kind alone in Q4_0 causes, as a
//! share of their sum, averaged over three models on a tuning text;
//! docs/QUANT.md) spread over the kind's matrices in proportion to their
//! own relative Q4_0 error on this model (Σ w_j (x − x̂)² / Σ w_j x², w the
//! importance of the input column, 1 without an importance matrix). The
//! candidates are taken greedily by score per extra byte (Q8_0 over Q4_0)
//! while the extra bytes stay within the budget.

/// Kind → share of the output error, measured (docs/QUANT.md, "q4_mixed").
const KIND_SHARE: &[(&str, f64)] = &[
    ("attn_q", 0.034),
    ("attn_k", 0.051),
    ("attn_v", 0.233),
    ("attn_o", 0.078),
    ("ffn_gate", 0.129),
    ("ffn_up", 0.205),
    ("ffn_down", 0.270),
];

/// A Q4_0 candidate: its kind (`attn_v`, ...), its relative Q4_0 error,
/// and the bytes Q8_0 adds over Q4_0.
pub struct Candidate<'a> {
    pub kind: &'a str,
    pub error: f64,
    pub extra_bytes: u64,
}

/// The indices of the candidates that go to Q8_0, at most `budget` extra bytes.
pub fn choose_q8(candidates: &[Candidate], budget: u64) -> Vec<usize> {
    let share = |kind: &str| KIND_SHARE.iter().find(|(k, _)| *k == kind).map_or(0.05, |(_, s)| *s);
    let kind_error = |kind: &str| candidates.iter().filter(|c| c.kind == kind).map(|c| c.error).sum::<f64>();
    let mut order: Vec<(f64, usize)> = candidates
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let total = kind_error(c.kind);
            let score = if total > 0.0 { share(c.kind) * c.error / total } else { 0.0 };
            (score / c.extra_bytes.max(1) as f64, i)
        })
        .collect();
    // best first; equal scores in file order
    order.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut spent = 0u64;
    let mut chosen = Vec::new();
    for (score, i) in order {
        let extra = candidates[i].extra_bytes;
        if score > 0.0 && spent + extra <= budget {
            spent += extra;
            chosen.push(i);
        }
    }
    chosen.sort_unstable();
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(kind: &str, error: f64, extra_bytes: u64) -> Candidate<'_> {
        Candidate { kind, error, extra_bytes }
    }

    #[test]
    fn the_most_sensitive_per_byte_first_within_the_budget() {
        let cands = [c("attn_q", 0.01, 100), c("ffn_down", 0.01, 100), c("ffn_down", 0.03, 100), c("attn_v", 0.01, 10)];
        // attn_v: 0.233 / 10 bytes; ffn_down #2: 0.27·¾ / 100; #1: 0.27·¼ / 100; attn_q: 0.034 / 100
        assert_eq!(choose_q8(&cands, 0), Vec::<usize>::new());
        assert_eq!(choose_q8(&cands, 10), vec![3]);
        assert_eq!(choose_q8(&cands, 110), vec![2, 3]);
        assert_eq!(choose_q8(&cands, 209), vec![2, 3]);
        assert_eq!(choose_q8(&cands, 210), vec![1, 2, 3]);
        assert_eq!(choose_q8(&cands, 1000), vec![0, 1, 2, 3]);
    }
}
