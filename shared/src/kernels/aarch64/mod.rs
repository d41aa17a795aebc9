//! AArch64 kernel sets. NEON is the AArch64 baseline, so its module is in
//! every AArch64 build (the higher sets reuse its f32 kernels and block
//! folding); dotprod (`sdot`), i8mm (`smmla`) and SVE have no stable
//! intrinsics and use `asm!`. The K-quant dots are written once
//! (`kquant`), generic over the 16-byte int8 dot: NEON's with
//! `smull`/`sadalp`, the dotprod, i8mm and SVE builds' with `sdot`
//! (`neon_dotprod`, compiled into all three).

pub mod kquant;
pub mod neon;

#[cfg(krafla_isa = "i8mm")]
pub mod i8mm;
// also in the i8mm and SVE builds, which include dotprod and take its
// K-quant dots
#[cfg(any(krafla_isa = "neon_dotprod", krafla_isa = "i8mm", krafla_isa = "sve"))]
pub mod neon_dotprod;
#[cfg(krafla_isa = "sve")]
pub mod sve;
