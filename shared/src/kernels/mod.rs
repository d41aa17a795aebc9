//! The kernel seam.
//!
//! `arch` is the kernel module this build was compiled for, chosen by
//! `cfg(target_feature)` at compile time; there is no runtime dispatch. Each
//! ISA module exports the same functions as `portable` (the scalar
//! reference), and the algorithms above the innermost loops — the blocked
//! matrix multiply, attention, RoPE — are written once, here and in
//! `model.rs`, on top of those functions.

use std::sync::OnceLock;

use half::f16;
use rayon::prelude::*;

use crate::quant::{quantize_act, BlockQ4_0, BlockQ4_0F32, BlockQ8Act, BlockQ8_0, BlockQ8_0F32, QK};

pub mod portable;

// One line per ISA module as they are added; exactly one `arch` is in scope.
pub use portable as arch;

/// Name of the kernel set compiled into this build.
pub const ISA: &str = "portable";

/// Borrowed rows of a weight matrix, in their stored type.
#[derive(Clone, Copy)]
pub enum WeightData<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Q8_0(&'a [BlockQ8_0]),
    Q4_0(&'a [BlockQ4_0]),
    Q8_0F32(&'a [BlockQ8_0F32]),
    Q4_0F32(&'a [BlockQ4_0F32]),
}

/// A [rows, cols] weight matrix (row-major, cols contiguous).
#[derive(Clone, Copy)]
pub struct MatRef<'a> {
    pub rows: usize,
    pub cols: usize,
    pub data: WeightData<'a>,
}

impl<'a> MatRef<'a> {
    pub fn is_quantized(&self) -> bool {
        !matches!(self.data, WeightData::F32(_) | WeightData::F16(_))
    }

    /// Dot product of row `r` with one input row.
    #[inline]
    fn row_dot(&self, r: usize, x: &[f32], xq: &[BlockQ8Act]) -> f32 {
        let (c, b) = (self.cols, self.cols / QK);
        match self.data {
            WeightData::F32(w) => arch::dot_f32(&w[r * c..(r + 1) * c], x),
            WeightData::F16(w) => arch::dot_f16_f32(&w[r * c..(r + 1) * c], x),
            WeightData::Q8_0(w) => arch::dot_q8(&w[r * b..(r + 1) * b], xq),
            WeightData::Q8_0F32(w) => arch::dot_q8(&w[r * b..(r + 1) * b], xq),
            WeightData::Q4_0(w) => arch::dot_q4(&w[r * b..(r + 1) * b], xq),
            WeightData::Q4_0F32(w) => arch::dot_q4(&w[r * b..(r + 1) * b], xq),
        }
    }

    /// Row `r` as f32 (embedding lookup).
    pub fn row_to_f32(&self, r: usize, out: &mut [f32]) {
        let (c, b) = (self.cols, self.cols / QK);
        match self.data {
            WeightData::F32(w) => out.copy_from_slice(&w[r * c..(r + 1) * c]),
            WeightData::F16(w) => arch::f16_to_f32(&w[r * c..(r + 1) * c], out),
            WeightData::Q8_0(w) => crate::quant::dequant_q8(&w[r * b..(r + 1) * b], out),
            WeightData::Q8_0F32(w) => crate::quant::dequant_q8(&w[r * b..(r + 1) * b], out),
            WeightData::Q4_0(w) => crate::quant::dequant_q4(&w[r * b..(r + 1) * b], out),
            WeightData::Q4_0F32(w) => crate::quant::dequant_q4(&w[r * b..(r + 1) * b], out),
        }
    }
}

/// A batch of input rows [n_tokens][cols] plus, computed once on demand,
/// their Q8 quantisation for quantised weights.
pub struct Input<'a> {
    pub x: &'a [f32],
    pub cols: usize,
    q8: OnceLock<Vec<BlockQ8Act>>,
}

impl<'a> Input<'a> {
    pub fn new(x: &'a [f32], cols: usize) -> Self {
        debug_assert_eq!(x.len() % cols, 0);
        Input { x, cols, q8: OnceLock::new() }
    }
    pub fn n_tokens(&self) -> usize {
        self.x.len() / self.cols
    }
    fn q8(&self) -> &[BlockQ8Act] {
        self.q8.get_or_init(|| {
            let mut q = vec![BlockQ8Act::default(); self.x.len() / QK];
            quantize_act(self.x, &mut q);
            q
        })
    }
}

/// Rows of the weight matrix handled by one task: small enough to balance
/// threads, large enough that a tile of weights is reused across tokens.
const ROW_TILE: usize = 16;

/// out[t][r] = Σ_c w[r][c] · x[t][c] for every token t of `input`.
///
/// Each output element is one `row_dot` call, whatever the thread count or
/// batch size, so results are bit-identical across both. Weight rows are
/// walked in tiles, each tile applied to every token while it is in cache.
pub fn matmul(w: &MatRef, input: &Input, out: &mut [f32]) {
    let n_tok = input.n_tokens();
    assert_eq!(input.cols, w.cols, "matmul: input width does not match the weight matrix");
    assert_eq!(out.len(), n_tok * w.rows);
    let xq: &[BlockQ8Act] = if w.is_quantized() { input.q8() } else { &[] };
    let bpr = w.cols / QK; // activation blocks per token
    let one_token = |t: usize| -> (&[f32], &[BlockQ8Act]) {
        let x = &input.x[t * w.cols..(t + 1) * w.cols];
        let q = if xq.is_empty() { xq } else { &xq[t * bpr..(t + 1) * bpr] };
        (x, q)
    };
    if n_tok == 1 {
        let (x, q) = one_token(0);
        out.par_chunks_mut(ROW_TILE).enumerate().for_each(|(tile, o)| {
            for (i, v) in o.iter_mut().enumerate() {
                *v = w.row_dot(tile * ROW_TILE + i, x, q);
            }
        });
        return;
    }
    // Token-major results are gathered per row tile ([rows][tokens]) and
    // transposed afterwards, so every task writes one contiguous chunk.
    let mut by_row = vec![0.0f32; out.len()];
    by_row.par_chunks_mut(ROW_TILE * n_tok).enumerate().for_each(|(tile, o)| {
        let r0 = tile * ROW_TILE;
        let rows = o.len() / n_tok;
        for t in 0..n_tok {
            let (x, q) = one_token(t);
            for i in 0..rows {
                o[i * n_tok + t] = w.row_dot(r0 + i, x, q);
            }
        }
    });
    for t in 0..n_tok {
        for r in 0..w.rows {
            out[t * w.rows + r] = by_row[r * n_tok + t];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequant_q4, dequant_q8, Q4Block, Q8Block};

    /// Small deterministic generator (xorshift) for test data.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn f32(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        }
        fn vec(&mut self, n: usize) -> Vec<f32> {
            (0..n).map(|_| self.f32()).collect()
        }
    }

    fn q8_blocks(rng: &mut Rng, n: usize) -> Vec<BlockQ8_0> {
        (0..n)
            .map(|_| {
                let mut b = BlockQ8_0 { d: f16::from_f32(rng.f32() * 0.1), qs: [0; QK] };
                b.qs.iter_mut().for_each(|q| *q = rng.next() as i8);
                b
            })
            .collect()
    }
    fn q4_blocks(rng: &mut Rng, n: usize) -> Vec<BlockQ4_0> {
        (0..n)
            .map(|_| {
                let mut b = BlockQ4_0 { d: f16::from_f32(rng.f32() * 0.1), qs: [0; QK / 2] };
                b.qs.iter_mut().for_each(|q| *q = rng.next() as u8);
                b
            })
            .collect()
    }
    fn act(rng: &mut Rng, n_blocks: usize) -> (Vec<f32>, Vec<BlockQ8Act>) {
        let x = rng.vec(n_blocks * QK);
        let mut q = vec![BlockQ8Act::default(); n_blocks];
        quantize_act(&x, &mut q);
        (x, q)
    }
    fn f64_dot(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
    }

    /// Exact integer reference for a Q8 × Q8act dot: per-block integer sums.
    fn exact_blocks_q8<B: Q8Block>(w: &[B], x: &[BlockQ8Act]) -> f64 {
        w.iter()
            .zip(x)
            .map(|(bw, bx)| {
                let s: i64 = bw.quants().iter().zip(&bx.qs).map(|(&a, &b)| a as i64 * b as i64).sum();
                bw.scale() as f64 * bx.d as f64 * s as f64
            })
            .sum()
    }
    fn exact_blocks_q4<B: Q4Block>(w: &[B], x: &[BlockQ8Act]) -> f64 {
        let mut wf = vec![0.0f32; QK];
        w.iter()
            .zip(x)
            .map(|(bw, bx)| {
                dequant_q4(std::slice::from_ref(bw), &mut wf);
                let s: f64 = wf.iter().zip(&bx.qs).map(|(&a, &b)| a as f64 * b as f64).sum();
                s * bx.d as f64
            })
            .sum()
    }

    #[test]
    fn dot_f32_matches_f64_on_odd_lengths() {
        let mut rng = Rng(0x9e3779b97f4a7c15);
        for n in [1, 3, 7, 8, 15, 31, 33, 64, 100, 257, 1000, 4099] {
            let (a, b) = (rng.vec(n), rng.vec(n));
            let want = f64_dot(&a, &b);
            let bound = 1e-6 * n as f64 + 1e-6;
            assert!((arch::dot_f32(&a, &b) as f64 - want).abs() <= bound, "n={n}");
            assert_eq!(arch::dot_f32(&a, &b).to_bits(), arch::dot_f32(&a, &b).to_bits());
            let h: Vec<f16> = a.iter().map(|&v| f16::from_f32(v)).collect();
            let hf: Vec<f32> = h.iter().map(|v| v.to_f32()).collect();
            assert!((arch::dot_f16_f32(&h, &b) as f64 - f64_dot(&hf, &b)).abs() <= bound, "f16 n={n}");
        }
    }

    #[test]
    fn quantized_dots_match_exact_reference() {
        let mut rng = Rng(12345);
        for nb in [1, 2, 3, 5, 8, 17, 18, 64, 191] {
            let (_, xq) = act(&mut rng, nb);
            let w8 = q8_blocks(&mut rng, nb);
            let w4 = q4_blocks(&mut rng, nb);
            let (g8, g4) = (arch::dot_q8(&w8, &xq), arch::dot_q4(&w4, &xq));
            let (e8, e4) = (exact_blocks_q8(&w8, &xq), exact_blocks_q4(&w4, &xq));
            // Integer parts are exact; only the per-block f32 scaling and the
            // f32 accumulation round.
            let scale8: f64 = w8.iter().zip(&xq).map(|(a, b)| (a.scale() * b.d).abs() as f64 * 32.0 * 127.0 * 127.0).sum();
            let scale4: f64 = w4.iter().zip(&xq).map(|(a, b)| (a.scale() * b.d).abs() as f64 * 32.0 * 8.0 * 127.0).sum();
            assert!((g8 as f64 - e8).abs() <= 2e-6 * scale8, "q8 nb={nb}: {g8} vs {e8}");
            assert!((g4 as f64 - e4).abs() <= 2e-6 * scale4, "q4 nb={nb}: {g4} vs {e4}");
            assert_eq!(g8.to_bits(), portable::dot_q8(&w8, &xq).to_bits(), "q8 differs from portable");
            assert_eq!(g4.to_bits(), portable::dot_q4(&w4, &xq).to_bits(), "q4 differs from portable");
        }
    }

    #[test]
    fn activation_quantization_error_is_bounded() {
        let mut rng = Rng(777);
        let (x, q) = act(&mut rng, 9);
        let mut back = vec![0.0f32; x.len()];
        for (i, b) in q.iter().enumerate() {
            for j in 0..QK {
                back[i * QK + j] = b.d * b.qs[j] as f32;
            }
            assert_eq!(b.sum, b.qs.iter().map(|&v| v as i32).sum::<i32>());
        }
        for (i, (&a, &b)) in x.iter().zip(&back).enumerate() {
            assert!((a - b).abs() <= q[i / QK].d * 0.5 + 1e-7);
        }
    }

    #[test]
    fn matmul_is_identical_for_any_batch_and_thread_count() {
        let mut rng = Rng(4242);
        let (rows, cols, n_tok) = (37, 96, 9);
        let w4 = q4_blocks(&mut rng, rows * cols / QK);
        let w8 = q8_blocks(&mut rng, rows * cols / QK);
        let wf = rng.vec(rows * cols);
        let x = rng.vec(n_tok * cols);
        for data in [WeightData::Q4_0(&w4), WeightData::Q8_0(&w8), WeightData::F32(&wf)] {
            let m = MatRef { rows, cols, data };
            let mut batched = vec![0.0; n_tok * rows];
            matmul(&m, &Input::new(&x, cols), &mut batched);
            for t in 0..n_tok {
                let mut single = vec![0.0; rows];
                let xs = &x[t * cols..(t + 1) * cols];
                for threads in [1, 3] {
                    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                    pool.install(|| matmul(&m, &Input::new(xs, cols), &mut single));
                    let got: Vec<u32> = single.iter().map(|v| v.to_bits()).collect();
                    let want: Vec<u32> = batched[t * rows..(t + 1) * rows].iter().map(|v| v.to_bits()).collect();
                    assert_eq!(got, want, "token {t}, {threads} threads");
                }
            }
        }
    }

    #[test]
    fn matmul_matches_dequantized_f64() {
        let mut rng = Rng(99);
        let (rows, cols) = (5, 64);
        let w8 = q8_blocks(&mut rng, rows * cols / QK);
        let x = rng.vec(cols);
        let mut out = vec![0.0; rows];
        matmul(&MatRef { rows, cols, data: WeightData::Q8_0(&w8) }, &Input::new(&x, cols), &mut out);
        let mut wrow = vec![0.0f32; cols];
        for r in 0..rows {
            dequant_q8(&w8[r * 2..r * 2 + 2], &mut wrow);
            let want = f64_dot(&wrow, &x);
            let mag: f64 = wrow.iter().zip(&x).map(|(a, b)| (a * b).abs() as f64).sum();
            // activation quantisation error is at most half a step per element
            assert!((out[r] as f64 - want).abs() <= 0.02 * mag + 1e-4, "row {r}: {} vs {want}", out[r]);
        }
    }

    #[test]
    fn f32_ops_match_f64() {
        let mut rng = Rng(5);
        for n in [1, 7, 33, 576] {
            let x = rng.vec(n);
            let w = rng.vec(n);
            let mut out = vec![0.0; n];
            arch::rmsnorm(&x, &w, 1e-5, 1.0, &mut out);
            let ms: f64 = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
            let inv = 1.0 / (ms + 1e-5).sqrt();
            for i in 0..n {
                let want = x[i] as f64 * inv * (w[i] as f64 + 1.0);
                assert!((out[i] as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()));
            }
            let mut s = x.clone();
            arch::softmax(&mut s);
            let mx = x.iter().fold(f64::MIN, |m, &v| m.max(v as f64));
            let z: f64 = x.iter().map(|&v| (v as f64 - mx).exp()).sum();
            for i in 0..n {
                assert!((s[i] as f64 - (x[i] as f64 - mx).exp() / z).abs() <= 1e-6);
            }
            let (mut g, u) = (x.clone(), w.clone());
            arch::silu_mul(&mut g, &u);
            for i in 0..n {
                let v = x[i] as f64;
                assert!((g[i] as f64 - v / (1.0 + (-v).exp()) * u[i] as f64).abs() <= 1e-6);
            }
            let mut g = x.clone();
            arch::gelu_tanh_mul(&mut g, &u);
            for i in 0..n {
                let v = x[i] as f64;
                let want = 0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh());
                assert!((g[i] as f64 - want * u[i] as f64).abs() <= 1e-6);
            }
        }
    }
}
