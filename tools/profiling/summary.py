"""Per-group costs, the compact profile summary planners read, and the per-layer console table."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from profiling_agent.tools.text import human

# ---------------------------------------------------------------- calling the model


# ---------------------------------------------------------------- groups and summaries


def _group_fields(group: Any) -> dict[str, Any]:
    if isinstance(group, Mapping):
        return {
            "name": group["name"],
            "members": tuple(group.get("members", ())),
            "kind": group.get("kind", ""),
            "block": group.get("block", ""),
        }
    return {
        "name": group.name,
        "members": tuple(group.members),
        "kind": getattr(group, "kind", ""),
        "block": getattr(group, "block", ""),
    }


def _matches(row_name: str, members: Iterable[str]) -> bool:
    return any(row_name == m or row_name.startswith(m + ".") for m in members)


def group_costs(profile: Mapping[str, Any], groups: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """Sum params, MACs and latency over each group's members, with shares of the model totals.

    A member names a module; its descendants count too (each layer row at most once per group), so a member
    "vit.layers.0.attention" covers q/k/v/o and the attention matmuls booked on the attention module.

    Args:
        profile: The output of `profile_model`.
        groups: PrunableGroup objects or dicts with "name" and "members" (optionally "kind", "block").

    Returns:
        {group name: {"kind", "block", "params", "macs", "latency_ms", "params_share", "macs_share",
        "latency_share", "missing"}}; `missing` lists members that matched no layer row.
    """
    totals = profile["totals"]
    layers = profile["layers"]
    out: dict[str, dict[str, Any]] = {}
    for group in groups:
        fields = _group_fields(group)
        rows = [row for row in layers if _matches(row["name"], fields["members"])]
        missing = [m for m in fields["members"] if not any(_matches(row["name"], (m,)) for row in rows)]
        params = sum(row["params"] for row in rows)
        macs = sum(row["macs"] for row in rows)
        latency = sum(row["latency_ms"] for row in rows)
        out[fields["name"]] = {
            "kind": fields["kind"],
            "block": fields["block"],
            "params": params,
            "macs": macs,
            "latency_ms": latency,
            "params_share": params / totals["params"] if totals.get("params") else 0.0,
            "macs_share": macs / totals["macs"] if totals.get("macs") else 0.0,
            "latency_share": sum(row["latency_share"] for row in rows),
            "missing": missing,
        }
    return out


def planner_profile(model: Any, input_shape: Any, *, device: str = "cpu", depth: bool = False) -> dict[str, Any]:
    """Profile `model` (see `profile_model`) and add what planners read: groups, their costs, protected modules.

    Returns:
        The profile dict plus "groups" (the family adapter's prunable groups as dicts), "group_costs" (see
        `group_costs`; a head group also owns the attention matmuls booked on its attention module; with `depth`
        the block groups depth pruning may remove come last and own everything under their block), "protected"
        (modules pruning never touches) and "identical_layers" (the classes of identical layers, whose rows' latency
        is pooled: `identical`).
    """
    from profiling_agent.tools.compression.families import (
        adapter_for,
        planning_groups,
    )  # lazy: torch and transformers; the CLI's flag check runs without it
    from profiling_agent.tools.profiling.dynamic import (
        profile_model,
    )  # lazy: torch; the CLI's flag check runs without it
    from profiling_agent.tools.profiling.identical import (
        identical_layers,
        pool_layer_rows,
    )  # lazy: torch; the CLI's flag check runs without it

    full = profile_model(model, input_shape, device=device)
    full["identical_layers"] = identical_layers(model)
    pool_layer_rows(full["layers"], full["identical_layers"], ("latency_ms", "latency_share"))
    adapter = adapter_for(model)
    groups = [dataclasses.asdict(g) for g in planning_groups(model, depth)]
    owned = [{**g, "members": (*g["members"], g["module"])} if g["kind"] == "head" else g for g in groups]
    full["groups"] = groups
    full["group_costs"] = group_costs(full, owned)
    full["protected"] = adapter.protected_modules(model)
    return full


def _round(value: float, digits: int = 3) -> float:
    return float(f"{value:.{digits}g}") if value else 0.0


def summarize_profile(
    profile: Mapping[str, Any], groups: Iterable[Any] | None = None, top_k: int = 8
) -> dict[str, Any]:
    """Condense a profile into a small JSON dict for an LLM prompt and the graph state.

    Returns:
        {"totals", "env", "top_latency": [{"name", "type", "latency_ms", "latency_share", "macs_share"}],
        "top_macs": [{"name", "macs", "macs_share"}], "operators": [{"op", "self_ms", "share"}],
        "groups": {"columns": [...], "rows": {name: [params_share, macs_share, latency_share]}}}. Shares are
        fractions; latencies are module self times in ms; three significant digits.
    """
    totals, env, layers = profile["totals"], profile["env"], profile["layers"]
    by_latency = sorted(layers, key=lambda row: row["latency_ms"], reverse=True)[:top_k]
    by_macs = sorted((row for row in layers if row["macs"]), key=lambda row: row["macs"], reverse=True)[:top_k]
    summary: dict[str, Any] = {
        "totals": {
            "params": totals["params"],
            "macs": totals["macs"],
            "latency_ms": _round(totals["latency_ms"]),
            "act_bytes": totals["act_bytes"],
        },
        "env": {k: env[k] for k in ("device", "threads", "input_shape", "batch")},
        "top_latency": [
            {
                "name": r["name"],
                "type": r["type"],
                "latency_ms": _round(r["latency_ms"]),
                "latency_share": _round(r["latency_share"]),
                "macs_share": _round(r["macs_share"]),
            }
            for r in by_latency
        ],
        "top_macs": [{"name": r["name"], "macs": r["macs"], "macs_share": _round(r["macs_share"])} for r in by_macs],
        "operators": [
            {
                "op": r["op"],
                "self_ms": _round(r.get("self_cuda_ms", r["self_cpu_ms"])),
                "share": _round(r["self_share"]),
            }
            for r in profile.get("operators", [])[:top_k]
        ],
    }
    if groups is not None:
        costs = group_costs(profile, groups)
        summary["groups"] = {
            "columns": ["params_share", "macs_share", "latency_share"],
            "rows": {
                name: [_round(c["params_share"]), _round(c["macs_share"]), _round(c["latency_share"])]
                for name, c in costs.items()
            },
        }
    backend = profile.get("backend_profile")
    if backend:
        summary["backend"] = backend_summary(backend)
        planned = backend.get("planned_on", "torch")
        shares = (backend.get("forms", {}).get(planned) or {}).get("group_latency_share")
        if planned != "torch" and shares and "groups" in summary:
            summary["groups"]["columns"].append(f"{planned}_latency_share")
            for name, row in summary["groups"]["rows"].items():
                row.append(_round(float(shares.get(name, 0.0))))
    if "error" in profile:
        summary["error"] = profile["error"]
    return summary


def backend_summary(backend: Mapping[str, Any]) -> dict[str, Any]:
    """Condense profile.json's `backend_profile` into the state's BackendSummary fields."""
    forms = backend.get("forms", {})
    table = backend.get("latency_table")
    return {
        "planned_on": backend.get("planned_on", "torch"),
        "forms_ms": {name: float(row["total_ms"]) for name, row in forms.items() if "total_ms" in row},
        "failed": {name: str(row["error"]) for name, row in forms.items() if "error" in row},
        "latency_table": table.get("form") if table else None,
        "notes": [str(n) for n in backend.get("notes") or []],
    }


def format_layer_table(profile: Mapping[str, Any], top: int = 30) -> str:
    """Render the `top` layers by latency as a fixed-width text table, with a totals line."""
    rows = sorted(profile["layers"], key=lambda row: row["latency_ms"], reverse=True)[:top]
    width = max([len("layer"), *(len(row["name"]) for row in rows)])
    width = min(width, 60)
    header = f"{'layer':<{width}}  {'type':<22}  {'params':>9}  {'MACs':>9}  {'ms':>9}  {'lat %':>6}  {'MACs %':>6}"
    lines = [header, "-" * len(header)]
    for row in rows:
        name = row["name"] if len(row["name"]) <= width else "…" + row["name"][-(width - 1) :]
        lines.append(
            f"{name:<{width}}  {row['type'][:22]:<22}  {human(row['params']):>9}  "
            f"{human(row['macs']):>9}  {row['latency_ms']:>9.3f}  {100 * row['latency_share']:>6.1f}  "
            f"{100 * row['macs_share']:>6.1f}"
        )
    totals = profile["totals"]
    lines.append("-" * len(header))
    lines.append(
        f"{'total (forward median, no hooks)':<{width}}  {'':<22}  {human(totals['params']):>9}  "
        f"{human(totals['macs']):>9}  {totals['latency_ms']:>9.3f}"
    )
    return "\n".join(lines)
