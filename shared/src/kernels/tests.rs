//! Every kernel of the compiled-in `Arch` against `Portable` and against
//! f64 references. `cargo xtask kernel-tests` runs these once per x86-64
//! variant (sse2, sse41, avx2, avx512vnni); tests/test_arm.py and
//! test_armv7.py run them under qemu for every ARM variant.
//!
//! Identity. The dots (f32, f16, Q8, Q4), rmsnorm and axpy of every x86
//! kernel set follow `portable`'s reduction order exactly and are tested
//! bit-identical to it: activations are re-quantised between matmuls, so a
//! one-ulp difference can flip a rounding and move logits by ~1e-2.
//! Bounds. Quantised dots: each block's integer sum is exact; only the
//! per-block f32 scaling (two roundings), the ⌈n/8⌉ − 1 adds of a lane
//! and the three of the final tree round, so for n blocks
//! |got − exact| ≤ (⌈n/8⌉ + 5)·2^-24·Σ_b |d_b|·Σ_j |w_j·x_j|
//!                 + (Σ_b Σ_j |w_j·x_j| + 2n + 8)·2^-149,
//! the last term for d_w·d_x and products that underflow to subnormals.
//! f32 dots: 1e-6·n + 1e-6 absolute on values in [-1, 1].
//! exp (vector kernels, softmax / silu / gelu): relative 1e-6 against f64.
use half::f16;

use super::portable::f16_bits_to_f32;
use super::*;
use crate::quant::{
    dequant_q4, dequant_q8, ActQ8, ActRef, BlockQ4_0, BlockQ4_0F32, BlockQ8Act, BlockQ8_0, BlockQ8_0F32, Q4Block,
    Q8Block, QK, ROWS8,
};
use crate::test_rng::Rng;

fn q8_blocks(rng: &mut Rng, n: usize) -> Vec<BlockQ8_0> {
    (0..n)
        .map(|_| {
            let mut b = BlockQ8_0 { d: f16::from_f32(rng.f32() * 0.1), qs: [0; QK] };
            b.qs.iter_mut().for_each(|q| *q = rng.next() as i8); // includes -128
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
fn act(rng: &mut Rng, n_blocks: usize) -> (Vec<f32>, ActQ8) {
    let x = rng.vec(n_blocks * QK);
    let q = ActQ8::quantize(&x);
    (x, q)
}
fn f64_dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

/// (exact Σ_b d_b·isum_b in f64, the error bound of the module doc).
fn exact_q8<B: Q8Block>(w: &[B], x: &[BlockQ8Act]) -> (f64, f64) {
    let (mut sum, mut mag, mut imag) = (0.0, 0.0, 0.0);
    for (bw, bx) in w.iter().zip(x) {
        let d = bw.scale() as f64 * bx.d as f64;
        let s: i64 = bw.quants().iter().zip(&bx.qs).map(|(&a, &b)| a as i64 * b as i64).sum();
        let m: i64 = bw.quants().iter().zip(&bx.qs).map(|(&a, &b)| (a as i64 * b as i64).abs()).sum();
        sum += d * s as f64;
        mag += d.abs() * m as f64;
        imag += m as f64;
    }
    (sum, bound(w.len(), mag, imag))
}
fn exact_q4<B: Q4Block>(w: &[B], x: &[BlockQ8Act]) -> (f64, f64) {
    let (mut sum, mut mag, mut imag) = (0.0, 0.0, 0.0);
    for (bw, bx) in w.iter().zip(x) {
        let d = bw.scale() as f64 * bx.d as f64;
        let (mut s, mut m) = (0i64, 0i64);
        for (j, &byte) in bw.nibbles().iter().enumerate() {
            for (n, q) in [((byte & 15) as i64 - 8, bx.qs[j]), ((byte >> 4) as i64 - 8, bx.qs[j + 16])] {
                s += n * q as i64;
                m += (n * q as i64).abs();
            }
        }
        sum += d * s as f64;
        mag += d.abs() * m as f64;
        imag += m as f64;
    }
    (sum, bound(w.len(), mag, imag))
}
/// The module doc's bound for `n` blocks: (⌈n/8⌉ + 5)·2^-24·mag + (imag + 2n + 8)·2^-149.
fn bound(n: usize, mag: f64, imag: f64) -> f64 {
    (n.div_ceil(8) + 5) as f64 * f64::powi(2.0, -24) * mag + (imag + (2 * n + 8) as f64) * f64::powi(2.0, -149)
}

/// `arch` against `portable` (bit for bit) and the exact f64 sum (within
/// `bound`), for these weights as given and with their scales as f32 ×
/// `f32_mul`.
fn check_quantized(tag: &str, w8: &[BlockQ8_0], w4: &[BlockQ4_0], x: &ActQ8, f32_mul: f32) {
    let xq = x.as_ref();
    let xb = xq.blocks();
    let w8f: Vec<BlockQ8_0F32> = w8.iter().map(|b| BlockQ8_0F32 { d: b.d.to_f32() * f32_mul, qs: b.qs }).collect();
    let w4f: Vec<BlockQ4_0F32> = w4.iter().map(|b| BlockQ4_0F32 { d: b.d.to_f32() * f32_mul, qs: b.qs }).collect();
    let check = |name: &str, got: f32, port: f32, (e, bound): (f64, f64)| {
        assert!((got as f64 - e).abs() <= bound, "{tag} {name}: {got} vs exact {e} (bound {bound:e})");
        assert_eq!(got.to_bits(), port.to_bits(), "{tag} {name}: {got} vs portable {port}");
    };
    // plain blocks (no contiguous scales and sums) give the same bits
    assert_eq!(Arch::dot_q8(w8, xb).to_bits(), Arch::dot_q8(w8, xq).to_bits(), "{tag} q8 from blocks");
    assert_eq!(Arch::dot_q4(w4, xb).to_bits(), Arch::dot_q4(w4, xq).to_bits(), "{tag} q4 from blocks");
    assert_eq!(
        Arch::dot_q4(&w4[..w4.len() / 2], xq.range(0, w4.len() / 2)).to_bits(),
        Portable::dot_q4(&w4[..w4.len() / 2], &xb[..w4.len() / 2]).to_bits(),
        "{tag} q4 range"
    );
    check("q8", Arch::dot_q8(w8, xq), Portable::dot_q8(w8, xq), exact_q8(w8, xb));
    check("q4", Arch::dot_q4(w4, xq), Portable::dot_q4(w4, xq), exact_q4(w4, xb));
    check("q8f32", Arch::dot_q8(&w8f, xq), Portable::dot_q8(&w8f, xq), exact_q8(&w8f, xb));
    check("q4f32", Arch::dot_q4(&w4f, xq), Portable::dot_q4(&w4f, xq), exact_q4(&w4f, xb));
}

#[test]
fn four_token_dots_equal_single_token_dots() {
    let mut rng = Rng(0x5eed_f00d_1234_5678);
    for nb in (1..=34).chain([47, 64, 65, 191, 300]) {
        let (w8, w4) = (q8_blocks(&mut rng, nb), q4_blocks(&mut rng, nb));
        let (w8f, w4f): (Vec<BlockQ8_0F32>, Vec<BlockQ4_0F32>) = (
            w8.iter().map(|b| BlockQ8_0F32 { d: b.d.to_f32(), qs: b.qs }).collect(),
            w4.iter().map(|b| BlockQ4_0F32 { d: b.d.to_f32(), qs: b.qs }).collect(),
        );
        let acts: Vec<ActQ8> = (0..4).map(|_| act(&mut rng, nb).1).collect();
        let xs = [0, 1, 2, 3].map(|t| acts[t].as_ref());
        let bits = |v: [f32; 4]| v.map(f32::to_bits);
        let single = |f: &dyn Fn(ActRef) -> f32| bits(xs.map(f));
        assert_eq!(bits(Arch::dot_q8_x4(&w8, xs)), single(&|x| Arch::dot_q8(&w8, x)), "q8 nb={nb}");
        assert_eq!(bits(Arch::dot_q4_x4(&w4, xs)), single(&|x| Arch::dot_q4(&w4, x)), "q4 nb={nb}");
        assert_eq!(bits(Arch::dot_q8_x4(&w8f, xs)), single(&|x| Arch::dot_q8(&w8f, x)), "q8f32 nb={nb}");
        assert_eq!(bits(Arch::dot_q4_x4(&w4f, xs)), single(&|x| Arch::dot_q4(&w4f, x)), "q4f32 nb={nb}");
        // activation rows of plain blocks (no contiguous scales): the one-by-one path
        let plain: Vec<Vec<BlockQ8Act>> = acts.iter().map(|a| a.as_ref().blocks().to_vec()).collect();
        let xp = [0, 1, 2, 3].map(|t| ActRef::from(&plain[t]));
        assert_eq!(bits(Arch::dot_q4_x4(&w4, xp)), single(&|x| Arch::dot_q4(&w4, x)), "q4 plain nb={nb}");
        assert_eq!(bits(Arch::dot_q8_x4(&w8, xp)), single(&|x| Arch::dot_q8(&w8, x)), "q8 plain nb={nb}");
        // odd starts (no paired activations) and even starts with an odd count, against portable
        for start in [1.min(nb), 2.min(nb)] {
            let xo = [0, 1, 2, 3].map(|t| acts[t].as_ref().range(start, nb));
            let wo = &w4[start..];
            let port = xo.map(|x| Portable::dot_q4(wo, x).to_bits());
            assert_eq!(bits(Arch::dot_q4_x4(wo, xo)), port, "q4 x4 from block {start} nb={nb}");
            assert_eq!(xo.map(|x| Arch::dot_q4(wo, x).to_bits()), port, "q4 from block {start} nb={nb}");
        }
    }
}

/// The eight-row kernels (`dot_q8_r8` ..., this build's and `Portable`'s) over
/// repacked rows against the single-row dots, bit for bit: every row of
/// every group, one token and four, odd block counts, f16 scales that are
/// subnormal, huge, zero or infinite, quants including −128; the two- and
/// three-token forms with each token in every position.
#[test]
fn eight_row_dots_equal_single_row_dots() {
    use crate::quant::{repack_q4_x8, repack_q8_x8};
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    for nb in (1..=34).chain([47, 64, 65, 191, 300]) {
        let rows = 2 * ROWS8 + 3; // two groups and three rows left in the plain layout
        let (mut w8, mut w4) = (q8_blocks(&mut rng, rows * nb), q4_blocks(&mut rng, rows * nb));
        for (i, d) in
            [f16::from_bits(1), f16::from_bits(0x3ff), f16::MAX, f16::ZERO, f16::INFINITY].into_iter().enumerate()
        {
            let at = (i * 7919) % (rows * nb);
            w8[at].d = d;
            w4[(at * 3) % (rows * nb)].d = d;
        }
        let p8 = repack_q8_x8(&w8, nb, Arch::Q8_X8_BIAS, "test").unwrap();
        let p4 = repack_q4_x8(&w4, nb, "test").unwrap();
        let (r8, r4) =
            (repack_q8_x8(&w8, nb, Portable::Q8_X8_BIAS, "test").unwrap(), repack_q4_x8(&w4, nb, "test").unwrap());
        assert_eq!((p8.len(), p4.len()), (2 * nb, 2 * nb));
        let acts: Vec<ActQ8> = (0..4).map(|_| act(&mut rng, nb).1).collect();
        let xs = [0, 1, 2, 3].map(|t| acts[t].as_ref());
        for g in 0..2 {
            let blocks = g * nb..(g + 1) * nb;
            let row = |k: usize| (g * ROWS8 + k) * nb..(g * ROWS8 + k + 1) * nb;
            let bits8 = |v: [f32; 8]| v.map(f32::to_bits);
            for (t, &x) in xs.iter().enumerate() {
                let want8: [u32; 8] = std::array::from_fn(|k| Arch::dot_q8(&w8[row(k)], x).to_bits());
                let want4: [u32; 8] = std::array::from_fn(|k| Arch::dot_q4(&w4[row(k)], x).to_bits());
                let port8: [u32; 8] = std::array::from_fn(|k| Portable::dot_q8(&w8[row(k)], x).to_bits());
                assert_eq!(want8, port8, "q8 single-row dots against portable nb={nb}");
                assert_eq!(bits8(Arch::dot_q8_r8(&p8[blocks.clone()], x)), want8, "q8 r8 nb={nb} g={g}");
                assert_eq!(bits8(Arch::dot_q4_r8(&p4[blocks.clone()], x)), want4, "q4 r8 nb={nb} g={g}");
                assert_eq!(bits8(Portable::dot_q8_r8(&r8[blocks.clone()], x)), want8, "portable q8 r8 nb={nb}");
                assert_eq!(bits8(Portable::dot_q4_r8(&r4[blocks.clone()], x)), want4, "portable q4 r8 nb={nb}");
                assert_eq!(bits8(Arch::dot_q8_r8_x4(&p8[blocks.clone()], xs)[t]), want8, "q8 r8 x4 nb={nb} t={t}");
                assert_eq!(bits8(Arch::dot_q4_r8_x4(&p4[blocks.clone()], xs)[t]), want4, "q4 r8 x4 nb={nb} t={t}");
                // token t at position p of the two- and three-token forms, the others beside it
                for p in 0..3 {
                    let x3: [ActRef; 3] = std::array::from_fn(|i| if i == p { x } else { xs[(t + i + 1) % 4] });
                    let (q8, q4) = (&p8[blocks.clone()], &p4[blocks.clone()]);
                    assert_eq!(bits8(Arch::dot_q8_r8_x3(q8, x3)[p]), want8, "q8 r8 x3 nb={nb} t={t} p={p}");
                    assert_eq!(bits8(Arch::dot_q4_r8_x3(q4, x3)[p]), want4, "q4 r8 x3 nb={nb} t={t} p={p}");
                    if p < 2 {
                        let x2 = [x3[0], x3[1]];
                        assert_eq!(bits8(Arch::dot_q8_r8_x2(q8, x2)[p]), want8, "q8 r8 x2 nb={nb} t={t} p={p}");
                        assert_eq!(bits8(Arch::dot_q4_r8_x2(q4, x2)[p]), want4, "q4 r8 x2 nb={nb} t={t} p={p}");
                    }
                }
            }
        }
    }
}

/// The prompt tile kernels (`tile_q8`, `tile_q4`: two interleaved groups ·
/// a run of tokens) against the single-row dots, bit for bit: every row of
/// both groups, every run length up to the set's `TILE_TOKENS` (the
/// default's four when it has none), odd block counts (fewer than the
/// eight partial sums, and not a multiple of eight), extreme scales and
/// quants; `Portable`'s default against the same dots.
/// Tokens the tile tests and benchmark give a tile call: the set's
/// `TILE_TOKENS`, or four for a set without tile kernels (the default).
#[allow(clippy::absurd_extreme_comparisons)] // TILE_TOKENS is 0 in some sets
pub(super) const TILE_TEST_TOKENS: usize = if Arch::TILE_TOKENS > 4 { Arch::TILE_TOKENS } else { 4 };

#[test]
fn prompt_tiles_equal_single_row_dots() {
    use crate::quant::{repack_q4_x8, repack_q8_x8};
    let mut rng = Rng(0x0071_17e5);
    for nb in (1..=17).chain([31, 48, 65, 280]) {
        let rows = 2 * ROWS8;
        let (mut w8, mut w4) = (q8_blocks(&mut rng, rows * nb), q4_blocks(&mut rng, rows * nb));
        for (i, d) in
            [f16::from_bits(1), f16::from_bits(0x3ff), f16::MAX, f16::ZERO, f16::INFINITY].into_iter().enumerate()
        {
            w8[(i * 7919) % (rows * nb)].d = d;
            w4[(i * 104_729) % (rows * nb)].d = d;
        }
        w8[rows * nb / 2].qs = [-128; QK];
        let p8 = repack_q8_x8(&w8, nb, Arch::Q8_X8_BIAS, "test").unwrap();
        let p4 = repack_q4_x8(&w4, nb, "test").unwrap();
        let r8 = repack_q8_x8(&w8, nb, Portable::Q8_X8_BIAS, "test").unwrap();
        let n_max = TILE_TEST_TOKENS;
        let mut acts: Vec<ActQ8> = (0..n_max).map(|_| act(&mut rng, nb).1).collect();
        // an activation at the quantiser's extremes: every quant ±127
        let big: Vec<f32> = (0..nb * QK).map(|i| if i % 3 == 0 { -1e30 } else { 1e30 }).collect();
        acts[n_max - 1] = ActQ8::quantize(&big);
        let want = |q8: bool, t: usize| -> [u32; 16] {
            std::array::from_fn(|r| {
                let row = r * nb..(r + 1) * nb;
                let x = acts[t].as_ref();
                if q8 { Arch::dot_q8(&w8[row], x) } else { Arch::dot_q4(&w4[row], x) }.to_bits()
            })
        };
        for n in 1..=n_max {
            let xs: Vec<ActRef> = acts[..n].iter().map(|a| a.as_ref()).collect();
            let mut out = vec![[0.0f32; 16]; n];
            let bits = |o: &[[f32; 16]], t: usize| o[t].map(f32::to_bits);
            Arch::tile_q8(&p8, nb, &xs, &mut out);
            for t in 0..n {
                assert_eq!(bits(&out, t), want(true, t), "tile_q8 nb={nb} n={n} t={t}");
            }
            Arch::tile_q4(&p4, nb, &xs, &mut out);
            for t in 0..n {
                assert_eq!(bits(&out, t), want(false, t), "tile_q4 nb={nb} n={n} t={t}");
            }
            Portable::tile_q8(&r8, nb, &xs, &mut out);
            for t in 0..n {
                assert_eq!(bits(&out, t), want(true, t), "portable tile_q8 nb={nb} n={n} t={t}");
            }
        }
    }
}

/// Attention's several-rows kernels (`dot_f32_rows`, `axpy_rows`) against the single-row
/// kernels, bit for bit: lengths that are not multiples of the vector
/// width, row counts around the four-row step, a stride wider than a row.
#[test]
fn kv_row_kernels_equal_single_row_kernels() {
    let mut rng = Rng(0xa77e_0000_0000_0001);
    for n in (1..=20).chain([31, 32, 33, 63, 64, 65, 96, 128, 129, 256]) {
        for count in [1, 3, 4, 5, 8, 9, 13, 17] {
            let stride = n + 7;
            let rows = rng.vec(stride * count);
            let q = rng.vec(n);
            let mut got = vec![0.0f32; count];
            Arch::dot_f32_rows(&q, &rows, stride, &mut got);
            for (p, &g) in got.iter().enumerate() {
                let want = Arch::dot_f32(&q, &rows[p * stride..p * stride + n]);
                assert_eq!(g.to_bits(), want.to_bits(), "dot_f32_rows n={n} count={count} row {p}");
            }
            let w = rng.vec(count);
            let start = rng.vec(n);
            let mut got = start.clone();
            Arch::axpy_rows(&w, &rows, stride, &mut got);
            let mut want = start;
            for (p, &a) in w.iter().enumerate() {
                Arch::axpy(a, &rows[p * stride..p * stride + n], &mut want);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            assert_eq!(bits(&got), bits(&want), "axpy_rows n={n} count={count}");
        }
    }
}

#[test]
fn compiled_isa_is_the_expected_one() {
    // KRAFLA_EXPECT_ISA is set by `cargo xtask kernel-tests` per variant.
    if let Some(want) = option_env!("KRAFLA_EXPECT_ISA") {
        assert_eq!(ISA, want, "this build's kernel set");
    }
    #[cfg(target_arch = "x86_64")]
    assert_ne!(ISA, "portable");
}

#[test]
fn dot_f32_matches_f64_and_portable_on_odd_lengths() {
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let lengths = (0..=70).chain([100, 127, 129, 257, 576, 1000, 1536, 4099]);
    for n in lengths {
        let (a, b) = (rng.vec(n), rng.vec(n));
        let want = f64_dot(&a, &b);
        let bound = 1e-6 * n as f64 + 1e-6;
        let got = Arch::dot_f32(&a, &b);
        assert!((got as f64 - want).abs() <= bound, "n={n}");
        assert_eq!(got.to_bits(), Portable::dot_f32(&a, &b).to_bits(), "n={n} vs portable");
        assert_eq!(got.to_bits(), Arch::dot_f32(&a, &b).to_bits());
        let h: Vec<f16> = a.iter().map(|&v| f16::from_f32(v)).collect();
        let hf: Vec<f32> = h.iter().map(|v| v.to_f32()).collect();
        let gh = Arch::dot_f16_f32(&h, &b);
        assert!((gh as f64 - f64_dot(&hf, &b)).abs() <= bound, "f16 n={n}");
        assert_eq!(gh.to_bits(), Portable::dot_f16_f32(&h, &b).to_bits(), "f16 n={n} vs portable");
    }
}

#[test]
fn quantized_dots_match_exact_reference_and_portable() {
    let mut rng = Rng(12345);
    for nb in (1..=40).chain([47, 64, 65, 96, 191, 256, 257, 1000]) {
        let (_, xq) = act(&mut rng, nb);
        let w8 = q8_blocks(&mut rng, nb);
        let w4 = q4_blocks(&mut rng, nb);
        check_quantized(&format!("random nb={nb}"), &w8, &w4, &xq, 1.5);
    }
}

/// Extreme quants (−128 weights, ±127 activations, nibbles 0 and 15) and
/// scales (zero, −0, f16 subnormals and extremes, f32 subnormals, tiny
/// and huge activation scales), mixed block by block.
#[test]
fn quantized_dots_on_extreme_values_match_portable_and_exact() {
    let mut rng = Rng(0xdead_beef);
    let f16s: [u16; 12] =
        [0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x7bff, 0xfbff, 0x3c00, 0x2e66, 0x1400, 0xb800];
    let dxs = [0.0f32, 1e-38, 2.5e-30, 1e-3, 0.7, 1e3, 1e20, f32::from_bits(1)];
    let f32_muls = [1.0f32, 1e-5, 3.0e-39, 1e6];
    let pick = |rng: &mut Rng, n: usize| (rng.next() % n as u64) as usize;
    for nb in (1..=40).chain([64, 65, 191, 300]) {
        for pattern in 0..4 {
            let q8 = |rng: &mut Rng| -> i8 {
                match pattern {
                    0 => -128,
                    1 => [127, -128, -127, 0][pick(rng, 4)],
                    _ => rng.next() as i8,
                }
            };
            let nib = |rng: &mut Rng| -> u8 {
                match pattern {
                    0 => 0x00,
                    1 => 0xff,
                    2 => [0x0f, 0xf0, 0x00, 0xff][pick(rng, 4)],
                    _ => rng.next() as u8,
                }
            };
            let xv = |rng: &mut Rng| -> i8 {
                match pattern {
                    0 => 127,
                    1 => -127,
                    2 => [127, -127][pick(rng, 2)],
                    _ => (rng.next() % 255) as i8 as i16 as i8, // may be -128 only via wrap; clamp below
                }
                .max(-127)
            };
            let blocks: Vec<BlockQ8Act> = (0..nb)
                .map(|_| {
                    let mut b = BlockQ8Act { d: dxs[pick(&mut rng, dxs.len())], ..Default::default() };
                    b.qs.iter_mut().for_each(|v| *v = xv(&mut rng));
                    b.sum = b.qs.iter().map(|&v| v as i32).sum();
                    b
                })
                .collect();
            let xq = ActQ8::from_blocks(blocks);
            let w8: Vec<BlockQ8_0> = (0..nb)
                .map(|_| {
                    let mut b = BlockQ8_0 { d: f16::from_bits(f16s[pick(&mut rng, f16s.len())]), qs: [0; QK] };
                    b.qs.iter_mut().for_each(|v| *v = q8(&mut rng));
                    b
                })
                .collect();
            let w4: Vec<BlockQ4_0> = (0..nb)
                .map(|_| {
                    let mut b = BlockQ4_0 { d: f16::from_bits(f16s[pick(&mut rng, f16s.len())]), qs: [0; QK / 2] };
                    b.qs.iter_mut().for_each(|v| *v = nib(&mut rng));
                    b
                })
                .collect();
            let mul = f32_muls[pick(&mut rng, f32_muls.len())];
            check_quantized(&format!("extreme nb={nb} pattern={pattern} f32×{mul:e}"), &w8, &w4, &xq, mul);
        }
    }
}

/// With unit scales the result is the integer sum itself: every partial
/// sum stays below 2^24, so any f32 order must give it exactly.
#[test]
fn quantized_integer_part_is_exact() {
    let mut rng = Rng(31337);
    let one = f16::from_f32(1.0);
    for nb in (1..=32).chain([100, 191, 500]) {
        // Full-range quants up to 32 blocks; beyond, |q| < 16 keeps sums < 2^24.
        let lim: i64 = if nb <= 32 { 127 } else { 15 };
        let q = |rng: &mut Rng| ((rng.next() % (2 * lim as u64 + 1)) as i64 - lim) as i8;
        let mut xb = vec![BlockQ8Act::default(); nb];
        for b in xb.iter_mut() {
            b.d = 1.0;
            b.qs.iter_mut().for_each(|v| *v = q(&mut rng));
            b.sum = b.qs.iter().map(|&v| v as i32).sum();
        }
        let mut w8: Vec<BlockQ8_0> = (0..nb).map(|_| BlockQ8_0 { d: one, qs: [0; QK] }).collect();
        w8.iter_mut().for_each(|b| b.qs.iter_mut().for_each(|v| *v = q(&mut rng)));
        if nb <= 32 {
            w8[0].qs[5] = -128; // the sign trick must handle -128 weights
        }
        let w4: Vec<BlockQ4_0> = q4_blocks(&mut rng, nb).into_iter().map(|b| BlockQ4_0 { d: one, ..b }).collect();
        let e8 = exact_q8(&w8, &xb).0;
        let e4 = exact_q4(&w4, &xb).0;
        let xq = ActQ8::from_blocks(xb);
        let xq = xq.as_ref();
        assert!(e8.abs() < 16_777_216.0 && e4.abs() < 16_777_216.0);
        assert_eq!(Arch::dot_q8(&w8, xq) as f64, e8, "q8 nb={nb}");
        assert_eq!(Arch::dot_q4(&w4, xq) as f64, e4, "q4 nb={nb}");
    }
}

#[test]
fn activation_quantization_error_is_bounded() {
    let mut rng = Rng(777);
    let (x, q) = act(&mut rng, 9);
    let q = q.as_ref().blocks();
    let mut back = vec![0.0f32; x.len()];
    for (i, b) in q.iter().enumerate() {
        for j in 0..QK {
            back[i * QK + j] = b.d * b.qs[j] as f32;
        }
        assert_eq!(b.sum, b.qs.iter().map(|&v| v as i32).sum::<i32>());
        assert!(b.qs.iter().all(|&v| v != -128), "the Q8 sign trick needs activation quants in [-127, 127]");
    }
    for (i, (&a, &b)) in x.iter().zip(&back).enumerate() {
        assert!((a - b).abs() <= q[i / QK].d * 0.5 + 1e-7);
    }
}

#[test]
fn f16_conversion_is_exact_for_every_value() {
    let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    let mut got = vec![0.0f32; all.len()];
    Arch::f16_to_f32(&all, &mut got);
    for (h, g) in all.iter().zip(&got) {
        let want = h.to_f32();
        assert_eq!(g.to_bits(), want.to_bits(), "arch f16 {:#06x}", h.to_bits());
        assert_eq!(f16_bits_to_f32(h.to_bits()).to_bits(), want.to_bits(), "bits {:#06x}", h.to_bits());
        assert_eq!(crate::quant::f16_to_f32(*h).to_bits(), want.to_bits(), "scalar {:#06x}", h.to_bits());
    }
    // odd lengths and offsets
    for n in 0..20 {
        let mut out = vec![0.0f32; n];
        Arch::f16_to_f32(&all[1000..1000 + n], &mut out);
        assert!(out.iter().zip(&all[1000..]).all(|(o, h)| *o == h.to_f32()));
    }
}

/// The vector exp behind softmax / silu / gelu: relative 1e-6 against f64.
#[cfg(target_arch = "x86_64")]
#[test]
fn vector_exp_is_within_1e6_relative() {
    let mut xs: Vec<f32> = (0..400_000).map(|i| -87.3 + i as f32 * (88.72 + 87.3) / 400_000.0).collect();
    xs.extend([0.0, -0.0, 1e-8, -1e-8, 88.72, -87.33, 0.5 * std::f32::consts::LN_2]);
    let mut got = xs.clone();
    Arch::exp(&mut got);
    let mut worst = 0.0f64;
    for (&x, &g) in xs.iter().zip(&got) {
        let want = (x as f64).exp();
        let rel = (g as f64 - want).abs() / want;
        worst = worst.max(rel);
        assert!(rel <= 1e-6, "exp({x}) = {g}, want {want} (rel {rel:e})");
    }
    eprintln!("vector exp: worst relative error {worst:e}");
    let mut sp = vec![f32::NEG_INFINITY, -200.0, -104.0, f32::INFINITY, 89.0, f32::NAN, 0.0];
    Arch::exp(&mut sp);
    assert_eq!(&sp[..5], &[0.0, 0.0, 0.0, f32::INFINITY, f32::INFINITY]);
    assert!(sp[5].is_nan());
    assert_eq!(sp[6], 1.0);
}

#[test]
fn f32_ops_match_f64_and_portable() {
    let mut rng = Rng(5);
    for n in (1..=40).chain([63, 64, 65, 100, 576, 1536]) {
        let x = rng.vec(n);
        let w = rng.vec(n);
        let mut out = vec![0.0; n];
        Arch::rmsnorm(&x, &w, 1e-5, &mut out);
        let mut port = vec![0.0; n];
        Portable::rmsnorm(&x, &w, 1e-5, &mut port);
        let ms: f64 = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
        let inv = 1.0 / (ms + 1e-5).sqrt();
        for i in 0..n {
            let want = x[i] as f64 * inv * w[i] as f64;
            assert!((out[i] as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()), "rmsnorm n={n}");
            assert_eq!(out[i].to_bits(), port[i].to_bits(), "rmsnorm n={n} vs portable");
        }
        // softmax on a wide range (scores), relative to f64
        let scores: Vec<f32> = x.iter().map(|&v| v * 30.0).collect();
        let mut s = scores.clone();
        Arch::softmax(&mut s);
        let mut sp = scores.clone();
        Portable::softmax(&mut sp);
        // reference from the f32 differences x − max the kernels exponentiate
        let mx = scores.iter().fold(f32::MIN, |m, &v| m.max(v));
        let z: f64 = scores.iter().map(|&v| ((v - mx) as f64).exp()).sum();
        for i in 0..n {
            let want = ((scores[i] - mx) as f64).exp() / z;
            assert!(
                (s[i] as f64 - want).abs() <= 1e-6 * want + 1e-37,
                "softmax n={n} i={i}: {} vs {want}, portable {}",
                s[i],
                sp[i]
            );
            assert!((s[i] - sp[i]).abs() as f64 <= 2e-6 * want + 1e-37, "softmax n={n} vs portable");
        }
        // silu over [-30, 30], relative
        let g30: Vec<f32> = x.iter().map(|&v| v * 30.0).collect();
        let (mut g, mut gp) = (g30.clone(), g30.clone());
        Arch::silu_mul(&mut g, &w);
        Portable::silu_mul(&mut gp, &w);
        for i in 0..n {
            let v = g30[i] as f64;
            let want = v / (1.0 + (-v).exp()) * w[i] as f64;
            assert!((g[i] as f64 - want).abs() <= 2e-6 * want.abs() + 1e-30, "silu n={n} x={v}");
            assert!((g[i] - gp[i]).abs() as f64 <= 3e-6 * want.abs() + 1e-30, "silu n={n} vs portable");
        }
        // gelu_tanh over [-6, 6]
        let g6: Vec<f32> = x.iter().map(|&v| v * 6.0).collect();
        let (mut g, mut gp) = (g6.clone(), g6.clone());
        Arch::gelu_tanh_mul(&mut g, &w);
        Portable::gelu_tanh_mul(&mut gp, &w);
        for i in 0..n {
            let v = g6[i] as f64;
            let t = (2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v);
            let want = 0.5 * v * (1.0 + t.tanh()) * w[i] as f64;
            assert!((g[i] as f64 - want).abs() <= 2e-6 * (1.0 + v.abs()), "gelu n={n} x={v}");
            assert!((g[i] - gp[i]).abs() as f64 <= 4e-6 * (1.0 + v.abs()), "gelu n={n} vs portable");
        }
        // axpy
        let (mut y, mut yp) = (w.clone(), w.clone());
        Arch::axpy(0.37, &x, &mut y);
        Portable::axpy(0.37, &x, &mut yp);
        for i in 0..n {
            let want = w[i] as f64 + 0.37f32 as f64 * x[i] as f64;
            assert!((y[i] as f64 - want).abs() <= 2.5e-7, "axpy n={n}");
            assert_eq!(y[i].to_bits(), yp[i].to_bits(), "axpy n={n} vs portable");
        }
    }
}

#[test]
fn matmul_is_identical_for_any_batch_and_thread_count() {
    // 2, 3, 6, 9 tokens: the batch split by row tiles (runs of four, then
    // the last one to three tokens together); 17, 33: by row tiles through
    // the prompt tile kernels (on more than one thread); 70: split by runs
    // of tokens
    for n_tok in [2, 3, 6, 9, 17, 33, 70] {
        matmul_identical_for(n_tok);
    }
}

fn matmul_identical_for(n_tok: usize) {
    let mut rng = Rng(4242);
    let (rows, cols) = (37, 160);
    let w4 = q4_blocks(&mut rng, rows * cols / QK);
    let w8 = q8_blocks(&mut rng, rows * cols / QK);
    let w8f: Vec<BlockQ8_0F32> = w8.iter().map(|b| BlockQ8_0F32 { d: b.d.to_f32(), qs: b.qs }).collect();
    let w4f: Vec<BlockQ4_0F32> = w4.iter().map(|b| BlockQ4_0F32 { d: b.d.to_f32(), qs: b.qs }).collect();
    let wf = rng.vec(rows * cols);
    let wh: Vec<f16> = wf.iter().map(|&v| f16::from_f32(v)).collect();
    let x = rng.vec(n_tok * cols);
    let p8 = crate::quant::repack_q8_x8(&w8, cols / QK, Arch::Q8_X8_BIAS, "test").unwrap();
    let p4 = crate::quant::repack_q4_x8(&w4, cols / QK, "test").unwrap();
    let wm = super::tests_mxfp4::mxfp4_blocks(&mut rng, rows * cols / QK, 110, 30);
    let pm = crate::quant::repack_mxfp4_x8(&wm, cols / QK, "test").unwrap();
    let datas = [
        (WeightData::Q4_0(&w4), Packed::None),
        (WeightData::Q8_0(&w8), Packed::None),
        (WeightData::Q8_0F32(&w8f), Packed::None),
        (WeightData::Q4_0F32(&w4f), Packed::None),
        (WeightData::F32(&wf), Packed::None),
        (WeightData::F16(&wh), Packed::None),
        // the eight-row kernels: 32 rows in four groups, 5 left in the plain layout
        (WeightData::Q4_0(&w4), Packed::Q4(&p4)),
        (WeightData::Q8_0(&w8), Packed::Q8(&p8)),
        (WeightData::Mxfp4(&wm), Packed::None),
        (WeightData::Mxfp4(&wm), Packed::Mxfp4(&pm)),
    ];
    let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
    for (data, packed) in datas {
        let m = MatRef { rows, cols, data, packed };
        let mut batched = vec![0.0; n_tok * rows];
        matmul(&m, &Input::new(&x, cols), &mut batched);
        let mut unpacked = vec![0.0; n_tok * rows];
        matmul(&MatRef { packed: Packed::None, ..m }, &Input::new(&x, cols), &mut unpacked);
        assert_eq!(bits(&batched), bits(&unpacked), "repacked rows give the plain layout's results");
        // two matrices in one group (one parallel region for a short batch)
        let (mut first, mut second) = (vec![0.0; n_tok * rows], vec![0.0; n_tok * rows]);
        crate::kernels::matmul_group(&mut [(&m, &mut first[..]), (&m, &mut second[..])], &Input::new(&x, cols));
        assert_eq!(bits(&first), bits(&batched), "grouped, {n_tok} tokens");
        assert_eq!(bits(&second), bits(&batched), "grouped (second), {n_tok} tokens");
        for threads in [1, 2, 3] {
            let pool = std::sync::Arc::new(crate::pool::Pool::new(threads).unwrap());
            // another batch split: 4 (or one fewer than all) + the rest
            let (mut split, h) = (vec![0.0; n_tok * rows], 4.min(n_tok - 1));
            pool.install(|| {
                matmul(&m, &Input::new(&x[..h * cols], cols), &mut split[..h * rows]);
                matmul(&m, &Input::new(&x[h * cols..], cols), &mut split[h * rows..]);
            });
            assert_eq!(bits(&split), bits(&batched), "{h}+rest split, {n_tok} tokens, {threads} threads");
            for t in 0..n_tok {
                let mut single = vec![0.0; rows];
                let xs = &x[t * cols..(t + 1) * cols];
                pool.install(|| matmul(&m, &Input::new(xs, cols), &mut single));
                assert_eq!(bits(&single), bits(&batched[t * rows..(t + 1) * rows]), "token {t}, {threads} threads");
            }
        }
    }
}

#[test]
fn matmul_matches_dequantized_f64() {
    let mut rng = Rng(99);
    let (rows, cols) = (5, 64);
    let w8 = q8_blocks(&mut rng, rows * cols / QK);
    let w4 = q4_blocks(&mut rng, rows * cols / QK);
    let x = rng.vec(cols);
    let mut out8 = vec![0.0; rows];
    let mut out4 = vec![0.0; rows];
    matmul(&MatRef { rows, cols, data: WeightData::Q8_0(&w8), packed: Packed::None }, &Input::new(&x, cols), &mut out8);
    matmul(&MatRef { rows, cols, data: WeightData::Q4_0(&w4), packed: Packed::None }, &Input::new(&x, cols), &mut out4);
    let mut wrow = vec![0.0f32; cols];
    for r in 0..rows {
        for (name, out, deq) in [("q8", &out8, 0), ("q4", &out4, 1)] {
            if deq == 0 {
                dequant_q8(&w8[r * 2..r * 2 + 2], &mut wrow);
            } else {
                dequant_q4(&w4[r * 2..r * 2 + 2], &mut wrow);
            }
            let want = f64_dot(&wrow, &x);
            let mag: f64 = wrow.iter().zip(&x).map(|(a, b)| (a * b).abs() as f64).sum();
            // activation quantisation error is at most half a step per element
            assert!((out[r] as f64 - want).abs() <= 0.02 * mag + 1e-4, "{name} row {r}: {} vs {want}", out[r]);
        }
    }
}

/// Single-thread dot throughput (run: cargo test --release -p krafla --lib bench_dots -- --ignored --nocapture).
#[test]
#[ignore]
fn bench_dots() {
    let mut rng = Rng(1);
    for cols in [576, 1536] {
        let rows = 8192 * 576 / cols;
        let nb = cols / QK;
        let w4 = q4_blocks(&mut rng, rows * nb);
        let w8 = q8_blocks(&mut rng, rows * nb);
        let (_, xq) = act(&mut rng, nb);
        let xq = xq.as_ref();
        let time = |name: &str, bytes: usize, f: &dyn Fn() -> f32| {
            let mut best = f64::MAX;
            let mut sink = 0.0;
            for _ in 0..20 {
                let t = std::time::Instant::now();
                sink += f();
                best = best.min(t.elapsed().as_secs_f64());
            }
            eprintln!(
                "{ISA} {name} ({cols} cols): {:.2} ms, {:.1} GB/s ({sink})",
                best * 1e3,
                bytes as f64 / best / 1e9
            );
        };
        time("q4", w4.len() * 18, &|| (0..rows).map(|r| Arch::dot_q4(&w4[r * nb..(r + 1) * nb], xq)).sum());
        time("q8", w8.len() * 34, &|| (0..rows).map(|r| Arch::dot_q8(&w8[r * nb..(r + 1) * nb], xq)).sum());
        // four tokens per weight row (prompt batches): GB/s of weights as if read once per token
        let xs = [xq; 4];
        let sum4 = |v: [f32; 4]| v.iter().sum::<f32>();
        time("q4 x4", 4 * w4.len() * 18, &|| {
            (0..rows).map(|r| sum4(Arch::dot_q4_x4(&w4[r * nb..(r + 1) * nb], xs))).sum()
        });
        time("q8 x4", 4 * w8.len() * 34, &|| {
            (0..rows).map(|r| sum4(Arch::dot_q8_x4(&w8[r * nb..(r + 1) * nb], xs))).sum()
        });
    }
}

/// `int8_peak` does the products it counts: the ISA loops multiply 3 by −2
/// in every lane, so their sums are −6 per multiply-accumulate; a set
/// without a loop of its own runs `Portable`'s (its `dot_q8`, the same bits).
#[test]
fn int8_peak_counts_its_products() {
    for rounds in [1, 3, 1000] {
        let (macs, check) = Arch::int8_peak(rounds);
        assert!(macs >= 8 * rounds as u64, "{macs} MACs in {rounds} rounds");
        if Arch::INT8_PEAK == Portable::INT8_PEAK {
            assert_eq!((macs, check), Portable::int8_peak(rounds));
        } else {
            assert_eq!(check as i64, -6 * macs as i64, "{} over {rounds} rounds", Arch::INT8_PEAK);
        }
    }
}

/// The prompt tile kernels' multiply-accumulate rate on cache-resident data
/// against `int8_peak`, one thread, with the four-token eight-row kernels
/// beside them (run: RUSTFLAGS="-C target-feature=..." cargo test --release
/// -p krafla --lib bench_tiles -- --ignored --nocapture).
#[test]
#[ignore]
fn bench_tiles() {
    use crate::quant::{
        repack_mxfp4_x8, repack_q4_x8, repack_q4k_x8, repack_q5k_x8, repack_q6k_x8, repack_q8_x8, BlockQ4K, BlockQ5K,
        BlockQ6K,
    };
    let mut rng = Rng(5);
    let peak = {
        let t = std::time::Instant::now();
        let (macs, _) = Arch::int8_peak(1 << 20);
        macs as f64 / t.elapsed().as_secs_f64() / 1e9
    };
    fn four<'a>(xs: &[ActRef<'a>]) -> [ActRef<'a>; 4] {
        std::array::from_fn(|i| xs[i])
    }
    for cols in [1536, 8960] {
        let (nb, nbs) = (cols / QK, cols / 256);
        let (w4, w8) = (q4_blocks(&mut rng, 16 * nb), q8_blocks(&mut rng, 16 * nb));
        let wk: Vec<BlockQ4K> = (0..16 * nbs)
            .map(|i| BlockQ4K {
                d: f16::from_f32(0.01),
                dmin: f16::from_f32(0.002),
                scales: std::array::from_fn(|j| ((i * 7 + j * 13) % 64) as u8),
                qs: std::array::from_fn(|j| ((i * 31 + j * 17) % 256) as u8),
            })
            .collect();
        let p4 = repack_q4_x8(&w4, nb, "bench").unwrap();
        let p8 = repack_q8_x8(&w8, nb, Arch::Q8_X8_BIAS, "bench").unwrap();
        let pk = repack_q4k_x8(&wk, nbs, "bench").unwrap();
        let w5: Vec<BlockQ5K> = wk
            .iter()
            .enumerate()
            .map(|(i, b)| BlockQ5K {
                d: b.d,
                dmin: b.dmin,
                scales: b.scales,
                qh: std::array::from_fn(|j| ((i * 23 + j * 19) % 256) as u8),
                qs: b.qs,
            })
            .collect();
        let p5 = repack_q5k_x8(&w5, nbs, "bench").unwrap();
        let w6: Vec<BlockQ6K> = (0..16 * nbs)
            .map(|i| BlockQ6K {
                ql: std::array::from_fn(|j| ((i * 29 + j * 11) % 256) as u8),
                qh: std::array::from_fn(|j| ((i * 13 + j * 7) % 256) as u8),
                scales: std::array::from_fn(|j| ((i * 5 + j * 3) % 256) as u8 as i8),
                d: f16::from_f32(0.01),
            })
            .collect();
        let p6 = repack_q6k_x8(&w6, nbs, "bench").unwrap();
        let pm = repack_mxfp4_x8(&super::tests_mxfp4::mxfp4_blocks(&mut rng, 16 * nb, 120, 8), nb, "bench").unwrap();
        let acts: Vec<ActQ8> = (0..64).map(|_| act(&mut rng, nb).1).collect();
        let macs = (16 * cols * acts.len()) as f64;
        // best of 20 passes of `run` over the 64 tokens in runs of `n`
        let time = |name: &str, n: usize, run: &mut dyn FnMut(&[ActRef]) -> f32| {
            let (mut best, mut sink) = (f64::MAX, 0.0);
            for _ in 0..20 {
                let t = std::time::Instant::now();
                for chunk in acts.chunks(n) {
                    let xs: Vec<ActRef> = chunk.iter().map(|a| a.as_ref()).collect();
                    sink += run(&xs);
                }
                best = best.min(t.elapsed().as_secs_f64());
            }
            let rate = macs / best / 1e9;
            eprintln!(
                "{ISA} {name} {cols} cols: {rate:.1} GMAC/s, {:.0} % of the peak {peak:.1} ({sink})",
                100.0 * rate / peak
            );
        };
        let mut out = [[0.0f32; 16]; 16];
        let mut tile = |kind: usize, xs: &[ActRef]| {
            let o = &mut out[..xs.len()];
            match kind {
                0 => Arch::tile_q4(&p4, nb, xs, o),
                1 => Arch::tile_q8(&p8, nb, xs, o),
                2 => Arch::tile_q4k(&pk, nbs, xs, o),
                3 => Arch::tile_q5k(&p5, nbs, xs, o),
                4 => Arch::tile_q6k(&p6, nbs, xs, o),
                _ => Arch::tile_mxfp4(&pm, nb, xs, o),
            }
            std::hint::black_box(&out);
            out[0][0]
        };
        let n = TILE_TEST_TOKENS;
        time("tile_q4", n, &mut |xs| tile(0, xs));
        time("tile_q8", n, &mut |xs| tile(1, xs));
        time("tile_q4k", n, &mut |xs| tile(2, xs));
        time("tile_q5k", n, &mut |xs| tile(3, xs));
        time("tile_q6k", n, &mut |xs| tile(4, xs));
        time("tile_mxfp4", n, &mut |xs| tile(5, xs));
        time("dot_q4_r8_x4", 4, &mut |xs| {
            (0..2).map(|g| std::hint::black_box(Arch::dot_q4_r8_x4(&p4[g * nb..(g + 1) * nb], four(xs)))[0][0]).sum()
        });
        time("dot_q4k_r8_x4", 4, &mut |xs| {
            (0..2).map(|g| std::hint::black_box(Arch::dot_q4k_r8_x4(&pk[g * nbs..(g + 1) * nbs], four(xs)))[0][0]).sum()
        });
        time("dot_q6k_r8_x4", 4, &mut |xs| {
            (0..2).map(|g| std::hint::black_box(Arch::dot_q6k_r8_x4(&p6[g * nbs..(g + 1) * nbs], four(xs)))[0][0]).sum()
        });
        // one token a call, as decode runs them (weights in cache here: what the
        // kernel itself can stream, against the read bandwidth --bench measures)
        time("dot_q4k_r8", 1, &mut |xs| {
            (0..2).map(|g| std::hint::black_box(Arch::dot_q4k_r8(&pk[g * nbs..(g + 1) * nbs], xs[0]))[0]).sum()
        });
        time("dot_q5k_r8", 1, &mut |xs| {
            (0..2).map(|g| std::hint::black_box(Arch::dot_q5k_r8(&p5[g * nbs..(g + 1) * nbs], xs[0]))[0]).sum()
        });
        time("dot_mxfp4_r8", 1, &mut |xs| {
            (0..2).map(|g| std::hint::black_box(Arch::dot_mxfp4_r8(&pm[g * nb..(g + 1) * nb], xs[0]))[0]).sum()
        });
        time("dot_q6k_r8", 1, &mut |xs| {
            (0..2).map(|g| std::hint::black_box(Arch::dot_q6k_r8(&p6[g * nbs..(g + 1) * nbs], xs[0]))[0]).sum()
        });
        time("tile_q4k one token", 1, &mut |xs| tile(2, xs));
        time("tile_q6k one token", 1, &mut |xs| tile(4, xs));
        time("dot_q4_r8", 1, &mut |xs| {
            (0..2).map(|g| std::hint::black_box(Arch::dot_q4_r8(&p4[g * nb..(g + 1) * nb], xs[0]))[0]).sum()
        });
    }
}
