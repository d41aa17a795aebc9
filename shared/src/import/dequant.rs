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

fn h(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
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
                *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
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
        GgmlType::Q4K | GgmlType::Q5K => {
            let (d, dmin) = (h(b, 0), h(b, 2));
            let (sc, mn) = scale_min_k4(&b[4..16]);
            let (qh, qs) = if ty == GgmlType::Q5K { (&b[16..48], &b[48..176]) } else { (&[0u8; 32][..], &b[16..144]) };
            let qh: &[u8; 32] = qh.try_into().unwrap();
            // eight sub-blocks of 32: sub-block k takes the low (k even) or
            // high nibbles of qs[32·(k/2)..], and bit k of each qh byte
            for (k, o) in o.chunks_exact_mut(32).enumerate() {
                let (dl, ml) = (d * sc[k] as f32, dmin * mn[k] as f32);
                let q4: &[u8; 32] = qs[32 * (k / 2)..32 * (k / 2) + 32].try_into().unwrap();
                let shift = 4 * (k % 2);
                for ((v, &lo), &hi) in o.iter_mut().zip(q4).zip(qh) {
                    let q = ((lo >> shift) & 15) | (((hi >> k) & 1) << 4);
                    *v = dl * q as f32 - ml;
                }
            }
        }
        GgmlType::Q6K => {
            let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
            let d = h(b, 208);
            // two halves of 128; in each, four runs of 32 (r): the low
            // nibbles of ql[64·half + 32·(r % 2)..] (r < 2) or their high
            // nibbles, and bits 2r, 2r+1 of qh[32·half..]; a scale per 16
            for (half, o) in o.chunks_exact_mut(128).enumerate() {
                let qh: &[u8; 32] = qh[32 * half..32 * half + 32].try_into().unwrap();
                for (r, o) in o.chunks_exact_mut(32).enumerate() {
                    let at = 64 * half + 32 * (r % 2);
                    let ql: &[u8; 32] = ql[at..at + 32].try_into().unwrap();
                    let shift = 4 * (r / 2);
                    for (g, o) in o.chunks_exact_mut(16).enumerate() {
                        let ds = d * (scales[8 * half + 2 * r + g] as i8) as f32;
                        for l in 0..16 {
                            let (lo, hi) = (ql[16 * g + l], qh[16 * g + l]);
                            let q = ((lo >> shift) & 15) | (((hi >> (2 * r)) & 3) << 4);
                            o[l] = ds * ((q as i8).wrapping_sub(32) as f32);
                        }
                    }
                }
            }
        }
        GgmlType::Q8K => {
            let d = f32::from_le_bytes(b[0..4].try_into().unwrap());
            for j in 0..256 {
                o[j] = d * (b[4 + j] as i8) as f32;
            }
        }
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("element types are handled by dequantize"),
    }
}

/// Q4_K / Q5_K's eight 6-bit scales and mins from their 12 packed bytes.
fn scale_min_k4(s: &[u8]) -> ([u8; 8], [u8; 8]) {
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
