//! The MXFP4 dots of the compiled-in `Arch` against `Portable` (bit for
//! bit), against the exact f64 sum of the dequantised weights
//! (`dequant_mxfp4`) times the activations' quants (within the bound of
//! tests.rs's module doc, which holds here as for Q8: each block's integer
//! sum is exact and its scale a power of two), and four tokens against one.
//! Run on every build as tests.rs is.
use super::*;
use crate::quant::{dequant_mxfp4, e8m0_half, ActQ8, ActRef, BlockMxfp4, BlockQ8Act, MXFP4_VALUES, QK};
use crate::test_rng::Rng;

/// Random blocks with scales 2^(e−128) for e in `e_lo..e_lo + e_span`.
pub(super) fn mxfp4_blocks(rng: &mut Rng, n: usize, e_lo: u8, e_span: u8) -> Vec<BlockMxfp4> {
    (0..n)
        .map(|_| {
            let mut b =
                BlockMxfp4 { e: e_lo.wrapping_add((rng.next() % u64::from(e_span.max(1))) as u8), qs: [0; QK / 2] };
            b.qs.iter_mut().for_each(|q| *q = rng.next() as u8);
            b
        })
        .collect()
}

/// (exact Σ over the dequantised weights of w·q·d_x in f64, the bound of tests.rs).
fn exact(w: &[BlockMxfp4], x: &[BlockQ8Act]) -> (f64, f64) {
    let (mut sum, mut mag, mut imag) = (0.0, 0.0, 0.0);
    let mut deq = [0.0f32; QK];
    for (bw, bx) in w.iter().zip(x) {
        dequant_mxfp4(std::slice::from_ref(bw), &mut deq);
        let d = e8m0_half(bw.e) as f64 * bx.d as f64;
        for (j, &v) in deq.iter().enumerate() {
            // the dequantised value is exactly e8m0_half(e)·MXFP4_VALUES[code]
            let code = if j < QK / 2 { bw.qs[j] & 15 } else { bw.qs[j - QK / 2] >> 4 };
            assert_eq!(v as f64, e8m0_half(bw.e) as f64 * MXFP4_VALUES[code as usize] as f64, "dequant of code {code}");
            sum += v as f64 * bx.qs[j] as f64 * bx.d as f64;
            let p = (MXFP4_VALUES[code as usize] as i64 * bx.qs[j] as i64).abs() as f64;
            mag += d.abs() * p;
            imag += p;
        }
    }
    let n = w.len();
    let bound =
        (n.div_ceil(8) + 5) as f64 * f64::powi(2.0, -24) * mag + (imag + (2 * n + 8) as f64) * f64::powi(2.0, -149);
    (sum, bound)
}

fn check(tag: &str, w: &[BlockMxfp4], x: &ActQ8) {
    let xq = x.as_ref();
    let got = Arch::dot_mxfp4(w, xq);
    let port = Portable::dot_mxfp4(w, xq);
    assert_eq!(got.to_bits(), port.to_bits(), "{tag}: {got} vs portable {port}");
    let (e, bound) = exact(w, xq.blocks());
    // a block's d_w·d_x·Σ|w·q| past f32's range may overflow to ±inf (then
    // inf − inf or inf·0 is NaN), as in any f32 dot: only the bits are checked
    let overflows =
        w.iter().zip(xq.blocks()).any(|(bw, bx)| e8m0_half(bw.e) as f64 * bx.d as f64 * 48768.0 >= f64::powi(2.0, 127));
    assert!(overflows || (got as f64 - e).abs() <= bound, "{tag}: {got} vs exact {e} (bound {bound:e})");
    // plain blocks (no contiguous scales and sums) give the same bits
    assert_eq!(Arch::dot_mxfp4(w, xq.blocks().into()).to_bits(), got.to_bits(), "{tag} from blocks");
}

#[test]
fn mxfp4_dots_match_exact_reference_and_portable() {
    let mut rng = Rng(0x3f4f4);
    for nb in (1..=40).chain([47, 64, 65, 96, 191, 256, 257, 1000]) {
        let x = ActQ8::quantize(&rng.vec(nb * QK));
        check(&format!("nb={nb}"), &mxfp4_blocks(&mut rng, nb, 118, 16), &x);
    }
}

/// Every scale code from the subnormal ones (e = 0, 1) to 2^126, all-ones
/// and all-−12 blocks, ±127 activations and tiny or huge activation scales.
#[test]
fn mxfp4_dots_on_extreme_values_match_portable_and_exact() {
    let mut rng = Rng(0xe830);
    for e in [0u8, 1, 2, 3, 64, 127, 128, 200, 230] {
        for nb in [1, 7, 8, 9, 33] {
            let mut w = mxfp4_blocks(&mut rng, nb, e, 1);
            w[0].qs = [0x77; QK / 2]; // +6 and +6: the largest values
            if nb > 1 {
                w[1].qs = [0xff; QK / 2]; // −6
            }
            let mut x = rng.vec(nb * QK);
            x[..QK].iter_mut().for_each(|v| *v = if v.is_sign_negative() { -1.0 } else { 1.0 }); // ±127
            for scale in [1e-30f32, 1.0, 1e20] {
                let xs: Vec<f32> = x.iter().map(|v| v * scale).collect();
                check(&format!("e={e} nb={nb} scale={scale:e}"), &w, &ActQ8::quantize(&xs));
            }
        }
    }
}

#[test]
fn mxfp4_four_token_dots_equal_single_token_dots() {
    let mut rng = Rng(0x4_70c);
    for nb in [1, 2, 7, 8, 9, 16, 17, 63, 90] {
        let w = mxfp4_blocks(&mut rng, nb, 110, 30);
        let xs: Vec<ActQ8> = (0..4).map(|_| ActQ8::quantize(&rng.vec(nb * QK))).collect();
        let refs = [xs[0].as_ref(), xs[1].as_ref(), xs[2].as_ref(), xs[3].as_ref()];
        let four = Arch::dot_mxfp4_x4(&w, refs).map(f32::to_bits);
        let single = refs.map(|x| Arch::dot_mxfp4(&w, x).to_bits());
        assert_eq!(four, single, "nb={nb}");
        let plain = [refs[0].blocks(), refs[1].blocks(), refs[2].blocks(), refs[3].blocks()].map(ActRef::from);
        assert_eq!(Arch::dot_mxfp4_x4(&w, plain).map(f32::to_bits), single, "plain nb={nb}");
    }
}

/// The table is E2M1 doubled: sign bit 3, exponent bits 2..1, mantissa bit 0.
#[test]
fn mxfp4_values_are_e2m1_doubled() {
    for code in 0..16u8 {
        let (sign, exp, man) = (code >> 3, (code >> 1) & 3, code & 1);
        let mag = if exp == 0 {
            f64::from(man) * 0.5
        } else {
            (1.0 + f64::from(man) * 0.5) * f64::powi(2.0, i32::from(exp) - 1)
        };
        let v = if sign == 1 { -mag } else { mag };
        assert_eq!(f64::from(MXFP4_VALUES[code as usize]), 2.0 * v, "code {code}");
    }
    for e in 0..=255u8 {
        let want = f64::powi(2.0, i32::from(e) - 128);
        assert_eq!(e8m0_half(e) as f64, want.min(f64::powi(2.0, 127)), "e8m0 {e}");
    }
}

/// The eight-row kernels (`dot_mxfp4_r8` and its two- to four-token forms)
/// and the prompt tile (`tile_mxfp4`) over repacked rows against the
/// single-row dots, bit for bit: every row of both groups, odd block
/// counts, every E8M0 code class (the subnormal 0 and 1, 2, 254, 255) and
/// the largest codes, activations at the quantiser's extremes, each token
/// in every position of the short forms, every tile length.
#[test]
fn mxfp4_eight_row_dots_and_tiles_equal_single_row_dots() {
    use crate::quant::{repack_mxfp4_x8, ROWS8};
    let mut rng = Rng(0x3f4_0008);
    let tile_tokens = super::tests::TILE_TEST_TOKENS;
    for nb in (1..=34).chain([47, 64, 65, 191, 300]) {
        let rows = 2 * ROWS8 + 3; // two groups and three rows left in the plain layout
        let mut w = mxfp4_blocks(&mut rng, rows * nb, 112, 30);
        for (i, e) in [0u8, 1, 2, 254, 255].into_iter().enumerate() {
            w[(i * 7919) % (rows * nb)].e = e;
        }
        w[(rows * nb) / 3].qs = [0x77; QK / 2];
        w[(rows * nb) / 2].qs = [0xff; QK / 2];
        let p = repack_mxfp4_x8(&w, nb, "test").unwrap();
        assert_eq!(p.len(), 2 * nb);
        let mut acts: Vec<ActQ8> = (0..tile_tokens).map(|_| ActQ8::quantize(&rng.vec(nb * QK))).collect();
        let big: Vec<f32> = (0..nb * QK).map(|i| if i % 3 == 0 { -1e30 } else { 1e30 }).collect();
        acts[1] = ActQ8::quantize(&big); // every quant ±127
        let xs: Vec<ActRef> = acts.iter().map(|a| a.as_ref()).collect();
        let want = |r: usize, t: usize| Arch::dot_mxfp4(&w[r * nb..(r + 1) * nb], xs[t]).to_bits();
        let bits8 = |v: [f32; 8]| v.map(f32::to_bits);
        for g in 0..2 {
            let q = &p[g * nb..(g + 1) * nb];
            let x4 = [xs[0], xs[1], xs[2], xs[3]];
            for t in 0..4 {
                let want8: [u32; 8] = std::array::from_fn(|k| want(g * ROWS8 + k, t));
                let port: [u32; 8] = std::array::from_fn(|k| {
                    Portable::dot_mxfp4(&w[(g * ROWS8 + k) * nb..(g * ROWS8 + k + 1) * nb], xs[t]).to_bits()
                });
                assert_eq!(want8, port, "single-row dots against portable nb={nb}");
                assert_eq!(bits8(Arch::dot_mxfp4_r8(q, xs[t])), want8, "r8 nb={nb} g={g} t={t}");
                assert_eq!(bits8(Portable::dot_mxfp4_r8(q, xs[t])), want8, "portable r8 nb={nb} g={g}");
                assert_eq!(bits8(Arch::dot_mxfp4_r8(q, xs[t].blocks().into())), want8, "r8 from blocks nb={nb}");
                assert_eq!(bits8(Arch::dot_mxfp4_r8_x4(q, x4)[t]), want8, "r8 x4 nb={nb} g={g} t={t}");
                for at in 0..3 {
                    let x3: [ActRef; 3] = std::array::from_fn(|i| if i == at { xs[t] } else { x4[(t + i + 1) % 4] });
                    assert_eq!(bits8(Arch::dot_mxfp4_r8_x3(q, x3)[at]), want8, "r8 x3 nb={nb} t={t} at={at}");
                    if at < 2 {
                        let x2 = [x3[0], x3[1]];
                        assert_eq!(bits8(Arch::dot_mxfp4_r8_x2(q, x2)[at]), want8, "r8 x2 nb={nb} t={t} at={at}");
                    }
                }
            }
        }
        for n in 1..=tile_tokens {
            let mut out = vec![[0.0f32; 16]; n];
            Arch::tile_mxfp4(&p, nb, &xs[..n], &mut out);
            for (t, o) in out.iter().enumerate() {
                let want16: [u32; 16] = std::array::from_fn(|r| want(r, t));
                assert_eq!(o.map(f32::to_bits), want16, "tile nb={nb} n={n} t={t}");
            }
        }
    }
}
