//! Rank-ordered BPE merging, O(n log n) in the number of initial symbols.
//!
//! This reproduces Hugging Face `tokenizers`' `Word::merge_all`: symbols live in a doubly
//! linked list, candidate pairs in a min-heap ordered by (merge rank, position). A popped
//! candidate is applied only if it is still current (both symbols alive and the pair still
//! maps to the same merged id); each merge pushes the two new neighbouring pairs.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// Multiplicative hasher for the packed `u64` pair keys (FxHash constant). The keys are
/// token ids from a local file, so HashDoS resistance is not needed; speed is.
#[derive(Default, Clone, Copy)]
pub struct PairHasher(u64);

impl Hasher for PairHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

/// Merge table: packed (left, right) -> (rank, merged id).
pub type MergeMap = HashMap<u64, (u32, u32), BuildHasherDefault<PairHasher>>;

/// Pack an id pair into a map key.
pub fn pair_key(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

const NONE: usize = usize::MAX;

/// One symbol of the word being merged.
#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    prev: usize,
    next: usize,
    alive: bool,
}

/// Merge `ids` (the initial symbols of one pre-tokenized word) and append the result to `out`.
pub fn merge_word(ids: &[u32], merges: &MergeMap, out: &mut Vec<u32>) {
    if ids.len() < 2 {
        out.extend_from_slice(ids);
        return;
    }
    let mut sym: Vec<Symbol> = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| Symbol {
            id,
            prev: if i == 0 { NONE } else { i - 1 },
            next: if i + 1 == ids.len() { NONE } else { i + 1 },
            alive: true,
        })
        .collect();
    // Heap entries: Reverse((rank, position, merged id)) -> lowest rank, then leftmost.
    let mut heap: BinaryHeap<Reverse<(u32, usize, u32)>> = BinaryHeap::with_capacity(ids.len());
    for (pos, w) in ids.windows(2).enumerate() {
        if let Some(&(rank, new_id)) = merges.get(&pair_key(w[0], w[1])) {
            heap.push(Reverse((rank, pos, new_id)));
        }
    }
    while let Some(Reverse((_, pos, new_id))) = heap.pop() {
        let cur = sym[pos];
        if !cur.alive || cur.next == NONE {
            continue;
        }
        let right = sym[cur.next];
        match merges.get(&pair_key(cur.id, right.id)) {
            Some(&(_, id)) if id == new_id => {}
            _ => continue, // stale entry
        }
        sym[pos].id = new_id;
        sym[pos].next = right.next;
        sym[cur.next].alive = false;
        if right.next != NONE {
            sym[right.next].prev = pos;
        }
        if cur.prev != NONE {
            if let Some(&(rank, id)) = merges.get(&pair_key(sym[cur.prev].id, new_id)) {
                heap.push(Reverse((rank, cur.prev, id)));
            }
        }
        if right.next != NONE {
            if let Some(&(rank, id)) = merges.get(&pair_key(new_id, sym[right.next].id)) {
                heap.push(Reverse((rank, pos, id)));
            }
        }
    }
    out.extend(sym.iter().filter(|s| s.alive).map(|s| s.id));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(entries: &[((u32, u32), u32)]) -> MergeMap {
        entries.iter().enumerate().map(|(rank, &((a, b), id))| (pair_key(a, b), (rank as u32, id))).collect()
    }

    #[test]
    fn merges_by_rank_then_position() {
        // a=0 b=1 ab=2 bb=3; "bb" outranks "ab": a b b -> a bb (not ab b).
        let m = table(&[((1, 1), 3), ((0, 1), 2)]);
        let mut out = vec![];
        merge_word(&[0, 1, 1], &m, &mut out);
        assert_eq!(out, vec![0, 3]);
        // Equal rank: leftmost first: b b b -> bb b.
        out.clear();
        merge_word(&[1, 1, 1], &m, &mut out);
        assert_eq!(out, vec![3, 1]);
    }

    #[test]
    fn long_run_is_fast() {
        // "aaaa..." with a -> aa -> aaaa chains: must finish quickly on 200k symbols.
        let m = table(&[((0, 0), 1), ((1, 1), 2)]);
        let mut out = vec![];
        merge_word(&vec![0; 200_000], &m, &mut out);
        assert_eq!(out, vec![2; 50_000]);
    }
}
