//! 32-bit ARM: Krafla needs NEON there (armv7-a + NEON + VFPv4, the armv7hf
//! release's one build). rustc's `neon` target feature is not stable on
//! 32-bit ARM and not visible to `cfg`, so the kernels are written in `asm!`
//! and the start-up guard (variants/src/guard_arm.rs) refuses a CPU without
//! NEON or VFPv4.

pub mod neon;
