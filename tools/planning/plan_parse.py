"""Turn an LLM's reply into a plan-shaped dict: JSON extraction and key normalization."""

from __future__ import annotations

import json
import re
from typing import Any

from profiling_agent.state import CompressionPlan

_MAX_TEXT = 200_000  # characters of LLM text scanned for a JSON object
_MAX_SCAN = 200  # '{' positions tried by the JSON scanner
PLAN_KEYS = ("pruning", "quantization", "rationale")
PRUNE_KEYS = ("layer", "type", "ratio", "justification")
QUANT_KEYS = ("layer", "type", "dtype", "justification")


# ---------------------------------------------------------------- parsing untrusted text


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in a plan")


def _loads(text: str) -> Any:
    return json.loads(text, parse_constant=_reject_constant)


def _fenced_blocks(text: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"```[A-Za-z0-9_-]*[ \t]*\n?(.*?)```", text, flags=re.DOTALL)]


def _without_trailing_commas(text: str) -> str:
    return re.sub(r",(\s*[}\]])", r"\1", text)


def _try_object(text: str) -> dict[str, Any] | None:
    for variant in (text, _without_trailing_commas(text)):
        try:
            value = _loads(variant.strip())
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _scan_objects(text: str) -> list[dict[str, Any]]:
    decoder = json.JSONDecoder(parse_constant=_reject_constant)
    found = []
    for tried, match in enumerate(re.finditer(r"\{", text)):
        if tried >= _MAX_SCAN:
            break
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(value, dict):
            found.append(value)
    return found


def _looks_like_plan(value: dict[str, Any]) -> bool:
    return any(key in value for key in (*PLAN_KEYS, "plan", "compression_plan"))


def extract_json_object(text: str) -> dict[str, Any]:
    """Find the JSON object in an LLM reply: plain JSON, a fenced block, or an object inside prose.

    The text is only parsed as JSON (NaN and Infinity rejected), never evaluated. Objects that look like a
    plan (a `pruning`, `quantization` or `plan` key) win over other objects.

    Raises:
        ValueError: When the text holds no JSON object.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("the reply is empty: answer with the JSON plan")
    text = text[:_MAX_TEXT]
    candidates: list[dict[str, Any]] = []
    for chunk in (*_fenced_blocks(text), text):
        value = _try_object(chunk)
        if value is not None:
            candidates.append(value)
    candidates += _scan_objects(text) + _scan_objects(_without_trailing_commas(text))
    if not candidates:
        raise ValueError("no JSON object found in the reply: answer with one JSON object, no code")
    return next((c for c in candidates if _looks_like_plan(c)), candidates[0])


def _clean_entries(raw: Any, allowed: tuple[str, ...], label: str, notes: list[str]) -> Any:
    if raw is None:
        return []
    if not isinstance(raw, list):
        return raw  # left for schema validation to reject with a precise message
    out = []
    for i, entry in enumerate(raw):
        if isinstance(entry, dict):
            extra = sorted(set(entry) - set(allowed))
            if extra:
                notes.append(f"{label}[{i}]: ignored unknown keys {extra}")
            entry = {k: v for k, v in entry.items() if k in allowed}
        out.append(entry)
    return out


def normalize_plan(value: Any) -> tuple[dict[str, Any], list[str]]:
    """Unwrap and tidy a parsed plan: {"plan": {...}} wrappers, null lists, unknown keys dropped with a note.

    Raises:
        ValueError: When `value` is not an object.
    """
    if isinstance(value, CompressionPlan):
        return value.model_dump(), []
    if isinstance(value, dict) and not any(k in value for k in PLAN_KEYS):
        for key in ("plan", "compression_plan", "CompressionPlan"):
            if isinstance(value.get(key), dict):
                value = value[key]
                break
    if not isinstance(value, dict):
        raise ValueError(f"the plan must be a JSON object, got {type(value).__name__}")
    notes: list[str] = []
    extra = sorted(set(value) - set(PLAN_KEYS))
    if extra:
        notes.append(f"ignored unknown top-level keys {extra}")
    plan = {
        "pruning": _clean_entries(value.get("pruning"), PRUNE_KEYS, "pruning", notes),
        "quantization": _clean_entries(value.get("quantization"), QUANT_KEYS, "quantization", notes),
        "rationale": value.get("rationale") if isinstance(value.get("rationale"), str) else "",
    }
    return plan, notes


def parse_plan_text(text: str) -> tuple[dict[str, Any], list[str]]:
    """Extract and normalize a plan from LLM text; raise ValueError with a readable reason on failure."""
    try:
        return normalize_plan(extract_json_object(text))
    except RecursionError as exc:
        raise ValueError("the JSON is nested too deeply") from exc
