//! Chat templates: wrap one user turn (and an optional system prompt) the
//! way each model family was trained. The tokenizer adds BOS where the
//! model uses one, so templates never spell it.

/// Template kinds `--chat` accepts (plus `auto`: the kind in the `.mlt`).
pub const TEMPLATES: [&str; 7] = ["chatml", "qwen3", "llama2", "llama3", "mistral", "gemma", "zephyr"];

/// One user turn formatted for `kind`, ending where the assistant speaks.
pub fn format(kind: &str, system: Option<&str>, user: &str) -> Result<String, String> {
    let s = match kind {
        "chatml" | "qwen3" => {
            let mut s = String::new();
            if let Some(sys) = system {
                s += &format!("<|im_start|>system\n{sys}<|im_end|>\n");
            }
            s += &format!("<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n");
            if kind == "qwen3" {
                // Qwen3's template with thinking disabled: an empty think block.
                s += "<think>\n\n</think>\n\n";
            }
            s
        }
        "llama2" => match system {
            Some(sys) => format!("[INST] <<SYS>>\n{sys}\n<</SYS>>\n\n{user} [/INST]"),
            None => format!("[INST] {user} [/INST]"),
        },
        "llama3" => {
            let mut s = String::new();
            if let Some(sys) = system {
                s += &format!("<|start_header_id|>system<|end_header_id|>\n\n{sys}<|eot_id|>");
            }
            s + &format!("<|start_header_id|>user<|end_header_id|>\n\n{user}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
        }
        "mistral" => match system {
            Some(sys) => format!("[INST] {sys}\n\n{user} [/INST]"),
            None => format!("[INST] {user} [/INST]"),
        },
        "gemma" => {
            // Gemma has no system role: its template prepends the system text to the user turn.
            let body = match system {
                Some(sys) => format!("{sys}\n\n{user}"),
                None => user.to_string(),
            };
            format!("<start_of_turn>user\n{body}<end_of_turn>\n<start_of_turn>model\n")
        }
        "zephyr" => {
            let mut s = String::new();
            if let Some(sys) = system {
                s += &format!("<|system|>\n{sys}</s>\n");
            }
            s + &format!("<|user|>\n{user}</s>\n<|assistant|>\n")
        }
        other => return Err(format!("unknown chat template '{other}' (known: {}, auto)", TEMPLATES.join(", "))),
    };
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_matches_the_smollm2_template_shape() {
        assert_eq!(
            format("chatml", Some("S"), "Hi").unwrap(),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert!(format("nope", None, "x").is_err());
        for t in TEMPLATES {
            assert!(format(t, None, "question?").unwrap().contains("question?"));
        }
    }
}
