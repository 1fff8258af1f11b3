"""What one planning round reads from the run (RoundInputs), built by the analyze step from the graph's state."""

from __future__ import annotations

from dataclasses import dataclass, field

from profiling_agent.state import Candidate, EvalRecord, Fallback, GroupSensitivity, Objective, TokenAxis


@dataclass(frozen=True)
class RoundInputs:
    """The facts a planning round plans from; the planners never see the whole graph state.

    Attributes:
        objective: The run's objective (target, budget, planner, quantization).
        iteration: The round being planned (one past the run's last iteration).
        candidates: The earlier rounds' candidates, oldest first.
        baseline_eval: The baseline's validation evaluation (None before it is measured).
        sensitivity: The probe's result per group name.
        fallbacks: The LLM planner's earlier fallbacks (shown to it in later rounds).
        run_path: The run folder (the LLM's transcript goes there); "" for none.
        model_ref: The model's hub id or path (shown to the LLM).
        family: The model family adapter in use (vit, resnet, ...).
        token_axis: Token merging's measured latency and damage (ViT, DeiT under a latency target), or None.
    """

    objective: Objective
    iteration: int
    candidates: list[Candidate] = field(default_factory=list)
    baseline_eval: EvalRecord | None = None
    sensitivity: dict[str, GroupSensitivity] = field(default_factory=dict)
    fallbacks: list[Fallback] = field(default_factory=list)
    run_path: str = ""
    model_ref: str = ""
    family: str = ""
    token_axis: TokenAxis | None = None

    def llm_replied(self) -> bool:
        """Return True when an earlier round of this run got at least one reply from the LLM."""
        for cand in self.candidates:
            llm = cand.planner_meta.llm
            if llm is not None and int(llm.usage.get("calls") or 0) > 0:
                return True
        return False
