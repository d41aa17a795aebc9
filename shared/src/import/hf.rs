//! A Hugging Face model directory (config.json and `.safetensors` files,
//! sharded or not; F32, F16, BF16 or F64) as an `.mlb` model in memory:
//! the metadata from `hf_config.rs`, the tensors renamed to `.mlb` names in
//! `.mlb` order, then `convert.rs` converts every one of them (nothing of a
//! safetensors file is used in place: its matrices are float, which Krafla
//! runs as Q8_0, Q4_0, F16 or F32).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::convert::{self, check_shapes, conversion_metadata, convert, SourceTensor};
use super::hf_config::{self, HfConfig};
use super::ImportOptions;
use crate::fault::Fault;
use crate::format::gguf::GgmlType;
use crate::format::mlb::{Bytes, MetaValue, Mlb};
use crate::format::safetensors::{Element, SafetensorsFile, View};

/// The largest config.json or index file read (real ones are a few KiB).
pub(super) const MAX_JSON: u64 = 16 << 20;

/// Per-layer tensors (after `model.layers.N.`) → `.mlb` names, in `.mlb` order.
const LAYER_NAMES: &[(&str, &str)] = &[
    ("input_layernorm.weight", "attn_norm"),
    ("self_attn.q_proj.weight", "attn_q"),
    ("self_attn.k_proj.weight", "attn_k"),
    ("self_attn.v_proj.weight", "attn_v"),
    ("self_attn.o_proj.weight", "attn_o"),
    ("self_attn.q_proj.bias", "attn_q_bias"),
    ("self_attn.k_proj.bias", "attn_k_bias"),
    ("self_attn.v_proj.bias", "attn_v_bias"),
    ("self_attn.q_norm.weight", "attn_q_norm"),
    ("self_attn.k_norm.weight", "attn_k_norm"),
    ("mlp.gate_proj.weight", "ffn_gate"),
    ("mlp.up_proj.weight", "ffn_up"),
    ("mlp.down_proj.weight", "ffn_down"),
];
/// Then, for a plain block, the norm before the feed-forward...
const PLAIN_NAMES: &[(&str, &str)] = &[("post_attention_layernorm.weight", "ffn_norm")];
/// ... or, for a Gemma (sandwich) block, the norms around both halves.
const SANDWICH_NAMES: &[(&str, &str)] = &[
    ("post_attention_layernorm.weight", "attn_post_norm"),
    ("pre_feedforward_layernorm.weight", "ffn_norm"),
    ("post_feedforward_layernorm.weight", "ffn_post_norm"),
];
/// Qwen3.5's Gated DeltaNet tensors (after `linear_attn.`; docs/FORMAT.md).
const LINEAR_NAMES: &[(&str, &str)] = &[
    ("in_proj_qkv.weight", "ssm_qkv"),
    ("in_proj_z.weight", "ssm_z"),
    ("in_proj_b.weight", "ssm_b"),
    ("in_proj_a.weight", "ssm_a"),
    ("conv1d.weight", "ssm_conv"),
    ("A_log", "ssm_a_log"),
    ("dt_bias", "ssm_dt_bias"),
    ("norm.weight", "ssm_norm"),
    ("out_proj.weight", "ssm_out"),
];

/// Where the text model's tensors are, in the checkpoints transformers writes.
const PREFIXES: &[&str] = &["model.language_model.", "model.", "language_model.model.", "model.text_model.", ""];
const LM_HEADS: &[&str] = &["lm_head.weight", "language_model.lm_head.weight", "model.lm_head.weight"];

/// A model directory, its config read and its weight files mapped.
pub struct HfModel {
    pub dir: PathBuf,
    config: HfConfig,
    files: Vec<SafetensorsFile>,
}

/// Whether `path` is a Hugging Face model directory (it has a config.json).
pub fn is_model_dir(path: &Path) -> bool {
    path.is_dir() && path.join("config.json").is_file()
}

/// A UTF-8 file of at most `max` bytes.
pub(super) fn read_json_text(path: &Path, max: u64) -> Result<String, String> {
    use std::io::Read;
    let shown = path.display();
    let file = std::fs::File::open(path).map_err(|e| format!("{shown}: cannot open: {e}"))?;
    let mut text = String::new();
    file.take(max + 1).read_to_string(&mut text).map_err(|e| format!("{shown}: cannot read: {e}"))?;
    if text.len() as u64 > max {
        return Err(format!("{shown}: larger than {} MiB", max >> 20));
    }
    Ok(text)
}

impl HfModel {
    /// Reads `dir/config.json` and maps the weight files (those the index
    /// lists, or every `*.safetensors`).
    pub fn open(dir: &Path) -> Result<HfModel, String> {
        let shown = dir.display();
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            return Err(format!("{shown}: no config.json"));
        }
        let config = hf_config::parse(&read_json_text(&config_path, MAX_JSON)?).map_err(|e| format!("{shown}: {e}"))?;
        let index = dir.join("model.safetensors.index.json");
        let mut names: Vec<String> = if index.is_file() {
            let text = read_json_text(&index, MAX_JSON)?;
            let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", index.display()))?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| format!("{}: no weight_map", index.display()))?;
            let mut files = Vec::new();
            for f in map.values() {
                let f = f.as_str().ok_or_else(|| format!("{}: a weight_map value is not a string", index.display()))?;
                // a file of this directory, never a path out of it
                if f.is_empty() || f.contains(['/', '\\']) || f == ".." {
                    return Err(format!("{}: {f:?} is not a file name", index.display()));
                }
                files.push(f.to_string());
            }
            files
        } else {
            let entries = std::fs::read_dir(dir).map_err(|e| format!("{shown}: cannot list: {e}"))?;
            entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.ends_with(".safetensors"))
                .collect()
        };
        names.sort();
        names.dedup();
        if names.is_empty() {
            return Err(format!("{shown}: no .safetensors files"));
        }
        let files = names.iter().map(|n| SafetensorsFile::open(&dir.join(n))).collect::<Result<_, _>>()?;
        Ok(HfModel { dir: dir.to_path_buf(), config, files })
    }

    pub fn path(&self) -> String {
        self.dir.display().to_string()
    }

    /// The `.mlb` model, converted by `opts`' rules.
    pub fn import(&self, opts: &ImportOptions) -> Result<Mlb, Fault> {
        let path = self.path();
        self.with_tensors(|mut meta, plan| {
            meta.extend(conversion_metadata(opts));
            let (converted, infos) = convert(plan, 0, opts, &path)?;
            Mlb::assemble(Bytes::Owned(Vec::new()), converted, meta, infos, path.clone())
        })?
    }

    /// Whether `import(opts)` would make any tensor Q4_0 (from the names
    /// and shapes: no tensor is read).
    pub fn makes_q4(&self, opts: &ImportOptions) -> Result<bool, String> {
        let views = self.views()?;
        let (_, named) = self.names(&views).map_err(|e| format!("{}: {e}", self.path()))?;
        Ok(convert::makes_q4_of_floats(named.iter().map(|(n, _, shape)| (n.as_str(), shape.as_slice())), opts))
    }

    /// Every tensor of the files, by name.
    fn views(&self) -> Result<HashMap<String, View<'_>>, String> {
        let mut views = HashMap::new();
        for file in &self.files {
            for v in file.tensors()? {
                views.insert(v.name.clone(), v);
            }
        }
        Ok(views)
    }

    /// `f` of the metadata and the tensors in `.mlb` order and names, their
    /// shapes checked. Errors name the directory.
    fn with_tensors<R>(&self, f: impl FnOnce(Vec<(String, MetaValue)>, &[SourceTensor]) -> R) -> Result<R, String> {
        let shown = self.path();
        let views = self.views()?;
        // F64 tensors narrowed to f32 (rare: kept here for as long as the plan)
        let narrowed: HashMap<&str, Vec<u8>> = views
            .values()
            .filter(|v| v.element == Element::F64)
            .map(|v| {
                let bytes = v
                    .bytes
                    .chunks_exact(8)
                    .flat_map(|b| (f64::from_le_bytes(b.try_into().expect("8 bytes")) as f32).to_le_bytes());
                (v.name.as_str(), bytes.collect())
            })
            .collect();
        let (meta, named) = self.names(&views).map_err(|e| format!("{shown}: {e}"))?;
        let plan: Vec<SourceTensor> = named
            .into_iter()
            .map(|(name, hf_name, shape)| {
                let v = &views[hf_name];
                let (ty, bytes) = match v.element {
                    Element::Ggml(ty) => (ty, v.bytes),
                    Element::F64 => (GgmlType::F32, narrowed[hf_name].as_slice()),
                };
                let dims = shape.iter().rev().copied().collect();
                SourceTensor { name, source_name: hf_name.to_string(), ty, dims, bytes, in_place: None }
            })
            .collect();
        check_shapes(&meta, &plan).map_err(|e| format!("{shown}: {e}"))?;
        Ok(f(meta, &plan))
    }

    /// The metadata (with `tie_embeddings`), and per `.mlb` tensor in order
    /// its name, its name in the files and its shape (rows first).
    #[allow(clippy::type_complexity)]
    fn names<'v>(
        &self,
        views: &'v HashMap<String, View>,
    ) -> Result<(Vec<(String, MetaValue)>, Vec<(String, &'v str, Vec<u64>)>), String> {
        let cfg = &self.config;
        let mut meta = cfg.meta.clone();
        let find = |name: &str| views.get_key_value(name).map(|(k, v)| (k.as_str(), v));
        let need = |name: &str| find(name).ok_or_else(|| format!("missing tensor {name}"));
        let entry = |name: String, hf: &str| -> Result<(String, &'v str, Vec<u64>), String> {
            let (k, v) = need(hf)?;
            Ok((name, k, v.shape.clone()))
        };
        let prefix = PREFIXES
            .iter()
            .find(|p| views.contains_key(&format!("{p}embed_tokens.weight")))
            .ok_or("missing tensor model.embed_tokens.weight")?;
        let mut out = vec![entry("token_embd".into(), &format!("{prefix}embed_tokens.weight"))?];
        let lm_head = LM_HEADS.iter().find(|n| views.contains_key(**n));
        let tie = cfg.tie.unwrap_or(lm_head.is_none());
        if !tie && lm_head.is_none() {
            return Err("missing tensor lm_head.weight".into());
        }
        meta.push(("tie_embeddings".into(), MetaValue::Int(tie as i64)));

        let sandwich = cfg.int("norm_sandwich") == 1;
        let names: Vec<(&str, &str)> =
            LAYER_NAMES.iter().chain(if sandwich { SANDWICH_NAMES } else { PLAIN_NAMES }).copied().collect();
        let n_layers = cfg.int("n_layers") as usize;
        let kinds = cfg.layer_kinds();
        // the names under each layer's prefix
        let mut by_layer: Vec<Vec<&str>> = vec![Vec::new(); n_layers];
        let layers = format!("{prefix}layers.");
        for name in views.keys() {
            let Some((i, suffix)) = name.strip_prefix(&layers).and_then(|r| r.split_once('.')) else { continue };
            let canonical = !i.is_empty() && (i == "0" || !i.starts_with('0')) && i.bytes().all(|b| b.is_ascii_digit());
            if let Some(layer) = canonical.then(|| i.parse::<usize>().ok()).flatten().and_then(|i| by_layer.get_mut(i))
            {
                layer.push(suffix);
            }
        }
        for (i, mut present) in by_layer.into_iter().enumerate() {
            let linear = kinds.is_some_and(|k| k[i] == super::families::LINEAR);
            let mut required: Vec<String> =
                ["input_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]
                    .map(String::from)
                    .to_vec();
            required.extend((if sandwich { SANDWICH_NAMES } else { PLAIN_NAMES }).iter().map(|(s, _)| s.to_string()));
            if linear {
                required.extend(LINEAR_NAMES.iter().map(|(s, _)| format!("linear_attn.{s}")));
            } else {
                required
                    .extend(["q_proj", "k_proj", "v_proj", "o_proj"].iter().map(|p| format!("self_attn.{p}.weight")));
                if cfg.int("qk_norm") == 1 {
                    required.extend(["self_attn.q_norm.weight".into(), "self_attn.k_norm.weight".into()]);
                }
            }
            for r in &required {
                if !present.contains(&r.as_str()) {
                    return Err(format!("missing tensor {layers}{i}.{r}"));
                }
            }
            let rank = |s: &str| names.iter().position(|(n, _)| *n == s).unwrap_or(usize::MAX);
            present.sort_by(|a, b| (rank(a), *a).cmp(&(rank(b), *b)));
            for suffix in present {
                let hf = format!("{layers}{i}.{suffix}");
                let mapped = match (names.iter().find(|(n, _)| *n == suffix), suffix.strip_prefix("linear_attn.")) {
                    (Some((_, m)), _) => *m,
                    (None, Some(short)) if cfg.family.linear_attention => LINEAR_NAMES
                        .iter()
                        .find(|(n, _)| *n == short)
                        .map(|(_, m)| *m)
                        .ok_or_else(|| format!("unexpected tensor {hf} for arch {}", cfg.family.arch))?,
                    _ => return Err(format!("unexpected tensor {hf} for arch {}", cfg.family.arch)),
                };
                let mut e = entry(format!("blk.{i}.{mapped}"), &hf)?;
                if mapped == "ssm_conv" {
                    // [channels, 1, kernel] → [channels, kernel]
                    match e.2[..] {
                        [c, 1, k] => e.2 = vec![c, k],
                        _ => return Err(format!("{hf}: shape {:?}, expected [channels, 1, kernel]", e.2)),
                    }
                }
                out.push(e);
            }
        }
        out.push(entry("output_norm".into(), &format!("{prefix}norm.weight"))?);
        if let (false, Some(head)) = (tie, lm_head) {
            out.push(entry("output".into(), head)?);
        }
        Ok((meta, out))
    }
}
