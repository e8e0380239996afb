#!/usr/bin/python3
"""Semantic evaluation of a tinyflux model: over 100 fixed prompts and seeds, how often the shape's
color, the background, the shape class, the count and the position come out as asked.

    /usr/bin/python3 tools/tinyflux/evaluate.py [--model assets/tinyflux] [--cfg-scale 3] [--json OUT]
    /usr/bin/python3 tools/tinyflux/evaluate.py --self-check     # the grader on the dataset's own pictures

The prompts are full captions (size, color, shape, position and background all said), drawn with
a fixed seed from dataset.py's grammar; prompt i is sampled with seed i by the PyTorch sampler
(sample.py, step for step cubevec's pipeline). Grading (shapes.py for the geometry):

  color       the majority nearest palette color of the foreground is the asked one
  background  the majority nearest palette color of the border is the asked one
  shape       every shape found is of the asked class (circle / square / triangle by fill ratio
              and taper; a blob is wrong)
  count       the number of shapes found is the asked one (1 or 2)
  position    the shapes' mean center is within POSITION_TOLERANCE pixels of the asked anchor
  all         all five

--self-check grades the dataset's renders of the same 100 scenes; every rate must be 1.0, or the
grader, not the model, is wrong.
"""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dataset  # noqa: E402
import shapes  # noqa: E402

PROMPT_COUNT = 100
PROMPT_SEED = 2027
POSITION_TOLERANCE = 8.0
ATTRIBUTES = ("color", "background", "shape", "count", "position")


def fixed_scenes(n=PROMPT_COUNT, seed=PROMPT_SEED):
    """n scenes (with their full captions) from the dataset's grammar, always the same."""
    rng = np.random.default_rng(seed)
    scenes = [dataset.random_scene(rng) for _ in range(n)]
    for s in scenes:
        s["centers"] = [tuple(c) for c in (dataset.ANCHOR_ONE[s["position"]],) ] if s["count"] == 1 else \
            [tuple(c) for c in dataset.ANCHOR_TWO[s["position"]]]
        s["prompt"] = dataset.caption(s, full=True)
    return scenes


def grade(pixels, scene):
    """Dict attribute -> bool (and what was read) for one RGB uint8 picture [H, W, 3]."""
    background, color = dataset.dominant_colors(pixels)
    found = shapes.read_shapes(pixels, background)
    anchor = np.mean(np.array(scene["centers"], dtype=np.float64), axis=0)
    if found:
        mean_center = np.mean(np.array([f["center"] for f in found]), axis=0)
        off = float(np.hypot(*(mean_center - anchor)))
    else:
        off = float("inf")
    result = dict(
        color=color == scene["color"],
        background=background == scene["background"],
        shape=bool(found) and all(f["kind"] == scene["shape"] for f in found),
        count=len(found) == scene["count"],
        position=off <= POSITION_TOLERANCE,
    )
    result["all"] = all(result[a] for a in ATTRIBUTES)
    result["read"] = dict(color=color, background=background, shapes=[f["kind"] for f in found],
                          fills=[round(f["fill"], 3) for f in found], offset=round(off, 2))
    return result


def summarize(grades):
    return {a: float(np.mean([g[a] for g in grades])) for a in ATTRIBUTES + ("all",)}


def self_check(scenes):
    grades = []
    for s in scenes:
        img = np.round((dataset.render(s).transpose(1, 2, 0) + 1) * 127.5).clip(0, 255).astype(np.uint8)
        grades.append(grade(img, s))
    bad = [(s["prompt"], g["read"]) for s, g in zip(scenes, grades) if not g["all"]]
    return summarize(grades), bad


def evaluate_model(model, scenes, steps=28, cfg_scale=0.0, progress=True):
    """(rates, per-prompt rows, pictures) of a sample.TinyFlux over the scenes."""
    import sample as S
    grades, pictures = [], []
    for i, s in enumerate(scenes):
        kw = dict(negative_prompt="", cfg_scale=cfg_scale) if cfg_scale > 0 else {}
        px = S.to_pixels(model.sample(s["prompt"], seed=i, steps=steps, **kw))
        grades.append(grade(px, s))
        pictures.append(px)
        if progress and (i + 1) % 10 == 0:
            print(f"  {i + 1}/{len(scenes)} prompts: {summarize(grades)}", flush=True)
    rows = [dict(prompt=s["prompt"], seed=i, **{k: v for k, v in g.items()}) for i, (s, g) in enumerate(zip(scenes, grades))]
    return summarize(grades), rows, pictures


def contact_sheet(pictures, path, columns=10):
    from PIL import Image
    size = pictures[0].shape[0]
    rows = (len(pictures) + columns - 1) // columns
    sheet = np.zeros((rows * size, columns * size, 3), dtype=np.uint8)
    for i, p in enumerate(pictures):
        sheet[(i // columns) * size:(i // columns + 1) * size, (i % columns) * size:(i % columns + 1) * size] = p
    Image.fromarray(sheet).save(path)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=os.path.join(os.path.dirname(os.path.dirname(HERE)), "assets", "tinyflux"))
    p.add_argument("--steps", type=int, default=28)
    p.add_argument("--cfg-scale", type=float, default=0.0, help="true CFG with the empty prompt; 0 = off")
    p.add_argument("--json", help="write the rates and every prompt's grade here")
    p.add_argument("--sheet", help="write the 100 pictures as a 10x10 PNG here")
    p.add_argument("--self-check", action="store_true", help="grade the dataset's own renders (all must pass)")
    args = p.parse_args()
    scenes = fixed_scenes()
    if args.self_check:
        rates, bad = self_check(scenes)
        print("self-check on the dataset's renders:", rates)
        for prompt, read in bad:
            print("  MISREAD:", prompt, read)
        sys.exit(0 if not bad else 1)
    import torch
    import sample as S
    torch.set_num_threads(2)
    model = S.TinyFlux(args.model)
    rates, rows, pictures = evaluate_model(model, scenes, steps=args.steps, cfg_scale=args.cfg_scale)
    print(f"{args.model}: {args.steps} steps, CFG {'off' if args.cfg_scale <= 0 else args.cfg_scale}:")
    for a in ATTRIBUTES + ("all",):
        print(f"  {a:<10} {rates[a]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(model=args.model, steps=args.steps, cfg_scale=args.cfg_scale, rates=rates, rows=rows), f, indent=1)
    if args.sheet:
        contact_sheet(pictures, args.sheet)


if __name__ == "__main__":
    main()
