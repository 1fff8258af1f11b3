"""Analogues of the ProfilingAgent paper's Tables 1, 3 and 4 on the benchmark zoo, every number measured here.

Usage:
    python bench/paper_tables.py --quick          # ViT + ResNet, 3 agent iterations, ViT-B/16 only: < 5 min
    python bench/paper_tables.py                  # all four zoo models, 5 agent iterations, four full-size configs
    python bench/paper_tables.py --json out.json --zoo /tmp/zoo --threads 2   # on a quiet machine
    python bench/paper_tables.py --tiny           # smoke test: the tiny zoo's ViT, 1 iteration, a 2-layer ViT, 1 budget

Table 1: uniform L1, L2 and random pruning at 1%, 10% and 20% (tools/compression/baselines.py) against the agent
(the real LangGraph loop, deterministic planner, pruning only, no recovery) on each zoo model: held-out test
accuracy change and parameters (the uniform ratios remove different fractions: the matched-budget section
compares methods at equal parameter reductions, with Torch-Pruning's global pruning, with and without recovery).
Table 3: quantization, ours (torch dynamic qint8) against ONNX Runtime's dynamic QInt8: accuracy change, memory,
latency before -> after and speed ratio. Table 4: pruning (the agent's best) against quantization per model.
A last table repeats the latency and memory columns on full-size configs with random weights (ViT-B/16,
DeiT-B/16, Swin-B, ResNet-101). Within a model every variant is evaluated on the same seeded subset and its
latency measured interleaved with the others in one call (median of repeats, same thread count).

The zoo (bench/zoo.py) is built first when missing. Prints Markdown; writes JSON (and the Markdown) next to it.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import matched_budgets as matched_lib  # noqa: E402
import zoo as zoo_lib  # noqa: E402

from profiling_agent.state import QuantEntry  # noqa: E402
from profiling_agent.tools import run_layout

RATIOS = (0.01, 0.1, 0.2)
METHODS = ("l1", "l2", "random")
METHOD_NAMES = {"l1": "L1", "l2": "L2", "random": "Random"}
EXIT_BAD_INPUT = 2

FULL_SIZE: dict[str, tuple[str, str, dict[str, Any]]] = {
    "vit-b16": ("ViTConfig", "ViTForImageClassification", {}),  # the defaults are ViT-B/16 at 224
    "deit-b16": ("DeiTConfig", "DeiTForImageClassification", {}),
    "swin-b": (
        "SwinConfig",
        "SwinForImageClassification",
        {"embed_dim": 128, "depths": [2, 2, 18, 2], "num_heads": [4, 8, 16, 32], "window_size": 7},
    ),
    "resnet-101": (
        "ResNetConfig",
        "ResNetForImageClassification",
        {
            "embedding_size": 64,
            "hidden_sizes": [256, 512, 1024, 2048],
            "depths": [3, 4, 23, 3],
            "layer_type": "bottleneck",
        },
    ),
}
# `--tiny`'s stand-in for the full-size configs: the same code path on a 2-layer ViT at 32x32
TINY_FULL_SIZE = {
    "vit-tiny": (
        "ViTConfig",
        "ViTForImageClassification",
        {
            "image_size": 32,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 128,
        },
    )
}

PROFILES = {
    "quick": {
        "models": ("vit", "resnet"),
        "iterations": 3,
        "subset": 300,
        "test_subset": 500,
        "calibration": 32,
        "repeats": 20,  # zoo models run in milliseconds: many repeats are cheap and steady the medians
        "agent_repeats": 5,
        "warmup": 2,
        "batch": 8,
        "full_size": ("vit-b16",),
        "full_repeats": 2,
        "full_batch": 2,
    },
    "tiny": {
        "models": ("vit",),
        "iterations": 1,
        "subset": 64,
        "test_subset": 64,
        "calibration": 16,
        "repeats": 3,
        "agent_repeats": 2,
        "warmup": 1,
        "batch": 8,
        "full_size": tuple(TINY_FULL_SIZE),
        "full_repeats": 2,
        "full_batch": 2,
        "budgets": (0.2,),
    },
    "full": {
        "models": zoo_lib.FAMILIES,
        "iterations": 5,
        "subset": 1000,
        "test_subset": 2000,
        "calibration": 64,
        "repeats": 30,
        "agent_repeats": 10,
        "warmup": 3,
        "batch": 16,
        "full_size": tuple(FULL_SIZE),
        "full_repeats": 5,
        "full_batch": 8,
    },
}


def say(message: str) -> None:
    """Print a progress line on stderr (stdout carries the tables)."""
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the agent (real LangGraph loop)


def run_agent(model_dir: str, dataset_dir: str, run_root: Path, thread: str, settings: dict[str, Any]) -> dict:
    """Run the agent graph (deterministic planner, pruning only) on one zoo model; return the final state."""
    from profiling_agent.graph.builder import build_graph
    from profiling_agent.graph.checkpoint import open_checkpointer
    from profiling_agent.state import Context

    inputs = {
        "model": {"ref": model_dir},
        "dataset": {
            "ref": dataset_dir,
            "split": "test",
            "subset": settings["subset"],
            "test_subset": settings["test_subset"],
            "calibration": settings["calibration"],
            "seed": settings["seed"],
        },
        "objective": {
            "planner": "deterministic",
            "iterations": settings["iterations"],
            "quantize": "none",  # pruning only: Table 1 compares pruning with pruning
            "max_acc_drop": settings["max_acc_drop"],
            "target_reduction": settings["target_reduction"],
        },
    }
    context = Context(
        run_root=str(run_root),
        device="cpu",
        threads=settings["threads"],
        latency_repeats=settings["agent_repeats"],
        latency_warmup=settings["warmup"],
        latency_batch=settings["batch"],
        recover="none",  # Table 1 compares one-shot pruning with one-shot pruning; recovery: the matched table
        backend="torch",  # pruning only: the torch model, not its ONNX Runtime forms (Table 3 measures those)
        plots=not settings["tiny"],  # the smoke test's runs: no report charts (matplotlib's drawing)
    )
    graph = build_graph(checkpointer=open_checkpointer(run_root))
    return graph.invoke(inputs, {"configurable": {"thread_id": thread}}, context=context, durability="sync")


# ---------------------------------------------------------------- measuring one zoo model


def _params(model: torch.nn.Module) -> int:
    from profiling_agent.tools.models.sizes import count_params

    return int(count_params(model))


def _memory(name: str, model: torch.nn.Module) -> int:
    from profiling_agent.tools.models.sizes import state_bytes

    return int(model.size_bytes) if name.startswith("ort_") else int(state_bytes(model))


def _qint8(model: torch.nn.Module) -> torch.nn.Module:
    from profiling_agent.tools.compression.quantization import quantize_model

    return quantize_model(model, [QuantEntry(layer="all", dtype="qint8")])[0]


def _kind(key: str) -> str:
    if key.startswith("ort_"):
        return key
    return "torch_qint8" if key.endswith("qint8") else "torch_fp32"


def with_sentinels(models: dict[str, torch.nn.Module], ort: dict[str, Any]) -> dict[str, torch.nn.Module]:
    """Order models by kind (torch FP32, torch qint8, ORT FP32, ORT QInt8), each kind after an unreported twin.

    measure_latency interleaves models in a rotating but cyclic order, so a model always runs right after the
    same neighbour. On millisecond models the first one after a switch of runtime or kernels runs ~15% slower
    (measured: caches and branch predictors warmed by the other runtime); a discarded twin of the same kind
    absorbs that, so every reported model follows one of its own kind.
    """
    from profiling_agent.tools.runtimes.onnx_runtime import OrtClassifier

    twins = {
        "torch_fp32": lambda: copy.deepcopy(models["baseline"]),
        "torch_qint8": lambda: _qint8(models["baseline"]),
        "ort_fp32": lambda: OrtClassifier(ort["fp32"].path, torch.get_num_threads()),
        "ort_qint8": lambda: OrtClassifier(ort["int8"].path, torch.get_num_threads()),
    }
    ordered: dict[str, torch.nn.Module] = {}
    for kind, twin in twins.items():
        members = {k: m for k, m in models.items() if _kind(k) == kind}
        if members:
            ordered[f"_twin_{kind}"] = twin()
            ordered.update(members)
    return ordered


def measure_zoo_model(name: str, entry: dict[str, Any], dataset_dir: str, work: Path, settings: dict) -> dict:
    """Run the agent, build every baseline variant of one zoo model, and measure all of them side by side."""
    from profiling_agent.tools.compression.baselines import prune_uniform
    from profiling_agent.tools.data.stream import open_run_data
    from profiling_agent.tools.evaluation.latency import measure_latency
    from profiling_agent.tools.evaluation.metrics import agreement, predict, top1
    from profiling_agent.tools.models.artifact_load import load_artifact
    from profiling_agent.tools.runtimes.onnx_runtime import onnx_runtime_baseline

    start = time.perf_counter()
    say(f"[{name}] agent: deterministic planner, up to {settings['iterations']} iterations (LangGraph loop)")
    state = run_agent(entry["path"], dataset_dir, work / "runs", name, settings)
    agent_seconds = time.perf_counter() - start
    run = Path(state["run_path"])
    # accuracy on the held-out test images: the validation images chose the agent's best, so they cannot report it
    tensors = open_run_data(run, parts=("test",), materialize=("test",))  # a few hundred images: in memory
    pixels, labels = tensors["test_pixels"], tensors["test_labels"]
    allowed = (state.get("labels") or {}).get("allowed_ids")
    base = load_artifact(run / state["baseline"]["path"]).model.eval()
    example = torch.zeros(1, *pixels.shape[1:])

    models: dict[str, torch.nn.Module] = {"baseline": base}
    for method in METHODS:
        for ratio in RATIOS:
            pruned = copy.deepcopy(base)
            prune_uniform(pruned, ratio, example, importance=method, seed=settings["seed"])
            models[f"{method}@{ratio:g}"] = pruned
    best = state.get("best")
    if best:
        models["agent"] = load_artifact(run / run_layout.BEST).model.eval()
        models["agent+qint8"] = _qint8(models["agent"])
    models["torch_qint8"] = _qint8(base)
    say(f"[{name}] ONNX Runtime: export, dynamic QInt8")
    ort = onnx_runtime_baseline(base, pixels[:2], work / "onnx" / name, threads=torch.get_num_threads())
    models["ort_fp32"], models["ort_qint8"] = ort["fp32"], ort["int8"]

    say(f"[{name}] accuracy of {len(models)} variants on {len(labels)} images, then latency side by side")
    preds = {k: predict(m, pixels, batch_size=64, allowed_ids=allowed) for k, m in models.items()}
    lat = measure_latency(
        with_sentinels(models, ort),
        pixels[: settings["batch"]],
        batch_size=settings["batch"],
        warmup=settings["warmup"],
        repeats=settings["repeats"],
    )
    variants = {}
    for key, model in models.items():
        variants[key] = {
            "accuracy": top1(preds[key], labels),
            "agreement": agreement(preds[key], preds["baseline"]),
            "params": _params(model) if not key.startswith("ort_") else _params(base),
            "memory_bytes": _memory(key, model),
            "latency_ms": lat[key]["latency_ms"],
            "latency_batch_ms": lat[key]["latency_batch_ms"],
        }
    agent_info = {
        "iterations_run": len(state.get("candidates", [])),
        "stop_reason": state.get("stop_reason"),
        "best_iteration": best["iteration"] if best else None,
        "within_budget": best.get("within_budget") if best else None,
        "run_path": str(run),
        "seconds": round(agent_seconds, 1),
        "graph_eval": (best or {}).get("eval"),
    }
    return {
        "model": name,
        "architecture": entry.get("architecture"),
        "zoo_accuracy": entry.get("test_accuracy"),
        "n_eval": len(labels),
        "batch_size": settings["batch"],
        "threads": torch.get_num_threads(),
        "variants": variants,
        "agent": agent_info,
        "onnx": {
            "exporter": ort["export"]["exporter"],
            "export_seconds": round(ort["export"]["seconds"], 1),
            "quantize_seconds": round(ort["quantize"]["seconds"], 1),
        },
        "seconds": round(time.perf_counter() - start, 1),
    }


# ---------------------------------------------------------------- full-size configs (random weights)


def build_full_size(name: str) -> torch.nn.Module:
    """Build a full-size classifier from its transformers config with random weights (1,000 classes)."""
    import transformers

    config_cls, model_cls, kwargs = {**FULL_SIZE, **TINY_FULL_SIZE}[name]
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(num_labels=1000, **kwargs)
    return getattr(transformers, model_cls)(config).eval()


def measure_full_size(name: str, work: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """Measure params, memory and latency of FP32, uniform L2 20% pruning, torch qint8 and ONNX Runtime."""
    from estimate import estimate_pruning

    from profiling_agent.tools.compression.baselines import prune_uniform, uniform_entries
    from profiling_agent.tools.compression.families import adapter_for
    from profiling_agent.tools.evaluation.latency import measure_latency
    from profiling_agent.tools.runtimes.onnx_runtime import onnx_runtime_baseline

    start = time.perf_counter()
    say(f"[{name}] full-size config, random weights: building, pruning, quantizing, exporting")
    base = build_full_size(name)
    size = getattr(base.config, "image_size", 224)  # ResNet configs have no image size: 224 like the others
    size = size if isinstance(size, int) else size[0]
    x = torch.randn(
        settings["full_batch"], base.config.num_channels, size, size, generator=torch.Generator().manual_seed(0)
    )
    kinds = [g.kind for g in adapter_for(base).prunable_groups(base)]
    params_at = {f"{r:g}": estimate_pruning(base, uniform_entries(kinds, r))["params_after"] for r in RATIOS}
    pruned = copy.deepcopy(base)
    prune_uniform(pruned, 0.2, x[:1], importance="l2")
    models = {"baseline": base, "l2@0.2": pruned, "torch_qint8": _qint8(base)}
    ort = onnx_runtime_baseline(base, x[:1], work / "onnx" / name, threads=torch.get_num_threads())
    models["ort_fp32"], models["ort_qint8"] = ort["fp32"], ort["int8"]
    with torch.inference_mode():
        check = (ort["fp32"](pixel_values=x).logits - base(pixel_values=x).logits).abs().max().item()
    say(f"[{name}] latency of {len(models)} variants side by side")
    # no twins here (see with_sentinels): a ~0.2 ms switching cost is noise next to forwards of 100+ ms
    lat = measure_latency(models, x, batch_size=settings["full_batch"], warmup=1, repeats=settings["full_repeats"])
    variants = {
        key: {
            "params": _params(model) if not key.startswith("ort_") else _params(base),
            "memory_bytes": _memory(key, model),
            "latency_ms": lat[key]["latency_ms"],
            "latency_batch_ms": lat[key]["latency_batch_ms"],
        }
        for key, model in models.items()
    }
    return {
        "model": name,
        "architecture": type(base).__name__,
        "image_size": size,
        "batch_size": settings["full_batch"],
        "threads": torch.get_num_threads(),
        "uniform_params_after": params_at,
        "variants": variants,
        "onnx": {"exporter": ort["export"]["exporter"], "fp32_max_abs_logit_diff": check},
        "seconds": round(time.perf_counter() - start, 1),
    }


# ---------------------------------------------------------------- tables


def _md(rows: list[list[Any]]) -> str:
    head, *body = rows
    lines = ["| " + " | ".join(map(str, head)) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in body]
    return "\n".join(lines)


def _pct(after: float, before: float) -> str:
    return f"{100 * (1 - after / before):+.1f}%" if before else "-"


def table1(results: list[dict[str, Any]]) -> str:
    """Table 1: accuracy change and params of uniform L1/L2/random pruning and of the agent."""
    rows = [["model", "method", "ratio", "top-1 %", "ΔAcc (pp)", "params", "params −%", "lat b1 ms", "speed b1"]]
    for res in results:
        v, name = res["variants"], res["model"]
        base = v["baseline"]
        rows.append(
            [
                name,
                "baseline (FP32)",
                "-",
                f"{base['accuracy']:.2f}",
                "0.00",
                f"{base['params']:,}",
                "-",
                f"{base['latency_ms']:.2f}",
                "1.00x",
            ]
        )
        for method in METHODS:
            for ratio in RATIOS:
                r = v[f"{method}@{ratio:g}"]
                rows.append(
                    [
                        name,
                        METHOD_NAMES[method],
                        f"{ratio:.0%}",
                        f"{r['accuracy']:.2f}",
                        f"{r['accuracy'] - base['accuracy']:+.2f}",
                        f"{r['params']:,}",
                        _pct(r["params"], base["params"]),
                        f"{r['latency_ms']:.2f}",
                        f"{base['latency_ms'] / r['latency_ms']:.2f}x",
                    ]
                )
        if "agent" in v:
            r, info = v["agent"], res["agent"]
            budget = "" if info["within_budget"] else ", over budget"
            label = f"Agent ({info['iterations_run']} it, best #{info['best_iteration']}{budget})"
            rows.append(
                [
                    name,
                    label,
                    "per layer",
                    f"{r['accuracy']:.2f}",
                    f"{r['accuracy'] - base['accuracy']:+.2f}",
                    f"{r['params']:,}",
                    _pct(r["params"], base["params"]),
                    f"{r['latency_ms']:.2f}",
                    f"{base['latency_ms'] / r['latency_ms']:.2f}x",
                ]
            )
    return _md(rows)


def table3(results: list[dict[str, Any]]) -> str:
    """Table 3: torch dynamic qint8 against ONNX Runtime dynamic QInt8."""
    rows = [
        [
            "model",
            "method",
            "ΔAcc (pp)",
            "memory MB before→after",
            "memory −%",
            "lat b1 ms before→after",
            "speed b1",
            "speed b{n} ",
            "vs torch FP32 b1",
        ]
    ]
    for res in results:
        v, name, n = res["variants"], res["model"], res["batch_size"]
        rows[0][7] = f"speed b{n}"
        pairs = [
            ("Ours: torch dynamic qint8", "baseline", "torch_qint8"),
            ("ONNX Runtime dynamic QInt8", "ort_fp32", "ort_qint8"),
            ("ONNX Runtime FP32 (export only)", "baseline", "ort_fp32"),
        ]
        for label, before_key, after_key in pairs:
            before, after = v[before_key], v[after_key]
            base = v["baseline"]
            rows.append(
                [
                    name,
                    label,
                    f"{after['accuracy'] - base['accuracy']:+.2f}",
                    f"{before['memory_bytes'] / 1e6:.3f}→{after['memory_bytes'] / 1e6:.3f}",
                    _pct(after["memory_bytes"], before["memory_bytes"]),
                    f"{before['latency_ms']:.2f}→{after['latency_ms']:.2f}",
                    f"{before['latency_ms'] / after['latency_ms']:.2f}x",
                    f"{before['latency_batch_ms'] / after['latency_batch_ms']:.2f}x",
                    f"{base['latency_ms'] / after['latency_ms']:.2f}x",
                ]
            )
    return _md(rows)


def table4(results: list[dict[str, Any]]) -> str:
    """Table 4: pruning (the agent's best) against quantization (torch qint8), and both, per model."""
    rows = [["model", "technique", "ΔAcc (pp)", "agreement %", "params −%", "memory −%", "speed b1", "speed bN"]]
    for res in results:
        v, name = res["variants"], res["model"]
        base = v["baseline"]
        for label, key in (
            ("Pruning (agent)", "agent"),
            ("Quantization (torch qint8)", "torch_qint8"),
            ("Pruning + quantization", "agent+qint8"),
            ("Quantization (ONNX Runtime)", "ort_qint8"),
        ):
            if key not in v:
                continue
            r = v[key]
            rows.append(
                [
                    name,
                    label,
                    f"{r['accuracy'] - base['accuracy']:+.2f}",
                    f"{r['agreement']:.1f}",
                    _pct(r["params"], base["params"]),
                    _pct(r["memory_bytes"], base["memory_bytes"]),
                    f"{base['latency_ms'] / r['latency_ms']:.2f}x",
                    f"{base['latency_batch_ms'] / r['latency_batch_ms']:.2f}x",
                ]
            )
    return _md(rows)


def table_full_size(results: list[dict[str, Any]]) -> str:
    """Latency and memory of the full-size configs (random weights: no accuracy)."""
    labels = {
        "baseline": "FP32",
        "l2@0.2": "L2 uniform 20% pruning",
        "torch_qint8": "torch dynamic qint8",
        "ort_fp32": "ONNX Runtime FP32",
        "ort_qint8": "ONNX Runtime dynamic QInt8",
    }
    rows = [["model", "variant", "params", "memory MB", "memory −%", "lat b1 ms", "speed b1", "lat bN ms", "speed bN"]]
    for res in results:
        v = res["variants"]
        base = v["baseline"]
        for key, label in labels.items():
            r = v[key]
            rows.append(
                [
                    f"{res['model']} (b{res['batch_size']})",
                    label,
                    f"{r['params']:,}",
                    f"{r['memory_bytes'] / 1e6:.1f}",
                    _pct(r["memory_bytes"], base["memory_bytes"]),
                    f"{r['latency_ms']:.1f}",
                    f"{base['latency_ms'] / r['latency_ms']:.2f}x",
                    f"{r['latency_batch_ms']:.1f}",
                    f"{base['latency_batch_ms'] / r['latency_batch_ms']:.2f}x",
                ]
            )
        after = ", ".join(f"{float(k):.0%}: {p:,}" for k, p in res["uniform_params_after"].items())
        rows.append([res["model"], "params after uniform pruning (L1 = L2 = random)", after, "", "", "", "", "", ""])
    return _md(rows)


def render(report: dict[str, Any]) -> str:
    """Render every table as Markdown."""
    s = report["settings"]
    parts = [
        f"# Paper tables ({'tiny' if s.get('tiny') else 'quick' if s['quick'] else 'full'} run, "
        f"{s['threads']} thread(s), "
        f"{report['seconds']:.0f} s)",
        "",
        f"Zoo models trained on Fashion-MNIST; accuracy on {s['test_subset']} held-out test images (the agent selects "
        f"on {s['subset']} other validation images, which report nothing here); the agent "
        f"runs the LangGraph loop (deterministic planner, pruning only, up to {s['iterations']} iterations, "
        f"budget {s['max_acc_drop']} pp, target {s['target_reduction']:.0%} params). Latency: median of "
        f"{s['repeats']} interleaved repeats, batch 1 and batch {s['batch']}.",
        "",
        "## Table 1: uniform L1 / L2 / random pruning vs the agent",
        "",
        table1(report["zoo"]),
        "",
        "## Table 3: quantization, ours (torch dynamic qint8) vs ONNX Runtime (dynamic QInt8)",
        "",
        "Memory: parameters and buffers (packed int8 weights included) for torch, the .onnx file for ONNX Runtime.",
        "",
        table3(report["zoo"]),
        "",
        "## Table 4: pruning vs quantization",
        "",
        "Every row against the torch FP32 baseline (for ONNX Runtime the memory is the .onnx file's size).",
        "",
        table4(report["zoo"]),
    ]
    if report.get("matched"):
        parts += ["", "## Matched budgets: the agent against uniform and Torch-Pruning global pruning", ""]
        parts.append(matched_lib.render(report["matched"]))
        parts += [f"Plots: {', '.join(report['matched'].get('plots', []))}", ""]
    if report["full_size"]:
        parts += ["", "## Full-size configs (random weights): latency and memory", ""]
        parts.append(table_full_size(report["full_size"]))
    for res in report["zoo"]:
        a = res["agent"]
        parts.append(
            f"\n- {res['model']}: agent stopped: {a['stop_reason']} ({a['seconds']:.0f} s); ONNX export "
            f"{res['onnx']['exporter']} {res['onnx']['export_seconds']:.1f} s"
        )
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------- main


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    profile = dict(PROFILES["tiny" if args.tiny else "quick" if args.quick else "full"])
    for key in ("iterations", "subset", "repeats"):
        if getattr(args, key) is not None:
            profile[key] = getattr(args, key)
    if args.models:
        profile["models"] = tuple(args.models)
    if args.full_size is not None:
        profile["full_size"] = tuple(args.full_size)
    profile.update(
        {
            "quick": args.quick,
            "tiny": args.tiny,
            "seed": args.seed,
            "threads": args.threads,
            "max_acc_drop": args.max_acc_drop,
            "target_reduction": args.target_reduction,
        }
    )
    return profile


def _check(args: argparse.Namespace) -> str | None:
    bad = [m for m in args.models or () if m not in zoo_lib.SPECS]
    if bad:
        return f"unknown zoo model {bad[0]!r}; choose from {', '.join(zoo_lib.SPECS)}"
    bad = [m for m in args.full_size or () if m not in FULL_SIZE]
    if bad:
        return f"unknown full-size config {bad[0]!r}; choose from {', '.join(FULL_SIZE)}"
    for key, low in (("iterations", 1), ("subset", 8), ("repeats", 1), ("threads", 1)):
        value = getattr(args, key)
        if value is not None and value < low:
            return f"--{key} must be at least {low}"
    if not 0 < args.target_reduction < 1:
        return "--target-reduction must be in (0, 1)"
    if args.max_acc_drop < 0:
        return "--max-acc-drop must be at least 0"
    return None


def main(argv: list[str] | None = None) -> int:
    """Build the zoo if needed, measure every table, print Markdown and write JSON."""
    parser = argparse.ArgumentParser(prog="bench/paper_tables.py", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="ViT + ResNet, 3 iterations, ViT-B/16 only (< 5 min)")
    parser.add_argument("--tiny", action="store_true", help="smoke test: the tiny zoo's ViT, 1 iteration, a tiny ViT")
    parser.add_argument("--zoo", default=None, help="zoo folder (default: $PROFILING_AGENT_CACHE/zoo)")
    parser.add_argument("--models", nargs="+", default=None, help=f"zoo models ({', '.join(zoo_lib.SPECS)})")
    parser.add_argument("--full-size", nargs="*", default=None, help=f"full-size configs ({', '.join(FULL_SIZE)})")
    parser.add_argument("--iterations", type=int, default=None, help="agent iterations (5; quick 3)")
    parser.add_argument("--subset", type=int, default=None, help="evaluation images (1000; quick 300)")
    parser.add_argument("--repeats", type=int, default=None, help="timed latency repeats of zoo models (30; quick 20)")
    parser.add_argument("--max-acc-drop", type=float, default=2.0, help="the agent's accuracy budget in pp")
    parser.add_argument(
        "--target-reduction",
        type=float,
        default=0.2,
        help="the agent's params reduction target (default 0.2, the largest uniform ratio)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch and ONNX Runtime intra-op threads (default 1: two threads on a "
        "shared 2-core machine measured 10-20x slower and far noisier)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="output JSON (default: ZOO/paper_tables[_quick].json)")
    parser.add_argument("--work", default=None, help="folder for agent runs and ONNX files (default: a temp dir)")
    args = parser.parse_args(argv)
    problem = _check(args)
    if problem:
        parser.exit(EXIT_BAD_INPUT, f"paper_tables: error: {problem}\n")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.ERROR)
    if args.tiny:
        zoo_lib.use_tiny()
    settings = _settings(args)
    start = time.perf_counter()
    zoo_dir = Path(args.zoo) if args.zoo else zoo_lib.default_out()
    say(f"zoo: {zoo_dir} (models {', '.join(settings['models'])})")
    try:
        zoo = zoo_lib.build_zoo(zoo_dir, settings["models"], threads=args.threads, log=say)
    except zoo_lib.ZooError as exc:
        parser.exit(EXIT_BAD_INPUT, f"paper_tables: error: {exc}\n")
    torch.set_num_threads(settings["threads"])
    with tempfile.TemporaryDirectory(prefix="paper-tables-") as tmp:
        work = Path(args.work) if args.work else Path(tmp)
        zoo_results = [
            measure_zoo_model(name, zoo["models"][name], zoo["dataset"]["path"], work, settings)
            for name in settings["models"]
        ]
        full = [measure_full_size(name, work, settings) for name in settings["full_size"]]
    say("matched budgets: every method solved to 10/20/30/40% fewer parameters (bench/matched_budgets.py)")
    matched = matched_lib.run(
        settings["models"],
        quick=args.quick,
        budgets=settings.get("budgets", matched_lib.BUDGETS),
        zoo_dir=zoo_dir,
        threads=args.threads,
        seed=args.seed,
    )
    report = {
        "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()},
        "zoo_dir": str(zoo_dir),
        "zoo": zoo_results,
        "full_size": full,
        "matched": matched,
        "seconds": round(time.perf_counter() - start, 1),
    }
    suffix = "_tiny" if args.tiny else "_quick" if args.quick else ""
    out = Path(args.json) if args.json else zoo_dir / f"paper_tables{suffix}.json"
    plots = out.parent / f"{out.stem}_plots"
    matched["plots"] = [str(matched_lib.plot(r, matched_lib.RECOVERY, plots)) for r in matched["results"]]
    text = render(report)
    print(text)
    report["matched"] = matched_lib.json_ready(matched)
    from profiling_agent.tools.io import write_json_atomic, write_text_atomic

    write_json_atomic(out, report)
    write_text_atomic(out.with_suffix(".md"), text)
    say(f"wrote {out} and {out.with_suffix('.md')} in {report['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
