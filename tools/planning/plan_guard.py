"""Guard for untrusted (LLM-proposed) compression plans: schema, regex safety, targets and bounds."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from profiling_agent.prompts.plan_example import example_copy_reasons
from profiling_agent.state import MAX_REGEX_LEN, CompressionPlan, GroupRow, PlannerProfile, TokenAxis
from profiling_agent.tools.compression.depth import block_limits, limit_key
from profiling_agent.tools.planning.ratio_solver import (
    RatioCaps,
    effective_ratio,
    estimate_key,
    estimate_reduction,
    ratio_cap,
    removed_blocks,
)
from profiling_agent.tools.planning.regex_safety import regex_problem, slow_patterns
from profiling_agent.tools.planning.token_guard import token_reasons
from profiling_agent.tools.planning.token_plan import to_total

WIDTH_KINDS = ("structured", "head")  # the kinds that thin a group (a block goes whole)


@dataclass
class GuardConfig(RatioCaps):
    """Bounds an LLM plan must respect before it is applied (its ratio caps: `RatioCaps`, shared with the planner)."""

    min_ratio: float = 0.01  # smaller ratios remove nothing worth a pruning pass
    max_predicted_param_reduction: float = 0.9  # estimated from group sizes and cost shares
    max_regex_len: int = MAX_REGEX_LEN  # characters per layer regex
    max_entries: int = 256  # pruning plus quantization entries
    allowed_dtypes: tuple[str, ...] = ("qint8", "float16")  # dynamic quantization weight dtypes
    match_time_budget: float = 1.0  # seconds for all regex searches in a child process; 0 skips that check
    target: str | None = None  # the objective's target: with params or macs a plan must prune something
    target_reduction: float = 0.0  # the objective's reduction of `target` (for the refusal's message)
    min_share_of_target: float = 0.0  # a params/macs plan predicted below this share of the target is sent back
    refuse_example: bool = False  # refuse the prompt's format example (LLM plans; a human never saw it)
    tokens: TokenAxis | None = None  # the run's measured token axis: a plan's "tokens" entry is checked against it


@dataclass
class GuardVerdict:
    """The guard's decision on one plan.

    Attributes:
        ok: True when the plan may be applied.
        plan: The validated plan when `ok`, else None.
        reasons: Why the plan was rejected, one short sentence each (sent back to the LLM).
        warnings: Non-fatal remarks (e.g. a ratio too small to remove one unit).
        ratios: Requested ratio per targeted group (later entries override earlier ones).
        estimate: Predicted fractional reduction of params, macs and latency from pruning; with a token entry, the
            latency composes merging's predicted saving (`tokens`, `token_guard.predicted_saving`).
    """

    ok: bool
    plan: CompressionPlan | None
    reasons: list[str]
    warnings: list[str] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)
    estimate: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return the verdict without the plan as JSON-ready data (for transcripts)."""
        return {
            "ok": self.ok,
            "reasons": list(self.reasons),
            "warnings": list(self.warnings),
            "ratios": dict(self.ratios),
            "estimate": dict(self.estimate),
        }


# ---------------------------------------------------------------- plan checks


def _schema_reasons(
    error: ValidationError, explained: dict[int, str] | None = None, kinds: tuple[str, ...] = ()
) -> list[str]:
    """Return one reason per schema error (at most 12), located like "pruning.0.ratio".

    A pruning entry in `explained` gets that reason instead of its schema errors; an unknown pruning type is told
    `kinds` (this model's: "block" only when it has block groups) rather than every type the schema knows.
    """
    explained = explained or {}
    reasons = list(explained.values())
    for item in error.errors():
        loc, msg = item["loc"], item["msg"]
        if len(loc) > 1 and loc[0] == "pruning" and loc[1] in explained:
            continue
        if kinds and item["type"] == "literal_error" and len(loc) == 3 and (loc[0], loc[2]) == ("pruning", "type"):
            msg = f"Input should be {_choices(kinds)}"
        where = ".".join(str(part) for part in loc) or "plan"
        value = json.dumps(item.get("input"), default=str)[:60] if "input" in item else ""
        reasons.append(f"{where}: {msg}" + (f" (got {value})" if value else ""))
    return reasons[:12]


def _choices(values: tuple[str, ...]) -> str:
    quoted = [repr(v) for v in values]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def _protected_names(protected: list[str], layer_names: list[str]) -> list[str]:
    inside = [n for n in layer_names if any(n == p or n.startswith(p + ".") for p in protected if p)]
    return list(dict.fromkeys([*protected, *inside]))


def _short(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


class _Checker:
    """One plan's checks, collecting reasons and warnings."""

    def __init__(self, plan: CompressionPlan, profile: PlannerProfile, config: GuardConfig):
        self.plan, self.config = plan, config
        self.rows = profile.rows
        self.layer_names = [r.name for r in profile.layers or []]
        self.linear_names = [r.name for r in profile.layers or [] if r.is_linear()]
        self.has_layers = profile.layers is not None
        self.protected = _protected_names(list(profile.protected), self.layer_names)
        self.reasons: list[str] = []
        self.warnings: list[str] = []
        self.compiled: dict[str, re.Pattern[str]] = {}
        self.moot: list[int] = []  # pruning entries that only target groups inside removed blocks

    def _label(self, section: str, i: int, layer: str) -> str:
        return f"{section}[{i}] layer {layer!r}"

    def compile_all(self) -> None:
        """Check every regex statically, then time the survivors in a child process."""
        entries = [("pruning", i, e.layer) for i, e in enumerate(self.plan.pruning)]
        entries += [("quantization", i, e.layer) for i, e in enumerate(self.plan.quantization) if e.layer != "all"]
        safe = []
        for section, i, layer in entries:
            problem = regex_problem(layer, self.config.max_regex_len)
            if problem:
                self.reasons.append(f"{self._label(section, i, layer)}: {problem}")
            else:
                safe.append(layer)
        safe = list(dict.fromkeys(safe))
        subjects = list(dict.fromkeys([g.module for g in self.rows] + self.protected + self.layer_names))
        slow = slow_patterns(safe, subjects, self.config.match_time_budget)
        if slow is None:
            self.warnings.append("regex timing check skipped (no child process)")
            slow = []
        for layer in slow:
            self.reasons.append(
                f"layer {layer!r}: searching module names took longer than "
                f"{self.config.match_time_budget:g} s (catastrophic backtracking); simplify it"
            )
        self.compiled = {layer: re.compile(layer) for layer in safe if layer not in slow}

    def check_pruning(self) -> dict[str, float]:
        """Check ratios, targets, protection and depth; return the requested ratio per targeted group.

        Width groups inside a removed block are moot: they are left out of the ratios, and an entry that only
        targets such groups is listed in `moot` (the plan drops it).
        """
        ratios: dict[str, float] = {}
        matched: list[tuple[int, str, list[GroupRow]]] = []  # (entry index, label, groups it targets)
        for i, entry in enumerate(self.plan.pruning):
            label = self._label("pruning", i, entry.layer)
            cap = ratio_cap(entry.type, self.config)
            if entry.type == "block" and entry.ratio != 1.0:
                self.reasons.append(f"{label}: a block entry removes the whole block: its ratio must be 1.0")
            elif entry.ratio < self.config.min_ratio:
                self.reasons.append(f"{label}: ratio {entry.ratio:g} is below the minimum {self.config.min_ratio:g}")
            if entry.ratio > cap:
                self.reasons.append(f"{label}: ratio {entry.ratio:g} exceeds the {entry.type} cap {cap:g}")
            pattern = self.compiled.get(entry.layer)
            if pattern is None:
                continue
            hits = [g for g in self.rows if g.kind == entry.type and pattern.search(g.module)]
            guarded = [name for name in self.protected if pattern.search(name)]
            if guarded:
                self.reasons.append(
                    f"{label}: matches protected module(s) {_short(guarded)}; anchor it to group "
                    f"modules only, e.g. '^{re.escape(self._example(entry.type))}$'"
                )
            if not hits:
                self.reasons.append(self._no_match(label, entry.type, pattern))
                continue
            if all(effective_ratio(g.units, g.min_units, entry.ratio) <= 0 for g in hits):
                self.warnings.append(
                    f"{label}: ratio {entry.ratio:g} removes no unit from {_short([g.name for g in hits])}"
                )
            for group in hits:
                ratios[group.name] = entry.ratio
            matched.append((i, label, hits))
        gone = removed_blocks(ratios, self.rows)
        self.check_depth(gone, matched)
        self.moot = self._moot(gone, matched)
        return {
            g.name: ratios[g.name] for g in self.rows if g.name in ratios and (g.kind == "block" or g.block not in gone)
        }

    def check_depth(self, gone: set[str], matched: list[tuple[int, str, list[GroupRow]]]) -> None:
        """Refuse removing every block of a stack, or more than `max_block_fraction` of them (block groups count)."""
        stacks: dict[str, list[str]] = {}
        for group in self.rows:
            if group.kind == "block":
                stacks.setdefault(limit_key(group), []).append(group.module)
        fraction = self.config.max_block_fraction
        limits = block_limits(self.rows, fraction)
        for stack, blocks in stacks.items():
            removed = [b for b in blocks if b in gone]
            allowed = limits[stack]
            if len(removed) <= allowed:
                continue
            labels = [label for _, label, hits in matched if any(g.module in removed for g in hits)]
            what = (
                f"removes every removable block of {stack} ({len(blocks)})"
                if len(removed) == len(blocks)
                else f"removes {len(removed)} of the {len(blocks)} removable blocks of {stack}"
            )
            self.reasons.append(
                f"{_short(labels, 2)}: {what}; at most {allowed} may go ({fraction:.0%} of a stack, at least one "
                "kept): remove fewer blocks"
            )

    def _moot(self, gone: set[str], matched: list[tuple[int, str, list[GroupRow]]]) -> list[int]:
        """Return the width entries whose every group lies inside a removed block, with a warning for each."""
        moot = []
        for i, label, hits in matched:
            inside = [g for g in hits if g.kind != "block" and g.block in gone]
            if not inside:
                continue
            names = _short([g.name for g in inside])
            if len(inside) == len(hits):
                moot.append(i)
                self.warnings.append(f"{label}: dropped as moot: {names} lie inside removed blocks")
            else:
                self.warnings.append(f"{label}: {names} lie inside removed blocks: moot, not counted")
        return moot

    def _example(self, kind: str) -> str:
        return next((g.module for g in self.rows if g.kind == kind), "module.name")

    def _no_match(self, label: str, kind: str, pattern: re.Pattern[str]) -> str:
        other = [g for g in self.rows if g.kind != kind and pattern.search(g.module)]
        if other:
            other_kind = other[0].kind
            return (
                f"{label}: matches no {kind} group, only {_short([g.name for g in other], 2)} (a {other_kind} "
                f"group): use type {other_kind!r} for it, or change the regex"
            )
        examples = [g.module for g in self.rows if g.kind == kind][:2]
        if not examples:
            return f"{label}: this model has no {kind} groups"
        return f"{label}: matches no {kind} group module; {kind} modules look like {_short(examples, 2)}"

    def check_quantization(self) -> None:
        """Check dtypes and that each regex selects at least one Linear layer."""
        for i, entry in enumerate(self.plan.quantization):
            label = self._label("quantization", i, entry.layer)
            if entry.dtype not in self.config.allowed_dtypes:
                self.reasons.append(
                    f"{label}: dtype {entry.dtype!r} is not allowed ({', '.join(self.config.allowed_dtypes)})"
                )
            pattern = self.compiled.get(entry.layer)
            if entry.layer == "all" or pattern is None or not self.has_layers:
                continue
            if not any(pattern.search(name) for name in self.linear_names):
                self.reasons.append(
                    f"{label}: matches no nn.Linear layer (dynamic quantization only touches "
                    f"Linear layers, e.g. {_short(self.linear_names, 2) or 'none in this model'})"
                )

    def check_size(self, ratios: dict[str, float]) -> dict[str, float]:
        """Bound the predicted parameter reduction; return the predicted reductions."""
        estimate = {key: round(estimate_reduction(ratios, self.rows, key), 4) for key in ("params", "macs", "latency")}
        limit = self.config.max_predicted_param_reduction
        if estimate["params"] > limit:
            self.reasons.append(
                f"the plan would remove about {estimate['params']:.0%} of the parameters "
                f"(at most {limit:.0%}); lower the ratios"
            )
        if not self.plan.pruning and not self.plan.quantization and self.plan.tokens is None:
            self.reasons.append("the plan is empty: add pruning or quantization entries")
        return estimate


def _expand_group_entry(
    entry: dict[str, Any], i: int, rows: Sequence[GroupRow], notes: list[str]
) -> tuple[list[Any], list[str]]:
    """Turn one `{"groups": [names], "type", "ratio"}` entry into one anchored-module entry per group.

    A group named exactly has one kind, so a channel entry naming a head group (or a head entry naming a channel
    group) takes the group's kind, with a note in `notes`; a block entry or a block group keeps the refusal (a
    block goes whole, a channel or head ratio never does).
    """
    label = f"pruning[{i}]"
    if "layer" in entry:
        return [entry], [f"{label}: give either 'layer' (a regex) or 'groups' (exact group names), not both"]
    names = entry["groups"]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        return [], [f"{label}: 'groups' must be a non-empty list of group names from the profile"]
    by_name = {g.name: g for g in rows} | {g.module: g for g in rows}
    kind = entry.get("type")
    rest = {k: v for k, v in entry.items() if k != "groups"}
    reasons, out, retyped = [], [], []
    for name in names[:256]:
        group = by_name.get(name)
        if group is None:
            reasons.append(f"{label}: unknown group {name[:80]!r}; {_closest_groups(name, rows)}")
        elif kind in WIDTH_KINDS and group.kind in WIDTH_KINDS and group.kind != kind:
            retyped.append(name)
            out.append({**rest, "type": group.kind, "layer": f"^{re.escape(group.module)}$"})
        elif kind in ("structured", "head", "block") and group.kind != kind:
            reasons.append(f"{label}: group {name!r} is a {group.kind} group: use type {group.kind!r} for it")
        else:
            out.append({**rest, "layer": f"^{re.escape(group.module)}$"})
    if retyped:
        notes.append(f"{label}: type {kind!r} does not fit {_short(retyped, 2)}: each takes its group's own type")
    return out, reasons


def _closest_groups(name: str, rows: Sequence[GroupRow]) -> str:
    """Say which group names an unknown one most resembles (difflib), or what group names look like."""
    names = [g.name for g in rows]
    close = difflib.get_close_matches(name, names, n=2, cutoff=0.6)
    if not close and "." in name:  # a module path around a group's name ('resnet.encoder.stages.2...conv1')
        close = difflib.get_close_matches(name, [g.module for g in rows], n=2, cutoff=0.6)
        close = [g.name for g in rows if g.module in close]
    if close:
        return f"did you mean {' or '.join(repr(c) for c in close)}?"
    return f"group names look like {_short(names, 2)}"


def expand_groups(
    plan: dict[str, Any], rows: Sequence[GroupRow], notes: list[str] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """Replace pruning entries that name exact groups with one regex entry per group (same type and ratio).

    A width entry (channels or heads) naming a group of the other width kind takes the group's kind; each such
    repair is said in `notes`.

    Returns:
        (the plan with only `layer` entries, reasons to refuse it: unknown names, a type that does not fit).
    """
    entries = plan.get("pruning")
    if not isinstance(entries, list) or not any(isinstance(e, dict) and "groups" in e for e in entries):
        return plan, []
    out: list[Any] = []
    reasons: list[str] = []
    for i, entry in enumerate(entries):
        if isinstance(entry, dict) and "groups" in entry:
            expanded, why = _expand_group_entry(entry, i, rows, notes if notes is not None else [])
            out += expanded
            reasons += why
        else:
            out.append(entry)
    return {**plan, "pruning": out}, reasons


def _ratio_reasons(plan: dict[str, Any], depth: bool, config: GuardConfig) -> dict[int, str]:
    """Explain, per pruning entry, a ratio its type can never take (the schema's own message reads worse).

    A block entry removes the whole block, so its ratio is exactly 1.0; a channel or head entry stays below 1.0
    (the hint about "block" is given only with `depth`: the model has block groups).
    """
    entries = plan.get("pruning")
    out: dict[int, str] = {}
    for i, entry in enumerate(entries if isinstance(entries, list) else []):
        ratio = entry.get("ratio") if isinstance(entry, dict) else None
        if not isinstance(ratio, (int, float)) or isinstance(ratio, bool):
            continue
        kind, layer = entry.get("type"), entry.get("layer")
        named = f" (layer {layer!r})" if isinstance(layer, str) else ""
        if kind == "block" and ratio != 1.0:
            out[i] = (
                f"pruning.{i}.ratio: a block entry{named} removes the whole block, so its ratio must be 1.0, not "
                f"{ratio:g}; to thin a block instead, use type 'structured' or 'head' on its groups"
            )
        elif kind in ("structured", "head") and ratio >= 1.0:
            hint = "; type 'block' removes a whole block" if depth else ""
            out[i] = (
                f"pruning.{i}.ratio: a {kind} entry's ratio{named} must be less than 1, got {ratio:g} (the {kind} cap "
                f"is {ratio_cap(str(kind), config):g}){hint}"
            )
    return out


def _needs_pruning(plan: CompressionPlan, target: str | None, target_reduction: float) -> list[str]:
    if plan.pruning or target not in ("params", "macs"):
        return []
    what = "parameters" if target == "params" else "MACs"
    return [
        f"the plan prunes nothing, but the objective asks for {target_reduction:.0%} fewer {what}, which "
        f"quantization cannot give: add pruning entries"
    ]


def _under_target(estimate: dict[str, float], config: GuardConfig) -> list[str]:
    """Refuse a plan whose predicted reduction is below `min_share_of_target` of the objective's (params, macs)."""
    if config.target not in ("params", "macs") or config.min_share_of_target <= 0 or not estimate:
        return []
    predicted, floor = estimate.get(estimate_key(config.target), 0.0), config.min_share_of_target
    needed = floor * config.target_reduction
    if predicted >= needed:
        return []
    return [
        f"the plan is predicted to remove {predicted:.1%} of the {config.target} (from the groups' cost shares), "
        f"less than {floor:.0%} of the objective's {config.target_reduction:.0%}: raise the ratios or prune more "
        f"groups to predict at least {needed:.0%} (propose_plan(goal={config.target_reduction:g}) returns a plan "
        "that reaches the objective)"
    ]


def _token_estimate(
    plan: CompressionPlan, config: GuardConfig, reasons: list[str], estimate: dict[str, float]
) -> dict[str, float]:
    """Check the plan's token entry (refusals go to `reasons`); return the estimate with merging composed in."""
    why, saved = token_reasons(plan.tokens, config.tokens)
    reasons += why
    if plan.tokens is None or not estimate or why:
        return estimate
    return {**estimate, "latency": to_total(estimate.get("latency", 0.0), saved), "tokens": saved}


def check_plan(
    plan: dict[str, Any] | CompressionPlan,
    profile: PlannerProfile,
    config: GuardConfig | None = None,
) -> GuardVerdict:
    """Validate a plan against the model's profile before anything is applied.

    Args:
        plan: The plan (a dict parsed from LLM output, or a CompressionPlan).
        profile: The prunable groups with their cost shares, the modules that must never be pruned (a regex
            matching them, or a layer inside them, fails) and the layer rows: quantization regexes must match one
            of their Linear layers (without layer rows only the quantization regexes' syntax is checked).
        config: Bounds and the objective's target (a plan without pruning is refused when the target is
            params or macs, which quantization cannot reduce); defaults to GuardConfig().

    Returns:
        A GuardVerdict; `plan` is set only when `ok`.
    """
    config = config or GuardConfig()
    named: list[tuple[str, str]] = [(g.name, g.kind) for g in profile.rows]  # what the format example's check reads
    repaired: list[str] = []  # what was mended on the way (a group's own type), said with the verdict's warnings
    if isinstance(plan, dict):
        n = sum(len(plan.get(k) or []) for k in ("pruning", "quantization") if isinstance(plan.get(k), list))
        if n > config.max_entries:
            return GuardVerdict(False, None, [f"the plan has {n} entries (at most {config.max_entries})"])
        copied = example_copy_reasons(plan, named, {}) if config.refuse_example else []
        if copied:
            return GuardVerdict(False, None, copied)
        plan, reasons = expand_groups(plan, profile.rows, repaired)
        if reasons:
            return GuardVerdict(False, None, reasons)
    try:
        parsed = plan if isinstance(plan, CompressionPlan) else CompressionPlan.model_validate(plan)
    except ValidationError as exc:
        depth = any(g.kind == "block" for g in profile.rows)
        explained = _ratio_reasons(plan, depth, config) if isinstance(plan, dict) else {}
        kinds = ("structured", "head", "block") if depth else ("structured", "head")
        return GuardVerdict(False, None, _schema_reasons(exc, explained, kinds))
    n = len(parsed.pruning) + len(parsed.quantization)
    if n > config.max_entries:
        return GuardVerdict(False, None, [f"the plan has {n} entries (at most {config.max_entries})"])
    checker = _Checker(parsed, profile, config)
    checker.compile_all()
    ratios = checker.check_pruning()
    checker.check_quantization()
    estimate = checker.check_size(ratios)
    estimate = _token_estimate(parsed, config, checker.reasons, estimate)
    if not checker.reasons:
        checker.reasons += _needs_pruning(parsed, config.target, config.target_reduction)
    if not checker.reasons:
        copied = example_copy_reasons({}, named, ratios) if config.refuse_example else []
        checker.reasons += copied + _under_target(estimate, config)
    ok = not checker.reasons
    if ok and checker.moot:  # width entries inside removed blocks do nothing: the applied plan leaves them out
        parsed = parsed.model_copy(
            update={"pruning": [e for i, e in enumerate(parsed.pruning) if i not in checker.moot]}
        )
    warnings = repaired + checker.warnings
    return GuardVerdict(ok, parsed if ok else None, checker.reasons, warnings, ratios, estimate)
