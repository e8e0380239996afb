#!/usr/bin/env python3
"""Writes the seed corpus of the safetensors fuzzer into tests/fuzz/corpus/ (or OUTPUT_DIR): small
valid files covering the format's corners and malformed ones, one per validation rule, so libFuzzer
starts next to every branch of the parser. Standard library only, deterministic output.

Usage: python3 tests/fuzz/make_corpus.py [OUTPUT_DIR]
"""
import json
import os
import struct
import sys


def header_bytes(header, pad=True):
    """Compact JSON (dict order kept), space-padded to a multiple of 8 like the reference writer."""
    text = header if isinstance(header, (bytes, bytearray)) else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return bytes(text)


def safetensors(header, data=b"", pad=True, length=None):
    """A file image: u64 little-endian header length (or `length` to lie about it), header, data."""
    text = header_bytes(header, pad)
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def seeds():
    f32_pair = struct.pack("<2f", 1.5, -2.0)
    yield "valid_empty_header", safetensors({})
    yield "valid_metadata_only", safetensors({"__metadata__": {"format": "pt"}})
    yield "valid_null_metadata", safetensors({"__metadata__": None, "w": entry("F32", [2], 0, 8)}, f32_pair)
    yield "valid_scalar", safetensors({"s": entry("F32", [], 0, 4)}, struct.pack("<f", 0.25))
    yield "valid_zero_size", safetensors({"e": entry("F32", [0, 4], 0, 0), "w": entry("F32", [2], 0, 8)}, f32_pair)
    yield "valid_mixed_dtypes", safetensors(
        {"__metadata__": {"format": "pt"},
         "ids": entry("I64", [2], 0, 16),
         "w": entry("F32", [2], 16, 24),
         "h": entry("BF16", [2, 1], 24, 28),
         "m": entry("BOOL", [3], 28, 31),
         "q": entry("I8", [1], 31, 32)},
        struct.pack("<2q", -1, 7) + f32_pair + b"\x80\x3f\x00\xc0" + b"\x01\x00\x01" + b"\xfe")
    yield "valid_f4_sub_byte", safetensors({"p": entry("F4", [2], 0, 1)}, b"\x21")
    # The reference reader accepts JSON whitespace around the object and an unpadded header.
    yield "valid_whitespace_unpadded", safetensors(b"\n\t {\"w\":" + json.dumps(entry("F32", [2], 0, 8)).encode() + b"}\r\n",
                                                   f32_pair, pad=False)

    yield "bad_too_small", b"\x08\x00\x00\x00"
    yield "bad_header_too_large", safetensors({}, length=1 << 63)
    yield "bad_header_past_end", safetensors({}, length=100)
    yield "bad_invalid_utf8", safetensors(b'{"w\xc3\x28":' + json.dumps(entry("F32", [2], 0, 8)).encode() + b"}", f32_pair)
    yield "bad_not_an_object", safetensors(b"[1, 2, 3]")
    yield "bad_truncated_json", safetensors(b'{"w": {"dtype": "F32", "sha')
    yield "bad_deep_nesting", safetensors(b"{\"a\":" + b"[" * 64 + b"]" * 64 + b"}")
    yield "bad_unknown_dtype", safetensors({"w": entry("F31", [2], 0, 8)}, f32_pair)
    yield "bad_metadata_value", safetensors({"__metadata__": {"format": 1}})
    yield "bad_negative_shape", safetensors({"w": entry("F32", [-2], 0, 8)}, f32_pair)
    yield "bad_missing_offsets", safetensors({"w": {"dtype": "F32", "shape": [2]}}, f32_pair)
    yield "bad_overlap", safetensors({"a": entry("F32", [2], 0, 8), "b": entry("F32", [1], 4, 8)}, f32_pair)
    yield "bad_gap", safetensors({"a": entry("F32", [1], 0, 4), "b": entry("F32", [1], 8, 12)}, f32_pair + f32_pair[:4])
    yield "bad_shape_mismatch", safetensors({"w": entry("F32", [1000, 1000], 0, 8)}, f32_pair)
    yield "bad_shape_overflow", safetensors({"w": entry("F32", [1 << 32, 1 << 32, 2], 0, 8)}, f32_pair)
    yield "bad_f4_odd_count", safetensors({"p": entry("F4", [3], 0, 2)}, b"\x21\x03")
    yield "bad_duplicate_name", safetensors(
        b'{"w":' + json.dumps(entry("F32", [1], 0, 4)).encode() + b',"w":' +
        json.dumps(entry("F32", [1], 4, 8)).encode() + b"}", f32_pair)
    yield "bad_trailing_bytes", safetensors({"w": entry("F32", [2], 0, 8)}, f32_pair + b"polyglot")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
    os.makedirs(out_dir, exist_ok=True)
    for name, data in seeds():
        with open(os.path.join(out_dir, name + ".safetensors"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
