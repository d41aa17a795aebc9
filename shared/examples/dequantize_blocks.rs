//! Test support for tests/test_gguf.py: Krafla's GGUF dequantiser on raw
//! blocks, to compare with the `gguf` package's.
//!
//! Usage: `dequantize_blocks <ggml type code> <blocks file> <out file>`: the
//! blocks file holds whole blocks of that type; the out file gets their
//! values as f32 little-endian.

use std::process::ExitCode;

use krafla::format::gguf::GgmlType;
use krafla::import::dequant::dequantize;

fn run(args: &[String]) -> Result<(), String> {
    let [_, code, input, output] = args else {
        return Err("usage: dequantize_blocks TYPE_CODE BLOCKS OUT".into());
    };
    let code: u32 = code.parse().map_err(|e| format!("type code {code:?}: {e}"))?;
    let ty = GgmlType::from_code(code).map_err(|t| format!("unknown type {t}"))?;
    let data = std::fs::read(input).map_err(|e| format!("{input}: {e}"))?;
    let (block, bytes) = ty.block();
    if data.len() % bytes != 0 {
        return Err(format!("{input}: {} bytes is not whole {} blocks of {bytes}", data.len(), ty.name()));
    }
    let mut out = vec![0.0f32; data.len() / bytes * block];
    dequantize(ty, &data, &mut out);
    let raw: Vec<u8> = out.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(output, raw).map_err(|e| format!("{output}: {e}"))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dequantize_blocks: {e}");
            ExitCode::from(2)
        }
    }
}
