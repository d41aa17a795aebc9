//! The kernel set: every operation the model needs from an instruction set,
//! as one trait that each ISA module implements (`Sse2`, `Avx2`, `Neon`,
//! ...; `Portable` is the scalar reference). The compiler checks that each
//! set is complete and that the signatures agree. Where an ISA has no kernel
//! of its own for an operation, the default method here fills it in, built
//! from that ISA's own kernels: four tokens as four single-token dots,
//! several KV rows as a loop over the single-row kernels. The eight-row
//! kernels over interleaved weights default to `Portable`'s reference, which
//! only tests reach: a set without its own (`ROWS8` false; for the K-quant
//! ones `KQUANT_ROWS8` false) makes the model keep those weights in the
//! plain layout, so they are never called.
//!
//! Every implementation returns the same bits as `Portable` (see
//! `kernels/portable.rs` for the summation order), which the kernel tests
//! (`kernels/tests.rs`) check on every build.

use half::f16;

use super::portable::Portable;
use crate::quant::{
    ActQ8, ActRef, BlockMxfp4, BlockMxfp4x8, BlockQ4K, BlockQ4Kx8, BlockQ4_0x8, BlockQ5K, BlockQ5Kx8, BlockQ6K,
    BlockQ6Kx8, BlockQ8_0, BlockQ8_0x8, Q4Block, Q8Block,
};

pub trait Kernels {
    /// This set has its own eight-row kernels (`dot_q8_r8` ...): the model
    /// copies Q8_0 / Q4_0 matrices into the interleaved layout at load time.
    const ROWS8: bool = false;
    /// What the eight-row Q8 kernels expect XORed into every interleaved
    /// quant (`quant::repack_q8_x8`).
    const Q8_X8_BIAS: u8 = Portable::Q8_X8_BIAS;
    /// This set has its own eight-row K-quant kernels (`dot_q4k_r8`,
    /// `dot_q5k_r8`, `dot_q6k_r8` ...): the model copies Q4_K / Q5_K / Q6_K matrices into the
    /// interleaved layout at load time (the other sets keep them per row).
    const KQUANT_ROWS8: bool = false;
    /// This set has its own eight-row MXFP4 kernels (`dot_mxfp4_r8` ...):
    /// the model copies MXFP4 matrices into the interleaved layout at load
    /// time (the other sets keep them per row).
    const MXFP4_ROWS8: bool = false;
    /// What `int8_peak` runs, for `--bench`'s line.
    const INT8_PEAK: &'static str = "the one-row dot_q8 loop";

    // ---- f32 vectors

    /// Σ a[i]·b[i].
    fn dot_f32(a: &[f32], b: &[f32]) -> f32;
    /// Σ w[i]·x[i] for f16 weights.
    fn dot_f16_f32(w: &[f16], x: &[f32]) -> f32;
    /// out = x / sqrt(mean(x²) + eps) · w.
    fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]);
    /// In-place softmax.
    fn softmax(x: &mut [f32]);
    /// y += a·x.
    fn axpy(a: f32, x: &[f32], y: &mut [f32]);
    /// gate ← silu(gate)·up (SwiGLU).
    fn silu_mul(gate: &mut [f32], up: &[f32]);
    /// gate ← gelu_tanh(gate)·up (GeGLU, tanh approximation).
    fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]);
    /// f16 → f32 of a slice (exact).
    fn f16_to_f32(src: &[f16], dst: &mut [f32]);
    /// e^x of every element through the set's vector exp (the one behind
    /// softmax, SiLU and GELU); for the kernel tests.
    fn exp(x: &mut [f32]);

    // ---- attention over f32 KV rows (row p at `rows[p·stride..]`)

    /// out[p] = `dot_f32`(q, row p).
    fn dot_f32_rows(q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
        let n = q.len();
        for (p, o) in out.iter_mut().enumerate() {
            *o = Self::dot_f32(q, &rows[p * stride..p * stride + n]);
        }
    }
    /// out += w[p]·row p, p in order (each element as `axpy` row after row).
    fn axpy_rows(w: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
        let n = out.len();
        for (p, &a) in w.iter().enumerate() {
            Self::axpy(a, &rows[p * stride..p * stride + n], out);
        }
    }

    // ---- int8 dots: weight blocks · quantised activation blocks

    /// Q8 weights · Q8 activations.
    fn dot_q8<'a, B: Q8Block>(w: &[B], x: impl Into<ActRef<'a>>) -> f32;
    /// Q4 weights · Q8 activations.
    fn dot_q4<'a, B: Q4Block>(w: &[B], x: impl Into<ActRef<'a>>) -> f32;
    /// One weight row with four activation rows (prompt batches); result t
    /// is `dot_q8` of row t, bit for bit.
    fn dot_q8_x4<B: Q8Block>(w: &[B], xs: [ActRef; 4]) -> [f32; 4] {
        xs.map(|x| Self::dot_q8(w, x))
    }
    /// As `dot_q8_x4` for Q4 weights.
    fn dot_q4_x4<B: Q4Block>(w: &[B], xs: [ActRef; 4]) -> [f32; 4] {
        xs.map(|x| Self::dot_q4(w, x))
    }

    /// MXFP4 weights · Q8 activations (no default: every set has its own):
    /// block b's exact Σ `MXFP4_VALUES`[nibble]·q, scaled by
    /// `e8m0_half(e)`·d_x, in `dot_q8`'s order.
    fn dot_mxfp4(w: &[BlockMxfp4], x: ActRef) -> f32;
    /// One MXFP4 row with four activation rows; result t is `dot_mxfp4` of row t, bit for bit.
    fn dot_mxfp4_x4(w: &[BlockMxfp4], xs: [ActRef; 4]) -> [f32; 4] {
        xs.map(|x| Self::dot_mxfp4(w, x))
    }

    // ---- eight interleaved rows (`quant::BlockQ8_0x8`, `BlockQ4_0x8`)

    /// Eight interleaved Q8 rows · one activation row: row k's result is
    /// `dot_q8` of row k, bit for bit.
    fn dot_q8_r8(w: &[BlockQ8_0x8], x: ActRef) -> [f32; 8] {
        Portable::dot_q8_r8(w, x)
    }
    /// As `dot_q8_r8` for Q4 rows.
    fn dot_q4_r8(w: &[BlockQ4_0x8], x: ActRef) -> [f32; 8] {
        Portable::dot_q4_r8(w, x)
    }
    /// Eight interleaved Q8 rows · two activation rows (short batches:
    /// speculative decoding's verification, a batched server step).
    fn dot_q8_r8_x2(w: &[BlockQ8_0x8], xs: [ActRef; 2]) -> [[f32; 8]; 2] {
        xs.map(|x| Self::dot_q8_r8(w, x))
    }
    /// As `dot_q8_r8_x2` for Q4 rows.
    fn dot_q4_r8_x2(w: &[BlockQ4_0x8], xs: [ActRef; 2]) -> [[f32; 8]; 2] {
        xs.map(|x| Self::dot_q4_r8(w, x))
    }
    /// Eight interleaved Q8 rows · three activation rows.
    fn dot_q8_r8_x3(w: &[BlockQ8_0x8], xs: [ActRef; 3]) -> [[f32; 8]; 3] {
        xs.map(|x| Self::dot_q8_r8(w, x))
    }
    /// Eight interleaved Q4 rows · three activation rows.
    fn dot_q4_r8_x3(w: &[BlockQ4_0x8], xs: [ActRef; 3]) -> [[f32; 8]; 3] {
        xs.map(|x| Self::dot_q4_r8(w, x))
    }
    /// Eight interleaved Q8 rows · four activation rows.
    fn dot_q8_r8_x4(w: &[BlockQ8_0x8], xs: [ActRef; 4]) -> [[f32; 8]; 4] {
        xs.map(|x| Self::dot_q8_r8(w, x))
    }
    /// Eight interleaved Q4 rows · four activation rows.
    fn dot_q4_r8_x4(w: &[BlockQ4_0x8], xs: [ActRef; 4]) -> [[f32; 8]; 4] {
        xs.map(|x| Self::dot_q4_r8(w, x))
    }

    // ---- eight interleaved MXFP4 rows (`quant::BlockMxfp4x8`; defaults as
    // for `dot_q8_r8`, reached only by tests for a set without its own,
    // `MXFP4_ROWS8` false)

    /// Eight interleaved MXFP4 rows · one activation row: row k's result is
    /// `dot_mxfp4` of row k, bit for bit.
    fn dot_mxfp4_r8(w: &[BlockMxfp4x8], x: ActRef) -> [f32; 8] {
        Portable::dot_mxfp4_r8(w, x)
    }
    /// Eight interleaved MXFP4 rows · two activation rows.
    fn dot_mxfp4_r8_x2(w: &[BlockMxfp4x8], xs: [ActRef; 2]) -> [[f32; 8]; 2] {
        xs.map(|x| Self::dot_mxfp4_r8(w, x))
    }
    /// Eight interleaved MXFP4 rows · three activation rows.
    fn dot_mxfp4_r8_x3(w: &[BlockMxfp4x8], xs: [ActRef; 3]) -> [[f32; 8]; 3] {
        xs.map(|x| Self::dot_mxfp4_r8(w, x))
    }
    /// Eight interleaved MXFP4 rows · four activation rows.
    fn dot_mxfp4_r8_x4(w: &[BlockMxfp4x8], xs: [ActRef; 4]) -> [[f32; 8]; 4] {
        xs.map(|x| Self::dot_mxfp4_r8(w, x))
    }

    // ---- prompt tiles: two interleaved groups (16 rows) · a run of tokens

    /// Tokens a prompt tile kernel (`tile_q8`, `tile_q4`, `tile_q4k`, `tile_q6k`) of this set takes
    /// at most; 0: the set has none, and `matmul` runs long batches through
    /// the eight-row kernels four tokens at a time.
    const TILE_TOKENS: usize = 0;
    /// Two consecutive interleaved Q8 groups (`w[g·nb + b]`, g = 0, 1) · the
    /// activation rows `xs` (at most `TILE_TOKENS`): `out[t][8·g + k]` is
    /// `dot_q8` of group g's row k with token t, bit for bit. The default
    /// (and those of the other tiles) runs the eight-row kernels, up to four
    /// tokens a call (`tile_by_rows8`).
    fn tile_q8(w: &[BlockQ8_0x8], nb: usize, xs: &[ActRef], out: &mut [[f32; 16]]) {
        tile_by_rows8(w, nb, xs, out, (Self::dot_q8_r8, Self::dot_q8_r8_x2, Self::dot_q8_r8_x3, Self::dot_q8_r8_x4))
    }
    /// As `tile_q8` for Q4 groups.
    fn tile_q4(w: &[BlockQ4_0x8], nb: usize, xs: &[ActRef], out: &mut [[f32; 16]]) {
        tile_by_rows8(w, nb, xs, out, (Self::dot_q4_r8, Self::dot_q4_r8_x2, Self::dot_q4_r8_x3, Self::dot_q4_r8_x4))
    }

    /// As `tile_q8` for MXFP4 groups: `dot_mxfp4` of each row, bit for bit.
    fn tile_mxfp4(w: &[BlockMxfp4x8], nb: usize, xs: &[ActRef], out: &mut [[f32; 16]]) {
        tile_by_rows8(
            w,
            nb,
            xs,
            out,
            (Self::dot_mxfp4_r8, Self::dot_mxfp4_r8_x2, Self::dot_mxfp4_r8_x3, Self::dot_mxfp4_r8_x4),
        )
    }

    /// Asks for `bytes` to be brought into the L2 cache ahead of use (a
    /// prompt tile's weights, read while the previous tile computes); a
    /// hint with no effect on results. The default does nothing.
    #[inline]
    fn prefetch(bytes: &[u8]) {
        let _ = bytes;
    }

    /// As `tile_q8` for Q4_K groups (`nb` super-blocks each): `out[t][8·g
    /// + k]` is `dot_q4k` of group g's row k with token t, bit for bit.
    fn tile_q4k(w: &[BlockQ4Kx8], nb: usize, xs: &[ActRef], out: &mut [[f32; 16]]) {
        tile_by_rows8(w, nb, xs, out, (Self::dot_q4k_r8, Self::dot_q4k_r8_x2, Self::dot_q4k_r8_x3, Self::dot_q4k_r8_x4))
    }
    /// As `tile_q4k` for Q5_K groups: `dot_q5k` of each row, bit for bit.
    fn tile_q5k(w: &[BlockQ5Kx8], nb: usize, xs: &[ActRef], out: &mut [[f32; 16]]) {
        tile_by_rows8(w, nb, xs, out, (Self::dot_q5k_r8, Self::dot_q5k_r8_x2, Self::dot_q5k_r8_x3, Self::dot_q5k_r8_x4))
    }
    /// As `tile_q4k` for Q6_K groups: `dot_q6k` of each row, bit for bit.
    fn tile_q6k(w: &[BlockQ6Kx8], nb: usize, xs: &[ActRef], out: &mut [[f32; 16]]) {
        tile_by_rows8(w, nb, xs, out, (Self::dot_q6k_r8, Self::dot_q6k_r8_x2, Self::dot_q6k_r8_x3, Self::dot_q6k_r8_x4))
    }

    // ---- K-quant super-blocks of 256 · quantised activation blocks
    // (eight activation blocks per super-block; the order is `Portable`'s)

    /// Q4_K weights · Q8 activations (no default: every set has its own).
    fn dot_q4k(w: &[BlockQ4K], x: ActRef) -> f32;
    /// Q5_K weights · Q8 activations.
    fn dot_q5k(w: &[BlockQ5K], x: ActRef) -> f32;
    /// Q6_K weights · Q8 activations.
    fn dot_q6k(w: &[BlockQ6K], x: ActRef) -> f32;
    /// One Q4_K row with four activation rows; result t is `dot_q4k` of row t, bit for bit.
    fn dot_q4k_x4(w: &[BlockQ4K], xs: [ActRef; 4]) -> [f32; 4] {
        xs.map(|x| Self::dot_q4k(w, x))
    }
    /// As `dot_q4k_x4` for Q5_K.
    fn dot_q5k_x4(w: &[BlockQ5K], xs: [ActRef; 4]) -> [f32; 4] {
        xs.map(|x| Self::dot_q5k(w, x))
    }
    /// As `dot_q4k_x4` for Q6_K.
    fn dot_q6k_x4(w: &[BlockQ6K], xs: [ActRef; 4]) -> [f32; 4] {
        xs.map(|x| Self::dot_q6k(w, x))
    }

    // ---- eight interleaved K-quant rows (`quant::BlockQ4Kx8`, `BlockQ5Kx8`, `BlockQ6Kx8`;
    // defaults as for `dot_q8_r8`: `Portable`'s reference, reached only by
    // tests for a set without its own, `KQUANT_ROWS8` false)

    /// Eight interleaved Q4_K rows · one activation row: row k's result is
    /// `dot_q4k` of row k, bit for bit.
    fn dot_q4k_r8(w: &[BlockQ4Kx8], x: ActRef) -> [f32; 8] {
        Portable::dot_q4k_r8(w, x)
    }
    /// Eight interleaved Q4_K rows · two activation rows.
    fn dot_q4k_r8_x2(w: &[BlockQ4Kx8], xs: [ActRef; 2]) -> [[f32; 8]; 2] {
        xs.map(|x| Self::dot_q4k_r8(w, x))
    }
    /// Eight interleaved Q4_K rows · three activation rows.
    fn dot_q4k_r8_x3(w: &[BlockQ4Kx8], xs: [ActRef; 3]) -> [[f32; 8]; 3] {
        xs.map(|x| Self::dot_q4k_r8(w, x))
    }
    /// Eight interleaved Q4_K rows · four activation rows.
    fn dot_q4k_r8_x4(w: &[BlockQ4Kx8], xs: [ActRef; 4]) -> [[f32; 8]; 4] {
        xs.map(|x| Self::dot_q4k_r8(w, x))
    }
    /// Eight interleaved Q5_K rows · one activation row: row k's result is
    /// `dot_q5k` of row k, bit for bit.
    fn dot_q5k_r8(w: &[BlockQ5Kx8], x: ActRef) -> [f32; 8] {
        Portable::dot_q5k_r8(w, x)
    }
    /// As `dot_q4k_r8_x2` for Q5_K.
    fn dot_q5k_r8_x2(w: &[BlockQ5Kx8], xs: [ActRef; 2]) -> [[f32; 8]; 2] {
        xs.map(|x| Self::dot_q5k_r8(w, x))
    }
    /// As `dot_q4k_r8_x3` for Q5_K.
    fn dot_q5k_r8_x3(w: &[BlockQ5Kx8], xs: [ActRef; 3]) -> [[f32; 8]; 3] {
        xs.map(|x| Self::dot_q5k_r8(w, x))
    }
    /// As `dot_q4k_r8_x4` for Q5_K.
    fn dot_q5k_r8_x4(w: &[BlockQ5Kx8], xs: [ActRef; 4]) -> [[f32; 8]; 4] {
        xs.map(|x| Self::dot_q5k_r8(w, x))
    }
    /// Eight interleaved Q6_K rows · one activation row: row k's result is
    /// `dot_q6k` of row k, bit for bit.
    fn dot_q6k_r8(w: &[BlockQ6Kx8], x: ActRef) -> [f32; 8] {
        Portable::dot_q6k_r8(w, x)
    }
    /// Eight interleaved Q6_K rows · two activation rows.
    fn dot_q6k_r8_x2(w: &[BlockQ6Kx8], xs: [ActRef; 2]) -> [[f32; 8]; 2] {
        xs.map(|x| Self::dot_q6k_r8(w, x))
    }
    /// Eight interleaved Q6_K rows · three activation rows.
    fn dot_q6k_r8_x3(w: &[BlockQ6Kx8], xs: [ActRef; 3]) -> [[f32; 8]; 3] {
        xs.map(|x| Self::dot_q6k_r8(w, x))
    }
    /// Eight interleaved Q6_K rows · four activation rows.
    fn dot_q6k_r8_x4(w: &[BlockQ6Kx8], xs: [ActRef; 4]) -> [[f32; 8]; 4] {
        xs.map(|x| Self::dot_q6k_r8(w, x))
    }

    // ---- the int8 multiply-accumulate peak (`--bench`)

    /// `rounds` rounds of this set's own int8 dot instruction sequence (as
    /// its kernels use it) on register-resident data, with enough
    /// independent chains to keep its units busy; returns the
    /// multiply-accumulates done (one 8-bit × 8-bit product added into a
    /// sum) and a checksum that keeps the work from being optimised away.
    /// Without a loop of its own a set gets the figure of its one-row kernel
    /// loop: `dot_q8` over a row of 64 blocks that stays in L1.
    fn int8_peak(rounds: usize) -> (u64, i32) {
        const NB: usize = 64;
        let w: Vec<BlockQ8_0> = (0..NB)
            .map(|b| BlockQ8_0 {
                d: f16::from_f32(0.5),
                qs: core::array::from_fn(|i| ((b * 7 + i * 13) % 255) as u8 as i8),
            })
            .collect();
        let x: Vec<f32> = (0..NB * 32).map(|i| ((i * 29) % 17) as f32 - 8.0).collect();
        let xq = ActQ8::quantize(&x);
        let mut sum = 0.0f32;
        for _ in 0..rounds {
            sum += Self::dot_q8(core::hint::black_box(&w[..]), xq.as_ref());
        }
        ((rounds * NB * 32) as u64, sum.to_bits() as i32)
    }
}

/// The eight-row kernels of one kind of group, for one to four tokens
/// (`tile_by_rows8`'s argument).
type Rows8Kernels<B> = (
    fn(&[B], ActRef) -> [f32; 8],
    fn(&[B], [ActRef; 2]) -> [[f32; 8]; 2],
    fn(&[B], [ActRef; 3]) -> [[f32; 8]; 3],
    fn(&[B], [ActRef; 4]) -> [[f32; 8]; 4],
);

/// A prompt tile (two groups of `nb` blocks, `Kernels::tile_q8`) through a
/// set's eight-row kernels `k`, up to four tokens a call: `out[t][8·g +
/// k]` is group g's row k with token t, the kernels' own bits.
#[inline]
fn tile_by_rows8<B>(w: &[B], nb: usize, xs: &[ActRef], out: &mut [[f32; 16]], k: Rows8Kernels<B>) {
    assert!(w.len() >= 2 * nb && out.len() >= xs.len(), "prompt tile: two groups of {nb} blocks");
    for (xs, out) in xs.chunks(4).zip(out.chunks_mut(4)) {
        for (g, group) in [&w[..nb], &w[nb..2 * nb]].into_iter().enumerate() {
            let mut put = |rows: &[[f32; 8]]| {
                for (o, r) in out.iter_mut().zip(rows) {
                    o[8 * g..8 * g + 8].copy_from_slice(r);
                }
            };
            match *xs {
                [a] => put(&[k.0(group, a)]),
                [a, b] => put(&k.1(group, [a, b])),
                [a, b, c] => put(&k.2(group, [a, b, c])),
                [a, b, c, d] => put(&k.3(group, [a, b, c, d])),
                _ => unreachable!("chunks of 1 to 4"),
            }
        }
    }
}
