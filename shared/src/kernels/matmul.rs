//! The matrix multiply over a weight matrix in its stored type, and how it
//! is split across threads. Every output element is one dot product of the
//! kernel set (`Arch`) in a fixed order, whatever the thread count, the
//! batch size or the split, so results are bit-identical across all three.

use std::sync::OnceLock;

use half::f16;
use rayon::prelude::*;

use super::{Arch, Kernels};
use crate::quant::{
    dequant_q4, dequant_q4k, dequant_q5k, dequant_q6k, dequant_q8, ActQ8, ActRef, BlockQ4K, BlockQ4Kx8, BlockQ4_0,
    BlockQ4_0F32, BlockQ4_0x8, BlockQ5K, BlockQ6K, BlockQ6Kx8, BlockQ8_0, BlockQ8_0F32, BlockQ8_0x8, QK, QK_K, ROWS8,
};

/// Borrowed rows of a weight matrix, in their stored type.
#[derive(Clone, Copy)]
pub enum WeightData<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Q8_0(&'a [BlockQ8_0]),
    Q4_0(&'a [BlockQ4_0]),
    Q8_0F32(&'a [BlockQ8_0F32]),
    Q4_0F32(&'a [BlockQ4_0F32]),
    Q4K(&'a [BlockQ4K]),
    Q5K(&'a [BlockQ5K]),
    Q6K(&'a [BlockQ6K]),
}

/// Rows 0 .. ⌊rows/8⌋·8 of a Q8_0 / Q4_0 / Q4_K / Q6_K matrix again, in the
/// eight-row interleaved layout (the eight-row kernels): group g's block b
/// at g·nb + b, nb = cols/32 (Q8_0, Q4_0) or cols/256 (Q4_K, Q6_K).
#[derive(Clone, Copy)]
pub enum Packed<'a> {
    None,
    Q8(&'a [BlockQ8_0x8]),
    Q4(&'a [BlockQ4_0x8]),
    Q4K(&'a [BlockQ4Kx8]),
    Q6K(&'a [BlockQ6Kx8]),
}

/// A [rows, cols] weight matrix (row-major, cols contiguous).
#[derive(Clone, Copy)]
pub struct MatRef<'a> {
    pub rows: usize,
    pub cols: usize,
    pub data: WeightData<'a>,
    /// The same rows interleaved for the eight-row kernels, when repacked.
    pub packed: Packed<'a>,
}

impl<'a> MatRef<'a> {
    pub fn is_quantized(&self) -> bool {
        !matches!(self.data, WeightData::F32(_) | WeightData::F16(_))
    }

    /// Dot product of row `r` with one input row.
    #[inline]
    fn row_dot(&self, r: usize, x: &[f32], xq: ActRef) -> f32 {
        let (c, b, k) = (self.cols, self.cols / QK, self.cols / QK_K);
        match self.data {
            WeightData::F32(w) => Arch::dot_f32(&w[r * c..(r + 1) * c], x),
            WeightData::F16(w) => Arch::dot_f16_f32(&w[r * c..(r + 1) * c], x),
            WeightData::Q8_0(w) => Arch::dot_q8(&w[r * b..(r + 1) * b], xq),
            WeightData::Q8_0F32(w) => Arch::dot_q8(&w[r * b..(r + 1) * b], xq),
            WeightData::Q4_0(w) => Arch::dot_q4(&w[r * b..(r + 1) * b], xq),
            WeightData::Q4_0F32(w) => Arch::dot_q4(&w[r * b..(r + 1) * b], xq),
            WeightData::Q4K(w) => Arch::dot_q4k(&w[r * k..(r + 1) * k], xq),
            WeightData::Q5K(w) => Arch::dot_q5k(&w[r * k..(r + 1) * k], xq),
            WeightData::Q6K(w) => Arch::dot_q6k(&w[r * k..(r + 1) * k], xq),
        }
    }

    /// `row_dot` of row `r` with four input rows (`dot_q8_x4`, `dot_q4_x4`).
    #[inline]
    fn row_dot4(&self, r: usize, x: [&[f32]; 4], xq: [ActRef; 4]) -> [f32; 4] {
        let (b, k) = (self.cols / QK, self.cols / QK_K);
        match self.data {
            WeightData::Q8_0(w) => Arch::dot_q8_x4(&w[r * b..(r + 1) * b], xq),
            WeightData::Q8_0F32(w) => Arch::dot_q8_x4(&w[r * b..(r + 1) * b], xq),
            WeightData::Q4_0(w) => Arch::dot_q4_x4(&w[r * b..(r + 1) * b], xq),
            WeightData::Q4_0F32(w) => Arch::dot_q4_x4(&w[r * b..(r + 1) * b], xq),
            WeightData::Q4K(w) => Arch::dot_q4k_x4(&w[r * k..(r + 1) * k], xq),
            WeightData::Q5K(w) => Arch::dot_q5k_x4(&w[r * k..(r + 1) * k], xq),
            WeightData::Q6K(w) => Arch::dot_q6k_x4(&w[r * k..(r + 1) * k], xq),
            WeightData::F32(_) | WeightData::F16(_) => [0, 1, 2, 3].map(|t| self.row_dot(r, x[t], xq[t])),
        }
    }

    /// Blocks of the repacked rows r .. r + 8 in `packed`, if r starts a repacked group.
    #[inline]
    fn group_blocks(&self, r: usize) -> Option<std::ops::Range<usize>> {
        let (packed_len, b) = match self.packed {
            Packed::Q8(p) => (p.len(), self.cols / QK),
            Packed::Q4(p) => (p.len(), self.cols / QK),
            Packed::Q4K(p) => (p.len(), self.cols / QK_K),
            Packed::Q6K(p) => (p.len(), self.cols / QK_K),
            Packed::None => return None,
        };
        let g = r / ROWS8;
        (r.is_multiple_of(ROWS8) && (g + 1) * b <= packed_len).then(|| g * b..(g + 1) * b)
    }

    /// Rows r .. r + 8 with 1 to 4 input rows, if they are a repacked group:
    /// `put(k, t, value)` for row r + k and input row t, one kernel call
    /// for all of them (`dot_q8_r8` ... `dot_q8_r8_x4`), so the group's
    /// weights are read once; returns whether it was.
    #[inline]
    fn group_dots(&self, r: usize, xq: &[ActRef], mut put: impl FnMut(usize, usize, f32)) -> bool {
        let Some(blocks) = self.group_blocks(r) else { return false };
        macro_rules! call {
            ($p:expr, $one:ident, $x2:ident, $x3:ident, $x4:ident) => {{
                let p = &$p[blocks];
                let mut out = |v: &[[f32; 8]]| {
                    for (t, by_row) in v.iter().enumerate() {
                        for (k, &val) in by_row.iter().enumerate() {
                            put(k, t, val);
                        }
                    }
                };
                match *xq {
                    [a] => out(&[Arch::$one(p, a)]),
                    [a, b] => out(&Arch::$x2(p, [a, b])),
                    [a, b, c] => out(&Arch::$x3(p, [a, b, c])),
                    [a, b, c, d] => out(&Arch::$x4(p, [a, b, c, d])),
                    _ => unreachable!("group_dots: 1 to 4 input rows"),
                }
            }};
        }
        match self.packed {
            Packed::Q8(p) => call!(p, dot_q8_r8, dot_q8_r8_x2, dot_q8_r8_x3, dot_q8_r8_x4),
            Packed::Q4(p) => call!(p, dot_q4_r8, dot_q4_r8_x2, dot_q4_r8_x3, dot_q4_r8_x4),
            Packed::Q4K(p) => call!(p, dot_q4k_r8, dot_q4k_r8_x2, dot_q4k_r8_x3, dot_q4k_r8_x4),
            Packed::Q6K(p) => call!(p, dot_q6k_r8, dot_q6k_r8_x2, dot_q6k_r8_x3, dot_q6k_r8_x4),
            Packed::None => return false,
        }
        true
    }

    /// `Kernels::prefetch` of rows r .. r + n's weights (what a prompt
    /// tile reads next, fetched while the one before computes): the
    /// repacked groups when they are repacked, else the plain rows.
    fn prefetch_rows(&self, r: usize, n: usize) {
        /// Elements from .. from + len of `v` (as far as it goes) as bytes.
        fn part<T: bytemuck::Pod>(v: &[T], from: usize, len: usize) -> &[u8] {
            bytemuck::cast_slice(&v[from.min(v.len())..(from + len).min(v.len())])
        }
        let n = n.min(self.rows.saturating_sub(r));
        let (b, k) = (self.cols / QK, self.cols / QK_K);
        let bytes = match (self.packed, self.group_blocks(r)) {
            (Packed::Q8(p), Some(g)) => part(p, g.start, g.len() * n / ROWS8),
            (Packed::Q4(p), Some(g)) => part(p, g.start, g.len() * n / ROWS8),
            (Packed::Q4K(p), Some(g)) => part(p, g.start, g.len() * n / ROWS8),
            (Packed::Q6K(p), Some(g)) => part(p, g.start, g.len() * n / ROWS8),
            (Packed::None, _) => match self.data {
                WeightData::Q8_0(w) => part(w, r * b, n * b),
                WeightData::Q4_0(w) => part(w, r * b, n * b),
                WeightData::Q4K(w) => part(w, r * k, n * k),
                WeightData::Q5K(w) => part(w, r * k, n * k),
                WeightData::Q6K(w) => part(w, r * k, n * k),
                _ => return,
            },
            _ => return, // the rows after the last repacked group
        };
        Arch::prefetch(bytes);
    }

    /// Rows r .. r + 16 (two repacked groups) with tokens t0 .. t0 + n
    /// through the set's prompt tile kernels (`tile_q8`, `tile_q4`, `tile_q4k`),
    /// `Kernels::TILE_TOKENS` tokens a call: `put(i, t, value)` for row
    /// r + i and token t; returns whether it was (the set has tile kernels
    /// and both groups are repacked Q8_0 / Q4_0 / Q4_K ones).
    #[inline]
    fn prompt_tile<'x>(
        &self,
        r: usize,
        t0: usize,
        n: usize,
        one_token: &impl Fn(usize) -> (&'x [f32], ActRef<'x>),
        mut put: impl FnMut(usize, usize, f32),
    ) -> bool {
        if Arch::TILE_TOKENS == 0 || !matches!(self.packed, Packed::Q8(_) | Packed::Q4(_) | Packed::Q4K(_)) {
            return false;
        }
        let (Some(first), Some(_)) = (self.group_blocks(r), self.group_blocks(r + ROWS8)) else { return false };
        let (nb, blocks) = (first.len(), first.start..first.start + 2 * first.len());
        let mut out = [[0.0f32; 16]; Arch::TILE_TOKENS];
        let mut t = t0;
        while t < t0 + n {
            // (0 in a set without tile kernels, which never get here)
            #[allow(clippy::unnecessary_min_or_max)]
            let run = Arch::TILE_TOKENS.min(t0 + n - t);
            let xs: [ActRef; Arch::TILE_TOKENS] =
                std::array::from_fn(|j| if j < run { one_token(t + j).1 } else { ActRef::from(&[][..]) });
            match self.packed {
                Packed::Q8(p) => Arch::tile_q8(&p[blocks.clone()], nb, &xs[..run], &mut out[..run]),
                Packed::Q4(p) => Arch::tile_q4(&p[blocks.clone()], nb, &xs[..run], &mut out[..run]),
                Packed::Q4K(p) => Arch::tile_q4k(&p[blocks.clone()], nb, &xs[..run], &mut out[..run]),
                _ => unreachable!("prompt_tile: checked above"),
            }
            for (j, row) in out[..run].iter().enumerate() {
                for (i, &v) in row.iter().enumerate() {
                    put(i, t + j, v);
                }
            }
            t += run;
        }
        true
    }

    /// Row `r` as f32 (embedding lookup).
    pub fn row_to_f32(&self, r: usize, out: &mut [f32]) {
        let (c, b, k) = (self.cols, self.cols / QK, self.cols / QK_K);
        match self.data {
            WeightData::F32(w) => out.copy_from_slice(&w[r * c..(r + 1) * c]),
            WeightData::F16(w) => Arch::f16_to_f32(&w[r * c..(r + 1) * c], out),
            WeightData::Q8_0(w) => dequant_q8(&w[r * b..(r + 1) * b], out),
            WeightData::Q8_0F32(w) => dequant_q8(&w[r * b..(r + 1) * b], out),
            WeightData::Q4_0(w) => dequant_q4(&w[r * b..(r + 1) * b], out),
            WeightData::Q4_0F32(w) => dequant_q4(&w[r * b..(r + 1) * b], out),
            WeightData::Q4K(w) => dequant_q4k(&w[r * k..(r + 1) * k], out),
            WeightData::Q5K(w) => dequant_q5k(&w[r * k..(r + 1) * k], out),
            WeightData::Q6K(w) => dequant_q6k(&w[r * k..(r + 1) * k], out),
        }
    }
}

/// A batch of input rows [n_tokens][cols] plus, computed once on demand,
/// their Q8 quantisation for quantised weights.
pub struct Input<'a> {
    pub x: &'a [f32],
    pub cols: usize,
    q8: OnceLock<ActQ8>,
}

impl<'a> Input<'a> {
    pub fn new(x: &'a [f32], cols: usize) -> Self {
        debug_assert_eq!(x.len() % cols, 0);
        Input { x, cols, q8: OnceLock::new() }
    }
    pub fn n_tokens(&self) -> usize {
        self.x.len() / self.cols
    }
    fn q8(&self) -> ActRef<'_> {
        self.q8.get_or_init(|| ActQ8::quantize(self.x)).as_ref()
    }
}

/// Rows of a weight tile in a prompt matmul: two repacked groups of eight,
/// whose weights stay in L1/L2 while they are applied to a run of tokens
/// (`prompt_tile`'s kernels take exactly these 16 rows).
const ROW_TILE: usize = 16;

/// out[t][r] = Σ_c w[r][c] · x[t][c] for every token t of `input`.
///
/// Each output element is one dot of row r with token t (`row_dot`, or its
/// row's lane of `group_dots` / `prompt_tile` for repacked rows, which are
/// bit-identical to it), whatever the thread count or batch size, so
/// results are bit-identical across both.
pub fn matmul(w: &MatRef, input: &Input, out: &mut [f32]) {
    matmul_group(&mut [(w, out)], input);
}

/// Several matmuls sharing one input (q/k/v, gate/up).
///
/// A short batch (one token, or the few tokens of a batched decode step)
/// runs in one parallel region: the rows of all matrices are cut into a few
/// contiguous chunks per thread (multiples of eight rows, so repacked groups
/// stay whole), and each task streams its rows once for all the tokens. A
/// long batch (a prompt) is cut into runs of tokens, each task walking all
/// row tiles for its run, one matrix after another. Either way every output
/// element is one dot as in `matmul`.
pub fn matmul_group(items: &mut [(&MatRef, &mut [f32])], input: &Input) {
    let n_tok = input.n_tokens();
    for (w, out) in items.iter() {
        assert_eq!(input.cols, w.cols, "matmul: input width does not match the weight matrix");
        assert_eq!(out.len(), n_tok * w.rows);
    }
    let any_quantized = items.iter().any(|(w, _)| w.is_quantized());
    let empty = ActQ8::default();
    let xq = if any_quantized { input.q8() } else { empty.as_ref() };
    let cols = input.cols;
    let bpr = cols / QK; // activation blocks per token
    let one_token = |t: usize| -> (&[f32], ActRef) {
        let x = &input.x[t * cols..(t + 1) * cols];
        let q = if xq.is_empty() { xq } else { xq.range(t * bpr, (t + 1) * bpr) };
        (x, q)
    };
    let threads = rayon::current_num_threads();
    // Tokens per task when a batch is split by tokens: a multiple of 4, about
    // four tasks per thread, at most 64 (their activations stay in L2).
    let token_chunk = n_tok.div_ceil(threads * 4).next_multiple_of(4).clamp(16, 64);
    if n_tok.div_ceil(token_chunk) < 2 * threads {
        short_batch(items, n_tok, &one_token);
        return;
    }
    for (w, out) in items.iter_mut() {
        // Long batch: each task takes a run of tokens and walks all rows in
        // tiles, each tile's weights reused by the run's tokens while in
        // cache; it writes its own [tokens][rows] part of `out`.
        let rows = w.rows;
        out.par_chunks_mut(token_chunk * rows).enumerate().for_each(|(chunk, o)| {
            let t0 = chunk * token_chunk;
            let n = o.len() / rows;
            for r0 in (0..rows).step_by(ROW_TILE) {
                let tile_rows = ROW_TILE.min(rows - r0);
                w.prefetch_rows(r0 + ROW_TILE, ROW_TILE);
                let mut put = |i: usize, t: usize, v: f32| o[(t - t0) * rows + r0 + i] = v;
                if !(tile_rows == ROW_TILE && w.prompt_tile(r0, t0, n, &one_token, &mut put)) {
                    tile_dots(w, r0, tile_rows, t0, n, &one_token, put);
                }
            }
        });
    }
}

/// `matmul_group` for a few tokens: contiguous row chunks of every matrix,
/// all in one parallel region. One token writes straight into `out`; more
/// go through a [tokens][chunk rows] buffer per task, copied out after.
fn short_batch<'a>(
    items: &mut [(&MatRef, &mut [f32])],
    n_tok: usize,
    one_token: &(impl Fn(usize) -> (&'a [f32], ActRef<'a>) + Sync),
) {
    let total_rows: usize = items.iter().map(|(w, _)| w.rows).sum();
    // a multiple of 8, so that repacked groups are never split
    let chunk = (total_rows / (rayon::current_num_threads() * 4)).max(ROW_TILE).next_multiple_of(ROWS8);
    if n_tok == 1 {
        let mut tasks: Vec<(&MatRef, usize, &mut [f32])> = Vec::new();
        for (w, out) in items.iter_mut() {
            for (i, o) in out.chunks_mut(chunk).enumerate() {
                tasks.push((*w, i * chunk, o));
            }
        }
        tasks.into_par_iter().for_each(|(w, r0, o)| {
            let len = o.len();
            tile_dots(w, r0, len, 0, 1, one_token, |i, _, v| o[i] = v);
        });
        return;
    }
    let mut tasks: Vec<(usize, usize, usize)> = Vec::new(); // (item, first row, rows)
    for (k, (w, _)) in items.iter().enumerate() {
        for r0 in (0..w.rows).step_by(chunk) {
            tasks.push((k, r0, chunk.min(w.rows - r0)));
        }
    }
    let mats: Vec<&MatRef> = items.iter().map(|(w, _)| *w).collect();
    let results: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&(k, r0, len)| {
            // Tiles of rows, each tile's weights read once from memory for all the tokens.
            let mut buf = vec![0.0f32; n_tok * len];
            for r in (0..len).step_by(ROW_TILE) {
                let tile = ROW_TILE.min(len - r);
                tile_dots(mats[k], r0 + r, tile, 0, n_tok, one_token, |i, t, v| buf[t * len + r + i] = v);
            }
            buf
        })
        .collect();
    for (&(k, r0, len), buf) in tasks.iter().zip(&results) {
        let (w, out) = &mut items[k];
        for (t, part) in buf.chunks_exact(len).enumerate() {
            out[t * w.rows + r0..][..len].copy_from_slice(part);
        }
    }
}

/// Rows r0 .. r0 + rows of `w` against tokens t0 .. t0 + n: `put(i, t,
/// value)` for row r0 + i and token t. Runs of four tokens, then the last
/// one to three together; repacked groups of eight rows take a run in one
/// kernel call (`group_dots`), other rows go row by row (`row_dot4` for
/// four tokens, else `row_dot` per token): every value is bit-identical
/// whichever way it is computed.
#[inline]
fn tile_dots<'a>(
    w: &MatRef,
    r0: usize,
    rows: usize,
    t0: usize,
    n: usize,
    one_token: &impl Fn(usize) -> (&'a [f32], ActRef<'a>),
    mut put: impl FnMut(usize, usize, f32),
) {
    let mut t = t0;
    while t < t0 + n {
        let run = 4.min(t0 + n - t);
        let mut x: [&[f32]; 4] = [&[]; 4];
        let mut q: [ActRef; 4] = [ActRef::from(&[][..]); 4];
        for j in 0..run {
            (x[j], q[j]) = one_token(t + j);
        }
        let mut i = 0;
        while i < rows {
            if i + ROWS8 <= rows && w.group_dots(r0 + i, &q[..run], |k, j, v| put(i + k, t + j, v)) {
                i += ROWS8;
            } else if run == 4 {
                for (j, val) in w.row_dot4(r0 + i, x, q).into_iter().enumerate() {
                    put(i, t + j, val);
                }
                i += 1;
            } else {
                for j in 0..run {
                    put(i, t + j, w.row_dot(r0 + i, x[j], q[j]));
                }
                i += 1;
            }
        }
        t += run;
    }
}
