"""Krafla `.mlb` model files: writer, reader and the block quantisers.

The layout is specified in docs/FORMAT.md (section `.mlb`). This module is
used by tools/convert.py (writing), tools/reference_forward.py (reading),
tools/q4_experiment.py and the tests (reading and quantisation round trips).

Quantisation (blocks of 32 along the last dim):
  Q8_0  d = max|x| / 127, q = round(x / d)                      (llama.cpp rule)
  Q4_0  "max": d = m / -8 where m is the signed absmax element,
              q = clamp(round(x / d) + 8, 0, 15)                 (llama.cpp rule)
        "fit": the max rule, or the least-squares scale of the best of
              eight trial scales' codes (d = f · m / -8, f in 0.8..1.3, each
              rounded as stored), whichever has the lower (optionally
              importance-weighted) squared error.  Never worse than "max"
              in that error.  ("grid", the earlier default: the lowest error
              over 26 such trial scales and the max rule.)
K-quants (super-blocks of 256, llama.cpp's layouts): encode_k, see the
comment above it and docs/QUANT.md.
"""
import atexit
import concurrent.futures
import ctypes
import multiprocessing
import os
import struct

import numpy as np

import mlb_layout

MAGIC = b"KRAFLAMB"
# Version 2 has a layout field in each tensor entry; a file whose tensors are
# all plain rows is written as version 1, without it (docs/FORMAT.md).
VERSION, VERSION_ROWS = 2, 1
LAYOUT_ROWS, LAYOUT_ROWS8 = 0, 1
LAYOUT_NAMES = {LAYOUT_ROWS: "rows", LAYOUT_ROWS8: "rows8"}

F32, F16, Q8_0, Q4_0, Q8_0_F32, Q4_0_F32 = 0, 1, 2, 3, 4, 5
Q4_K, Q5_K, Q6_K = 6, 7, 8
TYPE_NAMES = {F32: "f32", F16: "f16", Q8_0: "q8_0", Q4_0: "q4_0",
              Q8_0_F32: "q8_0_f32", Q4_0_F32: "q4_0_f32", Q4_K: "q4_k", Q5_K: "q5_k", Q6_K: "q6_k"}
QK = 32
# bytes per block of 32 elements for the quantised types
BLOCK_BYTES = {Q8_0: 34, Q4_0: 18, Q8_0_F32: 36, Q4_0_F32: 20}
# K-quants (llama.cpp's layouts; copied from GGUF files, or made from floats
# by encode_k below): bytes per super-block of 256 elements
QK_K = 256
K_BLOCK_BYTES = {Q4_K: 144, Q5_K: 176, Q6_K: 210}

META_INT, META_FLOAT, META_STR, META_INTS, META_FLOATS = 0, 1, 2, 3, 4


class MlbError(Exception):
    pass


# --------------------------------------------------------------------------
# sizes

def tensor_nbytes(ttype, shape):
    shape = [int(s) for s in shape]
    n = 1
    for s in shape:
        n *= s
    if ttype == F32:
        return 4 * n
    if ttype == F16:
        return 2 * n
    if ttype in BLOCK_BYTES:
        if shape[-1] % QK:
            raise MlbError(f"last dim {shape[-1]} is not a multiple of {QK}")
        return n // QK * BLOCK_BYTES[ttype]
    if ttype in K_BLOCK_BYTES:
        if shape[-1] % QK_K:
            raise MlbError(f"last dim {shape[-1]} is not a multiple of {QK_K}")
        return n // QK_K * K_BLOCK_BYTES[ttype]
    raise MlbError(f"unknown tensor type {ttype}")


def stored_nbytes(ttype, shape, layout):
    """Bytes of a tensor as stored in `layout`."""
    if layout == LAYOUT_ROWS8:
        if len(shape) != 2 or ttype not in mlb_layout.GROUP_BLOCK:
            raise MlbError(f"layout rows8 needs a 2-D q8_0, q4_0, q4_k or q6_k matrix, not type {ttype} {list(shape)}")
        tensor_nbytes(ttype, shape)  # checks the row length
        return mlb_layout.nbytes(ttype, int(shape[0]), int(shape[1]))
    return tensor_nbytes(ttype, shape)


def saved_layout(ttype, shape):
    """The layout writers store a tensor in by default (Rust: format::mlb::saved_layout): the eight-row
    groups for a matrix of a type the kernels read so with at least eight rows, else plain rows."""
    if len(shape) == 2 and int(shape[0]) >= mlb_layout.ROWS8 and ttype in mlb_layout.GROUP_BLOCK:
        return LAYOUT_ROWS8
    return LAYOUT_ROWS


def _align(n, a=64):
    return (n + a - 1) // a * a


# --------------------------------------------------------------------------
# quantisation

def _f16_round(d):
    """Round float32 scales to what a f16 scale field will hold."""
    return d.astype(np.float16).astype(np.float32)


def quantize_q8_0(x, scale_dtype=np.float16):
    """x: float array, last dim multiple of 32. Returns (d [nb], q int8 [nb,32])."""
    b = np.asarray(x, dtype=np.float32).reshape(-1, QK)
    return by_pieces(_q8_0_piece, [b], np.dtype(scale_dtype))


def _q8_0_piece(b, scale_dtype):
    amax = np.abs(b).max(axis=1)
    d = amax / 127.0
    with np.errstate(divide="ignore", invalid="ignore"):
        idv = np.where(d > 0, 1.0 / d, 0.0).astype(np.float32)
    q = np.rint(b * idv[:, None]).astype(np.int8)  # |q| <= 127 by construction
    return d.astype(scale_dtype), q


def _q4_max_rule(b):
    """llama.cpp quantize_row_q4_0_ref: returns (d float32 unrounded, q uint8 0..15)."""
    idx = np.abs(b).argmax(axis=1)
    m = b[np.arange(b.shape[0]), idx]
    d = m / -8.0
    with np.errstate(divide="ignore", invalid="ignore"):
        idv = np.where(d != 0, 1.0 / d, 0.0).astype(np.float32)
    q = np.clip(np.floor(b * idv[:, None] + 8.5), 0, 15).astype(np.uint8)
    return d.astype(np.float32), q


def _q4_codes(b, d):
    with np.errstate(divide="ignore", invalid="ignore"):
        idv = np.where(d != 0, 1.0 / d, 0.0).astype(np.float32)
    return np.clip(np.rint(b * idv[:, None]) + 8, 0, 15).astype(np.uint8)


# The fitted rule (the default; shared/src/import/quantize.rs has the same
# arithmetic, docs/QUANT.md the measurements): the max rule, or the
# least-squares scale of the best of eight trial scales' codes, whichever has
# the lower (importance-weighted) squared error.  The trial scales are d0·f
# for these factors of the max rule's scale d0 = m/-8 (f < 1 clips the
# largest weight).
TRIAL_FACTORS = np.linspace(0.8, 1.3, 8, dtype=np.float32)

# The grid search that was the default before (rule "grid": the max rule and
# d0·f for 26 factors, the lowest error), kept for tools/q4_experiment.py and
# docs/QUANT.md's first experiments.  Measured on SmolLM2-135M, 0.8..1.3 beat
# 1.0..1.3; the mirrored scale (d = m/7 · f, largest weight on level +7) did
# not help and is off by default.
GRID_FACTORS = np.linspace(0.8, 1.3, 26, dtype=np.float32)


def q4_0_scales(b, rule="fit", scale_dtype=np.float16, factors=None, mirror=False, weights=None):
    """Choose Q4_0 scales and codes for blocks b [nb, 32] (float32).

    Returns (d as stored (scale_dtype), q uint8 [nb, 32] in 0..15).
    rule: "max"  llama.cpp's rule;
          "fit"  the default: the max rule, then eight trial scales d0·f
                 (TRIAL_FACTORS), each rounded to scale_dtype, whose codes'
                 least-squares scale is refitted for the trial that it helps
                 most; that scale (rounded) and its codes, if their error is
                 lower than the max rule's;
          "grid" the earlier search: max rule + d0·f (f in factors, default
                 GRID_FACTORS) [+ mirrored m/7·f if mirror], each evaluated
                 with the scale rounded to scale_dtype, keep the lowest
                 squared error per block (an earlier candidate on ties).
    weights: optional [nb, 32] non-negative importance of each element in the
             squared error ("fit" and "grid"), e.g. the mean squared
             activation of the matching input column (an importance matrix).
    """
    if rule not in ("max", "fit", "grid"):
        raise ValueError(f"unknown q4 scale rule {rule!r}")
    b = np.asarray(b, dtype=np.float32)
    factors = GRID_FACTORS if factors is None else np.asarray(factors, dtype=np.float32)
    w = None if weights is None else np.asarray(weights, dtype=np.float32).reshape(b.shape)
    return by_pieces(_q4_0_piece, [b, w], rule, np.dtype(scale_dtype), factors, mirror)


def _q4_0_piece(b, w, rule, scale_dtype, factors, mirror):
    if rule == "fit":
        return _q4_lsq_piece(b, w, scale_dtype)
    d0, q0 = _q4_max_rule(b)
    if rule == "max":
        return d0.astype(scale_dtype), q0
    best_d, fitted = _q4_fit_piece(b, d0, q0, w, factors, mirror, scale_dtype)
    q = q0.copy()
    q[fitted] = _q4_codes(b[fitted], best_d[fitted])
    return best_d.astype(scale_dtype), q


def _q4_lsq_piece(b, w, scale_dtype):
    """The fitted rule over blocks b [n, 32]: (d as stored, codes).  As in
    _q4_fit_piece, the blocks are transposed and every sum runs over the
    element index j = 0 .. 31 in order, in float32, as quantize.rs sums.
    First the max rule (as _q4_max_rule, on the transposed blocks; m is the
    first element of largest magnitude, which quantize.rs takes too, where
    argmax would take a NaN) and its error; then for each trial's levels
    l = codes − 8 = rint(clip(x · (1/d), −8, 7)), S_xq = Σ (x·w)·l and
    S_qq = Σ (w·l)·l; the trial with the largest S_xq²/S_qq (an earlier one
    on ties; none if all are 0) gives d* = S_xq/S_qq, rounded, and d* with
    its levels is kept where its error is below the max rule's."""
    def rnd(d):  # the scale as stored (too large for f16: infinity, as quantize.rs makes it)
        with np.errstate(over="ignore"):
            return d.astype(scale_dtype).astype(np.float32)

    def inverse(d):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)

    def levels(d, out):
        np.multiply(bt, inverse(d), out=out)
        np.clip(out, -8.0, 7.0, out=out)
        return np.rint(out, out=out)

    bt = np.ascontiguousarray(b.T)
    wt = None if w is None else np.ascontiguousarray(w.T)
    m = bt[0].copy()
    for row in bt[1:]:
        np.copyto(m, row, where=np.abs(row) > np.abs(m))
    d0 = m / np.float32(-8.0)
    lv0 = np.multiply(bt, inverse(d0))
    np.add(lv0, np.float32(8.5), out=lv0)
    np.floor(lv0, out=lv0)
    np.clip(lv0, 0.0, 15.0, out=lv0)
    np.subtract(lv0, np.float32(8.0), out=lv0)
    wx = bt if wt is None else bt * wt
    lv = lv0.copy()  # the work arrays, reused by every trial
    r = np.empty_like(bt)
    d_max = rnd(d0)
    e_max = _q4_err_t(bt, d_max, lv, wt, r)
    n = bt.shape[1]
    best_v, best_xq, best_qq = (np.zeros(n, dtype=np.float32) for _ in range(3))
    for f in TRIAL_FACTORS:
        levels(rnd(d0 * f), lv)
        xq = ordered_sum(np.multiply(wx, lv, out=r))
        if wt is not None:
            np.multiply(wt, lv, out=r)
            np.multiply(r, lv, out=r)
        else:
            np.multiply(lv, lv, out=r)
        qq = ordered_sum(r)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            v = np.where(qq > 0, xq * xq / qq, np.float32(0.0)).astype(np.float32)
        better = v > best_v
        best_v = np.where(better, v, best_v)
        best_xq = np.where(better, xq, best_xq)
        best_qq = np.where(better, qq, best_qq)
    found = best_v > 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d_fit = rnd((best_xq / np.where(found, best_qq, np.float32(1.0))).astype(np.float32))
    lv_fit = levels(d_fit, lv).copy()
    e_fit = _q4_err_t(bt, d_fit, lv, wt, r)
    fitted = found & (e_fit < e_max)
    np.copyto(lv0, lv_fit, where=fitted)
    np.add(lv0, np.float32(8.0), out=lv0)
    return np.where(fitted, d_fit, d_max).astype(scale_dtype), lv0.T.astype(np.uint8)


# Blocks per piece of the quantisers: a piece's arrays (32 × PIECE float32)
# stay in the cache, and pieces run in worker processes on all cores.
PIECE = 4096
_POOL = None


def by_pieces(fn, arrays, *args):
    """fn(*pieces, *args) -> a tuple of arrays, for pieces of PIECE rows of
    `arrays` (None stays None), concatenated.  Each row's result is its own,
    so the pieces and where they run do not change it."""
    n = len(arrays[0])
    jobs = [[None if a is None else a[s:s + PIECE] for a in arrays] for s in range(0, n, PIECE)] or [arrays]
    results = in_workers(fn, jobs, *args)
    return tuple(np.concatenate(parts) for parts in zip(*results, strict=True))


def in_workers(fn, jobs, *args):
    """[fn(*job, *args) for job in jobs], more than one job in worker
    processes on all cores: numpy's loops in threads contend for the
    interpreter lock (two threads were no faster than one, two processes
    1.8× faster, on this 2-core machine)."""
    if len(jobs) <= 1 or (os.cpu_count() or 1) == 1:
        return [fn(*job, *args) for job in jobs]
    global _POOL
    if _POOL is None:
        spawn = multiprocessing.get_context("spawn")
        _POOL = concurrent.futures.ProcessPoolExecutor(os.cpu_count(), mp_context=spawn,
                                                       initializer=_keep_temporaries_in_the_heap)
        atexit.register(_POOL.shutdown)  # before the interpreter tears modules down
    return list(_POOL.map(fn, *zip(*jobs, strict=True), *([a] * len(jobs) for a in args)))


def _keep_temporaries_in_the_heap():
    """A worker's numpy temporaries of a piece (about 0.5 MB each) are above
    glibc's threshold for mapping an allocation of its own, so each would be
    mapped, zeroed by the kernel and unmapped again: with glibc, raise the
    thresholds (mallopt M_MMAP_THRESHOLD, M_TRIM_THRESHOLD) so that they stay
    in the heap (on the 1.5B model, 10 s less system time).  Elsewhere nothing."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 256 << 20)
        libc.mallopt(-1, 512 << 20)
    except (OSError, AttributeError):
        pass


def _q4_fit_piece(b, d0, q0, w, factors, mirror, scale_dtype):
    """The grid search (rule "grid") over blocks b [n, 32]: (the best scale
    as stored, in float32; whether a scaled candidate beat the max rule).
    The blocks are transposed so that each element index j is one contiguous
    row, and the squared error is summed over j = 0 .. 31 in order, in
    float32.  The codes minus 8 are clip(rint(x · (1/d)), −8, 7): the same
    numbers as clip(rint(x · (1/d)) + 8, 0, 15) − 8 (_q4_codes)."""
    def rnd(d):  # the scale as stored
        return d.astype(scale_dtype).astype(np.float32)

    bt = np.ascontiguousarray(b.T)
    wt = None if w is None else np.ascontiguousarray(w.T)
    x = np.empty_like(bt)  # the work arrays, reused by every candidate
    r = np.empty_like(bt)
    best_d = rnd(d0)
    np.subtract(q0.T, np.float32(8.0), out=x, dtype=np.float32)
    best_e = _q4_err_t(bt, best_d, x, wt, r)
    fitted = np.zeros(b.shape[0], dtype=bool)
    bases = [d0, d0 * np.float32(-8.0 / 7.0)] if mirror else [d0]  # m/−8, m/7
    for base in bases:
        for f in factors:
            d = rnd(base * f)
            with np.errstate(divide="ignore", invalid="ignore"):
                idv = np.where(d != 0, 1.0 / d, 0.0).astype(np.float32)
            np.multiply(bt, idv, out=x)
            np.rint(x, out=x)
            np.clip(x, -8.0, 7.0, out=x)
            e = _q4_err_t(bt, d, x, wt, r)
            better = e < best_e
            best_e = np.where(better, e, best_e)
            best_d = np.where(better, d, best_d)
            fitted |= better
    return best_d, fitted


def _q4_err_t(bt, d, levels, wt, r):
    """Squared error of each block (a column of bt [32, n]) with scale d and
    levels (codes − 8; overwritten), summed in float32 element by element in
    order (r: a work array)."""
    np.multiply(d, levels, out=levels)
    np.subtract(bt, levels, out=r)
    np.multiply(r, r, out=r)
    if wt is not None:
        np.multiply(r, wt, out=r)
    return ordered_sum(r)


def ordered_sum(rows):
    """Σ_j rows[j] of a float32 array [32, n], j in order, in float32, as
    quantize.rs sums (numpy's own reductions choose their order by the
    array's shape: pairwise for a single column)."""
    s = np.zeros(rows.shape[1], dtype=np.float32)
    for row in rows:
        np.add(s, row, out=s)
    return s


def pack_q4(q):
    """q uint8 [nb, 32] (0..15) -> [nb, 16] bytes: byte j = q[j] | q[j+16] << 4."""
    return (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)


def unpack_q4(p):
    return np.concatenate([p & 0x0F, p >> 4], axis=1)


def encode(x, ttype, q4_rule="fit", col_weights=None):
    """Encode a float array into the raw bytes of tensor type ttype.
    x may also be a matrix whose rows are read on demand (an object with
    `shape` and `read_rows(start, stop)`, as source_gguf.GgufRows): then the
    Q8_0 and Q4_0 pieces are read (dequantised) in the worker processes that
    quantise them, and only the bytes they make come back.
    col_weights: optional per-column (last dim) importance for the Q4 "fit" rule."""
    if not hasattr(x, "read_rows"):
        x = np.ascontiguousarray(x, dtype=np.float32)
    if ttype in K_BLOCK_BYTES:
        if x.shape[-1] % QK_K:
            raise MlbError(f"last dim {x.shape[-1]} is not a multiple of {QK_K}")
        return encode_k(x, ttype)
    if ttype == F32:
        return np.asarray(x, dtype=np.float32).astype("<f4").tobytes()
    if ttype == F16:
        return np.asarray(x, dtype=np.float32).astype("<f2").tobytes()
    if ttype not in (Q8_0, Q8_0_F32, Q4_0, Q4_0_F32):
        raise MlbError(f"unknown tensor type {ttype}")
    cols = int(x.shape[-1])
    if cols % QK:
        raise MlbError(f"last dim {cols} is not a multiple of {QK}")
    cw = None
    if col_weights is not None and ttype in (Q4_0, Q4_0_F32):
        cw = np.asarray(col_weights, dtype=np.float32)
        if cw.shape != (cols,):
            raise MlbError(f"importance vector has shape {cw.shape}, expected ({cols},)")
    if q4_rule not in ("max", "fit"):
        raise ValueError(f"unknown q4 scale rule {q4_rule!r}")
    rows = int(np.prod(x.shape[:-1], dtype=np.int64))
    step = max(1, PIECE * QK // cols)  # whole rows, about PIECE blocks a piece
    if hasattr(x, "read_rows"):
        pieces = [(x, r, min(r + step, rows)) for r in range(0, rows, step)]
    else:  # each piece's own rows go to the worker
        x = x.reshape(rows, cols)
        pieces = [(x[r:r + step], 0, len(x[r:r + step])) for r in range(0, rows, step)]
    return b"".join(in_workers(_encode_rows, pieces, ttype, q4_rule, cw))


def _encode_rows(source, start, stop, ttype, q4_rule, cw):
    """The bytes of rows start..stop of `source` (an array or a `read_rows` source) in ttype."""
    x = source.read_rows(start, stop) if hasattr(source, "read_rows") else source[start:stop]
    b = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, QK)
    sd = np.dtype("<f2") if ttype in (Q8_0, Q4_0) else np.dtype("<f4")
    nb = b.shape[0]
    if ttype in (Q8_0, Q8_0_F32):
        d, q = _q8_0_piece(b, sd)
        q = q.view(np.uint8)
    else:
        w = None if cw is None else np.tile(cw, stop - start).reshape(-1, QK)
        d, q = _q4_0_piece(b, w, q4_rule, sd, GRID_FACTORS, False)
        q = pack_q4(q)
    out = np.empty((nb, sd.itemsize + q.shape[1]), np.uint8)
    out[:, :sd.itemsize] = d.astype(sd).view(np.uint8).reshape(nb, sd.itemsize)
    out[:, sd.itemsize:] = q
    return out.tobytes()


def decode(raw, ttype, shape):
    """Raw tensor bytes (bytes / uint8 array) -> float32 array of shape."""
    shape = tuple(int(s) for s in shape)
    buf = np.frombuffer(raw, dtype=np.uint8) if not isinstance(raw, np.ndarray) else raw.view(np.uint8).reshape(-1)
    if ttype == F32:
        return buf.view("<f4").astype(np.float32).reshape(shape)
    if ttype == F16:
        return buf.view("<f2").astype(np.float32).reshape(shape)
    if ttype in K_BLOCK_BYTES:
        return _decode_k(buf.reshape(-1, K_BLOCK_BYTES[ttype]), ttype).reshape(shape)
    sd = np.dtype("<f2") if ttype in (Q8_0, Q4_0) else np.dtype("<f4")
    bb = BLOCK_BYTES[ttype]
    blk = buf.reshape(-1, bb)
    d = np.ascontiguousarray(blk[:, :sd.itemsize]).view(sd).astype(np.float32)  # [nb, 1]
    if ttype in (Q8_0, Q8_0_F32):
        q = np.ascontiguousarray(blk[:, sd.itemsize:]).view(np.int8).astype(np.float32)
    else:
        q = unpack_q4(blk[:, sd.itemsize:]).astype(np.float32) - 8.0
    return (d * q).reshape(shape)


def _scales_mins_k4(s):
    """[nb, 12] packed 6-bit scales and mins of Q4_K / Q5_K -> ([nb, 8], [nb, 8])."""
    s = s.astype(np.uint8)
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 2) & 0x30)], axis=1)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 2) & 0x30)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _decode_k(blk, ttype):
    """K-quant super-blocks [nb, bytes] -> float32 [nb, 256], with the runtime's
    operations (shared/src/quant.rs `dequant_q4k` ...): (d·sc)·q − dmin·m and
    (d·scale)·(q − 32), each rounded to float32."""
    f32 = np.float32
    if ttype == Q6_K:
        ql, qh = blk[:, 0:128], blk[:, 128:192]
        sc = np.ascontiguousarray(blk[:, 192:208]).view(np.int8).astype(f32)  # [nb, 16]
        d = np.ascontiguousarray(blk[:, 208:210]).view("<f2").astype(f32)  # [nb, 1]
        q = np.empty((blk.shape[0], 2, 4, 32), np.int32)  # element 128·h + 32·r + l
        for h in range(2):
            for r in range(4):
                lo = (ql[:, 64 * h + 32 * (r % 2):64 * h + 32 * (r % 2) + 32] >> (4 * (r // 2))) & 15
                hi = (qh[:, 32 * h:32 * h + 32] >> (2 * r)) & 3
                q[:, h, r, :] = lo.astype(np.int32) | (hi.astype(np.int32) << 4)
        q = q.reshape(-1, 16, 16)
        return ((d * sc)[:, :, None] * (q - 32).astype(f32)).reshape(-1, QK_K)
    d = np.ascontiguousarray(blk[:, 0:2]).view("<f2").astype(f32)
    dmin = np.ascontiguousarray(blk[:, 2:4]).view("<f2").astype(f32)
    sc, mn = _scales_mins_k4(blk[:, 4:16])
    qs = blk[:, 16:144] if ttype == Q4_K else blk[:, 48:176]
    q = np.empty((blk.shape[0], 8, 32), np.int32)  # sub-block j, weight l
    for j in range(8):
        q[:, j, :] = (qs[:, 32 * (j // 2):32 * (j // 2) + 32] >> (4 * (j % 2))) & 15
        if ttype == Q5_K:
            q[:, j, :] |= ((blk[:, 16:48] >> j) & 1).astype(np.int32) << 4
    dl, ml = d * sc, dmin * mn  # [nb, 8]
    return (dl[:, :, None] * q.astype(f32) - ml[:, :, None]).reshape(-1, QK_K)


# --------------------------------------------------------------------------
# K-quants from floats (Q4_K, Q5_K, Q6_K in llama.cpp's byte layouts)
#
# Q4_K / Q5_K: a super-block of 256 = 8 sub-blocks of 32, each x ~ s·q − m
# (q in 0..15 / 0..31, m >= 0); the eight s and eight m are stored as 6-bit
# integers times the super-block's f16 d and dmin (d = max s / 63, ...).
# Q6_K: 16 sub-blocks of 16, x ~ s·(q − 32) (q in 0..63); the sixteen s are
# int8 times the super-block's f16 d (the largest |s| becomes −128).
# The per-sub-block (s, m) or s come from K_RULE (docs/QUANT.md):
#   "minmax"  s = (max − min') / nmax, m = −min' with min' = min(min x, 0);
#             Q6_K: s = x_a / −32 for the element x_a of largest magnitude.
#   "search"  llama.cpp's kind of search: for a set of inverse scales around
#             the min/max one, codes by rounding, then the least-squares
#             (s, m) (or s) for those codes, weighted (Q4_K/Q5_K: w = rms(x)
#             + |x|; Q6_K: w = x²); the lowest weighted squared error wins,
#             the min/max candidate included.
# After the 6-bit / 8-bit scale quantisation every code is recomputed by
# rounding against the scales as stored (what the runtime will multiply).
# All blocks of a tensor are processed at once (numpy, no per-block loop).

K_RULES = ("search", "minmax")
K_RULE = "search"
# Offsets added to nmax in the search's inverse scale (nmax + o) / (max − min')
# (Q6_K: −(32 + o) / x_a).  llama.cpp steps them by 0.1; steps of 0.2 halve the
# time for +0.4 % squared weight error (docs/QUANT.md, the "Speed." paragraph of `--type q4_k_m`).
K_SEARCH_KMIN = {Q4_K: np.arange(-5, 6, dtype=np.float32) * np.float32(0.2),
                 Q5_K: np.arange(-2, 6, dtype=np.float32) * np.float32(0.2)}
K_SEARCH_Q6 = np.arange(-4, 5, dtype=np.float32) * np.float32(0.2)


def _kmin_fit(x, nmax, rule, offsets):
    """Sub-blocks x [n, 32] -> (s [n], m [n]) float32 with x ~ s·q − m, q in 0..nmax."""
    f32 = np.float32
    lo = np.minimum(x.min(axis=1), f32(0))
    rng = x.max(axis=1) - lo
    ok = rng > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        inv0 = np.where(ok, f32(nmax) / rng, f32(0)).astype(f32)
    s = np.where(ok, rng / f32(nmax), f32(0)).astype(f32)
    off = lo.astype(f32)  # x ~ s·q + off, off <= 0
    if rule == "minmax":
        return s, -off
    if rule != "search":
        raise ValueError(f"unknown K-quant rule {rule!r}")
    w = np.sqrt((x * x).mean(axis=1, keepdims=True)) + np.abs(x)
    wx = w * x
    sw = np.einsum("ij->i", w).astype(np.float64)
    sx = np.einsum("ij->i", wx).astype(np.float64)
    sxx = np.einsum("ij,ij->i", wx, x).astype(np.float64)

    def sums(inv, base):
        q = x - base[:, None]
        q *= inv[:, None]
        np.rint(q, out=q)
        np.clip(q, 0, nmax, out=q)
        wq = w * q
        return (np.einsum("ij->i", wq).astype(np.float64), np.einsum("ij,ij->i", wq, q).astype(np.float64),
                np.einsum("ij,ij->i", wq, x).astype(np.float64))

    def err(a, b, sq, sqq, sxq):  # weighted squared error of x ~ a·q + b, from the sums
        return a * a * sqq + 2 * a * b * sq + b * b * sw - 2 * a * sxq - 2 * b * sx + sxx

    best = err(s.astype(np.float64), off.astype(np.float64), *sums(inv0, lo))
    best_s, best_off = s.astype(np.float64), off.astype(np.float64)
    hi = lo + rng
    for o in offsets:
        # each candidate starts from the best offset so far (as llama.cpp's search does)
        base = best_off.astype(f32)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(ok, (f32(nmax) + o) / (hi - base), f32(0)).astype(f32)
        sq, sqq, sxq = sums(inv, base)
        det = sw * sqq - sq * sq
        with np.errstate(divide="ignore", invalid="ignore"):
            a = (sw * sxq - sx * sq) / det
            b = (sqq * sx - sq * sxq) / det
            pos = b > 0  # the offset must stay <= 0: refit the scale alone
            a = np.where(pos, sxq / sqq, a)
            b = np.where(pos, 0.0, b)
        e = err(a, b, sq, sqq, sxq)
        better = ok & (det > 0) & (e < best) & (a > 0)
        best = np.where(better, e, best)
        best_s = np.where(better, a, best_s)
        best_off = np.where(better, b, best_off)
    return best_s.astype(f32), (-best_off).astype(f32)


def _q6_fit(x, rule, offsets):
    """Sub-blocks x [n, 16] -> s [n] float32 with x ~ s·(q − 32), q − 32 in −32..31."""
    f32 = np.float32
    n = x.shape[0]
    big = x[np.arange(n), np.abs(x).argmax(axis=1)]
    ok = np.abs(big) > 0
    s = np.where(ok, big / f32(-32), f32(0)).astype(f32)
    if rule == "minmax":
        return s
    if rule != "search":
        raise ValueError(f"unknown K-quant rule {rule!r}")
    w = x * x
    wx = w * x
    best_score = np.full(n, -1.0)
    best_s = s.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        for o in np.concatenate([[f32(0)], offsets[offsets != 0]]):
            inv = np.where(ok, -(f32(32) + o) / big, f32(0)).astype(f32)
            q = x * inv[:, None]
            np.rint(q, out=q)
            np.clip(q, -32, 31, out=q)
            sxq = np.einsum("ij,ij->i", wx, q).astype(np.float64)
            sqq = np.einsum("ij,ij->i", w * q, q).astype(np.float64)
            score = np.where(sqq > 0, sxq * sxq / sqq, -1.0)  # error reduction of the least-squares s
            better = ok & (score > best_score)
            best_score = np.where(better, score, best_score)
            best_s = np.where(better, sxq / sqq, best_s)
    return best_s.astype(f32)


def _pack_scales_k4(sc, mn):
    """[nb, 8] 6-bit scales and mins -> [nb, 12] (inverse of _scales_mins_k4)."""
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    out = np.empty((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = mn[:, 0:4] | ((mn[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 15) | ((mn[:, 4:8] & 15) << 4)
    return out


def encode_k(x, ttype, rule=None, chunk=1024):
    """Float array (size a multiple of 256) -> raw bytes of Q4_K, Q5_K or Q6_K.
    Works on `chunk` super-blocks at a time (all of them at once within a
    chunk; the chunks only keep the temporaries in cache)."""
    rule = K_RULE if rule is None else rule
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, QK_K)
    return b"".join(_encode_k(x[i:i + chunk], ttype, rule) for i in range(0, x.shape[0], chunk))


def _encode_k(x, ttype, rule):
    f32 = np.float32
    nb = x.shape[0]
    out = np.zeros((nb, K_BLOCK_BYTES[ttype]), np.uint8)
    if ttype == Q6_K:
        s = _q6_fit(x.reshape(-1, 16), rule, K_SEARCH_Q6).reshape(nb, 16)
        big = s[np.arange(nb), np.abs(s).argmax(axis=1)]
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(big != 0, f32(-128) / big, f32(0)).astype(f32)
            d = np.where(big != 0, f32(1) / inv, f32(0)).astype("<f2")
        sc = np.clip(np.rint(s * inv[:, None]), -128, 127).astype(np.int8)
        dl = (d.astype(f32)[:, None] * sc.astype(f32))  # [nb, 16], as the runtime forms it
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(dl[:, :, None] != 0,
                         np.clip(np.rint(x.reshape(nb, 16, 16) / dl[:, :, None]), -32, 31), 0)
        q = (q + 32).astype(np.uint8).reshape(nb, 2, 4, 32)  # element 128·h + 32·r + l
        ql = np.empty((nb, 2, 64), np.uint8)
        ql[:, :, 0:32] = (q[:, :, 0] & 15) | ((q[:, :, 2] & 15) << 4)
        ql[:, :, 32:64] = (q[:, :, 1] & 15) | ((q[:, :, 3] & 15) << 4)
        qh = (q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6)
        out[:, 0:128] = ql.reshape(nb, 128)
        out[:, 128:192] = qh.reshape(nb, 64)
        out[:, 192:208] = sc.view(np.uint8)
        out[:, 208:210] = d.reshape(nb, 1).view(np.uint8)
        return out.tobytes()
    if ttype not in (Q4_K, Q5_K):
        raise MlbError(f"not a K-quant type: {ttype}")
    nmax = 15 if ttype == Q4_K else 31
    s, m = _kmin_fit(x.reshape(-1, 32), nmax, rule, K_SEARCH_KMIN[ttype])
    s, m = np.maximum(s, 0).reshape(nb, 8), m.reshape(nb, 8)
    smax, mmax = s.max(axis=1), m.max(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ls = np.clip(np.rint(s * np.where(smax > 0, f32(63) / smax, f32(0))[:, None]), 0, 63)
        lm = np.clip(np.rint(m * np.where(mmax > 0, f32(63) / mmax, f32(0))[:, None]), 0, 63)
    d = (smax / f32(63)).astype("<f2")
    dmin = (mmax / f32(63)).astype("<f2")
    dl = d.astype(f32)[:, None] * ls.astype(f32)  # [nb, 8], as the runtime forms them
    ml = dmin.astype(f32)[:, None] * lm.astype(f32)
    xb = x.reshape(nb, 8, 32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(dl[:, :, None] > 0, np.clip(np.rint((xb + ml[:, :, None]) / dl[:, :, None]), 0, nmax), 0)
    q = q.astype(np.uint8)  # [nb, 8, 32]: sub-block j, weight l
    out[:, 0:2] = d.reshape(nb, 1).view(np.uint8)
    out[:, 2:4] = dmin.reshape(nb, 1).view(np.uint8)
    out[:, 4:16] = _pack_scales_k4(ls, lm)
    lo4 = q & 15
    qs = (lo4[:, 0::2] | (lo4[:, 1::2] << 4)).reshape(nb, 128)  # byte 32·(j//2) + l
    if ttype == Q4_K:
        out[:, 16:144] = qs
    else:
        hb = (q >> 4).astype(np.uint8)  # [nb, 8, 32]
        out[:, 16:48] = np.bitwise_or.reduce(hb << np.arange(8, dtype=np.uint8)[None, :, None], axis=1)
        out[:, 48:176] = qs
    return out.tobytes()


def roundtrip_k(x, ttype, rule=None):
    """encode_k then decode."""
    return decode(encode_k(x, ttype, rule), ttype, np.shape(x))


def roundtrip(x, ttype, q4_rule="fit", col_weights=None):
    """Quantise then dequantise (what the runtime will see)."""
    return decode(encode(x, ttype, q4_rule, col_weights), ttype, np.shape(x))


# --------------------------------------------------------------------------
# writer

def _meta_bytes(key, value):
    kb = key.encode()
    if not 1 <= len(kb) <= 256:
        raise MlbError(f"bad metadata key {key!r}")
    out = struct.pack("<I", len(kb)) + kb
    if isinstance(value, bool) or isinstance(value, (int, np.integer)):
        return out + struct.pack("<Bq", META_INT, int(value))
    if isinstance(value, (float, np.floating)):
        return out + struct.pack("<Bd", META_FLOAT, float(value))
    if isinstance(value, str):
        vb = value.encode()
        if len(vb) > 65536:
            raise MlbError(f"metadata string {key!r} too long")
        return out + struct.pack("<BI", META_STR, len(vb)) + vb
    if isinstance(value, (list, tuple, np.ndarray)):
        vals = list(value)
        if len(vals) > 65536:
            raise MlbError(f"metadata array {key!r} too long")
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in vals):
            return out + struct.pack("<BI", META_INTS, len(vals)) + struct.pack(f"<{len(vals)}q", *map(int, vals))
        return out + struct.pack("<BI", META_FLOATS, len(vals)) + struct.pack(f"<{len(vals)}d", *map(float, vals))
    raise MlbError(f"unsupported metadata value for {key!r}: {type(value).__name__}")


def write_mlb(fileobj, meta, tensors, progress=None, rows8=True):
    """Write an .mlb.

    meta: dict key -> int / float / str / list of int / list of float.
    tensors: list of (name, ttype, shape, producer) where producer() returns
             the encoded bytes in plain rows (len must equal tensor_nbytes(ttype, shape)).
             Producers are called one at a time, in order (streaming).
    progress: optional callback(index, name, ttype, shape) before each tensor.
    rows8: store matrices in their `saved_layout` (the eight-row groups the
           kernels read); False: every tensor in plain rows (a version 1 file).
    """
    if len(meta) > 4096 or len(tensors) > 65536:
        raise MlbError("too many metadata entries or tensors")
    names = [t[0] for t in tensors]
    if len(set(names)) != len(names):
        raise MlbError("duplicate tensor names")
    layouts = [saved_layout(ttype, shape) if rows8 else LAYOUT_ROWS for _, ttype, shape, _ in tensors]
    version = VERSION if any(lay != LAYOUT_ROWS for lay in layouts) else VERSION_ROWS
    head = bytearray(MAGIC + struct.pack("<IIII", version, len(meta), len(tensors), 0))
    for k, v in meta.items():
        head += _meta_bytes(k, v)
    offsets, off = [], 0
    for (name, ttype, shape, _), layout in zip(tensors, layouts):
        if not 1 <= len(shape) <= 4:
            raise MlbError(f"{name}: bad rank {len(shape)}")
        offsets.append(off)
        off = _align(off + stored_nbytes(ttype, shape, layout))
    for (name, ttype, shape, _), o, layout in zip(tensors, offsets, layouts):
        nb = name.encode()
        if not 1 <= len(nb) <= 256:
            raise MlbError(f"bad tensor name {name!r}")
        head += struct.pack("<I", len(nb)) + nb + struct.pack("<I", ttype)
        if version == VERSION:
            head += struct.pack("<I", layout)
        head += struct.pack("<I", len(shape))
        head += struct.pack(f"<{len(shape)}Q", *map(int, shape)) + struct.pack("<Q", o)
    data_start = _align(len(head))
    head += b"\0" * (data_start - len(head))
    fileobj.write(head)
    pos = 0
    for i, ((name, ttype, shape, producer), o, layout) in enumerate(zip(tensors, offsets, layouts)):
        if progress:
            progress(i, name, ttype, shape)
        if o > pos:
            fileobj.write(b"\0" * (o - pos))
            pos = o
        raw = producer()
        if len(raw) != tensor_nbytes(ttype, shape):
            raise MlbError(f"{name}: produced {len(raw)} bytes, expected {tensor_nbytes(ttype, shape)}")
        if layout == LAYOUT_ROWS8:
            raw = mlb_layout.interleave(raw, ttype, int(shape[0]), int(shape[1]))
        fileobj.write(raw)
        pos += len(raw)
    end = _align(pos)
    if end > pos:
        fileobj.write(b"\0" * (end - pos))


# --------------------------------------------------------------------------
# reader

class MlbReader:
    """Reads an .mlb (validating counts and offsets). Tensor data via np.memmap;
    `tensors[name]` = (type, shape, offset), `layouts[name]` its layout."""

    def __init__(self, path):
        self.path = os.fspath(path)
        size = os.path.getsize(self.path)
        with open(self.path, "rb") as f:
            data = f.read(min(size, 64 << 20))
        self._size = size
        p = 0

        def need(n):
            if p + n > len(data):
                raise MlbError("truncated header")

        def rd(fmt):
            nonlocal p
            n = struct.calcsize(fmt)
            need(n)
            v = struct.unpack_from(fmt, data, p)
            p += n
            return v

        def rstr(limit):
            nonlocal p
            (n,) = rd("<I")
            if n > limit:
                raise MlbError("string too long")
            need(n)
            s = data[p:p + n].decode()
            p += n
            return s

        need(24)
        if data[:8] != MAGIC:
            raise MlbError("bad magic")
        p = 8
        ver, n_meta, n_tensors, _ = rd("<IIII")
        if ver not in (VERSION, VERSION_ROWS):
            raise MlbError(f"unsupported version {ver}")
        if n_meta > 4096 or n_tensors > 65536:
            raise MlbError("too many entries")
        self.meta = {}
        for _ in range(n_meta):
            k = rstr(256)
            (t,) = rd("<B")
            if t == META_INT:
                v = rd("<q")[0]
            elif t == META_FLOAT:
                v = rd("<d")[0]
            elif t == META_STR:
                v = rstr(65536)
            elif t in (META_INTS, META_FLOATS):
                (c,) = rd("<I")
                if c > 65536:
                    raise MlbError("array too long")
                v = list(rd(f"<{c}{'q' if t == META_INTS else 'd'}"))
            else:
                raise MlbError(f"bad metadata type {t}")
            if k in self.meta:
                raise MlbError(f"duplicate key {k}")
            self.meta[k] = v
        self.tensors = {}
        self.layouts = {}
        for _ in range(n_tensors):
            name = rstr(256)
            (ttype,) = rd("<I")
            (layout,) = rd("<I") if ver == VERSION else (LAYOUT_ROWS,)
            if layout not in LAYOUT_NAMES:
                raise MlbError(f"{name}: unknown layout {layout}")
            (nd,) = rd("<I")
            if not 1 <= nd <= 4:
                raise MlbError(f"{name}: bad rank")
            shape = rd(f"<{nd}Q")
            (off,) = rd("<Q")
            if name in self.tensors:
                raise MlbError(f"duplicate tensor {name}")
            self.tensors[name] = (ttype, tuple(shape), off)
            self.layouts[name] = layout
        self.data_start = _align(p)
        for name, (ttype, shape, off) in self.tensors.items():
            if off % 64:
                raise MlbError(f"{name}: misaligned offset")
            if self.data_start + off + stored_nbytes(ttype, shape, self.layouts[name]) > size:
                raise MlbError(f"{name}: extends past end of file")
        self._mm = np.memmap(self.path, dtype=np.uint8, mode="r") if size else None

    def stored(self, name):
        """The tensor's bytes as stored (in its layout)."""
        ttype, shape, off = self.tensors[name]
        s = self.data_start + off
        return self._mm[s:s + stored_nbytes(ttype, shape, self.layouts[name])]

    def raw(self, name):
        """The tensor's bytes in plain rows (the type's layout, docs/FORMAT.md)."""
        ttype, shape, _ = self.tensors[name]
        if self.layouts[name] == LAYOUT_ROWS8:
            return np.frombuffer(mlb_layout.deinterleave(self.stored(name), ttype, *shape), np.uint8)
        return self.stored(name)

    def get(self, name):
        """Dequantised float32 copy of a tensor."""
        ttype, shape, _ = self.tensors[name]
        return decode(np.array(self.raw(name)), ttype, shape)
