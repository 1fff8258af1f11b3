"""The plan, fallback and profile sections of report.html."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from profiling_agent.tools.reporting.html_parts import esc, html_facts, html_table
from profiling_agent.tools.reporting.markdown import token_lines
from profiling_agent.tools.text import as_number, percent

_REJECTED_CHARS = 4000  # a rejected LLM answer is shown up to this many characters


def _plan_block(cand: Mapping[str, Any], best_it: Any) -> str:
    plan = cand.get("plan") or {}
    is_best = cand.get("iteration") == best_it
    head = f"Iteration {esc(cand.get('iteration'))}: {esc(cand.get('planner'))} planner, {esc(cand.get('status'))}" + (
        ' <span class="badge ok">best</span>' if is_best else ""
    )
    parts = [f"<details{' open' if is_best else ''}><summary>{head}</summary>"]
    if cand.get("error"):
        parts.append(f'<p class="bad">Error: {esc(cand["error"])}</p>')
    if plan.get("rationale"):
        parts.append(f"<p>{esc(plan['rationale'])}</p>")
    llm = cand.get("llm")
    if isinstance(llm, Mapping):
        usage = llm.get("usage") or {}
        transcript = f"; transcript <code>{esc(llm['transcript'])}</code>" if llm.get("transcript") else ""
        parts.append(
            f'<p class="sub">LLM {esc(llm.get("model") or "")}: {esc(usage.get("calls", 0))} call(s), '
            f"{esc(usage.get('total_tokens', 0))} tokens{transcript}"
            + (f"; LLM plan {esc(llm['applied'])}" if llm.get("applied") else "")
            + "</p>"
        )
    pruning = plan.get("pruning") or []
    if pruning:
        rows = [["layer (regex)", "type", "ratio", "justification"]]
        rows += [
            [
                f"<code>{esc(e.get('layer'))}</code>",
                esc(e.get("type")),
                esc(f"{e['ratio']:.3f}" if as_number(e.get("ratio")) is not None else e.get("ratio")),
                f'<span class="just">{esc(e.get("justification", ""))}</span>',
            ]
            for e in pruning
        ]
        parts.append("<h3>Pruning entries</h3>\n" + html_table(rows, raw={0, 1, 2, 3}, css="plan"))
    applied = cand.get("applied") or []
    if applied:
        rows = [["group", "module", "kind", "ratio", "units before", "units after"]]
        rows += [
            [
                a.get("group"),
                a.get("module"),
                a.get("kind"),
                f"{a['ratio']:.3f}" if as_number(a.get("ratio")) is not None else a.get("ratio"),
                a.get("units_before"),
                a.get("units_after"),
            ]
            for a in applied
        ]
        parts.append("<h3>As applied</h3>\n" + html_table(rows, css="applied"))
    quant = plan.get("quantization") or []
    if quant:
        items = "".join(
            f"<li>quantize <code>{esc(q.get('layer'))}</code> {esc(q.get('type'))} {esc(q.get('dtype'))}: "
            f"{esc(q.get('justification', ''))}</li>"
            for q in quant
        )
        parts.append(
            f"<h3>Quantization entries</h3>\n<ul>{items}</ul>"
            f'<p class="sub">{esc(cand.get("quantized", 0))} Linear layer(s) quantized.</p>'
        )
    tokens = token_lines(cand.get("tokens"))
    if tokens:
        items = "".join(f"<li>{esc(line.removeprefix('- '))}</li>" for line in tokens)
        parts.append(f"<h3>Token merging</h3>\n<ul>{items}</ul>")
    parts.append("</details>")
    return "\n".join(parts)


def plans_section(result: Mapping[str, Any]) -> str:
    """Render the report's section listing each candidate's plan."""
    cands = result.get("candidates") or []
    if not cands:
        return "<h2>Plans</h2>\n<p>No plan was applied.</p>"
    best_it = (result.get("best") or {}).get("iteration")
    return "<h2>Plans</h2>\n" + "\n".join(_plan_block(c, best_it) for c in cands)


def _clip(text: str, limit: int = _REJECTED_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _rejected_html(rejected: Any) -> str:
    """Render what the LLM answered and why it was refused: a list of {"stage", "reasons", "answer"} or any JSON."""
    if not rejected:
        return ""
    if isinstance(rejected, list) and all(isinstance(item, Mapping) for item in rejected):
        items = []
        for item in rejected:
            reasons = "; ".join(str(r) for r in (item.get("reasons") or [])[:6]) or "-"
            answer = str(item.get("answer") or "")
            items.append(
                f"<li>rejected at {esc(item.get('stage'))}: {esc(reasons)}"
                + (f"<details><summary>answer</summary><pre>{esc(_clip(answer))}</pre></details>" if answer else "")
                + "</li>"
            )
        return "<ol>" + "".join(items) + "</ol>"
    text = rejected if isinstance(rejected, str) else json.dumps(rejected, indent=1, default=str)
    return f"<details><summary>rejected answer</summary><pre>{esc(_clip(text))}</pre></details>"


def fallbacks_section(result: Mapping[str, Any]) -> str:
    """Render the report's section on planner fallbacks; empty when there were none."""
    fallbacks = (result.get("planner") or {}).get("fallbacks") or []
    if not fallbacks:
        return "<h2>Planner fallbacks</h2>\n<p>None: every plan came from the planner that was asked for.</p>"
    rows = [["iteration", "stage", "model", "reason", "rejected answers and tool errors"]]
    for f in fallbacks:
        tools = "".join(
            f"<li>tool call <code>{esc(t.get('name'))}</code> refused: {esc(t.get('error'))}</li>"
            for t in f.get("tool_errors") or []
            if isinstance(t, Mapping)
        )
        cell = _rejected_html(f.get("rejected")) + (f"<ul>{tools}</ul>" if tools else "")
        rows.append([esc(f.get("iteration")), esc(f.get("stage")), esc(f.get("model")), esc(f.get("reason")), cell])
    note = '<p class="sub">The LLM\'s plan was not applied in these iterations; the deterministic plan was used.</p>'
    return "<h2>Planner fallbacks</h2>\n" + note + html_table(rows, raw={0, 1, 2, 3, 4}, table_id="fallbacks")


def profile_section(summary: Mapping[str, Any] | None) -> str:
    """Render the report's section summarizing the profile; empty without one."""
    if not summary:
        return ""
    totals, env = summary.get("totals") or {}, summary.get("env") or {}
    parts = ["<h2>Profile highlights (baseline)</h2>"]
    items = []
    if totals:
        items.append(
            (
                "Totals",
                esc(
                    f"{totals.get('params', 0):,} params, {totals.get('macs', 0):,} MACs, "
                    f"{totals.get('latency_ms')} ms batch-1, {totals.get('act_bytes', 0):,} "
                    "activation bytes"
                ),
            )
        )
    if env:
        items.append(
            (
                "Measured on",
                esc(
                    f"{env.get('device')}, {env.get('threads')} thread(s), input "
                    f"{env.get('input_shape')}, batch {env.get('batch')}"
                ),
            )
        )
    if summary.get("error"):
        items.append(("Profiler error", esc(summary["error"])))
    parts.append(html_facts(items))
    top = summary.get("top_latency") or []
    if top:
        rows = [["layer", "type", "self ms", "latency share", "MACs share"]]
        rows += [
            [
                r.get("name"),
                r.get("type"),
                r.get("latency_ms"),
                percent(r.get("latency_share")),
                percent(r.get("macs_share")),
            ]
            for r in top
        ]
        parts.append("<h3>Slowest layers</h3>\n" + html_table(rows, table_id="top-latency"))
    macs = summary.get("top_macs") or []
    if macs:
        rows = [["layer", "MACs", "MACs share"]] + [
            [r.get("name"), f"{int(r.get('macs') or 0):,}", percent(r.get("macs_share"))] for r in macs
        ]
        parts.append("<h3>Most MACs</h3>\n" + html_table(rows, table_id="top-macs"))
    ops = summary.get("operators") or []
    if ops:
        rows = [["operator", "self ms", "share"]] + [
            [r.get("op"), r.get("self_ms"), percent(r.get("share"))] for r in ops
        ]
        parts.append("<h3>Operators (torch.profiler)</h3>\n" + html_table(rows, table_id="operators"))
    groups = (summary.get("groups") or {}).get("rows") or {}
    if groups:
        rows = [["prunable group", "params share", "MACs share", "latency share"]]
        rows += [[name, *(percent(v) for v in values)] for name, values in groups.items()]
        parts.append("<h3>Prunable groups</h3>\n" + html_table(rows, table_id="groups"))
    return "\n".join(parts)
