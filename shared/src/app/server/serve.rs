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

use super::api::{self, ApiError, GenRequest, Meta, Prompt, ToolChoice};
use super::engine::{Event, Job, TokenLogprob};
use super::http::{self, Request, Response, StreamWriter};
use super::{unix_now, Server};
use crate::chat::{CallSyntax, Tool, ToolCall};
use crate::generate::Finish;

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

pub(crate) fn generate(srv: &Server, stream: &mut TcpStream, req: &Request, chat: bool) {
    let received = Instant::now();
    match prepare(srv, req, chat, received) {
        Ok((greq, ids, calls)) => run(srv, stream, req, greq, ids, calls, received),
        Err(e) => srv.send_error(stream, &e),
    }
}

/// Validates the body and turns it into prompt ids with the output limit
/// set; with tools, also the syntax the model writes calls in (its answer
/// is read back as calls where it holds them).
fn prepare(
    srv: &Server,
    req: &Request,
    chat: bool,
    received: Instant,
) -> Result<(GenRequest, Vec<u32>, Option<CallSyntax>), ApiError> {
    let obj = api::parse_object(&req.body)?;
    let server = api::ServerDefaults { seed: unique(), timeout: srv.request_timeout, received };
    let mut greq = api::parse_request(&obj, chat, &server)?;
    let deadline = greq.params.timeout.map(|s| received + Duration::from_secs_f64(s));
    let mut calls = None;
    let ids = match &greq.prompt {
        Prompt::Messages(m) => {
            let template = srv.template.ok_or_else(|| {
                ApiError::new(400, "no_chat_template", "this server has no chat template: start it with --chat KIND")
            })?;
            let shown: &[Tool] = if greq.tool_choice == ToolChoice::None { &[] } else { &greq.tools };
            let mut text = template
                .format_with_tools(srv.system.as_deref(), m, shown)
                .map_err(|e| ApiError::field("invalid_value", "messages", e))?;
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
                let g = syntax.grammar(&forced, parallel, deadline).map_err(|e| api::grammar_error("tools", e))?;
                greq.params.grammar = Some(Arc::new(g));
            }
            if !shown.is_empty() {
                calls = Some(syntax);
            }
            // only the template's text may hold control tokens: the messages' are plain text
            text.encode(&srv.tokenizer, true)
        }
        // a raw prompt's special tokens are text unless the request says otherwise
        Prompt::Text(t) if greq.parse_special => srv.tokenizer.encode(t, true),
        Prompt::Text(t) => srv.tokenizer.encode_plain(t, true),
        Prompt::Ids(ids) => {
            if let Some(bad) = ids.iter().find(|&&i| i as usize >= srv.vocab_size) {
                return Err(ApiError::field(
                    "invalid_value",
                    "prompt",
                    format!("'prompt' holds token id {bad}, outside the vocabulary (size {})", srv.vocab_size),
                ));
            }
            ids.clone()
        }
    };
    if ids.is_empty() {
        return Err(ApiError::field("invalid_value", "prompt", "the prompt is empty (no tokens)"));
    }
    if ids.len() > srv.ctx {
        return Err(ApiError {
            param: Some(if chat { "messages" } else { "prompt" }.into()),
            ..ApiError::new(
                400,
                "context_length_exceeded",
                format!("the prompt has {} tokens, more than the context of {} tokens", ids.len(), srv.ctx),
            )
        });
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

fn run(
    srv: &Server,
    stream: &mut TcpStream,
    req: &Request,
    greq: GenRequest,
    ids: Vec<u32>,
    calls: Option<CallSyntax>,
    received: Instant,
) {
    let chat = greq.chat;
    let meta = Meta {
        id: format!("{}-{:016x}", if chat { "chatcmpl" } else { "cmpl" }, unique()),
        created: unix_now(),
        model: srv.model_id.clone(),
        fingerprint: srv.fingerprint.clone(),
    };
    let (tx, rx) = channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let queued = Arc::new(AtomicBool::new(true));
    let deadline = greq.params.timeout.map(|s| received + Duration::from_secs_f64(s));
    let job = Job {
        id: meta.id.clone(),
        prompt_text: srv.log_prompts.then(|| String::from_utf8_lossy(&srv.tokenizer.decode(&ids)).into_owned()),
        prompt: ids,
        params: greq.params.clone(),
        events: tx,
        cancel: cancel.clone(),
        queued: queued.clone(),
        received,
    };
    if !srv.queue.submit(job) {
        let m = &srv.queue.metrics;
        let msg = format!(
            "the server is busy: all {} slots are generating and {} requests are waiting (--max-queue); retry later",
            m.slots,
            m.waiting.load(Ordering::SeqCst)
        );
        return srv.send_error(stream, &ApiError::new(503, "queue_full", msg));
    }
    // Set when the client went away: the worker stops before its next token.
    let hang_up = || cancel.store(true, Ordering::SeqCst);

    let common = srv.common_headers();
    // A stream's head goes out when its request gets a slot: until then it can
    // still be answered with a plain error status (and a load balancer can
    // still retry it elsewhere).
    let mut writer: Option<StreamWriter> = None;
    let mut started = false;
    let want_logprobs = greq.params.logprobs.is_some();
    let mut text = String::new();
    let mut logprobs: Vec<TokenLogprob> = Vec::new();
    let mut first = true;
    loop {
        let ev = match rx.recv_timeout(POLL) {
            Ok(ev) => ev,
            Err(RecvTimeoutError::Timeout) => {
                if http::peer_closed(stream) {
                    srv.queue.withdraw(&queued);
                    return hang_up();
                }
                if !started && deadline.is_some_and(|d| Instant::now() >= d) {
                    // Its deadline passed while it waited for a slot: it leaves the queue
                    // (the worker will skip it). Nothing was sent yet (a stream's head goes
                    // out when it gets a slot).
                    srv.queue.withdraw(&queued);
                    hang_up();
                    let e = ApiError::new(
                        503,
                        "timeout",
                        "the request's deadline passed before a slot was free; retry later",
                    );
                    return srv.send_error(stream, &e);
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => {
                // The worker dropped the job without a last word (cancelled, or a bug).
                let e = ApiError::new(500, "server_error", "the generation ended unexpectedly");
                match writer {
                    Some(mut w) => {
                        let _ = w.send(&sse(&e.to_json()));
                        let _ = w.end();
                    }
                    None => srv.send_error(stream, &e),
                }
                return;
            }
        };
        match ev {
            Event::Started => {
                started = true;
                if greq.stream {
                    srv.queue.metrics.answered(200);
                    match StreamWriter::start(stream, "text/event-stream", &common, req.http10) {
                        Ok(w) => writer = Some(w),
                        Err(_) => return hang_up(),
                    }
                }
                if let (Some(w), true) = (writer.as_mut(), chat) {
                    // OpenAI's first chat chunk: the role and empty content.
                    if w.send(&sse(&meta.chunk(true, Some(""), true, None, None, greq.include_usage))).is_err() {
                        return hang_up();
                    }
                    first = false;
                }
            }
            Event::Delta { text: delta, logprobs: lp } => {
                let lp_json = lp.as_ref().map(|t| {
                    if chat {
                        api::chat_logprobs(std::slice::from_ref(t))
                    } else {
                        api::completion_logprobs(std::slice::from_ref(t))
                    }
                });
                match writer.as_mut() {
                    // with tools, the answer may be calls: it is read whole at the end
                    Some(w) if calls.is_none() => {
                        if delta.is_empty() && lp_json.is_none() {
                            continue;
                        }
                        let chunk = meta.chunk(chat, Some(&delta), first, None, lp_json, greq.include_usage);
                        first = false;
                        if w.send(&sse(&chunk)).is_err() || http::peer_closed(w.stream()) {
                            return hang_up();
                        }
                    }
                    _ => {
                        text.push_str(&delta);
                        logprobs.extend(lp);
                        if http::peer_closed(writer.as_mut().map_or(&*stream, |w| w.stream())) {
                            return hang_up();
                        }
                    }
                }
            }
            Event::Done { finish, prompt_tokens, completion_tokens, cached_tokens } => {
                let usage = api::usage(prompt_tokens, completion_tokens, cached_tokens);
                let parsed = calls.and_then(|syntax| {
                    let (content, found) = syntax.parse(&text, &greq.tools)?;
                    let ids = call_ids(syntax, found.len());
                    let found: Vec<ToolCall> = found
                        .into_iter()
                        .zip(ids)
                        .map(|((name, arguments), id)| ToolCall { id, name, arguments })
                        .collect();
                    Some((content, found))
                });
                if let Some((content, found)) = parsed {
                    match writer {
                        Some(mut w) => {
                            let mut chunks = Vec::new();
                            if !content.is_empty() {
                                chunks.push(meta.chunk(true, Some(&content), false, None, None, greq.include_usage));
                            }
                            chunks.extend(meta.calls_chunks(&found, greq.include_usage));
                            for c in &chunks {
                                let _ = w.send(&sse(c));
                            }
                            if greq.include_usage {
                                let _ = w.send(&sse(&meta.usage_chunk(true, usage)));
                            }
                            let _ = w.send(b"data: [DONE]\n\n");
                            let _ = w.end();
                        }
                        None => srv.send(stream, &Response::json(200, &meta.answer_calls(&content, &found, usage))),
                    }
                    return;
                }
                if let (Some(w), Some(_)) = (writer.as_mut(), calls) {
                    // no calls after all: the held text, as one delta
                    if !text.is_empty() {
                        let lp_json = want_logprobs.then(|| api::chat_logprobs(&logprobs));
                        let _ = w.send(&sse(&meta.chunk(true, Some(&text), first, None, lp_json, greq.include_usage)));
                        first = false;
                    }
                }
                match writer {
                    Some(mut w) => {
                        let last = if chat {
                            meta.chunk(true, None, first, Some(finish), None, greq.include_usage)
                        } else {
                            meta.chunk(false, Some(""), first, Some(finish), None, greq.include_usage)
                        };
                        let _ = w.send(&sse(&last));
                        if greq.include_usage {
                            let _ = w.send(&sse(&meta.usage_chunk(chat, usage)));
                        }
                        let _ = w.send(b"data: [DONE]\n\n");
                        let _ = w.end();
                    }
                    None => {
                        let lp = want_logprobs.then(|| {
                            if chat {
                                api::chat_logprobs(&logprobs)
                            } else {
                                api::completion_logprobs(&logprobs)
                            }
                        });
                        srv.send(stream, &Response::json(200, &meta.answer(chat, &text, finish, usage, lp)));
                    }
                }
                debug_assert!(finish != Finish::Cancelled);
                return;
            }
            Event::Error(msg) => {
                let e = ApiError::new(500, "server_error", msg);
                match writer {
                    Some(mut w) => {
                        let _ = w.send(&sse(&e.to_json()));
                        let _ = w.send(b"data: [DONE]\n\n");
                        let _ = w.end();
                    }
                    None => srv.send_error(stream, &e),
                }
                return;
            }
        }
    }
}
