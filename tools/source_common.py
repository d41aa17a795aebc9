"""What the source readers of tools/convert.py share: the error they raise and
the RoPE row permutations.

A reader (source_hf.load_hf, source_gguf.load_gguf, source_llama2c.load_llama2c)
returns (meta, tensors): meta the .mlb metadata (keys starting with `_` are
internal and not written), tensors an ordered dict .mlb tensor name ->
(shape, loader, ...) where loader() gives float32 in .mlb layout (Hugging Face
layout: [out, in], q/k rows in the `half` RoPE layout), or for a GGUF matrix a
`source_gguf.GgufRows` that `numpy.asarray` reads (and `mlb.encode` reads in
pieces, in its worker processes).
"""


class ConvertError(Exception):
    """An error the user can fix (unsupported model, missing tensor, bad file):
    tools/convert.py prints it as one line and exits with status 2."""


def unpermute_interleaved(w, n_head):
    """Rows in interleaved RoPE layout (pairs 2i, 2i+1; llama.cpp GGUF, llama2.c)
    -> Hugging Face `half` layout (pairs i, i + hd/2).  Inverse of llama.cpp's
    convert_hf_to_gguf `permute`."""
    rows = w.shape[0]
    hd = rows // n_head
    return (w.reshape(n_head, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def permute_to_interleaved(w, n_head):
    """HF `half` layout -> interleaved (llama.cpp's `permute`)."""
    rows = w.shape[0]
    hd = rows // n_head
    return (w.reshape(n_head, 2, hd // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))
