"""One round's planning problem as every planner reads it: a typed row per prunable group, the objective, the rounds.

The profile (profile.json) holds the groups and their cost shares as JSON, and the probe its results per group;
`PlanningProblem.of` reads the three into one `GroupRow` per group once, at the planning room's door. The
deterministic planner, the LLM planner's proposals and the baselines' shares read the rows, never the JSON.
Neither record is held in the graph's state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from profiling_agent.schemas.base import Strict
from profiling_agent.schemas.inputs import Objective
from profiling_agent.schemas.planning import PastRound
from profiling_agent.schemas.records import GroupSensitivity
from profiling_agent.schemas.settings import PruneType

# the cost shares a row carries, by the key the planners' estimates use (`ratio_solver.estimate_key`)
SHARE_KEYS = ("params", "macs", "latency")


class LatencyCurve(Strict):
    """A group's latency saved in the delivered form at a few pruning ratios (`tools/profiling/latency_model.py`)."""

    ratios: list[float] = Field(description="The ratios measured, ascending.")
    saved_share: list[float] = Field(description="Share of the whole model's latency saved at each ratio.")


class GroupRow(BaseModel):
    """One prunable group as the planners read it: its shape, its cost shares and the probe's damage."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="The group's stable id (`layers.3.mlp`).")
    kind: PruneType = Field(description="structured (channels), head or block.")
    module: str = Field(description="The module a plan entry names (`^module$`).")
    units: int = Field(description="Prunable units now (channels, heads; 1 for a block).")
    unit_size: int = Field(default=1, description="Channels per unit (a head's width; 1 for channels).")
    min_units: int = Field(description="Units that always remain (0 only for a block, removed whole).")
    block: str | None = Field(default=None, description="The enclosing block's module (None: not given).")
    members: list[str] = Field(default_factory=list, description="The modules the group spans (empty: not given).")
    extra: dict[str, Any] = Field(default_factory=dict, description="The adapter's extra facts (a replaced block).")
    params_share: float = Field(default=0.0, description="Share of the model's parameters.")
    macs_share: float = Field(default=0.0, description="Share of the model's MACs.")
    latency_share: float = Field(default=0.0, description="Share of the planned form's latency.")
    latency_curve: LatencyCurve | None = Field(default=None, description="Latency saved by ratio, where measured.")
    damage: float = Field(default=0.0, description="The probe's damage score (0: not probed).")

    def share(self, key: str) -> float:
        """Return the group's `key` share (params, macs or latency)."""
        return {"params": self.params_share, "macs": self.macs_share, "latency": self.latency_share}[key]

    @classmethod
    def of(cls, group: Mapping[str, Any], cost: Mapping[str, Any], damage: float) -> GroupRow:
        """Read a row from the profile's group and cost rows (JSON) and the probe's damage."""
        kind = group["kind"]
        curve = cost.get("latency_curve")
        return cls(
            name=str(group["name"]),
            kind=kind,
            module=str(group["module"]),
            units=int(group["units"]),
            unit_size=int(group.get("unit_size", 1)),
            min_units=int(group.get("min_units", 0 if kind == "block" else 1)),
            block=None if group.get("block") is None else str(group["block"]),
            members=[str(m) for m in group.get("members") or []],
            extra=dict(group.get("extra") or {}),
            **{f"{k}_share": float(cost.get(f"{k}_share", 0.0) or 0.0) for k in SHARE_KEYS},
            latency_curve=LatencyCurve.model_validate(curve) if curve else None,
            damage=damage,
        )


def damage_of(record: GroupSensitivity | Mapping[str, Any] | None) -> float:
    """Return a probe record's damage (a record, or its JSON; 0 when the group was not probed)."""
    if record is None:
        return 0.0
    if isinstance(record, GroupSensitivity):
        return float(record.damage)
    return float(record.get("damage", 0.0))


class PlanningProblem(BaseModel):
    """What every planner of a round reads: the groups it may prune (rows), the objective and earlier rounds."""

    model_config = ConfigDict(frozen=True)

    rows: list[GroupRow] = Field(description="The prunable groups, in the profile's order.")
    objective: Objective = Field(description="The run's objective.")
    history: list[PastRound] = Field(default_factory=list, description="Earlier rounds, oldest first.")

    @classmethod
    def of(
        cls,
        groups: Sequence[Mapping[str, Any]],
        costs: Mapping[str, Mapping[str, Any]],
        sensitivity: Mapping[str, GroupSensitivity | Mapping[str, Any]],
        objective: Objective,
        history: Sequence[PastRound] = (),
    ) -> PlanningProblem:
        """Read the problem from the profile's groups and costs (JSON) and the probe's results per group."""
        return cls(rows=group_rows(groups, costs, sensitivity), objective=objective, history=list(history))

    def names(self) -> list[str]:
        """Return the groups' names, in order."""
        return [r.name for r in self.rows]


def group_rows(
    groups: Sequence[Mapping[str, Any]],
    costs: Mapping[str, Mapping[str, Any]],
    sensitivity: Mapping[str, GroupSensitivity | Mapping[str, Any]],
) -> list[GroupRow]:
    """Return one row per profile group (JSON), with its cost row and the probe's damage, in the groups' order."""
    return [GroupRow.of(g, costs.get(str(g["name"]), {}), damage_of(sensitivity.get(str(g["name"])))) for g in groups]
