//! Where a grammar's parse can be after some bytes: a set of stacks.
//!
//! A stack's top is the position of the byte range the next byte must
//! match; below it are the positions where each enclosing rule resumes.
//! Stacks are persistent: a node is (position, node below), interned, so a
//! stack is one node id, two parses that reach the same stack share it, and
//! a `State` (the sorted top ids) is cheap to copy, compare and hash.
//! Expanding a rule whose reference ends an alternative does not push a
//! resume position (a tail call), so a right-recursive repetition keeps its
//! stack depth.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use super::{Grammar, Sym};
use crate::tokenizer::bpe::{pair_key, PairHasher};

/// No node below: the bottom of every stack.
const BOTTOM: u32 = u32::MAX;

/// The most stack nodes one byte may expand, the most parses (stack tops)
/// a state may hold, and the most nodes a matcher may make: a grammar so
/// ambiguous that one byte leaves more parses than this (`root ::= x{1000}`
/// with a nullable recursive `x`, or 500 alternatives that all match the
/// same byte) would otherwise take unbounded time and memory. Past any of
/// them, the parse is cut: the state is dead and `Matcher::overflowed` says
/// why. JSON Schema grammars expand tens of nodes a byte and keep a few
/// tops (an `enum` of many values is a tree of shared prefixes).
const MAX_EXPANDED: usize = 1024;
const MAX_TOPS: usize = 256;
const MAX_NODES: usize = 1 << 22;

/// Where the parse can be: the stack tops (each at a `Sym::Bytes`), sorted,
/// and whether the output so far is already a whole match.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct State {
    pub tops: Vec<u32>,
    pub accepting: bool,
}

impl State {
    /// No byte can follow and nothing has matched: the output cannot be
    /// completed.
    pub fn is_dead(&self) -> bool {
        self.tops.is_empty() && !self.accepting
    }
}

/// The grammar and every stack node made so far.
pub struct Matcher {
    grammar: Arc<Grammar>,
    /// Node id → (position in `grammar.syms`, node below).
    nodes: Vec<(u32, u32)>,
    ids: HashMap<u64, u32, BuildHasherDefault<PairHasher>>,
    /// Per node, the last `visit` stamp that reached it (one expansion
    /// visits each node once).
    seen: Vec<u32>,
    visit: u32,
    work: Vec<u32>,
    overflowed: bool,
    /// Nodes expanded so far (the work a mask did).
    pub expansions: u64,
}

impl Matcher {
    pub fn new(grammar: Arc<Grammar>) -> Matcher {
        Matcher {
            grammar,
            nodes: Vec::new(),
            ids: HashMap::default(),
            seen: Vec::new(),
            visit: 0,
            work: Vec::new(),
            overflowed: false,
            expansions: 0,
        }
    }

    /// A parse was cut for its size (`MAX_EXPANDED`, `MAX_TOPS`,
    /// `MAX_NODES`), or a mask ran past its budget.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// Marks the matcher cut (a mask ran past its budget).
    pub fn cut(&mut self) {
        self.overflowed = true;
    }

    fn node(&mut self, pos: u32, below: u32) -> u32 {
        let key = pair_key(pos, below);
        if let Some(&id) = self.ids.get(&key) {
            return id;
        }
        let id = self.nodes.len() as u32;
        self.nodes.push((pos, below));
        self.seen.push(0);
        self.ids.insert(key, id);
        id
    }

    /// The state before any byte.
    pub fn start(&mut self) -> State {
        let mut state = State::default();
        self.begin();
        let g = Arc::clone(&self.grammar);
        for &start in &g.alts[g.root as usize] {
            let n = self.node(start, BOTTOM);
            self.work.push(n);
        }
        self.expand(&mut state);
        state
    }

    /// The state after one more byte (dead if the byte cannot follow).
    pub fn advance(&mut self, from: &State, byte: u8, to: &mut State) {
        to.tops.clear();
        to.accepting = false;
        self.begin();
        for &top in &from.tops {
            let (pos, below) = self.nodes[top as usize];
            if let Sym::Bytes(lo, hi) = self.grammar.syms[pos as usize] {
                if (lo..=hi).contains(&byte) {
                    let n = self.node(pos + 1, below);
                    self.work.push(n);
                }
            }
        }
        self.expand(to);
    }

    fn begin(&mut self) {
        self.visit = self.visit.wrapping_add(1);
        if self.visit == 0 {
            self.seen.fill(0);
            self.visit = 1;
        }
        self.work.clear();
    }

    /// Expands the nodes in `work` until every stack's top is a byte range
    /// (kept in `state.tops`) or the stack has ended (`state.accepting`).
    fn expand(&mut self, state: &mut State) {
        let g = Arc::clone(&self.grammar);
        let syms = &g.syms;
        let mut expanded = 0;
        while let Some(id) = self.work.pop() {
            if self.seen[id as usize] == self.visit {
                continue;
            }
            self.seen[id as usize] = self.visit;
            expanded += 1;
            self.expansions += 1;
            if expanded > MAX_EXPANDED || state.tops.len() > MAX_TOPS || self.nodes.len() > MAX_NODES {
                self.overflowed = true;
                self.work.clear();
                state.tops.clear();
                state.accepting = false;
                return;
            }
            let (pos, below) = self.nodes[id as usize];
            match syms[pos as usize] {
                Sym::Bytes(..) => state.tops.push(id),
                Sym::End if below == BOTTOM => state.accepting = true,
                Sym::End => self.work.push(below),
                Sym::Rule(r) => {
                    let resume = match syms[pos as usize + 1] {
                        Sym::End => below,
                        _ => self.node(pos + 1, below),
                    };
                    for &start in &g.alts[r as usize] {
                        let n = self.node(start, resume);
                        self.work.push(n);
                    }
                }
            }
        }
        state.tops.sort_unstable();
    }

    /// The state after `bytes` (dead as soon as one cannot follow).
    pub fn advance_bytes(&mut self, from: &State, bytes: &[u8]) -> State {
        let mut cur = from.clone();
        let mut next = State::default();
        for &b in bytes {
            self.advance(&cur, b, &mut next);
            std::mem::swap(&mut cur, &mut next);
            if cur.is_dead() {
                break;
            }
        }
        cur
    }
}
