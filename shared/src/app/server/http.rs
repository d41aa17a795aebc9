//! HTTP/1.1 over `std::net`: one request per connection (`Connection:
//! close`), request heads parsed by `httparse`, bodies framed by
//! Content-Length only, every read under a deadline, and streamed answers in
//! chunked transfer encoding.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

/// Largest request head (request line and headers).
const MAX_HEAD: usize = 32 * 1024;
const MAX_HEADERS: usize = 64;

#[derive(Clone, Copy)]
pub struct Limits {
    pub max_body: usize,
    /// Deadline for receiving the whole request, and timeout of each write.
    pub timeout: Duration,
}

pub struct Request {
    pub method: String,
    /// The path without the query string.
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub http10: bool,
}

impl Request {
    /// The first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// Why no request could be read.
pub enum ReadError {
    /// The client closed the connection or sent nothing before the deadline: just hang up.
    Gone,
    /// Answer with this status, error code and message, then hang up.
    Reply(u16, &'static str, String),
}

fn reply(status: u16, code: &'static str, msg: impl Into<String>) -> ReadError {
    ReadError::Reply(status, code, msg.into())
}

/// The request head at the start of `buf`, with its length in bytes, or
/// None while it is incomplete.
fn parse_head(buf: &[u8]) -> Result<Option<(usize, Request)>, ReadError> {
    let mut hdrs = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut hdrs);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => {
            let headers = req
                .headers
                .iter()
                .map(|h| (h.name.to_string(), String::from_utf8_lossy(h.value).trim().to_string()))
                .collect::<Vec<_>>();
            let target = req.path.unwrap_or("/");
            let path = target.split(['?', '#']).next().unwrap_or("/").to_string();
            let method = req.method.unwrap_or("").to_string();
            Ok(Some((n, Request { method, path, headers, body: Vec::new(), http10: req.version == Some(0) })))
        }
        Ok(httparse::Status::Partial) => Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            Err(reply(431, "headers_too_large", format!("more than {MAX_HEADERS} request headers")))
        }
        Err(e) => Err(reply(400, "bad_request", format!("malformed HTTP request: {e}"))),
    }
}

/// The length of the body a request head announces: Content-Length only
/// (no Transfer-Encoding), repeated headers agreeing, at most `max_body`.
fn body_length(req: &Request, max_body: usize) -> Result<usize, ReadError> {
    if req.header("transfer-encoding").is_some() {
        return Err(reply(411, "length_required", "chunked request bodies are not supported: send a Content-Length"));
    }
    let mut length: Option<usize> = None;
    for (k, v) in &req.headers {
        if k.eq_ignore_ascii_case("content-length") {
            let n: usize = match v.parse() {
                Ok(n) if v.bytes().all(|b| b.is_ascii_digit()) => n,
                _ => return Err(reply(400, "bad_request", format!("invalid Content-Length '{v}'"))),
            };
            if length.is_some_and(|l| l != n) {
                return Err(reply(400, "bad_request", "conflicting Content-Length headers"));
            }
            length = Some(n);
        }
    }
    let length = length.unwrap_or(0);
    if length > max_body {
        return Err(reply(
            413,
            "request_too_large",
            format!("the request body has {length} bytes, more than the limit of {max_body} (--max-body)"),
        ));
    }
    Ok(length)
}

/// The request in `buf` when the client sent exactly these bytes and then
/// closed its end: the same head parse, framing and limits as
/// `read_request`, without a socket (hostile-input tests, the fuzz target).
pub fn parse_request(buf: &[u8], max_body: usize) -> Result<Request, ReadError> {
    let (head_len, mut req) = match parse_head(buf)? {
        Some(head) => head,
        None if buf.len() >= MAX_HEAD => {
            return Err(reply(431, "headers_too_large", format!("the request head exceeds {MAX_HEAD} bytes")))
        }
        None if buf.is_empty() => return Err(ReadError::Gone),
        None => return Err(reply(400, "bad_request", "the connection closed inside the request head")),
    };
    let length = body_length(&req, max_body)?;
    let body = &buf[head_len..];
    if body.len() < length {
        return Err(reply(400, "bad_request", "the connection closed inside the request body"));
    }
    req.body = body[..length].to_vec();
    Ok(req)
}

/// Reads one request, within `limits.timeout` in total.
pub fn read_request(stream: &mut TcpStream, limits: &Limits) -> Result<Request, ReadError> {
    let deadline = Instant::now() + limits.timeout;
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    let (head_len, mut req) = loop {
        if let Some(head) = parse_head(&buf)? {
            break head;
        }
        if buf.len() >= MAX_HEAD {
            return Err(reply(431, "headers_too_large", format!("the request head exceeds {MAX_HEAD} bytes")));
        }
        match read_some(stream, &mut chunk, deadline) {
            Ok(0) if buf.is_empty() => return Err(ReadError::Gone),
            Ok(0) => return Err(reply(400, "bad_request", "the connection closed inside the request head")),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if is_timeout(&e) && buf.is_empty() => return Err(ReadError::Gone),
            Err(e) if is_timeout(&e) => return Err(reply(408, "request_timeout", "timed out reading the request")),
            Err(_) => return Err(ReadError::Gone),
        }
    };
    let length = body_length(&req, limits.max_body)?;
    if req.header("expect").is_some_and(|v| v.eq_ignore_ascii_case("100-continue")) && buf.len() - head_len < length {
        let _ = stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
    }
    let mut body = buf.split_off(head_len);
    body.truncate(length);
    while body.len() < length {
        let want = (length - body.len()).min(chunk.len());
        match read_some(stream, &mut chunk[..want], deadline) {
            Ok(0) => return Err(reply(400, "bad_request", "the connection closed inside the request body")),
            Ok(n) => body.extend_from_slice(&chunk[..n]),
            Err(e) if is_timeout(&e) => {
                return Err(reply(408, "request_timeout", "timed out reading the request body"))
            }
            Err(_) => return Err(ReadError::Gone),
        }
    }
    req.body = body;
    Ok(req)
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// One read that gives up at `deadline`.
fn read_some(stream: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> std::io::Result<usize> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ErrorKind::TimedOut.into());
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(buf) {
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

/// True when the client has closed its end (or the socket failed). Never blocks.
pub fn peer_closed(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let mut b = [0u8; 1];
    let closed = match stream.peek(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted),
    };
    let _ = stream.set_nonblocking(false);
    closed
}

/// After an early answer (e.g. 413): stop writing, swallow what the client is
/// still sending for a moment, so closing does not reset the connection
/// before the client has read the answer.
pub fn drain_and_close(mut stream: TcpStream) {
    let _ = stream.shutdown(Shutdown::Write);
    let deadline = Instant::now() + Duration::from_millis(500);
    let mut buf = [0u8; 16384];
    let mut total = 0usize;
    while total < 64 << 20 {
        match read_some(&mut stream, &mut buf, deadline) {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n,
        }
    }
}

pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// A complete (not streamed) answer.
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn json(status: u16, value: &serde_json::Value) -> Response {
        Response { status, content_type: "application/json", headers: Vec::new(), body: value.to_string().into_bytes() }
    }
}

fn head(status: u16, content_type: &str, headers: &[(String, String)], framing: &str) -> Vec<u8> {
    let mut h = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    if !content_type.is_empty() {
        h += &format!("Content-Type: {content_type}\r\n");
    }
    for (k, v) in headers {
        h += &format!("{k}: {v}\r\n");
    }
    h += framing;
    h += "Connection: close\r\n\r\n";
    h.into_bytes()
}

/// Sends `resp`; without `with_body` (a HEAD request) only its head, the
/// Content-Length still that of the body.
pub fn write_response(
    stream: &mut TcpStream,
    resp: &Response,
    common: &[(String, String)],
    with_body: bool,
) -> std::io::Result<()> {
    let mut headers = common.to_vec();
    headers.extend(resp.headers.iter().cloned());
    let mut out = head(resp.status, resp.content_type, &headers, &format!("Content-Length: {}\r\n", resp.body.len()));
    if with_body {
        out.extend_from_slice(&resp.body);
    }
    stream.write_all(&out)?;
    stream.flush()
}

/// A streamed answer: chunked for HTTP/1.1 clients, close-delimited for HTTP/1.0.
pub struct StreamWriter {
    stream: TcpStream,
    chunked: bool,
}

impl StreamWriter {
    /// Sends the head of the answer; the writer keeps its own handle of the socket.
    pub fn start(
        stream: &TcpStream,
        content_type: &str,
        common: &[(String, String)],
        http10: bool,
    ) -> std::io::Result<StreamWriter> {
        let mut stream = stream.try_clone()?;
        let mut headers = common.to_vec();
        headers.push(("Cache-Control".into(), "no-cache".into()));
        headers.push(("X-Accel-Buffering".into(), "no".into()));
        let framing = if http10 { "" } else { "Transfer-Encoding: chunked\r\n" };
        stream.write_all(&head(200, content_type, &headers, framing))?;
        stream.flush()?;
        Ok(StreamWriter { stream, chunked: !http10 })
    }

    pub fn send(&mut self, data: &[u8]) -> std::io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        if self.chunked {
            let mut out = format!("{:x}\r\n", data.len()).into_bytes();
            out.extend_from_slice(data);
            out.extend_from_slice(b"\r\n");
            self.stream.write_all(&out)?;
        } else {
            self.stream.write_all(data)?;
        }
        self.stream.flush()
    }

    pub fn end(mut self) -> std::io::Result<()> {
        if self.chunked {
            self.stream.write_all(b"0\r\n\r\n")?;
        }
        self.stream.flush()
    }

    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(r: Result<Request, ReadError>) -> u16 {
        match r {
            Ok(_) => 200,
            Err(ReadError::Gone) => 0,
            Err(ReadError::Reply(s, _, _)) => s,
        }
    }

    #[test]
    fn parse_request_frames_the_body_by_content_length() {
        let r = parse_request(b"POST /v1/completions?x=1 HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}extra", 10);
        let Ok(r) = r else { panic!("not parsed") };
        assert_eq!(
            (r.method.as_str(), r.path.as_str(), &r.body[..], r.http10),
            ("POST", "/v1/completions", &b"{}"[..], false)
        );
        assert_eq!(r.header("CONTENT-length"), Some("2"));
    }

    #[test]
    fn parse_request_answers_what_read_request_answers() {
        assert_eq!(status(parse_request(b"", 10)), 0);
        assert_eq!(status(parse_request(b"GET / HTTP/1.1\r\n", 10)), 400);
        assert_eq!(status(parse_request(b"GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab", 10)), 400);
        assert_eq!(status(parse_request(b"GET / HTTP/1.1\r\nContent-Length: 11\r\n\r\n", 10)), 413);
        assert_eq!(status(parse_request(b"GET / HTTP/1.1\r\nContent-Length: +1\r\n\r\n", 10)), 400);
        let conflicting = b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab";
        assert_eq!(status(parse_request(conflicting, 10)), 400);
        let chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n";
        assert_eq!(status(parse_request(chunked, 10)), 411);
        let mut flood = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..=MAX_HEADERS {
            flood.extend(format!("X-{i}: 1\r\n").bytes());
        }
        assert_eq!(status(parse_request(&flood, 10)), 431);
        let mut long = b"GET / HTTP/1.1\r\nX: ".to_vec();
        long.resize(MAX_HEAD, b'a');
        assert_eq!(status(parse_request(&long, 10)), 431);
        assert_eq!(status(parse_request(b"GET / HTTP/1.0\r\n\r\n", 0)), 200);
    }
}
