//! Which tokens can continue a constrained output.
//!
//! `Vocab` (once per tokenizer) holds every token's bytes and the ids sorted
//! by those bytes, with each one's common prefix length with the one
//! before. A mask walks that list once: a token's parse states are the
//! previous token's up to their common prefix, so each byte of the sorted
//! vocabulary's trie is matched once, and a prefix no parse can take skips
//! every token that starts with it.
//!
//! `Constraint` (once per request) keeps the parse state of the output so
//! far, answers whether one token may follow (the sampler's greedy choice
//! is checked first; most are allowed) and makes the whole mask when it
//! must, cached by parse state (an output's states repeat: every string
//! value, every array item).

use std::collections::HashMap;
use std::sync::Arc;

use super::matcher::{Matcher, State};
use super::Grammar;
use crate::tokenizer::Tokenizer;

/// Token ids sorted by their bytes.
struct Sorted {
    ids: Vec<u32>,
    /// `lcp[i]`: how many leading bytes token `ids[i]` shares with `ids[i - 1]`.
    lcp: Vec<u32>,
}

/// The vocabulary's bytes, for masks.
pub struct Vocab {
    /// Per id, the bytes after another token; empty for a token that never
    /// continues an output (control tokens).
    pieces: Vec<Box<[u8]>>,
    /// The first token of an output loses a leading space (SentencePiece).
    strips_first_space: bool,
    later: Sorted,
    first: Option<Sorted>,
}

impl Vocab {
    pub fn new(tokenizer: &Tokenizer) -> Vocab {
        let pieces: Vec<Box<[u8]>> = (0..tokenizer.vocab_size() as u32)
            .map(|id| if tokenizer.is_control(id) { Box::default() } else { tokenizer.piece(id).into() })
            .collect();
        Vocab::from_pieces(pieces, tokenizer.strips_leading_space())
    }

    /// Per id, the token's bytes (empty: never allowed).
    pub fn from_pieces(pieces: Vec<Box<[u8]>>, strips_first_space: bool) -> Vocab {
        let later = Sorted::new(&pieces, false);
        let first = strips_first_space.then(|| Sorted::new(&pieces, true));
        Vocab { pieces, strips_first_space, later, first }
    }

    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// Token `id`'s bytes, as the first token of the output or after another.
    fn bytes(&self, id: u32, first: bool) -> &[u8] {
        let p = self.pieces.get(id as usize).map_or(&[][..], |p| &p[..]);
        match p {
            [b' ', rest @ ..] if first && self.strips_first_space => rest,
            _ => p,
        }
    }
}

impl Sorted {
    fn new(pieces: &[Box<[u8]>], strip: bool) -> Sorted {
        let bytes = |id: u32| {
            let p = &pieces[id as usize][..];
            match p {
                [b' ', rest @ ..] if strip => rest,
                _ => p,
            }
        };
        let mut ids: Vec<u32> = (0..pieces.len() as u32).filter(|&id| !bytes(id).is_empty()).collect();
        ids.sort_by(|&a, &b| bytes(a).cmp(bytes(b)).then(a.cmp(&b)));
        let mut lcp = vec![0u32; ids.len()];
        for i in 1..ids.len() {
            let (a, b) = (bytes(ids[i - 1]), bytes(ids[i]));
            lcp[i] = a.iter().zip(b).take_while(|(x, y)| x == y).count() as u32;
        }
        Sorted { ids, lcp }
    }
}

/// What constrains an output: the grammar, and the vocabulary it is
/// applied to.
#[derive(Clone)]
pub struct Constrained {
    pub grammar: Arc<Grammar>,
    pub vocab: Arc<Vocab>,
}

impl std::fmt::Debug for Constrained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Constrained({} rules)", self.grammar.alts.len())
    }
}

/// One output's parse state and masks.
pub struct Constraint {
    matcher: Matcher,
    vocab: Arc<Vocab>,
    state: State,
    /// No token taken yet.
    first: bool,
    masks: HashMap<(State, bool), Arc<Vec<u64>>>,
    /// Scratch: the parse state after each byte of the current token.
    depth: Vec<State>,
}

/// Bytes of masks kept per request at most (a bit per token each: 19 KB
/// for a vocabulary of 152k).
const MAX_CACHED_MASK_BYTES: usize = 16 << 20;

/// Stack nodes one mask may expand (about a second of work): a grammar
/// whose parses multiply over the vocabulary's bytes is cut past it, not
/// left to hold the server's worker. JSON Schema masks expand a few
/// hundred thousand on a 150k vocabulary.
const MASK_BUDGET: u64 = 20_000_000;

impl Constraint {
    pub fn new(grammar: Arc<Grammar>, vocab: Arc<Vocab>) -> Constraint {
        let mut matcher = Matcher::new(grammar);
        let state = matcher.start();
        Constraint { matcher, vocab, state, first: true, masks: HashMap::new(), depth: Vec::new() }
    }

    /// The grammar is so ambiguous that a parse was cut (no token can then
    /// continue the output).
    pub fn overflowed(&self) -> bool {
        self.matcher.overflowed()
    }

    /// The output so far is a whole match (an end-of-text token may follow).
    pub fn accepting(&self) -> bool {
        self.state.accepting
    }

    /// The output is a whole match and no byte can follow: it is complete.
    pub fn complete(&self) -> bool {
        self.state.accepting && self.state.tops.is_empty()
    }

    /// Whether token `id`'s bytes can continue the output.
    pub fn allows(&mut self, id: u32) -> bool {
        let bytes = self.vocab.bytes(id, self.first);
        !bytes.is_empty() && !self.matcher.advance_bytes(&self.state, bytes).is_dead()
    }

    /// Takes token `id` into the output; false (and no change) if it cannot
    /// continue it.
    pub fn accept(&mut self, id: u32) -> bool {
        let bytes = self.vocab.bytes(id, self.first);
        let next = self.matcher.advance_bytes(&self.state, bytes);
        if bytes.is_empty() || next.is_dead() {
            return false;
        }
        self.state = next;
        self.first = false;
        true
    }

    /// A bit per token id (`mask[id / 64] >> (id % 64) & 1`): set for the
    /// tokens whose bytes can continue the output.
    pub fn mask(&mut self) -> Arc<Vec<u64>> {
        let key = (self.state.clone(), self.first);
        if let Some(m) = self.masks.get(&key) {
            return Arc::clone(m);
        }
        let vocab = Arc::clone(&self.vocab);
        let sorted = match (&vocab.first, self.first) {
            (Some(first), true) => first,
            _ => &vocab.later,
        };
        let mut mask = vec![0u64; vocab.len().div_ceil(64)];
        if self.depth.is_empty() {
            self.depth.push(State::default());
        }
        self.depth[0] = self.state.clone();
        // depth[0..=valid] are the states after the current token's first bytes
        let mut valid = 0usize;
        // a dead prefix length: every token sharing it is dead too
        let mut dead: Option<usize> = None;
        let budget_end = self.matcher.expansions + MASK_BUDGET;
        for (i, &id) in sorted.ids.iter().enumerate() {
            if self.matcher.expansions > budget_end {
                // cut: no token continues a parse this costly
                self.matcher.cut();
                mask.fill(0);
                break;
            }
            let bytes = vocab.bytes(id, self.first);
            let shared = sorted.lcp[i] as usize;
            if let Some(d) = dead {
                if shared >= d {
                    continue;
                }
                dead = None;
            }
            let mut k = shared.min(valid);
            while k < bytes.len() {
                if self.depth.len() <= k + 1 {
                    self.depth.push(State::default());
                }
                let (done, next) = self.depth.split_at_mut(k + 1);
                self.matcher.advance(&done[k], bytes[k], &mut next[0]);
                k += 1;
                if next[0].is_dead() {
                    dead = Some(k);
                    break;
                }
            }
            valid = k;
            if dead.is_none() {
                mask[id as usize / 64] |= 1 << (id % 64);
            }
        }
        let mask = Arc::new(mask);
        if (self.masks.len() + 1) * mask.len() * 8 <= MAX_CACHED_MASK_BYTES {
            self.masks.insert(key, Arc::clone(&mask));
        }
        mask
    }
}

/// Whether bit `id` of a mask is set.
pub fn allowed(mask: &[u64], id: u32) -> bool {
    mask.get(id as usize / 64).is_some_and(|w| w >> (id % 64) & 1 == 1)
}
