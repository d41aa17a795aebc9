//! The attention KV cache in f32, f16 or Q8_0.
//!
//! Layout per stored matrix: [attention layers][ctx][Hkv·hd]. Q8_0 keeps
//! blocks of 32 along each row (so head_dim must be a multiple of 32); keys
//! are then scored with the integer Q8 dot product against a quantised
//! query, values are dequantised one row at a time.

use half::f16;

use crate::fault::Fault;
use crate::kernels::{Arch, Kernels};
use crate::quant::{dequant_q8, BlockQ8Act, BlockQ8_0, QK};

/// Element type of the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    F32,
    F16,
    Q8,
}

impl KvType {
    pub const ALL: [KvType; 3] = [KvType::F32, KvType::F16, KvType::Q8];

    /// What it stores, for `--help`.
    pub fn help(self) -> &'static str {
        match self {
            KvType::F32 => "f32 (exact)",
            KvType::F16 => "f16 (half the memory)",
            KvType::Q8 => {
                "Q8_0 blocks of 32 with an f16 scale (3.76× smaller than f32; needs a head_dim that is a multiple of 32)"
            }
        }
    }

    /// Other names it answers to (`q8_0`, as llama.cpp's `--cache-type-k` says).
    pub fn aliases(self) -> &'static [&'static str] {
        match self {
            KvType::Q8 => &["q8_0"],
            _ => &[],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8 => "q8",
        }
    }
}

/// One stored matrix (keys or values).
enum Store {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Q8(Vec<BlockQ8_0>),
}

/// A vector of `n` copies of `fill`, or a one-line error instead of an abort when memory runs out.
pub(crate) fn try_alloc<T: Clone>(n: usize, fill: T, what: &str) -> Result<Vec<T>, Fault> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        Fault::Resource(format!(
            "cannot allocate the {what} ({} MiB)",
            n.saturating_mul(std::mem::size_of::<T>()) >> 20
        ))
    })?;
    v.resize(n, fill);
    Ok(v)
}

impl Store {
    fn new(ty: KvType, values: usize, what: &str) -> Result<Store, Fault> {
        Ok(match ty {
            KvType::F32 => Store::F32(try_alloc(values, 0.0f32, what)?),
            KvType::F16 => Store::F16(try_alloc(values, f16::ZERO, what)?),
            KvType::Q8 => Store::Q8(try_alloc(values / QK, BlockQ8_0 { d: f16::ZERO, qs: [0; QK] }, what)?),
        })
    }

    fn bytes(&self) -> usize {
        match self {
            Store::F32(v) => v.len() * 4,
            Store::F16(v) => v.len() * 2,
            Store::Q8(v) => v.len() * std::mem::size_of::<BlockQ8_0>(),
        }
    }

    /// Stores `src` at value offset `at` (a multiple of 32 for Q8).
    fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            Store::F32(v) => v[at..at + src.len()].copy_from_slice(src),
            Store::F16(v) => v[at..at + src.len()].iter_mut().zip(src).for_each(|(d, &s)| *d = f16::from_f32(s)),
            Store::Q8(v) => {
                for (b, chunk) in v[at / QK..(at + src.len()) / QK].iter_mut().zip(src.chunks_exact(QK)) {
                    let amax = chunk.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                    let d = amax / 127.0;
                    let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
                    b.d = f16::from_f32(d);
                    b.qs.iter_mut().zip(chunk).for_each(|(q, &x)| *q = crate::quant::round_to_i8(x * inv));
                }
            }
        }
    }

    /// Copies `out.len()` values starting at `at` out as f32.
    fn read(&self, at: usize, out: &mut [f32]) {
        match self {
            Store::F32(v) => out.copy_from_slice(&v[at..at + out.len()]),
            Store::F16(v) => Arch::f16_to_f32(&v[at..at + out.len()], out),
            Store::Q8(v) => dequant_q8(&v[at / QK..(at + out.len()) / QK], out),
        }
    }
}

/// Keys and values of every attention layer.
pub struct KvCache {
    pub ty: KvType,
    ctx: usize,
    row: usize,
    keys: Store,
    values: Store,
}

/// A query head prepared for scoring against the cache.
pub struct Query<'a> {
    pub x: &'a [f32],
    /// Q8 blocks of `x` (only for a Q8 cache).
    pub q8: Vec<BlockQ8Act>,
}

impl KvCache {
    pub fn new(ty: KvType, layers: usize, ctx: usize, row: usize, head_dim: usize) -> Result<KvCache, Fault> {
        if ty == KvType::Q8 && !head_dim.is_multiple_of(QK) {
            return Err(format!(
                "a Q8 KV cache needs a head_dim that is a multiple of {QK} (this model's is {head_dim})"
            )
            .into());
        }
        let n = layers.checked_mul(ctx).and_then(|v| v.checked_mul(row)).ok_or("KV cache size overflows")?;
        Ok(KvCache { ty, ctx, row, keys: Store::new(ty, n, "key cache")?, values: Store::new(ty, n, "value cache")? })
    }

    pub fn bytes(&self) -> usize {
        self.keys.bytes() + self.values.bytes()
    }

    fn offset(&self, slot: usize, pos: usize) -> usize {
        (slot * self.ctx + pos) * self.row
    }

    /// Stores rows [n][Hkv·hd] of keys and values from position `pos` on.
    pub fn write(&mut self, slot: usize, pos: usize, k: &[f32], v: &[f32]) {
        let at = self.offset(slot, pos);
        self.keys.write(at, k);
        self.values.write(at, v);
    }

    /// Prepares one query head (quantised for a Q8 cache).
    pub fn query<'a>(&self, x: &'a [f32]) -> Query<'a> {
        let mut q8 = Vec::new();
        if self.ty == KvType::Q8 {
            q8 = vec![BlockQ8Act::default(); x.len() / QK];
            crate::quant::quantize_act(x, &mut q8);
        }
        Query { x, q8 }
    }

    /// q · k for the head at `head_off` of position `pos`.
    pub fn score(&self, slot: usize, pos: usize, head_off: usize, q: &Query) -> f32 {
        let at = self.offset(slot, pos) + head_off;
        let hd = q.x.len();
        match &self.keys {
            Store::F32(v) => Arch::dot_f32(q.x, &v[at..at + hd]),
            Store::F16(v) => Arch::dot_f16_f32(&v[at..at + hd], q.x),
            Store::Q8(v) => Arch::dot_q8(&v[at / QK..(at + hd) / QK], &q.q8),
        }
    }

    /// out += w · v for the head at `head_off` of position `pos`.
    /// out[i] = `score` of positions first + i (a run of the cache), f32
    /// caches through the several-rows kernel (same results).
    pub fn scores(&self, slot: usize, first: usize, head_off: usize, q: &Query, out: &mut [f32]) {
        match &self.keys {
            Store::F32(v) if !out.is_empty() => {
                let at = self.offset(slot, first) + head_off;
                let end = at + (out.len() - 1) * self.row + q.x.len();
                Arch::dot_f32_rows(q.x, &v[at..end], self.row, out);
            }
            _ => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = self.score(slot, first + i, head_off, q);
                }
            }
        }
    }

    /// out += Σ_i weights[i]·value(first + i), in order: `accumulate_value`
    /// for each position, f32 caches through the several-rows kernel (same results).
    pub fn accumulate_values(
        &self,
        slot: usize,
        first: usize,
        head_off: usize,
        weights: &[f32],
        out: &mut [f32],
        scratch: &mut [f32],
    ) {
        match &self.values {
            Store::F32(v) if !weights.is_empty() => {
                let at = self.offset(slot, first) + head_off;
                let end = at + (weights.len() - 1) * self.row + out.len();
                Arch::axpy_rows(weights, &v[at..end], self.row, out);
            }
            _ => {
                for (i, &w) in weights.iter().enumerate() {
                    self.accumulate_value(slot, first + i, head_off, w, out, scratch);
                }
            }
        }
    }

    pub fn accumulate_value(
        &self,
        slot: usize,
        pos: usize,
        head_off: usize,
        w: f32,
        out: &mut [f32],
        scratch: &mut [f32],
    ) {
        let at = self.offset(slot, pos) + head_off;
        match &self.values {
            Store::F32(v) => Arch::axpy(w, &v[at..at + out.len()], out),
            other => {
                other.read(at, scratch);
                Arch::axpy(w, scratch, out);
            }
        }
    }
}
