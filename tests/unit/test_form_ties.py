"""Ties resolve the same way every time: forms within noise of the fastest are ranked by a fixed order."""

from __future__ import annotations

import random
import statistics

from helpers.eval_records import evaluation, form

from profiling_agent.state import Objective
from profiling_agent.tools.evaluation.delivery import delivery_note, peer_best, quantization_only_peer
from profiling_agent.tools.evaluation.selection import choose_form
from profiling_agent.tools.evaluation.ties import fastest_form, simplicity

BASE = evaluation(name="baseline", accuracy=90.0, latency_ms=10.0)


def _timed(name, accuracy, samples, size_mb=1.0):
    """A form whose batch-1 latency is the median of its interleaved samples."""
    return form(name, accuracy=accuracy, latency_ms=statistics.median(samples), size_mb=size_mb, speedup=1.0)


def _noisy(rng, centre, spread, repeats=10):
    return [round(centre * (1.0 + rng.uniform(-spread, spread)), 6) for _ in range(repeats)]


def test_the_simpler_runtime_and_precision_order():
    names = ["ov_int8", "ort_static", "ov_bf16", "torch_qint8", "ort_dynamic", "ov_fp32", "ort_fp32", "torch_fp32"]
    ranked = sorted(names, key=lambda n: simplicity(n, form(n).backend))
    assert ranked == ["torch_fp32", "torch_qint8", "ort_fp32", "ort_dynamic", "ort_static", "ov_fp32", "ov_bf16",
                      "ov_int8"]  # fmt: skip


def test_overlapping_intervals_deliver_the_same_form_whichever_median_was_lower():
    """Two forms as fast as each other: their medians swap from timing to timing, the delivered form does not."""
    rng = random.Random(0)
    chosen, lower, ties = set(), set(), 0
    for _ in range(40):
        samples = {"ort_dynamic": _noisy(rng, 1.0, 0.2, 15), "ort_fp32": _noisy(rng, 1.0, 0.2, 15)}
        forms = [_timed(n, 89.5, s) for n, s in samples.items()]
        fastest = min(forms, key=lambda f: f.latency_ms or 0.0).name
        lower.add(fastest)
        choice = choose_form(forms, BASE, Objective(max_acc_drop=2.0), samples=samples)
        assert choice is not None and choice.how == "paired" and choice.timed_fastest == fastest
        if choice.tie_decided:  # overlapping: the fixed order, equally accurate -> the simpler precision
            ties += 1
            chosen.add(choice.chosen.name)
        else:  # judged apart (the rule's error rate on +-20% noise, about 1%): the timed fastest
            assert choice.chosen.name == fastest
    assert lower == {"ort_dynamic", "ort_fp32"}  # the clock alone would have delivered either
    assert chosen == {"ort_fp32"} and ties >= 38


def test_a_tie_goes_to_the_more_accurate_form_before_the_simpler_runtime():
    rng = random.Random(1)
    samples = {"ort_fp32": _noisy(rng, 1.0, 0.2), "ov_int8": _noisy(rng, 0.98, 0.2)}
    forms = [_timed("ort_fp32", 89.0, samples["ort_fp32"]), _timed("ov_int8", 89.6, samples["ov_int8"])]
    choice = fastest_form(forms, samples)
    assert choice.chosen.name == "ov_int8" and set(choice.tied) == {"ort_fp32", "ov_int8"}
    note = choice.note()
    assert note.startswith("a tie decided: ov_int8, ort_fp32 ran within noise") and "chose ov_int8" in note


def test_clearly_separated_intervals_deliver_the_faster_form():
    rng = random.Random(2)
    samples = {"ort_fp32": _noisy(rng, 1.0, 0.05), "ort_dynamic": _noisy(rng, 0.6, 0.05)}
    forms = [_timed("ort_fp32", 89.9, samples["ort_fp32"]), _timed("ort_dynamic", 89.0, samples["ort_dynamic"])]
    choice = choose_form(forms, BASE, Objective(max_acc_drop=2.0), samples=samples)
    assert choice is not None and choice.chosen.name == "ort_dynamic"  # faster beats more accurate and simpler
    assert not choice.tie_decided and choice.note() == ""
    # a median under 2% apart but measurably slower every repeat is still a tie (within the 2% band)
    close = {"ort_fp32": [1.01] * 6, "ort_dynamic": [1.0] * 6}
    forms = [_timed(n, 89.0, s) for n, s in close.items()]
    assert fastest_form(forms, close).chosen.name == "ort_fp32"


def test_the_delivery_note_and_the_peer_say_when_a_tie_decided():
    rng = random.Random(3)
    samples = {"torch_fp32": _noisy(rng, 10.0, 0.05), "ort_dynamic": _noisy(rng, 1.0, 0.2),
               "ort_fp32": _noisy(rng, 1.0, 0.2)}  # fmt: skip
    forms = [_timed(n, 89.5 if n != "torch_fp32" else 90.0, s) for n, s in samples.items()]
    forms = [f.model_copy(update={"path": f"baseline_forms/{f.name}"}) for f in forms]
    base = BASE.model_copy(update={"variants": forms})
    peer = quantization_only_peer(forms, base, Objective(max_acc_drop=2.0), samples=samples)
    assert peer is not None and peer["name"] == "ort_fp32" and peer["tie"].startswith("a tie decided")
    from profiling_agent.state import ArtifactRef

    ref = ArtifactRef(path="baseline", sha256="-", size_bytes=1, params=1)
    delivered = peer_best(base.model_copy(update={"peer": peer}), ref, Objective(max_acc_drop=2.0))
    assert delivered.eval is not None and "a tie decided" in str(delivered.eval.delivery_note)
    note = delivery_note(forms[2], True, [], "auto", peer["tie"])
    assert note.startswith("fastest measured form within the accuracy budget (auto); a tie decided")
    assert "a tie decided" not in delivery_note(forms[2], True, [], "auto")


def test_two_repeats_too_few_for_a_paired_interval_tie_when_their_samples_overlap():
    """`--repeats 2`: no paired interval; forms whose samples overlap (within 2%) tie, whichever median is lower."""
    swapped = [
        {"ort_fp32": [1.00, 1.10], "ort_dynamic": [1.06, 1.03]},  # medians 1.050 and 1.045: 0.5% apart
        {"ort_fp32": [1.07, 0.98], "ort_dynamic": [1.12, 1.00]},  # medians 1.025 and 1.060: 3.4% apart
    ]
    for samples in swapped:
        forms = [_timed(n, 89.0, s) for n, s in samples.items()]
        fastest = fastest_form(forms, samples)
        assert fastest.chosen.name == "ort_fp32" and fastest.how == "overlap" and fastest.tie_decided
        assert "too few repeats for a paired interval" in fastest.note()
    apart = {"ort_fp32": [1.00, 1.02], "ort_dynamic": [0.80, 0.82]}  # every sample says ort_dynamic is faster
    forms = [_timed(n, 89.0, s) for n, s in apart.items()]
    assert fastest_form(forms, apart).chosen.name == "ort_dynamic" and not fastest_form(forms, apart).tie_decided
