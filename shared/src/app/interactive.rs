//! `ml_run MODEL` on a terminal: a chat. Each line typed is a user turn in
//! the model's template; the answer streams as it is generated; the
//! conversation stays in the KV cache, so a turn evaluates only its own
//! tokens (the text the template adds between the last answer and the new
//! turn's assistant header, appended to the exact ids already cached).
//!
//! Input comes through a line editor (rustyline) that reads the terminal in
//! raw mode, so a line of any length arrives whole (a cooked read cuts it at
//! 4095 bytes), and takes a bracketed paste as text, so pasted lines are one
//! turn with their newlines; a line ending in `\` goes on at the `. `
//! prompt; Up and Down recall the session's lines. Between reads the
//! terminal is back in its own mode, so Ctrl-C is a signal again.
//!
//! Commands: `/clear` starts a new conversation, `/exit` (or Ctrl-D) leaves.
//! Ctrl-C stops the answer being generated; at the prompt it leaves (exit
//! status 130). When the context is full the chat says so and `/clear`
//! starts over: no turn is dropped silently.

use super::answer_text::AnswerText;
use super::stdout;
use std::cell::RefCell;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use rustyline::error::ReadlineError;
use rustyline::history::DefaultHistory;
use rustyline::{Config, Editor};

use crate::chat::reasoning::Reasoning;
use crate::chat::{drop_oldest_turn, ChatFormat, Message, Role};
use crate::generate::{DecodeParams, Decoded, Finish, Generator, SpecStats, Speculator, Token};
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
    template: ChatFormat,
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
    let mut input = line_editor()?;
    loop {
        let Some(line) = read_turn(&mut input)? else {
            // the editor has ended the prompt's line
            return Ok(());
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
        // When the conversation and room for an answer do not fit, the oldest
        // turns go (the system prompt stays), and the rest is evaluated again.
        let mut dropped = 0;
        let (mut full, mut ids) = loop {
            let full = template.format(system, &conv.messages, &[], &Default::default())?;
            // (what the user typed is plain text: a `<|im_start|>` in it is not a control token)
            let ids = match full.as_str().starts_with(conv.text.as_str()) {
                true if !conv.ids.is_empty() => {
                    let mut ids = conv.ids.clone();
                    ids.extend(full.after(conv.text.len()).encode(tokenizer, false));
                    ids
                }
                _ => full.encode(tokenizer, true),
            };
            if ids.len() + answer_room(ctx) <= ctx || !drop_oldest_turn(&mut conv.messages) {
                break (full, ids);
            }
            dropped += 1;
        };
        if dropped > 0 {
            eprintln!("{}(the context is full: the {dropped} oldest turns were dropped){}", style.dim, style.reset);
        }
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
        let new = ids.len() - cached;

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
        let mut answer = AnswerText::new(Some(Reasoning::for_prompt(Some(template.kind), full.as_str())));
        // the answer as the model wrote it (a harmony answer's channels included)
        let mut raw = String::new();
        let mut write_error = None;
        let t1 = Instant::now();
        let before = speculator.as_ref().map(|s| s.stats);
        // The answer's tokens before the last context shift (they are in `ids` since).
        let mut earlier = 0;
        let mut logits = logits;
        let done = loop {
            let room = ctx - generator.state().pos;
            params.max_tokens = max_tokens.map_or(room, |n| n.saturating_sub(earlier).min(room));
            let done =
                generator.decode(logits, &ids, &params, Some(tokenizer), speculator.as_mut(), &mut |t: Token| {
                    raw.push_str(t.text);
                    if let Err(e) = answer.show(t.text) {
                        write_error = Some(e);
                        return false;
                    }
                    !STOP.load(Ordering::SeqCst)
                });
            let done = match done {
                Ok(d) => d,
                Err(e) => {
                    ANSWERING.store(false, Ordering::SeqCst);
                    return Err(e);
                }
            };
            // The answer filled the context: the oldest turns go, and it goes on
            // after the conversation that is left and what it has said so far.
            let full_context = done.finish == Finish::Length && generator.state().pos + 1 >= ctx;
            let more = max_tokens.is_none_or(|n| earlier + done.tokens.len() < n);
            if !(full_context && more && !done.grammar_cut && write_error.is_none()) {
                break done;
            }
            let mut so_far: Vec<u32> = ids[ids.len() - earlier..].to_vec();
            so_far.extend(&done.tokens);
            let mut shifted = 0;
            let refit = loop {
                if !drop_oldest_turn(&mut conv.messages) {
                    break None;
                }
                shifted += 1;
                let f = template.format(system, &conv.messages, &[], &Default::default())?;
                let mut new_ids = f.encode(tokenizer, true);
                new_ids.extend(&so_far);
                if new_ids.len() + answer_room(ctx) <= ctx {
                    break Some((f, new_ids));
                }
            };
            let Some((f, new_ids)) = refit else { break done };
            raw.push_str(&done.tail);
            answer.show(&done.tail)?;
            (full, ids, earlier) = (f, new_ids, so_far.len());
            eprint!("{}[the context is full: the {shifted} oldest turns were dropped]{}", style.dim, style.reset);
            let cached = generator.reuse_prefix(&ids);
            match generator.prefill(&ids[cached..], LogitsFor::Last, &|| STOP.load(Ordering::SeqCst))? {
                Some(l) => logits = l,
                None => {
                    break Decoded {
                        finish: Finish::Cancelled,
                        tokens: Vec::new(),
                        tail: String::new(),
                        grammar_cut: false,
                    }
                }
            }
            if let Some(s) = &mut speculator {
                s.prepare(&ids)?;
            }
        };
        ANSWERING.store(false, Ordering::SeqCst);
        if let Some(e) = write_error {
            return Err(e);
        }
        let gen_secs = t1.elapsed().as_secs_f64();
        raw.push_str(&done.tail);
        answer.show(&done.tail)?;
        answer.finish()?;
        stdout::line("")?;

        conv.ids = ids;
        conv.ids.extend(&done.tokens);
        conv.text = full.as_str().to_string() + &raw;
        conv.messages.push(Message::new(Role::Assistant, answer.content));
        let note = match done.finish {
            _ if done.grammar_cut => " (the grammar is too ambiguous to follow further: the answer is incomplete)",
            Finish::Cancelled => " (stopped)",
            Finish::Length if generator.state().pos + 1 >= ctx => {
                " (the context is full: /clear starts a new conversation)"
            }
            Finish::Length => " (the answer reached -n)",
            Finish::Stop => "",
        };
        // the turn's own prompt and its whole answer (over any context shifts)
        let answer_tokens = earlier + done.tokens.len();
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
            answer_tokens,
            answer_tokens as f64 / gen_secs.max(1e-9),
            style.reset
        );
    }
}

/// The tokens kept free for an answer when the oldest turns are dropped to
/// make room: a quarter of the context, at most 1024.
fn answer_room(ctx: usize) -> usize {
    (ctx / 4).clamp(1, 1024)
}

/// The terminal's line editor: rustyline on stdin and stdout (raw mode only
/// while it reads a line), its history the session's lines, in memory only.
type LineEditor = Editor<LineKeeper, DefaultHistory>;

fn line_editor() -> Result<LineEditor, String> {
    let config = Config::builder().auto_add_history(true).build();
    let mut editor = LineEditor::with_config(config).map_err(|e| format!("cannot use the terminal: {e}"))?;
    editor.set_helper(Some(LineKeeper::default()));
    Ok(editor)
}

/// The line being edited, copied at each change (rustyline asks its helper
/// for a hint after each change, with the line). When the terminal sends
/// bytes that are not UTF-8, rustyline's read fails and drops the line (and
/// the byte after an unfinished sequence, and the rest of that read); the
/// copy lets the next read start where the line was.
#[derive(Default)]
struct LineKeeper {
    line: RefCell<String>,
}

impl rustyline::hint::Hinter for LineKeeper {
    type Hint = String;

    fn hint(&self, line: &str, _pos: usize, _ctx: &rustyline::Context<'_>) -> Option<String> {
        let mut kept = self.line.borrow_mut();
        kept.clear();
        kept.push_str(line);
        None
    }
}

impl rustyline::completion::Completer for LineKeeper {
    type Candidate = String;
}
impl rustyline::highlight::Highlighter for LineKeeper {}
impl rustyline::validate::Validator for LineKeeper {}
impl rustyline::Helper for LineKeeper {}

/// One user turn: a line, or lines joined while each ends in `\`. A
/// bracketed paste is one line, its newlines kept. None at the end of the
/// input.
fn read_turn(input: &mut LineEditor) -> Result<Option<String>, String> {
    let mut turn = String::new();
    loop {
        let Some(line) = read_line(input, if turn.is_empty() { "> " } else { ". " })? else {
            return Ok((!turn.is_empty()).then_some(turn));
        };
        match line.strip_suffix('\\') {
            Some(part) => {
                turn.push_str(part);
                turn.push('\n');
            }
            None => {
                turn.push_str(&line);
                return Ok(Some(turn));
            }
        }
    }
}

/// One line from the editor after `prompt`. None at the end of the input
/// (Ctrl-D on an empty line). Ctrl-C leaves with exit status 130: in raw
/// mode it is a key, not the signal the Ctrl-C handler catches.
fn read_line(input: &mut LineEditor, prompt: &str) -> Result<Option<String>, String> {
    let mut resumed = String::new();
    loop {
        let read = if resumed.is_empty() {
            input.readline(prompt)
        } else {
            input.readline_with_initial(prompt, (&resumed, ""))
        };
        match read {
            Ok(line) => return Ok(Some(line)),
            Err(ReadlineError::Eof) => return Ok(None),
            Err(ReadlineError::Interrupted) => std::process::exit(130),
            // bytes that are not UTF-8 (a terminal in another encoding)
            // become U+FFFD rather than ending the conversation: the line
            // goes on from the copy the helper kept
            Err(ReadlineError::Io(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
                resumed = input.helper().map(|keeper| keeper.line.take()).unwrap_or_default();
                resumed.push(char::REPLACEMENT_CHARACTER);
            }
            Err(e) => return Err(format!("cannot read the terminal: {e}")),
        }
    }
}
