#!/usr/bin/python3
"""Semantic evaluation of tinywan: over fixed prompts and seeds, how often the shape's color, the
background and the motion come out as asked.

    /usr/bin/python3 tools/tinywan/evaluate.py [--model assets/tinywan] [--per-motion 10] [--json OUT] [--sheet OUT.png]
    /usr/bin/python3 tools/tinywan/evaluate.py --self-check     # the grader on the dataset's own clips
    /usr/bin/python3 tools/tinywan/evaluate.py --direction-check 8   # the four direction words from the same noise

The prompts are full captions drawn with a fixed seed from dataset.py's grammar, ten per motion
(left, right, up, down, growing, shrinking); prompt i is sampled with seed i by the PyTorch sampler
(sample.py, step for step cubevec's pipeline) at the model's generation defaults. Grading, per clip:

  background  the majority nearest palette color of the border pixels (over all frames) is the asked one
  color       the majority nearest palette color of the foreground (pixels farther than 60 in RGB
              from the background's color, over all frames) is the asked one
  motion      the centroid track of the foreground: for a move, the displacement from the mean of the
              first three frames to the mean of the last three is at least MIN_TRAVEL pixels and points
              within 45 degrees of the asked direction; for growing / shrinking the centroid moves
              less than MIN_TRAVEL and the foreground area of the last three frames is at least
              AREA_RATIO times (or at most 1 / AREA_RATIO times) that of the first three
  all         all three

--self-check grades the dataset's renders of the same clips; every rate must be 1.0, or the grader,
not the model, is wrong.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dataset  # noqa: E402

PER_MOTION = 10
PROMPT_SEED = 2028
MIN_TRAVEL = 8.0  # pixels; the dataset's moves cover 28
AREA_RATIO = 2.0  # the dataset's size changes are 9x in area
ATTRIBUTES = ("color", "background", "motion")
FOREGROUND_THRESHOLD = 60.0


def fixed_clips(per_motion=PER_MOTION, seed=PROMPT_SEED):
    """per_motion clips of each motion, with their full captions, always the same."""
    rng = np.random.default_rng(seed)
    clips = []
    for motion in dataset.MOTIONS:
        while sum(c["motion"] == motion for c in clips) < per_motion:
            c = dataset.random_clip(rng)
            if c["motion"] == motion:
                c["prompt"] = dataset.caption(c, full=True)
                clips.append(c)
    return clips


def track(frames, background):
    """Per frame (centroid (x, y) or None, foreground pixel count) of uint8 frames [F, H, W, 3]."""
    bg = np.array(dataset.PALETTE[background], dtype=np.float64)
    out = []
    for f in frames.astype(np.float64):
        mask = np.linalg.norm(f - bg, axis=-1) > FOREGROUND_THRESHOLD
        ys, xs = np.nonzero(mask)
        out.append(((float(xs.mean()) + 0.5, float(ys.mean()) + 0.5) if len(xs) else None, int(mask.sum())))
    return out


def read_motion(frames, background):
    """(motion name or None, displacement (dx, dy), area ratio last / first)."""
    t = track(frames, background)
    first, last = [c for c, _ in t[:3] if c], [c for c, _ in t[-3:] if c]
    if not first or not last:
        return None, (0.0, 0.0), 0.0
    dx, dy = np.mean(last, axis=0) - np.mean(first, axis=0)
    area_first, area_last = np.mean([a for _, a in t[:3]]), np.mean([a for _, a in t[-3:]])
    ratio = float(area_last / max(area_first, 1.0))
    if math.hypot(dx, dy) >= MIN_TRAVEL:
        angle = math.degrees(math.atan2(dy, dx))  # 0: right, 90: down (image y grows downwards)
        for name, (ux, uy) in dataset.DIRECTIONS.items():
            off = abs((angle - math.degrees(math.atan2(uy, ux)) + 180) % 360 - 180)
            if off <= 45:
                return name, (float(dx), float(dy)), ratio
    elif ratio >= AREA_RATIO:
        return "growing", (float(dx), float(dy)), ratio
    elif ratio <= 1 / AREA_RATIO:
        return "shrinking", (float(dx), float(dy)), ratio
    return None, (float(dx), float(dy)), ratio


def dominant_colors(frames):
    """(background, shape) palette names over all frames (tinyflux's reading on the frames side by side)."""
    return dataset.flux_world.dominant_colors(np.concatenate(list(frames), axis=1), threshold=FOREGROUND_THRESHOLD)


def grade(frames, clip):
    background, color = dominant_colors(frames)
    motion, shift, ratio = read_motion(frames, background)
    g = dict(background=background == clip["background"], color=color == clip["color"], motion=motion == clip["motion"])
    g["all"] = all(g[a] for a in ATTRIBUTES)
    g["read"] = dict(background=background, color=color, motion=motion, displacement=shift, area_ratio=ratio)
    return g


def summarize(grades):
    return {a: float(np.mean([g[a] for g in grades])) for a in ATTRIBUTES + ("all",)}


def clip_frames(clip):
    return np.round((dataset.render(clip).transpose(1, 2, 3, 0) + 1) * 127.5).clip(0, 255).astype(np.uint8)


def self_check(clips):
    grades = [grade(clip_frames(c), c) for c in clips]
    bad = [(c["prompt"], g["read"]) for c, g in zip(clips, grades) if not g["all"]]
    return summarize(grades), bad


def evaluate_model(model, clips, progress=True, **kw):
    import sample as S
    grades, rows, videos = [], [], []
    for i, c in enumerate(clips):
        frames = S.to_frames(model.sample(c["prompt"], seed=i, **kw))
        g = grade(frames, c)
        grades.append(g)
        videos.append(frames)
        rows.append(dict(prompt=c["prompt"], seed=i, **{a: bool(g[a]) for a in ATTRIBUTES + ("all",)}, read=g["read"]))
        if progress:
            print(f"  {'ok ' if g['all'] else 'BAD'} {i:3d} {c['prompt']!r}: {g['read']}", flush=True)
    return summarize(grades), rows, videos


DIRECTION_PROMPT = "a {color} {shape} moving {word} on a {background} background"
DIRECTION_CASES = [("red", "circle", "blue"), ("yellow", "square", "purple"), ("white", "triangle", "green"),
                   ("orange", "circle", "black")]


def direction_check(model, seeds, progress=True, **kw):
    """Do the words steer the motion, or the noise? Per seed and case, the four direction words
    are rendered from the same noise; returns (rate of clips moving as asked, mean spread in
    pixels: the mean distance of the four displacements from their mean). A model whose direction
    comes from the noise moves the same way for all four words: spread near 0, rate near 0.25."""
    import sample as S
    hits, spreads = [], []
    for seed in range(seeds):
        color, shape, background = DIRECTION_CASES[seed % len(DIRECTION_CASES)]
        shifts = []
        for word in dataset.DIRECTIONS:
            prompt = DIRECTION_PROMPT.format(color=color, shape=shape, word=word, background=background)
            frames = S.to_frames(model.sample(prompt, seed=seed, **kw))
            motion, shift, _ = read_motion(frames, background)
            hits.append(motion == word)
            shifts.append(shift)
        shifts = np.array(shifts)
        spreads.append(float(np.linalg.norm(shifts - shifts.mean(axis=0), axis=1).mean()))
        if progress:
            print(f"  seed {seed}: " + " ".join(f"{w} ({dx:+.0f},{dy:+.0f})" for w, (dx, dy) in zip(dataset.DIRECTIONS, shifts)),
                  flush=True)
    return float(np.mean(hits)), float(np.mean(spreads))


def contact_sheet(videos, path, every=4):
    """One row per clip: frames 0, every, 2 every, ..."""
    from PIL import Image
    Image.fromarray(np.concatenate([np.concatenate(list(v[::every]), axis=1) for v in videos], axis=0)).save(path)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=os.path.join(os.path.dirname(os.path.dirname(HERE)), "assets", "tinywan"))
    p.add_argument("--per-motion", type=int, default=PER_MOTION)
    p.add_argument("--steps", type=int, help="default: the model's generation_defaults.json")
    p.add_argument("--guidance", type=float, help="default: the model's generation_defaults.json")
    p.add_argument("--json", help="write the rates and every prompt's grade here")
    p.add_argument("--sheet", help="write the clips as a PNG here (one row per clip)")
    p.add_argument("--self-check", action="store_true", help="grade the dataset's own renders (all must pass)")
    p.add_argument("--direction-check", type=int, metavar="SEEDS",
                   help="instead: render the four direction words from the same noise for SEEDS seeds")
    args = p.parse_args()
    clips = fixed_clips(args.per_motion)
    if args.self_check:
        rates, bad = self_check(clips)
        print("self-check on the dataset's renders:", rates)
        for prompt, read in bad:
            print("  MISREAD:", prompt, read)
        sys.exit(0 if not bad else 1)
    import torch
    import sample as S
    torch.set_num_threads(2)
    try:
        model = S.TinyWan(args.model)
    except (OSError, ValueError, KeyError) as e:  # a missing folder or file, a config that does not parse
        p.error(f"--model {args.model}: not a tinywan folder ({e})")
    if args.direction_check is not None:
        if args.direction_check < 1:
            p.error(f"--direction-check {args.direction_check}: expected a positive number of seeds")
        rate, spread = direction_check(model, args.direction_check, steps=args.steps, guidance=args.guidance)
        print(f"{args.model}: the four direction words from the same noise, {args.direction_check} seeds: moving as asked "
              f"{rate:.2f} (0.25 if the noise decides), displacements {spread:.1f} px apart on average")
        return
    rates, rows, videos = evaluate_model(model, clips, steps=args.steps, guidance=args.guidance)
    print(f"{args.model}: {len(clips)} prompts, {args.steps or model.defaults['steps']} steps, guidance "
          f"{model.defaults['guidance'] if args.guidance is None else args.guidance}:")
    for a in ATTRIBUTES + ("all",):
        print(f"  {a:<10} {rates[a]:.2f}")
    for motion in dataset.MOTIONS:
        got = [r["motion"] for r, c in zip(rows, clips) if c["motion"] == motion]
        print(f"  motion {motion:<10} {np.mean(got):.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(model=args.model, rates=rates, rows=rows), f, indent=1)
    if args.sheet:
        contact_sheet(videos, args.sheet)


if __name__ == "__main__":
    main()
