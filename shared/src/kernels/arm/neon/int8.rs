//! armv7 NEON int8 kernels in `asm!`: the exact per-block integer sums of
//! Q8 and Q4 weights against quantised activations (`vmull.s8` +
//! `vpadal.s16`), then their scaling and summation in `portable`'s order,
//! with the flush-to-zero check (mod.rs) that keeps them bit-identical.

use core::arch::asm;

use crate::kernels::portable::{combine8, f16_bits_to_f32};
use crate::quant::{e8m0_half_bits, ActRef, BlockMxfp4, BlockQ8Act, Q4Block, Q8Block, MXFP4_VALUES};

/// Blocks whose integer sums one `isums` call computes at most (the stack buffer).
const CHUNK: usize = 64;

/// Byte distance between the quants of consecutive activation blocks.
const ACT_STRIDE: usize = core::mem::size_of::<BlockQ8Act>();

/// `isums!(n, w, ws, x, out, setup, block)`: the exact integer sums of `n`
/// blocks into `out` (i32), four blocks per step and then one by one.
/// `block` is the text of one block: it loads the block's weights from
/// `{w}` and its 32 activation quants from `{x}` (advancing each by its
/// stride `{ws}` / `{xs}`) and leaves the 32 products pairwise added in the
/// i32 lanes of q8 (d16, d17).
macro_rules! isums {
    ($n:expr, $w:expr, $ws:expr, $x:expr, $out:expr, $setup:expr, $block:expr) => {
        asm!(
            $setup,
            "movs {n4}, {n}, lsr #2",
            "beq 3f",
            "2:",
            $block,
            "vpadd.i32 d24, d16, d17",
            $block,
            "vpadd.i32 d25, d16, d17",
            $block,
            "vpadd.i32 d26, d16, d17",
            $block,
            "vpadd.i32 d27, d16, d17",
            "vpadd.i32 d24, d24, d25",
            "vpadd.i32 d25, d26, d27",
            "vst1.32 {{d24-d25}}, [{out}]!", // four block sums
            "subs {n4}, {n4}, #1",
            "bne 2b",
            "3:",
            "ands {n}, {n}, #3",
            "beq 5f",
            "4:",
            $block,
            "vpadd.i32 d24, d16, d17",
            "vpadd.i32 d24, d24, d24",
            "vst1.32 {{d24[0]}}, [{out}]!",
            "subs {n}, {n}, #1",
            "bne 4b",
            "5:",
            n = inout(reg) $n => _,
            n4 = out(reg) _,
            w = inout(reg) $w => _,
            ws = in(reg) $ws,
            x = inout(reg) $x => _,
            xs = in(reg) ACT_STRIDE,
            out = inout(reg) $out => _,
            out("q0") _, out("q1") _, out("q2") _, out("q3") _,
            out("q8") _, out("q9") _, out("q10") _, out("q11") _,
            out("q12") _, out("q13") _, out("q14") _, out("q15") _,
            options(nostack),
        )
    };
}

/// One Q8 block: 32 weight and 32 activation quants, four `vmull.s8` (each
/// i8·i8 fits i16) and `vpadal.s16` into the i32 lanes of q8.
macro_rules! q8_block {
    () => {
        concat!(
            "vld1.8 {{d0-d3}}, [{w}], {ws}\n",
            "vld1.8 {{d4-d7}}, [{x}], {xs}\n",
            "vmull.s8 q8, d0, d4\n",
            "vmull.s8 q9, d1, d5\n",
            "vmull.s8 q10, d2, d6\n",
            "vmull.s8 q11, d3, d7\n",
            "vpaddl.s16 q8, q8\n",
            "vpadal.s16 q8, q9\n",
            "vpadal.s16 q8, q10\n",
            "vpadal.s16 q8, q11\n",
        )
    };
}

/// One Q4 block: 16 nibble bytes (byte j: element j low, j + 16 high) as
/// signed `nibble − 8` (q14 = 0x0f bytes, q15 = 8 bytes), then as `q8_block!`.
macro_rules! q4_block {
    () => {
        concat!(
            "vld1.8 {{d0-d1}}, [{w}], {ws}\n",
            "vld1.8 {{d4-d7}}, [{x}], {xs}\n",
            "vand q1, q0, q14\n",
            "vshr.u8 q0, q0, #4\n",
            "vsub.i8 q1, q1, q15\n", // elements 0..16
            "vsub.i8 q0, q0, q15\n", // elements 16..32
            "vmull.s8 q8, d2, d4\n",
            "vmull.s8 q9, d3, d5\n",
            "vmull.s8 q10, d0, d6\n",
            "vmull.s8 q11, d1, d7\n",
            "vpaddl.s16 q8, q8\n",
            "vpadal.s16 q8, q9\n",
            "vpadal.s16 q8, q10\n",
            "vpadal.s16 q8, q11\n",
        )
    };
}

/// out[k] = Σ_j w[k]_j·x[k]_j, exact, for k < out.len().
fn isums_q8<B: Q8Block>(w: &[B], x: &[BlockQ8Act], out: &mut [i32]) {
    let n = out.len();
    assert!(n > 0 && w.len() >= n && x.len() >= n);
    // SAFETY: the loop reads n blocks' 32 quants at stride size_of::<B>()
    // from w[0].quants() and at stride ACT_STRIDE from x[0].qs (both slices
    // hold ≥ n blocks, asserted; the quants are the blocks' trailing 32
    // bytes) and writes n i32 to out; it touches only the declared NEON
    // registers and the flags; NEON is checked by the start-up guard.
    unsafe {
        isums!(
            n,
            w[0].quants().as_ptr(),
            core::mem::size_of::<B>(),
            x[0].qs.as_ptr(),
            out.as_mut_ptr(),
            "",
            q8_block!()
        )
    }
}

/// out[k] = Σ_j (nibble_j − 8)·x[k]_j over w[k]'s nibbles, exact, for k < out.len().
fn isums_q4<B: Q4Block>(w: &[B], x: &[BlockQ8Act], out: &mut [i32]) {
    let n = out.len();
    assert!(n > 0 && w.len() >= n && x.len() >= n);
    // SAFETY: as `isums_q8`, reading 16 nibble bytes per weight block.
    unsafe {
        isums!(
            n,
            w[0].nibbles().as_ptr(),
            core::mem::size_of::<B>(),
            x[0].qs.as_ptr(),
            out.as_mut_ptr(),
            "vmov.i8 q14, #15\nvmov.i8 q15, #8",
            q4_block!()
        )
    }
}

/// out[k] = Σ_j `MXFP4_VALUES`[code_j]·x[k]_j over w[k]'s codes, exact, for
/// k < out.len(): the nibbles split as in `q4_block!`, looked up in the
/// 16-byte table (q13) with `vtbl.8`, then as `q8_block!`; one block a step.
fn isums_mxfp4(w: &[BlockMxfp4], x: &[BlockQ8Act], out: &mut [i32]) {
    let n = out.len();
    assert!(n > 0 && w.len() >= n && x.len() >= n);
    // SAFETY: the loop reads the 16-byte table, n blocks' 16 code bytes at
    // stride size_of::<BlockMxfp4>() from w[0].qs and 32 activation quants
    // at stride ACT_STRIDE from x[0].qs (both slices hold ≥ n blocks,
    // asserted) and writes n i32 to out; it touches only the declared NEON
    // registers and the flags; NEON is checked by the start-up guard.
    unsafe {
        asm!(
            "vld1.8 {{d26-d27}}, [{tab}]",
            "vmov.i8 q14, #15",
            "2:",
            "vld1.8 {{d0-d1}}, [{w}], {ws}",
            "vld1.8 {{d4-d7}}, [{x}], {xs}",
            "vand q1, q0, q14",
            "vshr.u8 q0, q0, #4",
            "vtbl.8 d2, {{d26-d27}}, d2", // elements 0..8
            "vtbl.8 d3, {{d26-d27}}, d3", // 8..16
            "vtbl.8 d0, {{d26-d27}}, d0", // 16..24
            "vtbl.8 d1, {{d26-d27}}, d1", // 24..32
            "vmull.s8 q8, d2, d4",
            "vmull.s8 q9, d3, d5",
            "vmull.s8 q10, d0, d6",
            "vmull.s8 q11, d1, d7",
            "vpaddl.s16 q8, q8",
            "vpadal.s16 q8, q9",
            "vpadal.s16 q8, q10",
            "vpadal.s16 q8, q11",
            "vpadd.i32 d24, d16, d17",
            "vpadd.i32 d24, d24, d24",
            "vst1.32 {{d24[0]}}, [{out}]!",
            "subs {n}, {n}, #1",
            "bne 2b",
            tab = in(reg) MXFP4_VALUES.as_ptr(),
            n = inout(reg) n => _,
            w = inout(reg) w[0].qs.as_ptr() => _,
            ws = in(reg) core::mem::size_of::<BlockMxfp4>(),
            x = inout(reg) x[0].qs.as_ptr() => _,
            xs = in(reg) ACT_STRIDE,
            out = inout(reg) out.as_mut_ptr() => _,
            out("q0") _, out("q1") _, out("q2") _, out("q3") _,
            out("q8") _, out("q9") _, out("q10") _, out("q11") _,
            out("q12") _, out("q13") _, out("q14") _,
            options(nostack),
        )
    }
}

/// `check!("qN")`: marks in q11 the lanes of qN whose magnitude is nonzero
/// and below 2^-51 (q15 = 2^-51's bits shifted left by one; temporaries q10, q14).
#[rustfmt::skip]
macro_rules! check {
    ($q:literal) => {
        concat!(
            "vshl.i32 q10, ", $q, ", #1\n", // the magnitude bits, shifted left
            "vcgt.u32 q14, q15, q10\n",
            "vtst.32 q10, q10, q10\n",
            "vand q14, q14, q10\n",
            "vorr q11, q11, q14\n",
        )
    };
}

/// `lanes[l]` += Σ over the blocks k ≡ l (mod 8) of (d_w·d_x)·isum, in
/// block order, for `sums.len()` (a multiple of 8) blocks in NEON: weight
/// scales from `wbits` (f16 bits when `f16`, else f32 bits), activation
/// scales `dx`. Returns false, leaving `lanes` meaningless, if a scale's
/// magnitude is nonzero and below 2^-51: otherwise every scale is zero or
/// normal, every nonzero d_w·d_x is ≥ 2^-102, and so every product and
/// partial sum is 0 or a multiple of 2^-125, never subnormal, and NEON's
/// flush-to-zero cannot change a bit.
fn scale8(f16: bool, sums: &[i32], wbits: &[u32], dx: &[f32], lanes: &mut [f32; 8]) -> bool {
    let n8 = sums.len() / 8;
    assert!(n8 > 0 && sums.len().is_multiple_of(8) && wbits.len() >= sums.len() && dx.len() >= sums.len());
    let (mut bad0, mut bad1): (u32, u32);
    macro_rules! pass {
        ($($cvt:expr),*) => {
            asm!(
                f16_consts!(),
                "vmov.i32 q15, #0x4c000000",
                "vmov.i32 q11, #0",
                "vld1.32 {{d24-d27}}, [{acc}]",
                "2:",
                "vld1.32 {{d4-d7}}, [{wb}]!",
                $($cvt,)*
                "vld1.32 {{d16-d19}}, [{dx}]!",
                check!("q2"),
                check!("q3"),
                check!("q8"),
                check!("q9"),
                "vmul.f32 q2, q2, q8", // d = d_w·d_x
                "vmul.f32 q3, q3, q9",
                "vld1.32 {{d0-d3}}, [{s}]!",
                "vcvt.f32.s32 q0, q0", // exact: |isum| < 2^24
                "vcvt.f32.s32 q1, q1",
                "vmul.f32 q0, q2, q0",
                "vmul.f32 q1, q3, q1",
                "vadd.f32 q12, q12, q0",
                "vadd.f32 q13, q13, q1",
                "subs {n}, {n}, #1",
                "bne 2b",
                "vst1.32 {{d24-d27}}, [{acc}]",
                "vorr d22, d22, d23",
                "vmov {bad0}, {bad1}, d22",
                acc = in(reg) lanes.as_mut_ptr(),
                wb = inout(reg) wbits.as_ptr() => _,
                dx = inout(reg) dx.as_ptr() => _,
                s = inout(reg) sums.as_ptr() => _,
                n = inout(reg) n8 => _,
                bad0 = out(reg) bad0,
                bad1 = out(reg) bad1,
                out("q0") _, out("q1") _, out("q2") _, out("q3") _,
                out("q4") _, out("q5") _, out("q6") _, out("q7") _,
                out("q8") _, out("q9") _, out("q10") _, out("q11") _,
                out("q12") _, out("q13") _, out("q14") _, out("q15") _,
                options(nostack),
            )
        };
    }
    // SAFETY: the loop reads 8·n8 elements of sums, wbits and dx (each holds
    // at least that many, asserted) and reads and writes the 8 f32 of
    // `lanes`; it touches only the declared NEON registers, the two outputs
    // and the flags; NEON is checked by the start-up guard.
    unsafe {
        if f16 {
            pass!(f16x4!("q2"), f16x4!("q3"))
        } else {
            pass!()
        }
    }
    bad0 | bad1 == 0
}

/// `lanes[b % 8]` += (d_w·d_x)·isum for blocks b = b0.. (one per `sums`
/// element) in scalar IEEE arithmetic, in block order.
fn scale_scalar(lanes: &mut [f32; 8], b0: usize, sums: &[i32], dw: impl Fn(usize) -> f32, dx: impl Fn(usize) -> f32) {
    for (k, &s) in sums.iter().enumerate() {
        let b = b0 + k;
        lanes[b % 8] += (dw(b) * dx(b)) * s as f32;
    }
}

/// Σ_b (d_w·d_x)·isum_b over `n` blocks in `portable`'s order for N
/// activation rows (one token, or four of a prompt): block b into lane b %
/// 8 (multiply, multiply, add), the lanes combined as
/// `portable::combine8`. The exact sums come `CHUNK` blocks at a time from
/// `isums(t, b0, out)` for row t, each chunk for all N rows in turn, so
/// the chunk's weights (at most 64 blocks, 2.2 KB) come from memory once
/// and from the L1 cache for the other rows; `bits(b)` is weight block b's
/// scale (f16 bits when `f16`); the activation scales come from a row's
/// contiguous array when it has one, else from its blocks. Whole groups of
/// eight blocks are scaled in NEON (`scale8`), the last n % 8 in scalar
/// code; if `scale8` finds a scale that NEON's flush-to-zero could misread
/// for a row, that row's sum is redone in scalar code. Each row's
/// operations are the one-row form's, so its result is the same bits.
#[inline]
fn scaled_sum<const N: usize>(
    n: usize,
    xs: [ActRef; N],
    f16: bool,
    bits: impl Fn(usize) -> u32,
    mut isums: impl FnMut(usize, usize, &mut [i32]),
) -> [f32; N] {
    let dw = |b: usize| if f16 { f16_bits_to_f32(bits(b) as u16) } else { f32::from_bits(bits(b)) };
    let mut lanes = [[0.0f32; 8]; N];
    let (mut sums, mut wbits, mut dxs) = ([0i32; CHUNK], [0u32; CHUNK], [0.0f32; CHUNK]);
    let n8 = n / 8 * 8;
    let mut exact = [true; N];
    for b0 in (0..n8).step_by(CHUNK) {
        let m = CHUNK.min(n8 - b0);
        for (k, v) in wbits[..m].iter_mut().enumerate() {
            *v = bits(b0 + k);
        }
        for (t, x) in xs.iter().enumerate() {
            isums(t, b0, &mut sums[..m]);
            let d = if x.has_side() {
                &x.d[b0..b0 + m]
            } else {
                for (v, b) in dxs[..m].iter_mut().zip(&x.blocks()[b0..b0 + m]) {
                    *v = b.d;
                }
                &dxs[..m]
            };
            exact[t] &= scale8(f16, &sums[..m], &wbits[..m], d, &mut lanes[t]);
        }
    }
    for (t, x) in xs.iter().enumerate() {
        let (side, xb) = (x.has_side(), x.blocks());
        let dx = |b: usize| if side { x.d[b] } else { xb[b].d };
        if !exact[t] {
            lanes[t] = [0.0; 8];
            for b0 in (0..n8).step_by(CHUNK) {
                let sums = &mut sums[..CHUNK.min(n8 - b0)];
                isums(t, b0, sums);
                scale_scalar(&mut lanes[t], b0, sums, dw, dx);
            }
        }
        if n8 < n {
            let sums = &mut sums[..n - n8];
            isums(t, n8, sums);
            scale_scalar(&mut lanes[t], n8, sums, dw, dx);
        }
    }
    lanes.map(combine8)
}

/// Q8 weights · Q8 activations for N activation rows: exact per-block
/// integer sums in NEON, scaled and summed in `portable`'s order
/// (bit-identical; N = 1 is `dot_q8`).
#[inline]
pub(crate) fn dot_q8_n<B: Q8Block, const N: usize>(w: &[B], xs: [ActRef; N]) -> [f32; N] {
    debug_assert!(xs.iter().all(|x| x.len() == w.len()));
    let n = xs.iter().fold(w.len(), |n, x| n.min(x.len()));
    let xb = xs.map(|x| x.blocks());
    scaled_sum(n, xs, B::F16_SCALE, |b| w[b].scale_bits(), |t, b0, out| isums_q8(&w[b0..], &xb[t][b0..], out))
}

/// Q4 weights · Q8 activations for N activation rows: Σ (nibble − 8)·q per
/// block (exact), scaled as `dot_q8_n`.
#[inline]
pub(crate) fn dot_q4_n<B: Q4Block, const N: usize>(w: &[B], xs: [ActRef; N]) -> [f32; N] {
    debug_assert!(xs.iter().all(|x| x.len() == w.len()));
    let n = xs.iter().fold(w.len(), |n, x| n.min(x.len()));
    let xb = xs.map(|x| x.blocks());
    scaled_sum(n, xs, B::F16_SCALE, |b| w[b].scale_bits(), |t, b0, out| isums_q4(&w[b0..], &xb[t][b0..], out))
}

/// MXFP4 weights · Q8 activations for N activation rows: the values looked
/// up into int8, then as `dot_q8_n`.
#[inline]
pub(crate) fn dot_mxfp4_n<const N: usize>(w: &[BlockMxfp4], xs: [ActRef; N]) -> [f32; N] {
    debug_assert!(xs.iter().all(|x| x.len() == w.len()));
    let n = xs.iter().fold(w.len(), |n, x| n.min(x.len()));
    let xb = xs.map(|x| x.blocks());
    scaled_sum(n, xs, false, |b| e8m0_half_bits(w[b].e), |t, b0, out| isums_mxfp4(&w[b0..], &xb[t][b0..], out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The quantised dots at the edge of `scale8`'s flush-to-zero check
    /// (scales of 2^-51, one ulp below, f32 subnormals, mixed signs) give
    /// `portable`'s bits, whichever path computes them.
    #[test]
    fn armv7_scale_check_boundary_matches_portable() {
        use crate::kernels::{Kernels, Portable};
        use crate::quant::{ActQ8, BlockQ8_0F32};
        let t = f32::powi(2.0, -51);
        let below = f32::from_bits(t.to_bits() - 1);
        let scales = [t, -t, below, -below, 1.0, 3.0e-39, f32::MIN_POSITIVE, 0.0];
        for nb in [8, 16, 19, 64, 72] {
            for (i, &sw) in scales.iter().enumerate() {
                for &sx in &scales {
                    let mut s = (nb * 131 + i) as u32 | 1;
                    let mut next = move || {
                        s ^= s << 13;
                        s ^= s >> 17;
                        s ^= s << 5;
                        s
                    };
                    let x: Vec<BlockQ8Act> = (0..nb)
                        .map(|k| {
                            let mut b = BlockQ8Act { d: if k % 3 == 0 { sx } else { 0.37 }, ..Default::default() };
                            b.qs.iter_mut().for_each(|q| *q = ((next() % 255) as i32 - 127) as i8);
                            b.sum = b.qs.iter().map(|&q| q as i32).sum();
                            b
                        })
                        .collect();
                    let w: Vec<BlockQ8_0F32> = (0..nb)
                        .map(|k| {
                            let mut b = BlockQ8_0F32 { d: if k % 2 == 0 { sw } else { t }, qs: [0; 32] };
                            b.qs.iter_mut().for_each(|q| *q = next() as i8);
                            b
                        })
                        .collect();
                    let xq = ActQ8::from_blocks(x);
                    let (got, want) = (dot_q8_n(&w, [xq.as_ref()])[0], Portable::dot_q8(&w, &xq));
                    assert_eq!(got.to_bits(), want.to_bits(), "nb={nb} w scale {sw:e} x scale {sx:e}");
                    // four rows, the flush-to-zero fallback taken by some rows only
                    let plain = ActQ8::quantize(&vec![1.0; nb * 32]);
                    let four = dot_q8_n(&w, [plain.as_ref(), xq.as_ref(), plain.as_ref(), xq.as_ref()]);
                    let p = Portable::dot_q8(&w, &plain);
                    assert_eq!(four.map(f32::to_bits), [p, want, p, want].map(f32::to_bits), "x4 nb={nb}");
                }
            }
        }
    }

    /// The Q4 nibble unpacking and the four-block / one-block paths of the
    /// integer sums, against a scalar sum, for every count 1..=70.
    #[test]
    fn armv7_block_sums_match_scalar() {
        use crate::quant::{BlockQ4_0, BlockQ8_0};
        let mut s = 0x1234_5678u32;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        };
        for n in 1..=70 {
            let x: Vec<BlockQ8Act> = (0..n)
                .map(|_| {
                    let mut b = BlockQ8Act::default();
                    b.qs.iter_mut().for_each(|q| *q = (next() % 255) as i8);
                    b.qs.iter_mut().for_each(|q| *q = (*q).max(-127));
                    b
                })
                .collect();
            let w8: Vec<BlockQ8_0> = (0..n)
                .map(|_| {
                    let mut b = BlockQ8_0::default();
                    b.qs.iter_mut().for_each(|q| *q = next() as i8);
                    b
                })
                .collect();
            let w4: Vec<BlockQ4_0> = (0..n)
                .map(|_| {
                    let mut b = BlockQ4_0::default();
                    b.qs.iter_mut().for_each(|q| *q = next() as u8);
                    b
                })
                .collect();
            let (mut g8, mut g4) = (vec![0; n], vec![0; n]);
            isums_q8(&w8, &x, &mut g8);
            isums_q4(&w4, &x, &mut g4);
            for k in 0..n {
                let want8: i32 = w8[k].qs.iter().zip(&x[k].qs).map(|(&a, &b)| a as i32 * b as i32).sum();
                let want4: i32 = (0..16)
                    .map(|j| {
                        let byte = w4[k].qs[j] as i32;
                        ((byte & 15) - 8) * x[k].qs[j] as i32 + ((byte >> 4) - 8) * x[k].qs[j + 16] as i32
                    })
                    .sum();
                assert_eq!(g8[k], want8, "q8 n={n} block {k}");
                assert_eq!(g4[k], want4, "q4 n={n} block {k}");
            }
        }
    }
}
