//! One generation request, from body to answer: validate, format and
//! tokenize, check the context, queue the job, then relay the worker's
//! events as one JSON answer or as server-sent events, watching the socket
//! so that a client who hangs up cancels its job.

use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::error::ApiError;
use super::fields::parse_object;
use super::http::{self, Request, Response, StreamWriter};
use super::job::{Event, Job, TokenLogprob};
use super::request::{grammar_error, parse_request, GenRequest, Prompt, ReasoningFormat, ServerDefaults, ToolChoice};
use super::response::{usage, Reply};
use super::{anthropic, responses, unix_now, Server};
use crate::chat::reasoning::Reasoning;
use crate::chat::{drop_oldest_turn, CallSyntax, ChatFormat, Message, PromptText, Template, Tool, ToolCall};
use crate::generate::Finish;
use crate::model::{check_prompt, TokenError};

/// How often a waiting connection checks whether its client is still there.
const POLL: Duration = Duration::from_millis(20);

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A fresh number per request (ids and default seeds).
fn unique() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    // splitmix64 of both, so consecutive ids look unrelated
    let mut z = nanos ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The server's template and the prompt text it makes of a chat request's
/// messages, with the request's tools shown unless `tool_choice` is "none".
fn chat_prompt(srv: &Server, greq: &GenRequest, messages: &[Message]) -> Result<(Template, PromptText), ApiError> {
    let template = srv.template.ok_or_else(|| {
        ApiError::new(400, "no_chat_template", "this server has no chat template: start it with --chat KIND")
    })?;
    let format = ChatFormat {
        kind: template,
        jinja: srv.jinja.clone(),
        strip_bos: srv.tokenizer.adds_bos(),
        kwargs: srv.template_kwargs.clone(),
    };
    let text = format
        .format(srv.system.as_deref(), messages, greq.shown_tools(), &greq.template_kwargs)
        .map_err(|e| ApiError::field("invalid_value", "messages", e))?;
    Ok((template, text))
}

/// llama.cpp's `POST /apply-template`: the body of a chat request ->
/// `{"prompt": TEXT}`, the text its messages (and tools) make under the
/// server's template, ending where the assistant speaks, as generation
/// would tokenize it (the tokenizer's BOS aside).
pub(crate) fn apply_template(srv: &Server, req: &Request) -> Result<Value, ApiError> {
    let obj = parse_object(&req.body)?;
    let server = ServerDefaults { seed: 0, timeout: srv.request_timeout, received: Instant::now() };
    let greq = parse_request(&obj, true, &server)?;
    let Prompt::Messages(m) = &greq.prompt else {
        return Err(ApiError::field("missing_parameter", "messages", "'messages' is required"));
    };
    let (_, text) = chat_prompt(srv, &greq, m)?;
    Ok(serde_json::json!({ "prompt": text.as_str() }))
}

/// The API a generation request came in: OpenAI's chat completions or
/// completions, Anthropic's Messages, or OpenAI's Responses (the last two
/// translated into a chat request, and answered in their own shapes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ApiKind {
    Chat,
    Completions,
    Anthropic,
    Responses,
}

pub(crate) fn generate(srv: &Server, stream: &mut TcpStream, req: &Request, kind: ApiKind) {
    let received = Instant::now();
    let request = parse_object(&req.body).and_then(|obj| {
        let chat_obj = match kind {
            ApiKind::Chat | ApiKind::Completions => return Ok((obj.clone(), obj)),
            ApiKind::Anthropic => anthropic::to_chat_request(&obj)?,
            ApiKind::Responses => responses::to_chat_request(&obj)?,
        };
        Ok((obj, chat_obj))
    });
    match request
        .and_then(|(obj, chat_obj)| Ok((obj, prepare(srv, &chat_obj, kind != ApiKind::Completions, received)?)))
    {
        Ok((obj, (greq, ids, calls))) => run(srv, stream, req, &obj, kind, greq, ids, calls, received),
        Err(e) => srv.send(stream, &error_in(kind, &e)),
    }
}

/// An error answer in the API's own shape.
fn error_in(kind: ApiKind, e: &ApiError) -> Response {
    match kind {
        ApiKind::Anthropic => {
            let mut resp = super::error_response(e);
            resp.body = anthropic::error_json(e).to_string().into_bytes();
            resp
        }
        _ => super::error_response(e),
    }
}

/// Validates the body and turns it into prompt ids with the output limit
/// set; with tools, also the syntax the model writes calls in (its answer
/// is read back as calls where it holds them).
fn prepare(
    srv: &Server,
    obj: &serde_json::Map<String, Value>,
    chat: bool,
    received: Instant,
) -> Result<(GenRequest, Vec<u32>, Option<CallSyntax>), ApiError> {
    let server = ServerDefaults { seed: unique(), timeout: srv.request_timeout, received };
    let mut greq = parse_request(obj, chat, &server)?;
    let deadline = greq.params.timeout.map(|s| received + Duration::from_secs_f64(s));
    let mut calls = None;
    let ids = match &greq.prompt {
        Prompt::Messages(m) => {
            let (template, mut text) = chat_prompt(srv, &greq, m)?;
            if srv.context_shift {
                // a conversation that leaves no room for its answer loses its oldest turns
                let room = greq.max_tokens.unwrap_or(srv.ctx / 4).clamp(1, (srv.ctx / 4).max(1));
                let first = text.encode(&srv.tokenizer, true).len();
                let mut messages = m.clone();
                let mut len = first;
                while len + room > srv.ctx && drop_oldest_turn(&mut messages) {
                    text = chat_prompt(srv, &greq, &messages)?.1;
                    len = text.encode(&srv.tokenizer, true).len();
                    greq.dropped.0 += 1;
                }
                greq.dropped.1 = first - len;
            }
            let syntax = template.call_syntax();
            let forced: Vec<Tool> = match &greq.tool_choice {
                ToolChoice::None | ToolChoice::Auto => Vec::new(),
                ToolChoice::Required => greq.tools.clone(),
                ToolChoice::Function(name) => greq.tools.iter().filter(|t| &t.name == name).cloned().collect(),
            };
            if !forced.is_empty() {
                // the answer is the call: written under its grammar, after the syntax's opening
                text.push_template(syntax.forced_prefix());
                // a named function is called once (OpenAI's meaning)
                let parallel = greq.parallel_tool_calls && greq.tool_choice == ToolChoice::Required;
                let g = syntax.grammar(&forced, parallel, deadline).map_err(|e| grammar_error("tools", e))?;
                greq.params.grammar = Some(Arc::new(g));
            }
            if !greq.shown_tools().is_empty() {
                calls = Some(syntax);
            }
            greq.prompt_text = text.as_str().to_string();
            // only the template's text may hold control tokens: the messages' are plain text
            text.encode(&srv.tokenizer, true)
        }
        // a raw prompt's special tokens are text unless the request says otherwise
        Prompt::Text(t) if greq.parse_special => srv.tokenizer.encode(t, true),
        Prompt::Text(t) => srv.tokenizer.encode_plain(t, true),
        Prompt::Ids(ids) => ids.clone(),
    };
    if let Err(e) = check_prompt(&ids, srv.vocab_size, srv.ctx) {
        let param = if chat { "messages" } else { "prompt" };
        let code =
            if matches!(e, TokenError::BeyondContext { .. }) { "context_length_exceeded" } else { "invalid_value" };
        return Err(ApiError::field(code, param, format!("'{param}': {e}")));
    }
    // g tokens need the prompt and g - 1 of them in the cache.
    greq.params.max_tokens = greq.token_limit(srv.ctx - ids.len() + 1);
    Ok((greq, ids, calls))
}

/// An id for each call: Mistral's nine letters and digits, else OpenAI's
/// `call_` and 24.
fn call_ids(syntax: CallSyntax, n: usize) -> Vec<String> {
    const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let len = if syntax == CallSyntax::Mistral { 9 } else { 24 };
    (0..n)
        .map(|_| {
            // eight characters per 64-bit number (62^8 < 2^64)
            let mut bits = [unique(), unique(), unique()];
            let id: String = (0..len)
                .map(|i| {
                    let word = &mut bits[i / 8];
                    let c = ALNUM[(*word % 62) as usize] as char;
                    *word /= 62;
                    c
                })
                .collect();
            if syntax == CallSyntax::Mistral {
                id
            } else {
                format!("call_{id}")
            }
        })
        .collect()
}

fn sse(v: &Value) -> Vec<u8> {
    format!("data: {v}\n\n").into_bytes()
}

/// The client hung up: its job stops before the next token.
struct Gone;

/// The shapes of one answer in the API it came in: OpenAI's (`Reply`), or
/// Anthropic's and the Responses API's, whose streams keep state (which
/// block or item is open).
enum Api {
    OpenAi,
    Anthropic(anthropic::Message),
    Responses(responses::Response),
}

/// Where one answer goes: a whole JSON body at the end, or, for a stream,
/// server-sent events from the moment the request gets a slot (until then
/// it can still be answered with a plain error status, and a load balancer
/// can still retry it elsewhere).
struct Answer<'a> {
    srv: &'a Server,
    socket: &'a mut TcpStream,
    reply: Reply,
    api: Api,
    /// The prompt's tokens (Anthropic's `message_start` tells them).
    prompt_tokens: usize,
    /// Headers of the answer besides the server's own (a context shift's).
    headers: Vec<(String, String)>,
    /// Some once a stream's head has gone out.
    events: Option<StreamWriter>,
}

impl Answer<'_> {
    /// The request has a slot: a stream's head and its opening events go out.
    fn start(&mut self, stream: bool, http10: bool) -> Result<(), Gone> {
        if !stream {
            return Ok(());
        }
        self.srv.queue.metrics.answered(200);
        let mut headers = self.srv.common_headers();
        headers.extend(self.headers.iter().cloned());
        let w = StreamWriter::start(self.socket, "text/event-stream", &headers, http10).map_err(|_| Gone)?;
        self.events = Some(w);
        let opening = match &mut self.api {
            Api::OpenAi if self.reply.chat => vec![sse(&self.reply.opening_chunk())],
            Api::OpenAi => Vec::new(),
            Api::Anthropic(m) => m.start(self.prompt_tokens),
            Api::Responses(r) => r.start(),
        };
        self.send_all(&opening)
    }

    /// Events to the stream; Gone if the client has hung up.
    fn send_all(&mut self, events: &[Vec<u8>]) -> Result<(), Gone> {
        let w = self.events.as_mut().expect("events go to a stream");
        for e in events {
            w.send(e).map_err(|_| Gone)?;
        }
        if http::peer_closed(w.stream()) {
            return Err(Gone);
        }
        Ok(())
    }

    fn streaming(&self) -> bool {
        self.events.is_some()
    }

    /// Whether the client has hung up.
    fn gone(&self) -> bool {
        http::peer_closed(self.events.as_ref().map_or(&*self.socket, |w| w.stream()))
    }

    /// One piece of a stream's text.
    fn text(&mut self, text: &str, logprobs: Option<Value>) -> Result<(), Gone> {
        let events = match &mut self.api {
            Api::OpenAi => vec![sse(&self.reply.text_chunk(text, logprobs))],
            Api::Anthropic(m) => m.text(text),
            Api::Responses(r) => r.text(text),
        };
        self.send_all(&events)
    }

    /// One piece of a stream's reasoning.
    fn reasoning(&mut self, text: &str) -> Result<(), Gone> {
        let events = match &mut self.api {
            Api::OpenAi => vec![sse(&self.reply.reasoning_chunk(text))],
            Api::Anthropic(m) => m.reasoning(text),
            Api::Responses(r) => r.reasoning(text),
        };
        self.send_all(&events)
    }

    /// The end of a text answer: a stream's last chunks, or the whole answer
    /// (`text`, `reasoning` and `logprobs` are the whole answer's; a stream sent them already).
    fn finish(self, text: &str, reasoning: &str, finish: Finish, usage: Value, logprobs: Option<Value>) {
        let Answer { srv, socket, reply, api, events, headers, .. } = self;
        match (events, api) {
            (Some(mut w), Api::OpenAi) => {
                let _ = w.send(&sse(&reply.finish_chunk(finish)));
                end_stream(w, &reply, usage);
            }
            (Some(w), Api::Anthropic(mut m)) => send_and_end(w, &m.finish(finish, &usage)),
            (Some(w), Api::Responses(mut r)) => send_and_end(w, &r.finish(finish, &usage)),
            (None, api) => {
                let body = match api {
                    Api::OpenAi => reply.answer(text, reasoning, finish, usage, logprobs),
                    Api::Anthropic(m) => m.answer(text, reasoning, finish, &usage),
                    Api::Responses(mut r) => r.answer(text, reasoning, finish, &usage),
                };
                let mut resp = Response::json(200, &body);
                resp.headers.extend(headers);
                srv.send(socket, &resp)
            }
        }
    }

    /// The end of a chat answer that called tools: the text before the calls, and the calls.
    fn finish_calls(self, content: &str, calls: &[ToolCall], usage: Value) {
        let Answer { srv, socket, reply, api, events, headers, .. } = self;
        match (events, api) {
            (Some(mut w), Api::OpenAi) => {
                if !content.is_empty() {
                    let _ = w.send(&sse(&reply.text_chunk(content, None)));
                }
                for c in reply.calls_chunks(calls) {
                    let _ = w.send(&sse(&c));
                }
                end_stream(w, &reply, usage);
            }
            (Some(w), Api::Anthropic(mut m)) => send_and_end(w, &m.finish_calls(content, calls, &usage)),
            (Some(w), Api::Responses(mut r)) => send_and_end(w, &r.finish_calls(content, calls, &usage)),
            (None, api) => {
                let body = match api {
                    Api::OpenAi => reply.answer_calls(content, calls, usage),
                    Api::Anthropic(m) => m.answer_calls(content, calls, &usage),
                    Api::Responses(mut r) => r.answer_calls(content, calls, &usage),
                };
                let mut resp = Response::json(200, &body);
                resp.headers.extend(headers);
                srv.send(socket, &resp)
            }
        }
    }

    /// An error: its status while nothing was sent, else an error event
    /// (and, after the worker's own error, OpenAI's end marker).
    fn fail(self, e: ApiError, done_marker: bool) {
        let Answer { srv, socket, api, events, .. } = self;
        match (events, api) {
            (Some(mut w), Api::OpenAi) => {
                let _ = w.send(&sse(&e.to_json()));
                if done_marker {
                    let _ = w.send(b"data: [DONE]\n\n");
                }
                let _ = w.end();
            }
            (Some(w), Api::Anthropic(_)) => send_and_end(w, &[anthropic::Message::error(&e)]),
            (Some(w), Api::Responses(mut r)) => {
                let event = r.error(&e);
                send_and_end(w, &[event])
            }
            (None, Api::Anthropic(_)) => srv.send(socket, &error_in(ApiKind::Anthropic, &e)),
            (None, _) => srv.send_error(socket, &e),
        }
    }
}

/// The last events of a stream, and its end.
fn send_and_end(mut w: StreamWriter, events: &[Vec<u8>]) {
    for e in events {
        let _ = w.send(e);
    }
    let _ = w.end();
}

/// The end of a stream that answered: the usage chunk when asked for, then `[DONE]`.
fn end_stream(mut w: StreamWriter, reply: &Reply, usage: Value) {
    if reply.include_usage {
        let _ = w.send(&sse(&reply.usage_chunk(usage)));
    }
    let _ = w.send(b"data: [DONE]\n\n");
    let _ = w.end();
}

/// Queues the job, then relays the worker's events to the answer until the
/// job ends, the client hangs up or the deadline passes in the queue.
#[allow(clippy::too_many_arguments)]
fn run(
    srv: &Server,
    socket: &mut TcpStream,
    req: &Request,
    request: &serde_json::Map<String, Value>,
    kind: ApiKind,
    greq: GenRequest,
    ids: Vec<u32>,
    calls: Option<CallSyntax>,
    received: Instant,
) {
    let chat = greq.chat;
    let prefix = match kind {
        ApiKind::Chat => "chatcmpl-",
        ApiKind::Completions => "cmpl-",
        ApiKind::Anthropic => "msg_",
        ApiKind::Responses => "resp_",
    };
    let reply = Reply {
        id: format!("{prefix}{:016x}", unique()),
        created: unix_now(),
        model: srv.model_id.clone(),
        fingerprint: srv.fingerprint.clone(),
        chat,
        include_usage: greq.include_usage,
    };
    let prompt_tokens = ids.len();
    let (tx, rx) = channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let queued = Arc::new(AtomicBool::new(true));
    let deadline = greq.params.timeout.map(|s| received + Duration::from_secs_f64(s));
    let job = Job {
        id: reply.id.clone(),
        prompt_text: srv.log_prompts.then(|| String::from_utf8_lossy(&srv.tokenizer.decode(&ids)).into_owned()),
        prompt: ids,
        params: greq.params.clone(),
        events: tx,
        cancel: cancel.clone(),
        queued: queued.clone(),
        received,
        embed: None,
    };
    if !srv.queue.submit(job) {
        let m = &srv.queue.metrics;
        let msg = format!(
            "the server is busy: all {} slots are generating and {} requests are waiting (--max-queue); retry later",
            m.slots,
            m.waiting.load(Ordering::SeqCst)
        );
        return srv.send_error(socket, &ApiError::new(503, "queue_full", msg));
    }
    // Set when the client went away: the worker stops before its next token.
    let hang_up = || cancel.store(true, Ordering::SeqCst);

    let api = match kind {
        ApiKind::Chat | ApiKind::Completions => Api::OpenAi,
        ApiKind::Anthropic => Api::Anthropic(anthropic::Message::new(reply.id.clone(), reply.model.clone())),
        ApiKind::Responses => {
            Api::Responses(responses::Response::new(reply.id.clone(), reply.model.clone(), reply.created, request))
        }
    };
    let (dropped_messages, dropped_tokens) = greq.dropped;
    let headers = match dropped_messages {
        0 => Vec::new(),
        _ => vec![("X-Context-Dropped-Tokens".to_string(), dropped_tokens.to_string())],
    };
    let mut answer = Answer { srv, socket, reply, api, prompt_tokens, headers, events: None };
    let mut started = false;
    let want_logprobs = greq.params.logprobs.is_some();
    // The text not streamed: all of a whole answer, or with tools all of
    // a stream's (the answer may be calls: it is read whole at the end).
    let mut text = String::new();
    let mut logprobs: Vec<TokenLogprob> = Vec::new();
    // how much of `text` a stream with tools has sent (the text before any call)
    let mut sent = 0;
    // a chat answer's reasoning (harmony's analysis channel, a <think> block) apart from its content
    let harmony = srv.template == Some(Template::Harmony);
    let split =
        chat && matches!(greq.prompt, Prompt::Messages(_)) && (harmony || greq.reasoning != ReasoningFormat::None);
    let mut channels = split.then(|| Reasoning::for_prompt(srv.template, &greq.prompt_text));
    // deepseek-legacy: the block stays in the content too
    let both = greq.reasoning == ReasoningFormat::Both && !harmony;
    let mut reasoning = String::new();
    loop {
        let ev = match rx.recv_timeout(POLL) {
            Ok(ev) => ev,
            Err(RecvTimeoutError::Timeout) => {
                if answer.gone() {
                    srv.queue.withdraw(&queued);
                    return hang_up();
                }
                if !started && deadline.is_some_and(|d| Instant::now() >= d) {
                    // Its deadline passed while it waited for a slot: it leaves the queue
                    // (the worker will skip it). Nothing was sent yet.
                    srv.queue.withdraw(&queued);
                    hang_up();
                    let msg = "the request's deadline passed before a slot was free; retry later";
                    return answer.fail(ApiError::new(503, "timeout", msg), false);
                }
                continue;
            }
            // The worker dropped the job without a last word (cancelled, or a bug).
            Err(RecvTimeoutError::Disconnected) => {
                let e = ApiError::new(500, "server_error", "the generation ended unexpectedly");
                return answer.fail(e, false);
            }
        };
        match ev {
            Event::Started => {
                started = true;
                if answer.start(greq.stream, req.http10).is_err() {
                    return hang_up();
                }
            }
            Event::Delta { text: delta, logprobs: lp } => {
                let (think, delta) = match &mut channels {
                    Some(c) => {
                        let split = c.push(&delta);
                        (split.reasoning, if both { delta } else { split.content })
                    }
                    None => (String::new(), delta),
                };
                if answer.streaming() && calls.is_none() {
                    if !think.is_empty() && answer.reasoning(&think).is_err() {
                        return hang_up();
                    }
                    if delta.is_empty() && lp.is_none() {
                        continue;
                    }
                    let lp_json = lp.as_ref().map(|t| answer.reply.logprobs(std::slice::from_ref(t)));
                    if answer.text(&delta, lp_json).is_err() {
                        return hang_up();
                    }
                } else if let (true, Some(syntax), false) = (answer.streaming(), calls, want_logprobs) {
                    // with tools: the reasoning, and the text before any call, as they come
                    if !think.is_empty() && answer.reasoning(&think).is_err() {
                        return hang_up();
                    }
                    text.push_str(&delta);
                    let safe = syntax.streamable(&text);
                    if safe > sent {
                        if answer.text(&text[sent..safe], None).is_err() {
                            return hang_up();
                        }
                        sent = safe;
                    } else if answer.gone() {
                        return hang_up();
                    }
                } else {
                    reasoning.push_str(&think);
                    text.push_str(&delta);
                    logprobs.extend(lp);
                    if answer.gone() {
                        return hang_up();
                    }
                }
            }
            Event::Done { finish, prompt_tokens, completion_tokens, cached_tokens } => {
                debug_assert!(finish != Finish::Cancelled);
                let mut usage = usage(prompt_tokens, completion_tokens, cached_tokens);
                if dropped_messages > 0 {
                    usage["context_shift"] =
                        serde_json::json!({"dropped_messages": dropped_messages, "dropped_tokens": dropped_tokens});
                }
                if let Some(mut held) = channels.as_mut().map(Reasoning::finish) {
                    if both {
                        held.content.clear();
                    }
                    if answer.streaming() {
                        if calls.is_some() {
                            // read with the rest for calls below
                            text.push_str(&std::mem::take(&mut held.content));
                        }
                        let sent = (held.reasoning.is_empty() || answer.reasoning(&held.reasoning).is_ok())
                            && (held.content.is_empty() || answer.text(&held.content, None).is_ok());
                        if !sent {
                            return hang_up();
                        }
                    } else {
                        reasoning.push_str(&held.reasoning);
                        text.push_str(&held.content);
                    }
                }
                if let Some(syntax) = calls {
                    if let Some((content, found)) = syntax.parse(&text, &greq.tools) {
                        let ids = call_ids(syntax, found.len());
                        let found: Vec<ToolCall> = found
                            .into_iter()
                            .zip(ids)
                            .map(|((name, arguments), id)| ToolCall { id, name, arguments })
                            .collect();
                        // a stream sent the content's start already
                        return answer.finish_calls(content.get(sent..).unwrap_or(""), &found, usage);
                    }
                    // no calls after all: a stream gets the held text as one piece
                    if answer.streaming() && text.len() > sent {
                        let lp_json = want_logprobs.then(|| answer.reply.logprobs(&logprobs));
                        let _ = answer.text(&text[sent..], lp_json);
                    }
                }
                let lp = want_logprobs.then(|| answer.reply.logprobs(&logprobs));
                return answer.finish(&text, &reasoning, finish, usage, lp);
            }
            Event::Error(fault) => return answer.fail(ApiError::from_fault(&fault), true),
            // only embedding jobs send one
            Event::Embedding(_) => {}
        }
    }
}
