//! Unit tests: small synthetic tokenizers (behaviour) and hostile `.mlt` files (robustness).
//! The comparison against HF `tokenizers` on real vocabularies is in tests/test_tokenizer.py.

use super::*;
use crate::format::mlt::*;

const CHAT: &str = "chatml";

/// Byte-level BPE: ids 0..256 are the GPT-2 chars of bytes 0..256, then merged tokens.
fn byte_level_raw() -> RawTokenizer {
    let map = pretok::byte_to_char();
    let mut tokens: Vec<String> = map.iter().map(|c| c.to_string()).collect();
    let mut types = vec![TYPE_NORMAL; 256];
    let mut merges = vec![];
    for (a, b) in [("h", "e"), ("Ġ", "w"), ("l", "l"), ("he", "ll"), ("hell", "o")] {
        let id = |t: &str, tokens: &Vec<String>| tokens.iter().position(|x| x == t).unwrap() as u32;
        merges.push((id(a, &tokens), id(b, &tokens)));
        tokens.push(format!("{a}{b}"));
        types.push(TYPE_NORMAL);
    }
    tokens.push("<|end|>".into());
    types.push(TYPE_CONTROL);
    let end = tokens.len() as u32 - 1;
    RawTokenizer {
        kind: ModelKind::ByteLevel,
        pretok: PreTokenizer::Gpt2,
        flags: FLAG_ADD_EOS,
        bos: None,
        eos: Some(end),
        eot: Some(end),
        unk: None,
        pad: None,
        chat_template: CHAT.into(),
        chat_jinja: String::new(),
        scores: Vec::new(),
        tokens,
        types,
        merges,
    }
}

/// SentencePiece BPE with byte fallback and a prefix space.
fn spm_raw() -> RawTokenizer {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![TYPE_UNKNOWN, TYPE_CONTROL, TYPE_CONTROL];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(TYPE_BYTE);
    }
    for t in ["▁", "h", "i", "▁h", "▁hi"] {
        tokens.push(t.into());
        types.push(TYPE_NORMAL);
    }
    let id = |t: &str| tokens.iter().position(|x| x == t).unwrap() as u32;
    let merges = vec![(id("▁"), id("h")), (id("▁h"), id("i"))];
    RawTokenizer {
        kind: ModelKind::SentencePiece,
        pretok: PreTokenizer::None,
        flags: FLAG_BYTE_FALLBACK | FLAG_PREFIX_SPACE | FLAG_ADD_BOS | FLAG_METASPACE,
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
        merges,
    }
}

fn load(raw: &RawTokenizer) -> Tokenizer {
    Tokenizer::from_bytes(&write(raw), "t.mlt").expect("valid file")
}

fn streamed(t: &Tokenizer, ids: &[u32]) -> Vec<u8> {
    let mut out = vec![];
    let mut prev = None;
    for &id in ids {
        out.extend(t.decode_piece(prev, id));
        prev = Some(id);
    }
    out
}

#[test]
fn byte_level_encode_decode() {
    let t = load(&byte_level_raw());
    let id = |s: &str| t.token_id(s).unwrap();
    let ids = t.encode("hello world<|end|>", false);
    let expect = [id("hello"), id("Ġw"), id("o"), id("r"), id("l"), id("d"), id("<|end|>")];
    assert_eq!(ids, expect);
    assert_eq!(t.decode(&ids), b"hello world<|end|>");
    assert_eq!(streamed(&t, &ids), t.decode(&ids));
    // add_special appends eos; bytes outside ASCII round-trip.
    let ids = t.encode("héllo \u{1F600}\n", true);
    assert_eq!(ids.last(), t.eos_id().as_ref());
    assert_eq!(t.decode(&ids), "héllo \u{1F600}\n<|end|>".as_bytes());
    assert_eq!(t.chat_template(), CHAT);
    assert!(t.is_control(id("<|end|>")) && !t.is_control(id("hello")));
    assert_eq!(t.encode("", false), Vec::<u32>::new());
}

#[test]
fn sentencepiece_encode_decode() {
    let t = load(&spm_raw());
    let id = |s: &str| t.token_id(s).unwrap();
    let ids = t.encode("hi hi€", true);
    let euro = "€".bytes().map(|b| id(&format!("<0x{b:02X}>")));
    let expect: Vec<u32> = [1, id("▁hi"), id("▁hi")].into_iter().chain(euro).collect();
    assert_eq!(ids, expect);
    assert_eq!(t.decode(&ids), "<s> hi hi€".as_bytes());
    assert_eq!(t.decode(&ids[1..]), "hi hi€".as_bytes(), "prefix space stripped");
    assert_eq!(streamed(&t, &ids[1..]), t.decode(&ids[1..]));
    assert_eq!(streamed(&t, &ids), t.decode(&ids));
    assert_eq!(t.encode("", true), vec![1]);
    assert_eq!(t.encode("</s>", false), vec![2]);
}

/// Gemma 4: merges never cross a newline, and a newline run that is one token is that token
/// even where no merge builds it.
#[test]
fn gemma4_lines_and_newline_runs() {
    let mut raw = spm_raw();
    for t in ["\n", "\n\n", "i\n"] {
        raw.tokens.push(t.into());
        raw.types.push(TYPE_NORMAL);
    }
    let id = |t: &str| raw.tokens.iter().position(|x| x == t).unwrap() as u32;
    raw.merges.push((id("i"), id("\n"))); // would join "i" and "\n" within a line
    raw.pretok = PreTokenizer::Gemma4;
    raw.flags &= !FLAG_PREFIX_SPACE;
    let t = load(&raw);
    let id = |s: &str| t.token_id(s).unwrap();
    assert_eq!(t.encode("hi\n\nhi", false), [id("h"), id("i"), id("\n\n"), id("h"), id("i")]);
    assert_eq!(t.encode(" hi\n", false), [id("▁hi"), id("\n")]);
    raw.pretok = PreTokenizer::None;
    let t = load(&raw);
    assert_eq!(t.encode("hi\n\n", false), [id("h"), id("i\n"), id("\n")], "the rules above are Gemma 4's");
}

#[test]
fn valid_files_load_from_disk() {
    let dir = std::env::temp_dir().join(format!("krafla_tok_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.mlt");
    std::fs::write(&path, write(&spm_raw())).unwrap();
    assert!(Tokenizer::load(&path).is_ok());
    let err = Tokenizer::load(&dir.join("missing.mlt")).err().unwrap();
    assert!(err.starts_with(&format!("{}: cannot read", dir.join("missing.mlt").display())));
    std::fs::remove_dir_all(&dir).ok();
}

// ----- hostile files -----

/// Parse and expect a one-line error naming the file and containing `needle`.
fn expect_err(bytes: &[u8], needle: &str) {
    match Tokenizer::from_bytes(bytes, "bad.mlt") {
        Ok(_) => panic!("accepted a bad file (expected {needle:?})"),
        Err(e) => {
            assert!(e.starts_with("bad.mlt: "), "{e}");
            assert!(!e.contains('\n'), "multi-line error: {e}");
            assert!(e.contains(needle), "error {e:?} lacks {needle:?}");
        }
    }
}

/// Offset of `n_vocab` (after the 44-byte header and the chat template string).
fn vocab_count_offset(raw: &RawTokenizer) -> usize {
    44 + 4 + raw.chat_template.len()
}

/// Offset of `n_merges`.
fn merge_count_offset(raw: &RawTokenizer, bytes: &[u8]) -> usize {
    bytes.len() - 4 - 8 * raw.merges.len()
}

fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn every_truncation_is_an_error() {
    for raw in [byte_level_raw(), spm_raw()] {
        let full = write(&raw);
        for len in 0..full.len() {
            let e = Tokenizer::from_bytes(&full[..len], "cut.mlt").err();
            let e = e.unwrap_or_else(|| panic!("accepted a file cut at {len} bytes"));
            assert!(e.starts_with("cut.mlt: ") && e.contains("truncated"), "{len}: {e}");
        }
        assert!(Tokenizer::from_bytes(&full, "ok.mlt").is_ok());
    }
}

#[test]
fn bad_header_fields() {
    let good = write(&byte_level_raw());
    let patched = |at: usize, v: u32| {
        let mut b = good.clone();
        put_u32(&mut b, at, v);
        b
    };
    let mut magic = good.clone();
    magic[0] = b'X';
    expect_err(&magic, "bad magic");
    expect_err(&patched(8, 2), "unsupported version 2");
    expect_err(&patched(12, 7), "unknown model kind 7");
    expect_err(&patched(16, 11), "unknown pre-tokenizer 11");
    expect_err(&patched(20, 1 << 31), "unknown flag bits");
    expect_err(&patched(24, 999_999), "bos_id 999999 is out of range");
    expect_err(&patched(36, (-2i32) as u32), "unk_id -2 is out of range");
    expect_err(&patched(44, u32::MAX), "chat template length");
}

#[test]
fn huge_counts_are_rejected_before_allocating() {
    let raw = byte_level_raw();
    let good = write(&raw);
    let at = vocab_count_offset(&raw);
    for (count, needle) in [(u32::MAX, "exceeds the limit"), (MAX_VOCAB, "truncated")] {
        let mut b = good.clone();
        put_u32(&mut b, at, count);
        expect_err(&b, needle);
    }
    let at = merge_count_offset(&raw, &good);
    for (count, needle) in [(u32::MAX, "exceeds the limit"), (MAX_MERGES, "truncated")] {
        let mut b = good.clone();
        put_u32(&mut b, at, count);
        expect_err(&b, needle);
    }
    // A token length far beyond the limit.
    let mut b = good.clone();
    put_u32(&mut b, at_first_token(&raw), 0xFFFF_FFF0);
    expect_err(&b, "token 0 length");
}

/// Offset of the first token's length field.
fn at_first_token(raw: &RawTokenizer) -> usize {
    vocab_count_offset(raw) + 4
}

#[test]
fn bad_tables() {
    // Merge id out of range.
    let mut raw = byte_level_raw();
    raw.merges[1].1 = 10_000;
    expect_err(&write(&raw), "merge 1 (");
    // Merge whose concatenation is not a token.
    let mut raw = byte_level_raw();
    raw.merges[0] = (0, 1);
    expect_err(&write(&raw), "not in the vocabulary");
    // Invalid UTF-8 in a token: 'A' (1 byte) -> 0xFF.
    let raw = byte_level_raw();
    let mut b = write(&raw);
    let before: usize = raw.tokens[..65].iter().map(|t| 4 + t.len() + 5).sum();
    let tok_a = at_first_token(&raw) + before + 4;
    assert_eq!(b[tok_a], b'A');
    b[tok_a] = 0xFF;
    expect_err(&b, "token 65 is not valid UTF-8");
    // Unknown token type.
    let mut raw = byte_level_raw();
    raw.types[3] = 9;
    expect_err(&write(&raw), "unknown token type 9");
    // A byte-type token that is not <0xNN>.
    let mut raw = spm_raw();
    raw.types[261] = TYPE_BYTE;
    expect_err(&write(&raw), "is not <0xNN>");
    // Trailing garbage: a chat template source cut short, or bytes after one.
    let mut b = write(&spm_raw());
    b.push(0);
    expect_err(&b, "chat template source needs 4 bytes");
    let mut raw = spm_raw();
    raw.chat_jinja = "{{ x }}".into();
    let mut b = write(&raw);
    assert_eq!(Tokenizer::from_bytes(&b, "ok.mlt").unwrap().chat_jinja(), "{{ x }}");
    b.push(0);
    expect_err(&b, "trailing");
}

#[test]
fn garbage_never_panics() {
    // Deterministic pseudo-random mutations of a valid file.
    let good = write(&spm_raw());
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..2000 {
        let mut b = good.clone();
        for _ in 0..4 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let at = (state % b.len() as u64) as usize;
            b[at] = (state >> 32) as u8;
        }
        if let Ok(t) = Tokenizer::from_bytes(&b, "m.mlt") {
            let ids = t.encode("hi <s> x\u{1F600}", true);
            let _ = t.decode(&ids);
        }
    }
}

/// gpt-oss: `<|return|>` and `<|call|>` end an answer, `<|end|>` (between its channels) does not,
/// whatever the file names as end of turn.
#[test]
fn harmony_stop_ids() {
    let mut raw = byte_level_raw();
    for t in ["<|end|>", "<|return|>", "<|call|>"] {
        raw.tokens.push(t.into());
        raw.types.push(TYPE_CONTROL);
    }
    let id = |t: &str| raw.tokens.iter().position(|x| x == t).unwrap() as u32;
    raw.eot = Some(id("<|end|>"));
    raw.eos = Some(id("<|return|>"));
    raw.chat_template = "harmony".into();
    assert_eq!(load(&raw).stop_ids(), [id("<|return|>"), id("<|call|>")]);
    raw.chat_template = CHAT.into();
    assert_eq!(load(&raw).stop_ids(), [id("<|end|>"), id("<|return|>")]);
}
