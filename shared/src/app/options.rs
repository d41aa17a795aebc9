//! What the CLI and the server share: the options that say which model and
//! tokenizer to run and how (threads, context, KV cache, prompt batch, chat
//! template, repacking), loading and checking them, the thread pool, and the
//! startup line.

use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};

use clap::builder::PossibleValue;
use clap::ValueEnum;

use crate::chat::{ChatFormat, JinjaTemplate, Template};
use crate::fault::Fault;
use crate::format::gguf::Gguf;
use crate::format::mlb::Mlb;
use crate::format::mlt::{self, RawTokenizer, MAX_CHAT_JINJA};
use crate::format::write_atomic;
use crate::import::imatrix::Imatrix;
use crate::import::quantize::Q4Rule;
use crate::import::{calibrate, hf, llama2c};
use crate::import::{read_tokenizer, ConvertType, ImportOptions, Source};
use crate::kernels::ISA;
use crate::model::{KvType, LoadOptions, Model, Pooling, State};
use crate::tokenizer::Tokenizer;

/// More threads than this are a typing mistake, not a machine: each one is
/// an OS thread with its own stack, and starting 100,000 takes minutes.
const MAX_THREADS: usize = 1024;

/// `--chat`: a template, or the one the tokenizer file records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChatChoice {
    Auto,
    Template(Template),
}

impl ValueEnum for ChatChoice {
    fn value_variants<'a>() -> &'a [Self] {
        static ALL: LazyLock<Vec<ChatChoice>> = LazyLock::new(|| {
            std::iter::once(ChatChoice::Auto)
                .chain(Template::value_variants().iter().map(|&t| ChatChoice::Template(t)))
                .collect()
        });
        &ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(match self {
            ChatChoice::Auto => PossibleValue::new("auto").help("the template the tokenizer file records"),
            ChatChoice::Template(t) => t.to_possible_value()?,
        })
    }
}

/// A JSON object given on the command line.
fn json_object(s: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_str::<serde_json::Value>(s) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(_) => Err("not a JSON object".into()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

/// A percentage from 0 to 1000.
fn percent(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..=1000.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not within 0..=1000"))
    }
}

/// Options of every mode that runs a model.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Tokenizer: .mlt, tokenizer.json, a GGUF file or a llama2.c tokenizer.bin; a GGUF model or a model directory brings its own.
    #[arg(short = 'z', long = "tokenizer")]
    pub tokenizer: Option<PathBuf>,
    /// GGUF models: what the tensor types Krafla does not read (Q4_1, Q5_*,
    /// K-quants) become at load [default: auto].
    #[arg(long = "type", value_enum)]
    pub convert_type: Option<ConvertType>,
    /// GGUF models: convert the types Krafla reads too (Q4_K, Q6_K, Q8_0, F16 ...) to
    /// --type q8_0 or q4_0, from their dequantised values (llama-quantize --allow-requantize).
    #[arg(long)]
    pub requantize: bool,
    /// GGUF models: how Q4_0 scales are chosen (docs/QUANT.md).
    #[arg(long = "q4-scale", value_enum, default_value_t = Q4Rule::Fit)]
    pub q4_scale: Q4Rule,
    /// GGUF models: weight the fitted Q4_0 rule by this importance matrix (written by
    /// ml_run --imatrix-out) instead of the one measured at load on the built-in text.
    #[arg(long, value_name = "FILE", conflicts_with = "no_imatrix")]
    pub imatrix: Option<PathBuf>,
    /// GGUF models, --type q4_mixed: the extra bytes its Q8_0 matrices may take, in percent of
    /// the q4_0 model's weight bytes.
    #[arg(long, value_name = "PERCENT", default_value_t = 15.0, value_parser = percent)]
    pub mixed_budget: f64,
    /// GGUF models: no importance matrix for Q4_0 (no calibration run at load; a worse file).
    #[arg(long)]
    pub no_imatrix: bool,
    /// Write the model as loaded to an .mlb file (the next start maps it).
    #[arg(long, value_name = "OUT.mlb")]
    pub save: Option<PathBuf>,
    /// Write the tokenizer in use to an .mlt file.
    #[arg(long, value_name = "OUT.mlt")]
    pub save_tokenizer: Option<PathBuf>,
    /// Worker threads (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Context length (default: 4096 or the model's maximum if smaller).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// KV cache type.
    #[arg(long = "kv", value_enum, default_value_t = KvType::F32)]
    pub kv: KvType,
    /// Prompt tokens evaluated per forward call.
    #[arg(long, default_value_t = 512)]
    pub batch: usize,
    /// Chat template (ml_run: wrap the prompt in it; ml_server: for /v1/chat/completions, by default the
    /// tokenizer file's).
    #[arg(long, value_enum)]
    pub chat: Option<ChatChoice>,
    /// A Jinja chat template file to render conversations with, instead of the one the model's
    /// file carries (llama-server's --chat-template-file). Without it, and without --chat KIND,
    /// the model's own template is used where its file has one.
    #[arg(long, value_name = "FILE.jinja", conflicts_with = "chat")]
    pub chat_template_file: Option<PathBuf>,
    /// Variables for the model's own template, as a JSON object (llama-server's option), e.g.
    /// '{"enable_thinking": false}'; a server request's chat_template_kwargs override them.
    #[arg(long, value_name = "JSON", value_parser = json_object)]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// How embeddings pool the positions' hidden states (--embedding): mean, cls (the first
    /// position) or last [default: the model file's pooling_type, else mean].
    #[arg(long, value_parser = ["mean", "cls", "last"])]
    pub pooling: Option<String>,
    /// System prompt for the chat template.
    #[arg(long)]
    pub system: Option<String>,
    /// Keep Q8_0/Q4_0 (Q4_K/Q5_K/Q6_K) weights stored in plain rows only in the mapped file: no
    /// interleaved copy for the eight-row kernels (slower, less memory; same logits). Weights
    /// stored in eight-row groups (files written by --save or convert.py) are read in place anyway.
    #[arg(long)]
    pub no_repack: bool,
}

impl RunArgs {
    /// `-t`, or every core.
    pub fn threads(&self) -> Result<usize, String> {
        match self.threads {
            Some(0) => Err("-t must be at least 1".into()),
            Some(n) if n > MAX_THREADS => Err(format!("-t {n}: at most {MAX_THREADS} threads")),
            Some(n) => Ok(n),
            None => Ok(std::thread::available_parallelism().map_or(1, |n| n.get())),
        }
    }

    /// The worker threads: the inference pool the forward pass runs on
    /// (`crate::pool`, set for the whole process), and the rayon pool that
    /// loading and conversion run on (returned).
    pub fn thread_pool(&self) -> Result<(rayon::ThreadPool, usize), String> {
        let threads = self.threads()?;
        if self.batch == 0 {
            return Err("--batch must be at least 1".into());
        }
        crate::pool::init(threads)?;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| format!("cannot start {threads} threads: {e}"))?;
        Ok((pool, threads))
    }

    /// The model file (a GGUF file opened, its tokenizer read from it) and
    /// the tokenizer: `-z`, else the GGUF file's. `--save-tokenizer` writes
    /// the tokenizer here.
    pub fn open(&self, model: Option<&Path>) -> Result<(Option<ModelFile>, Option<Tokenizer>), Fault> {
        let file = model.map(ModelFile::open).transpose()?;
        if self.convert_type.is_some() && !matches!(file, Some(ModelFile::Import(_))) {
            return Err(
                "--type applies to models converted when loaded (GGUF, a model directory, llama2.c), not to .mlb files"
                    .into(),
            );
        }
        let raw: Option<RawTokenizer> = match (&self.tokenizer, &file) {
            (Some(path), _) => Some(read_tokenizer(path)?),
            (None, Some(ModelFile::Import(source))) => source.tokenizer()?,
            (None, _) => None,
        };
        if let Some(path) = &self.save_tokenizer {
            let raw = raw.as_ref().ok_or(
                "--save-tokenizer: there is no tokenizer (-z, a GGUF model or a model directory with tokenizer.json)",
            )?;
            write_atomic(path, |out| out.write_all(&mlt::write(raw)))?;
        }
        let tokenizer = raw.map(Tokenizer::build).transpose()?;
        Ok((file, tokenizer))
    }

    /// How a GGUF model is converted: `--type`, `--requantize`, `--q4-scale`, `--imatrix`.
    pub fn import_options(&self) -> Result<ImportOptions, String> {
        let imatrix = match &self.imatrix {
            Some(path) => {
                let file = std::fs::File::open(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
                let bytes = super::read_capped(file, super::MAX_PROMPT_FILE, &path.display().to_string())?;
                Some(Arc::new(Imatrix::from_bytes(&bytes).map_err(|e| format!("{}: {e}", path.display()))?))
            }
            None => None,
        };
        Ok(ImportOptions {
            ctype: self.convert_type.unwrap_or(ConvertType::Auto),
            requantize: self.requantize,
            q4_rule: self.q4_scale,
            imatrix,
            mixed_budget: self.mixed_budget / 100.0,
        })
    }

    /// The model (converted on the current thread pool if it is GGUF),
    /// checked against the tokenizer when there is one; `--save` writes it.
    /// With `record_inputs`, the model records what its matrices see.
    pub fn load_model(
        &self,
        file: ModelFile,
        tokenizer: Option<&Tokenizer>,
        record_inputs: bool,
    ) -> Result<Arc<Model>, Fault> {
        let mlb = match file {
            ModelFile::Mlb(path) => Mlb::open(&path)?,
            ModelFile::Import(source) => {
                let mut opts = self.import_options()?;
                let weighted = opts.q4_rule == Q4Rule::Fit && !self.no_imatrix;
                if let (None, true, Some(tok)) = (&opts.imatrix, weighted, tokenizer) {
                    if source.makes_q4(&opts)? {
                        opts.imatrix = Some(Arc::new(calibrate::imatrix(&source, tok)?));
                    }
                }
                source.import(&opts)?
            }
        };
        if let Some(path) = &self.save {
            mlb.save(path)?;
        }
        let mut model = Model::from_mlb(Arc::new(mlb), LoadOptions { repack: !self.no_repack })?;
        if record_inputs {
            model.record_inputs();
        }
        if let Some(t) = tokenizer {
            check_vocab_sizes(t.vocab_size(), model.config.vocab_size)?;
        }
        Ok(Arc::new(model))
    }

    /// `--ctx`, or 4096 (the model's maximum if smaller).
    pub fn ctx(&self, model: &Model) -> Result<usize, String> {
        let max = model.config.context_length;
        match self.ctx {
            Some(0) => Err("--ctx must be at least 1".into()),
            Some(n) if n > max => Err(format!("--ctx {n} exceeds the model's maximum context {max}")),
            Some(n) => Ok(n),
            None => Ok(max.min(4096)),
        }
    }

    /// A sequence's state for `ctx` positions with the `--kv` cache.
    pub fn state(&self, model: &Model, ctx: usize) -> Result<State, Fault> {
        State::with_kv(&model.config, ctx, self.kv)
            .map_err(|e| e.context(format!("--kv {} --ctx {ctx}", self.kv.name())))
    }

    /// `--pooling`, else the model file's, else mean.
    pub fn pooling(&self, model: &Model) -> Pooling {
        let named = self.pooling.as_deref().and_then(|n| Pooling::ALL.into_iter().find(|p| p.name() == n));
        named.or(model.config.pooling).unwrap_or(Pooling::Mean)
    }

    /// How conversations become prompts (`template` and `jinja`): None
    /// without a template. A Jinja template of no known kind has its answers
    /// read as ChatML's (Hermes tool calls).
    pub fn chat_format(&self, tokenizer: Option<&Tokenizer>, default_auto: bool) -> Result<Option<ChatFormat>, String> {
        let kind = self.template(tokenizer, default_auto)?;
        let jinja = match tokenizer {
            Some(tok) if kind.is_some() || default_auto || self.chat.is_some() => self.jinja(tok)?,
            _ => None,
        };
        let strip_bos = tokenizer.is_some_and(Tokenizer::adds_bos);
        let kwargs = self.chat_template_kwargs.clone().unwrap_or_default();
        Ok(match (kind, jinja) {
            (Some(kind), jinja) => Some(ChatFormat { kind, jinja, strip_bos, kwargs }),
            (None, Some(jinja)) => Some(ChatFormat { kind: Template::Chatml, jinja: Some(jinja), strip_bos, kwargs }),
            (None, None) => None,
        })
    }

    /// The Jinja template conversations are rendered with: `--chat-template-file`, or the
    /// model's own unless `--chat KIND` picks a built-in. A model template that does not
    /// compile is reported and the built-in kind used instead.
    pub fn jinja(&self, tokenizer: &Tokenizer) -> Result<Option<Arc<JinjaTemplate>>, String> {
        let source = match (&self.chat_template_file, self.chat) {
            (Some(path), _) => super::read_text_file(path, u64::from(MAX_CHAT_JINJA), "chat template")?,
            (None, Some(ChatChoice::Template(_))) => return Ok(None),
            (None, _) => tokenizer.chat_jinja().to_string(),
        };
        if source.is_empty() {
            return Ok(None);
        }
        let (bos, eos) = (tokenizer.token_text(tokenizer.bos_id()), tokenizer.token_text(tokenizer.eos_id()));
        match (JinjaTemplate::new(&source, &bos, &eos), &self.chat_template_file) {
            (Ok(t), _) => Ok(Some(Arc::new(t))),
            (Err(e), Some(path)) => Err(format!("{}: {e}", path.display())),
            (Err(e), None) => {
                eprintln!(
                    "krafla: the model's chat template cannot be read here ({e}); using the built-in '{}' template",
                    tokenizer.chat_template()
                );
                Ok(None)
            }
        }
    }

    /// The chat template kind (how answers and tool calls are read, and the
    /// built-in rendering): `--chat`, or with `auto` the tokenizer file's
    /// (`--chat-template-file`'s, when given); `default_auto` makes no
    /// `--chat` mean `auto` where the file names one.
    pub fn template(&self, tokenizer: Option<&Tokenizer>, default_auto: bool) -> Result<Option<Template>, String> {
        if let Some(path) = &self.chat_template_file {
            let source = super::read_text_file(path, u64::from(MAX_CHAT_JINJA), "chat template")?;
            let kind = crate::import::tokenizer::template_kind(&source);
            let recorded = tokenizer.map_or("", Tokenizer::chat_template);
            // a template of no known kind: answers read as ChatML's (Hermes tool calls)
            let name = [kind, recorded].into_iter().find(|k| !k.is_empty()).unwrap_or("chatml");
            return Ok(Template::from_name(name));
        }
        let recorded = || -> Result<Option<Template>, String> {
            let Some(tok) = tokenizer else { return Ok(None) };
            let name = tok.chat_template();
            if name.is_empty() {
                return Ok(None);
            }
            Template::from_name(name).map(Some).ok_or_else(|| {
                format!("the tokenizer file names the chat template {name:?}, which this build does not know")
            })
        };
        match self.chat {
            Some(ChatChoice::Template(t)) => Ok(Some(t)),
            Some(ChatChoice::Auto) if tokenizer.is_none() => Err("--chat auto needs a tokenizer (-z)".into()),
            Some(ChatChoice::Auto) => recorded()?
                .map(Some)
                .ok_or_else(|| "--chat auto: the tokenizer file names no chat template; pass one".to_string()),
            None if default_auto => recorded(),
            None => Ok(None),
        }
    }
}

/// A model file as given on the command line.
pub enum ModelFile {
    Mlb(PathBuf),
    /// Converted when loaded.
    Import(Box<Source>),
}

impl ModelFile {
    /// A GGUF file (by its magic), a Hugging Face directory (it has a
    /// config.json) or a llama2.c checkpoint (`.bin`) opened and validated;
    /// any other file is taken for an `.mlb`, which `Mlb::open` checks.
    pub fn open(path: &Path) -> Result<ModelFile, String> {
        if path.is_dir() {
            if !hf::is_model_dir(path) {
                return Err(format!("{}: a directory without config.json is not a model", path.display()));
            }
            return Ok(ModelFile::Import(Box::new(Source::Hf(Box::new(hf::HfModel::open(path)?)))));
        }
        if Gguf::sniff_file(path)? {
            Ok(ModelFile::Import(Box::new(Source::Gguf(Box::new(Gguf::open(path)?)))))
        } else if llama2c::is_checkpoint(path) {
            Ok(ModelFile::Import(Box::new(Source::Llama2c(Box::new(llama2c::Llama2c::open(path)?)))))
        } else {
            Ok(ModelFile::Mlb(path.to_path_buf()))
        }
    }
}

/// A tokenizer and a model belong together when every token has an
/// embedding row and the model has no more rows than padding explains:
/// models round their vocabulary up (Qwen2.5: 151,665 tokens, 151,936 rows),
/// by far less than 1/64 of it or 1,024 rows. The padding rows are never
/// sampled (generate::Generator::decode).
pub fn check_vocab_sizes(tokens: usize, rows: usize) -> Result<(), String> {
    let padding = (rows / 64).max(1024);
    if tokens > rows {
        Err(format!("the tokenizer has {tokens} tokens but the model only {rows}: they do not belong together"))
    } else if rows - tokens > padding {
        Err(format!(
            "the tokenizer has {tokens} tokens but the model {rows}, more than padding explains \
             (at most {padding} more): they do not belong together"
        ))
    } else {
        Ok(())
    }
}

/// The line both executables print when a model is loaded: the build, the
/// threads, the model, how long loading took and the memory it takes: the
/// file's weights (mapped, or partly converted at load from a GGUF file)
/// and the copies loading made of them (eight-row groups repacked from
/// plain rows; plain rows de-interleaved from a file's eight-row groups,
/// on builds without eight-row kernels).
pub fn startup_line(
    path: &Path,
    model: &Model,
    load_secs: f64,
    threads: usize,
    ctx: usize,
    state: &State,
    kv: KvType,
) -> String {
    let mib = |b: f64| b / 1048576.0;
    let copies = model.weight_copies();
    super::escape_line(&format!(
        "krafla: isa {ISA}, {threads} threads, model {} ({}, {:.1} M params{}, loaded in {:.0} ms), ctx {ctx}, \
         memory: {:.1} MiB weights ({}) + {:.1} MiB repacked weights + {:.1} MiB de-interleaved weights \
         + {:.1} MiB KV cache ({})",
        path.display(),
        model.config.arch,
        model.n_params() as f64 / 1e6,
        match model.config.moe {
            m if m.n_experts > 0 => format!(", {} of {} experts a token", m.n_used, m.n_experts),
            _ => String::new(),
        },
        load_secs * 1e3,
        mib(model.file.file_len() as f64),
        match model.file.converted_bytes() {
            0 => "mapped".to_string(),
            made => format!("{:.1} MiB of them converted at load", mib(made as f64)),
        },
        mib(copies.repacked as f64),
        mib(copies.deinterleaved as f64),
        mib(state.bytes() as f64),
        kv.name()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocab_sizes_allow_padding_only() {
        assert!(check_vocab_sizes(151_665, 151_936).is_ok());
        assert!(check_vocab_sizes(49_152, 49_152).is_ok());
        assert!(check_vocab_sizes(400, 49_152).unwrap_err().contains("more than padding explains"));
        assert!(check_vocab_sizes(49_153, 49_152).unwrap_err().contains("the model only 49152"));
        assert!(check_vocab_sizes(1, 1025).is_ok() && check_vocab_sizes(1, 1026).is_err());
    }

    #[test]
    fn chat_choices_are_auto_and_every_template() {
        let names: Vec<String> = ChatChoice::value_variants()
            .iter()
            .map(|c| c.to_possible_value().unwrap().get_name().to_string())
            .collect();
        assert_eq!(names[0], "auto");
        assert_eq!(names.len(), 1 + Template::value_variants().len());
        for &t in Template::value_variants() {
            assert!(names.iter().any(|n| n == t.name()), "{}", t.name());
        }
    }
}
