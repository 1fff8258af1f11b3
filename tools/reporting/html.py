"""A self-contained report.html of a finished run (inline CSS, charts as data URIs)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from profiling_agent.tools import run_layout
from profiling_agent.tools.reporting.html_parts import REPORT_CSS, data_uri, esc, html_card, html_facts, html_table
from profiling_agent.tools.reporting.html_plans import fallbacks_section, plans_section, profile_section
from profiling_agent.tools.reporting.markdown import backend_lines, comparison_rows, token_axis_lines, variant_rows
from profiling_agent.tools.reporting.notes import evaluation_notes, outcome_warnings
from profiling_agent.tools.reporting.plots import PLOT_FILES, extra_baselines
from profiling_agent.tools.reporting.speed import DeliveredSpeed, delivered_speed, speed_sentence
from profiling_agent.tools.text import as_number, number, percent

REPORT_HTML, REPORT_MD = run_layout.REPORT_HTML, run_layout.REPORT_MD
RESULT_JSON, PROFILE_JSON = run_layout.RESULT, run_layout.PROFILE


# ------------------------------------------------------------------------------------------- sections


def _planner_text(planner: Mapping[str, Any]) -> str:
    mode = f" ({planner['mode']}: {planner.get('mode_note') or ''})" if planner.get("mode") else ""
    used = ", ".join(str(u) for u in planner.get("used") or []) or "-"
    return esc(
        f"requested {planner.get('requested')}{mode}, used {used}; {len(planner.get('fallbacks') or [])} fallback(s)"
    )


def _llm_text(llm: Mapping[str, Any]) -> str:
    usage = llm.get("usage") or {}
    transcripts = ", ".join(f"<code>{esc(t)}</code>" for t in llm.get("transcripts") or []) or "-"
    return (
        esc(
            f"{llm.get('model')}: {usage.get('calls', 0)} call(s), {usage.get('total_tokens', 0):,} tokens "
            f"({usage.get('input_tokens', 0):,} in, {usage.get('output_tokens', 0):,} out); "
            f"{len(llm.get('tool_errors') or [])} refused or failed tool call(s); transcripts "
        )
        + transcripts
    )


def _summary(result: Mapping[str, Any]) -> str:
    model, dataset = result.get("model") or {}, result.get("dataset") or {}
    obj, labels, planner = result.get("objective") or {}, result.get("labels") or {}, result.get("planner") or {}
    shape = result.get("input_shape") or {}
    base = result.get("baseline") or {}
    items = [
        ("Model", f"<code>{esc(model.get('ref'))}</code> ({esc(result.get('family'))} adapter)"),
        (
            "Dataset",
            f"<code>{esc(dataset.get('ref'))}</code>, split <code>{esc(dataset.get('split'))}</code>, "
            f"{esc(dataset.get('subset'))}-image seeded subset (seed {esc(dataset.get('seed'))})",
        ),
        (
            "Labels",
            esc(
                f"mapped by {labels.get('method')}"
                + (", predictions restricted to the dataset's classes" if labels.get("restricted") else "")
            ),
        ),
        (
            "Input",
            esc(f"{shape.get('channels')} x {shape.get('height')} x {shape.get('width')} ({shape.get('source', '?')})")
            if shape
            else "-",
        ),
        (
            "Objective",
            esc(
                f"reduce {obj.get('target')} by {percent(obj.get('target_reduction'), 0)} within "
                f"{obj.get('max_acc_drop')} pp top-1; rule {obj.get('select')}; at most "
                f"{obj.get('iterations')} iterations; quantize {obj.get('quantize')}"
            ),
        ),
        ("Planner", _planner_text(planner)),
        *([("LLM", _llm_text(planner["llm"]))] if isinstance(planner.get("llm"), Mapping) else []),
        ("Stopped", esc(result.get("stop_reason") or "-")),
        ("Profile", esc(backend_lines(result.get("backend_profile"))[0].removeprefix("- Profile: "))),
        *[
            ("Tokens", esc(line.removeprefix("- Token merging ")))
            for line in token_axis_lines(result.get("token_axis"))
        ],
        *([("Target", esc(result["outcome"]["statement"]))] if result.get("outcome") else []),
        (
            "Latency",
            esc(
                f"{result.get('latency_method') or '-'}; {base.get('threads')} thread(s), "
                f"batch 1 and batch {base.get('batch_size')}"
            ),
        ),
    ]
    return "<h2>Run summary</h2>\n" + html_facts(items)


def _ratio_card(label: str, new: Any, old: Any, fmt: str) -> str:
    n, o = as_number(new), as_number(old)
    if n is None or o is None or o == 0:
        return ""
    change = n / o - 1
    return html_card(label, number(n, fmt), f"{number(o, fmt)} before ({change:+.1%})", "good" if change < 0 else "bad")


def _outcome(result: Mapping[str, Any]) -> str:
    best, base = result.get("best"), result.get("baseline") or {}
    if not best:
        return '<h2>Outcome</h2>\n<p><span class="badge warn">no candidate finished</span></p>'
    drop, acc, base_acc = (
        as_number(best.get("accuracy_drop")),
        as_number(best.get("accuracy")),
        as_number(base.get("accuracy")),
    )
    target = (result.get("objective") or {}).get("target")
    speed = delivered_speed(result)
    cards = [
        *_speed_cards(speed),
        html_card(
            "Top-1, validation (chose it)",
            "-" if acc is None else f"{acc:.2f}%",
            f"{base_acc:.2f}% before ({-drop:+.2f} pp)" if drop is not None and base_acc is not None else "",
            "good" if drop is not None and drop <= 0 else "bad",
        ),
        _test_card(best, base),
        _ratio_card("Parameters", best.get("params"), base.get("params"), ","),
        _ratio_card("MACs / image", best.get("macs"), base.get("macs"), ","),
        _ratio_card("Weights (MB)", best.get("size_mb"), base.get("size_mb"), ".3f"),
    ]
    within = best.get("within_budget")
    badge = (
        '<span class="badge ok">within the accuracy budget</span>'
        if within
        else '<span class="badge warn">NOT within the accuracy budget</span>'
    )
    text = (
        f"Best: iteration {esc(best.get('iteration'))} by the {esc(best.get('rule'))} rule, "
        f"{esc(percent(best.get('reduction')))} {esc(target)} reduction, saved in <code>best/</code>. {badge}"
    )
    if speed is not None:
        text += f"<br>Batch-1 speed: {esc(speed_sentence(speed, with_flag=False))}."
    warnings = "".join(f'<p><span class="badge warn">{esc(line)}</span></p>' for line in outcome_warnings(result))
    notes = "".join(f'<p class="note">{esc(line)}</p>' for line in evaluation_notes(result))
    return (
        "<h2>Outcome</h2>\n<p>"
        + text
        + "</p>\n"
        + warnings
        + notes
        + '<div class="cards">'
        + "".join(c for c in cards if c)
        + "</div>"
    )


def _speed_cards(speed: DeliveredSpeed | None) -> list[str]:
    """Cards of the delivered model's batch-1 speed: against the quantization-only form, then torch FP32."""
    if speed is None:
        return []
    cards = []
    if speed.quant_delivered:
        cards.append(
            html_card(
                "Speed vs quantization only",
                "1.00x",
                f"it is the quantization-only form ({speed.quant_name} of the unpruned model)",
                "",
            )
        )
    elif speed.vs_quant is not None:
        cards.append(
            html_card(
                "Speed vs quantization only",
                f"{speed.vs_quant:.2f}x",
                f"than {speed.quant_name} of the unpruned model, timed side by side",
                "good" if speed.vs_quant >= 1 else "bad",
            )
        )
    if speed.vs_torch is not None:
        cards.append(
            html_card(
                "Speed vs torch FP32",
                f"{speed.vs_torch:.2f}x",
                "than the original model in torch FP32, timed side by side",
                "good" if speed.vs_torch >= 1 else "bad",
            )
        )
    return cards


def _test_card(best: Mapping[str, Any], base: Mapping[str, Any]) -> str:
    acc, base_acc, ci = (
        as_number(best.get("test_accuracy")),
        as_number(base.get("test_accuracy")),
        best.get("test_delta_ci"),
    )
    if acc is None or base_acc is None:
        return ""
    interval = f", 95% CI [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else ""
    detail = f"{base_acc:.2f}% before ({acc - base_acc:+.2f} pp{interval}); images no plan or selection saw"
    return html_card("Top-1, held-out test (reports it)", f"{acc:.2f}%", detail, "good" if acc >= base_acc else "bad")


def _candidates(result: Mapping[str, Any]) -> str:
    rows = comparison_rows(dict(result))
    best_it = (result.get("best") or {}).get("iteration")
    classes = ["baseline"] + [
        "failed" if c.get("status") != "ok" else ("best" if c["iteration"] == best_it else "")
        for c in result.get("candidates") or []
    ]
    note = (
        '<p class="sub">Candidate rows hold each round\'s measurements (latency and speed measured '
        "interleaved with the baseline in that round); the best candidate's details below use the final "
        "joint measurement when one was taken.</p>"
    )
    return (
        "<h2>Baseline vs candidates</h2>\n"
        + html_table(rows, row_classes=classes, table_id="candidates")
        + "\n"
        + note
        + _variants(result)
        + _other_baselines(result)
        + _best_details(result)
    )


def _variants(result: Mapping[str, Any]) -> str:
    """Render every candidate's backend forms (torch, ONNX Runtime), the delivered one marked."""
    rows = variant_rows(dict(result))
    if len(rows) == 1:
        return ""
    best = result.get("best") or {}
    classes = ["best" if "(delivered)" in r[1] and r[0] == str(best.get("iteration")) else "" for r in rows[1:]]
    note = f'<p class="sub">Delivered: {esc(best.get("delivered"))} ({esc(best.get("delivery_note"))}).</p>'
    return (
        "<h3>Backend forms of each candidate</h3>\n" + html_table(rows, row_classes=classes, table_id="variants") + note
    )


def _other_baselines(result: Mapping[str, Any]) -> str:
    """Render the optional reference models of result.json's "baselines" key (uniform pruning, ONNX, ...)."""
    refs = extra_baselines(result)
    if not refs:
        return ""
    columns = (
        ("accuracy", "top-1 %", ".2f"),
        ("latency_ms", "lat b1 ms", ".2f"),
        ("speedup", "speed", ".2f"),
        ("params", "params", ","),
        ("size_mb", "size MB", ".3f"),
    )
    rows: list[list[Any]] = [["reference", *(label for _, label, _ in columns)]]
    for ref in refs:
        rows.append([ref["name"], *(number(ref.get(k), f) for k, _, f in columns)])
    return "<h3>Other baselines</h3>\n" + html_table(rows, table_id="baselines")


_DETAIL_KEYS = (
    ("accuracy", "top-1 %", ".2f"),
    ("agreement", "agreement with baseline %", ".2f"),
    ("latency_ms", "batch-1 latency ms", ".3f"),
    ("latency_batch_ms", "batch latency ms", ".3f"),
    ("speedup", "batch-1 speed", ".2f"),
    ("speedup_batch", "batch speed", ".2f"),
    ("round_latency_ms", "batch-1 latency ms (its round)", ".3f"),
    ("round_speedup", "batch-1 speed (its round)", ".2f"),
    ("pruned_latency_ms", "batch-1 latency ms, pruned only", ".3f"),
    ("quant_speedup", "speed from quantization", ".2f"),
    ("params", "params", ","),
    ("macs", "MACs", ","),
    ("memory_bytes", "parameter + buffer bytes", ","),
    ("size_mb", "weights file MB", ".3f"),
    ("accuracy_drop", "accuracy drop pp", "+.2f"),
    ("reduction", "reduction of the target", ".1%"),
)


def _best_details(result: Mapping[str, Any]) -> str:
    best, base = result.get("best"), result.get("baseline") or {}
    if not best:
        return ""
    rows: list[list[Any]] = [["metric", "baseline", f"best (iteration {best.get('iteration')})"]]
    for key, label, fmt in _DETAIL_KEYS:
        b, v = as_number(base.get(key)), as_number(best.get(key))
        if v is None:
            continue
        rows.append([label, number(b, fmt), number(v, fmt)])
    return "<h3>Best candidate in detail</h3>\n" + html_table(rows, table_id="best-details")


def _plots(images: Mapping[str, bytes]) -> str:
    if not images:
        return ""
    figures = []
    for key, (_name, caption) in PLOT_FILES.items():
        if key in images:
            full = "" if key.startswith("pareto") else ' class="full"'
            figures.append(
                f'<figure id="plot-{esc(key)}"{full}><img src="{data_uri(images[key])}" alt="{esc(caption)}">'
                f"<figcaption>{esc(caption)}</figcaption></figure>"
            )
    return '<h2>Plots</h2>\n<div class="plots">' + "\n".join(figures) + "</div>"


# ------------------------------------------------------------------------------------------- page


def render_html(
    result: Mapping[str, Any],
    images: Mapping[str, bytes] | None = None,
    profile_summary: Mapping[str, Any] | None = None,
) -> str:
    """Render report.html: summary, outcome, candidates table, plots, plans, fallbacks, profile highlights.

    Every piece of text from the run (plans, justifications, LLM answers, names) is HTML-escaped; images are
    embedded as base64 PNG data URIs and the CSS is inline, so the file needs nothing else.

    Args:
        result: result.json of a finished run.
        images: {key of PLOT_FILES: PNG bytes}; missing keys are simply not shown.
        profile_summary: The compact profile summary (tools.profiling.summarize_profile), or None.
    """
    status = result.get("status")
    badge = f'<span class="badge {"ok" if status == "done" else "warn"}">{esc(status)}</span>'
    versions = ", ".join(f"{k} {v}" for k, v in (result.get("versions") or {}).items())
    body = [
        f"<h1>profiling-agent report: {esc(result.get('thread_id'))} {badge}</h1>",
        f'<div class="sub">{esc((result.get("model") or {}).get("ref"))} on '
        f"{esc((result.get('dataset') or {}).get('ref'))}</div>",
        _summary(result),
        _outcome(result),
        _candidates(result),
        _plots(images or {}),
        plans_section(result),
        fallbacks_section(result),
        profile_section(profile_summary),
        f"<footer>Versions: {esc(versions)}. Generated from result.json and profile.json; rebuild with "
        f"<code>profiling-agent report RUN_DIR/{esc(result.get('thread_id'))}</code>.</footer>",
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>profiling-agent report: {esc(result.get('thread_id'))}</title>\n<style>{REPORT_CSS}</style>\n</head>\n"
        "<body><main>\n" + "\n".join(part for part in body if part) + "\n</main></body>\n</html>\n"
    )
