//! `ml_run MODEL` on a terminal: a chat. Each line typed is a user turn in
//! the model's template; the answer streams as it is generated; the
//! conversation stays in the KV cache, so a turn evaluates only its own
//! tokens (the text the template adds between the last answer and the new
//! turn's assistant header, appended to the exact ids already cached).
//!
//! Commands: `/clear` starts a new conversation, `/exit` (or Ctrl-D) leaves.
//! Ctrl-C stops the answer being generated; at the prompt it leaves (exit
//! status 130). When the context is full the chat says so and `/clear`
//! starts over: no turn is dropped silently.

use super::stdout;
use std::io::{BufRead, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::chat::{Message, Role, Template};
use crate::generate::{DecodeParams, Finish, Generator, SpecStats, Speculator, Token};
use crate::model::LogitsFor;
use crate::tokenizer::Tokenizer;

/// Set by Ctrl-C while an answer is being made.
static STOP: AtomicBool = AtomicBool::new(false);
/// Whether an answer is being made (Ctrl-C stops it) or the chat waits for
/// input (Ctrl-C leaves).
static ANSWERING: AtomicBool = AtomicBool::new(false);

/// Text styles for the status lines: dim on a terminal, plain otherwise
/// (or with `NO_COLOR` set).
struct Style {
    dim: &'static str,
    reset: &'static str,
}

impl Style {
    fn for_stderr() -> Style {
        if std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none() {
            Style { dim: "\x1b[2m", reset: "\x1b[0m" }
        } else {
            Style { dim: "", reset: "" }
        }
    }
}

/// The conversation so far: its messages, and the ids and text the model
/// has seen (the ids of the last prompt and of the answer generated to it).
struct Conversation {
    messages: Vec<Message>,
    ids: Vec<u32>,
    text: String,
}

/// Runs the chat until `/exit`, Ctrl-D or Ctrl-C at the prompt.
/// `max_tokens`: the longest answer (None: until the answer ends or the
/// context is full).
pub fn run(
    mut generator: Generator,
    mut speculator: Option<Speculator>,
    tokenizer: &Tokenizer,
    template: Template,
    system: Option<&str>,
    mut params: DecodeParams,
    max_tokens: Option<usize>,
) -> Result<(), String> {
    ctrlc::set_handler(|| {
        if ANSWERING.load(Ordering::SeqCst) {
            STOP.store(true, Ordering::SeqCst);
        } else {
            let _ = writeln!(std::io::stdout());
            std::process::exit(130);
        }
    })
    .map_err(|e| format!("cannot catch Ctrl-C: {e}"))?;
    let style = Style::for_stderr();
    let ctx = generator.state().ctx;
    eprintln!(
        "{}krafla: chatting ({} template, context {ctx} tokens). /clear starts over, /exit or Ctrl-D leaves, \
         Ctrl-C stops an answer.{}",
        style.dim,
        template.name(),
        style.reset
    );
    let mut conv = Conversation { messages: Vec::new(), ids: Vec::new(), text: String::new() };
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    loop {
        let Some(line) = read_turn(&mut input)? else {
            return stdout::line("");
        };
        match line.trim() {
            "" => continue,
            "/exit" | "/quit" => return Ok(()),
            "/clear" => {
                generator.reset();
                conv = Conversation { messages: Vec::new(), ids: Vec::new(), text: String::new() };
                eprintln!("{}(a new conversation){}", style.dim, style.reset);
                continue;
            }
            cmd if cmd.starts_with('/') && !cmd.contains(char::is_whitespace) => {
                eprintln!("{}unknown command {cmd:?}: /clear, /exit{}", style.dim, style.reset);
                continue;
            }
            _ => {}
        }

        // The prompt: the conversation's ids so far and the text the template
        // adds after them, or (where the template writes an answer back
        // differently from how it was prompted) the whole conversation again.
        conv.messages.push(Message::new(Role::User, line.trim_end()));
        let full = template.format(system, &conv.messages)?;
        // (what the user typed is plain text: a `<|im_start|>` in it is not a control token)
        let ids = match full.as_str().starts_with(conv.text.as_str()) {
            true if !conv.ids.is_empty() => {
                let mut ids = conv.ids.clone();
                ids.extend(full.after(conv.text.len()).encode(tokenizer, false));
                ids
            }
            _ => full.encode(tokenizer, true),
        };
        if ids.len() >= ctx {
            conv.messages.pop();
            eprintln!(
                "{}the context is full ({} of {ctx} tokens would be needed): /clear starts a new conversation{}",
                style.dim,
                ids.len(),
                style.reset
            );
            continue;
        }
        let cached = generator.reuse_prefix(&ids);

        STOP.store(false, Ordering::SeqCst);
        ANSWERING.store(true, Ordering::SeqCst);
        let t0 = Instant::now();
        let logits = generator.prefill(&ids[cached..], LogitsFor::Last, &|| STOP.load(Ordering::SeqCst))?;
        if let (Some(s), Some(_)) = (&mut speculator, &logits) {
            s.prepare(&ids)?;
        }
        let prompt_secs = t0.elapsed().as_secs_f64();
        let Some(logits) = logits else {
            ANSWERING.store(false, Ordering::SeqCst);
            conv.messages.pop();
            // the cache holds part of this prompt: tokenize the whole text next time
            (conv.ids, conv.text) = (Vec::new(), String::new());
            eprintln!("{}[stopped]{}", style.dim, style.reset);
            continue;
        };
        let room = ctx - generator.state().pos;
        params.max_tokens = max_tokens.map_or(room, |n| n.min(room));
        let mut answer = String::new();
        let mut write_error = None;
        let t1 = Instant::now();
        let before = speculator.as_ref().map(|s| s.stats);
        let done = generator.decode(logits, &ids, &params, Some(tokenizer), speculator.as_mut(), &mut |t: Token| {
            if !t.text.is_empty() {
                answer.push_str(t.text);
                if let Err(e) = stdout::write(t.text.as_bytes()) {
                    write_error = Some(e);
                    return false;
                }
            }
            !STOP.load(Ordering::SeqCst)
        });
        ANSWERING.store(false, Ordering::SeqCst);
        let done = done?;
        if let Some(e) = write_error {
            return Err(e);
        }
        let gen_secs = t1.elapsed().as_secs_f64();
        answer.push_str(&done.tail);
        stdout::line(&done.tail)?;

        conv.ids = ids;
        conv.ids.extend(&done.tokens);
        conv.text = full.as_str().to_string() + &answer;
        conv.messages.push(Message::new(Role::Assistant, answer));
        let note = match done.finish {
            Finish::Cancelled => " (stopped)",
            Finish::Length if generator.state().pos + 1 >= ctx => {
                " (the context is full: /clear starts a new conversation)"
            }
            Finish::Length => " (the answer reached -n)",
            Finish::Stop => "",
        };
        let new = conv.ids.len() - done.tokens.len() - cached;
        let spec = match (&speculator, before) {
            (Some(s), Some(b)) => {
                let turn = SpecStats {
                    drafted: s.stats.drafted - b.drafted,
                    accepted: s.stats.accepted - b.accepted,
                    passes: s.stats.passes - b.passes,
                };
                format!("; speculative: {}", turn.summary())
            }
            _ => String::new(),
        };
        eprintln!(
            "{}[prompt {new} tokens ({cached} cached), {:.1} tokens/s; answer {} tokens, {:.1} tokens/s{spec}]{note}{}",
            style.dim,
            new as f64 / prompt_secs.max(1e-9),
            done.tokens.len(),
            done.tokens.len() as f64 / gen_secs.max(1e-9),
            style.reset
        );
    }
}

/// One user turn: a line, or lines joined while each ends in `\`. None at
/// the end of the input.
fn read_turn(input: &mut impl BufRead) -> Result<Option<String>, String> {
    let mut turn = String::new();
    loop {
        stdout::write(if turn.is_empty() { b"> " } else { b". " })?;
        // bytes that are not UTF-8 (a terminal in another encoding) become
        // U+FFFD rather than ending the conversation
        let mut bytes = Vec::new();
        let n = input.read_until(b'\n', &mut bytes).map_err(|e| format!("cannot read the terminal: {e}"))?;
        if n == 0 {
            return Ok((!turn.is_empty()).then_some(turn));
        }
        let line = String::from_utf8_lossy(&bytes);
        let line = line.trim_end_matches(['\n', '\r']);
        match line.strip_suffix('\\') {
            Some(part) => {
                turn.push_str(part);
                turn.push('\n');
            }
            None => {
                turn.push_str(line);
                return Ok(Some(turn));
            }
        }
    }
}
