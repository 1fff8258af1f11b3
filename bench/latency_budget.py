"""What the run's timing budget saves on a full-size model, and what it changes in the medians.

Random-weight ViT-B/16 (transformers' default ViTConfig, 1,000 classes, 224x224) in the forms a run times side by
side: torch FP32, ONNX Runtime FP32 and ONNX Runtime dynamic QInt8. They are timed twice with the run's protocol
(batch 1 and batch 16, 3 warm-up passes, 15 repeats, 1 thread): with every repeat, as before, and with the run's
budget (`latency.RUN_BUDGET_S`: a model past it after MIN_REPEATS repeats sits out the rest). Prints the process
CPU-seconds of each timing and every model's medians and repeats in both.

    .venv/bin/python bench/latency_budget.py [--tiny] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paper_tables import build_full_size  # noqa: E402


def _forms(tiny: bool, folder: Path) -> tuple[dict[str, torch.nn.Module], torch.Tensor]:
    from profiling_agent.tools.runtimes.forms import build_forms

    if tiny:
        from transformers import ViTConfig, ViTForImageClassification

        small = ViTConfig(
            num_labels=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128
        )
        torch.manual_seed(0)
        model = ViTForImageClassification(small).eval()
    else:
        model = build_full_size("vit-b16")
    pixels = torch.randn(16, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    built = build_forms(model, pixels[:8], pixels[:4], folder, forms=["ort_fp32", "ort_dynamic"], threads=1)
    models: dict[str, torch.nn.Module] = {"baseline": model}
    for form in built:
        if form.status != "ok":
            raise SystemExit(f"{form.name} failed: {form.reason}")
        models[form.name] = form.model
    return models, pixels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a 2-layer ViT: a smoke test of the script")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    from profiling_agent.tools.evaluation.latency import RUN_BUDGET_S, measure_latency

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="latency-budget-") as scratch:
        models, pixels = _forms(args.tiny, Path(scratch))
        rows = {}
        for label, budget in (("every repeat", None), (f"budget {RUN_BUDGET_S:.0f} s", RUN_BUDGET_S)):
            cpu, wall = time.process_time(), time.perf_counter()
            lat = measure_latency(models, pixels, batch_size=16, warmup=3, repeats=args.repeats, budget_s=budget)
            rows[label] = {
                "cpu_s": round(time.process_time() - cpu, 1),
                "wall_s": round(time.perf_counter() - wall, 1),
                "models": {
                    name: {k: round(r[k], 2) for k in ("latency_ms", "latency_batch_ms")} | {"repeats": r["repeats"]}
                    for name, r in lat.items()
                },
            }
            print(f"{label}: {rows[label]['cpu_s']} CPU-s, {rows[label]['wall_s']} s wall", flush=True)
            for name, r in rows[label]["models"].items():
                print(
                    f"  {name:12s} batch 1 {r['latency_ms']:9.2f} ms  batch 16 {r['latency_batch_ms']:10.2f} ms"
                    f"  repeats {r['repeats']}"
                )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
