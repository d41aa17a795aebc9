//! Chat templates: a conversation of system, user and assistant messages
//! formatted the way each model family was trained, ending where the
//! assistant speaks. One implementation serves the CLI (one user turn, an
//! optional system prompt) and the server (whole conversations). The
//! tokenizer adds the first BOS where the model uses one, so templates never
//! spell it; templates that repeat BOS/EOS between turns (llama2, mistral)
//! spell them (`<s>`, `</s>`) so the tokenizer matches them as special tokens.

/// A template kind (`--chat`, and the kind a `.mlt` file records).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Template {
    /// `<|im_start|>role ... <|im_end|>` (SmolLM2, Qwen2)
    Chatml,
    /// ChatML with thinking off: an empty `<think>` block (Qwen3)
    Qwen3,
    /// `[INST] <<SYS>> ... [/INST]`
    Llama2,
    /// `<|start_header_id|>role<|end_header_id|> ... <|eot_id|>`
    Llama3,
    /// `[INST] ... [/INST]`
    Mistral,
    /// `<start_of_turn>user ... <end_of_turn>`
    Gemma,
    /// `<|user|> ... </s>` (TinyLlama)
    Zephyr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
}

#[derive(Clone, Debug)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Message {
        Message { role, content: content.into() }
    }
}

impl Template {
    /// The name `--chat` and `.mlt` files use.
    pub fn name(self) -> &'static str {
        match self {
            Template::Chatml => "chatml",
            Template::Qwen3 => "qwen3",
            Template::Llama2 => "llama2",
            Template::Llama3 => "llama3",
            Template::Mistral => "mistral",
            Template::Gemma => "gemma",
            Template::Zephyr => "zephyr",
        }
    }

    /// The template called `name`, if there is one.
    pub fn from_name(name: &str) -> Option<Template> {
        <Template as clap::ValueEnum>::from_str(name, false).ok()
    }

    /// One user turn, after `system` when given.
    pub fn format_turn(self, system: Option<&str>, user: &str) -> String {
        let mut turn: Vec<Message> = system.map(|s| Message::new(Role::System, s)).into_iter().collect();
        turn.push(Message::new(Role::User, user));
        self.format(None, &turn).expect("a system prompt and one user message suit every template")
    }

    /// The conversation, ending where the assistant speaks. `default_system`
    /// is used when the conversation has no system message.
    pub fn format(self, default_system: Option<&str>, messages: &[Message]) -> Result<String, String> {
        if messages.is_empty() {
            return Err("the conversation must hold at least one message".into());
        }
        let has_system = messages.iter().any(|m| m.role == Role::System);
        let injected;
        let messages: &[Message] = match (has_system, default_system) {
            (false, Some(sys)) => {
                injected = std::iter::once(Message::new(Role::System, sys))
                    .chain(messages.iter().cloned())
                    .collect::<Vec<_>>();
                &injected
            }
            _ => messages,
        };
        match self {
            Template::Chatml | Template::Qwen3 | Template::Llama3 | Template::Zephyr => Ok(self.role_headers(messages)),
            Template::Llama2 | Template::Mistral | Template::Gemma => self.alternating(messages),
        }
    }

    /// Templates with a header per role (system allowed anywhere).
    fn role_headers(self, messages: &[Message]) -> String {
        let mut s = String::new();
        for m in messages {
            let role = match m.role {
                Role::System => "system",
                Role::User => "user",
                Role::Assistant => "assistant",
            };
            let c = &m.content;
            match self {
                Template::Llama3 => s += &format!("<|start_header_id|>{role}<|end_header_id|>\n\n{c}<|eot_id|>"),
                Template::Zephyr => s += &format!("<|{role}|>\n{c}</s>\n"),
                _ => s += &format!("<|im_start|>{role}\n{c}<|im_end|>\n"),
            }
        }
        match self {
            Template::Llama3 => s += "<|start_header_id|>assistant<|end_header_id|>\n\n",
            Template::Zephyr => s += "<|assistant|>\n",
            Template::Qwen3 => s += "<|im_start|>assistant\n<think>\n\n</think>\n\n",
            _ => s += "<|im_start|>assistant\n",
        }
        s
    }

    /// Templates without a system role (llama2, mistral, gemma): system text
    /// joins the first user turn, and turns must alternate user/assistant,
    /// starting with the user, as these models' own templates require.
    fn alternating(self, messages: &[Message]) -> Result<String, String> {
        let kind = self.name();
        let n_sys = messages.iter().take_while(|m| m.role == Role::System).count();
        if messages[n_sys..].iter().any(|m| m.role == Role::System) {
            return Err(format!("the '{kind}' template allows system messages only at the start of the conversation"));
        }
        let system: Option<String> =
            (n_sys > 0).then(|| messages[..n_sys].iter().map(|m| m.content.as_str()).collect::<Vec<_>>().join("\n\n"));
        let turns = &messages[n_sys..];
        for (i, m) in turns.iter().enumerate() {
            let want = if i % 2 == 0 { Role::User } else { Role::Assistant };
            if m.role != want {
                return Err(format!(
                    "the '{kind}' template needs turns alternating user/assistant, starting with a user message (message {} is not)",
                    n_sys + i
                ));
            }
        }
        if turns.last().map(|m| m.role) != Some(Role::User) {
            return Err(format!("the '{kind}' template needs the conversation to end with a user message"));
        }
        let mut s = String::new();
        for (i, m) in turns.iter().enumerate() {
            let c = &m.content;
            let first = i == 0;
            // the system text opens the first user turn
            let user = || match (&system, first) {
                (Some(sys), true) if self == Template::Llama2 => format!("<<SYS>>\n{sys}\n<</SYS>>\n\n{c}"),
                (Some(sys), true) => format!("{sys}\n\n{c}"),
                _ => c.clone(),
            };
            match (self, m.role) {
                (Template::Llama2, Role::User) => {
                    s += &format!("{}[INST] {} [/INST]", if first { "" } else { "<s>" }, user())
                }
                (Template::Llama2, _) => s += &format!(" {c} </s>"),
                (Template::Mistral, Role::User) => s += &format!("[INST] {} [/INST]", user()),
                (Template::Mistral, _) => s += &format!("{c}</s>"),
                (_, Role::User) => s += &format!("<start_of_turn>user\n{}<end_of_turn>\n", user()),
                (_, _) => s += &format!("<start_of_turn>model\n{c}<end_of_turn>\n"),
            }
        }
        if self == Template::Gemma {
            s += "<start_of_turn>model\n";
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    fn msg(role: Role, c: &str) -> Message {
        Message::new(role, c)
    }

    #[test]
    fn names_round_trip() {
        for &t in Template::value_variants() {
            assert_eq!(Template::from_name(t.name()), Some(t));
        }
        assert_eq!(Template::from_name("nope"), None);
    }

    #[test]
    fn one_turn_shapes() {
        assert_eq!(
            Template::Chatml.format_turn(Some("S"), "Hi"),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(Template::Llama2.format_turn(Some("S"), "Hi"), "[INST] <<SYS>>\nS\n<</SYS>>\n\nHi [/INST]");
        assert_eq!(Template::Llama2.format_turn(None, "Hi"), "[INST] Hi [/INST]");
        assert_eq!(Template::Mistral.format_turn(Some("S"), "Hi"), "[INST] S\n\nHi [/INST]");
        assert_eq!(
            Template::Gemma.format_turn(Some("S"), "Hi"),
            "<start_of_turn>user\nS\n\nHi<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(
            Template::Qwen3.format_turn(None, "Hi"),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        );
        for &t in Template::value_variants() {
            assert!(t.format_turn(None, "question?").contains("question?"));
        }
    }

    #[test]
    fn default_system_and_request_system() {
        for &t in Template::value_variants() {
            let want = t.format_turn(Some("Be brief."), "Hi there?");
            let got = t.format(Some("Be brief."), &[msg(Role::User, "Hi there?")]).unwrap();
            assert_eq!(got, want, "{t:?}: the default system prompt");
        }
        // A system message in the conversation overrides the default.
        let m = [msg(Role::System, "A"), msg(Role::User, "q")];
        assert_eq!(Template::Chatml.format(Some("B"), &m).unwrap(), Template::Chatml.format_turn(Some("A"), "q"));
    }

    #[test]
    fn multi_turn_shapes() {
        let conv = [msg(Role::System, "S"), msg(Role::User, "u1"), msg(Role::Assistant, "a1"), msg(Role::User, "u2")];
        let f = |t: Template| t.format(None, &conv).unwrap();
        assert_eq!(
            f(Template::Chatml),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nu1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n\
             <|im_start|>user\nu2<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(f(Template::Llama2), "[INST] <<SYS>>\nS\n<</SYS>>\n\nu1 [/INST] a1 </s><s>[INST] u2 [/INST]");
        assert_eq!(f(Template::Mistral), "[INST] S\n\nu1 [/INST]a1</s>[INST] u2 [/INST]");
        assert_eq!(
            f(Template::Gemma),
            "<start_of_turn>user\nS\n\nu1<end_of_turn>\n<start_of_turn>model\na1<end_of_turn>\n\
             <start_of_turn>user\nu2<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(
            f(Template::Llama3),
            "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nu1<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\na1<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nu2<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        assert_eq!(
            f(Template::Zephyr),
            "<|system|>\nS</s>\n<|user|>\nu1</s>\n<|assistant|>\na1</s>\n<|user|>\nu2</s>\n<|assistant|>\n"
        );
        assert!(f(Template::Qwen3).ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    }

    #[test]
    fn bad_conversations_are_errors() {
        assert!(Template::Chatml.format(None, &[]).is_err());
        let two_users = [msg(Role::User, "a"), msg(Role::User, "b")];
        assert!(Template::Llama2.format(None, &two_users).is_err());
        assert!(Template::Chatml.format(None, &two_users).is_ok());
        let late_system =
            [msg(Role::User, "a"), msg(Role::Assistant, "b"), msg(Role::System, "c"), msg(Role::User, "d")];
        assert!(Template::Gemma.format(None, &late_system).is_err());
        assert!(Template::Mistral.format(None, &[msg(Role::User, "a"), msg(Role::Assistant, "b")]).is_err());
    }
}
