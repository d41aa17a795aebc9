//! The command line shared by every Krafla executable (`ml_run` and the
//! per-ISA builds): generate text, or the test interfaces (`--prompt-ids`,
//! `--logits-out`, `--tokenize`, `--print-ids`).

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;

use crate::kernels::ISA;
use crate::model::{LoadOptions, LogitsFor, Model, State};
use crate::sampler::{Sampler, SamplerConfig};
use crate::tokenizer::Tokenizer;

/// Exit code for bad input files, arguments or requests.
pub const EXIT_BAD_INPUT: i32 = 2;

#[derive(Parser, Debug)]
#[command(name = "ml_run", version, about = "Krafla: run a Llama-style model (.mlb) on the CPU")]
pub struct Args {
    /// Model file (.mlb). Not needed with --tokenize.
    pub model: Option<PathBuf>,
    /// Tokenizer file (.mlt).
    #[arg(short = 'z', long = "tokenizer")]
    pub tokenizer: Option<PathBuf>,
    /// Prompt text.
    #[arg(short = 'p', long)]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long = "file")]
    pub prompt_file: Option<PathBuf>,
    /// Tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 256)]
    pub n_predict: usize,
    /// Worker threads (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Temperature; 0 is greedy.
    #[arg(short = 'T', long = "temp", default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalty for tokens among the last 64 (1.0 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Random seed for sampling (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Context length (default: 4096 or the model's maximum if smaller).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Wrap the prompt in a chat template: chatml, qwen3, llama2, llama3, mistral, gemma, zephyr, or auto.
    #[arg(long)]
    pub chat: Option<String>,
    /// System prompt for --chat.
    #[arg(long)]
    pub system: Option<String>,
    /// Prompt as comma-separated token ids (skips the tokenizer).
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    /// Write f32 little-endian logits of every prompt position ([T][V]) to FILE.
    #[arg(long)]
    pub logits_out: Option<PathBuf>,
    /// KV cache type: f32, f16 (half the memory) or q8 (Q8_0 blocks, ~3.8× smaller than f32).
    #[arg(long = "kv", default_value = "f32")]
    pub kv: String,
    /// Prompt tokens evaluated per forward call.
    #[arg(long, default_value_t = 512)]
    pub batch: usize,
    /// Print the prompt's token ids as a JSON array and exit (needs only -z).
    #[arg(long)]
    pub tokenize: bool,
    /// Print generated token ids as a JSON array instead of text.
    #[arg(long)]
    pub print_ids: bool,
    /// Keep Q8_0/Q4_0 weights only in the mapped file: no interleaved copy
    /// for the eight-row kernels (slower, less memory; same logits).
    #[arg(long)]
    pub no_repack: bool,
    /// Benchmark: prompt processing (--pp) and generation (--tg) speed, llama-bench style.
    #[arg(long)]
    pub bench: bool,
    /// --bench: prompt tokens (also accepted as -pp).
    #[arg(long = "pp", default_value_t = 512)]
    pub bench_pp: usize,
    /// --bench: generated tokens (also accepted as -tg).
    #[arg(long = "tg", default_value_t = 128)]
    pub bench_tg: usize,
    /// --bench: repetitions.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub bench_reps: usize,
    /// Perplexity of a text file (llama.cpp's protocol; --ctx defaults to 512 here).
    #[arg(long)]
    pub perplexity: Option<PathBuf>,
    /// --perplexity: score at most this many chunks (default: all).
    #[arg(long)]
    pub chunks: Option<usize>,
}

/// Entry point of every executable; returns the process exit code.
pub fn main() -> i32 {
    // `ml_run --server ...` (and the `ml_server` launcher name) runs the HTTP server.
    if std::env::args_os().nth(1).is_some_and(|a| a == "--server") {
        return crate::server::main();
    }
    // llama-bench spells these with one dash.
    let argv = std::env::args_os().map(|a| match a.to_str() {
        Some("-pp") => "--pp".into(),
        Some("-tg") => "--tg".into(),
        _ => a,
    });
    let args = match Args::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { EXIT_BAD_INPUT } else { 0 };
        }
    };
    match run(args) {
        Ok(()) => 0,
        Err(msg) => {
            eprintln!("krafla: {msg}");
            EXIT_BAD_INPUT
        }
    }
}

fn prompt_text(args: &Args) -> Result<Option<String>, String> {
    let mut text = args.prompt.clone();
    if let Some(path) = &args.prompt_file {
        let t =
            std::fs::read_to_string(path).map_err(|e| format!("{}: cannot read prompt file: {e}", path.display()))?;
        text = Some(text.map_or(t.clone(), |p| p + &t));
    }
    Ok(text)
}

fn run(args: Args) -> Result<(), String> {
    if args.batch == 0 {
        return Err("--batch must be at least 1".into());
    }
    let tokenizer = match &args.tokenizer {
        Some(p) => Some(Tokenizer::load(p)?),
        None => None,
    };
    let text = prompt_text(&args)?;
    let chat_kind: Option<String> = match (&args.chat, &tokenizer) {
        (Some(k), Some(t)) if k == "auto" => {
            if t.chat_template().is_empty() {
                return Err("--chat auto: the tokenizer file names no chat template; pass one".into());
            }
            Some(t.chat_template().to_string())
        }
        (Some(k), _) if k == "auto" => return Err("--chat auto needs a tokenizer (-z)".into()),
        (k, _) => k.clone(),
    };
    let text: Option<String> = match (chat_kind.as_deref(), text) {
        (Some(kind), Some(t)) => Some(crate::chat::format(kind, args.system.as_deref(), &t)?),
        (_, t) => t,
    };

    if args.tokenize {
        let tok = tokenizer.as_ref().ok_or("--tokenize needs a tokenizer (-z)")?;
        let ids = tok.encode(text.as_deref().unwrap_or(""), true);
        println!("[{}]", ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(","));
        return Ok(());
    }

    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if threads == 0 {
        return Err("-t must be at least 1".into());
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| format!("cannot start {threads} threads: {e}"))?;
    // Everything below runs on a pool thread, so parallel loops start inside the pool.
    pool.install(|| run_model(&args, tokenizer, text, threads))
}

/// Loads the model and runs the chosen mode (bench, perplexity, logits, generation).
fn run_model(args: &Args, tokenizer: Option<Tokenizer>, text: Option<String>, threads: usize) -> Result<(), String> {
    let model_path = args.model.as_ref().ok_or("no model given (ml_run MODEL.mlb -z TOKENIZER.mlt -p PROMPT)")?;
    let model = Model::load_with(model_path, LoadOptions { repack: !args.no_repack })?;
    let cfg = &model.config;
    if let Some(t) = &tokenizer {
        if t.vocab_size() > cfg.vocab_size {
            return Err(format!(
                "tokenizer has {} tokens but the model only {}: they do not belong together",
                t.vocab_size(),
                cfg.vocab_size
            ));
        }
    }

    if args.bench {
        if args.bench_reps == 0 {
            return Err("-r must be at least 1".into());
        }
        let name = model_path.file_stem().map_or("model".into(), |s| s.to_string_lossy().into_owned());
        let cfg = crate::measure::BenchConfig {
            prompt_tokens: args.bench_pp,
            gen_tokens: args.bench_tg,
            repetitions: args.bench_reps,
            batch: args.batch,
            threads,
            kv: crate::kvcache::KvType::parse(&args.kv)?,
        };
        return crate::measure::bench(&model, &name, &cfg);
    }
    if let Some(path) = &args.perplexity {
        let tok = tokenizer.as_ref().ok_or("--perplexity needs a tokenizer (-z)")?;
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
        let ctx = args.ctx.unwrap_or(512);
        if ctx < 4 || ctx > cfg.context_length {
            return Err(format!("--ctx {ctx} must be within 4..={}", cfg.context_length));
        }
        crate::measure::perplexity(
            &model,
            tok,
            &text,
            ctx,
            args.chunks,
            args.batch,
            crate::kvcache::KvType::parse(&args.kv)?,
        )?;
        return Ok(());
    }

    let prompt: Vec<u32> = match (&args.prompt_ids, &text, &tokenizer) {
        (Some(ids), _, _) => ids.clone(),
        (None, Some(t), Some(tok)) => tok.encode(t, true),
        (None, Some(_), None) => return Err("a text prompt needs a tokenizer (-z), or use --prompt-ids".into()),
        (None, None, _) => return Err("no prompt: give -p, -f or --prompt-ids".into()),
    };
    if prompt.is_empty() {
        return Err("the prompt is empty".into());
    }
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= cfg.vocab_size) {
        return Err(format!("token id {bad} is outside the vocabulary (size {})", cfg.vocab_size));
    }
    let ctx = cfg.resolve_ctx(args.ctx)?;
    if prompt.len() > ctx {
        return Err(format!("the prompt has {} tokens, more than the context of {ctx}", prompt.len()));
    }
    let kv_type = crate::kvcache::KvType::parse(&args.kv)?;
    let mut state = State::with_kv(cfg, ctx, kv_type)?;
    let weights_mib = model.file.file_len() as f64 / 1048576.0;
    eprintln!(
        "krafla: isa {ISA}, {threads} threads, model {} ({}, {:.1} M params), ctx {ctx}, memory: {:.1} MiB weights (mapped) + {:.1} MiB repacked weights + {:.1} MiB KV cache ({})",
        model_path.display(),
        cfg.arch,
        model.n_params() as f64 / 1e6,
        weights_mib,
        model.repacked_bytes() as f64 / 1048576.0,
        state.bytes() as f64 / 1048576.0,
        kv_type.name()
    );

    // ---- prompt ----
    let t0 = Instant::now();
    let want_all = args.logits_out.is_some();
    let mut all_logits: Vec<f32> = Vec::new();
    let mut last_logits: Vec<f32> = Vec::new();
    let n_batches = prompt.len().div_ceil(args.batch);
    for (i, chunk) in prompt.chunks(args.batch).enumerate() {
        let want = if want_all {
            LogitsFor::All
        } else if i + 1 == n_batches {
            LogitsFor::Last
        } else {
            LogitsFor::None
        };
        let logits = model.forward(&mut state, chunk, want)?;
        if want_all {
            all_logits.extend_from_slice(&logits);
        }
        if i + 1 == n_batches {
            last_logits = logits[logits.len() - cfg.vocab_size..].to_vec();
        }
    }
    let prompt_secs = t0.elapsed().as_secs_f64();
    if let Some(path) = &args.logits_out {
        let bytes: Vec<u8> = all_logits.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(path, bytes).map_err(|e| format!("{}: cannot write logits: {e}", path.display()))?;
    }

    // ---- generation ----
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
    });
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        seed,
        ..Default::default()
    });
    let stops: Vec<u32> = tokenizer.as_ref().map_or(Vec::new(), |t| t.eos_id().into_iter().chain(t.eot_id()).collect());
    let mut history = prompt.clone();
    let mut generated: Vec<u32> = Vec::new();
    let mut out = std::io::stdout().lock();
    let mut pending: Vec<u8> = Vec::new(); // bytes of an incomplete UTF-8 character
    let t1 = Instant::now();
    let mut logits = last_logits;
    while generated.len() < args.n_predict {
        let next = sampler.sample(&logits, &history);
        if stops.contains(&next) {
            break;
        }
        generated.push(next);
        history.push(next);
        if !args.print_ids {
            if let Some(tok) = &tokenizer {
                let prev = if generated.len() > 1 { Some(generated[generated.len() - 2]) } else { None };
                pending.extend(tok.decode_piece(prev, next));
                let valid = utf8_prefix_len(&pending);
                let _ = out.write_all(&pending[..valid]);
                let _ = out.flush();
                pending.drain(..valid);
            }
        }
        if generated.len() == args.n_predict || state.pos >= ctx {
            break;
        }
        logits = model.forward(&mut state, &[next], LogitsFor::Last)?;
    }
    let gen_secs = t1.elapsed().as_secs_f64();
    if args.print_ids || tokenizer.is_none() {
        let _ = writeln!(out, "[{}]", generated.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(","));
    } else {
        let _ = out.write_all(&pending);
        let _ = writeln!(out);
    }
    eprintln!(
        "krafla: prompt {} tokens, {:.1} tokens/s; generation {} tokens, {:.1} tokens/s",
        prompt.len(),
        prompt.len() as f64 / prompt_secs.max(1e-9),
        generated.len(),
        generated.len() as f64 / gen_secs.max(1e-9)
    );
    Ok(())
}

/// Length of the longest prefix that does not end inside a UTF-8 character.
fn utf8_prefix_len(bytes: &[u8]) -> usize {
    match std::str::from_utf8(bytes) {
        Ok(_) => bytes.len(),
        Err(e) => match e.error_len() {
            // Invalid bytes (not just incomplete): pass them through as they are.
            Some(_) => bytes.len(),
            None => e.valid_up_to(),
        },
    }
}
