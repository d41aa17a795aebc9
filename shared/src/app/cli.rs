//! The command line of every Krafla executable (`ml_run` and the per-ISA
//! builds): generate text from a prompt, the measurement modes (`--bench`,
//! `--perplexity`), and the test interfaces (`--prompt-ids`, `--logits-out`,
//! `--tokenize`, `--print-ids`).

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;

use super::answer_text::AnswerText;
use super::interactive;
use super::measure;
use super::options::{startup_line, ModelFile, RunArgs};
use super::speculative_options::SpecArgs;
use super::stdout;
use crate::chat::reasoning::Reasoning;
use crate::chat::{Message, PromptText, Role};
use crate::fault::Fault;
use crate::generate::{DecodeParams, Generator, Token, GRAMMAR_CUT};
use crate::grammar::{self, Constrained, Grammar, Vocab};
use crate::import::calibrate;
use crate::import::imatrix::Imatrix;
use crate::model::{check_prompt, LogitsFor};
use crate::sampler::{self, SamplerConfig, SettingRange};
use crate::tokenizer::Tokenizer;

#[derive(Parser, Debug)]
#[command(name = "ml_run", version, about = "Krafla: run a Llama-style model (.gguf or .mlb) on the CPU")]
pub struct Args {
    /// Model: an .mlb or .gguf file, a Hugging Face directory (config.json, *.safetensors, tokenizer.json) or a llama2.c .bin. Not needed with --tokenize and -z.
    pub model: Option<PathBuf>,
    #[command(flatten)]
    pub run: RunArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Prompt text.
    #[arg(short = 'p', long)]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long = "file")]
    pub prompt_file: Option<PathBuf>,
    /// Tokens to generate [default: 256; in the chat, until the answer ends].
    #[arg(short = 'n', long = "n-predict")]
    pub n_predict: Option<usize>,
    /// Temperature, 0 to 2; 0 is greedy.
    #[arg(short = 'T', long = "temp", default_value_t = 0.0, value_parser = setting(&sampler::TEMPERATURE))]
    pub temperature: f32,
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Nucleus sampling, 0 to 1.
    #[arg(long, default_value_t = 0.95, value_parser = setting(&sampler::TOP_P))]
    pub top_p: f32,
    /// Minimum probability relative to the most likely token, 0 to 1.
    #[arg(long, default_value_t = 0.05, value_parser = setting(&sampler::MIN_P))]
    pub min_p: f32,
    /// Penalty for tokens among the last 64 (1.0 = off), above 0 and at most 100.
    #[arg(long, default_value_t = 1.0, value_parser = setting(&sampler::REPEAT_PENALTY))]
    pub repeat_penalty: f32,
    /// Random seed for sampling (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Prompt as comma-separated token ids (skips the tokenizer).
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    /// Write f32 little-endian logits of every prompt position ([T][V]) to FILE.
    #[arg(long)]
    pub logits_out: Option<PathBuf>,
    /// Print the prompt's token ids as a JSON array and exit (needs only -z).
    #[arg(long)]
    pub tokenize: bool,
    /// Print generated token ids as a JSON array instead of text.
    #[arg(long)]
    pub print_ids: bool,
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
    /// --perplexity: write the scored positions' log-probabilities to FILE, the
    /// base for --kld-base (llama.cpp's --kl-divergence-base).
    #[arg(long, value_name = "FILE", requires = "perplexity")]
    pub kld_base_out: Option<PathBuf>,
    /// --perplexity: also report the KL divergence from the distributions in FILE
    /// (written by --kld-base-out on the same text, --ctx and --chunks) and how often
    /// the top token is the same.
    #[arg(long, value_name = "FILE", requires = "perplexity", conflicts_with = "kld_base_out")]
    pub kld_base: Option<PathBuf>,
    /// Write the mean square of every matrix's input columns (an importance matrix, for
    /// --imatrix and tools/convert.py --imatrix) to FILE: over the built-in calibration text
    /// (what a GGUF file's Q4_0 conversion uses), or with --perplexity over that text.
    #[arg(long, value_name = "FILE")]
    pub imatrix_out: Option<PathBuf>,
    /// Constrain the output to JSON valid against a JSON Schema: a file, or
    /// the schema itself when the text starts with `{`.
    #[arg(long, value_name = "SCHEMA|FILE", conflicts_with = "grammar")]
    pub json_schema: Option<String>,
    /// Constrain the output to a GBNF grammar (llama.cpp's format) in FILE.
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
    /// Print the prompt's embedding (the hidden states after the output norm, pooled by
    /// --pooling) as a JSON array, instead of generating (llama.cpp's llama-embedding).
    #[arg(long, conflicts_with_all = ["bench", "perplexity", "logits_out", "tokenize"])]
    pub embedding: bool,
    /// --embedding: 2 (unit length, the default, as /v1/embeddings) or -1 (the pooled
    /// vector as it is); llama.cpp's --embd-normalize numbers.
    #[arg(long, default_value_t = 2, allow_hyphen_values = true, value_parser = embd_normalize)]
    pub embd_normalize: i32,
    /// Read special tokens written in a raw prompt (`<|im_start|>`, `<s>`) as the control
    /// tokens they name, for prompts that spell out a chat format themselves. Without it
    /// they are plain text, and in a chat (--chat) the user's text is always plain.
    #[arg(long)]
    pub parse_special: bool,
}

/// `--embd-normalize`: -1 or 2 (llama.cpp's max-abs, taxicab and p-norms are not offered).
fn embd_normalize(s: &str) -> Result<i32, String> {
    match s.trim() {
        "-1" => Ok(-1),
        "2" => Ok(2),
        _ => Err(format!("'{s}' is not -1 (none) or 2 (unit length)")),
    }
}

/// The grammar of `--json-schema` or `--grammar`, compiled before the model
/// loads so that a bad one costs nothing.
fn output_grammar(args: &Args) -> Result<Option<Arc<Grammar>>, String> {
    let read = |path: &Path, what: &str| super::read_text_file(path, super::MAX_GRAMMAR_FILE, what);
    if let Some(arg) = &args.json_schema {
        let (text, name) = match arg.trim_start().starts_with('{') {
            true => (arg.clone(), "--json-schema".to_string()),
            false => (read(Path::new(arg), "JSON schema")?, arg.clone()),
        };
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", name.escape_debug()))?;
        let g = grammar::schema::compile(&value).map_err(|e| format!("{}: {e}", name.escape_debug()))?;
        return Ok(Some(Arc::new(g)));
    }
    if let Some(path) = &args.grammar {
        let g = grammar::gbnf::compile(&read(path, "grammar")?).map_err(|e| format!("{}: {e}", path.display()))?;
        return Ok(Some(Arc::new(g)));
    }
    Ok(None)
}

/// The command-line parser of a sampling setting: the range the server
/// checks too (`sampler::SettingRange`).
fn setting(range: &'static SettingRange) -> impl Fn(&str) -> Result<f32, String> + Clone + Send + Sync + 'static {
    move |text: &str| {
        let v: f64 = text.trim().parse().map_err(|_| format!("'{text}' is not a number"))?;
        range.check(v).map(|v| v as f32)
    }
}

/// `ml_run ARGS`.
pub fn main(argv: Vec<OsString>) -> Result<(), Fault> {
    // llama-bench spells these with one dash.
    let argv = argv
        .into_iter()
        .map(|a| match a.to_str() {
            Some("-pp") => "--pp".into(),
            Some("-tg") => "--tg".into(),
            _ => a,
        })
        .collect();
    let Some(args) = super::parse_args::<Args>(argv)? else { return Ok(()) };
    let started = Instant::now();
    let grammar = output_grammar(&args)?;
    let (file, tokenizer) = args.run.open(args.model.as_deref())?;
    let text = if is_chat(&args) { None } else { prompt_text(&args, tokenizer.as_ref())? };
    if args.tokenize {
        let tok = tokenizer.as_ref().ok_or("--tokenize needs a tokenizer (-z, or a GGUF model)")?;
        let ids = text.unwrap_or_default().encode(tok, true);
        return Ok(stdout::line(&format!("[{}]", ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")))?);
    }
    let (pool, threads) = args.run.thread_pool()?;
    // Everything below runs on a pool thread, so parallel loops start inside the pool.
    pool.install(|| run_model(&args, file, tokenizer, text, threads, started, grammar))
}

/// Whether this run is the interactive chat: no prompt given, no
/// measurement or test mode, and a terminal on stdin.
fn is_chat(args: &Args) -> bool {
    let prompt_given = args.prompt.is_some() || args.prompt_file.is_some() || args.prompt_ids.is_some();
    let other_mode = args.tokenize
        || args.embedding
        || args.bench
        || args.perplexity.is_some()
        || args.logits_out.is_some()
        || args.imatrix_out.is_some();
    !prompt_given && !other_mode && std::io::stdin().is_terminal()
}

/// The prompt text (`-p` then `-f`; without either, what is piped to stdin
/// when nothing else gives the input), wrapped in the chat template when
/// there is one. The user's text is plain (no control tokens) unless
/// `--parse-special` asks for a raw prompt's to be read.
fn prompt_text(args: &Args, tokenizer: Option<&Tokenizer>) -> Result<Option<PromptText>, String> {
    let mut text = args.prompt.clone();
    if let Some(path) = &args.prompt_file {
        let t = super::read_text_file(path, super::MAX_PROMPT_FILE, "the prompt file")?;
        text = Some(text.map_or(t.clone(), |p| p + &t));
    }
    let other_input =
        args.prompt_ids.is_some() || args.bench || args.perplexity.is_some() || args.imatrix_out.is_some();
    if text.is_none() && !other_input && !std::io::stdin().is_terminal() && args.model.is_some() {
        let bytes = super::read_capped(std::io::stdin(), super::MAX_PROMPT_FILE, "the prompt from stdin")?;
        text = Some(String::from_utf8(bytes).map_err(|_| "the prompt from stdin is not UTF-8 text")?);
    }
    Ok(match (args.run.chat_format(tokenizer, false)?, text) {
        (Some(_), Some(_)) if args.parse_special => {
            return Err("--parse-special is for raw prompts: with a chat template, only the template writes control \
                        tokens (leave out --chat, or --parse-special)"
                .into())
        }
        (Some(format), Some(t)) => {
            let turn = [Message::new(Role::User, t)];
            Some(format.format(args.run.system.as_deref(), &turn, &[], &Default::default())?)
        }
        (None, Some(t)) if args.parse_special => Some(PromptText::template(&t)),
        (None, Some(t)) => Some(PromptText::plain(&t)),
        (_, None) => None,
    })
}

fn write_imatrix(path: &Path, imatrix: &Imatrix) -> Result<(), Fault> {
    crate::format::write_atomic(path, |out| out.write_all(&imatrix.to_bytes()))?;
    eprintln!("importance matrix of {} matrices written to {}", imatrix.entries.len(), path.display());
    Ok(())
}

/// Loads the model and runs the chosen mode (bench, perplexity, logits, generation).
fn run_model(
    args: &Args,
    file: Option<ModelFile>,
    tokenizer: Option<Tokenizer>,
    text: Option<PromptText>,
    threads: usize,
    started: Instant,
    grammar: Option<Arc<Grammar>>,
) -> Result<(), Fault> {
    let (Some(model_path), Some(file)) = (args.model.as_ref(), file) else {
        return Err(
            "no model given (ml_run MODEL.gguf -p PROMPT, ml_run MODEL_DIR -p PROMPT, or ml_run MODEL.mlb -z TOKENIZER -p PROMPT)".into()
        );
    };
    let model = args.run.load_model(file, tokenizer.as_ref(), args.imatrix_out.is_some())?;
    let load_secs = started.elapsed().as_secs_f64();
    let vocab = model.config.vocab_size;

    if args.embedding {
        let prompt: Vec<u32> = match (&args.prompt_ids, &text, &tokenizer) {
            (Some(ids), _, _) => ids.clone(),
            (None, Some(t), Some(tok)) => t.encode(tok, true),
            _ => return Err("--embedding needs a prompt: -p, -f or --prompt-ids (and a tokenizer for text)".into()),
        };
        let ctx = args.run.ctx(&model)?;
        check_prompt(&prompt, vocab, ctx).map_err(|e| e.to_string())?;
        let mut state = args.run.state(&model, ctx)?;
        let pooling = args.run.pooling(&model);
        let e = model.embed(&mut state, &prompt, pooling, args.embd_normalize == 2, args.run.batch)?;
        let values: Vec<String> = e.iter().map(|v| format!("{v:?}")).collect();
        stdout::line(&format!("[{}]", values.join(",")))?;
        eprintln!(
            "krafla: embedding of {} tokens, {} values, {} pooling, in {:.1} ms",
            prompt.len(),
            e.len(),
            pooling.name(),
            started.elapsed().as_secs_f64() * 1e3 - load_secs * 1e3
        );
        return Ok(());
    }

    if args.bench {
        let cfg = measure::BenchConfig {
            prompt_tokens: args.bench_pp,
            gen_tokens: args.bench_tg,
            repetitions: args.bench_reps,
            batch: args.run.batch,
            threads,
            kv: args.run.kv,
        };
        if cfg.repetitions == 0 {
            return Err("-r must be at least 1".into());
        }
        let name = model_path.file_stem().map_or("model".into(), |s| s.to_string_lossy().into_owned());
        return measure::bench(model, &name, &cfg);
    }
    if let (Some(out), None) = (&args.imatrix_out, &args.perplexity) {
        let tok = tokenizer.as_ref().ok_or("--imatrix-out needs a tokenizer (-z)")?;
        return write_imatrix(out, &calibrate::measure(&model, tok)?);
    }
    if let Some(path) = &args.perplexity {
        let tok = tokenizer.as_ref().ok_or("--perplexity needs a tokenizer (-z)")?;
        let text = super::read_text_file(path, super::MAX_TEXT_FILE, "the text")?;
        let ctx = args.run.ctx.unwrap_or(512);
        if ctx < 4 || ctx > model.config.context_length {
            return Err(format!("--ctx {ctx} must be within 4..={}", model.config.context_length).into());
        }
        let state = args.run.state(&model, ctx)?;
        eprintln!("{}", startup_line(model_path, &model, load_secs, threads, ctx, &state, args.run.kv));
        let kld = match (&args.kld_base_out, &args.kld_base) {
            (Some(out), _) => Some(measure::Kld::Write(out)),
            (_, Some(base)) => Some(measure::Kld::Compare(base)),
            _ => None,
        };
        let mut gen = Generator::new(model.clone(), state, args.run.batch);
        measure::perplexity(&mut gen, tok, &text, args.chunks, kld)?;
        if let (Some(path), Some(stats)) = (&args.imatrix_out, model.input_stats()) {
            write_imatrix(path, &Imatrix { entries: stats.means() })?;
        }
        return Ok(());
    }

    if is_chat(args) {
        let tok = tokenizer.as_ref().ok_or("the chat needs a tokenizer (-z, or a GGUF model)")?;
        let template = args.run.chat_format(Some(tok), true)?.ok_or(
            "the chat needs a chat template, and the tokenizer names none: pass --chat NAME (or -p for one answer)",
        )?;
        let ctx = args.run.ctx(&model)?;
        let state = args.run.state(&model, ctx)?;
        let plan = args.spec.plan(&model, Some(tok), args.run.batch)?;
        eprintln!("{}", startup_line(model_path, &model, load_secs, threads, ctx, &state, args.run.kv));
        if let Some(line) = plan.describe() {
            eprintln!("krafla: {line}");
        }
        let params = decode_params(args, tokenizer.as_ref(), grammar.clone())?;
        let speculator = plan.speculator(ctx)?;
        let generator = Generator::new(model, state, args.run.batch);
        return Ok(interactive::run(
            generator,
            speculator,
            tok,
            template,
            args.run.system.as_deref(),
            params,
            args.n_predict,
        )?);
    }

    let prompt: Vec<u32> = match (&args.prompt_ids, &text, &tokenizer) {
        (Some(ids), _, _) => ids.clone(),
        (None, Some(t), Some(tok)) => t.encode(tok, true),
        (None, Some(_), None) => return Err("a text prompt needs a tokenizer (-z), or use --prompt-ids".into()),
        (None, None, _) => return Err("no prompt: give -p, -f or --prompt-ids".into()),
    };
    let ctx = args.run.ctx(&model)?;
    check_prompt(&prompt, vocab, ctx).map_err(|e| e.to_string())?;
    let state = args.run.state(&model, ctx)?;
    let plan = args.spec.plan(&model, tokenizer.as_ref(), args.run.batch)?;
    eprintln!("{}", startup_line(model_path, &model, load_secs, threads, ctx, &state, args.run.kv));
    if let Some(line) = plan.describe() {
        eprintln!("krafla: {line}");
    }
    let mut speculator = plan.speculator(ctx)?;
    let mut generator = Generator::new(model, state, args.run.batch);

    // ---- prompt ----
    let t0 = Instant::now();
    let want = if args.logits_out.is_some() { LogitsFor::All } else { LogitsFor::Last };
    let logits = generator.prefill(&prompt, want, &|| false)?.unwrap_or_default();
    if let Some(s) = &mut speculator {
        s.prepare(&prompt)?;
    }
    let prompt_secs = t0.elapsed().as_secs_f64();
    if let Some(path) = &args.logits_out {
        let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(path, bytes).map_err(|e| format!("{}: cannot write logits: {e}", path.display()))?;
    }

    // ---- generation ----
    let params = decode_params(args, tokenizer.as_ref(), grammar.clone())?;
    let text_out = if args.print_ids { None } else { tokenizer.as_ref() };
    let t1 = Instant::now();
    let last = logits[logits.len() - vocab..].to_vec();
    let mut write_error = None;
    // a harmony answer's reasoning goes to stderr
    let format = args.run.chat_format(tokenizer.as_ref(), false)?;
    let reasoning = format.zip(text.as_ref()).map(|(f, t)| Reasoning::for_prompt(Some(f.kind), t.as_str()));
    let mut answer = AnswerText::new(reasoning);
    let done = generator.decode(last, &prompt, &params, text_out, speculator.as_mut(), &mut |t: Token| {
        answer.show(t.text).map_err(|e| write_error = Some(e)).is_ok()
    })?;
    if let Some(e) = write_error {
        return Err(e.into());
    }
    let gen_secs = t1.elapsed().as_secs_f64();
    if text_out.is_none() {
        stdout::line(&format!("[{}]", done.tokens.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")))?;
    } else {
        answer.show(&done.tail)?;
        answer.finish()?;
        stdout::line("")?;
    }
    let spec = speculator.map_or(String::new(), |s| format!("; speculative: {}", s.stats.summary()));
    eprintln!(
        "krafla: prompt {} tokens, {:.1} tokens/s; generation {} tokens, {:.1} tokens/s{spec}",
        prompt.len(),
        prompt.len() as f64 / prompt_secs.max(1e-9),
        done.tokens.len(),
        done.tokens.len() as f64 / gen_secs.max(1e-9)
    );
    if done.grammar_cut {
        return Err(format!("after {} tokens: {GRAMMAR_CUT}", done.tokens.len()).into());
    }
    Ok(())
}

/// Sampling and stopping from the command line: `-n` (default 256), the
/// sampler options, the tokenizer's end-of-sequence and end-of-turn ids,
/// and the output's grammar.
fn decode_params(
    args: &Args,
    tokenizer: Option<&Tokenizer>,
    grammar: Option<Arc<Grammar>>,
) -> Result<DecodeParams, String> {
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
    });
    let constrained = match (grammar, tokenizer) {
        (None, _) => None,
        (Some(grammar), Some(t)) => Some(Constrained { grammar, vocab: Arc::new(Vocab::new(t)) }),
        (Some(_), None) => return Err("--json-schema and --grammar need a tokenizer (-z, or a GGUF model)".into()),
    };
    Ok(DecodeParams {
        max_tokens: args.n_predict.unwrap_or(256),
        sampler: SamplerConfig {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            min_p: args.min_p,
            repeat_penalty: args.repeat_penalty,
            seed,
            ..Default::default()
        },
        stop_ids: tokenizer.map_or(Vec::new(), Tokenizer::stop_ids),
        stop_strings: Vec::new(),
        constrained,
    })
}
