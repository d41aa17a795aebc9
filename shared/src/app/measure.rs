//! Measurement modes: `--bench` (llama-bench-style rows plus the decode
//! roofline) and `--perplexity` (llama.cpp's protocol).

use super::stdout;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use half::f16;

use rayon::prelude::*;

use crate::fault::Fault;
use crate::generate::Generator;
use crate::kernels::{Arch, Kernels, ISA};
use crate::model::{KvType, LogitsFor, Model, State};
use crate::tokenizer::Tokenizer;

/// Settings of one `--bench` run.
pub struct BenchConfig {
    pub prompt_tokens: usize,
    pub gen_tokens: usize,
    pub repetitions: usize,
    pub batch: usize,
    pub threads: usize,
    pub kv: KvType,
}

/// Mean and sample standard deviation.
fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 { v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    (mean, var.sqrt())
}

/// Deterministic token ids for benchmarking (not special tokens).
fn bench_tokens(n: usize, vocab: usize) -> Vec<u32> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (100 + x % (vocab as u64 - 100).max(1)) as u32 % vocab as u32
        })
        .collect()
}

/// Streams through a buffer far larger than the caches on every thread and
/// returns the read bandwidth in bytes per second (best of three passes).
/// The buffer is in huge pages where the weights made at load are
/// (`quant::ask_for_huge_pages`), so that the ceiling is what they can reach.
pub fn memory_read_bandwidth() -> f64 {
    const BYTES: usize = 512 << 20;
    let mut buf: Vec<u64> = Vec::with_capacity(BYTES / 8);
    crate::quant::ask_for_huge_pages(&buf);
    buf.extend(0..BYTES as u64 / 8);
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t = Instant::now();
        let sum: u64 = buf
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(0u64, |a, &b| a.wrapping_add(b)))
            .reduce(|| 0, u64::wrapping_add);
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(sum);
        best = best.max(BYTES as f64 / secs);
    }
    best
}

/// The build's int8 multiply-accumulate peak in MAC/s with every thread of
/// the pool busy: `Kernels::int8_peak` (the set's own int8 dot instruction
/// in independent register chains) on all threads at once, ~0.1 s each,
/// best of three.
pub fn int8_mac_peak() -> f64 {
    let mut rounds = 1usize << 10;
    loop {
        let t = Instant::now();
        std::hint::black_box(Arch::int8_peak(rounds));
        let secs = t.elapsed().as_secs_f64();
        if secs > 0.01 || rounds > 1 << 30 {
            rounds = ((rounds as f64) * 0.1 / secs.max(1e-9)).ceil() as usize;
            break;
        }
        rounds *= 2;
    }
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t = Instant::now();
        let done: Vec<(u64, i32)> = rayon::broadcast(|_| Arch::int8_peak(rounds));
        let secs = t.elapsed().as_secs_f64();
        let macs: u64 = std::hint::black_box(done).iter().map(|&(m, _)| m).sum();
        best = best.max(macs as f64 / secs);
    }
    best
}

/// Prints llama-bench-style markdown rows for prompt processing and
/// generation, then the decode roofline.
pub fn bench(model: Arc<Model>, model_name: &str, cfg: &BenchConfig) -> Result<(), Fault> {
    let c = &model.config;
    if cfg.prompt_tokens > c.context_length || cfg.gen_tokens >= c.context_length {
        return Err(Fault::Input(format!(
            "--bench: --pp {} / --tg {} do not fit the model's context of {} tokens (at most --pp {} and --tg {})",
            cfg.prompt_tokens,
            cfg.gen_tokens,
            c.context_length,
            c.context_length,
            c.context_length - 1
        )));
    }
    let ctx = cfg.prompt_tokens.max(cfg.gen_tokens + 1);
    let size_gib = model.file.file_len() as f64 / (1u64 << 30) as f64;
    let params_b = model.n_params() as f64 / 1e9;
    let vocab = c.vocab_size;
    stdout::line(
        "| model | size | params | isa | threads | test | t/s |\n| --- | ---: | ---: | --- | ---: | --- | ---: |",
    )?;
    let row = |test: String, rates: &[f64]| {
        let (m, s) = mean_std(rates);
        stdout::line(&format!(
            "| {model_name} | {size_gib:.2} GiB | {params_b:.2} B | {ISA} | {} | {test} | {m:.2} ± {s:.2} |",
            cfg.threads
        ))
    };
    let mut gen = Generator::new(model.clone(), State::with_kv(c, ctx, cfg.kv)?, cfg.batch);
    let mut pp = None;
    if cfg.prompt_tokens > 0 {
        let tokens = bench_tokens(cfg.prompt_tokens.min(ctx), vocab);
        let mut rates = Vec::new();
        // one untimed run first, as llama-bench does (page faults, caches)
        for rep in 0..=cfg.repetitions {
            gen.reset();
            let t = Instant::now();
            gen.prefill(&tokens, LogitsFor::Last, &|| false)?;
            if rep > 0 {
                rates.push(tokens.len() as f64 / t.elapsed().as_secs_f64());
            }
        }
        row(format!("pp{}", tokens.len()), &rates)?;
        pp = Some((tokens.len(), mean_std(&rates).0));
    }
    let mut tg_mean = 0.0;
    if cfg.gen_tokens > 0 {
        let n = cfg.gen_tokens.min(ctx - 1);
        let mut rates = Vec::new();
        // an untimed token first, as llama-bench's warm-up
        gen.reset();
        gen.step(bench_tokens(1, vocab)[0])?;
        for _ in 0..cfg.repetitions {
            gen.reset();
            let mut token = bench_tokens(1, vocab)[0];
            let t = Instant::now();
            for _ in 0..n {
                token = crate::sampler::argmax(&gen.step(token)?);
            }
            rates.push(n as f64 / t.elapsed().as_secs_f64());
        }
        tg_mean = mean_std(&rates).0;
        row(format!("tg{n}"), &rates)?;
    }
    let per_token = model.decode_bytes_per_token();
    let bandwidth = memory_read_bandwidth();
    let ceiling = bandwidth / per_token as f64;
    stdout::line(&format!(
        "\nroofline: {:.1} MB of weights read per generated token; memory read bandwidth {:.1} GB/s ({} threads); ceiling {:.1} tokens/s{}",
        per_token as f64 / 1e6,
        bandwidth / 1e9,
        cfg.threads,
        ceiling,
        if tg_mean > 0.0 { format!("; tg at {:.0}% of the ceiling", 100.0 * tg_mean / ceiling) } else { String::new() }
    ))?;
    let peak = int8_mac_peak();
    let achieved = match pp {
        Some((n, rate)) => {
            // a prompt of n tokens: every token through the layers' matrices, the head for the last one
            let (layers, head) = model.matmul_macs();
            let macs = rate * (layers as f64 + head as f64 / n as f64);
            format!(
                "; pp{n} at {:.1} GMAC/s, {:.0}% of the peak (the weight matrices' rows·cols per token, the head once per prompt, attention not counted)",
                macs / 1e9,
                100.0 * macs / peak
            )
        }
        None => String::new(),
    };
    Ok(stdout::line(&format!(
        "int8 peak: {:.1} GMAC/s ({}, {} threads){achieved}",
        peak / 1e9,
        Arch::INT8_PEAK,
        cfg.threads
    ))?)
}

/// What `perplexity` does with the scored positions' distributions besides
/// scoring: writes them (log-probabilities as f16) as a base, or compares
/// with a base written earlier (KL divergence, the same top token).
pub enum Kld<'a> {
    Write(&'a Path),
    Compare(&'a Path),
}

const KLD_MAGIC: &[u8] = b"KRAFLA-KLD-1\n";

/// The open base file of a `Kld`, and the comparison's running sums.
enum KldFile {
    Write(BufWriter<File>, PathBuf),
    Compare { file: BufReader<File>, path: PathBuf, sum: f64, sum2: f64, same_top: usize, count: usize },
}

impl KldFile {
    fn open(kld: &Kld, vocab: usize) -> Result<KldFile, String> {
        Ok(match kld {
            Kld::Write(path) => {
                let f = File::create(path).map_err(|e| format!("{}: cannot create: {e}", path.display()))?;
                let mut w = BufWriter::new(f);
                w.write_all(KLD_MAGIC)
                    .and_then(|_| w.write_all(&(vocab as u32).to_le_bytes()))
                    .map_err(|e| e.to_string())?;
                KldFile::Write(w, path.to_path_buf())
            }
            Kld::Compare(path) => {
                let f = File::open(path).map_err(|e| format!("{}: cannot open: {e}", path.display()))?;
                let mut file = BufReader::new(f);
                let mut head = vec![0u8; KLD_MAGIC.len() + 4];
                file.read_exact(&mut head).map_err(|_| format!("{}: not a --kld-base-out file", path.display()))?;
                if &head[..KLD_MAGIC.len()] != KLD_MAGIC {
                    return Err(format!("{}: not a --kld-base-out file", path.display()));
                }
                let v = u32::from_le_bytes(head[KLD_MAGIC.len()..].try_into().expect("4 bytes")) as usize;
                if v != vocab {
                    return Err(format!("{}: written for a vocabulary of {v}, this model has {vocab}", path.display()));
                }
                KldFile::Compare { file, path: path.to_path_buf(), sum: 0.0, sum2: 0.0, same_top: 0, count: 0 }
            }
        })
    }

    /// One scored position: its log-probabilities.
    fn position(&mut self, logp: &[f64]) -> Result<(), String> {
        match self {
            KldFile::Write(w, path) => {
                let bytes: Vec<u8> = logp.iter().flat_map(|&v| f16::from_f64(v).to_le_bytes()).collect();
                w.write_all(&bytes).map_err(|e| format!("{}: cannot write: {e}", path.display()))
            }
            KldFile::Compare { file, path, sum, sum2, same_top, count } => {
                let mut raw = vec![0u8; logp.len() * 2];
                file.read_exact(&mut raw).map_err(|_| {
                    format!(
                        "{}: has fewer positions than this run scores (other text, --ctx or --chunks?)",
                        path.display()
                    )
                })?;
                let base: Vec<f64> = raw.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f64()).collect();
                // both sides rounded as the base is stored: a model against its own base gives 0
                let logp: Vec<f64> = logp.iter().map(|&q| f16::from_f64(q).to_f64()).collect();
                let kl: f64 =
                    base.iter().zip(&logp).map(|(&b, &q)| if b > -60.0 { b.exp() * (b - q) } else { 0.0 }).sum();
                *sum += kl;
                *sum2 += kl * kl;
                *count += 1;
                *same_top += (argmax(&base) == argmax(&logp)) as usize;
                Ok(())
            }
        }
    }

    fn finish(self) -> Result<(), String> {
        match self {
            KldFile::Write(mut w, path) => w.flush().map_err(|e| format!("{}: cannot write: {e}", path.display())),
            KldFile::Compare { mut file, path, sum, sum2, same_top, count } => {
                if file.read(&mut [0u8]).map_err(|e| e.to_string())? != 0 {
                    return Err(format!("{}: has more positions than this run scores", path.display()));
                }
                let n = count.max(1) as f64;
                let mean = sum / n;
                let err = ((sum2 / n - mean * mean).max(0.0) / (n - 1.0).max(1.0)).sqrt();
                stdout::line(&format!(
                    "KLD = {mean:.6} +/- {err:.6}, same top token {:.2} % ({count} positions)",
                    100.0 * same_top as f64 / n
                ))
            }
        }
    }
}

/// The index of the largest value (the first of equals).
fn argmax(v: &[f64]) -> usize {
    v.iter().enumerate().fold((0, f64::NEG_INFINITY), |(bi, bv), (i, &x)| if x > bv { (i, x) } else { (bi, bv) }).0
}

/// Perplexity as llama.cpp's `perplexity` tool computes it: non-overlapping
/// chunks of `ctx` tokens, BOS replacing the first token of each chunk when
/// the tokenizer adds one, only the second half of each chunk scored.
pub fn perplexity(
    gen: &mut Generator,
    tokenizer: &Tokenizer,
    text: &str,
    max_chunks: Option<usize>,
    kld: Option<Kld>,
) -> Result<f64, String> {
    let vocab = gen.model().config.vocab_size;
    let ctx = gen.state().ctx;
    let tokens = tokenizer.encode(text, true);
    let bos = tokenizer.encode("", true).first().copied().filter(|&b| Some(b) == tokenizer.bos_id());
    if tokens.len() < 2 * ctx {
        return Err(format!("the text has {} tokens; --perplexity needs at least 2 × ctx = {}", tokens.len(), 2 * ctx));
    }
    let mut kld = kld.map(|k| KldFile::open(&k, vocab)).transpose()?;
    let n_chunks = (tokens.len() / ctx).min(max_chunks.unwrap_or(usize::MAX));
    let first = ctx / 2;
    eprintln!(
        "perplexity: {} tokens, {n_chunks} chunks of {ctx}, scoring the last {} of each",
        tokens.len(),
        ctx - 1 - first
    );
    let (mut nll, mut nll2, mut count) = (0.0f64, 0.0f64, 0usize);
    for i in 0..n_chunks {
        let mut chunk = tokens[i * ctx..(i + 1) * ctx].to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        gen.reset();
        let logits = gen.prefill(&chunk, LogitsFor::All, &|| false)?.unwrap_or_default();
        for j in first..ctx - 1 {
            let row = &logits[j * vocab..(j + 1) * vocab];
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
            let log_sum = row.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
            let v = log_sum - row[tokens[i * ctx + j + 1] as usize] as f64;
            nll += v;
            nll2 += v * v;
            count += 1;
            if let Some(k) = kld.as_mut() {
                let logp: Vec<f64> = row.iter().map(|&v| v as f64 - log_sum).collect();
                k.position(&logp)?;
            }
        }
        eprint!("[{}]{:.4},", i + 1, (nll / count as f64).exp());
    }
    eprintln!();
    let mean = nll / count as f64;
    let ppl = mean.exp();
    let var = nll2 / count as f64 - mean * mean;
    if var > 0.0 {
        stdout::line(&format!("Final estimate: PPL = {ppl:.4} +/- {:.5}", (var / (count as f64 - 1.0)).sqrt() * ppl))?;
    } else {
        stdout::line(&format!("Final estimate: PPL = {ppl:.4}"))?;
    }
    if let Some(k) = kld {
        k.finish()?;
    }
    Ok(ppl)
}
