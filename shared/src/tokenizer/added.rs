//! Added/special tokens matched verbatim in the input (leftmost, then longest), as HF
//! `tokenizers`' AddedVocabulary does with its leftmost-longest Aho-Corasick automaton.
//! Special (control) tokens are matched only outside the input's plain ranges (text
//! from users: there, as with HF's `encode_special_tokens`, they are text like any
//! other); the other added tokens are matched everywhere.

use std::ops::Range;

/// A byte trie of the verbatim-matched tokens.
#[derive(Default)]
pub struct AddedTokens {
    nodes: Vec<Node>,
}

#[derive(Default)]
struct Node {
    /// (byte, child node index), few per node.
    children: Vec<(u8, u32)>,
    /// Token ending here, and whether it is special (a control token).
    id: Option<(u32, bool)>,
}

/// A piece of the input: plain text to encode, or an added token.
#[derive(Debug, PartialEq, Eq)]
pub enum Segment<'t> {
    Text(&'t str),
    Token(u32),
}

impl AddedTokens {
    /// Build the trie from (text, id, special); for duplicate strings the first id wins.
    /// Empty strings are ignored.
    pub fn new<'a>(tokens: impl IntoIterator<Item = (&'a str, u32, bool)>) -> AddedTokens {
        let mut trie = AddedTokens { nodes: vec![Node::default()] };
        for (text, id, special) in tokens {
            if text.is_empty() {
                continue;
            }
            let mut node = 0usize;
            for &b in text.as_bytes() {
                node = trie.child_or_insert(node, b);
            }
            trie.nodes[node].id.get_or_insert((id, special));
        }
        trie
    }

    fn child(&self, node: usize, b: u8) -> Option<usize> {
        self.nodes[node].children.iter().find(|c| c.0 == b).map(|c| c.1 as usize)
    }

    fn child_or_insert(&mut self, node: usize, b: u8) -> usize {
        if let Some(c) = self.child(node, b) {
            return c;
        }
        let new = self.nodes.len();
        self.nodes.push(Node::default());
        self.nodes[node].children.push((b, new as u32));
        new
    }

    /// Longest token starting at `text[0]` that `allowed(length, special)`: (byte length, id).
    fn longest_at(&self, text: &[u8], allowed: impl Fn(usize, bool) -> bool) -> Option<(usize, u32)> {
        let mut node = 0usize;
        let mut best = None;
        for (i, &b) in text.iter().enumerate() {
            match self.child(node, b) {
                Some(c) => node = c,
                None => break,
            }
            if let Some((id, special)) = self.nodes[node].id {
                if allowed(i + 1, special) {
                    best = Some((i + 1, id));
                }
            }
        }
        best
    }

    /// Split `text` into plain-text runs and added tokens, calling `f` for each in order.
    /// A special token is not matched where it overlaps one of the byte ranges `plain`
    /// (sorted, disjoint). Tokens are valid UTF-8, so matches always start and end on
    /// char boundaries.
    pub fn split<'t>(&self, text: &'t str, plain: &[Range<usize>], mut f: impl FnMut(Segment<'t>)) {
        let bytes = text.as_bytes();
        let (mut start, mut i) = (0usize, 0usize);
        if self.nodes[0].children.is_empty() {
            i = bytes.len();
        }
        // the first plain range that ends after `i`
        let mut next_plain = 0;
        while i < bytes.len() {
            while next_plain < plain.len() && plain[next_plain].end <= i {
                next_plain += 1;
            }
            let clear_until = plain.get(next_plain).map_or(usize::MAX, |r| if r.start <= i { i } else { r.start });
            match self.longest_at(&bytes[i..], |len, special| !special || i + len <= clear_until) {
                Some((len, id)) => {
                    if i > start {
                        f(Segment::Text(&text[start..i]));
                    }
                    f(Segment::Token(id));
                    i += len;
                    start = i;
                }
                None => i += 1,
            }
        }
        if start < bytes.len() {
            f(Segment::Text(&text[start..]));
        }
    }
}

#[cfg(test)]
// byte ranges, not lists of numbers
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;

    #[test]
    fn leftmost_longest() {
        let t = AddedTokens::new([("<a>", 1, true), ("<a><b>", 2, true), ("\n", 3, false), ("\n\n", 4, false)]);
        let mut v = vec![];
        t.split("x<a><b>y<a>\n\n\nz", &[], |s| v.push(s));
        use Segment::*;
        assert_eq!(v, [Text("x"), Token(2), Text("y"), Token(1), Token(4), Token(3), Text("z")]);
    }

    #[test]
    fn special_tokens_are_text_in_plain_ranges() {
        use Segment::*;
        let t = AddedTokens::new([("<s>", 1, true), ("<s><t>", 2, true), ("<u>", 3, false)]);
        let split = |text: &'static str, plain: &[Range<usize>]| {
            let mut v = vec![];
            t.split(text, plain, |s| v.push(s));
            v
        };
        // "<s>" | plain "<s><u>" | "<s>": the plain one is text, the non-special one a token
        assert_eq!(split("<s><s><u><s>", &[3..9]), [Token(1), Text("<s>"), Token(3), Token(1)]);
        // a special token reaching into a plain range is not matched; a shorter one is
        assert_eq!(split("<s><t>", &[4..6]), [Token(1), Text("<t>")]);
        assert_eq!(split("<s><t>", &[0..1]), [Text("<s><t>")]);
        assert_eq!(split("<s><t>", &[]), [Token(2)]);
        assert_eq!(split("<s><t>", &[0..6]), [Text("<s><t>")]);
    }
}
