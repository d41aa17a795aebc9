//! Models and tokenizers from other formats, made at load time: a GGUF
//! file becomes an `.mlb` model in memory (its tensors of Krafla's types
//! used in place, the others converted on all threads) and an `.mlt`
//! tokenizer, by the same rules as `tools/convert.py` and
//! `tools/convert_tokenizer.py`, so that `--save` writes their bytes.

pub mod dequant;
pub mod families;
pub mod gguf;
pub mod quantize;
pub mod tokenizer;

/// How tensors of the types Krafla does not read are converted (`--type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ConvertType {
    /// Everything to Q8_0.
    #[value(name = "q8_0")]
    Q8_0,
    /// The embeddings and output to Q8_0, the rest to fitted Q4_0.
    #[value(name = "q4_0")]
    Q4_0,
    /// Types of 5 bits a weight or more to Q8_0, 4 bits or fewer to fitted
    /// Q4_0 (the embeddings and output to Q8_0); Q4_K, Q5_K and Q6_K, like
    /// every type Krafla reads, stay as they are under any `--type`.
    Auto,
}

impl ConvertType {
    pub fn name(self) -> &'static str {
        match self {
            ConvertType::Q8_0 => "q8_0",
            ConvertType::Q4_0 => "q4_0",
            ConvertType::Auto => "auto",
        }
    }
}

#[cfg(test)]
mod tests;
