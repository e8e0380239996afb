#!/usr/bin/python3
"""A small T5-style SentencePiece tokenizer and goldens for cubevec's T5Tokenizer.

Trains a Unigram model (vocab 600, nmt_nfkc normalization, T5's special ids: <pad> 0, </s> 1,
<unk> 2, no <s>) on this repository's README with Debian's python3-sentencepiece, writes it as
tests/data/t5_tokenizer/spiece.model with a tokenizer_config.json (extra_ids 100), then the ids a
transcription of transformers' slow T5Tokenizer gives for a set of prompts (the special tokens
typed in the prompt split out first, <extra_id_N> taking the whitespace around it, each piece
encoded on its own by sentencepiece, </s> appended, truncation and padding as FluxPipeline and
WanPipeline ask) into tests/data/t5_tokenizer_goldens.json.

It also writes the same model as transformers' T5Converter would into
tests/data/t5_tokenizer_json/ (tokenizer.json + tokenizer_config.json): the vocabulary from the
proto's pieces with their scores, <extra_id_99> ... <extra_id_0> appended with score 0.0, the
control and unknown pieces and the extra ids as special added tokens, the proto's
precompiled_charsmap in base64 in a Precompiled + Strip + Replace(" {2,}") normalizer, a
Metaspace pre-tokenizer (prepend_scheme "always") and the </s> template. The proto is read with the
small wire-format reader below (Debian's python3-sentencepiece has no protobuf module).

Run: /usr/bin/python3 tests/reference/make_t5_tokenizer.py
     /usr/bin/python3 tests/reference/make_t5_tokenizer.py --tokenizer-json-only
The second form converts the committed spiece.model without training again (training reads
README.md, which has changed since the committed model was made).
"""
import base64
import io
import json
import os
import re
import struct
import sys

import sentencepiece as spm

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data")
OUT = os.path.join(DATA, "t5_tokenizer")
OUT_JSON = os.path.join(DATA, "t5_tokenizer_json")
EXTRA_IDS = 100

PROMPTS = [
    "a photo of a cat",
    "",
    "A Photo OF a CAT!!",
    "3.14 dollars, 100% of the tests",
    "   lots   of\t\twhite\nspace   ",
    "naïve café, ﬁne ligature and full-width ＡＢＣ",
    "東京 タワー",
    "the model</s> and <pad> and <unk> typed",
    "fill <extra_id_0> the <extra_id_1>blank <extra_id_99>",
    "not special: <extra_id_100> <extra_id_07> <s> <extra_id_",
    " ".join(["stage"] * 40),
]


def split_specials(text, extra):
    """transformers' added-token split for T5: </s>, <pad>, <unk> as they are; <extra_id_N> with lstrip/rstrip."""
    pattern = re.compile(r"(</s>|<pad>|<unk>|<extra_id_(?:0|[1-9][0-9]*)>)")
    pieces = []
    for i, chunk in enumerate(pattern.split(text)):
        if i % 2 == 1:
            match = re.fullmatch(r"<extra_id_(\d+)>", chunk)
            if match and int(match.group(1)) >= extra:
                pieces.append(("text", chunk))  # not an added token: ordinary text
            else:
                pieces.append(("special", chunk))
        else:
            pieces.append(("text", chunk))
    # Merge text around tokens that are not special after all, then strip around extra ids.
    merged = []
    for kind, chunk in pieces:
        if kind == "text" and merged and merged[-1][0] == "text":
            merged[-1] = ("text", merged[-1][1] + chunk)
        else:
            merged.append((kind, chunk))
    for i, (kind, chunk) in enumerate(merged):
        if kind == "special" and chunk.startswith("<extra_id_"):
            if i > 0 and merged[i - 1][0] == "text":
                merged[i - 1] = ("text", merged[i - 1][1].rstrip())
            if i + 1 < len(merged) and merged[i + 1][0] == "text":
                merged[i + 1] = ("text", merged[i + 1][1].lstrip())
    return merged


def encode(sp, text):
    ids = []
    for kind, chunk in split_specials(text, EXTRA_IDS):
        if kind == "special":
            m = re.fullmatch(r"<extra_id_(\d+)>", chunk)
            ids.append(sp.get_piece_size() + EXTRA_IDS - 1 - int(m.group(1)) if m else sp.piece_to_id(chunk))
        elif chunk:
            ids += sp.encode(chunk)
    return ids


def wire_fields(data):
    """The (field, value) pairs of a protobuf message: ints for varints, bytes otherwise."""
    i, out = 0, []

    def varint():
        nonlocal i
        value = shift = 0
        while True:
            byte = data[i]
            i += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while i < len(data):
        key = varint()
        field, wire = key >> 3, key & 7
        if wire == 0:
            value = varint()
        elif wire == 1:
            value, i = data[i:i + 8], i + 8
        elif wire == 2:
            n = varint()
            value, i = data[i:i + n], i + n
        elif wire == 5:
            value, i = data[i:i + 4], i + 4
        else:
            raise ValueError("unsupported wire type %d" % wire)
        out.append((field, value))
    return out


def read_model_proto(data):
    """pieces [(piece, score, type)], byte_fallback, unk_id and precompiled_charsmap of a ModelProto."""
    pieces, trainer, normalizer = [], {}, {}
    for field, value in wire_fields(data):
        if field == 1:  # ModelProto.pieces
            piece = dict(wire_fields(value))
            pieces.append((piece[1].decode("utf-8"), struct.unpack("<f", piece[2])[0] if 2 in piece else 0.0, piece.get(3, 1)))
        elif field == 2:
            trainer = dict(wire_fields(value))
        elif field == 3:
            normalizer = dict(wire_fields(value))
    return {"pieces": pieces, "byte_fallback": bool(trainer.get(35, 0)), "unk_id": trainer.get(40, 0),
            "precompiled_charsmap": normalizer.get(2, b"")}


def write_tokenizer_json(model_bytes):
    """tokenizer.json as transformers' T5Converter (SpmConverter) and T5TokenizerFast write it."""
    proto = read_model_proto(model_bytes)
    vocab = [[piece, score] for piece, score, _ in proto["pieces"]]
    vocab += [["<extra_id_%d>" % i, 0.0] for i in range(EXTRA_IDS - 1, -1, -1)]
    added = [(i, piece) for i, (piece, _, kind) in enumerate(proto["pieces"]) if kind in (2, 3)]  # UNKNOWN, CONTROL
    added += [(len(proto["pieces"]) + EXTRA_IDS - 1 - i, "<extra_id_%d>" % i) for i in range(EXTRA_IDS - 1, -1, -1)]
    space = "\u2581"
    metaspace = {"type": "Metaspace", "replacement": space, "prepend_scheme": "always", "split": True}
    eos = [i for i, piece in added if piece == "</s>"][0]
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": piece, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
                          "special": True} for i, piece in sorted(added)],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Precompiled", "precompiled_charsmap": base64.b64encode(proto["precompiled_charsmap"]).decode("ascii")},
            {"type": "Strip", "strip_left": False, "strip_right": True},
            {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": space}]},
        "pre_tokenizer": metaspace,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}],
                           "special_tokens": {"</s>": {"id": "</s>", "ids": [eos], "tokens": ["</s>"]}}},
        "decoder": metaspace,
        "model": {"type": "Unigram", "unk_id": proto["unk_id"], "vocab": vocab, "byte_fallback": False},
    }
    os.makedirs(OUT_JSON, exist_ok=True)
    with open(os.path.join(OUT_JSON, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False, indent=2)
        f.write("\n")
    write_tokenizer_config(OUT_JSON)


def write_tokenizer_config(folder):
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "T5Tokenizer", "extra_ids": EXTRA_IDS, "model_max_length": 512, "eos_token": "</s>",
                   "pad_token": "<pad>", "unk_token": "<unk>"}, f, indent=2)


def main():
    if sys.argv[1:] == ["--tokenizer-json-only"]:
        with open(os.path.join(OUT, "spiece.model"), "rb") as f:
            write_tokenizer_json(f.read())
        return
    os.makedirs(OUT, exist_ok=True)
    corpus = open(os.path.join(HERE, "..", "..", "README.md"), encoding="utf-8").read().split("\n")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=model, vocab_size=600, model_type="unigram",
                                   pad_id=0, eos_id=1, unk_id=2, bos_id=-1, normalization_rule_name="nmt_nfkc",
                                   character_coverage=1.0, seed_sentencepiece_size=100000, num_threads=1, minloglevel=2)
    with open(os.path.join(OUT, "spiece.model"), "wb") as f:
        f.write(model.getvalue())
    write_tokenizer_config(OUT)
    write_tokenizer_json(model.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    cases = []
    for p in PROMPTS:
        ids = encode(sp, p)
        padded = ids[:15] + [1]
        cases.append({"prompt": p, "ids": ids, "padded_16": padded + [0] * (16 - len(padded)),
                      "mask_16": [1] * len(padded) + [0] * (16 - len(padded))})
    with open(os.path.join(DATA, "t5_tokenizer_goldens.json"), "w", encoding="utf-8") as f:
        json.dump({"_generator": "tests/reference/make_t5_tokenizer.py", "_sentencepiece_version": spm.__version__,
                   "pieces": sp.get_piece_size(), "cases": cases}, f, ensure_ascii=False, indent=1)
    for c in cases[:4]:
        print(repr(c["prompt"]), c["ids"])


if __name__ == "__main__":
    main()
