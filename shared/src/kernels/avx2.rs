//! AVX2 + FMA + F16C kernels: int8 dots with `vpmaddubsw` + `vpmaddwd`, one
//! 32-weight block per 256-bit vector; f32 ops eight lanes wide; f16 through
//! `vcvtph2ps`. Reductions follow `portable`'s order and no FMA is used, so
//! results equal the other x86 builds' (see sse2.rs for why). The AVX-512 VNNI build re-exports the f32 half.

entry_points!(
    dot_f32,
    dot_f16_f32,
    dot_q8,
    dot_q4,
    rmsnorm,
    softmax,
    axpy,
    silu_mul,
    gelu_tanh_mul,
    f16_to_f32,
    vexp
);

pub(super) mod imp {
    use core::arch::x86_64::*;

    use half::f16;

    use super::super::{q4_scale, q8_scale};
    use crate::quant::{BlockQ8Act, Q4Block, Q8Block, QK};

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn ld(c: &[f32]) -> __m256 {
        let c: &[f32; 8] = c.try_into().unwrap();
        // SAFETY: `c` is a reference to 8 readable f32; loadu needs no alignment.
        unsafe { _mm256_loadu_ps(c.as_ptr()) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn st(c: &mut [f32], v: __m256) {
        let c: &mut [f32; 8] = c.try_into().unwrap();
        // SAFETY: `c` is a unique reference to 8 writable f32; storeu needs no alignment.
        unsafe { _mm256_storeu_ps(c.as_mut_ptr(), v) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn ld_f16(c: &[f16]) -> __m256 {
        let c: &[f16; 8] = c.try_into().unwrap();
        // SAFETY: `c` points to 8 readable f16 (16 bytes); loadu needs no alignment.
        _mm256_cvtph_ps(unsafe { _mm_loadu_si128(c.as_ptr() as *const __m128i) })
    }

    /// A 32-byte block of quants as one vector.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn ld32<T: Copy>(q: &[T; QK]) -> __m256i {
        debug_assert_eq!(core::mem::size_of::<T>(), 1);
        // SAFETY: `q` points to 32 readable bytes (T is i8 or u8); loadu needs no alignment.
        unsafe { _mm256_loadu_si256(q.as_ptr() as *const __m256i) }
    }

    /// 16 nibble bytes → 32 bytes 0..15: low nibbles (elements 0..16) then high (16..32).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn unpack_nibbles(n: &[u8; QK / 2]) -> __m256i {
        // SAFETY: `n` points to 16 readable bytes; loadu needs no alignment.
        let n = unsafe { _mm_loadu_si128(n.as_ptr() as *const __m128i) };
        let m = _mm_set1_epi8(0x0f);
        _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(n), m), _mm_and_si128(n, m))
    }

    /// ((v0 + v4) + (v1 + v5)) + ((v2 + v6) + (v3 + v7)): `portable`'s combination.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn hsum(v: __m256) -> f32 {
        let t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(t, _mm_shuffle_ps::<0b10_11_00_01>(t, t));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehl_ps(s, s)))
    }

    /// Sum of eight i32 lanes (exact).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn hsum_i32(v: __m256i) -> i32 {
        let v = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let v = _mm_add_epi32(v, _mm_shuffle_epi32::<0b01_00_11_10>(v));
        _mm_cvtsi128_si32(_mm_add_epi32(v, _mm_shuffle_epi32::<0b10_11_00_01>(v)))
    }

    /// Σ a[i]·b[i] (f32 weights or f16 through `load`) in `portable`'s order
    /// exactly: eight partial sums (one vector, multiply then add, no FMA),
    /// combined pairwise, plus a scalar tail.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn dot_with<T: Copy>(a: &[T], b: &[f32], load: impl Fn(&[T]) -> __m256, one: impl Fn(T) -> f32) -> f32 {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        let mut acc = _mm256_setzero_ps();
        let (mut ca, mut cb) = (a.chunks_exact(8), b.chunks_exact(8));
        for (x, y) in (&mut ca).zip(&mut cb) {
            acc = _mm256_add_ps(acc, _mm256_mul_ps(load(x), ld(y)));
        }
        let mut tail = 0.0f32;
        for (&x, &y) in ca.remainder().iter().zip(cb.remainder()) {
            tail += one(x) * y;
        }
        hsum(acc) + tail
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        debug_assert_eq!(a.len(), b.len());
        dot_with(a, b, |c| ld(c), |v| v)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn dot_f16_f32(w: &[f16], x: &[f32]) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        dot_with(w, x, |c| ld_f16(c), |v| v.to_f32())
    }

    /// Σ of 32 u8 × i8 products in eight i32 lanes (exact: pair sums fit i16).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn maddubs(u: __m256i, s: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }

    /// Σ_i d_i·isum_i in block order, as `portable`: `block(i)` gives block
    /// i's exact i32 lanes and its scale d_w·d_x.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn sum_blocks(n: usize, block: impl Fn(usize) -> (__m256i, f32)) -> f32 {
        let mut acc = 0.0f32;
        for i in 0..n {
            let (s, d) = block(i);
            acc += d * hsum_i32(s) as f32;
        }
        acc
    }

    /// Q8 weights · Q8 activations, |w| × sign(x, w) (activation quants in [-127, 127]).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn dot_q8<B: Q8Block>(w: &[B], x: &[BlockQ8Act]) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        let n = w.len().min(x.len());
        sum_blocks(n, |i| {
            let (a, b) = (ld32(w[i].quants()), ld32(&x[i].qs));
            (
                maddubs(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a)),
                q8_scale(&w[i]) * x[i].d,
            )
        })
    }

    /// Q4 weights · Q8 activations: Σ nibble·q − 8·Σq per block (exact).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn dot_q4<B: Q4Block>(w: &[B], x: &[BlockQ8Act]) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        let n = w.len().min(x.len());
        sum_blocks(n, |i| {
            let s = maddubs(unpack_nibbles(w[i].nibbles()), ld32(&x[i].qs));
            let corr = _mm256_zextsi128_si256(_mm_cvtsi32_si128(-8 * x[i].sum));
            (_mm256_add_epi32(s, corr), q4_scale(&w[i]) * x[i].d)
        })
    }

    /// out = x / sqrt(mean(x²) + eps) · (w + offset); elementwise as `portable`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32, offset: f32, out: &mut [f32]) {
        let inv = 1.0 / (dot_f32(x, x) / x.len() as f32 + eps).sqrt();
        let n = x.len().min(w.len()).min(out.len());
        let (vi, vo) = (_mm256_set1_ps(inv), _mm256_set1_ps(offset));
        let mut i = 0;
        while i + 8 <= n {
            let v = _mm256_mul_ps(_mm256_mul_ps(ld(&x[i..i + 8]), vi), _mm256_add_ps(ld(&w[i..i + 8]), vo));
            st(&mut out[i..i + 8], v);
            i += 8;
        }
        for j in i..n {
            out[j] = x[j] * inv * (w[j] + offset);
        }
    }

    /// Applies `f` eight lanes at a time to `y`, the tail through a vector padded with `pad`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn map1(y: &mut [f32], pad: f32, mut f: impl FnMut(__m256) -> __m256) {
        let n = y.len();
        let mut i = 0;
        while i + 8 <= n {
            let v = f(ld(&y[i..i + 8]));
            st(&mut y[i..i + 8], v);
            i += 8;
        }
        if i < n {
            let mut a = [pad; 8];
            a[..n - i].copy_from_slice(&y[i..n]);
            let v = f(ld(&a));
            st(&mut a, v);
            y[i..n].copy_from_slice(&a[..n - i]);
        }
    }

    /// Applies `f` eight lanes at a time to `y` and `x`, the tail through a padded vector.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn map2(y: &mut [f32], x: &[f32], f: impl Fn(__m256, __m256) -> __m256) {
        let n = y.len().min(x.len());
        let mut i = 0;
        while i + 8 <= n {
            let v = f(ld(&y[i..i + 8]), ld(&x[i..i + 8]));
            st(&mut y[i..i + 8], v);
            i += 8;
        }
        if i < n {
            let (mut a, mut b) = ([0.0f32; 8], [0.0f32; 8]);
            a[..n - i].copy_from_slice(&y[i..n]);
            b[..n - i].copy_from_slice(&x[i..n]);
            let v = f(ld(&a), ld(&b));
            st(&mut a, v);
            y[i..n].copy_from_slice(&a[..n - i]);
        }
    }

    /// e^x, eight lanes: `sse2::exp4`'s operation sequence exactly (no FMA), so
    /// every x86 build computes the same values. Relative error
    /// ≤ 1e-6 against f64 on [-87.3, 88.72] (tested); below −103.97 gives 0,
    /// above 88.7228 gives +inf, NaN stays NaN.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn exp8(x: __m256) -> __m256 {
        let (hi, lo) = (_mm256_set1_ps(88.72283), _mm256_set1_ps(-103.97208));
        let xc = _mm256_min_ps(hi, _mm256_max_ps(lo, x)); // NaN passes through (second operand)
        let n = _mm256_cvtps_epi32(_mm256_mul_ps(xc, _mm256_set1_ps(std::f32::consts::LOG2_E)));
        let nf = _mm256_cvtepi32_ps(n);
        let r = _mm256_sub_ps(xc, _mm256_mul_ps(nf, _mm256_set1_ps(0.693_359_4)));
        let r = _mm256_sub_ps(r, _mm256_mul_ps(nf, _mm256_set1_ps(-2.121_944_4e-4)));
        let mut p = _mm256_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            1.666_666_5e-1,
            5.000_000_1e-1,
        ] {
            p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c));
        }
        let y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), _mm256_set1_ps(1.0));
        let n1 = _mm256_srai_epi32::<1>(n);
        let pow2 = |k| _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(k, _mm256_set1_epi32(127))));
        let v = _mm256_mul_ps(_mm256_mul_ps(y, pow2(n1)), pow2(_mm256_sub_epi32(n, n1)));
        let v = _mm256_blendv_ps(v, _mm256_set1_ps(f32::INFINITY), _mm256_cmp_ps::<_CMP_GT_OQ>(x, hi));
        _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(x, lo), v)
    }

    /// Test hook: e^x of every element through `exp8`.
    #[cfg(test)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn vexp(x: &mut [f32]) {
        map1(x, 0.0, |v| exp8(v));
    }

    /// In-place softmax: vector exp, the sum in element order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn softmax(x: &mut [f32]) {
        let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let vm = _mm256_set1_ps(max);
        map1(x, 0.0, |v| exp8(_mm256_sub_ps(v, vm)));
        // summed in element order, so every x86 build gives the same result
        let sum = x.iter().fold(0.0f32, |s, &e| s + e);
        let inv = _mm256_set1_ps(1.0 / sum);
        map1(x, 0.0, |v| _mm256_mul_ps(v, inv));
    }

    /// y += a·x (multiply then add, as `portable`)
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
        let va = _mm256_set1_ps(a);
        map2(y, x, |yv, xv| _mm256_add_ps(yv, _mm256_mul_ps(va, xv)));
    }

    /// gate ← silu(gate) · up
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
        let one = _mm256_set1_ps(1.0);
        map2(gate, up, |g, u| {
            let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
            _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u)
        });
    }

    /// gate ← gelu_tanh(gate) · up, tanh(t) = 1 − 2/(e^{2t} + 1).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
        let (one, two, half) = (_mm256_set1_ps(1.0), _mm256_set1_ps(2.0), _mm256_set1_ps(0.5));
        let (k, c) = (_mm256_set1_ps(0.797_884_6), _mm256_set1_ps(0.044715));
        map2(gate, up, |x, u| {
            let t = _mm256_mul_ps(k, _mm256_add_ps(x, _mm256_mul_ps(c, _mm256_mul_ps(_mm256_mul_ps(x, x), x))));
            let th = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(exp8(_mm256_add_ps(t, t)), one)));
            _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(half, x), _mm256_add_ps(one, th)), u)
        });
    }

    /// f16 → f32 conversion of a slice (exact).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            st(&mut dst[i..i + 8], ld_f16(&src[i..i + 8]));
            i += 8;
        }
        for j in i..n {
            dst[j] = src[j].to_f32();
        }
    }
}
