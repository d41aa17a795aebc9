//! What `/metrics` reports, in Prometheus' text format (version 0.0.4):
//! counters and gauges under llama.cpp's server names where one fits
//! (`krafla:prompt_tokens_total`, `krafla:tokens_predicted_total`,
//! `krafla:requests_processing`, `krafla:requests_deferred`, ...), requests
//! by HTTP status, and histograms of the time to the first token and of the
//! time between generated tokens.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds (seconds) of the latency histograms' buckets.
const TTFT_BUCKETS: [f64; 14] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0];
const TPOT_BUCKETS: [f64; 14] = [0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0];

/// A histogram with fixed buckets (counts per bucket, not cumulative).
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>, // one more than bounds: the +Inf bucket
    sum: f64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram { bounds, counts: vec![0; bounds.len() + 1], sum: 0.0 }
    }

    fn observe(&mut self, v: f64) {
        let i = self.bounds.partition_point(|&b| b < v);
        self.counts[i] += 1;
        self.sum += v;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, c) in self.counts.iter().enumerate() {
            cumulative += c;
            let le = self.bounds.get(i).map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {cumulative}", self.sum);
    }
}

/// The server's counters; shared by the connection threads and the worker.
pub struct Metrics {
    pub slots: usize,
    /// Requests waiting for a slot.
    pub waiting: AtomicUsize,
    /// Slots running a request.
    pub busy: AtomicUsize,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    predicted_tokens: AtomicU64,
    /// Microseconds spent on prompts and on generated tokens, summed over requests.
    prompt_micros: AtomicU64,
    predicted_micros: AtomicU64,
    /// Forward passes, and the sequences they carried.
    steps: AtomicU64,
    step_sequences: AtomicU64,
    drafted: AtomicU64,
    draft_accepted: AtomicU64,
    by_status: Mutex<BTreeMap<u16, u64>>,
    latency: Mutex<(Histogram, Histogram)>, // time to first token, time per output token
}

impl Metrics {
    pub fn new(slots: usize) -> Metrics {
        Metrics {
            slots,
            waiting: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
            prompt_tokens: AtomicU64::new(0),
            cached_tokens: AtomicU64::new(0),
            predicted_tokens: AtomicU64::new(0),
            prompt_micros: AtomicU64::new(0),
            predicted_micros: AtomicU64::new(0),
            steps: AtomicU64::new(0),
            step_sequences: AtomicU64::new(0),
            drafted: AtomicU64::new(0),
            draft_accepted: AtomicU64::new(0),
            by_status: Mutex::new(BTreeMap::new()),
            latency: Mutex::new((Histogram::new(&TTFT_BUCKETS), Histogram::new(&TPOT_BUCKETS))),
        }
    }

    /// A verification pass checked `drafted` guesses and kept `accepted`.
    pub fn drafted(&self, drafted: usize, accepted: usize) {
        self.drafted.fetch_add(drafted as u64, Ordering::Relaxed);
        self.draft_accepted.fetch_add(accepted as u64, Ordering::Relaxed);
    }

    /// An answer with this HTTP status was sent.
    pub fn answered(&self, status: u16) {
        *self.by_status.lock().unwrap_or_else(|e| e.into_inner()).entry(status).or_insert(0) += 1;
    }

    /// One forward pass over `sequences` sequences.
    pub fn step(&self, sequences: usize) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.step_sequences.fetch_add(sequences as u64, Ordering::Relaxed);
    }

    /// A request's prompt went in: `evaluated` tokens in `took`, `cached` reused.
    pub fn prompt_done(&self, evaluated: usize, cached: usize, took: Duration, ttft: Duration) {
        self.prompt_tokens.fetch_add(evaluated as u64, Ordering::Relaxed);
        self.cached_tokens.fetch_add(cached as u64, Ordering::Relaxed);
        self.prompt_micros.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        self.latency.lock().unwrap_or_else(|e| e.into_inner()).0.observe(ttft.as_secs_f64());
    }

    /// A token was generated `gap` after the one before it.
    pub fn token(&self, gap: Duration) {
        self.predicted_tokens.fetch_add(1, Ordering::Relaxed);
        self.predicted_micros.fetch_add(gap.as_micros() as u64, Ordering::Relaxed);
        self.latency.lock().unwrap_or_else(|e| e.into_inner()).1.observe(gap.as_secs_f64());
    }

    /// The first token of a request (its time is the prompt's, in `prompt_done`).
    pub fn first_token(&self) {
        self.predicted_tokens.fetch_add(1, Ordering::Relaxed);
    }

    /// The text of `/metrics`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut metric = |name: &str, kind: &str, help: &str, value: f64| {
            let _ = writeln!(out, "# HELP krafla:{name} {help}\n# TYPE krafla:{name} {kind}\nkrafla:{name} {value}");
        };
        let (prompt, predicted) = (get(&self.prompt_tokens), get(&self.predicted_tokens));
        let (prompt_s, predicted_s) = (get(&self.prompt_micros) as f64 / 1e6, get(&self.predicted_micros) as f64 / 1e6);
        let rate = |n: u64, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
        metric("prompt_tokens_total", "counter", "Prompt tokens evaluated.", prompt as f64);
        metric("prompt_seconds_total", "counter", "Time spent evaluating prompts.", prompt_s);
        metric(
            "prompt_tokens_cached_total",
            "counter",
            "Prompt tokens reused from a slot's cache.",
            get(&self.cached_tokens) as f64,
        );
        metric("tokens_predicted_total", "counter", "Tokens generated.", predicted as f64);
        metric("tokens_predicted_seconds_total", "counter", "Time between generated tokens, summed.", predicted_s);
        metric("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.", rate(prompt, prompt_s));
        metric(
            "predicted_tokens_seconds",
            "gauge",
            "Average generation throughput per request in tokens/s.",
            rate(predicted, predicted_s),
        );
        let steps = get(&self.steps);
        metric("n_decode_total", "counter", "Forward passes run.", steps as f64);
        metric(
            "n_decode_sequences_total",
            "counter",
            "Sequences carried by the forward passes, summed.",
            get(&self.step_sequences) as f64,
        );
        metric(
            "n_busy_slots_per_decode",
            "gauge",
            "Average sequences per forward pass.",
            if steps > 0 { get(&self.step_sequences) as f64 / steps as f64 } else { 0.0 },
        );
        metric("n_drafted_total", "counter", "Tokens drafted (speculative decoding).", get(&self.drafted) as f64);
        metric(
            "n_drafted_accepted_total",
            "counter",
            "Drafted tokens the model accepted.",
            get(&self.draft_accepted) as f64,
        );
        metric("slots_total", "gauge", "Slots (--parallel).", self.slots as f64);
        metric("requests_processing", "gauge", "Requests in a slot.", self.busy.load(Ordering::Relaxed) as f64);
        metric(
            "requests_deferred",
            "gauge",
            "Requests waiting for a slot.",
            self.waiting.load(Ordering::Relaxed) as f64,
        );
        let _ = writeln!(
            out,
            "# HELP krafla:requests_total Answers sent, by HTTP status.\n# TYPE krafla:requests_total counter"
        );
        for (status, n) in self.by_status.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(out, "krafla:requests_total{{status=\"{status}\"}} {n}");
        }
        let latency = self.latency.lock().unwrap_or_else(|e| e.into_inner());
        latency.0.render(
            &mut out,
            "krafla:time_to_first_token_seconds",
            "Time from a request's arrival to its first token.",
        );
        latency.1.render(
            &mut out,
            "krafla:time_per_output_token_seconds",
            "Time between consecutive generated tokens.",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = super::Metrics::new(2);
        m.prompt_done(10, 5, std::time::Duration::from_millis(30), std::time::Duration::from_millis(30));
        m.token(std::time::Duration::from_millis(40));
        m.token(std::time::Duration::from_secs(9));
        m.answered(200);
        m.answered(503);
        let text = m.render();
        assert!(text.contains("krafla:time_per_output_token_seconds_bucket{le=\"0.05\"} 1\n"), "{text}");
        assert!(text.contains("krafla:time_per_output_token_seconds_bucket{le=\"+Inf\"} 2\n"), "{text}");
        assert!(text.contains("krafla:time_to_first_token_seconds_bucket{le=\"0.025\"} 0\n"), "{text}");
        assert!(text.contains("krafla:time_to_first_token_seconds_bucket{le=\"0.05\"} 1\n"), "{text}");
        assert!(text.contains("krafla:requests_total{status=\"503\"} 1\n"), "{text}");
        assert!(text.contains("krafla:tokens_predicted_total 2\n"), "{text}");
    }
}
