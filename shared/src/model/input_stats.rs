//! What the weight matrices see: for each matrix, the sum over every row
//! the forward pass multiplied it with of each input column's square (and
//! how many rows), so that the quantiser can weight a column's error by the
//! mean square of its activations (an "importance matrix", llama.cpp's
//! imatrix idea; docs/QUANT.md). Recorded only when asked for
//! (`Model::record_inputs`); the pass's results do not change.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Per matrix name (`blk.N.attn_q`, ...): Σ x_j² per column j, and the rows.
#[derive(Default)]
pub struct InputStats {
    sums: Mutex<BTreeMap<String, (Vec<f64>, u64)>>,
}

impl InputStats {
    /// Adds the rows of `x` (`cols` wide) as the input of each of `names`.
    pub fn add(&self, names: &[String], x: &[f32], cols: usize) {
        if cols == 0 || x.is_empty() {
            return;
        }
        let mut sq = vec![0.0f64; cols];
        for row in x.chunks_exact(cols) {
            for (s, &v) in sq.iter_mut().zip(row) {
                *s += v as f64 * v as f64;
            }
        }
        let rows = (x.len() / cols) as u64;
        let mut sums = self.sums.lock().unwrap_or_else(|e| e.into_inner());
        for name in names {
            let (s, n) = sums.entry(name.clone()).or_insert_with(|| (vec![0.0; cols], 0));
            if s.len() == cols {
                s.iter_mut().zip(&sq).for_each(|(a, b)| *a += b);
                *n += rows;
            }
        }
    }

    /// Each matrix's rows seen and mean square input per column.
    pub fn means(&self) -> BTreeMap<String, (u64, Vec<f32>)> {
        let sums = self.sums.lock().unwrap_or_else(|e| e.into_inner());
        sums.iter()
            .filter(|(_, (_, n))| *n > 0)
            .map(|(k, (s, n))| (k.clone(), (*n, s.iter().map(|v| (v / *n as f64) as f32).collect())))
            .collect()
    }
}
