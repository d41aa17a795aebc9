//! Quantised block layouts (docs/FORMAT.md) and the activation quantiser.
//!
//! Weights use llama.cpp-compatible Q8_0 / Q4_0 blocks of 32 with an f16
//! scale (or an f32 scale). Activations are quantised on the fly to
//! `BlockQ8Act`: 32 int8 values with an f32 scale and their integer sum, the
//! sum letting Q4_0 kernels fold the −8 offset out of the inner loop.

use half::f16;

/// Weights per block.
pub const QK: usize = 32;

/// Q8_0 weight block: x = d · q.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

/// Q4_0 weight block: byte j holds element j (low nibble) and j + 16 (high
/// nibble); x = d · (nibble − 8).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

/// Q8_0 with an f32 scale.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8_0F32 {
    pub d: f32,
    pub qs: [i8; QK],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0F32>() == 36);

/// Q4_0 with an f32 scale.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4_0F32 {
    pub d: f32,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0F32>() == 20);

/// Activation block: x ≈ d · q, `sum` = Σ q (exact).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8Act {
    pub d: f32,
    pub sum: i32,
    pub qs: [i8; QK],
}
const _: () = assert!(std::mem::size_of::<BlockQ8Act>() == 40);

impl Default for BlockQ8Act {
    fn default() -> Self {
        BlockQ8Act { d: 0.0, sum: 0, qs: [0; QK] }
    }
}

/// A Q8 weight block, whatever its scale type.
pub trait Q8Block: Copy + Send + Sync + 'static {
    fn scale(&self) -> f32;
    fn quants(&self) -> &[i8; QK];
}
/// A Q4 weight block, whatever its scale type.
pub trait Q4Block: Copy + Send + Sync + 'static {
    fn scale(&self) -> f32;
    fn nibbles(&self) -> &[u8; QK / 2];
}

impl Q8Block for BlockQ8_0 {
    #[inline(always)]
    fn scale(&self) -> f32 {
        self.d.to_f32()
    }
    #[inline(always)]
    fn quants(&self) -> &[i8; QK] {
        &self.qs
    }
}
impl Q8Block for BlockQ8_0F32 {
    #[inline(always)]
    fn scale(&self) -> f32 {
        self.d
    }
    #[inline(always)]
    fn quants(&self) -> &[i8; QK] {
        &self.qs
    }
}
impl Q4Block for BlockQ4_0 {
    #[inline(always)]
    fn scale(&self) -> f32 {
        self.d.to_f32()
    }
    #[inline(always)]
    fn nibbles(&self) -> &[u8; QK / 2] {
        &self.qs
    }
}
impl Q4Block for BlockQ4_0F32 {
    #[inline(always)]
    fn scale(&self) -> f32 {
        self.d
    }
    #[inline(always)]
    fn nibbles(&self) -> &[u8; QK / 2] {
        &self.qs
    }
}

/// Quantises `x` (length a multiple of 32) into activation blocks with the
/// symmetric rule d = max|x| / 127, q = round(x / d).
pub fn quantize_act(x: &[f32], out: &mut [BlockQ8Act]) {
    debug_assert_eq!(x.len(), out.len() * QK);
    for (chunk, block) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let amax = chunk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in block.qs.iter_mut().zip(chunk) {
            *q = (v * inv).round() as i8;
            sum += *q as i32;
        }
        block.d = d;
        block.sum = sum;
    }
}

/// Dequantises one row of Q8 blocks.
pub fn dequant_q8<B: Q8Block>(blocks: &[B], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let d = b.scale();
        for (v, &q) in o.iter_mut().zip(b.quants()) {
            *v = d * q as f32;
        }
    }
}

/// Dequantises one row of Q4 blocks.
pub fn dequant_q4<B: Q4Block>(blocks: &[B], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let d = b.scale();
        for (j, &byte) in b.nibbles().iter().enumerate() {
            o[j] = d * ((byte & 0x0f) as i32 - 8) as f32;
            o[j + QK / 2] = d * ((byte >> 4) as i32 - 8) as f32;
        }
    }
}
