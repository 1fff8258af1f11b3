"""Text renderings of a run's result: the console table and report.md."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from profiling_agent.state import ProposalDiff, TokenRate
from profiling_agent.tools.reporting.notes import evaluation_notes, evaluation_warnings, test_headline
from profiling_agent.tools.reporting.speed import delivered_speed, speed_sentence
from profiling_agent.tools.text import number


def _delta(accuracy: Any, base: Any, ci: Any) -> str:
    """Format an accuracy change and its interval: "-0.42 [-1.10, +0.20]"."""
    if accuracy is None or base is None:
        return "-"
    text = f"{accuracy - base:+.2f}"
    return text + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else "")


def comparison_rows(result: dict[str, Any]) -> list[list[str]]:
    """Rows of the baseline-vs-candidates table (header first) for the CLI and the report."""
    header = [
        "model",
        "val top-1 %",
        "agree %",
        "lat b1 ms",
        f"lat b{(result.get('baseline') or {}).get('batch_size') or 'N'} ms",
        "speed",
        "params",
        "MACs",
        "size MB",
        "Δ val pp [95% CI]",
        "test top-1 %",
        "val before recovery %",
        "status",
    ]
    rows = [header]
    base = result.get("baseline") or {}
    rows.append(
        [
            "baseline",
            number(base.get("accuracy"), ".2f"),
            "100.00",
            number(base.get("latency_ms"), ".2f"),
            number(base.get("latency_batch_ms"), ".2f"),
            "1.00x",
            number(base.get("params"), ","),
            number(base.get("macs"), ","),
            number(base.get("size_mb"), ".3f"),
            "",
            number(base.get("test_accuracy"), ".2f"),
            "",
            "",
        ]
    )
    best = result.get("best") or {}
    best_it = best.get("iteration")
    for c in result.get("candidates", []):
        status = c["status"] if c["status"] != "ok" else ("best" if c["iteration"] == best_it else "")
        rows.append(
            [
                f"iter {c['iteration']}",
                number(c.get("accuracy"), ".2f"),
                number(c.get("agreement"), ".2f"),
                number(c.get("latency_ms"), ".2f"),
                number(c.get("latency_batch_ms"), ".2f"),
                number(c.get("speedup"), ".2f", "x"),
                number(c.get("params"), ","),
                number(c.get("macs"), ","),
                number(c.get("size_mb"), ".3f"),
                _delta(c.get("accuracy"), base.get("accuracy"), c.get("acc_delta_ci")),
                number(best.get("test_accuracy") if c["iteration"] == best_it else None, ".2f"),
                number(c.get("accuracy_before_recovery"), ".2f"),
                status,
            ]
        )
    return rows


def format_table(rows: list[list[str]]) -> str:
    """Render rows as a fixed-width text table."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        lines.append(
            "  ".join(
                cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(rows: list[list[str]]) -> str:
    """Render rows as a Markdown table."""
    out = ["| " + " | ".join(rows[0]) + " |", "|" + "|".join("---" for _ in rows[0]) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(out)


def md_text(text: Any, limit: int = 300) -> str:
    """Make untrusted text (LLM answers, reasons quoting them) one inert Markdown line, cut to `limit` characters."""
    flat = " ".join(str(text).split())
    flat = flat if len(flat) <= limit else flat[: limit - 3] + "..."
    for raw, safe in (
        ("\\", "\\\\"),
        ("&", "&amp;"),
        ("<", "&lt;"),
        (">", "&gt;"),
        ("`", "'"),
        ("|", "\\|"),
        ("[", "\\["),
        ("]", "\\]"),
        ("*", "\\*"),
        ("_", "\\_"),
    ):
        flat = flat.replace(raw, safe)
    return flat


def md_code(text: Any, limit: int = 120) -> str:
    """Render untrusted text as one inline code span (backticks and line breaks removed, cut to `limit`)."""
    flat = " ".join(str(text).split()).replace("`", "'")
    return "`" + (flat if len(flat) <= limit else flat[: limit - 3] + "...") + "`"


def _llm_line(llm: dict[str, Any] | None) -> list[str]:
    if not llm:
        return []
    usage = llm.get("usage") or {}
    transcripts = ", ".join(md_code(t) for t in llm.get("transcripts") or []) or "-"
    return [
        f"- LLM: {md_text(llm.get('model'), 80)}, {usage.get('calls', 0)} calls, {usage.get('total_tokens', 0):,} "
        f"tokens ({usage.get('input_tokens', 0):,} in, {usage.get('output_tokens', 0):,} out); transcripts "
        f"{transcripts}; {len(llm.get('tool_errors') or [])} refused or failed tool calls",
        *_structured_line(llm.get("structured") or []),
    ]


def structured_summary(steps: list[dict[str, Any]]) -> str:
    """Say which schema-constrained mode the server took and which it refused or ignored (for humans)."""
    if not steps:
        return ""
    last = steps[-1]
    mode = str(last.get("mode") or "off")
    given_up = list(dict.fromkeys(str(g.get("mode")) for s in steps for g in s.get("given_up") or []))
    text = f"{mode}{' (confirmed by the server)' if any(s.get('confirmed') for s in steps) else ''}"
    if last.get("choice") not in (None, "auto"):
        text += f", forced with --llm-structured {last['choice']}"
    if given_up:
        text += f"; given up: {', '.join(given_up)}"
    return text


def proposal_lines(candidates: list[dict[str, Any]]) -> list[str]:
    """Say per LLM plan what it changed relative to the deterministic proposal, and name the reference rounds."""
    lines: list[str] = []
    for k, c in enumerate(candidates):
        diff, before = c.get("vs_proposal"), len(lines)
        if c.get("planner") == "llm" and diff:
            parts = [f"+{g}" for g in diff.get("added") or []] + [f"-{g}" for g in diff.get("removed") or []]
            parts += [f"{g} {a:g}->{b:g}" for g, (a, b) in (diff.get("ratios") or {}).items()]
            parts += [f"quantization {diff['quantization']}"] if diff.get("quantization") else []
            label = ProposalDiff.model_validate(diff).label()  # "chosen alternative B", "edited (2 changes)", ...
            shown = "; ".join(parts[:8]) + (f"; ... {len(parts) - 8} more" if len(parts) > 8 else "")
            goal = f"at goal {float(diff.get('goal') or 0):.0%}" + (f": {shown}" if shown else "")
            if diff.get("proposals"):
                label += f" vs the proposal {goal}"
            elif diff.get("offered"):  # no proposal asked for: the closest of the alternatives the prompt offered
                label += f" vs the closest of the {diff['offered']} alternatives offered, {goal}"
            else:
                label += " (no proposal asked for or offered)"
            lines.append(f"- Iteration {c.get('iteration')}: LLM plan {md_text(label, 300)}")
        elif c.get("turn") == "llm" and (c.get("llm") or {}).get("applied"):
            lines.append(f"- Iteration {c.get('iteration')}: LLM plan {md_text(c['llm']['applied'], 300)}")
        elif c.get("turn") == "reference":
            lines.append(f"- Iteration {c.get('iteration')}: reference round (the deterministic planner's own plan)")
        again = [e.get("iteration") for e in candidates[:k] if c.get("path") and e.get("path") == c.get("path")]
        if (
            len(lines) > before and again
        ):  # a paired round repeating a measured plan records that candidate (paired.repeated_round)
            lines[-1] += f"; the plan of iteration {again[0]} again: its model and measurements, built once"
    return lines


def _structured_line(steps: list[dict[str, Any]]) -> list[str]:
    text = structured_summary(steps)
    return [f"- Structured output: {md_text(text, 200)}"] if text else []


def fallback_lines(fallbacks: list[dict[str, Any]]) -> list[str]:
    """Render the "Planner fallbacks" section: per fallback its stage, reason, and each rejected item with why."""
    if not fallbacks:
        return []
    lines = [
        "## Planner fallbacks",
        "",
        "The LLM's plan was not applied in these iterations; the deterministic plan was used instead.",
        "",
    ]
    for f in fallbacks:
        lines += [
            f"### Iteration {f.get('iteration', '-')}: {md_text(f.get('stage'), 40)}",
            "",
            f"Reason: {md_text(f.get('reason'))}",
            "",
        ]
        for n, item in enumerate(f.get("rejected") or [], 1):
            reasons = "; ".join(md_text(r, 200) for r in (item.get("reasons") or [])[:6]) or "-"
            lines.append(f"{n}. rejected at {md_text(item.get('stage'), 40)}: {reasons}")
            lines.append(f"   - answer: {md_text(item.get('answer'), 240) or '(empty)'}")
        for t in f.get("tool_errors") or []:
            lines.append(f"- tool call {md_code(t.get('name'), 60)} refused: {md_text(t.get('error'), 200)}")
        lines.append("")
    return lines


def test_lines(result: Mapping[str, Any]) -> list[str]:
    """Say what the held-out test images report, how the numbers were taken, and what puts them in doubt."""
    lines = [*test_headline(result), *evaluation_notes(result), *evaluation_warnings(result)]
    return [*lines, ""] if lines else []


def _recipe_text(recipe: dict[str, Any]) -> str:
    calib = recipe.get("calibration") or {}
    control = recipe.get("accuracy_control") or {}
    parts = (
        recipe.get("method"),
        f"hint {recipe.get('precision_hint')}" if recipe.get("precision_hint") else None,
        f"NNCF {recipe.get('model_type')}" if recipe.get("model_type") else None,
        "per-channel" if recipe.get("per_channel") else None,
        f"{calib.get('method') or 'calibration'} x{calib.get('samples')}" if calib else None,
        f"{recipe.get('exporter')} opset {recipe.get('opset')}" if recipe.get("exporter") else None,
        f"accuracy control: {control.get('kept_count', 0)} layers kept in float" if control.get("kept_count") else None,
    )
    return ", ".join(str(x) for x in parts if x)


def variant_rows(result: dict[str, Any]) -> list[list[str]]:
    """Rows (header first) of the unpruned model's forms and every candidate's, measured beside the baseline.

    "vs quant-only" is the form's speed over the quantization-only peer's (the unpruned model's fastest form within
    the budget), both timed in the same round.
    """
    header = ["iter", "variant", "status", "val top-1 %", "agree %", "speed b1", "speed bN", "vs quant-only", "MB"]
    rows = [[*header, "recipe", "note"]]
    base = result.get("baseline") or {}
    rounds = [("unpruned", base.get("variants") or [], base.get("peer") or {}, (base.get("peer") or {}).get("name"))]
    rounds += [
        (str(c["iteration"]), c.get("variants") or [], c.get("peer") or {}, c.get("delivered"))
        for c in result.get("candidates", [])
    ]
    for label, variants, peer, delivered in rounds:
        peer_speed = float(peer.get("speedup") or 0.0)
        for v in variants:
            marker = " (quantization only)" if label == "unpruned" else " (delivered)"
            vs = float(v.get("speedup") or 0.0) / peer_speed if peer_speed and v.get("speedup") else None
            rows.append(
                [
                    label,
                    v["name"] + (marker if v["name"] == delivered else ""),
                    v["status"],
                    number(v.get("accuracy"), ".2f"),
                    number(v.get("agreement"), ".2f"),
                    number(v.get("speedup"), ".2f", "x"),
                    number(v.get("speedup_batch"), ".2f", "x"),
                    number(vs, ".2f", "x"),
                    number(v.get("size_mb"), ".3f"),
                    _recipe_text(v.get("recipe") or {}) or "-",
                    md_text(v.get("error"), 160) if v.get("error") else "",
                ]
            )
    return rows


def variant_lines(result: dict[str, Any]) -> list[str]:
    """Render the "Backend variants" section (nothing when no round measured variants)."""
    rows = variant_rows(result)
    if len(rows) == 1:
        return []
    best = result.get("best") or {}
    note = f" Delivered: `{best.get('delivered')}` ({md_text(best.get('delivery_note'), 400)})." if best else ""
    return [
        "## Backend variants",
        "",
        "The unpruned model's forms (measured once) and each candidate's, side by side with the baseline in their "
        "round (same images, same threads); speeds are the torch baseline's latency over the form's, batch 1 and "
        "batch N; `vs quant-only` compares with the unpruned model's fastest form within the budget." + note,
        "",
        markdown_table(rows),
        "",
    ]


def backend_lines(backend: dict[str, Any] | None) -> list[str]:
    """Say which profile the planners read: the deliverable forms' per-node totals and the one planned on."""
    if not backend:
        return ["- Profile: torch eager only (no backend form profiled)"]
    forms = ", ".join(f"{name} {ms:.2f} ms" for name, ms in backend.get("forms_ms", {}).items())
    failed = "; ".join(f"{name} failed: {why}" for name, why in backend.get("failed", {}).items())
    table = f"; latency table measured on {backend['latency_table']}" if backend.get("latency_table") else ""
    return [
        f"- Profile: torch eager FP32 and the deliverable forms ({forms or 'none'}{'; ' + failed if failed else ''}); "
        f"planners read {backend.get('planned_on', 'torch')}'s latency shares{table}"
    ]


def token_axis_lines(axis: Mapping[str, Any] | None) -> list[str]:
    """Say what merging tokens saved in the planned form at each rate measured, its damage, and what was dropped."""
    if not axis:
        return []
    rows = []
    for r in axis["rates"][1:]:
        damage = f", {r['drop_pp']:.2f} pp lost" if r.get("drop_pp") is not None else ""
        what = TokenRate.model_validate(r).label()
        rows.append(f"{what} {r['latency_ms']:.3f} ms ({r['saved_share']:+.1%}{damage})")
    dropped = [r["dropped"] for r in axis["rates"] if r.get("dropped")]
    return [
        f"- Token merging on {axis['form']} at batch {axis['batch']}: unmerged {axis['base_ms']:.3f} ms; "
        + "; ".join(rows)
        + (f". Dropped: {'; '.join(dropped)}" if dropped else "")
    ]


def token_lines(tokens: Mapping[str, Any] | None) -> list[str]:
    """Say what a round's token merging was: its schedule, the latency it bought, and round 1's weighing."""
    if not tokens:
        return []
    lines = []
    entry, bought = tokens.get("entry"), tokens.get("bought")
    if entry:
        what = f"rate {entry['rate']}" if entry.get("rate") is not None else "a schedule"
        line = f"- merge tokens at {what}: schedule {tokens.get('schedule')}"
        if bought:
            line += (
                f"; bought {bought['saved_share']:.1%} of {bought['form']}'s latency at batch {bought['batch']} "
                f"({bought['base_ms']:.3f} -> {bought['latency_ms']:.3f} ms)"
            )
        lines.append(line + (f": {entry['justification']}" if entry.get("justification") else ""))
    if tokens.get("weighed"):
        lines.append(f"- token merging weighed: {tokens['weighed'].get('why')}")
    return lines


def _devices_line(result: dict[str, Any]) -> str:
    """Say which device each number comes from (accuracy passes and latency of a record share its device)."""
    base = (result.get("baseline") or {}).get("device") or "-"
    cands = sorted({str(c.get("device")) for c in result.get("candidates") or [] if c.get("device")})
    test = ((result.get("protocol") or {}).get("test") or {}).get("device") or "-"
    return (
        f"- Measured on: baseline {base}; candidates {', '.join(cands) or '-'} (CPU-only forms: torch dynamic "
        f"quantization, ONNX Runtime); held-out test {test}"
    )


def render_markdown(result: dict[str, Any], profile_summary: dict[str, Any] | None = None) -> str:
    """Write report.md: goal, outcome, comparison table, plans with their justifications, profile highlights."""
    obj = result.get("objective") or {}
    best = result.get("best")
    lines = [
        f"# profiling-agent report: {result['thread_id']}",
        "",
        f"- Model: `{(result.get('model') or {}).get('ref')}` ({result.get('family')} adapter)",
        f"- Dataset: `{(result.get('dataset') or {}).get('ref')}` split `{(result.get('dataset') or {}).get('split')}`,"
        f" labels mapped by {result['labels'].get('method')}"
        + (" (predictions restricted to the dataset's classes)" if result["labels"].get("restricted") else ""),
        _devices_line(result),
        f"- Objective: reduce {obj.get('target')} by {obj.get('target_reduction', 0):.0%} within "
        f"{obj.get('max_acc_drop')} pp top-1; rule `{obj.get('select')}`; at most {obj.get('iterations')} iterations",
        f"- Planner: requested {result['planner']['requested']}, used {', '.join(result['planner']['used']) or '-'}"
        f"; fallbacks: {len(result['planner']['fallbacks'])}"
        + (f" ({md_text(result['planner']['mode_note'])})" if result["planner"].get("mode_note") else ""),
        *_llm_line(result["planner"].get("llm")),
        *proposal_lines(result.get("candidates") or []),
        f"- Stopped: {result.get('stop_reason') or '-'}",
        *backend_lines(result.get("backend_profile")),
        *token_axis_lines(result.get("token_axis")),
        "",
        "## Outcome",
        "",
        *([f"Target: {md_text(result['outcome']['statement'])}.", ""] if result.get("outcome") else []),
    ]
    if best:
        base = result["baseline"]
        speed = delivered_speed(result)
        lines += [
            f"Best: iteration {best['iteration']} (saved in `best/` as `{best.get('delivered') or 'torch'}`): "
            f"top-1 {best['accuracy']:.2f}% vs "
            f"{base['accuracy']:.2f}% ({-best['accuracy_drop']:+.2f} pp), {best['params']:,} vs {base['params']:,} "
            f"params ({best['params'] / max(base['params'], 1) - 1:+.1%}), {best['size_mb']:.3f} vs "
            f"{base['size_mb']:.3f} MB."
            + ("" if best.get("within_budget") else " **No candidate stayed within the accuracy budget.**"),
            "",
            *([f"**Speed:** {md_text(speed_sentence(speed), 600)}.", ""] if speed is not None else []),
            *test_lines(result),
        ]
    else:
        lines += ["No candidate finished.", ""]
    lines += ["## Baseline vs candidates", "", markdown_table(comparison_rows(result)), ""]
    lines += variant_lines(result)
    lines += ["## Plans", ""]
    for c in result.get("candidates", []):
        plan = c.get("plan") or {}
        lines += [f"### Iteration {c['iteration']} ({c.get('planner')}, {c['status']})", ""]
        if c.get("error"):
            lines += [f"Error: {c['error']}", ""]
        if plan.get("rationale"):
            lines += [plan["rationale"], ""]
        if plan.get("pruning"):
            lines += ["| layer | type | ratio | justification |", "|---|---|---|---|"]
            lines += [
                f"| `{e['layer']}` | {e['type']} | {e['ratio']:.3f} | {e.get('justification', '')} |"
                for e in plan["pruning"]
            ]
            lines.append("")
        for q in plan.get("quantization", []):
            lines += [f"- quantize `{q['layer']}` {q['type']} {q['dtype']}: {q.get('justification', '')}"]
        lines += token_lines(c.get("tokens"))
        lines.append("")
    lines += fallback_lines(result["planner"].get("fallbacks") or [])
    if profile_summary:
        lines += ["## Profile highlights", ""]
        for row in (profile_summary.get("top_latency") or [])[:8]:
            name = row.get("name")
            share = row.get("latency_share")
            lines.append(
                f"- `{name}`: {row.get('latency_ms', 0):.3f} ms"
                + (f" ({share:.1%} of latency)" if isinstance(share, (int, float)) else "")
            )
        lines.append("")
    lines += ["## Versions", "", ", ".join(f"{k} {v}" for k, v in result["versions"].items()), ""]
    return "\n".join(lines)
