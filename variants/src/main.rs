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

fn main() {
    std::process::exit(krafla::cli::main());
}
