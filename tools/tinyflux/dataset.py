"""The tiny model's world: captioned 64x64 pictures of one or two colored shapes.

Everything the model knows comes from here: the palette, the shapes, sizes and positions, the
caption grammar, the vocabulary and the word-level tokenizer. Pure numpy (no torch), deterministic
for a given seed.

A picture: a flat background of one palette color and one or two shapes (circle, square or
triangle) of one other palette color, of one size, placed at one of five anchors (center, left,
right, top, bottom) with a jitter of up to 1.5 pixels. Edges are anti-aliased analytically (pixel
coverage from the signed distance to the shape's edge).

Two shapes are the same kind, color and size (small or medium; never large), side by side
horizontally (center, top, bottom) or stacked vertically (left, right).

Caption grammar (words always in this order; [..] may be left out):

    ARTICLE [SIZE] COLOR SHAPE [POSITION] [on ARTICLE COLOR background]

    ARTICLE   a | an (before a vowel) | two (two shapes; SHAPE then takes its plural)
    SIZE      small | medium | large                   (said with probability 0.8)
    COLOR     red | orange | yellow | green | blue | purple | white | black
    SHAPE     circle | square | triangle  (circles | squares | triangles)
    POSITION  in the center | on the left | on the right | at the top | at the bottom  (p = 0.8)
    background clause                                  (said with probability 0.9)

e.g. "a red circle on a blue background", "two small yellow squares on the left", "an orange
triangle at the top on a black background". The empty caption "" (all padding) is what the
training's caption dropout feeds for classifier-free guidance. What a caption leaves out is drawn
at random, so the model learns to fill it in.

Vocabulary: VOCAB below, 30 words plus the padding token "<pad>" (id 0). The tokenizer lower-cases,
treats , . ; : ! ? as spaces, splits on whitespace and maps each word to its id; a word outside the
vocabulary is an error listing the known words; at most MAX_LENGTH (16) words; the ids are padded
with 0 to MAX_LENGTH, as FluxPipeline pads T5's input (no attention mask).
"""
import numpy as np

SIZE = 64  # pixels, square

# name -> RGB (0..255). Hues far apart, so "the nearest palette color" is unambiguous.
PALETTE = {
    "red": (220, 40, 40),
    "orange": (245, 140, 20),
    "yellow": (245, 220, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "purple": (140, 60, 190),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}
COLORS = list(PALETTE)
SHAPES = ["circle", "square", "triangle"]
SIZES = {"small": 6.0, "medium": 10.0, "large": 15.0}  # circle radius in pixels
POSITIONS = ["center", "left", "right", "top", "bottom"]
POSITION_WORDS = {"center": ["in", "the", "center"], "left": ["on", "the", "left"], "right": ["on", "the", "right"],
                  "top": ["at", "the", "top"], "bottom": ["at", "the", "bottom"]}
# Shape centers (x, y) in pixels: one shape, and two shapes.
ANCHOR_ONE = {"center": (32, 32), "left": (17, 32), "right": (47, 32), "top": (32, 17), "bottom": (32, 47)}
ANCHOR_TWO = {"center": ((20, 32), (44, 32)), "left": ((17, 20), (17, 44)), "right": ((47, 20), (47, 44)),
              "top": ((20, 17), (44, 17)), "bottom": ((20, 47), (44, 47))}
JITTER = 0.0

PAD = "<pad>"
VOCAB = [PAD, "a", "an", "two", "small", "medium", "large"] + COLORS + \
        ["circle", "circles", "square", "squares", "triangle", "triangles",
         "in", "on", "at", "the", "center", "left", "right", "top", "bottom", "background"]
WORD_ID = {w: i for i, w in enumerate(VOCAB)}
MAX_LENGTH = 16
P_SIZE, P_POSITION, P_BACKGROUND = 0.8, 0.8, 0.9


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------
def split_words(prompt):
    for ch in ",.;:!?":
        prompt = prompt.replace(ch, " ")
    return prompt.lower().split()


def tokenize(prompt, word_id=None, max_length=None):
    """Prompt -> int64 ids [max_length], padded with 0 (by default this world's WORD_ID and
    MAX_LENGTH; tools/tinywan passes its own). Raises ValueError for unknown words."""
    word_id, max_length = word_id or WORD_ID, max_length or MAX_LENGTH
    words = split_words(prompt)
    unknown = [w for w in words if w not in word_id or w == PAD]
    if unknown:
        raise ValueError(f"unknown words {unknown}; known words: {' '.join(w for w in word_id if w != PAD)}")
    if len(words) > max_length:
        raise ValueError(f"{len(words)} words; at most {max_length}")
    ids = np.zeros(max_length, dtype=np.int64)
    ids[:len(words)] = [word_id[w] for w in words]
    return ids


# ---------------------------------------------------------------------------------------------
# Scenes, captions, pictures
# ---------------------------------------------------------------------------------------------
def random_scene(rng):
    """A dict: count, shape, color, background, size, position, centers [(x, y), ...]."""
    count = 1 if rng.random() < 0.6 else 2
    background = COLORS[rng.integers(len(COLORS))]
    color = background
    while color == background:
        color = COLORS[rng.integers(len(COLORS))]
    size = ["small", "medium", "large"][rng.integers(3)] if count == 1 else ["small", "medium"][rng.integers(2)]
    position = POSITIONS[rng.integers(len(POSITIONS))]
    anchors = [ANCHOR_ONE[position]] if count == 1 else list(ANCHOR_TWO[position])
    centers = [(x + rng.uniform(-JITTER, JITTER), y + rng.uniform(-JITTER, JITTER)) for x, y in anchors]
    return dict(count=count, shape=SHAPES[rng.integers(len(SHAPES))], color=color, background=background, size=size,
                position=position, centers=centers)


def article(next_word):
    return "an" if next_word[0] in "aeiou" else "a"


def caption(scene, rng=None, full=False):
    """The scene's caption; with rng (and not full), size, position and background are each left out
    at random (probabilities P_SIZE, P_POSITION, P_BACKGROUND of being said)."""
    say = (lambda p: True) if full or rng is None else (lambda p: rng.random() < p)
    words = []
    if say(P_SIZE):
        words.append(scene["size"])
    words.append(scene["color"])
    words.append(scene["shape"] + ("s" if scene["count"] == 2 else ""))
    words.insert(0, "two" if scene["count"] == 2 else article(words[0]))
    if say(P_POSITION):
        words += POSITION_WORDS[scene["position"]]
    if say(P_BACKGROUND):
        words += ["on", article(scene["background"]), scene["background"], "background"]
    return " ".join(words)


def parse_caption(text):
    """The attributes a caption states (for tests and evaluation): dict with count, size, color,
    shape, position, background (None when not said)."""
    w = split_words(text)
    out = dict(count=2 if w and w[0] == "two" else 1, size=None, color=None, shape=None, position=None, background=None)
    if "background" in w:
        out["background"] = w[w.index("background") - 1]
        w = w[:w.index("background") - 3]
    for word in w:
        if word in SIZES:
            out["size"] = word
        elif word in PALETTE and out["color"] is None:
            out["color"] = word
        elif word.rstrip("s") in SHAPES:
            out["shape"] = word.rstrip("s")
        elif word in POSITION_WORDS:
            out["position"] = word
    return out


def coverage(shape, cx, cy, r):
    """Anti-aliased coverage [SIZE, SIZE] in [0, 1] of one shape centered at (cx, cy), radius r."""
    y, x = np.mgrid[0:SIZE, 0:SIZE].astype(np.float64) + 0.5  # pixel centers
    dx, dy = x - cx, y - cy
    if shape == "circle":
        d = np.hypot(dx, dy) - r
    elif shape == "square":
        d = np.maximum(np.abs(dx), np.abs(dy)) - 0.88 * r
    else:  # equilateral triangle pointing up, circumradius 1.25 r, its bounding box centered on (cx, cy)
        R = 1.25 * r
        dy = dy + 0.25 * R  # centroid sits R/4 below the box's vertical center
        # three edges: outward normals at 90 + 120k degrees (down, upper-left, upper-right), at distance R/2
        d = np.full_like(x, -np.inf)
        for angle in (np.pi / 2, np.pi / 2 + 2 * np.pi / 3, np.pi / 2 + 4 * np.pi / 3):
            d = np.maximum(d, dx * np.cos(angle) + dy * np.sin(angle) - R / 2)
    return np.clip(0.5 - d, 0.0, 1.0)


def render(scene):
    """The picture as float32 [3, SIZE, SIZE] in [-1, 1] (the VAE's input range)."""
    r = SIZES[scene["size"]]
    cov = np.zeros((SIZE, SIZE))
    for cx, cy in scene["centers"]:
        cov = np.maximum(cov, coverage(scene["shape"], cx, cy, r))
    bg = np.array(PALETTE[scene["background"]], dtype=np.float64)[:, None, None]
    fg = np.array(PALETTE[scene["color"]], dtype=np.float64)[:, None, None]
    img = bg * (1 - cov) + fg * cov
    return (img / 127.5 - 1.0).astype(np.float32)


def make_pool(n, seed):
    """n random scenes and their pictures [n, 3, SIZE, SIZE] (float32, [-1, 1])."""
    rng = np.random.default_rng(seed)
    scenes = [random_scene(rng) for _ in range(n)]
    images = np.stack([render(s) for s in scenes])
    return scenes, images


# ---------------------------------------------------------------------------------------------
# Reading colors back (the semantic check; tests/pipelines/tinyflux_test.cpp does the same in C++)
# ---------------------------------------------------------------------------------------------
def nearest_color(rgb):
    names = list(PALETTE)
    table = np.array([PALETTE[n] for n in names], dtype=np.float64)
    return names[int(np.argmin(((table - np.asarray(rgb, dtype=np.float64)) ** 2).sum(-1)))]


def dominant_colors(pixels, ring=2, threshold=60.0):
    """(background, shape) palette names of an RGB uint8 picture [H, W, 3]: the background is the
    majority nearest palette color of the pixels within `ring` of the border; the shape is the
    majority nearest palette color of the pixels farther than `threshold` (RGB distance) from the
    background's palette color (None when there are none)."""
    px = pixels.astype(np.float64)
    h, w, _ = px.shape
    border = np.concatenate([px[:ring].reshape(-1, 3), px[-ring:].reshape(-1, 3), px[:, :ring].reshape(-1, 3),
                             px[:, -ring:].reshape(-1, 3)])
    votes = {}
    for p in border:
        n = nearest_color(p)
        votes[n] = votes.get(n, 0) + 1
    background = max(votes, key=votes.get)
    far = px.reshape(-1, 3)[np.linalg.norm(px.reshape(-1, 3) - np.array(PALETTE[background]), axis=1) > threshold]
    if len(far) == 0:
        return background, None
    votes = {}
    for p in far:
        n = nearest_color(p)
        votes[n] = votes.get(n, 0) + 1
    return background, max(votes, key=votes.get)


if __name__ == "__main__":
    # A contact sheet of random captioned pictures, for a look: dataset.py [OUT.png]
    import sys
    from PIL import Image
    rng = np.random.default_rng(0)
    scenes = [random_scene(rng) for _ in range(32)]
    sheet = np.zeros((4 * SIZE, 8 * SIZE, 3), dtype=np.uint8)
    for i, s in enumerate(scenes):
        img = np.round((render(s).transpose(1, 2, 0) + 1) * 127.5).clip(0, 255).astype(np.uint8)
        sheet[(i // 8) * SIZE:(i // 8 + 1) * SIZE, (i % 8) * SIZE:(i % 8 + 1) * SIZE] = img
        print(i, caption(s, rng), "|", dominant_colors(img))
    print("vocabulary:", len(VOCAB) - 1, "words:", " ".join(VOCAB[1:]))
    Image.fromarray(sheet).save(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tinyflux_dataset.png")
