"""Same seed, same file: each model run twice with one seed, the two `best/` folders compared byte for byte.

Usage:
    python bench/same_seed.py                                    # the embedded ViT and ResNet, the zoo ViT and ResNet
    python bench/same_seed.py --models embedded:resnet-digits --iterations 1
    python bench/same_seed.py --tiny                             # smoke test: the embedded ResNet, 16 images
    python bench/same_seed.py --json out.json -- --backend openvino   # flags after -- go to every run
    python bench/same_seed.py --models /models/my-vit --dataset /data/my-images   # a saved model of your own

Each run is `profiling-agent run` in a fresh process, in a run folder of its own, with the same seed and flags.
`zoo:NAME` is bench/zoo.py's model NAME (built on first use, with the Fashion-MNIST test set it reads); a folder is a
saved model (`save_pretrained`) run on `--dataset` (any dataset `profiling-agent run --dataset` takes). A row per
model: the forms each run delivered, how many files of `best/` differ (by sha256, paths included), whether a tie
between forms decided the delivery (the tie rule's note), whether a timing was flagged as contended, and how many
figures of each result.json lie outside the interval stored beside them (`interval_check`). Target (issue 49):
byte-identical `best/` for every model on a quiet machine, 0 figures outside their interval.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo as zoo_lib  # noqa: E402
from cli_runs import run_cli  # noqa: E402

from profiling_agent.tools.reporting.interval_check import ratios_outside_intervals  # noqa: E402

DEFAULT_MODELS = "embedded:vit-digits,embedded:resnet-digits,zoo:vit,zoo:resnet"


def model_flags(ref: str, dataset: str | None) -> list[str]:
    """Return the `--model`/`--dataset` flags of one model reference (embedded, zoo, or a saved model's folder)."""
    if ref.startswith("embedded:"):
        return ["--model", ref, "--dataset", "embedded:digits"]
    if ref.startswith("zoo:"):
        name = ref.removeprefix("zoo:")
        zoo_root = zoo_lib.default_out()
        zoo_lib.build_zoo(zoo_root, (name,), log=print)
        return ["--model", str(zoo_root / "models" / name), "--dataset", str(zoo_root / "fashion-mnist")]
    if Path(ref).is_dir() and dataset:
        return ["--model", ref, "--dataset", dataset]
    raise SystemExit(
        f"same_seed: unknown model {ref!r} (embedded:NAME, zoo:NAME, or a saved model's folder with --dataset)"
    )


def cpu_seconds() -> float:
    """Return the CPU seconds of this process and its finished children (user + system)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def file_hashes(folder: Path) -> dict[str, str]:
    """Return {path relative to `folder`: sha256} of every file below it."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def differing(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """Return the paths whose bytes differ between two `file_hashes`, or that only one of them holds."""
    return sorted(p for p in set(a) | set(b) if a.get(p) != b.get(p))


def run_facts(folder: Path) -> dict[str, Any]:
    """Read what one finished run delivered: its form, the tie note, the contention flag, interval misses, hashes."""
    result = json.loads((folder / "result.json").read_text())
    best, delivery = result.get("best") or {}, result.get("delivery") or {}
    note = str(best.get("delivery_note") or "")
    peer_tie = ((delivery.get("quantization_only") or {}).get("tie")) or ""
    return {
        "delivered": best.get("delivered"),
        "iteration": best.get("iteration"),
        "tie": "a tie decided" in note or bool(peer_tie),
        "flagged": bool(delivery.get("timings_flagged")),
        "flag_reason": delivery.get("flag_reason") or "",
        "outside": ratios_outside_intervals(result),
        "best": file_hashes(folder / "best") if (folder / "best").is_dir() else {},
    }


def compare_model(ref: str, flags: list[str], work: Path, in_process: bool) -> dict[str, Any]:
    """Run model `ref` twice with the same flags; return the row comparing the two runs."""
    runs, cpu, wall = [], 0.0, 0.0
    for name in ("a", "b"):
        folder = work / "runs" / re.sub(r"[^A-Za-z0-9._-]+", "-", ref).strip("-") / name  # a path never escapes work
        argv = ["run", *flags, "--run-dir", str(folder), "--thread-id", "t"]
        cpu_before, start = cpu_seconds(), time.perf_counter()
        code, stderr = run_cli(argv, in_process)
        wall += time.perf_counter() - start
        cpu += cpu_seconds() - cpu_before
        if code != 0:
            tail = (stderr.strip().splitlines() or ["(no output)"])[-1]
            raise SystemExit(f"same_seed: {ref} run {name} failed ({code}): {tail}")
        runs.append(run_facts(folder / "t"))
    a, b = runs
    return {
        "model": ref,
        "delivered": [f"{r['delivered']} (iteration {r['iteration']})" for r in runs],
        "best_files": len(a["best"]),
        "differing": differing(a["best"], b["best"]),
        "tie": [r["tie"] for r in runs],
        "flagged": [r["flag_reason"] or r["flagged"] for r in runs],
        "outside": a["outside"] + b["outside"],
        "cpu_s": round(cpu, 1),
        "wall_s": round(wall, 1),
    }


def table(rows: list[dict[str, Any]]) -> str:
    """Render the rows as a Markdown table."""
    head = "| model | delivered (a / b) | best/ files | differing | tie decided | flagged | outside interval | CPU-s |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {' / '.join(r['delivered'])} | {r['best_files']} | {len(r['differing'])} "
            f"| {' / '.join('yes' if t else 'no' for t in r['tie'])} "
            f"| {' / '.join('yes' if f else 'no' for f in r['flagged'])} | {len(r['outside'])} | {r['cpu_s']} |"
        )
    same = sum(1 for r in rows if not r["differing"])
    lines.append(
        f"\nbyte-identical best/: {same} of {len(rows)} models; figures outside their interval: "
        f"{sum(len(r['outside']) for r in rows)}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run every model twice with one seed; print the table (and write it as JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS, help="comma list of embedded:NAME and zoo:NAME")
    parser.add_argument("--dataset", default=None, help="the dataset of the saved models named by folder")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--subset", type=int, default=256, help="validation images (and as many test images)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each run")
    parser.add_argument("--work", type=Path, default=Path("/tmp/profiling-agent-bench/same_seed"))
    parser.add_argument("--json", type=Path, default=None, help="write the rows here as JSON")
    parser.add_argument("--tiny", action="store_true", help="smoke test: the embedded ResNet, 16 images, 1 round")
    parser.add_argument("extra", nargs="*", help="extra `profiling-agent run` flags, after --")
    args = parser.parse_args(argv)
    models = "embedded:resnet-digits" if args.tiny else args.models
    subset, iterations = (16, 1) if args.tiny else (args.subset, args.iterations)
    if args.tiny:
        zoo_lib.use_tiny()
    common = [
        "--seed",
        str(args.seed),
        "--iterations",
        str(iterations),
        "--subset",
        str(subset),
        "--test-subset",
        str(subset),
        "--threads",
        str(args.threads),
        "--planner",
        "deterministic",
    ]
    if args.tiny:
        common += ["--calibration", "8", "--repeats", "2", "--backend", "onnxruntime", "--recover", "none"]
        common += ["--no-plots"]  # the report's charts are not part of best/, the folders compared
    rows = []
    for ref in [m.strip() for m in models.split(",") if m.strip()]:
        flags = [*model_flags(ref, args.dataset), *common, *args.extra]
        rows.append(compare_model(ref, flags, args.work, in_process=args.tiny))
        print(f"{ref}: {len(rows[-1]['differing'])} differing files, {rows[-1]['cpu_s']} CPU-s", flush=True)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
