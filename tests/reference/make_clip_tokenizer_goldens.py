#!/usr/bin/python3
"""Goldens for cubevec's CLIP tokenizer (tests/data/clip_tokenizer_goldens.json): the ids a
transcription of transformers' slow CLIPTokenizer without ftfy gives for a set of prompts, padded
as FluxPipeline asks (max_length 77, truncation, pad <|endoftext|>).

Written from the transformers v4 sources (BasicTokenizer's cleaning, the CLIP regex, the BPE loop)
in Python's own Unicode (unicodedata, str.lower) and Debian's python3-regex for the exact pattern,
so it shares no code with the C++ tokenizer. It reads tests/data/clip_tokenizer/ (vocab.json,
merges.txt; make_clip_tokenizer.py writes them). Run: /usr/bin/python3 tests/reference/make_clip_tokenizer_goldens.py
"""
import json
import os
import unicodedata

import regex

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data")

PROMPTS = [
    "a photo of a cat",
    "hello world",
    "",
    "A Photo OF a CAT!!",
    "it's a DOG's life",
    "3.14 dollars, 100%",
    "   lots   of\t\twhite\nspace   ",
    "naïve café, Zoë's crème brûlée",
    "nai\u0308ve",
    "東京 タワー and 서울",
    "ΣΟΦΟΣ İstanbul STRASSE",
    "&amp; &lt;b&gt; html entities stay",
    "emoji 🙂🐈 and symbols ©®™ ½",
    "zero\u200bwidth soft\u00adhyphen control\u0007bell",
    "a <|endoftext|> inside and <|startoftext|> too",
    "an <|ENDOFTEXT|> in capitals",
    "''s !!'s 'sun we'll they'D",
    " ".join(["word"] * 100),
    "a photograph of an astronaut riding a horse on the moon, highly detailed, 8k, trending on artstation",
]


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def is_whitespace(ch):
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def is_control(ch):
    return ch not in "\t\n\r" and unicodedata.category(ch).startswith("C")


def is_cjk(cp):
    return any(lo <= cp <= hi for lo, hi in [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
                                             (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)])


def basic_tokenize(text):
    out = []
    for ch in text:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD or is_control(ch):
            continue
        out.append(" " if is_whitespace(ch) else (" " + ch + " " if is_cjk(cp) else ch))
    text = unicodedata.normalize("NFC", "".join(out))
    return [token.lower() for token in text.split()]


class Clip:
    def __init__(self, folder):
        self.encoder = json.load(open(os.path.join(folder, "vocab.json"), encoding="utf-8"))
        merges = open(os.path.join(folder, "merges.txt"), encoding="utf-8").read().strip().split("\n")[1:48895]
        self.ranks = {tuple(m.split()): i for i, m in enumerate(merges)}
        self.byte_encoder = bytes_to_unicode()
        self.pat = regex.compile(r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""",
                                 regex.IGNORECASE)

    def bpe(self, token):
        if token in ("<|startoftext|>", "<|endoftext|>"):
            return [token]
        word = tuple(token[:-1]) + (token[-1] + "</w>",)
        while len(word) > 1:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            first, second = best
            new, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and word[i] == first and word[i + 1] == second:
                    new.append(first + second)
                    i += 2
                else:
                    new.append(word[i])
                    i += 1
            word = tuple(new)
        return list(word)

    def encode_chunk(self, text):
        ids = []
        for piece in regex.findall(self.pat, " ".join(basic_tokenize(text))):
            symbols = "".join(self.byte_encoder[b] for b in piece.encode("utf-8"))
            ids += [self.encoder[s] for s in self.bpe(symbols)]
        return ids

    def encode(self, text):
        # The added-token split: the literal special tokens, exact case, before any cleaning.
        ids = []
        for i, chunk in enumerate(regex.split(r"(<\|startoftext\|>|<\|endoftext\|>)", text)):
            ids += [self.encoder[chunk]] if i % 2 else self.encode_chunk(chunk)
        return ids

    def encode_padded(self, text, max_length=77):
        ids = [49406] + self.encode(text)[: max_length - 2] + [49407]
        return ids + [self.encoder["<|endoftext|>"]] * (max_length - len(ids))


def main():
    clip = Clip(os.path.join(DATA, "clip_tokenizer"))
    goldens = [{"prompt": p, "ids": clip.encode(p), "padded_77": clip.encode_padded(p)} for p in PROMPTS]
    with open(os.path.join(DATA, "clip_tokenizer_goldens.json"), "w", encoding="utf-8") as f:
        json.dump({"_generator": "tests/reference/make_clip_tokenizer_goldens.py", "_regex_version": regex.__version__,
                   "_unicodedata_version": unicodedata.unidata_version, "cases": goldens}, f, ensure_ascii=False, indent=1)
    for g in goldens[:3]:
        print(repr(g["prompt"]), g["ids"])


if __name__ == "__main__":
    main()
