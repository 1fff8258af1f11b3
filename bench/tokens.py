"""Token merging composed with width pruning and OpenVINO INT8 (NNCF): four ov_int8 forms timed side by side.

Usage:
    python bench/tokens.py --quick                 # tiny ViT and DeiT configs, seconds: the smoke test
    python bench/tokens.py                         # full-size ViT-B/16 and DeiT-B/16 (random weights), minutes
    python bench/tokens.py --models vit-b16 --rate 13 --prune 0.3 --json out.json

Per model (built from its transformers config with random weights: speed only, no accuracy exists) the unpruned
model, the model with token merging (ToMe's constant rate r per layer, `--rate`), the model with `--prune` of every
MLP's intermediate channels removed (the engine's `prune_model`, L2 importance) and the pruned model with merging
are each exported and quantized by the form builders (`build_forms`, ov_int8: NNCF post-training INT8, the token
matching kept in float), then timed side by side (`time_side_by_side`): interleaved in a seeded order, same images,
same thread count (`--threads`, 1 by default), batch 1 and `--batch`, wall and process CPU time. The ratios are the
unpruned model's ov_int8 median latency over each form's. Each form's logits are checked against its torch model
by `build_forms` (INT8: reported, not bounded); `fidelity` is the ov_int8 form's top-1 agreement with its own torch
FP32 model on the check images.
Issue 37's target: merged + 30% pruned ov_int8 >= 2.0x faster at batch 1 than the unpruned model's ov_int8.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paper_tables import build_full_size  # noqa: E402

from profiling_agent.tools.compression.pruning import prune_model  # noqa: E402
from profiling_agent.tools.compression.token_merge import apply_token_merging, tokens_per_layer  # noqa: E402
from profiling_agent.tools.evaluation.latency import latency_inputs  # noqa: E402
from profiling_agent.tools.runtimes.forms import build_forms  # noqa: E402
from profiling_agent.tools.runtimes.forward import native_call, timed_calls_ms  # noqa: E402

FULL = ("vit-b16", "deit-b16")
# quick: ViT/DeiT-shaped models for 32x32 images in 4x4 patches (64 patches), 4 layers of hidden 64 with 4 heads
QUICK_CONFIG = {
    "image_size": 32,
    "patch_size": 4,
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "num_labels": 10,
}
PROFILES = {
    "quick": {"rate": 8, "repeats": 3, "warmup": 1, "calib": 4, "check": 4},
    "full": {"rate": 13, "repeats": 15, "warmup": 2, "calib": 8, "check": 8},  # r=13: ToMe's ViT-B/16 setting
}
VARIANTS = ("unpruned", "merged", "pruned", "merged+pruned")
TARGET = 2.0  # issue 37: merged + 30%-pruned ov_int8 vs the unpruned ov_int8 at batch 1


def say(message: str) -> None:
    """Print a progress line on stderr (stdout carries the table)."""
    print(message, file=sys.stderr, flush=True)


def build_model(name: str, quick: bool) -> torch.nn.Module:
    """Build the full-size model `name`, or (quick) its tiny stand-in, with seeded random weights."""
    if not quick:
        return build_full_size(name)
    import transformers

    config_cls, model_cls = {
        "vit-b16": ("ViTConfig", "ViTForImageClassification"),
        "deit-b16": ("DeiTConfig", "DeiTForImageClassification"),
    }[name]
    torch.manual_seed(0)
    return getattr(transformers, model_cls)(getattr(transformers, config_cls)(**QUICK_CONFIG)).eval()


def variants(model: torch.nn.Module, rate: int, prune: float, example: torch.Tensor) -> dict[str, Any]:
    """Return the four torch models (unpruned, merged, pruned, merged+pruned) and what was done to each."""
    import copy

    out: dict[str, Any] = {"unpruned": (model, {})}
    merged = copy.deepcopy(model)
    schedule = apply_token_merging(merged, rate)
    facts = {"schedule": schedule, "tokens_per_layer": tokens_per_layer(merged, schedule)}
    out["merged"] = (merged, facts)
    pruned = copy.deepcopy(model)
    prune_model(pruned, [{"layer": "mlp", "type": "structured", "ratio": prune}], example)
    widths = sorted({layer.mlp.fc1.out_features for layer in pruned.get_submodule(_backbone(pruned)).layers})
    out["pruned"] = (pruned, {"mlp_widths": widths})
    both = copy.deepcopy(pruned)
    apply_token_merging(both, schedule)
    out["merged+pruned"] = (both, {**facts, "mlp_widths": widths})
    return out


def _backbone(model: torch.nn.Module) -> str:
    return "vit" if hasattr(model, "vit") else "deit"


def measure(name: str, settings: dict[str, Any], work: Path) -> dict[str, Any]:
    """Build the four ov_int8 forms of model `name` and time them side by side; return the rows."""
    model = build_model(name, settings["quick"])
    size = int(model.config.image_size)
    gen = torch.Generator().manual_seed(0)
    pixels = torch.randn(settings["calib"] + settings["check"], 3, size, size, generator=gen)
    calib, check = pixels[: settings["calib"]], pixels[settings["calib"] :]
    torch_models = variants(model, settings["rate"], settings["prune"], pixels[:1])
    forms, rows = {}, {}
    for variant, (torch_model, facts) in torch_models.items():
        say(f"{name}: building {variant} ov_int8")
        built = build_forms(
            torch_model, calib, check, work / name / variant, forms=["ov_int8"], threads=settings["threads"]
        )
        form = next(v for v in built if v.name == "ov_int8")
        if form.status != "ok":
            why = "; ".join(f"{v.name}: {v.error}" for v in built if v.error)  # ort_fp32 holds an export's reason
            raise RuntimeError(f"{name} {variant}: ov_int8 failed: {why}")
        forms[variant] = form.model
        rows[variant] = {**facts, "fidelity_top1_pct": form.logit_agreement, "max_abs_diff": form.max_abs_diff}
    say(f"{name}: timing {len(forms)} forms side by side, batch 1 and {settings['batch']}")
    lat = time_side_by_side(forms, pixels, settings)
    base = lat["unpruned"]
    for variant, row in rows.items():
        row.update(lat[variant])
        for key in ("b1", "batch", "b1_cpu", "batch_cpu"):
            row[f"speedup_{key}"] = base[f"latency_{key}_ms"] / lat[variant][f"latency_{key}_ms"]
    return rows


def time_side_by_side(forms: dict[str, Any], pixels: torch.Tensor, settings: dict[str, Any]) -> dict[str, Any]:
    """Time every form at batch 1 and the larger batch, interleaved in a seeded order that changes every repeat.

    Each sample is one call (`forward.timed_calls_ms` on the runtime's own call, `forward.native_call`), timed in
    wall time and in process CPU time: with one inference thread, CPU time is the work the form did, which a
    machine shared with other jobs inflates far less than wall time. Medians of `repeats` samples.
    """
    single, batch = latency_inputs(pixels, settings["batch"])
    bound = {n: {"b1": native_call(m, single), "batch": native_call(m, batch)} for n, m in forms.items()}
    wall: dict[str, dict[str, list[float]]] = {n: {"b1": [], "batch": []} for n in forms}
    cpu: dict[str, dict[str, list[float]]] = {n: {"b1": [], "batch": []} for n in forms}
    device = torch.device("cpu")
    for _ in range(settings["warmup"]):
        for calls in bound.values():
            calls["b1"](), calls["batch"]()
    shuffler = random.Random(0)
    for _ in range(settings["repeats"]):
        for kind in ("b1", "batch"):
            for name in shuffler.sample(list(forms), len(forms)):
                start = time.process_time()
                wall[name][kind].append(timed_calls_ms(bound[name][kind], 1, device))
                cpu[name][kind].append((time.process_time() - start) * 1e3)
    return {
        name: {
            "latency_b1_ms": statistics.median(wall[name]["b1"]),
            "latency_batch_ms": statistics.median(wall[name]["batch"]),
            "latency_b1_cpu_ms": statistics.median(cpu[name]["b1"]),
            "latency_batch_cpu_ms": statistics.median(cpu[name]["batch"]),
            "repeats": settings["repeats"],
        }
        for name in forms
    }


def print_rows(name: str, rows: dict[str, Any], batch: int) -> None:
    """Print one model's table: latency and the ratio to the unpruned model's ov_int8 at both batch sizes."""
    print(f"\n{name}: ov_int8 (NNCF), {torch.get_num_threads()} thread(s); ratio = unpruned ov_int8 / this")
    print("medians in ms, wall time (process CPU time in brackets)")
    print(f"| variant | b1 | b1 ratio | b{batch} | b{batch} ratio | tokens after each layer | top-1 vs torch |")
    print("|---|---|---|---|---|---|---|")
    for variant, row in rows.items():
        tokens = ",".join(str(t) for t in row.get("tokens_per_layer", [])) or "all"
        print(
            f"| {variant} | {row['latency_b1_ms']:.2f} ({row['latency_b1_cpu_ms']:.2f}) | "
            f"{row['speedup_b1']:.2f}x ({row['speedup_b1_cpu']:.2f}x) | "
            f"{row['latency_batch_ms']:.2f} ({row['latency_batch_cpu_ms']:.2f}) | "
            f"{row['speedup_batch']:.2f}x ({row['speedup_batch_cpu']:.2f}x) | {tokens} | "
            f"{row['fidelity_top1_pct']:.0f}% |"
        )
    both = rows["merged+pruned"]
    verdict = "met" if min(both["speedup_b1"], both["speedup_b1_cpu"]) >= TARGET else "NOT met"
    print(
        f"target (merged + pruned >= {TARGET:.1f}x at batch 1): {both['speedup_b1']:.2f}x wall, "
        f"{both['speedup_b1_cpu']:.2f}x CPU time: {verdict}"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny configs: a smoke run in seconds")
    parser.add_argument("--models", nargs="+", choices=FULL, default=list(FULL))
    parser.add_argument("--rate", type=int, default=None, help="tokens merged per layer (ToMe's r; capped per layer)")
    parser.add_argument("--prune", type=float, default=0.3, help="fraction of every MLP's channels removed")
    parser.add_argument("--batch", type=int, default=16, help="the larger batch size")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    profile = PROFILES["quick" if args.quick else "full"]
    settings = {
        **profile,
        "quick": args.quick,
        "rate": profile["rate"] if args.rate is None else args.rate,
        "repeats": args.repeats or profile["repeats"],
        "prune": args.prune,
        "batch": args.batch,
        "threads": args.threads,
    }
    if not 0.0 < args.prune < 1.0 or settings["rate"] < 0 or args.batch < 1 or args.threads < 1:
        print("tokens.py: --prune must be in (0, 1), --rate >= 0, --batch and --threads >= 1", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    out: dict[str, Any] = {"settings": settings, "models": {}}
    with tempfile.TemporaryDirectory(prefix="bench-tokens-") as scratch:
        for name in args.models:
            rows = measure(name, settings, Path(scratch))
            out["models"][name] = rows
            print_rows(name, rows, args.batch)
            sys.stdout.flush()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
