use std::sync::Arc;

use serde_json::{json, Value};

use super::matcher::Matcher;
use super::*;
use crate::test_rng::Rng;

/// Whether `text` is one whole match of `g`.
fn matches(g: &Arc<Grammar>, text: &[u8]) -> bool {
    let mut m = Matcher::new(Arc::clone(g));
    let start = m.start();
    m.advance_bytes(&start, text).accepting
}

fn schema(s: Value) -> Arc<Grammar> {
    Arc::new(schema::compile(&s).unwrap_or_else(|e| panic!("{s}: {e}")))
}

#[test]
fn utf8_classes_match_exactly_their_characters() {
    let mut rng = Rng(7);
    let sets: [&[(u32, u32)]; 4] =
        [&[(0x41, 0x5a)], &[(0x80, 0x10ffff)], &[(0x7f, 0x801), (0xd000, 0xe100)], &[(0x1f600, 0x1f64f), (0x30, 0x39)]];
    for set in sets {
        for negate in [false, true] {
            let mut b = Builder::default();
            let c = b.chars(set, negate).unwrap();
            let root = b.rule(vec![vec![c]]).unwrap();
            let g = Arc::new(b.finish(root).unwrap());
            let edges: Vec<u32> = set.iter().flat_map(|&(a, z)| [a.saturating_sub(1), a, z, z + 1]).collect();
            let samples = (0..400)
                .map(|_| rng.below(0x110000) as u32)
                .chain(edges)
                .chain([0, 0x7f, 0x80, 0x7ff, 0x800, 0xffff, 0x10000, 0x10ffff]);
            for cp in samples {
                let Some(ch) = char::from_u32(cp) else { continue };
                let inside = set.iter().any(|&(a, z)| a <= cp && cp <= z) != negate;
                let mut buf = [0u8; 4];
                assert_eq!(
                    matches(&g, ch.encode_utf8(&mut buf).as_bytes()),
                    inside,
                    "U+{cp:04X} in {set:x?} negate {negate}"
                );
            }
            // never a lone continuation byte or a truncated sequence
            assert!(!matches(&g, &[0x80]));
            assert!(!matches(&g, &[0xe2, 0x82]));
        }
    }
}

#[test]
fn schema_outputs_match_and_others_do_not() {
    let g = schema(json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "tags": {"type": "array", "items": {"enum": ["a", "b\"c", 3]}, "minItems": 1, "maxItems": 2},
            "ok": {"type": ["boolean", "null"]},
            "nested": {"$ref": "#/$defs/point"}
        },
        "required": ["name", "tags"],
        "additionalProperties": false,
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}}
    }));
    for good in [
        r#"{"name":"Ann","tags":["a"]}"#,
        r#"{"name": "Ann", "age": -12, "tags": ["b\"c", 3], "ok": null}"#,
        r#"{"name":"\u00e9\n","tags":[3],"ok":true,"nested":{"x":1.5e-3}}"#,
        r#"{"name":"日本","tags":["a"],"nested":{"x":0}}"#,
    ] {
        assert!(matches(&g, good.as_bytes()), "{good}");
    }
    for bad in [
        r#"{"tags":["a"],"name":"Ann"}"#,         // order
        r#"{"name":"Ann"}"#,                      // required
        r#"{"name":"Ann","tags":[]}"#,            // minItems
        r#"{"name":"Ann","tags":["a","a","a"]}"#, // maxItems
        r#"{"name":"Ann","tags":["c"]}"#,         // enum
        r#"{"name":"Ann","tags":["a"],"x":1}"#,   // additional
        r#"{"name":"Ann","tags":["a"],"age":01}"#,
        r#"{"name":"Ann","tags":["a"],"age":1.5}"#,
        r#"{ "name":"Ann","tags":["a"]}"#,
        r#"{"name":"Ann","tags":["a"]} "#,
        "{\"name\":\"a\u{1}\",\"tags\":[\"a\"]}",
        r#"{"name":"Ann","tags":["a"],"nested":{}}"#,
    ] {
        assert!(!matches(&g, bad.as_bytes()), "{bad}");
    }
}

#[test]
fn recursive_refs_any_json_and_string_bounds() {
    let tree = schema(json!({
        "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}},
        "$ref": "#/$defs/node"
    }));
    assert!(matches(&tree, br#"{"v":1,"kids":[{"v":2,"kids":[{"v":3}]},{"v":4}]}"#));
    assert!(!matches(&tree, br#"{"v":1,"kids":[{"kids":[]}]}"#));
    let any = Arc::new(schema::any_object().unwrap());
    assert!(matches(&any, br#"{"a":[1,{"b":null},"x",true,-0.5E+10],"c":{}}"#));
    assert!(!matches(&any, br#"[1]"#));
    assert!(!matches(&any, br#"{"a":}"#));
    let s = schema(json!({"type": "string", "minLength": 2, "maxLength": 3}));
    assert!(matches(&s, br#""ab""#) && matches(&s, br#""a\"c""#) && matches(&s, "\"ééé\"".as_bytes()));
    assert!(!matches(&s, br#""a""#) && !matches(&s, br#""abcd""#));
    let p = schema(json!({"type": "string", "pattern": "^[A-Z]{2}-\\d{3}(x|yz)?$"}));
    assert!(matches(&p, br#""AB-123""#) && matches(&p, br#""ZZ-000yz""#));
    assert!(!matches(&p, br#""AB-12""#) && !matches(&p, br#""ab-123""#) && !matches(&p, br#""AB-123y""#));
    let q = schema(json!({"type": "string", "pattern": "[\"\\\\]"}));
    assert!(matches(&q, br#""a\"b""#) && matches(&q, br#""\\""#) && !matches(&q, br#""ab""#));
}

#[test]
fn unsupported_and_bad_schemas_name_the_problem() {
    for (s, want) in [
        (json!({"type": "integer", "minimum": 0}), "'minimum' at #"),
        (
            json!({"type": "object", "properties": {"a": {"type": "string", "format": "date"}}}),
            "'format' at #/properties/a",
        ),
        (json!({"oneOf": [{"type": "string"}]}), "'oneOf'"),
        (json!({"type": "strin"}), "unknown type 'strin'"),
        (json!({"$ref": "https://example.com/s.json"}), "'$ref'"),
        (json!({"type": "object", "properties": {"a": {}}, "required": ["b"]}), "'b'"),
        (json!({"type": "array", "maxItems": 1, "minItems": 2}), "at least 2"),
        (json!({"type": "string", "pattern": "(?=a)"}), "'(?'"),
        (json!({"type": "string", "pattern": "a{5000}"}), "above 1000"),
        (json!(7), "not a schema"),
        (json!({"enum": []}), "'enum'"),
    ] {
        let e = schema::compile(&s).err().unwrap_or_else(|| panic!("{s} compiled"));
        assert!(e.contains(want), "{s}: {e}");
    }
    let mut deep = json!({"type": "string"});
    for _ in 0..100 {
        deep = json!({"type": "array", "items": deep});
    }
    assert!(schema::compile(&deep).unwrap_err().contains("deeper"));
}

#[test]
fn gbnf_grammars_compile_and_match() {
    let g = Arc::new(
        gbnf::compile(
            "# a list of moves\nroot ::= move (\", \" move){0,2} \"!\"?\nmove ::=\n  [a-h] [1-8] | \"O-O\" |\n  \"\\u00e9\" .\n",
        )
        .unwrap(),
    );
    assert!(matches(&g, b"e4") && matches(&g, b"e4, O-O, h8!") && matches(&g, "é😀".as_bytes()));
    assert!(!matches(&g, b"e9") && !matches(&g, b"e4, e5, e6, e7") && !matches(&g, b"e4 "));
    for (text, want) in [
        ("root ::= foo", "'foo' is used but never defined"),
        ("root ::= root \"a\" | \"b\"", "left-recursive"),
        ("a ::= \"x\"", "no 'root'"),
        ("root ::= \"a\nb\"", "line 1"),
        ("root ::= \"a\"\nroot ::= \"b\"", "line 2: rule 'root' is defined twice"),
        ("root ::= [z-a]", "backwards"),
        ("root ::= \"a\"{3,1}", "below"),
        ("root ::= (\"a\"", "not closed"),
    ] {
        let e = gbnf::compile(text).err().unwrap_or_else(|| panic!("{text:?} compiled"));
        assert!(e.contains(want), "{text:?}: {e}");
    }
}

/// A small vocabulary: every ASCII byte, some multi-byte pieces, a
/// leading-space piece and an empty (control) one.
fn toy_vocab(strip: bool) -> Arc<Vocab> {
    let mut pieces: Vec<Box<[u8]>> = (0u8..128).map(|b| vec![b].into_boxed_slice()).collect();
    for p in ["{\"", "\":", "\",\"", "name", " \"", "\"}", "true", "tr", "[1", "1,", "é", "\u{1F600}", " {"] {
        pieces.push(p.as_bytes().into());
    }
    pieces.push(Box::default());
    Arc::new(Vocab::from_pieces(pieces, strip))
}

#[test]
fn masks_equal_checking_every_token() {
    let g = schema(
        json!({"type": "object", "properties": {"name": {"type": "string"}, "ok": {"type": "boolean"}, "n": {"type": "array", "items": {"type": "integer"}}}, "required": ["name"]}),
    );
    for strip in [false, true] {
        let vocab = toy_vocab(strip);
        let mut rng = Rng(11);
        for _ in 0..30 {
            let mut c = Constraint::new(Arc::clone(&g), Arc::clone(&vocab));
            for _ in 0..40 {
                if c.complete() {
                    break;
                }
                let mask = c.mask();
                let ids: Vec<u32> = (0..vocab.len() as u32).filter(|&id| allowed(&mask, id)).collect();
                for id in 0..vocab.len() as u32 {
                    assert_eq!(allowed(&mask, id), c.allows(id), "token {id}");
                }
                assert!(!ids.is_empty());
                let id = ids[rng.below(ids.len())];
                assert!(c.accept(id));
            }
        }
    }
    // the first token loses its leading space where the tokenizer strips it
    let vocab = toy_vocab(true);
    let mut c = Constraint::new(Arc::clone(&g), vocab);
    assert!(c.allows(128 + 12)); // " {" as the first token is "{"
    assert!(c.accept(128 + 12));
    assert!(!c.allows(128 + 12));
}

#[test]
fn pathological_ambiguity_is_cut_not_hung() {
    // found by the gbnf fuzz target: `root{1000}` of a recursive, nullable-
    // prefixed root took unbounded time per byte
    let text = "#\u{1a}move#s\nroot ::= move (\", \" move){0,3} \"!\"?\nmove ::=\n  [\":ue t ::= d\0ve (\", \" move){0,{0,}::=18] | \"O@-O\" |\n  \"\\u0e09\"? .root{1000}\n";
    let started = std::time::Instant::now();
    match gbnf::compile(text) {
        Ok(g) => {
            let pieces: Vec<Box<[u8]>> = (0u8..128).map(|b| vec![b].into_boxed_slice()).collect();
            let mut c = Constraint::new(Arc::new(g), Arc::new(Vocab::from_pieces(pieces, false)));
            for b in b"O@-O, O@-O" {
                let _ = c.mask();
                if !c.accept(u32::from(*b)) {
                    break;
                }
            }
        }
        Err(e) => assert!(!e.contains('\n'), "{e}"),
    }
    assert!(started.elapsed().as_secs() < 10, "took {:?}", started.elapsed());
}

#[test]
fn review_findings_stay_fixed() {
    // a short text cannot make a huge grammar
    let big = "root ::= ".to_string() + &"\"a\"{1000} ".repeat(3000);
    let started = std::time::Instant::now();
    assert!(gbnf::compile(&big).unwrap_err().contains("symbols"));
    // 500 alternatives matching the same byte: more parses than kept, refused
    let alts = vec!["[ -~]"; 500].join(" | ");
    assert!(gbnf::compile(&format!("root ::= x{{1000}}\nx ::= {alts}\n")).is_err());
    assert!(started.elapsed().as_secs() < 5, "{:?}", started.elapsed());
    // enum and const values keep to the type
    let e = schema(json!({"type": "string", "enum": ["a", 1]}));
    assert!(matches(&e, br#""a""#) && !matches(&e, b"1"));
    assert!(schema::compile(&json!({"type": "integer", "const": "x"})).is_err());
    // declared properties are not repeated as additional ones
    let a = schema(json!({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": true}));
    assert!(!matches(&a, br#"{"a":"x"}"#) && matches(&a, br#"{"a":1}"#) && !matches(&a, br#"{"a":1,"a":"x"}"#));
    // no surrogate escapes; other \u escapes are fine
    let s = schema(json!({"type": "string", "minLength": 2}));
    assert!(!matches(&s, br#""\ud83d\ude00""#) && !matches(&s, br#""\ud800x""#) && matches(&s, br#""\u00e9\uFFFD""#));
    // \S \W \D are ASCII only (a Unicode-aware validator refuses U+00A0 for \S)
    let p = schema(json!({"type": "string", "pattern": "^\\S\\W\\D$"}));
    assert!(matches(&p, br#""a!x""#) && !matches(&p, "\"\u{a0}!x\"".as_bytes()) && !matches(&p, "\"aéx\"".as_bytes()));
    // a large enum is a tree of shared prefixes, not 5000 parses
    let values: Vec<String> = (0..5000).map(|i| format!("value-{i:05}")).collect();
    let big_enum = schema(json!({"type": "object", "properties": {"c": {"enum": values}}, "required": ["c"]}));
    let mut m = Matcher::new(Arc::clone(&big_enum));
    let start = m.start();
    let end = m.advance_bytes(&start, br#"{"c":"value-04999"}"#);
    assert!(end.accepting && !m.overflowed());
}

/// Runs `f` on a thread with a small stack (a quarter of a server
/// connection thread's 2 MiB): a parser that recursed once per nesting level
/// of its input would overflow it, which aborts the whole process.
fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new().stack_size(512 << 10).spawn(f).unwrap().join().unwrap()
}

#[test]
fn deep_nesting_is_refused_not_a_stack_overflow() {
    // issue 32: a 6 KB schema whose pattern nests 3,000 groups, a 20 KB
    // grammar of 10,000 nested parentheses
    let e = on_small_stack(|| {
        let pattern = format!("^{}a{}$", "(".repeat(3000), ")".repeat(3000));
        schema::compile(&json!({"type": "string", "pattern": pattern})).unwrap_err()
    });
    assert!(e.contains("nested deeper than 100"), "{e}");
    let e = on_small_stack(|| {
        gbnf::compile(&format!("root ::= {}\"a\"{}", "(".repeat(10_000), ")".repeat(10_000))).unwrap_err()
    });
    assert!(e.contains("nested deeper than 100") && e.contains("line 1"), "{e}");
    // the deepest nesting allowed still compiles and matches, on the same stack: a
    // schema 60 levels deep whose innermost string has a pattern 100 groups deep
    let g = on_small_stack(|| {
        let mut s = json!({"type": "string", "pattern": format!("^{}a{}$", "(".repeat(100), ")".repeat(100))});
        for _ in 0..60 {
            s = json!({"type": "array", "items": s, "maxItems": 1});
        }
        schema::compile(&s).map(Arc::new).unwrap()
    });
    let text = format!("{}\"a\"{}", "[".repeat(60), "]".repeat(60));
    assert!(matches(&g, text.as_bytes()));
    let ok = on_small_stack(|| {
        let g = Arc::new(gbnf::compile(&format!("root ::= {}\"a\"{}", "(".repeat(100), ")".repeat(100))).unwrap());
        let p = schema(json!({"type": "string", "pattern": format!("^{}a{}$", "(".repeat(100), ")".repeat(100))}));
        matches(&g, b"a") && matches(&p, br#""a""#)
    });
    assert!(ok);
    // an enum of values that branch at every byte ("a", "aa", "aaa", …) stays shallow
    let words: Vec<String> = (1..=3000).map(|n| "a".repeat(n)).collect();
    let g = on_small_stack(move || schema::compile(&json!({"enum": words})).map(Arc::new).unwrap());
    let text = format!("\"{}\"", "a".repeat(2999));
    assert!(matches(&g, text.as_bytes()) && !matches(&g, b"\"\"") && !matches(&g, b"\"b\""));
}

#[test]
fn compiling_is_linear_in_the_text() {
    // issue 32: one 1 MB literal of CJK characters took 125 s (each character
    // re-validated the rest of the text), a long chain of nullable rules 5 s
    // (a fixpoint pass per rule); a deadline 5 s away, hundreds of times what
    // a linear compile takes, must not pass
    let within = || Some(std::time::Instant::now() + std::time::Duration::from_secs(5));
    let literal = format!("root ::= \"{}\"", "語".repeat(330_000));
    assert!(gbnf::compile_until(&literal, within()).is_ok());
    // (each rule nullable only through the next one, declared after it; its
    // start expands more rules than the matcher keeps, so it is refused)
    let mut chain = String::from("root ::= r0 \"x\"\n");
    for i in 0..19_990 {
        chain += &format!("r{i} ::= r{}\n", i + 1);
    }
    chain += "r19990 ::= \"\"\n";
    let e = gbnf::compile_until(&chain, within()).unwrap_err();
    assert!(e.contains("too ambiguous"), "{e}");
    // an enum whose one value is 1 MB (the shared prefix is found in one pass)
    let long = "b".repeat(1 << 20);
    let s = json!({"type": "string", "enum": [long.clone(), format!("{long}c")]});
    assert!(schema::compile_until(&s, within()).is_ok());
    // a deadline that has passed stops the compile
    let passed = Some(std::time::Instant::now());
    for e in [gbnf::compile_until(&chain, passed).unwrap_err(), schema::compile_until(&s, passed).unwrap_err()] {
        assert!(e.ends_with(DEADLINE_PASSED), "{e}");
    }
}

#[test]
fn small_findings_of_issue_32() {
    // a count too large for any integer is above the limit, not "expected a number"
    let e = gbnf::compile("root ::= \"a\"{99999999999999999999999999}").unwrap_err();
    assert!(e.contains("above 1000"), "{e}");
    let e = schema::compile(&json!({"type": "string", "pattern": "a{99999999999999999999999}"})).unwrap_err();
    assert!(e.contains("above 1000"), "{e}");
    // non-ASCII rule names are named as the characters they are
    for text in ["rulé ::= \"a\"\nroot ::= rulé", "root ::= \"a\" é", "é ::= \"a\"", "root ::= \"\\é\""] {
        let e = gbnf::compile(text).unwrap_err();
        assert!(e.contains('é') && !e.contains('Ã'), "{text:?}: {e}");
    }
    // a grammar or schema that matches nothing is refused
    for text in ["root ::= [^\\x00-\\U0010FFFF]", "root ::= \"a\" root", "root ::= x\nx ::= \"(\" x \")\""] {
        let e = gbnf::compile(text).unwrap_err();
        assert!(e.contains("no text matches"), "{text:?}: {e}");
    }
    let endless = json!({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]});
    assert!(schema::compile(&endless).unwrap_err().contains("no JSON value can match"));
    // a recursive schema that can end is fine
    let tree = json!({"type": "object", "properties": {"a": {"$ref": "#"}}});
    assert!(matches(&schema(tree), br#"{"a":{"a":{}}}"#));
}

#[test]
fn numbers_keep_their_literal_text() {
    // issue 32: integers beyond 64 bits in `const`/`enum` were rounded through f64
    let big = "123456789012345678901234567890";
    let v: Value = serde_json::from_str(&format!(r#"{{"const": {big}}}"#)).unwrap();
    let g = schema(v);
    assert!(matches(&g, big.as_bytes()) && !matches(&g, b"1.2345678901234568e+29"));
    let v: Value =
        serde_json::from_str(r#"{"type": "integer", "enum": [18446744073709551616, -9223372036854775809, 1.0]}"#)
            .unwrap();
    let g = schema(v);
    for good in ["18446744073709551616", "-9223372036854775809", "1.0"] {
        assert!(matches(&g, good.as_bytes()), "{good}");
    }
    assert!(!matches(&g, b"18446744073709552000"));
}

/// A character class written many times is one rule: a pattern of 100,000
/// `.` (the `scaled` fuzz target's find of 5 December: 21,845 copies of
/// `.....n......` took 0.6 s under the sanitizer reaching the rule limit)
/// compiles, with a handful of rules.
#[test]
fn a_character_class_used_many_times_is_one_rule() {
    let pattern = format!("^{}$", ".".repeat(100_000));
    let g = schema::compile(&serde_json::json!({"type": "string", "pattern": pattern})).unwrap();
    assert!(g.alts.len() < 100, "{} rules", g.alts.len());
    let g = gbnf::compile(&format!("root ::= {}\n", "[a-z] ".repeat(30_000))).unwrap();
    assert!(g.alts.len() < 10, "{} rules", g.alts.len());
}
