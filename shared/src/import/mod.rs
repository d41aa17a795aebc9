//! Models and tokenizers from other formats, made at load time: a GGUF
//! file becomes an `.mlb` model in memory (its tensors of Krafla's types
//! used in place, the others converted on all threads) and an `.mlt`
//! tokenizer, by the same rules as `tools/convert.py` and
//! `tools/convert_tokenizer.py`, so that `--save` writes their bytes.

pub mod calibrate;
pub mod convert;
pub mod dequant;
pub mod families;
pub mod gguf;
pub mod imatrix;
pub mod mixed;
pub mod quantize;
pub mod tokenizer;

use quantize::Q4Rule;

/// How tensors of the types Krafla does not read are converted (`--type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvertType {
    Q8_0,
    F32,
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
    pub const ALL: [ConvertType; 5] =
        [ConvertType::Q8_0, ConvertType::F32, ConvertType::Q4_0, ConvertType::Q4Mixed, ConvertType::Auto];

    /// What it does, for `--help`.
    pub fn help(self) -> &'static str {
        match self {
            ConvertType::Q8_0 => "Everything to Q8_0",
            ConvertType::F32 => {
                "Everything to F32: the source's values exactly, 4 bytes a weight (a reference for measuring the others)"
            }
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
            ConvertType::Q4_0 => "q4_0",
            ConvertType::Q4Mixed => "q4_mixed",
            ConvertType::Auto => "auto",
        }
    }
}

#[cfg(test)]
mod tests;
