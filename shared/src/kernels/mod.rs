//! The kernel seam.
//!
//! `Arch` is the kernel set this build was compiled for: the ISA module
//! named by `cfg(krafla_isa = "...")`, which the build script
//! (shared/build.rs) sets from the variant table (build/src/variants.rs) and
//! the target features the compiler enables. There is no runtime dispatch.
//! Every ISA module implements the one `Kernels` trait (set.rs), so callers
//! write `Arch::dot_q8(...)` whatever the build; `Portable` is the scalar
//! reference they are all tested against (tests.rs).
//!
//! Layout: one folder per architecture (memchr's `arch/` style), one module
//! per instruction set in it, the same functions in each; the algorithms
//! above the innermost loops are written once: the matrix multiply and its
//! thread split here (matmul.rs), attention and RoPE in `model`.

// The `isa_features!` macro: the build's target features for kernel functions.
include!(concat!(env!("OUT_DIR"), "/isa_features.rs"));

#[macro_use]
mod macros;

mod matmul;
pub mod portable;
mod set;

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
#[cfg(target_arch = "arm")]
pub mod arm;
#[cfg(target_arch = "x86_64")]
pub mod x86_64;

pub use matmul::{matmul, matmul_each, matmul_group, Input, MatRef, Packed, WeightData};
pub use portable::Portable;
pub use set::Kernels;

/// The kernel set of this build.
#[cfg(krafla_isa = "avx512vnni")]
pub type Arch = x86_64::avx512vnni::Avx512Vnni;
#[cfg(krafla_isa = "avx2")]
pub type Arch = x86_64::avx2::Avx2;
#[cfg(krafla_isa = "sse41")]
pub type Arch = x86_64::sse41::Sse41;
#[cfg(krafla_isa = "sse2")]
pub type Arch = x86_64::sse2::Sse2;
#[cfg(krafla_isa = "sve")]
pub type Arch = aarch64::sve::Sve;
#[cfg(krafla_isa = "i8mm")]
pub type Arch = aarch64::i8mm::I8mm;
#[cfg(krafla_isa = "neon_dotprod")]
pub type Arch = aarch64::neon_dotprod::NeonDotprod;
#[cfg(all(target_arch = "aarch64", krafla_isa = "neon"))]
pub type Arch = aarch64::neon::Neon;
#[cfg(all(target_arch = "arm", krafla_isa = "neon"))]
pub type Arch = arm::neon::Armv7Neon;
#[cfg(krafla_isa = "portable")]
pub type Arch = Portable;

/// Name of the kernel set compiled into this build (its variant's name).
pub const ISA: &str = env!("KRAFLA_ISA");

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_kquant;
#[cfg(test)]
mod tests_mxfp4;
