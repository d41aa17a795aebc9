//! Exact BPE tokenizers loaded from `.mlt` files (docs/FORMAT.md).
//!
//! Behaviour follows Hugging Face `tokenizers` (`encode(text, add_special_tokens)` and
//! `decode(ids, skip_special_tokens=False)`) for the two supported model kinds:
//!
//! * byte-level BPE (GPT-2 style): split on added tokens, pre-tokenize each run with the
//!   GPT-2 / Llama-3 / Qwen2 regex, map bytes to GPT-2's printable chars, merge by rank;
//! * SentencePiece-style BPE: split on added tokens, normalise (' ' -> U+2581, optional
//!   U+2581 prefix), merge the whole run by rank, falling back to `<0xNN>` byte tokens.
//!
//! Dependencies: `fancy-regex` for the pre-tokenizer regexes, which need the `(?!\S)`
//! look-ahead (the plain `regex` crate has no look-around) and Unicode classes `\p{L}`/`\p{N}`;
//! hand-coding these would need our own Unicode tables. Merging (`bpe`), added-token
//! matching (`added`) and the file reader (`crate::format::mlt`) are hand-written and dependency-free.

mod added;
pub(crate) mod bpe;
pub mod pretok;

use crate::format::mlt::{self, ModelKind, RawTokenizer};
use added::{AddedTokens, Segment};
use bpe::{pair_key, MergeMap};
use std::collections::HashMap;
use std::path::Path;

use unicode_normalization::UnicodeNormalization;

/// The SentencePiece space marker U+2581 ('▁').
const METASPACE: char = '\u{2581}';

/// A loaded, validated tokenizer.
pub struct Tokenizer {
    kind: ModelKind,
    flags: u32,
    regex: Vec<fancy_regex::Regex>,
    /// Gemma 4: a piece of newlines only that is one token is that token (llama.cpp's rule;
    /// its merges do not build every newline run).
    newline_runs_whole: bool,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    chat_template: String,
    chat_jinja: String,
    types: Vec<u8>,
    /// Token string -> first id with that string.
    vocab: HashMap<Box<str>, u32>,
    merges: MergeMap,
    added: AddedTokens,
    /// Byte-level: id of each byte's mapped char. SentencePiece: id of `<0xNN>`.
    byte_ids: [Option<u32>; 256],
    /// Bytes each token decodes to.
    pieces: Vec<Box<[u8]>>,
}

impl Tokenizer {
    /// Load a `.mlt` file. Errors are one line: "<path>: <problem>" (no panic, no
    /// allocation larger than the file).
    pub fn load(path: &Path) -> Result<Tokenizer, String> {
        Tokenizer::build(mlt::read(path)?).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parse a `.mlt` image; `name` prefixes error messages.
    pub fn from_bytes(bytes: &[u8], name: &str) -> Result<Tokenizer, String> {
        let raw = mlt::parse(bytes).map_err(|e| format!("{name}: {e}"))?;
        Tokenizer::build(raw).map_err(|e| format!("{name}: {e}"))
    }

    /// Derive the lookup tables from a structurally valid description (an
    /// `.mlt` file's, or one made from a GGUF file).
    pub fn build(raw: RawTokenizer) -> Result<Tokenizer, String> {
        let mut vocab: HashMap<Box<str>, u32> = HashMap::with_capacity(raw.tokens.len());
        for (id, t) in raw.tokens.iter().enumerate() {
            vocab.entry(t.as_str().into()).or_insert(id as u32);
        }
        let merges = merge_table(&raw.tokens, &raw.merges, &vocab)?;
        let byte_ids = match raw.kind {
            ModelKind::ByteLevel => byte_level_ids(&vocab),
            ModelKind::SentencePiece => byte_token_ids(&raw.tokens, &raw.types)?,
        };
        // control and unknown tokens are HF's special added tokens; user-defined ones are not
        let added = AddedTokens::new(raw.tokens.iter().zip(&raw.types).enumerate().filter_map(|(id, (t, &ty))| {
            let verbatim = matches!(ty, mlt::TYPE_CONTROL | mlt::TYPE_USER | mlt::TYPE_UNKNOWN);
            verbatim.then_some((t.as_str(), id as u32, ty != mlt::TYPE_USER))
        }));
        let pieces = decoded_pieces(raw.kind, &raw.tokens, &raw.types);
        Ok(Tokenizer {
            kind: raw.kind,
            flags: raw.flags,
            regex: pretok::compile(raw.pretok)?,
            newline_runs_whole: raw.pretok == mlt::PreTokenizer::Gemma4,
            bos: raw.bos,
            eos: raw.eos,
            eot: raw.eot,
            unk: raw.unk,
            pad: raw.pad,
            chat_template: raw.chat_template,
            chat_jinja: raw.chat_jinja,
            types: raw.types,
            vocab,
            merges,
            added,
            byte_ids,
            pieces,
        })
    }

    fn flag(&self, bit: u32) -> bool {
        self.flags & bit != 0
    }

    /// Encodes like HF `tokenizers` `encode(text, add_special_tokens=add_special)`:
    /// special/added tokens in `text` are matched verbatim; bos/eos added per the file's
    /// flags when `add_special`.
    pub fn encode(&self, text: &str, add_special: bool) -> Vec<u32> {
        self.encode_with_plain(text, &[], add_special)
    }

    /// `encode` of text that came from a user: special tokens written in it (`<|im_start|>`,
    /// `<s>`) are plain text, as HF does with `encode_special_tokens = True`; added tokens
    /// that are not special are still matched.
    pub fn encode_plain(&self, text: &str, add_special: bool) -> Vec<u32> {
        let whole = 0..text.len();
        self.encode_with_plain(text, std::slice::from_ref(&whole), add_special)
    }

    /// `encode`, with special tokens matched only outside the byte ranges `plain` (sorted,
    /// disjoint: the parts of a chat prompt that users wrote). Text on both sides of a
    /// range's edge is encoded together, as in the whole text.
    pub fn encode_with_plain(&self, text: &str, plain: &[std::ops::Range<usize>], add_special: bool) -> Vec<u32> {
        let mut out = Vec::new();
        if add_special && self.flag(mlt::FLAG_ADD_BOS) {
            out.extend(self.bos);
        }
        let mut scratch = Vec::new();
        self.added.split(text, plain, |seg| match seg {
            Segment::Token(id) => out.push(id),
            Segment::Text(run) => self.encode_run(run, &mut scratch, &mut out),
        });
        if add_special && self.flag(mlt::FLAG_ADD_EOS) {
            out.extend(self.eos);
        }
        out
    }

    /// Encode a run of text that contains no added tokens.
    fn encode_run(&self, run: &str, scratch: &mut Vec<u32>, out: &mut Vec<u32>) {
        let text = self.normalize(run);
        let ignore_merges = self.flag(mlt::FLAG_IGNORE_MERGES) && self.kind == ModelKind::ByteLevel;
        let byte_chars = pretok::byte_to_char();
        let mut mapped = String::new();
        pretok::split(&self.regex, &text, &mut |word| {
            if ignore_merges {
                mapped.clear();
                mapped.extend(word.bytes().map(|b| byte_chars[usize::from(b)]));
                if let Some(&id) = self.vocab.get(mapped.as_str()) {
                    out.push(id);
                    return;
                }
            }
            if self.newline_runs_whole && word.bytes().all(|b| b == b'\n') {
                if let Some(&id) = self.vocab.get(word) {
                    out.push(id);
                    return;
                }
            }
            scratch.clear();
            match self.kind {
                ModelKind::ByteLevel => self.byte_level_symbols(word, scratch),
                ModelKind::SentencePiece => self.char_symbols(word, scratch),
            }
            bpe::merge_word(scratch, &self.merges, out);
        });
    }

    /// Apply the prefix-space and metaspace normalisation to one run.
    fn normalize(&self, run: &str) -> String {
        let nfc;
        let run = if self.flag(mlt::FLAG_NFC) {
            nfc = run.nfc().collect::<String>();
            nfc.as_str()
        } else {
            run
        };
        let prefix = self.flag(mlt::FLAG_PREFIX_SPACE);
        match self.kind {
            ModelKind::ByteLevel if prefix && !run.starts_with(' ') => format!(" {run}"),
            ModelKind::ByteLevel => run.to_string(),
            ModelKind::SentencePiece => {
                let mut s = String::with_capacity(run.len() + 3);
                if prefix {
                    s.push(METASPACE);
                }
                if self.flag(mlt::FLAG_METASPACE) {
                    s.extend(run.chars().map(|c| if c == ' ' { METASPACE } else { c }));
                } else {
                    s.push_str(run);
                }
                s
            }
        }
    }

    /// Byte-level initial symbols: one per byte (the byte's mapped char). Bytes whose char
    /// is missing from the vocabulary become the unknown token (consecutive ones fused) or
    /// are dropped when there is none, as HF does.
    fn byte_level_symbols(&self, word: &str, out: &mut Vec<u32>) {
        let mut pending_unk = false;
        for &b in word.as_bytes() {
            match self.byte_ids[usize::from(b)] {
                Some(id) => {
                    self.flush_unk(&mut pending_unk, out);
                    out.push(id);
                }
                None => pending_unk = self.unk.is_some(),
            }
        }
        self.flush_unk(&mut pending_unk, out);
    }

    /// SentencePiece initial symbols: one per char if in the vocabulary, else its UTF-8 bytes
    /// as `<0xNN>` tokens (byte fallback), else the (fused) unknown token.
    fn char_symbols(&self, word: &str, out: &mut Vec<u32>) {
        let mut pending_unk = false;
        let mut buf = [0u8; 4];
        for c in word.chars() {
            let s = c.encode_utf8(&mut buf);
            if let Some(&id) = self.vocab.get(&*s) {
                self.flush_unk(&mut pending_unk, out);
                out.push(id);
                continue;
            }
            if self.flag(mlt::FLAG_BYTE_FALLBACK) {
                let ids: Option<Vec<u32>> = s.bytes().map(|b| self.byte_ids[usize::from(b)]).collect();
                if let Some(ids) = ids {
                    self.flush_unk(&mut pending_unk, out);
                    out.extend(ids);
                    continue;
                }
            }
            pending_unk = self.unk.is_some();
        }
        self.flush_unk(&mut pending_unk, out);
    }

    fn flush_unk(&self, pending: &mut bool, out: &mut Vec<u32>) {
        if std::mem::take(pending) {
            out.extend(self.unk);
        }
    }

    /// Strip the prefix space added at encode time (SentencePiece `Strip` decoder).
    pub fn strips_leading_space(&self) -> bool {
        self.kind == ModelKind::SentencePiece && self.flag(mlt::FLAG_PREFIX_SPACE)
    }

    /// Raw bytes of the decoded ids, like HF `decode(ids, skip_special_tokens=False)`
    /// (joined; may be invalid UTF-8 mid-stream). Ids outside the vocabulary are skipped.
    pub fn decode(&self, ids: &[u32]) -> Vec<u8> {
        let mut out = Vec::new();
        for &id in ids {
            if let Some(p) = self.pieces.get(id as usize) {
                out.extend_from_slice(p);
            }
        }
        if self.strips_leading_space() && out.first() == Some(&b' ') {
            out.remove(0);
        }
        out
    }

    /// Bytes of one token as emitted when streaming after `prev` (None = first token of
    /// the output); concatenating these equals `decode()`.
    pub fn decode_piece(&self, prev: Option<u32>, id: u32) -> Vec<u8> {
        let piece = self.pieces.get(id as usize).map_or(&[][..], |p| &p[..]);
        if prev.is_none() && self.strips_leading_space() && piece.first() == Some(&b' ') {
            return piece[1..].to_vec();
        }
        piece.to_vec()
    }

    /// The bytes token `id` decodes to after another token (empty outside
    /// the vocabulary).
    pub fn piece(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map_or(&[][..], |p| &p[..])
    }

    pub fn vocab_size(&self) -> usize {
        self.types.len()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    pub fn eot_id(&self) -> Option<u32> {
        self.eot
    }

    /// The ids that end an answer: EOS and end-of-turn. In the harmony format
    /// (gpt-oss) those are `<|return|>` and `<|call|>`, and never `<|end|>`, which
    /// ends one channel's message inside the answer (llama.cpp does the same).
    pub fn stop_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.eos.into_iter().chain(self.eot).collect();
        if self.chat_template == "harmony" {
            ids.extend(["<|return|>", "<|call|>"].iter().filter_map(|t| self.token_id(t)));
            ids.retain(|&id| Some(id) != self.token_id("<|end|>"));
        }
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Padding token from the file (informative).
    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }

    /// Exact vocabulary lookup of a token string (as stored in the file).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.get(text).copied()
    }

    /// Chat template kind name from the file (`chatml`, `gemma`, ...; may be empty).
    pub fn chat_template(&self) -> &str {
        &self.chat_template
    }

    /// The model's own chat template (Jinja source; empty if none).
    pub fn chat_jinja(&self) -> &str {
        &self.chat_jinja
    }

    /// A token's text (`bos_token`, `eos_token` in a template), empty for none.
    pub fn token_text(&self, id: Option<u32>) -> String {
        id.map_or(String::new(), |i| String::from_utf8_lossy(self.piece(i)).into_owned())
    }

    /// Whether encoding adds BOS.
    pub fn adds_bos(&self) -> bool {
        self.flag(mlt::FLAG_ADD_BOS) && self.bos.is_some()
    }

    pub fn is_control(&self, id: u32) -> bool {
        self.types.get(id as usize) == Some(&mlt::TYPE_CONTROL)
    }
}

/// Build pair -> (rank, merged id); the merged token must be in the vocabulary. A pair
/// listed twice keeps its last rank, like HF's map construction.
fn merge_table(tokens: &[String], merges: &[(u32, u32)], vocab: &HashMap<Box<str>, u32>) -> Result<MergeMap, String> {
    let mut table = MergeMap::with_capacity_and_hasher(merges.len(), Default::default());
    let mut joined = String::new();
    for (rank, &(a, b)) in merges.iter().enumerate() {
        joined.clear();
        joined.push_str(&tokens[a as usize]);
        joined.push_str(&tokens[b as usize]);
        let Some(&id) = vocab.get(joined.as_str()) else {
            return Err(format!("merge {rank} ({a}, {b}): {joined:?} is not in the vocabulary"));
        };
        table.insert(pair_key(a, b), (rank as u32, id));
    }
    Ok(table)
}

/// Byte-level BPE: vocabulary id of each byte's GPT-2 char.
fn byte_level_ids(vocab: &HashMap<Box<str>, u32>) -> [Option<u32>; 256] {
    let map = pretok::byte_to_char();
    let mut ids = [None; 256];
    let mut buf = [0u8; 4];
    for (b, c) in map.iter().enumerate() {
        ids[b] = vocab.get(&*c.encode_utf8(&mut buf)).copied();
    }
    ids
}

/// Parse a `<0xNN>` byte-token string.
fn byte_token_value(t: &str) -> Option<u8> {
    let hex = t.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// SentencePiece: ids of the `<0xNN>` byte tokens (type 3, which must parse).
fn byte_token_ids(tokens: &[String], types: &[u8]) -> Result<[Option<u32>; 256], String> {
    let mut ids = [None; 256];
    for (id, (t, &ty)) in tokens.iter().zip(types).enumerate() {
        if ty != mlt::TYPE_BYTE {
            continue;
        }
        let b = byte_token_value(t).ok_or_else(|| format!("token {id} {t:?} has type byte but is not <0xNN>"))?;
        ids[usize::from(b)].get_or_insert(id as u32);
    }
    Ok(ids)
}

/// The bytes every token decodes to (HF ByteLevel decoder, or Replace('▁', ' ') +
/// ByteFallback for SentencePiece).
fn decoded_pieces(kind: ModelKind, tokens: &[String], types: &[u8]) -> Vec<Box<[u8]>> {
    let inverse = pretok::char_to_byte();
    let byte_level = |t: &str| -> Box<[u8]> {
        let mapped: Option<Vec<u8>> = t.chars().map(|c| inverse.get(c as usize).copied().flatten()).collect();
        // HF keeps a token's raw UTF-8 when any char is outside the byte map.
        mapped.unwrap_or_else(|| t.as_bytes().to_vec()).into_boxed_slice()
    };
    tokens
        .iter()
        .zip(types)
        .map(|(t, &ty)| match kind {
            ModelKind::ByteLevel => byte_level(t),
            ModelKind::SentencePiece => match byte_token_value(t) {
                Some(b) if ty == mlt::TYPE_BYTE => Box::new([b]) as Box<[u8]>,
                _ => t.replace(METASPACE, " ").into_bytes().into_boxed_slice(),
            },
        })
        .collect()
}

#[cfg(test)]
mod tests;
