"""The profile as the plan guard, the LLM planner's tools and a plan's review read it: typed once from its JSON.

profile.json holds the groups, their cost shares, the protected modules, the layer rows and the totals as JSON;
`PlannerProfile.of` reads them into typed rows at the door, and the guard and the tools read the rows. What the
LLM is shown is dumped from the rows again (`tools/planning/llm_tools.py`). Not held in the graph's state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from profiling_agent.schemas.planning_problem import GroupRow, group_rows
from profiling_agent.schemas.records import TokenAxis

Number = int | float  # a count stays an int in what the LLM is shown (12, not 12.0)


class LayerRow(BaseModel):
    """One profile layer row (a module): its type, size, cost and shares; a missing number reads as 0."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(default="", description="The module's name.")
    type: str | None = Field(default=None, description="Its class name (None: not recorded).")
    params: Number = Field(default=0, description="Parameters of the module itself.")
    macs: Number | None = Field(default=0, description="Its MACs (None: the counter failed).")
    latency_ms: Number | None = Field(default=0.0, description="Its self time, ms.")
    macs_share: Number | None = Field(default=0.0, description="Share of the model's MACs.")
    latency_share: Number | None = Field(default=0.0, description="Share of the model's time.")

    def is_linear(self) -> bool:
        """Return True for an nn.Linear (what dynamic quantization touches)."""
        return "Linear" in str(self.type or "")


class PlannerProfile(BaseModel):
    """The groups a plan may prune (rows), the modules it must not touch, the layer rows and the totals."""

    model_config = ConfigDict(frozen=True)

    rows: list[GroupRow] = Field(default_factory=list, description="The prunable groups, in the profile's order.")
    protected: list[str] = Field(default_factory=list, description="Modules no plan may prune.")
    layers: list[LayerRow] | None = Field(
        default=None, description="The layer rows (None: not given; a quantization regex is then checked for syntax)."
    )
    totals: dict[str, Number | None] = Field(default_factory=dict, description="params, macs, latency_ms, ...")
    token_axis: TokenAxis | None = Field(default=None, description="The run's token axis, when it has one.")

    @classmethod
    def of(cls, profile: Mapping[str, Any]) -> PlannerProfile:
        """Read the profile's JSON (groups, group_costs, protected, layers, totals and token_axis where given)."""
        layers, axis = profile.get("layers"), profile.get("token_axis")
        return cls(
            rows=group_rows(profile.get("groups") or [], profile.get("group_costs") or {}, {}),
            protected=list(profile.get("protected") or []),
            layers=None if layers is None else [LayerRow.model_validate(r) for r in layers],
            totals=dict(profile.get("totals") or {}),
            token_axis=TokenAxis.model_validate(axis) if axis else None,
        )

    def with_layers(self) -> PlannerProfile:
        """Return the profile with a layer list (empty when it had none): every quantization regex then must match."""
        return self if self.layers is not None else self.model_copy(update={"layers": []})
