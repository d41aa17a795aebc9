//! How the command line shows an answer as it streams: its text on stdout,
//! and, in a chat, its reasoning (gpt-oss's analysis channel, a `<think>`
//! block) on stderr, dimmed on a terminal, so that stdout holds the answer
//! alone.

use std::io::{IsTerminal, Write};

use super::stdout;
use crate::chat::harmony::Split;
use crate::chat::reasoning::Reasoning;

pub struct AnswerText {
    channels: Option<Reasoning>,
    /// The escape codes around reasoning (empty unless stderr is a terminal).
    dim: (&'static str, &'static str),
    /// The answer's text shown so far (its content, without the reasoning).
    pub content: String,
}

impl AnswerText {
    /// `reasoning`: how a chat answer's reasoning is told apart (None: a raw prompt's text).
    pub fn new(reasoning: Option<Reasoning>) -> AnswerText {
        let terminal = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        AnswerText {
            channels: reasoning,
            dim: if terminal { ("\x1b[2m", "\x1b[0m") } else { ("", "") },
            content: String::new(),
        }
    }

    /// The next piece of the answer's text.
    pub fn show(&mut self, text: &str) -> Result<(), String> {
        let split = match &mut self.channels {
            Some(c) => c.push(text),
            None => Split { reasoning: String::new(), content: text.to_string() },
        };
        self.write(split)
    }

    /// The end of the answer: what was held back.
    pub fn finish(&mut self) -> Result<(), String> {
        match self.channels.as_mut().map(Reasoning::finish) {
            Some(split) => self.write(split),
            None => Ok(()),
        }
    }

    fn write(&mut self, split: Split) -> Result<(), String> {
        if !split.reasoning.is_empty() {
            // a closed stderr loses only the reasoning
            let _ = write!(std::io::stderr(), "{}{}{}", self.dim.0, split.reasoning, self.dim.1);
        }
        if !split.content.is_empty() {
            self.content.push_str(&split.content);
            stdout::write(split.content.as_bytes())?;
        }
        Ok(())
    }
}
