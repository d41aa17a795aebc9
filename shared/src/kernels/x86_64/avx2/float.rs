//! AVX2 f32 kernels, eight lanes wide: dots (f32, and f16 through
//! `vcvtph2ps`) in `portable`'s order, rmsnorm, softmax, SiLU and GELU
//! through `exp8`, axpy, f16 conversion, attention's several-row kernels.
//! The AVX-512 VNNI build uses these too.

use core::arch::x86_64::*;

use half::f16;

use super::{hsum, ld, st};

isa_features!(
    #[inline]
    fn ld_f16(c: &[f16]) -> __m256 {
        let c: &[f16; 8] = c.try_into().unwrap();
        // SAFETY: `c` points to 8 readable f16 (16 bytes); loadu needs no alignment.
        _mm256_cvtph_ps(unsafe { _mm_loadu_si128(c.as_ptr() as *const __m128i) })
    }

    /// Σ a[i]·b[i] (f32 weights or f16 through `load`) in `portable`'s order
    /// exactly: eight partial sums (one vector, multiply then add, no FMA),
    /// combined pairwise, plus a scalar tail.
    #[inline]
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
    pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        debug_assert_eq!(a.len(), b.len());
        dot_with(a, b, |c| ld(c), |v| v)
    }

    #[inline]
    pub(crate) fn dot_f16_f32(w: &[f16], x: &[f32]) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        dot_with(w, x, |c| ld_f16(c), crate::quant::f16_to_f32)
    }

    /// out[p] = `dot_f32`(q, row p) for rows p at `rows[p·stride..]`, bit
    /// for bit: four rows at a time (independent chains, `q` loaded once for
    /// the four), their eight-lane sums combined as `hsum` does in one
    /// transposed step, then each row's scalar tail added.
    #[inline]
    pub(crate) fn dot_f32_rows(q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
        f32_rows4!(q, rows, stride, out, |r, full| {
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut c = 0;
            while c < full {
                let qv = ld(&q[c..c + 8]);
                acc = unroll!(4, |j| _mm256_add_ps(acc[j], _mm256_mul_ps(qv, ld(&r[j][c..c + 8]))));
                c += 8;
            }
            // per row ((v0 + v4) + (v1 + v5)) + ((v2 + v6) + (v3 + v7)), as `hsum`
            let t = unroll!(4, |j| _mm_add_ps(_mm256_castps256_ps128(acc[j]), _mm256_extractf128_ps::<1>(acc[j])));
            let s = _mm_hadd_ps(_mm_hadd_ps(t[0], t[1]), _mm_hadd_ps(t[2], t[3]));
            let mut sums = [0.0f32; 4];
            // SAFETY: `sums` is 4 writable f32; storeu needs no alignment.
            unsafe { _mm_storeu_ps(sums.as_mut_ptr(), s) };
            sums
        })
    }

    /// out += w[p]·row p for p in order (rows at `rows[p·stride..]`), each
    /// element exactly as `axpy` row after row: out kept in registers, 64
    /// elements at a time.
    #[inline]
    pub(crate) fn axpy_rows(w: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
        let n = out.len();
        let mut c0 = 0;
        while c0 + 64 <= n {
            let mut o = unroll!(8, |k| ld(&out[c0 + 8 * k..c0 + 8 * k + 8]));
            for (p, &a) in w.iter().enumerate() {
                let row = &rows[p * stride + c0..p * stride + c0 + 64];
                let va = _mm256_set1_ps(a);
                o = unroll!(8, |k| _mm256_add_ps(o[k], _mm256_mul_ps(va, ld(&row[8 * k..8 * k + 8]))));
            }
            let _ = unroll!(8, |k| st(&mut out[c0 + 8 * k..c0 + 8 * k + 8], o[k]));
            c0 += 64;
        }
        if c0 < n {
            for (p, &a) in w.iter().enumerate() {
                axpy(a, &rows[p * stride + c0..p * stride + n], &mut out[c0..]);
            }
        }
    }

    /// out = x / sqrt(mean(x²) + eps) · w; elementwise as `portable`.
    #[inline]
    pub(crate) fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
        let inv = 1.0 / (dot_f32(x, x) / x.len() as f32 + eps).sqrt();
        let n = x.len().min(w.len()).min(out.len());
        let vi = _mm256_set1_ps(inv);
        let mut i = 0;
        while i + 8 <= n {
            let v = _mm256_mul_ps(_mm256_mul_ps(ld(&x[i..i + 8]), vi), ld(&w[i..i + 8]));
            st(&mut out[i..i + 8], v);
            i += 8;
        }
        for j in i..n {
            out[j] = x[j] * inv * w[j];
        }
    }

    /// Applies `f` eight lanes at a time to `y`, the tail through a vector padded with `pad`.
    #[inline]
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
    fn exp8(x: __m256) -> __m256 {
        let (hi, lo) = (_mm256_set1_ps(88.72283), _mm256_set1_ps(-103.97208));
        let xc = _mm256_min_ps(hi, _mm256_max_ps(lo, x)); // NaN passes through (second operand)
        let n = _mm256_cvtps_epi32(_mm256_mul_ps(xc, _mm256_set1_ps(std::f32::consts::LOG2_E)));
        let nf = _mm256_cvtepi32_ps(n);
        let r = _mm256_sub_ps(xc, _mm256_mul_ps(nf, _mm256_set1_ps(0.693_359_4)));
        let r = _mm256_sub_ps(r, _mm256_mul_ps(nf, _mm256_set1_ps(-2.121_944_4e-4)));
        let mut p = _mm256_set1_ps(1.987_569_1e-4);
        // Cephes' coefficients as published (5.000_000_1e-1 rounds to 0.5 in f32)
        #[allow(clippy::excessive_precision)]
        for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 5.000_000_1e-1] {
            p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c));
        }
        let y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), _mm256_set1_ps(1.0));
        let n1 = _mm256_srai_epi32::<1>(n);
        let pow2 = |k| _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(k, _mm256_set1_epi32(127))));
        let v = _mm256_mul_ps(_mm256_mul_ps(y, pow2(n1)), pow2(_mm256_sub_epi32(n, n1)));
        let v = _mm256_blendv_ps(v, _mm256_set1_ps(f32::INFINITY), _mm256_cmp_ps::<_CMP_GT_OQ>(x, hi));
        _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(x, lo), v)
    }

    /// e^x of every element through `exp8`.
    pub(crate) fn exp(x: &mut [f32]) {
        map1(x, 0.0, |v| exp8(v));
    }

    /// In-place softmax: vector exp, the sum in element order.
    #[inline]
    pub(crate) fn softmax(x: &mut [f32]) {
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
    pub(crate) fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
        let va = _mm256_set1_ps(a);
        map2(y, x, |yv, xv| _mm256_add_ps(yv, _mm256_mul_ps(va, xv)));
    }

    /// gate ← silu(gate) · up
    #[inline]
    pub(crate) fn silu_mul(gate: &mut [f32], up: &[f32]) {
        let one = _mm256_set1_ps(1.0);
        map2(gate, up, |g, u| {
            let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
            _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u)
        });
    }

    /// gate ← gelu_tanh(gate) · up, tanh(t) = 1 − 2/(e^{2t} + 1).
    #[inline]
    pub(crate) fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
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
    pub(crate) fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            st(&mut dst[i..i + 8], ld_f16(&src[i..i + 8]));
            i += 8;
        }
        for j in i..n {
            dst[j] = crate::quant::f16_to_f32(src[j]);
        }
    }
);
