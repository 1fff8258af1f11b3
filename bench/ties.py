"""The form tie rule's error rates on synthetic interleaved timings: equal forms judged apart, unequal ones told apart.

Usage:
    python bench/ties.py                  # 400 timings per cell, 10 and 15 repeats, +-5% and +-20% noise
    python bench/ties.py --timings 100

Each timing draws two forms' per-repeat samples, each sample the form's true latency times (1 + uniform noise),
and asks the tie rule (`tools/evaluation/ties.speed_tied`) whether the slower by median is within noise of the
faster. "apart" is the share of timings where two equally fast forms were judged apart (a same-seed run could then
deliver the other form), "told" the share where a form truly 10%, 20% or 50% slower was told apart.
"""

from __future__ import annotations

import argparse
import random
import statistics

from profiling_agent.state import VariantRecord
from profiling_agent.tools.evaluation.ties import speed_tied


def judged_apart(rng: random.Random, slower: float, noise: float, repeats: int) -> bool:
    """Time two forms (the second `slower` times the first) once; return whether the rule told them apart."""
    samples = {
        "ort_fp32": [1.0 + rng.uniform(-noise, noise) for _ in range(repeats)],
        "ort_dynamic": [slower * (1.0 + rng.uniform(-noise, noise)) for _ in range(repeats)],
    }
    forms = [
        VariantRecord(name=n, backend="onnxruntime", status="ok", accuracy=90.0, latency_ms=statistics.median(s))
        for n, s in samples.items()
    ]
    fast, slow = sorted(forms, key=lambda f: f.latency_ms or 0.0)
    return not speed_tied(slow, fast, samples)[0]


def main(argv: list[str] | None = None) -> int:
    """Print one row per (noise, repeats): the false-apart rate and the rates of telling real differences apart."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timings", type=int, default=400, help="synthetic timings per cell")
    args = parser.parse_args(argv)
    print("noise  repeats  apart(equal)  told(1.1x)  told(1.2x)  told(1.5x)")
    for noise in (0.05, 0.2):
        for repeats in (10, 15):
            rates = []
            for slower in (1.0, 1.1, 1.2, 1.5):
                rng = random.Random(0)
                hits = sum(judged_apart(rng, slower, noise, repeats) for _ in range(args.timings))
                rates.append(hits / args.timings)
            print(f"{noise:5.2f}  {repeats:7d}  " + "  ".join(f"{r:10.1%}" for r in rates))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
