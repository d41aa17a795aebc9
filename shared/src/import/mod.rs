//! Models and tokenizers from other formats, made at load time: a GGUF
//! file, a Hugging Face directory (safetensors) or a llama2.c checkpoint
//! becomes an `.mlb` model in memory (a GGUF file's tensors of Krafla's
//! types used in place, the others converted on all threads), and a GGUF
//! file's tokenizer or a `tokenizer.json` an `.mlt` tokenizer; `--save`
//! and `--save-tokenizer` write them.

pub mod calibrate;
pub mod convert;
pub mod dequant;
pub mod families;
pub mod gguf;
pub mod hf;
pub mod hf_config;
pub mod imatrix;
pub mod llama2c;
pub mod mixed;
pub mod quantize;
pub mod tokenizer;
pub mod tokenizer_json;

use quantize::Q4Rule;

use crate::fault::Fault;
use crate::format::gguf::Gguf;
use crate::format::mlb::Mlb;
use crate::format::mlt::RawTokenizer;

/// A model in a format other than `.mlb`, opened.
pub enum Source {
    Gguf(Box<Gguf>),
    Hf(Box<hf::HfModel>),
    Llama2c(Box<llama2c::Llama2c>),
}

impl Source {
    pub fn path(&self) -> String {
        match self {
            Source::Gguf(g) => g.path.clone(),
            Source::Hf(m) => m.path(),
            Source::Llama2c(m) => m.path.clone(),
        }
    }

    /// The options a source of floats is converted by: `auto` (which
    /// goes by the source's bits a weight) is Q8_0 for them.
    fn for_floats(&self, opts: &ImportOptions) -> ImportOptions {
        let mut opts = opts.clone();
        if opts.ctype == ConvertType::Auto && !matches!(self, Source::Gguf(_)) {
            opts.ctype = ConvertType::Q8_0;
        }
        opts
    }

    /// The `.mlb` model, converted by `opts`' rules.
    pub fn import(self, opts: &ImportOptions) -> Result<Mlb, Fault> {
        let opts = self.for_floats(opts);
        match self {
            Source::Gguf(g) => gguf::import_model(*g, &opts),
            Source::Hf(m) => m.import(&opts),
            Source::Llama2c(m) => m.import(&opts),
        }
    }

    /// Whether `import(opts)` would make any tensor Q4_0.
    pub fn makes_q4(&self, opts: &ImportOptions) -> Result<bool, String> {
        let opts = self.for_floats(opts);
        match self {
            Source::Gguf(g) => gguf::makes_q4(g, &opts),
            Source::Hf(m) => m.makes_q4(&opts),
            Source::Llama2c(m) => m.makes_q4(&opts),
        }
    }

    /// The tokenizer the model brings: a GGUF file's, or a model
    /// directory's `tokenizer.json`; None for a llama2.c checkpoint.
    pub fn tokenizer(&self) -> Result<Option<RawTokenizer>, String> {
        match self {
            Source::Gguf(g) => tokenizer::import_tokenizer(g).map(Some),
            Source::Hf(m) => {
                let path = m.dir.join("tokenizer.json");
                path.is_file().then(|| tokenizer_json::import_tokenizer_json(&path)).transpose()
            }
            Source::Llama2c(_) => Ok(None),
        }
    }

    /// The model as the calibration of an importance matrix runs it: its
    /// tensors of the types Krafla reads as they are, the others in Q8_0.
    pub fn calibration_model(&self) -> Result<Mlb, Fault> {
        let q8 = ImportOptions::new(ConvertType::Q8_0);
        match self {
            Source::Gguf(g) => gguf::import_model(Gguf::open(std::path::Path::new(&g.path))?, &q8),
            Source::Hf(m) => m.import(&q8),
            Source::Llama2c(m) => m.import(&q8),
        }
    }
}

/// A tokenizer file given on its own (`-z`): `.mlt`, a `tokenizer.json`,
/// a GGUF file's tokenizer, or llama2.c's `tokenizer.bin`.
pub fn read_tokenizer(path: &std::path::Path) -> Result<RawTokenizer, Fault> {
    if Gguf::sniff_file(path)? {
        return Ok(tokenizer::import_tokenizer(&Gguf::open(path)?)?);
    }
    if tokenizer_json::is_tokenizer_json(path) {
        return Ok(tokenizer_json::import_tokenizer_json(path)?);
    }
    if path.extension().is_some_and(|e| e == "bin") {
        return Ok(tokenizer_json::import_tokenizer_bin(path)?);
    }
    Ok(crate::format::mlt::read(path)?)
}

/// How tensors of the types Krafla does not read are converted (`--type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvertType {
    Q8_0,
    F32,
    F16,
    Q4_0,
    Q4Mixed,
    Auto,
}

/// How a GGUF file's tensors are converted at load.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    pub ctype: ConvertType,
    /// Convert the types Krafla reads too (Q4_K, Q6_K, Q8_0, ...), from
    /// their dequantised values, as `ctype` says.
    pub requantize: bool,
    /// How Q4_0 scales are chosen.
    pub q4_rule: Q4Rule,
    /// Per matrix name, the mean square of each input column (weights the
    /// fitted Q4_0 rule).
    pub imatrix: Option<std::sync::Arc<imatrix::Imatrix>>,
    /// `q4_mixed`: the extra bytes its Q8_0 matrices may take, as a share
    /// of the model's weight bytes in `q4_0`.
    pub mixed_budget: f64,
}

impl ImportOptions {
    pub fn new(ctype: ConvertType) -> ImportOptions {
        ImportOptions { ctype, requantize: false, q4_rule: Q4Rule::Fit, imatrix: None, mixed_budget: 0.15 }
    }
}

impl ConvertType {
    pub const ALL: [ConvertType; 6] = [
        ConvertType::Q8_0,
        ConvertType::F32,
        ConvertType::F16,
        ConvertType::Q4_0,
        ConvertType::Q4Mixed,
        ConvertType::Auto,
    ];

    /// What it does, for `--help`.
    pub fn help(self) -> &'static str {
        match self {
            ConvertType::Q8_0 => "Everything to Q8_0",
            ConvertType::F32 => {
                "Matrices to F32: the source's values exactly, 4 bytes a weight (a reference for measuring the others; \
                 from GGUF with --requantize, else its types Krafla reads stay)"
            }
            ConvertType::F16 => "Matrices to F16 (half of f32's bytes; norms and biases stay F32)",
            ConvertType::Q4_0 => "The embeddings and output to Q8_0, the rest to fitted Q4_0",
            ConvertType::Q4Mixed => {
                "As q4_0, but the matrices most sensitive per byte stay in Q8_0, within a byte budget (`--mixed-budget`)"
            }
            ConvertType::Auto => {
                "Types of 5 bits a weight or more to Q8_0, 4 bits or fewer to fitted Q4_0 (the embeddings and output \
                 to Q8_0); Q4_K, Q5_K and Q6_K, like every type Krafla reads, stay as they are under any `--type`"
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ConvertType::Q8_0 => "q8_0",
            ConvertType::F32 => "f32",
            ConvertType::F16 => "f16",
            ConvertType::Q4_0 => "q4_0",
            ConvertType::Q4Mixed => "q4_mixed",
            ConvertType::Auto => "auto",
        }
    }
}

#[cfg(test)]
mod tests;
