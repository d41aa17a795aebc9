//! Anthropic's Messages API (`POST /v1/messages`): the request translated
//! into a chat completion request (system, text, `tool_use` and
//! `tool_result` blocks, tools with their `input_schema`, `tool_choice`,
//! `stop_sequences`, `thinking`), and the answer in Anthropic's shapes: a
//! message of content blocks (`thinking`, `text`, `tool_use`) with its
//! `stop_reason`, or, streamed, `message_start`, each block's
//! `content_block_start` / `_delta` / `_stop`, `message_delta` and
//! `message_stop` events. Errors as `{"type": "error", "error": {...}}`.

use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::fields::{refuse_unknown, wrong_type};
use super::response::usage_counts as counts;
use crate::chat::ToolCall;
use crate::generate::Finish;

const FIELDS: [&str; 13] = [
    "model",
    "max_tokens",
    "messages",
    "system",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "metadata",
    "thinking",
];

fn bad(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::field("invalid_value", param, message)
}

/// The text of a `system` or `tool_result` content: a string, or text blocks.
fn text_of(v: &Value, param: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut s = String::new();
            for (i, b) in blocks.iter().enumerate() {
                match (b.get("type").and_then(Value::as_str), b.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => s.push_str(t),
                    _ => return Err(bad(&format!("{param}[{i}]"), format!("'{param}[{i}]' must be a text block"))),
                }
            }
            Ok(s)
        }
        other => Err(wrong_type(param, "a string or an array of text blocks", other)),
    }
}

/// The request as a chat completion request's body.
pub(crate) fn to_chat_request(obj: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    refuse_unknown(obj, &[&FIELDS])?;
    let mut out = Map::new();
    for (from, to) in [
        ("model", "model"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("stream", "stream"),
        ("stop_sequences", "stop"),
    ] {
        if let Some(v) = obj.get(from).filter(|v| !v.is_null()) {
            out.insert(to.into(), v.clone());
        }
    }
    match obj.get("max_tokens") {
        Some(v) => out.insert("max_tokens".into(), v.clone()),
        None => return Err(ApiError::field("missing_parameter", "max_tokens", "'max_tokens' is required")),
    };
    let mut messages = Vec::new();
    if let Some(system) = obj.get("system").filter(|v| !v.is_null()) {
        messages.push(json!({"role": "system", "content": text_of(system, "system")?}));
    }
    let list = match obj.get("messages") {
        Some(Value::Array(a)) => a,
        None => return Err(ApiError::field("missing_parameter", "messages", "'messages' is required")),
        Some(other) => return Err(wrong_type("messages", "an array", other)),
    };
    for (i, m) in list.iter().enumerate() {
        let p = format!("messages[{i}]");
        let role = m.get("role").and_then(Value::as_str);
        if !matches!(role, Some("user" | "assistant")) {
            return Err(bad(&format!("{p}.role"), format!("'{p}.role' must be 'user' or 'assistant'")));
        }
        let blocks = match m.get("content") {
            Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
            Some(Value::Array(a)) => a.clone(),
            _ => {
                return Err(bad(
                    &format!("{p}.content"),
                    format!("'{p}.content' must be a string or an array of blocks"),
                ))
            }
        };
        let (mut text, mut calls, mut results) = (String::new(), Vec::new(), Vec::new());
        for (j, b) in blocks.iter().enumerate() {
            let bp = format!("{p}.content[{j}]");
            match (b.get("type").and_then(Value::as_str), role) {
                (Some("text"), _) => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or_default()),
                (Some("thinking" | "redacted_thinking"), Some("assistant")) => {} // earlier reasoning: not shown again
                (Some("tool_use"), Some("assistant")) => {
                    let (Some(id), Some(name)) = (b.get("id"), b.get("name")) else {
                        return Err(bad(&bp, format!("'{bp}' needs 'id' and 'name'")));
                    };
                    let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                    calls.push(json!({"id": id, "type": "function",
                                      "function": {"name": name, "arguments": input.to_string()}}));
                }
                (Some("tool_result"), Some("user")) => {
                    let id = b.get("tool_use_id").ok_or_else(|| bad(&bp, format!("'{bp}' needs 'tool_use_id'")))?;
                    let content = match b.get("content") {
                        None | Some(Value::Null) => String::new(),
                        Some(c) => text_of(c, &format!("{bp}.content"))?,
                    };
                    results.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
                }
                (Some(kind), _) => {
                    return Err(ApiError::field(
                        "unsupported_value",
                        &bp,
                        format!("'{bp}': a '{kind}' block in a {} message is not supported", role.unwrap_or("")),
                    ))
                }
                (None, _) => return Err(bad(&bp, format!("'{bp}' has no 'type'"))),
            }
        }
        messages.extend(results);
        if role == Some("assistant") {
            let mut a = json!({"role": "assistant", "content": text});
            if !calls.is_empty() {
                a["tool_calls"] = Value::Array(calls);
            }
            messages.push(a);
        } else if !text.is_empty() || messages.last().is_none_or(|m| m["role"] != "tool") {
            messages.push(json!({"role": "user", "content": text}));
        }
    }
    out.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = obj.get("tools").filter(|v| !v.is_null()) {
        let Value::Array(tools) = tools else { return Err(wrong_type("tools", "an array", tools)) };
        let mut list = Vec::new();
        for (i, t) in tools.iter().enumerate() {
            let mut f = Map::new();
            for (from, to) in [("name", "name"), ("description", "description"), ("input_schema", "parameters")] {
                if let Some(v) = t.get(from) {
                    f.insert(to.into(), v.clone());
                }
            }
            if !f.contains_key("name") {
                return Err(bad(&format!("tools[{i}]"), format!("'tools[{i}]' needs 'name'")));
            }
            list.push(json!({"type": "function", "function": f}));
        }
        out.insert("tools".into(), Value::Array(list));
    }
    if let Some(choice) = obj.get("tool_choice").filter(|v| !v.is_null()) {
        let kind = choice.get("type").and_then(Value::as_str);
        let c = match kind {
            Some("auto") => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => {
                json!({"type": "function", "function": {"name": choice.get("name").cloned().unwrap_or(Value::Null)}})
            }
            _ => return Err(bad("tool_choice", "'tool_choice.type' must be 'auto', 'any', 'tool' or 'none'")),
        };
        out.insert("tool_choice".into(), c);
        if choice.get("disable_parallel_tool_use") == Some(&Value::Bool(true)) {
            out.insert("parallel_tool_calls".into(), Value::Bool(false));
        }
    }
    if let Some(thinking) = obj.get("thinking").filter(|v| !v.is_null()) {
        let on = match thinking.get("type").and_then(Value::as_str) {
            Some("enabled") => true,
            Some("disabled") => false,
            _ => return Err(bad("thinking", "'thinking.type' must be 'enabled' or 'disabled'")),
        };
        out.insert("chat_template_kwargs".into(), json!({"enable_thinking": on}));
    }
    Ok(out)
}

/// An error in Anthropic's shape.
pub(crate) fn error_json(e: &ApiError) -> Value {
    json!({"type": "error", "error": {"type": e.kind, "message": e.message}})
}

fn stop_reason(finish: Finish) -> &'static str {
    match finish {
        Finish::Length => "max_tokens",
        Finish::Stop | Finish::Cancelled => "end_turn",
    }
}

fn usage_json(usage: &Value) -> Value {
    let (input, output, cached) = counts(usage);
    json!({"input_tokens": input - cached, "cache_read_input_tokens": cached, "output_tokens": output})
}

fn call_block(c: &ToolCall) -> Value {
    let input: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
    json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input})
}

/// One answer: its identity, and for a stream the block that is open.
pub(crate) struct Message {
    pub id: String,
    pub model: String,
    /// Blocks started so far (the next one's index).
    blocks: usize,
    open: Option<&'static str>,
}

impl Message {
    pub fn new(id: String, model: String) -> Message {
        Message { id, model, blocks: 0, open: None }
    }

    fn whole(&self, content: Vec<Value>, stop_reason: &str, usage: &Value) -> Value {
        json!({"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
               "stop_reason": stop_reason, "stop_sequence": null, "usage": usage_json(usage)})
    }

    /// The whole answer of text (and reasoning).
    pub fn answer(&self, text: &str, reasoning: &str, finish: Finish, usage: &Value) -> Value {
        let mut content = Vec::new();
        if !reasoning.is_empty() {
            content.push(json!({"type": "thinking", "thinking": reasoning, "signature": ""}));
        }
        content.push(json!({"type": "text", "text": text}));
        self.whole(content, stop_reason(finish), usage)
    }

    /// The whole answer that called tools.
    pub fn answer_calls(&self, text: &str, calls: &[ToolCall], usage: &Value) -> Value {
        let mut content = Vec::new();
        if !text.is_empty() {
            content.push(json!({"type": "text", "text": text}));
        }
        content.extend(calls.iter().map(call_block));
        self.whole(content, "tool_use", usage)
    }

    /// A stream's first event, once the prompt's size is known.
    pub fn start(&self, prompt_tokens: usize) -> Vec<Vec<u8>> {
        let message = json!({"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                             "content": [], "stop_reason": null, "stop_sequence": null,
                             "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}});
        vec![event("message_start", &json!({"type": "message_start", "message": message}))]
    }

    /// The events that close the open block, if any.
    fn close(&mut self) -> Vec<Vec<u8>> {
        match self.open.take() {
            Some(_) => {
                vec![event("content_block_stop", &json!({"type": "content_block_stop", "index": self.blocks - 1}))]
            }
            None => Vec::new(),
        }
    }

    /// The events of a piece of a block of `kind` (`text` or `thinking`),
    /// opening it (and closing another) first.
    fn piece(&mut self, kind: &'static str, text: &str) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        if self.open != Some(kind) {
            out = self.close();
            let block = if kind == "text" {
                json!({"type": "text", "text": ""})
            } else {
                json!({"type": "thinking", "thinking": ""})
            };
            out.push(event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": self.blocks, "content_block": block}),
            ));
            self.blocks += 1;
            self.open = Some(kind);
        }
        let delta = if kind == "text" {
            json!({"type": "text_delta", "text": text})
        } else {
            json!({"type": "thinking_delta", "thinking": text})
        };
        out.push(event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": self.blocks - 1, "delta": delta}),
        ));
        out
    }

    pub fn text(&mut self, text: &str) -> Vec<Vec<u8>> {
        self.piece("text", text)
    }

    pub fn reasoning(&mut self, text: &str) -> Vec<Vec<u8>> {
        self.piece("thinking", text)
    }

    fn end(&mut self, stop_reason: &str, usage: &Value) -> Vec<Vec<u8>> {
        let mut out = self.close();
        let (_, output, _) = counts(usage);
        out.push(event(
            "message_delta",
            &json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null},
                    "usage": {"output_tokens": output}}),
        ));
        out.push(event("message_stop", &json!({"type": "message_stop"})));
        out
    }

    /// A stream's last events after text.
    pub fn finish(&mut self, finish: Finish, usage: &Value) -> Vec<Vec<u8>> {
        self.end(stop_reason(finish), usage)
    }

    /// A stream's last events when the model called tools: the text not
    /// sent yet, each call as a `tool_use` block, the end.
    pub fn finish_calls(&mut self, text: &str, calls: &[ToolCall], usage: &Value) -> Vec<Vec<u8>> {
        let mut out = if text.is_empty() { Vec::new() } else { self.text(text) };
        out.extend(self.close());
        for c in calls {
            let mut block = call_block(c);
            let input = std::mem::replace(&mut block["input"], json!({}));
            out.push(event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": self.blocks, "content_block": block}),
            ));
            out.push(event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": self.blocks,
                        "delta": {"type": "input_json_delta", "partial_json": input.to_string()}}),
            ));
            out.push(event("content_block_stop", &json!({"type": "content_block_stop", "index": self.blocks})));
            self.blocks += 1;
        }
        out.extend(self.end("tool_use", usage));
        out
    }

    /// An error event in a stream.
    pub fn error(e: &ApiError) -> Vec<u8> {
        event("error", &error_json(e))
    }
}

fn event(name: &str, data: &Value) -> Vec<u8> {
    format!("event: {name}\ndata: {data}\n\n").into_bytes()
}
