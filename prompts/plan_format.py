"""The plan's format, generated from `CompressionPlan`: its fields, its JSON schema and the prompt's format text.

The prompt's format text (`format_text`), the field lists the constrained answer's schema requires
(`tools.planning.structured.plan_schema`) and the guard's model all come from `state.CompressionPlan`, so a field
added there shows up in all three. An answer may name exact groups (`GROUPS`) instead of a `layer` regex: the
guard translates them. The optional `TOKENS` field (token merging) is shown only for a model with a token axis
(`format_text(tokens=True)`); a plan without it reads as before.
"""

from __future__ import annotations

from typing import Any

from profiling_agent.state import CompressionPlan

GROUPS = "groups"  # exact group names from the profile's table: an answer's alternative to a `layer` regex
TOKENS = "tokens"  # the plan's optional token-merging entry (ViT, DeiT only)
HIDDEN_TYPES = ("block",)  # pruning types the format text leaves to the depth note (shown when depth is on)
_WIDTH = 110  # characters per line of the format text


def plan_json_schema() -> dict[str, Any]:
    """Return CompressionPlan's JSON schema with the entry definitions inlined (no "$defs", no "$ref")."""
    schema = CompressionPlan.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(defs[node["$ref"].rsplit("/", 1)[-1]])
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return inline(schema)


def _object_of(prop: dict[str, Any]) -> dict[str, Any] | None:
    """Return the object schema of an optional object field (`anyOf` [object, null]), or None."""
    return next((p for p in prop.get("anyOf", []) if p.get("type") == "object"), None)


def entry_fields() -> dict[str, tuple[str, ...]]:
    """Return the plan's top-level fields ("plan") and each entry field's fields (lists and `tokens`), in order."""
    schema = plan_json_schema()
    fields = {"plan": tuple(schema["properties"])}
    for name, prop in schema["properties"].items():
        if prop.get("type") == "array":
            fields[name] = tuple(prop["items"]["properties"])
        elif _object_of(prop) is not None:
            fields[name] = tuple(_object_of(prop)["properties"])  # type: ignore[index]
    return fields


def answer_fields(entry: str) -> tuple[str, ...]:
    """Return the fields of a constrained answer's `entry` ("pruning", "quantization"): pruning names `groups`."""
    fields = entry_fields()[entry]
    return tuple(GROUPS if entry == "pruning" and f == "layer" else f for f in fields)


def _value(prop: dict[str, Any]) -> str:
    """Return one field's placeholder: its choices, its constant, or its description in angle brackets."""
    if "enum" in prop:
        return " | ".join(f'"{v}"' for v in prop["enum"] if v not in HIDDEN_TYPES)
    if "const" in prop:
        return f'"{prop["const"]}"'
    clauses = str(prop.get("description", "")).rstrip(".").split("; ")  # a clause on a hidden type waits too
    hint = "<" + "; ".join(c for c in clauses if not any(t in c for t in HIDDEN_TYPES)) + ">"
    kind = prop.get("type") or next((p.get("type") for p in prop.get("anyOf", []) if p.get("type") != "null"), None)
    if kind == "array":
        return f"[{hint}, ...]"
    return hint if kind in ("number", "integer") else f'"{hint}"'


def _entry(name: str, props: dict[str, Any]) -> list[str]:
    """Return an entry's fields as lines of `"key": value` pairs, wrapped at _WIDTH."""
    parts = []
    for key, prop in props.items():
        part = f'"{key}": {_value(prop)}'
        if name == "pruning" and key == "layer":  # exact group names, or a regex
            part = f'"{GROUPS}": ["<exact group name from the table>", ...] OR {part}'
        parts.append(part)
    lines, line = [], "    {"
    for i, part in enumerate(parts):
        piece = part + ("}" if i == len(parts) - 1 else ",")
        if len(line) + len(piece) + 1 > _WIDTH and line.strip() != "{":
            lines.append(line)
            line = "     " + piece
        else:
            line = line + ("" if line.endswith("{") else " ") + piece
    return [*lines, line]


def format_text(tokens: bool = False) -> str:
    """Return the plan format shown to the LLM: CompressionPlan's fields with their choices or descriptions.

    `tokens`: show the token-merging entry too (a model with a token axis); left out, the plan has no such field.
    """
    schema = plan_json_schema()
    props = {k: v for k, v in schema["properties"].items() if tokens or k != TOKENS}
    lines = ["{"]
    for i, (name, prop) in enumerate(props.items()):
        comma = "," if i < len(props) - 1 else ""
        obj = _object_of(prop)
        if prop.get("type") == "array":
            lines += [f'  "{name}": [', *_entry(name, prop["items"]["properties"]), f"  ]{comma}"]
        elif obj is not None:  # an optional entry: one object, or null
            entry = _entry(name, obj["properties"])
            lines += [f'  "{name}": null OR', *[line[2:] for line in entry[:-1]], entry[-1][2:] + comma]
        else:
            lines.append(f'  "{name}": {_value(prop)}{comma}')
    return "\n".join([*lines, "}"])
