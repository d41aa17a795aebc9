//! Token sampling: greedy, or repetition penalty → top-k → temperature →
//! softmax → top-p → min-p → draw, in llama.cpp's order.

/// Sampling settings. `temperature` 0 means greedy.
#[derive(Clone, Debug)]
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

/// A sampler with its own random stream (xoshiro256** seeded by splitmix64).
pub struct Sampler {
    pub config: SamplerConfig,
    rng: [u64; 4],
}

impl Sampler {
    pub fn new(config: SamplerConfig) -> Sampler {
        let mut s = config.seed;
        let mut next = || {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let rng = [next(), next(), next(), next()];
        Sampler { config, rng }
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.rng;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Picks the next token from `logits`; `history` feeds the repetition penalty.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let c = self.config.clone();
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
        if c.temperature <= 0.0 {
            return argmax(&logits);
        }
        // Candidates sorted by logit (ties: lower id first), cut to top-k.
        let mut cand: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &v)| (i as u32, v)).collect();
        let k = if c.top_k == 0 { cand.len() } else { c.top_k.min(cand.len()) };
        if k < cand.len() {
            cand.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            cand.truncate(k);
        }
        cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
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
        let total: f64 = probs[..keep].iter().sum();
        let mut r = self.uniform() * total;
        for i in 0..keep {
            r -= probs[i];
            if r < 0.0 {
                return cand[i].0;
            }
        }
        cand[keep - 1].0
    }
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
    fn greedy_takes_the_first_maximum() {
        assert_eq!(argmax(&[0.0, 3.0, 1.0, 3.0]), 1);
        let mut s = Sampler::new(SamplerConfig::default());
        assert_eq!(s.sample(&[0.0, 3.0, 1.0, 3.0], &[]), 1);
    }

    #[test]
    fn repetition_penalty_can_change_the_choice() {
        let mut s = Sampler::new(SamplerConfig { repeat_penalty: 2.0, ..Default::default() });
        assert_eq!(s.sample(&[3.0, 2.0], &[0]), 1);
        assert_eq!(s.sample(&[3.0, 2.0], &[1]), 0);
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
        let (mut a, mut b) = (Sampler::new(cfg.clone()), Sampler::new(cfg));
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let (x, y) = (a.sample(&logits, &[]), b.sample(&logits, &[]));
            assert_eq!(x, y);
            assert!(top3.contains(&x));
            seen.insert(x);
        }
        assert_eq!(seen.len(), 3, "high temperature over 200 draws should reach all of top-3");
    }

    #[test]
    fn distribution_follows_the_softmax() {
        let logits = [0.0f32, (3.0f32).ln()]; // probabilities 1/4, 3/4
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 1,
            ..Default::default()
        });
        let n = 20000;
        let ones = (0..n).filter(|_| s.sample(&logits, &[]) == 1).count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 0.75).abs() < 0.02, "got {frac}");
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        let logits = [10.0f32, 9.0, 0.0, -5.0];
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            min_p: 0.0,
            seed: 3,
            ..Default::default()
        });
        assert!((0..500).all(|_| s.sample(&logits, &[]) == 0));
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.2,
            seed: 3,
            ..Default::default()
        });
        assert!((0..500).all(|_| s.sample(&logits, &[]) <= 1));
    }
}
