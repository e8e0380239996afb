#!/usr/bin/python3
"""Renders prompts with the built `cubevec t2v` and lays out frames of each video as a labelled PNG.

    /usr/bin/python3 tools/tinywan/make_strip.py [--cubevec build/cubevec] [--out docs/images/tinywan_strip.png]

Each video is made exactly as a user makes it (`cubevec t2v --model assets/tinywan --prompt P
--seed S --out x.avi --frames-dir DIR`, the model's default size, frames and steps); the row shows
frames 0, 4, 8, 12 and 16 at 2x (nearest neighbour) after its prompt. Needs only PIL (no torch).
"""
import argparse
import os
import subprocess
import tempfile

from PIL import Image, ImageDraw, ImageFont

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPTS = [
    ("a red circle moving right on a blue background", 0),
    ("a yellow square moving up on a purple background", 0),
    ("a white triangle moving left on a black background", 0),
    ("a green circle moving down on a white background", 0),
    ("an orange square growing on a green background", 0),
    ("a blue triangle shrinking on a yellow background", 0),
]
FRAMES = (0, 4, 8, 12, 16)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cubevec", default=os.path.join(ROOT, "build", "cubevec"))
    p.add_argument("--model", default=os.path.join(ROOT, "assets", "tinywan"))
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "images", "tinywan_strip.png"))
    p.add_argument("--scale", type=int, default=2)
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (prompt, seed) in enumerate(PROMPTS):
            frames_dir = os.path.join(tmp, str(i))
            subprocess.run([args.cubevec, "t2v", "--model", args.model, "--prompt", prompt, "--seed", str(seed), "--out",
                            os.path.join(tmp, f"{i}.avi"), "--frames-dir", frames_dir], check=True, stderr=subprocess.DEVNULL)
            rows.append(([Image.open(os.path.join(frames_dir, f"frame_{f:05d}.jpg")).convert("RGB") for f in FRAMES], prompt))
    size = rows[0][0][0].width * args.scale
    font = ImageFont.load_default()
    pad, label_w, header = 6, 300, 16
    strip = Image.new("RGB", (label_w + len(FRAMES) * (size + pad) + pad, header + len(rows) * (size + pad) + pad), (255, 255, 255))
    draw = ImageDraw.Draw(strip)
    for k, f in enumerate(FRAMES):
        draw.text((label_w + pad + k * (size + pad), 3), f"frame {f}", fill=(0, 0, 0), font=font)
    for r, (frames, prompt) in enumerate(rows):
        y = header + pad + r * (size + pad)
        draw.text((pad, y + size // 2 - 6), prompt, fill=(0, 0, 0), font=font)
        for k, im in enumerate(frames):
            strip.paste(im.resize((size, size), Image.NEAREST), (label_w + pad + k * (size + pad), y))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    strip.save(args.out, optimize=True)
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    main()
