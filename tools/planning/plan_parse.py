"""Turn an LLM's reply into a plan-shaped dict: JSON extraction and key normalization."""

from __future__ import annotations

from typing import Any

from profiling_agent.state import CompressionPlan
from profiling_agent.tools.planning.json_extract import find_object

PLAN_KEYS = ("pruning", "quantization", "rationale", "tokens")
PRUNE_KEYS = ("layer", "groups", "type", "ratio", "justification")
QUANT_KEYS = ("layer", "type", "dtype", "justification")
WRAPPER_KEYS = ("plan", "compression_plan", "CompressionPlan")
PLAN_FORM = (
    '{"pruning": [{"groups" or "layer", "type", "ratio", "justification"}], "quantization": [...], "rationale": ""}'
)


# ---------------------------------------------------------------- finding the plan in untrusted text


def plan_shaped(value: dict[str, Any]) -> dict[str, Any] | None:
    """Return the plan `value` is or wraps, or None: a plan has a `pruning` or `quantization` list.

    An entry (an object with `layer` and `type`) never has that shape, so it can never pass for the plan.
    """
    if any(isinstance(value.get(key), list) for key in ("pruning", "quantization")):
        return value
    for key in WRAPPER_KEYS:
        inner = value.get(key)
        if isinstance(inner, dict) and any(isinstance(inner.get(k), list) for k in ("pruning", "quantization")):
            return inner
    return None


def extract_json_object(text: str) -> dict[str, Any]:
    """Return the JSON plan object of an LLM reply (plain, fenced, inside prose, or repaired), never a fragment.

    Raises:
        ValueError: When no top-level object of the reply is a plan; the message says what was wrong.
    """
    return find_object(text, plan_shaped, "plan", PLAN_FORM).value


def _holds_content(value: Any) -> bool:
    return isinstance(value, (list, dict)) and bool(value)


def _drop_unknown(obj: dict[str, Any], allowed: tuple[str, ...], label: str, notes: list[str]) -> dict[str, Any]:
    """Drop unknown keys with a note; refuse (ValueError) when a dropped key holds lists or objects."""
    extra = sorted(set(obj) - set(allowed))
    lost = [key for key in extra if _holds_content(obj[key])]
    if lost:
        raise ValueError(
            f"{label}: unknown key(s) {lost} hold content the plan format has no place for; "
            f"use only {', '.join(allowed)}"
        )
    if extra:
        notes.append(f"{label}: ignored unknown keys {extra}")
    return {k: v for k, v in obj.items() if k in allowed}


def _clean_entries(raw: Any, allowed: tuple[str, ...], label: str, notes: list[str]) -> Any:
    if raw is None:
        return []
    if not isinstance(raw, list):
        return raw  # left for schema validation to reject with a precise message
    return [
        _drop_unknown(entry, allowed, f"{label}[{i}]", notes) if isinstance(entry, dict) else entry
        for i, entry in enumerate(raw)
    ]


def _whole_blocks(entries: Any, notes: list[str]) -> Any:
    """Give a "block" entry that left out its ratio the only one it can have (1.0: the block is removed), noted."""
    if not isinstance(entries, list):
        return entries
    out = []
    for i, entry in enumerate(entries):
        if isinstance(entry, dict) and entry.get("type") == "block" and entry.get("ratio") is None:
            notes.append(f"pruning[{i}]: a block entry without a ratio removes the whole block: ratio set to 1.0")
            entry = {**entry, "ratio": 1.0}
        out.append(entry)
    return out


def _quantization_out_of_pruning(plan: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """Move a "dynamic" (quantization) entry written into `pruning` to `quantization`, noted.

    It carries its layer ("all" when it named none), dtype and justification; a ratio has no meaning there and is
    dropped. An entry that names groups stays (pruning groups are not the Linear layers quantization matches).
    """
    entries, quantization = plan.get("pruning"), plan.get("quantization") or []
    if not isinstance(entries, list) or not isinstance(quantization, list):
        return plan
    moved = [
        i
        for i, e in enumerate(entries)
        if isinstance(e, dict)
        and e.get("type") == "dynamic"
        and "groups" not in e
        and isinstance(e.get("layer", ""), str)
    ]
    if not moved:
        return plan
    quant = [
        {k: entries[i][k] for k in QUANT_KEYS if k in entries[i]} | {"layer": entries[i].get("layer") or "all"}
        for i in moved
    ]
    have = {_quant_key(q) for q in quantization if isinstance(q, dict)}
    new = [q for q in quant if _quant_key(q) not in have]
    again = "" if len(new) == len(quant) else " (dropped where the quantization list already had it)"
    notes.append(f"pruning{moved}: a 'dynamic' entry quantizes, it does not prune: moved to quantization{again}")
    kept = [e for i, e in enumerate(entries) if i not in moved]
    return {**plan, "pruning": kept, "quantization": quantization + new}


def _quant_key(entry: dict[str, Any]) -> tuple[str, str, str]:
    return str(entry.get("layer") or "all"), str(entry.get("type") or "dynamic"), str(entry.get("dtype") or "")


def normalize_plan(value: Any) -> tuple[dict[str, Any], list[str]]:
    """Unwrap and tidy a parsed plan: {"plan": {...}} wrappers, null lists, unknown scalar keys dropped with a note.

    A "block" entry without a ratio gets 1.0 (a block is removed whole; any other ratio is the guard's to refuse);
    a "dynamic" entry inside `pruning` moves to `quantization`.

    Raises:
        ValueError: When `value` is not an object, or an unknown key holds content (lists or objects) that
            dropping it would lose: the LLM meant something the format cannot say, so the plan is refused.
    """
    if isinstance(value, CompressionPlan):
        return value.model_dump(), []
    if isinstance(value, dict) and not any(k in value for k in PLAN_KEYS):
        for key in WRAPPER_KEYS:
            if isinstance(value.get(key), dict):
                value = value[key]
                break
    if not isinstance(value, dict):
        raise ValueError(f"the plan must be a JSON object, got {type(value).__name__}")
    notes: list[str] = []
    value = _quantization_out_of_pruning(_drop_unknown(value, PLAN_KEYS, "plan", notes), notes)
    plan = {
        "pruning": _whole_blocks(_clean_entries(value.get("pruning"), PRUNE_KEYS, "pruning", notes), notes),
        "quantization": _clean_entries(value.get("quantization"), QUANT_KEYS, "quantization", notes),
        "rationale": value.get("rationale") if isinstance(value.get("rationale"), str) else "",
    }
    if value.get("tokens") is not None:  # token merging (a null one is no entry); the guard checks it
        plan["tokens"] = value["tokens"]
    return plan, notes


def parse_plan_text(text: str) -> tuple[dict[str, Any], list[str]]:
    """Find, repair and normalize the plan in LLM text; raise ValueError with a readable reason on failure.

    Returns:
        (plan dict, notes): the notes name each repair applied and each harmless key dropped.
    """
    found = find_object(text, plan_shaped, "plan", PLAN_FORM)
    plan, notes = normalize_plan(found.value)
    return plan, [f"repaired the reply's JSON: {r}" for r in found.repairs] + notes
