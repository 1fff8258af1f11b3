"""Token merging composed with width pruning and OpenVINO INT8 (NNCF): four ov_int8 forms timed side by side.

Usage:
    python bench/tokens.py --quick                 # tiny ViT and DeiT configs, seconds: the smoke test
    python bench/tokens.py                         # full-size ViT-B/16 and DeiT-B/16 (random weights), minutes
    python bench/tokens.py --models vit-b16 --rate 13 --prune 0.3 --json out.json
    python bench/tokens.py --models vit-b16 --rate 32,32,32,0,0,0,0,0,0,0,0,0   # three merge sites, not twelve

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

Zoo mode (`--zoo [DIR]`; `--tiny` runs it on the tiny zoo as a smoke test): the trained zoo ViT with 196 patch
tokens (bench/zoo.py's vit-tokens, built when missing), so merging is judged on accuracy too:

    python bench/tokens.py --zoo                                   # ov_int8 and ort_dynamic, r 16/32, 30%/50%
    python bench/tokens.py --zoo --rates 24 --prunes 0.3 --distill-steps 150 --backends ov_int8

Variants: unpruned; merged alone (each `--rates` r, or a per-layer schedule such as 64,32,0,0); every MLP's
intermediate channels pruned (each `--prunes`) and recovered as the agent recovers (`recovery.reconstruct`, then
`--distill-steps` of `recovery.distill` from the unpruned model when > 0); and each pruned model merged at each
rate. Every variant is built as each INT8 form of
`--backends` (`build_forms`), scored on held-out Fashion-MNIST test images (never used to train or calibrate;
calibration images are training images the zoo model never saw) and timed side by side in one process at batch 1
and `--batch`, 1 thread. Ratios are against the best pruning-only form: the fastest at batch 1 of the pruning-only
forms within 1 pp of the unpruned FP32 model. Issue 37's target: a merged + pruned INT8 form within 1 pp that is
>= 1.3x faster at batch 1 than that form and not slower at the larger batch.
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

import recovery as recovery_lib  # noqa: E402
import zoo as zoo_lib  # noqa: E402
from paper_tables import build_full_size  # noqa: E402

from profiling_agent.tools.compression.pruning import prune_model  # noqa: E402
from profiling_agent.tools.compression.token_merge import apply_token_merging, tokens_per_layer  # noqa: E402
from profiling_agent.tools.evaluation.latency import latency_inputs  # noqa: E402
from profiling_agent.tools.recovery.distill import DistillConfig, distill  # noqa: E402
from profiling_agent.tools.recovery.reconstruct import reconstruct  # noqa: E402
from profiling_agent.tools.runtimes.forms import build_forms  # noqa: E402
from profiling_agent.tools.runtimes.forward import batched_logits, native_call, timed_calls_ms  # noqa: E402

FULL = ("vit-b16", "deit-b16")
# quick: ViT/DeiT-shaped models for 32x32 images in 4x4 patches (64 patches), 2 layers of hidden 64 with 4 heads
# (two layers: merging still compounds across layers; NNCF's graph matching, most of a build, grows with depth)
QUICK_CONFIG = {
    "image_size": 32,
    "patch_size": 4,
    "hidden_size": 64,
    "num_hidden_layers": 2,
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
ZOO_PROFILES = {  # zoo mode: held-out images, calibration images, timing repeats, rates, pruning ratios
    "tiny": {"held_out": 64, "calib": 32, "check": 8, "repeats": 2, "warmup": 1, "rates": [8], "prunes": [0.3]},
    "full": {"held_out": 3000, "calib": 256, "check": 16, "repeats": 21, "warmup": 3, "rates": [16, 32]}
    | {"prunes": [0.3, 0.5]},
}
ZOO_BACKENDS = ("ov_int8", "ort_dynamic")
ZOO_TARGET = 1.3  # issue 37: merged + pruned INT8 vs the best pruning-only form at batch 1, within 1 pp
ZOO_BUDGET_PP = 1.0


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


# ---------------------------------------------------------------- zoo mode: the trained 196-token ViT


def rate_arg(text: str) -> int | list[int]:
    """Parse a `--rates` entry: one r for every layer ("16") or one r per layer ("64,32,0,0")."""
    values = [int(v) for v in text.split(",")]
    return values[0] if len(values) == 1 else values


def _as_list(rate: int | list[int]) -> list[int]:
    return [rate] if isinstance(rate, int) else rate


def rate_name(rate: int | list[int]) -> str:
    """A rate's name in the table: r=16, or the schedule (64,32,0,0)."""
    return f"r={rate}" if isinstance(rate, int) else f"({','.join(str(v) for v in rate)})"


def zoo_variants(baseline: torch.nn.Module, data: dict[str, torch.Tensor], settings: dict[str, Any]) -> dict:
    """Return {variant: (torch model, facts)}: unpruned, merged per rate, pruned per ratio (recovered), both."""
    import copy

    out: dict[str, Any] = {"unpruned": (baseline, {"kind": "unpruned"})}
    for rate in settings["rates"]:
        merged = copy.deepcopy(baseline)
        schedule = apply_token_merging(merged, rate)
        out[f"merged {rate_name(rate)}"] = (
            merged,
            {"kind": "merged", "tokens_per_layer": tokens_per_layer(merged, schedule)},
        )
    for ratio in settings["prunes"]:
        pruned = copy.deepcopy(baseline)
        report = prune_model(pruned, [{"layer": "mlp", "type": "structured", "ratio": ratio}], data["calib_x"][:1])
        say(f"vit-tokens: pruned {ratio:.0%} of every MLP; reconstructing on {len(data['calib_x'])} images")
        reconstruct(baseline, pruned, data["calib_x"], report.applied)
        if settings["distill_steps"]:
            say(f"vit-tokens: distilling {settings['distill_steps']} steps of 64 images")
            batches = recovery_lib.distill_batches(data, 64)
            distill(pruned, baseline, batches, DistillConfig(steps=settings["distill_steps"], lr=settings["lr"]))
        pruned.eval()
        widths = sorted({layer.mlp.fc1.out_features for layer in pruned.get_submodule(_backbone(pruned)).layers})
        name = f"pruned {ratio:.0%}"
        out[name] = (pruned, {"kind": "pruned", "mlp_widths": widths})
        for rate in settings["rates"]:
            both = copy.deepcopy(pruned)
            schedule = apply_token_merging(both, rate)
            facts = {"kind": "both", "mlp_widths": widths, "tokens_per_layer": tokens_per_layer(both, schedule)}
            out[f"{name} + merged {rate_name(rate)}"] = (both, facts)
    return out


def top1(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Top-1 accuracy (%) of a torch model or a built form on images `x` with labels `y`."""
    return 100.0 * float((batched_logits(model, x, 250).argmax(-1) == y).float().mean())


def zoo_measure(path: Path, data: dict[str, torch.Tensor], settings: dict[str, Any], work: Path) -> dict[str, Any]:
    """Build every variant's INT8 forms, score them on the held-out images and time them side by side."""
    from transformers import AutoModelForImageClassification

    baseline = AutoModelForImageClassification.from_pretrained(path).eval()
    test_x, test_y = data["test_x"], data["test_y"]
    forms, rows, failed = {}, {}, {}
    for index, (variant, (model, facts)) in enumerate(zoo_variants(baseline, data, settings).items()):
        fp32 = top1(model, test_x, test_y)
        say(f"vit-tokens: {variant}: FP32 top-1 {fp32:.2f}%; building {', '.join(settings['backends'])}")
        calib = data["calib_x"]
        built = build_forms(
            model,
            calib,
            calib[: settings["check"]],
            work / f"variant-{index}",
            forms=settings["backends"],
            threads=settings["threads"],
        )
        for form in built:
            if form.name not in settings["backends"]:
                continue
            key = f"{form.name} | {variant}"
            if form.status != "ok":
                failed[key] = form.error or form.status
                continue
            forms[key] = form.model
            rows[key] = {**facts, "form": form.name, "variant": variant, "fp32_top1": fp32}
            rows[key]["top1"] = top1(form.model, test_x, test_y)
    say(f"vit-tokens: timing {len(forms)} forms side by side, batch 1 and {settings['batch']}")
    latency = time_side_by_side(forms, test_x, settings)
    for key, row in rows.items():
        row.update(latency[key])
    base = rows[f"{settings['backends'][0]} | unpruned"]["fp32_top1"] if rows else 0.0
    return {"rows": rows, "failed": failed, "baseline_fp32_top1": base, **zoo_verdict(rows, base)}


def zoo_verdict(rows: dict[str, Any], base: float) -> dict[str, Any]:
    """Ratios against the best pruning-only form within the budget, and whether issue 37's target is met."""
    within = {k: r for k, r in rows.items() if r["top1"] >= base - ZOO_BUDGET_PP}
    pruned = {k: r for k, r in within.items() if r["kind"] == "pruned"}
    if not pruned:
        return {"reference": None, "met": False, "best": None}
    reference = min(pruned, key=lambda k: pruned[k]["latency_b1_cpu_ms"])
    ref = rows[reference]
    for row in rows.values():
        for key in ("b1", "batch", "b1_cpu", "batch_cpu"):
            row[f"vs_pruned_{key}"] = ref[f"latency_{key}_ms"] / row[f"latency_{key}_ms"]
    both = {k: r for k, r in within.items() if r["kind"] == "both"}
    best = max(both, key=lambda k: both[k]["vs_pruned_b1_cpu"]) if both else None

    def meets(row: dict[str, Any]) -> bool:
        fast = min(row["vs_pruned_b1"], row["vs_pruned_b1_cpu"]) >= ZOO_TARGET
        return fast and min(row["vs_pruned_batch"], row["vs_pruned_batch_cpu"]) >= 1.0

    return {"reference": reference, "best": best, "met": any(meets(r) for r in both.values())}


def print_zoo(result: dict[str, Any], settings: dict[str, Any], images: int) -> None:
    """Print the zoo mode's table and verdict."""
    batch, base = settings["batch"], result["baseline_fp32_top1"]
    print(f"\nvit-tokens (ViT, 56x56 Fashion-MNIST, 196 patch tokens + CLS): {images} held-out images,")
    print(f"{torch.get_num_threads()} thread(s); unpruned FP32 top-1 {base:.2f}%; recovery: {settings['recovery']}")
    print(f"ratio = best pruning-only form ({result['reference']}) / this; wall time, process CPU time in brackets")
    print(
        f"| form | variant | tokens after each layer | MLP width | top-1 FP32 / form | Δ pp | b1 ms | b1 ratio | "
        f"b{batch} ms | b{batch} ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in result["rows"].values():
        tokens = ",".join(str(t) for t in row.get("tokens_per_layer", [])) or "197"
        widths = ",".join(str(w) for w in row.get("mlp_widths", [])) or "384"
        ratios = [f"{row.get(f'vs_pruned_{k}', float('nan')):.2f}x" for k in ("b1", "b1_cpu", "batch", "batch_cpu")]
        print(
            f"| {row['form']} | {row['variant']} | {tokens} | {widths} | {row['fp32_top1']:.2f} / {row['top1']:.2f} "
            f"| {row['top1'] - base:+.2f} | {row['latency_b1_ms']:.2f} ({row['latency_b1_cpu_ms']:.2f}) | "
            f"{ratios[0]} ({ratios[1]}) | {row['latency_batch_ms']:.2f} ({row['latency_batch_cpu_ms']:.2f}) | "
            f"{ratios[2]} ({ratios[3]}) |"
        )
    for key, why in result["failed"].items():
        print(f"failed: {key}: {why}")
    best = result["rows"].get(result["best"] or "", None)
    summary = (
        f"best merged + pruned within {ZOO_BUDGET_PP:g} pp: {result['best']}, {best['vs_pruned_b1']:.2f}x wall "
        f"({best['vs_pruned_b1_cpu']:.2f}x CPU) at batch 1, {best['vs_pruned_batch']:.2f}x at batch {batch}"
        if best
        else f"no merged + pruned form within {ZOO_BUDGET_PP:g} pp of the unpruned model (or no pruning-only one)"
    )
    verdict = "met" if result["met"] else "NOT met"
    print(
        f"target (merged + pruned >= {ZOO_TARGET}x the best pruning-only form at batch 1, not slower at b{batch}, "
        f"within {ZOO_BUDGET_PP:g} pp): {verdict}; {summary}"
    )


def run_zoo(args: argparse.Namespace) -> dict[str, Any]:
    """Zoo mode: build (or reuse) vit-tokens, measure its variants' forms, print the table; return the result."""
    if args.tiny:
        zoo_lib.use_tiny()
    profile = ZOO_PROFILES["tiny" if args.tiny else "full"]
    settings = {
        **profile,
        "rates": args.rates or profile["rates"],
        "prunes": args.prunes or profile["prunes"],
        "held_out": args.held_out or profile["held_out"],
        "repeats": args.repeats or profile["repeats"],
        "batch": args.batch,
        "backends": args.backends,
        "distill_steps": args.distill_steps,
        "lr": args.lr,
        "threads": args.threads,
    }
    settings["recovery"] = "reconstruct" + (f" + {args.distill_steps} distillation steps" if args.distill_steps else "")
    out = Path(args.zoo) if args.zoo else zoo_lib.default_out()
    zoo = zoo_lib.build_zoo(out, (zoo_lib.TOKENS_MODEL,), log=say)
    torch.set_num_threads(args.threads)
    train = 64 * 64 if args.distill_steps else 0
    data = recovery_lib.zoo_data(settings["held_out"], settings["calib"], train, model=zoo_lib.TOKENS_MODEL)
    with tempfile.TemporaryDirectory(prefix="bench-tokens-zoo-") as scratch:
        result = zoo_measure(Path(zoo["models"][zoo_lib.TOKENS_MODEL]["path"]), data, settings, Path(scratch))
    print_zoo(result, settings, len(data["test_y"]))
    return {"settings": settings, **result}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny configs: a smoke run in seconds")
    parser.add_argument("--models", nargs="+", choices=FULL, default=list(FULL))
    parser.add_argument(
        "--rate", type=rate_arg, default=None, help="tokens merged per layer (ToMe's r; capped), or a,b,c,... per layer"
    )
    parser.add_argument("--prune", type=float, default=0.3, help="fraction of every MLP's channels removed")
    parser.add_argument("--batch", type=int, default=16, help="the larger batch size")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the rows here")
    zoo = parser.add_argument_group("zoo mode (the trained 196-token ViT, bench/zoo.py's vit-tokens)")
    zoo.add_argument("--zoo", nargs="?", const="", default=None, help="run it, on this zoo folder (default: the zoo)")
    zoo.add_argument("--tiny", action="store_true", help="zoo mode on the tiny zoo: a smoke test")
    zoo.add_argument(
        "--rates", nargs="+", type=rate_arg, default=None, help="merging rates r, or per-layer schedules a,b,c,d"
    )
    zoo.add_argument("--prunes", nargs="+", type=float, default=None, help="MLP pruning ratios (default 0.3 0.5)")
    zoo.add_argument("--backends", nargs="+", choices=ZOO_BACKENDS, default=list(ZOO_BACKENDS))
    zoo.add_argument("--held-out", type=int, default=None, help="held-out test images (default 3000)")
    zoo.add_argument("--distill-steps", type=int, default=0, help="distillation after reconstruction (default 0)")
    zoo.add_argument("--lr", type=float, default=1e-3, help="peak distillation learning rate")
    args = parser.parse_args(argv)
    if args.zoo is not None or args.tiny:
        torch.set_num_threads(args.threads)
        result = run_zoo(args)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
        return 0
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
    if not 0.0 < args.prune < 1.0 or min(_as_list(settings["rate"])) < 0 or args.batch < 1 or args.threads < 1:
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
