"""The quantization part of a deterministic plan: every Linear quantized dynamically, dropped if it slowed a round."""

from __future__ import annotations

from collections.abc import Sequence

from profiling_agent.state import PastRound, QuantEntry, QuantizeChoice
from profiling_agent.tools.evaluation.selection import quantization_slowed, torch_quantized_delivery


def slowed_round(history: Sequence[PastRound]) -> PastRound | None:
    """Return the latest measured round if its quantization made the pruned model slower at batch 1 and batch N.

    A round delivered in another backend's form (ONNX Runtime quantizes the FP32 export itself) says nothing
    against the plan's quantization: torch quantization being slow there is no reason to drop it.
    """
    for h in reversed(history):
        q1, qn = h.quant_speedup, h.quant_speedup_batch
        if q1 is not None and qn is not None:
            if not torch_quantized_delivery(h.delivered):
                return None
            return h if quantization_slowed(q1, qn) else None
    return None


def quant_entries(quantize: QuantizeChoice, history: Sequence[PastRound], target: str) -> tuple[list[QuantEntry], str]:
    """Return the plan's quantization entries and, when a slowed round dropped them, the note saying why."""
    if quantize == "none":
        return [], ""
    slow = slowed_round(history) if target != "size" else None
    if slow:
        note = (
            f"quantization dropped: in round {slow.iteration or '?'} it made the pruned model slower "
            f"({slow.quant_speedup:.2f}x at batch 1, {slow.quant_speedup_batch:.2f}x at batch N, measured "
            "side by side); this model's Linear layers are too small for dynamic quantization to pay off"
        )
        return [], note
    why = (
        "Dynamic quantization of every nn.Linear: weights stored in "
        f"{'int8' if quantize == 'qint8' else 'float16'}, activations quantized on the fly; needs no "
        "calibration data and leaves convolutions untouched."
    )
    return [QuantEntry(layer="all", dtype=quantize, justification=why)], ""
