"""Quantization agent: post-training dynamic quantization of the plan's nn.Linear layers."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import artifact_ref, current_candidate, event, load_artifact_model, run_dir
from profiling_agent.state import ArtifactRef, CompressionPlan, Context, State
from profiling_agent.tools import run_layout


def quantize(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Quantize the pruned model as the plan says and save the candidate artifact."""
    from profiling_agent.tools.compression.quantization import quantize_model  # lazy: torch; steps load without it
    from profiling_agent.tools.models.artifacts import save_artifact  # lazy: torch; steps load without it

    it = state.iteration
    current = current_candidate(state)
    plan = state.plan or CompressionPlan()
    loaded = load_artifact_model(state, current.recovered or current.pruned)  # quantize after recovery
    entries = plan.quantization
    try:
        model, quantized = quantize_model(loaded.model, entries)
    except Exception as exc:  # e.g. an unsupported dtype on this backend: the candidate fails, the run goes on
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        current.status, current.error = "failed", f"quantization failed: {reason}"
        return {"current": current.model_dump(), "history": event("quantize", f"candidate failed: {reason}", it)}
    recipe = loaded.recipe
    saved = save_artifact(
        model,
        run_layout.iteration_dir(run_dir(state), it) / "candidate",
        processor=loaded.processor,
        quantized=quantized,
        attrs=recipe.get("attrs"),
        extra={**(recipe.get("extra") or {}), "role": "candidate", "plan": plan.model_dump()},
    )
    current.artifact = ArtifactRef.model_validate(artifact_ref(state, saved))
    current.quantized = sorted(quantized)
    dtypes = sorted(set(quantized.values()))
    message = f"quantized {len(quantized)} Linear layers ({', '.join(dtypes) or 'none'})"
    return {"current": current.model_dump(), "history": event("quantize", message, it)}
