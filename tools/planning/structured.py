"""Schema-constrained answers: the plan's JSON schema and which `response_format` a server accepts.

Servers differ: OpenAI, vLLM and llama.cpp's own server take `{"type": "json_schema", ...}`;
llama-cpp-python's server refuses that type (HTTP 500) but constrains `{"type": "json_object", "schema": ...}`
with a grammar; some take only a plain `{"type": "json_object"}` (JSON, no schema); others ignore
`response_format` altogether. The mode is found from the server's answers, once per run, in that order.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from profiling_agent.prompts.plan_format import TOKENS, answer_fields, entry_fields
from profiling_agent.state import GivenUpMode, StructuredChoice, StructuredFacts, StructuredMode

AUTO_ORDER: tuple[StructuredMode, ...] = ("json_schema", "json_object", "json", "off")
_FORMAT_WORDS = re.compile(r"response_format|json_schema|json_object|schema|grammar", re.IGNORECASE)


MAX_ENUM_LINEARS = 256  # Linear layer names listed for quantization entries (beyond: "all" only)


def ratio_grid(min_ratio: float, max_ratio: float, step: float = 0.05) -> list[float]:
    """Return the ratios a constrained answer may use: multiples of `step` within [min_ratio, max_ratio].

    Grammar-constrained decoders (llama.cpp) honour enums but not numeric bounds; a real 135M model wrote a
    ratio of 2 under a schema with "maximum": 0.8.
    """
    grid = [round(step * k, 4) for k in range(1, int(max_ratio / step + 1e-9) + 1)]
    return [r for r in grid if r >= min_ratio] or [round(max_ratio, 4)]


# string caps a grammar decoder enforces: a small model otherwise writes one justification until the token limit
MAX_JUSTIFICATION = 240
MAX_RATIONALE = 600
MAX_QUANT_ENTRIES = 2  # quantization entries a constrained answer may write ("all" and one exception, or two layers)


def plan_schema(
    groups: Sequence[tuple[str, str]],
    dtypes: tuple[str, ...],
    caps: dict[str, float],
    min_ratio: float,
    linears: list[str] | None = None,
    token_rates: list[int] | None = None,
    token_schedules: list[list[int]] | None = None,
    choices: list[str] | None = None,
) -> dict[str, Any]:
    """Return the JSON schema of a plan for this model, the one the server constrains decoding to.

    Under constraint a pruning entry names exact groups (`groups`, an enum of this model's group names, so a
    constrained model can neither invent a group nor mis-escape a regex), one entry shape per unit kind (`anyOf`:
    "head" entries list head groups only, with ratios up to the head cap; a real 135M model kept writing
    "structured" for head groups). The guard checks this form and, for unconstrained answers, also the `layer`
    regex form. Ratios come from a grid, and quantization entries name "all" or one exact Linear layer. A "block"
    entry (present only when the groups include block groups, i.e. depth pruning is on) removes whole blocks: its
    only ratio is 1.0. A "tokens" entry (only when a merging rate or schedule pays) names one that was measured.
    With `choices` (the labels of offered alternatives) the answer starts with a required `choice` (a label, or
    "own") and a `why`; the plan's fields become optional: a choice alone stands for the chosen plan, and entries
    beside it edit that plan. `groups` are this model's prunable groups as (name, kind), in the profile's order.
    """
    kinds = sorted({kind for _, kind in groups}) or ["structured", "head"]

    width_cap = max((cap for kind, cap in caps.items() if kind != "block"), default=0.8)

    def ratios_for(kind: str) -> list[float]:  # a block is removed whole: 1.0 is its one ratio
        return [1.0] if kind == "block" else ratio_grid(min_ratio, caps.get(kind, width_cap))

    def entry(kind: str) -> dict[str, Any]:  # one entry shape per unit kind: a head group cannot get "structured"
        names = [name for name, own in groups if own == kind] or [name for name, _ in groups]
        return {
            "type": "object",
            "properties": {
                "type": {"type": "string", "enum": [kind]},
                "groups": {
                    "type": "array",
                    "items": {"type": "string", "enum": names},
                    "minItems": 1,
                    "maxItems": len(names),
                },
                "ratio": {"type": "number", "enum": ratios_for(kind)},
                "justification": {"type": "string", "maxLength": MAX_JUSTIFICATION},
            },
            "required": list(answer_fields("pruning")),
            "additionalProperties": False,
        }

    prune_entry = entry(kinds[0]) if len(kinds) == 1 else {"anyOf": [entry(kind) for kind in kinds]}
    quant_entry = _quant_entry(dtypes, linears)
    quant_layers = quant_entry["properties"]["layer"]["enum"]
    props: dict[str, Any] = {
        "pruning": {"type": "array", "items": prune_entry, "maxItems": max(1, len(groups))},
        # bounded: a looping small model wrote quantization entries until the token limit cut its answer
        "quantization": {"type": "array", "items": quant_entry, "maxItems": min(len(quant_layers), MAX_QUANT_ENTRIES)},
        "rationale": {"type": "string", "maxLength": MAX_RATIONALE},
    }
    if token_rates or token_schedules:
        props[TOKENS] = {"anyOf": [{"type": "null"}, *token_schema(token_rates or [], token_schedules or [])]}
    if choices:
        choice = {"choice": {"type": "string", "enum": [*choices, "own"]}, "why": {"type": "string", "maxLength": 240}}
        return {
            "type": "object",
            "properties": {**choice, **props},
            "required": ["choice", "why"],
            "additionalProperties": False,
        }
    return {
        "type": "object",
        "properties": props,
        "required": [f for f in entry_fields()["plan"] if f in props],
        "additionalProperties": False,
    }


def _quant_entry(dtypes: tuple[str, ...], linears: list[str] | None) -> dict[str, Any]:
    """Return the schema of one quantization entry: "all" or one exact Linear layer (when few enough to list)."""
    quant_layers = ["all", *(linears or [])] if len(linears or []) <= MAX_ENUM_LINEARS else ["all"]
    return {
        "type": "object",
        "properties": {
            "layer": {"type": "string", "enum": quant_layers},
            "type": {"type": "string", "enum": ["dynamic"]},
            "dtype": {"type": "string", "enum": list(dtypes)},
            "justification": {"type": "string", "maxLength": MAX_JUSTIFICATION},
        },
        "required": list(answer_fields("quantization")),
        "additionalProperties": False,
    }


CHARS_PER_TOKEN = 3.0  # JSON of names, numbers and short prose: about 3 characters a token (BPE tokenizers)
MAX_SIZED_ENTRIES = 8  # pruning entries a sized answer allows for (a plan groups its groups into a few entries)


def answer_token_limit(schema: dict[str, Any], slack: float = 1.0) -> int:
    """Return the most tokens one answer needs: the longest plan `schema` allows, with `slack` for prose around it.

    The plan names each group at most once; its entries (at most MAX_SIZED_ENTRIES), quantization entries (at most
    MAX_QUANT_ENTRIES) and rationale carry their capped strings. A reply limit sized so leaves a
    rambling small model no room for pages of prose, and a schema-valid plan always fits.
    """
    props = schema.get("properties") or {}
    items = (props.get("pruning") or {}).get("items") or {}
    shapes = items.get("anyOf") or [items]
    names = {
        n
        for shape in shapes
        for n in ((shape.get("properties") or {}).get("groups") or {}).get("items", {}).get("enum", [])
    }
    entries = min(MAX_SIZED_ENTRIES, max(1, len(names)))
    chars = sum(len(n) + 3 for n in names) + entries * (MAX_JUSTIFICATION + 80)
    chars += MAX_QUANT_ENTRIES * (MAX_JUSTIFICATION + 100) + MAX_RATIONALE + 200  # quantization, rationale, braces
    chars += int((props.get("why") or {}).get("maxLength", 0))  # an offered alternative's choice and its reason
    return int(slack * chars / CHARS_PER_TOKEN) + 64


def token_schema(rates: list[int], schedules: list[list[int]]) -> list[dict[str, Any]]:
    """Return a constrained token entry's shapes: one of the measured `rates` for every layer, or one `schedules`."""

    def shape(key: str, values: list[Any], kind: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {
                "type": {"type": "string", "enum": [TOKENS]},
                key: {**kind, "enum": values},
                "justification": {"type": "string", "maxLength": MAX_JUSTIFICATION},
            },
            "required": ["type", key, "justification"],
            "additionalProperties": False,
        }

    shapes = [shape("rate", sorted(set(rates)), {"type": "integer"})] if rates else []
    if schedules:
        shapes.append(shape("schedule", [list(s) for s in schedules], {"type": "array", "items": {"type": "integer"}}))
    return shapes


def response_format(mode: StructuredMode, schema: dict[str, Any]) -> dict[str, Any] | None:
    """Return the request's `response_format` for `mode` (None for "off")."""
    if mode == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": "compression_plan", "schema": schema, "strict": False}}
    if mode == "json_object":
        return {"type": "json_object", "schema": schema}
    if mode == "json":
        return {"type": "json_object"}
    return None


def refuses_format(status: int | None, reason: str) -> bool:
    """Return True when a failed request reads as "this server does not take that response_format".

    A 4xx answer is a refusal of the request as sent; a 5xx counts only when its message is about the format
    (llama-cpp-python answers an unknown `response_format.type` with a 500 validation error).
    """
    if status is None:
        return False
    if 400 <= status < 500 and status not in (401, 403, 404, 408, 429):
        return True
    return status >= 500 and bool(_FORMAT_WORDS.search(reason))


@dataclass
class ModeFinder:
    """Which structured-output mode to use next, learnt from the server's answers (one per run).

    Attributes:
        choice: What the user asked for (`--llm-structured`); "auto" tries json_schema, json_object with the
            schema, plain json_object ("json"), then off.
        known: A mode an earlier round of this run found working; tried first.
        tried: One record per mode given up: {"mode", "why"}.
    """

    choice: StructuredChoice = "auto"
    known: StructuredMode | None = None
    tried: list[GivenUpMode] = field(default_factory=list)
    confirmed: bool = False

    def __post_init__(self) -> None:
        if self.choice != "auto":
            self.order: list[StructuredMode] = [self.choice]
        else:
            first = [self.known] if self.known in AUTO_ORDER else []
            self.order = list(dict.fromkeys([*first, *AUTO_ORDER]))

    @classmethod
    def restored(
        cls, choice: StructuredChoice, known: StructuredMode | None, record: StructuredFacts | None
    ) -> ModeFinder:
        """Return the finder as `record` (an earlier `record()` of this step, or None) left it."""
        finder = cls(choice, known)
        for given in (record or {}).get("given_up") or []:
            if finder.order and finder.order[0] == given.get("mode"):
                finder.tried.append(given)
                finder.order.pop(0)
        finder.confirmed = bool((record or {}).get("confirmed"))
        return finder

    @property
    def mode(self) -> StructuredMode:
        """The mode the next constrained request uses ("off" once every mode was given up)."""
        return self.order[0] if self.order else "off"

    def give_up(self, why: str) -> bool:
        """Drop the current mode (refused or ignored by the server); return True when another one is left.

        A forced mode (`choice` other than auto) is never dropped: its failures are the request's failures.
        """
        if self.choice != "auto" or self.mode == "off":
            return False
        self.tried.append({"mode": self.mode, "why": why[:200]})
        self.order.pop(0)
        return True

    def worked(self) -> None:
        """Note that the server answered a request in the current mode with a parseable plan."""
        self.confirmed = True

    def record(self) -> StructuredFacts:
        """Return the JSON facts for the transcript and result.json."""
        return {"choice": self.choice, "mode": self.mode, "confirmed": self.confirmed, "given_up": list(self.tried)}
