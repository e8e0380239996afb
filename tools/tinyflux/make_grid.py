#!/usr/bin/python3
"""Renders prompts with the built `cubevec t2i` and tiles the JPEGs into one labelled PNG.

    /usr/bin/python3 tools/tinyflux/make_grid.py [--cubevec build/cubevec] [--out docs/images/tinyflux_grid.png]

Each picture is made exactly as a user makes it (`cubevec t2i --model assets/tinyflux --prompt P
--seed S --out x.jpg`, default steps and size), shown at 2x (nearest neighbour) above its prompt.
Needs only PIL (no torch).
"""
import argparse
import os
import subprocess
import tempfile
import textwrap

from PIL import Image, ImageDraw, ImageFont

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPTS = [
    ("a large red circle in the center on a blue background", 0),
    ("two small yellow squares on the left on a purple background", 0),
    ("a large white triangle in the center on a black background", 0),
    ("a medium orange circle at the top on a green background", 0),
    ("two medium purple triangles at the bottom on a yellow background", 0),
    ("a small blue square on the right on a white background", 0),
    ("a medium green triangle in the center on a red background", 0),
    ("two medium black circles on the right on an orange background", 0),
]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cubevec", default=os.path.join(ROOT, "build", "cubevec"))
    p.add_argument("--model", default=os.path.join(ROOT, "assets", "tinyflux"))
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "images", "tinyflux_grid.png"))
    p.add_argument("--columns", type=int, default=4)
    p.add_argument("--scale", type=int, default=2)
    args = p.parse_args()
    cells = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (prompt, seed) in enumerate(PROMPTS):
            path = os.path.join(tmp, f"{i}.jpg")
            subprocess.run([args.cubevec, "t2i", "--model", args.model, "--prompt", prompt, "--seed", str(seed), "--out", path],
                           check=True, stderr=subprocess.DEVNULL)
            cells.append((Image.open(path).convert("RGB"), prompt))
    size = cells[0][0].width * args.scale
    font = ImageFont.load_default()
    lines = 3
    label_h = 12 * lines + 6
    pad = 6
    cols = args.columns
    rows = (len(cells) + cols - 1) // cols
    grid = Image.new("RGB", (cols * (size + pad) + pad, rows * (size + label_h + pad) + pad), (255, 255, 255))
    draw = ImageDraw.Draw(grid)
    for i, (im, prompt) in enumerate(cells):
        x = pad + (i % cols) * (size + pad)
        y = pad + (i // cols) * (size + label_h + pad)
        grid.paste(im.resize((size, size), Image.NEAREST), (x, y))
        for k, line in enumerate(textwrap.wrap(prompt, width=size // 6)[:lines]):
            draw.text((x, y + size + 3 + 12 * k), line, fill=(0, 0, 0), font=font)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    grid.save(args.out, optimize=True)
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    main()
