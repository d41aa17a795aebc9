//! x86-64 kernel sets. SSE2 is the x86-64 baseline, so its module is in
//! every x86-64 build (the SSE4.1 set reuses its f32 kernels and block
//! folding, the AVX2 set its 16-byte loads); the AVX-512 VNNI set reuses
//! AVX2's f32 kernels and block folding.

pub mod sse2;

#[cfg(any(krafla_isa = "avx2", krafla_isa = "avx512vnni"))]
pub mod avx2;
#[cfg(krafla_isa = "avx512vnni")]
pub mod avx512vnni;
#[cfg(krafla_isa = "sse41")]
pub mod sse41;

/// `Kernels::prefetch` of the AVX2 and AVX-512 sets: `prefetcht1` (into L2)
/// for each 64-byte line.
#[cfg(any(krafla_isa = "avx2", krafla_isa = "avx512vnni"))]
#[inline]
pub fn prefetch(bytes: &[u8]) {
    for line in bytes.chunks(64) {
        // SAFETY: a prefetch is a hint that reads nothing architecturally;
        // the address is inside `bytes`. SSE, in every x86-64 build.
        unsafe { core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T1 }>(line.as_ptr().cast()) };
    }
}
