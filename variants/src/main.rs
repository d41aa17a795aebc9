#[cfg(all(target_arch = "x86_64", any(target_os = "linux", windows)))]
mod guard;

fn main() {
    std::process::exit(krafla::cli::main());
}
