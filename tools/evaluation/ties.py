"""The fixed order that decides between deployable forms whose speeds are within noise of each other."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from profiling_agent.state import VariantRecord
from profiling_agent.tools.evaluation.latency import paired_ratio

LATENCY_TIE = 0.02  # forms not measurably more than 2% slower than the fastest count as equally fast
# ... "measurably" at this coverage of the paired interval: two equally fast forms timed 10 times with +-20% noise a
# sample are judged apart in 1-1.5% of timings at 99% (3% at 95%), a 20% slower one is told apart in half of
# them (with +-5% noise: 0% and all of them; `bench/ties.py`)
TIE_LEVEL = 0.99

# the simpler runtime first: torch runs the model itself, ONNX Runtime adds an exported graph, OpenVINO converts that
RUNTIMES = {"torch": 0, "onnxruntime": 1, "openvino": 2}
# ... and, within a runtime, the simpler precision: FP32 as trained; a 16-bit cast; int8 weights whose activations
# are scaled at each call (dynamic); int8 calibrated on images (static QDQ, NNCF's INT8)
PRECISIONS = {"fp32": 0, "float16": 1, "bf16": 1, "qint8": 2, "dynamic": 2, "static": 3, "int8": 3}

Samples = Mapping[str, Sequence[float | None]]  # form name -> its batch-1 sample of every interleaved repeat, ms


@dataclass(frozen=True)
class Fastest:
    """What `fastest_form` chose, and whether the fixed order (not the clock) decided.

    Attributes:
        chosen: The form chosen.
        timed_fastest: The form with the lowest median batch-1 latency.
        tied: The forms within noise of `timed_fastest` (itself included), in the fixed order; one name: no tie.
        how: How the ties were judged: "paired" (interleaved repeats), "overlap" (1-2 shared repeats: samples within
            LATENCY_TIE) or "band" (medians within LATENCY_TIE).
    """

    chosen: VariantRecord
    timed_fastest: str
    tied: tuple[str, ...]
    how: str

    @property
    def tie_decided(self) -> bool:
        """Return True when forms within noise of each other were ranked by the fixed order."""
        return len(self.tied) > 1

    def note(self) -> str:
        """Say that a tie decided and how ("" when the clock did)."""
        if not self.tie_decided:
            return ""
        noise = {
            "paired": "their paired 99% intervals reach within 2% of the fastest",
            "overlap": "too few repeats for a paired interval; their samples overlap within 2%",
        }.get(self.how, "their medians within 2%")
        return (
            f"a tie decided: {', '.join(self.tied)} ran within noise of each other ({noise}), so the fixed order "
            f"(validation accuracy, then the simpler runtime, then the name) chose {self.chosen.name}"
        )


def simplicity(name: str, backend: str) -> tuple[int, int]:
    """Return the (runtime, precision) rank of a form, lower is simpler (RUNTIMES, PRECISIONS; unknown: last)."""
    suffix = name.split("_", 1)[1] if "_" in name else name
    return RUNTIMES.get(backend, len(RUNTIMES)), PRECISIONS.get(suffix, max(PRECISIONS.values()) + 1)


def tie_order(form: VariantRecord) -> tuple[float, int, int, str]:
    """Return the fixed order's key: the more accurate on validation first, then the simpler runtime, then the name."""
    return (-float(form.accuracy or 0.0), *simplicity(form.name, form.backend), form.name)


def speed_tied(form: VariantRecord, fastest: VariantRecord, samples: Samples | None) -> tuple[bool, str]:
    """Return whether `form` is within noise of `fastest`, and how that was judged ("paired" or "band").

    Paired (both timed in the same interleaved repeats, at least 3 shared): `form` is tied unless the TIE_LEVEL (99%)
    interval of the median of its per-repeat time over the fastest's (`latency.paired_ratio`) lies wholly above
    1 + LATENCY_TIE, i.e. unless it is measurably more than 2% slower. With 1 or 2 shared repeats (too few for that
    interval, `--repeats 2`): tied when its fastest sample is within LATENCY_TIE of the fastest form's slowest one,
    i.e. unless every sample says it is slower ("overlap"; two same-seed runs of a saved ResNet split between
    ort_fp32 and ort_dynamic under the median band alone). Else (no samples): its median within LATENCY_TIE of the
    fastest's.
    """
    mine, theirs = (samples or {}).get(form.name), (samples or {}).get(fastest.name)
    paired = paired_ratio({"samples_ms": mine}, {"samples_ms": theirs}, level=TIE_LEVEL) if mine and theirs else None
    if paired is not None:
        return float(paired["ci"][0]) <= 1.0 + LATENCY_TIE, "paired"
    shared = [(a, b) for a, b in zip(mine or [], theirs or [], strict=False) if a and b and a > 0 and b > 0]
    if shared:
        return min(a for a, _ in shared) <= max(b for _, b in shared) * (1.0 + LATENCY_TIE), "overlap"
    return float(form.latency_ms or 0.0) <= float(fastest.latency_ms or 0.0) * (1.0 + LATENCY_TIE), "band"


def fastest_form(forms: Sequence[VariantRecord], samples: Samples | None = None) -> Fastest:
    """Return the fastest of `forms` at batch 1, ties resolved the same way every time.

    The form with the lowest median is timed fastest; every form within noise of it (`speed_tied`) is tied with it,
    and the tied forms are ranked by a fixed order (`tie_order`): validation accuracy, then the simpler runtime
    (torch < ONNX Runtime < OpenVINO; FP32 < 16-bit < dynamic int8 < static/calibrated int8), then the name. So two
    same-seed runs whose forms' medians swap places within noise deliver the same form; a form clearly faster wins.

    Args:
        forms: Measured forms (at least one; a form's latency_ms is its batch-1 median).
        samples: Form name -> its per-repeat batch-1 samples from one interleaved timing (None: medians only).
    """
    if not forms:
        raise ValueError("fastest_form needs at least one form")
    timed = min(forms, key=lambda f: (float(f.latency_ms or 0.0), tie_order(f)))
    judged = [(f, *speed_tied(f, timed, samples)) for f in forms if f is not timed]
    tied = sorted([timed, *(f for f, is_tied, _ in judged if is_tied)], key=tie_order)
    how = next((h for h in ("paired", "overlap") if any(j == h for _, _, j in judged)), "band")
    return Fastest(chosen=tied[0], timed_fastest=timed.name, tied=tuple(f.name for f in tied), how=how)
