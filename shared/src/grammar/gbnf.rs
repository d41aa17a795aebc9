//! llama.cpp's GBNF grammar text compiled to a grammar (`--grammar FILE`).
//!
//! `name ::= alternatives`, one rule per line (a rule continues on the next
//! line after `::=`, after `|` or inside parentheses); the output matches `root`.
//! Elements: `"literal"` and `[class]` (with `^`, ranges, and the escapes
//! `\n \r \t \\ \" \] \- \xHH \uHHHH \UHHHHHHHH`), `.` (any character), rule
//! names, `( … )`, and the postfix `* + ? {m} {m,} {m,n}`; `#` starts a
//! comment. Errors name the line.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use super::{Builder, Grammar, RuleId, Sym, MAX_NESTING};

/// Counted repetitions above this are refused (they expand into rules).
const MAX_COUNT: usize = 1000;

pub fn compile(text: &str) -> Result<Grammar, String> {
    compile_until(text, None)
}

/// `compile`, stopping with `grammar::DEADLINE_PASSED` once `deadline` has
/// passed. Linear in the text: every character is read once.
pub fn compile_until(text: &str, deadline: Option<Instant>) -> Result<Grammar, String> {
    let mut p = Parser {
        text,
        s: text.as_bytes(),
        at: 0,
        depth: 0,
        b: Builder::until(deadline),
        names: HashMap::new(),
        defined: HashSet::new(),
    };
    p.skip_space(true);
    while p.at < p.s.len() {
        p.rule()?;
        p.skip_space(true);
    }
    let mut undefined: Vec<&String> = p.names.keys().filter(|n| !p.defined.contains(*n)).collect();
    undefined.sort();
    if let Some(name) = undefined.first() {
        return Err(format!("grammar: rule '{}' is used but never defined", name.escape_debug()));
    }
    let root = *p.names.get("root").ok_or("grammar: no 'root' rule")?;
    let Parser { b, names, .. } = p;
    b.finish(root).map_err(|e| {
        // name the rule instead of its number
        let id = e.split_whitespace().nth(1).and_then(|n| n.parse::<RuleId>().ok());
        match id.and_then(|id| names.iter().find(|(_, &v)| v == id)) {
            Some((name, _)) if e.starts_with("rule ") => format!(
                "grammar: rule '{}' {}",
                name.escape_debug(),
                e.split_once(' ').map_or("", |x| x.1).split_once(' ').map_or("", |x| x.1)
            ),
            _ => format!("grammar: {e}"),
        }
    })
}

struct Parser<'t> {
    text: &'t str,
    s: &'t [u8],
    at: usize,
    /// Groups open around the current position.
    depth: usize,
    b: Builder,
    names: HashMap<String, RuleId>,
    defined: HashSet<String>,
}

impl Parser<'_> {
    fn line(&self) -> usize {
        1 + self.s[..self.at.min(self.s.len())].iter().filter(|&&c| c == b'\n').count()
    }

    fn err<T>(&self, what: &str) -> Result<T, String> {
        Err(format!("grammar: line {}: {what}", self.line()))
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    /// The character at the current position, escaped for a message.
    fn char_here(&self) -> String {
        let c = self.text.get(self.at..).and_then(|t| t.chars().next()).unwrap_or('\u{fffd}');
        c.escape_debug().to_string()
    }

    /// Spaces, tabs and comments; newlines too where `newlines`.
    fn skip_space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' | b'\r' => self.at += 1,
                b'\n' if newlines => self.at += 1,
                b'#' => {
                    while self.peek().is_some_and(|c| c != b'\n') {
                        self.at += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Result<String, String> {
        let start = self.at;
        while self.peek().is_some_and(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_') {
            self.at += 1;
        }
        if start == self.at {
            return match self.peek() {
                Some(c) if !c.is_ascii() => self.err(&format!(
                    "'{}' where a rule name should be (rule names are ASCII letters, digits, '-' and '_')",
                    self.char_here()
                )),
                _ => self.err("expected a rule name"),
            };
        }
        Ok(String::from_utf8_lossy(&self.s[start..self.at]).into_owned())
    }

    fn rule_id(&mut self, name: &str) -> Result<RuleId, String> {
        if let Some(&id) = self.names.get(name) {
            return Ok(id);
        }
        let id = self.b.declare()?;
        self.names.insert(name.to_string(), id);
        Ok(id)
    }

    fn rule(&mut self) -> Result<(), String> {
        let name = self.name()?;
        self.skip_space(false);
        if !self.s[self.at..].starts_with(b"::=") {
            return match self.peek() {
                Some(c) if !c.is_ascii() => self.err(&format!(
                    "'{}' in a rule name (rule names are ASCII letters, digits, '-' and '_')",
                    self.char_here()
                )),
                _ => self.err(&format!("expected '::=' after '{}'", name.escape_debug())),
            };
        }
        self.at += 3;
        self.skip_space(true);
        if self.defined.contains(&name) {
            return self.err(&format!("rule '{}' is defined twice", name.escape_debug()));
        }
        let id = self.rule_id(&name)?;
        self.defined.insert(name);
        let alts = self.alternatives(false)?;
        self.b.define(id, alts);
        match self.peek() {
            None | Some(b'\n') => Ok(()),
            Some(_) => self.err(&format!("unexpected '{}'", self.char_here())),
        }
    }

    fn alternatives(&mut self, nested: bool) -> Result<Vec<Vec<Sym>>, String> {
        let mut alts = vec![self.sequence(nested)?];
        while self.peek() == Some(b'|') {
            self.at += 1;
            self.skip_space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(alts)
    }

    fn sequence(&mut self, nested: bool) -> Result<Vec<Sym>, String> {
        let mut out = Vec::new();
        loop {
            self.skip_space(nested);
            let Some(c) = self.peek() else { break };
            let item: Vec<Sym> = match c {
                b'"' => {
                    self.at += 1;
                    let mut lit = Vec::new();
                    loop {
                        match self.peek() {
                            None | Some(b'\n') => return self.err("a literal is not closed"),
                            Some(b'"') => break,
                            _ => {
                                let ch = self.char()?;
                                let mut buf = [0u8; 4];
                                lit.extend(ch.encode_utf8(&mut buf).bytes().map(|x| Sym::Bytes(x, x)));
                            }
                        }
                    }
                    self.at += 1;
                    lit
                }
                b'[' => vec![self.class()?],
                b'.' => {
                    self.at += 1;
                    vec![self.b.chars(&[], true)?]
                }
                b'(' => {
                    if self.depth >= MAX_NESTING {
                        return self.err(&format!("groups nested deeper than {MAX_NESTING} levels"));
                    }
                    self.at += 1;
                    self.depth += 1;
                    self.skip_space(true);
                    let alts = self.alternatives(true)?;
                    self.skip_space(true);
                    if self.peek() != Some(b')') {
                        return self.err("a group is not closed");
                    }
                    self.at += 1;
                    self.depth -= 1;
                    vec![self.b.alt(alts)?]
                }
                c if c.is_ascii_alphanumeric() || c == b'-' || c == b'_' => {
                    let start = self.at;
                    let name = self.name()?;
                    let after = self.at;
                    self.skip_space(false);
                    if self.s[self.at..].starts_with(b"::=") {
                        // the next rule begins: this sequence has ended
                        self.at = start;
                        break;
                    }
                    self.at = after;
                    vec![Sym::Rule(self.rule_id(&name)?)]
                }
                _ => break,
            };
            let item = self.postfix(item)?;
            out.extend(item);
        }
        Ok(out)
    }

    fn postfix(&mut self, item: Vec<Sym>) -> Result<Vec<Sym>, String> {
        let (min, max) = match self.peek() {
            Some(b'*') => (0, None),
            Some(b'+') => (1, None),
            Some(b'?') => (0, Some(1)),
            Some(b'{') => {
                self.at += 1;
                self.skip_space(false);
                let min = self.count()?;
                self.skip_space(false);
                let max = if self.peek() == Some(b',') {
                    self.at += 1;
                    self.skip_space(false);
                    if self.peek() == Some(b'}') {
                        None
                    } else {
                        Some(self.count()?)
                    }
                } else {
                    Some(min)
                };
                self.skip_space(false);
                if self.peek() != Some(b'}') {
                    return self.err("a counted repetition without its '}'");
                }
                if max.is_some_and(|m| m < min) {
                    return self.err("a repetition whose maximum is below its minimum");
                }
                (min, max)
            }
            _ => return Ok(item),
        };
        self.at += 1;
        let one = if item.len() == 1 { item } else { vec![self.b.alt(vec![item])?] };
        self.b.repeat(&one, &[], min, max)
    }

    fn count(&mut self) -> Result<usize, String> {
        let start = self.at;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.at += 1;
        }
        if start == self.at {
            return self.err("expected a number");
        }
        // the digits are ASCII; a count too large for usize is above the limit too
        match self.text[start..self.at].parse::<usize>() {
            Ok(n) if n <= MAX_COUNT => Ok(n),
            _ => self.err(&format!("a repetition count above {MAX_COUNT}")),
        }
    }

    /// One character of a literal or class, escapes decoded.
    fn char(&mut self) -> Result<char, String> {
        // one character of the text (`at` is always on a character boundary)
        let Some(c) = self.text.get(self.at..).and_then(|t| t.chars().next()) else {
            return self.err("a literal or class ends early");
        };
        self.at += c.len_utf8();
        if c != '\\' {
            return Ok(c);
        }
        let Some(e) = self.text.get(self.at..).and_then(|t| t.chars().next()) else {
            return self.err("an escape at the end");
        };
        self.at += e.len_utf8();
        let hex = |p: &mut Self, n: usize| -> Result<char, String> {
            let digits = p.text.get(p.at..p.at + n).filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()));
            match digits.and_then(|d| u32::from_str_radix(d, 16).ok()).and_then(char::from_u32) {
                Some(c) => {
                    p.at += n;
                    Ok(c)
                }
                None => p.err("a bad hexadecimal escape"),
            }
        };
        match e {
            'n' => Ok('\n'),
            'r' => Ok('\r'),
            't' => Ok('\t'),
            'x' => hex(self, 2),
            'u' => hex(self, 4),
            'U' => hex(self, 8),
            '\\' | '"' | '[' | ']' | '-' | '^' => Ok(e),
            _ => self.err(&format!("unknown escape '\\{}'", e.escape_debug())),
        }
    }

    fn class(&mut self) -> Result<Sym, String> {
        self.at += 1;
        let negate = self.peek() == Some(b'^');
        if negate {
            self.at += 1;
        }
        let mut ranges = Vec::new();
        loop {
            match self.peek() {
                None | Some(b'\n') => return self.err("a character class is not closed"),
                Some(b']') => break,
                _ => {}
            }
            let lo = self.char()? as u32;
            if self.peek() == Some(b'-') && self.s.get(self.at + 1).is_some_and(|&c| c != b']') {
                self.at += 1;
                let hi = self.char()? as u32;
                if hi < lo {
                    return self.err("a character range runs backwards");
                }
                ranges.push((lo, hi));
            } else {
                ranges.push((lo, lo));
            }
        }
        self.at += 1;
        self.b.chars(&ranges, negate)
    }
}
