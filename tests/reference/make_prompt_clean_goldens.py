#!/usr/bin/python3
"""Goldens for cubevec's WanPipeline prompt cleaning (tests/data/prompt_clean_goldens.json): what
diffusers' prompt_clean gives without ftfy, i.e. whitespace_clean(basic_clean(text)) with
basic_clean = html.unescape twice then strip, and whitespace_clean = the `regex` module's \\s+ -> ' '
then strip (diffusers' pipeline_wan.py). Python's own html and str, Debian's python3-regex.

Run: /usr/bin/python3 tests/reference/make_prompt_clean_goldens.py
"""
import html
import json
import os

import regex

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "data", "prompt_clean_goldens.json")

PROMPTS = [
    "a cat",
    "   spaced \t out \n\n prompt   ",
    "&amp; &lt;b&gt;bold&lt;/b&gt; &quot;quoted&quot; &#39;single&#39;",
    "&amp;amp; decoded twice: &amp;lt;",
    "no semicolon: &amp &lt &copy2024 &notit; &notin; &nbsp-",
    "numeric: &#65;&#x42;&#X43 &#128; &#x80; &#150; &#0; &#13; &#x110000; &#xD800; &#1; &#99999999999999999999;",
    "not references: & &; &#; &#x; &# &unknownname; a&b",
    "unicode spaces:\u00a0\u2003\u3000\u2028\u0085end",
    "file separators\x1c\x1d stay inside but \x1f",
    "\x1c leading separators",
    "long name &" + "a" * 40 + ";",
    "emoji 🙂 &hearts; &#x1F600;",
    "",
]


def prompt_clean(text):
    text = html.unescape(html.unescape(text)).strip()
    return regex.sub(r"\s+", " ", text).strip()


def main():
    cases = [{"prompt": p, "clean": prompt_clean(p)} for p in PROMPTS]
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"_generator": "tests/reference/make_prompt_clean_goldens.py", "cases": cases}, f, ensure_ascii=False, indent=1)
    for c in cases[:6]:
        print(repr(c["clean"]))


if __name__ == "__main__":
    main()
