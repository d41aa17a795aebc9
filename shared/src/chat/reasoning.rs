//! An answer's reasoning apart from what it says, as the answer streams:
//! gpt-oss's analysis channel (`harmony::Channels`), or the `<think>…</think>`
//! block that Qwen3, QwQ, DeepSeek-R1 and SmolLM3 write first (`ThinkTags`;
//! where the template opened the block itself, the answer starts inside it).
//! Text that might be the start of a tag is held until the next piece shows
//! what it is.

use super::harmony::{Channels, Split};
use super::partial_suffix;
use super::Template;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// How an answer's reasoning is told from its content.
#[derive(Debug)]
pub enum Reasoning {
    Harmony(Channels),
    Think(ThinkTags),
}

impl Reasoning {
    /// The splitter for answers to `prompt` under `template`.
    pub fn for_prompt(template: Option<Template>, prompt: &str) -> Reasoning {
        match template {
            Some(Template::Harmony) => Reasoning::Harmony(Channels::new()),
            _ => Reasoning::Think(ThinkTags::new(opens_thinking(prompt))),
        }
    }

    /// The next piece of the answer: what of it (and of what was held) can be shown.
    pub fn push(&mut self, text: &str) -> Split {
        match self {
            Reasoning::Harmony(c) => c.push(text),
            Reasoning::Think(t) => t.push(text),
        }
    }

    /// The end of the answer: what was held back.
    pub fn finish(&mut self) -> Split {
        match self {
            Reasoning::Harmony(c) => c.finish(),
            Reasoning::Think(t) => t.finish(),
        }
    }
}

/// Whether the prompt ends inside a `<think>` block the template opened.
pub fn opens_thinking(prompt: &str) -> bool {
    prompt.trim_end().ends_with(OPEN)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Before anything but whitespace: a `<think>` here opens the block.
    Start,
    /// Just after `<think>`: the whitespace that follows is dropped.
    Opened,
    Inside,
    /// Just after `</think>`: the whitespace that follows is dropped.
    Closed,
    Content,
}

/// Splits `<think>REASONING</think>CONTENT` (the block only at the start).
#[derive(Debug)]
pub struct ThinkTags {
    state: State,
    held: String,
}

impl ThinkTags {
    /// `inside`: the prompt opened the block, the answer starts in it.
    pub fn new(inside: bool) -> ThinkTags {
        ThinkTags { state: if inside { State::Opened } else { State::Start }, held: String::new() }
    }

    pub fn push(&mut self, text: &str) -> Split {
        self.held.push_str(text);
        let mut out = Split::default();
        loop {
            match self.state {
                State::Start => {
                    let rest = self.held.trim_start();
                    if let Some(after) = rest.strip_prefix(OPEN) {
                        self.held = after.to_string();
                        self.state = State::Opened;
                    } else if OPEN.starts_with(rest) {
                        return out;
                    } else {
                        self.state = State::Content;
                    }
                }
                State::Inside => match self.held.find(CLOSE) {
                    Some(at) => {
                        out.reasoning.push_str(&self.held[..at]);
                        self.held.drain(..at + CLOSE.len());
                        self.state = State::Closed;
                    }
                    None => {
                        let keep = partial_suffix(&self.held, CLOSE);
                        out.reasoning.extend(self.held.drain(..self.held.len() - keep));
                        return out;
                    }
                },
                State::Opened | State::Closed => {
                    let rest = self.held.trim_start();
                    if rest.is_empty() {
                        self.held.clear();
                        return out;
                    }
                    self.held = rest.to_string();
                    self.state = if self.state == State::Opened { State::Inside } else { State::Content };
                }
                State::Content => {
                    out.content.push_str(&self.held);
                    self.held.clear();
                    return out;
                }
            }
        }
    }

    pub fn finish(&mut self) -> Split {
        let held = std::mem::take(&mut self.held);
        match self.state {
            // an unclosed block is all reasoning
            State::Inside => Split { reasoning: held, content: String::new() },
            State::Opened | State::Closed => Split::default(),
            State::Start | State::Content => Split { reasoning: String::new(), content: held },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The answer fed in every split into pieces of `step` bytes (at char boundaries).
    fn split_all(inside: bool, answer: &str) -> (String, String) {
        let mut results = Vec::new();
        for step in 1..=answer.len().max(1) {
            let mut t = ThinkTags::new(inside);
            let (mut r, mut c) = (String::new(), String::new());
            let mut at = 0;
            while at < answer.len() {
                let mut end = (at + step).min(answer.len());
                while !answer.is_char_boundary(end) {
                    end += 1;
                }
                let s = t.push(&answer[at..end]);
                r.push_str(&s.reasoning);
                c.push_str(&s.content);
                at = end;
            }
            let s = t.finish();
            r.push_str(&s.reasoning);
            c.push_str(&s.content);
            results.push((r, c));
        }
        results.dedup();
        assert_eq!(results.len(), 1, "{answer:?}: {results:?}");
        results.pop().unwrap()
    }

    #[test]
    fn think_blocks_split_the_same_however_the_text_arrives() {
        let s = |r: &str, c: &str| (r.to_string(), c.to_string());
        assert_eq!(split_all(false, "<think>\nHmm, 2+2.\n</think>\n\nIt is 4."), s("Hmm, 2+2.\n", "It is 4."));
        assert_eq!(split_all(false, "  <think>a</thi"), s("a</thi", ""));
        assert_eq!(split_all(false, "No thinking. <think>x</think>"), s("", "No thinking. <think>x</think>"));
        assert_eq!(split_all(false, "<thin"), s("", "<thin"));
        assert_eq!(split_all(true, "é reasoning</think>answer</think>"), s("é reasoning", "answer</think>"));
        assert_eq!(split_all(false, "<think></think>"), s("", ""));
        assert!(opens_thinking("<|im_start|>assistant\n<think>\n"));
        assert!(!opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    }
}
