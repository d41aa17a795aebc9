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
//! whose connections mostly wait for one generation worker. What we write
//! ourselves is only framing: Content-Length bodies (chunked request bodies
//! get 411), and chunked transfer encoding for streamed answers.
//!
//! Modules: `http` (socket I/O, limits, timeouts); the OpenAI wire format,
//! which knows nothing of the worker: `fields` (reading a body field by
//! field), `request` (a generation request validated), `response` (the
//! answer's and the stream chunks' JSON), `error` (the error answer); `job`
//! (what a connection and the worker pass each other); `engine` (the
//! generation worker: the `--parallel` slots decoded in one batch); `serve`
//! (one generation request from queue to answer, through one sink for a
//! stream or a whole answer); `metrics` (`/metrics`); `tokens` (llama.cpp's
//! `/tokenize` and `/detokenize`). Conversations are formatted by
//! `crate::chat`.

mod anthropic;
mod embeddings;
mod engine;
mod error;
pub(crate) mod fields;
pub(crate) mod http;
mod job;
mod metrics;
pub(crate) mod request;
mod response;
mod responses;
mod serve;
mod tokens;

use std::ffi::OsString;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use clap::Parser;
use serde_json::json;

use super::options::{startup_line, RunArgs};
use super::speculative_options::SpecArgs;
use crate::chat::{JinjaTemplate, Template};
use crate::fault::Fault;
use crate::generate::Sequence;
use crate::kernels::ISA;
use crate::tokenizer::Tokenizer;
use embeddings::EmbeddingSetup;
use engine::{Engine, Queue};
use error::ApiError;
use http::{Limits, ReadError, Request, Response};

/// The chat page, compiled in.
const CHAT_HTML: &str = include_str!("chat.html");

#[derive(Parser, Debug)]
#[command(name = "ml_server", version, about = "Krafla: an OpenAI-compatible HTTP server for one model")]
pub struct ServerArgs {
    /// Model: .mlb, .gguf, a Hugging Face directory or a llama2.c .bin.
    pub model: PathBuf,
    /// The model and how to run it (a tokenizer is required: -z, or the GGUF's or the directory's own).
    #[command(flatten)]
    pub run: RunArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
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
    /// Requests decoded together, each in a slot with its own KV cache of --ctx positions
    /// (default: 4, fewer if their KV caches would take more than half the available memory).
    #[arg(long, value_name = "N")]
    pub parallel: Option<usize>,
    /// Requests that may wait while every slot is busy (0 to 4096); more get 503.
    #[arg(long, default_value_t = 8)]
    pub max_queue: usize,
    /// Seconds a request may take from its arrival to its last token (0: no limit); a request
    /// may ask for less with the `timeout` field. Waiting past it gets 503; generating past it
    /// ends the answer with finish_reason "length".
    #[arg(long, default_value_t = 0.0, value_name = "SECS")]
    pub request_timeout: f64,
    /// Answer POST /v1/embeddings: each input's hidden states after the output norm, pooled
    /// (--pooling, else as the model file says, else mean) to a unit-length vector.
    #[arg(long, visible_alias = "embeddings")]
    pub embedding: bool,
    /// Chat requests whose conversation leaves no room for the answer (a quarter of --ctx, or
    /// max_tokens if less) lose their oldest turns after the system messages, instead of a 400;
    /// the answer says how many (`usage.context_shift`, header X-Context-Dropped-Tokens).
    #[arg(long)]
    pub context_shift: bool,
    /// Put each request's prompt text in its access log line.
    #[arg(long)]
    pub log_prompts: bool,
    /// Largest request body in bytes (at least 1); larger gets 413.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body: usize,
    /// Seconds a client has to send its whole request (also the timeout of each write; 1 to 86400).
    #[arg(long, default_value_t = 30)]
    pub read_timeout: u64,
}

/// The most requests `--max-queue` lets wait (each waiting request holds a thread).
const MAX_QUEUE: usize = 4096;
/// The most slots `--parallel` gives.
const MAX_PARALLEL: usize = 256;
/// The default `--parallel`.
const DEFAULT_PARALLEL: usize = 4;
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
        if self.parallel.is_some_and(|n| !(1..=MAX_PARALLEL).contains(&n)) {
            return Err(format!("--parallel must be from 1 to {MAX_PARALLEL}"));
        }
        if !(self.request_timeout.is_finite() && (0.0..=MAX_READ_TIMEOUT as f64).contains(&self.request_timeout)) {
            return Err(format!("--request-timeout must be from 0 to {MAX_READ_TIMEOUT} seconds"));
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
    /// Positions in each slot's KV cache (`--ctx`).
    pub ctx: usize,
    /// The context the model was trained for (its file's context length).
    pub trained_ctx: usize,
    pub template: Option<Template>,
    /// The Jinja template chats are rendered with (the model's own, or
    /// `--chat-template-file`); None: the built-in `template`.
    pub jinja: Option<Arc<JinjaTemplate>>,
    /// `--chat-template-kwargs`: the template's variables by default.
    pub template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// `--context-shift`: the oldest turns of a conversation too long go.
    pub context_shift: bool,
    /// `--embedding`: how embeddings are made; None: /v1/embeddings answers 501.
    pub embedding: Option<EmbeddingSetup>,
    pub system: Option<String>,
    pub model_id: String,
    pub created: u64,
    pub fingerprint: String,
    /// `--request-timeout` (None: no limit).
    pub request_timeout: Option<f64>,
    pub log_prompts: bool,
    api_key: Option<String>,
    cors_origin: Option<String>,
    limits: Limits,
    connections: AtomicUsize,
    max_connections: usize,
}

/// `ml_run --server ARGS` (the launcher's `ml_server ARGS`), `--server` removed.
pub fn main(argv: Vec<OsString>) -> Result<(), Fault> {
    match super::parse_args::<ServerArgs>(argv)? {
        Some(args) => run(args),
        None => Ok(()),
    }
}

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn run(args: ServerArgs) -> Result<(), Fault> {
    args.check()?;
    let started = std::time::Instant::now();
    let listener = TcpListener::bind((args.host.as_str(), args.port))
        .map_err(|e| format!("cannot listen on {}:{}: {e}", args.host, args.port))?;
    let addr = listener.local_addr().map_err(|e| format!("cannot read the listening address: {e}"))?;
    let limits = Limits { max_body: args.max_body, timeout: Duration::from_secs(args.read_timeout) };
    log(&format!("krafla: loading {}; http://{addr}/health answers 503 until it is ready", args.model.display()));
    let loading = Loading::start(&listener, limits)?;

    let (file, tokenizer) = args.run.open(Some(&args.model))?;
    let file = file.ok_or("no model given")?;
    let tokenizer = tokenizer
        .ok_or("ml_server needs a tokenizer (-z TOKENIZER, a GGUF model, or a model directory with tokenizer.json)")?;
    let format = args.run.chat_format(Some(&tokenizer), true)?;
    let (template, jinja) = (format.as_ref().map(|f| f.kind), format.and_then(|f| f.jinja));
    let (pool, threads) = args.run.thread_pool()?;
    let model = pool.install(|| args.run.load_model(file, Some(&tokenizer), false))?;
    let load_secs = started.elapsed().as_secs_f64();
    let vocab_size = model.config.vocab_size;
    let embedding = args
        .embedding
        .then(|| EmbeddingSetup { pooling: args.run.pooling(&model), dimensions: model.config.hidden_size });
    let trained_ctx = model.config.context_length;
    let ctx = args.run.ctx(&model)?;
    let first = args.run.state(&model, ctx)?;
    let slot_bytes = first.bytes();
    let parallel = args.parallel.unwrap_or_else(|| default_parallel(slot_bytes));
    let line = startup_line(&args.model, &model, load_secs, threads, ctx, &first, args.run.kv);
    let mut sequences = vec![Sequence::new(first)];
    for _ in 1..parallel {
        sequences.push(Sequence::new(args.run.state(&model, ctx)?));
    }
    let plan = pool.install(|| args.spec.plan(&model, Some(&tokenizer), args.run.batch))?;
    let speculators = match plan.is_on() {
        true => (0..parallel).map(|_| plan.speculator(ctx).map(|s| s.expect("on"))).collect::<Result<_, _>>()?,
        false => Vec::new(),
    };
    let tokenizer = Arc::new(tokenizer);
    let queue =
        Engine::new(model, sequences, speculators, args.run.batch, tokenizer.clone()).spawn(&pool, args.max_queue);

    let api_key = args.api_key.clone().or_else(|| std::env::var("KRAFLA_API_KEY").ok()).filter(|k| !k.is_empty());
    let model_id = args.alias.clone().unwrap_or_else(|| {
        args.model.file_name().map_or_else(|| args.model.display().to_string(), |n| n.to_string_lossy().into_owned())
    });
    let server = Arc::new(Server {
        queue,
        tokenizer,
        vocab_size,
        ctx,
        trained_ctx,
        template,
        jinja,
        context_shift: args.context_shift,
        template_kwargs: args.run.chat_template_kwargs.clone().unwrap_or_default(),
        embedding,
        system: args.run.system.clone(),
        model_id,
        created: unix_now(),
        fingerprint: format!("krafla-{}-{ISA}", env!("CARGO_PKG_VERSION")),
        request_timeout: (args.request_timeout > 0.0).then_some(args.request_timeout),
        log_prompts: args.log_prompts,
        api_key,
        cors_origin: args.cors_origin.clone(),
        limits,
        connections: AtomicUsize::new(0),
        max_connections: args.max_queue + 64 + parallel,
    });
    log(&line);
    if let Some(spec) = plan.describe() {
        log(&format!("krafla: {spec}"));
    }
    let mib = |b: usize| b as f64 / 1048576.0;
    log(&format!(
        "krafla: {parallel} slot{} (--parallel) of {ctx} positions, KV cache {:.1} MiB per slot, {:.1} MiB in total; \
         up to {} prompt tokens per step (--batch)",
        if parallel == 1 { "" } else { "s" },
        mib(slot_bytes),
        mib(slot_bytes * parallel),
        args.run.batch
    ));
    if !addr.ip().is_loopback() && server.api_key.is_none() {
        log(&format!(
            "krafla: warning: listening on {} without --api-key: anyone who can reach it can use it",
            addr.ip()
        ));
    }
    let pending = loading.finish(addr);
    log(&format!(
        "krafla: model id '{}', chat template {}, listening on http://{addr}/v1 (chat page: http://{addr}/)",
        server.model_id,
        server.template.map_or("none", Template::name)
    ));
    for conn in pending.into_iter().map(Ok).chain(listener.incoming()) {
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

/// `--parallel`'s default: 4 slots, fewer when their KV caches would take
/// more than half the memory available (Linux's MemAvailable), at least one.
fn default_parallel(slot_bytes: usize) -> usize {
    let available = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
        line.split_whitespace().nth(1)?.parse::<usize>().ok().map(|kib| kib.saturating_mul(1024))
    });
    match available {
        Some(bytes) => (bytes / 2 / slot_bytes.max(1)).clamp(1, DEFAULT_PARALLEL),
        None => DEFAULT_PARALLEL,
    }
}

/// The listener's accept loop while the model loads: every request gets 503
/// (`/health` says "loading"), so that a load balancer or a readiness probe
/// can tell a loading replica from a dead one.
struct Loading {
    ready: Arc<AtomicBool>,
    handed_over: mpsc::Receiver<TcpStream>,
    thread: std::thread::JoinHandle<()>,
}

impl Loading {
    fn start(listener: &TcpListener, limits: Limits) -> Result<Loading, String> {
        let listener = listener.try_clone().map_err(|e| format!("cannot share the listening socket: {e}"))?;
        let ready = Arc::new(AtomicBool::new(false));
        let (tx, handed_over) = mpsc::channel();
        let flag = ready.clone();
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(stream) = conn else { continue };
                if flag.load(Ordering::SeqCst) {
                    // The first connection after loading: the server's loop takes it.
                    let _ = tx.send(stream);
                    return;
                }
                let _ = std::thread::Builder::new().name("krafla-loading".into()).spawn(move || {
                    answer_while_loading(stream, &limits);
                });
            }
        });
        Ok(Loading { ready, handed_over, thread })
    }

    /// Stops the loading loop (waking it with a connection of our own) and
    /// returns the connection it took last, for the server's loop.
    fn finish(self, addr: std::net::SocketAddr) -> Option<TcpStream> {
        self.ready.store(true, Ordering::SeqCst);
        let wake_addr = match addr.ip() {
            std::net::IpAddr::V4(ip) if ip.is_unspecified() => (std::net::Ipv4Addr::LOCALHOST, addr.port()).into(),
            std::net::IpAddr::V6(ip) if ip.is_unspecified() => (std::net::Ipv6Addr::LOCALHOST, addr.port()).into(),
            _ => addr,
        };
        let wake = TcpStream::connect_timeout(&wake_addr, Duration::from_secs(5));
        let taken = self.handed_over.recv().ok();
        drop(wake);
        let _ = self.thread.join();
        taken
    }
}

fn answer_while_loading(mut stream: TcpStream, limits: &Limits) {
    let _ = stream.set_write_timeout(Some(limits.timeout));
    let Ok(req) = http::read_request(&mut stream, limits) else { return };
    let resp = if req.path.trim_end_matches('/') == "/health" {
        let mut health = Response::json(503, &json!({"status": "loading"}));
        health.headers.push(("Retry-After".into(), "1".into()));
        health
    } else {
        // error_response adds Retry-After to every 503.
        error_response(&ApiError::new(503, "loading", "the model is loading; retry shortly"))
    };
    let _ = http::write_response(&mut stream, &resp, &[], req.method != "HEAD");
    http::drain_and_close(stream);
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
        self.queue.metrics.answered(resp.status);
        let _ = http::write_response(stream, resp, &self.common_headers(), true);
    }

    /// The answer to a HEAD request: the head GET would get (its Content-Length
    /// included), without the body.
    fn send_head(&self, stream: &mut TcpStream, resp: &Response) {
        self.queue.metrics.answered(resp.status);
        let _ = http::write_response(stream, resp, &self.common_headers(), false);
    }

    pub(crate) fn send_error(&self, stream: &mut TcpStream, e: &ApiError) {
        self.send(stream, &error_response(e));
    }

    fn authorized(&self, req: &Request) -> bool {
        let Some(key) = &self.api_key else { return true };
        // OpenAI's clients send `Authorization: Bearer KEY`, Anthropic's `x-api-key: KEY`
        let given = req
            .header("authorization")
            .and_then(|v| {
                let (scheme, token) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .or_else(|| req.header("x-api-key").map(str::trim));
        given.is_some_and(|g| constant_time_eq(g.as_bytes(), key.as_bytes()))
    }
}

/// The answer of an error, with the headers its status calls for.
pub(crate) fn error_response(e: &ApiError) -> Response {
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
    Generate(serve::ApiKind),
    Embed,
}

fn route(srv: &Server, stream: &mut TcpStream, req: &Request) {
    // HEAD is GET without the body: the same route, the same API key rule, the same head.
    let head = req.method == "HEAD";
    let method = if head { "GET" } else { req.method.as_str() };
    let resp = match answer(srv, req, method) {
        Answer::Generate(kind) => return serve::generate(srv, stream, req, kind),
        Answer::Embed => return embeddings::embeddings(srv, stream, req),
        Answer::Send(resp) => resp,
        Answer::Fail(e) => error_response(&e),
    };
    if head {
        srv.send_head(stream, &resp);
    } else {
        srv.send(stream, &resp);
    }
}

/// The paths answered by some method: any other method gets 405, not 404.
const ENDPOINTS: [&str; 12] = [
    "/v1/messages",
    "/v1/responses",
    "/v1/embeddings",
    "/props",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/health",
    "/metrics",
    "/tokenize",
    "/detokenize",
    "/apply-template",
];

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
            let m = &srv.queue.metrics;
            let busy = m.busy.load(Ordering::SeqCst);
            let body = json!({
                "status": "ok",
                "slots_total": m.slots,
                "slots_busy": busy,
                "slots_idle": m.slots.saturating_sub(busy),
                "queued": m.waiting.load(Ordering::SeqCst),
            });
            return Answer::Send(Response::json(200, &body));
        }
        // Prometheus' scrape: counters only, no request content.
        ("GET", "/metrics") => {
            return Answer::Send(Response {
                status: 200,
                content_type: "text/plain; version=0.0.4; charset=utf-8",
                headers: Vec::new(),
                body: srv.queue.metrics.render().into_bytes(),
            });
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
    match (method, path) {
        ("GET", "/v1/models") => Answer::Send(Response::json(200, &json!({"object": "list", "data": [model(srv)]}))),
        ("GET", p) if p.strip_prefix("/v1/models/").is_some_and(|id| id == srv.model_id) => {
            Answer::Send(Response::json(200, &model(srv)))
        }
        ("GET", p) if p.starts_with("/v1/models/") => Answer::Fail(ApiError::new(
            404,
            "model_not_found",
            format!("no model '{}' here; this server has '{}'", &p[11..], srv.model_id),
        )),
        ("POST", "/v1/chat/completions") => Answer::Generate(serve::ApiKind::Chat),
        ("POST", "/v1/completions") => Answer::Generate(serve::ApiKind::Completions),
        ("POST", "/v1/messages") => Answer::Generate(serve::ApiKind::Anthropic),
        ("POST", "/v1/responses") => Answer::Generate(serve::ApiKind::Responses),
        ("POST", "/v1/embeddings") => Answer::Embed,
        ("POST", "/tokenize") => json_answer(tokens::tokenize(&srv.tokenizer, &req.body)),
        ("POST", "/detokenize") => json_answer(tokens::detokenize(&srv.tokenizer, &req.body)),
        ("POST", "/apply-template") => json_answer(serve::apply_template(srv, req)),
        ("GET", "/props") => Answer::Send(Response::json(200, &props(srv))),
        (_, p) if ENDPOINTS.contains(&p) => {
            Answer::Fail(ApiError::new(405, "method_not_allowed", format!("{method} is not allowed on {}", req.path)))
        }
        _ => Answer::Fail(ApiError::new(404, "not_found", format!("no such endpoint: {method} {}", req.path))),
    }
}

/// The model's entry in `/v1/models`: OpenAI's fields, then the context a
/// request may fill (`context_length`, `--ctx`), the chat template's kind
/// (null without one) and llama.cpp's `meta` figures.
fn model(srv: &Server) -> serde_json::Value {
    json!({
        "id": srv.model_id,
        "object": "model",
        "created": srv.created,
        "owned_by": "krafla",
        "context_length": srv.ctx,
        "chat_template": srv.template.map(Template::name),
        "meta": {"n_ctx_train": srv.trained_ctx, "n_ctx": srv.ctx, "n_vocab": srv.tokenizer.vocab_size()},
    })
}

/// llama-server's `GET /props`: the chat template (the Jinja source chats
/// are rendered with; null with a built-in one, whose kind
/// `chat_template_kind` names), the BOS and EOS tokens' text, the context.
fn props(srv: &Server) -> serde_json::Value {
    let tok = &srv.tokenizer;
    json!({
        "chat_template": srv.jinja.as_ref().map(|j| j.source()),
        "chat_template_kind": srv.template.map(Template::name),
        "bos_token": tok.token_text(tok.bos_id()),
        "eos_token": tok.token_text(tok.eos_id()),
        "add_bos_token": tok.adds_bos(),
        "default_generation_settings": {"n_ctx": srv.ctx},
        "build_info": srv.fingerprint,
    })
}

/// A JSON answer (200), or the error.
fn json_answer(result: Result<serde_json::Value, ApiError>) -> Answer {
    match result {
        Ok(body) => Answer::Send(Response::json(200, &body)),
        Err(e) => Answer::Fail(e),
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
        assert!(check(&["--max-queue", "4096"]).is_ok());
        // the largest queue a usize holds on this platform (u64::MAX on
        // 64-bit, u32::MAX on 32-bit) parses, and is refused by the check
        let huge_queue = usize::MAX.to_string();
        let refused = [
            ("--max-body", "0"),
            ("--read-timeout", "0"),
            ("--read-timeout", "18446744073709551615"),
            ("--max-queue", "4097"),
            ("--max-queue", huge_queue.as_str()),
        ];
        for (opt, v) in refused {
            let e = check(&[opt, v]).unwrap_err();
            assert!(e.starts_with(opt) && !e.contains('\n'), "{e}");
        }
    }

    /// A number no usize holds (2^64, on every platform) is clap's parse
    /// error, given as one line that names the option.
    #[test]
    fn limits_that_do_not_fit_are_one_line_errors() {
        let argv = ["ml_server", "m.mlb", "-z", "t.mlt", "--max-queue", "18446744073709551616"];
        let e = crate::app::parse_args::<super::ServerArgs>(argv.iter().map(Into::into).collect()).unwrap_err();
        assert!(e.contains("--max-queue") && e.contains("18446744073709551616") && !e.contains('\n'), "{e}");
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
