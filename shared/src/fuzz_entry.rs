//! Entry points of the fuzz targets (`tests/fuzz/`, `cargo xtask fuzz`):
//! one function per target, feeding arbitrary bytes to one input edge and,
//! when it accepts them, to what a run does next with the result. Each
//! returns normally for any input; a panic, an abort or an allocation
//! beyond the fuzzer's limit is a bug.

use crate::app::escape_line;
use crate::app::server::{fields, http, request};
use crate::format::gguf::Gguf;
use crate::format::mlb::Mlb;
use crate::format::mlt;
use crate::grammar::{gbnf, schema, Constraint, Grammar, Vocab};
use crate::import::{gguf::import_model, tokenizer::import_tokenizer, ConvertType, ImportOptions};
use crate::model::Config;
use crate::tokenizer::Tokenizer;

/// The text encoded and decoded by a tokenizer that builds.
const SAMPLE: &str = "Hello, world! 1234 héllo 😀 <|im_start|>\n  x";

/// An error as the program prints it (`app::escape_line`) is one line
/// without control characters, whatever file content it names.
fn one_line(e: &str) {
    assert!(!escape_line(e).contains(char::is_control), "error message not escaped: {e:?}");
}

/// Encodes and decodes `SAMPLE`; every id is in the vocabulary.
fn exercise(tok: &Tokenizer) {
    for add_special in [false, true] {
        let ids = tok.encode(SAMPLE, add_special);
        assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size()), "id outside the vocabulary");
        let _ = tok.decode(&ids);
        let mut prev = None;
        for &id in &ids {
            let _ = tok.decode_piece(prev, id);
            prev = Some(id);
        }
    }
}

/// An `.mlb` file, then the model configuration a load derives from it
/// and, when it is valid, the weights' load (shapes checked against it,
/// matrices repacked, or used in place or de-interleaved from their
/// stored eight-row groups).
pub fn mlb(data: &[u8]) {
    match Mlb::from_bytes(data.to_vec(), "fuzz.mlb") {
        Ok(f) => match Config::from_mlb(&f) {
            Ok(_) => {
                if let Err(e) = crate::model::Model::from_mlb(std::sync::Arc::new(f), Default::default()) {
                    one_line(&e);
                }
            }
            Err(e) => one_line(&e),
        },
        Err(e) => one_line(&e),
    }
}

/// An `.mlt` file, then the tokenizer built from it, encoding and decoding.
pub fn mlt(data: &[u8]) {
    let raw = match mlt::parse(data) {
        Ok(raw) => raw,
        Err(e) => return one_line(&e),
    };
    match Tokenizer::build(raw) {
        Ok(tok) => exercise(&tok),
        Err(e) => one_line(&e),
    }
}

/// A GGUF file, then its tokenizer and its model import (tensors converted
/// in memory: bounded by a small multiple of the file's size), the
/// configuration of the imported model, the model loaded and one token run
/// through it.
pub fn gguf(data: &[u8]) {
    let g = match Gguf::from_bytes(data.to_vec(), "fuzz.gguf") {
        Ok(g) => g,
        Err(e) => return one_line(&e),
    };
    match import_tokenizer(&g).and_then(Tokenizer::build) {
        Ok(tok) => exercise(&tok),
        Err(e) => one_line(&e),
    }
    match import_model(g, &ImportOptions::new(ConvertType::Auto)) {
        Ok(m) => match Config::from_mlb(&m) {
            // the model loaded, and one token through it (a router's choice
            // over garbage weights, NaN activations): an error or logits, never a panic
            Ok(_) => match crate::model::Model::from_mlb(std::sync::Arc::new(m), Default::default()) {
                Ok(model) => match crate::model::State::new(&model.config, 4) {
                    Ok(mut st) => {
                        if let Err(e) = model.forward(&mut st, &[0], crate::model::LogitsFor::Last) {
                            one_line(&e);
                        }
                    }
                    Err(e) => one_line(e.message()),
                },
                Err(e) => one_line(&e),
            },
            Err(e) => one_line(&e),
        },
        Err(e) => one_line(e.message()),
    }
}

/// A chat template (a model file's `tokenizer.chat_template`, or
/// `--chat-template-file`): compiled, then rendered as a request would be,
/// on a thread with a server connection's 2 MiB stack (a conversation
/// with a control token, a tool, a call and its result).
pub fn chat_template(data: &[u8]) {
    use crate::chat::{JinjaTemplate, Message, RenderOptions, Role, Tool, ToolCall};
    let Ok(source) = std::str::from_utf8(data) else { return };
    let t = match JinjaTemplate::new(source, "<s>", "</s>") {
        Ok(t) => t,
        Err(e) => return one_line(&e),
    };
    let f = serde_json::json!({"name": "f", "description": "d <|x|>", "parameters": {"type": "object"}});
    let tools = [Tool { name: "f".into(), function: f.as_object().cloned().unwrap_or_default() }];
    let mut call = Message::new(Role::Assistant, "");
    call.tool_calls = vec![ToolCall { id: "c1".into(), name: "f".into(), arguments: r#"{"a": [1, "<s>"]}"#.into() }];
    let mut result = Message::new(Role::Tool, "ok");
    result.tool_call_id = "c1".into();
    let conv = [Message::new(Role::System, " S "), Message::new(Role::User, "u <|im_end|> [INST]"), call, result];
    let options = RenderOptions { add_generation_prompt: true, kwargs: Default::default() };
    let rendered = std::thread::scope(|s| {
        std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn_scoped(s, || t.render(&conv, &tools, &options, true))
            .expect("a thread")
            .join()
            .expect("rendering does not panic")
    });
    match rendered {
        Ok(p) => assert!(p.plain_ranges().iter().all(|r| r.end <= p.as_str().len()), "plain range outside the text"),
        Err(e) => one_line(&e),
    }
}

/// Bytes a client sent before closing: the HTTP head, its framing and the body.
pub fn http_head(data: &[u8]) {
    const MAX_BODY: usize = 1 << 12;
    if let Ok(req) = http::parse_request(data, MAX_BODY) {
        assert!(req.body.len() <= MAX_BODY, "body beyond the limit");
        let _ = req.header("content-length");
    }
}

/// A request body of the API: the JSON object, then the request of both endpoints.
pub fn json_request(data: &[u8]) {
    if let Ok(obj) = fields::parse_object(data) {
        for chat in [false, true] {
            let server = request::ServerDefaults { seed: 7, timeout: None, received: std::time::Instant::now() };
            let _ = request::parse_request(&obj, chat, &server);
        }
    }
}

/// A JSON Schema: the grammar compiled from it, then its masks and matching
/// (`grammar_run`).
pub fn json_schema(data: &[u8]) {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
        match schema::compile(&v) {
            Ok(g) => grammar_run(g, data),
            Err(e) => one_line(&e),
        }
    }
}

/// A GBNF grammar: compiled, then its masks and matching (`grammar_run`).
pub fn gbnf(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match gbnf::compile(text) {
        Ok(g) => grammar_run(g, data),
        Err(e) => one_line(&e),
    }
}

/// A constrained output over a small vocabulary (every byte below 128, a
/// few longer pieces): the mask, then the input's own bytes token by token
/// while the grammar takes them, each taken token allowed by the mask
/// before it.
fn grammar_run(g: Grammar, data: &[u8]) {
    let mut pieces: Vec<Box<[u8]>> = (0u8..128).map(|b| vec![b].into_boxed_slice()).collect();
    for p in ["{\"", "\":", "\",\"", " \"", "true", "[1", "é", "\u{1F600}"] {
        pieces.push(p.as_bytes().into());
    }
    let vocab = std::sync::Arc::new(Vocab::from_pieces(pieces, true));
    let mut c = Constraint::new(std::sync::Arc::new(g), vocab);
    for &b in data.iter().take(256) {
        let mask = c.mask();
        let id = u32::from(b.min(127));
        if !c.accept(id) {
            assert!(!crate::grammar::allowed(&mask, id), "the mask allows a token the grammar refuses");
            break;
        }
        assert!(crate::grammar::allowed(&mask, id), "the mask refuses a token the grammar takes");
    }
}

/// The most bytes `scaled` builds: far beyond any nesting limit, and enough
/// that a parser quadratic in its input takes seconds where a linear one
/// takes milliseconds.
const SCALED_MAX: usize = 256 << 10;

/// A short input scaled up, for the parsers of request text: the bytes are
/// `kind, n (u16), |P|, P, |A|, A, |M|, M, |C|, C, S` and the text is
/// P A^n M C^n S (at most `SCALED_MAX` bytes), so that a few bytes make
/// nesting thousands deep (`(`^n … `)`^n) or a long run of one construct (a
/// literal of n CJK characters). `kind` picks the parser: a GBNF grammar, a
/// JSON Schema (its JSON text), a schema `pattern`, or an API request body.
/// It runs on a thread with a server connection's stack (2 MiB), where a
/// parser that recursed once per nesting level would overflow; `cargo xtask
/// fuzz` gives this target three seconds per input, so a parser that is not
/// linear in its input fails it too.
pub fn scaled(data: &[u8]) {
    let Some((&kind, rest)) = data.split_first() else { return };
    let Some(text) = scale(rest) else { return };
    let run = move || match kind % 4 {
        0 => {
            if let Ok(text) = std::str::from_utf8(&text) {
                if let Err(e) = gbnf::compile(text) {
                    one_line(&e);
                }
            }
        }
        1 => {
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&text) {
                if let Err(e) = schema::compile(&v) {
                    one_line(&e);
                }
            }
        }
        2 => {
            let pattern = String::from_utf8_lossy(&text).into_owned();
            if let Err(e) = schema::compile(&serde_json::json!({"type": "string", "pattern": pattern})) {
                one_line(&e);
            }
        }
        _ => json_request(&text),
    };
    let thread = std::thread::Builder::new().stack_size(2 << 20).spawn(run).expect("a thread");
    if let Err(panic) = thread.join() {
        std::panic::resume_unwind(panic);
    }
}

/// `scaled`'s text: P A^n M C^n S from `n (u16), |P|, P, |A|, A, |M|, M, |C|, C, S`.
fn scale(data: &[u8]) -> Option<Vec<u8>> {
    let (n, mut rest) = (usize::from(u16::from_le_bytes([*data.first()?, *data.get(1)?])), &data[2..]);
    let mut part = || -> Option<&[u8]> {
        let (&len, after) = rest.split_first()?;
        let (p, after) = after.split_at_checked(usize::from(len))?;
        rest = after;
        Some(p)
    };
    let (p, a, m, c) = (part()?, part()?, part()?, part()?);
    let s = rest;
    let fixed = p.len() + m.len() + s.len();
    let per = a.len() + c.len();
    let n = SCALED_MAX.saturating_sub(fixed).checked_div(per).map_or(0, |most| n.min(most));
    let mut text = Vec::with_capacity(fixed + n * per);
    text.extend_from_slice(p);
    (0..n).for_each(|_| text.extend_from_slice(a));
    text.extend_from_slice(m);
    (0..n).for_each(|_| text.extend_from_slice(c));
    text.extend_from_slice(s);
    Some(text)
}

/// An importance matrix (`--imatrix`): when it parses, it writes back to the
/// same bytes, and every entry's weights drive a fitted Q4_0 quantisation of
/// a row of its width (finite blocks, never worse than the max rule's error
/// weighted the same way is checked by the unit tests).
pub fn imatrix(data: &[u8]) {
    match crate::import::imatrix::Imatrix::from_bytes(data) {
        Ok(m) => {
            assert_eq!(m.to_bytes(), data, "an importance matrix does not write back to its bytes");
            for (name, (_, w)) in m.entries.iter().take(4) {
                let cols = w.len() / crate::quant::QK * crate::quant::QK;
                if cols == 0 || cols > 1 << 16 {
                    continue;
                }
                let x: Vec<f32> = (0..cols).map(|i| ((i * 7919) % 23) as f32 - 11.0).collect();
                let mut out = vec![crate::quant::BlockQ4_0::default(); cols / crate::quant::QK];
                let weights = m.weights(name, w.len()).map(|w| &w[..cols]);
                crate::import::quantize::quantize_q4_0(
                    &x,
                    cols,
                    crate::import::quantize::Q4Rule::Fit,
                    weights,
                    &mut out,
                );
            }
        }
        Err(e) => one_line(&e),
    }
}

/// The readers of the formats other than GGUF that a model is imported
/// from, chosen by the first byte: a config.json (and, when it parses, the
/// metadata's layer pattern), a `.safetensors` file, a `tokenizer.json`
/// (then the tokenizer built from it), llama2.c's `tokenizer.bin`, or a
/// llama2.c checkpoint (then its import as Q8_0 and the model's config).
pub fn import_sources(data: &[u8]) {
    use crate::format::mlb::Bytes;
    use crate::format::safetensors::SafetensorsFile;
    use crate::import::{hf_config, llama2c::Llama2c, tokenizer_json};
    let Some((&which, rest)) = data.split_first() else { return };
    let text = String::from_utf8_lossy(rest);
    let built = |raw: Result<mlt::RawTokenizer, String>| match raw.and_then(Tokenizer::build) {
        Ok(t) => exercise(&t),
        Err(e) => one_line(&e),
    };
    match which % 5 {
        0 => {
            if let Err(e) = hf_config::parse(&text) {
                one_line(&e)
            }
        }
        1 => {
            if let Err(e) = SafetensorsFile::from_bytes(rest.to_vec(), "fuzz.safetensors").tensors() {
                one_line(&e)
            }
        }
        2 => built(tokenizer_json::import_tokenizer_json_text(&text)),
        3 => built(tokenizer_json::read_bin(rest)),
        _ => match Llama2c::parse(Bytes::Owned(rest.to_vec()), "fuzz.bin".into()) {
            Ok(m) => match m.import(&ImportOptions::new(ConvertType::Q8_0)) {
                Ok(mlb) => {
                    if let Err(e) = Config::from_mlb(&mlb) {
                        one_line(&e)
                    }
                }
                Err(e) => one_line(&e.to_string()),
            },
            Err(e) => one_line(&e),
        },
    }
}

#[cfg(test)]
mod tests {
    /// `scaled` builds P A^n M C^n S, within its limit.
    #[test]
    fn scaled_inputs_are_built_as_described() {
        let input = |n: u16, parts: [&[u8]; 4], s: &[u8]| {
            let mut v = n.to_le_bytes().to_vec();
            for p in parts {
                v.push(p.len() as u8);
                v.extend_from_slice(p);
            }
            v.extend_from_slice(s);
            v
        };
        assert_eq!(super::scale(&input(3, [b"r=", b"(", b"a", b")"], b"!")).unwrap(), b"r=(((a)))!");
        let big = super::scale(&input(u16::MAX, [b"", b"abcdefg", b"", b"z"], b"")).unwrap();
        assert_eq!(big.len(), super::SCALED_MAX);
        assert!(super::scale(&[1]).is_none() && super::scale(&input(2, [b"", b"", b"", b""], b"")).is_some());
        // the findings of issue 32 as inputs of this shape fail cleanly and quickly
        let started = std::time::Instant::now();
        for (kind, n, parts, s) in [
            (0u8, 10_000, [&b"root ::= "[..], b"(", b"\"a\"", b")"], &b""[..]),
            (0, 60_000, [b"root ::= \"", "語".as_bytes(), b"", b""], b"\""),
            (2, 3_000, [b"^", b"(", b"a", b")"], b"$"),
            (1, 3_000, [b"", b"{\"anyOf\": [", b"{}", b"]}"], b""),
            (3, 50_000, [b"{\"messages\": ", b"[", b"", b"]"], b"}"),
        ] {
            let mut data = vec![kind];
            data.extend(input(n, parts, s));
            super::scaled(&data);
        }
        assert!(started.elapsed().as_secs() < 5, "{:?}", started.elapsed());
    }

    /// Every committed seed of every fuzz target runs through its entry
    /// point cleanly (what the fuzzer starts from keeps parsing).
    #[test]
    fn the_seeds_run_cleanly() {
        let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fuzz/seeds");
        type Entry = fn(&[u8]);
        let targets: [(&str, Entry); 9] = [
            ("chat_template", super::chat_template),
            ("mlb", super::mlb),
            ("mlt", super::mlt),
            ("gguf", super::gguf),
            ("http_head", super::http_head),
            ("json_request", super::json_request),
            ("json_schema", super::json_schema),
            ("gbnf", super::gbnf),
            ("scaled", super::scaled),
        ];
        for (name, run) in targets {
            let dir = seeds.join(name);
            let mut n = 0;
            for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
                let path = entry.unwrap().path();
                run(&std::fs::read(&path).unwrap());
                n += 1;
            }
            assert!(n > 0, "no seeds for {name}");
        }
    }

    /// The file seeds are valid files, so the fuzzer starts past the parsers:
    /// each `.mlb` gives a configuration, each `.mlt` a tokenizer, the GGUF
    /// model imports.
    #[test]
    fn the_file_seeds_load() {
        use super::*;
        let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fuzz/seeds");
        let files = |t: &str| -> Vec<(String, Vec<u8>)> {
            let mut v: Vec<_> = std::fs::read_dir(seeds.join(t))
                .unwrap()
                .map(|e| e.unwrap().path())
                .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
                .collect();
            v.sort();
            v
        };
        for (name, bytes) in files("mlb") {
            let f = Mlb::from_bytes(bytes, &name).unwrap();
            Config::from_mlb(&f).unwrap();
        }
        for (name, bytes) in files("mlt") {
            Tokenizer::from_bytes(&bytes, &name).unwrap();
        }
        for (name, bytes) in files("gguf") {
            let g = Gguf::from_bytes(bytes, &name).unwrap();
            Tokenizer::build(import_tokenizer(&g).unwrap()).unwrap();
            if name.ends_with("-1layer.gguf") {
                Config::from_mlb(&import_model(g, &ImportOptions::new(ConvertType::Auto)).unwrap()).unwrap();
            }
        }
    }
}
