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


def save(path, tensors):
    header, chunks, off = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        raw = a.tobytes()
        header[name] = {"dtype": _NAMES[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))
