//! Added/special tokens matched verbatim in the input (leftmost, then longest), as HF
//! `tokenizers`' AddedVocabulary does with its leftmost-longest Aho-Corasick automaton.

/// A byte trie of the verbatim-matched tokens.
#[derive(Default)]
pub struct AddedTokens {
    nodes: Vec<Node>,
}

#[derive(Default)]
struct Node {
    /// (byte, child node index), few per node.
    children: Vec<(u8, u32)>,
    /// Token ending here.
    id: Option<u32>,
}

/// A piece of the input: plain text to encode, or an added token.
#[derive(Debug, PartialEq, Eq)]
pub enum Segment<'t> {
    Text(&'t str),
    Token(u32),
}

impl AddedTokens {
    /// Build the trie; for duplicate strings the first id wins. Empty strings are ignored.
    pub fn new<'a>(tokens: impl IntoIterator<Item = (&'a str, u32)>) -> AddedTokens {
        let mut trie = AddedTokens { nodes: vec![Node::default()] };
        for (text, id) in tokens {
            if text.is_empty() {
                continue;
            }
            let mut node = 0usize;
            for &b in text.as_bytes() {
                node = trie.child_or_insert(node, b);
            }
            trie.nodes[node].id.get_or_insert(id);
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

    /// Longest token starting at `text[0]`: (byte length, id).
    fn longest_at(&self, text: &[u8]) -> Option<(usize, u32)> {
        let mut node = 0usize;
        let mut best = None;
        for (i, &b) in text.iter().enumerate() {
            match self.child(node, b) {
                Some(c) => node = c,
                None => break,
            }
            if let Some(id) = self.nodes[node].id {
                best = Some((i + 1, id));
            }
        }
        best
    }

    /// Split `text` into plain-text runs and added tokens, calling `f` for each in order.
    /// Tokens are valid UTF-8, so matches always start and end on char boundaries.
    pub fn split<'t>(&self, text: &'t str, mut f: impl FnMut(Segment<'t>)) {
        let bytes = text.as_bytes();
        let (mut start, mut i) = (0usize, 0usize);
        if self.nodes[0].children.is_empty() {
            i = bytes.len();
        }
        while i < bytes.len() {
            match self.longest_at(&bytes[i..]) {
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
mod tests {
    use super::*;

    #[test]
    fn leftmost_longest() {
        let t = AddedTokens::new([("<a>", 1), ("<a><b>", 2), ("\n", 3), ("\n\n", 4)]);
        let mut v = vec![];
        t.split("x<a><b>y<a>\n\n\nz", |s| v.push(s));
        use Segment::*;
        assert_eq!(v, [Text("x"), Token(2), Text("y"), Token(1), Token(4), Token(3), Text("z")]);
    }
}
