//! The matrix multiply over a weight matrix in its stored type, and how it
//! is split across threads. Every output element is one dot product of the
//! kernel set (`Arch`) in a fixed order, whatever the thread count, the
//! batch size or the split, so results are bit-identical across all three.

use std::sync::OnceLock;

use half::f16;

use super::{Arch, Kernels};
use crate::pool;
use crate::quant::{
    dequant_mxfp4, dequant_q4, dequant_q4k, dequant_q5k, dequant_q6k, dequant_q8, ActQ8, ActRef, BlockMxfp4,
    BlockMxfp4x8, BlockQ4K, BlockQ4Kx8, BlockQ4_0, BlockQ4_0F32, BlockQ4_0x8, BlockQ5K, BlockQ5Kx8, BlockQ6K,
    BlockQ6Kx8, BlockQ8_0, BlockQ8_0F32, BlockQ8_0x8, QK, QK_K, ROWS8,
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
    Mxfp4(&'a [BlockMxfp4]),
}

/// Rows 0 .. ⌊rows/8⌋·8 of a Q8_0 / Q4_0 / Q4_K / Q5_K / Q6_K / MXFP4 matrix
/// again, in the eight-row interleaved layout (the eight-row kernels): group
/// g's block b at g·nb + b, nb = cols/32 (Q8_0, Q4_0, MXFP4) or cols/256
/// (K-quants).
#[derive(Clone, Copy)]
pub enum Packed<'a> {
    None,
    Q8(&'a [BlockQ8_0x8]),
    Q4(&'a [BlockQ4_0x8]),
    Q4K(&'a [BlockQ4Kx8]),
    Q5K(&'a [BlockQ5Kx8]),
    Q6K(&'a [BlockQ6Kx8]),
    Mxfp4(&'a [BlockMxfp4x8]),
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

    /// Rows r0 .. r0 + n as a matrix of their own (one expert of the
    /// experts' matrices stacked in one tensor): the same bytes, its plain
    /// rows and, when r0 and n are whole groups, its eight-row groups.
    pub fn rows(&self, r0: usize, n: usize) -> MatRef<'a> {
        fn part<T>(v: &[T], per_row: usize, r0: usize, n: usize) -> &[T] {
            &v[(r0 * per_row).min(v.len())..((r0 + n) * per_row).min(v.len())]
        }
        let (c, b, k) = (self.cols, self.cols / QK, self.cols / QK_K);
        let data = match self.data {
            WeightData::F32(w) => WeightData::F32(part(w, c, r0, n)),
            WeightData::F16(w) => WeightData::F16(part(w, c, r0, n)),
            WeightData::Q8_0(w) => WeightData::Q8_0(part(w, b, r0, n)),
            WeightData::Q4_0(w) => WeightData::Q4_0(part(w, b, r0, n)),
            WeightData::Q8_0F32(w) => WeightData::Q8_0F32(part(w, b, r0, n)),
            WeightData::Q4_0F32(w) => WeightData::Q4_0F32(part(w, b, r0, n)),
            WeightData::Q4K(w) => WeightData::Q4K(part(w, k, r0, n)),
            WeightData::Q5K(w) => WeightData::Q5K(part(w, k, r0, n)),
            WeightData::Mxfp4(w) => WeightData::Mxfp4(part(w, b, r0, n)),
            WeightData::Q6K(w) => WeightData::Q6K(part(w, k, r0, n)),
        };
        let whole = r0.is_multiple_of(ROWS8) && n.is_multiple_of(ROWS8);
        let (g0, gn) = (r0 / ROWS8, n / ROWS8);
        let packed = match self.packed {
            Packed::Q8(p) if whole => Packed::Q8(part(p, b, g0, gn)),
            Packed::Q4(p) if whole => Packed::Q4(part(p, b, g0, gn)),
            Packed::Q4K(p) if whole => Packed::Q4K(part(p, k, g0, gn)),
            Packed::Q5K(p) if whole => Packed::Q5K(part(p, k, g0, gn)),
            Packed::Q6K(p) if whole => Packed::Q6K(part(p, k, g0, gn)),
            Packed::Mxfp4(p) if whole => Packed::Mxfp4(part(p, b, g0, gn)),
            _ => Packed::None,
        };
        MatRef { rows: n, cols: self.cols, data, packed }
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
            WeightData::Mxfp4(w) => Arch::dot_mxfp4(&w[r * b..(r + 1) * b], xq),
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
            WeightData::Mxfp4(w) => Arch::dot_mxfp4_x4(&w[r * b..(r + 1) * b], xq),
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
            Packed::Q5K(p) => (p.len(), self.cols / QK_K),
            Packed::Q6K(p) => (p.len(), self.cols / QK_K),
            Packed::Mxfp4(p) => (p.len(), self.cols / QK),
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
            Packed::Q5K(p) => call!(p, dot_q5k_r8, dot_q5k_r8_x2, dot_q5k_r8_x3, dot_q5k_r8_x4),
            Packed::Q6K(p) => call!(p, dot_q6k_r8, dot_q6k_r8_x2, dot_q6k_r8_x3, dot_q6k_r8_x4),
            Packed::Mxfp4(p) => call!(p, dot_mxfp4_r8, dot_mxfp4_r8_x2, dot_mxfp4_r8_x3, dot_mxfp4_r8_x4),
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
            (Packed::Q5K(p), Some(g)) => part(p, g.start, g.len() * n / ROWS8),
            (Packed::Q6K(p), Some(g)) => part(p, g.start, g.len() * n / ROWS8),
            (Packed::Mxfp4(p), Some(g)) => part(p, g.start, g.len() * n / ROWS8),
            (Packed::None, _) => match self.data {
                WeightData::Q8_0(w) => part(w, r * b, n * b),
                WeightData::Q4_0(w) => part(w, r * b, n * b),
                WeightData::Q4K(w) => part(w, r * k, n * k),
                WeightData::Q5K(w) => part(w, r * k, n * k),
                WeightData::Mxfp4(w) => part(w, r * b, n * b),
                WeightData::Q6K(w) => part(w, r * k, n * k),
                _ => return,
            },
            _ => return, // the rows after the last repacked group
        };
        Arch::prefetch(bytes);
    }

    /// Rows r .. r + 16 (two repacked groups) with tokens t0 .. t0 + n
    /// through the set's prompt tile kernels (`tile_q8`, `tile_q4`, `tile_q4k`, `tile_q5k`, `tile_q6k`, `tile_mxfp4`),
    /// `Kernels::TILE_TOKENS` tokens a call: `put(0, t, values)` with the 16
    /// rows' values for token t; returns whether it was (the set has tile kernels
    /// and both groups are repacked Q8_0 / Q4_0 / Q4_K / Q5_K / Q6_K / MXFP4 ones).
    #[inline]
    fn prompt_tile<'x>(
        &self,
        r: usize,
        t0: usize,
        n: usize,
        one_token: &impl Fn(usize) -> (&'x [f32], ActRef<'x>),
        mut put: impl FnMut(usize, usize, &[f32]),
    ) -> bool {
        if Arch::TILE_TOKENS == 0 || matches!(self.packed, Packed::None) {
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
                Packed::Q5K(p) => Arch::tile_q5k(&p[blocks.clone()], nb, &xs[..run], &mut out[..run]),
                Packed::Q6K(p) => Arch::tile_q6k(&p[blocks.clone()], nb, &xs[..run], &mut out[..run]),
                Packed::Mxfp4(p) => Arch::tile_mxfp4(&p[blocks.clone()], nb, &xs[..run], &mut out[..run]),
                _ => unreachable!("prompt_tile: checked above"),
            }
            for (j, row) in out[..run].iter().enumerate() {
                put(0, t + j, row);
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
            WeightData::Mxfp4(w) => dequant_mxfp4(&w[r * b..(r + 1) * b], out),
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

/// Several matmuls sharing one input (q/k/v, gate/up): `matmul_each`
/// with the same input for every matrix.
pub fn matmul_group(items: &mut [(&MatRef, &mut [f32])], input: &Input) {
    let mut each: Vec<(&MatRef, &Input, &mut [f32])> = items.iter_mut().map(|(w, o)| (*w, input, &mut **o)).collect();
    matmul_each(&mut each);
}

/// The input rows of one matmul as the kernels take them, token by token.
#[derive(Clone, Copy)]
struct Tokens<'a> {
    x: &'a [f32],
    /// Empty when no matrix that reads this input is quantised.
    xq: ActRef<'a>,
    cols: usize,
}

impl<'a> Tokens<'a> {
    fn n(&self) -> usize {
        self.x.len() / self.cols
    }
    /// Token t's row and its Q8 blocks.
    fn get(&self, t: usize) -> (&'a [f32], ActRef<'a>) {
        let x = &self.x[t * self.cols..(t + 1) * self.cols];
        let bpr = self.cols / QK;
        let q = if self.xq.is_empty() { self.xq } else { self.xq.range(t * bpr, (t + 1) * bpr) };
        (x, q)
    }
}

/// Several matmuls, each with its own input (the experts of a
/// Mixture-of-Experts layer, each over the tokens routed to it; or, through
/// `matmul_group`, one input shared).
///
/// The matrices with a short batch (one token, or the few tokens of a
/// decode step or of an expert's share) run in one parallel region: their
/// rows are cut into a few contiguous chunks per thread (multiples of eight
/// rows, so repacked groups stay whole), and each task streams its rows
/// once for all its tokens. A matrix with a long batch (a prompt) is cut
/// into runs of tokens, each task walking all row tiles for its run. Either
/// way every output element is one dot as in `matmul`.
pub fn matmul_each(items: &mut [(&MatRef, &Input, &mut [f32])]) {
    for (w, input, out) in items.iter() {
        assert_eq!(input.cols, w.cols, "matmul: input width does not match the weight matrix");
        assert_eq!(out.len(), input.n_tokens() * w.rows);
    }
    // each input quantised once, by the first quantised matrix that reads it
    let empty = ActQ8::default();
    let tokens: Vec<Tokens> = items
        .iter()
        .map(|(w, input, _)| {
            let xq = if w.is_quantized() { input.q8() } else { empty.as_ref() };
            Tokens { x: input.x, xq, cols: input.cols }
        })
        .collect();
    let threads = pool::threads();
    // Tokens per task when a batch is split by tokens: a multiple of 4, about
    // four tasks per thread, at most 64 (their activations stay in L2).
    let token_chunk = |n_tok: usize| n_tok.div_ceil(threads * 4).next_multiple_of(4).clamp(16, 64);
    let is_long = |n_tok: usize| n_tok.div_ceil(token_chunk(n_tok)) >= 2 * threads;
    let mut short: Vec<(&MatRef, Tokens, &mut [f32])> = Vec::new();
    for ((w, _, out), tok) in items.iter_mut().zip(&tokens) {
        let n_tok = tok.n();
        if n_tok == 0 {
            continue;
        }
        if !is_long(n_tok) {
            short.push((*w, *tok, &mut **out));
            continue;
        }
        // Long batch: each task takes a run of tokens and walks all rows in
        // tiles, each tile's weights reused by the run's tokens while in
        // cache; it writes its own [tokens][rows] part of `out`.
        let (rows, chunk_tokens) = (w.rows, token_chunk(n_tok));
        let one_token = |t: usize| tok.get(t);
        pool::chunks_mut(out, chunk_tokens * rows, 1, |chunk, o| {
            let t0 = chunk * chunk_tokens;
            let n = o.len() / rows;
            for r0 in (0..rows).step_by(ROW_TILE) {
                w.prefetch_rows(r0 + ROW_TILE, ROW_TILE);
                let put = |i: usize, t: usize, v: &[f32]| o[(t - t0) * rows + r0 + i..][..v.len()].copy_from_slice(v);
                tile_dots(w, r0, ROW_TILE.min(rows - r0), t0, n, &one_token, put, true);
            }
        });
    }
    if !short.is_empty() {
        short_batch(&mut short);
    }
}

/// `matmul_each` for matrices with a few tokens each: contiguous row chunks
/// of every matrix, all in one parallel region. When every matrix has one
/// token, tasks write straight into `out`; else each goes through a
/// [tokens][chunk rows] buffer, copied out after.
fn short_batch(items: &mut [(&MatRef, Tokens, &mut [f32])]) {
    let total_rows: usize = items.iter().map(|(w, _, _)| w.rows).sum();
    // a multiple of 8, so that repacked groups are never split
    let chunk = (total_rows / (pool::threads() * 4)).max(ROW_TILE).next_multiple_of(ROWS8);
    if items.iter().all(|(_, tok, _)| tok.n() == 1) {
        let mut tasks: Vec<(&MatRef, Tokens, usize, &mut [f32])> = Vec::new();
        for (w, tok, out) in items.iter_mut() {
            for (i, o) in out.chunks_mut(chunk).enumerate() {
                tasks.push((*w, *tok, i * chunk, o));
            }
        }
        pool::each_mut(&mut tasks, |(w, tok, r0, o)| {
            let len = o.len();
            tile_dots(w, *r0, len, 0, 1, &|t| tok.get(t), |i, _, v| o[i..][..v.len()].copy_from_slice(v), false);
        });
        return;
    }
    let mut tasks: Vec<(usize, usize, usize)> = Vec::new(); // (item, first row, rows)
    for (k, (w, _, _)) in items.iter().enumerate() {
        for r0 in (0..w.rows).step_by(chunk) {
            tasks.push((k, r0, chunk.min(w.rows - r0)));
        }
    }
    let mats: Vec<(&MatRef, Tokens)> = items.iter().map(|(w, tok, _)| (*w, *tok)).collect();
    let results: Vec<Vec<f32>> = pool::map(tasks.len(), |task| {
        let (k, r0, len) = tasks[task];
        // Tiles of rows, each tile's weights read once from memory for all the tokens.
        let (w, tok) = mats[k];
        let n_tok = tok.n();
        let mut buf = vec![0.0f32; n_tok * len];
        let tiles = n_tok >= TILE_MIN_TOKENS;
        for r in (0..len).step_by(ROW_TILE) {
            if tiles && r + ROW_TILE < len {
                w.prefetch_rows(r0 + r + ROW_TILE, ROW_TILE);
            }
            let put = |i: usize, t: usize, v: &[f32]| buf[t * len + r + i..][..v.len()].copy_from_slice(v);
            tile_dots(w, r0 + r, ROW_TILE.min(len - r), 0, n_tok, &|t| tok.get(t), put, tiles);
        }
        buf
    });
    for (&(k, r0, len), buf) in tasks.iter().zip(&results) {
        let (w, _, out) = &mut items[k];
        for (t, part) in buf.chunks_exact(len).enumerate() {
            out[t * w.rows + r0..][..len].copy_from_slice(part);
        }
    }
}

/// Tokens in a short batch from which a matrix's rows go through the prompt
/// tile kernels (`MatRef::prompt_tile`) rather than the eight-row dots.
/// Measured on the 1.5B Q4_K_M file (avx512vnni, 2 threads, `--bench -pp
/// N`): tiles 64.6 against 74.5 tokens/s at 8 tokens, level at 16 (86.4
/// against 84.7), ahead at 32 (102.6 against 85.7) and 48 (107.5 against
/// 91.6): a prompt chunk or a server step with a prompt in it.
const TILE_MIN_TOKENS: usize = 16;

/// Rows r0 .. r0 + rows of `w` against tokens t0 .. t0 + n: `put(i, t,
/// values)` for rows r0 + i, r0 + i + 1, ... and token t (a prompt tile's
/// sixteen rows in one call, else one value). Runs of four tokens, then the last
/// one to three together; repacked groups of eight rows take a run in one
/// kernel call (`group_dots`), other rows go row by row (`row_dot4` for
/// four tokens, else `row_dot` per token); with `tiles`, a whole tile of
/// repacked rows goes through the prompt tile kernels instead
/// (`MatRef::prompt_tile`): every value is bit-identical whichever way it
/// is computed.
#[allow(clippy::too_many_arguments)]
#[inline]
fn tile_dots<'a>(
    w: &MatRef,
    r0: usize,
    rows: usize,
    t0: usize,
    n: usize,
    one_token: &impl Fn(usize) -> (&'a [f32], ActRef<'a>),
    mut put: impl FnMut(usize, usize, &[f32]),
    tiles: bool,
) {
    if tiles && rows == ROW_TILE && w.prompt_tile(r0, t0, n, one_token, &mut put) {
        return;
    }
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
            if i + ROWS8 <= rows && w.group_dots(r0 + i, &q[..run], |k, j, v| put(i + k, t + j, &[v])) {
                i += ROWS8;
            } else if run == 4 {
                for (j, val) in w.row_dot4(r0 + i, x, q).into_iter().enumerate() {
                    put(i, t + j, &[val]);
                }
                i += 1;
            } else {
                for j in 0..run {
                    put(i, t + j, &[w.row_dot(r0 + i, x[j], q[j])]);
                }
                i += 1;
            }
        }
        t += run;
    }
}
