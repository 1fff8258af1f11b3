"""Quantization agent: post-training dynamic quantization of the plan's nn.Linear layers."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import artifact_ref, event, iteration_dir, load_artifact_model
from profiling_agent.state import Context, State


def quantize(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Quantize the pruned model as the plan says and save the candidate artifact."""
    from profiling_agent.tools.compression.quantization import quantize_model
    from profiling_agent.tools.models.artifacts import save_artifact

    it = state.iteration
    current = dict(state.current or {})
    loaded = load_artifact_model(state, current["pruned"])
    entries = state.plan.get("quantization", [])
    try:
        model, quantized = quantize_model(loaded.model, entries)
    except Exception as exc:  # e.g. an unsupported dtype on this backend: the candidate fails, the run goes on
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        current.update({"status": "failed", "error": f"quantization failed: {reason}"})
        return {"current": current, "history": event("quantize", f"candidate failed: {reason}", it)}
    recipe = loaded.recipe
    saved = save_artifact(
        model,
        iteration_dir(state, it) / "candidate",
        processor=loaded.processor,
        quantized=quantized,
        attrs=recipe.get("attrs"),
        extra={**(recipe.get("extra") or {}), "role": "candidate", "plan": state.plan},
    )
    current.update({"artifact": artifact_ref(state, saved), "quantized": sorted(quantized)})
    dtypes = sorted(set(quantized.values()))
    message = f"quantized {len(quantized)} Linear layers ({', '.join(dtypes) or 'none'})"
    return {"current": current, "history": event("quantize", message, it)}
