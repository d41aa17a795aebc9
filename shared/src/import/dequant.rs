//! GGUF tensor data to f32, for the types Krafla converts at load: each
//! value computed with the operations of the `gguf` package's numpy
//! dequantisers (gguf-py `quants.py`, itself llama.cpp's
//! `dequantize_row_*`), one f32 rounding each, so that the requantised
//! blocks match `tools/convert.py`'s bit for bit.
//!
//! Layouts (llama.cpp's `ggml-common.h`): 32-weight blocks Q4_0 {d; qs[16]},
//! Q4_1 {d, m; qs[16]}, Q5_0 {d; qh[4]; qs[16]}, Q5_1 {d, m; qh[4]; qs[16]},
//! Q8_0 {d; qs[32]}; 256-weight super-blocks Q2_K {scales[16]; qs[64]; d,
//! dmin}, Q3_K {hmask[32]; qs[64]; scales[12]; d}, Q4_K {d, dmin;
//! scales[12]; qs[128]}, Q5_K {d, dmin; scales[12]; qh[32]; qs[128]},
//! Q6_K {ql[128]; qh[64]; scales[16]; d}, Q8_K {d (f32); qs[256]; bsums[16]};
//! d, m, dmin are f16 but Q8_K's.

use half::f16;

use crate::format::gguf::GgmlType;
use crate::quant::{dequant_mxfp4, dequant_q4k, dequant_q5k, dequant_q6k, f16_to_f32};

fn h(b: &[u8], at: usize) -> f32 {
    f16_to_f32(f16::from_le_bytes([b[at], b[at + 1]]))
}

/// The first block of quantised `data` whose scale is NaN or infinite
/// (its values would be), with that scale: one look per block, where the
/// values are 32 or 256 (a block's values are finite exactly when its
/// scales are: the codes and sub-block scales are small integers). None
/// for the element types (F32, F16, BF16), whose values are to be looked at
/// themselves.
pub fn nonfinite_scale(ty: GgmlType, data: &[u8]) -> Option<(usize, f32)> {
    // each block's f16 scales at bytes A and C (d, and the min or dmin where it has one)
    match ty {
        GgmlType::Q4_0 => first_nonfinite_f16::<18, 0, 0>(data),
        GgmlType::Q4_1 => first_nonfinite_f16::<20, 0, 2>(data),
        GgmlType::Q5_0 => first_nonfinite_f16::<22, 0, 0>(data),
        GgmlType::Q5_1 => first_nonfinite_f16::<24, 0, 2>(data),
        GgmlType::Q8_0 => first_nonfinite_f16::<34, 0, 0>(data),
        GgmlType::Q2K => first_nonfinite_f16::<84, 80, 82>(data),
        GgmlType::Q3K => first_nonfinite_f16::<110, 108, 108>(data),
        GgmlType::Q4K => first_nonfinite_f16::<144, 0, 2>(data),
        GgmlType::Q5K => first_nonfinite_f16::<176, 0, 2>(data),
        GgmlType::Q6K => first_nonfinite_f16::<210, 208, 208>(data),
        // Q8_K's d is an f32
        GgmlType::Q8K => data
            .chunks_exact(292)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .enumerate()
            .find(|(_, d)| !d.is_finite()),
        // E8M0 scales are powers of two, all finite
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Mxfp4 => None,
    }
}

/// The first of the N-byte blocks of `data` whose f16 at byte A or C (C = A
/// or A + 2) is NaN or infinite, and that value. (On the bits, the two
/// f16s as one word: this runs once a block over every converted tensor.)
fn first_nonfinite_f16<const N: usize, const A: usize, const C: usize>(data: &[u8]) -> Option<(usize, f32)> {
    const { assert!(C == A || C == A + 2) };
    let scales = |b: &[u8; N]| -> u32 {
        let high = if C == A { 0 } else { u16::from_le_bytes([b[C], b[C + 1]]) };
        u32::from(u16::from_le_bytes([b[A], b[A + 1]])) | u32::from(high) << 16
    };
    let (blocks, _) = data.as_chunks::<N>();
    // an f16's exponent field is all ones when adding one to it carries into its bit 15
    let i = blocks.iter().position(|b| ((scales(b) & 0x7c00_7c00) + 0x0400_0400) & 0x8000_8000 != 0)?;
    let (a, c) = (h(&blocks[i], A), h(&blocks[i], C));
    Some((i, if a.is_finite() { c } else { a }))
}

/// `out` (the tensor's element count) from the tensor's bytes `data`.
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) {
    let (block, bytes) = ty.block();
    debug_assert_eq!(data.len() / bytes * block, out.len());
    match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(4)) {
                *o = f32::from_le_bytes(c.try_into().unwrap());
            }
        }
        GgmlType::F16 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = f16_to_f32(f16::from_le_bytes([c[0], c[1]]));
            }
        }
        GgmlType::BF16 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16);
            }
        }
        _ => {
            for (b, o) in data.chunks_exact(bytes).zip(out.chunks_exact_mut(block)) {
                block_values(ty, b, o);
            }
        }
    }
}

/// One block's values.
fn block_values(ty: GgmlType, b: &[u8], o: &mut [f32]) {
    match ty {
        GgmlType::Q4_0 => {
            let d = h(b, 0);
            for j in 0..16 {
                o[j] = d * ((b[2 + j] & 15) as i32 - 8) as f32;
                o[j + 16] = d * ((b[2 + j] >> 4) as i32 - 8) as f32;
            }
        }
        GgmlType::Q4_1 => {
            let (d, m) = (h(b, 0), h(b, 2));
            for j in 0..16 {
                o[j] = d * (b[4 + j] & 15) as f32 + m;
                o[j + 16] = d * (b[4 + j] >> 4) as f32 + m;
            }
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let q1 = ty == GgmlType::Q5_1;
            let d = h(b, 0);
            let m = if q1 { h(b, 2) } else { 0.0 };
            let at = if q1 { 4 } else { 2 };
            let qh = u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
            let qs = &b[at + 4..at + 20];
            for j in 0..32 {
                let low = if j < 16 { qs[j] & 15 } else { qs[j - 16] >> 4 };
                let q = low | ((((qh >> j) & 1) as u8) << 4);
                o[j] = if q1 { d * q as f32 + m } else { d * (q as i32 - 16) as f32 };
            }
        }
        GgmlType::Q8_0 => {
            let d = h(b, 0);
            for j in 0..32 {
                o[j] = (b[2 + j] as i8) as f32 * d;
            }
        }
        GgmlType::Q2K => {
            let (scales, qs) = (&b[0..16], &b[16..80]);
            let (d, dmin) = (h(b, 80), h(b, 82));
            for (e, v) in o.iter_mut().enumerate() {
                let g = e / 16;
                let (half, shift, l) = (e / 128, (e % 128) / 32, e % 32);
                let q = (qs[half * 32 + l] >> (2 * shift)) & 3;
                let dl = d * (scales[g] & 15) as f32;
                let ml = dmin * (scales[g] >> 4) as f32;
                *v = dl * q as f32 - ml;
            }
        }
        GgmlType::Q3K => {
            let (hmask, qs, sc) = (&b[0..32], &b[32..96], &b[96..108]);
            let d = h(b, 108);
            for (e, v) in o.iter_mut().enumerate() {
                let g = e / 16;
                let low = (sc[g % 8] >> (4 * (g / 8))) & 15;
                let high = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
                let scale = ((low | (high << 4)) as i8).wrapping_sub(32) as f32;
                let (half, shift, l) = (e / 128, (e % 128) / 32, e % 32);
                let ql = (qs[half * 32 + l] >> (2 * shift)) & 3;
                let qh = ((hmask[l] >> (e / 32)) & 1) ^ 1;
                let q = (ql as i8 - ((qh << 2) as i8)) as f32;
                *v = (d * scale) * q;
            }
        }
        // the K-quants the runtime also reads in place: one implementation (quant.rs)
        GgmlType::Q4K => dequant_q4k(&[bytemuck::pod_read_unaligned(b)], o),
        GgmlType::Q5K => dequant_q5k(&[bytemuck::pod_read_unaligned(b)], o),
        GgmlType::Q6K => dequant_q6k(&[bytemuck::pod_read_unaligned(b)], o),
        GgmlType::Mxfp4 => dequant_mxfp4(&[bytemuck::pod_read_unaligned(b)], o),
        GgmlType::Q8K => {
            let d = f32::from_le_bytes(b[0..4].try_into().unwrap());
            for j in 0..256 {
                o[j] = d * (b[4 + j] as i8) as f32;
            }
        }
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("element types are handled by dequantize"),
    }
}
