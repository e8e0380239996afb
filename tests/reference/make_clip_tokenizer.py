#!/usr/bin/python3
"""Writes the CLIP tokenizer folder tests use (tests/data/clip_tokenizer/) from openai/CLIP's public
bpe_simple_vocab_16e6.txt.gz, in the layout a diffusers FLUX.1 folder's tokenizer/ has: vocab.json,
merges.txt, special_tokens_map.json, tokenizer_config.json.

The vocabulary is built as openai's SimpleTokenizer builds it: the 256 byte symbols in
bytes_to_unicode order, the same with '</w>', each of the first 48,894 merges joined, then
<|startoftext|> and <|endoftext|> (49,408 entries). Standard library only.

Usage: /usr/bin/python3 tests/reference/make_clip_tokenizer.py PATH/TO/bpe_simple_vocab_16e6.txt.gz
"""
import gzip
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "data", "clip_tokenizer")


def byte_symbols():
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = 256 + extra
            extra += 1
    return [chr(table[b]) for b in printable] + [chr(table[b]) for b in range(256) if b not in printable]


def main():
    lines = gzip.open(sys.argv[1], "rt", encoding="utf-8").read().split("\n")
    merges = lines[1 : 49152 - 256 - 2 + 1]
    symbols = byte_symbols()
    vocab = symbols + [s + "</w>" for s in symbols] + ["".join(m.split()) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({token: i for i, token in enumerate(vocab)}, f, ensure_ascii=False)
    with open(os.path.join(OUT, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(merges) + "\n")
    with open(os.path.join(OUT, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                   "unk_token": "<|endoftext|>"}, f, indent=2)
    with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "CLIPTokenizer", "model_max_length": 77, "do_lower_case": True,
                   "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                   "unk_token": "<|endoftext|>"}, f, indent=2)
    print(len(vocab), "vocabulary entries,", len(merges), "merges")


if __name__ == "__main__":
    main()
