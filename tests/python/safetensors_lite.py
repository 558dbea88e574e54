"""A small standard-library safetensors reader/writer (numpy arrays), so the PyTorch twin needs
only Debian's python3-numpy and python3-torch: no pip packages."""
import json
import struct

import numpy as np

_DTYPES = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    body = data[8 + n :]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        if e["dtype"] == "BF16":  # widen to f32 through the upper 16 bits
            raw = np.frombuffer(body[e["data_offsets"][0] : e["data_offsets"][1]], dtype=np.uint16)
            arr = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            b, en = e["data_offsets"]
            arr = np.frombuffer(body[b:en], dtype=_DTYPES[e["dtype"]])
        out[name] = arr.reshape(e["shape"]).copy()
    return out


def to_bf16_bits(a):
    """float32 -> bf16 bit patterns (uint16), rounding to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def save(path, tensors, bf16=()):
    """Names in `bf16` are written as BF16 (from float32, rounded to nearest even)."""
    header, chunks, off = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        if name in bf16:
            raw = to_bf16_bits(a).tobytes()
            header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
            chunks.append(raw)
            off += len(raw)
            continue
        raw = a.tobytes()
        header[name] = {"dtype": _NAMES[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))
