//! How fast this build's quantiser turns real weights into Q4_0 and Q8_0,
//! on one thread (docs/QUANT.md#conversion-speed).
//!
//! Usage: `quantize_speed MODEL.gguf [MAX_WEIGHTS]`: the 2-D layer matrices
//! of the file, in file order, that fit in MAX_WEIGHTS weights (default 64M) are
//! dequantised to f32 first; then each rule runs over all of them (Q4_0 in
//! tasks of whole bands of rows copied into a buffer first, as the GGUF
//! import dequantises a task's rows before quantising them), three
//! times, and the best time is printed in ns a weight, with an FNV-1a hash
//! of the blocks made, so that two builds (or two versions of the
//! quantiser) can be compared for the same bytes as well as for speed.
//! The weighted search uses a fixed pseudo-random importance per column.

use std::process::ExitCode;
use std::time::Instant;

use krafla::format::gguf::Gguf;
use krafla::import::dequant::dequantize;
use krafla::import::quantize::{quantize_q4_0, quantize_q8_0, Q4Rule, BAND_ROWS};
use krafla::quant::{BlockQ4_0, BlockQ8_0, QK};

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// The matrices: (columns, values).
fn matrices(path: &str, max_weights: u64) -> Result<Vec<(usize, Vec<f32>)>, String> {
    let g = Gguf::open(std::path::Path::new(path))?;
    let mut out = Vec::new();
    let mut total = 0u64;
    for t in g.tensors.iter().filter(|t| t.name.starts_with("blk.") && t.dims.len() == 2) {
        if total + t.n_elements() > max_weights {
            continue;
        }
        let mut x = vec![0.0f32; t.n_elements() as usize];
        dequantize(t.ty, g.tensor_bytes(t), &mut x);
        total += t.n_elements();
        out.push((t.dims[0] as usize, x));
    }
    if out.is_empty() {
        return Err(format!("{path}: no layer matrix of at most {max_weights} weights"));
    }
    Ok(out)
}

fn run(args: &[String]) -> Result<(), String> {
    let (path, max) = match args {
        [_, path] => (path, 64u64 << 20),
        [_, path, max] => (path, max.parse().map_err(|e| format!("MAX_WEIGHTS {max:?}: {e}"))?),
        _ => return Err("usage: quantize_speed MODEL.gguf [MAX_WEIGHTS]".into()),
    };
    let mats = matrices(path, max)?;
    let weights: u64 = mats.iter().map(|(_, x)| x.len() as u64).sum();
    println!("{} matrices, {weights} weights", mats.len());
    let importance: Vec<Vec<f32>> = mats
        .iter()
        .map(|(cols, _)| (0..*cols).map(|j| ((j * 2_654_435_761usize) % 1000) as f32 / 100.0 + 0.01).collect())
        .collect();
    let time = |name: &str, f: &dyn Fn() -> Vec<u8>| {
        let mut best = f64::INFINITY;
        let mut hash = 0;
        for _ in 0..3 {
            let t = Instant::now();
            let bytes = f();
            best = best.min(t.elapsed().as_secs_f64());
            hash = fnv1a(&bytes);
        }
        println!("{name:<22} {:>7.2} ns a weight   blocks {hash:016x}", best * 1e9 / weights as f64);
    };
    // As the GGUF import does: tasks of BAND_ROWS rows (or more, about 64 KiB),
    // each copied into a buffer (where the import dequantises them) and quantised from there.
    let q4 = |rule: Q4Rule, weighted: bool| -> Vec<u8> {
        let mut all = Vec::new();
        let mut buf = Vec::new();
        for ((cols, x), w) in mats.iter().zip(&importance) {
            let rows = (16384 / cols).max(1).next_multiple_of(BAND_ROWS);
            let mut out = vec![BlockQ4_0::default(); x.len() / QK];
            for (x, out) in x.chunks(rows * cols).zip(out.chunks_mut(rows * cols / QK)) {
                buf.clear();
                buf.extend_from_slice(x);
                quantize_q4_0(&buf, *cols, rule, weighted.then_some(&w[..]), out);
            }
            all.extend_from_slice(bytemuck::cast_slice(&out));
        }
        all
    };
    time("q8_0", &|| {
        let mut all = Vec::new();
        for (_, x) in &mats {
            let mut out = vec![BlockQ8_0::default(); x.len() / QK];
            quantize_q8_0(x, &mut out);
            all.extend_from_slice(bytemuck::cast_slice(&out));
        }
        all
    });
    time("q4_0 max", &|| q4(Q4Rule::Max, false));
    time("q4_0 fit", &|| q4(Q4Rule::Fit, false));
    time("q4_0 fit, weighted", &|| q4(Q4Rule::Fit, true));
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("quantize_speed: {e}");
            ExitCode::from(2)
        }
    }
}
