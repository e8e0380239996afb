"""safetensors files for the Python tests, written and read here apart from cubevec's own reader:
F32 arrays out; F32, U8 and BOOL arrays in."""

import json
import struct

import numpy as np


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    data = open(path, "rb").read()
    length = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + length])
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        dtype = {"F32": np.float32, "U8": np.uint8, "BOOL": np.bool_}[entry["dtype"]]
        out[name] = np.frombuffer(data[8 + length + begin:8 + length + end], dtype).reshape(entry["shape"])
    return out
