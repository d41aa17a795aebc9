//! Token sampling: greedy, or repetition penalty → top-k → temperature →
//! softmax → top-p → min-p → draw, in llama.cpp's order.

/// Sampling settings. `temperature` 0 means greedy.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub repeat_last_n: usize,
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

/// The valid range of one sampling setting: the one check behind `ml_run`'s
/// options (exit 2) and the server's request fields (400), so that neither
/// accepts a value the other refuses.
pub struct SettingRange {
    /// The server's field name (the CLI option is `--` and the name with `-`).
    pub name: &'static str,
    pub min: f64,
    pub max: f64,
    /// `min` itself is refused (a penalty of 0 would divide by zero).
    pub min_excluded: bool,
    /// What a valid value is, for the error message.
    pub expected: &'static str,
}

impl SettingRange {
    /// `v` if it is in the range; NaN and infinities never are.
    pub fn check(&self, v: f64) -> Result<f64, String> {
        let above_min = if self.min_excluded { v > self.min } else { v >= self.min };
        if above_min && v <= self.max {
            Ok(v)
        } else {
            Err(format!("'{}' must be {}", self.name, self.expected))
        }
    }
}

/// Temperature: 0 is greedy; OpenAI's range.
pub const TEMPERATURE: SettingRange =
    SettingRange { name: "temperature", min: 0.0, max: 2.0, min_excluded: false, expected: "a number from 0 to 2" };
pub const TOP_P: SettingRange =
    SettingRange { name: "top_p", min: 0.0, max: 1.0, min_excluded: false, expected: "a number from 0 to 1" };
pub const MIN_P: SettingRange =
    SettingRange { name: "min_p", min: 0.0, max: 1.0, min_excluded: false, expected: "a number from 0 to 1" };
/// Divides positive logits, so 0 is refused; 1 is off.
pub const REPEAT_PENALTY: SettingRange = SettingRange {
    name: "repeat_penalty",
    min: 0.0,
    max: 100.0,
    min_excluded: true,
    expected: "a number above 0 and at most 100",
};

/// A sampler. Its random numbers are not a stream but a function of the seed,
/// the position in the output and the token (`uniform_at`), so a seed fixes
/// the output however the tokens are produced: one per forward pass, or
/// several per pass with speculative decoding, whatever the number of
/// guesses.
pub struct Sampler {
    pub config: SamplerConfig,
}

/// splitmix64's output function of `z` (a 64-bit mix with full avalanche).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The uniform number in (0, 1) of token `token` at output position
/// `position` for `seed`.
pub fn uniform_at(seed: u64, position: u64, token: u32) -> f64 {
    let z = mix(mix(mix(seed) ^ position.wrapping_mul(0xd605_bbb5_8c8a_bbb3)) ^ u64::from(token));
    ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

impl Sampler {
    pub fn new(config: SamplerConfig) -> Sampler {
        Sampler { config }
    }

    /// The token at output position `position` after `logits`; `history` feeds the
    /// repetition penalty.
    pub fn sample(&self, logits: &[f32], history: &[u32], position: u64) -> u32 {
        let dist = self.distribution(logits, history);
        self.draw_at(&dist, position)
    }

    /// The token `dist` gives at output position `position` (greedy: its token), by an
    /// exponential race (the Gumbel-max trick): each candidate i has its own uniform
    /// number u_i = `uniform_at(seed, position, i)`, and the one with the largest
    /// ln(u_i) / w_i wins, which is candidate i with probability w_i / Σw. Two
    /// distributions raced with the same numbers (a draft model's and the target's)
    /// pick the same token with probability at least (1 − d) / (1 + d), d their total
    /// variation distance, so a draft model's guess is most often the target's token,
    /// while the target's token never depends on the guess.
    pub fn draw_at(&self, dist: &Distribution, position: u64) -> u32 {
        let weights = match dist {
            Distribution::Greedy(id) => return *id,
            Distribution::Weights(w) => w,
        };
        let mut best = (f64::NEG_INFINITY, weights[0].0);
        for &(id, w) in weights {
            if w > 0.0 {
                // libm's log: the same bits on every platform
                let key = libm::log(uniform_at(self.config.seed, position, id)) / w;
                if key > best.0 || (key == best.0 && id < best.1) {
                    best = (key, id);
                }
            }
        }
        best.1
    }

    /// What `sample` draws from: the argmax when greedy, else the
    /// candidates left by the filters with their (unnormalised) weights.
    pub fn distribution(&self, logits: &[f32], history: &[u32]) -> Distribution {
        let c = &self.config;
        let logits = self.penalized(logits, history);
        if c.temperature <= 0.0 {
            return Distribution::Greedy(argmax(&logits));
        }
        let cand = ranked(&logits, c.top_k);
        if cand.is_empty() {
            // every logit −∞ (a grammar's mask left nothing): nothing to weigh
            return Distribution::Greedy(argmax(&logits));
        }
        // Temperature and softmax (in f64).
        let max = cand[0].1 as f64;
        let mut probs: Vec<f64> = cand.iter().map(|&(_, v)| ((v as f64 - max) / c.temperature as f64).exp()).collect();
        let sum: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= sum);
        // Top-p: smallest prefix with mass ≥ p.
        let mut keep = probs.len();
        if c.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, p) in probs.iter().enumerate() {
                acc += p;
                if acc >= c.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        // Min-p: drop tokens below min_p × the top probability.
        if c.min_p > 0.0 {
            let floor = probs[0] * c.min_p as f64;
            keep = keep.min(probs.iter().take_while(|&&p| p >= floor).count().max(1));
        }
        Distribution::Weights(cand[..keep].iter().zip(&probs).map(|(&(id, _), &p)| (id, p)).collect())
    }

    /// `logits` after the repetition penalty.
    fn penalized(&self, logits: &[f32], history: &[u32]) -> Vec<f32> {
        let c = &self.config;
        let mut logits = logits.to_vec();
        if c.repeat_penalty != 1.0 && c.repeat_last_n > 0 {
            let recent = &history[history.len().saturating_sub(c.repeat_last_n)..];
            let mut seen = std::collections::HashSet::new();
            for &t in recent {
                if (t as usize) < logits.len() && seen.insert(t) {
                    let v = &mut logits[t as usize];
                    *v = if *v > 0.0 { *v / c.repeat_penalty } else { *v * c.repeat_penalty };
                }
            }
        }
        logits
    }

    /// The `k` tokens with the highest logits after the repetition penalty,
    /// highest first (ties: lower id first, as `argmax` and the sampling
    /// order break them).
    pub fn best(&self, logits: &[f32], history: &[u32], k: usize) -> Vec<u32> {
        ranked(&self.penalized(logits, history), k.max(1)).into_iter().map(|(id, _)| id).collect()
    }
}

/// The distribution a sampler draws from.
#[derive(Clone, Debug, PartialEq)]
pub enum Distribution {
    /// Temperature 0: this token.
    Greedy(u32),
    /// Candidates and unnormalised weights, most likely first.
    Weights(Vec<(u32, f64)>),
}

impl Distribution {
    /// The most likely token.
    pub fn top(&self) -> u32 {
        match self {
            Distribution::Greedy(id) => *id,
            Distribution::Weights(w) => w[0].0,
        }
    }
}

/// Candidates sorted by logit (ties: lower id first), cut to the best `k`
/// (0: all). A token masked out by a grammar has a logit of −∞: never a
/// candidate (NaN stays one, as it always was).
fn ranked(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut cand: Vec<(u32, f32)> =
        logits.iter().enumerate().filter(|(_, &v)| v != f32::NEG_INFINITY).map(|(i, &v)| (i as u32, v)).collect();
    let k = if k == 0 { cand.len() } else { k.min(cand.len()) };
    if k < cand.len() {
        cand.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        cand.truncate(k);
    }
    cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    cand
}

/// Index of the largest logit; the lowest index wins ties.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setting_ranges_refuse_nan_infinities_and_the_excluded_minimum() {
        for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.5, 2.0000001] {
            assert!(TEMPERATURE.check(v).is_err(), "{v}");
        }
        assert_eq!(TEMPERATURE.check(0.0), Ok(0.0));
        assert_eq!(TEMPERATURE.check(2.0), Ok(2.0));
        assert!(TOP_P.check(1.5).is_err() && MIN_P.check(5.0).is_err());
        assert!(REPEAT_PENALTY.check(0.0).is_err() && REPEAT_PENALTY.check(f64::NAN).is_err());
        assert_eq!(REPEAT_PENALTY.check(1.1), Ok(1.1));
        assert_eq!(TOP_P.check(2.0).unwrap_err(), "'top_p' must be a number from 0 to 1");
    }

    #[test]
    fn nan_and_masked_logits_never_panic() {
        for temperature in [0.0, 0.8] {
            let s = Sampler::new(SamplerConfig { temperature, ..Default::default() });
            let _ = s.sample(&[f32::NAN; 5], &[], 0);
            assert_eq!(s.sample(&[f32::NEG_INFINITY, f32::NEG_INFINITY, 1.0], &[], 1), 2);
            let _ = s.sample(&[f32::NEG_INFINITY; 3], &[], 2);
        }
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        assert_eq!(argmax(&[0.0, 3.0, 1.0, 3.0]), 1);
        let s = Sampler::new(SamplerConfig::default());
        assert_eq!(s.sample(&[0.0, 3.0, 1.0, 3.0], &[], 0), 1);
    }

    #[test]
    fn repetition_penalty_can_change_the_choice() {
        let s = Sampler::new(SamplerConfig { repeat_penalty: 2.0, ..Default::default() });
        assert_eq!(s.sample(&[3.0, 2.0], &[0], 0), 1);
        assert_eq!(s.sample(&[3.0, 2.0], &[1], 0), 0);
    }

    #[test]
    fn same_seed_same_draws_and_top_k_limits_choices() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let cfg = SamplerConfig { temperature: 1.5, top_k: 3, top_p: 1.0, min_p: 0.0, seed: 7, ..Default::default() };
        let mut top3: Vec<u32> = {
            let mut idx: Vec<u32> = (0..50).collect();
            idx.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
            idx[..3].to_vec()
        };
        top3.sort();
        let (a, b) = (Sampler::new(cfg.clone()), Sampler::new(cfg));
        let mut seen = std::collections::HashSet::new();
        for n in 0..200 {
            let (x, y) = (a.sample(&logits, &[], n), b.sample(&logits, &[], n));
            assert_eq!(x, y);
            assert!(top3.contains(&x));
            seen.insert(x);
        }
        assert_eq!(seen.len(), 3, "high temperature over 200 draws should reach all of top-3");
    }

    #[test]
    fn distribution_follows_the_softmax() {
        let logits = [0.0f32, (3.0f32).ln()]; // probabilities 1/4, 3/4
        let s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 1,
            ..Default::default()
        });
        let n = 20000;
        let ones = (0..n).filter(|&i| s.sample(&logits, &[], i) == 1).count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 0.75).abs() < 0.02, "got {frac}");
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        let logits = [10.0f32, 9.0, 0.0, -5.0];
        let s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            min_p: 0.0,
            seed: 3,
            ..Default::default()
        });
        assert!((0..500).all(|i| s.sample(&logits, &[], i) == 0));
        let s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.2,
            seed: 3,
            ..Default::default()
        });
        assert!((0..500).all(|i| s.sample(&logits, &[], i) <= 1));
    }

    /// The draws at positions 0, 1, 2, … follow the distribution (a
    /// chi-square test with 4 degrees of freedom at p < 0.001, critical value
    /// 18.47), and a draft model's guess drawn at the same position from its
    /// own distribution q is the target's token with probability at least
    /// (1 − d) / (1 + d), d the total variation distance (always when q = p),
    /// while a fixed guess (prompt lookup) is the target's token with
    /// probability p(guess).
    #[test]
    fn positional_draws_follow_the_distribution_and_couple_with_a_draft() {
        let target = [1.0f32, 0.2, -0.5, 0.7, -2.0];
        let draft = [0.9f32, 0.3, -0.4, 0.6, -1.5];
        let cfg = SamplerConfig { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 11, ..Default::default() };
        let s = Sampler::new(cfg);
        let p: Vec<(u32, f64)> = match s.distribution(&target, &[]) {
            Distribution::Weights(w) => {
                let total: f64 = w.iter().map(|x| x.1).sum();
                w.iter().map(|&(id, x)| (id, x / total)).collect()
            }
            Distribution::Greedy(_) => unreachable!(),
        };
        let expected = |id: u32| p.iter().find(|w| w.0 == id).unwrap().1;
        let q: Vec<(u32, f64)> = match s.distribution(&draft, &[]) {
            Distribution::Weights(w) => {
                let total: f64 = w.iter().map(|x| x.1).sum();
                w.iter().map(|&(id, x)| (id, x / total)).collect()
            }
            Distribution::Greedy(_) => unreachable!(),
        };
        let tv: f64 = p.iter().map(|&(id, x)| (x - q.iter().find(|w| w.0 == id).unwrap().1).abs()).sum::<f64>() / 2.0;
        let chi2 = |counts: &[usize; 5], n: usize| -> f64 {
            (0..5)
                .map(|i| (counts[i] as f64 - n as f64 * expected(i as u32)).powi(2) / (n as f64 * expected(i as u32)))
                .sum()
        };
        let n = 100_000u64;
        let mut counts = [0usize; 5];
        let (mut same_as_draft, mut same_as_itself, mut same_as_lookup) = (0, 0, 0);
        for i in 0..n {
            let t = s.sample(&target, &[], i);
            counts[t as usize] += 1;
            same_as_draft += usize::from(s.sample(&draft, &[], i) == t);
            same_as_itself += usize::from(s.sample(&target, &[], i) == t);
            same_as_lookup += usize::from(t == 0);
        }
        assert!(chi2(&counts, n as usize) < 18.47, "{counts:?} against {p:?}");
        assert_eq!(same_as_itself, n as usize);
        let rate = same_as_draft as f64 / n as f64;
        assert!(rate > 0.9, "a draft close to the target agrees {rate}");
        assert!(rate >= (1.0 - tv) / (1.0 + tv) - 0.01, "{rate} against total variation {tv}");
        assert!((same_as_lookup as f64 / n as f64 - expected(0)).abs() < 0.01);
        // the test can fail: draws that ignored the position would not spread
        let first = s.sample(&target, &[], 0);
        let stuck: [usize; 5] = std::array::from_fn(|k| if k as u32 == first { n as usize } else { 0 });
        assert!(chi2(&stuck, n as usize) > 18.47);
        // another seed, other draws
        let other = Sampler::new(SamplerConfig { seed: 12, ..s.config.clone() });
        assert!((0..64).any(|i| other.sample(&target, &[], i) != s.sample(&target, &[], i)));
    }
}
