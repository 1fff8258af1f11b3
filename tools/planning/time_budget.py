"""The run's time budget: expected seconds of the remaining steps and the knobs (trials, recovery, forms, rounds)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from profiling_agent.schemas.plans import BudgetPlan
from profiling_agent.schemas.settings import BackendChoice

SETUP_STEPS = ("acquire", "resolve_input_shape", "prepare_data", "profile", "probe_sensitivity", "measure_baseline")
ROUND_STEPS = ("analyze", "prune", "recover", "quantize", "evaluate", "iterate")
FINAL_STEPS = ("evaluate_held_out", "report")
FORM_STEPS = ("measure_baseline", "evaluate", "evaluate_held_out")  # their time grows with the forms built

# Prior wall seconds of a step before this run measured it: fixed + per GMAC of one image. The per-GMAC parts are a
# whole run on full-size ViT-B/16 (17.6 GMAC, 2 rounds, OpenVINO, 2 cores; docs/facts.md): CPU-seconds / 1.5; the
# fixed parts a run on the embedded digits ViT (0.004 GMAC), whose steps are mostly exports and process set-up.
PRIOR_S: dict[str, tuple[float, float]] = {
    "acquire": (2.0, 0.5),
    "resolve_input_shape": (1.0, 0.1),
    "prepare_data": (2.0, 0.5),
    "profile": (15.0, 10.8),
    "probe_sensitivity": (2.0, 14.8),
    "measure_baseline": (15.0, 17.0),
    "analyze": (2.0, 18.1),  # round 1 (its back-off and token trials)
    "analyze_later": (1.0, 3.5),  # a searching round
    "prune": (1.0, 1.0),
    "recover": (5.0, 17.4),
    "quantize": (1.0, 0.5),
    "evaluate": (8.0, 8.9),
    "iterate": (0.2, 0.0),
    "evaluate_held_out": (8.0, 9.3),
    "report": (5.0, 0.0),
}
FULL_TRIALS = 4  # trials of a searching round (tools/planning/search.py SEARCH_TRIALS)
MIN_TRIALS = 1
MIN_RECOVER_MINUTES = 0.05  # the shortest distillation cap (0 would mean no cap)
RECOVER_OVERHEAD = 1.2  # a recover step takes about this times its distillation cap (load, refit, save)
FORMS_CUT = 0.5  # measuring only the OpenVINO forms takes about this share of measuring every form
CUT_ORDER = ("trials", "recovery", "forms", "rounds")


@dataclass(frozen=True)
class Knobs:
    """What the remaining steps run with: rounds in all, trials per searching round, recovery cap, backend."""

    rounds: int
    trials: int
    recover_minutes: float
    backend: BackendChoice


@dataclass(frozen=True)
class Progress:
    """Where the run stands: the seconds each finished step took, by (node, iteration), in order."""

    steps: Sequence[tuple[str, int, float]]
    gmacs: float = 1.0  # one image's GMAC (the priors scale with it)

    def spent(self) -> float:
        """Return the seconds the finished steps took."""
        return sum(s for _, _, s in self.steps)

    def done(self, node: str, iteration: int = 0) -> bool:
        """Return whether `node` finished (in round `iteration` for a round step)."""
        return any(n == node and (node not in ROUND_STEPS or it == iteration) for n, it, _ in self.steps)

    def rounds_done(self) -> int:
        """Return the rounds recorded by iterate."""
        return sum(1 for n, _, _ in self.steps if n == "iterate")

    def rounds_started(self) -> int:
        """Return the rounds recorded by iterate, plus the one in progress (planned, not yet recorded)."""
        done = self.rounds_done()
        return done + 1 if self.done("analyze", done + 1) else done

    def measured(self, node: str, later: bool = False) -> float | None:
        """Return the mean seconds `node` took in this run (analyze: round 1, or `later` rounds), None if never run."""
        times = [s for n, it, s in self.steps if n == node and (node != "analyze" or (it > 1) == later)]
        return sum(times) / len(times) if times else None


def step_estimate(node: str, progress: Progress, knobs: Knobs, full: Knobs, later: bool = False) -> float:
    """Return the expected seconds of one `node` step under `knobs` (measured this run, else the prior)."""
    key = "analyze_later" if node == "analyze" and later else node
    fixed, per_gmac = PRIOR_S.get(key, (1.0, 0.0))
    seconds = progress.measured(node, later)
    if seconds is None:
        seconds = fixed + per_gmac * progress.gmacs
    if key == "analyze_later":
        seconds *= (1 + knobs.trials) / (1 + full.trials)
    if node == "recover":
        seconds = min(seconds, cap_of(knobs.recover_minutes) * 60 * RECOVER_OVERHEAD + fixed)
    if node in FORM_STEPS and knobs.backend != full.backend:
        seconds *= FORMS_CUT
    return seconds


def remaining_steps(progress: Progress, rounds: int) -> list[tuple[str, int]]:
    """Return the steps still to run as (node, round), in order, when the run finishes `rounds` rounds."""
    todo: list[tuple[str, int]] = [(n, 0) for n in SETUP_STEPS if not progress.done(n)]
    first = progress.rounds_done() + 1
    for it in range(first, rounds + 1):
        todo += [(n, it) for n in ROUND_STEPS if not progress.done(n, it)]
    return todo + [(n, 0) for n in FINAL_STEPS if not progress.done(n)]


def expected(progress: Progress, knobs: Knobs, full: Knobs) -> dict[tuple[str, int], float]:
    """Return the expected seconds of each remaining step under `knobs`."""
    return {
        (n, it): step_estimate(n, progress, knobs, full, later=it > 1)
        for n, it in remaining_steps(progress, knobs.rounds)
    }


def _total(progress: Progress, knobs: Knobs, full: Knobs) -> float:
    return sum(expected(progress, knobs, full).values())


def cap_of(minutes: float) -> float:
    """Return a distillation cap in minutes as a number that compares (0, no cap: infinity)."""
    return minutes if minutes > 0 else math.inf


def _cut(knobs: Knobs, what: str) -> Knobs:
    """Return `knobs` with `what` (trials, recovery, forms) cut as far as it goes."""
    if what == "trials":
        return dataclasses.replace(knobs, trials=min(knobs.trials, MIN_TRIALS))
    if what == "recovery":
        return dataclasses.replace(knobs, recover_minutes=min(cap_of(knobs.recover_minutes), MIN_RECOVER_MINUTES))
    return dataclasses.replace(knobs, backend="openvino" if knobs.backend == "auto" else knobs.backend)


def _refill_recovery(knobs: Knobs, progress: Progress, full: Knobs, left: float) -> Knobs:
    """Give recovery the largest cap (up to the full one) that keeps the remaining steps within `left` seconds."""
    cheapest = dataclasses.replace(knobs, recover_minutes=MIN_RECOVER_MINUTES)
    steps = expected(progress, cheapest, full)
    recovers = [k for k in steps if k[0] == "recover"]
    if not recovers:
        return knobs
    room = left - sum(steps.values()) + sum(steps[k] for k in recovers)
    cap = (room / len(recovers) - PRIOR_S["recover"][0]) / 60 / RECOVER_OVERHEAD
    if cap >= cap_of(full.recover_minutes):
        return dataclasses.replace(knobs, recover_minutes=full.recover_minutes)
    return dataclasses.replace(knobs, recover_minutes=max(MIN_RECOVER_MINUTES, math.floor(cap * 1000) / 1000))


def _rounds_that_fit(knobs: Knobs, progress: Progress, full: Knobs, left: float) -> Knobs:
    """Return `knobs` with the most rounds (up to the full count, at least one) whose remaining steps fit `left`."""
    fewest = max(1, progress.rounds_started())
    for rounds in range(full.rounds, fewest, -1):
        trial = dataclasses.replace(knobs, rounds=rounds)
        if _total(progress, trial, full) <= left:
            return trial
    return dataclasses.replace(knobs, rounds=fewest)


def cut_list(knobs: Knobs, full: Knobs) -> list[str]:
    """Describe what `knobs` cut from `full`, in CUT_ORDER."""
    cuts = []
    if knobs.trials < full.trials:
        cuts.append(f"trials per searching round {full.trials} -> {knobs.trials}")
    if cap_of(knobs.recover_minutes) < cap_of(full.recover_minutes):
        was = f"{full.recover_minutes:g}" if full.recover_minutes > 0 else "no cap"
        cuts.append(f"distillation cap {was} -> {knobs.recover_minutes:g} min per candidate")
    if knobs.backend != full.backend:
        cuts.append(f"forms: {full.backend} -> {knobs.backend} only")
    if knobs.rounds < full.rounds:
        cuts.append(f"rounds {full.rounds} -> {knobs.rounds}")
    return cuts


def cut_names(knobs: Knobs, full: Knobs) -> list[str]:
    """Return the knobs `knobs` cut from `full`, in CUT_ORDER."""
    cut = {
        "trials": knobs.trials < full.trials,
        "recovery": cap_of(knobs.recover_minutes) < cap_of(full.recover_minutes),
        "forms": knobs.backend != full.backend,
        "rounds": knobs.rounds < full.rounds,
    }
    return [name for name in CUT_ORDER if cut[name]]


def plan_budget(budget_s: float | None, progress: Progress, full: Knobs) -> BudgetPlan:
    """Plan the remaining steps to fit `budget_s` (None: no bound, the full knobs); cut in CUT_ORDER until they fit.

    Each cut goes as far as it goes (one trial, the shortest recovery, OpenVINO's forms only, the fewest rounds
    that fit, at least one): the next cut is made only when the steps still do not fit. Recovery then gets back the
    largest cap the rest leaves room for. Measured step times replace the priors as the run goes, so a resume (its
    history's steps counted as spent) plans with what it measured.

    Args:
        budget_s: Seconds the whole run may take, or None.
        progress: The finished steps' seconds and the model's GMAC.
        full: The knobs without a budget (the run's settings).

    Returns:
        The plan: knobs, what was cut, seconds spent and expected.
    """
    knobs = full
    left = (budget_s or 0.0) - progress.spent()
    if budget_s is not None and _total(progress, knobs, full) > left:
        for what in CUT_ORDER:
            knobs = _rounds_that_fit(knobs, progress, full, left) if what == "rounds" else _cut(knobs, what)
            if _total(progress, knobs, full) <= left:
                break
        if cap_of(knobs.recover_minutes) < cap_of(full.recover_minutes):
            knobs = _refill_recovery(knobs, progress, full, left)
    return BudgetPlan(
        budget_s=budget_s or 0.0,
        spent_s=round(progress.spent(), 3),
        expected_s=round(_total(progress, knobs, full), 3),
        rounds=knobs.rounds,
        trials=knobs.trials,
        recover_minutes=knobs.recover_minutes,
        backend=knobs.backend,
        cuts=cut_list(knobs, full),
        cut=cut_names(knobs, full),
    )


def next_step_s(plan: BudgetPlan, progress: Progress, full: Knobs, node: str, iteration: int) -> float:
    """Return the seconds `node` (in round `iteration`) is expected to take under `plan`."""
    knobs = Knobs(plan.rounds, plan.trials, plan.recover_minutes, plan.backend)
    return step_estimate(node, progress, knobs, full, later=node == "analyze" and iteration > 1)


def another_round_fits(plan: BudgetPlan, progress: Progress) -> bool:
    """Return whether the rounds the plan keeps include one more than those recorded."""
    return plan.rounds > progress.rounds_done()


def progress_of(history: Sequence[Mapping[str, Any]], gmacs: float) -> Progress:
    """Build the Progress of a run from its history events' `spent_s` (events without one are not steps)."""
    steps = [
        (str(e["node"]), int(e.get("iteration") or 0), float(e["spent_s"]))
        for e in history
        if e.get("spent_s") is not None
    ]
    return Progress(steps, gmacs)
