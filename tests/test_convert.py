"""Tests for tools/convert.py (and its source readers), tools/mlb.py and the
numpy reference forward (tools/reference_forward.py)."""
import base64
import json
import os
import shutil
import struct

import numpy as np
import pytest

# tools/ is on sys.path: conftest, which pytest loads before this module, puts it there
import convert
import families
import llama2c
import mlb
import reference_forward as rf
from conftest import FIXTURES, REPO, ml_bin, run_ml, run_tool, unavailable
from source_common import permute_to_interleaved, unpermute_interleaved
from source_hf import hf_meta

TINY = FIXTURES / "hf-tiny"
FAMILIES = sorted(p.name for p in TINY.iterdir() if (p / "config.json").exists()) if TINY.exists() else []


def _f16(x):
    return np.float32(np.float16(x))


# --------------------------------------------------------------------------
# block packing against straightforward per-block references

def ref_q8_0(x, f32_scale=False):
    out = bytearray()
    for blk in np.asarray(x, np.float32).reshape(-1, 32):
        amax = float(np.max(np.abs(blk)))
        d = np.float32(amax / 127.0)
        q = [int(np.rint(v / d)) if d else 0 for v in blk]
        out += struct.pack("<f" if f32_scale else "<e", d)
        out += struct.pack("<32b", *q)
    return bytes(out)


def ref_q4_0_max(x, f32_scale=False):
    out = bytearray()
    for blk in np.asarray(x, np.float32).reshape(-1, 32):
        i = int(np.argmax(np.abs(blk)))
        d = np.float32(blk[i] / -8.0)
        idv = np.float32(1.0 / d) if d else np.float32(0)
        q = [min(15, int(np.float32(v) * idv + np.float32(8.5))) for v in blk]
        out += struct.pack("<f" if f32_scale else "<e", d)
        out += bytes(q[j] | (q[j + 16] << 4) for j in range(16))
    return bytes(out)


@pytest.mark.parametrize("f32_scale", [False, True])
def test_q8_0_packing_matches_reference(f32_scale):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 64)).astype(np.float32) * rng.uniform(0.01, 3, (6, 1)).astype(np.float32)
    x[2, :32] = 0.0  # all-zero block
    tt = mlb.Q8_0_F32 if f32_scale else mlb.Q8_0
    raw = mlb.encode(x, tt)
    assert raw == ref_q8_0(x, f32_scale)
    assert len(raw) == mlb.tensor_nbytes(tt, x.shape)
    y = mlb.decode(raw, tt, x.shape)
    d = np.abs(x).reshape(-1, 32).max(1) / 127
    err = np.abs(y - x).reshape(-1, 32).max(1)
    assert np.all(err <= d * 0.5 * 1.01 + (d * 2e-3 if not f32_scale else 0) + 1e-12)


@pytest.mark.parametrize("f32_scale", [False, True])
def test_q4_0_max_packing_matches_reference(f32_scale):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 96)).astype(np.float32)
    x[1, 32:64] = 0.0
    tt = mlb.Q4_0_F32 if f32_scale else mlb.Q4_0
    raw = mlb.encode(x, tt, "max")
    assert raw == ref_q4_0_max(x, f32_scale)
    # decode with the FORMAT.md nibble order, by hand
    bb = 20 if f32_scale else 18
    sd = "<f" if f32_scale else "<e"
    y = []
    for b in range(len(raw) // bb):
        blk = raw[b * bb:(b + 1) * bb]
        d = struct.unpack(sd, blk[:bb - 16])[0]
        lo = [(c & 15) - 8 for c in blk[bb - 16:]]
        hi = [(c >> 4) - 8 for c in blk[bb - 16:]]
        y += [d * v for v in lo + hi]
    np.testing.assert_array_equal(mlb.decode(raw, tt, x.shape), np.asarray(y, np.float32).reshape(x.shape))


def test_q4_fit_never_worse_than_max():
    rng = np.random.default_rng(3)
    blocks = [rng.standard_normal((2000, 32)),
              rng.standard_t(3, (2000, 32)),
              rng.uniform(-1, 1, (2000, 32)) * 1e-3,
              rng.laplace(size=(2000, 32))]
    b = np.concatenate(blocks).astype(np.float32)
    b[:50] = 0.0
    b[50:100, 5] *= 20  # outliers
    for tt in (mlb.Q4_0, mlb.Q4_0_F32):
        e_fit = ((mlb.roundtrip(b, tt, "fit") - b) ** 2).sum(1)
        e_max = ((mlb.roundtrip(b, tt, "max") - b) ** 2).sum(1)
        assert np.all(e_fit <= e_max * (1 + 1e-6) + 1e-30)
        nz = e_max > 0
        assert np.mean(e_fit[nz] / e_max[nz]) < 0.95  # and it actually helps on average
    # the earlier grid search: with factors >= 1 the largest weight of each block is never clipped
    sd = np.float16
    d, q = mlb.q4_0_scales(b, "grid", sd, factors=np.linspace(1.0, 1.3, 25))
    y = d.astype(np.float32)[:, None] * (q - 8.0)
    r, i = np.arange(len(b)), np.abs(b).argmax(1)
    assert np.all(np.abs(y - b)[r, i] <= 0.5 * np.abs(d.astype(np.float32)) * 1.0001 + 1e-12)


def test_q4_fit_weighted():
    rng = np.random.default_rng(4)
    b = rng.standard_normal((3000, 32)).astype(np.float32)
    w = rng.uniform(0, 4, (3000, 32)).astype(np.float32) ** 2
    d0, q0 = mlb.q4_0_scales(b, "max")
    d1, q1 = mlb.q4_0_scales(b, "fit", weights=w)
    d2, q2 = mlb.q4_0_scales(b, "fit", weights=np.ones_like(w))
    d3, q3 = mlb.q4_0_scales(b, "fit")
    np.testing.assert_array_equal(d2, d3)
    np.testing.assert_array_equal(q2, q3)

    def err(d, q):
        return (w * (b - d.astype(np.float32)[:, None] * (q - 8.0)) ** 2).sum(1)

    assert np.all(err(d1, q1) <= err(d0, q0) * (1 + 1e-6))
    assert err(d1, q1).sum() < err(d3, q3).sum()


def test_q4_fit_pieces_do_not_change_the_result(monkeypatch):
    """The quantisers run on pieces of blocks on all cores: one block's scale and codes
    are the same whatever the piece size (here one piece, pieces of 1000, of 7)."""
    rng = np.random.default_rng(5)
    b = (rng.standard_normal((3001, 32)) * np.exp(rng.uniform(-20, 20, (3001, 1)))).astype(np.float32)
    b[::17] = 0.0
    b[1::19, 3] = 60000.0
    w = rng.uniform(0, 3, b.shape).astype(np.float32)
    results = []
    for piece in (100000, 1000, 7):
        monkeypatch.setattr(mlb, "PIECE", piece)
        results.append([mlb.q4_0_scales(b, rule, sd, weights=wt, mirror=m)
                        for sd in (np.float16, np.float32) for wt in (None, w)
                        for rule, m in (("fit", False), ("grid", False), ("grid", True))])
    for other in results[1:]:
        for (d0, q0), (d1, q1) in zip(results[0], other, strict=True):
            assert d0.tobytes() == d1.tobytes() and np.array_equal(q0, q1)


# --------------------------------------------------------------------------
# converter errors

def _assert_clean_failure(p, out):
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith("[")]
    assert len(lines) == 1, p.stderr
    assert not os.path.exists(out)
    assert not os.path.exists(str(out) + ".tmp")
    return lines[0]


def test_unknown_architecture(tmp_path):
    src = tmp_path / "m"
    shutil.copytree(TINY / "llama2", src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["model_type"] = "gpt_neox"
    cfg["architectures"] = ["GPTNeoXForCausalLM"]
    (src / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "o.mlb"
    line = _assert_clean_failure(run_tool("convert.py", src, "-o", out, check=False), out)
    assert "gpt_neox" in line and "unsupported architecture" in line


def _without_tensor(tmp_path, name):
    """A copy of the tiny llama2 checkpoint (config.json, model.safetensors) without tensor `name`."""
    from safetensors.numpy import load_file, save_file
    src = tmp_path / "m"
    src.mkdir()
    shutil.copy(TINY / "llama2" / "config.json", src / "config.json")
    t = load_file(str(TINY / "llama2" / "model.safetensors"))
    del t[name]
    save_file(t, str(src / "model.safetensors"))
    return src


def test_missing_tensor(tmp_path):
    src = _without_tensor(tmp_path, "model.layers.2.mlp.up_proj.weight")
    out = tmp_path / "o.mlb"
    line = _assert_clean_failure(run_tool("convert.py", src, "-o", out, "--type", "q4_0", check=False), out)
    assert "model.layers.2.mlp.up_proj.weight" in line


def test_missing_lm_head_untied(tmp_path):
    src = _without_tensor(tmp_path, "lm_head.weight")
    out = tmp_path / "o.mlb"
    line = _assert_clean_failure(run_tool("convert.py", src, "-o", out, check=False), out)
    assert "lm_head.weight" in line


def _write_safetensors(path, tensors):
    """Minimal safetensors writer (F32 or BF16 given as uint16 arrays)."""
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        dt = "BF16" if a.dtype == np.uint16 else "F32"
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def test_hf_sharded_bf16_multimodal_layout(tmp_path):
    """Sharded BF16 checkpoint with `model.language_model.` prefix, a
    text_config wrapper and vision / mtp tensors that must be skipped."""
    from safetensors.numpy import load_file
    t = load_file(str(TINY / "llama2" / "model.safetensors"))
    bf = {}
    for n, a in t.items():
        u = a.astype(np.float32).view(np.uint32)
        b = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
        nn = n.replace("model.", "model.language_model.", 1) if n.startswith("model.") else n
        bf[nn] = b
    bf["model.vision_tower.patch_embed.weight"] = np.zeros((4, 4), np.uint16)
    bf["mtp.layers.0.mlp.up_proj.weight"] = np.zeros((4, 4), np.uint16)
    names = sorted(bf)
    src = tmp_path / "mm"
    src.mkdir()
    half = len(names) // 2
    wm = {}
    for k, part in enumerate((names[:half], names[half:])):
        fn = f"model-0000{k + 1}-of-00002.safetensors"
        _write_safetensors(src / fn, {n: bf[n] for n in part})
        wm.update({n: fn for n in part})
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    inner = json.loads((TINY / "llama2" / "config.json").read_text())
    cfg = {"model_type": "llava_like", "architectures": ["SomethingForConditionalGeneration"],
           "text_config": inner, "vision_config": {"hidden_size": 4}}
    (src / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "m.mlb"
    run_tool("convert.py", src, "-o", out, "--type", "f32")
    m, W = rf.load_model(str(out))
    m0, W0 = rf.load_model(str(TINY / "llama2"))
    assert set(W) == set(W0)
    for n in W0:
        np.testing.assert_allclose(W[n], W0[n], rtol=2 ** -8, atol=1e-30, err_msg=n)
    assert m["arch"] == "llama" and m["tie_embeddings"] == 0


# --------------------------------------------------------------------------
# config forms

def _to_v4(cfg):
    """Rewrite a transformers v5 config (rope_parameters) in the v4 form."""
    c = dict(cfg)
    rp = c.pop("rope_parameters")
    if "full_attention" in rp:  # gemma3: per layer type
        full, local = rp["full_attention"], rp["sliding_attention"]
        c["rope_theta"] = full["rope_theta"]
        c["rope_local_base_freq"] = local["rope_theta"]
        if full.get("rope_type", "default") != "default":
            c["rope_scaling"] = {k: v for k, v in full.items() if k != "rope_theta"}
        c.pop("layer_types", None)
        c["sliding_window_pattern"] = c.pop("_sliding_window_pattern", 6)
    else:
        c["rope_theta"] = rp["rope_theta"]
        if "partial_rotary_factor" in rp:
            c["partial_rotary_factor"] = rp["partial_rotary_factor"]
        rest = {k: v for k, v in rp.items() if k not in ("rope_theta", "partial_rotary_factor")}
        if rest.get("rope_type", "default") != "default":
            rest["type"] = rest.pop("rope_type")  # the older v4 spelling
            c["rope_scaling"] = rest
        else:
            c["rope_scaling"] = None
    return c


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_v4_and_v5_config_forms_agree(family):
    cfg = json.loads((TINY / family / "config.json").read_text())
    v5 = hf_meta(cfg)
    v4 = hf_meta(_to_v4(cfg))
    assert v4 == v5
    if family == "gemma2-softcap":  # v4 Gemma 2 configs have no layer_types
        c = _to_v4(cfg)
        c.pop("layer_types")
        assert hf_meta(c) == v5


def test_hf_metadata_details():
    m = hf_meta(json.loads((TINY / "llama3-scaled" / "config.json").read_text()))[1]
    assert (m["rope_scaling"], m["rope_scaling_factor"], m["rope_original_context"]) == ("llama3", 32.0, 16)
    m = hf_meta(json.loads((TINY / "gemma3-local-global" / "config.json").read_text()))[1]
    assert m["layer_kinds"] == [1, 1, 1, 1, 1, 0] and m["rope_local_theta"] == 10000.0
    assert m["rope_theta"] == 1e6 and m["rope_scaling"] == "linear" and m["norm_unit_offset"] == 1
    m = hf_meta(json.loads((TINY / "qwen3_5-hybrid" / "config.json").read_text()))[1]
    assert m["rope_dim"] == 8 and m["layer_kinds"] == [2, 2, 2, 0] and m["attn_output_gate"] == 1
    m = hf_meta(json.loads((TINY / "smollm3-nope" / "config.json").read_text()))[1]
    assert m["layer_rope"] == [1, 1, 1, 0]
    # multimodal wrapper: text_config is used
    inner = json.loads((TINY / "gemma3-local-global" / "config.json").read_text())
    outer = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
             "text_config": inner, "vision_config": {"hidden_size": 8}}
    assert hf_meta(outer) == hf_meta(inner)


def test_family_layer_patterns():
    """families.py's default layer patterns, and a source's period overriding them."""
    S, F = families.SLIDING, families.FULL
    fam = families.FAMILIES
    assert fam["gemma2"].layer_kinds(4) == [S, F, S, F]
    assert fam["gemma3"].layer_kinds(7) == [S, S, S, S, S, F, S]
    assert fam["gemma3"].layer_kinds(4, period=2) == [S, F, S, F]
    assert fam["gemma3"].layer_kinds(3, period=0) == [S, S, S]  # llama.cpp: period 0 = every layer slides
    assert fam["mistral"].layer_kinds(3, window=8) == [S, S, S] and fam["mistral"].layer_kinds(3) is None
    assert fam["qwen2"].layer_kinds(4, window=8, window_from=2) == [F, F, S, S]
    assert fam["qwen2"].layer_kinds(4, window=8) == [F, F, F, F]  # max_window_layers defaults to every layer
    assert fam["llama"].layer_kinds(4, window=8, period=2) is None
    assert families.from_hf("gemma3_text", None) is fam["gemma3"]
    assert families.from_hf(None, ["Foo", "Qwen3_5ForConditionalGeneration"]) is fam["qwen3_5"]
    assert families.from_gguf("gemma3") is fam["gemma3"] and families.from_gguf("qwen3_5") is None
    # both readers take the fixed traits from the table: Gemma 3 from HF has them all
    m = hf_meta(json.loads((TINY / "gemma3-local-global" / "config.json").read_text()))[1]
    assert fam["gemma3"].traits(m["hidden_size"]).items() <= m.items()


# --------------------------------------------------------------------------
# K-quants made from floats (mlb.encode_k)

def _k_test_data():
    """Super-blocks of 256 with the awkward cases: all zero, constant (+ and -),
    negative only, positive only, one spike, huge, tiny, and ordinary ones."""
    rng = np.random.default_rng(7)
    rows = [np.zeros(256), np.full(256, 0.37), np.full(256, -2.5),
            -np.abs(rng.standard_normal(256)), np.abs(rng.standard_normal(256)) + 1.0,
            np.where(np.arange(256) == 77, 50.0, 0.01 * rng.standard_normal(256)),
            1e4 * rng.standard_normal(256), 1e-3 * rng.standard_normal(256)]
    mixed = rng.standard_normal(256)
    mixed[:32] = 0.0  # one zero sub-block next to ordinary ones
    mixed[32:64] *= 40.0  # and a sub-block far wider than the others
    rows.append(mixed)
    x = np.concatenate([np.stack(rows), rng.standard_normal((23, 256)) * rng.uniform(0.01, 3, (23, 1))])
    return x.astype(np.float32).reshape(8, 1024)


def _k_error_bound(raw, ttype, x):
    """Per-element error bound from the scales as stored (derived in the comments)."""
    blk = np.frombuffer(raw, np.uint8).reshape(-1, mlb.K_BLOCK_BYTES[ttype])
    nb = blk.shape[0]
    f32 = np.float32
    if ttype == mlb.Q6_K:
        d = np.ascontiguousarray(blk[:, 208:210]).view("<f2").astype(f32)  # [nb, 1]
        sc = np.ascontiguousarray(blk[:, 192:208]).view(np.int8).astype(f32)
        step = np.abs(d * sc)  # [nb, 16], per sub-block of 16
        # half a step from rounding; the sub-block scale s lost up to d/2 to its
        # int8 rounding, which moves the grid's end (32 steps out) by 16·d; the
        # search may also pick a scale that clips the largest weight by a step
        bound = step + 16 * np.abs(d) * 1.01
        return np.repeat(bound, 16, axis=1).reshape(x.shape)
    d = np.ascontiguousarray(blk[:, 0:2]).view("<f2").astype(f32)
    dmin = np.ascontiguousarray(blk[:, 2:4]).view("<f2").astype(f32)
    sc, _ = mlb._scales_mins_k4(blk[:, 4:16])
    nmax = 15 if ttype == mlb.Q4_K else 31
    step = d * sc  # [nb, 8]
    # half a step (rounding) + a step (the search may clip an extreme weight) +
    # the 6-bit rounding of the scale (d/2, times nmax steps) and of the min (dmin/2)
    bound = 1.5 * step + (nmax * d + dmin) / 2 * 1.01
    return np.repeat(bound, 32, axis=1).reshape(nb * 256)[:x.size].reshape(x.shape)


@pytest.mark.parametrize("rule", mlb.K_RULES)
@pytest.mark.parametrize("ttype", [mlb.Q4_K, mlb.Q5_K, mlb.Q6_K])
def test_k_quant_roundtrip_and_gguf_decode(ttype, rule):
    from gguf import GGMLQuantizationType, quants
    x = _k_test_data()
    raw = mlb.encode_k(x, ttype, rule)
    assert len(raw) == mlb.tensor_nbytes(ttype, x.shape)
    y = mlb.decode(raw, ttype, x.shape)
    # llama.cpp's layout: the gguf package's own dequantiser reads the same values
    g = quants.dequantize(np.frombuffer(raw, np.uint8).reshape(x.shape[0], -1),
                          GGMLQuantizationType[mlb.TYPE_NAMES[ttype].upper()])
    np.testing.assert_allclose(y, g, rtol=1e-6, atol=0)
    err = np.abs(y - x)
    bound = _k_error_bound(raw, ttype, x)
    assert np.all(err <= bound + 1e-30), f"worst excess {np.max(err - bound)}"
    flat = x.reshape(-1, 256)
    yf = y.reshape(-1, 256)
    assert np.all(yf[0] == 0)  # all zero stays zero
    np.testing.assert_allclose(yf[1], flat[1], rtol=0.02)  # constants
    np.testing.assert_allclose(yf[2], flat[2], rtol=0.02)
    # relative rms error of the ordinary blocks, what 4/5/6 bits give
    rel = np.sqrt(np.mean((yf[9:] - flat[9:]) ** 2, axis=1) / np.mean(flat[9:] ** 2, axis=1))
    assert rel.max() < {mlb.Q4_K: 0.12, mlb.Q5_K: 0.06, mlb.Q6_K: 0.03}[ttype]
    # encode() dispatches to it; rows must be whole super-blocks
    assert mlb.encode(x, ttype) == mlb.encode_k(x, ttype)
    with pytest.raises(mlb.MlbError):
        mlb.encode(np.zeros((2, 128), np.float32), ttype)


def test_k_search_never_worse_than_minmax_on_average():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((64, 512)) * rng.uniform(0.01, 2, (64, 1))).astype(np.float32)
    for tt in (mlb.Q4_K, mlb.Q5_K, mlb.Q6_K):
        e = {r: np.mean((mlb.roundtrip_k(x, tt, r) - x) ** 2) for r in mlb.K_RULES}
        assert e["search"] < e["minmax"], (tt, e)


def test_q4_k_m_mix():
    names = ["token_embd", "output_norm"]
    for i in range(8):
        names += [f"blk.{i}.{k}" for k in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_o",
                                         "ffn_gate", "ffn_up", "ffn_down")]
    tied = convert.q4_k_m_types(names)
    # 8 layers: more bits for the first and last eighth (0, 7) and every third between (3, 6)
    six = {f"blk.{i}.{k}" for i in (0, 3, 6, 7) for k in ("attn_v", "ffn_down")} | {"token_embd"}
    assert {n for n, t in tied.items() if t == mlb.Q6_K} == six
    assert all(tied[n] == mlb.Q4_K for n in names if n not in six)
    untied = convert.q4_k_m_types(names + ["output"])
    assert untied["output"] == mlb.Q6_K and untied["token_embd"] == mlb.Q4_K
    # llama.cpp's pattern at Qwen2.5-1.5B's 28 layers (its Q4_K_M file has these attn_v in Q6_K)
    n28 = [f"blk.{i}.attn_v" for i in range(28)]
    assert [i for i in range(28) if convert.q4_k_m_types(n28)[n28[i]] == mlb.Q6_K] == \
        [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]
    # choose_type: the row length decides the fallback; norms stay F32; GGUF K tensors are kept
    ct = convert.choose_type
    assert ct("blk.0.attn_q", (256, 512), "q4_k_m", "f16", k_type=mlb.Q4_K) == mlb.Q4_K
    assert ct("blk.0.ffn_down", (256, 512), "q4_k_m", "f16", k_type=mlb.Q6_K) == mlb.Q6_K
    assert ct("blk.0.attn_q", (576, 576), "q4_k_m", "f16", k_type=mlb.Q4_K) == mlb.Q8_0
    assert ct("blk.0.attn_q", (576, 576), "q4_k_m", "f32", k_type=mlb.Q4_K) == mlb.Q8_0_F32
    assert ct("blk.0.attn_q", (64, 48), "q4_k_m", "f16", k_type=mlb.Q4_K) == mlb.F16
    assert ct("blk.0.attn_norm", (512,), "q4_k_m", "f16") == mlb.F32
    assert ct("blk.0.attn_q", (256, 512), "q4_k_m", "f16", source="Q5_K", k_type=mlb.Q4_K) == mlb.Q5_K
    assert ct("blk.0.attn_q", (256, 512), "q4_k_m", "f16", source="F16", k_type=mlb.Q4_K) == mlb.Q4_K
    assert ct("blk.0.attn_q", (256, 512), "q4_k_m", "f16", source="Q4_1", k_type=mlb.Q4_K) == mlb.Q4_K


def _wide_llama(tmp_path, seed=11):
    """A random Llama checkpoint whose rows are multiples of 256 (the hf-tiny
    fixtures' 64 / 192 are not, so they would get no K-quant at all)."""
    cfg = json.loads((TINY / "llama2" / "config.json").read_text())
    cfg.update(hidden_size=256, intermediate_size=512, head_dim=64, num_attention_heads=4,
               num_key_value_heads=2, num_hidden_layers=8, vocab_size=512)
    D, F, L, V, KV = 256, 512, 8, 512, 128
    rng = np.random.default_rng(seed)

    def w(*shape, std=0.06):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    t = {"model.embed_tokens.weight": w(V, D, std=1.0), "model.norm.weight": np.ones(D, np.float32),
         "lm_head.weight": w(V, D)}
    for i in range(L):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": np.ones(D, np.float32),
                  p + "post_attention_layernorm.weight": np.ones(D, np.float32),
                  p + "self_attn.q_proj.weight": w(D, D), p + "self_attn.k_proj.weight": w(KV, D),
                  p + "self_attn.v_proj.weight": w(KV, D), p + "self_attn.o_proj.weight": w(D, D),
                  p + "mlp.gate_proj.weight": w(F, D), p + "mlp.up_proj.weight": w(F, D),
                  p + "mlp.down_proj.weight": w(D, F)})
    src = tmp_path / "wide"
    src.mkdir()
    _write_safetensors(src / "model.safetensors", t)
    (src / "config.json").write_text(json.dumps(cfg))
    return src


def test_q4_k_m_conversion_runs(tmp_path):
    exe = ml_bin()
    if not exe.is_file():
        unavailable(f"no executable {exe} (set KRAFLA_BIN or build target/release)")
    src = _wide_llama(tmp_path)
    f32, k = tmp_path / "f32.mlb", tmp_path / "k.mlb"
    run_tool("convert.py", src, "-o", f32, "--type", "f32")
    run_tool("convert.py", src, "-o", k, "--type", "q4_k_m")
    r = mlb.MlbReader(k)
    assert r.meta["convert_type"] == "q4_k_m" and r.meta["convert_k_rule"] == mlb.K_RULE
    types = {n: t for n, (t, _, _) in r.tensors.items()}
    assert types["output"] == mlb.Q6_K and types["token_embd"] == mlb.Q4_K
    assert types["blk.0.attn_v"] == mlb.Q6_K and types["blk.1.attn_v"] == mlb.Q4_K
    assert types["blk.3.ffn_down"] == mlb.Q6_K and types["blk.4.ffn_down"] == mlb.Q4_K
    assert types["blk.2.attn_q"] == mlb.Q4_K and types["blk.2.attn_norm"] == mlb.F32
    ids = [1, 5, 9, 200, 31, 77, 400, 3]

    def run(path):
        out = tmp_path / (path.stem + ".f32")
        run_ml(path, "--prompt-ids", ",".join(map(str, ids)), "--logits-out", out, "-n", "0")
        return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)

    got, ref = run(k), run(f32)
    # the executable reads the K blocks as numpy decodes them: against the numpy
    # f32 forward of the same file's dequantised weights the difference is the
    # runtime's 8-bit activations only (measured 2.1 %; a q8_0 file: 2.0 %; a
    # misread layout gives ~100 %)
    mine = rf.forward(*rf.load_model(str(k)), ids)
    assert np.sqrt(np.mean((got - mine) ** 2) / np.mean(mine ** 2)) < 0.04
    # against the f32 file: what the quantisation moves in this random model,
    # which amplifies weight noise a lot (measured 0.26; --type q4_0: 0.28, q8_0: 0.03)
    rel = np.sqrt(np.mean((got - ref) ** 2) / np.mean(ref ** 2))
    assert rel < 0.4


# --------------------------------------------------------------------------
# HF conversions vs transformers' logits (numpy reference forward)

@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "qwen3_5-hybrid"])
def test_hf_tiny_f32_matches_transformers(family, tmp_path):
    out = tmp_path / "m.mlb"
    p = run_tool("convert.py", TINY / family, "-o", out, "--type", "f32")
    assert "token_embd" in p.stderr  # progress lines
    assert not os.path.exists(str(out) + ".tmp")
    diff = rf.check_tiny(*rf.load_model(str(out)), TINY / family / "reference.json")
    assert diff < 1e-3


def test_qwen3_5_converts(tmp_path):
    out = tmp_path / "m.mlb"
    run_tool("convert.py", TINY / "qwen3_5-hybrid", "-o", out, "--type", "q8_0")
    r = mlb.MlbReader(out)
    assert r.meta["arch"] == "qwen3_5" and "blk.0.ssm_qkv" in r.tensors and r.tensors["blk.0.ssm_conv"][1] == (128, 4)
    assert r.tensors["blk.3.attn_q"][1] == (256, 64)


@pytest.mark.parametrize("qtype", ["q8_0", "q4_0", "q4_mixed", "f16"])
def test_quantised_types_and_reference_logits(qtype, tmp_path):
    out = tmp_path / "m.mlb"
    run_tool("convert.py", TINY / "llama2", "-o", out, "--type", qtype, "--scale-type", "f32")
    r = mlb.MlbReader(out)
    types = {n: t for n, (t, _, _) in r.tensors.items()}
    assert types["blk.0.attn_norm"] == mlb.F32 and types["output_norm"] == mlb.F32
    want = {"q8_0": mlb.Q8_0_F32, "q4_0": mlb.Q4_0_F32, "q4_mixed": mlb.Q4_0_F32, "f16": mlb.F16}[qtype]
    assert types["blk.1.ffn_up"] == want
    if qtype == "q4_mixed":
        assert types["blk.1.ffn_down"] == mlb.Q8_0_F32 and types["token_embd"] == mlb.Q8_0_F32
    fx = json.loads((TINY / "llama2" / "reference.json").read_text())
    want = np.frombuffer(base64.b64decode(fx["logits_f32_le_base64"]), "<f4").reshape(fx["logits_shape"])
    got = rf.forward(*rf.load_model(str(out)), fx["input_ids"])
    rel = np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2))
    # the tiny random model (init range 0.25) amplifies weight noise a lot;
    # these bounds only catch gross packing errors (a wrong layout gives ~1.4)
    assert rel < {"f16": 0.01, "q8_0": 0.15, "q4_0": 0.9, "q4_mixed": 0.9}[qtype]


def test_imatrix_option(tmp_path):
    meta, W = rf.load_model(str(TINY / "llama2"))
    rng = np.random.default_rng(5)
    im = {n: rng.uniform(0, 3, a.shape[1]).astype(np.float32) ** 4 for n, a in W.items() if a.ndim == 2}
    np.savez(tmp_path / "im.npz", **im)
    a, b = tmp_path / "a.mlb", tmp_path / "b.mlb"
    run_tool("convert.py", TINY / "llama2", "-o", a, "--type", "q4_0")
    run_tool("convert.py", TINY / "llama2", "-o", b, "--type", "q4_0", "--imatrix", tmp_path / "im.npz")
    ra, rb = mlb.MlbReader(a), mlb.MlbReader(b)
    assert rb.meta["convert_q4_scale"] == "fit+imatrix"
    n = "blk.1.ffn_gate"
    x = W[n]
    ea = (((ra.get(n) - x) ** 2) * im[n]).sum()
    eb = (((rb.get(n) - x) ** 2) * im[n]).sum()
    assert eb < ea
    im["blk.0.attn_q"] = np.ones(3, np.float32)
    np.savez(tmp_path / "bad.npz", **im)
    out = tmp_path / "c.mlb"
    p = run_tool("convert.py", TINY / "llama2", "-o", out, "--type", "q4_0", "--imatrix", tmp_path / "bad.npz",
                 check=False)
    assert "blk.0.attn_q" in _assert_clean_failure(p, out)


# --------------------------------------------------------------------------
# GGUF: SmolLM2-135M-Instruct Q4_1 vs transformers' GGUF loader

def test_gguf_smollm2_matches_transformers(smollm2_gguf, tmp_path):
    out = tmp_path / "smol.mlb"
    run_tool("convert.py", smollm2_gguf, "-o", out, "--type", "f32")
    meta, W = rf.load_model(str(out))
    assert meta["arch"] == "llama" and meta["tie_embeddings"] == 1 and meta["n_kv_heads"] == 3
    assert W["blk.0.attn_q"].shape == (576, 576) and W["blk.0.ffn_down"].shape == (576, 1536)
    worst, top1 = rf.check_real(meta, W, FIXTURES / "real" / "smollm2-135m.json")
    assert top1 and worst < 2e-2
    # without undoing llama.cpp's q/k permutation the model would be wrong
    H, Hkv = meta["n_heads"], meta["n_kv_heads"]
    for i in range(meta["n_layers"]):
        W[f"blk.{i}.attn_q"] = permute_to_interleaved(W[f"blk.{i}.attn_q"], H)
        W[f"blk.{i}.attn_k"] = permute_to_interleaved(W[f"blk.{i}.attn_k"], Hkv)
    assert rf.check_real(meta, W, FIXTURES / "real" / "smollm2-135m.json")[0] > 0.5


def test_gguf_q4_k_m_keeps_and_requantizes(smollm2_gguf, tmp_path):
    """From a GGUF file, --type q4_k_m keeps the Q8_0 token_embd and quantises
    the Q4_1 matrices; --requantize re-encodes every tensor from its floats."""
    import gguf
    a, b = tmp_path / "a.mlb", tmp_path / "b.mlb"
    run_tool("convert.py", smollm2_gguf, "-o", a, "--type", "q4_k_m")
    run_tool("convert.py", smollm2_gguf, "-o", b, "--type", "q4_k_m", "--requantize")
    ra, rb = mlb.MlbReader(a), mlb.MlbReader(b)
    ta = {n: t for n, (t, _, _) in ra.tensors.items()}
    # 30 layers: more bits for 0-2, 5, 8, ..., 26, 27; ffn_down has 1536 columns, the rest 576 (-> Q8_0)
    assert ta["blk.0.ffn_down"] == mlb.Q6_K and ta["blk.3.ffn_down"] == mlb.Q4_K and ta["blk.5.ffn_down"] == mlb.Q6_K
    assert ta["blk.3.ffn_up"] == mlb.Q8_0 and ta["blk.3.attn_v"] == mlb.Q8_0 and ta["token_embd"] == mlb.Q8_0
    assert {n: t for n, (t, _, _) in rb.tensors.items()} == ta
    assert np.array_equal(ra.raw("blk.3.ffn_down"), rb.raw("blk.3.ffn_down"))
    # the source's Q8_0 embedding: copied as it is, or requantised from its values (Q8_0 again, near)
    src = {t.name: t for t in gguf.GGUFReader(smollm2_gguf).tensors}["token_embd.weight"]
    assert bytes(ra.raw("token_embd")) == bytes(np.asarray(src.data).reshape(-1).view(np.uint8))
    e = ra.get("token_embd")
    np.testing.assert_allclose(rb.get("token_embd"), e, atol=0.02 * np.abs(e).max())
    p = run_tool("convert.py", smollm2_gguf, "-o", tmp_path / "c.mlb", "--type", "auto", "--requantize", check=False)
    _assert_clean_failure(p, tmp_path / "c.mlb")


def test_permutation_inverse():
    w = np.arange(6 * 16 * 4, dtype=np.float32).reshape(6 * 16, 4)
    np.testing.assert_array_equal(unpermute_interleaved(permute_to_interleaved(w, 6), 6), w)


# --------------------------------------------------------------------------
# llama2.c round trips on the llama2 fixture

@pytest.mark.parametrize("version", [0, 1, 2])
@pytest.mark.parametrize("family", ["llama2", "smollm2-tied"])
def test_llama2c_roundtrip(version, family, tmp_path):
    meta, W = rf.load_model(str(TINY / family))
    ck = tmp_path / "model.bin"
    {0: llama2c.write_v0, 1: llama2c.write_v1, 2: llama2c.write_v2}[version](str(ck), meta, W)
    out = tmp_path / "m.mlb"
    run_tool("convert.py", ck, "-o", out, "--type", "f32")
    m2, W2 = rf.load_model(str(out))
    assert m2["arch"] == "llama2c" and m2["tie_embeddings"] == meta["tie_embeddings"]
    for k in ("vocab_size", "hidden_size", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim",
              "context_length"):
        assert m2[k] == meta[k], k
    assert set(W2) == set(W)
    for n, a in W.items():
        if version == 2 and a.ndim == 2:
            g = 64
            tol = np.abs(a).reshape(-1, g).max(1) / 127 * 0.5 * 1.0001 + 1e-7
            assert np.all(np.abs(W2[n] - a).reshape(-1, g) <= tol[:, None]), n
        else:
            np.testing.assert_array_equal(W2[n], a, err_msg=n)
    if family == "llama2" and meta["rope_theta"] == 10000.0:
        fx = json.loads((TINY / family / "reference.json").read_text())
        want = np.frombuffer(base64.b64decode(fx["logits_f32_le_base64"]), "<f4").reshape(fx["logits_shape"])
        got = rf.forward(m2, W2, fx["input_ids"])
        if version < 2:
            assert np.abs(got - want).max() < 1e-3
        else:  # Q8 weights; the tiny random model amplifies weight noise
            assert np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2)) < 0.15


def test_llama2c_truncated(tmp_path):
    meta, W = rf.load_model(str(TINY / "llama2"))
    ck = tmp_path / "model.bin"
    llama2c.write_v0(str(ck), meta, W)
    data = ck.read_bytes()
    ck.write_bytes(data[: len(data) // 2])
    out = tmp_path / "m.mlb"
    line = _assert_clean_failure(run_tool("convert.py", ck, "-o", out, check=False), out)
    assert "truncated" in line


def test_gguf_reader_matches_the_gguf_package_and_refuses_every_cut_and_mutation(tmp_path):
    """tools/gguf_file.py reads what the `gguf` package's GGUFReader reads (fields, tensor
    table, bytes); every truncation and random byte mutation of a real file either reads or
    raises GgufError (one line), never another exception, and a count larger than the file
    is refused before anything is allocated for it."""
    import random

    import gguf

    import gguf_file

    seed = REPO / "tests" / "fuzz" / "seeds" / "gguf" / "llama-1layer.gguf"
    fields, tensors = gguf_file.read(seed)
    r = gguf.GGUFReader(seed)
    assert fields == {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert [(t.name, t.shape, t.tensor_type, t.nbytes) for t in tensors] == \
        [(t.name, tuple(int(d) for d in t.shape), t.tensor_type, int(t.n_bytes)) for t in r.tensors]
    for a, b in zip(tensors, r.tensors, strict=True):
        assert a.data.shape == b.data.shape and np.array_equal(a.data, b.data)
    data = seed.read_bytes()
    bad = tmp_path / "bad.gguf"

    def check(raw):
        bad.write_bytes(raw)
        try:
            gguf_file.read(bad)
        except gguf_file.GgufError as e:
            assert "\n" not in str(e) and str(e)
    for n in range(0, len(data), 7):
        bad.write_bytes(data[:n])
        with pytest.raises(gguf_file.GgufError):
            gguf_file.read(bad)
    rng = random.Random(19)
    for _ in range(1000):
        raw = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        check(bytes(raw))
    # a field count of 2^60: refused at once
    check(data[:16] + struct.pack("<Q", 1 << 60) + data[24:])
    with pytest.raises(gguf_file.GgufError, match="truncated"):
        gguf_file.read(bad)


# --------------------------------------------------------------------------
# .mlb writer / reader

def test_mlb_roundtrip_and_layout(tmp_path):
    p = tmp_path / "x.mlb"
    meta = {"arch": "llama", "n": 3, "f": 0.5, "ia": [1, -2], "fa": [0.5, 1.5]}
    a = np.arange(64, dtype=np.float32).reshape(2, 32)
    tensors = [("a", mlb.F32, [2, 32], lambda: mlb.encode(a, mlb.F32)),
               ("b", mlb.Q8_0, [2, 32], lambda: mlb.encode(a, mlb.Q8_0)),
               ("c", mlb.F32, [3], lambda: mlb.encode(np.ones(3), mlb.F32))]
    with open(p, "wb") as f:
        mlb.write_mlb(f, meta, tensors)
    r = mlb.MlbReader(p)
    assert r.meta == meta
    assert r.data_start % 64 == 0 and all(off % 64 == 0 for _, _, off in r.tensors.values())
    np.testing.assert_array_equal(r.get("a"), a)
    assert np.abs(r.get("b") - a).max() <= 63 / 127 * 0.5 * 1.01
    raw = p.read_bytes()
    assert raw[:8] == b"KRAFLAMB" and struct.unpack("<IIII", raw[8:24]) == (1, 5, 3, 0)
    assert len(raw) % 64 == 0
