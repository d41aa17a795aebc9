//! The model's own chat template: the Jinja source its file carries
//! (`tokenizer.chat_template`, or `--chat-template-file`), rendered as
//! Hugging Face's transformers renders it (`apply_chat_template`): blocks
//! trimmed, `raise_exception`, `strftime_now`, a `tojson` that writes what
//! Python's `json.dumps` writes, the Python string and dict methods
//! templates call, and the conversation as `messages`, `tools`,
//! `add_generation_prompt`, `bos_token`, `eos_token` and the request's
//! `chat_template_kwargs` (`enable_thinking`, ...).
//!
//! What users wrote stays plain text (`PromptText`): the conversation is
//! rendered a second time with each part of the request's strings that
//! could spell a control token (from a `<` or `[` to the next `>` or `]`)
//! between two noncharacters; where the two renderings agree once those
//! are removed, the text between them is what users wrote. A template that
//! looks into those parts (Qwen3 cuts an earlier answer at its `</think>`)
//! makes them disagree; then every copy of such a part in the prompt is
//! plain (the template's own copies too: a user who types `<|im_end|>`
//! where such a template reads it breaks only their own prompt).

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, Value as JValue};
use minijinja::{Environment, Error, ErrorKind};
use serde_json::{Map, Value};

use super::tools::py_json;
use super::{Message, PromptText, Role, Tool};

/// The template's name in its environment (errors name it).
const NAME: &str = "chat template";
/// Work one rendering may do (minijinja's fuel, about one unit per
/// instruction), for a conversation of `items` messages and tools: a
/// template that loops for ever, or recurses into itself twice per call,
/// ends with an error after at most this much. Real templates' work grows
/// with the conversation, some quadratically: with four tools, 400 turns
/// (881 messages) take 2.85M units under Gemma 4's template and 0.51M
/// under DeepSeek V3.2's (the worst of llama.cpp's `models/templates/`),
/// 3.2 × items², within the 20 × items² here; one turn takes at most
/// 3,306 (Kimi K3's). So a small request costs a hostile template about
/// one million units (40 ms; 2 s under the fuzzer's sanitizer) and no
/// request more than 50 million (2 s), where a fixed 50 million let
/// every request of a few messages cost that.
fn fuel(items: usize) -> u64 {
    let n = items as u64;
    1_000_000u64.saturating_add(20_000 * n).saturating_add(n.saturating_mul(n).saturating_mul(20)).min(50_000_000)
}
/// The tool whose name the probe for tool support looks for.
const PROBE_TOOL: &str = "krafla_probe_tool_7d2f";
/// Around each request string in the marked rendering.
const OPEN: char = '\u{FDD0}';
const CLOSE: char = '\u{FDD1}';

/// A compiled chat template.
pub struct JinjaTemplate {
    env: Environment<'static>,
    source: String,
    /// Whether the template shows the tools it is given (SmolLM2's and
    /// Gemma's do not: a request with tools then takes the built-in kind's format).
    shows_tools: bool,
    bos: String,
    eos: String,
}

/// What a rendering takes besides the conversation.
#[derive(Clone, Debug, Default)]
pub struct RenderOptions {
    /// End where the assistant speaks (the server and the chat always do).
    pub add_generation_prompt: bool,
    /// Extra template variables (`chat_template_kwargs`).
    pub kwargs: Map<String, Value>,
}

impl JinjaTemplate {
    /// `source` compiled; `bos` and `eos` are the tokens' texts (empty when
    /// the vocabulary has none). Errors are one line.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<JinjaTemplate, String> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(fuel(0)));
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        // jinja2's: `items` of an undefined value is empty
        env.add_filter("items", |v: &JValue| match v.is_undefined() {
            true => Ok(JValue::from(Vec::<JValue>::new())),
            false => minijinja::filters::items(v),
        });
        // Python's: None is not iterable (minijinja iterates it as empty)
        env.add_test("iterable", |v: JValue| !v.is_none() && !v.is_undefined() && v.try_iter().is_ok());
        env.add_template_owned(NAME, source.to_string()).map_err(|e| one_line(&e))?;
        let mut t = JinjaTemplate {
            env,
            source: source.to_string(),
            shows_tools: false,
            bos: bos.to_string(),
            eos: eos.to_string(),
        };
        // llama.cpp's probe: a tool with an unlikely name, looked for in the text
        let mut probe = Map::new();
        probe.insert("name".into(), Value::String(PROBE_TOOL.into()));
        probe.insert("description".into(), Value::String("A tool".into()));
        probe.insert(
            "parameters".into(),
            serde_json::json!({"type": "object", "properties": {"arg": {"type": "string", "description": "An argument"}},
                "required": ["arg"]}),
        );
        let tools = [Tool { name: PROBE_TOOL.into(), function: probe }];
        let options = RenderOptions { add_generation_prompt: true, kwargs: Map::new() };
        let user = [Message::new(Role::User, "hi")];
        t.shows_tools = t.render_json(&user, &tools, &options, None).is_ok_and(|s| s.contains(PROBE_TOOL));
        Ok(t)
    }

    /// Whether the template shows the tools it is given.
    pub fn shows_tools(&self) -> bool {
        self.shows_tools
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The conversation as the template writes it, with what users wrote
    /// marked. `strip_bos`: the tokenizer adds BOS itself, so a BOS the
    /// template writes first is dropped (as llama.cpp does).
    pub fn render(
        &self,
        messages: &[Message],
        tools: &[Tool],
        options: &RenderOptions,
        strip_bos: bool,
    ) -> Result<PromptText, String> {
        let text = self.render_json(messages, tools, options, None)?;
        let mut risky = Vec::new();
        let marked = self.render_json(messages, tools, options, Some(&mut risky))?;
        let mut prompt = match marked_ranges(&marked) {
            Some(p) if p.as_str() == text => p,
            _ => searched_ranges(&text, &risky),
        };
        if strip_bos && !self.bos.is_empty() && prompt.as_str().starts_with(&self.bos) {
            prompt = prompt.after(self.bos.len());
        }
        Ok(prompt)
    }

    /// One rendering; with `marks`, each request string between `OPEN` and
    /// `CLOSE` (inside its leading and trailing whitespace, so `trim` still
    /// trims), and the strings listed in `marks`.
    fn render_json(
        &self,
        messages: &[Message],
        tools: &[Tool],
        options: &RenderOptions,
        mut marks: Option<&mut Vec<String>>,
    ) -> Result<String, String> {
        let mut conv = Vec::with_capacity(messages.len());
        for m in messages {
            conv.push(message_json(m, marks.as_deref_mut()));
        }
        let items = messages.len() + tools.len();
        let tools: Vec<JValue> = tools.iter().map(|t| to_jinja(&tool_json(t), marks.as_deref_mut())).collect();
        let mut ctx: Vec<(String, JValue)> = vec![
            ("messages".into(), JValue::from(conv)),
            ("tools".into(), if tools.is_empty() { JValue::from(()) } else { JValue::from(tools) }),
            ("add_generation_prompt".into(), JValue::from(options.add_generation_prompt)),
            ("bos_token".into(), JValue::from(self.bos.clone())),
            ("eos_token".into(), JValue::from(self.eos.clone())),
        ];
        for (k, v) in &options.kwargs {
            ctx.retain(|(name, _)| name != k);
            ctx.push((k.clone(), to_jinja(v, None)));
        }
        // the budget for this conversation's size (`fuel`), on a copy of the
        // environment (its templates and functions are shared, not copied)
        let mut env = self.env.clone();
        env.set_fuel(Some(fuel(items)));
        let tmpl = env.get_template(NAME).map_err(|e| one_line(&e))?;
        tmpl.render(JValue::from_iter(ctx)).map_err(|e| one_line(&e))
    }
}

/// An error as one line: its kind and detail, where in the template.
fn one_line(e: &Error) -> String {
    let mut s = match e.detail() {
        Some(d) if e.kind() == ErrorKind::InvalidOperation => d.to_string(),
        Some(d) => format!("{}: {d}", e.kind()),
        None => e.kind().to_string(),
    };
    if let Some(line) = e.line() {
        s.push_str(&format!(" (chat template line {line})"));
    }
    s.escape_debug().to_string()
}

/// A message as transformers' templates read it (OpenAI's fields; a call's
/// arguments as the object they spell, as the models were trained).
fn message_json(m: &Message, mut marks: Option<&mut Vec<String>>) -> JValue {
    let role = match m.role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    let mut fields: Vec<(&str, JValue)> =
        vec![("role", role.into()), ("content", text(&m.content, marks.as_deref_mut()))];
    if !m.tool_calls.is_empty() {
        let calls: Vec<JValue> = m
            .tool_calls
            .iter()
            .map(|c| {
                let arguments = match serde_json::from_str::<Value>(&c.arguments) {
                    Ok(v @ Value::Object(_)) => to_jinja(&v, marks.as_deref_mut()),
                    _ => text(&c.arguments, marks.as_deref_mut()),
                };
                let function =
                    JValue::from_iter([("name", text(&c.name, marks.as_deref_mut())), ("arguments", arguments)]);
                JValue::from_iter([
                    ("id", text(&c.id, marks.as_deref_mut())),
                    ("type", "function".into()),
                    ("function", function),
                ])
            })
            .collect();
        fields.push(("tool_calls", JValue::from(calls)));
    }
    if m.role == Role::Tool {
        fields.push(("tool_call_id", text(&m.tool_call_id, marks)));
    }
    JValue::from_iter(fields)
}

fn tool_json(t: &Tool) -> Value {
    let mut m = Map::new();
    m.insert("type".into(), Value::String("function".into()));
    m.insert("function".into(), Value::Object(t.function.clone()));
    Value::Object(m)
}

/// A request string; with `marks`, each part of it that could spell a
/// control token (`risky_parts`) between `OPEN` and `CLOSE`, and listed.
fn text(s: &str, marks: Option<&mut Vec<String>>) -> JValue {
    let Some(marks) = marks else { return JValue::from(s) };
    let parts = risky_parts(s);
    if parts.is_empty() {
        return JValue::from(s);
    }
    let mut out = String::with_capacity(s.len() + 6 * parts.len());
    let mut done = 0;
    for r in parts {
        out.push_str(&s[done..r.start]);
        out.push(OPEN);
        out.push_str(&s[r.clone()]);
        out.push(CLOSE);
        marks.push(s[r.clone()].to_string());
        done = r.end;
    }
    out.push_str(&s[done..]);
    JValue::from(out)
}

/// The byte ranges of `s` that could be, or be part of, a control token:
/// every control token of the families Krafla knows is bracketed (`<s>`,
/// `<|im_end|>`, `<start_of_turn>`, `[INST]`), so each `<` or `[` up to the
/// next `>` or `]` (or the end), and the start up to a first closer
/// (which could end a token the template began). Sorted, disjoint.
fn risky_parts(s: &str) -> Vec<std::ops::Range<usize>> {
    let mut parts: Vec<std::ops::Range<usize>> = Vec::new();
    let closer = |from: usize| s[from..].find(['>', ']']).map_or(s.len(), |i| from + i + 1);
    if let Some(first_close) = s.find(['>', ']']) {
        if s.find(['<', '[']).is_none_or(|open| open > first_close) {
            parts.push(0..first_close + 1);
        }
    }
    for (at, _) in s.match_indices(['<', '[']) {
        let r = at..closer(at + 1);
        match parts.last_mut() {
            Some(last) if last.end >= r.start => last.end = last.end.max(r.end),
            _ => parts.push(r),
        }
    }
    parts
}

/// JSON as template values (maps keep their order; numbers as Python
/// reads them); strings marked when `marks` is given.
fn to_jinja(v: &Value, mut marks: Option<&mut Vec<String>>) -> JValue {
    match v {
        Value::Null => JValue::from(()),
        Value::Bool(b) => JValue::from(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => JValue::from(i),
            (_, Some(u), _) => JValue::from(u),
            (_, _, Some(f)) => JValue::from(f),
            _ => JValue::from(n.to_string()),
        },
        Value::String(s) => text(s, marks),
        Value::Array(a) => JValue::from(a.iter().map(|x| to_jinja(x, marks.as_deref_mut())).collect::<Vec<_>>()),
        Value::Object(m) => JValue::from_iter(m.iter().map(|(k, x)| (k.clone(), to_jinja(x, marks.as_deref_mut())))),
    }
}

/// The marked rendering without its marks, the text between them plain;
/// `None` if they do not pair up.
fn marked_ranges(marked: &str) -> Option<PromptText> {
    let mut p = PromptText::default();
    let mut inside = false;
    let mut rest = marked;
    while let Some(at) = rest.find([OPEN, CLOSE]) {
        let c = rest[at..].chars().next()?;
        match (c == OPEN, inside) {
            (true, false) => p.push_template(&rest[..at]),
            (false, true) => p.push_plain(&rest[..at]),
            _ => return None,
        }
        inside = c == OPEN;
        rest = &rest[at + c.len_utf8()..];
    }
    if inside {
        return None;
    }
    p.push_template(rest);
    Some(p)
}

/// `text` with every copy of each risky part of the request's strings
/// plain (where the template changed those strings, so the marks did not
/// survive).
fn searched_ranges(text: &str, risky: &[String]) -> PromptText {
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for part in risky {
        ranges.extend(text.match_indices(part.as_str()).map(|(at, m)| (at, at + m.len())));
    }
    ranges.sort_unstable();
    let mut p = PromptText::default();
    let mut done = 0;
    for (start, end) in ranges {
        if end <= done {
            continue;
        }
        let start = start.max(done);
        p.push_template(&text[done..start]);
        p.push_plain(&text[start..end]);
        done = end;
    }
    p.push_template(&text[done..]);
    p
}

fn raise_exception(message: String) -> Result<JValue, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// transformers' `tojson`: Python's `json.dumps(x, ensure_ascii=False,
/// indent=indent)` (`ensure_ascii`, `separators` and `sort_keys` taken too).
fn tojson(value: JValue, kwargs: Kwargs) -> Result<JValue, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<JValue> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let mut json =
        serde_json::to_value(&value).map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    if sort_keys == Some(true) {
        sort(&mut json);
    }
    let mut out = py_json(&json, indent);
    if let Some(seps) = separators {
        let item: String = seps.get_item(&JValue::from(0))?.to_string();
        let key: String = seps.get_item(&JValue::from(1))?.to_string();
        out = py_json_with(&json, &item, &key);
    }
    if ensure_ascii == Some(true) {
        out = out
            .chars()
            .map(|c| match c {
                c if c.is_ascii() => c.to_string(),
                c => {
                    let mut buf = [0u16; 2];
                    c.encode_utf16(&mut buf).iter().map(|u| format!("\\u{u:04x}")).collect()
                }
            })
            .collect();
    }
    Ok(JValue::from(out))
}

fn sort(v: &mut Value) {
    match v {
        Value::Object(m) => {
            let mut items: Vec<(String, Value)> = std::mem::take(m).into_iter().collect();
            items.sort_by(|a, b| a.0.cmp(&b.0));
            for (k, mut x) in items {
                sort(&mut x);
                m.insert(k, x);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(sort),
        _ => {}
    }
}

/// `json.dumps(v, separators=(item, key))` (no indent).
fn py_json_with(v: &Value, item: &str, key: &str) -> String {
    match v {
        Value::Array(a) => format!("[{}]", a.iter().map(|x| py_json_with(x, item, key)).collect::<Vec<_>>().join(item)),
        Value::Object(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, x)| format!("{}{key}{}", Value::String(k.clone()), py_json_with(x, item, key)))
                .collect::<Vec<_>>()
                .join(item)
        ),
        other => py_json(other, None),
    }
}

/// `strftime_now(format)`: the current UTC time as Python's `strftime`
/// writes it (the directives chat templates use).
fn strftime_now(format: String) -> Result<JValue, Error> {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    Ok(JValue::from(strftime(&format, secs)))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// `secs` after the epoch (UTC) formatted by `format`'s `%` directives.
fn strftime(format: &str, secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let (year, month, day) = super::harmony::civil_from_days(days);
    let sod = secs.rem_euclid(86_400);
    let (h, m, s) = (sod / 3600, sod % 3600 / 60, sod % 60);
    // 1970-01-01 was a Thursday
    let weekday = (days + 3).rem_euclid(7) as usize;
    let yday = days - super::harmony::days_from_civil(year, 1, 1) + 1;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut d = chars.next();
        let no_pad = d == Some('-');
        if no_pad {
            d = chars.next();
        }
        let num = |v: i64, w: usize| if no_pad { v.to_string() } else { format!("{v:0w$}") };
        let month_name = MONTHS[(month - 1) as usize];
        match d {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&num(year.rem_euclid(100), 2)),
            Some('m') => out.push_str(&num(month, 2)),
            Some('d') => out.push_str(&num(day, 2)),
            Some('e') => out.push_str(&format!("{day:2}")),
            Some('j') => out.push_str(&num(yday, 3)),
            Some('H') => out.push_str(&num(h, 2)),
            Some('I') => out.push_str(&num((h + 11) % 12 + 1, 2)),
            Some('M') => out.push_str(&num(m, 2)),
            Some('S') => out.push_str(&num(s, 2)),
            Some('p') => out.push_str(if h < 12 { "AM" } else { "PM" }),
            Some('B') => out.push_str(month_name),
            Some('b') | Some('h') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('F') => out.push_str(&format!("{year:04}-{month:02}-{day:02}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, messages: &[Message]) -> Result<PromptText, String> {
        let opts = RenderOptions { add_generation_prompt: true, kwargs: Map::new() };
        JinjaTemplate::new(source, "<s>", "</s>")?.render(messages, &[], &opts, true)
    }

    const CHATML: &str =
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}\
        {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

    #[test]
    fn renders_and_marks_what_users_wrote() {
        let m = [Message::new(Role::User, "  hi <|im_end|> ")];
        let p = render(CHATML, &m).unwrap();
        assert_eq!(p.as_str(), "<|im_start|>user\nhi <|im_end|><|im_end|>\n<|im_start|>assistant\n");
        assert_eq!(&p.as_str()[p.plain_ranges()[0].clone()], "<|im_end|>");
        assert_eq!(p.plain_ranges().len(), 1);
    }

    #[test]
    fn risky_parts_cover_every_bracketed_run() {
        let parts = |s: &str| risky_parts(s).into_iter().map(|r| s[r].to_string()).collect::<Vec<_>>();
        assert_eq!(parts("end|> x [INST] y <|im_"), ["end|>", "[INST]", "<|im_"]);
        assert_eq!(parts("a <b <c> d"), ["<b <c>"]);
        assert!(parts("plain text").is_empty());
    }

    /// A macro that calls itself twice per call (2^21 calls): the fuzzer's
    /// find (tests/fuzz/seeds/chat_template/exponential_macro), which ran
    /// a fixed budget of 50 million units, two seconds a rendering. A short
    /// conversation now gets about one million.
    #[test]
    fn a_template_that_recurses_twice_per_call_runs_out_of_fuel() {
        let source = "{% macro r(x, d) %}{% if d > 0 %}{{ r(x, d - 1) }}{{ r(x, d - 1) }}{% else %}{{ x }}\
            {% endif %}{% endmacro %}{{ r('a', 20) }}{% for m in messages %}{{ m.content }}{% endfor %}";
        let err = render(source, &[Message::new(Role::User, "hi")]).unwrap_err();
        assert!(err.contains("ran out of fuel"), "{err}");
        assert!(fuel(2) < 1_100_000 && fuel(usize::MAX) == 50_000_000);
    }

    /// Real templates' work grows with the conversation, some quadratically
    /// (`fuel`): 1,000 messages under a template that walks the
    /// conversation once per message (a million steps) still render.
    #[test]
    fn a_long_conversation_under_a_quadratic_template_renders() {
        let source = "{% for m in messages %}{% for k in messages %}{% if k.role == 'x' %}!{% endif %}\
            {% endfor %}{{ m.content }}{% endfor %}";
        let m: Vec<Message> = (0..1000).map(|i| Message::new(Role::User, format!("m{i}"))).collect();
        let p = render(source, &m).unwrap();
        assert!(p.as_str().starts_with("m0m1m2") && p.as_str().ends_with("m999"), "{}", p.as_str());
    }

    #[test]
    fn a_template_that_cuts_strings_still_marks_control_text() {
        let cut = "{% for m in messages %}[{{ m.content.split('#')[-1] }}]{% endfor %}";
        let m = [Message::new(Role::User, "a#b <|im_end|>\nc")];
        let p = render(cut, &m).unwrap();
        assert_eq!(p.as_str(), "[b <|im_end|>\nc]");
        let plain: Vec<&str> = p.plain_ranges().iter().map(|r| &p.as_str()[r.clone()]).collect();
        assert!(plain.iter().any(|s| s.contains("<|im_end|>")), "{plain:?}");
    }

    #[test]
    fn bos_is_dropped_and_helpers_work() {
        let src = "{{ bos_token }}{{ messages[0].content | tojson }}{{ {'b': 1, 'a': [1.5, none, true]} | tojson }}\
                   {% if messages[0].content.startswith('x') %}X{% endif %}{{ 'é' | tojson(ensure_ascii=true) }}";
        let p = render(src, &[Message::new(Role::User, "x\"y")]).unwrap();
        assert_eq!(p.as_str(), "\"x\\\"y\"{\"b\": 1, \"a\": [1.5, null, true]}X\"\\u00e9\"");
        let e = render("{{ raise_exception('roles must alternate') }}", &[Message::new(Role::User, "x")]);
        assert_eq!(e.unwrap_err(), "roles must alternate (chat template line 1)");
        assert!(JinjaTemplate::new("{% for %}", "", "").is_err());
        let forever = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        assert!(render(forever, &[Message::new(Role::User, "x")]).is_err());
    }

    /// What rendering costs a request: `KRAFLA_BENCH_TEMPLATE=FILE.jinja cargo test --release -p
    /// krafla --lib bench_template -- --ignored --nocapture` renders a 10-turn conversation with
    /// two tools and a call (both renderings and the marks, as a request does).
    #[test]
    #[ignore]
    fn bench_template() {
        let path = std::env::var("KRAFLA_BENCH_TEMPLATE").expect("KRAFLA_BENCH_TEMPLATE=FILE.jinja");
        let source = std::fs::read_to_string(&path).unwrap();
        let started = std::time::Instant::now();
        let t = JinjaTemplate::new(&source, "<s>", "</s>").unwrap();
        let compile = started.elapsed();
        let f = serde_json::json!({"name": "get_weather", "description": "The weather now in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}});
        let tool = Tool { name: "get_weather".into(), function: f.as_object().unwrap().clone() };
        let tools = [tool.clone(), Tool { name: "other".into(), ..tool }];
        let mut conv = vec![Message::new(Role::System, "You are a helpful assistant.")];
        for i in 0..10 {
            conv.push(Message::new(Role::User, format!("Question {i}: what is the weather like in Paris today?")));
            conv.push(Message::new(Role::Assistant, format!("Answer {i}: it is sunny and 20 degrees in Paris.")));
        }
        conv.push(Message::new(Role::User, "And tomorrow?"));
        let options = RenderOptions { add_generation_prompt: true, kwargs: Map::new() };
        let n = 200;
        let started = std::time::Instant::now();
        for _ in 0..n {
            std::hint::black_box(t.render(&conv, &tools, &options, true).unwrap());
        }
        let per = started.elapsed() / n;
        let len = t.render(&conv, &tools, &options, true).unwrap().as_str().len();
        eprintln!("{path}: compile {compile:?}, render {per:?} per request ({len} bytes of prompt)");
    }

    #[test]
    fn strftime_directives() {
        // 2024-07-26 13:05:09 UTC, a Friday
        let t = 1_722_000_000 - 1_722_000_000 % 86_400 + 13 * 3600 + 5 * 60 + 9;
        assert_eq!(
            strftime("%d %b %Y|%-d %B|%Y-%m-%d %H:%M:%S|%A %a %j %%", t),
            "26 Jul 2024|26 July|2024-07-26 13:05:09|Friday Fri 208 %"
        );
    }
}
