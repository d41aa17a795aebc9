//! A JSON Schema `pattern` (an ECMA-262 regular expression) as grammar
//! symbols for a JSON string's content: every character is written as JSON
//! needs it (`"` and `\` escaped, control characters as escapes).
//!
//! The subset: literals, `.`, classes (`[a-z_]`, `[^"]`), `\d \w \s` and
//! their negations, the usual escapes, groups (`(…)`, `(?:…)`),
//! alternation, the quantifiers `* + ? {n} {n,} {n,m}` (a lazy `?` after one
//! changes nothing here), and `^` / `$` at the ends. Without `^` (or `$`)
//! the match may begin (or end) anywhere in the string, as JSON Schema
//! says. Back-references, look-arounds and anchors inside are refused. The
//! output is always a string the pattern matches (`\d` makes ASCII digits
//! only, and `\D \W \S` ASCII characters only: subsets of what a
//! Unicode-aware validator accepts).

use super::{char_set, Builder, Sym, MAX_NESTING};

/// Counted repetitions above this are refused (they expand into rules).
const MAX_COUNT: usize = 1000;

enum Node {
    /// One character in the ranges, or with `negate` in none of them.
    Chars(Vec<(u32, u32)>, bool),
    Seq(Vec<Node>),
    Alt(Vec<Node>),
    Repeat(Box<Node>, usize, Option<usize>),
}

/// The symbols for a JSON string's content matching `pattern`.
pub fn compile(b: &mut Builder, pattern: &str) -> Result<Vec<Sym>, String> {
    let mut chars: Vec<char> = pattern.chars().collect();
    let anchored_start = chars.first() == Some(&'^');
    if anchored_start {
        chars.remove(0);
    }
    let escaped_end = chars.len() >= 2 && chars[chars.len() - 2] == '\\' && {
        // an odd number of backslashes before the final `$` escapes it
        let n = chars[..chars.len() - 1].iter().rev().take_while(|&&c| c == '\\').count();
        n % 2 == 1
    };
    let anchored_end = chars.last() == Some(&'$') && !escaped_end;
    if anchored_end {
        chars.pop();
    }
    let mut p = Parser { chars, at: 0, depth: 0 };
    let node = p.alternation()?;
    if p.at < p.chars.len() {
        return Err(format!("unexpected '{}' at character {}", p.chars[p.at].escape_debug(), p.at + 1));
    }
    let any = Node::Repeat(Box::new(Node::Chars(vec![(u32::from(b'\n'), u32::from(b'\n'))], true)), 0, None);
    let mut out = Vec::new();
    if !anchored_start {
        out.extend(emit(b, &any)?);
    }
    out.extend(emit(b, &node)?);
    if !anchored_end {
        out.extend(emit(b, &any)?);
    }
    Ok(out)
}

struct Parser {
    chars: Vec<char>,
    at: usize,
    /// Groups open around the current position (`emit` recurses as deep).
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn next(&mut self) -> Result<char, String> {
        let c = self.peek().ok_or("the pattern ends early")?;
        self.at += 1;
        Ok(c)
    }

    fn alternation(&mut self) -> Result<Node, String> {
        let mut alts = vec![self.sequence()?];
        while self.peek() == Some('|') {
            self.at += 1;
            alts.push(self.sequence()?);
        }
        Ok(if alts.len() == 1 { alts.pop().expect("one") } else { Node::Alt(alts) })
    }

    fn sequence(&mut self) -> Result<Node, String> {
        let mut items = Vec::new();
        while let Some(c) = self.peek() {
            if c == '|' || c == ')' {
                break;
            }
            let atom = self.atom()?;
            items.push(self.quantified(atom)?);
        }
        Ok(Node::Seq(items))
    }

    fn quantified(&mut self, atom: Node) -> Result<Node, String> {
        let (min, max) = match self.peek() {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            Some('{') => {
                self.at += 1;
                let min = self.number()?;
                let max = if self.peek() == Some(',') {
                    self.at += 1;
                    if self.peek() == Some('}') {
                        None
                    } else {
                        Some(self.number()?)
                    }
                } else {
                    Some(min)
                };
                if self.peek() != Some('}') {
                    return Err("a counted repetition without its '}'".into());
                }
                if max.is_some_and(|m| m < min) {
                    return Err(format!(
                        "the repetition {{{min},{}}} has its maximum below its minimum",
                        max.unwrap_or(0)
                    ));
                }
                (min, max)
            }
            _ => return Ok(atom),
        };
        self.at += 1;
        if self.peek() == Some('?') {
            self.at += 1;
        }
        if matches!(self.peek(), Some('*' | '+' | '?' | '{')) {
            return Err(format!("a quantifier after a quantifier at character {}", self.at + 1));
        }
        Ok(Node::Repeat(Box::new(atom), min, max))
    }

    fn number(&mut self) -> Result<usize, String> {
        let start = self.at;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.at += 1;
        }
        if start == self.at {
            return Err(format!("a counted repetition without a number at character {}", start + 1));
        }
        let digits: String = self.chars[start..self.at].iter().collect();
        // a count too large for usize is above the limit too
        match digits.parse::<usize>() {
            Ok(n) if n <= MAX_COUNT => Ok(n),
            _ => Err(format!("a repetition count above {MAX_COUNT}")),
        }
    }

    fn atom(&mut self) -> Result<Node, String> {
        let at = self.at + 1;
        match self.next()? {
            '(' => {
                if self.depth >= MAX_NESTING {
                    return Err(format!("groups nested deeper than {MAX_NESTING} levels at character {at}"));
                }
                if self.peek() == Some('?') {
                    self.at += 1;
                    if self.next()? != ':' {
                        return Err(format!("unsupported group '(?' at character {at} (only '(?:' is)"));
                    }
                }
                self.depth += 1;
                let inner = self.alternation()?;
                self.depth -= 1;
                if self.next()? != ')' {
                    return Err(format!("the group at character {at} is not closed"));
                }
                Ok(inner)
            }
            '[' => self.class(),
            '.' => Ok(Node::Chars(vec![(u32::from(b'\n'), u32::from(b'\n'))], true)),
            '\\' => self.escape(false),
            c @ ('^' | '$') => Err(format!("unsupported anchor '{c}' inside the pattern at character {at}")),
            c @ ('*' | '+' | '?' | '{' | '}' | ']' | ')') => Err(format!("unexpected '{c}' at character {at}")),
            c => Ok(Node::Chars(vec![(c as u32, c as u32)], false)),
        }
    }

    /// After `\`: a class (`\d`, …) or one character.
    fn escape(&mut self, in_class: bool) -> Result<Node, String> {
        let at = self.at;
        let one = |c: char| Ok(Node::Chars(vec![(c as u32, c as u32)], false));
        let digit = vec![(u32::from(b'0'), u32::from(b'9'))];
        let word = vec![(48, 57), (65, 90), (95, 95), (97, 122)];
        let space = vec![(9, 13), (32, 32)];
        match self.next()? {
            // the negations within ASCII: a Unicode-aware validator's \d, \w
            // and \s also take non-ASCII digits, letters and spaces
            'd' => Ok(Node::Chars(digit, false)),
            'D' => Ok(Node::Chars(ascii_without(&digit), false)),
            'w' => Ok(Node::Chars(word, false)),
            'W' => Ok(Node::Chars(ascii_without(&word), false)),
            's' => Ok(Node::Chars(space, false)),
            'S' => Ok(Node::Chars(ascii_without(&space), false)),
            'n' => one('\n'),
            't' => one('\t'),
            'r' => one('\r'),
            'f' => one('\u{c}'),
            'v' => one('\u{b}'),
            'b' if in_class => one('\u{8}'),
            'u' => {
                let hex: String = (0..4).map(|_| self.next()).collect::<Result<_, _>>()?;
                let v = u32::from_str_radix(&hex, 16).map_err(|_| format!("a bad '\\u' escape at character {at}"))?;
                one(char::from_u32(v).ok_or_else(|| format!("'\\u{hex}' at character {at} is a surrogate"))?)
            }
            c if c.is_ascii_alphanumeric() => Err(format!("unsupported escape '\\{c}' at character {at}")),
            c => one(c),
        }
    }

    /// After `[`: the class up to its `]`.
    fn class(&mut self) -> Result<Node, String> {
        let start = self.at;
        let negate = self.peek() == Some('^');
        if negate {
            self.at += 1;
        }
        let mut ranges = Vec::new();
        let mut first = true;
        loop {
            let c = self.next().map_err(|_| format!("the class at character {start} is not closed"))?;
            if c == ']' && !first {
                break;
            }
            first = false;
            let lo = match c {
                '\\' => match self.escape(true)? {
                    Node::Chars(r, false) if r.len() == 1 && r[0].0 == r[0].1 => r[0].0,
                    Node::Chars(r, false) => {
                        ranges.extend(r);
                        continue;
                    }
                    _ => return Err(format!("unsupported negated class escape inside the class at character {start}")),
                },
                c => c as u32,
            };
            if self.peek() == Some('-') && self.chars.get(self.at + 1).is_some_and(|&n| n != ']') {
                self.at += 1;
                let hi = match self.next()? {
                    '\\' => match self.escape(true)? {
                        Node::Chars(r, false) if r.len() == 1 && r[0].0 == r[0].1 => r[0].0,
                        _ => return Err(format!("a range ending in a class at character {}", self.at)),
                    },
                    c => c as u32,
                };
                if hi < lo {
                    return Err(format!("the range at character {start} runs backwards"));
                }
                ranges.push((lo, hi));
            } else {
                ranges.push((lo, lo));
            }
        }
        Ok(Node::Chars(ranges, negate))
    }
}

/// The ASCII characters not in `ranges`.
fn ascii_without(ranges: &[(u32, u32)]) -> Vec<(u32, u32)> {
    char_set(ranges, true).into_iter().filter(|&(a, _)| a <= 0x7f).map(|(a, z)| (a, z.min(0x7f))).collect()
}

/// One character of the set as it is written inside a JSON string.
fn json_char(b: &mut Builder, ranges: &[(u32, u32)], negate: bool) -> Result<Sym, String> {
    let set = char_set(ranges, negate);
    if let Some(&sym) = b.json_classes.get(&set) {
        return Ok(sym);
    }
    let sym = json_char_rule(b, &set)?;
    b.json_classes.insert(set, sym);
    Ok(sym)
}

/// `json_char`'s rule for the merged set `set`.
fn json_char_rule(b: &mut Builder, set: &[(u32, u32)]) -> Result<Sym, String> {
    let has = |c: u32| set.iter().any(|&(a, z)| a <= c && c <= z);
    let mut alts: Vec<Vec<Sym>> = Vec::new();
    // written as they are: everything but control characters, '"' and '\'
    let plain: Vec<(u32, u32)> = char_set(set, false)
        .into_iter()
        .flat_map(|(a, z)| {
            let mut parts = Vec::new();
            let mut lo = a.max(0x20);
            for special in [u32::from(b'"'), u32::from(b'\\')] {
                if lo <= special && special <= z {
                    if lo < special {
                        parts.push((lo, special - 1));
                    }
                    lo = special + 1;
                }
            }
            if lo <= z {
                parts.push((lo, z));
            }
            parts
        })
        .collect();
    if !plain.is_empty() {
        alts.push(vec![b.chars(&plain, false)?]);
    }
    let escape = |s: &str| s.bytes().map(|x| Sym::Bytes(x, x)).collect::<Vec<Sym>>();
    for (c, e) in [(u32::from(b'"'), "\\\""), (u32::from(b'\\'), "\\\\")] {
        if has(c) {
            alts.push(escape(e));
        }
    }
    for c in 0..0x20u32 {
        if has(c) {
            let e = match c {
                0x0a => "\\n".to_string(),
                0x09 => "\\t".to_string(),
                0x0d => "\\r".to_string(),
                _ => format!("\\u{c:04x}"),
            };
            alts.push(escape(&e));
        }
    }
    if alts.is_empty() {
        return Err("a class that matches no character".into());
    }
    b.alt(alts)
}

fn emit(b: &mut Builder, node: &Node) -> Result<Vec<Sym>, String> {
    Ok(match node {
        Node::Chars(ranges, negate) => vec![json_char(b, ranges, *negate)?],
        Node::Seq(items) => {
            let mut out = Vec::new();
            for item in items {
                out.extend(emit(b, item)?);
            }
            out
        }
        Node::Alt(alts) => {
            let alts = alts.iter().map(|a| emit(b, a)).collect::<Result<Vec<_>, _>>()?;
            vec![b.alt(alts)?]
        }
        Node::Repeat(inner, min, max) => {
            let one = emit(b, inner)?;
            let one = if one.len() == 1 { one } else { vec![b.alt(vec![one])?] };
            b.repeat(&one, &[], *min, *max)?
        }
    })
}
