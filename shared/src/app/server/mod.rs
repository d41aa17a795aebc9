//! `ml_server` (`ml_run --server`): an OpenAI-compatible HTTP API over one
//! loaded model, with a small chat page at `/`.
//!
//! Crates, and why: `serde_json` (the de-facto standard JSON crate) parses
//! and writes every body. HTTP requests are parsed by `httparse`, the
//! zero-copy, fuzzed request-head parser underneath hyper, and served on
//! `std::net` with one thread per connection. We chose it over `tiny_http`,
//! which owns its sockets: it offers no read/write timeouts (a slow client
//! could hold a request forever), and its writer cannot see a client hang up
//! until a write fails, whereas we must notice a disconnect within one token
//! (we peek the socket between tokens). A full async stack (hyper + tokio)
//! would add ~40 crates and minutes of build time on two cores for a server
//! that runs one generation at a time. What we write ourselves is only
//! framing: Content-Length bodies (chunked request bodies get 411), and
//! chunked transfer encoding for streamed answers.
//!
//! Modules: `http` (socket I/O, limits, timeouts), `api` (OpenAI request
//! validation and answer shapes), `engine` (the single generation worker
//! around `generate::Generator`), `serve` (one generation request from queue
//! to answer). Conversations are formatted by `crate::chat`.

pub(crate) mod api;
mod engine;
pub(crate) mod http;
mod serve;

use std::ffi::OsString;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use serde_json::json;

use super::options::{startup_line, RunArgs};
use crate::chat::Template;
use crate::generate::Generator;
use crate::kernels::ISA;
use crate::tokenizer::Tokenizer;
use api::ApiError;
use engine::{Engine, Queue};
use http::{Limits, ReadError, Request, Response};

/// The chat page, compiled in.
const CHAT_HTML: &str = include_str!("chat.html");

#[derive(Parser, Debug)]
#[command(name = "ml_server", version, about = "Krafla: an OpenAI-compatible HTTP server for one model (.mlb)")]
pub struct ServerArgs {
    /// Model file (.mlb).
    pub model: PathBuf,
    /// The model and how to run it (-z is required here).
    #[command(flatten)]
    pub run: RunArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the address is printed on stderr).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require "Authorization: Bearer KEY" on every endpoint but /health and the chat page
    /// (default: the KRAFLA_API_KEY environment variable, if set).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Model id reported by the API (default: the model's file name).
    #[arg(long)]
    pub alias: Option<String>,
    /// Allow browser pages from this origin (e.g. http://localhost:3000, or *) to call the API.
    #[arg(long)]
    pub cors_origin: Option<String>,
    /// Requests that may wait while one generates (0 to 4096); more get 503.
    #[arg(long, default_value_t = 8)]
    pub max_queue: usize,
    /// Largest request body in bytes (at least 1); larger gets 413.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body: usize,
    /// Seconds a client has to send its whole request (also the timeout of each write; 1 to 86400).
    #[arg(long, default_value_t = 30)]
    pub read_timeout: u64,
}

/// The most requests `--max-queue` lets wait (each waiting request holds a thread).
const MAX_QUEUE: usize = 4096;
/// The longest `--read-timeout`: a day.
const MAX_READ_TIMEOUT: u64 = 86_400;

impl ServerArgs {
    /// Refuses limits the server cannot work with: a body limit of 0 (every
    /// API request has a body), a read timeout of 0 or beyond a day, a queue
    /// larger than the threads it would hold.
    fn check(&self) -> Result<(), String> {
        if self.max_body == 0 {
            return Err("--max-body must be at least 1 byte (every API request has a body)".into());
        }
        if !(1..=MAX_READ_TIMEOUT).contains(&self.read_timeout) {
            return Err(format!("--read-timeout must be from 1 to {MAX_READ_TIMEOUT} seconds"));
        }
        if self.max_queue > MAX_QUEUE {
            return Err(format!("--max-queue must be from 0 to {MAX_QUEUE}"));
        }
        Ok(())
    }
}

/// Writes one line to the log (stderr), escaped onto one line without
/// control characters: it may hold a client's or a file's text. A closed
/// stderr loses the line but never stops the server.
pub(crate) fn log(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{}", super::escape_line(line));
}

/// What every connection thread shares.
pub(crate) struct Server {
    pub queue: Queue,
    pub tokenizer: Arc<Tokenizer>,
    pub vocab_size: usize,
    pub ctx: usize,
    pub template: Option<Template>,
    pub system: Option<String>,
    pub model_id: String,
    pub created: u64,
    pub fingerprint: String,
    api_key: Option<String>,
    cors_origin: Option<String>,
    limits: Limits,
    connections: AtomicUsize,
    max_connections: usize,
}

/// `ml_run --server ARGS` (the launcher's `ml_server ARGS`), `--server` removed.
pub fn main(argv: Vec<OsString>) -> Result<(), String> {
    match super::parse_args::<ServerArgs>(argv)? {
        Some(args) => run(args),
        None => Ok(()),
    }
}

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn run(args: ServerArgs) -> Result<(), String> {
    args.check()?;
    let started = std::time::Instant::now();
    let (file, tokenizer) = args.run.open(Some(&args.model))?;
    let file = file.ok_or("no model given")?;
    let tokenizer = tokenizer.ok_or("ml_server needs a tokenizer (-z TOKENIZER.mlt, or a GGUF model)")?;
    let template = args.run.template(Some(&tokenizer), true)?;
    let (pool, threads) = args.run.thread_pool()?;
    let model = pool.install(|| args.run.load_model(file, Some(&tokenizer)))?;
    let load_secs = started.elapsed().as_secs_f64();
    let vocab_size = model.config.vocab_size;
    let ctx = args.run.ctx(&model)?;
    let state = args.run.state(&model, ctx)?;
    let line = startup_line(&args.model, &model, load_secs, threads, ctx, &state, args.run.kv);
    let tokenizer = Arc::new(tokenizer);
    let generator = Generator::new(model, state, args.run.batch);
    let queue = Engine::new(generator, tokenizer.clone()).spawn(&pool, args.max_queue);

    let listener = TcpListener::bind((args.host.as_str(), args.port))
        .map_err(|e| format!("cannot listen on {}:{}: {e}", args.host, args.port))?;
    let addr = listener.local_addr().map_err(|e| format!("cannot read the listening address: {e}"))?;
    let api_key = args.api_key.clone().or_else(|| std::env::var("KRAFLA_API_KEY").ok()).filter(|k| !k.is_empty());
    let model_id = args.alias.clone().unwrap_or_else(|| {
        args.model.file_name().map_or_else(|| args.model.display().to_string(), |n| n.to_string_lossy().into_owned())
    });
    let server = Arc::new(Server {
        queue,
        tokenizer,
        vocab_size,
        ctx,
        template,
        system: args.run.system.clone(),
        model_id,
        created: unix_now(),
        fingerprint: format!("krafla-{}-{ISA}", env!("CARGO_PKG_VERSION")),
        api_key,
        cors_origin: args.cors_origin.clone(),
        limits: Limits { max_body: args.max_body, timeout: Duration::from_secs(args.read_timeout) },
        connections: AtomicUsize::new(0),
        max_connections: args.max_queue + 64,
    });
    log(&line);
    if !addr.ip().is_loopback() && server.api_key.is_none() {
        log(&format!(
            "krafla: warning: listening on {} without --api-key: anyone who can reach it can use it",
            addr.ip()
        ));
    }
    log(&format!(
        "krafla: model id '{}', chat template {}, listening on http://{addr}/v1 (chat page: http://{addr}/)",
        server.model_id,
        server.template.map_or("none", Template::name)
    ));
    for conn in listener.incoming() {
        let Ok(stream) = conn else { continue };
        let srv = server.clone();
        srv.connections.fetch_add(1, Ordering::SeqCst);
        let spawned = std::thread::Builder::new().name("krafla-conn".into()).spawn(move || {
            handle_connection(&srv, stream);
            srv.connections.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            server.connections.fetch_sub(1, Ordering::SeqCst);
        }
    }
    Ok(())
}

impl Server {
    /// Headers on every answer: CORS when allowed.
    fn common_headers(&self) -> Vec<(String, String)> {
        match &self.cors_origin {
            Some(o) => vec![("Access-Control-Allow-Origin".into(), o.clone()), ("Vary".into(), "Origin".into())],
            None => Vec::new(),
        }
    }

    pub(crate) fn send(&self, stream: &mut TcpStream, resp: &Response) {
        let _ = http::write_response(stream, resp, &self.common_headers(), true);
    }

    /// The answer to a HEAD request: the head GET would get (its Content-Length
    /// included), without the body.
    fn send_head(&self, stream: &mut TcpStream, resp: &Response) {
        let _ = http::write_response(stream, resp, &self.common_headers(), false);
    }

    pub(crate) fn send_error(&self, stream: &mut TcpStream, e: &ApiError) {
        self.send(stream, &error_response(e));
    }

    fn authorized(&self, req: &Request) -> bool {
        let Some(key) = &self.api_key else { return true };
        let given = req.header("authorization").and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
        given.is_some_and(|g| constant_time_eq(g.as_bytes(), key.as_bytes()))
    }
}

/// The answer of an error, with the headers its status calls for.
fn error_response(e: &ApiError) -> Response {
    let mut resp = Response::json(e.status, &e.to_json());
    if e.status == 401 {
        resp.headers.push(("WWW-Authenticate".into(), "Bearer".into()));
    }
    if e.status == 503 {
        resp.headers.push(("Retry-After".into(), "1".into()));
    }
    resp
}

/// Equality whose time depends only on the lengths, not on where the bytes differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u64;
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
        diff |= std::hint::black_box(x as u64);
    }
    std::hint::black_box(diff) == 0
}

fn handle_connection(srv: &Server, mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(srv.limits.timeout));
    if srv.connections.load(Ordering::SeqCst) > srv.max_connections {
        srv.send_error(
            &mut stream,
            &ApiError::new(503, "too_many_connections", "too many open connections; retry later"),
        );
        http::drain_and_close(stream);
        return;
    }
    let req = match http::read_request(&mut stream, &srv.limits) {
        Ok(r) => r,
        Err(ReadError::Gone) => return,
        Err(ReadError::Reply(status, code, msg)) => {
            srv.send_error(&mut stream, &ApiError::new(status, code, msg));
            http::drain_and_close(stream);
            return;
        }
    };
    route(srv, &mut stream, &req);
}

/// What a request gets: an answer, or a generation (which answers as it goes).
enum Answer {
    Send(Response),
    Fail(ApiError),
    Generate { chat: bool },
}

fn route(srv: &Server, stream: &mut TcpStream, req: &Request) {
    // HEAD is GET without the body: the same route, the same API key rule, the same head.
    let head = req.method == "HEAD";
    let method = if head { "GET" } else { req.method.as_str() };
    let resp = match answer(srv, req, method) {
        Answer::Generate { chat } => return serve::generate(srv, stream, req, chat),
        Answer::Send(resp) => resp,
        Answer::Fail(e) => error_response(&e),
    };
    if head {
        srv.send_head(stream, &resp);
    } else {
        srv.send(stream, &resp);
    }
}

/// The answer to `method` (GET for a HEAD request, so that its head is GET's) on `req.path`.
fn answer(srv: &Server, req: &Request, method: &str) -> Answer {
    let path = req.path.trim_end_matches('/');
    // Browser preflight: answered only when --cors-origin allows it.
    if method == "OPTIONS" {
        if srv.cors_origin.is_none() {
            return Answer::Fail(ApiError::new(405, "method_not_allowed", "OPTIONS is not allowed (no --cors-origin)"));
        }
        let mut resp = Response { status: 204, content_type: "", headers: Vec::new(), body: Vec::new() };
        resp.headers.push(("Access-Control-Allow-Methods".into(), "GET, HEAD, POST, OPTIONS".into()));
        resp.headers.push(("Access-Control-Allow-Headers".into(), "Authorization, Content-Type".into()));
        resp.headers.push(("Access-Control-Max-Age".into(), "600".into()));
        return Answer::Send(resp);
    }
    // Unauthenticated: liveness, and the static chat page (it holds no data; its API calls carry the key).
    match (method, path) {
        ("GET", "/health") => {
            let body = json!({
                "status": "ok",
                "busy": srv.queue.busy.load(Ordering::SeqCst),
                "queued": srv.queue.waiting.load(Ordering::SeqCst),
            });
            return Answer::Send(Response::json(200, &body));
        }
        ("GET", "" | "/index.html") => {
            return Answer::Send(Response {
                status: 200,
                content_type: "text/html; charset=utf-8",
                headers: vec![
                    (
                        "Content-Security-Policy".into(),
                        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; \
                         img-src data:; frame-ancestors 'none'"
                            .into(),
                    ),
                    ("X-Content-Type-Options".into(), "nosniff".into()),
                    ("Referrer-Policy".into(), "no-referrer".into()),
                ],
                body: CHAT_HTML.as_bytes().to_vec(),
            });
        }
        _ => {}
    }
    if !srv.authorized(req) {
        return Answer::Fail(ApiError::new(
            401,
            "invalid_api_key",
            "missing or wrong API key: send the header 'Authorization: Bearer KEY'",
        ));
    }
    let model = || json!({"id": srv.model_id, "object": "model", "created": srv.created, "owned_by": "krafla"});
    match (method, path) {
        ("GET", "/v1/models") => Answer::Send(Response::json(200, &json!({"object": "list", "data": [model()]}))),
        ("GET", p) if p.strip_prefix("/v1/models/").is_some_and(|id| id == srv.model_id) => {
            Answer::Send(Response::json(200, &model()))
        }
        ("GET", p) if p.starts_with("/v1/models/") => Answer::Fail(ApiError::new(
            404,
            "model_not_found",
            format!("no model '{}' here; this server has '{}'", &p[11..], srv.model_id),
        )),
        ("POST", "/v1/chat/completions") => Answer::Generate { chat: true },
        ("POST", "/v1/completions") => Answer::Generate { chat: false },
        (_, "/v1/chat/completions" | "/v1/completions" | "/v1/models" | "/health") => {
            Answer::Fail(ApiError::new(405, "method_not_allowed", format!("{method} is not allowed on {}", req.path)))
        }
        _ => Answer::Fail(ApiError::new(404, "not_found", format!("no such endpoint: {method} {}", req.path))),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn limits_that_cannot_work_are_refused() {
        use clap::Parser;
        let check = |extra: &[&str]| {
            let argv = ["ml_server", "m.mlb", "-z", "t.mlt"].iter().chain(extra);
            super::ServerArgs::try_parse_from(argv).unwrap().check()
        };
        assert!(check(&[]).is_ok());
        assert!(check(&["--max-queue", "0", "--max-body", "1", "--read-timeout", "86400"]).is_ok());
        for (opt, v) in [("--max-body", "0"), ("--read-timeout", "0"), ("--read-timeout", "18446744073709551615")] {
            let e = check(&[opt, v]).unwrap_err();
            assert!(e.starts_with(opt) && !e.contains('\n'), "{e}");
        }
        assert!(check(&["--max-queue", "18446744073709551615"]).unwrap_err().starts_with("--max-queue"));
    }

    #[test]
    fn constant_time_eq_is_equality() {
        use super::constant_time_eq as eq;
        assert!(eq(b"secret", b"secret"));
        assert!(!eq(b"secret", b"secreT"));
        assert!(!eq(b"secret", b"secret2"));
        assert!(!eq(b"", b"x"));
        assert!(eq(b"", b""));
    }
}
