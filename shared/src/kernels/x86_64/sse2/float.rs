//! SSE2 f32 kernels: dots (f32 and f16 weights) in `portable`'s order,
//! rmsnorm, softmax, SiLU and GELU through the Cephes `exp4`, axpy, f16
//! conversion, and attention's several-row kernels.

use core::arch::x86_64::*;

use half::f16;

use super::{cvt_f16x4, hsum, ld, st};
use crate::kernels::portable::f16_bits_to_f32;

isa_features!(
    #[inline]
    fn ld_f16x4(c: &[f16]) -> __m128 {
        let c: &[f16; 4] = c.try_into().unwrap();
        // SAFETY: `c` points to 4 readable f16 (8 bytes); loadl reads exactly 8 bytes.
        cvt_f16x4(unsafe { _mm_loadl_epi64(c.as_ptr() as *const __m128i) })
    }

    /// Σ a[i]·b[i] in `portable`'s order exactly: eight partial sums (two
    /// 4-lane vectors, multiply then add), combined pairwise, plus a scalar tail.
    #[inline]
    pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        debug_assert_eq!(a.len(), b.len());
        dot_with(a, b, |c| ld(c))
    }

    #[inline]
    fn dot_with<T: Copy + Into<Scalar>>(a: &[T], b: &[f32], load: impl Fn(&[T]) -> __m128) -> f32 {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        let (mut lo, mut hi) = (_mm_setzero_ps(), _mm_setzero_ps());
        let (mut ca, mut cb) = (a.chunks_exact(8), b.chunks_exact(8));
        for (x, y) in (&mut ca).zip(&mut cb) {
            lo = _mm_add_ps(lo, _mm_mul_ps(load(&x[..4]), ld(&y[..4])));
            hi = _mm_add_ps(hi, _mm_mul_ps(load(&x[4..]), ld(&y[4..])));
        }
        let mut tail = 0.0f32;
        for (&x, &y) in ca.remainder().iter().zip(cb.remainder()) {
            tail += x.into().0 * y;
        }
        hsum(_mm_add_ps(lo, hi)) + tail
    }
);

/// An element converted to f32 for the scalar tail of `dot_with`.
pub(crate) struct Scalar(f32);

impl From<f32> for Scalar {
    fn from(v: f32) -> Self {
        Scalar(v)
    }
}

impl From<f16> for Scalar {
    fn from(v: f16) -> Self {
        Scalar(f16_bits_to_f32(v.to_bits()))
    }
}

isa_features!(
    /// Σ w[i]·x[i] for f16 weights, same order as `dot_f32`.
    #[inline]
    pub(crate) fn dot_f16_f32(w: &[f16], x: &[f32]) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        dot_with(w, x, |c| ld_f16x4(c))
    }

    /// out[p] = `dot_f32`(q, row p) for rows p at `rows[p·stride..]`, bit
    /// for bit: four rows at a time (independent chains, `q` loaded once for
    /// the four), their sums combined as `hsum` does through one 4 × 4
    /// transpose, then each row's scalar tail added.
    #[inline]
    pub(crate) fn dot_f32_rows(q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
        f32_rows4!(q, rows, stride, out, |r, full| {
            let mut acc = [[_mm_setzero_ps(); 2]; 4];
            let mut c = 0;
            while c < full {
                let (q0, q1) = (ld(&q[c..c + 4]), ld(&q[c + 4..c + 8]));
                acc = unroll!(4, |j| [
                    _mm_add_ps(acc[j][0], _mm_mul_ps(q0, ld(&r[j][c..c + 4]))),
                    _mm_add_ps(acc[j][1], _mm_mul_ps(q1, ld(&r[j][c + 4..c + 8]))),
                ]);
                c += 8;
            }
            // per row t = lo + hi, then (t0 + t1) + (t2 + t3), as `hsum`
            let t = unroll!(4, |j| _mm_add_ps(acc[j][0], acc[j][1]));
            let (a, b) = (_mm_unpacklo_ps(t[0], t[1]), _mm_unpackhi_ps(t[0], t[1]));
            let (c_, d) = (_mm_unpacklo_ps(t[2], t[3]), _mm_unpackhi_ps(t[2], t[3]));
            let col = [_mm_movelh_ps(a, c_), _mm_movehl_ps(c_, a), _mm_movelh_ps(b, d), _mm_movehl_ps(d, b)];
            let s = _mm_add_ps(_mm_add_ps(col[0], col[1]), _mm_add_ps(col[2], col[3]));
            let mut sums = [0.0f32; 4];
            st(&mut sums, s);
            sums
        })
    }

    /// out += w[p]·row p for p in order (rows at `rows[p·stride..]`), each
    /// element exactly as `axpy` row after row: out kept in registers, 32
    /// elements at a time.
    #[inline]
    pub(crate) fn axpy_rows(w: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
        let n = out.len();
        let mut c0 = 0;
        while c0 + 32 <= n {
            let mut o = unroll!(8, |k| ld(&out[c0 + 4 * k..c0 + 4 * k + 4]));
            for (p, &a) in w.iter().enumerate() {
                let row = &rows[p * stride + c0..p * stride + c0 + 32];
                let va = _mm_set1_ps(a);
                o = unroll!(8, |k| _mm_add_ps(o[k], _mm_mul_ps(va, ld(&row[4 * k..4 * k + 4]))));
            }
            let _ = unroll!(8, |k| st(&mut out[c0 + 4 * k..c0 + 4 * k + 4], o[k]));
            c0 += 32;
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
        let vi = _mm_set1_ps(inv);
        let mut i = 0;
        while i + 4 <= n {
            st(&mut out[i..i + 4], _mm_mul_ps(_mm_mul_ps(ld(&x[i..i + 4]), vi), ld(&w[i..i + 4])));
            i += 4;
        }
        for j in i..n {
            out[j] = x[j] * inv * w[j];
        }
    }

    /// Applies `f` four lanes at a time to `y`, the tail through a zero-padded vector.
    #[inline]
    fn map1(y: &mut [f32], f: impl Fn(__m128) -> __m128) {
        let n = y.len();
        let mut i = 0;
        while i + 4 <= n {
            let v = f(ld(&y[i..i + 4]));
            st(&mut y[i..i + 4], v);
            i += 4;
        }
        if i < n {
            let mut a = [0.0f32; 4];
            a[..n - i].copy_from_slice(&y[i..n]);
            let v = f(ld(&a));
            st(&mut a, v);
            y[i..n].copy_from_slice(&a[..n - i]);
        }
    }

    /// Applies `f` four lanes at a time to `y` and `x`, the tail through a zero-padded vector.
    #[inline]
    fn map2(y: &mut [f32], x: &[f32], f: impl Fn(__m128, __m128) -> __m128) {
        let n = y.len().min(x.len());
        let mut i = 0;
        while i + 4 <= n {
            let v = f(ld(&y[i..i + 4]), ld(&x[i..i + 4]));
            st(&mut y[i..i + 4], v);
            i += 4;
        }
        if i < n {
            let (mut a, mut b) = ([0.0f32; 4], [0.0f32; 4]);
            a[..n - i].copy_from_slice(&y[i..n]);
            b[..n - i].copy_from_slice(&x[i..n]);
            let v = f(ld(&a), ld(&b));
            st(&mut a, v);
            y[i..n].copy_from_slice(&a[..n - i]);
        }
    }

    /// e^x, four lanes: Cephes expf (n = round(x·log2 e), r = x − n·ln 2 in two
    /// parts, degree-6 polynomial, scaled by 2^n in two steps). Relative error
    /// ≤ 1e-6 against f64 on [-87.3, 88.72] (tested, about 2e-7 seen); below
    /// −103.97 gives 0, above 88.7228 gives +inf, NaN stays NaN.
    #[inline]
    pub(crate) fn exp4(x: __m128) -> __m128 {
        let (hi, lo) = (_mm_set1_ps(88.72283), _mm_set1_ps(-103.97208));
        let xc = _mm_min_ps(hi, _mm_max_ps(lo, x)); // NaN passes through (second operand)
        let n = _mm_cvtps_epi32(_mm_mul_ps(xc, _mm_set1_ps(std::f32::consts::LOG2_E)));
        let nf = _mm_cvtepi32_ps(n);
        let r = _mm_sub_ps(
            _mm_sub_ps(xc, _mm_mul_ps(nf, _mm_set1_ps(0.693_359_4))),
            _mm_mul_ps(nf, _mm_set1_ps(-2.121_944_4e-4)),
        );
        let mut p = _mm_set1_ps(1.987_569_1e-4);
        // Cephes' coefficients as published (5.000_000_1e-1 rounds to 0.5 in f32)
        #[allow(clippy::excessive_precision)]
        for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 5.000_000_1e-1] {
            p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(c));
        }
        let y = _mm_add_ps(_mm_add_ps(_mm_mul_ps(_mm_mul_ps(p, r), r), r), _mm_set1_ps(1.0));
        let n1 = _mm_srai_epi32::<1>(n);
        let pow2 = |k| _mm_castsi128_ps(_mm_slli_epi32::<23>(_mm_add_epi32(k, _mm_set1_epi32(127))));
        let v = _mm_mul_ps(_mm_mul_ps(y, pow2(n1)), pow2(_mm_sub_epi32(n, n1)));
        let big = _mm_cmpgt_ps(x, hi);
        let v = _mm_or_ps(_mm_andnot_ps(big, v), _mm_and_ps(big, _mm_set1_ps(f32::INFINITY)));
        _mm_andnot_ps(_mm_cmplt_ps(x, lo), v)
    }

    /// e^x of every element through `exp4`.
    pub(crate) fn exp(x: &mut [f32]) {
        map1(x, |v| exp4(v));
    }

    /// In-place softmax: vector exp, the sum in element order.
    #[inline]
    pub(crate) fn softmax(x: &mut [f32]) {
        let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let vm = _mm_set1_ps(max);
        map1(x, |v| exp4(_mm_sub_ps(v, vm)));
        // summed in element order, so every x86 build gives the same result
        let sum = x.iter().fold(0.0f32, |s, &e| s + e);
        let inv = _mm_set1_ps(1.0 / sum);
        map1(x, |v| _mm_mul_ps(v, inv));
    }

    /// y += a·x
    #[inline]
    pub(crate) fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
        let va = _mm_set1_ps(a);
        map2(y, x, |yv, xv| _mm_add_ps(yv, _mm_mul_ps(va, xv)));
    }

    /// gate ← silu(gate) · up
    #[inline]
    pub(crate) fn silu_mul(gate: &mut [f32], up: &[f32]) {
        let one = _mm_set1_ps(1.0);
        map2(gate, up, |g, u| {
            let e = exp4(_mm_sub_ps(_mm_setzero_ps(), g));
            _mm_mul_ps(_mm_div_ps(g, _mm_add_ps(one, e)), u)
        });
    }

    /// gate ← gelu_tanh(gate) · up, tanh(t) = 1 − 2/(e^{2t} + 1).
    #[inline]
    pub(crate) fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
        let (one, two, half) = (_mm_set1_ps(1.0), _mm_set1_ps(2.0), _mm_set1_ps(0.5));
        let (k, c) = (_mm_set1_ps(0.797_884_6), _mm_set1_ps(0.044715));
        map2(gate, up, |x, u| {
            let t = _mm_mul_ps(k, _mm_add_ps(x, _mm_mul_ps(c, _mm_mul_ps(_mm_mul_ps(x, x), x))));
            let th = _mm_sub_ps(one, _mm_div_ps(two, _mm_add_ps(exp4(_mm_add_ps(t, t)), one)));
            _mm_mul_ps(_mm_mul_ps(_mm_mul_ps(half, x), _mm_add_ps(one, th)), u)
        });
    }

    /// f16 → f32 conversion of a slice (exact).
    #[inline]
    pub(crate) fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 4 <= n {
            st(&mut dst[i..i + 4], ld_f16x4(&src[i..i + 4]));
            i += 4;
        }
        for j in i..n {
            dst[j] = f16_bits_to_f32(src[j].to_bits());
        }
    }
);
