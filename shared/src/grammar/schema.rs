//! A JSON Schema compiled to a grammar whose every match parses as JSON and
//! validates against the schema.
//!
//! The subset: `type` (one or a list), `properties`, `required`,
//! `additionalProperties`, `items`, `enum`, `const`, `anyOf`, `allOf` with
//! one schema, `minItems` / `maxItems`, `minLength` / `maxLength`, string
//! `pattern` (`pattern.rs`), `$ref` to `#`, `#/$defs/…` or
//! `#/definitions/…`. Annotations (`title`, `description`, `default`,
//! `examples`, …) are ignored; any other keyword is refused, named with
//! where it is, so that a schema is never half applied.
//!
//! The output is compact JSON with at most one space after `:` and `,`
//! (small models otherwise pad with whitespace); object properties come in
//! the schema's order, each one in `required` always, the others
//! optionally; other properties only where none is declared and
//! `additionalProperties` allows them (a schema with no `properties` takes
//! any object). `enum` and `const` values not of the schema's `type` are
//! left out, and the values are a tree of shared prefixes. Numbers have at most 16 digits before and after the point
//! and 3 in the exponent, so that a model cannot run on forever inside one.

use std::collections::HashMap;
use std::time::Instant;

use serde_json::{Map, Value};

use super::pattern;
use super::{Builder, Grammar, RuleId, Sym, NO_MATCH};

/// Keywords that say nothing about which values are valid.
const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$defs",
    "definitions",
    "strict",
];

/// Nesting deeper than this is refused (the compiler recurses per level).
const MAX_DEPTH: usize = 64;

/// The grammar of a JSON value valid against `schema`.
pub fn compile(schema: &Value) -> Result<Grammar, String> {
    compile_until(schema, None)
}

/// `compile`, stopping with `grammar::DEADLINE_PASSED` once `deadline` has passed.
pub fn compile_until(schema: &Value, deadline: Option<Instant>) -> Result<Grammar, String> {
    let mut b = Builder::until(deadline);
    let root = rule(&mut b, schema)?;
    b.finish(root).map_err(|e| match e.as_str() {
        NO_MATCH => "no JSON value can match the schema (a required property or item recurses without end)".into(),
        _ => e,
    })
}

/// The grammar of any JSON object (`response_format: json_object`).
pub fn any_object() -> Result<Grammar, String> {
    let mut b = Builder::default();
    let root = any_object_rule(&mut b)?;
    b.finish(root)
}

/// A rule of `b` matching the JSON values valid against `schema` (its
/// `$ref`s resolved within it).
pub fn rule(b: &mut Builder, schema: &Value) -> Result<RuleId, String> {
    let mut c = Compiler::new(b, schema);
    let root = c.rule_for(schema, "#", 0)?;
    c.finish_refs()?;
    Ok(root)
}

/// A rule of `b` matching any JSON object.
pub fn any_object_rule(b: &mut Builder) -> Result<RuleId, String> {
    Compiler::new(b, &Value::Null).any_object()
}

struct Compiler<'s, 'b> {
    b: &'b mut Builder,
    root: &'s Value,
    /// `$ref` targets: rule per reference, and the ones still to compile.
    refs: HashMap<String, RuleId>,
    pending: Vec<(String, RuleId)>,
    /// Rules made once: string, number, integer, any value, optional space.
    shared: HashMap<&'static str, RuleId>,
}

fn lit(s: &str) -> Vec<Sym> {
    s.bytes().map(|b| Sym::Bytes(b, b)).collect()
}

impl<'s, 'b> Compiler<'s, 'b> {
    fn new(b: &'b mut Builder, root: &'s Value) -> Compiler<'s, 'b> {
        Compiler { b, root, refs: HashMap::new(), pending: Vec::new(), shared: HashMap::new() }
    }

    /// A rule made once per grammar.
    fn shared(
        &mut self,
        name: &'static str,
        make: fn(&mut Compiler) -> Result<Vec<Vec<Sym>>, String>,
    ) -> Result<Sym, String> {
        if let Some(&id) = self.shared.get(name) {
            return Ok(Sym::Rule(id));
        }
        let id = self.b.declare()?;
        self.shared.insert(name, id);
        let alts = make(self)?;
        self.b.define(id, alts);
        Ok(Sym::Rule(id))
    }

    /// `:` or `,` and at most one space.
    fn punct(&mut self, p: &str) -> Result<Vec<Sym>, String> {
        let space = self.shared("space", |_| Ok(vec![lit(" "), vec![]]))?;
        let mut s = lit(p);
        s.push(space);
        Ok(s)
    }

    /// One character of a JSON string's content, escapes included.
    fn string_char(&mut self) -> Result<Sym, String> {
        self.shared("string_char", |c| {
            let plain = c.b.chars(&[(0, 0x1f), ('"' as u32, '"' as u32), ('\\' as u32, '\\' as u32)], true)?;
            let escaped = c.b.chars(
                &[
                    ('"' as u32, '"' as u32),
                    ('\\' as u32, '\\' as u32),
                    ('/' as u32, '/' as u32),
                    ('b' as u32, 'b' as u32),
                    ('f' as u32, 'f' as u32),
                    ('n' as u32, 'n' as u32),
                    ('r' as u32, 'r' as u32),
                    ('t' as u32, 't' as u32),
                ],
                false,
            )?;
            let hex =
                c.b.chars(&[('0' as u32, '9' as u32), ('a' as u32, 'f' as u32), ('A' as u32, 'F' as u32)], false)?;
            // \uXXXX, never a surrogate (D800-DFFF): a lone one is not valid
            // JSON text to every parser, and a pair would be one character
            // counted as two by `minLength` / `maxLength`
            let not_d = c.b.chars(&[('d' as u32, 'd' as u32), ('D' as u32, 'D' as u32)], false)?;
            let first = c.b.chars(
                &[
                    ('0' as u32, '9' as u32),
                    ('a' as u32, 'c' as u32),
                    ('A' as u32, 'C' as u32),
                    ('e' as u32, 'f' as u32),
                    ('E' as u32, 'F' as u32),
                ],
                false,
            )?;
            let u = c.b.alt(vec![vec![first, hex], vec![not_d, Sym::Bytes(b'0', b'7')]])?;
            Ok(vec![
                vec![plain],
                vec![Sym::Bytes(b'\\', b'\\'), escaped],
                vec![Sym::Bytes(b'\\', b'\\'), Sym::Bytes(b'u', b'u'), u, hex, hex],
            ])
        })
    }

    fn string(&mut self) -> Result<Sym, String> {
        self.shared("string", |c| {
            let ch = c.string_char()?;
            let body = c.b.star(vec![ch])?;
            Ok(vec![vec![Sym::Bytes(b'"', b'"'), body, Sym::Bytes(b'"', b'"')]])
        })
    }

    fn digits(&mut self) -> Sym {
        Sym::Bytes(b'0', b'9')
    }

    fn integer(&mut self) -> Result<Sym, String> {
        self.shared("integer", |c| {
            let d = c.digits();
            let minus = c.b.optional(lit("-"))?;
            let rest = c.b.repeat(&[d], &[], 0, Some(15))?;
            let mut nonzero = vec![Sym::Bytes(b'1', b'9')];
            nonzero.extend(rest);
            let magnitude = c.b.alt(vec![lit("0"), nonzero])?;
            Ok(vec![vec![minus, magnitude]])
        })
    }

    fn number(&mut self) -> Result<Sym, String> {
        self.shared("number", |c| {
            let d = c.digits();
            let int = c.integer()?;
            let mut frac = lit(".");
            frac.extend(c.b.repeat(&[d], &[], 1, Some(16))?);
            let frac = c.b.optional(frac)?;
            let sign = c.b.optional(vec![Sym::Bytes(b'+', b'+')])?;
            let sign = c.b.alt(vec![vec![sign], lit("-")])?;
            let e = c.b.chars(&[('e' as u32, 'e' as u32), ('E' as u32, 'E' as u32)], false)?;
            let mut exp = vec![e, sign];
            exp.extend(c.b.repeat(&[d], &[], 1, Some(3))?);
            let exp = c.b.optional(exp)?;
            Ok(vec![vec![int, frac, exp]])
        })
    }

    /// Any JSON value.
    fn any_value(&mut self) -> Result<Sym, String> {
        self.shared("value", |c| {
            let object = Sym::Rule(c.any_object()?);
            let value = Sym::Rule(c.shared["value"]);
            let comma = c.punct(",")?;
            let items = c.b.repeat(&[value], &comma, 0, None)?;
            let mut array = lit("[");
            array.extend(items);
            array.extend(lit("]"));
            let (string, number) = (c.string()?, c.number()?);
            Ok(vec![vec![object], array, vec![string], vec![number], lit("true"), lit("false"), lit("null")])
        })
    }

    /// Any JSON object.
    fn any_object(&mut self) -> Result<RuleId, String> {
        let sym = self.shared("object", |c| {
            let mut member = vec![c.string()?];
            member.extend(c.punct(":")?);
            member.push(c.any_value()?);
            let comma = c.punct(",")?;
            let members = c.b.repeat(&member, &comma, 0, None)?;
            let mut object = lit("{");
            object.extend(members);
            object.extend(lit("}"));
            Ok(vec![object])
        })?;
        match sym {
            Sym::Rule(id) => Ok(id),
            _ => unreachable!("shared rules are rules"),
        }
    }

    /// A rule for `schema` (found at `path`, for messages).
    fn rule_for(&mut self, schema: &Value, path: &str, depth: usize) -> Result<RuleId, String> {
        let alts = self.alternatives(schema, path, depth)?;
        self.b.rule(alts)
    }

    /// The alternatives matching the values valid against `schema`.
    fn alternatives(&mut self, schema: &Value, path: &str, depth: usize) -> Result<Vec<Vec<Sym>>, String> {
        if depth > MAX_DEPTH {
            return Err(format!("the schema nests deeper than {MAX_DEPTH} levels at {path}"));
        }
        let obj = match schema {
            Value::Bool(true) => return Ok(vec![vec![self.any_value()?]]),
            Value::Bool(false) => return Err(format!("{path} is `false`: no value is valid")),
            Value::Object(o) => o,
            _ => return Err(format!("{path} is not a schema (an object or a boolean)")),
        };
        let keys: Vec<&str> = obj.keys().map(|k| k.as_str()).filter(|k| !ANNOTATIONS.contains(k)).collect();
        let only = |allowed: &[&str]| -> Result<(), String> {
            match keys.iter().find(|k| !allowed.contains(k)) {
                Some(k) => Err(format!("unsupported JSON Schema keyword '{k}' at {path}")),
                None => Ok(()),
            }
        };
        if let Some(r) = obj.get("$ref") {
            only(&["$ref"]).map_err(|e| format!("{e} (beside '$ref')"))?;
            let r = r.as_str().ok_or_else(|| format!("'$ref' at {path} is not a string"))?;
            return Ok(vec![vec![Sym::Rule(self.reference(r, path)?)]]);
        }
        for key in ["anyOf", "allOf"] {
            if let Some(list) = obj.get(key) {
                only(&[key]).map_err(|e| format!("{e} (beside '{key}')"))?;
                let list = list
                    .as_array()
                    .filter(|l| !l.is_empty())
                    .ok_or_else(|| format!("'{key}' at {path} is not a non-empty list"))?;
                if key == "allOf" && list.len() > 1 {
                    return Err(format!("unsupported JSON Schema keyword 'allOf' with more than one schema at {path}"));
                }
                let mut alts = Vec::new();
                for (i, s) in list.iter().enumerate() {
                    alts.push(vec![Sym::Rule(self.rule_for(s, &format!("{path}/{key}/{i}"), depth + 1)?)]);
                }
                return Ok(alts);
            }
        }
        if obj.contains_key("const") || obj.contains_key("enum") {
            let key = if obj.contains_key("const") { "const" } else { "enum" };
            only(&[key, "type"])?;
            let values: Vec<&Value> = match (key, &obj[key]) {
                ("const", v) => vec![v],
                (_, Value::Array(l)) if !l.is_empty() => l.iter().collect(),
                _ => return Err(format!("'enum' at {path} is not a non-empty list")),
            };
            // a value must also be of the schema's `type`, where it gives one
            let types: Vec<&str> = match obj.get("type") {
                None => Vec::new(),
                Some(Value::String(t)) => vec![t.as_str()],
                Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
                Some(_) => return Err(format!("'type' at {path} is not a string or a list of strings")),
            };
            let texts: Vec<String> = values
                .into_iter()
                .filter(|v| types.is_empty() || types.iter().any(|t| is_of_type(v, t)))
                .map(|v| v.to_string())
                .collect();
            if texts.is_empty() {
                return Err(format!("no value of '{key}' at {path} is of its 'type'"));
            }
            let words: Vec<&[u8]> = texts.iter().map(|t| t.as_bytes()).collect();
            return self.literals(&words);
        }
        let types: Vec<&str> = match obj.get("type") {
            None => {
                if obj.contains_key("properties")
                    || obj.contains_key("additionalProperties")
                    || obj.contains_key("required")
                {
                    vec!["object"]
                } else if obj.contains_key("items") || obj.contains_key("minItems") || obj.contains_key("maxItems") {
                    vec!["array"]
                } else if obj.contains_key("pattern") || obj.contains_key("minLength") || obj.contains_key("maxLength")
                {
                    vec!["string"]
                } else {
                    only(&[])?;
                    return Ok(vec![vec![self.any_value()?]]);
                }
            }
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) if !ts.is_empty() => ts
                .iter()
                .map(|t| t.as_str().ok_or_else(|| format!("'type' at {path} lists a value that is not a string")))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(format!("'type' at {path} is not a string or a non-empty list of strings")),
        };
        let mut used: Vec<&str> = vec!["type"];
        let mut alts = Vec::new();
        for t in types {
            let (alt, keywords): (Vec<Sym>, &[&str]) = match t {
                "object" => (self.object(obj, path, depth)?, &["properties", "required", "additionalProperties"]),
                "array" => (self.array(obj, path, depth)?, &["items", "minItems", "maxItems"]),
                "string" => (self.string_schema(obj, path)?, &["pattern", "minLength", "maxLength"]),
                "number" => (vec![self.number()?], &[]),
                "integer" => (vec![self.integer()?], &[]),
                "boolean" => (vec![self.b.alt(vec![lit("true"), lit("false")])?], &[]),
                "null" => (lit("null"), &[]),
                other => return Err(format!("unknown type '{}' at {path}", other.escape_debug())),
            };
            used.extend_from_slice(keywords);
            alts.push(alt);
        }
        only(&used)?;
        Ok(alts)
    }

    /// Alternatives matching exactly `words`, as a tree of their shared
    /// prefixes: a state then holds one parse per distinct next byte, not
    /// one per word. Built with a work list, not recursion: values such as
    /// "a", "aa", "aaa", … branch at every byte.
    fn literals(&mut self, words: &[&[u8]]) -> Result<Vec<Vec<Sym>>, String> {
        let mut words: Vec<&[u8]> = words.to_vec();
        words.sort_unstable();
        words.dedup();
        let mut pending: Vec<(RuleId, Vec<&[u8]>)> = Vec::new();
        let top = self.branches(&words, &mut pending)?;
        while let Some((id, rest)) = pending.pop() {
            let alts = self.branches(&rest, &mut pending)?;
            self.b.define(id, alts);
        }
        Ok(top)
    }

    /// One level of `literals`' tree for sorted, distinct `words`: per first
    /// byte, the prefix its words share, then a rule (in `pending`, to be
    /// defined from the words' rests) for what follows.
    fn branches<'w>(
        &mut self,
        words: &[&'w [u8]],
        pending: &mut Vec<(RuleId, Vec<&'w [u8]>)>,
    ) -> Result<Vec<Vec<Sym>>, String> {
        let mut alts = Vec::new();
        let mut i = 0;
        while i < words.len() {
            let Some(&b) = words[i].first() else {
                alts.push(Vec::new());
                i += 1;
                continue;
            };
            let j = i + words[i..].iter().take_while(|w| w.first() == Some(&b)).count();
            let group = &words[i..j];
            // the longest prefix the group shares: sorted, it is the first's and the last's
            let (first, last) = (group[0], group[group.len() - 1]);
            let shared = first.iter().zip(last).take_while(|(x, y)| x == y).count();
            let mut alt: Vec<Sym> = first[..shared].iter().map(|&x| Sym::Bytes(x, x)).collect();
            if group.len() > 1 {
                let id = self.b.declare()?;
                pending.push((id, group.iter().map(|w| &w[shared..]).collect()));
                alt.push(Sym::Rule(id));
            }
            alts.push(alt);
            i = j;
        }
        Ok(alts)
    }

    fn object(&mut self, obj: &Map<String, Value>, path: &str, depth: usize) -> Result<Vec<Sym>, String> {
        let props = match obj.get("properties") {
            None => None,
            Some(Value::Object(p)) => Some(p),
            Some(_) => return Err(format!("'properties' at {path} is not an object")),
        };
        let required: Vec<&str> = match obj.get("required") {
            None => Vec::new(),
            Some(Value::Array(r)) => r
                .iter()
                .map(|k| k.as_str().ok_or_else(|| format!("'required' at {path} lists a value that is not a string")))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(format!("'required' at {path} is not a list")),
        };
        // other members only where no property is declared: one named like a
        // declared property would be read in its place
        let extra = match (obj.get("additionalProperties"), props) {
            (Some(Value::Bool(_)) | None, Some(_)) | (Some(Value::Bool(false)), None) => None,
            (Some(Value::Object(_)), Some(_)) => None,
            (None | Some(Value::Bool(true)), None) => Some(self.any_value()?),
            (Some(s @ Value::Object(_)), None) => {
                Some(Sym::Rule(self.rule_for(s, &format!("{path}/additionalProperties"), depth + 1)?))
            }
            (Some(_), _) => return Err(format!("'additionalProperties' at {path} is not a boolean or a schema")),
        };
        if let Some(k) = required.iter().find(|k| !props.is_some_and(|p| p.contains_key(**k))) {
            return Err(format!(
                "unsupported: 'required' at {path} names '{}', which is not among the properties",
                k.escape_debug()
            ));
        }
        // members from property i on, given whether one was written already
        let comma = self.punct(",")?;
        let colon = self.punct(":")?;
        let members: Vec<(Vec<Sym>, bool)> = match props {
            None => Vec::new(),
            Some(p) => {
                let mut out = Vec::new();
                for (name, s) in p {
                    let mut m = lit(&Value::String(name.clone()).to_string());
                    m.extend_from_slice(&colon);
                    let at = format!("{path}/properties/{}", name.escape_debug());
                    m.push(Sym::Rule(self.rule_for(s, &at, depth + 1)?));
                    out.push((m, required.contains(&name.as_str())));
                }
                out
            }
        };
        // tail[first]: the additional members (any number) after the declared ones
        let tail = match extra {
            None => [vec![], vec![]],
            Some(value) => {
                let mut m = vec![self.string()?];
                m.extend_from_slice(&colon);
                m.push(value);
                let mut later_m = comma.clone();
                later_m.extend_from_slice(&m);
                let later = self.b.star(later_m)?;
                let mut first_m = m;
                first_m.push(later);
                let first = self.b.optional(first_m)?;
                [vec![first], vec![later]]
            }
        };
        // rest[first] for the members from i on, built from the last one back
        let mut rest: [Vec<Sym>; 2] = tail;
        for (m, req) in members.into_iter().rev() {
            let mut with = [m.clone(), [comma.clone(), m].concat()];
            with[0].extend_from_slice(&rest[1]);
            with[1].extend_from_slice(&rest[1]);
            rest = if req {
                [vec![self.b.alt(vec![with[0].clone()])?], vec![self.b.alt(vec![with[1].clone()])?]]
            } else {
                let first = self.b.alt(vec![with[0].clone(), rest[0].clone()])?;
                let later = self.b.alt(vec![with[1].clone(), rest[1].clone()])?;
                [vec![first], vec![later]]
            };
        }
        let mut out = lit("{");
        out.extend(rest[0].clone());
        out.extend(lit("}"));
        Ok(out)
    }

    fn array(&mut self, obj: &Map<String, Value>, path: &str, depth: usize) -> Result<Vec<Sym>, String> {
        let item = match obj.get("items") {
            None => self.any_value()?,
            Some(Value::Array(_)) => {
                return Err(format!("unsupported JSON Schema keyword 'items' as a list (a tuple) at {path}"))
            }
            Some(s) => Sym::Rule(self.rule_for(s, &format!("{path}/items"), depth + 1)?),
        };
        let min = count(obj, "minItems", path)?.unwrap_or(0);
        let max = count(obj, "maxItems", path)?;
        let comma = self.punct(",")?;
        let mut out = lit("[");
        out.extend(self.b.repeat(&[item], &comma, min, max)?);
        out.extend(lit("]"));
        Ok(out)
    }

    fn string_schema(&mut self, obj: &Map<String, Value>, path: &str) -> Result<Vec<Sym>, String> {
        let min = count(obj, "minLength", path)?;
        let max = count(obj, "maxLength", path)?;
        let body = match obj.get("pattern") {
            Some(p) => {
                if min.is_some() || max.is_some() {
                    return Err(format!("unsupported: 'pattern' together with 'minLength' or 'maxLength' at {path}"));
                }
                let p = p.as_str().ok_or_else(|| format!("'pattern' at {path} is not a string"))?;
                pattern::compile(self.b, p).map_err(|e| format!("'pattern' at {path}: {e}"))?
            }
            None if min.is_none() && max.is_none() => return Ok(vec![self.string()?]),
            None => {
                let ch = self.string_char()?;
                self.b.repeat(&[ch], &[], min.unwrap_or(0), max)?
            }
        };
        let mut out = lit("\"");
        out.extend(body);
        out.extend(lit("\""));
        Ok(out)
    }

    /// The rule of a `$ref` target, compiled later (it may be recursive).
    fn reference(&mut self, r: &str, path: &str) -> Result<RuleId, String> {
        if let Some(&id) = self.refs.get(r) {
            return Ok(id);
        }
        if resolve(self.root, r).is_none() {
            return Err(format!(
                "'$ref' at {path}: '{}' is not '#', '#/$defs/…' or '#/definitions/…' of this schema",
                r.escape_debug()
            ));
        }
        let id = self.b.declare()?;
        self.refs.insert(r.to_string(), id);
        self.pending.push((r.to_string(), id));
        Ok(id)
    }

    fn finish_refs(&mut self) -> Result<(), String> {
        while let Some((r, id)) = self.pending.pop() {
            let target = resolve(self.root, &r).expect("checked when referenced");
            let alts = self.alternatives(target, &r, 1)?;
            self.b.define(id, alts);
        }
        Ok(())
    }
}

/// `#`, `#/$defs/NAME` or `#/definitions/NAME` in `root`.
fn resolve<'v>(root: &'v Value, r: &str) -> Option<&'v Value> {
    if r == "#" {
        return Some(root);
    }
    let rest = r.strip_prefix("#/")?;
    let (section, name) = rest.split_once('/')?;
    if section != "$defs" && section != "definitions" {
        return None;
    }
    let name = name.replace("~1", "/").replace("~0", "~");
    root.get(section)?.get(&name)
}

/// Whether `v` is of JSON Schema type `t`.
fn is_of_type(v: &Value, t: &str) -> bool {
    match t {
        "string" => v.is_string(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|x| x.fract() == 0.0),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        _ => false,
    }
}

/// A non-negative integer keyword (`minItems`, `maxLength`, …).
fn count(obj: &Map<String, Value>, key: &str, path: &str) -> Result<Option<usize>, String> {
    match obj.get(key) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n <= 4096 => Ok(Some(n as usize)),
            Some(_) => Err(format!("unsupported: '{key}' above 4096 at {path}")),
            None => Err(format!("'{key}' at {path} is not a non-negative integer")),
        },
    }
}
