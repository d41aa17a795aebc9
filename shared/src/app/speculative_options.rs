//! The speculative-decoding options the CLI and the server share
//! (`--lookup`, `--draft`, `--draft-max`), and the draft model they load.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use super::options::{check_vocab_sizes, ModelFile};
use crate::fault::Fault;
use crate::format::mlb::Mlb;
use crate::generate::{DraftModel, Sequence, Source, Speculator};
use crate::import::{ConvertType, ImportOptions};
use crate::model::{LayerKind, LoadOptions, Model, State};
use crate::tokenizer::Tokenizer;

#[derive(Args, Debug, Clone, Default)]
pub struct SpecArgs {
    /// Speculative decoding by prompt lookup: draft the tokens that followed
    /// the last N tokens where they occurred earlier in the context
    /// (N from 1 to 16; 0 = off).
    #[arg(long = "lookup", value_name = "N", default_value_t = 0)]
    pub lookup: usize,
    /// Speculative decoding with a draft model: a small model with the same
    /// vocabulary (.mlb or .gguf) proposes the next tokens.
    #[arg(long = "draft", value_name = "FILE")]
    pub draft: Option<PathBuf>,
    /// Most tokens drafted ahead per forward pass (fewer when guesses fail).
    #[arg(long = "draft-max", value_name = "K", default_value_t = 8)]
    pub draft_max: usize,
    /// Fewest tokens drafted per pass when there is a guess, even when
    /// guessing does not seem to pay (0: as measured).
    #[arg(long = "draft-min", value_name = "K", default_value_t = 0)]
    pub draft_min: usize,
}

/// What the options ask for, loaded: a source of drafts per sequence.
pub enum SpecPlan {
    Off,
    Lookup { ngram: usize, sizes: (usize, usize) },
    Draft { model: Arc<Model>, sizes: (usize, usize), batch: usize },
}

impl SpecArgs {
    /// Checks the options and loads the draft model (with `target`'s vocabulary).
    pub fn plan(&self, target: &Model, tokenizer: Option<&Tokenizer>, batch: usize) -> Result<SpecPlan, Fault> {
        if self.lookup > 16 {
            return Err(format!("--lookup {} must be from 0 to 16", self.lookup).into());
        }
        if !(1..=32).contains(&self.draft_max) {
            return Err(format!("--draft-max {} must be from 1 to 32", self.draft_max).into());
        }
        if self.draft_min > self.draft_max {
            return Err(format!("--draft-min {} must be at most --draft-max {}", self.draft_min, self.draft_max).into());
        }
        let (lookup, draft) = (self.lookup, self.draft.as_ref());
        if lookup > 0 && draft.is_some() {
            return Err("--lookup and --draft are two ways to draft: choose one".into());
        }
        if (lookup > 0 || draft.is_some()) && target.config.layer_kinds.contains(&LayerKind::DeltaNet) {
            return Err(format!(
                "speculative decoding needs a model that can rewind its cache; {} has recurrent (DeltaNet) layers",
                target.config.arch
            )
            .into());
        }
        if lookup > 0 {
            return Ok(SpecPlan::Lookup { ngram: lookup, sizes: (self.draft_min, self.draft_max) });
        }
        let Some(path) = draft else { return Ok(SpecPlan::Off) };
        let shown = path.display();
        let mlb = match ModelFile::open(path)? {
            ModelFile::Mlb(p) => Mlb::open(&p)?,
            ModelFile::Import(source) => {
                if let (Some(t), Ok(Some(raw))) = (tokenizer, source.tokenizer()) {
                    if let Ok(d) = Tokenizer::build(raw) {
                        same_vocabulary(t, &d).map_err(|e| format!("--draft {shown}: {e}"))?;
                    }
                }
                source.import(&ImportOptions::new(ConvertType::Auto))?
            }
        };
        let model = Model::from_mlb(Arc::new(mlb), LoadOptions::default())?;
        if model.config.layer_kinds.contains(&LayerKind::DeltaNet) {
            return Err(format!("--draft {shown}: a draft model with recurrent (DeltaNet) layers cannot rewind").into());
        }
        if model.config.vocab_size != target.config.vocab_size {
            let tokens = tokenizer.map_or(target.config.vocab_size, |t| t.vocab_size());
            check_vocab_sizes(tokens, model.config.vocab_size).map_err(|e| format!("--draft {shown}: {e}"))?;
        }
        Ok(SpecPlan::Draft { model: Arc::new(model), sizes: (self.draft_min, self.draft_max), batch })
    }
}

impl SpecPlan {
    pub fn is_on(&self) -> bool {
        !matches!(self, SpecPlan::Off)
    }

    /// A speculator for one sequence of up to `ctx` positions.
    pub fn speculator(&self, ctx: usize) -> Result<Option<Speculator>, Fault> {
        Ok(match self {
            SpecPlan::Off => None,
            SpecPlan::Lookup { ngram, sizes } => Some(Speculator::new(Source::Lookup { ngram: *ngram }, *sizes)),
            SpecPlan::Draft { model, sizes, batch } => {
                let state = State::new(&model.config, ctx.min(model.config.context_length))?;
                let draft = DraftModel::new(model.clone(), Sequence::new(state), *batch);
                Some(Speculator::new(Source::Model(Box::new(draft)), *sizes))
            }
        })
    }

    /// "lookup 3-grams, up to 8 ahead" or "draft model M, up to 8 ahead", for the startup line.
    pub fn describe(&self) -> Option<String> {
        match self {
            SpecPlan::Off => None,
            SpecPlan::Lookup { ngram, sizes } => {
                Some(format!("speculative: lookup {ngram}-grams, up to {} ahead", sizes.1))
            }
            SpecPlan::Draft { model, sizes, .. } => Some(format!(
                "speculative: draft model {} ({:.1} M params), up to {} ahead",
                model.config.arch,
                model.n_params() as f64 / 1e6,
                sizes.1
            )),
        }
    }
}

/// Draft and target tokenizers agree on every token's bytes.
fn same_vocabulary(target: &Tokenizer, draft: &Tokenizer) -> Result<(), String> {
    if target.vocab_size() != draft.vocab_size() {
        return Err(format!(
            "the draft model's vocabulary has {} tokens, the model's {}: they must be the same",
            draft.vocab_size(),
            target.vocab_size()
        ));
    }
    match (0..target.vocab_size() as u32).find(|&id| target.decode_piece(None, id) != draft.decode_piece(None, id)) {
        Some(id) => Err(format!("token {id} differs between the draft model's vocabulary and the model's")),
        None => Ok(()),
    }
}
