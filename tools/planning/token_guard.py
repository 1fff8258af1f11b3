"""The guard's check of a plan's token entry against the run's measured token axis, and its predicted saving.

The guard never sees the model, only what the profile and the probe measured (`state.TokenAxis`): the tokens, the
protected ones, the layers (a schedule's length) and the planned form's latency at a few rates. A token entry is
refused when the run has no token axis (a CNN, Swin, or a target other than latency, where nothing was measured),
when its schedule does not fit (length, whole r >= 0, at most half a layer's unprotected tokens), or when its
predicted saving (`predicted_saving`: the measured one for a measured rate or schedule, else interpolated on the mean
tokens the layers see between the uniform rates) does not pay, as the profile drops a row that does not.
"""

from __future__ import annotations

from collections.abc import Sequence

from profiling_agent.state import TokenAxis, TokenEntry

MIN_SAVING = 0.05  # as `profiling.token_latency.MIN_SAVING`: a saving below it is within the timing's precision


def layer_tokens(axis: TokenAxis, schedule: Sequence[int]) -> list[int]:
    """Return the tokens each layer sees (before its merge) under `schedule`."""
    tokens, seen = axis.rates[0].tokens_left, []
    for r in schedule:
        seen.append(tokens)
        tokens -= r
    return seen


def schedule_of(axis: TokenAxis, entry: TokenEntry) -> list[int]:
    """Return the per-layer schedule of an entry: its own, or its rate capped per layer as ToMe does."""
    if entry.schedule is not None:
        return list(entry.schedule)
    tokens, out = axis.rates[0].tokens_left, []
    for _ in axis.rates[0].schedule:
        r = min(int(entry.rate or 0), (tokens - axis.protected) // 2)
        out.append(r)
        tokens -= r
    return out


def predicted_saving(axis: TokenAxis, schedule: Sequence[int]) -> float:
    """Return the share of the planned form's latency `schedule` is predicted to save.

    A measured schedule's measured saving; otherwise interpolated linearly on the mean tokens the layers see between
    the uniform rates (beyond them, the nearest). A front-loaded schedule saves more per token than uniform rates
    (fewer merge sites), so the uniform rates alone are the interpolation's points.
    """
    measured = next((r for r in axis.rates if r.schedule == list(schedule)), None)
    if measured is not None:
        return measured.saved_share
    points = sorted(
        (sum(layer_tokens(axis, r.schedule)) / len(r.schedule), r.saved_share)
        for r in axis.rates
        if r.schedule and r.rate is not None
    )
    x = sum(layer_tokens(axis, schedule)) / max(1, len(schedule))
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    return points[-1][1]


def token_reasons(entry: TokenEntry | None, axis: TokenAxis | None) -> tuple[list[str], float]:
    """Return why a plan's token entry is refused (none: it may be applied) and its predicted latency saving."""
    if entry is None:
        return [], 0.0
    if axis is None or not axis.rates:
        return [
            'this run has no token axis to merge ("tokens" needs a ViT or DeiT under a latency target, where the '
            'profile measured it): set "tokens" to null'
        ], 0.0
    layers = len(axis.rates[0].schedule)
    schedule = schedule_of(axis, entry)
    if len(schedule) != layers:
        return [f'a token "schedule" needs one r per layer ({layers} layers), got {len(schedule)}'], 0.0
    for i, (r, seen) in enumerate(zip(schedule, layer_tokens(axis, schedule), strict=True)):
        cap = (seen - axis.protected) // 2
        if r > cap:
            return [
                f"token schedule: layer {i} sees {seen} tokens ({axis.protected} protected) and can merge at most "
                f"{cap}, not {r}"
            ], 0.0
    saved = predicted_saving(axis, schedule)
    if saved < MIN_SAVING:
        measured = "; ".join(f"{r.label()} {r.saved_share:+.1%}" for r in axis.rates[1:])
        return [
            f"token merging {entry.label()} is predicted to save {saved:+.1%} of {axis.form}'s latency at batch "
            f"{axis.batch}, under the {MIN_SAVING:.0%} that pays (measured: {measured}): drop it or merge more"
        ], saved
    return [], saved
