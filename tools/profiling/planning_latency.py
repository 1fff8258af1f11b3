"""The latency a plan reads: measured once per run, repeated to a stated precision, snapped to a grid, and kept.

Planners weigh groups by their latency shares (and, under a latency target, by their measured savings curves). Those
are timings, and timing noise changed plans from run to run. So the profile step measures them once: the planned
form's node profile is repeated until every group's share agrees to `PRECISION` (at most `MAX_REPEATS` times), the
median is kept, and every share and saving is snapped to a geometric grid (`GRID`) coarser than that noise; shares
whose repeats missed the precision snap to a coarser grid the spread reached allows (`reachable_grid`), and the
record and the console say so. Identical layers are pooled (`identical`), and a sample averages enough calls for the
timer (`node_samples`); the record says how the node times' sum compared with one whole-model timing. The
record goes to profile.json (`planning_latency`); every round and a resumed run read it and never re-measure. The first
record of a model is also kept per machine (keyed by weights, groups, backend choice, threads, input shape, target),
so a later run of the same model on the same machine plans from the same numbers. docs/facts.md gives the noise the
grid was chosen from.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from profiling_agent.tools.io import write_json_atomic
from profiling_agent.tools.models.embedded_data import cache_dir
from profiling_agent.tools.profiling.backend_profile import monotone_savings
from profiling_agent.tools.profiling.node_samples import SAMPLE_S

SCHEMA = 4  # 2: OpenVINO static shape; 3: front-loaded token schedules; 4: identical layers pooled, sampled calls
GRID = 1.1  # shares snap to the nearest power of 1.1: steps of 10%, above the repeats' noise (docs/facts.md)
COARSEST = 2.0  # the coarsest grid a missed precision falls back to (steps of 100%)
PRECISION = 0.05  # repeat until each group's share spreads (max - min) by at most 5% of its median
SHARE_FLOOR = 0.01  # a group below 1% of the time is judged by an absolute spread of 5% of 1%
MIN_REPEATS = 3
OUTLIERS_FROM = 5  # from this many samples on, the spread leaves the highest and the lowest out
MAX_REPEATS = 7


def snap(share: float, grid: float = GRID) -> float:
    """Return `share` snapped to a geometric grid (the nearest power of `grid`); zero and below give 0."""
    if share <= 0:
        return 0.0
    return float(f"{grid ** round(math.log(share, grid)):.6g}")


def reachable_grid(spread: float | None) -> float:
    """Return the grid shares measured to `spread` can be snapped to: `GRID` within `PRECISION`, else coarser.

    A grid's steps are twice the precision it absorbs (`GRID`'s 10% steps, 5%): a spread s takes steps of at least
    2s, rounded up to a tenth, at most `COARSEST`.
    """
    if spread is None or spread <= PRECISION:
        return GRID
    return min(COARSEST, math.ceil((1 + 2 * spread) * 10 - 1e-9) / 10)


def spread(samples: Sequence[Mapping[str, float]]) -> float:
    """Return the largest spread (max - min) of a group's share across samples, relative to its median.

    From five samples on, the highest and the lowest are left out: the median kept does not move with one outlier
    (an OpenVINO compile whose first block ran 20x slower than in the other six), so its precision does not either.
    """
    worst = 0.0
    for name in samples[0]:
        values = sorted(float(s.get(name, 0.0)) for s in samples)
        central = values[1:-1] if len(values) >= OUTLIERS_FROM else values
        worst = max(worst, (central[-1] - central[0]) / max(statistics.median(values), SHARE_FLOOR))
    return worst


def repeated_shares(
    sample: Callable[[], Mapping[str, float]],
    first: Mapping[str, float] | None = None,
    *,
    precision: float = PRECISION,
    max_repeats: int = MAX_REPEATS,
) -> tuple[dict[str, float], int, float]:
    """Take share samples until they agree to `precision` (at least `MIN_REPEATS`, at most `max_repeats`).

    Args:
        sample: Measures the groups' shares once more.
        first: A sample already measured (the profile's own), counted as the first.
        precision: The largest relative spread (`spread`) that stops the repeats.
        max_repeats: The most samples taken in all.

    Returns:
        (each group's median share, the number of samples, their spread).
    """
    samples = [dict(first)] if first is not None else []
    while len(samples) < max_repeats:
        samples.append(dict(sample()))
        if len(samples) >= MIN_REPEATS and spread(samples) <= precision:
            break
    medians = {name: statistics.median(float(s.get(name, 0.0)) for s in samples) for name in samples[0]}
    return medians, len(samples), round(spread(samples), 4)


def planning_record(
    form: str,
    shares: Mapping[str, float],
    torch_shares: Mapping[str, float],
    curves: Mapping[str, Mapping[str, Sequence[float]]] | None = None,
    measured: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Build profile.json's `planning_latency`: the planned form and its snapped shares and savings curves.

    The shares snap to the grid their spread reached (`reachable_grid`, `GRID` when within the precision; stored as
    `grid`); the torch shares and the curves to `GRID`.

    Args:
        form: The form the planners read (`torch` or a backend form).
        shares: Each group's latency share in `form` (the repeats' medians).
        torch_shares: Each group's share in the torch profile.
        curves: Per group, {"ratios", "saved_share"} from the form's latency table (latency targets).
        measured: How it was measured: forms_ms, repeats, spread, and how the samples were taken.
    """
    grid = reachable_grid((measured or {}).get("spread"))
    snapped = {
        name: {"ratios": list(c["ratios"]), "saved_share": [snap(float(v)) for v in c["saved_share"]]}
        for name, c in (curves or {}).items()
    }
    return {
        "schema": SCHEMA,
        "form": form,
        "grid": grid,
        "precision": PRECISION,
        "shares": {name: snap(float(v), grid) for name, v in shares.items()},
        "torch_shares": {name: snap(float(v)) for name, v in torch_shares.items()},
        "curves": snapped,
        **dict(measured or {}),
    }


def records_dir() -> Path:
    """Return the folder of this machine's planning records (beside the latency tables in the cache)."""
    return cache_dir() / "latency"


def record_key(
    digest: str, backend: str, threads: int, shape: Sequence[int], latency_target: bool, tokens: bool = False
) -> str:
    """Return the cache key of a planning record: what the same measurement on this machine would depend on.

    `tokens`: the record holds the token axis's latency too (a ViT or DeiT under a latency target); the keys of
    other records are as they were.
    """
    key = [SCHEMA, digest, backend, threads, list(shape), latency_target] + (["tokens"] if tokens else [])
    text = json.dumps(key)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cached_record(cache: Path, key: str) -> dict[str, Any] | None:
    """Return the planning record cached under `key`, or None."""
    path = cache / f"planning-v{SCHEMA}-{key}.json"
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("schema") == SCHEMA else None


def keep_record(cache: Path, key: str, record: Mapping[str, Any]) -> bool:
    """Store `record` as this machine's planning measurement under `key` unless one is stored; return if written.

    The first record stays (later runs plan from it), including one whose repeats missed the precision: a busy
    machine then keeps planning alike rather than from a new noisy measurement each run (the console says so;
    deleting the file measures again).
    """
    path = cache / f"planning-v{SCHEMA}-{key}.json"
    if path.exists():
        return False
    write_json_atomic(path, {**record, "source": "cache"})
    return True


def record_note(record: Mapping[str, Any]) -> str:
    """Say in one console clause where the planners' latency came from and how precise it is."""
    form, spread = record.get("form"), record.get("spread")
    if record.get("source") == "cache":
        return f"; planners read {form}'s latency from this machine's stored measurement of this model"
    check = _check_note(record)
    if spread is None:
        return f"; planners read {form}'s latency (one profile, shares on a {GRID} grid{check})"
    missed = ""
    if spread > PRECISION:
        missed = f", above the {PRECISION:.0%} precision: shares on a coarser {record.get('grid')} grid"
    calls = record.get("calls_per_sample")
    sampled = f" of {calls} call{'s' if calls != 1 else ''} a sample" if calls else ""
    if calls and record.get("sample_ms") is not None and record["sample_ms"] < SAMPLE_S * 1e3:
        sampled += f" (a sample {record['sample_ms']:.1f} ms, under {SAMPLE_S * 1e3:.0f} ms: the most calls allowed)"
    repeats = f"{record.get('repeats')} repeats{sampled}"
    return f"; planners read {form}'s latency ({repeats}, spread {spread:.0%}{missed}{check})"


def _check_note(record: Mapping[str, Any]) -> str:
    pooled = record.get("identical_layers") or []
    ratio = record.get("nodes_vs_whole")
    out = f"; {sum(len(c) for c in pooled)} identical layers in {len(pooled)} classes pooled" if pooled else ""
    return out + (f"; parts sum to {ratio:.2f}x one whole-model timing" if ratio else "")


def record_from_profile(profile: Mapping[str, Any]) -> dict[str, Any]:
    """Build the planning record from a fresh profile.json: the planned form's repeated shares, or the torch ones.

    The savings curves come from the planned form's latency table (`backend_profile.latency_table`), when measured.
    """
    torch_shares = {name: float(c.get("latency_share", 0.0)) for name, c in profile["group_costs"].items()}
    backend = profile.get("backend_profile") or {}
    tokens = backend.get("token_latency") or profile.get("token_latency")
    extra = {"tokens": tokens} if tokens and "error" not in tokens else {}  # the token axis (`token_latency`)
    form = str(backend.get("planned_on", "torch"))
    repeats = backend.get("planned_repeats") or {}
    pooled = {"identical_layers": profile.get("identical_layers") or backend.get("identical_layers") or []}
    if form == "torch" or not repeats:
        totals = profile.get("totals", {})
        whole, parts = totals.get("latency_ms"), totals.get("timed_ms")  # hooked modules' self times vs one forward
        check = {"nodes_vs_whole": round(parts / whole, 3) if whole and parts else None}
        measured = {"forms_ms": {"torch": whole}, "repeats": 1, "spread": None, **check, **pooled}
        return planning_record("torch", torch_shares, torch_shares, None, {**measured, **extra})
    curves = {}
    table = backend.get("latency_table")
    if table and table.get("form") == form:
        base = float(table["total_ms"][0]) or 1.0
        curves = {
            name: {"ratios": table["ratios"], "saved_share": monotone_savings(times, base)}
            for name, times in table["groups"].items()
        }
    forms_ms = {name: row.get("total_ms") for name, row in backend.get("forms", {}).items() if "total_ms" in row}
    sampled = {k: repeats.get(k) for k in ("calls_per_sample", "sample_ms", "whole_ms", "nodes_vs_whole")}
    measured = {"forms_ms": forms_ms, "repeats": repeats["repeats"], "spread": repeats["spread"], **sampled}
    measured.update(pooled, **extra)
    shares = {name: float(repeats["shares"].get(name, 0.0)) for name in torch_shares}
    return planning_record(form, shares, torch_shares, curves, measured)
