//! Multi-turn chat formatting for the server: the same template kinds and
//! shapes as `crate::chat::format` (which formats one user turn), extended to
//! whole conversations of system, user and assistant messages. A single user
//! message (with or without a system prompt) formats exactly as
//! `chat::format` does; the unit tests check that for every kind.
//!
//! As in `chat.rs`, the tokenizer adds the first BOS where the model uses
//! one. Templates that repeat BOS/EOS between turns (llama2, mistral) spell
//! them (`<s>`, `</s>`) so the tokenizer matches them as special tokens.

use crate::chat::TEMPLATES;

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

/// The conversation formatted for `kind`, ending where the assistant speaks.
/// `default_system` (the server's `--system`) is used when the conversation
/// has no system message.
pub fn format_conversation(kind: &str, default_system: Option<&str>, messages: &[Message]) -> Result<String, String> {
    if !TEMPLATES.contains(&kind) {
        return Err(format!("unknown chat template '{kind}' (known: {}, auto)", TEMPLATES.join(", ")));
    }
    if messages.is_empty() {
        return Err("'messages' must hold at least one message".into());
    }
    let has_system = messages.iter().any(|m| m.role == Role::System);
    let injected;
    let messages: &[Message] = match (has_system, default_system) {
        (false, Some(sys)) => {
            injected = std::iter::once(Message { role: Role::System, content: sys.to_string() })
                .chain(messages.iter().cloned())
                .collect::<Vec<_>>();
            &injected
        }
        _ => messages,
    };
    match kind {
        "chatml" | "qwen3" => Ok(role_headers(messages, kind)),
        "llama3" => Ok(role_headers(messages, kind)),
        "zephyr" => Ok(role_headers(messages, kind)),
        _ => alternating(kind, messages),
    }
}

/// Templates with a header per role (system allowed anywhere).
fn role_headers(messages: &[Message], kind: &str) -> String {
    let mut s = String::new();
    for m in messages {
        let role = match m.role {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        };
        let c = &m.content;
        match kind {
            "llama3" => s += &format!("<|start_header_id|>{role}<|end_header_id|>\n\n{c}<|eot_id|>"),
            "zephyr" => s += &format!("<|{role}|>\n{c}</s>\n"),
            _ => s += &format!("<|im_start|>{role}\n{c}<|im_end|>\n"),
        }
    }
    match kind {
        "llama3" => s += "<|start_header_id|>assistant<|end_header_id|>\n\n",
        "zephyr" => s += "<|assistant|>\n",
        "qwen3" => s += "<|im_start|>assistant\n<think>\n\n</think>\n\n",
        _ => s += "<|im_start|>assistant\n",
    }
    s
}

/// Templates without a system role (llama2, mistral, gemma): system text
/// joins the first user turn, and turns must alternate user/assistant,
/// starting with the user, as these models' own templates require.
fn alternating(kind: &str, messages: &[Message]) -> Result<String, String> {
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
        match (kind, m.role) {
            ("llama2", Role::User) => {
                let body = match (&system, first) {
                    (Some(sys), true) => format!("<<SYS>>\n{sys}\n<</SYS>>\n\n{c}"),
                    _ => c.clone(),
                };
                s += &format!("{}[INST] {body} [/INST]", if first { "" } else { "<s>" });
            }
            ("llama2", _) => s += &format!(" {c} </s>"),
            ("mistral", Role::User) => {
                let body = match (&system, first) {
                    (Some(sys), true) => format!("{sys}\n\n{c}"),
                    _ => c.clone(),
                };
                s += &format!("[INST] {body} [/INST]");
            }
            ("mistral", _) => s += &format!("{c}</s>"),
            (_, Role::User) => {
                // gemma
                let body = match (&system, first) {
                    (Some(sys), true) => format!("{sys}\n\n{c}"),
                    _ => c.clone(),
                };
                s += &format!("<start_of_turn>user\n{body}<end_of_turn>\n");
            }
            (_, _) => s += &format!("<start_of_turn>model\n{c}<end_of_turn>\n"),
        }
    }
    if kind == "gemma" {
        s += "<start_of_turn>model\n";
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: Role, c: &str) -> Message {
        Message { role, content: c.into() }
    }

    #[test]
    fn one_turn_matches_chat_rs_for_every_kind() {
        for kind in TEMPLATES {
            for sys in [None, Some("Be brief.")] {
                let want = crate::chat::format(kind, sys, "Hi there?").unwrap();
                // System given as a message...
                let mut m = Vec::new();
                if let Some(s) = sys {
                    m.push(msg(Role::System, s));
                }
                m.push(msg(Role::User, "Hi there?"));
                assert_eq!(format_conversation(kind, None, &m).unwrap(), want, "{kind} {sys:?}");
                // ...or as the server's default system prompt.
                let got = format_conversation(kind, sys, &[msg(Role::User, "Hi there?")]).unwrap();
                assert_eq!(got, want, "{kind} default {sys:?}");
            }
        }
    }

    #[test]
    fn request_system_message_overrides_the_default() {
        let m = [msg(Role::System, "A"), msg(Role::User, "q")];
        assert_eq!(
            format_conversation("chatml", Some("B"), &m).unwrap(),
            crate::chat::format("chatml", Some("A"), "q").unwrap()
        );
    }

    #[test]
    fn multi_turn_shapes() {
        let conv = [msg(Role::System, "S"), msg(Role::User, "u1"), msg(Role::Assistant, "a1"), msg(Role::User, "u2")];
        let f = |k| format_conversation(k, None, &conv).unwrap();
        assert_eq!(
            f("chatml"),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nu1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n\
             <|im_start|>user\nu2<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(f("llama2"), "[INST] <<SYS>>\nS\n<</SYS>>\n\nu1 [/INST] a1 </s><s>[INST] u2 [/INST]");
        assert_eq!(f("mistral"), "[INST] S\n\nu1 [/INST]a1</s>[INST] u2 [/INST]");
        assert_eq!(
            f("gemma"),
            "<start_of_turn>user\nS\n\nu1<end_of_turn>\n<start_of_turn>model\na1<end_of_turn>\n\
             <start_of_turn>user\nu2<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(
            f("llama3"),
            "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nu1<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\na1<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nu2<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        assert_eq!(
            f("zephyr"),
            "<|system|>\nS</s>\n<|user|>\nu1</s>\n<|assistant|>\na1</s>\n<|user|>\nu2</s>\n<|assistant|>\n"
        );
        assert!(f("qwen3").ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    }

    #[test]
    fn bad_conversations_are_errors() {
        assert!(format_conversation("chatml", None, &[]).is_err());
        assert!(format_conversation("nope", None, &[msg(Role::User, "x")]).is_err());
        let two_users = [msg(Role::User, "a"), msg(Role::User, "b")];
        assert!(format_conversation("llama2", None, &two_users).is_err());
        assert!(format_conversation("chatml", None, &two_users).is_ok());
        let late_system =
            [msg(Role::User, "a"), msg(Role::Assistant, "b"), msg(Role::System, "c"), msg(Role::User, "d")];
        assert!(format_conversation("gemma", None, &late_system).is_err());
        assert!(format_conversation("mistral", None, &[msg(Role::User, "a"), msg(Role::Assistant, "b")]).is_err());
    }
}
