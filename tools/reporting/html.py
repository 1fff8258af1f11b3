"""A self-contained report.html of a finished run (inline CSS, charts as data URIs)."""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Iterable, Mapping
from typing import Any

from profiling_agent.tools.reporting.plots import PLOT_FILES
from profiling_agent.tools.text import as_number, percent

REPORT_HTML, REPORT_MD = "report.html", "report.md"
RESULT_JSON, PROFILE_JSON = "result.json", "profile.json"
_REJECTED_CHARS = 4000  # a rejected LLM answer is shown up to this many characters

_CSS = """
:root { --fg: #1f2328; --muted: #59636e; --line: #d1d9e0; --bg: #f6f8fa; --accent: #4c78a8; --best: #fdecea;
        --bad: #b42318; --good: #1a7f37; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       color: var(--fg); background: #fff; }
main { max-width: 1220px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 32px 0 10px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3 { font-size: 15px; margin: 18px 0 6px; }
p { margin: 6px 0; }
code, pre { font: 12.5px/1.45 ui-monospace, SFMono-Regular, Menlo, "DejaVu Sans Mono", monospace; }
code { background: var(--bg); padding: 1px 4px; border-radius: 4px; }
pre { background: var(--bg); padding: 10px; border-radius: 6px; overflow-x: auto; white-space: pre-wrap;
      word-break: break-word; }
.sub { color: var(--muted); margin-bottom: 14px; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 600;
         background: var(--bg); border: 1px solid var(--line); vertical-align: middle; }
.badge.ok { color: var(--good); border-color: #aceebb; background: #dafbe1; }
.badge.warn { color: var(--bad); border-color: #ffcecb; background: #ffebe9; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 3px 16px; margin: 8px 0; }
dl.facts dt { color: var(--muted); }
dl.facts dd { margin: 0; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(170px, 1fr)); gap: 12px; margin: 12px 0; }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; background: #fff; }
.card .label { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.card .value { font-size: 22px; font-weight: 650; }
.card .detail { color: var(--muted); font-size: 12px; }
.good { color: var(--good); } .bad { color: var(--bad); }
table { border-collapse: collapse; margin: 8px 0 14px; font-size: 13px; }
th, td { border: 1px solid var(--line); padding: 4px 9px; vertical-align: top; }
th { background: var(--bg); text-align: left; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.best td { background: var(--best); font-weight: 600; }
tr.failed td { color: var(--bad); }
tr.baseline td { background: #f3f6fa; }
.wide { width: 100%; }
.plots { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 18px; }
figure { margin: 0; border: 1px solid var(--line); border-radius: 8px; padding: 8px; background: #fff; }
figure.full { grid-column: 1 / -1; }
figure img { max-width: 100%; height: auto; display: block; margin: 0 auto; }
figcaption { color: var(--muted); font-size: 12.5px; text-align: center; margin-top: 4px; }
details { border: 1px solid var(--line); border-radius: 8px; padding: 6px 12px; margin: 10px 0; }
details > summary { cursor: pointer; font-weight: 600; }
details[open] > summary { margin-bottom: 6px; }
.just { color: #333; max-width: 560px; }
footer { margin-top: 36px; color: var(--muted); font-size: 12px; }
"""


# ------------------------------------------------------------------------------------------- helpers


def _e(value: Any) -> str:
    """Escape any value for HTML text and attributes (plans may hold LLM text)."""
    return html.escape("" if value is None else str(value), quote=True)


def _is_num_cell(text: str) -> bool:
    stripped = "".join(ch for ch in text if ch not in ",x%+-. ")
    return bool(stripped) and stripped.isdigit()


def _table(
    rows: list[list[Any]],
    *,
    row_classes: Iterable[str] | None = None,
    raw: set[int] | None = None,
    table_id: str = "",
    css: str = "",
) -> str:
    """Render rows (header first) as an HTML table; cells are escaped unless their column is in `raw`.

    Columns listed in `raw` must already hold escaped HTML built by this module.
    """
    raw = raw or set()
    classes = list(row_classes or [])
    attrs = (f' id="{_e(table_id)}"' if table_id else "") + (f' class="{_e(css)}"' if css else "")
    out = [
        f"<table{attrs}>",
        "<thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in rows[0]) + "</tr></thead>",
        "<tbody>",
    ]
    for n, row in enumerate(rows[1:]):
        cls = classes[n] if n < len(classes) and classes[n] else ""
        cells = []
        for i, cell in enumerate(row):
            text = cell if i in raw else _e(cell)
            num = i not in raw and _is_num_cell(str(cell))
            cells.append(f'<td class="num">{text}</td>' if num else f"<td>{text}</td>")
        out.append((f'<tr class="{_e(cls)}">' if cls else "<tr>") + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _facts(items: Iterable[tuple[str, str]]) -> str:
    """Render a definition list; values are already escaped HTML."""
    return '<dl class="facts">' + "".join(f"<dt>{_e(k)}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


def _card(label: str, value: str, detail: str = "", tone: str = "") -> str:
    cls = f"value {tone}".strip()
    return (
        f'<div class="card"><div class="label">{_e(label)}</div><div class="{cls}">{_e(value)}</div>'
        f'<div class="detail">{_e(detail)}</div></div>'
    )


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


# ------------------------------------------------------------------------------------------- sections


def _planner_text(planner: Mapping[str, Any]) -> str:
    mode = f" ({planner['mode']}: {planner.get('mode_note') or ''})" if planner.get("mode") else ""
    used = ", ".join(str(u) for u in planner.get("used") or []) or "-"
    return _e(
        f"requested {planner.get('requested')}{mode}, used {used}; {len(planner.get('fallbacks') or [])} fallback(s)"
    )


def _llm_text(llm: Mapping[str, Any]) -> str:
    usage = llm.get("usage") or {}
    transcripts = ", ".join(f"<code>{_e(t)}</code>" for t in llm.get("transcripts") or []) or "-"
    return (
        _e(
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
        ("Model", f"<code>{_e(model.get('ref'))}</code> ({_e(result.get('family'))} adapter)"),
        (
            "Dataset",
            f"<code>{_e(dataset.get('ref'))}</code>, split <code>{_e(dataset.get('split'))}</code>, "
            f"{_e(dataset.get('subset'))}-image seeded subset (seed {_e(dataset.get('seed'))})",
        ),
        (
            "Labels",
            _e(
                f"mapped by {labels.get('method')}"
                + (", predictions restricted to the dataset's classes" if labels.get("restricted") else "")
            ),
        ),
        (
            "Input",
            _e(f"{shape.get('channels')} x {shape.get('height')} x {shape.get('width')} ({shape.get('source', '?')})")
            if shape
            else "-",
        ),
        (
            "Objective",
            _e(
                f"reduce {obj.get('target')} by {percent(obj.get('target_reduction'), 0)} within "
                f"{obj.get('max_acc_drop')} pp top-1; rule {obj.get('select')}; at most "
                f"{obj.get('iterations')} iterations; quantize {obj.get('quantize')}"
            ),
        ),
        ("Planner", _planner_text(planner)),
        *([("LLM", _llm_text(planner["llm"]))] if isinstance(planner.get("llm"), Mapping) else []),
        ("Stopped", _e(result.get("stop_reason") or "-")),
        (
            "Latency",
            _e(
                f"{result.get('latency_method') or '-'}; {base.get('threads')} thread(s), "
                f"batch 1 and batch {base.get('batch_size')}"
            ),
        ),
    ]
    return "<h2>Run summary</h2>\n" + _facts(items)


def _fmt(value: float, fmt: str) -> str:
    return format(int(value), fmt) if fmt == "," else format(value, fmt)


def _ratio_card(label: str, new: Any, old: Any, fmt: str) -> str:
    n, o = as_number(new), as_number(old)
    if n is None or o is None or o == 0:
        return ""
    change = n / o - 1
    return _card(label, _fmt(n, fmt), f"{_fmt(o, fmt)} before ({change:+.1%})", "good" if change < 0 else "bad")


def _outcome(result: Mapping[str, Any]) -> str:
    best, base = result.get("best"), result.get("baseline") or {}
    if not best:
        return '<h2>Outcome</h2>\n<p><span class="badge warn">no candidate finished</span></p>'
    drop, acc, base_acc = (
        as_number(best.get("accuracy_drop")),
        as_number(best.get("accuracy")),
        as_number(base.get("accuracy")),
    )
    speed = as_number(best.get("speedup"))
    target = (result.get("objective") or {}).get("target")
    cards = [
        _card(
            "Top-1 accuracy",
            "-" if acc is None else f"{acc:.2f}%",
            f"{base_acc:.2f}% before ({-drop:+.2f} pp)" if drop is not None and base_acc is not None else "",
            "good" if drop is not None and drop <= 0 else "bad",
        ),
        _ratio_card("Parameters", best.get("params"), base.get("params"), ","),
        _ratio_card("MACs / image", best.get("macs"), base.get("macs"), ","),
        _ratio_card("Weights (MB)", best.get("size_mb"), base.get("size_mb"), ".3f"),
        _card(
            "Batch-1 speed",
            f"{speed:.2f}x" if speed is not None else "-",
            "vs baseline, measured side by side",
            "good" if speed and speed >= 1 else "bad",
        ),
    ]
    within = best.get("within_budget")
    badge = (
        '<span class="badge ok">within the accuracy budget</span>'
        if within
        else '<span class="badge warn">NOT within the accuracy budget</span>'
    )
    text = (
        f"Best: iteration {_e(best.get('iteration'))} by the {_e(best.get('rule'))} rule, "
        f"{_e(percent(best.get('reduction')))} {_e(target)} reduction, saved in <code>best/</code>. {badge}"
    )
    return "<h2>Outcome</h2>\n<p>" + text + '</p>\n<div class="cards">' + "".join(c for c in cards if c) + "</div>"


def _candidates(result: Mapping[str, Any]) -> str:
    from profiling_agent.tools.reporting.markdown import comparison_rows

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
        + _table(rows, row_classes=classes, table_id="candidates")
        + "\n"
        + note
        + _other_baselines(result)
        + _best_details(result)
    )


def _other_baselines(result: Mapping[str, Any]) -> str:
    """Render the optional reference models of result.json's "baselines" key (uniform pruning, ONNX, ...)."""
    from profiling_agent.tools.reporting.plots import extra_baselines

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
        rows.append([ref["name"], *("-" if as_number(ref.get(k)) is None else _fmt(ref[k], f) for k, _, f in columns)])
    return "<h3>Other baselines</h3>\n" + _table(rows, table_id="baselines")


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
        rows.append([label, "-" if b is None else _fmt(b, fmt), _fmt(v, fmt)])
    return "<h3>Best candidate in detail</h3>\n" + _table(rows, table_id="best-details")


def _plots(images: Mapping[str, bytes]) -> str:
    if not images:
        return ""
    figures = []
    for key, (_name, caption) in PLOT_FILES.items():
        if key in images:
            full = "" if key.startswith("pareto") else ' class="full"'
            figures.append(
                f'<figure id="plot-{_e(key)}"{full}><img src="{_data_uri(images[key])}" alt="{_e(caption)}">'
                f"<figcaption>{_e(caption)}</figcaption></figure>"
            )
    return '<h2>Plots</h2>\n<div class="plots">' + "\n".join(figures) + "</div>"


def _plan_block(cand: Mapping[str, Any], best_it: Any) -> str:
    plan = cand.get("plan") or {}
    is_best = cand.get("iteration") == best_it
    head = f"Iteration {_e(cand.get('iteration'))}: {_e(cand.get('planner'))} planner, {_e(cand.get('status'))}" + (
        ' <span class="badge ok">best</span>' if is_best else ""
    )
    parts = [f"<details{' open' if is_best else ''}><summary>{head}</summary>"]
    if cand.get("error"):
        parts.append(f'<p class="bad">Error: {_e(cand["error"])}</p>')
    if plan.get("rationale"):
        parts.append(f"<p>{_e(plan['rationale'])}</p>")
    llm = cand.get("llm")
    if isinstance(llm, Mapping):
        usage = llm.get("usage") or {}
        transcript = f"; transcript <code>{_e(llm['transcript'])}</code>" if llm.get("transcript") else ""
        parts.append(
            f'<p class="sub">LLM {_e(llm.get("model") or "")}: {_e(usage.get("calls", 0))} call(s), '
            f"{_e(usage.get('total_tokens', 0))} tokens{transcript}</p>"
        )
    pruning = plan.get("pruning") or []
    if pruning:
        rows = [["layer (regex)", "type", "ratio", "justification"]]
        rows += [
            [
                f"<code>{_e(e.get('layer'))}</code>",
                _e(e.get("type")),
                _e(f"{e['ratio']:.3f}" if as_number(e.get("ratio")) is not None else e.get("ratio")),
                f'<span class="just">{_e(e.get("justification", ""))}</span>',
            ]
            for e in pruning
        ]
        parts.append("<h3>Pruning entries</h3>\n" + _table(rows, raw={0, 1, 2, 3}, css="plan"))
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
        parts.append("<h3>As applied</h3>\n" + _table(rows, css="applied"))
    quant = plan.get("quantization") or []
    if quant:
        items = "".join(
            f"<li>quantize <code>{_e(q.get('layer'))}</code> {_e(q.get('type'))} {_e(q.get('dtype'))}: "
            f"{_e(q.get('justification', ''))}</li>"
            for q in quant
        )
        parts.append(
            f"<h3>Quantization entries</h3>\n<ul>{items}</ul>"
            f'<p class="sub">{_e(cand.get("quantized", 0))} Linear layer(s) quantized.</p>'
        )
    parts.append("</details>")
    return "\n".join(parts)


def _plans(result: Mapping[str, Any]) -> str:
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
                f"<li>rejected at {_e(item.get('stage'))}: {_e(reasons)}"
                + (f"<details><summary>answer</summary><pre>{_e(_clip(answer))}</pre></details>" if answer else "")
                + "</li>"
            )
        return "<ol>" + "".join(items) + "</ol>"
    text = rejected if isinstance(rejected, str) else json.dumps(rejected, indent=1, default=str)
    return f"<details><summary>rejected answer</summary><pre>{_e(_clip(text))}</pre></details>"


def _fallbacks(result: Mapping[str, Any]) -> str:
    fallbacks = (result.get("planner") or {}).get("fallbacks") or []
    if not fallbacks:
        return "<h2>Planner fallbacks</h2>\n<p>None: every plan came from the planner that was asked for.</p>"
    rows = [["iteration", "stage", "model", "reason", "rejected answers and tool errors"]]
    for f in fallbacks:
        tools = "".join(
            f"<li>tool call <code>{_e(t.get('name'))}</code> refused: {_e(t.get('error'))}</li>"
            for t in f.get("tool_errors") or []
            if isinstance(t, Mapping)
        )
        cell = _rejected_html(f.get("rejected")) + (f"<ul>{tools}</ul>" if tools else "")
        rows.append([_e(f.get("iteration")), _e(f.get("stage")), _e(f.get("model")), _e(f.get("reason")), cell])
    note = '<p class="sub">The LLM\'s plan was not applied in these iterations; the deterministic plan was used.</p>'
    return "<h2>Planner fallbacks</h2>\n" + note + _table(rows, raw={0, 1, 2, 3, 4}, table_id="fallbacks")


def _profile(summary: Mapping[str, Any] | None) -> str:
    if not summary:
        return ""
    totals, env = summary.get("totals") or {}, summary.get("env") or {}
    parts = ["<h2>Profile highlights (baseline)</h2>"]
    items = []
    if totals:
        items.append(
            (
                "Totals",
                _e(
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
                _e(
                    f"{env.get('device')}, {env.get('threads')} thread(s), input "
                    f"{env.get('input_shape')}, batch {env.get('batch')}"
                ),
            )
        )
    if summary.get("error"):
        items.append(("Profiler error", _e(summary["error"])))
    parts.append(_facts(items))
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
        parts.append("<h3>Slowest layers</h3>\n" + _table(rows, table_id="top-latency"))
    macs = summary.get("top_macs") or []
    if macs:
        rows = [["layer", "MACs", "MACs share"]] + [
            [r.get("name"), f"{int(r.get('macs') or 0):,}", percent(r.get("macs_share"))] for r in macs
        ]
        parts.append("<h3>Most MACs</h3>\n" + _table(rows, table_id="top-macs"))
    ops = summary.get("operators") or []
    if ops:
        rows = [["operator", "self ms", "share"]] + [
            [r.get("op"), r.get("self_ms"), percent(r.get("share"))] for r in ops
        ]
        parts.append("<h3>Operators (torch.profiler)</h3>\n" + _table(rows, table_id="operators"))
    groups = (summary.get("groups") or {}).get("rows") or {}
    if groups:
        rows = [["prunable group", "params share", "MACs share", "latency share"]]
        rows += [[name, *(percent(v) for v in values)] for name, values in groups.items()]
        parts.append("<h3>Prunable groups</h3>\n" + _table(rows, table_id="groups"))
    return "\n".join(parts)


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
    badge = f'<span class="badge {"ok" if status == "done" else "warn"}">{_e(status)}</span>'
    versions = ", ".join(f"{k} {v}" for k, v in (result.get("versions") or {}).items())
    body = [
        f"<h1>profiling-agent report: {_e(result.get('thread_id'))} {badge}</h1>",
        f'<div class="sub">{_e((result.get("model") or {}).get("ref"))} on '
        f"{_e((result.get('dataset') or {}).get('ref'))}</div>",
        _summary(result),
        _outcome(result),
        _candidates(result),
        _plots(images or {}),
        _plans(result),
        _fallbacks(result),
        _profile(profile_summary),
        f"<footer>Versions: {_e(versions)}. Generated from result.json and profile.json; rebuild with "
        f"<code>profiling-agent report RUN_DIR/{_e(result.get('thread_id'))}</code>.</footer>",
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>profiling-agent report: {_e(result.get('thread_id'))}</title>\n<style>{_CSS}</style>\n</head>\n"
        "<body><main>\n" + "\n".join(part for part in body if part) + "\n</main></body>\n</html>\n"
    )
