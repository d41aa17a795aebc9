//! The one check of tokens before they reach the model: not empty (a
//! prompt), every id inside the vocabulary, and room in the context. The
//! forward pass, the CLI and the server (its request and its worker) all
//! call it, so they refuse the same inputs with the same words.

use std::fmt;

/// What is wrong with tokens given to the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenError {
    /// A prompt without a token.
    Empty,
    /// An id the model has no row for.
    OutsideVocabulary { id: u32, vocab: usize },
    /// `held` positions already in the state plus `new` exceed `ctx`.
    BeyondContext { held: usize, new: usize, ctx: usize },
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match *self {
            TokenError::Empty => write!(f, "the prompt is empty (no tokens)"),
            TokenError::OutsideVocabulary { id, vocab } => {
                write!(f, "token id {id} is outside the vocabulary (size {vocab})")
            }
            TokenError::BeyondContext { held: 0, new, ctx } => {
                write!(f, "the prompt has {new} tokens, more than the context of {ctx} tokens")
            }
            TokenError::BeyondContext { held, new, ctx } => {
                write!(f, "context is full: {held} positions + {new} new exceed the context of {ctx}")
            }
        }
    }
}

/// Tokens `tokens` after `held` positions of a context of `ctx`, for a
/// model of `vocab` tokens.
pub fn check_tokens(tokens: &[u32], vocab: usize, held: usize, ctx: usize) -> Result<(), TokenError> {
    if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(TokenError::OutsideVocabulary { id, vocab });
    }
    if held.saturating_add(tokens.len()) > ctx {
        return Err(TokenError::BeyondContext { held, new: tokens.len(), ctx });
    }
    Ok(())
}

/// A prompt evaluated from the start: not empty, and `check_tokens`.
pub fn check_prompt(tokens: &[u32], vocab: usize, ctx: usize) -> Result<(), TokenError> {
    if tokens.is_empty() {
        return Err(TokenError::Empty);
    }
    check_tokens(tokens, vocab, 0, ctx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_checked_in_one_order() {
        assert_eq!(check_prompt(&[], 10, 4), Err(TokenError::Empty));
        assert_eq!(check_prompt(&[1, 10], 10, 4), Err(TokenError::OutsideVocabulary { id: 10, vocab: 10 }));
        assert_eq!(check_prompt(&[1; 5], 10, 4), Err(TokenError::BeyondContext { held: 0, new: 5, ctx: 4 }));
        assert_eq!(check_prompt(&[9; 4], 10, 4), Ok(()));
        assert_eq!(check_tokens(&[], 10, 4, 4), Ok(()));
        assert_eq!(check_tokens(&[1], 10, 4, 4), Err(TokenError::BeyondContext { held: 4, new: 1, ctx: 4 }));
        assert_eq!(
            check_tokens(&[1], 10, usize::MAX, 4).unwrap_err().to_string(),
            format!("context is full: {} positions + 1 new exceed the context of 4", usize::MAX)
        );
        assert_eq!(
            check_prompt(&[1; 5], 10, 4).unwrap_err().to_string(),
            "the prompt has 5 tokens, more than the context of 4 tokens"
        );
    }
}
