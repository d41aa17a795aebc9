//! AArch64 kernel sets. NEON is the AArch64 baseline, so its module is in
//! every AArch64 build (the higher sets reuse its f32 kernels and block
//! folding); dotprod (`sdot`), i8mm (`smmla`) and SVE have no stable
//! intrinsics and use `asm!`.

pub mod neon;

#[cfg(krafla_isa = "i8mm")]
pub mod i8mm;
#[cfg(krafla_isa = "neon_dotprod")]
pub mod neon_dotprod;
#[cfg(krafla_isa = "sve")]
pub mod sve;
