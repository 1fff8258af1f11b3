"""Sensitivity probe speed: the fast probe on all groups beside the full probe on a few, full-size ViT-B/16.

Random-weight ViT-B/16 (transformers' default ViTConfig, 1,000 classes, 224x224), 64 seeded calibration images,
refit on (as runs with recovery do). Prints CPU-seconds (process, all threads) and wall seconds of each, the full
probe's per-group cost extrapolated to every group, the ratio, and the two probes' damage on the groups both
measured. The machine may be shared: CPU-seconds count, the load average is printed.

    .venv/bin/python bench/probe_speed.py                  # fast on 24 groups, full on the first 2
    .venv/bin/python bench/probe_speed.py --model resnet   # ResNet-50
    .venv/bin/python bench/probe_speed.py --tiny           # smoke test: 2-block configs of the same family, 8 images
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    """Time both probes and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("vit", "resnet"), default="vit")
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--full-groups", type=int, default=2, help="groups the full probe measures")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tiny", action="store_true", help="smoke test: a 2-block config of the family, 8 images")
    args = parser.parse_args(argv)
    if args.tiny:
        args.images = min(args.images, 8)

    import torch
    from transformers import ResNetConfig, ResNetForImageClassification, ViTConfig, ViTForImageClassification

    from profiling_agent.tools.compression.families import adapter_for
    from profiling_agent.tools.profiling.probe_fast import probe_groups
    from profiling_agent.tools.profiling.sensitivity import probe_groups_full

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    small = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}
    if args.model == "vit":
        model = ViTForImageClassification(ViTConfig(num_labels=1000, **(small if args.tiny else {}))).eval()
    else:
        tiny = {"embedding_size": 8, "hidden_sizes": [16, 32], "depths": [1, 1]}
        model = ResNetForImageClassification(ResNetConfig(num_labels=1000, **(tiny if args.tiny else {}))).eval()
    pixels = torch.randn(args.images, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    groups = adapter_for(model).prunable_groups(model)
    print(f"{args.model}: {len(groups)} groups, {args.images} images, load {os.getloadavg()}", flush=True)

    cpu, wall = time.process_time(), time.perf_counter()
    fast = probe_groups(model, groups, pixels, recover=True)
    fast_cpu, fast_wall = time.process_time() - cpu, time.perf_counter() - wall
    print(f"fast probe, {len(groups)} groups: {fast_cpu:.1f} CPU-s, {fast_wall:.1f} s wall", flush=True)

    some = groups[: args.full_groups]
    cpu, wall = time.process_time(), time.perf_counter()
    full = probe_groups_full(model, some, pixels, recover=True)
    full_cpu, full_wall = time.process_time() - cpu, time.perf_counter() - wall
    per_group = full_cpu / max(len(some), 1)
    print(
        f"full probe, {len(some)} groups: {full_cpu:.1f} CPU-s, {full_wall:.1f} s wall; "
        f"{per_group:.1f} CPU-s per group -> about {per_group * len(groups):.0f} CPU-s for all {len(groups)}"
    )
    print(f"fast / full (all groups, extrapolated): {fast_cpu / (per_group * len(groups)):.3f}")
    for g in some:
        print(f"  {g.name:<28} damage full {full[g.name]['damage']:.5g}  fast {fast[g.name]['damage']:.5g}")
    print(f"load average now {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
