"""The final timing leaves out the unpruned forms that cannot be the quantization-only form, and says why."""

from __future__ import annotations

from profiling_agent.state import EvalRecord, Objective, VariantRecord
from profiling_agent.tools.evaluation.final_latency import FORM_SAMPLES, cannot_win, unpruned_contenders

NOISE = [1.0, 1.1, 0.9, 1.05, 0.95, 1.02, 0.98, 1.08, 0.92, 1.0, 1.03, 0.97, 1.01, 0.99, 1.04]  # per-repeat noise


def _base(samples: dict[str, list[float]] | None) -> EvalRecord:
    def form(name: str, backend: str, ms: float) -> VariantRecord:
        return VariantRecord(
            name=name, backend=backend, status="ok", accuracy=90.0, latency_ms=ms, path=f"baseline_forms/{name}"
        )

    forms = [
        VariantRecord(name="torch_fp32", backend="torch", status="ok", accuracy=90.0, latency_ms=9.0, path="baseline"),
        form("ort_fp32", "onnxruntime", 1.2),
        form("ort_dynamic", "onnxruntime", 1.0),
        form("ov_fp32", "openvino", 3.0),
        form("ov_int8", "openvino", 1.1),  # the third fastest, but within 1.5x of the fastest: a round builds it
    ]
    peer = {"name": "ort_dynamic", "path": "baseline_forms/ort_dynamic", "latency_ms": 1.0, "latency_batch_ms": 8.0}
    return EvalRecord(
        name="baseline", accuracy=90.0, agreement=100.0, n_samples=8, latency_ms=9.0, latency_batch_ms=90.0,
        batch_size=16, baseline_latency_ms=9.0, speedup=1.0, memory_bytes=1, size_mb=1.0, params=10, macs=10,
        threads=1, peer=peer, variants=forms, timing={FORM_SAMPLES: samples} if samples is not None else {},
    )  # fmt: skip


def _samples(**ms: float) -> dict[str, list[float]]:
    return {name: [m * n for n in NOISE] for name, m in ms.items()}


def test_a_form_measurably_slower_than_the_peer_is_not_timed_again():
    base = _base(_samples(torch_fp32=9.0, ort_fp32=1.2, ort_dynamic=1.0, ov_fp32=3.0, ov_int8=1.1))
    left_out = cannot_win(base)
    assert set(left_out) == {"ov_fp32"}  # ort_fp32 is the second fastest, ov_int8 within 1.5x: both can win
    assert "cannot win" in left_out["ov_fp32"] and "3.00x the time of ort_dynamic" in left_out["ov_fp32"]
    contenders = unpruned_contenders(base, Objective(max_acc_drop=1.0))
    assert set(contenders) == {"ort_dynamic", "ort_fp32", "ov_int8"}


def test_a_slow_form_within_noise_of_the_peer_stays():
    noisy = _samples(torch_fp32=9.0, ort_fp32=1.2, ort_dynamic=1.0, ov_int8=1.1)
    noisy["ov_fp32"] = [3.0, 0.5, 3.1, 0.6, 2.9, 0.7, 3.2, 0.5, 3.0, 0.6, 2.8, 0.9, 3.0, 0.4, 3.1]  # median 2.8x
    assert cannot_win(_base(noisy)) == {}  # its interval reaches below 1.02x of the peer: it could still tie


def test_without_recorded_samples_every_form_that_kept_the_budget_is_timed():
    base = _base(None)  # a run recorded before the baseline kept its per-repeat samples
    assert cannot_win(base) == {}
    assert set(unpruned_contenders(base, Objective(max_acc_drop=1.0))) == {
        "ort_dynamic",
        "ort_fp32",
        "ov_fp32",
        "ov_int8",
    }
