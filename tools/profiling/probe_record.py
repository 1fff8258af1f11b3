"""What the sensitivity probe keeps in state (rounded, known fields) and how it is said in one line."""

from __future__ import annotations

from typing import Any

from profiling_agent.state import GroupSensitivity


def probe_record(
    result: dict[str, dict[str, Any]], ratio: float, cpu: float, seconds: float, refit: bool
) -> tuple[dict[str, GroupSensitivity], str]:
    """Return the sensitivity kept in state per group (sensitivity.json keeps the probe's extra facts) and its summary.

    Args:
        result: The probe's rows by group (probe_groups).
        ratio: The ratio each group was pruned at.
        cpu: CPU seconds the probe took.
        seconds: Wall seconds it took.
        refit: The damage was measured after the least-squares refit.
    """
    fields = GroupSensitivity.model_fields
    rounded = {
        name: GroupSensitivity.model_validate(
            {k: (round(v, 5) if isinstance(v, float) else v) for k, v in r.items() if k in fields}
        )
        for name, r in result.items()
    }
    least = min(rounded, key=lambda g: rounded[g].damage) if rounded else "-"
    most = max(rounded, key=lambda g: rounded[g].damage) if rounded else "-"
    fast = sum(1 for r in result.values() if r.get("fast"))
    message = (
        f"{len(rounded)} groups probed at ratio {ratio:g} in {cpu:.1f} CPU-s ({seconds:.1f} s wall; "
        f"{fast} from their own block onward); least sensitive {least}, most {most}"
    )
    if refit:
        message += " (after reconstruction)"
    unprunable = {name: r.error for name, r in rounded.items() if r.error}
    if unprunable:  # recorded facts: planners leave these groups out
        message += f"; {len(unprunable)} unprunable: " + "; ".join(f"{n} ({why})" for n, why in unprunable.items())
    return rounded, message
