"""Deployment backends side by side: torch FP32/qint8, ONNX Runtime FP32/dynamic/static, OpenVINO FP32/bf16/INT8.

Usage:
    python bench/backends.py --quick              # 4 full-size configs + 2 trained models, < 10 min on 2 cores
    python bench/backends.py                      # more repeats, batch 8, the Fashion-MNIST zoo when built
    python bench/backends.py --full-size vit-b16 --trained embedded:resnet-digits --json out.json
    python bench/backends.py --tiny               # smoke test: a 2-layer ViT and the agent on embedded:vit-digits

Full-size ViT-B/16, DeiT-B/16, Swin-B and ResNet-101 are built from transformers configs with random weights
(1,000 classes, 224x224): no accuracy exists, so each variant reports its logit fidelity (largest |difference| from
the torch FP32 of the same architecture) and its top-1 agreement with it on random images. Their "pruned" model is
the engine's uniform L2 pruning at --ratio (MLP channels and heads for transformers, inner conv channels for
ResNets), standing in for an agent plan, which needs a trained model. Trained models (the embedded digits models
and, when built, bench/zoo.py's Fashion-MNIST models) run the agent itself (deterministic planner, backend auto)
and report accuracy on the run's validation images; their "pruned" model is the agent's best candidate's FP32
pruned model.

Every number of one model comes from one `measure_latency` call: all variants interleaved, same images, same
thread count, process CPU time beside wall time (a block whose wall time exceeds its CPU time by more than
tools.evaluation.latency.BUSY_FACTOR is measured again, and flagged when it stays busy). Ratios are to the unpruned
torch FP32 model of the same row block; "vs unpruned OV INT8" is the unpruned model's OpenVINO INT8 (NNCF) latency
over the row's: what pruning adds over quantizing the unpruned model alone. "delivered" is the fastest pruned
variant at batch 1 whose logits stay within --max-rel-diff of its torch FP32's (random weights: nearly tied logits
make top-1 agreement on a few images noise) or, for trained models, whose accuracy keeps the budget, as the
evaluate node would choose.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paper_tables import FULL_SIZE, TINY_FULL_SIZE, build_full_size  # noqa: E402

from profiling_agent.tools import run_layout

EXIT_BAD_INPUT = 2
TRAINED = ("embedded:vit-digits", "embedded:resnet-digits")
ALL = ("ort_fp32", "ort_dynamic", "ort_static", "ov_fp32", "ov_bf16", "ov_int8")
# quick: the unpruned model only as torch FP32/qint8, ORT dynamic and OpenVINO INT8 (the references the targets
# name), every form of the pruned one; static calibration of a full-size model is the slowest step
PROFILES = {
    "tiny": {
        "repeats": 1,
        "warmup": 0,
        "batch": 2,
        "calib": 4,
        "check": 4,
        "trained_repeats": 2,
        "base_forms": ("ort_dynamic", "ov_fp32"),  # no NNCF INT8 build: the slowest step of a smoke test
        "pruned_qint8": False,
        # the agent's own timing and distillation kept short, its own forms torch's only: the bench builds and
        # times the ONNX Runtime and OpenVINO forms of the run's baseline and best pruned model itself
        "context": {
            "latency_repeats": 2,
            "latency_warmup": 1,
            "latency_batch": 8,
            "recover_steps": 8,
            "backend": "torch",
            "plots": False,  # the report's charts: the reporting tests' subject, not this bench's
        },
    },
    "quick": {
        "repeats": 2,
        "warmup": 1,
        "batch": 8,
        "calib": 8,
        "check": 8,
        "trained_repeats": 20,
        "base_forms": ("ort_dynamic", "ov_int8"),
        "pruned_qint8": False,
    },
    "full": {
        "repeats": 7,
        "warmup": 2,
        "batch": 8,
        "calib": 32,
        "check": 16,
        "trained_repeats": 40,
        "base_forms": ALL,
        "pruned_qint8": True,
    },
}


def say(message: str) -> None:
    """Print a progress line on stderr (stdout carries the table)."""
    print(message, file=sys.stderr, flush=True)


def _qint8(model: torch.nn.Module) -> torch.nn.Module:
    from profiling_agent.state import QuantEntry
    from profiling_agent.tools.compression.quantization import quantize_model

    return quantize_model(model, [QuantEntry(layer="all", dtype="qint8")])[0]


def _size_mb(model: torch.nn.Module) -> float:
    from profiling_agent.tools.models.sizes import state_bytes

    size = getattr(model, "size_bytes", None)
    return (size if isinstance(size, int) else state_bytes(model)) / 1e6


def forms(prefix: str, fp32: torch.nn.Module, calib, check, work: Path, settings: dict) -> tuple[dict, dict]:
    """Torch FP32 (and qint8) plus the ONNX Runtime and OpenVINO forms of one model; and the build facts."""
    from profiling_agent.tools.runtimes.forms import build_forms

    pruned = bool(prefix)
    models = {f"{prefix}torch_fp32": fp32}
    if not pruned or settings["pruned_qint8"]:
        models[f"{prefix}torch_qint8"] = _qint8(fp32)
    wanted = ALL if pruned and not settings["tiny"] else settings["base_forms"]
    start = time.perf_counter()
    built = build_forms(
        fp32,
        calib[: settings["calib"]],
        check,
        work / (prefix.strip(":") or "base"),
        forms=wanted,
        threads=torch.get_num_threads(),
    )
    facts: dict[str, Any] = {"seconds": round(time.perf_counter() - start, 1)}
    for v in built:
        if v.name not in wanted:  # the FP32 ONNX export every form starts from
            continue
        if v.status == "ok":
            models[f"{prefix}{v.name}"] = v.model
        facts[f"{prefix}{v.name}"] = {
            "status": v.status,
            "error": v.error,
            "max_abs_diff": v.max_abs_diff,
            "seconds": v.seconds,
        }
    return models, facts


def measure(
    models: dict, pixels, labels, allowed, batch: int, warmup: int, repeats: int, held_out: tuple | None = None
) -> dict:
    """Accuracy (when labels are given) or agreement with torch FP32, and latency, all in one interleaved run.

    `held_out` (pixels, labels): images no choice saw (the run's test images); their accuracy is reported beside
    the validation accuracy the delivered form is chosen on.
    """
    from profiling_agent.tools.evaluation.latency import measure_latency_checked
    from profiling_agent.tools.evaluation.metrics import agreement, predict, top1
    from profiling_agent.tools.runtimes.forward import forward_logits

    rows: dict[str, dict[str, Any]] = {}
    with torch.inference_mode():
        ref = forward_logits(models["torch_fp32"], pixels).float()
    preds = {k: predict(m, pixels, batch_size=64, allowed_ids=allowed) for k, m in models.items()}
    lat, timing = measure_latency_checked(models, pixels[:batch], batch_size=batch, warmup=warmup, repeats=repeats)
    rows["_timing"] = timing
    for key, model in models.items():
        own = "pruned:torch_fp32" if key.startswith("pruned:") else "torch_fp32"
        with torch.inference_mode():
            own_ref = ref if own == "torch_fp32" else forward_logits(models[own], pixels).float()
            diff = (forward_logits(model, pixels).float() - own_ref).abs().max().item() / own_ref.abs().max().item()
        rows[key] = {
            "size_mb": _size_mb(model),
            "latency_ms": lat[key]["latency_ms"],
            "latency_batch_ms": lat[key]["latency_batch_ms"],
            "wall_over_cpu": round(lat[key]["wall_s"] / lat[key]["cpu_s"], 3) if lat[key]["cpu_s"] else None,
            "agreement_fp32": agreement(preds[key], preds[own]),
            "max_rel_diff": diff,  # largest |logit - its torch FP32's| over the largest |logit|
            "accuracy": top1(preds[key], labels) if labels is not None else None,
        }
        if held_out is not None:
            rows[key]["test_accuracy"] = top1(
                predict(model, held_out[0], batch_size=64, allowed_ids=allowed), held_out[1]
            )
    return rows


def full_size(name: str, work: Path, settings: dict) -> dict:
    """Build one full-size config, prune a copy uniformly, build every form of both, measure side by side."""
    from profiling_agent.tools.compression.baselines import prune_uniform

    start = time.perf_counter()
    say(f"[{name}] building (random weights), pruning {settings['ratio']:.0%} uniformly (L2)")
    base = build_full_size(name)
    size = getattr(base.config, "image_size", 224)
    size = size if isinstance(size, int) else size[0]
    n = max(settings["calib"], settings["check"], settings["batch"])
    x = torch.randn(
        n + settings["check"], base.config.num_channels, size, size, generator=torch.Generator().manual_seed(0)
    )
    calib, check = x[: settings["calib"]], x[n : n + settings["check"]]
    pruned = copy.deepcopy(base)
    prune_uniform(pruned, settings["ratio"], x[:1], importance="l2")
    say(f"[{name}] ONNX Runtime and OpenVINO forms (unpruned and pruned)")
    models, facts = forms("", base, calib, check, work / name, settings)
    more, more_facts = forms("pruned:", pruned, calib, check, work / name, settings)
    models.update(more)
    facts.update(more_facts)
    say(f"[{name}] latency of {len(models)} variants side by side (batch 1 and {settings['batch']})")
    rows = measure(models, check, None, None, settings["batch"], settings["warmup"], settings["repeats"])
    return {
        "model": name,
        "params": sum(p.numel() for p in base.parameters()),
        "rows": rows,
        "build": facts,
        "seconds": round(time.perf_counter() - start, 1),
    }


def trained(ref: str, dataset: str, work: Path, settings: dict) -> dict:
    """Run the agent on a trained model, then measure every form of its baseline and best pruned model."""
    from profiling_agent.graph.builder import build_graph
    from profiling_agent.graph.checkpoint import open_checkpointer
    from profiling_agent.state import Context
    from profiling_agent.tools.data.stream import open_run_data
    from profiling_agent.tools.models.artifact_load import load_artifact

    start = time.perf_counter()
    name = ref.split(":")[-1].rstrip("/").split("/")[-1]
    say(
        f"[{name}] agent: deterministic planner, {settings['iterations']} iterations, backend "
        f"{settings.get('context', {}).get('backend', 'auto')}, "
        f"target {settings['target']} {settings['target_reduction']:.0%}, budget {settings['max_acc_drop']:g} pp"
    )
    inputs = {
        "model": {"ref": ref},
        "dataset": {
            "ref": dataset,
            "subset": settings["subset"],
            "test_subset": settings.get("test_subset") or settings["subset"],
            "calibration": 64,
        },
        "objective": {
            "planner": "deterministic",
            "iterations": settings["iterations"],
            "max_acc_drop": settings["max_acc_drop"],
            "target": settings["target"],
            "target_reduction": settings["target_reduction"],
            **({"depth": settings["depth"]} if settings["depth"] is not None else {}),
        },
    }
    context = {"latency_repeats": 5, **settings.get("context", {})}
    ctx = Context(run_root=str(work / "runs"), device="cpu", threads=torch.get_num_threads(), **context)
    graph = build_graph(checkpointer=open_checkpointer(work / "runs"))
    state = graph.invoke(inputs, {"configurable": {"thread_id": name}}, context=ctx, durability="sync")
    run = Path(state["run_path"])
    for line in round_lines(json.loads((run / run_layout.RESULT).read_text())):
        say(f"[{name}] {line}")
    parts = ("eval", "test", "calib")
    tensors = open_run_data(run, parts=parts, materialize=parts)  # a few hundred images: in memory
    pixels, labels = tensors["eval_pixels"], tensors["eval_labels"]
    allowed = (state.get("labels") or {}).get("allowed_ids")
    base = load_artifact(run / state["baseline"]["path"]).model
    best = state.get("best") or {}
    if not settings["tiny"]:
        settings = {**settings, "base_forms": ALL, "pruned_qint8": True}  # small models: every form is cheap
    models, facts = forms("", base, tensors["calib_pixels"], pixels[:32], work / name, settings)
    fp32_ref = best.get("recovered") or best.get("pruned")  # what the run's ONNX forms were built from
    if fp32_ref:
        pruned = load_artifact(run / fp32_ref["path"]).model
        more, more_facts = forms("pruned:", pruned, tensors["calib_pixels"], pixels[:32], work / name, settings)
        models.update(more)
        facts.update(more_facts)
    say(f"[{name}] accuracy and latency of {len(models)} variants side by side")
    held_out = (tensors["test_pixels"], tensors["test_labels"])
    rows = measure(
        models, pixels, labels, allowed, settings["batch"], settings["warmup"], settings["trained_repeats"], held_out
    )
    return {
        "model": name,
        "rows": rows,
        "build": facts,
        "agent_delivered": (best.get("eval") or {}).get("delivered"),
        "seconds": round(time.perf_counter() - start, 1),
    }


def round_lines(result: dict) -> list[str]:
    """One line per round of a run's result.json: what its plan took out, its validation change, its latency."""
    base = float((result.get("baseline") or {}).get("accuracy") or 0.0)
    lines = []
    for cand in result.get("candidates") or []:
        applied = cand.get("applied") or []
        blocks = [row["group"] for row in applied if row.get("kind") == "block"]
        width = sum(1 for row in applied if row.get("kind") != "block")
        check = cand.get("check") or {}
        change = f"{float(cand['accuracy']) - base:+.2f} pp" if cand.get("accuracy") is not None else "failed"
        reduction = check.get("measured_latency_reduction")
        latency = f", latency {-reduction:+.1%} on {check.get('latency_form')}" if reduction is not None else ""
        lines.append(
            f"round {cand.get('iteration')}: blocks {blocks or 'none'}, {width} width groups; validation {change}"
            f"{latency}"
        )
    return lines


def delivered(result: dict, max_rel_diff: float, max_drop: float) -> str | None:
    """The fastest pruned form at batch 1 that keeps the accuracy budget (random weights: a logit error bound)."""
    rows = result["rows"]
    base = rows["torch_fp32"]
    ok = []
    for key, row in rows.items():
        if not key.startswith("pruned:") or key == "_timing":
            continue
        if row["accuracy"] is not None:
            keep = base["accuracy"] - row["accuracy"] <= max_drop
        else:  # random weights: nearly tied logits make top-1 agreement noise; bound the logit error instead
            keep = row["max_rel_diff"] <= max_rel_diff
        if keep:
            ok.append(key)
    return min(ok, key=lambda k: rows[k]["latency_ms"]) if ok else None


def unpruned_fastest(result: dict, max_rel_diff: float, max_drop: float) -> str | None:
    """The fastest unpruned form at batch 1 that keeps the budget: what quantization alone gives a user."""
    rows = result["rows"]
    base = rows["torch_fp32"]
    ok = []
    for key, row in rows.items():
        if key.startswith(("pruned:", "_")):
            continue
        if row["accuracy"] is not None:
            keep = base["accuracy"] - row["accuracy"] <= max_drop
        else:
            keep = row["max_rel_diff"] <= max_rel_diff
        if keep:
            ok.append(key)
    return min(ok, key=lambda k: rows[k]["latency_ms"]) if ok else None


def table(results: list[dict], settings: dict) -> str:
    """Markdown: per model and form, size and speed ratios to the unpruned torch FP32 and OpenVINO INT8, quality."""
    head = [
        "model",
        "variant",
        "MB",
        "size vs FP32",
        "b1 ms",
        "b1 speed",
        f"b{settings['batch']} speed",
        "vs unpruned OV INT8",
        "top-1 % (or agree % w/ FP32)",
        "held-out top-1 %",
        "max rel diff",
        "wall/CPU",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for res in results:
        rows, base = res["rows"], res["rows"]["torch_fp32"]
        timing = rows.get("_timing") or {}
        chosen = delivered(res, settings["max_rel_diff"], settings["max_acc_drop"])
        peer = unpruned_fastest(res, settings["max_rel_diff"], settings["max_acc_drop"])
        res["delivered"], res["unpruned_fastest"] = chosen, peer
        ov_int8 = rows.get("ov_int8")
        for key, row in rows.items():
            if key == "_timing":
                continue
            quality = row["accuracy"] if row["accuracy"] is not None else row["agreement_fp32"]
            mark = " **(delivered)**" if key == chosen else " *(quantization only)*" if key == peer else ""
            vs_ov = f"{ov_int8['latency_ms'] / row['latency_ms']:.2f}x" if ov_int8 else "-"
            cells = [
                res["model"],
                key + mark,
                f"{row['size_mb']:.1f}",
                f"{row['size_mb'] / base['size_mb'] - 1:+.0%}",
                f"{row['latency_ms']:.1f}",
                f"{base['latency_ms'] / row['latency_ms']:.2f}x",
                f"{base['latency_batch_ms'] / row['latency_batch_ms']:.2f}x",
                vs_ov,
                f"{quality:.1f}",
                f"{row['test_accuracy']:.1f}" if row.get("test_accuracy") is not None else "-",
                f"{row['max_rel_diff']:.3g}",
                f"{row.get('wall_over_cpu') or 0:.2f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
        blank = " | " * (len(head) - 3)
        for ref, label in (
            ("ort_dynamic", "unpruned ort_dynamic"),
            ("ov_int8", "unpruned OpenVINO INT8"),
            (peer, f"the fastest unpruned form ({peer})"),
        ):
            if chosen and ref and ref in rows:
                vs = rows[ref]["latency_ms"] / rows[chosen]["latency_ms"]
                res[f"delivered_vs_{'fastest_unpruned' if ref == peer else ref + '_unpruned'}"] = vs
                lines.append(f"| {res['model']} | delivered vs {label}, batch 1 | | | | {vs:.2f}x{blank}|")
        if timing.get("busy"):
            lines.append(f"| {res['model']} | TIMINGS FLAGGED: wall {timing['wall_over_cpu']}x CPU time{blank}| |")
        failed = [f"{k}: {f['error']}" for k, f in res["build"].items() if isinstance(f, dict) and f.get("error")]
        if failed:
            lines.append(f"| {res['model']} | not built: {'; '.join(failed)[:300]} |{blank}| |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure every backend variant of the full-size configs and the trained models; print a Markdown table."""
    parser = argparse.ArgumentParser(prog="bench/backends.py", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and calibration images (< 10 min)")
    parser.add_argument(
        "--tiny", action="store_true", help="smoke test: a 2-layer ViT, the agent 1 round on embedded:vit-digits"
    )
    parser.add_argument("--full-size", nargs="*", default=None, help=f"configs ({', '.join(FULL_SIZE)}; default all)")
    parser.add_argument("--trained", nargs="*", default=None, help="trained model refs (default: embedded digits)")
    parser.add_argument("--dataset", default="embedded:digits", help="dataset of the trained models")
    parser.add_argument("--ratio", type=float, default=0.3, help="uniform pruning ratio of the full-size configs")
    parser.add_argument("--iterations", type=int, default=2, help="agent iterations on trained models")
    parser.add_argument("--subset", type=int, default=512, help="validation images of trained models")
    parser.add_argument(
        "--test-subset", type=int, default=None, help="held-out test images of trained models (default: --subset)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch and ONNX Runtime threads (default 1)")
    parser.add_argument(
        "--max-rel-diff",
        type=float,
        default=0.15,
        help="random-weight models: largest |logit error| / largest |logit| a delivered form may have",
    )
    parser.add_argument("--max-acc-drop", type=float, default=2.0, help="trained models: accuracy budget in pp")
    parser.add_argument(
        "--target",
        choices=["params", "macs", "latency", "size"],
        default="params",
        help="trained models: the objective's target",
    )
    parser.add_argument("--target-reduction", type=float, default=0.4, help="trained models: the target's reduction")
    parser.add_argument(
        "--depth",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="trained models: remove whole blocks too (default: only under a latency target)",
    )
    parser.add_argument("--json", default=None, help="also write the numbers here")
    args = parser.parse_args(argv)
    bad = [m for m in args.full_size or () if m not in {**FULL_SIZE, **TINY_FULL_SIZE}]
    if bad or not 0 < args.ratio < 1 or args.threads < 1 or args.iterations < 1:
        what = f"unknown config {bad[0]!r}" if bad else "--ratio must be in (0, 1), --threads and --iterations >= 1"
        print(f"bench/backends.py: error: {what}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.tiny:
        args.iterations, args.subset = 1, 64
        args.full_size = list(TINY_FULL_SIZE) if args.full_size is None else args.full_size
        args.trained = ["embedded:vit-digits"] if args.trained is None else args.trained
    settings = {**PROFILES["tiny" if args.tiny else "quick" if args.quick else "full"], **vars(args)}
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in FULL_SIZE if args.full_size is None else args.full_size:
            results.append(full_size(name, Path(tmp), settings))
        for ref in TRAINED if args.trained is None else args.trained:
            results.append(trained(ref, args.dataset, Path(tmp), settings))
    text = table(results, settings)
    load = os.getloadavg() if hasattr(os, "getloadavg") else ()
    cpu = time.process_time()
    print(
        f"\n{len(results)} models, {args.threads} thread(s), {time.perf_counter() - start:.0f} s wall, {cpu:.0f} s "
        f"process CPU, load average at the end {', '.join(f'{x:.1f}' for x in load)}\n\n{text}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": settings, "results": results}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
