"""The delivered model's speed as a report states it: against the quantization-only form first, then torch FP32."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from profiling_agent.tools.text import as_number


@dataclass(frozen=True)
class DeliveredSpeed:
    """Batch-1 speed ratios of what best/ holds, read from result.json ("delivery", else "best").

    Attributes:
        vs_quant: Its speed over the quantization-only form's (None when that form was not measured).
        quant_name: The quantization-only form (the unpruned model's fastest form within the budget), or None.
        quant_delivered: True when that form itself was delivered (no pruning plan beat it).
        vs_torch: Its speed over the original torch FP32 model's, or None.
        verdict: What pruning added, in words ("" when unknown).
        flagged: True when the timings were taken on a busy machine (a starved CPU or a contended reference).
        timing: The busy-machine facts of that measurement.
        vs_quant_ci: The paired 95% interval of `vs_quant` ({"ratio", "ci", "repeats"}), None when unknown.
        vs_torch_ci: The same for `vs_torch`.
        reason: Why the timings were flagged ("" when they were not).
    """

    vs_quant: float | None
    quant_name: str | None
    quant_delivered: bool
    vs_torch: float | None
    verdict: str
    flagged: bool
    timing: Mapping[str, Any]
    vs_quant_ci: Mapping[str, Any] | None = None
    vs_torch_ci: Mapping[str, Any] | None = None
    reason: str = ""


def delivered_speed(result: Mapping[str, Any]) -> DeliveredSpeed | None:
    """Return the delivered model's speed ratios (the final side-by-side timing's), or None without a best model."""
    best = result.get("best")
    if not best:
        return None
    delivery = result.get("delivery") or {}
    quant = delivery.get("quantization_only") or {}
    vs_torch = as_number(delivery.get("vs_original_torch"))
    return DeliveredSpeed(
        vs_quant=as_number(delivery.get("vs_quantization_only")) if quant else None,
        quant_name=quant.get("name"),
        quant_delivered=bool(delivery) and not delivery.get("pruning_added", True),
        vs_torch=vs_torch if vs_torch is not None else as_number(best.get("speedup")),
        verdict=str(delivery.get("verdict") or ""),
        flagged=bool(delivery.get("timings_flagged")),
        timing=delivery.get("timing") or {},
        vs_quant_ci=delivery.get("vs_quantization_only_ci") if quant else None,
        vs_torch_ci=delivery.get("vs_original_torch_ci") if vs_torch is not None else None,
        reason=str(delivery.get("flag_reason") or ""),
    )


def speed_sentence(speed: DeliveredSpeed, with_flag: bool = True) -> str:
    """Say the delivered model's speed in one sentence, against quantization alone first (no final full stop).

    Each ratio carries its paired 95% interval when the final timing gave one; a ratio over quantization alone
    whose interval holds 1.0 is said to be no measurable difference. With `with_flag`, flagged timings are said at
    its end (report.html shows them apart, as a warning).
    """
    from profiling_agent.tools.evaluation.delivery import (
        interval,
    )  # lazy: torch; tools.reporting.html loads this module without it
    from profiling_agent.tools.evaluation.latency import (
        measurably_different,
    )  # lazy: torch; tools.reporting.html loads this module without it

    torch = (
        f"{speed.vs_torch:.2f}x the original torch FP32 model" + interval(speed.vs_torch_ci)
        if speed.vs_torch is not None
        else ""
    )
    if speed.quant_delivered:
        text = f"the quantization-only form ({speed.quant_name} of the unpruned model) was delivered" + (
            f": {torch}" if torch else ""
        )
    elif speed.vs_quant is not None:
        text = f"{speed.vs_quant:.2f}x the quantization-only form ({speed.quant_name} of the unpruned model)"
        text += interval(speed.vs_quant_ci)
        if measurably_different(speed.vs_quant_ci) is False:
            text += ", no measurable difference"
        text += f" and {torch}" if torch else ""
    else:
        text = torch or "not measured"
    if speed.verdict and not speed.quant_delivered:
        text += f"; {speed.verdict}"
    if with_flag and speed.flagged:
        text += f"; TIMINGS FLAGGED: {timing_flag(speed)}"
    return text


def timing_flag(speed: DeliveredSpeed) -> str:
    """Say why the delivered model's timings are in doubt ('' when they were not flagged)."""
    if not speed.flagged:
        return ""
    return speed.reason or (
        f"measured on a busy machine (wall {speed.timing.get('wall_over_cpu')}x CPU time, "
        f"threshold {speed.timing.get('factor')})"
    )
