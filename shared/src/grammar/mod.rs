//! Constrained decoding: output that must match a grammar.
//!
//! * `Grammar` (this file): a context-free grammar over bytes, made with a
//!   `Builder`; characters are UTF-8 byte sequences (`Builder::chars`), so
//!   matching never decodes text;
//! * `schema`: a JSON Schema (or "any JSON object") compiled to a grammar;
//! * `pattern`: the regular-expression subset of a schema's `pattern`;
//! * `gbnf`: llama.cpp's GBNF grammar text compiled to a grammar;
//! * `matcher`: the grammar's parse stacks after some bytes, and one byte
//!   more;
//! * `vocab`: the vocabulary as sorted byte strings, and `Constraint`: which
//!   tokens can continue the output (the mask the sampler applies), per
//!   generated token.
//!
//! A grammar is compiled once per request; the vocabulary's sorted list
//! once per tokenizer.

pub mod gbnf;
mod matcher;
mod pattern;
pub mod schema;
mod vocab;

pub use vocab::{allowed, Constrained, Constraint, Vocab};

use std::time::Instant;

/// A rule's index in `Grammar::alts`.
pub type RuleId = u32;

/// One symbol of an alternative.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sym {
    /// One byte in `lo..=hi`.
    Bytes(u8, u8),
    /// Any alternative of the rule.
    Rule(RuleId),
    /// The end of an alternative.
    End,
}

/// Rules made of alternatives, each a sequence of symbols; the output must
/// be one whole match of `root`.
#[derive(Debug)]
pub struct Grammar {
    /// Every alternative's symbols, each followed by `End`.
    syms: Vec<Sym>,
    /// Per rule, where its alternatives start in `syms`.
    alts: Vec<Vec<u32>>,
    root: RuleId,
}

/// The most rules a grammar may have (a bound on what one request can make
/// the server build: repetition counts are expanded into rules).
pub const MAX_RULES: usize = 20_000;
/// The most symbols the rules of a grammar may hold in all (each
/// repetition's copies counted as it makes them), so that a short text
/// (`"a"{1000} "a"{1000} ...`) cannot make the server build gigabytes.
pub const MAX_SYMS: usize = 2_000_000;

/// Groups (GBNF parentheses, a pattern's groups) nested deeper than this
/// are refused: the parsers recurse once per level, and a request of a few
/// kilobytes must not exhaust a connection thread's stack.
pub const MAX_NESTING: usize = 100;

/// The end of an error message when the request's deadline passed while its
/// grammar was being compiled (the server answers 503 instead of 400).
pub const DEADLINE_PASSED: &str = "the request's deadline passed while its grammar was being compiled";

/// Err with `DEADLINE_PASSED` once `deadline` has passed.
fn check_deadline(deadline: Option<Instant>) -> Result<(), String> {
    match deadline {
        Some(d) if Instant::now() >= d => Err(DEADLINE_PASSED.to_string()),
        _ => Ok(()),
    }
}

/// Builds a grammar rule by rule; rules may refer to rules defined later.
#[derive(Default)]
pub struct Builder {
    rules: Vec<Option<Vec<Vec<Sym>>>>,
    /// Symbols made so far (rules defined, repetitions expanded).
    syms: usize,
    /// When compiling must stop (a request's deadline), if ever.
    deadline: Option<Instant>,
    /// The symbol of each character class made so far (by its merged
    /// ranges), so that a class written many times (`.` in a long pattern,
    /// `[a-z]` in every rule) is one rule, not one per use.
    char_classes: std::collections::HashMap<Vec<(u32, u32)>, Sym>,
    /// The same for a class as written inside a JSON string (`pattern.rs`).
    json_classes: std::collections::HashMap<Vec<(u32, u32)>, Sym>,
}

impl Builder {
    /// A builder that stops with `DEADLINE_PASSED` once `deadline` has passed
    /// (the clock is read every few hundred rules, and between the phases of
    /// `finish`).
    pub fn until(deadline: Option<Instant>) -> Builder {
        Builder { deadline, ..Builder::default() }
    }

    /// Err once the deadline has passed.
    pub fn check_deadline(&self) -> Result<(), String> {
        check_deadline(self.deadline)
    }

    /// A new rule, to be defined later (for recursion).
    pub fn declare(&mut self) -> Result<RuleId, String> {
        if self.rules.len() >= MAX_RULES {
            return Err(format!("the grammar needs more than {MAX_RULES} rules"));
        }
        if self.rules.len() % 256 == 255 {
            self.check_deadline()?;
        }
        self.rules.push(None);
        Ok((self.rules.len() - 1) as RuleId)
    }

    pub fn define(&mut self, id: RuleId, alts: Vec<Vec<Sym>>) {
        self.syms += alts.iter().map(|a| a.len() + 1).sum::<usize>();
        self.rules[id as usize] = Some(alts);
    }

    fn too_big(&self) -> Result<(), String> {
        match self.syms > MAX_SYMS {
            true => Err(format!("the grammar needs more than {MAX_SYMS} symbols")),
            false => Ok(()),
        }
    }

    /// A rule with these alternatives.
    pub fn rule(&mut self, alts: Vec<Vec<Sym>>) -> Result<RuleId, String> {
        let id = self.declare()?;
        self.define(id, alts);
        Ok(id)
    }

    /// `Sym::Rule` of a new rule with these alternatives.
    pub fn alt(&mut self, alts: Vec<Vec<Sym>>) -> Result<Sym, String> {
        Ok(Sym::Rule(self.rule(alts)?))
    }

    /// `seq` zero or one time.
    pub fn optional(&mut self, seq: Vec<Sym>) -> Result<Sym, String> {
        self.alt(vec![seq, vec![]])
    }

    /// `seq` any number of times (a right-recursive rule).
    pub fn star(&mut self, seq: Vec<Sym>) -> Result<Sym, String> {
        let id = self.declare()?;
        let mut again = seq;
        again.push(Sym::Rule(id));
        self.define(id, vec![again, vec![]]);
        Ok(Sym::Rule(id))
    }

    /// `seq` from `min` to `max` times (`None`: no upper bound), with
    /// `sep` between two of them.
    pub fn repeat(&mut self, seq: &[Sym], sep: &[Sym], min: usize, max: Option<usize>) -> Result<Vec<Sym>, String> {
        if max.is_some_and(|m| m < min) {
            return Err(format!("a repetition of at least {min} and at most {} times", max.unwrap_or(0)));
        }
        let cat = |a: &[Sym], b: &[Sym]| [a, b].concat();
        // after the first: (sep seq) up to `left` more times, nested so that
        // each is only reachable after the one before
        let more = |b: &mut Builder, left: Option<usize>| -> Result<Vec<Sym>, String> {
            match left {
                None => Ok(vec![b.star(cat(sep, seq))?]),
                Some(n) => {
                    let mut tail: Vec<Sym> = Vec::new();
                    for _ in 0..n {
                        let mut s = cat(sep, seq);
                        s.extend(tail);
                        tail = vec![b.optional(s)?];
                    }
                    Ok(tail)
                }
            }
        };
        if min == 0 {
            if max == Some(0) {
                return Ok(Vec::new());
            }
            let mut first = seq.to_vec();
            first.extend(more(self, max.map(|m| m - 1))?);
            return Ok(vec![self.optional(first)?]);
        }
        self.too_big()?;
        let mut out = seq.to_vec();
        for _ in 1..min {
            out.extend_from_slice(sep);
            out.extend_from_slice(seq);
            if self.syms + out.len() > MAX_SYMS {
                return Err(format!("the grammar needs more than {MAX_SYMS} symbols"));
            }
        }
        self.syms += out.len();
        out.extend(more(self, max.map(|m| m - min))?);
        Ok(out)
    }

    /// One UTF-8 character in one of `ranges` (scalar values, inclusive);
    /// with `negate`, one character in none of them.
    pub fn chars(&mut self, ranges: &[(u32, u32)], negate: bool) -> Result<Sym, String> {
        let clamped: Vec<(u32, u32)> = ranges.iter().map(|&(a, b)| (a.min(b), a.max(b).min(MAX_CHAR))).collect();
        let merged = char_set(&clamped, negate);
        if let Some(&sym) = self.char_classes.get(&merged) {
            return Ok(sym);
        }
        let mut alts = Vec::new();
        for &(a, b) in &merged {
            utf8_sequences(a, b, &mut alts);
        }
        let sym = if alts.len() == 1 && alts[0].len() == 1 { alts[0][0] } else { self.alt(alts)? };
        self.char_classes.insert(merged, sym);
        Ok(sym)
    }

    /// The grammar whose output is one match of `root`: every rule must be
    /// defined, and none may reach itself before reading a byte (the
    /// matcher expands rules eagerly, so left recursion would not end).
    pub fn finish(self, root: RuleId) -> Result<Grammar, String> {
        self.too_big()?;
        self.check_deadline()?;
        let deadline = self.deadline;
        let mut syms = Vec::new();
        let mut alts = Vec::with_capacity(self.rules.len());
        for (id, rule) in self.rules.into_iter().enumerate() {
            let rule = rule.ok_or_else(|| format!("rule {id} is used but never defined"))?;
            let mut starts = Vec::with_capacity(rule.len());
            for alt in rule {
                starts.push(syms.len() as u32);
                syms.extend(alt);
                syms.push(Sym::End);
            }
            alts.push(starts);
        }
        if syms.len() > u32::MAX as usize / 2 {
            return Err("the grammar is too large".into());
        }
        let grammar = Grammar { syms, alts, root };
        let nullable = grammar.fixpoint(Fixpoint::Nullable);
        if !grammar.fixpoint(Fixpoint::Productive)[root as usize] {
            return Err(NO_MATCH.into());
        }
        check_deadline(deadline)?;
        grammar.check_left_recursion(&nullable)?;
        check_deadline(deadline)?;
        // a grammar whose very first parse is cut for its size cannot be used
        let grammar = std::sync::Arc::new(grammar);
        let mut m = matcher::Matcher::new(std::sync::Arc::clone(&grammar));
        m.start();
        if m.overflowed() {
            return Err("the grammar is too ambiguous: its start alone has more parses than the matcher keeps".into());
        }
        drop(m);
        Ok(std::sync::Arc::try_unwrap(grammar).expect("the matcher was dropped"))
    }
}

/// The message of a grammar that no text matches.
pub const NO_MATCH: &str =
    "no text matches the grammar (every way through it needs a rule that never ends, or a character class without a character)";

/// What `Grammar::fixpoint` computes per rule.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fixpoint {
    /// The rule can match no bytes at all (the empty text).
    Nullable,
    /// The rule can match some text (it can end).
    Productive,
}

impl Grammar {
    /// Per rule, whether it is nullable (or productive): a rule is when one
    /// of its alternatives has only such rules (and, for productive, byte
    /// ranges) in it. Linear in the grammar's size: each alternative counts
    /// the rule symbols not yet known to be so, and a rule found to be so
    /// lowers the counts of the alternatives it occurs in.
    fn fixpoint(&self, kind: Fixpoint) -> Vec<bool> {
        let n_rules = self.alts.len();
        // per alternative: its rule, and how many of its rule symbols are not yet known
        let mut owner: Vec<u32> = Vec::new();
        let mut waiting: Vec<u32> = Vec::new();
        // per rule: the alternatives each of its occurrences is in
        let mut occurs_in: Vec<Vec<u32>> = vec![Vec::new(); n_rules];
        let mut done = vec![false; n_rules];
        let mut queue: Vec<u32> = Vec::new();
        for (r, starts) in self.alts.iter().enumerate() {
            for &s in starts {
                let alt = owner.len() as u32;
                let mut count = 0u32;
                let mut has_bytes = false;
                for x in self.syms[s as usize..].iter().take_while(|&&x| x != Sym::End) {
                    match *x {
                        Sym::Rule(q) => {
                            count += 1;
                            occurs_in[q as usize].push(alt);
                        }
                        _ => has_bytes = true,
                    }
                }
                // a byte range can never match the empty text
                let possible = kind == Fixpoint::Productive || !has_bytes;
                owner.push(r as u32);
                waiting.push(if possible { count } else { u32::MAX });
                if possible && count == 0 && !done[r] {
                    done[r] = true;
                    queue.push(r as u32);
                }
            }
        }
        while let Some(q) = queue.pop() {
            for &alt in &occurs_in[q as usize] {
                let w = &mut waiting[alt as usize];
                if *w == u32::MAX {
                    continue;
                }
                *w -= 1;
                let r = owner[alt as usize] as usize;
                if *w == 0 && !done[r] {
                    done[r] = true;
                    queue.push(r as u32);
                }
            }
        }
        done
    }

    fn check_left_recursion(&self, nullable: &[bool]) -> Result<(), String> {
        // rules each rule can expand to before reading a byte
        let first: Vec<Vec<RuleId>> = self
            .alts
            .iter()
            .map(|starts| {
                let mut out = Vec::new();
                for &s in starts {
                    for x in &self.syms[s as usize..] {
                        match *x {
                            Sym::Rule(q) => {
                                out.push(q);
                                if !nullable[q as usize] {
                                    break;
                                }
                            }
                            _ => break,
                        }
                    }
                }
                out
            })
            .collect();
        // depth-first search for a cycle: 0 new, 1 on the path, 2 done
        let mut mark = vec![0u8; self.alts.len()];
        for start in 0..self.alts.len() {
            if mark[start] != 0 {
                continue;
            }
            let mut path: Vec<(usize, usize)> = vec![(start, 0)];
            mark[start] = 1;
            while let Some((r, i)) = path.last_mut() {
                let r = *r;
                if let Some(&q) = first[r].get(*i) {
                    *i += 1;
                    match mark[q as usize] {
                        0 => {
                            mark[q as usize] = 1;
                            path.push((q as usize, 0));
                        }
                        1 => {
                            return Err(format!(
                                "rule {q} is left-recursive (it can reach itself before reading a character)"
                            ))
                        }
                        _ => {}
                    }
                } else {
                    mark[r] = 2;
                    path.pop();
                }
            }
        }
        Ok(())
    }
}

/// The largest scalar value.
pub(crate) const MAX_CHAR: u32 = 0x10_ffff;

/// The characters in `ranges` (or, with `negate`, in none of them), sorted
/// and merged into disjoint ranges.
pub(crate) fn char_set(ranges: &[(u32, u32)], negate: bool) -> Vec<(u32, u32)> {
    let mut set: Vec<(u32, u32)> = ranges.to_vec();
    set.sort_unstable();
    let mut merged: Vec<(u32, u32)> = Vec::new();
    for (a, b) in set {
        match merged.last_mut() {
            Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    if !negate {
        return merged;
    }
    let mut out = Vec::new();
    let mut next = 0;
    for (a, b) in merged {
        if a > next {
            out.push((next, a - 1));
        }
        next = b + 1;
    }
    if next <= MAX_CHAR {
        out.push((next, MAX_CHAR));
    }
    out
}

/// The UTF-8 encodings of the scalar values `lo..=hi` (surrogates left
/// out) as sequences of byte ranges, appended to `out`.
fn utf8_sequences(lo: u32, hi: u32, out: &mut Vec<Vec<Sym>>) {
    if lo > hi {
        return;
    }
    if lo <= 0xdfff && hi >= 0xd800 {
        if lo < 0xd800 {
            utf8_sequences(lo, 0xd7ff, out);
        }
        if hi > 0xdfff {
            utf8_sequences(0xe000, hi, out);
        }
        return;
    }
    // one encoded length at a time
    for limit in [0x7f, 0x7ff, 0xffff] {
        if lo <= limit && hi > limit {
            utf8_sequences(lo, limit, out);
            utf8_sequences(limit + 1, hi, out);
            return;
        }
    }
    if hi <= 0x7f {
        out.push(vec![Sym::Bytes(lo as u8, hi as u8)]);
        return;
    }
    // split until every continuation byte but the first differing one spans its whole range
    let len = if hi <= 0x7ff {
        2
    } else if hi <= 0xffff {
        3
    } else {
        4
    };
    for i in 1..len {
        let m = (1u32 << (6 * i)) - 1;
        if lo & !m != hi & !m {
            if lo & m != 0 {
                utf8_sequences(lo, lo | m, out);
                utf8_sequences((lo | m) + 1, hi, out);
                return;
            }
            if hi & m != m {
                utf8_sequences(lo, (hi & !m) - 1, out);
                utf8_sequences(hi & !m, hi, out);
                return;
            }
        }
    }
    let (mut a, mut b) = ([0u8; 4], [0u8; 4]);
    let a = char::from_u32(lo).expect("not a surrogate").encode_utf8(&mut a).as_bytes().to_vec();
    let b = char::from_u32(hi).expect("not a surrogate").encode_utf8(&mut b).as_bytes().to_vec();
    out.push(a.iter().zip(&b).map(|(&x, &y)| Sym::Bytes(x, y)).collect());
}

#[cfg(test)]
mod tests;
