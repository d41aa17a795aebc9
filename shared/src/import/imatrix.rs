//! Importance matrices: per weight matrix (by its `.mlb` name), the mean
//! square of each input column over a calibration text, as
//! `Model::record_inputs` measures it. The file (`--imatrix-out`, read by
//! `--imatrix` and `tools/convert.py --imatrix`) is little-endian:
//!
//! ```text
//! "KRAFLA-IMATRIX-1\n"  u32 entries
//! per entry: u32 name bytes, name (UTF-8), u64 rows seen, u32 columns, f32 × columns
//! ```
//!
//! The entries are in the byte order of their names, each name once.

use std::collections::BTreeMap;

const MAGIC: &[u8] = b"KRAFLA-IMATRIX-1\n";

/// Matrix name → (rows seen, mean square per column).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Imatrix {
    pub entries: BTreeMap<String, (u64, Vec<f32>)>,
}

impl Imatrix {
    /// The weights for matrix `name` if it has `cols` of them.
    pub fn weights(&self, name: &str, cols: usize) -> Option<&[f32]> {
        self.entries.get(name).map(|(_, w)| &w[..]).filter(|w| w.len() == cols)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend((self.entries.len() as u32).to_le_bytes());
        for (name, (rows, w)) in &self.entries {
            out.extend((name.len() as u32).to_le_bytes());
            out.extend(name.as_bytes());
            out.extend(rows.to_le_bytes());
            out.extend((w.len() as u32).to_le_bytes());
            w.iter().for_each(|v| out.extend(v.to_le_bytes()));
        }
        out
    }

    /// Reads a file's bytes; every count is checked against what is left,
    /// and the weights must be finite and not negative.
    pub fn from_bytes(b: &[u8]) -> Result<Imatrix, String> {
        let mut rest = b.strip_prefix(MAGIC).ok_or("not a Krafla importance matrix (bad magic)")?;
        let mut take = |n: usize| -> Result<&[u8], String> {
            if rest.len() < n {
                return Err("importance matrix is truncated".into());
            }
            let (head, tail) = rest.split_at(n);
            rest = tail;
            Ok(head)
        };
        let u32_of = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize;
        let n = u32_of(take(4)?);
        let mut entries = BTreeMap::new();
        for _ in 0..n {
            let len = u32_of(take(4)?);
            let name = std::str::from_utf8(take(len)?).map_err(|_| "importance matrix: a name is not UTF-8")?;
            if entries.last_key_value().is_some_and(|(last, _): (&String, _)| last.as_str() >= name) {
                return Err(format!("importance matrix: {name:?} is out of order or repeated (names are sorted)"));
            }
            let rows = u64::from_le_bytes(take(8)?.try_into().expect("8 bytes"));
            let cols = u32_of(take(4)?);
            let raw = take(cols.checked_mul(4).ok_or("importance matrix is truncated")?)?;
            let w: Vec<f32> = raw.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect();
            if w.iter().any(|v| !v.is_finite() || *v < 0.0) {
                return Err(format!("importance matrix: {name:?} has a negative or non-finite weight"));
            }
            entries.insert(name.to_string(), (rows, w));
        }
        if !rest.is_empty() {
            return Err("importance matrix has trailing bytes".into());
        }
        Ok(Imatrix { entries })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Imatrix {
        let mut entries = BTreeMap::new();
        entries.insert("blk.0.attn_q".to_string(), (512, vec![0.5, 1.0, 0.0, 3.25]));
        entries.insert("blk.0.ffn_down".to_string(), (7, (0..64).map(|i| i as f32 / 8.0).collect()));
        Imatrix { entries }
    }

    #[test]
    fn writes_and_reads_back() {
        let m = sample();
        assert_eq!(Imatrix::from_bytes(&m.to_bytes()).unwrap(), m);
        assert_eq!(m.weights("blk.0.attn_q", 4), Some(&[0.5, 1.0, 0.0, 3.25][..]));
        assert_eq!(m.weights("blk.0.attn_q", 8), None, "a matrix of another width gets no weights");
        assert_eq!(m.weights("blk.1.attn_q", 4), None);
    }

    #[test]
    fn every_cut_and_bad_value_is_an_error() {
        let bytes = sample().to_bytes();
        for n in 0..bytes.len() {
            assert!(Imatrix::from_bytes(&bytes[..n]).is_err(), "cut at {n}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(Imatrix::from_bytes(&long).unwrap_err().contains("trailing"));
        for bad in [-1.0f32, f32::NAN, f32::INFINITY] {
            let mut m = sample();
            m.entries.get_mut("blk.0.attn_q").unwrap().1[2] = bad;
            assert!(Imatrix::from_bytes(&m.to_bytes()).unwrap_err().contains("negative or non-finite"));
        }
        // a count far beyond the file is refused before anything is allocated for it
        let mut huge = MAGIC.to_vec();
        huge.extend(1u32.to_le_bytes());
        huge.extend(1u32.to_le_bytes());
        huge.push(b'x');
        huge.extend(1u64.to_le_bytes());
        huge.extend(u32::MAX.to_le_bytes());
        assert!(Imatrix::from_bytes(&huge).unwrap_err().contains("truncated"));
    }

    /// Found by the `imatrix` fuzz target: names out of order (or twice) would not write back
    /// to the same bytes, and a repeated name would silently replace the first.
    #[test]
    fn names_must_be_sorted_and_distinct() {
        let entry = |name: &str| {
            let mut b = (name.len() as u32).to_le_bytes().to_vec();
            b.extend(name.as_bytes());
            b.extend(1u64.to_le_bytes());
            b.extend(1u32.to_le_bytes());
            b.extend(1.0f32.to_le_bytes());
            b
        };
        let file = |names: &[&str]| {
            let mut b = MAGIC.to_vec();
            b.extend((names.len() as u32).to_le_bytes());
            names.iter().for_each(|n| b.extend(entry(n)));
            b
        };
        assert!(Imatrix::from_bytes(&file(&["a", "b"])).is_ok());
        for bad in [&["b", "a"][..], &["a", "a"]] {
            let e = Imatrix::from_bytes(&file(bad)).unwrap_err();
            assert!(e.contains("out of order or repeated"), "{e}");
        }
    }
}
