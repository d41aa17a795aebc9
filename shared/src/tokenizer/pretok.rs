//! Pre-tokenization: the split regexes of each pre-tokenizer kind (GPT-2, Llama 3, Qwen2,
//! Qwen3.5, o200k, Gemma 4's lines, and the sequences of DeepSeek, Falcon and StarCoder) and GPT-2's
//! byte-to-unicode map.

use crate::format::mlt::PreTokenizer;
use fancy_regex::Regex;

/// GPT-2 ByteLevel regex (also SmolLM2), as in HF `tokenizers`.
pub const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3 Split regex.
pub const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2 Split regex (single digits).
pub const QWEN2: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen3.5's Split regex: Qwen2's with combining marks (\p{M}) kept in words.
pub const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// OpenAI's o200k split (llama.cpp's `gpt-4o`: Phi-4-mini, gpt-oss): words by case, with
/// their contraction, digits in threes.
pub const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-2's split without its last alternative (the gaps are pieces anyway): the last stage of
/// the sequences below.
const GPT2_WORDS: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// The CJK ranges DeepSeek's tokenizers keep together.
const DEEPSEEK_CJK: &str = r"[\u{4e00}-\u{9fa5}\u{800}-\u{4e00}\u{ac00}-\u{d7ff}]+";

/// The regexes of a pre-tokenizer kind, applied in sequence (each splits the pieces of the one
/// before): one for most kinds, several for the tokenizers whose tokenizer.json chains `Split`s
/// (DeepSeek, Falcon, StarCoder).
fn patterns(kind: PreTokenizer) -> &'static [&'static str] {
    match kind {
        PreTokenizer::None => &[],
        PreTokenizer::Gpt2 => &[GPT2],
        PreTokenizer::Llama3 => &[LLAMA3],
        PreTokenizer::Qwen2 => &[QWEN2],
        PreTokenizer::Qwen35 => &[QWEN35],
        PreTokenizer::Gpt4o => &[GPT4O],
        // (also refact and command-r): single digits, then GPT-2's words
        PreTokenizer::Starcoder => &[r"\p{N}", GPT2_WORDS],
        PreTokenizer::Falcon => &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2_WORDS, r"[0-9][0-9][0-9]"],
        // lines apart from newline runs; no word split (merges run over a whole line)
        PreTokenizer::Gemma4 => &[r"[^\n]+|[\n]+"],
        PreTokenizer::DeepseekCoder => &[r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", DEEPSEEK_CJK, r"\p{N}"],
        PreTokenizer::DeepseekLlm => &[
            r"[\r\n]",
            r"\s?[A-Za-z\u{b5}\u{c0}-\u{d6}\u{d8}-\u{f6}\u{f8}-\u{1ba}\u{1bc}-\u{1bf}\u{1c4}-\u{293}\u{295}-\u{2af}\u{370}-\u{373}\u{376}\u{377}\u{37b}-\u{37d}\u{37f}\u{386}\u{388}-\u{38a}\u{38c}\u{38e}-\u{3a1}\u{3a3}-\u{3f5}\u{3f7}-\u{481}\u{48a}-\u{52f}\u{531}-\u{556}\u{10a0}-\u{10c5}\u{13a0}-\u{13f5}\u{13f8}-\u{13fd}\u{1c90}-\u{1cba}\u{1cbd}-\u{1cbf}\u{1d00}-\u{1d2b}\u{1d6b}-\u{1d77}\u{1d79}-\u{1d9a}\u{1e00}-\u{1f15}\u{1f18}-\u{1f1d}\u{1f20}-\u{1f45}\u{1f48}-\u{1f4d}\u{1f50}-\u{1f57}\u{1f59}\u{1f5b}\u{1f5d}\u{1f5f}-\u{1f7d}\u{1f80}-\u{1fb4}\u{1fb6}-\u{1fbc}\u{1fbe}\u{1fc2}-\u{1fc4}\u{1fc6}-\u{1fcc}\u{1fd0}-\u{1fd3}\u{1fd6}-\u{1fdb}\u{1fe0}-\u{1fec}\u{1ff2}-\u{1ff4}\u{1ff6}-\u{1ffc}\u{2102}\u{2107}\u{210a}-\u{2113}\u{2115}\u{2119}-\u{211d}\u{2124}\u{2126}\u{2128}\u{212a}-\u{212d}\u{212f}-\u{2134}\u{2139}\u{213c}-\u{213f}\u{2145}-\u{2149}\u{214e}\u{2183}\u{2184}\u{2c00}-\u{2c7b}\u{2c7e}-\u{2ce4}\u{2ceb}-\u{2cee}\u{2cf2}\u{2cf3}\u{a640}-\u{a66d}\u{a680}-\u{a69b}\u{a722}-\u{a76f}\u{a771}-\u{a787}\u{a78b}-\u{a78e}\u{ab70}-\u{abbf}\u{fb00}-\u{fb06}\u{fb13}-\u{fb17}\u{ff21}-\u{ff3a}\u{ff41}-\u{ff5a}\u{10400}-\u{1044f}\u{104b0}-\u{104d3}\u{104d8}-\u{104fb}\u{10c80}-\u{10cb2}\u{10cc0}-\u{10cf2}\u{118a0}-\u{118df}\u{1e900}-\u{1e943}]+",
            r"\s?[!-/:-~\u{ff01}-\u{ff0f}\u{ff1a}-\u{ff5e}\u{2018}-\u{201f}\u{3000}-\u{3002}]+",
            r"\s+$",
            DEEPSEEK_CJK,
            r"\p{N}+",
        ],
    }
}

/// Compile the regexes of a pre-tokenizer kind (none: the whole text is one piece).
pub fn compile(kind: PreTokenizer) -> Result<Vec<Regex>, String> {
    patterns(kind)
        .iter()
        .map(|pattern| {
            fancy_regex::RegexBuilder::new(pattern)
                .backtrack_limit(10_000_000)
                .build()
                .map_err(|e| format!("cannot compile the {kind:?} pre-tokenizer regex: {e}"))
        })
        .collect()
}

/// Split `text` into pieces like HF `Split(behavior=Isolated)`: every match and every gap
/// between matches is a piece; each regex of `res` splits the pieces of the one before
/// (HF `Sequence`). Calls `f` for each non-empty piece in order.
pub fn split<'t>(res: &[Regex], text: &'t str, f: &mut impl FnMut(&'t str)) {
    let Some((re, rest)) = res.split_first() else {
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
            split(rest, &text[last..m.start()], f);
        }
        if m.end() > m.start() {
            split(rest, m.as_str(), f);
        }
        last = m.end();
    }
    if last < text.len() {
        split(rest, &text[last..], f);
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
        split(&re, "Hello world's  end!!\n", &mut |p| v.push(p));
        assert_eq!(v, ["Hello", " world", "'s", " ", " end", "!!", "\n"]);
    }

    #[test]
    fn each_regex_of_a_sequence_splits_the_pieces_of_the_one_before() {
        // StarCoder: digits one by one first, then GPT-2's words over what is left
        let re = compile(PreTokenizer::Starcoder).unwrap();
        let mut v = vec![];
        split(&re, "x 123ab", &mut |p| v.push(p));
        assert_eq!(v, ["x", " ", "1", "2", "3", "ab"]);
        // the o200k split keeps a word's case run and its contraction together
        let re = compile(PreTokenizer::Gpt4o).unwrap();
        let mut v = vec![];
        split(&re, "HELLO'S CamelCase 12345", &mut |p| v.push(p));
        assert_eq!(v, ["HELLO'S", " Camel", "Case", " ", "123", "45"]);
        // every kind compiles
        for code in 0..11 {
            compile(crate::format::mlt::pre_tokenizer(code).unwrap()).unwrap();
        }
    }
}
