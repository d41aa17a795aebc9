fn main() {
    std::process::exit(krafla::cli::main());
}
