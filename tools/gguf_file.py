"""A GGUF file's metadata and tensor table, read straight from its bytes.

    fields, tensors = gguf_file.read(path)

`fields` maps each metadata key to its value as Python has it (int, float,
bool, str, or a list of them); `tensors` lists the tensor table in file
order (`Tensor`: name, shape in GGUF order (fastest dimension first), type,
absolute offset and length of its bytes, and `data`, those bytes
memory-mapped as llama.cpp's `gguf` package shapes them, so
`gguf.quants.dequantize(t.data, t.tensor_type)` reads them).

The `gguf` package's own `GGUFReader` makes a numpy view of every part of
every field, which takes 13 s for a 150k-token vocabulary; this reader
decodes the same values in well under a second.  Every count, length and
offset is checked against the file's size before it is used, so a
truncated or hostile file raises `GgufError` (one line) and never allocates
more than the file holds.
"""
import mmap
import struct

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = b"GGUF"
# value type -> struct format of the scalar types (8: string, 9: array)
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


class GgufError(ValueError):
    """The file is not a GGUF file this reader can take (the message is one line)."""


class Tensor:
    """One entry of the tensor table; `data` maps its bytes."""

    def __init__(self, name, shape, tensor_type, offset, nbytes, data):
        self.name, self.shape, self.tensor_type = name, shape, tensor_type
        self.offset, self.nbytes, self.data = offset, nbytes, data


class _Cursor:
    def __init__(self, buf):
        self.buf, self.at = buf, 0

    def need(self, n, what):
        if n < 0 or self.at + n > len(self.buf):
            raise GgufError(f"truncated at byte {self.at} ({what} needs {n} bytes)")

    def scalar(self, fmt, what):
        size = struct.calcsize(fmt)
        self.need(size, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.at)
        self.at += size
        return v

    def string(self, what):
        n = self.scalar("<Q", what)
        self.need(n, what)
        raw = bytes(self.buf[self.at:self.at + n])
        self.at += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GgufError(f"{what} is not UTF-8") from None

    def value(self, vtype, what, depth=0):
        if vtype in SCALARS:
            return self.scalar(SCALARS[vtype], what)
        if vtype == STRING:
            return self.string(what)
        if vtype == ARRAY and depth == 0:
            itype = self.scalar("<I", what)
            count = self.scalar("<Q", what)
            least = struct.calcsize(SCALARS[itype]) if itype in SCALARS else 8
            self.need(count * least, what)  # each item takes at least `least` bytes
            if itype in SCALARS:
                size = struct.calcsize(SCALARS[itype])
                items = np.frombuffer(self.buf, SCALARS[itype], count, self.at).tolist()
                self.at += count * size
                return items
            return [self.value(itype, what, depth + 1) for _ in range(count)]
        raise GgufError(f"{what} has the unknown value type {vtype}")


def read(path):
    """(fields, tensors) of the GGUF file at `path` (see the module's text)."""
    with open(path, "rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise GgufError("truncated at byte 0 (an empty file)") from None
    c = _Cursor(buf)
    c.need(4, "the magic")
    if buf[:4] != MAGIC:
        raise GgufError("not a GGUF file (no GGUF magic)")
    c.at = 4
    version = c.scalar("<I", "the version")
    if version not in (2, 3):
        raise GgufError(f"GGUF version {version} (only 2 and 3 are read)")
    n_tensors = c.scalar("<Q", "the tensor count")
    n_fields = c.scalar("<Q", "the field count")
    c.need(n_fields * 12 + n_tensors * 24, "the table")  # the least each entry takes
    fields = {}
    for _ in range(n_fields):
        key = c.string("a metadata key")
        fields[key] = c.value(c.scalar("<I", key), key)
    table = []
    for _ in range(n_tensors):
        name = c.string("a tensor name")
        n_dims = c.scalar("<I", name)
        if not 1 <= n_dims <= 4:
            raise GgufError(f"tensor {name!r} has {n_dims} dimensions")
        dims = [c.scalar("<Q", name) for _ in range(n_dims)]
        code = c.scalar("<I", name)
        try:
            ttype = GGMLQuantizationType(code)
        except ValueError:
            raise GgufError(f"tensor {name!r} has the unknown type {code}") from None
        table.append((name, dims, ttype, c.scalar("<Q", name)))
    align = fields.get("general.alignment", 32)
    if not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise GgufError(f"general.alignment {align!r} is not a power of two")
    base = (c.at + align - 1) // align * align
    tensors = []
    for name, dims, ttype, rel in table:
        block, size = GGML_QUANT_SIZES[ttype]
        if dims[0] % block:
            raise GgufError(f"tensor {name!r}: {dims[0]} columns are not whole blocks of {block}")
        rows = 1
        for d in dims[1:]:
            rows *= d
        row_bytes = dims[0] // block * size
        nbytes = rows * row_bytes
        start = base + rel
        if rel % align or start + nbytes > len(buf):
            raise GgufError(f"tensor {name!r} lies past the end of the file or off its alignment")
        shape = tuple(reversed(dims))
        if ttype == GGMLQuantizationType.F32:
            data = np.frombuffer(buf, np.float32, nbytes // 4, start).reshape(shape)
        elif ttype == GGMLQuantizationType.F16:
            data = np.frombuffer(buf, np.float16, nbytes // 2, start).reshape(shape)
        else:
            data = np.frombuffer(buf, np.uint8, nbytes, start).reshape(*shape[:-1], row_bytes)
        tensors.append(Tensor(name, tuple(dims), ttype, start, nbytes, data))
    return fields, tensors
