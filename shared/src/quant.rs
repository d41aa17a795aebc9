//! Quantised block layouts (docs/FORMAT.md) and the activation quantiser.
//!
//! Weights use llama.cpp-compatible Q8_0 / Q4_0 blocks of 32 with an f16
//! scale (or an f32 scale). Activations are quantised on the fly to
//! `BlockQ8Act`: 32 int8 values with an f32 scale and their integer sum, the
//! sum letting Q4_0 kernels fold the −8 offset out of the inner loop.

use bytemuck::{Pod, Zeroable};
use half::f16;

/// f16 to f32, exact, with the conversion chosen when compiling: F16C's
/// instruction in the builds that have it, else `f16_bits_to_f32`. Never
/// `half`'s `to_f32`, which (with `std`) picks F16C by run-time CPU
/// detection: each build converts with its own code.
#[inline(always)]
pub fn f16_to_f32(h: f16) -> f32 {
    #[cfg(all(target_arch = "x86_64", target_feature = "f16c"))]
    {
        use std::arch::x86_64::{_mm_cvtph_ps, _mm_cvtsi32_si128, _mm_cvtss_f32};
        // SAFETY: this build is compiled with F16C (the cfg above), which its
        // start-up guard checks; the intrinsics only read their arguments.
        unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h.to_bits() as i32))) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "f16c")))]
    f16_bits_to_f32(h.to_bits())
}

/// Exact f16 → f32 from the bits, without F16C: the magnitude bits shifted
/// into f32 position and multiplied by 2^112 (exact for normals and
/// subnormals), infinities and NaNs (quieted, as F16C does) patched in.
#[inline(always)]
pub fn f16_bits_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let rest = (h & 0x7fff) << 13;
    let mut v = (f32::from_bits(rest) * f32::from_bits(0x7780_0000)).to_bits();
    if rest >= 0x0f80_0000 {
        v = rest | 0x7f80_0000 | if rest > 0x0f80_0000 { 0x0040_0000 } else { 0 };
    }
    f32::from_bits(v | (h & 0x8000) << 16)
}

/// Weights per block.
pub const QK: usize = 32;

/// Q8_0 weight block: x = d · q.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

/// Q4_0 weight block: byte j holds element j (low nibble) and j + 16 (high
/// nibble); x = d · (nibble − 8).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

/// Q8_0 with an f32 scale.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct BlockQ8_0F32 {
    pub d: f32,
    pub qs: [i8; QK],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0F32>() == 36);

/// Q4_0 with an f32 scale.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct BlockQ4_0F32 {
    pub d: f32,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0F32>() == 20);

/// MXFP4 block (the OCP microscaling format as GGUF stores it, gpt-oss's
/// expert weights): 32 E2M1 values sharing one E8M0 power-of-two scale `e`;
/// byte j holds element j (low nibble) and j + 16 (high nibble), as Q4_0.
/// x = 2^(e−127) · e2m1(nibble) = `e8m0_half(e)` · `MXFP4_VALUES[nibble]`:
/// the values doubled are integers, so a block's dot with int8 activations
/// is an exact integer sum, as for Q8_0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct BlockMxfp4 {
    pub e: u8,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockMxfp4>() == 17);

/// Twice the E2M1 value of each 4-bit code (sign bit 3, then two exponent
/// bits and one mantissa bit): 0, ½, 1, 1½, 2, 3, 4, 6 and their negatives.
pub const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// 2^(e−128): half the E8M0 scale `e`, the factor of `MXFP4_VALUES`. Exact
/// for every e (e < 2 gives the subnormals 2^−128 and 2^−127; E8M0's NaN
/// code 255 reads as 2^127, as in llama.cpp).
#[inline(always)]
pub fn e8m0_half(e: u8) -> f32 {
    f32::from_bits(e8m0_half_bits(e))
}
/// The bits of `e8m0_half(e)`.
#[inline(always)]
pub fn e8m0_half_bits(e: u8) -> u32 {
    if e < 2 {
        0x0020_0000 << e
    } else {
        (u32::from(e) - 1) << 23
    }
}

/// Dequantises one row of MXFP4 blocks: `e8m0_half(e)`·value (exact).
pub fn dequant_mxfp4(blocks: &[BlockMxfp4], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let d = e8m0_half(b.e);
        for (j, &byte) in b.qs.iter().enumerate() {
            o[j] = d * f32::from(MXFP4_VALUES[usize::from(byte & 15)]);
            o[j + QK / 2] = d * f32::from(MXFP4_VALUES[usize::from(byte >> 4)]);
        }
    }
}

/// Weights per K-quant super-block (`BlockQ4K`, `BlockQ5K`, `BlockQ6K`):
/// eight activation blocks of `QK`.
pub const QK_K: usize = 256;

/// llama.cpp's Q4_K super-block: eight sub-blocks of 32, sub-block j with a
/// 6-bit scale sc[j] and min m[j] (`scales_mins_k4`), weight l of sub-block
/// j = d·sc[j]·q − dmin·m[j], q the low (j even) or high (j odd) nibble of
/// `qs[32·⌊j/2⌋ + l]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qs: [u8; 128],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

/// llama.cpp's Q5_K super-block: as `BlockQ4K` with a fifth bit, bit j of
/// `qh[l]` for weight l of sub-block j (q in 0..32).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qh: [u8; 32],
    pub qs: [u8; 128],
}
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);

/// llama.cpp's Q6_K super-block: sixteen groups of 16 with an int8 scale
/// each; weight e = d·scales[⌊e/16⌋]·(q − 32), q a 6-bit code: for
/// e = 128·h + 32·r + l (h < 2, r < 4, l < 32), the low (r < 2) or high
/// nibble of `ql[64·h + 32·(r mod 2) + l]` and bits 2r, 2r+1 of
/// `qh[32·h + l]` (`q6k_code`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ6K {
    pub ql: [u8; 128],
    pub qh: [u8; 64],
    pub scales: [i8; 16],
    pub d: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

/// Q4_K / Q5_K's eight 6-bit scales and eight 6-bit mins from their 12
/// packed bytes: sub-blocks 0..4 in the low six bits of bytes 0..4 (scales)
/// and 4..8 (mins); sub-blocks 4..8 in the nibbles of bytes 8..12 with the
/// top two bits of bytes 0..8.
#[inline(always)]
pub fn scales_mins_k4(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for i in 0..4 {
        sc[i] = s[i] & 63;
        mn[i] = s[4 + i] & 63;
        sc[4 + i] = (s[8 + i] & 15) | ((s[i] >> 2) & 0x30);
        mn[4 + i] = (s[8 + i] >> 4) | ((s[4 + i] >> 2) & 0x30);
    }
    (sc, mn)
}

/// The 5-bit code of weight l of sub-block j of a Q5_K block (Q4_K: the
/// same without `qh`).
#[inline(always)]
pub fn q5k_code(b: &BlockQ5K, j: usize, l: usize) -> u8 {
    ((b.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15) | (((b.qh[l] >> j) & 1) << 4)
}
/// The 4-bit code of weight l of sub-block j of a Q4_K block.
#[inline(always)]
pub fn q4k_code(b: &BlockQ4K, j: usize, l: usize) -> u8 {
    (b.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15
}
/// The 6-bit code (0..64, the weight is d·scale·(code − 32)) of weight e of
/// a Q6_K block.
#[inline(always)]
pub fn q6k_code(b: &BlockQ6K, e: usize) -> u8 {
    let (h, r, l) = (e / 128, (e % 128) / 32, e % 32);
    let lo = (b.ql[64 * h + 32 * (r % 2) + l] >> (4 * (r / 2))) & 15;
    let hi = (b.qh[32 * h + l] >> (2 * r)) & 3;
    lo | (hi << 4)
}

/// Dequantises one row of Q4_K blocks (the operations of llama.cpp's and
/// gguf-py's dequantisers: (d·sc)·q − dmin·m, one rounding each).
pub fn dequant_q4k(blocks: &[BlockQ4K], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        dequant_kmin(b.d, b.dmin, &b.scales, |j, l| q4k_code(b, j, l), o);
    }
}
/// Dequantises one row of Q5_K blocks (as `dequant_q4k`).
pub fn dequant_q5k(blocks: &[BlockQ5K], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        dequant_kmin(b.d, b.dmin, &b.scales, |j, l| q5k_code(b, j, l), o);
    }
}
/// One Q4_K / Q5_K super-block: (d·sc[j])·code(j, l) − dmin·m[j].
#[inline(always)]
fn dequant_kmin(d: f16, dmin: f16, scales: &[u8; 12], code: impl Fn(usize, usize) -> u8, out: &mut [f32]) {
    let (sc, mn) = scales_mins_k4(scales);
    let (d, dmin) = (f16_to_f32(d), f16_to_f32(dmin));
    for (j, o) in out.chunks_exact_mut(QK).enumerate() {
        let (dl, ml) = (d * sc[j] as f32, dmin * mn[j] as f32);
        for (l, v) in o.iter_mut().enumerate() {
            *v = dl * code(j, l) as f32 - ml;
        }
    }
}
/// Dequantises one row of Q6_K blocks: (d·scale)·(q − 32).
pub fn dequant_q6k(blocks: &[BlockQ6K], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        for (e, v) in o.iter_mut().enumerate() {
            *v = (d * b.scales[e / 16] as f32) * (q6k_code(b, e) as i32 - 32) as f32;
        }
    }
}

/// Rows per interleaved group of the eight-row kernels (`Kernels::dot_q8_r8` ...).
pub const ROWS8: usize = 8;

/// Block b of eight consecutive Q8_0 rows, interleaved for the eight-row
/// kernels: `d[k]` is row k's scale, `qs[32·i + 4·k + e]` is row k's quant
/// 4·i + e XOR the build's bias (`repack_q8_x8`), so one 32-byte load holds
/// four quants of each of the eight rows. Made at load time, or stored so
/// in the file (bias 0: docs/FORMAT.md, layout `rows8`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_0x8 {
    pub d: [f16; ROWS8],
    pub qs: [u8; ROWS8 * QK],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0x8>() == 8 * 34);

/// Block b of eight consecutive Q4_0 rows, interleaved as `BlockQ8_0x8`:
/// `qs[32·i + 4·k + e]` is row k's nibble byte 4·i + e (elements 4·i + e
/// and 16 + 4·i + e).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_0x8 {
    pub d: [f16; ROWS8],
    pub qs: [u8; ROWS8 * QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0x8>() == 8 * 18);

/// Block b of eight consecutive MXFP4 rows, interleaved as `BlockQ4_0x8`:
/// `e[k]` is row k's E8M0 scale, `qs[32·i + 4·k + e]` row k's nibble byte
/// 4·i + e. 136 bytes for 8 × 17: made at load only (the `rows8` file
/// layout holds no MXFP4).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockMxfp4x8 {
    pub e: [u8; ROWS8],
    pub qs: [u8; ROWS8 * QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockMxfp4x8>() == 8 * 17);

/// Whether a copy of quantised blocks takes any scale (the kernel tests'
/// extremes, `--save`) or refuses a scale that is NaN or infinite (the
/// loader: such a block makes every output it touches NaN).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scales {
    Any,
    Finite,
}

/// A quantised block's scales: d, and dmin where the type has one.
pub trait Scaled {
    /// The first scale that is NaN or infinite, if any.
    fn nonfinite_scale(&self) -> Option<f32>;
}

fn nonfinite_f16(d: f16) -> Option<f32> {
    (!d.is_finite()).then(|| f16_to_f32(d))
}

macro_rules! scaled_by {
    ($ty:ty, $($field:ident),+) => {
        impl Scaled for $ty {
            #[inline(always)]
            fn nonfinite_scale(&self) -> Option<f32> {
                None$(.or_else(|| nonfinite_f16(self.$field)))+
            }
        }
    };
}
scaled_by!(BlockQ8_0, d);
scaled_by!(BlockQ4_0, d);
scaled_by!(BlockQ4K, d, dmin);
scaled_by!(BlockQ5K, d, dmin);
scaled_by!(BlockQ6K, d);
/// An E8M0 scale is never NaN or infinite here: `e8m0_half` reads every
/// code, 255 included, as a finite power of two.
impl Scaled for BlockMxfp4 {
    fn nonfinite_scale(&self) -> Option<f32> {
        None
    }
}
impl Scaled for BlockQ8_0F32 {
    fn nonfinite_scale(&self) -> Option<f32> {
        (!self.d.is_finite()).then_some(self.d)
    }
}
impl Scaled for BlockQ4_0F32 {
    fn nonfinite_scale(&self) -> Option<f32> {
        (!self.d.is_finite()).then_some(self.d)
    }
}

/// Whether every value of `x` is finite (neither NaN nor infinite), in one
/// pass of integer operations that every build vectorises: a value's
/// exponent field is all ones exactly when adding one to it carries into
/// the sign bit.
pub fn all_finite(x: &[f32]) -> bool {
    let carry = x.iter().fold(0u32, |acc, v| acc | ((v.to_bits() & 0x7f80_0000) + 0x0080_0000));
    carry & 0x8000_0000 == 0
}

/// The first block with a scale that is NaN or infinite: its index and that scale.
pub fn nonfinite_block<B: Scaled>(blocks: &[B]) -> Option<(usize, f32)> {
    blocks.iter().enumerate().find_map(|(i, b)| Some((i, b.nonfinite_scale()?)))
}

/// The error of block `block` (in row-major order) of `what` having the scale `scale`.
pub fn nonfinite_scale_error(what: &str, block: usize, scale: f32) -> String {
    format!("{what} has a non-finite scale ({scale}) in block {block}")
}

/// Notes block `at` as non-finite when it is the first so far (the blocks
/// of a copy are checked in any order, on all threads).
struct FirstBad(std::sync::atomic::AtomicUsize);

impl FirstBad {
    fn new() -> FirstBad {
        FirstBad(std::sync::atomic::AtomicUsize::new(usize::MAX))
    }
    fn note(&self, at: usize) {
        self.0.fetch_min(at, std::sync::atomic::Ordering::Relaxed);
    }
    /// The error naming the first block noted, of the row-major `blocks`.
    fn check<B: Scaled>(self, blocks: &[B], what: &str) -> Result<(), String> {
        match self.0.into_inner() {
            usize::MAX => Ok(()),
            b => Err(nonfinite_scale_error(what, b, blocks[b].nonfinite_scale().unwrap_or(f32::NAN))),
        }
    }
}

/// The eight-row layout of a matrix of plain blocks `w` with `nb` blocks a
/// row: rows 0 .. ⌊rows/8⌋·8 in groups (group g's block b at g·nb + b),
/// made on all threads; the last rows % 8 rows stay in `w`. Q8 quants are
/// stored XOR `bias`. With `Scales::Finite` every block's scales are
/// checked on the way (the tail rows' too), and the first non-finite one
/// in row-major order is the error.
pub fn repack_rows8<X: Rows8>(w: &[X::Row], nb: usize, bias: u8, scales: Scales, what: &str) -> Result<Vec<X>, String> {
    use rayon::prelude::*;
    let n = w.len().checked_div(nb).unwrap_or(0) / ROWS8 * nb;
    let mut out = Vec::new();
    out.try_reserve_exact(n)
        .map_err(|_| format!("out of memory repacking {what} ({} bytes)", n * std::mem::size_of::<X>()))?;
    ask_for_huge_pages(&out);
    let first_bad = FirstBad::new();
    (0..n)
        .into_par_iter()
        .map(|i| {
            let at = |k: usize| (i / nb * ROWS8 + k) * nb + i % nb;
            let rows = std::array::from_fn(|k| &w[at(k)]);
            if scales == Scales::Finite {
                // (the row with the lowest index: it comes first in row-major order)
                if let Some(k) = rows.iter().position(|r| r.nonfinite_scale().is_some()) {
                    first_bad.note(at(k));
                }
            }
            X::group(rows, bias)
        })
        .collect_into_vec(&mut out);
    if scales == Scales::Finite {
        // the tail rows, which the kernels read in place: a few rows more
        let tail = n * ROWS8;
        if let Some((b, _)) = nonfinite_block(&w[tail.min(w.len())..]) {
            first_bad.note(tail + b);
        }
    }
    first_bad.check(w, what)?;
    Ok(out)
}

/// Asks Linux to back `v`'s allocation (not yet written) with transparent
/// huge pages (the weights made at load: repacked groups here, converted
/// tensors in import/convert.rs): a matrix read once per token through 2 MiB pages instead of
/// 4 KiB ones streams 20-28 % faster on one core (`bench_stream_q4k`;
/// docs/PERFORMANCE.md, "Four streams against one"). Only the
/// whole 2 MiB pages inside the buffer qualify; a kernel without them, or
/// with them off, refuses or ignores the advice, which changes nothing else.
pub(crate) fn ask_for_huge_pages<T>(v: &Vec<T>) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let (start, len) = (v.as_ptr() as usize, v.capacity() * std::mem::size_of::<T>());
        let (from, to) = (start.next_multiple_of(HUGE), (start + len) / HUGE * HUGE);
        if to > from {
            // SAFETY: from..to lies inside `v`'s allocation, which this process
            // owns; MADV_HUGEPAGE only changes how its pages are backed, never
            // their contents, and an error leaves them as they were.
            let _ = unsafe { libc::madvise(from as *mut libc::c_void, to - from, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = v;
}

/// Bytes i..i + 4 of `b` as a little-endian word (the repacks move four
/// bytes at a time).
#[inline(always)]
fn word(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().expect("four bytes"))
}

/// Stores `v` little-endian at bytes i..i + 4 of `b`.
#[inline(always)]
fn put_word(b: &mut [u8], i: usize, v: u32) {
    b[i..i + 4].copy_from_slice(&v.to_le_bytes());
}

/// The eight-row layout of a Q8_0 matrix with `nb` blocks per row (whole
/// groups only; the last rows % 8 rows stay in `w`). Each quant is stored
/// as its byte XOR `bias` (0x80: w + 128 as an unsigned byte, for kernels
/// that multiply unsigned weights by signed activations).
pub fn repack_q8_x8(w: &[BlockQ8_0], nb: usize, bias: u8, what: &str) -> Result<Vec<BlockQ8_0x8>, String> {
    repack_rows8(w, nb, bias, Scales::Any, what)
}

/// Whole groups of eight Q8_0 rows (`nb` blocks each) interleaved into
/// `out` with bias 0 (the file's), on this thread (as `interleave_q4_x8`).
pub fn interleave_q8_x8(w: &[BlockQ8_0], nb: usize, out: &mut [BlockQ8_0x8]) {
    for (i, x) in out.iter_mut().enumerate().take(w.len() / (ROWS8 * nb.max(1)) * nb) {
        *x = group_q8_x8(std::array::from_fn(|k| &w[(i / nb * ROWS8 + k) * nb + i % nb]), 0);
    }
}

/// Block b of eight Q8_0 rows, interleaved, each quant XOR `bias`.
fn group_q8_x8(rows: [&BlockQ8_0; ROWS8], bias: u8) -> BlockQ8_0x8 {
    let bias4 = u32::from_ne_bytes([bias; 4]);
    let mut x = BlockQ8_0x8 { d: rows.map(|r| r.d), qs: [0; ROWS8 * QK] };
    for (k, r) in rows.iter().enumerate() {
        let qs: &[u8; QK] = bytemuck::cast_ref(&r.qs);
        for i in 0..QK / 4 {
            put_word(&mut x.qs, 32 * i + 4 * k, word(qs, 4 * i) ^ bias4);
        }
    }
    x
}

/// The eight-row layout of a Q4_0 matrix (as `repack_q8_x8`, no bias).
pub fn repack_q4_x8(w: &[BlockQ4_0], nb: usize, what: &str) -> Result<Vec<BlockQ4_0x8>, String> {
    repack_rows8(w, nb, 0, Scales::Any, what)
}

/// Whole groups of eight Q4_0 rows (`nb` blocks each) interleaved into
/// `out` on this thread, for a caller that makes the rows in pieces (the
/// GGUF import, which quantises a piece's rows straight into their groups).
pub fn interleave_q4_x8(w: &[BlockQ4_0], nb: usize, out: &mut [BlockQ4_0x8]) {
    for (i, x) in out.iter_mut().enumerate().take(w.len() / (ROWS8 * nb.max(1)) * nb) {
        *x = group_q4_x8(std::array::from_fn(|k| &w[(i / nb * ROWS8 + k) * nb + i % nb]));
    }
}

/// Block b of eight Q4_0 rows, interleaved.
fn group_q4_x8(rows: [&BlockQ4_0; ROWS8]) -> BlockQ4_0x8 {
    BlockQ4_0x8 { d: rows.map(|r| r.d), qs: interleave_nibbles(rows.map(|r| &r.qs)) }
}

/// Eight rows' 16 nibble bytes of a block, four bytes of each row in turn:
/// row k's byte 4·i + e at 32·i + 4·k + e.
fn interleave_nibbles(rows: [&[u8; QK / 2]; ROWS8]) -> [u8; ROWS8 * QK / 2] {
    let mut qs = [0; ROWS8 * QK / 2];
    for (k, r) in rows.iter().enumerate() {
        for i in 0..QK / 8 {
            put_word(&mut qs, 32 * i + 4 * k, word(&r[..], 4 * i));
        }
    }
    qs
}

/// The eight-row layout of an MXFP4 matrix (as `repack_q4_x8`).
pub fn repack_mxfp4_x8(w: &[BlockMxfp4], nb: usize, what: &str) -> Result<Vec<BlockMxfp4x8>, String> {
    repack_rows8(w, nb, 0, Scales::Any, what)
}

/// Block b of eight MXFP4 rows, interleaved as `group_q4_x8` lays out Q4_0's.
fn group_mxfp4_x8(rows: [&BlockMxfp4; ROWS8]) -> BlockMxfp4x8 {
    BlockMxfp4x8 { e: rows.map(|r| r.e), qs: interleave_nibbles(rows.map(|r| &r.qs)) }
}

/// Super-block s of eight consecutive Q4_K rows, interleaved for the
/// eight-row K-quant kernels (`Kernels::dot_q4k_r8`): `d[k]`, `dmin[k]` are
/// row k's; `scales[j][k]`, `mins[j][k]` row k's 6-bit scale and min of
/// sub-block j (`scales_mins_k4`, unpacked); `qs[256·c + 32·g + 4·k + e]`
/// is row k's nibble byte `qs[32·c + 4·g + e]`, so one 32-byte load (c, g)
/// holds, in 32-bit lane k, row k's codes 4g..4g + 4 of sub-block 2c (low
/// nibbles) and of sub-block 2c + 1 (high nibbles). 1184 bytes for 8 × 144.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4Kx8 {
    pub d: [f16; ROWS8],
    pub dmin: [f16; ROWS8],
    pub scales: [[u8; ROWS8]; 8],
    pub mins: [[u8; ROWS8]; 8],
    pub qs: [u8; ROWS8 * QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4Kx8>() == 32 + 128 + 1024);

impl BlockQ4Kx8 {
    /// Row k's 4-bit code of weight l of sub-block j, as `q4k_code` of the row's block.
    #[inline(always)]
    pub fn code(&self, k: usize, j: usize, l: usize) -> u8 {
        (self.qs[256 * (j / 2) + 32 * (l / 4) + 4 * k + l % 4] >> (4 * (j % 2))) & 15
    }
}

/// Super-block s of eight consecutive Q5_K rows, interleaved for the
/// eight-row K-quant kernels (`Kernels::dot_q5k_r8`): `d`, `dmin`,
/// `scales`, `mins` and `qs` (each code's low four bits) as in
/// `BlockQ4Kx8`; `qh[32·g + 4·k + e]` is row k's byte `qh[4·g + e]`, whose
/// bit j is the fifth bit of code 4·g + e of sub-block j, so one 32-byte
/// load g holds in lane k the fifth bits of row k's codes 4g..4g + 4 of
/// every sub-block, beside `qs`'s loads (c, g). 1440 bytes for 8 × 176.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5Kx8 {
    pub d: [f16; ROWS8],
    pub dmin: [f16; ROWS8],
    pub scales: [[u8; ROWS8]; 8],
    pub mins: [[u8; ROWS8]; 8],
    pub qs: [u8; ROWS8 * QK_K / 2],
    pub qh: [u8; ROWS8 * QK_K / 8],
}
const _: () = assert!(std::mem::size_of::<BlockQ5Kx8>() == 32 + 128 + 1024 + 256);

impl BlockQ5Kx8 {
    /// Row k's 5-bit code of weight l of sub-block j, as `q5k_code` of the row's block.
    #[inline(always)]
    pub fn code(&self, k: usize, j: usize, l: usize) -> u8 {
        let at = 32 * (l / 4) + 4 * k + l % 4;
        let low = (self.qs[256 * (j / 2) + at] >> (4 * (j % 2))) & 15;
        low | (((self.qh[at] >> j) & 1) << 4)
    }
}

/// Super-block s of eight consecutive Q6_K rows, interleaved for the
/// eight-row K-quant kernels (`Kernels::dot_q6k_r8`) at the file's density
/// (210 bytes a row): `d[k]` is row k's, `scales[i][k]` row k's scale of
/// group i (16 weights); `qs` holds four 384-byte parts, part c the codes of
/// sub-blocks 2c and 2c + 1, read in order. Row k's 6-bit code
/// (`q6k_code`) of weight e = 32·j + 4·g + l (sub-block j = 2c + p) is split
/// as in `BlockQ4Kx8`: its low four bits are nibble p of `qs[384·c + 32·g +
/// 4·k + l]`, so one 32-byte load (c, g) holds row k's low bits of
/// sub-blocks 2c and 2c + 1 in lane k; its high two bits are field g % 4
/// (bits 2·(g % 4)..) of `qs[384·c + 256 + 32·(2p + g / 4) + 4·k + l]`, so
/// one 32-byte load holds the high bits of four such loads. `code` reads
/// one back. 1680 bytes for 8 × 210.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ6Kx8 {
    pub d: [f16; ROWS8],
    pub scales: [[i8; ROWS8]; 16],
    pub qs: [u8; ROWS8 * QK_K * 3 / 4],
}
const _: () = assert!(std::mem::size_of::<BlockQ6Kx8>() == 16 + 128 + 1536);
const _: () = assert!(std::mem::size_of::<BlockQ6Kx8>() == 8 * std::mem::size_of::<BlockQ6K>());
// SAFETY: `#[repr(C)]` of f16, i8 and u8 arrays (every bit pattern a
// valid value) with no padding (the size asserts above: 16 + 128 + 1536);
// bytemuck's derive does not reach a [u8; 1536] field.
unsafe impl Zeroable for BlockQ6Kx8 {}
// SAFETY: as for `Zeroable` above; the type is `Copy` and `'static`.
unsafe impl Pod for BlockQ6Kx8 {}

impl BlockQ6Kx8 {
    /// Where row k's weight e lives in `qs` (the layout above): the byte
    /// and shift of its low four bits, the byte and shift of its high two.
    #[inline(always)]
    fn code_at(k: usize, e: usize) -> ((usize, u32), (usize, u32)) {
        let (j, g, l) = (e / 32, (e % 32) / 4, e % 4);
        let (c, p) = (j / 2, j % 2);
        let lo = (384 * c + 32 * g + 4 * k + l, 4 * p as u32);
        let hi = (384 * c + 256 + 32 * (2 * p + g / 4) + 4 * k + l, 2 * (g % 4) as u32);
        (lo, hi)
    }

    /// Row k's 6-bit code of weight e (0..64), as `q6k_code` of the row's block.
    #[inline(always)]
    pub fn code(&self, k: usize, e: usize) -> u8 {
        let ((lo, lo_shift), (hi, hi_shift)) = Self::code_at(k, e);
        ((self.qs[lo] >> lo_shift) & 15) | (((self.qs[hi] >> hi_shift) & 3) << 4)
    }
}

/// The eight-row layout of a Q4_K matrix with `nb` super-blocks per row
/// (whole groups only; the last rows % 8 rows stay in `w`).
pub fn repack_q4k_x8(w: &[BlockQ4K], nb: usize, what: &str) -> Result<Vec<BlockQ4Kx8>, String> {
    repack_rows8(w, nb, 0, Scales::Any, what)
}

/// Super-block s of eight Q4_K rows, interleaved.
fn group_q4k_x8(rows: [&BlockQ4K; ROWS8]) -> BlockQ4Kx8 {
    let mut x = BlockQ4Kx8 {
        d: rows.map(|r| r.d),
        dmin: rows.map(|r| r.dmin),
        scales: [[0; ROWS8]; 8],
        mins: [[0; ROWS8]; 8],
        qs: [0; ROWS8 * QK_K / 2],
    };
    for (k, r) in rows.iter().enumerate() {
        let (sc, mn) = scales_mins_k4(&r.scales);
        for j in 0..8 {
            x.scales[j][k] = sc[j];
            x.mins[j][k] = mn[j];
        }
        // byte 32·c + 4·g + e of the row to 256·c + 32·g + 4·k + e
        for i in 0..QK_K / 8 {
            put_word(&mut x.qs, 256 * (i / 8) + 32 * (i % 8) + 4 * k, word(&r.qs, 4 * i));
        }
    }
    x
}

/// The eight-row layout of a Q5_K matrix (as `repack_q4k_x8`).
pub fn repack_q5k_x8(w: &[BlockQ5K], nb: usize, what: &str) -> Result<Vec<BlockQ5Kx8>, String> {
    repack_rows8(w, nb, 0, Scales::Any, what)
}

/// Super-block s of eight Q5_K rows, interleaved: the low four bits as
/// `group_q4k_x8` lays out Q4_K's, the fifth bits beside them.
fn group_q5k_x8(rows: [&BlockQ5K; ROWS8]) -> BlockQ5Kx8 {
    let q4k = rows.map(|r| BlockQ4K { d: r.d, dmin: r.dmin, scales: r.scales, qs: r.qs });
    let low = group_q4k_x8(std::array::from_fn(|k| &q4k[k]));
    let mut x = BlockQ5Kx8 {
        d: low.d,
        dmin: low.dmin,
        scales: low.scales,
        mins: low.mins,
        qs: low.qs,
        qh: [0; ROWS8 * QK_K / 8],
    };
    for (k, r) in rows.iter().enumerate() {
        // byte 4·g + e of the row to 32·g + 4·k + e
        for g in 0..QK_K / 32 {
            put_word(&mut x.qh, 32 * g + 4 * k, word(&r.qh, 4 * g));
        }
    }
    x
}

/// The eight-row layout of a Q6_K matrix (as `repack_q4k_x8`).
pub fn repack_q6k_x8(w: &[BlockQ6K], nb: usize, what: &str) -> Result<Vec<BlockQ6Kx8>, String> {
    repack_rows8(w, nb, 0, Scales::Any, what)
}

/// Super-block s of eight Q6_K rows, interleaved.
fn group_q6k_x8(rows: [&BlockQ6K; ROWS8]) -> BlockQ6Kx8 {
    let mut x = BlockQ6Kx8 { d: rows.map(|r| r.d), scales: [[0; ROWS8]; 16], qs: [0; ROWS8 * QK_K * 3 / 4] };
    for (k, r) in rows.iter().enumerate() {
        for i in 0..16 {
            x.scales[i][k] = r.scales[i];
        }
        // `code_at` and `q6k_code` for the four weights e = 32·j + 4·g + 0..4
        // at once: sub-block j's low bits from the row's ql, its high bits
        // from qh, four bytes a word
        for j in 0..8 {
            let (c, p, h, r4) = (j / 2, j % 2, j / 4, j % 4);
            for g in 0..8 {
                let lo = (word(&r.ql, 64 * h + 32 * (r4 % 2) + 4 * g) >> (4 * (r4 / 2))) & 0x0f0f_0f0f;
                let hi = (word(&r.qh, 32 * h + 4 * g) >> (2 * r4)) & 0x0303_0303;
                let (at_lo, at_hi) = (384 * c + 32 * g + 4 * k, 384 * c + 256 + 32 * (2 * p + g / 4) + 4 * k);
                let (was_lo, was_hi) = (word(&x.qs, at_lo), word(&x.qs, at_hi));
                put_word(&mut x.qs, at_lo, was_lo | lo << (4 * p));
                put_word(&mut x.qs, at_hi, was_hi | hi << (2 * (g % 4)));
            }
        }
    }
    x
}

/// The 12 packed bytes of eight 6-bit scales and mins: the inverse of
/// `scales_mins_k4` (each value < 64; every 12 bytes are reached).
pub fn pack_scales_mins_k4(sc: &[u8; 8], mn: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for i in 0..4 {
        s[i] = (sc[i] & 63) | ((sc[4 + i] >> 4) << 6);
        s[4 + i] = (mn[i] & 63) | ((mn[4 + i] >> 4) << 6);
        s[8 + i] = (sc[4 + i] & 15) | ((mn[4 + i] & 15) << 4);
    }
    s
}

/// An eight-row interleaved block and the plain block of each of its rows
/// (`group` makes one; `row` takes it apart again).
pub trait Rows8: Pod + Send + Sync {
    /// The block of one row.
    type Row: Pod + Send + Sync + Scaled;
    /// Block b of eight rows, interleaved (Q8: each quant XOR `bias`).
    fn group(rows: [&Self::Row; ROWS8], bias: u8) -> Self;
    /// Row k's block (0 ≤ k < 8). Q8: the quants as stored XOR `bias`.
    fn row(&self, k: usize, bias: u8) -> Self::Row;
    /// The first row whose scale (d, or dmin) is NaN or infinite, and that scale.
    fn nonfinite_row(&self) -> Option<(usize, f32)>;
}

/// The first of eight rows' f16 scales (in each of `scales`, row by row)
/// that is not finite: its row and value.
fn nonfinite_of_rows(scales: &[&[f16; ROWS8]]) -> Option<(usize, f32)> {
    // on the bits, four f16s a word first (this runs on every group of a
    // repack): an exponent field is all ones when adding one to it carries
    // into the f16's top bit
    let carry = |w: u64| ((w & 0x7c00_7c00_7c00_7c00) + 0x0400_0400_0400_0400) & 0x8000_8000_8000_8000;
    if scales.iter().all(|d| bytemuck::cast::<[f16; ROWS8], [u64; 2]>(**d).iter().all(|&w| carry(w) == 0)) {
        return None;
    }
    (0..ROWS8).find_map(|k| scales.iter().find_map(|d| Some((k, nonfinite_f16(d[k])?))))
}

impl Rows8 for BlockQ8_0x8 {
    type Row = BlockQ8_0;
    fn nonfinite_row(&self) -> Option<(usize, f32)> {
        nonfinite_of_rows(&[&self.d])
    }
    fn group(rows: [&BlockQ8_0; ROWS8], bias: u8) -> Self {
        group_q8_x8(rows, bias)
    }
    fn row(&self, k: usize, bias: u8) -> BlockQ8_0 {
        BlockQ8_0 { d: self.d[k], qs: std::array::from_fn(|j| (self.qs[32 * (j / 4) + 4 * k + j % 4] ^ bias) as i8) }
    }
}

impl Rows8 for BlockQ4_0x8 {
    type Row = BlockQ4_0;
    fn nonfinite_row(&self) -> Option<(usize, f32)> {
        nonfinite_of_rows(&[&self.d])
    }
    fn group(rows: [&BlockQ4_0; ROWS8], _bias: u8) -> Self {
        group_q4_x8(rows)
    }
    fn row(&self, k: usize, _bias: u8) -> BlockQ4_0 {
        BlockQ4_0 { d: self.d[k], qs: std::array::from_fn(|j| self.qs[32 * (j / 4) + 4 * k + j % 4]) }
    }
}

impl Rows8 for BlockMxfp4x8 {
    type Row = BlockMxfp4;
    fn nonfinite_row(&self) -> Option<(usize, f32)> {
        None
    }
    fn group(rows: [&BlockMxfp4; ROWS8], _bias: u8) -> Self {
        group_mxfp4_x8(rows)
    }
    fn row(&self, k: usize, _bias: u8) -> BlockMxfp4 {
        BlockMxfp4 { e: self.e[k], qs: std::array::from_fn(|j| self.qs[32 * (j / 4) + 4 * k + j % 4]) }
    }
}

impl Rows8 for BlockQ4Kx8 {
    type Row = BlockQ4K;
    fn nonfinite_row(&self) -> Option<(usize, f32)> {
        nonfinite_of_rows(&[&self.d, &self.dmin])
    }
    fn group(rows: [&BlockQ4K; ROWS8], _bias: u8) -> Self {
        group_q4k_x8(rows)
    }
    fn row(&self, k: usize, _bias: u8) -> BlockQ4K {
        let sc = std::array::from_fn(|j| self.scales[j][k]);
        let mn = std::array::from_fn(|j| self.mins[j][k]);
        BlockQ4K {
            d: self.d[k],
            dmin: self.dmin[k],
            scales: pack_scales_mins_k4(&sc, &mn),
            qs: std::array::from_fn(|i| self.qs[256 * (i / 32) + 32 * ((i % 32) / 4) + 4 * k + i % 4]),
        }
    }
}

impl Rows8 for BlockQ5Kx8 {
    type Row = BlockQ5K;
    fn nonfinite_row(&self) -> Option<(usize, f32)> {
        nonfinite_of_rows(&[&self.d, &self.dmin])
    }
    fn group(rows: [&BlockQ5K; ROWS8], _bias: u8) -> Self {
        group_q5k_x8(rows)
    }
    fn row(&self, k: usize, _bias: u8) -> BlockQ5K {
        let sc = std::array::from_fn(|j| self.scales[j][k]);
        let mn = std::array::from_fn(|j| self.mins[j][k]);
        BlockQ5K {
            d: self.d[k],
            dmin: self.dmin[k],
            scales: pack_scales_mins_k4(&sc, &mn),
            qh: std::array::from_fn(|l| self.qh[32 * (l / 4) + 4 * k + l % 4]),
            qs: std::array::from_fn(|i| self.qs[256 * (i / 32) + 32 * ((i % 32) / 4) + 4 * k + i % 4]),
        }
    }
}

impl Rows8 for BlockQ6Kx8 {
    type Row = BlockQ6K;
    fn nonfinite_row(&self) -> Option<(usize, f32)> {
        nonfinite_of_rows(&[&self.d])
    }
    fn group(rows: [&BlockQ6K; ROWS8], _bias: u8) -> Self {
        group_q6k_x8(rows)
    }
    fn row(&self, k: usize, _bias: u8) -> BlockQ6K {
        let mut b =
            BlockQ6K { ql: [0; 128], qh: [0; 64], scales: std::array::from_fn(|i| self.scales[i][k]), d: self.d[k] };
        for e in 0..QK_K {
            // where q6k_code reads code e
            let (h, r, l) = (e / 128, (e % 128) / 32, e % 32);
            let q = self.code(k, e);
            b.ql[64 * h + 32 * (r % 2) + l] |= (q & 15) << (4 * (r / 2));
            b.qh[32 * h + l] |= (q >> 4) << (2 * r);
        }
        b
    }
}

/// Rows 0 .. 8·⌊rows/8⌋ of a matrix with `nb` blocks a row, back in the
/// plain row layout from their eight-row groups (`packed`: group g's block
/// b at g·nb + b); the Q8 quants XOR `bias`. Groups are taken apart on all
/// threads of the current pool; with `Scales::Finite`, the first block
/// (row-major) whose scale is not finite is the error.
pub fn deinterleave_x8<X: Rows8>(
    packed: &[X],
    nb: usize,
    bias: u8,
    scales: Scales,
    what: &str,
) -> Result<Vec<X::Row>, String> {
    use rayon::prelude::*;
    let nb = nb.max(1);
    let n = packed.len() / nb * nb * ROWS8;
    let mut out = Vec::new();
    out.try_reserve_exact(n)
        .map_err(|_| format!("out of memory de-interleaving {what} ({} bytes)", n * std::mem::size_of::<X::Row>()))?;
    out.resize(n, X::Row::zeroed());
    let first_bad = FirstBad::new();
    out.par_chunks_mut(ROWS8 * nb).zip(packed.par_chunks(nb)).enumerate().for_each(|(g, (rows, group))| {
        for (k, row) in rows.chunks_exact_mut(nb).enumerate() {
            for (b, (r, x)) in row.iter_mut().zip(group).enumerate() {
                *r = x.row(k, bias);
                if scales == Scales::Finite && r.nonfinite_scale().is_some() {
                    first_bad.note((g * ROWS8 + k) * nb + b);
                }
            }
        }
    });
    first_bad.check(&out, what)?;
    Ok(out)
}

/// Eight-row Q8_0 groups (`nb` blocks a row) with every quant XOR `bias`
/// (a build whose kernels read another bias than the file's 0:
/// `Kernels::Q8_X8_BIAS`); with `Scales::Finite`, the first block
/// (row-major) whose scale is not finite is the error.
pub fn rebias_q8_x8(
    packed: &[BlockQ8_0x8],
    nb: usize,
    bias: u8,
    scales: Scales,
    what: &str,
) -> Result<Vec<BlockQ8_0x8>, String> {
    let mut out = Vec::new();
    out.try_reserve_exact(packed.len())
        .map_err(|_| format!("out of memory repacking {what} ({} bytes)", std::mem::size_of_val(packed)))?;
    let nb = nb.max(1);
    let mut first_bad: Option<(usize, f32)> = None;
    out.extend(packed.iter().enumerate().map(|(i, x)| {
        if let Some((k, d)) = x.nonfinite_row().filter(|_| scales == Scales::Finite) {
            // block b of row 8g + k, row-major
            let at = (i / nb * ROWS8 + k) * nb + i % nb;
            if first_bad.is_none_or(|(b, _)| at < b) {
                first_bad = Some((at, d));
            }
        }
        BlockQ8_0x8 { d: x.d, qs: x.qs.map(|q| q ^ bias) }
    }));
    match first_bad {
        Some((b, d)) => Err(nonfinite_scale_error(what, b, d)),
        None => Ok(out),
    }
}

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

/// The quants of an all-zero Q8 block, and the nibbles of an all-zero Q4
/// block: what a vector kernel's last, partial step of eight blocks reads in
/// place of the blocks past the end (their products are 0).
pub static ZERO_Q8: [i8; QK] = [0; QK];
pub static ZERO_Q4: [u8; QK / 2] = [0; QK / 2];

/// A Q8 weight block, whatever its scale type.
pub trait Q8Block: Copy + Send + Sync + 'static {
    /// The scale is an f16 (else an f32): tells vector kernels how to read `scale_bits`.
    const F16_SCALE: bool;
    fn scale(&self) -> f32;
    /// The scale's raw bits: the f16's zero-extended, or the f32's.
    fn scale_bits(&self) -> u32;
    fn quants(&self) -> &[i8; QK];
}
/// A Q4 weight block, whatever its scale type.
pub trait Q4Block: Copy + Send + Sync + 'static {
    /// As `Q8Block::F16_SCALE`.
    const F16_SCALE: bool;
    fn scale(&self) -> f32;
    /// As `Q8Block::scale_bits`.
    fn scale_bits(&self) -> u32;
    fn nibbles(&self) -> &[u8; QK / 2];
}

macro_rules! block_impl {
    ($trait:ident, $ty:ty, $f16:literal, $data:ident, $arr:ty) => {
        impl $trait for $ty {
            const F16_SCALE: bool = $f16;
            #[inline(always)]
            fn scale(&self) -> f32 {
                self.d.widened()
            }
            #[inline(always)]
            fn scale_bits(&self) -> u32 {
                self.d.to_bits() as u32
            }
            #[inline(always)]
            fn $data(&self) -> &$arr {
                &self.qs
            }
        }
    };
}
/// A block scale (f16 or f32) as f32, so `block_impl!` reads the same for
/// each; f16 through `f16_to_f32` (not `half`'s inherent `to_f32`).
trait Widened {
    fn widened(self) -> f32;
}
impl Widened for f32 {
    #[inline(always)]
    fn widened(self) -> f32 {
        self
    }
}
impl Widened for f16 {
    #[inline(always)]
    fn widened(self) -> f32 {
        f16_to_f32(self)
    }
}
block_impl!(Q8Block, BlockQ8_0, true, quants, [i8; QK]);
block_impl!(Q8Block, BlockQ8_0F32, false, quants, [i8; QK]);
block_impl!(Q4Block, BlockQ4_0, true, nibbles, [u8; QK / 2]);
block_impl!(Q4Block, BlockQ4_0F32, false, nibbles, [u8; QK / 2]);

/// Quantised activation rows: the blocks, and again each block's scale and
/// sum in contiguous arrays (vector kernels load eight of them at once).
#[derive(Clone, Debug, Default)]
pub struct ActQ8 {
    blocks: Vec<BlockQ8Act>,
    d: Vec<f32>,
    sum: Vec<i32>,
}

impl ActQ8 {
    /// `quantize_act` of `x` (length a multiple of 32).
    pub fn quantize(x: &[f32]) -> Self {
        let mut blocks = vec![BlockQ8Act::default(); x.len() / QK];
        // blocks are independent: a prompt batch is split across threads
        const PER_TASK: usize = 1024;
        crate::pool::chunks_mut(&mut blocks, PER_TASK, 1, |i, b| {
            quantize_act(&x[i * PER_TASK * QK..(i * PER_TASK + b.len()) * QK], b)
        });
        Self::from_blocks(blocks)
    }
    pub fn from_blocks(blocks: Vec<BlockQ8Act>) -> Self {
        let d = blocks.iter().map(|b| b.d).collect();
        let sum = blocks.iter().map(|b| b.sum).collect();
        ActQ8 { blocks, d, sum }
    }
    pub fn as_ref(&self) -> ActRef<'_> {
        ActRef { blocks: &self.blocks, d: &self.d, sum: &self.sum }
    }
}

/// A borrowed run of activation blocks: from an `ActQ8` (with the
/// contiguous scales and sums), or from plain blocks (`d` and `sum` empty;
/// the kernels then read them from the blocks, a little slower).
#[derive(Clone, Copy, Debug)]
pub struct ActRef<'a> {
    pub(crate) blocks: &'a [BlockQ8Act],
    /// Empty, or one per block.
    pub(crate) d: &'a [f32],
    /// Empty, or one per block.
    pub(crate) sum: &'a [i32],
}

impl<'a> ActRef<'a> {
    pub fn len(&self) -> usize {
        self.blocks.len()
    }
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }
    pub fn blocks(&self) -> &'a [BlockQ8Act] {
        self.blocks
    }
    /// Whether the contiguous scales and sums are present.
    pub(crate) fn has_side(&self) -> bool {
        self.d.len() == self.blocks.len() && self.sum.len() == self.blocks.len()
    }
    /// Blocks `start..end`.
    pub fn range(self, start: usize, end: usize) -> Self {
        let side = |v: &'a [f32]| if v.is_empty() { v } else { &v[start..end] };
        ActRef {
            blocks: &self.blocks[start..end],
            d: side(self.d),
            sum: if self.sum.is_empty() { self.sum } else { &self.sum[start..end] },
        }
    }
}

impl<'a> From<&'a [BlockQ8Act]> for ActRef<'a> {
    fn from(blocks: &'a [BlockQ8Act]) -> Self {
        ActRef { blocks, d: &[], sum: &[] }
    }
}
impl<'a> From<&'a Vec<BlockQ8Act>> for ActRef<'a> {
    fn from(blocks: &'a Vec<BlockQ8Act>) -> Self {
        ActRef { blocks, d: &[], sum: &[] }
    }
}
impl<'a> From<&'a ActQ8> for ActRef<'a> {
    fn from(a: &'a ActQ8) -> Self {
        a.as_ref()
    }
}

/// Quantises `x` (length a multiple of 32) into activation blocks with the
/// symmetric rule d = max|x| / 127, q = round(x / d).
pub fn quantize_act(x: &[f32], out: &mut [BlockQ8Act]) {
    debug_assert_eq!(x.len(), out.len() * QK);
    for (chunk, block) in x.chunks_exact(QK).zip(out.iter_mut()) {
        // max|x| in eight lanes (the compiler vectorises this; max does not
        // depend on the order, NaNs are skipped either way)
        let mut lanes = [0.0f32; 8];
        for part in chunk.chunks_exact(8) {
            for (m, v) in lanes.iter_mut().zip(part) {
                *m = m.max(v.abs());
            }
        }
        let amax = lanes.iter().fold(0.0f32, |m, &v| m.max(v));
        let d = amax / 127.0;
        let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in block.qs.iter_mut().zip(chunk) {
            *q = round_to_i8(v * inv);
            sum += *q as i32;
        }
        block.d = d;
        block.sum = sum;
    }
}

/// `x.round() as i8` (half away from zero, saturating, NaN to 0) in a form
/// every build vectorises: `round` has no instruction below SSE4.1 (sse2
/// called `roundf` per value) and the saturating `as` converts one value at
/// a time. Clamped to i8's range first, x + (0.5 − 2⁻²⁵)·sign(x) truncates
/// to round(x): 0.5 − 2⁻²⁵ is the largest float below one half, so that
/// 0.49999997 does not round up to 1 (with 0.5 it would); the truncation
/// is one `cvttps2dq` per vector.
#[inline(always)]
pub(crate) fn round_to_i8(x: f32) -> i8 {
    const BELOW_HALF: f32 = 0.49999997; // 0.5 − 2⁻²⁵
    if x.is_nan() {
        return 0;
    }
    let c = x.clamp(-128.0, 127.0);
    // SAFETY: c is finite and within [-128, 127], so the sum is within
    // (-128.5, 127.5), whose truncation fits i32 (and i8).
    unsafe { (c + BELOW_HALF.copysign(c)).to_int_unchecked::<i32>() as i8 }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks of arbitrary bytes (every bit pattern is a block: `Pod`).
    fn blocks<B: Pod>(n: usize, seed: u64) -> Vec<B> {
        let mut state = seed;
        let mut bytes = vec![0u8; n * std::mem::size_of::<B>()];
        for b in &mut bytes {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            *b = (state >> 33) as u8;
        }
        bytes.chunks_exact(std::mem::size_of::<B>()).map(bytemuck::pod_read_unaligned).collect()
    }

    fn round_trip<X: Rows8>(w: &[X::Row], nb: usize, bias: u8, packed: &[X]) {
        let back = deinterleave_x8(packed, nb, bias, Scales::Any, "test").unwrap();
        let whole = packed.len() * ROWS8;
        assert_eq!(back.len(), whole);
        assert_eq!(bytemuck::cast_slice::<_, u8>(&back), bytemuck::cast_slice::<_, u8>(&w[..whole]));
    }

    #[test]
    fn round_to_i8_is_round_as_i8() {
        let special = [0.5f32, 1.5, 2.5, -0.5, -2.5, 126.5, 127.49, 127.5, 128.0, -128.5, -129.0, 0.49999997, -0.0];
        let edges =
            [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN, f32::MIN_POSITIVE, 1e-45];
        let mut state = 7u64;
        let random = (0..100_000).map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            f32::from_bits((state >> 32) as u32) // every bit pattern: NaNs, infinities, subnormals
        });
        // the 64 floats either side of every half and whole number to ±260
        let near = (-520..=520).flat_map(|h| {
            let bits = (h as f32 / 2.0).to_bits() as i64;
            (-64..=64).map(move |k| f32::from_bits((bits + k).max(0) as u32))
        });
        let stride = (0..=u32::MAX).step_by(1021).map(f32::from_bits);
        for x in special.into_iter().chain(edges).chain(random).chain(near).chain(stride) {
            assert_eq!(round_to_i8(x), x.round() as i8, "{x:e} ({:#x})", x.to_bits());
        }
    }

    #[test]
    fn interleaving_round_trips_every_bit() {
        // 19 rows: two whole groups and a tail of three rows that stay plain
        let (rows, nb) = (19, 3);
        for bias in [0, 0x80] {
            let w: Vec<BlockQ8_0> = blocks(rows * nb, 1);
            let packed = repack_q8_x8(&w, nb, bias, "test").unwrap();
            assert_eq!(packed.len(), 2 * nb);
            round_trip(&w, nb, bias, &packed);
            round_trip(&w, nb, bias ^ 0x80, &rebias_q8_x8(&packed, nb, 0x80, Scales::Any, "test").unwrap());
        }
        let w: Vec<BlockQ4_0> = blocks(rows * nb, 2);
        let packed = repack_q4_x8(&w, nb, "test").unwrap();
        round_trip(&w, nb, 0, &packed);
        let mut by_piece = vec![BlockQ4_0x8::zeroed(); packed.len()];
        interleave_q4_x8(&w[..8 * nb], nb, &mut by_piece[..nb]);
        interleave_q4_x8(&w[8 * nb..], nb, &mut by_piece[nb..]);
        assert_eq!(bytemuck::cast_slice::<_, u8>(&by_piece), bytemuck::cast_slice::<_, u8>(&packed));
        let w: Vec<BlockQ8_0> = blocks(rows * nb, 6);
        let packed = repack_q8_x8(&w, nb, 0, "test").unwrap();
        let mut by_piece = vec![BlockQ8_0x8::zeroed(); packed.len()];
        interleave_q8_x8(&w[..8 * nb], nb, &mut by_piece[..nb]);
        interleave_q8_x8(&w[8 * nb..], nb, &mut by_piece[nb..]);
        assert_eq!(bytemuck::cast_slice::<_, u8>(&by_piece), bytemuck::cast_slice::<_, u8>(&packed));
        let w: Vec<BlockQ4K> = blocks(rows * nb, 3);
        round_trip(&w, nb, 0, &repack_q4k_x8(&w, nb, "test").unwrap());
        let w: Vec<BlockQ5K> = blocks(rows * nb, 11);
        let packed = repack_q5k_x8(&w, nb, "test").unwrap();
        round_trip(&w, nb, 0, &packed);
        for (i, x) in packed.iter().enumerate() {
            for (k, j, l) in (0..ROWS8).flat_map(|k| (0..8).flat_map(move |j| (0..QK).map(move |l| (k, j, l)))) {
                let row = &w[(i / nb * ROWS8 + k) * nb + i % nb];
                assert_eq!(x.code(k, j, l), q5k_code(row, j, l), "group block {i}, row {k}, sub-block {j}, weight {l}");
            }
        }
        let w: Vec<BlockQ6K> = blocks(rows * nb, 4);
        round_trip(&w, nb, 0, &repack_q6k_x8(&w, nb, "test").unwrap());
    }

    /// The loader's copies (`Scales::Finite`) name the first block, in
    /// row-major order, whose scale is NaN or infinite, whichever order the
    /// groups are made in; `Scales::Any` copies every bit as it is.
    #[test]
    fn checked_copies_name_the_first_non_finite_scale() {
        // 19 rows of 3 blocks: two groups, then three tail rows
        let (rows, nb) = (19, 3);
        let finite = |seed| {
            let mut w: Vec<BlockQ8_0> = blocks(rows * nb, seed);
            w.iter_mut().for_each(|b| b.d = f16::from_f32(0.5));
            w
        };
        let mut w = finite(7);
        // row 7's block 0 is in the group block made first; row 0's block 2 comes first row-major
        w[7 * nb].d = f16::NAN;
        w[2].d = f16::INFINITY;
        w[12 * nb + 1].d = f16::NEG_INFINITY;
        let err = repack_rows8::<BlockQ8_0x8>(&w, nb, 0x80, Scales::Finite, "m").unwrap_err();
        assert_eq!(err, "m has a non-finite scale (inf) in block 2");
        let packed = repack_rows8::<BlockQ8_0x8>(&w, nb, 0, Scales::Any, "m").unwrap();
        round_trip(&w, nb, 0, &packed);
        let err = deinterleave_x8(&packed, nb, 0, Scales::Finite, "m").unwrap_err();
        assert_eq!(err, "m has a non-finite scale (inf) in block 2");
        let err = rebias_q8_x8(&packed, nb, 0x80, Scales::Finite, "m").unwrap_err();
        assert_eq!(err, "m has a non-finite scale (inf) in block 2");
        // a tail row's, which only the repack sees (the loader checks the tail it copies)
        let mut w = finite(8);
        w[18 * nb + 1].d = f16::NAN;
        let err = repack_rows8::<BlockQ8_0x8>(&w, nb, 0, Scales::Finite, "m").unwrap_err();
        assert_eq!(err, format!("m has a non-finite scale (NaN) in block {}", 18 * nb + 1));
        let packed = repack_rows8::<BlockQ8_0x8>(&w, nb, 0, Scales::Any, "m").unwrap();
        assert!(deinterleave_x8(&packed, nb, 0, Scales::Finite, "m").is_ok());
        assert!(rebias_q8_x8(&packed, nb, 0x80, Scales::Finite, "m").is_ok());
        // Q4_K's dmin, Q6_K's d
        let mut w: Vec<BlockQ4K> = blocks(rows * nb, 9);
        w.iter_mut().for_each(|b| (b.d, b.dmin) = (f16::ONE, f16::ONE));
        w[9 * nb + 2].dmin = f16::NEG_INFINITY;
        let err = repack_rows8::<BlockQ4Kx8>(&w, nb, 0, Scales::Finite, "k").unwrap_err();
        assert_eq!(err, format!("k has a non-finite scale (-inf) in block {}", 9 * nb + 2));
        let packed = repack_rows8::<BlockQ4Kx8>(&w, nb, 0, Scales::Any, "k").unwrap();
        assert_eq!(deinterleave_x8(&packed, nb, 0, Scales::Finite, "k").unwrap_err(), err);
        let mut w: Vec<BlockQ6K> = blocks(rows * nb, 10);
        w.iter_mut().for_each(|b| b.d = f16::ONE);
        w[nb].d = f16::NAN;
        let err = repack_rows8::<BlockQ6Kx8>(&w, nb, 0, Scales::Finite, "6").unwrap_err();
        assert_eq!(err, format!("6 has a non-finite scale (NaN) in block {nb}"));
    }

    #[test]
    fn all_finite_is_every_is_finite() {
        let specials = [0.0, -0.0, 1.0, f32::MAX, f32::MIN, f32::MIN_POSITIVE, 1e-45, f32::INFINITY, f32::NAN];
        for (i, &v) in specials.iter().chain(&[f32::NEG_INFINITY, -f32::NAN]).enumerate() {
            let x: Vec<f32> = (0..37).map(|j| if j == i * 3 { v } else { j as f32 }).collect();
            assert_eq!(all_finite(&x), v.is_finite(), "{v}");
        }
        // every exponent and sign, and a spread of mantissas
        for bits in (0..=u32::MAX).step_by(65537) {
            let v = f32::from_bits(bits);
            assert_eq!(all_finite(&[1.0, v, 2.0]), v.is_finite(), "{bits:#x}");
        }
        assert!(all_finite(&[]));
    }

    #[test]
    fn k4_scales_pack_and_unpack_inversely() {
        for s in blocks::<[u8; 12]>(64, 5) {
            let (sc, mn) = scales_mins_k4(&s);
            assert_eq!(pack_scales_mins_k4(&sc, &mn), s);
        }
    }
}
