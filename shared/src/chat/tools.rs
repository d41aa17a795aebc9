//! Tool calls in the models' own formats: how the tools are shown to the
//! model and how its calls are written, per template family, and the way
//! back from generated text to calls.
//!
//! * Hermes (Qwen2.5 / Qwen3's `<tool_call>` JSON, used too by the
//!   templates without a format of their own: ChatML models such as
//!   SmolLM2, Gemma, Llama 2, Zephyr): the tools as JSON lines inside
//!   `<tools></tools>` in the system message, each call as
//!   `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`, results in
//!   a user turn inside `<tool_response></tool_response>`;
//! * Llama 3.1: the tools (JSON, indented) in the first user message, one
//!   call per turn as `{"name": …, "parameters": {…}}`, results in the
//!   `ipython` role;
//! * Mistral: `[AVAILABLE_TOOLS] [...][/AVAILABLE_TOOLS]` before the last
//!   user turn, calls as `[TOOL_CALLS] [{"name": …, "arguments": {…}}]`,
//!   results as `[TOOL_RESULTS] {"content": …, "call_id": …}[/TOOL_RESULTS]`.
//!
//! JSON is written as Python's `json.dumps` writes it (`", "` and `": "`),
//! as the templates' `tojson` did when the models were trained.

use std::time::Instant;

use serde_json::{Map, Value};

use super::{PromptText, Template};
use crate::grammar::{schema, Builder, Grammar, Sym};

/// The most calls one forced answer may hold: a small model that may go on
/// calling (the end of its turn is allowed after every call) still ends.
pub const MAX_PARALLEL_CALLS: usize = 8;

/// A function the model may call.
#[derive(Clone, Debug)]
pub struct Tool {
    pub name: String,
    /// The `function` object as the request gave it (name, description,
    /// parameters), shown to the model.
    pub function: Map<String, Value>,
}

impl Tool {
    /// The JSON Schema of the arguments (none given: any object).
    pub fn parameters(&self) -> Option<&Value> {
        self.function.get("parameters")
    }

    /// `{"type": "function", "function": {...}}`.
    fn as_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("type".into(), Value::String("function".into()));
        m.insert("function".into(), Value::Object(self.function.clone()));
        Value::Object(m)
    }
}

/// One call the model made (or made earlier in the conversation).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

/// How a template's models write calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallSyntax {
    Hermes,
    Llama3,
    Mistral,
}

impl Template {
    pub fn call_syntax(self) -> CallSyntax {
        match self {
            Template::Llama3 => CallSyntax::Llama3,
            Template::Mistral => CallSyntax::Mistral,
            _ => CallSyntax::Hermes,
        }
    }
}

/// `v` as Python's `json.dumps(v, ensure_ascii=False)` writes it, or with
/// `indent`, as `json.dumps(v, indent=indent)`.
pub fn py_json(v: &Value, indent: Option<usize>) -> String {
    let mut out = String::new();
    write_py_json(v, indent, 0, &mut out);
    out
}

fn write_py_json(v: &Value, indent: Option<usize>, depth: usize, out: &mut String) {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let sep = if indent.is_some() { "," } else { ", " };
    match v {
        Value::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1);
                write_py_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        Value::Object(m) if !m.is_empty() => {
            out.push('{');
            for (i, (k, item)) in m.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1);
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(": ");
                write_py_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Arguments JSON text as a template writes it: the object itself when it
/// parses (the models were trained on objects), else the text as a string.
fn arguments_json(arguments: &str) -> String {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v) => py_json(&v, None),
        Err(_) => py_json(&Value::String(arguments.to_string()), None),
    }
}

impl CallSyntax {
    /// What the system message gains (Hermes), where the tools are shown there.
    pub fn system_tools_text(self, tools: &[Tool]) -> Option<PromptText> {
        if self != CallSyntax::Hermes || tools.is_empty() {
            return None;
        }
        let mut s = PromptText::template(
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
             You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
        );
        for t in tools {
            s.push_template("\n");
            s.push_plain(&py_json(&t.as_json(), None));
        }
        s.push_template(
            "\n</tools>\n\nFor each function call, return a json object with function name and arguments within \
             <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": \
             <args-json-object>}\n</tool_call>",
        );
        Some(s)
    }

    /// Llama 3.1: the text before the first user message's own.
    pub fn user_tools_text(self, tools: &[Tool]) -> Option<PromptText> {
        if self != CallSyntax::Llama3 || tools.is_empty() {
            return None;
        }
        let mut s = PromptText::template(
            "Given the following functions, please respond with a JSON for a function call with its proper \
             arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function name, \
             \"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n",
        );
        for t in tools {
            s.push_plain(&py_json(&t.as_json(), Some(4)));
            s.push_template("\n\n");
        }
        Some(s)
    }

    /// Mistral: the block before the last user turn.
    pub fn available_tools_text(self, tools: &[Tool]) -> Option<PromptText> {
        if self != CallSyntax::Mistral || tools.is_empty() {
            return None;
        }
        let list: Vec<String> = tools.iter().map(|t| py_json(&t.as_json(), None)).collect();
        let mut s = PromptText::template("[AVAILABLE_TOOLS] [");
        s.push_plain(&list.join(", "));
        s.push_template("][/AVAILABLE_TOOLS]");
        Some(s)
    }

    /// An assistant turn's calls as the model writes them (after its text).
    pub fn calls_text(self, content: &str, calls: &[ToolCall]) -> Result<PromptText, String> {
        let call = |c: &ToolCall, args_key: &str| {
            format!(
                "{{\"name\": {}, \"{args_key}\": {}}}",
                py_json(&Value::String(c.name.clone()), None),
                arguments_json(&c.arguments)
            )
        };
        Ok(match self {
            CallSyntax::Hermes => {
                let mut s = PromptText::plain(content);
                for (i, c) in calls.iter().enumerate() {
                    if i > 0 || !content.is_empty() {
                        s.push_template("\n");
                    }
                    s.push_template("<tool_call>\n");
                    s.push_plain(&call(c, "arguments"));
                    s.push_template("\n</tool_call>");
                }
                s
            }
            CallSyntax::Llama3 => match calls {
                [c] => PromptText::plain(&call(c, "parameters")),
                _ => return Err("the llama3 template takes one tool call per assistant message".into()),
            },
            CallSyntax::Mistral => {
                let list: Vec<String> = calls
                    .iter()
                    .map(|c| {
                        let mut s = call(c, "arguments");
                        s.pop();
                        format!("{s}, \"id\": {}}}", py_json(&Value::String(c.id.clone()), None))
                    })
                    .collect();
                let mut s = PromptText::template("[TOOL_CALLS] [");
                s.push_plain(&list.join(", "));
                s.push_template("]");
                s
            }
        })
    }

    /// A tool's result as the model reads it.
    pub fn result_text(self, content: &str, call_id: &str) -> PromptText {
        match self {
            CallSyntax::Hermes => {
                let mut s = PromptText::template("<tool_response>\n");
                s.push_plain(content);
                s.push_template("\n</tool_response>");
                s
            }
            // the template writes a string result as JSON (`tojson`)
            CallSyntax::Llama3 => PromptText::plain(&py_json(&Value::String(content.to_string()), None)),
            CallSyntax::Mistral => {
                let mut s = PromptText::template("[TOOL_RESULTS] ");
                s.push_plain(&format!(
                    "{{\"content\": {}, \"call_id\": {}}}",
                    match serde_json::from_str::<Value>(content) {
                        Ok(v @ (Value::Object(_) | Value::Array(_))) => py_json(&v, None),
                        _ => py_json(&Value::String(content.to_string()), None),
                    },
                    py_json(&Value::String(call_id.to_string()), None)
                ));
                s.push_template("[/TOOL_RESULTS]");
                s
            }
        }
    }

    /// Text appended to the prompt when a call is required, so that the
    /// model's output is the call itself (Mistral's `[TOOL_CALLS]` is a
    /// control token, which a grammar over text cannot produce).
    pub fn forced_prefix(self) -> &'static str {
        match self {
            CallSyntax::Mistral => "[TOOL_CALLS]",
            _ => "",
        }
    }

    /// The grammar of a required call to one of `tools` (several with
    /// `parallel`, where the format allows it), after `forced_prefix`.
    /// Compiling stops with `grammar::DEADLINE_PASSED` once `deadline` has passed.
    pub fn grammar(self, tools: &[Tool], parallel: bool, deadline: Option<Instant>) -> Result<Grammar, String> {
        let mut b = Builder::until(deadline);
        let lit = |s: &str| s.bytes().map(|x| Sym::Bytes(x, x)).collect::<Vec<Sym>>();
        let args_key = if self == CallSyntax::Llama3 { "parameters" } else { "arguments" };
        let mut alts = Vec::new();
        for t in tools {
            let args = match t.parameters() {
                Some(p) => schema::rule(&mut b, p).map_err(|e| format!("tool '{}': {e}", t.name.escape_debug()))?,
                None => schema::any_object_rule(&mut b)?,
            };
            let mut call =
                lit(&format!("{{\"name\": {}, \"{args_key}\": ", py_json(&Value::String(t.name.clone()), None)));
            call.push(Sym::Rule(args));
            call.extend(lit("}"));
            alts.push(call);
        }
        let call = b.alt(alts)?;
        let (one, sep, open, close) = match self {
            CallSyntax::Hermes => {
                let mut one = lit("<tool_call>\n");
                one.push(call);
                one.extend(lit("\n</tool_call>"));
                (one, lit("\n"), vec![], vec![])
            }
            CallSyntax::Llama3 => (vec![call], vec![], vec![], vec![]),
            CallSyntax::Mistral => {
                // the model's first token is `▁[`, whose space the tokenizer drops at
                // the start of an output: the space may or may not be there
                let mut open = vec![b.optional(lit(" "))?];
                open.extend(lit("["));
                (vec![call], lit(", "), open, lit("]"))
            }
        };
        let max = if parallel && self != CallSyntax::Llama3 { MAX_PARALLEL_CALLS } else { 1 };
        let mut root = open;
        root.extend(b.repeat(&one, &sep, 1, Some(max))?);
        root.extend(close);
        let root = b.rule(vec![root])?;
        b.finish(root)
    }

    /// How much of an answer's text so far is certainly not part of a call,
    /// so a stream may send it as it comes (llama.cpp's streaming): Hermes
    /// calls follow the text, so everything before a `<tool_call>` (or the
    /// start of one) but its trailing whitespace, which `parse` trims;
    /// Llama 3.1's and Mistral's are the whole answer, so nothing while the
    /// answer may still be one, and all once it cannot.
    pub fn streamable(self, text: &str) -> usize {
        const HERMES: &str = "<tool_call>";
        let start = text.trim_start();
        let held_from = match self {
            CallSyntax::Hermes => text.find(HERMES).unwrap_or_else(|| text.len() - super::partial_suffix(text, HERMES)),
            CallSyntax::Llama3 => {
                let tag = "<|python_tag|>";
                let maybe =
                    start.is_empty() || start.starts_with('{') || tag.starts_with(start) || start.starts_with(tag);
                if maybe {
                    0
                } else {
                    text.len()
                }
            }
            CallSyntax::Mistral => {
                if start.is_empty() || start.starts_with('[') {
                    0
                } else {
                    text.len()
                }
            }
        };
        text[..held_from].trim_end().len()
    }

    /// The calls in a generated answer (after `forced_prefix` when a call was
    /// required), and the text before them; None when the answer holds no
    /// well-formed call to one of `tools` (it is then plain text).
    pub fn parse(self, text: &str, tools: &[Tool]) -> Option<(String, Vec<(String, String)>)> {
        let known = |v: &Value, args_key: &str| -> Option<(String, String)> {
            let name = v.get("name")?.as_str()?;
            tools.iter().find(|t| t.name == name)?;
            let args = v.get(args_key).or_else(|| v.get("arguments"))?;
            let args = match args {
                Value::String(s) => serde_json::from_str::<Value>(s).ok()?,
                other => other.clone(),
            };
            args.is_object().then(|| (name.to_string(), args.to_string()))
        };
        match self {
            CallSyntax::Hermes => {
                let start = text.find("<tool_call>")?;
                let mut calls = Vec::new();
                let mut rest = &text[start..];
                while let Some(after) = rest.trim_start().strip_prefix("<tool_call>") {
                    let Some(end) = after.find("</tool_call>") else { break };
                    let v: Value = serde_json::from_str(after[..end].trim()).ok()?;
                    calls.push(known(&v, "arguments")?);
                    rest = &after[end + "</tool_call>".len()..];
                }
                // what follows the calls: nothing, or a call cut off by the token limit
                let rest = rest.trim();
                let cut_off = rest.starts_with("<tool_call>") || "<tool_call>".starts_with(rest);
                (!calls.is_empty() && cut_off).then(|| (text[..start].trim_end().to_string(), calls))
            }
            CallSyntax::Llama3 => {
                // a call may follow `<|python_tag|>` (a control token, shown as text)
                let text = text.trim_start().strip_prefix("<|python_tag|>").unwrap_or(text);
                let v: Value = serde_json::from_str(text.trim()).ok()?;
                Some((String::new(), vec![known(&v, "parameters")?]))
            }
            CallSyntax::Mistral => {
                let list = text.trim_start().strip_prefix("[TOOL_CALLS]").unwrap_or(text);
                let v: Value = serde_json::from_str(list.trim()).ok()?;
                let calls = v.as_array()?.iter().map(|c| known(c, "arguments")).collect::<Option<Vec<_>>>()?;
                (!calls.is_empty()).then_some((String::new(), calls))
            }
        }
    }
}
