//! OpenAI's Responses API (`POST /v1/responses`), without stored state: the
//! request translated into a chat completion request (`input` as text or
//! items: messages, `function_call`, `function_call_output`;
//! `instructions`, function tools, `tool_choice`, `max_output_tokens`,
//! `text.format`), and the answer as a response object whose `output`
//! holds a `reasoning` item, a `message` with its `output_text`, and
//! `function_call` items; streamed as `response.created`, the items' and
//! parts' `added` / `delta` / `done` events and `response.completed`, each
//! with its `sequence_number`. `previous_response_id` (server-side state)
//! is refused with a 400.

use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::fields::{refuse_unknown, wrong_type};
use super::response::usage_counts as counts;
use crate::chat::ToolCall;
use crate::generate::Finish;

const FIELDS: [&str; 19] = [
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "stream",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "store",
    "metadata",
    "user",
    "previous_response_id",
    "reasoning",
    "truncation",
    "include",
    "stream_options",
];

fn bad(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::field("invalid_value", param, message)
}

/// A message item's content: a string, or input/output text parts.
fn content_text(v: Option<&Value>, param: &str) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut s = String::new();
            for (i, part) in parts.iter().enumerate() {
                match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                    (Some("input_text" | "output_text" | "text"), Some(t)) => s.push_str(t),
                    (kind, _) => {
                        return Err(ApiError::field(
                            "unsupported_value",
                            &format!("{param}[{i}]"),
                            format!("'{param}[{i}]': a {:?} part is not supported (text only)", kind.unwrap_or("")),
                        ))
                    }
                }
            }
            Ok(s)
        }
        Some(other) => Err(wrong_type(param, "a string or an array of content parts", other)),
    }
}

/// The request as a chat completion request's body.
pub(crate) fn to_chat_request(obj: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    refuse_unknown(obj, &[&FIELDS])?;
    if obj.get("previous_response_id").is_some_and(|v| !v.is_null()) {
        return Err(ApiError::field(
            "unsupported_parameter",
            "previous_response_id",
            "this server keeps no responses: send the whole conversation in 'input'",
        ));
    }
    let mut out = Map::new();
    for (from, to) in [
        ("model", "model"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("stream", "stream"),
        ("max_output_tokens", "max_tokens"),
        ("parallel_tool_calls", "parallel_tool_calls"),
        ("stream_options", "stream_options"),
    ] {
        if let Some(v) = obj.get(from).filter(|v| !v.is_null()) {
            out.insert(to.into(), v.clone());
        }
    }
    let mut messages = Vec::new();
    if let Some(instructions) = obj.get("instructions").filter(|v| !v.is_null()) {
        let Value::String(s) = instructions else { return Err(wrong_type("instructions", "a string", instructions)) };
        messages.push(json!({"role": "system", "content": s}));
    }
    match obj.get("input") {
        None | Some(Value::Null) => return Err(ApiError::field("missing_parameter", "input", "'input' is required")),
        Some(Value::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let p = format!("input[{i}]");
                match item.get("type").and_then(Value::as_str).unwrap_or("message") {
                    "message" => {
                        let role = match item.get("role").and_then(Value::as_str) {
                            Some(r @ ("user" | "assistant" | "system" | "developer")) => r,
                            _ => {
                                return Err(bad(
                                    &format!("{p}.role"),
                                    format!("'{p}.role' must be 'user', 'assistant', 'system' or 'developer'"),
                                ))
                            }
                        };
                        let text = content_text(item.get("content"), &format!("{p}.content"))?;
                        messages.push(json!({"role": role, "content": text}));
                    }
                    "function_call" => {
                        let (Some(id), Some(name)) = (item.get("call_id"), item.get("name")) else {
                            return Err(bad(&p, format!("'{p}' needs 'call_id' and 'name'")));
                        };
                        let args = item.get("arguments").cloned().unwrap_or_else(|| json!("{}"));
                        let call = json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}});
                        // calls in a row are one assistant turn's
                        match messages.last_mut() {
                            Some(last) if last["role"] == "assistant" && last.get("tool_calls").is_some() => {
                                last["tool_calls"].as_array_mut().expect("an array").push(call);
                            }
                            _ => messages.push(json!({"role": "assistant", "content": "", "tool_calls": [call]})),
                        }
                    }
                    "function_call_output" => {
                        let id = item.get("call_id").ok_or_else(|| bad(&p, format!("'{p}' needs 'call_id'")))?;
                        let output = match item.get("output") {
                            Some(Value::String(s)) => s.clone(),
                            Some(other) => other.to_string(),
                            None => String::new(),
                        };
                        messages.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
                    }
                    "reasoning" => {} // earlier reasoning: not shown again
                    other => {
                        return Err(ApiError::field(
                            "unsupported_value",
                            &p,
                            format!("'{p}': items of type {other:?} are not supported"),
                        ))
                    }
                }
            }
        }
        Some(other) => return Err(wrong_type("input", "a string or an array of items", other)),
    }
    out.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = obj.get("tools").filter(|v| !v.is_null()) {
        let Value::Array(tools) = tools else { return Err(wrong_type("tools", "an array", tools)) };
        let mut list = Vec::new();
        for (i, t) in tools.iter().enumerate() {
            if t.get("type").and_then(Value::as_str) != Some("function") {
                return Err(ApiError::field(
                    "unsupported_value",
                    &format!("tools[{i}]"),
                    format!("'tools[{i}]': only function tools are supported"),
                ));
            }
            let mut f = Map::new();
            for k in ["name", "description", "parameters"] {
                if let Some(v) = t.get(k).filter(|v| !v.is_null()) {
                    f.insert(k.into(), v.clone());
                }
            }
            list.push(json!({"type": "function", "function": f}));
        }
        out.insert("tools".into(), Value::Array(list));
    }
    if let Some(choice) = obj.get("tool_choice").filter(|v| !v.is_null()) {
        let c = match choice {
            Value::String(_) => choice.clone(),
            Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
                json!({"type": "function", "function": {"name": o.get("name").cloned().unwrap_or(Value::Null)}})
            }
            _ => return Err(bad("tool_choice", "'tool_choice' must be 'auto', 'none', 'required' or a function")),
        };
        out.insert("tool_choice".into(), c);
    }
    // asking for reasoning turns the template's thinking on (and gpt-oss's effort)
    if let Some(reasoning) = obj.get("reasoning").filter(|v| !v.is_null()) {
        let mut kwargs = Map::new();
        kwargs.insert("enable_thinking".into(), Value::Bool(true));
        if let Some(effort) = reasoning.get("effort").filter(|v| v.is_string()) {
            kwargs.insert("reasoning_effort".into(), effort.clone());
        }
        out.insert("chat_template_kwargs".into(), Value::Object(kwargs));
    }
    if let Some(format) = obj.get("text").and_then(|t| t.get("format")).filter(|v| !v.is_null()) {
        match format.get("type").and_then(Value::as_str) {
            Some("text") => {}
            Some("json_object") => {
                out.insert("response_format".into(), json!({"type": "json_object"}));
            }
            Some("json_schema") => {
                let mut schema = Map::new();
                for k in ["name", "schema", "strict"] {
                    if let Some(v) = format.get(k) {
                        schema.insert(k.into(), v.clone());
                    }
                }
                out.insert("response_format".into(), json!({"type": "json_schema", "json_schema": schema}));
            }
            _ => return Err(bad("text.format", "'text.format.type' must be 'text', 'json_object' or 'json_schema'")),
        }
    }
    Ok(out)
}

fn usage_json(usage: &Value) -> Value {
    let (input, output, cached) = counts(usage);
    json!({"input_tokens": input, "input_tokens_details": {"cached_tokens": cached},
           "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
           "total_tokens": input + output})
}

/// One response: its identity, the items made so far, and for a stream
/// the item that is open and the events' count.
pub(crate) struct Response {
    id: String,
    model: String,
    created: u64,
    /// The request's settings the response object repeats.
    echo: Map<String, Value>,
    output: Vec<Value>,
    /// The open item: ("reasoning" | "message", its text so far).
    open: Option<(&'static str, String)>,
    sequence: u64,
}

impl Response {
    pub fn new(id: String, model: String, created: u64, request: &Map<String, Value>) -> Response {
        let mut echo = Map::new();
        for (k, default) in [
            ("instructions", Value::Null),
            ("max_output_tokens", Value::Null),
            ("temperature", json!(1.0)),
            ("top_p", json!(1.0)),
            ("tool_choice", json!("auto")),
            ("tools", json!([])),
            ("parallel_tool_calls", json!(true)),
            ("metadata", json!({})),
            ("text", json!({"format": {"type": "text"}})),
        ] {
            echo.insert(k.into(), request.get(k).filter(|v| !v.is_null()).cloned().unwrap_or(default));
        }
        Response { id, model, created, echo, output: Vec::new(), open: None, sequence: 0 }
    }

    /// The response object with `status` and the output so far.
    fn object(&self, status: &str, finish: Option<Finish>, usage: Option<&Value>) -> Value {
        let mut m = Map::new();
        m.insert("id".into(), json!(self.id));
        m.insert("object".into(), json!("response"));
        m.insert("created_at".into(), json!(self.created));
        m.insert("status".into(), json!(status));
        m.insert("model".into(), json!(self.model));
        m.insert("output".into(), Value::Array(self.output.clone()));
        m.insert("error".into(), Value::Null);
        let incomplete = (finish == Some(Finish::Length)).then(|| json!({"reason": "max_output_tokens"}));
        m.insert("incomplete_details".into(), incomplete.unwrap_or(Value::Null));
        m.insert("previous_response_id".into(), Value::Null);
        m.insert("store".into(), json!(false));
        m.insert("usage".into(), usage.map_or(Value::Null, usage_json));
        m.extend(self.echo.clone());
        Value::Object(m)
    }

    fn item_id(&self, prefix: &str) -> String {
        format!("{prefix}_{}_{}", &self.id[5..], self.output.len())
    }

    fn reasoning_item(&self, text: &str, status: &str) -> Value {
        json!({"type": "reasoning", "id": self.item_id("rs"), "status": status, "summary": [],
               "content": [{"type": "reasoning_text", "text": text}]})
    }

    fn message_item(&self, text: &str, status: &str) -> Value {
        let content = if status == "in_progress" && text.is_empty() {
            json!([])
        } else {
            json!([{"type": "output_text", "text": text, "annotations": []}])
        };
        json!({"type": "message", "id": self.item_id("msg"), "status": status, "role": "assistant", "content": content})
    }

    fn call_item(&self, c: &ToolCall, status: &str) -> Value {
        json!({"type": "function_call", "id": self.item_id("fc"), "call_id": c.id, "name": c.name,
               "arguments": c.arguments, "status": status})
    }

    /// The whole answer of text (and reasoning).
    pub fn answer(&mut self, text: &str, reasoning: &str, finish: Finish, usage: &Value) -> Value {
        if !reasoning.is_empty() {
            self.output.push(self.reasoning_item(reasoning, "completed"));
        }
        self.output.push(self.message_item(text, "completed"));
        let status = if finish == Finish::Length { "incomplete" } else { "completed" };
        self.object(status, Some(finish), Some(usage))
    }

    /// The whole answer that called tools.
    pub fn answer_calls(&mut self, text: &str, calls: &[ToolCall], usage: &Value) -> Value {
        if !text.is_empty() {
            self.output.push(self.message_item(text, "completed"));
        }
        for c in calls {
            self.output.push(self.call_item(c, "completed"));
        }
        self.object("completed", Some(Finish::Stop), Some(usage))
    }

    fn event(&mut self, kind: &str, mut data: Value) -> Vec<u8> {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        format!("event: {kind}\ndata: {data}\n\n").into_bytes()
    }

    /// A stream's first events.
    pub fn start(&mut self) -> Vec<Vec<u8>> {
        let obj = self.object("in_progress", None, None);
        vec![
            self.event("response.created", json!({"response": obj})),
            self.event("response.in_progress", json!({"response": obj})),
        ]
    }

    /// The events that finish the open item.
    fn close(&mut self) -> Vec<Vec<u8>> {
        let Some((kind, text)) = self.open.take() else { return Vec::new() };
        let index = self.output.len();
        let mut out = Vec::new();
        let item = if kind == "reasoning" {
            let id = self.item_id("rs");
            out.push(self.event(
                "response.reasoning_text.done",
                json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
            ));
            self.reasoning_item(&text, "completed")
        } else {
            let id = self.item_id("msg");
            let part = json!({"type": "output_text", "text": text, "annotations": []});
            out.push(self.event(
                "response.output_text.done",
                json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
            ));
            out.push(self.event(
                "response.content_part.done",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
            ));
            self.message_item(&text, "completed")
        };
        out.push(self.event("response.output_item.done", json!({"output_index": index, "item": item})));
        self.output.push(item);
        out
    }

    /// A piece of the reasoning or the message, opening its item (and
    /// finishing another) first.
    fn piece(&mut self, kind: &'static str, text: &str) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        if self.open.as_ref().map(|(k, _)| *k) != Some(kind) {
            out = self.close();
            let index = self.output.len();
            let item = if kind == "reasoning" {
                self.reasoning_item("", "in_progress")
            } else {
                self.message_item("", "in_progress")
            };
            out.push(self.event("response.output_item.added", json!({"output_index": index, "item": item})));
            if kind == "message" {
                let id = self.item_id("msg");
                out.push(self.event(
                    "response.content_part.added",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                           "part": {"type": "output_text", "text": "", "annotations": []}}),
                ));
            }
            self.open = Some((kind, String::new()));
        }
        let (index, id) = (self.output.len(), self.item_id(if kind == "reasoning" { "rs" } else { "msg" }));
        if let Some((_, so_far)) = &mut self.open {
            so_far.push_str(text);
        }
        let name = if kind == "reasoning" { "response.reasoning_text.delta" } else { "response.output_text.delta" };
        out.push(self.event(name, json!({"item_id": id, "output_index": index, "content_index": 0, "delta": text})));
        out
    }

    pub fn text(&mut self, text: &str) -> Vec<Vec<u8>> {
        self.piece("message", text)
    }

    pub fn reasoning(&mut self, text: &str) -> Vec<Vec<u8>> {
        self.piece("reasoning", text)
    }

    fn end(&mut self, finish: Finish, usage: &Value) -> Vec<Vec<u8>> {
        let mut out = self.close();
        let (kind, status) = if finish == Finish::Length {
            ("response.incomplete", "incomplete")
        } else {
            ("response.completed", "completed")
        };
        let obj = self.object(status, Some(finish), Some(usage));
        out.push(self.event(kind, json!({"response": obj})));
        out
    }

    /// A stream's last events after text.
    pub fn finish(&mut self, finish: Finish, usage: &Value) -> Vec<Vec<u8>> {
        if self.output.is_empty() && self.open.is_none() {
            // an empty answer is still a message
            let mut out = self.piece("message", "");
            out.extend(self.end(finish, usage));
            return out;
        }
        self.end(finish, usage)
    }

    /// A stream's last events when the model called tools.
    pub fn finish_calls(&mut self, text: &str, calls: &[ToolCall], usage: &Value) -> Vec<Vec<u8>> {
        let mut out = if text.is_empty() { Vec::new() } else { self.text(text) };
        out.extend(self.close());
        for c in calls {
            let index = self.output.len();
            let id = self.item_id("fc");
            let added = self.call_item(&ToolCall { arguments: String::new(), ..c.clone() }, "in_progress");
            out.push(self.event("response.output_item.added", json!({"output_index": index, "item": added})));
            out.push(self.event(
                "response.function_call_arguments.delta",
                json!({"item_id": id, "output_index": index, "delta": c.arguments}),
            ));
            out.push(self.event(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": index, "arguments": c.arguments}),
            ));
            let item = self.call_item(c, "completed");
            out.push(self.event("response.output_item.done", json!({"output_index": index, "item": item})));
            self.output.push(item);
        }
        out.extend(self.end(Finish::Stop, usage));
        out
    }

    /// An error event in a stream.
    pub fn error(&mut self, e: &ApiError) -> Vec<u8> {
        self.event("error", json!({"code": e.code, "message": e.message, "param": e.param}))
    }
}
