//! llama.cpp's `/tokenize` and `/detokenize`: text to token ids (each with
//! its bytes on request) and ids back to text, with the server's tokenizer.
//! Bodies are checked field by field like the OpenAI endpoints' (`api`), so
//! each error names its field.

use serde_json::{json, Value};

use super::error::ApiError;
use super::fields::{parse_object, refuse_unknown, wrong_type, Fields};
use crate::tokenizer::Tokenizer;

/// The fields `/tokenize` takes (llama.cpp's, without its mixed text-and-ids `content`).
const TOKENIZE_FIELDS: [&str; 4] = ["content", "add_special", "parse_special", "with_pieces"];
/// The fields `/detokenize` takes.
const DETOKENIZE_FIELDS: [&str; 1] = ["tokens"];

/// `POST /tokenize`: `{"content": TEXT, "add_special": false, "with_pieces": false}` ->
/// `{"tokens": [ID, ...]}`, or with `with_pieces` `{"tokens": [{"id": ID, "piece": PIECE}, ...]}`.
/// A piece is a string when its bytes are UTF-8, else the array of its byte
/// values (part of a character), as llama.cpp answers; the pieces
/// concatenated are what `/detokenize` makes of the ids. `add_special` adds
/// what the tokenizer adds around a prompt (BOS, EOS). `parse_special`
/// (default true, as llama.cpp's): special tokens written in the text are the
/// control tokens they name; false: they are plain text, as a chat message's are.
pub(crate) fn tokenize(tokenizer: &Tokenizer, body: &[u8]) -> Result<Value, ApiError> {
    let obj = parse_object(body)?;
    refuse_unknown(&obj, &[&TOKENIZE_FIELDS])?;
    let f = Fields(&obj);
    let content = match f.get("content") {
        Some(Value::String(s)) => s,
        Some(other) => return Err(wrong_type("content", "a string", other)),
        None => return Err(ApiError::field("missing_parameter", "content", "'content' is required")),
    };
    let add_special = f.boolean("add_special")?.unwrap_or(false);
    let with_pieces = f.boolean("with_pieces")?.unwrap_or(false);
    let ids = match f.boolean("parse_special")?.unwrap_or(true) {
        true => tokenizer.encode(content, add_special),
        false => tokenizer.encode_plain(content, add_special),
    };
    if !with_pieces {
        return Ok(json!({ "tokens": ids }));
    }
    let mut prev = None;
    let tokens: Vec<Value> = ids
        .iter()
        .map(|&id| {
            let piece = piece_json(tokenizer.decode_piece(prev, id));
            prev = Some(id);
            json!({"id": id, "piece": piece})
        })
        .collect();
    Ok(json!({ "tokens": tokens }))
}

/// `POST /detokenize`: `{"tokens": [ID, ...]}` -> `{"content": TEXT}`, the
/// ids' bytes as UTF-8 (U+FFFD where they are not). Every id must be in the
/// tokenizer's vocabulary.
pub(crate) fn detokenize(tokenizer: &Tokenizer, body: &[u8]) -> Result<Value, ApiError> {
    let obj = parse_object(body)?;
    refuse_unknown(&obj, &[&DETOKENIZE_FIELDS])?;
    let f = Fields(&obj);
    let list = match f.get("tokens") {
        Some(Value::Array(a)) => a,
        Some(other) => return Err(wrong_type("tokens", "an array of token ids", other)),
        None => return Err(ApiError::field("missing_parameter", "tokens", "'tokens' is required")),
    };
    let vocab = tokenizer.vocab_size();
    let ids = list.iter().enumerate().map(|(i, v)| token_id(v, i, vocab)).collect::<Result<Vec<u32>, _>>()?;
    Ok(json!({"content": String::from_utf8_lossy(&tokenizer.decode(&ids))}))
}

/// A token's bytes in a `with_pieces` answer: a string when they are UTF-8,
/// else the array of their byte values.
fn piece_json(bytes: Vec<u8>) -> Value {
    match String::from_utf8(bytes) {
        Ok(text) => Value::String(text),
        Err(e) => json!(e.into_bytes()),
    }
}

/// Element `index` of `tokens`: an id below `vocab`.
fn token_id(v: &Value, index: usize, vocab: usize) -> Result<u32, ApiError> {
    let param = format!("tokens[{index}]");
    let outside = |shown: &str| {
        ApiError::field(
            "invalid_value",
            &param,
            format!(
                "'{param}' is {shown}, outside the vocabulary: token ids are from 0 to {}",
                vocab.saturating_sub(1)
            ),
        )
    };
    let Value::Number(n) = v else { return Err(wrong_type(&param, "a token id (an integer)", v)) };
    if let Some(id) = n.as_u64() {
        return match u32::try_from(id) {
            Ok(id) if (id as usize) < vocab => Ok(id),
            _ => Err(outside(&id.to_string())),
        };
    }
    // Negative, or a whole number outside the vocabulary written as a float
    // (serde_json reads integers beyond 64 bits so).
    if n.as_i64().is_some() || n.as_f64().is_some_and(|x| x.fract() == 0.0 && (x < 0.0 || x >= vocab as f64)) {
        return Err(outside(&n.to_string()));
    }
    Err(wrong_type(&param, "a token id (an integer)", v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::mlt::*;

    /// SentencePiece without a prefix space: <unk>, <s> (BOS, added), </s>,
    /// the 256 byte tokens (ids 3..259), then "a", "b", "é".
    fn tokenizer() -> Tokenizer {
        let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        let mut types = vec![TYPE_UNKNOWN, TYPE_CONTROL, TYPE_CONTROL];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(TYPE_BYTE);
        }
        for t in ["a", "b", "é"] {
            tokens.push(t.into());
            types.push(TYPE_NORMAL);
        }
        let raw = RawTokenizer {
            kind: ModelKind::SentencePiece,
            pretok: PreTokenizer::None,
            flags: FLAG_BYTE_FALLBACK | FLAG_ADD_BOS,
            bos: Some(1),
            eos: Some(2),
            eot: None,
            unk: Some(0),
            pad: None,
            chat_template: String::new(),
            chat_jinja: String::new(),
            scores: Vec::new(),
            tokens,
            types,
            merges: Vec::new(),
        };
        Tokenizer::build(raw).expect("a valid tokenizer")
    }

    fn call(f: fn(&Tokenizer, &[u8]) -> Result<Value, ApiError>, body: &str) -> Result<Value, ApiError> {
        f(&tokenizer(), body.as_bytes())
    }

    #[test]
    fn text_to_ids_and_back() {
        let v = call(tokenize, r#"{"content": "abé"}"#).unwrap();
        assert_eq!(v, json!({"tokens": [259, 260, 261]}));
        let v = call(tokenize, r#"{"content": "ab", "add_special": true, "parse_special": true}"#).unwrap();
        assert_eq!(v, json!({"tokens": [1, 259, 260]}));
        assert_eq!(call(tokenize, r#"{"content": ""}"#).unwrap(), json!({"tokens": []}));
        let v = call(detokenize, r#"{"tokens": [1, 259, 261, 3, 0]}"#).unwrap();
        assert_eq!(v, json!({"content": "<s>aé\u{0}<unk>"}));
        assert_eq!(call(detokenize, r#"{"tokens": []}"#).unwrap(), json!({"content": ""}));
        // Half a character: U+FFFD.
        assert_eq!(call(detokenize, r#"{"tokens": [259, 198]}"#).unwrap(), json!({"content": "a\u{fffd}"}));
    }

    #[test]
    fn pieces_are_strings_or_bytes() {
        // "😀" is not in the vocabulary: four byte tokens, each part of the character.
        let v = call(tokenize, r#"{"content": "a😀", "with_pieces": true}"#).unwrap();
        let smile = "😀".as_bytes();
        let mut want = vec![json!({"id": 259, "piece": "a"})];
        want.extend(smile.iter().map(|&b| json!({"id": 3 + u32::from(b), "piece": [b]})));
        assert_eq!(v, json!({ "tokens": want }));
    }

    #[test]
    fn bad_bodies_name_the_field() {
        let err = |f, body: &str| {
            let e = call(f, body).unwrap_err();
            assert_eq!(e.status, 400, "{body}");
            (e.code, e.param.unwrap_or_default())
        };
        assert_eq!(err(tokenize, "{"), ("invalid_json", String::new()));
        assert_eq!(err(tokenize, "[1]"), ("invalid_json", String::new()));
        assert_eq!(err(tokenize, ""), ("invalid_json", String::new()));
        assert_eq!(err(tokenize, "{}"), ("missing_parameter", "content".into()));
        assert_eq!(err(tokenize, r#"{"content": 5}"#), ("invalid_type", "content".into()));
        assert_eq!(err(tokenize, r#"{"content": "a", "add_special": 1}"#), ("invalid_type", "add_special".into()));
        assert_eq!(err(tokenize, r#"{"content": "a", "with_pieces": "y"}"#), ("invalid_type", "with_pieces".into()));
        assert_eq!(err(tokenize, r#"{"content": "a", "parse_special": 0}"#), ("invalid_type", "parse_special".into()));
        assert_eq!(err(tokenize, r#"{"content": "a", "zz": 1, "b": 2}"#), ("unsupported_parameter", "b".into()));
        assert_eq!(err(detokenize, "{}"), ("missing_parameter", "tokens".into()));
        assert_eq!(err(detokenize, r#"{"tokens": 5}"#), ("invalid_type", "tokens".into()));
        assert_eq!(err(detokenize, r#"{"tokens": "a"}"#), ("invalid_type", "tokens".into()));
        assert_eq!(err(detokenize, r#"{"tokens": [1, "2"]}"#), ("invalid_type", "tokens[1]".into()));
        assert_eq!(err(detokenize, r#"{"tokens": [1.5]}"#), ("invalid_type", "tokens[0]".into()));
        assert_eq!(err(detokenize, r#"{"tokens": [2.0]}"#), ("invalid_type", "tokens[0]".into()));
        assert_eq!(err(detokenize, r#"{"tokens": [null]}"#), ("invalid_type", "tokens[0]".into()));
        for bad in ["262", "-1", "4294967296", "18446744073709551616", "-9223372036854775809", "1e30"] {
            let e = call(detokenize, &format!(r#"{{"tokens": [0, {bad}]}}"#)).unwrap_err();
            assert_eq!((e.code, e.param.as_deref()), ("invalid_value", Some("tokens[1]")), "{bad}");
            assert!(e.message.contains("from 0 to 261") && !e.message.contains('\n'), "{}", e.message);
        }
        let e = call(detokenize, r#"{"tokens": [99999]}"#).unwrap_err();
        assert!(e.message.starts_with("'tokens[0]' is 99999,"), "{}", e.message);
    }
}
