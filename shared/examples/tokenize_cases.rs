//! Test support for tests/test_tokenizer.py: run many encode/decode cases in one process.
//!
//! Usage: `tokenize_cases <tokenizer.mlt> <cases.txt>`
//!
//! Each input line is one case (hex avoids any escaping or JSON parsing):
//! * `E <0|1> <hex of UTF-8 text>` — encode with add_special = 0/1;
//! * `P <0|1> <hex of UTF-8 text>` — encode as plain text (special tokens in it are text);
//! * `D <comma-separated ids>` — decode those ids.
//!
//! Each case prints one JSON line: `{"ids":[..],"decoded":"<hex>","streamed":"<hex>"}`
//! where `decoded` is `decode(ids)` and `streamed` the concatenated `decode_piece` output.

use krafla::tokenizer::Tokenizer;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

fn hex_decode(s: &str) -> Result<Vec<u8>, String> {
    if s.len() % 2 == 1 {
        return Err(format!("odd-length hex {s:?}"));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|e| format!("bad hex {s:?}: {e}")))
        .collect()
}

fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn parse_ids(s: &str) -> Result<Vec<u32>, String> {
    s.split(',').filter(|p| !p.is_empty()).map(|p| p.parse::<u32>().map_err(|e| format!("bad id {p:?}: {e}"))).collect()
}

fn streamed(tok: &Tokenizer, ids: &[u32]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut prev = None;
    for &id in ids {
        out.extend(tok.decode_piece(prev, id));
        prev = Some(id);
    }
    out
}

/// Run one case line and return its JSON output line.
fn run_case(tok: &Tokenizer, line: &str) -> Result<String, String> {
    let mut parts = line.splitn(3, ' ');
    let ids = match (parts.next(), parts.next(), parts.next()) {
        (Some(mode @ ("E" | "P")), Some(flag), text) => {
            let text = String::from_utf8(hex_decode(text.unwrap_or(""))?)
                .map_err(|e| format!("case text is not UTF-8: {e}"))?;
            match mode {
                "E" => tok.encode(&text, flag == "1"),
                _ => tok.encode_plain(&text, flag == "1"),
            }
        }
        (Some("D"), ids, None) => parse_ids(ids.unwrap_or(""))?,
        _ => return Err(format!("bad case line {line:?}")),
    };
    let list: Vec<String> = ids.iter().map(u32::to_string).collect();
    Ok(format!(
        "{{\"ids\":[{}],\"decoded\":\"{}\",\"streamed\":\"{}\"}}",
        list.join(","),
        hex_encode(&tok.decode(&ids)),
        hex_encode(&streamed(tok, &ids))
    ))
}

fn run(args: &[String]) -> Result<(), String> {
    let [_, mlt, cases] = args else {
        return Err("usage: tokenize_cases <tokenizer.mlt> <cases.txt>".into());
    };
    let tok = Tokenizer::load(Path::new(mlt))?;
    let text = std::fs::read_to_string(cases).map_err(|e| format!("{cases}: {e}"))?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    for line in text.lines().filter(|l| !l.is_empty()) {
        writeln!(out, "{}", run_case(&tok, line)?).map_err(|e| e.to_string())?;
    }
    out.flush().map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tokenize_cases: {e}");
            ExitCode::FAILURE
        }
    }
}
