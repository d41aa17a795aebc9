"""Krafla `.mlb` model files for the tests and tools: the reader, the writer and
the decoders of every tensor type (an oracle for the runtime's dequantisation).

The layout is specified in docs/FORMAT.md (section `.mlb`). Models are made by
the executables (`ml_run SRC --save OUT.mlb`, shared/src/import/): this module
quantises nothing; it writes test files from bytes it is given (or from floats
in F32 / F16) and reads any file back as float32 (tools/reference_forward.py).
"""
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
# K-quants (llama.cpp's layouts, as GGUF files hold them): bytes per super-block of 256 elements
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
# encodings: the exact ones (the quantisers are Rust's: `ml_run SRC --save`)

def encode(x, ttype):
    """A float array as the raw bytes of an F32 or F16 tensor."""
    if ttype == F32:
        return np.asarray(x, dtype=np.float32).astype("<f4").tobytes()
    if ttype == F16:
        return np.asarray(x, dtype=np.float32).astype("<f2").tobytes()
    raise MlbError(f"tensor type {TYPE_NAMES.get(ttype, ttype)}: make quantised files with `ml_run SRC --save`")


def unpack_q4(p):
    return np.concatenate([p & 0x0F, p >> 4], axis=1)


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


def write_plain_rows(src, out):
    """The .mlb `src` again with every tensor in plain rows (a version 1 file): the layout
    files had before the eight-row groups, which the loaders still read."""
    r = MlbReader(src)
    tensors = [(n, t, list(shape), lambda n=n: bytes(r.raw(n))) for n, (t, shape, _) in r.tensors.items()]
    with open(out, "wb") as f:
        write_mlb(f, dict(r.meta), tensors, rows8=False)
