"""Typed evaluation records for tests: a full EvalRecord, a VariantRecord, a Candidate from the numbers that matter."""

from __future__ import annotations

from typing import Any

from profiling_agent.state import ArtifactRef, Best, Candidate, EvalRecord, Objective, VariantRecord
from profiling_agent.tools.evaluation.delivery import quantization_only_peer
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


BASE_VARIANTS = [
    form("torch_fp32", accuracy=90.0, latency_ms=10.0, speedup=1.0, size_mb=4.0),
    form("ort_dynamic", accuracy=89.0, latency_ms=4.0, speedup=2.5, size_mb=1.0, path="baseline_forms/ort_dynamic"),
    # 5 pp lost, outside a 2 pp budget
    form("ov_int8", accuracy=85.0, latency_ms=2.0, speedup=5.0, size_mb=1.0, path="baseline_forms/ov_int8"),
    form("ov_bf16", status="skipped", error="no bf16"),
]


def delivery_baseline(objective: Objective):
    base = evaluation(
        name="baseline",
        accuracy=90.0,
        n_samples=100,
        latency_ms=10.0,
        latency_batch_ms=50.0,
        baseline_latency_ms=10.0,
        size_mb=4.0,
        params=1000,
        macs=10,
        variants=BASE_VARIANTS,
    )
    base.peer = quantization_only_peer(BASE_VARIANTS, base, objective)
    return base


def delivery_best(
    objective: Objective, *, accuracy: float, latency: float, peer_latency: float, reduction: float
) -> Best:
    ev = delivery_baseline(objective).model_copy(
        update={
            "name": "iter_01",
            "accuracy": accuracy,
            "latency_ms": latency,
            "speedup": 10.0 / latency,
            "delivered": "ov_int8",
            "variants": [],
            "peer": {"name": "ort_dynamic", "latency_ms": peer_latency},
        }
    )
    drop = 90.0 - accuracy
    artifact = ArtifactRef(path="iter_01/candidate", sha256="-", size_bytes=1, params=600)
    return Best(
        iteration=1,
        status="ok",
        eval=ev,
        rule="budget",
        within_budget=drop <= 2.0,
        reduction=reduction,
        accuracy_drop=drop,
        artifact=artifact,
    )


BASE_REF = ArtifactRef(path="baseline", sha256="-", size_bytes=4000000, params=1000)
