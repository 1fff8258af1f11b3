"""Typed evaluation records for tests: a full EvalRecord, a VariantRecord, a Candidate from the numbers that matter."""

from __future__ import annotations

from typing import Any

from profiling_agent.state import Candidate, EvalRecord, VariantRecord
from profiling_agent.tools.evaluation.variants import backend_of

EVAL_DEFAULTS: dict[str, Any] = {
    "name": "record",
    "accuracy": 90.0,
    "agreement": 100.0,
    "n_samples": 100,
    "latency_ms": 1.0,
    "latency_batch_ms": 1.0,
    "batch_size": 16,
    "baseline_latency_ms": 1.0,
    "speedup": 1.0,
    "memory_bytes": 1,
    "size_mb": 1.0,
    "params": 1000,
    "macs": 1000,
    "threads": 1,
}


def evaluation(**values: Any) -> EvalRecord:
    """An EvalRecord: the defaults above, `values` over them."""
    return EvalRecord.model_validate({**EVAL_DEFAULTS, **values})


def form(name: str, **values: Any) -> VariantRecord:
    """A measured form (status ok unless `values` says), its backend from its name."""
    return VariantRecord.model_validate({"name": name, "backend": backend_of(name), "status": "ok", **values})


def candidate(iteration: int, ev: EvalRecord | None = None, status: str = "ok", **values: Any) -> Candidate:
    """A finished candidate with its evaluation."""
    return Candidate.model_validate({"iteration": iteration, "status": status, "eval": ev, **values})
