#!/usr/bin/python3
"""A small T5-style SentencePiece tokenizer and goldens for cubevec's T5Tokenizer.

Trains a Unigram model (vocab 600, nmt_nfkc normalization, T5's special ids: <pad> 0, </s> 1,
<unk> 2, no <s>) on this repository's README with Debian's python3-sentencepiece, writes it as
tests/data/t5_tokenizer/spiece.model with a tokenizer_config.json (extra_ids 100), then the ids a
transcription of transformers' slow T5Tokenizer gives for a set of prompts (the special tokens
typed in the prompt split out first, <extra_id_N> taking the whitespace around it, each piece
encoded on its own by sentencepiece, </s> appended, truncation and padding as FluxPipeline and
WanPipeline ask) into tests/data/t5_tokenizer_goldens.json.

Run: /usr/bin/python3 tests/reference/make_t5_tokenizer.py
"""
import io
import json
import os
import re

import sentencepiece as spm

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data")
OUT = os.path.join(DATA, "t5_tokenizer")
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


def main():
    os.makedirs(OUT, exist_ok=True)
    corpus = open(os.path.join(HERE, "..", "..", "README.md"), encoding="utf-8").read().split("\n")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=model, vocab_size=600, model_type="unigram",
                                   pad_id=0, eos_id=1, unk_id=2, bos_id=-1, normalization_rule_name="nmt_nfkc",
                                   character_coverage=1.0, seed_sentencepiece_size=100000, num_threads=1, minloglevel=2)
    with open(os.path.join(OUT, "spiece.model"), "wb") as f:
        f.write(model.getvalue())
    with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "T5Tokenizer", "extra_ids": EXTRA_IDS, "model_max_length": 512, "eos_token": "</s>",
                   "pad_token": "<pad>", "unk_token": "<unk>"}, f, indent=2)
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
