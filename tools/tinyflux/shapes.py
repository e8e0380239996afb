"""Reading shapes back from a picture: how many, and which class (circle, square, triangle).

The semantic evaluation (`evaluate.py`) and its self-check use this; pure numpy + scipy.ndimage.

A picture's foreground is every pixel farther than THRESHOLD (RGB distance) from the background's
palette color. Its 8-connected components of at least MIN_AREA pixels, and at least a fifth of the
largest one, are the shapes. Each is classified by two geometric measures of its pixel mask:

  fill   area / bounding-box area: a square fills its box (1.0), a circle pi/4 (0.785), the
         dataset's upward triangle 1/2;
  taper  the mask's width over the top quarter of its box divided by the width over the bottom
         quarter: about 1 for circles and squares, near 0 for an upward triangle.

  square    fill >= 0.89
  triangle  fill < 0.66 and taper < 0.6
  circle    0.66 <= fill < 0.89, taper >= 0.6 and the box's aspect within 3:4 .. 4:3
  blob      anything else (never right)
"""
import numpy as np
from scipy import ndimage

import dataset

THRESHOLD = 60.0
MIN_AREA = 12


def foreground(pixels, background):
    """Boolean mask [H, W] of the pixels far from the background's palette color."""
    px = pixels.astype(np.float64)
    return np.linalg.norm(px - np.array(dataset.PALETTE[background], dtype=np.float64), axis=-1) > THRESHOLD


def classify(mask):
    """(class, fill, taper) of one component's mask (cropped or not)."""
    ys, xs = np.nonzero(mask)
    y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
    box = mask[y0:y1, x0:x1]
    h, w = box.shape
    fill = box.sum() / float(h * w)
    quarter = max(1, h // 4)
    top = box[:quarter].sum(axis=1).mean()
    bottom = box[-quarter:].sum(axis=1).mean()
    taper = top / max(bottom, 1e-9)
    aspect = w / float(h)
    if fill >= 0.89:
        kind = "square"
    elif fill < 0.66 and taper < 0.6:
        kind = "triangle"
    elif fill >= 0.66 and taper >= 0.6 and 0.75 <= aspect <= 4 / 3:
        kind = "circle"
    else:
        kind = "blob"
    return kind, float(fill), float(taper)


def read_shapes(pixels, background):
    """The shapes of an RGB uint8 picture [H, W, 3] on the given background: a list of dicts (class,
    fill, taper, area, center (x, y)), largest first."""
    labels, n = ndimage.label(foreground(pixels, background), structure=np.ones((3, 3)))
    comps = []
    for i in range(1, n + 1):
        m = labels == i
        area = int(m.sum())
        if area >= MIN_AREA:
            comps.append((area, m))
    if not comps:
        return []
    largest = max(a for a, _ in comps)
    out = []
    for area, m in sorted(comps, key=lambda c: -c[0]):
        if area * 5 < largest:
            continue
        kind, fill, taper = classify(m)
        ys, xs = np.nonzero(m)
        out.append(dict(kind=kind, fill=fill, taper=taper, area=area, center=(float(xs.mean()), float(ys.mean()))))
    return out
