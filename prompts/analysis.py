"""Prompts of the Analysis Agent (round 1): profile, sensitivity and objective in, a JSON CompressionPlan out."""

from __future__ import annotations

import re
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

from profiling_agent.prompts.plan_example import example_plan_json
from profiling_agent.prompts.plan_format import format_text
from profiling_agent.state import MAX_REGEX_LEN, Objective, TokenRate
from profiling_agent.tools.text import as_number, human, number

# The plan format of the paper's Figure 4 (plus a whole-plan rationale and exact group names as an alternative
# to regexes), shown verbatim to the LLM: generated from CompressionPlan by prompts/plan_format.py.
PLAN_SCHEMA = format_text()

# The guard's bounds quoted in the rules when the caller passes none (GuardConfig's defaults; a test keeps them equal).
DEFAULT_BOUNDS: dict[str, Any] = {
    "min_ratio": 0.01,
    "max_ratio_structured": 0.8,
    "max_ratio_head": 0.75,
    "max_block_fraction": 0.5,
    "max_predicted_param_reduction": 0.9,
    "max_regex_len": MAX_REGEX_LEN,
}

# Placeholders: {min_ratio}, {max_structured}, {max_head}, {max_reduction} (GuardConfig bounds),
# {max_regex_len}, {tools} (TOOLS_PARAGRAPH or NO_TOOLS), {schema} (PLAN_SCHEMA), {example} (the format
# example: a made-up model's groups, prompts/plan_example.py).
ANALYSIS_SYSTEM = """You are the Analysis Agent of ProfilingAgent. It compresses a Hugging Face image \
classifier by structured pruning and post-training dynamic quantization. You read a profile (parameters, MACs \
and measured latency per layer and per prunable group) and a sensitivity probe, and you propose a layer-wise \
compression plan that meets the objective while keeping the accuracy drop within budget.

How a plan is applied (always to the original, uncompressed model):
- A pruning entry selects the groups it lists by exact name in "groups" (the simplest way: no regex, no \
escaping), or else every prunable group of its "type" whose module name contains a match of its "layer" regex \
(Python re.search). When entries overlap, the later entry's ratio wins.
- "structured" removes that fraction of a group's channels (conv filters or MLP hidden units); "head" removes \
that fraction of an attention module's heads, rounded down (a ratio below 1/heads removes nothing).
- A quantization entry dynamically quantizes the nn.Linear layers whose name matches "layer" ("all" = every \
Linear). Convolutions are never quantized.

Rules (a guard checks every plan and sends back the reasons when it rejects one):
- Use group and module names from the tables only; a group's "type" is its kind in the table. Anchor and \
escape regexes, e.g. ^encoder\\.(0|1|2)\\.ffn$, and inside JSON write each backslash twice \
("^encoder\\\\.(0|1)"); exact names in "groups" need no escaping.
- Never match a protected module (classifier, embeddings, norms, residual outputs...).
- ratio from {min_ratio} to {max_structured} for "structured", up to {max_head} for "head"; the predicted \
parameter reduction must stay at or below {max_reduction:.0%}.
- No nested quantifiers like (a+)+, no backreferences, at most {max_regex_len} characters per regex.
- Prune groups with a large cost share and a low probe damage harder; spare the most sensitive groups.

{tools}Your final message must be exactly one JSON object in this format, with no code and no comments:
{schema}

The format on a DIFFERENT, made-up model (its group names do not exist in this model; a copy is refused):
{example}"""

# Placeholders: {profile_block} (model, totals, top layers, group table, regex families, protected modules),
# {objective_block} (target, target_reduction, max_acc_drop, quantization choice), {task} (what to do now).
ANALYSIS_USER = """{profile_block}

{objective_block}

{task}"""

# {tool_rounds}: Context.llm_tool_rounds (the tools paragraph is left out when it is 0: no tool is bound then)
TOOLS_PARAGRAPH = (
    "You may call the tools (at most {tool_rounds} rounds): propose_plan(goal, emphasis) returns the deterministic "
    "planner's plan at a goal as a starting point that you may accept, edit (ratios, groups, quantization) or "
    "replace; estimate_plan and match_layers check a plan before you answer. The run records what you changed "
    "relative to the proposal. "
)
NO_TOOLS = "No tools are offered in this run: answer from the tables. "

ANALYSIS_TASK = (
    "Propose the first plan. Aim straight at the target reduction (a plan predicted to remove less than half of it "
    "is sent back), concentrating pruning where cost is high and damage is low. {start}Answer with the JSON plan only."
)
START_WITH_PROPOSAL = "For a starting point call propose_plan with the objective's reduction as goal. "

MAX_GROUP_ROWS = 64  # groups listed in the prompt; the match_layers tool covers the rest
TOP_LAYERS = 10  # most expensive layers listed


def _pct(value: Any) -> str:
    share = as_number(value)
    return number(None if share is None else 100 * share, ".1f")


def totals_line(totals: dict[str, Any]) -> str:
    """Render the model totals on one line."""
    latency = totals.get("latency_ms")
    return (
        f"Totals: {human(totals.get('params'))} params, {human(totals.get('macs'))} MACs per image, "
        f"{number(latency, '.3g')} ms batch-1 latency (median)."
    )


def top_layers_table(layers: list[dict[str, Any]], top: int = TOP_LAYERS) -> str:
    """Render the `top` layers by self latency as a compact pipe table."""
    rows = sorted(layers, key=lambda r: float(r.get("latency_ms") or 0.0), reverse=True)[:top]
    lines = ["layer | type | params | MACs | ms | lat% | MACs%"]
    for r in rows:
        lines.append(
            f"{r.get('name')} | {r.get('type')} | {human(r.get('params'))} | {human(r.get('macs'))} | "
            f"{number(r.get('latency_ms'), '.3g')} | {_pct(r.get('latency_share'))} | {_pct(r.get('macs_share'))}"
        )
    return "\n".join(lines)


def group_table(groups: list[dict[str, Any]], costs: dict[str, Any], sensitivity: dict[str, Any]) -> str:
    """Render one row per prunable group: exact module name, size, cost shares (%) and probe results.

    When the latency shares are the delivered backend form's (`torch_latency_share` kept beside them), both
    columns are shown: lat% (the form that ships) and torch_lat% (torch eager FP32).
    """
    both = any("torch_latency_share" in c for c in costs.values())
    lines = [
        "group | kind | module | units | params% | MACs% | lat% | "
        + ("torch_lat% | " if both else "")
        + "damage | acc_drop_pp"
    ]
    for g in groups[:MAX_GROUP_ROWS]:
        c, s = costs.get(g["name"], {}), sensitivity.get(g["name"], {})
        torch_col = f"{_pct(c.get('torch_latency_share'))} | " if both else ""
        lines.append(
            f"{g['name']} | {g['kind']} | {g['module']} | {g['units']} | {_pct(c.get('params_share'))} | "
            f"{_pct(c.get('macs_share'))} | {_pct(c.get('latency_share'))} | {torch_col}"
            f"{number(s.get('damage'), '.3g')} | {number(s.get('acc_drop'), '.2g')}"
        )
    if len(groups) > MAX_GROUP_ROWS:
        lines.append(f"... {len(groups) - MAX_GROUP_ROWS} more groups: use the match_layers tool to see them")
    return "\n".join(lines)


def _slot(values: list[str]) -> str:
    unique = sorted(set(values), key=int)
    if len(unique) == 1:
        return re.escape(unique[0])
    if len(unique) <= 4:
        return "(" + "|".join(unique) + ")"
    return r"\d+"


def regex_families(groups: list[dict[str, Any]], protected: list[str]) -> list[dict[str, Any]]:
    """Find one anchored regex per family of similar group modules (digits generalized), checked exactly.

    Returns:
        [{"regex", "kind", "count", "first", "last"}]; a family regex is kept only when it selects exactly its
        own groups of that kind and no protected module.
    """
    families: dict[tuple[str, tuple[str, ...]], list[dict[str, Any]]] = {}
    for g in groups:
        parts = re.split(r"(\d+)", g["module"])
        families.setdefault((g["kind"], tuple(parts[0::2])), []).append(g)
    out = []
    for (kind, texts), members in families.items():
        slots = [re.split(r"(\d+)", m["module"])[1::2] for m in members]
        regex = (
            "^"
            + "".join(
                re.escape(text) + (_slot([s[i] for s in slots]) if i < len(slots[0]) else "")
                for i, text in enumerate(texts)
            )
            + "$"
        )
        compiled = re.compile(regex)
        selected = [g["name"] for g in groups if g["kind"] == kind and compiled.search(g["module"])]
        if sorted(selected) != sorted(m["name"] for m in members) or any(compiled.search(p) for p in protected):
            continue
        out.append(
            {
                "regex": regex,
                "kind": kind,
                "count": len(members),
                "first": members[0]["name"],
                "last": members[-1]["name"],
            }
        )
    return out


def regex_help(groups: list[dict[str, Any]], protected: list[str]) -> str:
    """Render the family regexes and what each selects."""
    lines = []
    for fam in regex_families(groups, protected):
        lines.append(f"{fam['regex']}  ({fam['kind']}) selects {fam['count']} groups: {fam['first']} .. {fam['last']}")
    if not lines:
        return "(no common pattern; use the exact module names, anchored)"
    return "\n".join(lines) + "\nTo pick some of them, narrow an index: \\d+ or (0|1|2) -> (0|2)."


def _display_slot(values: list[str]) -> str:
    unique = sorted(set(values), key=int)
    if len(unique) == 1:
        return unique[0]
    return "N" if len(unique) > 4 else "(" + "|".join(unique) + ")"


def name_templates(names: list[str]) -> list[str]:
    """Summarize module names that differ only in their indices, e.g. "vit.layers.N.layernorm_before".

    An index slot shows its single value, its few values as (0|1), or N for more than four values.
    """
    families: dict[tuple[str, ...], list[list[str]]] = {}
    for name in names:
        parts = re.split(r"(\d+)", name)
        families.setdefault(tuple(parts[0::2]), []).append(parts[1::2])
    out = []
    for texts, slots in families.items():
        out.append(
            "".join(
                t + (_display_slot([s[i] for s in slots]) if i < len(slots[0]) else "") for i, t in enumerate(texts)
            )
        )
    return out


def protected_line(protected: list[str], limit: int = 24) -> str:
    """List protected modules compactly (names that differ only in indices are summarized)."""
    shown = name_templates(protected)
    more = f" and {len(shown) - limit} more" if len(shown) > limit else ""
    text = ", ".join(shown[:limit]) + more
    return f"Protected modules (never prune, and never let a pruning regex match them): {text or 'none'}"


def _probe_note(sensitivity: dict[str, Any]) -> str:
    ratios = {round(float(s.get("ratio", 0.0)), 3) for s in sensitivity.values() if isinstance(s, dict)}
    at = f" at ratio {ratios.pop():g}" if len(ratios) == 1 else ""
    return (
        f"Probe: each group pruned alone{at}; damage = KL(baseline || pruned) + fraction of changed "
        "predictions (higher = more sensitive); acc_drop in percentage points. Shares are % of the whole model."
    )


def _latency_note(profile: dict[str, Any]) -> str:
    form = (profile.get("backend_profile") or {}).get("planned_on")
    if not form or form == "torch":
        return " lat% is torch eager FP32."
    return (
        f" lat% is the share of batch-1 latency in {form}, the form that will most likely ship (its per-node "
        "profile); torch_lat% is torch eager FP32, for comparison. Plan for lat%."
    )


def depth_note(
    groups: list[dict[str, Any]],
    limits: dict[str, int] | None = None,
    fraction: float = DEFAULT_BOUNDS["max_block_fraction"],
) -> str:
    """Explain "block" entries when the groups include block groups (depth pruning is on); "" otherwise.

    `limits` ({stack: blocks that may go}, the profile's `block_limits`, computed by the planning side with the
    guard's rule) are listed when given.
    """
    if not any(g.get("kind") == "block" for g in groups):
        return ""
    swapped = {str(g["module"]) for g in groups if g.get("kind") == "block" and (g.get("extra") or {}).get("replace")}
    listed = [f"{n} blocks of {s}" for s, n in (limits or {}).items() if s not in swapped]
    here = "; ".join(listed[:6]) + (f" and {len(listed) - 6} more stacks" if len(listed) > 6 else "")
    swap_note = (
        " A block group whose module is a stage's first residual block (it has a projection shortcut) is replaced "
        "by that shortcut instead: its row's shares are its residual branch, what goes; it does not count toward "
        "the stack's limit."
        if swapped
        else ""
    )
    return (
        '\nDepth: a "block" group is a whole block (a transformer layer, or a residual block with an identity '
        'shortcut). A pruning entry of type "block" must have ratio 1.0: it removes that block and its whole cost (the '
        "shares in its row), which is what cuts batch-1 latency most on small models."
        + swap_note
        + f"\nRemove at most {fraction:.0%} of the blocks of a stack, never all"
        + (f" (here at most {here})" if here else "")
        + '; "structured" and "head" entries inside a removed block are moot.'
    )


def pays(axis: dict[str, Any] | None) -> bool:
    """Return True when the run's token axis has a rate the plan may use (it pays, its damage was measured)."""
    return any(
        any(r["schedule"]) and not r.get("dropped") and r.get("drop_pp") is not None
        for r in (axis or {}).get("rates", [])
    )


def token_note(axis: dict[str, Any] | None) -> str:
    """Explain the "tokens" entry and list its measured rates when the run has a token axis (ViT, DeiT); else ""."""
    if not axis:
        return ""
    rows = []
    for r in axis["rates"][1:]:
        damage = f", {r['drop_pp']:.2f} pp lost alone" if r.get("drop_pp") is not None else ""
        what = TokenRate.model_validate(r).label()
        rows.append(f"{what}: {r['saved_share']:+.1%} latency{damage}" + (" (dropped)" if r.get("dropped") else ""))
    return (
        '\nTokens: a "tokens" entry ({"type": "tokens", "rate": r}) merges r tokens after every transformer layer\'s '
        'attention (ToMe, training-free), installed after pruning; {"type": "tokens", "schedule": [...]} merges r per '
        "layer as a measured schedule lists; merging and pruning compose (their latency savings multiply). Measured "
        f"on {axis['form']} at batch {axis['batch']}: " + "; ".join(rows) + ". Use only a rate or schedule that pays "
        "(not dropped); set tokens to null otherwise (the token_table tool shows the measurements)."
    )


def profile_block(profile: dict[str, Any], sensitivity: dict[str, Any], model_info: dict[str, Any]) -> str:
    """Render the profile part shared by the analysis and iterative prompts."""
    groups = list(profile.get("groups") or [])
    protected = list(profile.get("protected") or [])
    name = model_info.get("model") or "unknown"
    extra = ", ".join(f"{k} {v}" for k, v in model_info.items() if v and k != "model")
    info = f"{name} ({extra})" if extra else name
    return "\n\n".join(
        [
            f"Model: {info}\n{totals_line(profile.get('totals') or {})}",
            f"Most expensive layers by self latency:\n{top_layers_table(profile.get('layers') or [])}",
            f"Prunable groups ({len(groups)}). {_probe_note(sensitivity)}{_latency_note(profile)}\n"
            f"{group_table(groups, profile.get('group_costs') or {}, sensitivity)}"
            f"{depth_note(groups, profile.get('block_limits'))}{token_note(profile.get('token_axis'))}",
            f"Regexes that select whole families of groups:\n{regex_help(groups, protected)}",
            protected_line(protected),
        ]
    )


def objective_block(objective: Objective) -> str:
    """Render the objective: target, target reduction, accuracy budget and the quantization choice."""
    quant = (
        'no quantization (the user disabled it: leave "quantization" empty)'
        if objective.quantize == "none"
        else f"dynamic {objective.quantize} quantization of the Linear layers (include it in the plan)"
    )
    return (
        f"Objective: reduce {objective.target} by at least {objective.target_reduction:.0%} with a top-1 accuracy "
        f"drop of at most {objective.max_acc_drop:g} percentage points. Quantization requested: {quant}."
    )


def system_prompt(bounds: dict[str, Any] | None, tool_rounds: int) -> str:
    """Fill ANALYSIS_SYSTEM from the guard's bounds (GuardConfig's fields by name; DEFAULT_BOUNDS when None)."""
    b = {**DEFAULT_BOUNDS, **(bounds or {})}
    return ANALYSIS_SYSTEM.format(
        min_ratio=b["min_ratio"],
        max_structured=b["max_ratio_structured"],
        max_head=b["max_ratio_head"],
        max_reduction=b["max_predicted_param_reduction"],
        max_regex_len=b["max_regex_len"],
        tools=TOOLS_PARAGRAPH.format(tool_rounds=tool_rounds) if tool_rounds > 0 else NO_TOOLS,
        schema=format_text(tokens=True) if pays(b.get("tokens")) else PLAN_SCHEMA,  # the token field: a rate pays
        example=example_plan_json(),
    )


def render_analysis(
    profile: dict[str, Any],
    sensitivity: dict[str, Any],
    objective: Objective,
    *,
    model_info: dict[str, Any] | None = None,
    bounds: dict[str, Any] | None = None,
    tool_rounds: int = 6,
) -> list[BaseMessage]:
    """Build the round-1 messages: the system prompt and the profile/objective prompt.

    Args:
        profile: The full profile.json dict (groups, group_costs, protected, layers, totals).
        sensitivity: Probe results per group name.
        objective: The run's objective.
        model_info: Facts shown in the header (e.g. {"model": ref, "family": "vit"}).
        bounds: The guard's bounds quoted in the rules (GuardConfig's fields by name).
        tool_rounds: Tool-call rounds allowed.
    """
    user = ANALYSIS_USER.format(
        profile_block=profile_block(profile, sensitivity, model_info or {}),
        objective_block=objective_block(objective),
        task=ANALYSIS_TASK.format(start=START_WITH_PROPOSAL if tool_rounds > 0 else ""),
    )
    return [SystemMessage(content=system_prompt(bounds, tool_rounds)), HumanMessage(content=user)]
