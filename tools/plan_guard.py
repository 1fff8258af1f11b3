"""Guard for untrusted (LLM-proposed) compression plans: parsing, schema, regex safety, targets and bounds."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from profiling_agent.state import MAX_REGEX_LEN, CompressionPlan
from profiling_agent.tools.planner import effective_ratio, estimate_reduction

try:  # Python 3.11+
    import re._constants as _sre
    import re._parser as _sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _sre  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

logger = logging.getLogger(__name__)

_REPEATS = {_sre.MAX_REPEAT, _sre.MIN_REPEAT}
_POSSESSIVE = getattr(_sre, "POSSESSIVE_REPEAT", None)
_MAX_UNBOUNDED = 6  # more unbounded quantifiers than this in one module-name regex is suspicious
_MAX_TEXT = 200_000  # characters of LLM text scanned for a JSON object
_MAX_SCAN = 200  # '{' positions tried by the JSON scanner
PLAN_KEYS = ("pruning", "quantization", "rationale")
PRUNE_KEYS = ("layer", "type", "ratio", "justification")
QUANT_KEYS = ("layer", "type", "dtype", "justification")


@dataclass
class GuardConfig:
    """Bounds an LLM plan must respect before it is applied."""

    min_ratio: float = 0.01  # smaller ratios remove nothing worth a pruning pass
    max_ratio_structured: float = 0.8  # the paper's GPT-4-Turbo plans pruned 0.95 and destroyed accuracy
    max_ratio_head: float = 0.75  # keep at least one head in four
    max_predicted_param_reduction: float = 0.9  # estimated from group sizes and cost shares
    max_regex_len: int = MAX_REGEX_LEN  # characters per layer regex
    max_entries: int = 256  # pruning plus quantization entries
    allowed_dtypes: tuple[str, ...] = ("qint8", "float16")  # dynamic quantization weight dtypes
    match_time_budget: float = 1.0  # seconds for all regex searches in a child process; 0 skips that check


@dataclass
class GuardVerdict:
    """The guard's decision on one plan.

    Attributes:
        ok: True when the plan may be applied.
        plan: The validated plan when `ok`, else None.
        reasons: Why the plan was rejected, one short sentence each (sent back to the LLM).
        warnings: Non-fatal remarks (e.g. a ratio too small to remove one unit).
        ratios: Requested ratio per targeted group (later entries override earlier ones).
        estimate: Predicted fractional reduction of params, macs and latency from pruning alone.
    """

    ok: bool
    plan: CompressionPlan | None
    reasons: list[str]
    warnings: list[str] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)
    estimate: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return the verdict without the plan as JSON-ready data (for transcripts)."""
        return {
            "ok": self.ok,
            "reasons": list(self.reasons),
            "warnings": list(self.warnings),
            "ratios": dict(self.ratios),
            "estimate": dict(self.estimate),
        }


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


# ---------------------------------------------------------------- regex safety


def _first_chars(items: list[Any]) -> set[int] | None:
    """Return the set of characters a subpattern can start with, or None when unknown or possibly empty."""
    for op, av in items:
        if op in (_sre.AT, _sre.ASSERT, _sre.ASSERT_NOT):
            continue
        if op is _sre.LITERAL:
            return {av}
        if op is _sre.IN:
            return _class_chars(av)
        if op is _sre.SUBPATTERN:
            return _first_chars(list(av[-1]))
        if op is _sre.BRANCH:
            sets = [_first_chars(list(b)) for b in av[1]]
            return None if any(s is None for s in sets) else set().union(*sets)
        if op in _REPEATS or op is _POSSESSIVE:
            return _first_chars(list(av[2])) if av[0] > 0 else None
        return None
    return None


def _class_chars(items: list[Any]) -> set[int] | None:
    chars: set[int] = set()
    for op, av in items:
        if op is _sre.LITERAL:
            chars.add(av)
        elif op is _sre.RANGE and av[1] - av[0] < 4096:
            chars.update(range(av[0], av[1] + 1))
        elif op is _sre.CATEGORY and av is _sre.CATEGORY_DIGIT:
            chars.update(range(48, 58))
        else:
            return None
    return chars


def _has_variable_repeat(items: list[Any]) -> bool:
    for op, av in items:
        if op in _REPEATS and av[0] != av[1]:
            return True
        if any(_has_variable_repeat(sub) for sub in _children(op, av)):
            return True
    return False


def _children(op: Any, av: Any) -> list[list[Any]]:
    if op in _REPEATS or op is _POSSESSIVE:
        return [list(av[2])]
    if op is _sre.SUBPATTERN:
        return [list(av[-1])]
    if op in (_sre.ASSERT, _sre.ASSERT_NOT):
        return [list(av[1])]
    if op is _sre.BRANCH:
        return [list(b) for b in av[1]]
    if op is getattr(_sre, "ATOMIC_GROUP", None):
        return [list(av)]
    if op is _sre.GROUPREF_EXISTS:
        return [list(b) for b in av[1:] if b is not None]
    return []


def _overlapping_branches(items: list[Any]) -> bool:
    for op, av in items:
        if op is _sre.SUBPATTERN:
            return _overlapping_branches(list(av[-1]))
        if op is _sre.BRANCH:
            sets = [_first_chars(list(b)) for b in av[1]]
            if any(s is None for s in sets):
                return True
            return any(sets[i] & sets[j] for i in range(len(sets)) for j in range(i + 1, len(sets)))
    return False


def _walk_problems(items: list[Any], counts: dict[str, int]) -> str | None:
    for op, av in items:
        if op in (_sre.GROUPREF, _sre.GROUPREF_EXISTS):
            return "backreferences are not allowed"
        if op in _REPEATS:
            high, body = av[1], list(av[2])
            unbounded = high == _sre.MAXREPEAT
            counts["unbounded"] += int(unbounded)
            if (unbounded or high > 16) and _has_variable_repeat(body):
                return "nested quantifiers such as (a+)+ or (.*)* can backtrack catastrophically"
            if (unbounded or high > 16) and _overlapping_branches(body):
                return "a repeated alternation whose branches can start alike, such as (a|aa)+, can backtrack " \
                       "catastrophically"
        for sub in _children(op, av):
            problem = _walk_problems(sub, counts)
            if problem:
                return problem
    return None


def regex_problem(pattern: str, max_len: int = MAX_REGEX_LEN) -> str | None:
    """Return why `pattern` is unsafe or invalid as a module-name regex, or None when it is fine.

    Checked statically, without running the pattern: length, syntax, backreferences, nested quantifiers,
    repeated overlapping alternations and too many unbounded quantifiers.
    """
    if not isinstance(pattern, str) or not pattern:
        return "the regex is empty"
    if len(pattern) > max_len:
        return f"the regex has {len(pattern)} characters (at most {max_len})"
    try:
        parsed = _sre_parse.parse(pattern)
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError, ValueError) as exc:
        return f"the regex does not compile: {exc}"
    counts = {"unbounded": 0}
    try:
        problem = _walk_problems(list(parsed), counts)
    except RecursionError:
        return "the regex is nested too deeply"
    if problem:
        return problem
    if counts["unbounded"] > _MAX_UNBOUNDED:
        return f"the regex has {counts['unbounded']} unbounded quantifiers (at most {_MAX_UNBOUNDED})"
    return None


_TIMING_CHILD = """
import json, re, sys
data = json.load(sys.stdin)
for pattern in data["patterns"]:
    compiled = re.compile(pattern)
    for subject in data["subjects"]:
        compiled.search(subject)
    sys.stdout.write("."); sys.stdout.flush()
"""


def slow_patterns(patterns: list[str], subjects: list[str], budget: float) -> list[str] | None:
    """Run every search in a child process under a time budget; return the patterns that did not finish.

    Python's `re` cannot be interrupted inside the process, so the searches run in `python -I -S` (patterns
    and subjects passed as JSON data, never as code) and the child is killed when the budget runs out.
    Returns None when the child could not be started (the static checks still apply).
    """
    if not patterns or not subjects or budget <= 0:
        return []
    if not sys.executable:
        return None
    payload = json.dumps({"patterns": patterns, "subjects": subjects})
    try:
        subprocess.run(
            [sys.executable, "-I", "-S", "-c", _TIMING_CHILD],
            input=payload, capture_output=True, text=True, timeout=budget, check=True,
        )
    except subprocess.TimeoutExpired as exc:
        done = (exc.stdout or b"").count(b"." if isinstance(exc.stdout, bytes) else ".")
        return patterns[done:done + 1]
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("regex timing check skipped: %s", exc)
        return None
    return []


# ---------------------------------------------------------------- plan checks


def _schema_reasons(error: ValidationError) -> list[str]:
    reasons = []
    for item in error.errors()[:12]:
        where = ".".join(str(part) for part in item["loc"]) or "plan"
        value = json.dumps(item.get("input"), default=str)[:60] if "input" in item else ""
        reasons.append(f"{where}: {item['msg']}" + (f" (got {value})" if value else ""))
    return reasons


def _protected_names(protected: list[str], layer_names: list[str]) -> list[str]:
    inside = [n for n in layer_names if any(n == p or n.startswith(p + ".") for p in protected if p)]
    return list(dict.fromkeys([*protected, *inside]))


def _is_linear(row: dict[str, Any]) -> bool:
    return "Linear" in str(row.get("type", ""))


def _cap(kind: str, config: GuardConfig) -> float:
    return config.max_ratio_head if kind == "head" else config.max_ratio_structured


def _short(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


class _Checker:
    """One plan's checks, collecting reasons and warnings."""

    def __init__(
        self,
        plan: CompressionPlan,
        groups: list[dict[str, Any]],
        protected: list[str],
        group_costs: dict[str, dict[str, Any]],
        layers: list[dict[str, Any]] | None,
        config: GuardConfig,
    ):
        self.plan, self.groups, self.costs, self.config = plan, groups, group_costs, config
        self.layer_names = [str(r.get("name", "")) for r in layers or []]
        self.linear_names = [str(r["name"]) for r in layers or [] if _is_linear(r)]
        self.has_layers = layers is not None
        self.protected = _protected_names(list(protected), self.layer_names)
        self.reasons: list[str] = []
        self.warnings: list[str] = []
        self.compiled: dict[str, re.Pattern[str]] = {}

    def _label(self, section: str, i: int, layer: str) -> str:
        return f"{section}[{i}] layer {layer!r}"

    def compile_all(self) -> None:
        """Check every regex statically, then time the survivors in a child process."""
        entries = [("pruning", i, e.layer) for i, e in enumerate(self.plan.pruning)]
        entries += [("quantization", i, e.layer) for i, e in enumerate(self.plan.quantization) if e.layer != "all"]
        safe = []
        for section, i, layer in entries:
            problem = regex_problem(layer, self.config.max_regex_len)
            if problem:
                self.reasons.append(f"{self._label(section, i, layer)}: {problem}")
            else:
                safe.append(layer)
        safe = list(dict.fromkeys(safe))
        subjects = list(dict.fromkeys([g["module"] for g in self.groups] + self.protected + self.layer_names))
        slow = slow_patterns(safe, subjects, self.config.match_time_budget)
        if slow is None:
            self.warnings.append("regex timing check skipped (no child process)")
            slow = []
        for layer in slow:
            self.reasons.append(f"layer {layer!r}: searching module names took longer than "
                                f"{self.config.match_time_budget:g} s (catastrophic backtracking); simplify it")
        self.compiled = {layer: re.compile(layer) for layer in safe if layer not in slow}

    def check_pruning(self) -> dict[str, float]:
        """Check ratios, targets and protection; return the requested ratio per targeted group."""
        ratios: dict[str, float] = {}
        for i, entry in enumerate(self.plan.pruning):
            label = self._label("pruning", i, entry.layer)
            cap = _cap(entry.type, self.config)
            if entry.ratio < self.config.min_ratio:
                self.reasons.append(f"{label}: ratio {entry.ratio:g} is below the minimum {self.config.min_ratio:g}")
            if entry.ratio > cap:
                self.reasons.append(f"{label}: ratio {entry.ratio:g} exceeds the {entry.type} cap {cap:g}")
            pattern = self.compiled.get(entry.layer)
            if pattern is None:
                continue
            hits = [g for g in self.groups if g["kind"] == entry.type and pattern.search(g["module"])]
            guarded = [name for name in self.protected if pattern.search(name)]
            if guarded:
                self.reasons.append(f"{label}: matches protected module(s) {_short(guarded)}; anchor it to group "
                                    f"modules only, e.g. '^{re.escape(self._example(entry.type))}$'")
            if not hits:
                self.reasons.append(self._no_match(label, entry.type, pattern))
                continue
            if all(effective_ratio(int(g["units"]), int(g.get("min_units", 1)), entry.ratio) <= 0 for g in hits):
                self.warnings.append(f"{label}: ratio {entry.ratio:g} removes no unit from "
                                     f"{_short([g['name'] for g in hits])}")
            for group in hits:
                ratios[group["name"]] = entry.ratio
        return {g["name"]: ratios[g["name"]] for g in self.groups if g["name"] in ratios}

    def _example(self, kind: str) -> str:
        return next((g["module"] for g in self.groups if g["kind"] == kind), "module.name")

    def _no_match(self, label: str, kind: str, pattern: re.Pattern[str]) -> str:
        other = [g["name"] for g in self.groups if g["kind"] != kind and pattern.search(g["module"])]
        if other:
            other_kind = "structured" if kind == "head" else "head"
            return f"{label}: matches no {kind} group, only {other[0]} (kind {other_kind}); change the type or regex"
        examples = [g["module"] for g in self.groups if g["kind"] == kind][:2]
        if not examples:
            return f"{label}: this model has no {kind} groups"
        return f"{label}: matches no {kind} group module; {kind} modules look like {_short(examples, 2)}"

    def check_quantization(self) -> None:
        """Check dtypes and that each regex selects at least one Linear layer."""
        for i, entry in enumerate(self.plan.quantization):
            label = self._label("quantization", i, entry.layer)
            if entry.dtype not in self.config.allowed_dtypes:
                self.reasons.append(f"{label}: dtype {entry.dtype!r} is not allowed "
                                    f"({', '.join(self.config.allowed_dtypes)})")
            pattern = self.compiled.get(entry.layer)
            if entry.layer == "all" or pattern is None or not self.has_layers:
                continue
            if not any(pattern.search(name) for name in self.linear_names):
                self.reasons.append(f"{label}: matches no nn.Linear layer (dynamic quantization only touches "
                                    f"Linear layers, e.g. {_short(self.linear_names, 2) or 'none in this model'})")

    def check_size(self, ratios: dict[str, float]) -> dict[str, float]:
        """Bound the predicted parameter reduction; return the predicted reductions."""
        estimate = {key: round(estimate_reduction(ratios, self.groups, self.costs, key), 4)
                    for key in ("params", "macs", "latency")}
        limit = self.config.max_predicted_param_reduction
        if estimate["params"] > limit:
            self.reasons.append(f"the plan would remove about {estimate['params']:.0%} of the parameters "
                                f"(at most {limit:.0%}); lower the ratios")
        if not self.plan.pruning and not self.plan.quantization:
            self.reasons.append("the plan is empty: add pruning or quantization entries")
        return estimate


def check_plan(
    plan: dict[str, Any] | CompressionPlan,
    groups: list[dict[str, Any]],
    protected: list[str],
    group_costs: dict[str, dict[str, Any]],
    config: GuardConfig | None = None,
    *,
    layers: list[dict[str, Any]] | None = None,
) -> GuardVerdict:
    """Validate a plan against the model's profile before anything is applied.

    Args:
        plan: The plan (a dict parsed from LLM output, or a CompressionPlan).
        groups: Prunable groups as dicts (name, kind, module, units, min_units).
        protected: Module names that must never be pruned (a regex matching them, or a layer inside them, fails).
        group_costs: Per-group cost shares (`params_share`, `macs_share`, `latency_share`).
        config: Bounds; defaults to GuardConfig().
        layers: Profile layer rows (name, type); quantization regexes must match one of their Linear layers.
            Without them only the quantization regexes' syntax is checked.

    Returns:
        A GuardVerdict; `plan` is set only when `ok`.
    """
    config = config or GuardConfig()
    if isinstance(plan, dict):
        n = sum(len(plan.get(k) or []) for k in ("pruning", "quantization") if isinstance(plan.get(k), list))
        if n > config.max_entries:
            return GuardVerdict(False, None, [f"the plan has {n} entries (at most {config.max_entries})"])
    try:
        parsed = plan if isinstance(plan, CompressionPlan) else CompressionPlan.model_validate(plan)
    except ValidationError as exc:
        return GuardVerdict(False, None, _schema_reasons(exc))
    n = len(parsed.pruning) + len(parsed.quantization)
    if n > config.max_entries:
        return GuardVerdict(False, None, [f"the plan has {n} entries (at most {config.max_entries})"])
    checker = _Checker(parsed, groups, protected, group_costs, layers, config)
    checker.compile_all()
    ratios = checker.check_pruning()
    checker.check_quantization()
    estimate = checker.check_size(ratios)
    ok = not checker.reasons
    return GuardVerdict(ok, parsed if ok else None, checker.reasons, checker.warnings, ratios, estimate)
