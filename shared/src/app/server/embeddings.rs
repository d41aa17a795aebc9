//! `POST /v1/embeddings` (served with `--embedding`): OpenAI's request and
//! answer. Each input is a job in the worker's slots, batched with whatever
//! else runs (its prompt's hidden states pooled as the model file says, or
//! `--pooling`, to unit length), at most as many at once as there are
//! slots; the answer lists the vectors in the inputs' order, as floats or
//! (`encoding_format: "base64"`, what OpenAI's Python client asks for) as
//! the base64 of their little-endian f32 bytes.

use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::error::ApiError;
use super::fields::{parse_object, refuse_unknown, wrong_type, Fields};
use super::http::{self, Request, Response};
use super::job::{Event, GenParams, Job};
use super::Server;
use crate::model::{check_prompt, Pooling};

/// OpenAI's most inputs per request.
const MAX_INPUTS: usize = 2048;
const FIELDS: [&str; 5] = ["input", "model", "encoding_format", "user", "dimensions"];
/// How often a waiting request looks for results and for its client.
const POLL: Duration = Duration::from_millis(5);

/// How the server answers embeddings: None without `--embedding`.
#[derive(Clone, Copy, Debug)]
pub struct EmbeddingSetup {
    pub pooling: Pooling,
    pub dimensions: usize,
}

pub(crate) fn embeddings(srv: &Server, stream: &mut TcpStream, req: &Request) {
    match answer(srv, stream, req) {
        Ok(Some(body)) => {
            srv.send(stream, &Response { status: 200, content_type: "application/json", headers: Vec::new(), body })
        }
        Ok(None) => {} // the client went away
        Err(e) => srv.send_error(stream, &e),
    }
}

/// One input: a text, or token ids.
enum Input {
    Text(String),
    Ids(Vec<u32>),
}

fn parse_inputs(v: Option<&Value>) -> Result<Vec<Input>, ApiError> {
    let bad = |msg: String| ApiError::field("invalid_value", "input", msg);
    let ids = |a: &[Value]| -> Option<Vec<u32>> {
        a.iter().map(|x| x.as_u64().and_then(|i| u32::try_from(i).ok())).collect()
    };
    let inputs = match v {
        None => return Err(ApiError::field("missing_parameter", "input", "'input' is required")),
        Some(Value::String(s)) => vec![Input::Text(s.clone())],
        Some(Value::Array(a)) if a.is_empty() => return Err(bad("'input' must not be an empty array".into())),
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => {
            vec![Input::Ids(ids(a).ok_or_else(|| bad("token ids must be integers from 0 to 2^32 - 1".into()))?)]
        }
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| match x {
                Value::String(s) => Ok(Input::Text(s.clone())),
                Value::Array(t) => {
                    ids(t).map(Input::Ids).ok_or_else(|| bad("token ids must be integers from 0 to 2^32 - 1".into()))
                }
                other => Err(wrong_type("input", "a string, an array of strings or of token ids", other)),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(wrong_type("input", "a string, an array of strings or of token ids", other)),
    };
    if inputs.len() > MAX_INPUTS {
        return Err(bad(format!("'input' holds {} items; at most {MAX_INPUTS}", inputs.len())));
    }
    Ok(inputs)
}

/// The answer's body; None when the client went away.
fn answer(srv: &Server, stream: &mut TcpStream, req: &Request) -> Result<Option<Vec<u8>>, ApiError> {
    let Some(setup) = srv.embedding else {
        return Err(ApiError::new(
            501,
            "not_supported",
            "this server does not compute embeddings: start it with --embedding",
        ));
    };
    let obj = parse_object(&req.body)?;
    refuse_unknown(&obj, &[&FIELDS])?;
    let f = Fields(&obj);
    let base64 = match f.string("encoding_format")? {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::field(
                "invalid_value",
                "encoding_format",
                format!("'encoding_format' must be 'float' or 'base64', not {other:?}"),
            ))
        }
    };
    f.string("model")?;
    f.string("user")?;
    if let Some(d) = f.int("dimensions", 1, i64::MAX)? {
        if d as usize != setup.dimensions {
            return Err(ApiError::field(
                "unsupported_value",
                "dimensions",
                format!("this model's embeddings have {} dimensions, not {d}", setup.dimensions),
            ));
        }
    }
    let mut prompts = Vec::new();
    for (i, input) in parse_inputs(f.get("input"))?.into_iter().enumerate() {
        let ids = match input {
            // special tokens written in a text are text
            Input::Text(t) => srv.tokenizer.encode_plain(&t, true),
            Input::Ids(ids) => ids,
        };
        if ids.is_empty() {
            return Err(ApiError::field("invalid_value", "input", format!("input {i} is empty")));
        }
        check_prompt(&ids, srv.vocab_size, srv.ctx)
            .map_err(|e| ApiError::field("invalid_value", "input", format!("input {i}: {e}")))?;
        prompts.push(ids);
    }
    let total: usize = prompts.iter().map(Vec::len).sum();
    let Some(vectors) = run(srv, stream, prompts, setup.pooling)? else { return Ok(None) };

    let mut body = String::from("{\"object\":\"list\",\"data\":[");
    for (i, v) in vectors.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&format!("{{\"object\":\"embedding\",\"index\":{i},\"embedding\":"));
        if base64 {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            body.push('"');
            body.push_str(&base64_encode(&bytes));
            body.push('"');
        } else {
            body.push('[');
            body.push_str(&v.iter().map(|x| format!("{x:?}")).collect::<Vec<_>>().join(","));
            body.push(']');
        }
        body.push('}');
    }
    let model = Value::String(srv.model_id.clone());
    body.push_str(&format!("],\"model\":{model},\"usage\":{{\"prompt_tokens\":{total},\"total_tokens\":{total}}}}}"));
    Ok(Some(body.into_bytes()))
}

/// The prompts' embeddings, as jobs in the worker, at most a slot's worth
/// at a time; None when the client went away (its jobs cancelled).
fn run(
    srv: &Server,
    stream: &TcpStream,
    prompts: Vec<Vec<u32>>,
    pooling: Pooling,
) -> Result<Option<Vec<Vec<f32>>>, ApiError> {
    let received = Instant::now();
    let window = srv.queue.metrics.slots.max(1);
    let mut out: Vec<Option<Vec<f32>>> = vec![None; prompts.len()];
    let mut pending = prompts.into_iter().enumerate();
    let mut running: Vec<(usize, Receiver<Event>, Arc<AtomicBool>)> = Vec::new();
    let cancel_all = |running: &[(usize, Receiver<Event>, Arc<AtomicBool>)]| {
        running.iter().for_each(|(_, _, c)| c.store(true, Ordering::SeqCst));
    };
    loop {
        while running.len() < window {
            let Some((i, prompt)) = pending.next() else { break };
            let (tx, rx) = channel();
            let cancel = Arc::new(AtomicBool::new(false));
            let job = Job {
                id: format!("embd-{i}"),
                prompt_text: None,
                prompt,
                params: GenParams {
                    max_tokens: 0,
                    temperature: 0.0,
                    top_p: 1.0,
                    top_k: 0,
                    min_p: 0.0,
                    repeat_penalty: 1.0,
                    seed: 0,
                    stop: Vec::new(),
                    logprobs: None,
                    ignore_eos: false,
                    timeout: srv.request_timeout,
                    draft_sizes: (None, None),
                    grammar: None,
                },
                events: tx,
                cancel: cancel.clone(),
                queued: Arc::new(AtomicBool::new(true)),
                received,
                embed: Some(pooling),
            };
            if !srv.queue.submit(job) {
                cancel_all(&running);
                return Err(ApiError::new(503, "queue_full", "the server is busy; retry later"));
            }
            running.push((i, rx, cancel));
        }
        if running.is_empty() {
            break;
        }
        let mut progressed = false;
        let mut k = 0;
        while k < running.len() {
            match running[k].1.try_recv() {
                Ok(Event::Embedding(v)) => {
                    out[running[k].0] = Some(v);
                    progressed = true;
                }
                Ok(Event::Done { .. }) if out[running[k].0].is_none() => {
                    // ended before its vector: its deadline passed
                    cancel_all(&running);
                    return Err(ApiError::new(503, "timeout", "the request's deadline passed; retry later"));
                }
                Ok(Event::Done { .. }) => {
                    running.swap_remove(k);
                    progressed = true;
                    continue;
                }
                Ok(Event::Error(fault)) => {
                    cancel_all(&running);
                    return Err(ApiError::from_fault(&fault));
                }
                Ok(_) | Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Disconnected) => {
                    cancel_all(&running);
                    return Err(ApiError::new(500, "server_error", "the embedding ended unexpectedly"));
                }
            }
            k += 1;
        }
        if !progressed {
            if http::peer_closed(stream) {
                cancel_all(&running);
                return Ok(None);
            }
            std::thread::sleep(POLL);
        }
    }
    Ok(Some(out.into_iter().map(|v| v.unwrap_or_default()).collect()))
}

/// Standard base64 with padding (RFC 4648).
fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (k, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if k <= chunk.len() {
                out.push(ALPHABET[(n >> shift & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_as_rfc_4648() {
        for (raw, want) in [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foobar", "Zm9vYmFy")] {
            assert_eq!(super::base64_encode(raw.as_bytes()), want);
        }
    }
}
