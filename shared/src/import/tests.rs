//! GGUF import on small made-up files: the metadata and tensor order, which
//! tensors stay in the file and which are converted, the conversion's
//! accuracy, `save` round trips, the tokenizer, and hostile files (clean
//! errors, never a panic).

use std::sync::Arc;

use super::dequant::dequantize;
use super::gguf::import_model;
use super::quantize::{quantize_q4_0, quantize_q8_0, Q4Rule};
use super::tokenizer::import_tokenizer;
use super::{ConvertType, ImportOptions};
use crate::format::gguf::{test_array, write_gguf, GgmlType, Gguf, Value};
use crate::format::mlb::{interleave_rows8, Layout, MetaValue, Mlb, TensorType};
use crate::kernels::{Arch, Kernels};
use crate::model::{LoadOptions, LogitsFor, Model, State};
use crate::quant::{BlockQ4_0, BlockQ8_0};
use crate::test_rng::Rng;

const D: u64 = 256;
const F: u64 = 512;
const V: u64 = 40;
const HD: u64 = 64;

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Random Q4_1 blocks for `n` weights (small, finite scales).
fn q4_1(rng: &mut Rng, n: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..n / 32 {
        out.extend(half::f16::from_f32(0.002 + 0.001 * rng.f32()).to_le_bytes());
        out.extend(half::f16::from_f32(-0.015 + 0.001 * rng.f32()).to_le_bytes());
        out.extend((0..16).map(|_| rng.next() as u8));
    }
    out
}

/// Random Q6_K super-blocks for `n` weights.
fn q6_k(rng: &mut Rng, n: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..n / 256 {
        out.extend((0..192).map(|_| rng.next() as u8));
        out.extend((0..16).map(|_| (rng.next() % 64) as u8));
        out.extend(half::f16::from_f32(0.0005).to_le_bytes());
    }
    out
}

/// A one-layer llama GGUF: norms in F32, token_embd in Q6_K, attention in
/// Q4_1, the feed-forward's gate in Q8_0 (kept), the rest Q4_1; its own
/// byte-level tokenizer of V tokens.
fn tiny_llama(extra_meta: &[(&str, Value)], drop: &[&str]) -> Vec<u8> {
    tiny_llama_edited(extra_meta, drop, |_| {})
}

/// A GGUF tensor as `write_gguf` takes it: name, type, GGUF dims, bytes.
type TestTensor = (&'static str, GgmlType, Vec<u64>, Vec<u8>);

/// `tiny_llama` with its tensors changed by `edit` first.
fn tiny_llama_edited(extra_meta: &[(&str, Value)], drop: &[&str], edit: impl Fn(&mut Vec<TestTensor>)) -> Vec<u8> {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let ones: Vec<f32> = (0..D).map(|_| 1.0 + 0.1 * rng.f32()).collect();
    let q8: Vec<u8> = (0..F * D / 32)
        .flat_map(|_| {
            let mut b = half::f16::from_f32(0.01).to_le_bytes().to_vec();
            b.extend((0..32).map(|_| (rng.next() % 200) as u8));
            b
        })
        .collect();
    let mut tensors = vec![
        ("token_embd.weight", GgmlType::Q6K, vec![D, V], q6_k(&mut rng, D * V)),
        ("output_norm.weight", GgmlType::F32, vec![D], f32_bytes(&ones)),
        ("blk.0.attn_norm.weight", GgmlType::F32, vec![D], f32_bytes(&ones)),
        ("blk.0.attn_q.weight", GgmlType::Q4_1, vec![D, 4 * HD], q4_1(&mut rng, D * 4 * HD)),
        ("blk.0.attn_k.weight", GgmlType::Q4_1, vec![D, 2 * HD], q4_1(&mut rng, D * 2 * HD)),
        ("blk.0.attn_v.weight", GgmlType::Q4_1, vec![D, 2 * HD], q4_1(&mut rng, D * 2 * HD)),
        ("blk.0.attn_output.weight", GgmlType::Q4_1, vec![4 * HD, D], q4_1(&mut rng, D * 4 * HD)),
        ("blk.0.ffn_norm.weight", GgmlType::F32, vec![D], f32_bytes(&ones)),
        ("blk.0.ffn_gate.weight", GgmlType::Q8_0, vec![D, F], q8),
        ("blk.0.ffn_up.weight", GgmlType::Q4_1, vec![D, F], q4_1(&mut rng, D * F)),
        ("blk.0.ffn_down.weight", GgmlType::Q4_1, vec![F, D], q4_1(&mut rng, D * F)),
    ];
    tensors.retain(|t| !drop.contains(&t.0));
    edit(&mut tensors);
    let tokens: Vec<String> =
        (0..V).map(|i| if i < 26 { ((b'a' + i as u8) as char).to_string() } else { format!("t{i}") }).collect();
    let token_values: Vec<Value> = tokens.iter().map(|t| Value::Str(Box::leak(t.clone().into_boxed_str()))).collect();
    let mut meta = vec![
        ("general.architecture", Value::Str("llama")),
        ("llama.embedding_length", Value::U32(D as u32)),
        ("llama.block_count", Value::U32(1)),
        ("llama.attention.head_count", Value::U32(4)),
        ("llama.attention.head_count_kv", Value::U32(2)),
        ("llama.feed_forward_length", Value::U32(F as u32)),
        ("llama.context_length", Value::U32(64)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.rope.freq_base", Value::F32(10000.0)),
        ("tokenizer.ggml.model", Value::Str("gpt2")),
        ("tokenizer.ggml.pre", Value::Str("smollm")),
        ("tokenizer.ggml.tokens", test_array(8, &token_values)),
        ("tokenizer.ggml.merges", test_array(8, &[Value::Str("a b"), Value::Str("c d")])),
        ("tokenizer.ggml.bos_token_id", Value::U32(1)),
        ("tokenizer.ggml.eos_token_id", Value::U32(2)),
    ];
    for &(k, v) in extra_meta {
        match meta.iter_mut().find(|(key, _)| *key == k) {
            Some(entry) => entry.1 = v,
            None => meta.push((k, v)),
        }
    }
    write_gguf(&meta, &tensors)
}

fn import(bytes: Vec<u8>, ctype: ConvertType) -> Result<Mlb, String> {
    import_model(Gguf::from_bytes(bytes, "t.gguf")?, &ImportOptions::new(ctype)).map_err(|e| e.to_string())
}

#[test]
fn a_tiny_llama_imports_in_convert_py_order() {
    let mlb = import(tiny_llama(&[], &[]), ConvertType::Q4_0).unwrap();
    let keys: Vec<&str> = mlb.meta_in_order().map(|(k, _)| k).collect();
    assert_eq!(
        keys,
        [
            "arch",
            "vocab_size",
            "hidden_size",
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "ffn_dim",
            "context_length",
            "norm_eps",
            "rope_theta",
            "rope_style",
            "bos_id",
            "eos_id",
            "tie_embeddings",
            "convert_type",
            "convert_q4_scale"
        ]
    );
    assert_eq!(mlb.meta["rope_style"], MetaValue::Str("interleaved".into()));
    assert_eq!(mlb.meta["norm_eps"], MetaValue::Float(f64::from(1e-5f32)));
    let names: Vec<(&str, TensorType)> = mlb.tensors.iter().map(|t| (t.name.as_str(), t.ttype)).collect();
    use TensorType::*;
    assert_eq!(
        names,
        [
            ("token_embd", Q6K), // a K-quant is kept whatever --type (issue 15)
            ("blk.0.attn_k", Q4_0),
            ("blk.0.attn_norm", F32),
            ("blk.0.attn_o", Q4_0),
            ("blk.0.attn_q", Q4_0),
            ("blk.0.attn_v", Q4_0),
            ("blk.0.ffn_down", Q4_0),
            ("blk.0.ffn_gate", Q8_0),
            ("blk.0.ffn_norm", F32),
            ("blk.0.ffn_up", Q4_0),
            ("output_norm", F32),
        ]
    );
    // kept tensors stay in the file; the others were made, 64-byte aligned
    let g = Gguf::from_bytes(tiny_llama(&[], &[]), "t.gguf").unwrap();
    let gate = g.tensor("blk.0.ffn_gate.weight").unwrap();
    assert_eq!(mlb.tensor("blk.0.ffn_gate").unwrap().start, gate.start);
    let embd = g.tensor("token_embd.weight").unwrap();
    assert_eq!(mlb.tensor("token_embd").unwrap().start, embd.start);
    assert_eq!(mlb.tensor_bytes(mlb.tensor("blk.0.ffn_gate").unwrap()), g.tensor_bytes(gate));
    assert!(mlb.tensor("blk.0.ffn_up").unwrap().start.is_multiple_of(64));
    assert!(mlb.converted_bytes() > 0);
    // a made-from-GGUF model loads and runs
    let model = Model::from_mlb(Arc::new(mlb), LoadOptions::default()).unwrap();
    let mut st = State::new(&model.config, 8).unwrap();
    let logits = model.forward(&mut st, &[3, 4, 5], LogitsFor::Last).unwrap();
    assert!(logits.len() == V as usize && logits.iter().all(|v| v.is_finite()));
}

/// A converted tensor is the quantiser's blocks of the dequantised source,
/// and within half a Q8_0 step of it.
#[test]
fn converted_tensors_are_the_quantised_source() {
    let bytes = tiny_llama(&[], &[]);
    let g = Gguf::from_bytes(bytes.clone(), "t.gguf").unwrap();
    let src = g.tensor("blk.0.ffn_up.weight").unwrap();
    let mut x = vec![0.0f32; (D * F) as usize];
    dequantize(src.ty, g.tensor_bytes(src), &mut x);
    let mut q8 = vec![BlockQ8_0::default(); x.len() / 32];
    quantize_q8_0(&x, &mut q8);
    let mut q4 = vec![BlockQ4_0::default(); x.len() / 32];
    quantize_q4_0(&x, x.len(), Q4Rule::Fit, None, &mut q4);
    // in plain rows, or (on builds whose kernels read them) made straight
    // into the eight-row groups of the same rows, as a saved file holds them
    let made = |ctype| {
        let mlb = import(bytes.clone(), ctype).unwrap();
        let t = mlb.tensor("blk.0.ffn_up").unwrap();
        (t.layout, t.ttype, t.dims.clone(), mlb.tensor_bytes(t).to_vec())
    };
    let laid_out = |(layout, ttype, dims, bytes): (Layout, TensorType, Vec<u64>, Vec<u8>), plain: &[u8]| {
        let want = match layout {
            Layout::Rows => plain.to_vec(),
            Layout::Rows8 => interleave_rows8(ttype, &dims, plain, "test").unwrap(),
        };
        assert_eq!(bytes, want, "{ttype:?} {layout:?}");
        layout
    };
    let q8_layout = laid_out(made(ConvertType::Q8_0), bytemuck::cast_slice::<BlockQ8_0, u8>(&q8));
    let q4_layout = laid_out(made(ConvertType::Q4_0), bytemuck::cast_slice::<BlockQ4_0, u8>(&q4));
    let q8_groups = Arch::ROWS8 && Arch::Q8_X8_BIAS == 0;
    assert_eq!((q4_layout == Layout::Rows8, q8_layout == Layout::Rows8), (Arch::ROWS8, q8_groups));
    let mut back = vec![0.0f32; x.len()];
    dequantize(GgmlType::Q8_0, bytemuck::cast_slice::<BlockQ8_0, u8>(&q8), &mut back);
    for (b, (w, g)) in x.chunks(32).zip(back.chunks(32)).enumerate() {
        let amax = w.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for (w, g) in w.iter().zip(g) {
            // half a step, plus the f16 rounding of the scale (2^-11 relative, times 127 steps)
            assert!((w - g).abs() <= amax / 127.0 * 0.5 + amax * 1e-3, "block {b}: {w} vs {g}");
        }
    }
}

#[test]
fn save_writes_what_open_reads_back() {
    let mlb = import(tiny_llama(&[], &[]), ConvertType::Auto).unwrap();
    let dir = std::env::temp_dir().join(format!("krafla-import-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b) = (dir.join("a.mlb"), dir.join("b.mlb"));
    mlb.save(&a).unwrap();
    let back = Mlb::open(&a).unwrap();
    assert_eq!(back.file_len(), mlb.file_len());
    assert_eq!(back.meta_in_order().collect::<Vec<_>>(), mlb.meta_in_order().collect::<Vec<_>>());
    for (x, y) in back.tensors.iter().zip(&mlb.tensors) {
        assert_eq!((&x.name, x.ttype, &x.dims), (&y.name, y.ttype, &y.dims));
        // the imported tensors are plain rows; save stores matrices of eight rows or more in groups
        let want = if x.layout == y.layout {
            mlb.tensor_bytes(y).to_vec()
        } else {
            assert_eq!(x.layout, crate::format::mlb::Layout::Rows8, "{}", x.name);
            crate::format::mlb::interleave_rows8(y.ttype, &y.dims, mlb.tensor_bytes(y), "test").unwrap()
        };
        assert_eq!(back.tensor_bytes(x), want, "{}", x.name);
    }
    back.save(&b).unwrap();
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    assert_eq!(std::fs::read(&a).unwrap().len(), mlb.file_len());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_tokenizer_comes_from_the_file() {
    let g = Gguf::from_bytes(tiny_llama(&[], &[]), "t.gguf").unwrap();
    let raw = import_tokenizer(&g).unwrap();
    assert_eq!(raw.tokens.len(), V as usize);
    assert_eq!((raw.bos, raw.eos, raw.eot), (Some(1), Some(2), Some(2)));
    assert_eq!(raw.merges, [(0, 1), (2, 3)]);
    assert_eq!(raw.chat_template, "");
    let g = Gguf::from_bytes(
        tiny_llama(&[("tokenizer.chat_template", Value::Str("{{ '<|im_start|>' + role }}"))], &[]),
        "t.gguf",
    )
    .unwrap();
    assert_eq!(import_tokenizer(&g).unwrap().chat_template, "chatml");
    let g = Gguf::from_bytes(tiny_llama(&[("tokenizer.ggml.pre", Value::Str("chameleon"))], &[]), "t.gguf").unwrap();
    let err = import_tokenizer(&g).unwrap_err();
    assert!(err.contains("unsupported tokenizer: tokenizer.ggml.pre \"chameleon\""), "{err}");
}

#[test]
fn sentencepiece_merges_come_from_the_scores() {
    // pieces: a b c ab bc abc; scores favour "bc" over "ab"; "abc" = ab+c or a+bc
    let tokens = ["a", "b", "c", "ab", "bc", "abc"];
    let values: Vec<Value> = tokens.iter().map(|t| Value::Str(t)).collect();
    let scores: Vec<Value> = [-1.0f32, -1.0, -1.0, -3.0, -2.0, -4.0].iter().map(|&s| Value::F32(s)).collect();
    let bytes = write_gguf(
        &[
            ("tokenizer.ggml.model", Value::Str("llama")),
            ("tokenizer.ggml.tokens", test_array(8, &values)),
            ("tokenizer.ggml.scores", test_array(6, &scores)),
        ],
        &[],
    );
    let raw = import_tokenizer(&Gguf::from_bytes(bytes, "s.gguf").unwrap()).unwrap();
    // best score first: bc (−2) = b+c, ab (−3) = a+b, abc (−4) = a+bc, ab+c
    assert_eq!(raw.merges, [(1, 2), (0, 1), (0, 4), (3, 2)]);
}

#[test]
fn bad_models_are_clean_errors() {
    let check = |bytes: Vec<u8>, needle: &str| {
        let err = import(bytes, ConvertType::Auto).err().expect("accepted a bad model");
        assert!(err.starts_with("t.gguf: ") && err.contains(needle), "error '{err}' lacks '{needle}'");
    };
    check(tiny_llama(&[], &["blk.0.ffn_up.weight"]), "missing tensor blk.0.ffn_up.weight");
    check(tiny_llama(&[], &["token_embd.weight"]), "missing tensor token_embd.weight");
    check(tiny_llama(&[("llama.block_count", Value::U64(1 << 40))], &[]), "");
    check(tiny_llama(&[("llama.attention.head_count_kv", Value::U32(3))], &[]), "not a multiple");
    check(tiny_llama(&[("llama.attention.head_count", Value::U32(0))], &[]), "must be positive");
    check(tiny_llama(&[("llama.embedding_length", Value::Str("x"))], &[]), "should be a count");
    check(tiny_llama(&[("llama.feed_forward_length", Value::U32(7))], &[]), "shape");
    let mut other = tiny_llama(&[], &[]);
    let at = other.windows(5).position(|w| w == b"llama").unwrap();
    other[at..at + 5].copy_from_slice(b"bloom");
    check(other, "unsupported architecture \"bloom\"");
}

/// A GGUF file of a few hundred bytes: the hyperparameters of `arch` with
/// `layers` layers (and a sliding window, which makes the mistral and qwen2
/// families list a kind per layer), one token embedding, and the tensors of
/// `with_layers` layers.
fn few_bytes_with_layers(arch: &str, layers: u64, with_layers: u64) -> Vec<u8> {
    let key = |k: &str| -> &'static str { Box::leak(format!("{arch}.{k}").into_boxed_str()) };
    let meta = [
        ("general.architecture", Value::Str(Box::leak(arch.to_string().into_boxed_str()))),
        (key("block_count"), Value::U64(layers)),
        (key("embedding_length"), Value::U32(32)),
        (key("attention.head_count"), Value::U32(2)),
        (key("feed_forward_length"), Value::U32(32)),
        (key("attention.sliding_window"), Value::U32(4)),
    ];
    let mut tensors = vec![("token_embd.weight".to_string(), GgmlType::F32, vec![32, 4], vec![0u8; 4 * 32 * 4])];
    for i in 0..with_layers {
        for t in ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up"] {
            tensors.push((format!("blk.{i}.{t}.weight"), GgmlType::F32, vec![32], vec![0u8; 4 * 32]));
        }
    }
    let tensors: Vec<(&str, GgmlType, Vec<u64>, Vec<u8>)> =
        tensors.iter().map(|(n, t, d, b)| (n.as_str(), *t, d.clone(), b.clone())).collect();
    write_gguf(&meta, &tensors)
}

/// A huge block count is refused with its key and numbers before anything
/// is made per layer, in every family (those with a kind per layer
/// allocated one for each layer the file claimed: 8 TB for 2^40); a count
/// within the limit but beyond the layers the file has tensors for too.
#[test]
fn block_counts_beyond_the_limit_or_the_tensors_are_refused() {
    for arch in ["llama", "mistral", "qwen2", "gemma2", "gemma3"] {
        for layers in [1u64 << 26, 1 << 40, 1 << 61, u64::MAX >> 1, 1025, 0] {
            let bytes = few_bytes_with_layers(arch, layers, 0);
            let err = import(bytes, ConvertType::Auto).err().expect("accepted a hostile block count");
            assert_eq!(err, format!("t.gguf: {arch}.block_count = {layers} is outside 1..=1024"));
        }
        for (layers, with) in [(1024, 0), (3, 2)] {
            let err = import(few_bytes_with_layers(arch, layers, with), ConvertType::Auto).err().unwrap();
            assert_eq!(
                err,
                format!("t.gguf: {arch}.block_count = {layers}, but the file has tensors for {with} layers")
            );
        }
        // within both: the first layer's missing tensor is what is wrong
        let err = import(few_bytes_with_layers(arch, 2, 2), ConvertType::Auto).err().unwrap();
        assert!(err.contains("missing tensor blk.0.ffn_down.weight"), "{err}");
    }
}

/// Mutated files never panic the loader or the tokenizer import.
#[test]
fn mutations_never_panic() {
    let good = tiny_llama(&[], &[]);
    let mut rng = Rng(0x0bad_f00d_dead_beef);
    // mutate the header (metadata and tensor table), where the structure is
    let header = good.len() - (good.len() / 2);
    for _ in 0..1500 {
        let mut b = good.clone();
        for _ in 0..1 + rng.next() % 3 {
            let at = (rng.next() % header as u64) as usize;
            match rng.next() % 3 {
                0 => b[at] ^= 1 << (rng.next() % 8),
                1 => b[at] = 0xff,
                _ => b[at] = (rng.next() % 10) as u8,
            }
        }
        if let Ok(g) = Gguf::from_bytes(b, "m.gguf") {
            let _ = import_tokenizer(&g);
            let _ = import_model(g, &ImportOptions::new(ConvertType::Q8_0));
        }
    }
}

/// `bytes` with the little-endian f32 or f16 at `at` replaced by `v`.
fn poke(bytes: &mut [u8], at: usize, v: f32, f16: bool) {
    if f16 {
        bytes[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
    } else {
        bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
}

/// `tiny_llama` with tensor `name`'s bytes changed by `change`.
fn tiny_llama_with(name: &str, change: impl Fn(&mut Vec<u8>)) -> Vec<u8> {
    tiny_llama_edited(&[], &[], |tensors| change(&mut tensors.iter_mut().find(|t| t.0 == name).unwrap().3))
}

/// The error of loading `bytes` (imported as `ctype`) and running three
/// tokens through it: from the import, the load, or the forward pass;
/// with the eight-row copies made at load (where the build's kernels read
/// them) and without (`--no-repack`: every matrix read in place), the
/// same error each time.
fn run_error(bytes: Vec<u8>, ctype: ConvertType) -> String {
    let run = |repack: bool| {
        let mlb = import(bytes.clone(), ctype)?;
        let model = Model::from_mlb(Arc::new(mlb), LoadOptions { repack })?;
        let mut st = State::new(&model.config, 8).unwrap();
        let err = model.forward(&mut st, &[3, 4, 5], LogitsFor::Last).expect_err("ran with non-finite values");
        assert_eq!(st.pos, 0, "the state is back where it was");
        Err::<(), String>(err)
    };
    let (copied, in_place) = (run(true).unwrap_err(), run(false).unwrap_err());
    // (found in the logits instead of the copy, the error tells them too)
    assert!(in_place.starts_with(&copied) || copied.starts_with(&in_place), "{copied} / {in_place}");
    copied
}

/// A NaN or infinity in a norm, in a matrix the import converts, or in the
/// scale of a block used as stored is a one-line error naming the tensor:
/// at load where the values are copied (norms, repacked blocks, converted
/// tensors), else when the logits come out not finite (their cause then
/// found among the weights).
#[test]
fn non_finite_weights_are_named() {
    let t = "t.gguf: tensor";
    for (v, shown) in [(f32::NAN, "NaN"), (f32::INFINITY, "inf"), (f32::NEG_INFINITY, "-inf")] {
        // a norm, copied at load
        let bytes = tiny_llama_with("blk.0.ffn_norm.weight", |b| poke(b, 4 * 7, v, false));
        let err = run_error(bytes, ConvertType::Q4_0);
        assert_eq!(err, format!("{t} 'blk.0.ffn_norm' has a non-finite value ({shown}) at element 7"));
        // a Q4_1 matrix converted to Q4_0 (by --type q8_0: to Q8_0): block 3's d, block 4's m
        for ctype in [ConvertType::Q4_0, ConvertType::Q8_0] {
            let bytes = tiny_llama_with("blk.0.ffn_up.weight", |b| poke(b, 20 * 3, v, true));
            let err = run_error(bytes, ctype);
            assert_eq!(err, format!("{t} 'blk.0.ffn_up.weight' has a non-finite scale ({shown}) in block 3"));
            let bytes = tiny_llama_with("blk.0.ffn_up.weight", |b| poke(b, 20 * 4 + 2, v, true));
            let err = run_error(bytes, ctype);
            assert_eq!(err, format!("{t} 'blk.0.ffn_up.weight' has a non-finite scale ({shown}) in block 4"));
        }
        // an F32 matrix converted (--requantize): the value
        let bytes = tiny_llama_edited(&[], &[], |tensors| {
            let up = tensors.iter_mut().find(|t| t.0 == "blk.0.ffn_up.weight").unwrap();
            let mut values = vec![0.01f32; (D * F) as usize];
            values[D as usize * 300 + 5] = v;
            *up = (up.0, GgmlType::F32, up.2.clone(), f32_bytes(&values));
        });
        let opts = ImportOptions { requantize: true, ..ImportOptions::new(ConvertType::Q4_0) };
        let err = import_model(Gguf::from_bytes(bytes, "t.gguf").unwrap(), &opts).err().unwrap().to_string();
        let at = D * 300 + 5;
        assert_eq!(err, format!("{t} 'blk.0.ffn_up.weight' has a non-finite value ({shown}) at element {at}"));
    }
    // a Q8_0 matrix used as stored (the attention's output, in Q8_0 here):
    // its block 5's scale, found as it is repacked (builds with eight-row
    // kernels) or once the logits are NaN
    let bytes = tiny_llama_edited(&[], &[], |tensors| {
        let o = tensors.iter_mut().find(|t| t.0 == "blk.0.attn_output.weight").unwrap();
        let mut q8: Vec<u8> = (0..(D * 4 * HD / 32) as usize)
            .flat_map(|i| {
                let mut b = half::f16::from_f32(0.01).to_le_bytes().to_vec();
                b.extend((0..32).map(|j| ((i * 7 + j * 13) % 200) as u8));
                b
            })
            .collect();
        poke(&mut q8, 34 * 5, f32::INFINITY, true);
        *o = (o.0, GgmlType::Q8_0, o.2.clone(), q8);
    });
    let err = run_error(bytes, ConvertType::Auto);
    assert!(err.starts_with(&format!("{t} 'blk.0.attn_o' has a non-finite scale (inf) in block 5")), "{err}");
    // a Q6_K embedding's (tied: also the output's) block 9, whose d is last
    let bytes = tiny_llama_with("token_embd.weight", |b| poke(b, 210 * 9 + 208, f32::NAN, true));
    let err = run_error(bytes, ConvertType::Auto);
    assert!(err.starts_with(&format!("{t} 'token_embd' has a non-finite scale (NaN) in block 9")), "{err}");
}

/// The same in a saved `.mlb`, whose matrices are in eight-row groups:
/// used in place (named once the logits are NaN, the block counted in
/// row-major order all the same) or de-interleaved at load.
#[test]
fn non_finite_scales_in_eight_row_groups_are_named() {
    let dir = std::env::temp_dir().join(format!("krafla-nonfinite-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (clean, path) = (dir.join("clean.mlb"), dir.join("m.mlb"));
    import(tiny_llama(&[], &[]), ConvertType::Q4_0).unwrap().save(&clean).unwrap();
    // (tensor, bytes of its eight-row group block, blocks a row, row, block)
    let cases = [("blk.0.ffn_down", 8 * 18, (F / 32) as usize, 13, 6), ("token_embd", 8 * 210, 1, 17, 0)];
    for (name, group_block, nb, row, block) in cases {
        let mlb = Mlb::open(&clean).unwrap();
        let t = mlb.tensor(name).unwrap();
        assert_eq!(t.layout, Layout::Rows8);
        // d[row % 8] of group block (row / 8, block): every layout's first field
        let at = t.start + (row / 8 * nb + block) * group_block + 2 * (row % 8);
        let mut bytes = std::fs::read(&clean).unwrap();
        bytes[at..at + 2].copy_from_slice(&half::f16::INFINITY.to_le_bytes());
        std::fs::write(&path, bytes).unwrap();
        let err = match Model::from_mlb(Arc::new(Mlb::open(&path).unwrap()), LoadOptions::default()) {
            Err(e) => e,
            Ok(model) => {
                let mut st = State::new(&model.config, 8).unwrap();
                model.forward(&mut st, &[3, 4, 5], LogitsFor::Last).err().unwrap_or_else(|| panic!("{name}"))
            }
        };
        let want =
            format!("{}: tensor '{name}' has a non-finite scale (inf) in block {}", path.display(), row * nb + block);
        assert!(err.starts_with(&want), "{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A finite value the target type cannot hold (an f16 scale overflows) is
/// an error naming the tensor and block, not an infinite scale.
#[test]
fn values_too_large_for_the_conversion_are_named() {
    let bytes = tiny_llama_edited(&[], &[], |tensors| {
        let up = tensors.iter_mut().find(|t| t.0 == "blk.0.ffn_up.weight").unwrap();
        let mut values = vec![0.01f32; (D * F) as usize];
        values[32 * 11 + 4] = 1e10;
        *up = (up.0, GgmlType::F32, up.2.clone(), f32_bytes(&values));
    });
    let g = Gguf::from_bytes(bytes, "t.gguf").unwrap();
    let opts = ImportOptions { requantize: true, ..ImportOptions::new(ConvertType::Q8_0) };
    let err = import_model(g, &opts).err().unwrap().to_string();
    assert_eq!(
        err,
        "t.gguf: tensor 'blk.0.ffn_up.weight' has values too large for q8_0 (its f16 scale overflows) in block 11"
    );
}

/// Finite weights whose activations overflow: the logits say so, every
/// weight being finite; finite logits pass as they are.
#[test]
fn overflowing_activations_are_told_apart_from_weights() {
    // a huge (finite) output norm: the head's input overflows f32
    let bytes = tiny_llama_with("output_norm.weight", |b| {
        b.chunks_exact_mut(4).for_each(|v| v.copy_from_slice(&f32::MAX.to_le_bytes()))
    });
    let err = run_error(bytes, ConvertType::Q4_0);
    assert!(
        err.starts_with("the logits at position 2 are not finite (")
            && err.ends_with("while every weight is finite: the activations overflowed"),
        "{err}"
    );
    let model =
        Model::from_mlb(Arc::new(import(tiny_llama(&[], &[]), ConvertType::Q4_0).unwrap()), LoadOptions::default())
            .unwrap();
    let mut st = State::new(&model.config, 8).unwrap();
    let logits = model.forward(&mut st, &[3, 4, 5], LogitsFor::All).unwrap();
    let mut st2 = State::new(&model.config, 8).unwrap();
    let direct = model
        .forward_batch(&mut [crate::model::Segment { state: &mut st2, tokens: &[3, 4, 5], want: LogitsFor::All }])
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(
        logits.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        direct.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    assert_eq!(model.check_logits(&[0.0, -3e38, 3e38, f32::MIN_POSITIVE], 0), Ok(()));
    let v = V as usize;
    let mut bad = vec![1.0f32; 2 * v];
    bad[v + 7] = f32::NEG_INFINITY;
    let err = model.check_logits(&bad, 10).unwrap_err();
    assert!(err.starts_with("the logits at position 11 are not finite (-inf for token 7)"), "{err}");
}

#[test]
fn f32_and_f16_convert_every_matrix_but_the_types_krafla_reads_unless_requantized() {
    use super::convert::choose_type;
    let m = [256u64, 512];
    for (ctype, want) in [(ConvertType::F32, TensorType::F32), (ConvertType::F16, TensorType::F16)] {
        // a float source (safetensors, llama2.c: nothing kept), rows of any length
        assert_eq!(choose_type("blk.0.attn_q", &m, None, ctype), want);
        assert_eq!(choose_type("blk.0.attn_q", &[64, 48], None, ctype), want);
        assert_eq!(choose_type("token_embd", &m, None, ctype), want);
        // GGUF: what Krafla reads stays; the rest (Q4_1, BF16 as F32) converts
        assert_eq!(choose_type("blk.0.attn_q", &m, Some(GgmlType::Q4K), ctype), TensorType::Q4K);
        assert_eq!(choose_type("blk.0.attn_q", &m, Some(GgmlType::Q4_1), ctype), want);
        // vectors stay F32 under any type
        assert_eq!(choose_type("blk.0.attn_norm", &[256], None, ctype), TensorType::F32);
    }
    assert_eq!(choose_type("blk.0.attn_q", &m, Some(GgmlType::BF16), ConvertType::F16), TensorType::F32);
    // q8_0 of a float source; rows that are not whole blocks in F16
    assert_eq!(choose_type("blk.0.attn_q", &m, None, ConvertType::Q8_0), TensorType::Q8_0);
    assert_eq!(choose_type("blk.0.attn_q", &[64, 48], None, ConvertType::Q8_0), TensorType::F16);
}

#[test]
fn a_template_with_channels_is_harmony() {
    let jinja = "{{- \"<|start|>assistant<|channel|>final<|message|>\" + message.content + \"<|end|>\" }}";
    assert_eq!(super::tokenizer::template_kind(jinja), "harmony");
    assert_eq!(super::tokenizer::template_kind("<|im_start|>{{ m }}<|im_end|>"), "chatml");
}
