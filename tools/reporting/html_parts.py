"""Building blocks of report.html: the stylesheet, escaping, tables, fact lists, cards and data URIs."""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable
from typing import Any

REPORT_CSS = """
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
p.note { color: var(--muted); background: var(--bg); border-left: 3px solid var(--line); padding: 3px 10px; }
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


def esc(value: Any) -> str:
    """Escape any value for HTML text and attributes (plans may hold LLM text)."""
    return html.escape("" if value is None else str(value), quote=True)


def _is_num_cell(text: str) -> bool:
    stripped = "".join(ch for ch in text if ch not in ",x%+-. ")
    return bool(stripped) and stripped.isdigit()


def html_table(
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
    attrs = (f' id="{esc(table_id)}"' if table_id else "") + (f' class="{esc(css)}"' if css else "")
    out = [
        f"<table{attrs}>",
        "<thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in rows[0]) + "</tr></thead>",
        "<tbody>",
    ]
    for n, row in enumerate(rows[1:]):
        cls = classes[n] if n < len(classes) and classes[n] else ""
        cells = []
        for i, cell in enumerate(row):
            text = cell if i in raw else esc(cell)
            num = i not in raw and _is_num_cell(str(cell))
            cells.append(f'<td class="num">{text}</td>' if num else f"<td>{text}</td>")
        out.append((f'<tr class="{esc(cls)}">' if cls else "<tr>") + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def html_facts(items: Iterable[tuple[str, str]]) -> str:
    """Render a definition list; values are already escaped HTML."""
    return '<dl class="facts">' + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


def html_card(label: str, value: str, detail: str = "", tone: str = "") -> str:
    """One headline card: a label, a value and an optional detail line."""
    cls = f"value {tone}".strip()
    return (
        f'<div class="card"><div class="label">{esc(label)}</div><div class="{cls}">{esc(value)}</div>'
        f'<div class="detail">{esc(detail)}</div></div>'
    )


def data_uri(png: bytes) -> str:
    """Encode a PNG as a data: URI to embed in the report."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")
