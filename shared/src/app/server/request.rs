//! A /v1/chat/completions or /v1/completions body, validated into a
//! `GenRequest`: the prompt (text, ids or messages), the sampling settings,
//! the stop strings, the grammars of `response_format` and `grammar`, the
//! tools and `tool_choice`. Every error is a 400 naming its field (or a 503
//! when the request's deadline passes while its grammar compiles).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use super::error::ApiError;
use super::fields::{beyond_64_bits, out_of_range, refuse_unknown, unsupported, wrong_type, Fields};
use super::job::GenParams;
use crate::chat::{Message, Role, Tool, ToolCall};
use crate::grammar::{self, Grammar};
use crate::sampler::{SettingRange, MIN_P, REPEAT_PENALTY, TEMPERATURE, TOP_P};

/// Sampling defaults where a request says nothing. Temperature and top_p
/// follow OpenAI; top_k and min_p (extensions) follow llama.cpp's server.
const DEFAULT_TEMPERATURE: f64 = 1.0;
const DEFAULT_TOP_K: i64 = 40;
const DEFAULT_MIN_P: f64 = 0.05;
/// OpenAI's default `max_tokens` for /v1/completions.
const DEFAULT_COMPLETION_TOKENS: usize = 16;
const MAX_STOPS: usize = 16;
const MAX_TOP_LOGPROBS: i64 = 20;
/// OpenAI's penalties: accepted, but only 0 is supported.
const FREQUENCY_PENALTY: SettingRange = SettingRange {
    name: "frequency_penalty",
    min: -2.0,
    max: 2.0,
    min_excluded: false,
    expected: "a number from -2 to 2",
};
const PRESENCE_PENALTY: SettingRange = SettingRange { name: "presence_penalty", ..FREQUENCY_PENALTY };

#[derive(Debug)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    Messages(Vec<Message>),
}

/// A validated request for either endpoint.
#[derive(Debug)]
pub struct GenRequest {
    pub chat: bool,
    pub prompt: Prompt,
    /// `max_tokens` when given; None: the endpoint's default.
    pub max_tokens: Option<usize>,
    pub params: GenParams,
    pub stream: bool,
    pub include_usage: bool,
    /// Chat: the functions the model may call, and whether and how it must.
    pub tools: Vec<Tool>,
    pub tool_choice: ToolChoice,
    pub parallel_tool_calls: bool,
    /// Chat: extra variables for the model's own template (`chat_template_kwargs`,
    /// and `enable_thinking` given on its own).
    pub template_kwargs: serde_json::Map<String, Value>,
    /// Chat: whether the answer's `<think>` block becomes `reasoning_content`.
    pub reasoning: ReasoningFormat,
    /// Chat: the prompt's text as the template wrote it (set when it is made).
    pub prompt_text: String,
    /// Chat with `--context-shift`: the oldest turns dropped to make room,
    /// and their tokens (set when the prompt is made).
    pub dropped: (usize, usize),
    /// Completions: special tokens written in the prompt (`<|im_start|>`) are
    /// the control tokens they name (llama.cpp's `parse_special`); by default
    /// they are plain text.
    pub parse_special: bool,
}

/// llama-server's `reasoning_format`: what becomes of a `<think>` block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// Left in `content` as the model wrote it.
    None,
    /// Apart, as `reasoning_content` (`auto` and `deepseek`).
    Apart,
    /// Both: in `content` as written, and as `reasoning_content`.
    Both,
}

/// OpenAI's `tool_choice`.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    /// No tools are shown; the answer is text.
    None,
    /// The model answers with text or calls (its choice).
    Auto,
    /// The answer is one or more calls (their arguments valid against the
    /// functions' schemas).
    Required,
    /// The answer is a call to this function.
    Function(String),
}

impl GenRequest {
    /// The output-token limit when `prompt_len` tokens leave `room` in the context.
    pub fn token_limit(&self, room: usize) -> usize {
        match self.max_tokens {
            Some(n) => n.min(room),
            None if self.chat => room,
            None => DEFAULT_COMPLETION_TOKENS.min(room),
        }
    }

    /// The tools the template shows the model: none when `tool_choice` is "none".
    pub fn shown_tools(&self) -> &[Tool] {
        if self.tool_choice == ToolChoice::None {
            &[]
        } else {
            &self.tools
        }
    }
}

/// Fields both endpoints accept.
const COMMON_FIELDS: [&str; 23] = [
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repeat_penalty",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "user",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "ignore_eos",
    "timeout",
    "speculative.n_max",
    "speculative.n_min",
    "response_format",
    "json_schema",
    "grammar",
];
/// The longest `timeout` a request may ask for: a day.
const MAX_TIMEOUT: f64 = 86_400.0;
const CHAT_FIELDS: [&str; 11] = [
    "messages",
    "chat_template_kwargs",
    "enable_thinking",
    "reasoning_format",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "store",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
];
const COMPLETION_FIELDS: [&str; 6] = ["prompt", "logprobs", "echo", "suffix", "best_of", "parse_special"];

/// What a request gets from the server where it says nothing, and when it arrived.
pub struct ServerDefaults {
    /// The seed of a request without one.
    pub seed: u64,
    /// `--request-timeout` (None: no limit); a request may ask for less.
    pub timeout: Option<f64>,
    /// When the request arrived: its deadline counts from here, and covers
    /// compiling its grammars too.
    pub received: Instant,
}

impl ServerDefaults {
    /// The deadline of a request that asks for `timeout` seconds (None: the server's).
    fn deadline(&self, timeout: Option<f64>) -> Option<Instant> {
        self.effective_timeout(timeout).map(|s| self.received + Duration::from_secs_f64(s))
    }

    /// The request's own timeout within the server's.
    fn effective_timeout(&self, timeout: Option<f64>) -> Option<f64> {
        match (timeout, self.timeout) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The answer to a grammar (schema, GBNF, tool) that did not compile for
/// `param`: 400 naming the problem, or 503 when the request's deadline
/// passed while compiling it.
pub(crate) fn grammar_error(param: &str, e: String) -> ApiError {
    if e.ends_with(grammar::DEADLINE_PASSED) {
        return ApiError::new(503, "timeout", grammar::DEADLINE_PASSED);
    }
    ApiError::field("invalid_value", param, e)
}

/// Validates a /v1/chat/completions (`chat`) or /v1/completions body.
pub fn parse_request(obj: &Map<String, Value>, chat: bool, server: &ServerDefaults) -> Result<GenRequest, ApiError> {
    let own: &[&str] = if chat { &CHAT_FIELDS } else { &COMPLETION_FIELDS };
    refuse_unknown(obj, &[&COMMON_FIELDS, own])?;
    let f = Fields(obj);
    f.string("model")?;
    f.string("user")?;
    if f.int("n", 1, i64::MAX).map_err(|_| unsupported("n", "n other than 1"))?.is_some_and(|n| n != 1) {
        return Err(unsupported("n", "n other than 1"));
    }
    for range in [&FREQUENCY_PENALTY, &PRESENCE_PENALTY] {
        if f.number(range)?.is_some_and(|x| x != 0.0) {
            return Err(unsupported(range.name, "a non-zero value"));
        }
    }
    match f.get("logit_bias") {
        None => {}
        Some(Value::Object(m)) if m.is_empty() => {}
        Some(Value::Object(_)) => return Err(unsupported("logit_bias", "a non-empty logit_bias")),
        Some(v) => return Err(wrong_type("logit_bias", "an object", v)),
    }

    let mut max_tokens = f.int("max_tokens", 1, i64::MAX)?;
    let temperature = f.number(&TEMPERATURE)?.unwrap_or(DEFAULT_TEMPERATURE);
    let top_p = f.number(&TOP_P)?.unwrap_or(1.0);
    let top_k = f.int("top_k", 0, i64::MAX)?.unwrap_or(DEFAULT_TOP_K);
    let min_p = f.number(&MIN_P)?.unwrap_or(DEFAULT_MIN_P);
    let repeat_penalty = f.number(&REPEAT_PENALTY)?.unwrap_or(1.0);
    let seed = match f.get("seed") {
        None => server.seed,
        Some(Value::Number(n)) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i as u64,
            (None, Some(u)) => u,
            _ if beyond_64_bits(n) => {
                return Err(out_of_range("seed", &format!("an integer from {} to {}", i64::MIN, u64::MAX)))
            }
            _ => return Err(wrong_type("seed", "an integer", &Value::Number(n.clone()))),
        },
        Some(v) => return Err(wrong_type("seed", "an integer", v)),
    };
    let stop = parse_stop(f.get("stop"))?;
    let timeout = match f.get("timeout") {
        None => None,
        Some(Value::Number(n)) => match n.as_f64() {
            Some(x) if x > 0.0 && x <= MAX_TIMEOUT => Some(x),
            _ => return Err(out_of_range("timeout", "a number of seconds above 0 and at most 86400")),
        },
        Some(v) => return Err(wrong_type("timeout", "a number", v)),
    };
    let deadline = server.deadline(timeout);
    let timeout = server.effective_timeout(timeout);
    let grammar = parse_output_grammar(&f, deadline)?;
    let ignore_eos = f.boolean("ignore_eos")?.unwrap_or(false);
    let draft_max = f.int("speculative.n_max", 0, 32)?.map(|n| n as usize);
    let draft_min = f.int("speculative.n_min", 0, 32)?.map(|n| n as usize);
    let stream = f.boolean("stream")?.unwrap_or(false);
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(Value::Object(m)) => {
            if !stream {
                return Err(ApiError::field(
                    "invalid_value",
                    "stream_options",
                    "'stream_options' is only allowed when 'stream' is true",
                ));
            }
            if let Some(k) = m.keys().find(|k| k.as_str() != "include_usage") {
                return Err(ApiError::field(
                    "unsupported_parameter",
                    "stream_options",
                    format!("unsupported field 'stream_options.{k}'"),
                ));
            }
            Fields(m)
                .boolean("include_usage")
                .map_err(|mut e| {
                    e.param = Some("stream_options".into());
                    e.message = e.message.replace("'include_usage'", "'stream_options.include_usage'");
                    e
                })?
                .unwrap_or(false)
        }
        Some(v) => return Err(wrong_type("stream_options", "an object", v)),
    };

    let parse_special = !chat && f.boolean("parse_special")?.unwrap_or(false);
    let mut template_kwargs = serde_json::Map::new();
    let mut reasoning = ReasoningFormat::Apart;
    let (prompt, logprobs) = if chat {
        let mtc = f.int("max_completion_tokens", 1, i64::MAX)?;
        if mtc.is_some() {
            max_tokens = mtc;
        }
        f.boolean("store")?;
        let want = f.boolean("logprobs")?.unwrap_or(false);
        let top = f.int("top_logprobs", 0, MAX_TOP_LOGPROBS)?;
        if top.is_some() && !want {
            return Err(ApiError::field("invalid_value", "top_logprobs", "'top_logprobs' needs 'logprobs': true"));
        }
        let messages = match obj.get("messages") {
            None | Some(Value::Null) => {
                return Err(ApiError::field("missing_parameter", "messages", "'messages' is required"))
            }
            Some(v) => parse_messages(v)?,
        };
        template_kwargs = match f.get("chat_template_kwargs") {
            None | Some(Value::Null) => serde_json::Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(v) => return Err(wrong_type("chat_template_kwargs", "an object", v)),
        };
        if let Some(on) = f.boolean("enable_thinking")? {
            template_kwargs.insert("enable_thinking".into(), Value::Bool(on));
        }
        reasoning = match f.string("reasoning_format")? {
            None | Some("auto" | "deepseek") => ReasoningFormat::Apart,
            Some("none") => ReasoningFormat::None,
            Some("deepseek-legacy") => ReasoningFormat::Both,
            Some(other) => {
                return Err(ApiError::field(
                    "invalid_value",
                    "reasoning_format",
                    format!(
                        "'reasoning_format' must be 'none', 'auto', 'deepseek' or 'deepseek-legacy', not {other:?}"
                    ),
                ))
            }
        };
        (Prompt::Messages(messages), want.then(|| top.unwrap_or(0) as usize))
    } else {
        if f.boolean("echo")?.unwrap_or(false) {
            return Err(unsupported("echo", "echo"));
        }
        if f.string("suffix")?.is_some_and(|s| !s.is_empty()) {
            return Err(unsupported("suffix", "suffix (insertion)"));
        }
        if f.int("best_of", 1, i64::MAX)
            .map_err(|_| unsupported("best_of", "best_of other than 1"))?
            .is_some_and(|n| n != 1)
        {
            return Err(unsupported("best_of", "best_of other than 1"));
        }
        let logprobs = f.int("logprobs", 0, MAX_TOP_LOGPROBS)?.map(|k| k as usize);
        let prompt = match obj.get("prompt") {
            None | Some(Value::Null) => {
                return Err(ApiError::field("missing_parameter", "prompt", "'prompt' is required"))
            }
            Some(v) => parse_prompt(v)?,
        };
        (prompt, logprobs)
    };
    let params = GenParams {
        max_tokens: 0,
        temperature: temperature as f32,
        top_p: top_p as f32,
        top_k: usize::try_from(top_k).unwrap_or(usize::MAX),
        min_p: min_p as f32,
        repeat_penalty: repeat_penalty as f32,
        seed,
        stop,
        logprobs,
        ignore_eos,
        timeout,
        draft_sizes: (draft_min, draft_max),
        grammar,
    };
    let (tools, tool_choice, parallel_tool_calls) = match chat {
        true => parse_tools(&f, deadline)?,
        false => (Vec::new(), ToolChoice::None, false),
    };
    if params.grammar.is_some() && matches!(tool_choice, ToolChoice::Required | ToolChoice::Function(_)) {
        return Err(ApiError::field(
            "invalid_value",
            "tool_choice",
            "a required tool call cannot also follow 'response_format' (its arguments follow the tool's schema)",
        ));
    }
    Ok(GenRequest {
        chat,
        prompt,
        max_tokens: max_tokens.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        params,
        stream,
        include_usage,
        tools,
        tool_choice,
        parallel_tool_calls,
        template_kwargs,
        reasoning,
        prompt_text: String::new(),
        dropped: (0, 0),
        parse_special,
    })
}

/// What a function's name must be (OpenAI's `^[a-zA-Z0-9_-]{1,64}$`): it is
/// written into the prompt, where anything else could pass for the template's
/// own text.
const TOOL_NAME: &str = "1 to 64 ASCII letters, digits, '_' and '-'";

fn is_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `tools`, `tool_choice` and `parallel_tool_calls`. Each tool's schema is
/// compiled here so that one the server cannot follow is refused now.
fn parse_tools(f: &Fields, deadline: Option<Instant>) -> Result<(Vec<Tool>, ToolChoice, bool), ApiError> {
    let mut tools = Vec::new();
    match f.get("tools") {
        None => {}
        Some(Value::Array(list)) => {
            for (i, t) in list.iter().enumerate() {
                let p = format!("tools[{i}]");
                let obj = t.as_object().ok_or_else(|| wrong_type(&p, "an object", t))?;
                match obj.get("type") {
                    Some(Value::String(k)) if k == "function" => {}
                    _ => {
                        return Err(ApiError::field(
                            "invalid_value",
                            &format!("{p}.type"),
                            format!("'{p}.type' must be \"function\""),
                        ))
                    }
                }
                let fp = format!("{p}.function");
                let func = match obj.get("function") {
                    Some(Value::Object(func)) => func,
                    Some(v) => return Err(wrong_type(&fp, "an object", v)),
                    None => return Err(ApiError::field("missing_parameter", &fp, format!("'{fp}' is required"))),
                };
                let name = match func.get("name") {
                    Some(Value::String(n)) if is_tool_name(n) => n.clone(),
                    _ => {
                        return Err(ApiError::field(
                            "invalid_value",
                            &format!("{fp}.name"),
                            format!("'{fp}.name' must be {TOOL_NAME}"),
                        ))
                    }
                };
                if tools.iter().any(|t: &Tool| t.name == name) {
                    return Err(ApiError::field(
                        "invalid_value",
                        &format!("{fp}.name"),
                        format!("two tools are named '{}'", name.escape_debug()),
                    ));
                }
                tools.push(Tool { name, function: func.clone() });
            }
        }
        Some(v) => return Err(wrong_type("tools", "an array", v)),
    }
    let choice = match f.get("tool_choice") {
        None if tools.is_empty() => ToolChoice::None,
        None => ToolChoice::Auto,
        Some(Value::String(c)) => match c.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::field(
                    "invalid_value",
                    "tool_choice",
                    format!(
                        "'tool_choice' must be 'none', 'auto', 'required' or a function, not '{}'",
                        other.escape_debug()
                    ),
                ))
            }
        },
        Some(Value::Object(o)) => match o.get("function").and_then(|fun| fun.get("name")).and_then(Value::as_str) {
            Some(name) => ToolChoice::Function(name.to_string()),
            None => {
                return Err(ApiError::field(
                    "invalid_value",
                    "tool_choice",
                    "'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": NAME}}",
                ))
            }
        },
        Some(v) => return Err(wrong_type("tool_choice", "a string or an object", v)),
    };
    match &choice {
        ToolChoice::Required | ToolChoice::Auto if tools.is_empty() => {
            return Err(ApiError::field("invalid_value", "tool_choice", "'tool_choice' needs 'tools'"))
        }
        ToolChoice::Function(name) if !tools.iter().any(|t| &t.name == name) => {
            return Err(ApiError::field(
                "invalid_value",
                "tool_choice",
                format!("'tool_choice' names '{}', which is not among the tools", name.escape_debug()),
            ))
        }
        _ => {}
    }
    // the schemas a call is generated under must compile (only those: with
    // `auto` the schemas are shown to the model, not followed)
    for (i, t) in tools.iter().enumerate() {
        let forced = match &choice {
            ToolChoice::Required => true,
            ToolChoice::Function(name) => &t.name == name,
            _ => false,
        };
        if let (true, Some(params)) = (forced, t.parameters()) {
            let pp = format!("tools[{i}].function.parameters");
            grammar::schema::compile_until(params, deadline).map_err(|e| grammar_error(&pp, format!("'{pp}': {e}")))?;
        }
    }
    let parallel = f.boolean("parallel_tool_calls")?.unwrap_or(true);
    Ok((tools, choice, parallel))
}

/// The grammar the output must match: OpenAI's `response_format`
/// (`json_object`, `json_schema`), or llama.cpp's `json_schema` (a schema)
/// and `grammar` (GBNF text) fields; at most one of them.
fn parse_output_grammar(f: &Fields, deadline: Option<Instant>) -> Result<Option<Arc<Grammar>>, ApiError> {
    let given: Vec<&str> =
        ["response_format", "json_schema", "grammar"].into_iter().filter(|k| f.get(k).is_some()).collect();
    if given.len() > 1 {
        return Err(ApiError::field(
            "invalid_value",
            given[1],
            format!("'{}' and '{}' cannot be given together", given[0], given[1]),
        ));
    }
    let bad = |param: &str, e: String| ApiError::field("invalid_value", param, e);
    let schema = |param: &str, v: &Value| -> Result<Option<Arc<Grammar>>, ApiError> {
        grammar::schema::compile_until(v, deadline)
            .map(|g| Some(Arc::new(g)))
            .map_err(|e| grammar_error(param, format!("'{param}': {e}")))
    };
    if let Some(v) = f.get("json_schema") {
        return schema("json_schema", v);
    }
    if let Some(v) = f.get("grammar") {
        let text = v.as_str().ok_or_else(|| wrong_type("grammar", "a string", v))?;
        return grammar::gbnf::compile_until(text, deadline)
            .map(|g| Some(Arc::new(g)))
            .map_err(|e| grammar_error("grammar", e));
    }
    let Some(v) = f.get("response_format") else { return Ok(None) };
    let m = v.as_object().ok_or_else(|| wrong_type("response_format", "an object", v))?;
    let kind = match m.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(t) => return Err(wrong_type("response_format.type", "a string", t)),
        None => {
            return Err(ApiError::field(
                "missing_parameter",
                "response_format.type",
                "'response_format.type' is required",
            ))
        }
    };
    match kind {
        "text" => Ok(None),
        // llama.cpp also takes a schema here
        "json_object" => match m.get("schema") {
            Some(v) => schema("response_format.schema", v),
            None => grammar::schema::any_object().map(|g| Some(Arc::new(g))).map_err(|e| bad("response_format", e)),
        },
        "json_schema" => {
            let js = match m.get("json_schema") {
                Some(Value::Object(js)) => js,
                Some(v) => return Err(wrong_type("response_format.json_schema", "an object", v)),
                None => {
                    return Err(ApiError::field(
                        "missing_parameter",
                        "response_format.json_schema",
                        "'response_format.json_schema' is required",
                    ))
                }
            };
            match js.get("schema") {
                Some(v) => schema("response_format.json_schema.schema", v),
                None => Err(ApiError::field(
                    "missing_parameter",
                    "response_format.json_schema.schema",
                    "'response_format.json_schema.schema' is required",
                )),
            }
        }
        other => Err(bad(
            "response_format.type",
            format!(
                "'response_format.type' must be 'text', 'json_object' or 'json_schema', not '{}'",
                other.escape_debug()
            ),
        )),
    }
}

fn parse_stop(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let list: Vec<String> = match v {
        None => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_str().map(str::to_string).ok_or_else(|| wrong_type("stop", "a string or an array of strings", x))
            })
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(wrong_type("stop", "a string or an array of strings", other)),
    };
    if list.len() > MAX_STOPS {
        return Err(out_of_range("stop", &format!("at most {MAX_STOPS} strings")));
    }
    if list.iter().any(|s| s.is_empty()) {
        return Err(out_of_range("stop", "made of non-empty strings"));
    }
    Ok(list)
}

fn parse_prompt(v: &Value) -> Result<Prompt, ApiError> {
    let many = || unsupported("prompt", "more than one prompt per request");
    match v {
        Value::String(s) => Ok(Prompt::Text(s.clone())),
        Value::Array(a) if a.len() == 1 && a[0].is_string() => {
            Ok(Prompt::Text(a[0].as_str().unwrap_or("").to_string()))
        }
        Value::Array(a) if !a.is_empty() && a.iter().all(|x| x.is_number()) => a
            .iter()
            .map(|x| {
                x.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| {
                    ApiError::field("invalid_value", "prompt", "token ids in 'prompt' must be non-negative integers")
                })
            })
            .collect::<Result<Vec<u32>, _>>()
            .map(Prompt::Ids),
        Value::Array(a) if a.len() == 1 && a[0].is_array() => parse_prompt(&a[0]),
        Value::Array(a) if a.len() > 1 && a.iter().all(|x| x.is_string() || x.is_array()) => Err(many()),
        Value::Array(_) => Err(wrong_type(
            "prompt",
            "a string, an array of one string or an array of token ids",
            &Value::Array(Vec::new()),
        )),
        other => Err(wrong_type("prompt", "a string or an array of token ids", other)),
    }
}

/// An assistant message's `tool_calls`.
fn parse_tool_calls(v: &Value, p: &str) -> Result<Vec<ToolCall>, ApiError> {
    let list = v.as_array().ok_or_else(|| wrong_type(p, "an array", v))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, c) in list.iter().enumerate() {
        let cp = format!("{p}[{i}]");
        let string = |key: &str, v: Option<&Value>| -> Result<String, ApiError> {
            match v {
                Some(Value::String(s)) => Ok(s.clone()),
                Some(other) => Err(wrong_type(&format!("{cp}.{key}"), "a string", other)),
                None => Err(ApiError::field(
                    "missing_parameter",
                    &format!("{cp}.{key}"),
                    format!("'{cp}.{key}' is required"),
                )),
            }
        };
        let func = c.get("function");
        let arguments = match func.and_then(|f| f.get("arguments")) {
            // some clients send the object itself
            Some(v @ Value::Object(_)) => v.to_string(),
            other => string("function.arguments", other)?,
        };
        let name = string("function.name", func.and_then(|f| f.get("name")))?;
        if !is_tool_name(&name) {
            let np = format!("{cp}.function.name");
            return Err(ApiError::field("invalid_value", &np, format!("'{np}' must be {TOOL_NAME}")));
        }
        out.push(ToolCall { id: string("id", c.get("id")).unwrap_or_default(), name, arguments });
    }
    Ok(out)
}

fn parse_messages(v: &Value) -> Result<Vec<Message>, ApiError> {
    let arr = match v {
        Value::Array(a) => a,
        other => return Err(wrong_type("messages", "an array", other)),
    };
    if arr.is_empty() {
        return Err(ApiError::field("invalid_value", "messages", "'messages' must hold at least one message"));
    }
    let mut out = Vec::with_capacity(arr.len());
    for (i, m) in arr.iter().enumerate() {
        let p = format!("messages[{i}]");
        let obj = match m {
            Value::Object(o) => o,
            other => return Err(wrong_type(&p, "an object", other)),
        };
        let fields = ["role", "content", "name", "tool_calls", "tool_call_id", "refusal"];
        if let Some(k) = obj.keys().find(|k| !fields.contains(&k.as_str())) {
            return Err(ApiError::field("unsupported_parameter", &p, format!("unsupported field '{p}.{k}'")));
        }
        let role = match obj.get("role") {
            Some(Value::String(r)) => match r.as_str() {
                "system" | "developer" => Role::System,
                "user" => Role::User,
                "assistant" => Role::Assistant,
                "tool" => Role::Tool,
                other => {
                    return Err(ApiError::field(
                        "invalid_value",
                        &format!("{p}.role"),
                        format!(
                            "'{p}.role' is '{other}'; this server takes system, developer, user, assistant and tool"
                        ),
                    ))
                }
            },
            None => {
                return Err(ApiError::field(
                    "missing_parameter",
                    &format!("{p}.role"),
                    format!("'{p}.role' is required"),
                ))
            }
            Some(other) => return Err(wrong_type(&format!("{p}.role"), "a string", other)),
        };
        let cp = format!("{p}.content");
        let content = match obj.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None if role == Role::Assistant => String::new(),
            None => return Err(ApiError::field("missing_parameter", &cp, format!("'{cp}' is required"))),
            Some(Value::Array(parts)) => {
                let mut s = String::new();
                for (j, part) in parts.iter().enumerate() {
                    let pp = format!("{cp}[{j}]");
                    match (part.get("type").and_then(Value::as_str), part.get("text")) {
                        (Some("text"), Some(Value::String(t))) => s.push_str(t),
                        (Some("text"), _) => {
                            return Err(wrong_type(
                                &format!("{pp}.text"),
                                "a string",
                                part.get("text").unwrap_or(&Value::Null),
                            ))
                        }
                        (Some(t), _) => return Err(unsupported(&pp, &format!("content of type '{t}'"))),
                        (None, _) => {
                            return Err(ApiError::field(
                                "invalid_value",
                                &pp,
                                format!("'{pp}' must be an object with \"type\": \"text\""),
                            ))
                        }
                    }
                }
                s
            }
            Some(other) => return Err(wrong_type(&cp, "a string or an array of text parts", other)),
        };
        if let Some(n) = obj.get("name").filter(|n| !n.is_null() && !n.is_string()) {
            return Err(wrong_type(&format!("{p}.name"), "a string", n));
        }
        let mut message = Message::new(role, content);
        match (role, obj.get("tool_calls").filter(|v| !v.is_null())) {
            (Role::Assistant, Some(calls)) => message.tool_calls = parse_tool_calls(calls, &format!("{p}.tool_calls"))?,
            (_, Some(_)) => {
                return Err(ApiError::field(
                    "invalid_value",
                    &format!("{p}.tool_calls"),
                    format!("'{p}.tool_calls' is for assistant messages"),
                ))
            }
            _ => {}
        }
        if role == Role::Tool {
            let ip = format!("{p}.tool_call_id");
            message.tool_call_id = match obj.get("tool_call_id") {
                Some(Value::String(id)) => id.clone(),
                Some(v) => return Err(wrong_type(&ip, "a string", v)),
                None => return Err(ApiError::field("missing_parameter", &ip, format!("'{ip}' is required"))),
            };
            // a result answers a call made earlier in the conversation (as OpenAI requires)
            let answers_a_call = out.iter().flat_map(|m: &Message| &m.tool_calls).any(|c| c.id == message.tool_call_id);
            if !answers_a_call {
                return Err(ApiError::field(
                    "invalid_value",
                    &ip,
                    format!(
                        "'{ip}' is '{}', the id of no tool call of an earlier assistant message",
                        message.tool_call_id.escape_debug()
                    ),
                ));
            }
        }
        out.push(message);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::server::fields::parse_object;

    fn parse(body: &str, chat: bool) -> Result<GenRequest, ApiError> {
        let server = ServerDefaults { seed: 7, timeout: None, received: Instant::now() };
        parse_request(&parse_object(body.as_bytes())?, chat, &server)
    }

    #[test]
    fn good_requests() {
        let r =
            parse(r#"{"model":"m","prompt":"Hi","max_tokens":5,"stop":"\n","seed":3,"temperature":0}"#, false).unwrap();
        assert!(matches!(r.prompt, Prompt::Text(ref s) if s == "Hi"));
        assert_eq!((r.max_tokens, r.params.seed, r.params.stop.clone()), (Some(5), 3, vec!["\n".to_string()]));
        assert_eq!(r.token_limit(3), 3);
        let r = parse(r#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"stream":true,"stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":2}"#, true).unwrap();
        assert!(r.stream && r.include_usage && r.params.seed == 7 && r.params.logprobs == Some(2));
        assert!(matches!(r.prompt, Prompt::Messages(ref m) if m[0].content == "ab"));
        assert_eq!(r.token_limit(100), 100);
        let r = parse(r#"{"prompt":[1,2,3],"n":1,"presence_penalty":0,"logit_bias":{}}"#, false).unwrap();
        assert!(matches!(r.prompt, Prompt::Ids(ref v) if v == &[1, 2, 3]));
        assert_eq!(r.token_limit(100), 16);
    }

    #[test]
    fn bad_requests_name_the_problem() {
        let code = |b: &str, chat| parse(b, chat).unwrap_err().code;
        assert_eq!(code("{", false), "invalid_json");
        assert_eq!(code("[1]", false), "invalid_json");
        assert_eq!(code("", false), "invalid_json");
        assert_eq!(code(r#"{"prompt":"x","max_tokens":"5"}"#, false), "invalid_type");
        assert_eq!(code(r#"{"prompt":"x","max_tokens":0}"#, false), "invalid_value");
        assert_eq!(code(r#"{"prompt":"x","max_tokens":2.5}"#, false), "invalid_type");
        assert_eq!(code(r#"{"prompt":"x","temperature":3}"#, false), "invalid_value");
        assert_eq!(code(r#"{"prompt":"x","n":2}"#, false), "unsupported_value");
        assert_eq!(code(r#"{"prompt":"x","tools":[]}"#, false), "unsupported_parameter");
        assert_eq!(code(r#"{"prompt":["a","b"]}"#, false), "unsupported_value");
        assert_eq!(code(r#"{"prompt":5}"#, false), "invalid_type");
        assert_eq!(code(r#"{}"#, false), "missing_parameter");
        assert_eq!(code(r#"{"prompt":"x","stop":[1]}"#, false), "invalid_type");
        assert_eq!(code(r#"{"prompt":"x","stop":""}"#, false), "invalid_value");
        assert_eq!(code(r#"{"prompt":"x","stream_options":{"include_usage":true}}"#, false), "invalid_value");
        assert_eq!(code(r#"{"messages":"hi"}"#, true), "invalid_type");
        assert_eq!(code(r#"{"messages":[]}"#, true), "invalid_value");
        assert_eq!(code(r#"{"messages":[{"role":"function","content":"x"}]}"#, true), "invalid_value");
        assert_eq!(code(r#"{"messages":[{"role":"user"}]}"#, true), "missing_parameter");
        assert_eq!(
            code(r#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#, true),
            "unsupported_value"
        );
        assert_eq!(code(r#"{"messages":[{"role":"user","content":"x"}],"top_logprobs":2}"#, true), "invalid_value");
        // Sampling settings: the CLI's ranges and messages (crate::sampler).
        let e = parse(r#"{"prompt":"x","top_p":2}"#, false).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), ("invalid_value", "'top_p' must be a number from 0 to 1"));
        assert_eq!(code(r#"{"prompt":"x","temperature":-1}"#, false), "invalid_value");
        assert_eq!(code(r#"{"prompt":"x","min_p":5}"#, false), "invalid_value");
        assert_eq!(code(r#"{"prompt":"x","repeat_penalty":0}"#, false), "invalid_value");
        // numbers keep their literal text: one beyond f64 is out of range, not a JSON error
        assert_eq!(code(r#"{"prompt":"x","temperature":1e999}"#, false), "invalid_value");
        assert_eq!(parse(r#"{"prompt":"x","repeat_penalty":1.3}"#, false).unwrap().params.repeat_penalty, 1.3);
        // llama.cpp's draft sizes, flat dotted names
        let r = parse(r#"{"prompt":"x","speculative.n_max":0,"speculative.n_min":2}"#, false).unwrap();
        assert_eq!(r.params.draft_sizes, (Some(2), Some(0)));
        assert_eq!(code(r#"{"prompt":"x","speculative.n_max":33}"#, false), "invalid_value");
        assert_eq!(code(r#"{"prompt":"x","speculative":{"n_max":3}}"#, false), "unsupported_parameter");
        // Integers beyond 64 bits are out of range; fractions are not integers.
        for big in ["18446744073709551616", "-9223372036854775809", "1e30"] {
            let e = parse(&format!(r#"{{"prompt":"x","max_tokens":{big}}}"#), false).unwrap_err();
            assert_eq!(e.code, "invalid_value", "{big}: {}", e.message);
            assert!(e.message.contains("an integer from 1 to"), "{}", e.message);
        }
        assert_eq!(code(r#"{"prompt":"x","seed":18446744073709551616}"#, false), "invalid_value");
        assert!(parse(r#"{"prompt":"x","seed":18446744073709551615}"#, false).is_ok());
        assert_eq!(code(r#"{"prompt":"x","max_tokens":1e30.5}"#, false), "invalid_json");
        assert_eq!(code(r#"{"prompt":"x","max_tokens":3.5}"#, false), "invalid_type");
        let e = parse(r#"{"prompt":"x","max_tokens":"5"}"#, false).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert!(e.message.contains("max_tokens") && e.message.contains("string"), "{}", e.message);
        assert_eq!(e.to_json()["error"]["type"], "invalid_request_error");
    }
}
