//! Reader for `.mlt` tokenizer files (docs/FORMAT.md, section `.mlt`): the
//! structure only (ids in range, UTF-8 strings); `crate::tokenizer` builds
//! the lookup tables from it.
//!
//! Every count and length is checked against the bytes that remain before anything is
//! allocated (`ByteReader`), so a hostile file can never make the reader allocate more
//! than its own size.

use super::bytes::ByteReader;

/// File magic.
pub const MAGIC: &[u8; 8] = b"KRAFLAMT";
/// The only version this reader understands.
pub const VERSION: u32 = 1;
/// Upper bound on `n_vocab`.
pub const MAX_VOCAB: u32 = 4_194_304;
/// Upper bound on `n_merges`.
pub const MAX_MERGES: u32 = 16_777_216;
/// Upper bound on the byte length of one token string.
pub const MAX_TOKEN_LEN: u32 = 65_536;
/// The longest chat template source (Qwen3.5's is 7 KB, gpt-oss's 16 KB).
pub const MAX_CHAT_JINJA: u32 = 1 << 20;

/// Flag bits of the header.
pub const FLAG_BYTE_FALLBACK: u32 = 1;
pub const FLAG_PREFIX_SPACE: u32 = 1 << 1;
pub const FLAG_ADD_BOS: u32 = 1 << 2;
pub const FLAG_ADD_EOS: u32 = 1 << 3;
pub const FLAG_METASPACE: u32 = 1 << 4;
/// A pre-token found whole in the vocabulary is emitted as is (Llama 3's `ignore_merges`).
pub const FLAG_IGNORE_MERGES: u32 = 1 << 5;
/// Unicode NFC normalisation before pre-tokenising (Qwen2).
pub const FLAG_NFC: u32 = 1 << 6;
const KNOWN_FLAGS: u32 = (1 << 7) - 1;

/// Token types.
#[cfg_attr(not(test), allow(dead_code))]
pub const TYPE_NORMAL: u8 = 0;
pub const TYPE_CONTROL: u8 = 1;
pub const TYPE_USER: u8 = 2;
pub const TYPE_BYTE: u8 = 3;
pub const TYPE_UNKNOWN: u8 = 4;

/// Smallest encoding of one vocabulary entry: empty string (4) + f32 score (4) + u8 type (1).
const MIN_VOCAB_ENTRY: usize = 9;
/// Encoding of one merge: two u32 ids.
const MERGE_ENTRY: usize = 8;

/// Model kind (header field at offset 12).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// GPT-2 style byte-level BPE.
    ByteLevel,
    /// SentencePiece-style BPE (U+2581 for spaces, optional byte fallback).
    SentencePiece,
}

/// Pre-tokenizer kind (header field at offset 16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    None,
    Gpt2,
    Llama3,
    Qwen2,
    Qwen35,
    Gpt4o,
    Starcoder,
    Falcon,
    DeepseekCoder,
    DeepseekLlm,
    /// Gemma 4: lines and newline runs, each merged whole (SentencePiece-style BPE).
    Gemma4,
}

/// The file's contents, validated for structure (ids in range, UTF-8 strings).
#[derive(Debug)]
pub struct RawTokenizer {
    pub kind: ModelKind,
    pub pretok: PreTokenizer,
    pub flags: u32,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub chat_template: String,
    /// The model's own chat template (Jinja source), empty if none: an
    /// optional last field, absent from files written before it.
    pub chat_jinja: String,
    pub tokens: Vec<String>,
    /// SentencePiece scores (kept to write the file again; BPE ranks come from `merges`).
    pub scores: Vec<f32>,
    pub types: Vec<u8>,
    /// (left, right) id pairs; rank = index.
    pub merges: Vec<(u32, u32)>,
}

fn model_kind(v: u32) -> Result<ModelKind, String> {
    match v {
        0 => Ok(ModelKind::ByteLevel),
        1 => Ok(ModelKind::SentencePiece),
        _ => Err(format!("unknown model kind {v} (expected 0 or 1)")),
    }
}

pub(crate) fn pre_tokenizer(v: u32) -> Result<PreTokenizer, String> {
    match v {
        0 => Ok(PreTokenizer::None),
        1 => Ok(PreTokenizer::Gpt2),
        2 => Ok(PreTokenizer::Llama3),
        3 => Ok(PreTokenizer::Qwen2),
        4 => Ok(PreTokenizer::Qwen35),
        5 => Ok(PreTokenizer::Gpt4o),
        6 => Ok(PreTokenizer::Starcoder),
        7 => Ok(PreTokenizer::Falcon),
        8 => Ok(PreTokenizer::DeepseekCoder),
        9 => Ok(PreTokenizer::DeepseekLlm),
        10 => Ok(PreTokenizer::Gemma4),
        _ => Err(format!("unknown pre-tokenizer {v} (expected 0..=10)")),
    }
}

/// `-1` means absent; anything else must index the vocabulary.
fn optional_id(v: i32, what: &str, n_vocab: usize) -> Result<Option<u32>, String> {
    match v {
        -1 => Ok(None),
        v if v >= 0 && (v as usize) < n_vocab => Ok(Some(v as u32)),
        v => Err(format!("{what} {v} is out of range (vocabulary has {n_vocab} tokens)")),
    }
}

/// Reads and parses a `.mlt` file; errors are one line naming the file.
pub fn read(path: &std::path::Path) -> Result<RawTokenizer, String> {
    let name = path.display();
    let bytes = std::fs::read(path).map_err(|e| format!("{name}: cannot read: {e}"))?;
    parse(&bytes).map_err(|e| format!("{name}: {e}"))
}

/// Parse and structurally validate a whole `.mlt` file.
pub fn parse(buf: &[u8]) -> Result<RawTokenizer, String> {
    let mut r = ByteReader::new(buf);
    let magic = r.take(8, "magic")?;
    if magic != MAGIC {
        return Err("bad magic (not a KRAFLAMT tokenizer file)".to_string());
    }
    let version = r.u32("version")?;
    if version != VERSION {
        return Err(format!("unsupported version {version} (expected {VERSION})"));
    }
    let kind = model_kind(r.u32("model kind")?)?;
    let pretok = pre_tokenizer(r.u32("pre-tokenizer")?)?;
    let flags = r.u32("flags")?;
    if flags & !KNOWN_FLAGS != 0 {
        return Err(format!("unknown flag bits {:#x}", flags & !KNOWN_FLAGS));
    }
    let mut special = [0i32; 5];
    for (slot, what) in special.iter_mut().zip(SPECIAL_NAMES) {
        *slot = r.i32(what)?;
    }
    let chat_template = r.str(MAX_TOKEN_LEN, "chat template")?.to_string();

    let n_vocab = r.count(MAX_VOCAB, MIN_VOCAB_ENTRY, "n_vocab")?;
    let mut tokens = Vec::with_capacity(n_vocab);
    let mut types = Vec::with_capacity(n_vocab);
    let mut scores = Vec::with_capacity(n_vocab);
    for i in 0..n_vocab {
        let what = format!("token {i}");
        tokens.push(r.str(MAX_TOKEN_LEN, &what)?.to_string());
        scores.push(r.f32(&what)?);
        let ty = r.u8(&what)?;
        if ty > TYPE_UNKNOWN {
            return Err(format!("{what} has unknown token type {ty}"));
        }
        types.push(ty);
    }

    let n_merges = r.count(MAX_MERGES, MERGE_ENTRY, "n_merges")?;
    let mut merges = Vec::with_capacity(n_merges);
    for i in 0..n_merges {
        let what = format!("merge {i}");
        let (a, b) = (r.u32(&what)?, r.u32(&what)?);
        if a as usize >= n_vocab || b as usize >= n_vocab {
            return Err(format!("{what} ({a}, {b}) is out of range (vocabulary has {n_vocab} tokens)"));
        }
        merges.push((a, b));
    }
    let chat_jinja = match r.remaining() {
        0 => String::new(),
        _ => r.str(MAX_CHAT_JINJA, "chat template source")?.to_string(),
    };
    if r.remaining() != 0 {
        return Err(format!("{} unexpected trailing bytes", r.remaining()));
    }

    let [bos, eos, eot, unk, pad] = special;
    Ok(RawTokenizer {
        kind,
        pretok,
        flags,
        bos: optional_id(bos, SPECIAL_NAMES[0], n_vocab)?,
        eos: optional_id(eos, SPECIAL_NAMES[1], n_vocab)?,
        eot: optional_id(eot, SPECIAL_NAMES[2], n_vocab)?,
        unk: optional_id(unk, SPECIAL_NAMES[3], n_vocab)?,
        pad: optional_id(pad, SPECIAL_NAMES[4], n_vocab)?,
        chat_template,
        chat_jinja,
        tokens,
        scores,
        types,
        merges,
    })
}

const SPECIAL_NAMES: [&str; 5] = ["bos_id", "eos_id", "eot_id", "unk_id", "pad_id"];

/// A tokenizer as `.mlt` bytes: what `tools/convert_tokenizer.py` writes for
/// the same description (a missing score is written as 0).
pub fn write(raw: &RawTokenizer) -> Vec<u8> {
    fn string(out: &mut Vec<u8>, s: &[u8]) {
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s);
    }
    let id = |v: Option<u32>| v.map_or(-1, |v| v as i32);
    let mut out = MAGIC.to_vec();
    let kind = match raw.kind {
        ModelKind::ByteLevel => 0u32,
        ModelKind::SentencePiece => 1,
    };
    let pretok = match raw.pretok {
        PreTokenizer::None => 0u32,
        PreTokenizer::Gpt2 => 1,
        PreTokenizer::Llama3 => 2,
        PreTokenizer::Qwen2 => 3,
        PreTokenizer::Qwen35 => 4,
        PreTokenizer::Gpt4o => 5,
        PreTokenizer::Starcoder => 6,
        PreTokenizer::Falcon => 7,
        PreTokenizer::DeepseekCoder => 8,
        PreTokenizer::DeepseekLlm => 9,
        PreTokenizer::Gemma4 => 10,
    };
    for v in [VERSION, kind, pretok, raw.flags] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for v in [raw.bos, raw.eos, raw.eot, raw.unk, raw.pad] {
        out.extend_from_slice(&id(v).to_le_bytes());
    }
    string(&mut out, raw.chat_template.as_bytes());
    out.extend_from_slice(&(raw.tokens.len() as u32).to_le_bytes());
    for (i, (t, ty)) in raw.tokens.iter().zip(&raw.types).enumerate() {
        string(&mut out, t.as_bytes());
        let score = raw.scores.get(i).copied().unwrap_or(0.0);
        out.extend_from_slice(&score.to_le_bytes());
        out.push(*ty);
    }
    out.extend_from_slice(&(raw.merges.len() as u32).to_le_bytes());
    for (a, b) in &raw.merges {
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&b.to_le_bytes());
    }
    if !raw.chat_jinja.is_empty() {
        string(&mut out, raw.chat_jinja.as_bytes());
    }
    out
}
