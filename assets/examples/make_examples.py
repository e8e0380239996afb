#!/usr/bin/env python3
"""Writes the example checkpoints in this folder (see README.md): a tiny Flux-style DiT as one
safetensors file and as two shards with an index. Standard library only, deterministic output.

Value formula, for the k-th tensor in name order (k = 0, 1, ...) and its i-th element in row-major
order:  n = (i*37 + k*11) % 101 - 50,  float dtypes store n / 64, integer dtypes store n.
Every such value is exact in F32, F16 and BF16, so readers can recompute them exactly.

Usage: python3 assets/examples/make_examples.py [OUTPUT_DIR]   (default: this script's folder)
"""
import json
import math
import os
import struct
import sys

# (name, dtype, shape): diffusers Flux names, shrunk to dim 32, 4 heads of 8, 16 input channels.
TENSORS = [
    ("x_embedder.weight", "F32", [32, 16]),
    ("x_embedder.bias", "F32", [32]),
    ("time_text_embed.timestep_embedder.linear_1.weight", "F16", [32, 16]),
    ("time_text_embed.timestep_embedder.linear_1.bias", "F16", [32]),
    ("transformer_blocks.0.norm1.linear.weight", "BF16", [192, 32]),
    ("transformer_blocks.0.norm1.linear.bias", "BF16", [192]),
    ("transformer_blocks.0.attn.to_q.weight", "BF16", [32, 32]),
    ("transformer_blocks.0.attn.to_q.bias", "BF16", [32]),
    ("transformer_blocks.0.attn.norm_q.weight", "F32", [8]),
    ("pos_embed.ids", "I64", [16, 3]),  # (t, h, w) position ids of a 4x4 latent
    ("logit_scale", "F32", []),  # a rank-0 scalar
]

# The reference writer's dtype order (increasing alignment rank), for the layout sort.
DTYPE_RANK = ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
              "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64",
              "F64", "I64", "U64"]

METADATA = {"format": "pt"}

SHARD_NAMES = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def shard_of(name):
    """Shard 1 holds the top-level tensors, shard 2 the transformer block."""
    return 1 if name.startswith("transformer_blocks.") else 0


def numerator(k, i):
    return (i * 37 + k * 11) % 101 - 50


def encode(dtype, values):
    """Little-endian bytes of `values` (integers n; floats are stored as n / 64)."""
    out = bytearray()
    for n in values:
        if dtype == "I64":
            out += struct.pack("<q", n)
            continue
        v = n / 64
        if dtype == "F32":
            packed = struct.pack("<f", v)
        elif dtype == "F16":
            packed = struct.pack("<e", v)
        elif dtype == "BF16":
            packed = struct.pack("<f", v)[2:]  # the upper half of the f32 bits
        else:
            raise ValueError("unsupported dtype " + dtype)
        # The formula's values must survive the dtype unrounded, or readers could not check them exactly.
        back = struct.unpack("<f", b"\0\0" + packed)[0] if dtype == "BF16" else struct.unpack(
            "<f" if dtype == "F32" else "<e", packed)[0]
        assert back == v, (dtype, n)
        out += packed
    return bytes(out)


def tensor_bytes():
    """name -> (dtype, shape, bytes), with k taken from the name order over all tensors."""
    result = {}
    for k, (name, dtype, shape) in enumerate(sorted(TENSORS)):
        count = math.prod(shape)
        result[name] = (dtype, shape, encode(dtype, [numerator(k, i) for i in range(count)]))
    return result


def write_safetensors(path, tensors):
    """The reference writer's layout: descending dtype rank then name, header space-padded to 8."""
    order = sorted(tensors, key=lambda name: (-DTYPE_RANK.index(tensors[name][0]), name))
    header = {"__metadata__": METADATA}
    offset = 0
    for name in order:
        dtype, shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in order:
            f.write(tensors[name][2])


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    tensors = tensor_bytes()
    write_safetensors(os.path.join(out_dir, "tiny_dit.safetensors"), tensors)

    shard_dir = os.path.join(out_dir, "sharded")
    os.makedirs(shard_dir, exist_ok=True)
    weight_map = {}
    for index, shard in enumerate(SHARD_NAMES):
        part = {name: t for name, t in tensors.items() if shard_of(name) == index}
        write_safetensors(os.path.join(shard_dir, shard), part)
        weight_map.update({name: shard for name in part})
    total_size = sum(len(data) for _, _, data in tensors.values())
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(shard_dir, "model.safetensors.index.json"), "w") as f:
        f.write(json.dumps(index, indent=2) + "\n")


if __name__ == "__main__":
    main()
