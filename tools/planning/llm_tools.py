"""LangChain tools the LLM planner calls to inspect the profile and check a plan before proposing it."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from langchain_core.tools import BaseTool, tool
from typing_extensions import TypedDict

from profiling_agent.state import GroupRow, GroupSensitivity, PlannerProfile, TokenAxis
from profiling_agent.tools.planning.plan_guard import GuardConfig, GuardVerdict, check_plan
from profiling_agent.tools.planning.plan_parse import parse_plan_text
from profiling_agent.tools.planning.proposal import Propose
from profiling_agent.tools.planning.regex_safety import regex_problem
from profiling_agent.tools.planning.trials import Evaluate

MAX_LISTED = 40  # rows listed by one tool answer
MAX_TOOL_CHARS = 6000  # characters of one tool answer


def _round(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_round(v) for v in value]
    return value


def dump(value: Any) -> str:
    """Serialize a tool answer as compact JSON (floats to 4 significant digits), cut to MAX_TOOL_CHARS."""
    text = json.dumps(_round(value), separators=(",", ":"), default=str)
    return text if len(text) <= MAX_TOOL_CHARS else text[: MAX_TOOL_CHARS - 20] + "...(truncated)"


class ModelInfo(TypedDict, total=False):
    """What `model_overview` says of the model besides the profile."""

    model: str
    family: str | None


class ToolGroupRow(TypedDict):
    """One group as the tools show it: module, size, cost shares and the probe's damage (None: not probed)."""

    group: str
    kind: str
    module: str
    units: int
    unit_size: int
    min_units: int
    params_share: float
    macs_share: float
    latency_share: float
    damage: float | None
    acc_drop: float | None


class PlanningData:
    """The profile and probe results the tools read, indexed once per planning step."""

    def __init__(
        self, profile: PlannerProfile, sensitivity: Mapping[str, GroupSensitivity], model_info: ModelInfo | None
    ):
        self.profile = profile.with_layers()  # a quantization regex must match one of its Linear layers
        self.groups = profile.rows
        self.protected = profile.protected
        self.layers = self.profile.layers or []
        self.totals = profile.totals
        self.sensitivity = sensitivity
        self.model_info = model_info or {}
        self.guard_config = GuardConfig()
        self.by_name = {g.name: g for g in self.groups}
        self.member_of: dict[str, str] = {}
        for group in self.groups:
            for member in group.members or [group.module]:
                self.member_of.setdefault(member, group.name)

    def group_row(self, group: GroupRow) -> ToolGroupRow:
        """Describe one group: module, size, cost shares and probe damage."""
        sens = self.sensitivity.get(group.name)
        return {
            "group": group.name,
            "kind": group.kind,
            "module": group.module,
            "units": group.units,
            "unit_size": group.unit_size,
            "min_units": group.min_units,
            "params_share": group.params_share,
            "macs_share": group.macs_share,
            "latency_share": group.latency_share,
            "damage": None if sens is None else sens.damage,
            "acc_drop": None if sens is None else sens.acc_drop,
        }

    def is_protected(self, name: str) -> bool:
        """Return True when `name` is a protected module or lies inside one."""
        return any(name == p or name.startswith(p + ".") for p in self.protected if p)

    def guard(self, plan_json: str) -> tuple[GuardVerdict, list[str]]:
        """Parse plan text and run the guard; return (verdict, notes) or raise ValueError."""
        plan, notes = parse_plan_text(plan_json)
        verdict = check_plan(plan, self.profile, self.guard_config)
        return verdict, notes


def _match_layers(data: PlanningData, pattern: str, kind: str) -> str:
    problem = regex_problem(pattern)
    if problem:
        return f"error: {problem}"
    compiled = re.compile(pattern)
    hits = [g for g in data.groups if g.kind == kind and compiled.search(g.module)]
    guarded = [n for n in data.protected if compiled.search(n)]
    if not hits:
        other = [g for g in data.groups if g.kind != kind and compiled.search(g.module)]
        examples = [g.module for g in data.groups if g.kind == kind][:3]
        kinds = "/".join(sorted({str(g.kind) for g in other}))
        hint = f" It matches {len(other)} group(s) of the other kind ({kinds})." if other else ""
        return f"error: no {kind} group module matches {pattern!r}.{hint} {kind} modules look like: {examples}"
    rows = [data.group_row(g) for g in hits]
    total = {k: sum(float(g.share(k) or 0.0) for g in hits) for k in ("params", "macs", "latency")}
    return dump(
        {
            "pattern": pattern,
            "kind": kind,
            "matched": len(hits),
            "total_shares": {f"{k}_share": v for k, v in total.items()},
            "groups": rows[:MAX_LISTED],
            "protected_matches": guarded[:10],
            "note": "a plan regex must not match protected modules" if guarded else "",
        }
    )


def _layer_profile(data: PlanningData, top: int, sort_by: str) -> str:
    if sort_by not in ("latency", "macs", "params"):
        return "error: sort_by must be latency, macs or params"
    top = max(1, min(int(top), MAX_LISTED))
    key = {"latency": "latency_ms", "macs": "macs", "params": "params"}[sort_by]
    rows = sorted(data.layers, key=lambda r: float(getattr(r, key) or 0.0), reverse=True)[:top]
    total_params = float(data.totals.get("params") or 0.0)
    out = [
        {
            "name": row.name,
            "type": row.type,
            "params": row.params,
            "macs": row.macs,
            "latency_ms": row.latency_ms,
            "params_share": (row.params / total_params) if total_params else 0.0,
            "macs_share": row.macs_share,
            "latency_share": row.latency_share,
            "group": data.member_of.get(row.name),
            "protected": data.is_protected(row.name),
        }
        for row in rows
    ]
    return dump({"sort_by": sort_by, "totals": data.totals, "layers": out})


def _estimate_plan(data: PlanningData, plan_json: str) -> str:
    try:
        verdict, notes = data.guard(plan_json)
    except ValueError as exc:
        return f"error: {exc}"
    linear = [r for r in data.layers if r.is_linear()]
    quant = verdict.plan.quantization if verdict.plan else []
    quantized = [r for r in linear if any(q.layer == "all" or re.search(q.layer, r.name) for q in quant)]
    total_params = float(data.totals.get("params") or 0.0)
    return dump(
        {
            "valid": verdict.ok,
            "reasons": verdict.reasons,
            "warnings": verdict.warnings + notes,
            "predicted_reduction_from_pruning": verdict.estimate,
            "group_ratios": verdict.ratios,
            "quantized_linear_layers": len(quantized),
            "quantized_params_share": sum(r.params for r in quantized) / total_params if total_params else 0.0,
        }
    )


def _group_sensitivity(data: PlanningData, group: str) -> str:
    if group == "all":
        rows = sorted((data.group_row(g) for g in data.groups), key=lambda r: float(r["damage"] or 0.0))
        return dump({"sorted_by": "damage (least sensitive first)", "groups": rows[: MAX_LISTED * 2]})
    found = data.by_name.get(group) or next((g for g in data.groups if g.module == group), None)
    if found is None:
        names = [g.name for g in data.groups][:6]
        return f"error: unknown group {group!r}; use a group name such as {names} or 'all'"
    probe = data.sensitivity.get(found.name)
    return dump({**data.group_row(found), "probe": probe.model_dump() if probe is not None else {}})


def make_planning_tools(
    profile: PlannerProfile,
    sensitivity: Mapping[str, GroupSensitivity],
    model_info: ModelInfo | None = None,
    evaluate_fn: Evaluate | None = None,
    guard: GuardConfig | None = None,
    propose_fn: Propose | None = None,
) -> list[BaseTool]:
    """Build the planner's tools over one profile and probe result.

    Args:
        profile: The profile (groups with their cost shares, protected modules, layer rows, totals).
        sensitivity: The probe's record per group name (a group without one shows damage None).
        model_info: Optional facts about the model (ref, family) shown by `model_overview`.
        evaluate_fn: Optional callable applying a plan to a copy of the model and returning its trial; adds the
            `evaluate_plan` tool.
        guard: The bounds the planner's guard applies (the `check_plan` tool uses the same).
        propose_fn: Optional callable (goal, emphasis) -> the deterministic planner's plan at that goal with its
            predicted reduction; adds the `propose_plan` tool.

    Returns:
        The tools; their functions never raise, they return "error: ..." strings the LLM can act on.
    """
    data = PlanningData(profile, sensitivity, model_info)
    if guard is not None:
        data.guard_config = guard

    match_layers = _match_tool(data)

    @tool(parse_docstring=True)
    def layer_profile(top: int = 15, sort_by: Literal["latency", "macs", "params"] = "latency") -> str:
        """Show the most expensive layers of the profiled model, with their group and protection status.

        Args:
            top: How many layers to list (1 to 40).
            sort_by: Rank by "latency" (module self time), "macs" or "params".
        """
        return _layer_profile(data, top, sort_by)

    @tool(parse_docstring=True)
    def estimate_plan(plan_json: str) -> str:
        """Check a candidate plan without applying it: guard verdict and predicted params/MACs/latency reduction.

        Args:
            plan_json: The plan as a JSON object with "pruning", "quantization" and "rationale".
        """
        return _estimate_plan(data, plan_json)

    @tool(parse_docstring=True)
    def group_sensitivity(group: str) -> str:
        """Show a group's probe result (damage, kl, agreement, acc_drop when pruned alone) and cost shares.

        Args:
            group: A group name such as "layers.3.mlp", its module name, or "all" for every group by damage.
        """
        return _group_sensitivity(data, group)

    @tool
    def model_overview() -> str:
        """Summarize the model: totals, family, number of prunable groups per kind and protected modules."""
        kinds: dict[str, int] = {}
        for group in data.groups:
            kinds[group.kind] = kinds.get(group.kind, 0) + 1
        return dump(
            {
                "model": data.model_info,
                "totals": data.totals,
                "groups_per_kind": kinds,
                "protected": data.protected[:30],
            }
        )

    tools: list[BaseTool] = [match_layers, layer_profile, estimate_plan, group_sensitivity, model_overview]
    if data.guard_config.tokens is not None:
        tools.append(_token_tool(data.guard_config.tokens))
    if propose_fn is not None:
        tools.insert(0, _propose_tool(propose_fn))
    if evaluate_fn is not None:
        tools.append(_evaluate_tool(data, evaluate_fn))
    return tools


def _match_tool(data: PlanningData) -> BaseTool:
    """Build match_layers; its "kind" offers "block" only when the profile has block groups (depth pruning on)."""
    if not any(g.kind == "block" for g in data.groups):

        @tool(parse_docstring=True)
        def match_layers(pattern: str, kind: Literal["structured", "head"]) -> str:
            """List the prunable groups whose module name a plan regex would select (re.search), with their costs.

            Args:
                pattern: The regex exactly as it would appear in a pruning entry's "layer".
                kind: The pruning entry's "type": "structured" (channels) or "head" (attention heads).
            """
            return _match_layers(data, pattern, kind)

        return match_layers

    @tool("match_layers", parse_docstring=True)
    def match_layers_or_blocks(pattern: str, kind: Literal["structured", "head", "block"]) -> str:
        """List the prunable groups whose module name a plan regex would select (re.search), with their costs.

        Args:
            pattern: The regex exactly as it would appear in a pruning entry's "layer".
            kind: The pruning entry's "type": "structured" (channels), "head" (attention heads) or "block" (whole
                blocks at ratio 1.0, which removes them or replaces a ResNet stage's first block by its shortcut).
        """  # no colon on a continuation line: langchain-core 1.4.7 reads such a line as a new argument
        return _match_layers(data, pattern, kind)

    return match_layers_or_blocks


PROPOSAL_NOTE = (
    "A starting point from the deterministic planner: answer with it as is, edit it (groups, ratios, quantization) "
    "or write your own plan. The run records which."
)


def _propose_tool(propose_fn: Propose) -> BaseTool:
    @tool(parse_docstring=True)
    def propose_plan(goal: float, emphasis: Literal["balanced", "cost", "sensitivity"] = "balanced") -> str:
        """Get the deterministic planner's plan that is predicted to reach a goal, as a starting point to edit.

        Args:
            goal: Fraction of the objective's target to remove, e.g. 0.4 (40 is read as 40%).
            emphasis: "balanced" (cost share / damage), "cost" (prune the costliest groups harder) or
                "sensitivity" (spare the groups the probe found sensitive).
        """
        try:
            value = float(goal)
        except (TypeError, ValueError):
            return "error: goal must be a number such as 0.4"
        value = value / 100 if 1 < value <= 100 else value
        if not 0 < value < 1:
            return f"error: goal {goal!r} must be a fraction in (0, 1), e.g. 0.4"
        if emphasis not in ("balanced", "cost", "sensitivity"):
            return "error: emphasis must be balanced, cost or sensitivity"
        try:
            return dump({**propose_fn(value, emphasis).wire(), "note": PROPOSAL_NOTE})
        except Exception as exc:  # noqa: BLE001 - a failure is an answer, not a crash
            return f"error: no proposal: {type(exc).__name__}: {str(exc)[:200]}"

    return propose_plan


def _evaluate_tool(data: PlanningData, evaluate_fn: Evaluate) -> BaseTool:
    @tool(parse_docstring=True)
    def evaluate_plan(plan_json: str) -> str:
        """Apply a plan to a copy of the model and measure it (slow: use it once on your best candidate).

        Args:
            plan_json: The plan as a JSON object with "pruning", "quantization" and "rationale".
        """
        try:
            verdict, _ = data.guard(plan_json)
        except ValueError as exc:
            return f"error: {exc}"
        if not verdict.ok or verdict.plan is None:
            return dump({"valid": False, "reasons": verdict.reasons})
        try:
            return dump({"valid": True, "measured": evaluate_fn(verdict.plan).for_llm()})
        except Exception as exc:  # noqa: BLE001 - an evaluation failure is an answer, not a crash
            return f"error: evaluation failed: {type(exc).__name__}: {str(exc)[:300]}"

    return evaluate_plan


def _token_tool(axis: TokenAxis) -> BaseTool:
    @tool(parse_docstring=True)
    def token_table() -> str:
        """Show token merging's measured latency and damage: the delivered form's latency at each rate and schedule.

        A "tokens" entry ({"type": "tokens", "rate": r}) merges r tokens after every layer's attention (capped per
        layer); {"type": "tokens", "schedule": [...]} merges a measured front-loaded schedule (r per layer); merging
        and pruning compose (their latency savings multiply). Rows marked dropped do not pay.
        """
        return dump(
            {
                "form": axis.form,
                "batch": axis.batch,
                "unmerged_ms": axis.base_ms,
                "trial_images": axis.images,
                "rates": [
                    {k: v for k, v in r.model_dump().items() if v is not None and (k != "schedule" or r.rate is None)}
                    for r in axis.rates
                ],
            }
        )

    return token_table
