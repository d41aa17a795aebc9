//! The K-quant dots (`dot_q4k`, `dot_q5k`, `dot_q6k` and their four-token
//! forms) of the compiled-in `Arch` against `Portable`, bit for bit, and
//! against an exact f64 sum within a derived bound; run on every build as
//! `kernels/tests.rs` is (`cargo xtask kernel-tests`, the ARM qemu tests).
//!
//! Bound. Per activation block the integer parts S and M are exact and
//! below 2^24; the block's term (d·d_x)·S − (dmin·d_x)·M rounds five times
//! (two scale products, two products, the difference), the ⌈n/8⌉ − 1 adds
//! of a partial sum and the three of the final tree add theirs, so for n
//! activation blocks
//! |got − exact| ≤ (⌈n/8⌉ + 8)·2^-24·Σ_b (|d·d_x|·|S|_abs + |dmin·d_x|·|M|)
//!                 + (Σ_b (|S|_abs + |M|) + 4n + 8)·2^-149,
//! |S|_abs being Σ |sc·q·q_x| (the products' magnitudes), the last term for
//! scale products that underflow to subnormals. Q6_K has no M.
use half::f16;

use super::*;
use crate::quant::{
    q4k_code, q5k_code, q6k_code, scales_mins_k4, ActQ8, ActRef, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8Act, QK,
};
use crate::test_rng::Rng;

/// f16 scales: zeros, subnormals, the extremes, ordinary values (no inf/NaN).
const F16S: [u16; 12] =
    [0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x7bff, 0xfbff, 0x3c00, 0x2e66, 0x1400, 0xb800];

fn pick(rng: &mut Rng, n: usize) -> usize {
    (rng.next() % n as u64) as usize
}
fn bytes<const N: usize>(rng: &mut Rng, pattern: u8) -> [u8; N] {
    std::array::from_fn(|_| match pattern {
        0 => 0x00,
        1 => 0xff,
        2 => [0x0f, 0xf0, 0x00, 0xff][pick(rng, 4)],
        _ => rng.next() as u8,
    })
}
fn scale(rng: &mut Rng, extreme: bool) -> f16 {
    if extreme {
        f16::from_bits(F16S[pick(rng, F16S.len())])
    } else {
        f16::from_f32(rng.f32() * 0.01)
    }
}
fn q4k(rng: &mut Rng, n: usize, pattern: u8, extreme: bool) -> Vec<BlockQ4K> {
    (0..n)
        .map(|_| BlockQ4K {
            d: scale(rng, extreme),
            dmin: scale(rng, extreme),
            scales: bytes(rng, pattern),
            qs: bytes(rng, pattern),
        })
        .collect()
}
fn q5k(rng: &mut Rng, n: usize, pattern: u8, extreme: bool) -> Vec<BlockQ5K> {
    (0..n)
        .map(|_| BlockQ5K {
            d: scale(rng, extreme),
            dmin: scale(rng, extreme),
            scales: bytes(rng, pattern),
            qh: bytes(rng, pattern),
            qs: bytes(rng, pattern),
        })
        .collect()
}
fn q6k(rng: &mut Rng, n: usize, pattern: u8, extreme: bool) -> Vec<BlockQ6K> {
    (0..n)
        .map(|_| {
            let sc: [u8; 16] = bytes(rng, pattern);
            BlockQ6K {
                ql: bytes(rng, pattern),
                qh: bytes(rng, pattern),
                scales: sc.map(|v| v as i8),
                d: scale(rng, extreme),
            }
        })
        .collect()
}
/// `n` activation blocks: quantised random values, or extreme quants and scales.
fn acts(rng: &mut Rng, n: usize, pattern: u8, extreme: bool) -> ActQ8 {
    if !extreme {
        return ActQ8::quantize(&rng.vec(n * QK));
    }
    let dxs = [0.0f32, 1e-38, 2.5e-30, 1e-3, 0.7, 1e3, 1e20, f32::from_bits(1)];
    let blocks = (0..n)
        .map(|_| {
            let mut b = BlockQ8Act { d: dxs[pick(rng, dxs.len())], ..Default::default() };
            for v in b.qs.iter_mut() {
                *v = match pattern {
                    0 => 127,
                    1 => -127,
                    2 => [127, -127][pick(rng, 2)],
                    _ => (rng.next() as i8).max(-127),
                };
            }
            b.sum = b.qs.iter().map(|&v| v as i32).sum();
            b
        })
        .collect();
    ActQ8::from_blocks(blocks)
}

/// Per activation block: (d·d_x, S, |S|_abs, dmin·d_x, M), all exact (f64).
type Parts = Vec<(f64, i64, i64, f64, i64)>;

fn parts_q4k_q5k(d: &[(f16, f16, [u8; 12])], code: impl Fn(usize, usize, usize) -> u8, x: &[BlockQ8Act]) -> Parts {
    let mut out = Vec::new();
    for (s, &(d, dmin, scales)) in d.iter().enumerate() {
        let (sc, mn) = scales_mins_k4(&scales);
        for j in 0..8 {
            let bx = &x[8 * s + j];
            let (mut sum, mut abs) = (0i64, 0i64);
            for l in 0..QK {
                let p = sc[j] as i64 * code(s, j, l) as i64 * bx.qs[l] as i64;
                sum += p;
                abs += p.abs();
            }
            let dx = bx.d as f64;
            out.push((d.to_f64() * dx, sum, abs, dmin.to_f64() * dx, mn[j] as i64 * bx.sum as i64));
        }
    }
    out
}
fn parts_q6k(w: &[BlockQ6K], x: &[BlockQ8Act]) -> Parts {
    let mut out = Vec::new();
    for (s, b) in w.iter().enumerate() {
        for j in 0..8 {
            let bx = &x[8 * s + j];
            let (mut sum, mut abs) = (0i64, 0i64);
            for l in 0..QK {
                let e = 32 * j + l;
                let p = b.scales[e / 16] as i64 * (q6k_code(b, e) as i64 - 32) * bx.qs[l] as i64;
                sum += p;
                abs += p.abs();
            }
            out.push((b.d.to_f64() * bx.d as f64, sum, abs, 0.0, 0));
        }
    }
    out
}
/// (exact value, the module doc's bound).
fn exact(parts: &Parts) -> (f64, f64) {
    let n = parts.len();
    let (mut sum, mut mag, mut imag) = (0.0, 0.0, 0.0);
    for &(ds, s, abs, dm, m) in parts {
        sum += ds * s as f64 - dm * m as f64;
        mag += ds.abs() * abs as f64 + dm.abs() * m.abs() as f64;
        imag += (abs + m.abs()) as f64;
    }
    let bound =
        (n.div_ceil(8) + 8) as f64 * f64::powi(2.0, -24) * mag + (imag + (4 * n + 8) as f64) * f64::powi(2.0, -149);
    (sum, bound)
}

/// Every K-quant kernel of `Arch` on these weights: bit for bit with
/// `Portable`, within the bound of the exact sum, the same from plain
/// activation blocks and from a sub-range, and the four-token forms equal
/// to the single-token ones.
fn check(tag: &str, w4: &[BlockQ4K], w5: &[BlockQ5K], w6: &[BlockQ6K], xs: [&ActQ8; 4]) {
    let xq = xs[0].as_ref();
    let xb = xq.blocks();
    let plain = ActRef::from(xb);
    let d4: Vec<_> = w4.iter().map(|b| (b.d, b.dmin, b.scales)).collect();
    let d5: Vec<_> = w5.iter().map(|b| (b.d, b.dmin, b.scales)).collect();
    let cases: [(&str, f32, f32, f32, Parts); 3] = [
        ("q4_k", Arch::dot_q4k(w4, xq), Portable::dot_q4k(w4, xq), Arch::dot_q4k(w4, plain), {
            parts_q4k_q5k(&d4, |s, j, l| q4k_code(&w4[s], j, l), xb)
        }),
        ("q5_k", Arch::dot_q5k(w5, xq), Portable::dot_q5k(w5, xq), Arch::dot_q5k(w5, plain), {
            parts_q4k_q5k(&d5, |s, j, l| q5k_code(&w5[s], j, l), xb)
        }),
        ("q6_k", Arch::dot_q6k(w6, xq), Portable::dot_q6k(w6, xq), Arch::dot_q6k(w6, plain), parts_q6k(w6, xb)),
    ];
    for (name, got, port, from_plain, parts) in cases {
        let (e, bound) = exact(&parts);
        assert_eq!(got.to_bits(), port.to_bits(), "{tag} {name}: {got} vs portable {port}");
        assert_eq!(from_plain.to_bits(), got.to_bits(), "{tag} {name}: from plain blocks {from_plain} vs {got}");
        assert!((got as f64 - e).abs() <= bound, "{tag} {name}: {got} vs exact {e} (bound {bound:e})");
    }
    // a sub-range of the activations (not starting at 0)
    if w4.len() > 1 {
        let r = xq.range(8, xq.len());
        assert_eq!(Arch::dot_q4k(&w4[1..], r).to_bits(), Portable::dot_q4k(&w4[1..], r).to_bits(), "{tag} q4_k range");
        assert_eq!(Arch::dot_q5k(&w5[1..], r).to_bits(), Portable::dot_q5k(&w5[1..], r).to_bits(), "{tag} q5_k range");
        assert_eq!(Arch::dot_q6k(&w6[1..], r).to_bits(), Portable::dot_q6k(&w6[1..], r).to_bits(), "{tag} q6_k range");
    }
    // four tokens at once, with contiguous scales and from plain blocks
    let four = xs.map(|a| a.as_ref());
    let four_plain = xs.map(|a| ActRef::from(a.as_ref().blocks()));
    let bits = |v: [f32; 4]| v.map(f32::to_bits);
    for x4 in [four, four_plain] {
        assert_eq!(bits(Arch::dot_q4k_x4(w4, x4)), bits(four.map(|x| Portable::dot_q4k(w4, x))), "{tag} q4_k x4");
        assert_eq!(bits(Arch::dot_q5k_x4(w5, x4)), bits(four.map(|x| Portable::dot_q5k(w5, x))), "{tag} q5_k x4");
        assert_eq!(bits(Arch::dot_q6k_x4(w6, x4)), bits(four.map(|x| Portable::dot_q6k(w6, x))), "{tag} q6_k x4");
    }
}

#[test]
fn kquant_dots_match_portable_and_exact_on_random_blocks() {
    let mut rng = Rng(0x4b51_7561_6e74);
    for n in (1..=9).chain([15, 16, 17, 40]) {
        let (w4, w5, w6) = (q4k(&mut rng, n, 3, false), q5k(&mut rng, n, 3, false), q6k(&mut rng, n, 3, false));
        let xs: Vec<ActQ8> = (0..4).map(|_| acts(&mut rng, 8 * n, 3, false)).collect();
        check(&format!("random n={n}"), &w4, &w5, &w6, [&xs[0], &xs[1], &xs[2], &xs[3]]);
    }
}

/// All-zero and all-one bits, nibble patterns, the widest codes with the
/// largest scales and mins, ±127 activations, and scales from zero and
/// subnormal to the f16 and f32 extremes, block by block.
#[test]
fn kquant_dots_on_extreme_values_match_portable_and_exact() {
    let mut rng = Rng(0xe7_7e3e);
    for n in [1, 2, 3, 5, 8, 9, 13] {
        for pattern in 0..4 {
            let (w4, w5, w6) =
                (q4k(&mut rng, n, pattern, true), q5k(&mut rng, n, pattern, true), q6k(&mut rng, n, pattern, true));
            let xs: Vec<ActQ8> = (0..4).map(|_| acts(&mut rng, 8 * n, pattern, true)).collect();
            check(&format!("extreme n={n} pattern={pattern}"), &w4, &w5, &w6, [&xs[0], &xs[1], &xs[2], &xs[3]]);
        }
    }
}

/// With unit scales and unit activation scales the result is the integer
/// sum itself, which stays below 2^24: any summation order gives it exactly.
#[test]
fn kquant_integer_part_is_exact() {
    let mut rng = Rng(0x1d_e9e7);
    let one = f16::from_f32(1.0);
    for n in 1..=3 {
        let mut xb = vec![BlockQ8Act::default(); 8 * n];
        for b in xb.iter_mut() {
            b.d = 1.0;
            b.qs.iter_mut().for_each(|v| *v = (rng.next() % 31) as i8 - 15);
            b.sum = b.qs.iter().map(|&v| v as i32).sum();
        }
        let xq = ActQ8::from_blocks(xb);
        let xb = xq.as_ref().blocks();
        let w4: Vec<BlockQ4K> =
            q4k(&mut rng, n, 3, false).into_iter().map(|b| BlockQ4K { d: one, dmin: one, ..b }).collect();
        let w6: Vec<BlockQ6K> = q6k(&mut rng, n, 3, false).into_iter().map(|b| BlockQ6K { d: one, ..b }).collect();
        let d4: Vec<_> = w4.iter().map(|b| (b.d, b.dmin, b.scales)).collect();
        let e4 = exact(&parts_q4k_q5k(&d4, |s, j, l| q4k_code(&w4[s], j, l), xb)).0;
        let e6 = exact(&parts_q6k(&w6, xb)).0;
        assert!(e4.abs() < 16_777_216.0 && e6.abs() < 16_777_216.0);
        assert_eq!(Arch::dot_q4k(&w4, xq.as_ref()) as f64, e4, "q4_k n={n}");
        assert_eq!(Arch::dot_q6k(&w6, xq.as_ref()) as f64, e6, "q6_k n={n}");
    }
}

/// The dequantised weights times the activations' values equal the dot:
/// the kernels read the layout the dequantisers (and llama.cpp) read.
#[test]
fn kquant_dots_agree_with_the_dequantised_rows() {
    let mut rng = Rng(0xdec0de);
    let n = 3;
    let xq = acts(&mut rng, 8 * n, 3, false);
    let xv: Vec<f64> = xq.as_ref().blocks().iter().flat_map(|b| b.qs.map(|q| q as f64 * b.d as f64)).collect();
    let mut row = vec![0.0f32; n * 256];
    let f64_dot = |row: &[f32]| row.iter().zip(&xv).map(|(&w, &x)| w as f64 * x).sum::<f64>();
    let close =
        |a: f32, b: f64, what: &str| assert!((a as f64 - b).abs() <= 1e-4 * (1.0 + b.abs()), "{what}: {a} vs {b}");
    let w4 = q4k(&mut rng, n, 3, false);
    crate::quant::dequant_q4k(&w4, &mut row);
    close(Arch::dot_q4k(&w4, xq.as_ref()), f64_dot(&row), "q4_k");
    let w5 = q5k(&mut rng, n, 3, false);
    crate::quant::dequant_q5k(&w5, &mut row);
    close(Arch::dot_q5k(&w5, xq.as_ref()), f64_dot(&row), "q5_k");
    let w6 = q6k(&mut rng, n, 3, false);
    crate::quant::dequant_q6k(&w6, &mut row);
    close(Arch::dot_q6k(&w6, xq.as_ref()), f64_dot(&row), "q6_k");
}

/// The eight-row K-quant kernels (`dot_q4k_r8`, `dot_q5k_r8`, `dot_q6k_r8`
/// and their two- to four-token forms, this build's and `Portable`'s) over repacked rows
/// against the single-row `Portable` dots, bit for bit: every row of two
/// groups (three rows left over), one token and four, with contiguous
/// scales and from plain blocks, odd super-block counts, random and
/// extreme blocks and activations.
#[test]
fn kquant_eight_row_dots_equal_single_row_dots() {
    use crate::quant::{repack_q4k_x8, repack_q5k_x8, repack_q6k_x8, ROWS8};
    let mut rng = Rng(0x8_70_45);
    let bits8 = |v: [f32; 8]| v.map(f32::to_bits);
    for (nb, pattern, extreme) in
        [(1, 3, false), (2, 3, false), (3, 3, false), (5, 3, false), (8, 3, false), (9, 3, false), (17, 3, false)]
            .into_iter()
            .chain((0..4).flat_map(|p| [(1, p, true), (3, p, true), (9, p, true)]))
    {
        let rows = 2 * ROWS8 + 3;
        let (w4, w6) = (q4k(&mut rng, rows * nb, pattern, extreme), q6k(&mut rng, rows * nb, pattern, extreme));
        let (p4, p6) = (repack_q4k_x8(&w4, nb, "test").unwrap(), repack_q6k_x8(&w6, nb, "test").unwrap());
        assert_eq!((p4.len(), p6.len()), (2 * nb, 2 * nb));
        let acts: Vec<ActQ8> = (0..4).map(|_| acts(&mut rng, 8 * nb, pattern, extreme)).collect();
        let xs = [0, 1, 2, 3].map(|t| acts[t].as_ref());
        let plain = xs.map(|x| ActRef::from(x.blocks()));
        let tag = format!("nb={nb} pattern={pattern} extreme={extreme}");
        for g in 0..2 {
            let blocks = g * nb..(g + 1) * nb;
            let (q4, q6) = (&p4[blocks.clone()], &p6[blocks]);
            let row = |k: usize| (g * ROWS8 + k) * nb..(g * ROWS8 + k + 1) * nb;
            let (a4, a6) = (Arch::dot_q4k_r8_x4(q4, xs), Arch::dot_q6k_r8_x4(q6, xs));
            // the two- and three-token forms, token t at position p, the others beside it
            let x2 = |t: usize, p: usize| std::array::from_fn(|i| if i == p { xs[t] } else { xs[(t + 1) % 4] });
            let x3 = |t: usize, p: usize| std::array::from_fn(|i| if i == p { plain[t] } else { xs[(t + i + 1) % 4] });
            let (b4, b6) = (Arch::dot_q4k_r8_x4(q4, plain), Arch::dot_q6k_r8_x4(q6, plain));
            for (t, (&x, &xp)) in xs.iter().zip(&plain).enumerate() {
                let want4: [u32; 8] = std::array::from_fn(|k| Portable::dot_q4k(&w4[row(k)], x).to_bits());
                let want6: [u32; 8] = std::array::from_fn(|k| Portable::dot_q6k(&w6[row(k)], x).to_bits());
                assert_eq!(bits8(Portable::dot_q4k_r8(q4, x)), want4, "portable q4_k r8 {tag} g={g}");
                assert_eq!(bits8(Portable::dot_q6k_r8(q6, x)), want6, "portable q6_k r8 {tag} g={g}");
                assert_eq!(bits8(Arch::dot_q4k_r8(q4, x)), want4, "q4_k r8 {tag} g={g} t={t}");
                assert_eq!(bits8(Arch::dot_q6k_r8(q6, x)), want6, "q6_k r8 {tag} g={g} t={t}");
                assert_eq!(bits8(Arch::dot_q4k_r8(q4, xp)), want4, "q4_k r8 plain {tag} g={g} t={t}");
                assert_eq!(bits8(Arch::dot_q6k_r8(q6, xp)), want6, "q6_k r8 plain {tag} g={g} t={t}");
                assert_eq!(bits8(a4[t]), want4, "q4_k r8 x4 {tag} g={g} t={t}");
                assert_eq!(bits8(a6[t]), want6, "q6_k r8 x4 {tag} g={g} t={t}");
                assert_eq!(bits8(b4[t]), want4, "q4_k r8 x4 plain {tag} g={g} t={t}");
                assert_eq!(bits8(b6[t]), want6, "q6_k r8 x4 plain {tag} g={g} t={t}");
                for p in 0..2 {
                    assert_eq!(
                        bits8(Arch::dot_q4k_r8_x2(q4, x2(t, p))[p]),
                        want4,
                        "q4_k r8 x2 {tag} g={g} t={t} p={p}"
                    );
                    assert_eq!(
                        bits8(Arch::dot_q6k_r8_x2(q6, x2(t, p))[p]),
                        want6,
                        "q6_k r8 x2 {tag} g={g} t={t} p={p}"
                    );
                }
                for p in 0..3 {
                    assert_eq!(
                        bits8(Arch::dot_q4k_r8_x3(q4, x3(t, p))[p]),
                        want4,
                        "q4_k r8 x3 {tag} g={g} t={t} p={p}"
                    );
                    assert_eq!(
                        bits8(Arch::dot_q6k_r8_x3(q6, x3(t, p))[p]),
                        want6,
                        "q6_k r8 x3 {tag} g={g} t={t} p={p}"
                    );
                }
            }
        }
        // Q5_K: the same forms, its own blocks
        let w5 = q5k(&mut rng, rows * nb, pattern, extreme);
        let p5 = repack_q5k_x8(&w5, nb, "test").unwrap();
        assert_eq!(p5.len(), 2 * nb);
        for g in 0..2 {
            let q5 = &p5[g * nb..(g + 1) * nb];
            let row = |k: usize| (g * ROWS8 + k) * nb..(g * ROWS8 + k + 1) * nb;
            let (a5, b5) = (Arch::dot_q5k_r8_x4(q5, xs), Arch::dot_q5k_r8_x4(q5, plain));
            for (t, (&x, &xp)) in xs.iter().zip(&plain).enumerate() {
                let want5: [u32; 8] = std::array::from_fn(|k| Portable::dot_q5k(&w5[row(k)], x).to_bits());
                assert_eq!(bits8(Portable::dot_q5k_r8(q5, x)), want5, "portable q5_k r8 {tag} g={g}");
                assert_eq!(bits8(Arch::dot_q5k_r8(q5, x)), want5, "q5_k r8 {tag} g={g} t={t}");
                assert_eq!(bits8(Arch::dot_q5k_r8(q5, xp)), want5, "q5_k r8 plain {tag} g={g} t={t}");
                assert_eq!((bits8(a5[t]), bits8(b5[t])), (want5, want5), "q5_k r8 x4 {tag} g={g} t={t}");
                // the two- and three-token forms, token t at position p, others beside it
                for p in 0..2 {
                    let x2 = std::array::from_fn(|i| if i == p { xs[t] } else { xs[(t + 1) % 4] });
                    assert_eq!(bits8(Arch::dot_q5k_r8_x2(q5, x2)[p]), want5, "q5_k r8 x2 {tag} g={g} t={t} p={p}");
                }
                for p in 0..3 {
                    let x3 = std::array::from_fn(|i| if i == p { plain[t] } else { xs[(t + i + 1) % 4] });
                    assert_eq!(bits8(Arch::dot_q5k_r8_x3(q5, x3)[p]), want5, "q5_k r8 x3 {tag} g={g} t={t} p={p}");
                }
            }
        }
    }
}

/// The K-quant prompt tile kernels (`tile_q4k`, `tile_q5k`, `tile_q6k`: two interleaved
/// groups · a run of tokens) against the single-row dots, bit for bit: every
/// row, every run length up to the set's `TILE_TOKENS` (four for the
/// default), random and extreme blocks and activations.
#[test]
fn kquant_prompt_tiles_equal_single_row_dots() {
    use crate::quant::{repack_q4k_x8, repack_q5k_x8, repack_q6k_x8, ROWS8};
    let mut rng = Rng(0x0071_174b);
    #[allow(clippy::absurd_extreme_comparisons)] // TILE_TOKENS is 0 in some sets
    let n_max = if Arch::TILE_TOKENS > 4 { Arch::TILE_TOKENS } else { 4 };
    for (nb, pattern, extreme) in [(1, 3, false), (2, 3, false), (6, 3, false), (9, 3, false), (35, 3, false)]
        .into_iter()
        .chain((0..4).flat_map(|p| [(1, p, true), (3, p, true)]))
    {
        let rows = 2 * ROWS8;
        let (w4, w6) = (q4k(&mut rng, rows * nb, pattern, extreme), q6k(&mut rng, rows * nb, pattern, extreme));
        let (p4, p6) = (repack_q4k_x8(&w4, nb, "test").unwrap(), repack_q6k_x8(&w6, nb, "test").unwrap());
        let acts: Vec<ActQ8> = (0..n_max).map(|_| acts(&mut rng, 8 * nb, pattern, extreme)).collect();
        let want = |dot: &dyn Fn(usize, ActRef) -> f32| -> Vec<[u32; 16]> {
            acts.iter().map(|a| std::array::from_fn(|r| dot(r, a.as_ref()).to_bits())).collect()
        };
        let want4 = want(&|r, x| Arch::dot_q4k(&w4[r * nb..(r + 1) * nb], x));
        let want6 = want(&|r, x| Arch::dot_q6k(&w6[r * nb..(r + 1) * nb], x));
        let w5 = q5k(&mut rng, rows * nb, pattern, extreme);
        let p5 = repack_q5k_x8(&w5, nb, "test").unwrap();
        let want5 = want(&|r, x| Arch::dot_q5k(&w5[r * nb..(r + 1) * nb], x));
        for n in 1..=n_max {
            let xs: Vec<ActRef> = acts[..n].iter().map(|a| a.as_ref()).collect();
            let mut out = vec![[0.0f32; 16]; n];
            let check = |name: &str, out: &[[f32; 16]], want: &[[u32; 16]]| {
                for t in 0..n {
                    assert_eq!(
                        out[t].map(f32::to_bits),
                        want[t],
                        "{name} nb={nb} pattern={pattern} {extreme} n={n} t={t}"
                    );
                }
            };
            Arch::tile_q4k(&p4, nb, &xs, &mut out);
            check("tile_q4k", &out, &want4);
            Portable::tile_q4k(&p4, nb, &xs, &mut out);
            check("portable tile_q4k", &out, &want4);
            Arch::tile_q5k(&p5, nb, &xs, &mut out);
            check("tile_q5k", &out, &want5);
            Portable::tile_q5k(&p5, nb, &xs, &mut out);
            check("portable tile_q5k", &out, &want5);
            Arch::tile_q6k(&p6, nb, &xs, &mut out);
            check("tile_q6k", &out, &want6);
            Portable::tile_q6k(&p6, nb, &xs, &mut out);
            check("portable tile_q6k", &out, &want6);
        }
    }
}

/// A Q4_K, a Q5_K and a Q6_K matrix give the same bits through `matmul` with and
/// without the eight-row layout, for one token, a batch split by row tiles
/// and one split by runs of tokens, on 1 to 3 threads.
#[test]
fn kquant_matmul_is_identical_with_and_without_repack() {
    use crate::quant::{repack_q4k_x8, repack_q5k_x8, repack_q6k_x8};
    let mut rng = Rng(0x6d61_746d);
    let (rows, cols) = (37, 3 * 256);
    let nb = cols / 256;
    let (w4, w6) = (q4k(&mut rng, rows * nb, 3, false), q6k(&mut rng, rows * nb, 3, false));
    let (p4, p6) = (repack_q4k_x8(&w4, nb, "test").unwrap(), repack_q6k_x8(&w6, nb, "test").unwrap());
    let w5 = q5k(&mut rng, rows * nb, 3, false);
    let p5 = repack_q5k_x8(&w5, nb, "test").unwrap();
    let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
    for n_tok in [1, 2, 3, 9, 17, 33, 70] {
        let x = rng.vec(n_tok * cols);
        let kinds = [
            (WeightData::Q4K(&w4), Packed::Q4K(&p4)),
            (WeightData::Q5K(&w5), Packed::Q5K(&p5)),
            (WeightData::Q6K(&w6), Packed::Q6K(&p6)),
        ];
        for (data, packed) in kinds {
            let m = MatRef { rows, cols, data, packed };
            let mut plain = vec![0.0; n_tok * rows];
            matmul(&MatRef { packed: Packed::None, ..m }, &Input::new(&x, cols), &mut plain);
            for threads in [1, 2, 3] {
                let pool = std::sync::Arc::new(crate::pool::Pool::new(threads).unwrap());
                let mut got = vec![0.0; n_tok * rows];
                pool.install(|| matmul(&m, &Input::new(&x, cols), &mut got));
                assert_eq!(bits(&got), bits(&plain), "repacked K-quant rows, {n_tok} tokens, {threads} threads");
                let mut single = vec![0.0; rows];
                let xs = &x[(n_tok - 1) * cols..];
                pool.install(|| matmul(&m, &Input::new(xs, cols), &mut single));
                assert_eq!(bits(&single), bits(&plain[(n_tok - 1) * rows..]), "last token alone, {threads} threads");
            }
        }
    }
}

/// One core streaming a 200 MB Q4_K matrix in eight-row groups from memory
/// (Qwen2.5-1.5B's 1536 columns) through the one- and four-token kernels,
/// beside a plain sum of the same bytes, in 4 KiB pages and then in
/// transparent huge pages (`quant::ask_for_huge_pages`): how near the
/// kernels come to the core's read bandwidth (docs/PERFORMANCE.md, "Four
/// streams against one"). `cargo test --release -p krafla --lib
/// bench_stream_q4k -- --ignored --nocapture` under the variant's RUSTFLAGS.
#[test]
#[ignore]
fn bench_stream_q4k() {
    use crate::quant::{ask_for_huge_pages, repack_q4k_x8, BlockQ4Kx8};
    let (nb, groups) = (6, 30_000);
    let mut rng = Rng(5);
    let pk = repack_q4k_x8(&q4k(&mut rng, 8 * nb, 3, false), nb, "bench").unwrap();
    let acts: Vec<ActQ8> = (0..4).map(|_| acts(&mut rng, 8 * nb, 0, false)).collect();
    let x: [ActRef; 4] = std::array::from_fn(|t| acts[t].as_ref());
    for huge in [false, true] {
        let mut big: Vec<BlockQ4Kx8> = Vec::with_capacity(groups * nb);
        if huge {
            ask_for_huge_pages(&big);
        }
        (0..groups).for_each(|_| big.extend_from_slice(&pk));
        let bytes = std::mem::size_of_val(&big[..]) as f64;
        let best_rate = |pass: &mut dyn FnMut() -> f32| {
            let mut best = f64::MAX;
            for _ in 0..3 {
                let t = std::time::Instant::now();
                std::hint::black_box(pass());
                best = best.min(t.elapsed().as_secs_f64());
            }
            bytes / best / 1e9
        };
        let one = best_rate(&mut || big.chunks_exact(nb).map(|w| Arch::dot_q4k_r8(w, x[0])[0]).sum());
        let four = best_rate(&mut || big.chunks_exact(nb).map(|w| Arch::dot_q4k_r8_x4(w, x)[3][0]).sum());
        let words: &[u64] = bytemuck::cast_slice(&big[..]);
        let sum = best_rate(&mut || words.iter().fold(0u64, |a, &b| a.wrapping_add(b)) as f32);
        let pages = if huge { "huge pages" } else { "4 KiB pages" };
        eprintln!("{ISA}, {pages}: one token {one:.1} GB/s, four tokens {four:.1} GB/s, a plain sum {sum:.1} GB/s");
    }
}
