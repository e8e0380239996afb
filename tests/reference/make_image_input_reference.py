#!/usr/bin/python3
"""Test pictures and PIL's readings of them, for cubevec's image inputs (media/image_input.h).

Run with Debian's Pillow (python3-pil), which only /usr/bin/python3 sees:

    /usr/bin/python3 tests/reference/make_image_input_reference.py [OUTPUT_DIR]   # default tests/data

diffusers reads a picture with diffusers.utils.load_image (PIL's Image.open, ImageOps.exif_transpose,
.convert("RGB")) and VaeImageProcessor.preprocess resizes it with Image.resize(..., LANCZOS); this
script runs exactly those PIL calls. It writes, under OUTPUT_DIR:

  images/               small pictures of every kind the reader takes: 8-bit RGB, RGBA, grey, grey with
                        alpha, a palette with transparency, 16-bit RGB and 16-bit grey (written by the
                        script's own PNG writer: PIL writes no 16-bit RGB), interlaced, a JPEG, a grey
                        JPEG, a JPEG with EXIF orientation 6, and a CMYK JPEG (which cubevec refuses)
  goldens_image_input.safetensors
                        per picture `<name>.rgb` (H x W x 3, PIL's convert("RGB") after exif_transpose;
                        16-bit PNGs by their high byte, which is cubevec's rule: PIL clips 16-bit grey)
                        and `<name>.lanczos_WxH` for a few sizes (Image.resize(LANCZOS) of that)
"""

import json
import os
import struct
import sys
import zlib

import numpy as np
from PIL import Image, ImageOps

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import write_safetensors  # noqa: E402

import torch  # noqa: E402  (safetensors_io writes torch tensors)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data")
SIZES = [(16, 16), (64, 48), (50, 10), (37, 23)]


def picture(width, height, seed):
    """A smooth gradient with a disc and a little noise: edges for the resampler, no flat regions."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    disc = ((x - width * 0.6) ** 2 + (y - height * 0.4) ** 2) < (min(width, height) * 0.3) ** 2
    r = 40 + 180 * x / max(width - 1, 1) + 30 * disc
    g = 200 - 150 * y / max(height - 1, 1)
    b = 90 + 120 * disc + 20 * np.sin(x * 0.9)
    rgb = np.stack([r, g, b], axis=-1) + rng.normal(0, 6, (height, width, 3))
    return np.clip(np.rint(rgb), 0, 255).astype(np.uint8)


def png_chunk(kind, body):
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def write_png16(path, samples, color_type):
    """A 16-bit PNG (color type 2 RGB or 0 grey), filter 0 on every row."""
    height, width = samples.shape[:2]
    raw = b"".join(b"\x00" + samples[y].astype(">u2").tobytes() for y in range(height))
    data = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 16, color_type, 0, 0, 0))
    data += png_chunk(b"IDAT", zlib.compress(raw, 9)) + png_chunk(b"IEND", b"")
    open(path, "wb").write(data)


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]


def write_png8_interlaced(path, rgb):
    """An 8-bit RGB PNG with Adam7 interlacing (PIL writes none): the seven passes, filter 0 rows."""
    height, width = rgb.shape[:2]
    raw = b""
    for x0, y0, dx, dy in ADAM7:
        sub = rgb[y0::dy, x0::dx]
        if sub.size:
            raw += b"".join(b"\x00" + row.tobytes() for row in sub)
    data = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 1))
    data += png_chunk(b"IDAT", zlib.compress(raw, 9)) + png_chunk(b"IEND", b"")
    open(path, "wb").write(data)


def exif_with_orientation(orientation):
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def main():
    folder = os.path.join(OUT_DIR, "images")
    os.makedirs(folder, exist_ok=True)
    base = picture(37, 23, 1)
    files = {}

    def save(name, image, **kwargs):
        path = os.path.join(folder, name)
        image.save(path, **kwargs)
        files[name] = path

    save("rgb.png", Image.fromarray(base, "RGB"))
    alpha = np.clip(np.arange(37)[None, :] * 7 + np.arange(23)[:, None] * 3, 0, 255).astype(np.uint8)
    save("rgba.png", Image.fromarray(np.dstack([base, alpha]), "RGBA"))
    grey = Image.fromarray(base, "RGB").convert("L")
    save("grey.png", grey)
    save("grey_alpha.png", Image.fromarray(np.dstack([np.array(grey), alpha]), "LA"))
    palette = Image.fromarray(base, "RGB").quantize(colors=16)
    palette.info["transparency"] = 3
    save("palette.png", palette, transparency=3)
    write_png8_interlaced(os.path.join(folder, "interlaced.png"), base)
    files["interlaced.png"] = os.path.join(folder, "interlaced.png")
    assert Image.open(files["interlaced.png"]).info.get("interlace") == 1
    rgb16 = base.astype(np.uint16) * 257 + np.arange(37)[None, :, None].astype(np.uint16)  # low bytes vary too
    write_png16(os.path.join(folder, "rgb16.png"), rgb16, 2)
    files["rgb16.png"] = os.path.join(folder, "rgb16.png")
    grey16 = np.array(grey).astype(np.uint16) * 256 + 200
    write_png16(os.path.join(folder, "grey16.png"), grey16, 0)
    files["grey16.png"] = os.path.join(folder, "grey16.png")
    save("photo.jpg", Image.fromarray(base, "RGB"), quality=90)
    save("grey.jpg", grey, quality=90)
    save("rotated.jpg", Image.fromarray(picture(20, 12, 2), "RGB"), quality=90, exif=exif_with_orientation(6))
    save("cmyk.jpg", Image.fromarray(base, "RGB").convert("CMYK"), quality=90)

    tensors, meta = {}, {"_generator": "tests/reference/make_image_input_reference.py", "_pillow_version": Image.__version__}
    for name, path in sorted(files.items()):
        if name == "cmyk.jpg":
            continue  # refused by cubevec
        if name in ("rgb16.png", "grey16.png"):  # cubevec's rule: the high byte of each sample
            samples = rgb16 if name == "rgb16.png" else np.repeat(grey16[:, :, None], 3, axis=2)
            rgb = (samples >> 8).astype(np.uint8)
        else:
            rgb = np.array(ImageOps.exif_transpose(Image.open(path)).convert("RGB"))
        tensors[f"{name}.rgb"] = torch.from_numpy(rgb.astype(np.float32))
        for w, h in SIZES:
            resized = np.array(Image.fromarray(rgb, "RGB").resize((w, h), Image.LANCZOS))
            tensors[f"{name}.lanczos_{w}x{h}"] = torch.from_numpy(resized.astype(np.float32))
        meta[name] = json.dumps({"shape": list(rgb.shape)})
        print(f"{name}: {rgb.shape[1]}x{rgb.shape[0]}")
    write_safetensors(os.path.join(OUT_DIR, "goldens_image_input.safetensors"), tensors, meta)


if __name__ == "__main__":
    main()
