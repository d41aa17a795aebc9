//! What the CPU guards share: their one-line refusal, assembled at compile
//! time so the guard routines (which run before `main`) only copy bytes to
//! stderr.

/// `krafla: this build (ISA) needs the CPU feature 'NAME', which this CPU
/// lacks; run ml_run to pick a build that fits\n` in a fixed buffer, and its length.
pub const fn refusal<const CAP: usize>(feature: &str) -> ([u8; CAP], usize) {
    let parts: [&str; 5] = [
        "krafla: this build (",
        krafla::kernels::ISA,
        ") needs the CPU feature '",
        feature,
        "', which this CPU lacks; run ml_run to pick a build that fits\n",
    ];
    let mut out = [0u8; CAP];
    let mut len = 0;
    let mut p = 0;
    while p < parts.len() {
        let b = parts[p].as_bytes();
        let mut i = 0;
        while i < b.len() {
            out[len] = b[i];
            len += 1;
            i += 1;
        }
        p += 1;
    }
    (out, len)
}
