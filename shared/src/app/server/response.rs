//! The JSON of answers: a whole answer (text or tool calls), or the chunks
//! of a streamed one (the opening, text, tool calls, the finish, usage),
//! with OpenAI's logprobs and usage. `Reply` holds what every piece of one
//! answer shares; its methods say which piece they make.

use serde_json::{json, Map, Value};

use super::job::TokenLogprob;
use crate::chat::ToolCall;
use crate::generate::Finish;

/// `tool_calls` of an assistant message.
fn calls_json(calls: &[ToolCall]) -> Value {
    Value::Array(
        calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect(),
    )
}

pub fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// (prompt, completion, cached) tokens of a `usage` value: what the
/// Messages and Responses APIs report in their own fields.
pub fn usage_counts(usage: &Value) -> (u64, u64, u64) {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    (n(&usage["prompt_tokens"]), n(&usage["completion_tokens"]), n(&usage["prompt_tokens_details"]["cached_tokens"]))
}

/// A token's bytes as a string for logprobs. Whole characters stay as they
/// are; a token that holds part of a character (a byte-level tokenizer
/// splits most emoji and CJK characters) shows its bytes that are not whole
/// characters as `\xNN` and, for the legacy completions, gets OpenAI's
/// `bytes:` prefix (`"bytes:\xf0\x9f"`), never U+FFFD, which would hide
/// which bytes they are. Chat logprobs carry the exact bytes in `bytes` too.
fn token_text(bytes: &[u8], prefix: &str) -> String {
    let mut out = String::new();
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    if out.len() != bytes.len() {
        out.insert_str(0, prefix);
    }
    out
}

/// `choices[].logprobs` of a chat answer or chunk.
fn chat_logprobs(lps: &[TokenLogprob]) -> Value {
    let entry = |b: &[u8], lp: f64| json!({"token": token_text(b, ""), "logprob": lp, "bytes": b});
    let content: Vec<Value> = lps
        .iter()
        .map(|t| {
            let mut e = entry(&t.bytes, t.logprob);
            e["top_logprobs"] = Value::Array(t.top.iter().map(|(b, lp)| entry(b, *lp)).collect());
            e
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// `choices[].logprobs` of a completion answer or chunk. `text_offset` is
/// where each token starts in the answer's `text`, in characters (code
/// points: what a Python client's `text[i]` indexes).
fn completion_logprobs(lps: &[TokenLogprob]) -> Value {
    let mut tokens = Vec::new();
    let mut logprobs = Vec::new();
    let mut tops = Vec::new();
    let mut offsets = Vec::new();
    for t in lps {
        offsets.push(t.text_offset);
        tokens.push(token_text(&t.bytes, "bytes:"));
        logprobs.push(t.logprob);
        let mut m = Map::new();
        for (b, lp) in &t.top {
            m.entry(token_text(b, "bytes:")).or_insert(json!(lp));
        }
        tops.push(Value::Object(m));
    }
    json!({"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets})
}

/// What the answer and the chunks of one request share: its identity, its
/// endpoint (chat or completions) and whether it asked for
/// `stream_options.include_usage` (then every chunk has a `usage` field,
/// null until the extra last chunk).
pub struct Reply {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub fingerprint: String,
    pub chat: bool,
    pub include_usage: bool,
}

impl Reply {
    fn base(&self, object: &str) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("id".into(), json!(self.id));
        m.insert("object".into(), json!(object));
        m.insert("created".into(), json!(self.created));
        m.insert("model".into(), json!(self.model));
        m.insert("system_fingerprint".into(), json!(self.fingerprint));
        m
    }

    /// `choices[].logprobs` in the endpoint's shape.
    pub fn logprobs(&self, lps: &[TokenLogprob]) -> Value {
        if self.chat {
            chat_logprobs(lps)
        } else {
            completion_logprobs(lps)
        }
    }

    /// The whole (not streamed) answer.
    /// `reasoning`: what the model reasoned apart from its answer (harmony's
    /// analysis channel), a chat message's `reasoning_content` when not empty.
    pub fn answer(&self, text: &str, reasoning: &str, finish: Finish, usage: Value, logprobs: Option<Value>) -> Value {
        let lp = logprobs.unwrap_or(Value::Null);
        let choice = if self.chat {
            let mut message = json!({"role": "assistant", "content": text, "refusal": null});
            if !reasoning.is_empty() {
                message["reasoning_content"] = json!(reasoning);
            }
            json!({"index": 0, "message": message, "logprobs": lp, "finish_reason": finish.as_str()})
        } else {
            json!({"index": 0, "text": text, "logprobs": lp, "finish_reason": finish.as_str()})
        };
        let mut m = self.base(if self.chat { "chat.completion" } else { "text_completion" });
        m.insert("choices".into(), json!([choice]));
        m.insert("usage".into(), usage);
        Value::Object(m)
    }

    /// The whole chat answer when the model called tools: `content` (null
    /// when empty) and the calls, `finish_reason` "tool_calls".
    pub fn answer_calls(&self, content: &str, calls: &[ToolCall], usage: Value) -> Value {
        let content = if content.is_empty() { Value::Null } else { json!(content) };
        let message =
            json!({"role": "assistant", "content": content, "refusal": null, "tool_calls": calls_json(calls)});
        let choice = json!({"index": 0, "message": message, "logprobs": null, "finish_reason": "tool_calls"});
        let mut m = self.base("chat.completion");
        m.insert("choices".into(), json!([choice]));
        m.insert("usage".into(), usage);
        Value::Object(m)
    }

    /// A chunk of a stream holding one choice.
    fn chunk(&self, choice: Value) -> Value {
        let mut m = self.base(if self.chat { "chat.completion.chunk" } else { "text_completion" });
        m.insert("choices".into(), json!([choice]));
        if self.include_usage {
            m.insert("usage".into(), Value::Null);
        }
        Value::Object(m)
    }

    /// A chat chunk whose choice has this delta.
    fn delta_chunk(&self, delta: Value, logprobs: Option<Value>, finish: Option<&str>) -> Value {
        let lp = logprobs.unwrap_or(Value::Null);
        self.chunk(json!({"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}))
    }

    /// OpenAI's first chunk of a chat stream: the role and empty content.
    /// (A completions stream has no opening chunk.)
    pub fn opening_chunk(&self) -> Value {
        self.delta_chunk(json!({"role": "assistant", "content": ""}), None, None)
    }

    /// A chunk of a chat answer's reasoning (`delta.reasoning_content`, as
    /// llama-server and DeepSeek's API send it).
    pub fn reasoning_chunk(&self, text: &str) -> Value {
        self.delta_chunk(json!({"reasoning_content": text}), None, None)
    }

    /// A chunk of text, with the logprobs of the tokens that made it.
    pub fn text_chunk(&self, text: &str, logprobs: Option<Value>) -> Value {
        if self.chat {
            self.delta_chunk(json!({"content": text}), logprobs, None)
        } else {
            let lp = logprobs.unwrap_or(Value::Null);
            self.chunk(json!({"index": 0, "text": text, "logprobs": lp, "finish_reason": null}))
        }
    }

    /// The last chunk of a text answer: why it ended (an empty delta, or
    /// empty text for completions).
    pub fn finish_chunk(&self, finish: Finish) -> Value {
        if self.chat {
            self.delta_chunk(json!({}), None, Some(finish.as_str()))
        } else {
            self.chunk(json!({"index": 0, "text": "", "logprobs": null, "finish_reason": finish.as_str()}))
        }
    }

    /// The chunks of a chat answer's calls (each call's id, type and name in
    /// one chunk, its arguments in the next, as OpenAI streams them), then
    /// the last chunk, `finish_reason` "tool_calls".
    pub fn calls_chunks(&self, calls: &[ToolCall]) -> Vec<Value> {
        let mut out = Vec::new();
        for (i, c) in calls.iter().enumerate() {
            let head = json!({"tool_calls": [{"index": i, "id": c.id, "type": "function",
                                              "function": {"name": c.name, "arguments": ""}}]});
            out.push(self.delta_chunk(head, None, None));
            let args = json!({"tool_calls": [{"index": i, "function": {"arguments": c.arguments}}]});
            out.push(self.delta_chunk(args, None, None));
        }
        out.push(self.delta_chunk(json!({}), None, Some("tool_calls")));
        out
    }

    /// The extra last chunk of `stream_options.include_usage`: no choices, the usage.
    pub fn usage_chunk(&self, usage: Value) -> Value {
        let mut m = self.base(if self.chat { "chat.completion.chunk" } else { "text_completion" });
        m.insert("choices".into(), json!([]));
        m.insert("usage".into(), usage);
        Value::Object(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_with_part_of_a_character_show_their_bytes() {
        let smile = "😀".as_bytes();
        assert_eq!(token_text(b" hi", "bytes:"), " hi");
        assert_eq!(token_text("中".as_bytes(), "bytes:"), "中");
        assert_eq!(token_text(&smile[..2], "bytes:"), "bytes:\\xf0\\x9f");
        assert_eq!(token_text(&[b' ', smile[0]], ""), " \\xf0");
        let lp = |bytes: &[u8], text_offset| TokenLogprob {
            bytes: bytes.to_vec(),
            text_offset,
            logprob: -1.0,
            top: vec![(smile[2..].to_vec(), -1.0)],
        };
        let v = completion_logprobs(&[lp(&smile[..2], 0), lp(&smile[2..], 0), lp(b"!", 1)]);
        assert_eq!(v["tokens"], json!(["bytes:\\xf0\\x9f", "bytes:\\x98\\x80", "!"]));
        assert_eq!(v["text_offset"], json!([0, 0, 1]));
        assert_eq!(v["top_logprobs"][0], json!({"bytes:\\x98\\x80": -1.0}));
        let v = chat_logprobs(&[lp(&smile[..2], 0)]);
        assert_eq!(v["content"][0]["token"], "\\xf0\\x9f");
        assert_eq!(v["content"][0]["bytes"], json!([0xf0, 0x9f]));
        assert_eq!(v["content"][0]["top_logprobs"][0]["bytes"], json!([0x98, 0x80]));
    }
}
