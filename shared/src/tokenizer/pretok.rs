//! Pre-tokenization: the GPT-2 / Llama-3 / Qwen2 split regexes and GPT-2's byte-to-unicode map.

use crate::format::mlt::PreTokenizer;
use fancy_regex::Regex;

/// GPT-2 ByteLevel regex (also SmolLM2), as in HF `tokenizers`.
pub const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3 Split regex.
pub const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2 Split regex (single digits).
pub const QWEN2: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Compile the regex for a pre-tokenizer kind (`None` = whole text is one piece).
pub fn compile(kind: PreTokenizer) -> Result<Option<Regex>, String> {
    let pattern = match kind {
        PreTokenizer::None => return Ok(None),
        PreTokenizer::Gpt2 => GPT2,
        PreTokenizer::Llama3 => LLAMA3,
        PreTokenizer::Qwen2 => QWEN2,
    };
    fancy_regex::RegexBuilder::new(pattern)
        .backtrack_limit(10_000_000)
        .build()
        .map(Some)
        .map_err(|e| format!("cannot compile the {kind:?} pre-tokenizer regex: {e}"))
}

/// Split `text` into pieces like HF `Split(behavior=Isolated)`: every match and every gap
/// between matches is a piece. Calls `f` for each non-empty piece in order.
pub fn split<'t>(re: Option<&Regex>, text: &'t str, mut f: impl FnMut(&'t str)) {
    let Some(re) = re else {
        if !text.is_empty() {
            f(text);
        }
        return;
    };
    let mut last = 0;
    for m in re.find_iter(text) {
        let Ok(m) = m else {
            // Backtrack limit hit (pathological input): keep the rest as one piece.
            break;
        };
        if m.start() > last {
            f(&text[last..m.start()]);
        }
        if m.end() > m.start() {
            f(m.as_str());
        }
        last = m.end();
    }
    if last < text.len() {
        f(&text[last..]);
    }
}

/// GPT-2's byte -> printable char table: printable Latin-1 bytes map to themselves, the
/// rest to U+0100 + n in byte order.
pub fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let code = if printable {
            u32::from(b)
        } else {
            extra += 1;
            255 + extra
        };
        table[usize::from(b)] = char::from_u32(code).unwrap_or('\0');
    }
    table
}

/// Inverse of [`byte_to_char`], indexed by code point (all mapped chars are < U+0144).
pub fn char_to_byte() -> Vec<Option<u8>> {
    let mut inv = vec![None; 0x144];
    for (b, c) in byte_to_char().iter().enumerate() {
        inv[*c as usize] = Some(b as u8);
    }
    inv
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_matches_gpt2() {
        let t = byte_to_char();
        assert_eq!(t[b' ' as usize], '\u{120}'); // 'Ġ'
        assert_eq!(t[b'\n' as usize], '\u{10A}'); // 'Ċ'
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[0xAD], '\u{143}');
        let inv = char_to_byte();
        assert!((0..=255u8).all(|b| inv[t[b as usize] as usize] == Some(b)));
    }

    #[test]
    fn gpt2_split() {
        let re = compile(PreTokenizer::Gpt2).unwrap();
        let mut v = vec![];
        split(re.as_ref(), "Hello world's  end!!\n", |p| v.push(p));
        assert_eq!(v, ["Hello", " world", "'s", " ", " end", "!!", "\n"]);
    }
}
