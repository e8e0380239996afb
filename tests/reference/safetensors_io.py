"""safetensors I/O for cubevec's reference scripts (torch 1.13 has no safetensors package).

Used by make_goldens.py and make_flux_reference.py: import it as `import safetensors_io` (the
scripts' own directory is on sys.path when they are run as scripts).
"""
import json
import os
import struct

import numpy as np
import torch

BF16 = torch.bfloat16


# ---------------------------------------------------------------------------------------------
# safetensors writer (torch 1.13 has no safetensors package): u64 LE header length, JSON header
# padded with spaces to a multiple of 8, then the tensors' bytes, contiguous from offset 0.
# ---------------------------------------------------------------------------------------------
def tensor_bytes(t):
    t = t.detach().contiguous()
    if t.dtype == torch.float32:
        return "F32", t.numpy().astype("<f4").tobytes()
    if t.dtype == BF16:
        # The upper 16 bits of the f32 holding torch's own (round-to-nearest-even) bf16 value.
        bits = t.to(torch.float32).numpy().astype("<f4").view("<u4") >> 16
        return "BF16", bits.astype("<u2").tobytes()
    if t.dtype == torch.float16:
        return "F16", t.numpy().astype("<f2").tobytes()
    if t.dtype == torch.int32:
        return "I32", t.numpy().astype("<i4").tobytes()
    if t.dtype == torch.bool:
        # One byte per element, 0 or 1 (cubevec reads it as DType::boolean).
        return "BOOL", t.numpy().astype("u1").tobytes()
    raise TypeError(f"unsupported dtype {t.dtype}")


# Write order: wider dtypes first, so every tensor stays aligned; F32 before I32 as in the reference
# writer's order (F16 and BF16 tie and go by name, as the files written before I32/BOOL did).
DTYPE_ORDER = {"F32": (4, 1), "I32": (4, 0), "F16": (2, 0), "BF16": (2, 0), "BOOL": (1, 0)}


def write_safetensors(path, tensors, metadata):
    entries = []
    for name, t in tensors.items():
        dtype, data = tensor_bytes(t)
        entries.append((name, dtype, list(t.shape), data))
    # Wider dtypes first (as the reference writer does) so every tensor stays aligned.
    entries.sort(key=lambda e: (-DTYPE_ORDER[e[1]][0], -DTYPE_ORDER[e[1]][1], e[0]))
    header = {"__metadata__": metadata}
    offset = 0
    for name, dtype, shape, data in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for e in entries:
            f.write(e[3])
    os.replace(tmp, path)


_READ_DTYPES = {"F32": ("<f4", torch.float32), "F16": ("<f2", torch.float16), "I32": ("<i4", torch.int32),
                "BOOL": ("u1", torch.bool)}


def read_safetensors(path):
    """Returns (tensors, metadata): a dict name -> torch tensor (BF16 as torch.bfloat16) and the
    __metadata__ dict (or {}). For self-checks of the files written above."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode())
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, e in header.items():
        b, eend = e["data_offsets"]
        chunk = data[b:eend]
        if e["dtype"] == "BF16":
            bits = np.frombuffer(chunk, dtype="<u2").astype("<u4") << 16
            t = torch.from_numpy(bits.view("<f4").copy()).to(BF16)
        else:
            npd, td = _READ_DTYPES[e["dtype"]]
            t = torch.from_numpy(np.frombuffer(chunk, dtype=npd).copy())
            if td == torch.bool:
                t = t.to(torch.bool)
        out[name] = t.reshape(e["shape"])
    return out, meta
