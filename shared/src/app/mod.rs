//! The applications every Krafla executable holds, above the library: the
//! command line (`cli`: generation and the test interfaces), its measurement
//! modes (`measure`: `--bench`, `--perplexity`) and the OpenAI-compatible
//! server (`server`, `ml_run --server` / `ml_server`). `options` holds what
//! they share. Nothing below `app` prints or exits.

use std::io::Write;

mod answer_text;
pub mod cli;
pub mod interactive;
pub mod measure;
pub mod options;
pub mod server;
pub mod speculative_options;
pub mod stdout;
mod value_enums;

/// Entry point of every executable; returns the process exit code (`Fault::exit_code`).
pub fn main() -> i32 {
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // `ml_run --server ...` (and the `ml_server` launcher name) runs the HTTP server.
    let result = if argv.get(1).is_some_and(|a| a == "--server") {
        argv.remove(1);
        server::main(argv)
    } else {
        cli::main(argv)
    };
    match result {
        Ok(()) => 0,
        Err(fault) => {
            // not eprintln!, which panics when stderr is closed too
            let _ = writeln!(std::io::stderr(), "krafla: {}", escape_line(fault.message()));
            fault.exit_code()
        }
    }
}

/// The most bytes of a `--json-schema` or `--grammar` file (the server's
/// request bodies are 1 MiB by default).
pub const MAX_GRAMMAR_FILE: u64 = 16 << 20;
/// The most bytes of a prompt (`-f`, stdin) or an `--imatrix` file: far
/// beyond any context, far below what would exhaust memory.
pub const MAX_PROMPT_FILE: u64 = 64 << 20;
/// The most bytes of a `--perplexity` text.
pub const MAX_TEXT_FILE: u64 = 1 << 30;

/// Reads at most `limit` bytes from `input` (a file, a device such as
/// /dev/zero, or stdin); more is an error naming `what`, so that no input
/// can make the program read until memory runs out.
pub(crate) fn read_capped(input: impl std::io::Read, limit: u64, what: &str) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    input.take(limit + 1).read_to_end(&mut bytes).map_err(|e| format!("cannot read {what}: {e}"))?;
    if bytes.len() as u64 > limit {
        return Err(format!("{what} is larger than {} MiB", limit >> 20));
    }
    Ok(bytes)
}

/// The file at `path` as text (`read_capped`); errors name the file.
pub(crate) fn read_text_file(path: &std::path::Path, limit: u64, what: &str) -> Result<String, String> {
    let name = format!("{} ({what})", path.display());
    let file = std::fs::File::open(path).map_err(|e| format!("{name}: cannot read: {e}"))?;
    let bytes = read_capped(file, limit, &name)?;
    String::from_utf8(bytes).map_err(|e| format!("{name}: not UTF-8 text (at byte {})", e.utf8_error().valid_up_to()))
}

/// `text` made safe to print on one line of a terminal or a log: control
/// characters (C0, DEL, C1), line and paragraph separators and bidirectional
/// overrides, which a file or a request could use to fake log lines or drive
/// the terminal, become escapes (`\n`, `\u{1b}`); everything else is kept.
pub fn escape_line(text: &str) -> String {
    let unsafe_char = |c: char| {
        c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(unsafe_char) {
        return text.to_string();
    }
    text.chars().map(|c| if unsafe_char(c) { c.escape_default().to_string() } else { c.to_string() }).collect()
}

/// Parses the command line of `P`: Ok(None) after printing help or the
/// version, Err with one line for a bad command line.
pub(crate) fn parse_args<P: clap::Parser>(argv: Vec<std::ffi::OsString>) -> Result<Option<P>, String> {
    match P::try_parse_from(argv) {
        Ok(a) => Ok(Some(a)),
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            Ok(None)
        }
        Err(e) => Err(one_line(&e.to_string())),
    }
}

/// clap's error text as one line: its lines joined, the "error: " prefix and
/// the pointer to --help dropped.
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("For more information"))
        .map(|l| l.strip_prefix("error: ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn escape_line_keeps_text_on_one_line_without_control_characters() {
        let evil = "duplicate metadata key 'evil\x1b]0;PWNED\x07\nkrafla: fake line\0' \u{202e}txt 中文 é";
        let safe = super::escape_line(evil);
        assert_eq!(
            safe,
            "duplicate metadata key 'evil\\u{1b}]0;PWNED\\u{7}\\nkrafla: fake line\\u{0}' \\u{202e}txt 中文 é"
        );
        assert!(!safe.chars().any(char::is_control));
        assert_eq!(super::escape_line("plain text: 'ok'"), "plain text: 'ok'");
    }

    #[test]
    fn clap_errors_become_one_line() {
        let text = "error: invalid value 'nope' for '--chat <CHAT>'\n  [possible values: auto, chatml]\n\n\
                    For more information, try '--help'.\n";
        assert_eq!(super::one_line(text), "invalid value 'nope' for '--chat <CHAT>' [possible values: auto, chatml]");
    }
}
