//! How the command line shows an answer as it streams: its text on stdout,
//! and, for a template whose answers carry reasoning apart (harmony:
//! gpt-oss's analysis channel), the reasoning on stderr, dimmed on a
//! terminal, so that stdout holds the answer alone.

use std::io::{IsTerminal, Write};

use super::stdout;
use crate::chat::harmony::{Channels, Split};
use crate::chat::Template;

pub struct AnswerText {
    channels: Option<Channels>,
    /// The escape codes around reasoning (empty unless stderr is a terminal).
    dim: (&'static str, &'static str),
    /// The answer's text shown so far (its content, without the reasoning).
    pub content: String,
}

impl AnswerText {
    pub fn new(template: Option<Template>) -> AnswerText {
        let terminal = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        AnswerText {
            channels: (template == Some(Template::Harmony)).then(Channels::new),
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
        match self.channels.as_mut().map(Channels::finish) {
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
