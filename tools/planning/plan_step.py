"""The analyze step's work: plan the next round (a planner or a uniform baseline), keep its refit, write plan.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from profiling_agent.state import CompressionPlan, Context, PlannerMeta, group_rows
from profiling_agent.tools import run_layout
from profiling_agent.tools.io import read_json, write_json_atomic
from profiling_agent.tools.planning.llm_config import planner_mode
from profiling_agent.tools.planning.paired import repeated_round
from profiling_agent.tools.planning.round import RoundOutcome, planning_round
from profiling_agent.tools.planning.round_inputs import RoundInputs
from profiling_agent.tools.planning.trials import TrialFactory, TrialSetup
from profiling_agent.tools.recovery.refit_cache import TrialRefits, discard


def plan_next(
    inputs: RoundInputs, setup: TrialSetup, ctx: Context, folder: Path, conversation: Any = None
) -> RoundOutcome:
    """Plan round `inputs.iteration` and write its plan.json in `folder` (the round's folder).

    `conversation` is the compiled LLM conversation subgraph an LLM turn runs (None: the module's own).

    A uniform baseline plans once (`uniform_round`). Otherwise the planner choice resolves against the settings
    (`planner_mode`), the round plans from profile.json with calibration trials built from `setup`, and the chosen
    plan's trial refit is kept in `folder` for the recover step (an older one goes when there is none).

    Raises:
        ValueError: `--planner llm` without an LLM configured, or an endpoint that could not be used.
        LLMUnreachable: `--planner llm` whose endpoint never gave a usable reply.
    """
    from profiling_agent.tools.compression.baselines import (
        is_baseline,
    )  # lazy: torch_pruning; nodes.analyze loads this module without it

    if is_baseline(inputs.objective.planner):
        return uniform_round(inputs, Path(setup.run_path), folder)
    choice = planner_mode(inputs.objective.planner, ctx)  # --planner llm without an LLM: ValueError
    full_profile = read_json(Path(setup.run_path) / run_layout.PROFILE)
    refits = TrialRefits()
    trials = TrialFactory(setup, refits)
    out = planning_round(inputs, ctx, full_profile, choice.mode, trials.plans, trials.blocks, conversation)
    out.choice = choice
    if not (out.stop_reason or inputs.objective.approve):  # a plan waiting for approval is built as decided
        again = repeated_round(inputs.candidates, out.plan, out.meta, inputs.iteration)
        if again is not None:  # a paired round repeating a measured plan (a copied proposal): nothing is rebuilt
            out.measured = again[1]
            out.message += (
                f"; the plan of iteration {again[0]} again (same seed and images): its candidate, not rebuilt"
            )
    # the chosen plan's trial refit, for the recover step (which checks its key); none, or no recover step (a plan
    # measured before): an older one goes
    if out.stop_reason or out.measured is not None or not refits.save(out.plan.pruning, folder):
        discard(folder)
    write_plan(folder, inputs.iteration, out)
    return out


def uniform_round(inputs: RoundInputs, run_path: Path, folder: Path) -> RoundOutcome:
    """Plan a uniform l1/l2/random baseline: no sensitivity probe; the plan never changes, so one round is enough.

    Returns:
        The plan (meta: the baseline and its ratio), or, once a candidate exists, an empty outcome whose stop
        reason says why the run stops (nothing written then).
    """
    from profiling_agent.tools.compression.baselines import (
        as_baseline,
        check_ratio,
        uniform_plan,
    )  # lazy: torch_pruning; nodes.analyze loads this module without it

    planner = as_baseline(inputs.objective.planner)
    ratio = check_ratio(inputs.objective.ratio, planner)
    meta = PlannerMeta(baseline=planner, ratio=ratio)
    if inputs.candidates:  # the same plan again would give the same candidate
        stop = f"uniform {planner} baseline at ratio {ratio:g}: stopped after 1 iteration (its plan never changes)"
        return RoundOutcome(CompressionPlan(), planner, meta, f"stopping: {stop}", stop_reason=stop)
    groups = group_rows(read_json(run_path / run_layout.PROFILE)["groups"], {}, {})  # the baselines read rows too
    plan = uniform_plan(groups, ratio, planner, inputs.objective.quantize)
    message = f"{planner} baseline plan: every prunable group at ratio {ratio:g}, {len(plan.quantization)} quantization"
    out = RoundOutcome(plan, planner, meta, message + " entries")
    write_plan(folder, inputs.iteration, out)
    return out


def write_plan(folder: Path, iteration: int, out: RoundOutcome) -> None:
    """Write the round's plan.json (iteration, planner, plan), atomically."""
    write_json_atomic(
        folder / run_layout.PLAN, {"iteration": iteration, "planner": out.planner, "plan": out.plan.model_dump()}
    )
