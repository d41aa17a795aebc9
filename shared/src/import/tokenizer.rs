//! The tokenizer inside a GGUF file as an `.mlt` description: byte-level
//! BPE (`tokenizer.ggml.model = gpt2`) with its `tokenizer.ggml.pre`
//! pre-tokenizer, SentencePiece BPE (`llama`) with merges derived from
//! the piece scores, or Gemma 4's SentencePiece-style BPE with listed merges (`gemma4`); the chat template kind from `tokenizer.chat_template`;
//! BOS, EOS and end-of-turn ids. `finish` is what every source's tokenizer
//! gets last (`tokenizer_json.rs` uses it too).

use std::collections::HashMap;

use crate::format::gguf::{Gguf, Value};
use crate::format::mlt::{
    ModelKind, PreTokenizer, RawTokenizer, FLAG_ADD_BOS, FLAG_ADD_EOS, FLAG_BYTE_FALLBACK, FLAG_IGNORE_MERGES,
    FLAG_METASPACE, FLAG_NFC, FLAG_PREFIX_SPACE, TYPE_BYTE, TYPE_CONTROL, TYPE_NORMAL, TYPE_UNKNOWN, TYPE_USER,
};

/// llama.cpp `tokenizer.ggml.pre` names → pre-tokenizer (byte-level BPE).
const PRE_NAMES: &[(&str, PreTokenizer)] = &[
    ("gpt-2", PreTokenizer::Gpt2),
    ("gpt2", PreTokenizer::Gpt2),
    ("smollm", PreTokenizer::Gpt2),
    ("olmo", PreTokenizer::Gpt2),
    ("mpt", PreTokenizer::Gpt2),
    ("llama3", PreTokenizer::Llama3),
    ("llama-v3", PreTokenizer::Llama3),
    ("llama-bpe", PreTokenizer::Llama3),
    ("qwen2", PreTokenizer::Qwen2),
    ("qwen35", PreTokenizer::Qwen35),
    ("gpt-4o", PreTokenizer::Gpt4o),
    ("starcoder", PreTokenizer::Starcoder),
    ("refact", PreTokenizer::Starcoder),
    ("command-r", PreTokenizer::Starcoder),
    ("falcon", PreTokenizer::Falcon),
    ("deepseek-coder", PreTokenizer::DeepseekCoder),
    ("deepseek-llm", PreTokenizer::DeepseekLlm),
];

/// GGUF token type → `.mlt` token type (5, unused: HF marks these special).
fn token_type(gguf: i64) -> u8 {
    match gguf {
        2 => TYPE_UNKNOWN,
        3 | 5 => TYPE_CONTROL,
        4 => TYPE_USER,
        6 => TYPE_BYTE,
        _ => TYPE_NORMAL,
    }
}

/// Chat template kinds, the tokens that mark each in a vocabulary, and its
/// end-of-turn token.
const TEMPLATE_TOKENS: &[(&str, [&str; 2], &str)] = &[
    ("harmony", ["<|channel|>", "<|return|>"], "<|return|>"),
    ("chatml", ["<|im_start|>", "<|im_end|>"], "<|im_end|>"),
    ("gemma", ["<start_of_turn>", "<end_of_turn>"], "<end_of_turn>"),
    ("llama3", ["<|start_header_id|>", "<|eot_id|>"], "<|eot_id|>"),
    ("phi3", ["<|assistant|>", "<|end|>"], "<|end|>"),
];

/// The chat template family of a jinja source ("" if unknown).
pub fn template_kind(jinja: &str) -> &'static str {
    if jinja.contains("<|channel|>") {
        "harmony"
    } else if jinja.contains("<|im_start|>") {
        "chatml"
    } else if jinja.contains("<start_of_turn>") {
        "gemma"
    } else if jinja.contains("<|start_header_id|>") {
        "llama3"
    } else if jinja.contains("[INST]") {
        if jinja.contains("<<SYS>>") {
            "llama2"
        } else {
            "mistral"
        }
    } else if jinja.contains("<|user|>") && jinja.contains("<|end|>") {
        "phi3"
    } else if jinja.contains("<|user|>") {
        "zephyr"
    } else {
        ""
    }
}

/// The GGUF file's tokenizer. Errors are one line naming the file.
pub fn import_tokenizer(g: &Gguf) -> Result<RawTokenizer, String> {
    read(g).map_err(|e| format!("{}: unsupported tokenizer: {e}", g.path))
}

fn read(g: &Gguf) -> Result<RawTokenizer, String> {
    let (Some(model), Some(tokens)) = (g.get("tokenizer.ggml.model"), g.get("tokenizer.ggml.tokens")) else {
        return Err("no tokenizer.ggml.model / tokenizer.ggml.tokens metadata".into());
    };
    let model = model.as_str().ok_or("tokenizer.ggml.model is not a string")?;
    let tokens: Vec<String> = tokens
        .as_array()
        .and_then(|a| a.strings())
        .ok_or("tokenizer.ggml.tokens is not an array of strings")?
        .map(str::to_string)
        .collect();
    let n = tokens.len();
    let numbers = |key: &str| -> Result<Option<Vec<Value>>, String> {
        let Some(v) = g.get(key) else { return Ok(None) };
        let a = v.as_array().ok_or_else(|| format!("{key} is not an array"))?;
        if a.len == 0 {
            return Ok(None);
        }
        if a.len != n {
            return Err(format!("{key} has {} entries for {n} tokens", a.len));
        }
        Ok(Some(a.iter().collect()))
    };
    let types: Vec<u8> = match numbers("tokenizer.ggml.token_type")? {
        Some(v) => v
            .iter()
            .map(|t| t.as_i64().map(token_type).ok_or("a token type is not an integer"))
            .collect::<Result<_, _>>()?,
        None => vec![TYPE_NORMAL; n],
    };
    let scores: Vec<f32> = match numbers("tokenizer.ggml.scores")? {
        Some(v) => {
            v.iter().map(|s| s.as_f64().map(|s| s as f32).ok_or("a score is not a number")).collect::<Result<_, _>>()?
        }
        None => vec![0.0; n],
    };
    let mut token_to_id: HashMap<&str, u32> = HashMap::with_capacity(n);
    for (i, t) in tokens.iter().enumerate() {
        token_to_id.entry(t).or_insert(i as u32);
    }
    let flag = |key: &str, default: bool| -> bool {
        match g.get(key) {
            Some(v) => v.as_bool().or(v.as_i64().map(|i| i != 0)).unwrap_or(true),
            None => default,
        }
    };

    let mut flags = 0;
    let (kind, pretok, merges) = match model {
        "gpt2" => {
            let pre_name = match g.get("tokenizer.ggml.pre") {
                Some(v) => v.as_str().ok_or("tokenizer.ggml.pre is not a string")?,
                None => "gpt-2",
            };
            let pre = PRE_NAMES
                .iter()
                .find(|(name, _)| *name == pre_name)
                .map(|&(_, p)| p)
                .ok_or_else(|| format!("tokenizer.ggml.pre {pre_name:?}"))?;
            // llama.cpp's Llama 3 tokenizer looks whole words up first (HF's
            // ignore_merges); Qwen2's applies NFC.
            flags |= match pre {
                PreTokenizer::Llama3 | PreTokenizer::Gpt4o => FLAG_IGNORE_MERGES,
                PreTokenizer::Qwen2 => FLAG_NFC,
                _ => 0,
            };
            let merges = merges_from_strings(g, &token_to_id)?;
            if flag("tokenizer.ggml.add_space_prefix", false) {
                flags |= FLAG_PREFIX_SPACE;
            }
            (ModelKind::ByteLevel, pre, merges)
        }
        "llama" => {
            flags |= FLAG_BYTE_FALLBACK | FLAG_METASPACE;
            if flag("tokenizer.ggml.add_space_prefix", true) {
                flags |= FLAG_PREFIX_SPACE;
            }
            (ModelKind::SentencePiece, PreTokenizer::None, spm_merges_from_scores(&tokens, &scores, &types))
        }
        // Gemma 4: SentencePiece-style BPE (U+2581 for spaces, `<0xNN>` byte fallback) with
        // listed merges, run over each line; llama.cpp always adds BOS for it
        "gemma4" => {
            flags |= FLAG_BYTE_FALLBACK | FLAG_METASPACE;
            (ModelKind::SentencePiece, PreTokenizer::Gemma4, merges_from_strings(g, &token_to_id)?)
        }
        other => return Err(format!("tokenizer.ggml.model {other:?} (only gpt2, llama and gemma4)")),
    };

    let id = |key: &str| -> Option<u32> {
        let v = g.get(key)?.as_i64()?;
        (0..n as i64).contains(&v).then_some(v as u32)
    };
    let (bos, eos) = (id("tokenizer.ggml.bos_token_id"), id("tokenizer.ggml.eos_token_id"));
    if (model == "gemma4" || flag("tokenizer.ggml.add_bos_token", model == "llama")) && bos.is_some() {
        flags |= FLAG_ADD_BOS;
    }
    if flag("tokenizer.ggml.add_eos_token", false) && eos.is_some() {
        flags |= FLAG_ADD_EOS;
    }
    let jinja = match g.get("tokenizer.chat_template") {
        Some(v) => v.as_str().ok_or("tokenizer.chat_template is not a string")?,
        None => "",
    };

    let raw = RawTokenizer {
        kind,
        pretok,
        flags,
        bos,
        eos,
        eot: id("tokenizer.ggml.eot_token_id"),
        unk: id("tokenizer.ggml.unknown_token_id"),
        pad: id("tokenizer.ggml.padding_token_id"),
        chat_template: String::new(),
        chat_jinja: String::new(),
        tokens,
        scores,
        types,
        merges,
    };
    Ok(finish(raw, jinja))
}

/// `tokenizer.ggml.merges` as id pairs: each entry is two tokens joined by a space, split at
/// the first space after the first char (as llama.cpp does, so a token may start with one).
fn merges_from_strings(g: &Gguf, token_to_id: &HashMap<&str, u32>) -> Result<Vec<(u32, u32)>, String> {
    let mut merges = Vec::new();
    let Some(v) = g.get("tokenizer.ggml.merges") else { return Ok(merges) };
    let list = v.as_array().and_then(|a| a.strings()).ok_or("tokenizer.ggml.merges is not an array of strings")?;
    for m in list {
        let first = m.chars().next().map_or(0, char::len_utf8);
        let at = m[first..].find(' ').map(|i| i + first).ok_or_else(|| format!("merge {m:?} is not two tokens"))?;
        match (token_to_id.get(&m[..at]), token_to_id.get(&m[at + 1..])) {
            (Some(&a), Some(&b)) => merges.push((a, b)),
            _ => return Err(format!("merge {m:?} uses a token not in the vocabulary")),
        }
    }
    Ok(merges)
}

/// What every source's tokenizer gets last: the chat template kind from
/// the template's text (from the vocabulary's turn tokens when there is
/// none), the end-of-turn id when the source names none (the kind's
/// end-of-turn token, else EOS), and the unknown token's type.
pub(super) fn finish(mut t: RawTokenizer, jinja: &str) -> RawTokenizer {
    let first_id = |tok: &str| t.tokens.iter().position(|x| x == tok).map(|i| i as u32);
    let mut chat = template_kind(jinja);
    if chat.is_empty() && jinja.is_empty() {
        chat = TEMPLATE_TOKENS
            .iter()
            .find(|(_, marks, _)| marks.iter().all(|m| first_id(m).is_some()))
            .map_or("", |(kind, _, _)| kind);
    }
    if t.eot.is_none() {
        let eot_token = TEMPLATE_TOKENS.iter().find(|(kind, _, _)| *kind == chat).map_or("", |(_, _, e)| e);
        t.eot = first_id(eot_token).or(t.eos);
    }
    if let Some(u) = t.unk {
        if t.types[u as usize] == TYPE_NORMAL {
            t.types[u as usize] = TYPE_UNKNOWN;
        }
    }
    t.chat_template = chat.to_string();
    t.chat_jinja = jinja.to_string();
    t
}

/// SentencePiece BPE as merges: every split of a normal or user piece into
/// two such pieces, the better-scored piece first (then by id): Hugging
/// Face's SentencePieceExtractor, as `convert_tokenizer.py` has it. A piece
/// that occurs twice counts with its last id.
pub(super) fn spm_merges_from_scores(tokens: &[String], scores: &[f32], types: &[u8]) -> Vec<(u32, u32)> {
    let mut mergeable: HashMap<&str, u32> = HashMap::new();
    for (i, t) in tokens.iter().enumerate() {
        if matches!(types[i], TYPE_NORMAL | TYPE_USER) {
            mergeable.insert(t, i as u32);
        }
    }
    // (−score, id, left, right), the score made totally ordered (−0 as 0,
    // NaN last) so that the sort is the same however the pieces are visited
    let key = |i: u32| {
        let s = -f64::from(scores[i as usize]);
        if s.is_nan() {
            f64::INFINITY
        } else {
            s + 0.0
        }
    };
    let mut found = Vec::new();
    for (&t, &i) in &mergeable {
        for (k, _) in t.char_indices().skip(1) {
            if let (Some(&a), Some(&b)) = (mergeable.get(&t[..k]), mergeable.get(&t[k..])) {
                found.push((key(i), i, a, b));
            }
        }
    }
    found.sort_by(|x, y| x.0.total_cmp(&y.0).then((x.1, x.2, x.3).cmp(&(y.1, y.2, y.3))));
    found.into_iter().map(|(_, _, a, b)| (a, b)).collect()
}
