"""The `rows8` tensor layout of `.mlb` files (docs/FORMAT.md, "Tensor layouts"):
a 2-D Q8_0, Q4_0, Q4_K or Q6_K matrix stored as the eight-row kernels read it.

Rows 0 .. 8·⌊rows/8⌋ are in groups of eight rows, group g's block b (the b-th
block of each of its eight rows, interleaved) at g·nb + b; the last rows % 8
rows follow in the plain layout. `interleave` makes the stored bytes from
plain rows, `deinterleave` takes them back, bit for bit; both are the numpy
twins of shared/src/quant.rs (`repack_q8_x8` with bias 0, `repack_q4_x8`,
`repack_q4k_x8`, `repack_q6k_x8`, and `Rows8::row`).
"""
import numpy as np

ROWS8 = 8
Q8_0, Q4_0, Q4_K, Q6_K = 2, 3, 6, 8
# bytes of one row's block, and of one group block (eight rows' blocks interleaved)
ROW_BLOCK = {Q8_0: 34, Q4_0: 18, Q4_K: 144, Q6_K: 210}
GROUP_BLOCK = {Q8_0: 272, Q4_0: 144, Q4_K: 1184, Q6_K: 1680}
BLOCK_WEIGHTS = {Q8_0: 32, Q4_0: 32, Q4_K: 256, Q6_K: 256}


def nbytes(ttype, rows, cols):
    """Stored bytes of a [rows, cols] matrix in the rows8 layout."""
    nb = cols // BLOCK_WEIGHTS[ttype]
    return rows // ROWS8 * nb * GROUP_BLOCK[ttype] + rows % ROWS8 * nb * ROW_BLOCK[ttype]


def _f16_bytes(blk, lo):
    """The two bytes at `lo` of blocks [G, 8, nb, size] as [G, nb, 16]: row k's at 2k."""
    return blk[:, :, :, lo:lo + 2].transpose(0, 2, 1, 3).reshape(blk.shape[0], blk.shape[2], 16)


def _code_bytes(qs, per_part):
    """Code bytes [G, 8, nb, n] of eight rows -> [G, nb, 8·n]: row k's byte
    4·(per_part·c + g) + e at [c][g][k][e] (four bytes of each row in turn,
    `per_part` such runs to a part c)."""
    G, _, nb, n = qs.shape
    c = n // (per_part * 4)
    return qs.reshape(G, 8, nb, c, per_part, 4).transpose(0, 2, 3, 4, 1, 5).reshape(G, nb, n * 8)


def _q6k_codes(blk):
    """Q6_K blocks [..., 210] -> their 256 6-bit codes [..., 256] (`q6k_code`)."""
    ql, qh = blk[..., 0:128].astype(np.uint8), blk[..., 128:192].astype(np.uint8)
    out = np.empty(blk.shape[:-1] + (2, 4, 32), np.uint8)  # element 128·h + 32·r + l
    for h in range(2):
        for r in range(4):
            lo = (ql[..., 64 * h + 32 * (r % 2):64 * h + 32 * (r % 2) + 32] >> (4 * (r // 2))) & 15
            hi = (qh[..., 32 * h:32 * h + 32] >> (2 * r)) & 3
            out[..., h, r, :] = lo | (hi << 4)
    return out.reshape(blk.shape[:-1] + (256,))


def _q6k_from_codes(codes):
    """Codes [..., 256] -> the ql and qh bytes of Q6_K blocks ([..., 128], [..., 64])."""
    c = codes.reshape(codes.shape[:-1] + (2, 4, 32)).astype(np.uint8)
    ql = np.zeros(codes.shape[:-1] + (2, 2, 32), np.uint8)
    qh = np.zeros(codes.shape[:-1] + (2, 32), np.uint8)
    for r in range(4):
        ql[..., :, r % 2, :] |= (c[..., :, r, :] & 15) << (4 * (r // 2))
        qh |= (c[..., :, r, :] >> 4) << (2 * r)
    return ql.reshape(codes.shape[:-1] + (128,)), qh.reshape(codes.shape[:-1] + (64,))


def _scales_mins(s):
    """[..., 12] packed bytes -> 8 scales, 8 mins (uint8), as `scales_mins_k4`."""
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 2) & 0x30)], axis=-1)
    return sc, mn


def _pack_scales_mins(sc, mn):
    """The inverse of `_scales_mins` (`pack_scales_mins_k4`)."""
    return np.concatenate([(sc[..., 0:4] & 63) | ((sc[..., 4:8] >> 4) << 6),
                           (mn[..., 0:4] & 63) | ((mn[..., 4:8] >> 4) << 6),
                           (sc[..., 4:8] & 15) | ((mn[..., 4:8] & 15) << 4)], axis=-1).astype(np.uint8)


def _groups(ttype, blk):
    """Plain blocks of whole groups [G, 8, nb, ROW_BLOCK] -> group blocks [G, nb, GROUP_BLOCK]."""
    G, _, nb, _ = blk.shape
    if ttype in (Q8_0, Q4_0):
        return np.concatenate([_f16_bytes(blk, 0), _code_bytes(blk[..., 2:], blk.shape[-1] // 8)], axis=-1)
    if ttype == Q4_K:
        sc, mn = _scales_mins(blk[..., 4:16])  # [G, 8k, nb, 8j]

        def by_j(a):  # [G, k, nb, j] -> [G, nb, 64]: [j][k]
            return a.transpose(0, 2, 3, 1).reshape(G, nb, 64)
        return np.concatenate([_f16_bytes(blk, 0), _f16_bytes(blk, 2), by_j(sc), by_j(mn),
                               _code_bytes(blk[..., 16:144], 8)], axis=-1)
    # Q6_K: part c (sub-blocks 2c, 2c+1) = 256 bytes of low nibbles [g][k][l] (nibble p: sub-block 2c+p),
    # then 128 bytes of high bit pairs [2p + g/4][k][l] (field g % 4)
    codes = _q6k_codes(blk).reshape(G, 8, nb, 4, 2, 8, 4).transpose(0, 2, 3, 4, 5, 1, 6)  # [G,nb,c,p,g,k,l]
    lo = (codes[:, :, :, 0] & 15) | ((codes[:, :, :, 1] & 15) << 4)  # [G,nb,c,g,k,l]
    hi = (codes >> 4).reshape(G, nb, 4, 2, 2, 4, 8, 4)  # [G,nb,c,p,g/4,g%4,k,l]
    hi = sum((hi[:, :, :, :, :, f] << (2 * f)) for f in range(4)).astype(np.uint8)  # [G,nb,c,p,g/4,k,l]
    qs = np.concatenate([lo.reshape(G, nb, 4, 256), hi.reshape(G, nb, 4, 128)], axis=-1).reshape(G, nb, 1536)
    scales = blk[..., 192:208].transpose(0, 2, 3, 1).reshape(G, nb, 128)  # [i][k]
    return np.concatenate([_f16_bytes(blk, 208), scales, qs], axis=-1)


def _rows(ttype, grp):
    """Group blocks [G, nb, GROUP_BLOCK] -> plain blocks [G, 8, nb, ROW_BLOCK] (the inverse of `_groups`)."""
    G, nb, _ = grp.shape

    def f16s(lo):  # [G, nb, 16] -> [G, 8, nb, 2]
        return grp[..., lo:lo + 16].reshape(G, nb, 8, 2).transpose(0, 2, 1, 3)

    def codes_of(lo, n, per_part):  # the inverse of _code_bytes -> [G, 8, nb, n]
        c = n // (per_part * 4)
        part = grp[..., lo:lo + 8 * n].reshape(G, nb, c, per_part, 8, 4)
        return part.transpose(0, 4, 1, 2, 3, 5).reshape(G, 8, nb, n)

    if ttype in (Q8_0, Q4_0):
        n = 32 if ttype == Q8_0 else 16
        return np.concatenate([f16s(0), codes_of(16, n, n // 4)], axis=-1)
    if ttype == Q4_K:

        def by_k(a):  # [j][k] -> [G, k, nb, j]
            return a.reshape(G, nb, 8, 8).transpose(0, 3, 1, 2)
        scales = _pack_scales_mins(by_k(grp[..., 32:96]), by_k(grp[..., 96:160]))
        return np.concatenate([f16s(0), f16s(16), scales, codes_of(160, 128, 8)], axis=-1)
    qs = grp[..., 144:].reshape(G, nb, 4, 384)
    lo = qs[..., :256].reshape(G, nb, 4, 8, 8, 4)  # [c,g,k,l]
    hi = qs[..., 256:].reshape(G, nb, 4, 2, 2, 8, 4)  # [c,p,g/4,k,l]
    codes = np.empty((G, nb, 4, 2, 8, 8, 4), np.uint8)  # [c,p,g,k,l]
    for p in range(2):
        for g in range(8):
            high = (hi[:, :, :, p, g // 4] >> (2 * (g % 4))) & 3
            codes[:, :, :, p, g] = ((lo[:, :, :, g] >> (4 * p)) & 15) | (high << 4)
    codes = codes.transpose(0, 5, 1, 2, 3, 4, 6).reshape(G, 8, nb, 256)
    ql, qh = _q6k_from_codes(codes)
    scales = grp[..., 16:144].reshape(G, nb, 16, 8).transpose(0, 3, 1, 2)
    return np.concatenate([ql, qh, scales, f16s(0)], axis=-1)


def interleave(raw, ttype, rows, cols):
    """Plain bytes of a [rows, cols] matrix -> its rows8 bytes."""
    buf = np.frombuffer(bytes(raw), np.uint8) if not isinstance(raw, np.ndarray) else raw.reshape(-1)
    nb, rb = cols // BLOCK_WEIGHTS[ttype], ROW_BLOCK[ttype]
    whole = rows // ROWS8 * ROWS8
    head = buf[:whole * nb * rb].reshape(whole // ROWS8, ROWS8, nb, rb)
    return _groups(ttype, head).tobytes() + buf[whole * nb * rb:].tobytes()


def deinterleave(raw, ttype, rows, cols):
    """Rows8 bytes of a [rows, cols] matrix -> its plain bytes."""
    buf = np.frombuffer(bytes(raw), np.uint8) if not isinstance(raw, np.ndarray) else raw.reshape(-1)
    nb = cols // BLOCK_WEIGHTS[ttype]
    groups = rows // ROWS8 * nb * GROUP_BLOCK[ttype]
    head = buf[:groups].reshape(rows // ROWS8, nb, GROUP_BLOCK[ttype])
    return _rows(ttype, head).tobytes() + buf[groups:].tobytes()
