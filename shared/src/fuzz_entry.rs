//! Entry points of the fuzz targets (`tests/fuzz/`, `cargo xtask fuzz`):
//! one function per target, feeding arbitrary bytes to one input edge and,
//! when it accepts them, to what a run does next with the result. Each
//! returns normally for any input; a panic, an abort or an allocation
//! beyond the fuzzer's limit is a bug.

use crate::app::escape_line;
use crate::app::server::{api, http};
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
/// in memory: bounded by a small multiple of the file's size) and the
/// configuration of the imported model.
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
        Ok(m) => {
            if let Err(e) = Config::from_mlb(&m) {
                one_line(&e);
            }
        }
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
    if let Ok(obj) = api::parse_object(data) {
        for chat in [false, true] {
            let _ = api::parse_request(&obj, chat, 7);
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

#[cfg(test)]
mod tests {
    /// Every committed seed of every fuzz target runs through its entry
    /// point cleanly (what the fuzzer starts from keeps parsing).
    #[test]
    fn the_seeds_run_cleanly() {
        let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fuzz/seeds");
        type Entry = fn(&[u8]);
        let targets: [(&str, Entry); 7] = [
            ("mlb", super::mlb),
            ("mlt", super::mlt),
            ("gguf", super::gguf),
            ("http_head", super::http_head),
            ("json_request", super::json_request),
            ("json_schema", super::json_schema),
            ("gbnf", super::gbnf),
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
            if name.ends_with("llama-1layer.gguf") {
                Config::from_mlb(&import_model(g, &ImportOptions::new(ConvertType::Auto)).unwrap()).unwrap();
            }
        }
    }
}
