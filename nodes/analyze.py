"""Analysis agent (and, from round 2, the iterative pruning agent): profile + feedback -> CompressionPlan."""

from __future__ import annotations

import os
from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import (
    context_of,
    event,
    iteration_dir,
    load_artifact_model,
    progress_callback,
    run_dir,
)
from profiling_agent.state import CompressionPlan, Context, State


def llm_configured(ctx: Context) -> bool:
    """Return True when an OpenAI-compatible endpoint or key is configured."""
    return bool(ctx.llm_base_url or os.environ.get("OPENAI_BASE_URL") or os.environ.get(ctx.llm_api_key_env))


def planner_history(state: State) -> list[dict[str, Any]]:
    """Summarize earlier rounds for the deterministic planner: goal, gamma and whether the budget held."""
    from profiling_agent.tools.selection import within_budget

    rounds = []
    for cand in state.candidates:
        meta = cand.get("planner_meta") or {}
        if "goal" not in meta:
            continue
        passed = bool(
            cand.get("status") == "ok"
            and cand.get("eval")
            and state.baseline_eval
            and within_budget(cand["eval"], state.baseline_eval, state.objective)
        )
        ev = cand.get("eval") or {}
        rounds.append(
            {
                "iteration": cand["iteration"],
                "goal": meta["goal"],
                "gamma": meta["gamma"],
                "passed": passed,
                "quant_speedup": ev.get("quant_speedup"),
                "quant_speedup_batch": ev.get("quant_speedup_batch"),
            }
        )
    return rounds


def _sensitivity(state: State, runtime: Runtime[Context], ctx: Context) -> dict[str, Any]:
    from profiling_agent.tools.data import load_prepared
    from profiling_agent.tools.families import adapter_for
    from profiling_agent.tools.io import write_json_atomic
    from profiling_agent.tools.sensitivity import probe_sensitivity

    loaded = load_artifact_model(state, state.baseline)
    tensors = load_prepared(run_dir(state) / state.data["path"])
    groups = adapter_for(loaded.model).prunable_groups(loaded.model)
    result = probe_sensitivity(
        loaded.model,
        groups,
        tensors["calib_pixels"],
        tensors["calib_labels"],
        ratio=ctx.probe_ratio,
        allowed_ids=(state.labels or {}).get("allowed_ids"),
        seed=state.dataset.seed,
        progress=progress_callback(runtime, "sensitivity probe"),
    )
    write_json_atomic(run_dir(state) / "sensitivity.json", result)
    return {name: {k: (round(v, 5) if isinstance(v, float) else v) for k, v in r.items()} for name, r in result.items()}


def analyze(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Plan this iteration: probe sensitivity once, then ask the planner for a plan from profile and feedback."""
    from profiling_agent.tools.io import read_json, write_json_atomic
    from profiling_agent.tools.planner import plan_round

    ctx = context_of(runtime)
    iteration = state.iteration + 1
    update: dict[str, Any] = {"iteration": iteration, "current": None}
    sensitivity = state.sensitivity
    if sensitivity is None:
        sensitivity = _sensitivity(state, runtime, ctx)
        update["sensitivity"] = sensitivity
    full_profile = read_json(run_dir(state) / "profile.json")
    requested = state.objective.planner
    if requested == "llm" and not llm_configured(ctx):
        raise ValueError("--planner llm needs an LLM: set OPENAI_BASE_URL or OPENAI_API_KEY (or --llm-base-url)")
    history = planner_history(state)
    result = plan_round(full_profile["groups"], full_profile["group_costs"], sensitivity, state.objective, history)
    plan: CompressionPlan = result.plan
    planner_used = result.planner
    fallbacks: list[dict[str, Any]] = []
    if requested in ("llm", "auto") and llm_configured(ctx):
        from profiling_agent.tools.llm_planner import plan_with_llm

        this_round = state.model_copy(update={"iteration": iteration})
        outcome = plan_with_llm(this_round, ctx, full_profile, sensitivity, fallback=result)
        plan, planner_used, fallbacks = outcome.plan, outcome.planner, outcome.fallbacks
    plan_dict = plan.model_dump()
    write_json_atomic(
        iteration_dir(state, iteration) / "plan.json",
        {"iteration": iteration, "planner": planner_used, "plan": plan_dict},
    )
    goal = result.target_estimate
    if planner_used == "llm":  # feedback for later deterministic rounds: what the applied plan aimed at
        key = {"size": "params"}.get(state.objective.target, state.objective.target)
        goal = float(outcome.estimate.get(key, goal) or goal)
    meta = {"goal": goal, "gamma": result.gamma, "converged": result.converged}
    update.update(
        {
            "plan": plan_dict,
            "planner_used": planner_used,
            "current": {"iteration": iteration, "planner_meta": meta},
            "fallbacks": [{**f, "iteration": iteration} for f in fallbacks],
        }
    )
    if result.converged and planner_used == "deterministic":
        update["stop_reason"] = f"planner converged before iteration {iteration}: {result.notes[0]}"
    message = f"{planner_used} plan: {len(plan.pruning)} pruning and {len(plan.quantization)} quantization entries"
    update["history"] = event("analyze", message, iteration, rationale=plan.rationale)
    return update
