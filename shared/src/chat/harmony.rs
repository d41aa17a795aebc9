//! OpenAI's harmony format (gpt-oss): the prompt as gpt-oss's own template
//! writes it, and the answer's channels told apart.
//!
//! The prompt opens with a system message the template writes itself (the
//! model's identity, its knowledge cutoff, today's date, the reasoning effort,
//! the valid channels); a system message of the conversation becomes the
//! developer's instructions; earlier answers are written back as their final
//! channel only, as the template does for inference.
//!
//! The model answers in channels: `<|channel|>analysis<|message|>…<|end|>`
//! (its reasoning), then `<|start|>assistant<|channel|>final<|message|>…`
//! (the answer), ended by `<|return|>` (or `<|call|>`), which are stop ids
//! (`Tokenizer::stop_ids`). [`Channels`] splits the answer's text as it
//! streams into reasoning and content, dropping the headers.

use super::partial_suffix;
use super::{PromptText, Role, Turn};

/// The system message's text before the date.
const IDENTITY: &str = "You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\n";
/// The system message's text after the date.
const CHANNELS: &str =
    "\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.";

/// The conversation in the harmony format, ending where the assistant speaks;
/// `date` is today's (`YYYY-MM-DD`, the template's `strftime_now`).
pub(super) fn format(turns: &[Turn], date: &str) -> Result<PromptText, String> {
    let mut s = PromptText::template("<|start|>system<|message|>");
    s.push_template(IDENTITY);
    s.push_template(&format!("Current date: {date}"));
    s.push_template(CHANNELS);
    s.push_template("<|end|>");
    let (developer, rest) = match turns.split_first() {
        Some((first, rest)) if first.role == Role::System => (Some(&first.body), rest),
        _ => (None, turns),
    };
    if let Some(d) = developer.filter(|d| !d.is_empty()) {
        s.push_template("<|start|>developer<|message|># Instructions\n\n");
        s.push(d);
        s.push_template("\n\n<|end|>");
    }
    for (i, t) in rest.iter().enumerate() {
        let head = match t.role {
            Role::User => "<|start|>user<|message|>",
            Role::Assistant => "<|start|>assistant<|channel|>final<|message|>",
            Role::System => {
                return Err(format!(
                    "the 'harmony' template takes a system message only at the start of the conversation (message {} is one)",
                    i + usize::from(developer.is_some())
                ))
            }
            Role::Tool => return Err("the 'harmony' template (gpt-oss) does not take tool results yet".into()),
        };
        s.push_template(head);
        s.push(&t.body);
        s.push_template("<|end|>");
    }
    s.push_template("<|start|>assistant");
    Ok(s)
}

/// Today's date in UTC as `YYYY-MM-DD`.
pub(super) fn today() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    civil_date((secs / 86_400) as i64)
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_date(days: i64) -> String {
    let (year, month, day) = civil_from_days(days);
    format!("{year:04}-{month:02}-{day:02}")
}

/// The (year, month, day) of a day counted from 1970-01-01 (proleptic
/// Gregorian calendar, Howard Hinnant's algorithm).
pub(super) fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// The day counted from 1970-01-01 of a (year, month, day).
pub(super) fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

const MESSAGE: &str = "<|message|>";
const END: &str = "<|end|>";
const CHANNEL: &str = "<|channel|>";
/// A header longer than this is not one: the text is shown as content.
const MAX_HEADER: usize = 256;

/// An answer's text split into what it reasons and what it says.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

/// Where the answer's text is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Between messages: `<|start|>assistant<|channel|>NAME …` up to `<|message|>`.
    Header,
    /// A message's text, in the analysis channel (reasoning) or another (content).
    Body { reasoning: bool },
    /// Not the harmony format after all: everything is content.
    Plain,
}

/// Splits a harmony answer's text, streamed in pieces, into reasoning (the
/// analysis channel) and content (final and commentary), without the
/// headers and the `<|end|>` between messages. Text that might be the start
/// of a marker is held until the next piece shows what it is.
#[derive(Debug)]
pub struct Channels {
    state: State,
    held: String,
}

impl Default for Channels {
    fn default() -> Self {
        Channels { state: State::Header, held: String::new() }
    }
}

impl Channels {
    pub fn new() -> Channels {
        Channels::default()
    }

    /// The next piece of the answer: what of it (and of what was held) can be shown.
    pub fn push(&mut self, text: &str) -> Split {
        self.held.push_str(text);
        let mut out = Split::default();
        loop {
            match self.state {
                State::Plain => {
                    out.content.push_str(&std::mem::take(&mut self.held));
                    return out;
                }
                State::Header => {
                    let Some(at) = self.held.find(MESSAGE) else {
                        if self.held.len() > MAX_HEADER {
                            self.state = State::Plain;
                            continue;
                        }
                        return out;
                    };
                    let reasoning = channel_name(&self.held[..at]) == Some("analysis");
                    self.held.drain(..at + MESSAGE.len());
                    self.state = State::Body { reasoning };
                }
                State::Body { reasoning } => {
                    let to = if reasoning { &mut out.reasoning } else { &mut out.content };
                    match self.held.find(END) {
                        Some(at) => {
                            to.push_str(&self.held[..at]);
                            self.held.drain(..at + END.len());
                            self.state = State::Header;
                        }
                        None => {
                            // keep a tail that may begin `<|end|>`
                            let keep = partial_suffix(&self.held, END);
                            to.push_str(&self.held[..self.held.len() - keep]);
                            self.held.drain(..self.held.len() - keep);
                            return out;
                        }
                    }
                }
            }
        }
    }

    /// The end of the answer: the text still held (a header cut short is dropped).
    pub fn finish(&mut self) -> Split {
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Body { reasoning: true } => Split { reasoning: held, content: String::new() },
            State::Body { reasoning: false } | State::Plain => Split { reasoning: String::new(), content: held },
            // an answer that never opened a message is shown as it is
            State::Header if !held.contains("<|") => Split { reasoning: String::new(), content: held },
            State::Header => Split::default(),
        }
    }
}

/// The channel a header names (`…<|channel|>analysis …`).
fn channel_name(header: &str) -> Option<&str> {
    let rest = &header[header.rfind(CHANNEL)? + CHANNEL.len()..];
    rest.split(|c: char| c.is_whitespace() || c == '<').next()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANSWER: &str = "<|channel|>analysis<|message|>User asks 2+2. Answer 4.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.";

    fn split_in_pieces(text: &str, size: usize) -> Split {
        let mut c = Channels::new();
        let mut all = Split::default();
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(size) {
            let s = c.push(&piece.iter().collect::<String>());
            all.reasoning += &s.reasoning;
            all.content += &s.content;
        }
        let s = c.finish();
        all.reasoning += &s.reasoning;
        all.content += &s.content;
        all
    }

    #[test]
    fn channels_split_whatever_the_pieces() {
        for size in [1, 2, 3, 5, 7, 11, 1000] {
            let s = split_in_pieces(ANSWER, size);
            assert_eq!(s.reasoning, "User asks 2+2. Answer 4.", "pieces of {size}");
            assert_eq!(s.content, "2 + 2 = 4.", "pieces of {size}");
        }
        // a commentary preamble is content; a `<|` in the text that is no marker is kept
        let s = split_in_pieces("<|channel|>commentary<|message|>a <| b<|end|>", 2);
        assert_eq!(s, Split { reasoning: String::new(), content: "a <| b".into() });
    }

    #[test]
    fn text_that_is_not_harmony_is_content() {
        assert_eq!(split_in_pieces("Hello there.", 3).content, "Hello there.");
        let long = "x".repeat(MAX_HEADER + 10);
        assert_eq!(split_in_pieces(&long, 4).content, long);
        // an answer cut inside a header loses only the header
        let s = split_in_pieces("<|channel|>analysis<|message|>think<|end|><|start|>assistant<|chan", 3);
        assert_eq!(s, Split { reasoning: "think".into(), content: String::new() });
    }

    #[test]
    fn dates() {
        assert_eq!(civil_date(0), "1970-01-01");
        assert_eq!(civil_date(11_016), "2000-02-29");
        assert_eq!(civil_date(20_793), "2026-12-06");
        assert_eq!(civil_date(-1), "1969-12-31");
    }
}
