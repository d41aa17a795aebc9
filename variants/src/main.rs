#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod guard;

fn main() {
    std::process::exit(krafla::cli::main());
}
