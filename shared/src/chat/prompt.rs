//! A prompt as the chat template made it: its text, and which parts of it
//! users wrote (message contents, tools, calls, results). Only the
//! template's own text may hold control tokens: a user's `<|im_start|>` is
//! tokenized as the characters it is (`Tokenizer::encode_with_plain`), so
//! no message can end its turn or open another.

use std::ops::Range;

use crate::tokenizer::Tokenizer;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PromptText {
    text: String,
    /// Byte ranges of `text` that users wrote: sorted, disjoint, not empty.
    plain: Vec<Range<usize>>,
}

impl PromptText {
    /// Text the template writes (control tokens in it are matched).
    pub fn template(text: &str) -> PromptText {
        PromptText { text: text.to_string(), plain: Vec::new() }
    }

    /// Text a user wrote (control tokens in it are plain text).
    pub fn plain(text: &str) -> PromptText {
        let mut p = PromptText::default();
        p.push_plain(text);
        p
    }

    pub fn push_template(&mut self, text: &str) {
        self.text.push_str(text);
    }

    pub fn push_plain(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        let start = self.text.len();
        self.text.push_str(text);
        match self.plain.last_mut() {
            Some(last) if last.end == start => last.end = self.text.len(),
            _ => self.plain.push(start..self.text.len()),
        }
    }

    pub fn push(&mut self, other: &PromptText) {
        let shift = self.text.len();
        self.text.push_str(&other.text);
        for r in &other.plain {
            match self.plain.last_mut() {
                Some(last) if last.end == r.start + shift => last.end = r.end + shift,
                _ => self.plain.push(r.start + shift..r.end + shift),
            }
        }
    }

    /// `other` before this text.
    pub fn prepend(&mut self, other: &PromptText) {
        let mut joined = other.clone();
        joined.push(self);
        *self = joined;
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    /// The byte ranges users wrote.
    pub fn plain_ranges(&self) -> &[Range<usize>] {
        &self.plain
    }

    /// The text after its first `at` bytes (a character boundary), with
    /// what users wrote in it.
    pub fn after(&self, at: usize) -> PromptText {
        let plain = self.plain.iter().filter(|r| r.end > at).map(|r| r.start.max(at) - at..r.end - at).collect();
        PromptText { text: self.text[at..].to_string(), plain }
    }

    /// The token ids (`add_special`: with the tokenizer's BOS/EOS).
    pub fn encode(&self, tokenizer: &Tokenizer, add_special: bool) -> Vec<u32> {
        tokenizer.encode_with_plain(&self.text, &self.plain, add_special)
    }
}

/// Comparisons with plain strings (tests, and checks of the text alone).
impl PartialEq<&str> for PromptText {
    fn eq(&self, other: &&str) -> bool {
        self.text == *other
    }
}

impl PartialEq<String> for PromptText {
    fn eq(&self, other: &String) -> bool {
        &self.text == other
    }
}

#[cfg(test)]
// byte ranges, not lists of numbers
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;

    #[test]
    fn ranges_follow_the_text() {
        let mut p = PromptText::template("<a>");
        p.push_plain("xy");
        p.push_plain("z");
        p.push_template("<b>");
        p.push_plain("");
        assert_eq!((p.as_str(), p.plain_ranges()), ("<a>xyz<b>", &[3..6][..]));
        let mut q = PromptText::plain("q");
        q.push(&p);
        assert_eq!((q.as_str(), q.plain_ranges()), ("q<a>xyz<b>", &[0..1, 4..7][..]));
        let tail = q.after(5);
        assert_eq!((tail.as_str(), tail.plain_ranges()), ("yz<b>", &[0..2][..]));
        let mut r = PromptText::plain("w");
        r.prepend(&PromptText::plain("v"));
        assert_eq!(r.plain_ranges(), &[0..2]);
    }
}
