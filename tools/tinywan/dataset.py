"""The tiny video model's world: captioned 17-frame 64x64 clips of one colored shape in motion.

Pure numpy (no torch), deterministic for a given seed. The palette, the three shapes and the
anti-aliased renderer are tinyflux's (tools/tinyflux/dataset.py); what is new is time.

A clip: a flat background of one palette color and one shape (circle, square or triangle) of
another palette color that, over FRAMES frames, either moves (left, right, up or down, TRAVEL
pixels in total at a constant speed) or changes size (growing: radius R_SMALL -> R_LARGE;
shrinking: the reverse). A moving shape has a radius drawn from [R_MOVE_MIN, R_MOVE_MAX]; its path
is centered at random within the frame so that it stays inside; a shape that changes size stays
near the center.

Caption grammar (words always in this order; [..] may be left out):

    ARTICLE COLOR SHAPE MOTION [on ARTICLE COLOR background]

    ARTICLE   a | an (before a vowel)
    COLOR     red | orange | yellow | green | blue | purple | white | black
    SHAPE     circle | square | triangle
    MOTION    moving left | moving right | moving up | moving down | growing | shrinking
    background clause                                  (said with probability P_BACKGROUND)

e.g. "a red circle moving right on a blue background", "an orange square shrinking". The empty
caption is the unconditional input of classifier-free guidance. The tokenizer is tinyflux's
(lower-case, , . ; : ! ? become spaces, one id per word, padded with "<pad>" = 0 to MAX_LENGTH).
"""
import importlib.util
import os
import sys

import numpy as np


SHARED_NAMES = ("dataset", "modules", "sample", "shapes", "evaluate")  # file names both folders use


def load_tinyflux(name):
    """tools/tinyflux/NAME.py as the module tinyflux_NAME. The two folders use the same file names,
    so while it loads (and imports its siblings by those names) this folder's modules step aside;
    the tinyflux siblings it imported stay loaded as tinyflux_<name>."""
    key = "tinyflux_" + name
    if key in sys.modules:
        return sys.modules[key]
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tinyflux")
    ours = {n: sys.modules.pop(n) for n in SHARED_NAMES if n in sys.modules}
    path = list(sys.path)  # the tinyflux files put their folder first; it must not stay there
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location(key, os.path.join(folder, name + ".py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
        for n in SHARED_NAMES:
            if n in sys.modules:
                sys.modules.setdefault("tinyflux_" + n, sys.modules.pop(n))
    finally:
        sys.path[:] = path
        sys.modules.update(ours)
    return module


flux_world = load_tinyflux("dataset")  # palette, shapes, coverage, color reading

SIZE = flux_world.SIZE  # 64 pixels, square
FRAMES = 17  # 1 + 4k: the Wan VAE keeps the first frame and compresses the rest 4x in time
PALETTE = flux_world.PALETTE
COLORS = flux_world.COLORS
SHAPES = flux_world.SHAPES
MOTIONS = ["left", "right", "up", "down", "growing", "shrinking"]
DIRECTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}  # image y grows downwards
TRAVEL = 28.0  # pixels a moving shape covers from the first frame to the last
R_MOVE_MIN, R_MOVE_MAX = 7.0, 10.0
R_SMALL, R_LARGE = 5.0, 15.0

PAD = "<pad>"
VOCAB = [PAD, "a", "an"] + COLORS + SHAPES + ["moving", "left", "right", "up", "down", "growing", "shrinking", "on",
                                             "background"]
WORD_ID = {w: i for i, w in enumerate(VOCAB)}
MAX_LENGTH = 10
P_BACKGROUND = 0.8


split_words = flux_world.split_words


def tokenize(prompt):
    """Prompt -> int64 ids [MAX_LENGTH], padded with 0. Raises ValueError for unknown words."""
    return flux_world.tokenize(prompt, WORD_ID, MAX_LENGTH)


def random_clip(rng):
    """A dict: shape, color, background, motion, and per frame the center (x, y) and radius."""
    background = COLORS[rng.integers(len(COLORS))]
    color = background
    while color == background:
        color = COLORS[rng.integers(len(COLORS))]
    motion = MOTIONS[rng.integers(len(MOTIONS))]
    u = np.linspace(0.0, 1.0, FRAMES)
    if motion in DIRECTIONS:
        r = rng.uniform(R_MOVE_MIN, R_MOVE_MAX)
        margin = 1.3 * r + 1  # a triangle's box reaches 1.25 r from its center
        dx, dy = DIRECTIONS[motion]
        # The path's midpoint: anywhere that keeps both ends inside the frame.
        along = rng.uniform(margin + TRAVEL / 2, SIZE - margin - TRAVEL / 2)
        across = rng.uniform(margin, SIZE - margin)
        mid = (along, across) if dx else (across, along)
        xs = mid[0] + dx * TRAVEL * (u - 0.5)
        ys = mid[1] + dy * TRAVEL * (u - 0.5)
        radii = np.full(FRAMES, r)
    else:
        cx, cy = rng.uniform(28, 36), rng.uniform(28, 36)
        xs, ys = np.full(FRAMES, cx), np.full(FRAMES, cy)
        radii = R_SMALL + (R_LARGE - R_SMALL) * (u if motion == "growing" else 1 - u)
    return dict(shape=SHAPES[rng.integers(len(SHAPES))], color=color, background=background, motion=motion,
                xs=xs, ys=ys, radii=radii)


def motion_words(motion):
    return ["moving", motion] if motion in DIRECTIONS else [motion]


def caption(clip, rng=None, full=False):
    """The clip's caption; with rng (and not full) the background clause is said with probability
    P_BACKGROUND."""
    words = [flux_world.article(clip["color"]), clip["color"], clip["shape"]] + motion_words(clip["motion"])
    if full or rng is None or rng.random() < P_BACKGROUND:
        words += ["on", flux_world.article(clip["background"]), clip["background"], "background"]
    return " ".join(words)


def render(clip):
    """The clip as float32 [3, FRAMES, SIZE, SIZE] in [-1, 1] (the VAE's input range)."""
    bg = np.array(PALETTE[clip["background"]], dtype=np.float64)[:, None, None]
    fg = np.array(PALETTE[clip["color"]], dtype=np.float64)[:, None, None]
    frames = []
    for x, y, r in zip(clip["xs"], clip["ys"], clip["radii"]):
        cov = flux_world.coverage(clip["shape"], x, y, r)
        frames.append(bg * (1 - cov) + fg * cov)
    return (np.stack(frames, axis=1) / 127.5 - 1.0).astype(np.float32)


def make_pool(n, seed):
    """n random clips and their videos as uint8 [n, 3, FRAMES, SIZE, SIZE] (bytes: 1.3 GB for 6,000)."""
    rng = np.random.default_rng(seed)
    clips = [random_clip(rng) for _ in range(n)]
    videos = np.empty((n, 3, FRAMES, SIZE, SIZE), dtype=np.uint8)
    for i, c in enumerate(clips):
        videos[i] = np.round((render(c) + 1) * 127.5).clip(0, 255).astype(np.uint8)
    return clips, videos


if __name__ == "__main__":
    # A contact sheet of random clips (frames 0, 4, 8, 12, 16 of each row), for a look.
    from PIL import Image
    rng = np.random.default_rng(0)
    rows = []
    for i in range(8):
        c = random_clip(rng)
        print(i, caption(c, full=True))
        v = np.round((render(c) + 1) * 127.5).clip(0, 255).astype(np.uint8)
        rows.append(np.concatenate([v[:, f].transpose(1, 2, 0) for f in range(0, FRAMES, 4)], axis=1))
    print("vocabulary:", len(VOCAB) - 1, "words:", " ".join(VOCAB[1:]))
    Image.fromarray(np.concatenate(rows, axis=0)).save(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tinywan_dataset.png")
