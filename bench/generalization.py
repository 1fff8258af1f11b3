"""Leave-models-out benchmark: does a plan hold on a model the policy was never tuned on?

    python bench/generalization.py                   # both halves: models and oracles built or reused, agent run
    python bench/generalization.py --half report     # the held-out half only: the table that counts
    python bench/generalization.py resnet-bneck-digits-s1 --no-oracle
    python bench/generalization.py --list            # the models and their halves, nothing run
    python bench/generalization.py --tiny            # smoke test: one tiny model, short runs, a two-level oracle
                                                     # (the CLI's main in this process, 256 training images)

Models are trained here from scratch (seeds, widths, depths, layer types and data differ: bottleneck and basic
ResNets, ViT, DeiT, DeiT with its distillation head, Swin; scikit-learn's digits and Debian's Fashion-MNIST) and
listed in two named halves. Every policy constant of the planner and recovery (steps, margins, trial sizes,
correction rules) may be tuned on the `tune` half only; the table reports the `report` half and the summary
checks the targets there.

Each model's dataset (`save_to_disk`) holds the images it was trained on as `train` and unseen images as `test`,
as a user's would. For each model:
- agent: `profiling-agent run --split test --iterations 2 --planner deterministic --target-reduction 0.35
  --max-acc-drop 2 --recover auto` (run by its CLI, as a user runs it): the reduction it delivers, its validation
  drop, its held-out test drop with the paired interval, per round the predicted loss (interval) beside the
  measured one, and its wall time;
- oracle: the largest parameter reduction whose validation drop stays within the budget, swept on a 2.5% grid
  for two rankings, uniform L2 (`--planner l2`, the ratio solved to each level) and the planner's own
  (`--planner deterministic`, one round, the target at the level and the budget lifted so it does not back off),
  each one CLI run with the agent's recovery (auto), seed and validation rows, on the torch form without
  quantization. The grid is walked coarse to fine: 10% steps up to the first level that misses, then every
  2.5% step between the last pass and that miss (levels above a miss are taken to miss as well).

Models, datasets, oracle levels and agent results are cached under $PROFILING_AGENT_CACHE/generalization (or
--out), keyed by what they were built from, so the table reruns in minutes; `--fresh-agent` re-runs the agent.
Prints a Markdown table per half and the targets' summary for the report half; writes JSON with --json.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import zoo as zoo_lib  # noqa: E402
from cli_runs import run_cli  # noqa: E402

BUDGET_PP = 2.0  # the accuracy budget of every run, percentage points
TARGET = 0.35  # the agent's params target
COARSE, FINE = 0.10, 0.025  # the oracle grid: coarse steps, then the dense 2.5% steps
MAX_LEVEL = 0.80
RANKINGS = ("uniform", "planner")
HALVES = ("tune", "report")
DIGIT_LABELS = [str(i) for i in range(10)]
FASHION_TRAIN, FASHION_TEST = 6000, 2000  # images a Fashion-MNIST model trains on, and its unseen test images


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Case:
    """One benchmark model: its half, architecture (family + config changes), data, seed and training."""

    name: str
    half: str
    family: str  # resnet, vit, deit, deit-teacher, swin (base configs: bench/zoo.py's SPECS)
    data: str  # digits or fashion
    seed: int
    epochs: int
    lr: float
    config: dict[str, Any] = field(default_factory=dict)  # changes to the zoo config of the family


_BASIC = {"layer_type": "basic", "hidden_sizes": [32, 64, 128], "embedding_size": 16}
CASES = (
    Case("resnet-basic-digits-s0", "tune", "resnet", "digits", 0, 15, 3e-3, {**_BASIC, "depths": [1, 1, 1]}),
    Case("vit-digits-s0", "tune", "vit", "digits", 0, 30, 1e-3),
    Case("resnet-bneck-fashion-s0", "tune", "resnet", "fashion", 0, 4, 3e-3),
    Case("deit-teacher-fashion-s0", "tune", "deit-teacher", "fashion", 0, 6, 1e-3),
    Case("resnet-bneck-digits-s1", "report", "resnet", "digits", 1, 15, 3e-3),
    Case("resnet-basic-fashion-s1", "report", "resnet", "fashion", 1, 4, 3e-3, {**_BASIC, "depths": [2, 2, 2]}),
    Case(
        "vit-wide-fashion-s1",
        "report",
        "vit",
        "fashion",
        1,
        6,
        1e-3,
        {"hidden_size": 96, "num_hidden_layers": 6, "num_attention_heads": 6, "intermediate_size": 384},
    ),
    Case("swin-fashion-s1", "report", "swin", "fashion", 1, 5, 1e-3),
    Case("deit-digits-s2", "report", "deit", "digits", 2, 30, 1e-3, {"num_hidden_layers": 3}),
)
TINY_CASES = (
    Case("resnet-basic-digits-tiny", "report", "resnet", "digits", 0, 1, 3e-3, {**_BASIC, "depths": [1, 1, 1]}),
)
_CLASSES = {
    "resnet": ("ResNetConfig", "ResNetForImageClassification"),
    "vit": ("ViTConfig", "ViTForImageClassification"),
    "deit": ("DeiTConfig", "DeiTForImageClassification"),
    "deit-teacher": ("DeiTConfig", "DeiTForImageClassificationWithTeacher"),
    "swin": ("SwinConfig", "SwinForImageClassification"),
}


@dataclass(frozen=True)
class Settings:
    """How the runs are made: data sizes, the agent's flags and the oracle's grid (the tiny smoke shrinks them)."""

    iterations: int = 2
    extra: tuple[str, ...] = ()  # further CLI flags of every run (the smoke's small subsets)
    coarse: float = COARSE
    fine: float = FINE
    max_level: float = MAX_LEVEL
    threads: int | None = None

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Mode:
    """What a call may do: sweep the oracle, re-run a cached agent, or run nothing and print what is cached."""

    oracle: bool = True
    fresh: bool = False
    cached: bool = False  # run nothing: the agent and oracle points from the cache (a sweep stops at a gap)


TINY_SETTINGS = Settings(
    iterations=1,
    extra=(
        *("--val-subset", "120", "--test-subset", "120", "--calibration", "16", "--repeats", "2"),
        # auto recovery (reconstruct, then distillation) cut at 3 CPU-seconds per candidate: a smoke's recovery
        # need not converge, and uncut it would spend most of the smoke's time
        *("--recover-minutes", "0.05", "--backend", "torch"),
        "--no-plots",  # the report's charts: the reporting tests' subject, not this bench's
    ),
    coarse=0.10,
    fine=0.10,
    max_level=0.10,
)


# ---------------------------------------------------------------- models and data


def fingerprint(case: Case) -> str:
    sizes: dict[str, Any] = {"fashion": [FASHION_TRAIN, FASHION_TEST]}
    if zoo_lib.is_tiny():
        sizes["tiny_train"] = zoo_lib.TINY.train_images
    blob = json.dumps({"case": asdict(case), **sizes}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def source_images(data: str, seed: int) -> dict[str, Any]:
    """Return the (uint8 images, labels) of a case's train and test splits, and the label names."""
    if data == "digits":
        train_x, train_y = zoo_lib.load_digits_standin("train")
        if zoo_lib.is_tiny():  # the tiny zoo's training images: auto recovery's steps scale with them
            train_x, train_y = train_x[: zoo_lib.TINY.train_images], train_y[: zoo_lib.TINY.train_images]
        return {
            "train": (train_x, train_y),
            "test": zoo_lib.load_digits_standin("test"),
            "labels": DIGIT_LABELS,
        }
    zoo_lib.ensure_fashion_mnist()
    train_x, train_y = zoo_lib.load_fashion("train")
    test_x, test_y = zoo_lib.load_fashion("test")
    rng = np.random.default_rng(1000 + seed)
    tr = rng.permutation(len(train_y))[:FASHION_TRAIN]
    te = rng.permutation(len(test_y))[:FASHION_TEST]
    return {"train": (train_x[tr], train_y[tr]), "test": (test_x[te], test_y[te]), "labels": zoo_lib.LABELS}


def build_architecture(case: Case, labels: list[str]) -> torch.nn.Module:
    import transformers

    base = "deit" if case.family == "deit-teacher" else case.family
    config_name, model_name = _CLASSES[case.family]
    config = getattr(transformers, config_name)(
        **{**zoo_lib.SPECS[base].config, **case.config},
        id2label=dict(enumerate(labels)),
        label2id={n: i for i, n in enumerate(labels)},
    )
    return getattr(transformers, model_name)(config)


def ensure_case(case: Case, root: Path) -> dict[str, Any]:
    """Train and save the case's model and dataset unless cached; return its record (paths, accuracy, seconds)."""
    from datasets import DatasetDict, disable_progress_bars

    from profiling_agent.tools.io import atomic_dir, write_json_atomic

    folder, key = root / "models" / case.name, fingerprint(case)
    record_path = folder / "training.json"
    cached = json.loads(record_path.read_text()) if record_path.exists() else {}
    if cached.get("fingerprint") == key:
        return cached
    disable_progress_bars()
    start = time.perf_counter()
    images = source_images(case.data, case.seed)
    proc = zoo_lib.processor()
    x, y = zoo_lib.pixels(images["train"][0], proc), torch.from_numpy(images["train"][1])
    torch.manual_seed(case.seed)
    model = build_architecture(case, images["labels"])
    spec = replace(zoo_lib.SPECS["deit" if case.family == "deit-teacher" else case.family], epochs=case.epochs)
    zoo_lib.train(model, x, y, replace(spec, lr=case.lr), case.seed)
    test_x, test_y = zoo_lib.pixels(images["test"][0], proc), torch.from_numpy(images["test"][1])
    acc = zoo_lib.accuracy(model, test_x, test_y, batch_size=500)
    dataset = DatasetDict(
        {split: zoo_lib.as_dataset(*images[split], names=images["labels"]) for split in ("train", "test")}
    )
    record = {
        "name": case.name,
        "half": case.half,
        "fingerprint": key,
        "architecture": type(model).__name__,
        "params": sum(p.numel() for p in model.parameters()),
        "test_accuracy": round(acc, 2),
        "train_images": len(y),
        "test_images": len(test_y),
        "seconds": round(time.perf_counter() - start, 1),
        "case": asdict(case),
    }
    with atomic_dir(folder) as tmp:
        model.save_pretrained(tmp / "model")
        proc.save_pretrained(tmp / "model")
        dataset.save_to_disk(str(tmp / "data"))
        write_json_atomic(tmp / "training.json", record)
    say(f"[{case.name}] trained: {acc:.1f}% on its {len(test_y)} test images in {record['seconds']:.0f} s")
    return record


def model_dir(root: Path, case: Case) -> Path:
    return root / "models" / case.name / "model"


def data_dir(root: Path, case: Case) -> Path:
    return root / "models" / case.name / "data"


# ---------------------------------------------------------------- runs through the CLI


def cli_run(root: Path, case: Case, thread: str, flags: list[str], settings: Settings) -> dict[str, Any]:
    """Run `profiling-agent run` on the case (fresh thread folder); return its result.json and wall seconds."""
    import shutil

    runs = root / "runs" / case.name / thread  # its own run folder: a fresh checkpoint store each time
    shutil.rmtree(runs, ignore_errors=True)
    argv = [
        "run",
        "--model",
        str(model_dir(root, case)),
        "--dataset",
        str(data_dir(root, case)),
        "--split",
        "test",
        "--recover",
        "auto",
        "--run-dir",
        str(runs),
        "--thread-id",
        thread,
        *flags,
        *settings.extra,
        *(["--threads", str(settings.threads)] if settings.threads else []),
    ]
    start = time.perf_counter()
    code, stderr = run_cli(argv, in_process=zoo_lib.is_tiny())  # the tiny smoke's runs stay in this process
    seconds = time.perf_counter() - start
    if code != 0:
        tail = stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"{case.name} {thread}: profiling-agent run failed ({code}): {tail[0]}")
    return {"result": json.loads((runs / thread / "result.json").read_text()), "seconds": round(seconds, 1)}


def val_drop(result: dict[str, Any], cand: dict[str, Any]) -> float | None:
    acc = cand.get("accuracy")
    return None if acc is None else round(float(result["baseline"]["accuracy"]) - float(acc), 3)


def loss_interval(change_ci: list[float] | None) -> list[float] | None:
    """The loss interval of a (candidate - baseline) accuracy-change interval, pp (None without one)."""
    return None if not change_ci else [round(-float(change_ci[1]), 3), round(-float(change_ci[0]), 3)]


def noise_floor(rounds: list[dict[str, Any]]) -> float | None:
    """The median |predicted - measured| a predictor right on average would still show, from both intervals, pp.

    Each round's error then has the spread of the trial's and validation's paired intervals together (95% half
    widths / 1.96, combined in quadrature; the trial slice is a quarter of the validation rows, so this errs high),
    and the median of a normal's absolute value is 0.674 of its spread.
    """
    spreads = []
    for x in rounds:
        if x.get("interval") and x.get("measured_interval") and x["predicted"] is not None:
            sd_p = (x["interval"][1] - x["interval"][0]) / (2 * 1.96)
            sd_m = (x["measured_interval"][1] - x["measured_interval"][0]) / (2 * 1.96)
            spreads.append(0.674 * (sd_p**2 + sd_m**2) ** 0.5)
    return statistics.median(spreads) if spreads else None


def first_set(*values: Any) -> Any:
    """The first value that is not None (None when all are)."""
    return next((v for v in values if v is not None), None)


def round_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per round: the predicted loss with its interval (expected after recovery; the trial's beside it), the
    measured loss (`plots.measured_loss`) and the drop."""
    from profiling_agent.tools.reporting.plots import measured_loss

    rows = []
    for cand in result.get("candidates") or []:
        prediction = cand.get("prediction") or {}
        rows.append(
            {
                "iteration": cand["iteration"],
                "status": cand["status"],
                # the loss expected after recovery (the trial corrected as the round chose its goal); a run from
                # before the expected loss was recorded: the trial's own
                "predicted": first_set(prediction.get("expected_drop"), prediction.get("predicted_drop")),
                "interval": prediction.get("expected_interval") or prediction.get("predicted_interval"),
                "trial": prediction.get("predicted_drop"),
                "trial_interval": prediction.get("predicted_interval"),
                "measured": measured_loss(cand),
                "measured_interval": loss_interval(cand.get("acc_delta_ci")),
                "val_drop": val_drop(result, cand),
            }
        )
    return rows


def agent_row(root: Path, case: Case, settings: Settings, mode: Mode) -> dict[str, Any]:
    """The agent's run on the case (cached per model and settings unless `mode.fresh`)."""
    from profiling_agent.tools.io import write_json_atomic

    path = root / "agent" / f"{case.name}-{fingerprint(case)}-{settings.key()}.json"
    if path.exists() and not mode.fresh:
        return {**json.loads(path.read_text()), "reused": True}
    if mode.cached:
        raise RuntimeError(f"{case.name}: no cached agent run with these settings")
    flags = ["--iterations", str(settings.iterations), "--planner", "deterministic"]
    flags += ["--target-reduction", str(TARGET), "--max-acc-drop", str(BUDGET_PP)]
    ran = cli_run(root, case, "agent", flags, settings)
    result, best = ran["result"], ran["result"].get("best") or {}
    base = result["baseline"]
    row = {
        "reduction": round(1 - best["params"] / base["params"], 4) if best.get("params") else 0.0,
        "val_drop": best.get("accuracy_drop"),
        "within_budget": best.get("within_budget"),
        "test_drop": None if best.get("test_delta") is None else round(-float(best["test_delta"]), 3),
        "test_interval": best.get("test_delta_ci"),
        "rounds": round_rows(result),
        "seconds": ran["seconds"],
        "delivered": (result.get("delivery") or {}).get("delivered"),
        "when": time.strftime("%Y-%m-%d %H:%M"),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, row)
    return row


# ---------------------------------------------------------------- the oracle


class UniformSolver:
    """The uniform L2 ratio that removes a given fraction of the parameters (the engine's exact estimate)."""

    def __init__(self, path: Path) -> None:
        from transformers import AutoModelForImageClassification

        from profiling_agent.tools.compression.families import adapter_for

        self.model = AutoModelForImageClassification.from_pretrained(path).eval()
        self.adapter = adapter_for(self.model)
        self.kinds = {g.kind for g in self.adapter.prunable_groups(copy.deepcopy(self.model))}

    def ratio(self, level: float) -> float:
        from budget import solve_knob
        from estimate import estimate_pruning

        from profiling_agent.tools.compression.baselines import uniform_entries

        def removed(r: float) -> float:
            entries = uniform_entries(self.kinds & {"structured", "head"}, r, "l2")
            return float(estimate_pruning(self.model, entries, adapter=self.adapter)["params_fraction_removed"])

        return round(solve_knob(removed, level, 1e-3, 0.95).knob, 4)


def oracle_point(
    root: Path, case: Case, ranking: str, level: float, settings: Settings, solver
) -> dict[str, Any] | None:
    """One oracle level of one ranking: reduction reached and validation drop after the agent's recovery.

    `solver` returns the case's UniformSolver; None instead: run nothing (the cached point, or None when missing).
    """
    from profiling_agent.tools.io import write_json_atomic

    path = root / "oracle" / f"{case.name}-{fingerprint(case)}-{settings.key()}" / f"{ranking}-{level:.3f}.json"
    if path.exists():
        return json.loads(path.read_text())
    if solver is None:
        return None
    flags = ["--iterations", "1", "--quantize", "none", "--backend", "torch", "--max-acc-drop", "100"]
    if ranking == "uniform":
        flags += ["--planner", "l2", "--ratio", str(solver().ratio(level))]
    else:
        flags += ["--planner", "deterministic", "--target-reduction", str(level)]
    ran = cli_run(root, case, f"oracle-{ranking}-{round(level * 1000):03d}", flags, settings)
    result = ran["result"]
    cands = [c for c in result.get("candidates") or [] if c.get("params")]
    base = result["baseline"]
    point = {
        "ranking": ranking,
        "level": level,
        "reduction": round(1 - cands[0]["params"] / base["params"], 4) if cands else 0.0,
        "val_drop": val_drop(result, cands[0]) if cands else None,
        "seconds": ran["seconds"],
    }
    point["passed"] = point["val_drop"] is not None and point["val_drop"] <= BUDGET_PP
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, point)
    return point


def sweep(root: Path, case: Case, ranking: str, settings: Settings, solver) -> tuple[list[dict[str, Any]], bool]:
    """Walk the grid coarse to fine; return every measured point (ascending levels) and whether the sweep ended.

    With `solver` None only cached points are read, and the sweep stops, unfinished, at the first level not cached.
    """

    def grid(lo: float, hi: float, step: float) -> list[float]:
        count = round((hi - lo) / step)
        return [round(lo + step * k, 4) for k in range(1, count + 1)]

    points: list[dict[str, Any]] = []
    last_pass, first_miss = 0.0, None
    for level in grid(0.0, settings.max_level, settings.coarse):
        p = oracle_point(root, case, ranking, level, settings, solver)
        if p is None:
            return sorted(points, key=lambda q: q["level"]), False
        points.append(p)
        if not p["passed"]:
            first_miss = level
            break
        last_pass = level
    if first_miss is not None:
        for level in grid(last_pass, first_miss - settings.fine / 2, settings.fine):
            p = oracle_point(root, case, ranking, level, settings, solver)
            if p is None:
                return sorted(points, key=lambda q: q["level"]), False
            points.append(p)
            if not p["passed"]:
                break
    return sorted(points, key=lambda q: q["level"]), True


def oracle(root: Path, case: Case, settings: Settings, cached_only: bool = False) -> dict[str, Any]:
    """Both rankings' sweeps and the best passing reduction of each and of either (`complete`: both sweeps ended)."""
    cached: list[UniformSolver] = []

    def solver() -> UniformSolver:
        if not cached:
            cached.append(UniformSolver(model_dir(root, case)))
        return cached[0]

    out: dict[str, Any] = {"points": {}, "ended": {}}
    for ranking in RANKINGS:
        points, ended = sweep(root, case, ranking, settings, None if cached_only else solver)
        out["points"][ranking], out["ended"][ranking] = points, ended
        out.setdefault("no_miss", {})[ranking] = ended and all(p["passed"] for p in points)  # the grid's end
        out[ranking] = max((p["reduction"] for p in points if p["passed"]), default=0.0)
    out["complete"] = all(out["ended"].values())
    out["best"] = max(out[r] for r in RANKINGS)
    out["seconds"] = round(sum(p["seconds"] for pts in out["points"].values() for p in pts), 1)
    return out


# ---------------------------------------------------------------- the table


def measure(root: Path, case: Case, settings: Settings, mode: Mode) -> dict[str, Any]:
    if mode.cached and not (root / "models" / case.name / "training.json").exists():
        return {"case": case.name, "half": case.half, "params": 0, "error": "not built yet"}
    record = ensure_case(case, root)
    row: dict[str, Any] = {"case": case.name, "half": case.half, "params": record["params"]}
    row["test_accuracy"] = record["test_accuracy"]
    try:
        row["agent"] = agent_row(root, case, settings, mode)
        row["oracle"] = oracle(root, case, settings, mode.cached) if mode.oracle else None
    except RuntimeError as exc:
        row["error"] = str(exc)
    return row


def _pp(value: Any) -> str:
    return "-" if value is None else f"{float(value):.2f}"


def _rounds_cell(rounds: list[dict[str, Any]]) -> str:
    cells = []
    for r in rounds:
        interval = r.get("interval")
        span = f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else ""
        trial = f" (trial {_pp(r['trial'])})" if r.get("trial") is not None and r["trial"] != r["predicted"] else ""
        cells.append(f"{_pp(r['predicted'])}{span}{trial} vs {_pp(r['measured'])}")
    return "; ".join(cells) or "-"


def table(rows: list[dict[str, Any]], half: str) -> str:
    lines = [
        f"**{half} half**: params target {TARGET:.0%}, budget {BUDGET_PP:g} pp, recovery auto",
        "",
        "| model | params | agent reduction | val drop pp | test drop pp [interval] | oracle uniform | oracle planner"
        " | agent / oracle (/ min(oracle, target)) | rounds: expected [interval] (trial) vs measured pp"
        " | agent s | oracle s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row.get("error"):
            lines.append(f"| {row['case']} | {row['params']:,} | failed: {row['error']} |" + " |" * 8)
            continue
        a, o = row["agent"], row.get("oracle")
        ci = a.get("test_interval")
        test = _pp(a["test_drop"]) + (f" [{-ci[1]:.2f}, {-ci[0]:.2f}]" if ci else "")
        share = "-"
        if o and o["best"] > 0:  # an unfinished or never-missing sweep's best is a lower bound: the share an upper one
            # the oracle's best is a lower bound when a sweep stopped early or the best came from one that never missed
            bound = not o["complete"] or any(o["no_miss"][r] and o[r] >= o["best"] for r in RANKINGS)
            share = f"{'<= ' if bound else ''}{a['reduction'] / o['best']:.0%}"
            share += f" ({a['reduction'] / min(o['best'], TARGET):.0%})"
        within = "" if a.get("within_budget") else " (over)"
        lines.append(
            f"| {row['case']} | {row['params']:,} | {a['reduction']:.1%}{within} | {_pp(a['val_drop'])} | {test} | "
            + ("".join(_oracle_cell(o, ranking) for ranking in RANKINGS) if o else "- | - | ")
            + f"{share} | {_rounds_cell(a['rounds'])} | {a['seconds']:.0f} | "
            + (f"{o['seconds']:.0f} |" if o else "- |")
        )
    return "\n".join(lines)


def _oracle_cell(oracle: dict[str, Any], ranking: str) -> str:
    """One ranking's best passing reduction; ">=" when its sweep stopped before a miss (unfinished, or no miss up to
    the grid's end)."""
    if oracle["ended"][ranking]:
        return f">= {oracle[ranking]:.1%} (no miss) | " if oracle["no_miss"][ranking] else f"{oracle[ranking]:.1%} | "
    if not oracle["points"][ranking]:
        return "not run | "
    return f">= {oracle[ranking]:.1%} (unfinished) | "


def summary(rows: list[dict[str, Any]]) -> str:
    """The issue's targets on the given rows (the report half)."""
    done = [r for r in rows if not r.get("error")]
    if not done:
        return "No model finished."
    within = sum(bool(r["agent"].get("within_budget")) for r in done)
    beyond = [r["case"] for r in done if _test_beyond(r["agent"])]
    with_oracle = [r for r in done if r.get("oracle") and r["oracle"]["complete"] and r["oracle"]["best"] > 0]
    share = sum(r["agent"]["reduction"] >= 0.75 * r["oracle"]["best"] for r in with_oracle)
    capped = sum(r["agent"]["reduction"] >= 0.75 * min(r["oracle"]["best"], TARGET) for r in with_oracle)
    errors = [
        abs(x["predicted"] - x["measured"])
        for r in done
        for x in r["agent"]["rounds"]
        if x["predicted"] is not None and x["measured"] is not None
    ]
    median = statistics.median(errors) if errors else None
    floor = noise_floor([x for r in done for x in r["agent"]["rounds"]])
    floor_note = f"; a predictor right on average would show about {_pp(floor)} pp on these intervals" if floor else ""
    return "\n".join(
        [
            f"- within the budget on validation: {within} of {len(done)} (target: all)",
            f"- held-out test loss beyond the budget by more than its interval: {len(beyond)} "
            f"({', '.join(beyond) or 'none'}; target: none)",
            f"- at least 75% of the oracle's reduction: {share} of {len(with_oracle)} with an oracle (target: 80%); "
            f"of the smaller of the oracle's and the {TARGET:.0%} target the run asked for: {capped}",
            f"- median |predicted - measured| loss per round: {_pp(median)} pp over {len(errors)} rounds "
            f"(target: <= 1 pp{floor_note})",
            f"- failed runs: {len(rows) - len(done)}",
        ]
    )


def _test_beyond(agent: dict[str, Any]) -> bool:
    """The held-out test loss exceeds the budget even at the smallest loss its paired interval allows."""
    drop, ci = agent.get("test_drop"), agent.get("test_interval")
    if drop is None:
        return False
    low_loss = -ci[1] if ci else drop  # the interval of (candidate - baseline): its upper end is the smallest loss
    return low_loss > BUDGET_PP


def run(names: list[str], halves: tuple[str, ...], settings: Settings, root: Path, mode: Mode) -> dict[str, Any]:
    cases = [c for c in (TINY_CASES if zoo_lib.is_tiny() else CASES) if c.half in halves]
    cases = [c for c in cases if not names or c.name in names]
    start = time.perf_counter()
    rows = []
    for case in cases:
        row = measure(root, case, settings, mode)
        rows.append(row)
        agent = row.get("agent") or {}
        say(
            f"[{case.name}] agent {agent.get('reduction', 0):.1%} in {agent.get('seconds', 0):.0f} s"
            + (f"; {row['error']}" if row.get("error") else "")
        )
    return {"rows": rows, "seconds": round(time.perf_counter() - start, 1), "settings": asdict(settings)}


def render(report: dict[str, Any]) -> str:
    parts = []
    for half in HALVES:
        rows = [r for r in report["rows"] if r["half"] == half]
        if rows:
            parts += [table(rows, half), ""]
    report_rows = [r for r in report["rows"] if r["half"] == "report"]
    if report_rows:
        parts += ["Targets on the report half:", summary(report_rows)]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/generalization.py", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="models to run (default: every model of the chosen halves)")
    parser.add_argument("--half", choices=(*HALVES, "both"), default="both")
    parser.add_argument("--no-oracle", action="store_true", help="the agent alone (no oracle sweeps)")
    parser.add_argument("--fresh-agent", action="store_true", help="re-run the agent even where a result is cached")
    parser.add_argument("--cached", action="store_true", help="run nothing: print the cached runs and oracle points")
    parser.add_argument("--list", action="store_true", help="print the models and their halves; run nothing")
    parser.add_argument("--tiny", action="store_true", help="smoke test: one tiny model, short runs")
    parser.add_argument("--threads", type=int, default=None, help="torch threads of every run")
    parser.add_argument("--out", default=None, help="cache folder (default: $PROFILING_AGENT_CACHE/generalization)")
    parser.add_argument("--json", default=None, help="write the rows here")
    args = parser.parse_args(argv)
    if args.tiny:
        zoo_lib.use_tiny()
    cases = TINY_CASES if args.tiny else CASES
    unknown = [n for n in args.names if n not in {c.name for c in cases}]
    if unknown:
        print(f"bench/generalization.py: unknown models {unknown} (see --list)", file=sys.stderr)
        return 2
    if args.list:
        for case in cases:
            print(f"{case.half:6} {case.name}: {case.family} on {case.data}, seed {case.seed}, {case.config or 'zoo'}")
        return 0
    default = zoo_lib.cache_root() / ("generalization-tiny" if args.tiny else "generalization")
    root = Path(args.out) if args.out else default
    settings = replace(TINY_SETTINGS if args.tiny else Settings(), threads=args.threads)
    halves = HALVES if args.half == "both" else (args.half,)
    try:
        mode = Mode(oracle=not args.no_oracle, fresh=args.fresh_agent, cached=args.cached)
        report = run(list(args.names), halves, settings, root, mode)
    except zoo_lib.ZooError as exc:
        print(f"bench/generalization.py: {exc}", file=sys.stderr)
        return 2
    print(render(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    say(f"done in {report['seconds']:.0f} s")
    return 0 if all(not r.get("error") for r in report["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
