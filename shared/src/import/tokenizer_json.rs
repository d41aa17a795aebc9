//! A Hugging Face `tokenizer.json` (with the `tokenizer_config.json` and
//! `chat_template.jinja` beside it, when they are there) as an `.mlt`
//! description. Two kinds of BPE are read: byte-level BPE (GPT-2's
//! ByteLevel regex, or a Split with Llama 3's or Qwen2's regex followed by
//! ByteLevel without its own), and SentencePiece-style BPE (U+2581 for
//! spaces, optional byte fallback and prefix space). Anything else
//! (Unigram, WordPiece, other regexes...) is refused in one line. Also
//! llama2.c's `tokenizer.bin`.

use std::path::Path;

use serde_json::Value;

use super::hf::{read_json_text, MAX_JSON};
use super::tokenizer::{finish, spm_merges_from_scores};
use crate::format::mlt::{
    ModelKind, PreTokenizer, RawTokenizer, FLAG_ADD_BOS, FLAG_ADD_EOS, FLAG_BYTE_FALLBACK, FLAG_IGNORE_MERGES,
    FLAG_METASPACE, FLAG_NFC, FLAG_PREFIX_SPACE, MAX_MERGES, MAX_TOKEN_LEN, MAX_VOCAB, TYPE_BYTE, TYPE_CONTROL,
    TYPE_NORMAL, TYPE_UNKNOWN, TYPE_USER,
};
use crate::tokenizer::pretok;

const METASPACE: &str = "\u{2581}";

/// The largest tokenizer.json read (Gemma 3's is 33 MiB).
const MAX_TOKENIZER_JSON: u64 = 256 << 20;

/// Whether a path names a tokenizer this module reads (by its name).
pub fn is_tokenizer_json(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "json")
}

/// `tokenizer.json` at `path`. Errors are one line naming the file.
pub fn import_tokenizer_json(path: &Path) -> Result<RawTokenizer, String> {
    let shown = path.display();
    let text = read_json_text(path, MAX_TOKENIZER_JSON)?;
    let j: Value = serde_json::from_str(&text).map_err(|e| format!("{shown}: cannot read tokenizer: {e}"))?;
    let (config, jinja) = sidecar(path)?;
    read(&j, &config, &jinja).map_err(|e| format!("{shown}: unsupported tokenizer: {e}"))
}

/// A tokenizer.json's text alone (no files beside it: the fuzz target).
pub fn import_tokenizer_json_text(text: &str) -> Result<RawTokenizer, String> {
    let j: Value = serde_json::from_str(text).map_err(|e| format!("cannot read tokenizer: {e}"))?;
    read(&j, &Value::Null, "").map_err(|e| format!("unsupported tokenizer: {e}"))
}

/// tokenizer_config.json and the chat template beside `path`.
fn sidecar(path: &Path) -> Result<(Value, String), String> {
    let config_path = path.with_file_name("tokenizer_config.json");
    let config: Value = if config_path.is_file() {
        serde_json::from_str(&read_json_text(&config_path, MAX_JSON)?)
            .map_err(|e| format!("{}: {e}", config_path.display()))?
    } else {
        Value::Null
    };
    // the default template: a string, or the one named "default" of a list (else the first)
    let mut jinja = match config.get("chat_template") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(list)) => {
            let named: Vec<(Option<&str>, Option<&str>)> = list
                .iter()
                .filter(|t| t.is_object())
                .map(|t| (t.get("name").and_then(Value::as_str), t.get("template").and_then(Value::as_str)))
                .collect();
            let default = named.iter().find(|(n, _)| *n == Some("default")).and_then(|(_, t)| *t);
            default.or(named.first().and_then(|(_, t)| *t)).unwrap_or("").to_string()
        }
        _ => String::new(),
    };
    let jinja_path = path.with_file_name("chat_template.jinja");
    if jinja.is_empty() && jinja_path.is_file() {
        jinja = read_json_text(&jinja_path, MAX_JSON)?;
    }
    Ok((config, jinja))
}

/// A normalizer, pre-tokenizer, decoder or post-processor as the list of
/// its parts (a `Sequence` flattened; serde_json's depth limit bounds the nesting).
fn components(node: Option<&Value>) -> Vec<&Value> {
    let Some(node) = node.filter(|n| n.is_object()) else { return Vec::new() };
    if node.get("type").and_then(Value::as_str) == Some("Sequence") {
        let parts = ["normalizers", "pretokenizers", "decoders", "processors"]
            .iter()
            .find_map(|k| node.get(*k).and_then(Value::as_array).filter(|a| !a.is_empty()));
        return parts.into_iter().flatten().flat_map(|p| components(Some(p))).collect();
    }
    vec![node]
}

fn type_of(node: &Value) -> &str {
    node.get("type").and_then(Value::as_str).unwrap_or("")
}

/// A node's `pattern`: (its text, whether it is a regex).
fn pattern_of(node: &Value) -> (Option<&str>, bool) {
    let p = node.get("pattern");
    match (p.and_then(|p| p.get("Regex")), p.and_then(|p| p.get("String"))) {
        (Some(r), _) => (r.as_str(), true),
        (None, Some(s)) => (s.as_str(), false),
        _ => (None, false),
    }
}

fn flag(node: &Value, key: &str, default: bool) -> bool {
    node.get(key).and_then(Value::as_bool).unwrap_or(default)
}

/// The pre-tokenizer and add_prefix_space of a byte-level BPE.
fn byte_level(pres: &[&Value]) -> Result<(PreTokenizer, bool), String> {
    let types: Vec<&str> = pres.iter().map(|p| type_of(p)).collect();
    match types[..] {
        ["ByteLevel"] => {
            let pre = if flag(pres[0], "use_regex", true) { PreTokenizer::Gpt2 } else { PreTokenizer::None };
            Ok((pre, flag(pres[0], "add_prefix_space", false)))
        }
        ["Split", "ByteLevel"] => {
            let (split, bl) = (pres[0], pres[1]);
            if flag(bl, "use_regex", true) {
                return Err("Split followed by ByteLevel(use_regex=true) pre-tokenizer".into());
            }
            let pre = match pattern_of(split) {
                (Some(pretok::LLAMA3), true) => PreTokenizer::Llama3,
                (Some(pretok::QWEN2), true) => PreTokenizer::Qwen2,
                (Some(pretok::QWEN35), true) => PreTokenizer::Qwen35,
                (Some(pretok::GPT4O), true) => PreTokenizer::Gpt4o,
                (Some(pretok::GPT2), true) => PreTokenizer::Gpt2,
                (p, _) => return Err(format!("pre-tokenizer regex {:?} is not gpt2/llama3/qwen2", p.unwrap_or(""))),
            };
            if split.get("behavior").and_then(Value::as_str) != Some("Isolated") || flag(split, "invert", false) {
                return Err("Split pre-tokenizer must be behavior=Isolated, invert=false".into());
            }
            Ok((pre, flag(bl, "add_prefix_space", false)))
        }
        _ => Err(format!("byte-level pre-tokenizer sequence {types:?}")),
    }
}

/// (add_prefix_space, space_to_metaspace) of a SentencePiece-style BPE.
fn spm_flags(norms: &[&Value], pres: &[&Value]) -> Result<(bool, bool), String> {
    let (mut prefix, mut metaspace) = (false, false);
    for n in norms {
        match type_of(n) {
            "Replace" if pattern_of(n) == (Some(" "), false) && n.get("content") == Some(&METASPACE.into()) => {
                metaspace = true
            }
            "Prepend" if n.get("prepend") == Some(&METASPACE.into()) => prefix = true,
            "NFC" => eprintln!("warning: the tokenizer's NFC normalizer is not applied (exact only for NFC input)"),
            t => return Err(format!("normalizer {t:?}")),
        }
    }
    for p in pres {
        match type_of(p) {
            "Metaspace" => {
                if flag(p, "split", true) {
                    return Err("Metaspace pre-tokenizer with split=true".into());
                }
                metaspace = true;
                let default = if flag(p, "add_prefix_space", true) { "always" } else { "never" };
                let scheme = p.get("prepend_scheme").and_then(Value::as_str).unwrap_or(default);
                prefix = scheme != "never";
            }
            // splits on ' ' after ' ' → U+2581: never matches (Gemma 3)
            "Split" if pattern_of(p) == (Some(" "), false) && metaspace => {}
            t => return Err(format!("pre-tokenizer {t:?} for a SentencePiece-style BPE")),
        }
    }
    if !metaspace {
        return Err("SentencePiece-style BPE without ' ' -> U+2581 normalisation".into());
    }
    Ok((prefix, metaspace))
}

fn is_spm_decoder(decoders: &[&Value]) -> bool {
    decoders.iter().any(|d| {
        type_of(d) == "Metaspace"
            || (type_of(d) == "Replace"
                && pattern_of(d) == (Some(METASPACE), false)
                && d.get("content").and_then(Value::as_str) == Some(" "))
    })
}

/// (bos, eos) the post-processor's single template adds.
fn template_specials(
    post: Option<&Value>,
    id_of: &dyn Fn(&str) -> Option<u32>,
) -> Result<(Option<u32>, Option<u32>), String> {
    let (mut bos, mut eos) = (None, None);
    for proc in components(post) {
        match type_of(proc) {
            "ByteLevel" => continue,
            "TemplateProcessing" => {}
            t => return Err(format!("post-processor {t:?}")),
        }
        let mut seen_a = false;
        for item in proc.get("single").and_then(Value::as_array).into_iter().flatten() {
            if item.get("Sequence").is_some() {
                seen_a = true;
                continue;
            }
            let tok = item
                .get("SpecialToken")
                .and_then(|s| s.get("id"))
                .and_then(Value::as_str)
                .ok_or("a template item that is neither a sequence nor a special token")?;
            let listed = proc.get("special_tokens").and_then(|s| s.get(tok)).and_then(|s| s.get("ids"));
            let ids: Vec<Option<u32>> = match listed.and_then(Value::as_array).filter(|a| !a.is_empty()) {
                Some(ids) => ids.iter().map(|i| i.as_u64().and_then(|i| u32::try_from(i).ok())).collect(),
                None => vec![id_of(tok)],
            };
            let [Some(id)] = ids[..] else {
                return Err(format!("template special token {tok:?} with ids {ids:?}"));
            };
            if seen_a {
                eos = Some(id);
            } else {
                bos = Some(id);
            }
        }
    }
    Ok((bos, eos))
}

/// A token named in tokenizer_config.json (a string or `{"content": ...}`).
fn config_token<'a>(config: &'a Value, key: &str) -> Option<&'a str> {
    let v = config.get(key)?;
    v.get("content").unwrap_or(v).as_str()
}

/// `<0xAB>`: a SentencePiece byte piece.
fn is_byte_piece(t: &str) -> bool {
    let b = t.as_bytes();
    b.len() == 6 && t.starts_with("<0x") && t.ends_with('>') && b[3..5].iter().all(u8::is_ascii_hexdigit)
}

fn read(j: &Value, config: &Value, jinja: &str) -> Result<RawTokenizer, String> {
    let model = j.get("model").filter(|m| m.is_object()).ok_or("no model")?;
    let model_type = model.get("type").and_then(Value::as_str).unwrap_or("BPE");
    if model_type != "BPE" || model.get("merges").is_none() {
        return Err(format!("model type {model_type} (only BPE)"));
    }
    if model.get("dropout").is_some_and(|d| !d.is_null() && d.as_f64() != Some(0.0)) {
        return Err("BPE dropout".into());
    }
    let set = |k: &str| model.get(k).and_then(Value::as_str).is_some_and(|s| !s.is_empty());
    if set("continuing_subword_prefix") || set("end_of_word_suffix") {
        return Err("BPE continuing_subword_prefix / end_of_word_suffix".into());
    }

    // the vocabulary, then the added tokens over it
    let vocab = model.get("vocab").and_then(Value::as_object).ok_or("model.vocab is not an object")?;
    let added: &[Value] = j.get("added_tokens").and_then(Value::as_array).map_or(&[], |a| a.as_slice());
    let id = |v: &Value| -> Result<usize, String> {
        v.as_u64()
            .filter(|&i| i < u64::from(MAX_VOCAB))
            .map(|i| i as usize)
            .ok_or_else(|| format!("token id {v} is not an integer below {MAX_VOCAB}"))
    };
    let mut n = 0;
    for v in vocab.values() {
        n = n.max(id(v)? + 1);
    }
    for a in added {
        n = n.max(id(a.get("id").unwrap_or(&Value::Null))? + 1);
    }
    if n > vocab.len() + added.len() {
        // (before allocating for ids the file does not have)
        return Err(format!("vocabulary has holes (ids up to {}, {} entries)", n - 1, vocab.len() + added.len()));
    }
    let mut tokens: Vec<Option<String>> = vec![None; n];
    let mut types = vec![TYPE_NORMAL; n];
    for (t, v) in vocab {
        tokens[id(v)?] = Some(t.clone());
    }
    for a in added {
        let i = id(&a["id"])?;
        let content = a.get("content").and_then(Value::as_str).ok_or("an added token without content")?;
        tokens[i] = Some(content.to_string());
        types[i] = if flag(a, "special", false) { TYPE_CONTROL } else { TYPE_USER };
    }
    let tokens: Vec<String> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.ok_or_else(|| format!("vocabulary has holes (e.g. id {i})")))
        .collect::<Result<_, _>>()?;
    if let Some(t) = tokens.iter().find(|t| t.len() > MAX_TOKEN_LEN as usize) {
        return Err(format!("a token of {} bytes exceeds the format limit", t.len()));
    }
    let mut token_to_id = std::collections::HashMap::with_capacity(n);
    for (i, t) in tokens.iter().enumerate() {
        token_to_id.entry(t.as_str()).or_insert(i as u32);
    }
    let id_of = |t: &str| token_to_id.get(t).copied();

    let norms = components(j.get("normalizer"));
    let pres = components(j.get("pre_tokenizer"));
    let decoders = components(j.get("decoder"));
    let mut flags = 0;
    let byte_level_parts = decoders.iter().chain(&pres).any(|d| type_of(d) == "ByteLevel");
    let (kind, pretok) = if byte_level_parts {
        if !norms.is_empty() {
            let names: Vec<&str> = norms.iter().map(|n| type_of(n)).collect();
            if names != ["NFC"] {
                return Err(format!("normalizer {names:?} with byte-level BPE"));
            }
            flags |= FLAG_NFC;
        }
        let (pre, prefix) = byte_level(&pres)?;
        if prefix {
            flags |= FLAG_PREFIX_SPACE;
        }
        (ModelKind::ByteLevel, pre)
    } else if is_spm_decoder(&decoders) || pres.iter().any(|p| type_of(p) == "Metaspace") {
        let (prefix, metaspace) = spm_flags(&norms, &pres)?;
        flags |= if prefix { FLAG_PREFIX_SPACE } else { 0 } | if metaspace { FLAG_METASPACE } else { 0 };
        (ModelKind::SentencePiece, PreTokenizer::None)
    } else {
        return Err("neither byte-level nor SentencePiece-style BPE".into());
    };
    if flag(model, "byte_fallback", false) {
        flags |= FLAG_BYTE_FALLBACK;
    }
    if flag(model, "ignore_merges", false) {
        flags |= FLAG_IGNORE_MERGES;
    }
    if kind == ModelKind::SentencePiece {
        for (t, ty) in tokens.iter().zip(types.iter_mut()) {
            if *ty == TYPE_NORMAL && is_byte_piece(t) {
                *ty = TYPE_BYTE;
            }
        }
    }
    let mut unk = model.get("unk_token").and_then(Value::as_str).filter(|u| !u.is_empty()).and_then(id_of);
    if let Some(u) = unk {
        types[u as usize] = TYPE_UNKNOWN;
    }

    let listed = model.get("merges").and_then(Value::as_array).ok_or("model.merges is not a list")?;
    if listed.len() > MAX_MERGES as usize {
        return Err(format!("{} merges exceed the format limit", listed.len()));
    }
    let mut merges = Vec::with_capacity(listed.len());
    for m in listed {
        let (a, b) = match m {
            Value::String(s) => s.split_once(' ').ok_or_else(|| format!("merge {s:?} has no space"))?,
            Value::Array(pair) => match &pair[..] {
                [Value::String(a), Value::String(b)] => (a.as_str(), b.as_str()),
                _ => return Err(format!("merge {m} is not two strings")),
            },
            _ => return Err(format!("merge {m} is neither a string nor a pair")),
        };
        match (id_of(a), id_of(b)) {
            (Some(a), Some(b)) => merges.push((a, b)),
            _ => return Err(format!("merge {a:?} {b:?} uses a token not in the vocabulary")),
        }
    }

    let (bos_t, eos_t) = template_specials(j.get("post_processor"), &id_of)?;
    let bos = bos_t.or_else(|| config_token(config, "bos_token").and_then(id_of));
    let eos = eos_t.or_else(|| config_token(config, "eos_token").and_then(id_of));
    if bos_t.is_some() {
        flags |= FLAG_ADD_BOS;
    }
    if eos_t.is_some() {
        flags |= FLAG_ADD_EOS;
    }
    let pad = config_token(config, "pad_token").and_then(id_of);
    if unk.is_none() {
        unk = config_token(config, "unk_token").and_then(id_of);
    }
    let scores = vec![0.0; tokens.len()];
    Ok(finish(
        RawTokenizer {
            kind,
            pretok,
            flags,
            bos,
            eos,
            eot: None,
            unk,
            pad,
            chat_template: String::new(),
            chat_jinja: String::new(),
            tokens,
            scores,
            types,
            merges,
        },
        jinja,
    ))
}

/// llama2.c's `tokenizer.bin`: i32 max_token_length, then per token an f32
/// score, an i32 length and the bytes. Its exporter writes SentencePiece
/// pieces with U+2581 as a space and BOS/EOS as "\n<s>\n" / "\n</s>\n";
/// ids 0, 1, 2 are <unk>, <s>, </s> (Llama 2).
pub fn import_tokenizer_bin(path: &Path) -> Result<RawTokenizer, String> {
    let shown = path.display();
    let data = std::fs::read(path).map_err(|e| format!("{shown}: cannot read: {e}"))?;
    read_bin(&data).map_err(|e| format!("{shown}: unsupported tokenizer: {e}"))
}

pub fn read_bin(data: &[u8]) -> Result<RawTokenizer, String> {
    let i32_at = |at: usize| data.get(at..at + 4).map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")));
    let max_len = i32_at(0).ok_or("truncated tokenizer.bin header")?;
    if !(1..=65536).contains(&max_len) {
        return Err(format!("tokenizer.bin max_token_length {max_len} is out of range"));
    }
    let (mut pos, mut tokens, mut scores) = (4, Vec::new(), Vec::new());
    while pos < data.len() {
        let (Some(score), Some(n)) = (i32_at(pos), i32_at(pos + 4)) else {
            return Err(format!("tokenizer.bin is truncated in token {}", tokens.len()));
        };
        pos += 8;
        let n = usize::try_from(n).ok().filter(|&n| n <= max_len as usize && pos + n <= data.len());
        let n = n.ok_or_else(|| format!("tokenizer.bin token {} has a bad length", tokens.len()))?;
        let text = std::str::from_utf8(&data[pos..pos + n])
            .map_err(|_| format!("tokenizer.bin token {} is not UTF-8", tokens.len()))?;
        tokens.push(text.replace(' ', METASPACE));
        scores.push(f32::from_bits(score as u32));
        pos += n;
    }
    if tokens.len() < 3 || tokens.len() > MAX_VOCAB as usize {
        return Err(format!("tokenizer.bin has {} tokens", tokens.len()));
    }
    tokens[1] = tokens[1].trim_matches('\n').to_string();
    tokens[2] = tokens[2].trim_matches('\n').to_string();
    let mut types = vec![TYPE_NORMAL; tokens.len()];
    types[..3].copy_from_slice(&[TYPE_UNKNOWN, TYPE_CONTROL, TYPE_CONTROL]);
    for (t, ty) in tokens.iter().zip(types.iter_mut()) {
        if is_byte_piece(t) {
            *ty = TYPE_BYTE;
        }
    }
    let merges = spm_merges_from_scores(&tokens, &scores, &types);
    let flags = FLAG_BYTE_FALLBACK | FLAG_METASPACE | FLAG_PREFIX_SPACE | FLAG_ADD_BOS;
    let raw = RawTokenizer {
        kind: ModelKind::SentencePiece,
        pretok: PreTokenizer::None,
        flags,
        bos: Some(1),
        eos: Some(2),
        eot: None,
        unk: Some(0),
        pad: None,
        chat_template: String::new(),
        chat_jinja: String::new(),
        tokens,
        scores,
        types,
        merges,
    };
    Ok(finish(raw, ""))
}
