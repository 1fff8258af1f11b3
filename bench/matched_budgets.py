"""Peers at matched budgets: every method removes the same fraction of parameters, then all are tested alike.

    python bench/matched_budgets.py --quick                # ViT + ResNet, 500 held-out images (~2-3 min)
    python bench/matched_budgets.py                        # the four zoo families, 2,000 held-out images
    python bench/matched_budgets.py vit --budgets 0.2 0.4 --json out.json --plots DIR
    python bench/matched_budgets.py --tiny                 # smoke test: the tiny zoo (bench/zoo.py --tiny), budget 0.2

At 10, 20, 30 and 40% parameter reduction each method's own knob is solved (bench/budget.py) so it
removes that fraction within one point, as the engine's exact parameter estimate says:
- agent: the deterministic planner's plan (profile cost shares over probe damage) for a goal bisected to the budget;
- l1, l2, random: uniform pruning of every group, the ratio bisected to the budget;
- tp_magnitude, tp_taylor: Torch-Pruning's global pruning (GroupMagnitudeImportance / GroupTaylorImportance on
  the same dependency groups, normalized per group, ranked across the whole model), the removed fraction of all
  units bisected to the budget.
All are pruned by the same engine (same protected layers, same channel and head units), then measured on the same
held-out Fashion-MNIST test images (never used to calibrate, probe, plan or refit), without recovery and after
least-squares reconstruction on the calibration images (`--recover none reconstruct`). With reconstruction the
agent plans from the probe measured after reconstruction, as a run with recovery does. Taylor importance and
reconstruction use 256 calibration images from the training images the zoo never trained on; the probe uses 64.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import recovery as recovery_lib  # noqa: E402
import zoo as zoo_lib  # noqa: E402

BUDGETS = (0.1, 0.2, 0.3, 0.4)
METHODS = ("agent", "l1", "l2", "random", "tp_magnitude", "tp_taylor")
PEERS = METHODS[1:]
RECOVERY = ("none", "reconstruct")
PROBE_IMAGES = 64


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return scored(model, x, y)[0]


def scored(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, list[bool]]:
    """Top-1 % on the held-out images, and which images it got right (for the paired interval of a verdict)."""
    from profiling_agent.tools.evaluation.bootstrap import correct
    from profiling_agent.tools.evaluation.metrics import predict, top1

    preds = predict(model, x, batch_size=250)
    return top1(preds, y), [bool(c) for c in correct(preds, y)]


class Setting:
    """One zoo model with what every method needs: groups, profile costs, probe damage, Torch-Pruning scores."""

    def __init__(self, name: str, path: Path, data: dict[str, torch.Tensor], recover_modes: tuple[str, ...]):
        from global_pruning import unit_scores
        from transformers import AutoModelForImageClassification

        from profiling_agent.tools.compression.families import adapter_for
        from profiling_agent.tools.models.sizes import count_params
        from profiling_agent.tools.profiling.sensitivity import probe_groups_full
        from profiling_agent.tools.profiling.summary import planner_profile

        self.name, self.data = name, data
        self.baseline = AutoModelForImageClassification.from_pretrained(path).eval()
        self.example = data["calib_x"][:1]
        self.adapter = adapter_for(self.baseline)
        self.groups = self.adapter.prunable_groups(self.baseline)
        profile = planner_profile(copy.deepcopy(self.baseline), tuple(self.example.shape[1:]))
        self.group_dicts, self.costs = profile["groups"], profile["group_costs"]
        probe_x, probe_y = data["calib_x"][:PROBE_IMAGES], data["calib_y"][:PROBE_IMAGES]
        self.sensitivity = {
            mode: probe_groups_full(self.baseline, self.groups, probe_x, probe_y, recover=mode == "reconstruct")
            for mode in recover_modes
        }
        self.scores = {
            crit: unit_scores(self.baseline, self.example, crit, pixels=data["calib_x"], labels=data["calib_y"])
            for crit in ("magnitude", "taylor")
        }
        self.params = count_params(self.baseline)

    def plan(
        self, method: str, knob: float, mode: str, budget: float, heads: float | None = None
    ) -> tuple[list[Any], dict | None, str]:
        """Entries, chosen units (Torch-Pruning) and the importance the engine uses, for a knob value.

        `heads` fixes a uniform method's head ratio (the knob then sets the channel ratio alone)."""
        from global_pruning import global_removals, removal_entries

        from profiling_agent.state import Objective, PlanningProblem
        from profiling_agent.tools.compression.baselines import uniform_entries
        from profiling_agent.tools.planning.deterministic import PlannerConfig, plan_round

        if method == "agent":
            objective = Objective(target="params", target_reduction=budget, quantize="none", planner="deterministic")
            # whole units, not channel blocks: on the zoo ResNet's 16-64-channel groups the run's 8/16-channel
            # rounding (a latency choice) moves a plan in 5-25% steps, which missed the budget in 5 of its 8 cells
            config = PlannerConfig(align_channels=False)
            problem = PlanningProblem.of(self.group_dicts, self.costs, self.sensitivity[mode], objective)
            result = plan_round(problem, config, goal=knob)
            return list(result.plan.pruning), None, "l2"
        if method in ("l1", "l2", "random"):
            kinds = {g.kind for g in self.groups}
            if heads is None:
                return list(uniform_entries(kinds, knob, method)), None, method
            entries = uniform_entries(kinds - {"head"}, knob, method)
            if heads > 0 and "head" in kinds:
                entries += uniform_entries({"head"}, heads, method)
            return list(entries), None, method
        chosen = global_removals(self.groups, self.scores[method.removeprefix("tp_")], knob)
        return removal_entries(self.groups, chosen), chosen, "l2"

    def reduction(self, entries: list[Any]) -> float:
        from estimate import estimate_pruning

        if not entries:
            return 0.0
        return float(estimate_pruning(self.baseline, entries, adapter=self.adapter)["params_fraction_removed"])

    def knob_range(self, method: str, mode: str) -> tuple[float, float]:
        from profiling_agent.state import group_rows
        from profiling_agent.tools.planning.deterministic import PlannerConfig, max_feasible

        if method == "agent":
            return 1e-4, max_feasible(group_rows(self.group_dicts, self.costs, {}), "params", PlannerConfig())
        return 1e-4, 0.95


def measure(setting: Setting, method: str, budget: float, modes: tuple[str, ...]) -> list[dict[str, Any]]:
    """Solve the method's knob for `budget`, prune with the engine, and test without and with recovery."""
    from budget import solve_knob

    from profiling_agent.tools.compression.pruning import prune_model
    from profiling_agent.tools.recovery.reconstruct import reconstruct

    data, rows = setting.data, []
    plans: dict[str, Any] = {}
    for mode in modes:
        plan_mode = mode if method == "agent" else modes[0]  # only the agent plans differently with recovery
        if plan_mode not in plans:
            lo, hi = setting.knob_range(method, plan_mode)
            solved = solve_knob(
                lambda k, m=plan_mode: setting.reduction(setting.plan(method, k, m, budget)[0]), budget, lo, hi
            )
            heads = None
            if not solved.matched and method in ("l1", "l2", "random"):
                # heads are few and floor to whole heads, so one common ratio jumps past the budget: keep the head
                # ratio of the largest common ratio still under budget and solve the channel ratio alone
                heads = max((k for k, r in solved.tried if r < budget), default=0.0)
                solved = solve_knob(
                    lambda k, m=plan_mode, h=heads: setting.reduction(setting.plan(method, k, m, budget, h)[0]),
                    budget,
                    lo,
                    hi,
                )
            entries, chosen, importance = setting.plan(method, solved.knob, plan_mode, budget, heads)
            tick = time.perf_counter()
            pruned = copy.deepcopy(setting.baseline)
            report = prune_model(pruned, entries, setting.example, importance=importance, chosen=chosen)
            plans[plan_mode] = (solved, pruned, report, time.perf_counter() - tick)
        solved, pruned, report, seconds = plans[plan_mode]
        model = pruned
        if mode == "reconstruct":
            model = copy.deepcopy(pruned)
            tick = time.perf_counter()
            reconstruct(setting.baseline, model, data["calib_x"], report.applied)
            seconds += time.perf_counter() - tick
        reduction = 1 - report.params_after / report.params_before
        top1, right = scored(model, data["test_x"], data["test_y"])
        rows.append(
            {
                "model": setting.name,
                "budget": budget,
                "method": method,
                "recovery": mode,
                "knob": round(solved.knob, 5),
                "head_ratio": heads,
                "reduction": round(reduction, 5),
                "matched": abs(reduction - budget) <= 0.01,
                "test_top1": top1,
                "right": right,  # per held-out image; dropped from the JSON
                "params": report.params_after,
                "seconds": round(seconds, 2),
            }
        )
    return rows


def run_model(name: str, path: Path, data: dict[str, torch.Tensor], budgets, modes) -> dict[str, Any]:
    start = time.perf_counter()
    setting = Setting(name, path, data, modes)
    base = accuracy(setting.baseline, data["test_x"], data["test_y"])
    say(
        f"[{name}] baseline {base:.2f}% on {len(data['test_y'])} held-out images; "
        f"set up in {time.perf_counter() - start:.0f} s"
    )
    rows = []
    for budget in budgets:
        for method in METHODS:
            got = measure(setting, method, budget, modes)
            rows += got
            say(
                f"[{name}] {budget:.0%} {method}: "
                + ", ".join(f"{r['recovery']} {r['test_top1']:.2f}% at -{r['reduction']:.1%}" for r in got)
            )
    return {
        "model": name,
        "baseline": base,
        "params": setting.params,
        "rows": rows,
        "seconds": time.perf_counter() - start,
    }


def verdicts(result: dict[str, Any], modes) -> list[dict[str, Any]]:
    """Per budget and recovery: the agent's accuracy minus the best peer's (negative: a peer won), with its interval.

    The interval is the paired bootstrap 95% interval of that difference on the same held-out images
    (`tools/evaluation/bootstrap.py`): "win" above zero, "loss" below, "tie" when it holds zero.
    """
    from profiling_agent.tools.evaluation.bootstrap import paired_delta_ci

    out = []
    for mode in modes:
        for budget in sorted({r["budget"] for r in result["rows"]}):
            at = {r["method"]: r for r in result["rows"] if r["budget"] == budget and r["recovery"] == mode}
            peer = max(PEERS, key=lambda m: at[m]["test_top1"])
            low, high = paired_delta_ci(np.asarray(at["agent"]["right"]), np.asarray(at[peer]["right"]))
            out.append(
                {
                    "budget": budget,
                    "recovery": mode,
                    "agent": at["agent"]["test_top1"],
                    "best_peer": peer,
                    "peer": at[peer]["test_top1"],
                    "margin": round(at["agent"]["test_top1"] - at[peer]["test_top1"], 2),
                    "interval": [low, high],
                    "verdict": "win" if low > 0 else "loss" if high < 0 else "tie",
                    "all_matched": all(r["matched"] for r in at.values()),
                }
            )
    return out


def summary(results: list[dict[str, Any]], modes) -> str:
    """Count the cells where the agent is at or above the best peer, or tied within the paired interval."""
    cells = [v for result in results for v in verdicts(result, modes)]
    ahead = sum(v["margin"] >= 0 for v in cells)
    held = sum(v["margin"] >= 0 or v["verdict"] == "tie" for v in cells)
    losses = [v for v in cells if v["verdict"] == "loss"]
    return (
        f"The agent is at or above the best peer in {ahead} of {len(cells)} cells, and at or above it or tied within "
        f"the paired 95% interval in {held} of {len(cells)}"
        + (f"; behind beyond the interval in {len(losses)}." if losses else "; behind beyond the interval in none.")
    )


def table(result: dict[str, Any], modes) -> str:
    lines = [
        f"**{result['model']}** (baseline {result['baseline']:.2f}% top-1, {result['params']:,} params)",
        "",
        "| budget | recovery | " + " | ".join(METHODS) + " | agent - best peer |",
        "|---|---|" + "---|" * len(METHODS) + "---|",
    ]
    verdict = {(v["budget"], v["recovery"]): v for v in verdicts(result, modes)}
    for mode in modes:
        for budget in sorted({r["budget"] for r in result["rows"]}):
            at = {r["method"]: r for r in result["rows"] if r["budget"] == budget and r["recovery"] == mode}
            cells = []
            for method in METHODS:
                r = at[method]
                flag = "" if r["matched"] else " (unmatched)"
                cells.append(f"{r['test_top1']:.2f} (-{r['reduction']:.1%}){flag}")
            v = verdict[(budget, mode)]
            low, high = v["interval"]
            lines.append(
                f"| {budget:.0%} | {mode} | "
                + " | ".join(cells)
                + f" | {v['margin']:+.2f} ({v['best_peer']}; [{low:+.2f}, {high:+.2f}] {v['verdict']}) |"
            )
    return "\n".join(lines)


def plot(result: dict[str, Any], modes, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(modes), figsize=(5.5 * len(modes), 4), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        for method in METHODS:
            rows = sorted(
                (r for r in result["rows"] if r["method"] == method and r["recovery"] == mode),
                key=lambda r: r["reduction"],
            )
            style = {"linewidth": 2.5} if method == "agent" else {"linewidth": 1.2}
            ax.plot([100 * r["reduction"] for r in rows], [r["test_top1"] for r in rows], "o-", label=method, **style)
        ax.axhline(result["baseline"], color="grey", linestyle=":", label="baseline")
        ax.set(title=f"{result['model']}: {mode}", xlabel="parameters removed (%)", ylabel="held-out top-1 (%)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"matched_{result['model']}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(names, *, quick: bool, budgets=BUDGETS, modes=RECOVERY, zoo_dir=None, threads: int = 1, seed: int = 0):
    """Build the zoo when missing and measure every model; returns {"results", "held_out", "seconds"}.

    Under the tiny zoo (`zoo_lib.use_tiny()`) 100 held-out images and 32 calibration images.
    """
    start = time.perf_counter()
    out = Path(zoo_dir) if zoo_dir else zoo_lib.default_out()
    zoo = zoo_lib.build_zoo(out, tuple(names), threads=threads)
    held_out = 100 if zoo_lib.is_tiny() else 500 if quick else 2000
    data = recovery_lib.zoo_data(held_out, 32 if zoo_lib.is_tiny() else 256, 0, seed)
    results = [run_model(n, Path(zoo["models"][n]["path"]), data, tuple(budgets), tuple(modes)) for n in names]
    return {"results": results, "held_out": held_out, "seconds": round(time.perf_counter() - start, 1)}


def json_ready(report: dict[str, Any], modes=RECOVERY) -> dict[str, Any]:
    """Return the report with each model's verdicts and without the per-image correctness (written as JSON)."""
    results = [
        {
            **r,
            "verdicts": verdicts(r, modes),
            "rows": [{k: v for k, v in row.items() if k != "right"} for row in r["rows"]],
        }
        for r in report["results"]
    ]
    return {**report, "results": results}


def render(report: dict[str, Any], modes=RECOVERY) -> str:
    parts = [
        f"Matched budgets: held-out test top-1 % (parameters removed) on {report['held_out']} Fashion-MNIST test "
        "images; every method's knob solved to the budget within one point; the last column is the agent's "
        "accuracy minus the best peer's (negative: that peer won).",
        "",
    ]
    for result in report["results"]:
        parts += [table(result, modes), ""]
    parts.append(summary(report["results"], modes))
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/matched_budgets.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "names", nargs="*", help=f"zoo models (default: {' '.join(zoo_lib.FAMILIES)}; --quick vit resnet)"
    )
    parser.add_argument("--quick", action="store_true", help="ViT and ResNet, 500 held-out images")
    parser.add_argument("--tiny", action="store_true", help="smoke test: the tiny zoo's ViT and ResNet, budget 0.2")
    parser.add_argument("--budgets", nargs="+", type=float, default=list(BUDGETS))
    parser.add_argument("--recover", nargs="+", choices=RECOVERY, default=list(RECOVERY))
    parser.add_argument("--zoo", default=None, help="zoo folder (default: $PROFILING_AGENT_CACHE/zoo)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="write the rows here")
    parser.add_argument("--plots", default=None, help="folder for one accuracy-vs-reduction plot per model")
    args = parser.parse_args(argv)
    bad = [b for b in args.budgets if not 0 < b < 0.9]
    unknown = [n for n in args.names if n not in zoo_lib.FAMILIES]
    if bad or unknown:
        print(f"bench/matched_budgets.py: bad budgets {bad} or unknown models {unknown}", file=sys.stderr)
        return 2
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if args.tiny:
        zoo_lib.use_tiny()
        args.budgets = args.budgets if args.budgets != list(BUDGETS) else [0.2]
    torch.set_num_threads(args.threads)
    names = tuple(args.names) or (("vit", "resnet") if args.quick or args.tiny else zoo_lib.FAMILIES)
    report = run(
        names, quick=args.quick, budgets=args.budgets, modes=tuple(args.recover), zoo_dir=args.zoo, threads=args.threads
    )
    print(render(report, tuple(args.recover)))
    if args.plots:
        for result in report["results"]:
            say(f"plot: {plot(result, tuple(args.recover), Path(args.plots))}")
    if args.json:
        Path(args.json).write_text(json.dumps(json_ready(report, tuple(args.recover)), indent=1))
    say(f"done in {report['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
