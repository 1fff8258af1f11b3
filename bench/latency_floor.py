"""How much of a model's latency width pruning can remove at all, in each deployment form.

Every prunable group of the model (MLP channels and attention heads; a ResNet's inner convolution channels) is
pruned uniformly (L2) at growing ratios, far past what any accuracy budget allows, and each pruned model's forms
are timed side by side with the unpruned model's same forms in one `measure_latency` call (interleaved, 1 thread,
batch 1 and batch 32, 3 warm-ups, 15 repeats, every repeat: no run budget). The printed ratio of a form is the
pruned model's median latency over the unpruned model's in that form: the floor a plan can reach there by removing
channels and heads alone. What remains at 90% is what width pruning cannot touch: per-call overhead, LayerNorm,
softmax, the embeddings and the stem, the depth of the network.

    .venv/bin/python bench/latency_floor.py                     # the zoo ResNet and ViT (bench/zoo.py builds them)
    .venv/bin/python bench/latency_floor.py --models vit --ratios 0.5 0.9 --json floor.json
    .venv/bin/python bench/latency_floor.py --model-path PATH   # any saved classifier (its processor's size)
    .venv/bin/python bench/latency_floor.py --models vit --depth  # also the ViT with its last blocks removed
    .venv/bin/python bench/latency_floor.py --tiny              # smoke test: the tiny zoo's ViT at 50%, ort_dynamic

`--depth` adds what width pruning cannot reach: the same model with its last 1, half and all but one of its
transformer blocks removed (ViT and DeiT: the encoder's block list), timed in the same call. The engine does not
prune depth yet; this measures what it would buy.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo as zoo_lib  # noqa: E402

FORMS = ("ort_fp32", "ort_dynamic", "ov_fp32", "ov_int8")


def _pixels(model: Any, size: int, n: int = 64) -> torch.Tensor:
    channels = int(getattr(model.config, "num_channels", 3))
    return torch.randn(n, channels, size, size, generator=torch.Generator().manual_seed(0))


def _blocks_holder(model: Any) -> tuple[Any, str] | None:
    """Return (module, attribute) of a ViT/DeiT model's block list, or None for other layouts."""
    import torch.nn as nn

    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    for holder in (base, getattr(base, "encoder", None)):
        for attr in ("layers", "layer"):
            if holder is not None and isinstance(getattr(holder, attr, None), nn.ModuleList):
                return holder, attr
    return None


def shallower(model: Any, keep: int) -> Any:
    """Return a copy of `model` with its first `keep` transformer blocks only."""
    import torch.nn as nn

    copy_ = copy.deepcopy(model).eval()
    found = _blocks_holder(copy_)
    assert found is not None
    holder, attr = found
    setattr(holder, attr, nn.ModuleList(list(getattr(holder, attr))[:keep]))
    copy_.config.num_hidden_layers = keep
    return copy_


def floor_rows(
    model: Any,
    size: int,
    ratios: list[float],
    folder: Path,
    repeats: int,
    depth: bool = False,
    forms: tuple[str, ...] = FORMS,
) -> dict[str, Any]:
    """Time the unpruned model and its uniformly pruned copies in every form; return {form: {ratio: row}}.

    With `depth`, copies without their last blocks are timed too, keyed "blocks=K". `forms`: the exported forms
    timed beside torch FP32.
    """
    from profiling_agent.tools.compression.baselines import prune_uniform
    from profiling_agent.tools.evaluation.latency import measure_latency
    from profiling_agent.tools.models.sizes import count_params
    from profiling_agent.tools.runtimes.forms import build_forms

    pixels = _pixels(model, size)
    models: dict[str, Any] = {}
    params: dict[Any, int] = {}
    variants: dict[Any, Any] = {}
    for ratio in [0.0, *ratios]:
        variants[ratio] = copy.deepcopy(model).eval()
        if ratio:
            prune_uniform(variants[ratio], ratio, pixels[:1])
    found = _blocks_holder(model) if depth else None
    if depth and found is None:
        print("  --depth: no transformer block list in this model (ViT and DeiT only)", flush=True)
    if found is not None:
        n = len(getattr(found[0], found[1]))
        for keep in sorted({n - 1, max(1, n // 2), 1} - {n}, reverse=True):
            variants[f"blocks={keep}"] = shallower(model, keep)
    for key, variant in variants.items():
        params[key] = count_params(variant)
        models[f"torch_fp32@{key}"] = variant
        for form in build_forms(variant, pixels[:32], pixels[:8], folder / str(key), forms=forms, threads=1):
            if form.status == "ok":
                models[f"{form.name}@{key}"] = form.model
            else:
                print(f"  {form.name} at {key}: {form.status} ({form.error})", flush=True)
    lat = measure_latency(models, pixels, batch_size=32, warmup=3, repeats=repeats)
    rows: dict[str, Any] = {}
    for key, row in lat.items():
        form, name = key.split("@")
        variant = float(name) if not name.startswith("blocks=") else name
        rows.setdefault(form, {})[variant] = {
            "params": params[variant],
            "latency_ms": row["latency_ms"],
            "latency_batch_ms": row["latency_batch_ms"],
        }
    for by_ratio in rows.values():
        base = by_ratio[0.0]
        for row in by_ratio.values():
            row["ratio_b1"] = round(row["latency_ms"] / base["latency_ms"], 3)
            row["ratio_b32"] = round(row["latency_batch_ms"] / base["latency_batch_ms"], 3)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["resnet", "vit"], help="zoo models (bench/zoo.py)")
    parser.add_argument("--zoo", default=None, help="zoo folder (default: $PROFILING_AGENT_CACHE/zoo)")
    parser.add_argument("--model-path", default=None, help="a saved classifier instead of the zoo")
    parser.add_argument("--size", type=int, default=None, help="input size (default: the zoo's, else 224)")
    parser.add_argument("--ratios", nargs="*", type=float, default=[0.5, 0.75, 0.9])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--depth", action="store_true", help="also time the model with fewer transformer blocks")
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument("--tiny", action="store_true", help="smoke test: the tiny zoo's ViT (built when missing)")
    args = parser.parse_args(argv)
    from transformers import AutoModelForImageClassification

    if args.tiny:
        zoo_lib.use_tiny()
        args.models, args.ratios, args.repeats = ["vit"], [0.5], 2
        zoo_lib.build_zoo(Path(args.zoo) if args.zoo else None, tuple(args.models))

    torch.set_num_threads(1)
    if args.model_path:
        targets = {Path(args.model_path).name: Path(args.model_path)}
        size = args.size or 224
    else:
        zoo = Path(args.zoo) if args.zoo else zoo_lib.default_out()
        if not (zoo / "zoo.json").exists():
            print(f"no zoo at {zoo}: build it with `.venv/bin/python bench/zoo.py`", file=sys.stderr)
            return 2
        meta = json.loads((zoo / "zoo.json").read_text())
        targets = {name: Path(meta["models"][name]["path"]) for name in args.models}
        size = args.size or int(meta["image_size"])
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="latency-floor-") as scratch:
        for name, path in targets.items():
            model = AutoModelForImageClassification.from_pretrained(path).eval()
            forms = ("ort_dynamic",) if args.tiny else FORMS
            rows = floor_rows(model, size, args.ratios, Path(scratch) / name, args.repeats, args.depth, forms)
            out[name] = {form: {str(r): row for r, row in by.items()} for form, by in rows.items()}
            print(f"\n{name} ({size}x{size}): latency of the pruned model over the unpruned one, same form, b1 / b32")
            columns = [*args.ratios, *[k for k in rows["torch_fp32"] if isinstance(k, str)]]
            header = "| form | " + " | ".join(f"{c:.0%} pruned" if isinstance(c, float) else c for c in columns)
            print(header + " |\n|---|" + "---|" * len(columns))
            for form, by in rows.items():
                base = by[0.0]
                cells = [f"{by[c]['ratio_b1']:.2f}x / {by[c]['ratio_b32']:.2f}x" for c in columns if c in by]
                print(f"| {form} ({base['latency_ms']:.3f} ms) | " + " | ".join(cells) + " |")
            params = rows["torch_fp32"]
            print("params: " + ", ".join(f"{k}: {row['params']:,}" for k, row in params.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
