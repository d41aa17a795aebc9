//! `ml_variant` / `ml_<isa>`: one Krafla inference executable. The ISA comes
//! from the target features it is compiled with (`cargo xtask dist` builds
//! one per row of build/src/variants.rs); the start-up CPU guard of its
//! platform refuses a CPU that lacks one of them before `main` runs.

#[cfg(all(target_arch = "x86_64", any(target_os = "linux", windows)))]
mod guard;
#[cfg(all(target_arch = "aarch64", target_os = "linux"))]
mod guard_aarch64;
#[cfg(all(target_arch = "arm", target_os = "linux"))]
mod guard_arm;
#[cfg(any(
    all(target_arch = "x86_64", any(target_os = "linux", windows)),
    all(any(target_arch = "aarch64", target_arch = "arm"), target_os = "linux")
))]
mod guard_message;
#[cfg(any(
    all(target_arch = "x86_64", any(target_os = "linux", windows)),
    all(any(target_arch = "aarch64", target_arch = "arm"), target_os = "linux")
))]
#[path = "../../build/src/variants.rs"]
mod table;

fn main() {
    std::process::exit(krafla::app::main());
}
