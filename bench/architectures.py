"""Full-size ViT-B/16, DeiT-B/16 (distilled), Swin-B and ResNet-101 (random weights): fp32, pruned, qint8, both.

Usage:
    python bench/architectures.py                         # all four families, warm-up 2, 7 timed repeats
    python bench/architectures.py --quick                 # ViT-B/16 and ResNet-101, warm-up 1, 3 repeats
    python bench/architectures.py --families swin deit --threads 2 --json /tmp/arch.json
    python bench/architectures.py --tiny                  # smoke test: the four families as 2-block configs, 1 repeat

Each model is built from its transformers config with random weights (nothing is downloaded) and 1,000
classes at 224x224. One fixed plan per family is applied with the real pruning engine (tools/compression/pruning.py, the
family adapter, verified against masking the removed units): transformers lose 30% of every MLP's
intermediate channels and 25% of every layer's heads; ResNet-101 loses 30% of every bottleneck's inner
(1x1-reduce and 3x3) channels. Dynamic qint8 quantizes every nn.Linear. For each family the four variants are
measured side by side: parameters (quantized weights counted), MACs of one image (ptflops via
tools.profiling.static_profile), batch-1 and batch-8 CPU latency (tools.evaluation.measure_latency, all four
interleaved in one call: median of repeats, same thread count) and the size of the saved artifact's
model.safetensors. Every pruned and quantized artifact is reloaded and must reproduce its model's logits bit
for bit. Families run one at a time and their models are freed afterwards.

Prints a Markdown table of absolute values and ratios to fp32 (speed-up for latency); --json writes it all.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from profiling_agent.tools.runtimes.forward import batched_logits

EXIT_BAD_INPUT = 2
IMAGE_SIZE = 224
BATCH = 8
VARIANTS = ("fp32", "pruned", "qint8", "pruned+qint8")
TRANSFORMER_PLAN = [
    {"layer": ".", "type": "structured", "ratio": 0.3},  # MLP intermediate channels
    {"layer": ".", "type": "head", "ratio": 0.25},  # whole attention heads
]
RESNET_PLAN = [{"layer": ".", "type": "structured", "ratio": 0.3}]  # bottleneck conv1 and conv2 outputs
QUANT_PLAN = [{"layer": "all", "type": "dynamic", "dtype": "qint8"}]


@dataclass(frozen=True)
class Architecture:
    """One full-size model: its transformers config and model classes, config overrides and pruning plan."""

    title: str
    config_cls: str
    model_cls: str
    overrides: dict[str, Any] = field(default_factory=dict)
    plan: list[dict[str, Any]] = field(default_factory=lambda: list(TRANSFORMER_PLAN))


ARCHITECTURES = {
    "vit": Architecture("ViT-B/16", "ViTConfig", "ViTForImageClassification"),  # the config defaults
    "deit": Architecture("DeiT-B/16 distilled", "DeiTConfig", "DeiTForImageClassificationWithTeacher"),
    "swin": Architecture(
        "Swin-B",
        "SwinConfig",
        "SwinForImageClassification",
        {"embed_dim": 128, "depths": [2, 2, 18, 2], "num_heads": [4, 8, 16, 32], "window_size": 7},
    ),
    "resnet": Architecture(
        "ResNet-101",
        "ResNetConfig",
        "ResNetForImageClassification",
        {
            "embedding_size": 64,
            "hidden_sizes": [256, 512, 1024, 2048],
            "depths": [3, 4, 23, 3],
            "layer_type": "bottleneck",
        },
        list(RESNET_PLAN),
    ),
}
QUICK_FAMILIES = ("vit", "resnet")
_TINY_TRANSFORMER = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "patch_size": 32,
}
# `--tiny`: the same families and plans, shrunk to a few thousand parameters (still 224x224, 1,000 classes)
TINY_OVERRIDES: dict[str, dict[str, Any]] = {
    "vit": _TINY_TRANSFORMER,
    "deit": _TINY_TRANSFORMER,
    "swin": {"embed_dim": 16, "depths": [1, 1], "num_heads": [2, 4], "window_size": 7, "patch_size": 8},
    "resnet": {"embedding_size": 8, "hidden_sizes": [16, 32], "depths": [1, 1], "layer_type": "bottleneck"},
}


def say(message: str) -> None:
    """Print progress to stderr (stdout carries the table)."""
    print(message, file=sys.stderr, flush=True)


def build(arch: Architecture) -> torch.nn.Module:
    """Build the model from its config with seeded random weights, in eval mode."""
    import transformers

    torch.manual_seed(0)
    config = getattr(transformers, arch.config_cls)(num_labels=1000, **arch.overrides)
    return getattr(transformers, arch.model_cls)(config).eval()


def _save_and_check(model: torch.nn.Module, folder: Path, pixels: torch.Tensor, **kwargs: Any) -> dict[str, Any]:
    """Save an artifact, reload it and check the reloaded logits equal the model's bit for bit."""
    from profiling_agent.tools.models.artifact_load import load_artifact
    from profiling_agent.tools.models.artifacts import save_artifact

    ref = save_artifact(model, folder, **kwargs)
    reloaded = load_artifact(folder).model
    exact = bool(torch.equal(batched_logits(reloaded, pixels), batched_logits(model, pixels)))
    del reloaded
    return {"size_bytes": ref["size_bytes"], "params": ref["params"], "reload_exact": exact}


def measure_family(name: str, work: Path, *, warmup: int, repeats: int, tiny: bool = False) -> dict[str, Any]:
    """Build, prune, quantize, save and time the four variants of one family side by side (`tiny`: TINY_OVERRIDES)."""
    from profiling_agent.tools.compression.pruning import PruneGuard, prune_model
    from profiling_agent.tools.compression.quantization import quantize_model
    from profiling_agent.tools.compression.self_check import self_check
    from profiling_agent.tools.evaluation.latency import measure_latency
    from profiling_agent.tools.profiling.static import static_profile

    arch = ARCHITECTURES[name]
    if tiny:
        arch = replace(arch, title=f"tiny {arch.title}", overrides=TINY_OVERRIDES[name])
    start = time.perf_counter()
    phases: dict[str, float] = {}
    say(f"[{name}] building {arch.title} from its config (random weights)")
    fp32 = build(arch)
    phases["build"] = time.perf_counter() - start
    pixels = torch.randn(
        BATCH, fp32.config.num_channels, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(0)
    )
    say(f"[{name}] pruning with plan {arch.plan}")
    pruned = copy.deepcopy(fp32)
    t0 = time.perf_counter()
    report = prune_model(pruned, arch.plan, pixels[:1], guard=PruneGuard(verify=True))
    self_check(pruned, pixels[:2], 1000)
    phases["prune"] = time.perf_counter() - t0
    say(f"[{name}] quantizing (dynamic qint8, every nn.Linear)")
    t0 = time.perf_counter()
    qint8, done = quantize_model(fp32, QUANT_PLAN)
    pruned_qint8, done_pruned = quantize_model(pruned, QUANT_PLAN)
    phases["quantize"] = time.perf_counter() - t0
    models = {"fp32": fp32, "pruned": pruned, "qint8": qint8, "pruned+qint8": pruned_qint8}
    saved_with = {
        "fp32": {},
        "pruned": {"attrs": report.attrs},
        "qint8": {"quantized": done},
        "pruned+qint8": {"attrs": report.attrs, "quantized": done_pruned},
    }
    rows: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    for key, model in models.items():
        say(f"[{name}] {key}: MACs, saving and reloading the artifact")
        macs = static_profile(model, (fp32.config.num_channels, IMAGE_SIZE, IMAGE_SIZE))["total_macs"]
        rows[key] = {"macs": macs, **_save_and_check(model, work / name / key, pixels[:2], **saved_with[key])}
        shutil.rmtree(work / name / key)  # keep disk use to one artifact at a time
    phases["macs_and_artifacts"] = time.perf_counter() - t0
    say(f"[{name}] latency of the {len(models)} variants side by side (batch 1 and {BATCH}, {repeats} repeats)")
    t0 = time.perf_counter()
    latency = measure_latency(models, pixels, batch_size=BATCH, warmup=warmup, repeats=repeats)
    phases["latency"] = time.perf_counter() - t0
    for key in models:
        rows[key].update(latency_ms=latency[key]["latency_ms"], latency_batch_ms=latency[key]["latency_batch_ms"])
    result = {
        "family": name,
        "title": arch.title,
        "architecture": arch.model_cls,
        "plan": arch.plan,
        "pruned_groups": len(report.applied),
        "phase_seconds": {phase: round(seconds, 1) for phase, seconds in phases.items()},
        "quantized_layers": len(done),
        "variants": rows,
        "ratios": ratios(rows),
        "seconds": round(time.perf_counter() - start, 1),
    }
    del models, fp32, pruned, qint8, pruned_qint8
    gc.collect()
    return result


def ratios(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Return each variant's params, MACs and size over fp32's, and fp32's latency over the variant's (speed-up)."""
    base = rows["fp32"]

    def over(value: float | None, ref: float | None) -> float | None:
        return None if value is None or not ref else value / ref

    return {
        key: {
            "params": over(row["params"], base["params"]),
            "macs": over(row["macs"], base["macs"]),
            "size": over(row["size_bytes"], base["size_bytes"]),
            "speedup_b1": over(base["latency_ms"], row["latency_ms"]),
            f"speedup_b{BATCH}": over(base["latency_batch_ms"], row["latency_batch_ms"]),
        }
        for key, row in rows.items()
    }


def _num(value: float | None, unit: float, digits: int = 1) -> str:
    return "-" if value is None else f"{value / unit:,.{digits}f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def markdown(results: list[dict[str, Any]], settings: dict[str, Any]) -> str:
    """Render the results as a Markdown table: absolute values and ratios to fp32 side by side."""
    header = (
        f"| model | variant | params (M) | x fp32 | GMACs | x fp32 | b1 ms | speed-up | b{BATCH} ms | speed-up "
        "| size (MB) | x fp32 | reload |"
    )
    lines = [
        f"## Full-size architectures, random weights ({settings['threads']} threads, {settings['repeats']} repeats, "
        f"warm-up {settings['warmup']}, {IMAGE_SIZE}x{IMAGE_SIZE})",
        "",
        header,
        "|" + "---|" * (header.count("|") - 1),
    ]
    for result in results:
        for key in VARIANTS:
            row, ratio = result["variants"][key], result["ratios"][key]
            lines.append(
                f"| {result['title']} | {key} | {_num(row['params'], 1e6)} | {_ratio(ratio['params'])} "
                f"| {_num(row['macs'], 1e9, 2)} | {_ratio(ratio['macs'])} "
                f"| {row['latency_ms']:.1f} | {_ratio(ratio['speedup_b1'])} "
                f"| {row['latency_batch_ms']:.1f} | {_ratio(ratio[f'speedup_b{BATCH}'])} "
                f"| {_num(row['size_bytes'], 1e6)} | {_ratio(ratio['size'])} "
                f"| {'exact' if row['reload_exact'] else 'DIFFERS'} |"
            )
    lines += [
        "",
        "Pruned: transformers -30% MLP channels and -25% heads per layer; ResNet-101 -30% inner bottleneck "
        "channels. qint8: torch dynamic quantization of every nn.Linear (ResNet-101 has one, its classifier). "
        "MACs of quantized variants are counted like their float source. Latency: median, all four variants "
        "interleaved in one call. Size: the artifact's model.safetensors. Reload: the reloaded artifact's logits "
        "equal the model's bit for bit.",
        f"Load average at the end: {settings['loadavg']}; total {settings['seconds']:.0f} s.",
    ]
    return "\n".join(lines)


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line."""
    parser = _Parser(prog="bench/architectures.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--families",
        nargs="+",
        choices=sorted(ARCHITECTURES),
        default=None,
        help="families to measure (default: all four; --quick: vit resnet)",
    )
    parser.add_argument("--quick", action="store_true", help="two families, warm-up 1, 3 repeats")
    parser.add_argument("--tiny", action="store_true", help="smoke test: all four families shrunk, warm-up 0, 1 repeat")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (default 7, quick 3)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed warm-up passes (default 2, quick 1)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    parser.add_argument("--json", dest="json_out", default=None, help="also write every number as JSON here")
    args = parser.parse_args(argv)
    for flag in ("repeats", "threads"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag} must be at least 1")
    if args.warmup is not None and args.warmup < 0:
        parser.error("--warmup must not be negative")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table; return the exit code."""
    args = parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import warnings

    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    families = args.families or (list(QUICK_FAMILIES) if args.quick else list(ARCHITECTURES))
    repeats = args.repeats or (1 if args.tiny else 3 if args.quick else 7)
    warmup = args.warmup if args.warmup is not None else (0 if args.tiny else 1 if args.quick else 2)
    start = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="arch-bench-") as tmp:
        for name in families:
            results.append(measure_family(name, Path(tmp), warmup=warmup, repeats=repeats, tiny=args.tiny))
            say(f"[{name}] done in {results[-1]['seconds']:.0f} s")
    settings = {
        "families": families,
        "repeats": repeats,
        "warmup": warmup,
        "threads": torch.get_num_threads(),
        "batch": BATCH,
        "image_size": IMAGE_SIZE,
        "quick": args.quick,
        "tiny": args.tiny,
        "loadavg": " ".join(f"{v:.1f}" for v in os.getloadavg()),
        "seconds": time.perf_counter() - start,
        "torch": torch.__version__,
        "transformers": _transformers_version(),
        "python": platform.python_version(),
    }
    table = markdown(results, settings)
    print(table)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"settings": settings, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
