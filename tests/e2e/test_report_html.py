"""Tests of the plots, report.html and `profiling-agent report`, on one real finished run of the graph."""

from __future__ import annotations

import base64
import copy
import io
import json
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from helpers.quick_assets import FAST_CONTEXT

from profiling_agent.graph.cli.main import main
from profiling_agent.tools.reporting.html import render_html
from profiling_agent.tools.reporting.plots import (
    PLOT_FILES,
    accuracy_floor,
    extra_baselines,
    pareto_front,
    pareto_points,
    render_plots,
)

pytestmark = pytest.mark.slow

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EVIL = "<script>alert('x')</script><img src=x onerror=alert(1)>"


@pytest.fixture
def finished_run(digits_run):
    """(run folder, final state) of the session's shared two-round digits ViT run (accuracy is not under test)."""
    return digits_run.run, digits_run.out


def _result(run: Path) -> dict:
    return json.loads((run / "result.json").read_text())


class _Page(HTMLParser):
    """Collect tables (by id, rows of (class, cells)), images, tags and text of an HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.images: list[dict[str, str]] = []
        self.tables: dict[str, list[tuple[str, list[str]]]] = {}
        self.text: list[str] = []
        self._table: str | None = None
        self._row: tuple[str, list[str]] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        if tag == "img":
            self.images.append(attrs)
        elif tag == "table":
            self._table = attrs.get("id") or f"table{len(self.tables)}"
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self._row = (attrs.get("class") or "", [])
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row[1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None and self._table is not None:
            self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


def _parse(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    page.close()
    return page


def test_graph_run_writes_plots_markdown_links_and_html(finished_run):
    run, out = finished_run
    assert out["report"]["html"] == "report.html" and (run / "report.html").stat().st_size > 10_000
    assert out["report"]["plots"] == sorted(f"plots/{name}" for name, _ in PLOT_FILES.values())
    markdown = (run / "report.md").read_text()
    for name, caption in PLOT_FILES.values():
        assert (run / "plots" / name).read_bytes().startswith(PNG_SIGNATURE)
        assert f"![{caption}](plots/{name})" in markdown
    assert markdown.index("## Plots") < markdown.index("## Plans")


def test_html_tables_hold_the_numbers_of_result_json(finished_run):
    run, _ = finished_run
    result = _result(run)
    page = _parse((run / "report.html").read_text())
    header, *rows = page.tables["candidates"]
    assert header[1][:4] == ["model", "val top-1 %", "agree %", "lat b1 ms"]
    assert len(rows) == 1 + len(result["candidates"]) >= 2
    base = result["baseline"]
    cls, cells = rows[0]
    assert cls == "baseline" and cells[0] == "baseline"
    assert cells[1] == f"{base['accuracy']:.2f}" and cells[3] == f"{base['latency_ms']:.2f}"
    assert (
        cells[6] == f"{base['params']:,}" and cells[7] == f"{base['macs']:,}" and cells[8] == f"{base['size_mb']:.3f}"
    )
    for (cls, cells), cand in zip(rows[1:], result["candidates"], strict=True):
        assert cells[0] == f"iter {cand['iteration']}"
        if cand["status"] == "rejected":  # rejected on its trial slice: no full evaluation, shown as such
            assert cls == "failed" and cells[-1] == "rejected" and set(cells[1:9]) == {"-"}
            continue
        assert cells[1] == f"{cand['accuracy']:.2f}" and cells[2] == f"{cand['agreement']:.2f}"
        assert cells[3] == f"{cand['latency_ms']:.2f}" and cells[4] == f"{cand['latency_batch_ms']:.2f}"
        assert cells[5] == f"{cand['speedup']:.2f}x"
        assert cells[6] == f"{cand['params']:,}" and cells[7] == f"{cand['macs']:,}"
        assert cells[8] == f"{cand['size_mb']:.3f}"
        assert (cls == "best") == (cand["iteration"] == result["best"]["iteration"])
    details = {cells[0]: cells[1:] for _, cells in page.tables["best-details"][1:]}
    best = result["best"]
    assert details["params"] == [f"{base['params']:,}", f"{best['params']:,}"]
    assert details["batch-1 latency ms"] == [f"{base['latency_ms']:.3f}", f"{best['latency_ms']:.3f}"]
    # every plan's pruning entries are shown with their justification
    text = "".join(page.text)
    for cand in result["candidates"]:
        for entry in cand["plan"]["pruning"]:
            assert entry["justification"] in text and entry["layer"] in text
    assert (
        page.tables["top-latency"][1][1][0]
        == max(json.loads((run / "profile.json").read_text())["layers"], key=lambda r: r["latency_ms"])["name"]
    )


def test_table_rows_follow_candidates_including_failed_ones(finished_run):
    run, _ = finished_run
    result = _result(run)
    first = result["candidates"][0]
    extra = {**first, "iteration": 7, "accuracy": 12.3456, "params": 4321, "macs": 98765, "size_mb": 0.0421}
    failed = {"iteration": 8, "status": "failed", "plan": {}, "planner": "llm", "error": "pruning failed: boom"}
    result["candidates"] = [first, extra, failed]
    result["best"] = {**result["best"], "iteration": 7}
    rows = _parse(render_html(result)).tables["candidates"][1:]
    assert [cls for cls, _ in rows] == ["baseline", "", "best", "failed"]
    assert rows[2][1][:2] == ["iter 7", "12.35"] and rows[2][1][6:9] == ["4,321", "98,765", "0.042"]
    assert rows[3][1][0] == "iter 8" and rows[3][1][1] == "-" and rows[3][1][-1] == "failed"


def test_every_image_is_an_embedded_png_and_nothing_is_external(finished_run):
    from PIL import Image

    run, _ = finished_run
    html_text = (run / "report.html").read_text()
    page = _parse(html_text)
    assert len(page.images) == len(PLOT_FILES)
    for img in page.images:
        prefix = "data:image/png;base64,"
        assert img["src"].startswith(prefix), img["src"][:40]
        data = base64.b64decode(img["src"][len(prefix) :], validate=True)
        assert data.startswith(PNG_SIGNATURE)
        with Image.open(io.BytesIO(data)) as im:
            im.verify()
        assert img["alt"]
    assert not {"script", "link", "iframe", "object"} & set(page.tags)
    assert "http://" not in html_text and "https://" not in html_text and "file:" not in html_text


def test_llm_text_is_escaped(finished_run):
    run, _ = finished_run
    result = copy.deepcopy(_result(run))
    cand = result["candidates"][0]
    cand["plan"]["rationale"] = EVIL
    cand["plan"]["pruning"][0]["justification"] = EVIL
    cand["plan"]["pruning"][0]["layer"] = EVIL
    cand["error"] = EVIL
    result["stop_reason"] = EVIL
    result["planner"]["fallbacks"] = [
        {"reason": EVIL, "stage": "validate", "rejected": EVIL, "model": "fake", "iteration": 1},
        {
            "reason": "bad json",
            "stage": "parse",
            "rejected": [{"stage": "parse", "reasons": [EVIL], "answer": EVIL}],
            "tool_errors": [{"name": EVIL, "error": EVIL}],
            "model": "f",
            "iteration": 2,
        },
    ]
    result["planner"]["llm"] = {"model": EVIL, "usage": {"calls": 3}, "transcripts": [EVIL], "tool_errors": []}
    page_text = render_html(result)
    page = _parse(page_text)
    assert "script" not in page.tags and "img" not in page.tags  # no images passed, none injected
    assert "<script" not in page_text and "<img" not in page_text
    text = "".join(page.text)
    assert text.count(EVIL) >= 11  # shown to the reader as text, literally
    fallback_rows = page.tables["fallbacks"][1:]
    assert [cells[0] for _, cells in fallback_rows] == ["1", "2"] and EVIL in fallback_rows[0][1][3]


def test_cli_report_rebuilds_from_files_deterministically(finished_run, tmp_path, capsys):
    run, _ = finished_run
    copy_dir = tmp_path / "t1"
    copy_dir.mkdir()
    for name in ("result.json", "profile.json"):
        shutil.copy(run / name, copy_dir / name)
    (copy_dir / "plots").mkdir()
    (copy_dir / "plots" / "stale.png").write_bytes(b"x")  # unknown files are left alone
    assert main(["report", str(copy_dir)]) == 0
    assert "report.html" in capsys.readouterr().out
    first = (copy_dir / "report.html").read_bytes()
    assert first == (run / "report.html").read_bytes()  # same files in, same report out as the graph's
    assert (copy_dir / "report.md").read_text() == (run / "report.md").read_text()
    for name, _ in PLOT_FILES.values():
        assert (copy_dir / "plots" / name).read_bytes() == (run / "plots" / name).read_bytes()
    # without profile.json: the result charts and tables only, and the profile charts are removed
    (copy_dir / "profile.json").unlink()
    assert main(["report", str(copy_dir)]) == 0
    assert sorted(p.name for p in (copy_dir / "plots").iterdir()) == [
        "pareto_latency.png",
        "pareto_params.png",
        "predicted_loss.png",  # from result.json's predicted and measured losses per round
        "recovery_curve.png",  # from result.json's distillation curves
        "stale.png",
    ]
    assert len(_parse((copy_dir / "report.html").read_text()).images) == 4


@pytest.mark.parametrize("case", ["missing", "no-result", "running", "not-json", "not-a-result", "bad-field"])
def test_cli_report_rejects_what_is_not_a_finished_run(finished_run, tmp_path, capsys, case):
    run, _ = finished_run
    folder = tmp_path / "run"
    if case != "missing":
        folder.mkdir()
    result = _result(run)
    if case == "running":
        (folder / "result.json").write_text(json.dumps({**result, "status": "running"}))
    elif case == "not-json":
        (folder / "result.json").write_text("{not json")
    elif case == "not-a-result":
        (folder / "result.json").write_text(json.dumps({"thread_id": "t1"}))
    elif case == "bad-field":
        (folder / "result.json").write_text(json.dumps({**result, "candidates": [{"no": "iteration"}]}))
    assert main(["report", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("profiling-agent: error:") and "\n" not in err
    assert not (folder / "report.html").exists()


def test_cli_report_bad_folder_exits_2_without_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "profiling_agent.graph.cli", "report", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"profiling-agent: error: not a finished run: {tmp_path} has no result.json"
    assert "Traceback" not in proc.stderr


def test_pareto_points_front_and_extra_baselines(finished_run):
    run, _ = finished_run
    result = _result(run)
    assert extra_baselines(result) == []  # no "baselines" key: nothing extra, no error
    points = pareto_points(result)
    assert [p["kind"] for p in points].count("baseline") == 1 and [p["kind"] for p in points].count("best") == 1
    assert points[0]["latency_rel"] == 1.0
    rounds = [p for p in points if p["kind"] in ("candidate", "best") and p["label"].startswith("iter ")]
    evaluated = [cand for cand in result["candidates"] if cand["status"] == "ok"]  # a rejected one has no point
    for p, cand in zip(rounds, evaluated, strict=True):
        assert p["params"] == cand["params"] and p["latency_rel"] == pytest.approx(1 / cand["speedup"])
    best = result["best"]  # the best's other backend forms are drawn too, each at its own measured speed
    others = [v for v in best["variants"] if v["status"] == "ok" and v["name"] != best["delivered"]]
    forms = [p for p in points if p["kind"] == "variant"]
    where = f"iter {best['iteration']}" if best["iteration"] else "unpruned"  # 0: quantization alone was delivered
    assert [p["label"] for p in forms] == [f"{where} {v['name']}" for v in others]
    assert [p["latency_rel"] for p in forms] == pytest.approx([1 / v["speedup"] for v in others])
    result["baselines"] = {
        "uniform 40%": {"accuracy": 90.0, "params": 1000, "speedup": 2.0},
        "onnx int8": {"accuracy": 95.0, "latency_ms": result["baseline"]["latency_ms"] / 4},
        "broken": "not a dict",
    }
    refs = [p for p in pareto_points(result) if p["kind"] == "reference"]
    assert [(p["label"], p["latency_rel"]) for p in refs] == [("uniform 40%", 0.5), ("onnx int8", pytest.approx(0.25))]
    listed = {**result, "baselines": [{"name": "onnx", "accuracy": 1.0}, {"accuracy": 2.0}, 3]}
    assert [b["name"] for b in extra_baselines(listed)] == ["onnx", "ref 2"]
    page = _parse(render_html(result, images=None))
    assert len(page.tables["candidates"]) == 2 + len(result["candidates"])  # extra baselines stay out of it
    refs_table = {cells[0]: cells[1:] for _, cells in page.tables["baselines"][1:]}
    assert refs_table["uniform 40%"] == ["90.00", "-", "2.00", "1,000", "-"] and "broken" not in refs_table
    assert len(_parse(render_html(result, images=render_plots(result, None))).images) == 3  # Pareto plots, predictions


def test_pareto_front_and_accuracy_floor_are_exact():
    pts = [
        {"label": "a", "accuracy": 90.0, "params": 100.0},
        {"label": "b", "accuracy": 80.0, "params": 50.0},
        {"label": "c", "accuracy": 85.0, "params": 120.0},  # dominated by a
        {"label": "d", "accuracy": 80.0, "params": 60.0},  # dominated by b
        {"label": "e", "accuracy": 95.0, "params": None},  # no params: not on this plot
    ]
    assert [p["label"] for p in pareto_front(pts, "params")] == ["b", "a"]
    assert accuracy_floor(pts[:4], 91.0, 1.0) == 86.0  # 80 is more than max(4 x budget, 5 pp) below 91
    assert accuracy_floor(pts[:4], 91.0, 5.0) is None  # within 20 pp of the baseline: nothing clipped
    assert accuracy_floor(pts[:4], None, 1.0) is None


def test_report_node_keeps_report_md_when_charts_fail(finished_run, tmp_path, monkeypatch):
    from types import SimpleNamespace

    from profiling_agent.nodes.report import report
    from profiling_agent.state import Context, State
    from profiling_agent.tools.reporting import files as report_files

    run, out = finished_run
    copy_dir = tmp_path / "t1"
    shutil.copytree(run, copy_dir, ignore=shutil.ignore_patterns("report.*", "plots"))

    def broken(*_args, **_kwargs):
        raise RuntimeError("no fonts")

    monkeypatch.setattr(report_files, "write_report_files", broken)
    state = State.model_validate({**out, "run_path": str(copy_dir)})
    context = Context(run_root=str(tmp_path), **{**FAST_CONTEXT, "plots": True})
    update = report(state, SimpleNamespace(context=context))
    assert update["status"] == "done" and update["report"]["html"] is None
    assert "plots and report.html not written (RuntimeError: no fonts)" in update["history"][0]["message"]
    assert (copy_dir / "report.md").read_text().startswith("# profiling-agent report")
    assert not (copy_dir / "report.html").exists() and not (copy_dir / "plots").exists()


def test_a_run_without_plots_writes_both_reports_without_charts_and_says_so(finished_run, tmp_path):
    from types import SimpleNamespace

    from profiling_agent.nodes.report import report
    from profiling_agent.state import Context, State

    run, out = finished_run
    copy_dir = tmp_path / "t1"
    shutil.copytree(run, copy_dir, ignore=shutil.ignore_patterns("report.*"))  # the earlier charts stay, to go
    assert any((copy_dir / "plots").glob("*.png"))
    state = State.model_validate({**out, "run_path": str(copy_dir)})
    context = Context(run_root=str(tmp_path), **{**FAST_CONTEXT, "plots": False})
    update = report(state, SimpleNamespace(context=context))
    assert update["status"] == "done" and update["report"]["plots"] == [] and update["report"]["html"] == "report.html"
    assert "charts not drawn (--no-plots)" in update["history"][0]["message"]
    assert not any((copy_dir / "plots").glob("*.png"))  # no stale chart left beside reports that do not show it
    markdown = (copy_dir / "report.md").read_text()
    assert markdown.startswith("# profiling-agent report") and "](plots/" not in markdown
    page = (copy_dir / "report.html").read_text()
    assert "data:image/png" not in page and "<table" in page


def test_report_opens_in_chromium_with_every_chart_drawn(finished_run, tmp_path):
    """report.html in a real headless Chromium: every chart decodes, is laid out, and its pixels are not blank."""
    from helpers.browser import WIDTH, chart_layout, drawn_fraction, require_browser, screenshot
    from PIL import Image

    browser = require_browser()
    run, _ = finished_run
    page = tmp_path / "report.html"
    shutil.copy(run / "report.html", page)
    layout = chart_layout(browser, page, tmp_path)
    boxes = layout["boxes"]
    assert [b["id"] for b in boxes] == [f"plot-{key}" for key in PLOT_FILES]
    for box in boxes:
        assert box["complete"] and box["natural"] > 300, box  # decoded by the browser
        assert box["w"] > 300 and box["h"] > 200 and box["x"] + box["w"] <= WIDTH, box  # laid out, on the page
    shot = screenshot(browser, page, tmp_path / "report.png", layout["height"])
    with Image.open(shot) as image:
        assert image.size == (WIDTH, layout["height"])
        for box in boxes:
            area = (int(box["x"]), int(box["y"]), int(box["x"] + box["w"]), int(box["y"] + box["h"]))
            colours, drawn = drawn_fraction(image, area)
            assert colours >= 16 and drawn > 0.03, (box["id"], colours, drawn)  # axes, bars, text: not one colour


def test_headline_speed_of_the_run_leads_with_quantization_only(finished_run):
    run, _ = finished_run
    delivery = _result(run)["delivery"]
    quant = delivery["quantization_only"]
    page = (run / "report.html").read_text()
    first = page.index('<div class="cards">')
    assert page.index("Speed vs quantization only", first) < page.index("Speed vs torch FP32", first)
    if delivery["pruning_added"]:
        sentence = f"{delivery['vs_quantization_only']:.2f}x the quantization-only form ({quant['name']}"
    else:  # no plan beat quantization alone: that form itself was delivered
        sentence = f"the quantization-only form ({quant['name']} of the unpruned model) was delivered"
    assert sentence in page
    speed_line = next(line for line in (run / "report.md").read_text().splitlines() if line.startswith("**Speed:**"))
    assert speed_line.index("the quantization-only form") < speed_line.index("the original torch FP32 model")


def test_notes_are_drawn_neutral_and_warnings_in_the_warning_style_in_chromium(finished_run, tmp_path):
    """A note (the trial slice) is grey on the page's light background; a warning is red on the warning pink."""
    from helpers.browser import element_styles, require_browser

    browser = require_browser()
    run, _ = finished_run
    result = _result(run)  # the run's own result, with the outcome's warnings added: interval, weak data, timings
    result["best"] |= {"ci_crosses_budget": True}
    result["protocol"]["test"]["images"] = 5
    result["delivery"] = {**result["delivery"], "timings_flagged": True, "flag_reason": "a reference workload ran 2x"}
    page = tmp_path / "report.html"
    page.write_text(render_html(result))
    styles = element_styles(browser, page, tmp_path, ["p.note", ".badge.warn"])
    notes, warnings = styles["p.note"], styles[".badge.warn"]
    trial = next(n for n in notes if n["text"].startswith("Every plan trial was judged on"))
    assert trial["cls"] == "note" and trial["color"] == "rgb(89, 99, 110)"  # --muted
    assert trial["background"] == "rgb(246, 248, 250)"  # --bg, the page's neutral grey
    texts = [w["text"] for w in warnings]
    assert any(t.startswith("Caution: the accuracy change") for t in texts)
    assert "Timings flagged: a reference workload ran 2x." in texts
    assert any(t.startswith("Accuracy results mean little: 5 test images") for t in texts)
    for warning in warnings:
        assert warning["color"] == "rgb(180, 35, 24)" and warning["background"] == "rgb(255, 235, 233)"  # --bad
    assert not any(w["text"].startswith("Every plan trial") for w in warnings)
    # the graph's own report.html: its notes are notes too, never in a warning badge
    own = element_styles(browser, run / "report.html", tmp_path, ["p.note", ".badge.warn"])
    assert any(n["text"].startswith("Every plan trial was judged on") for n in own["p.note"])
    assert not any("plan trial" in w["text"] for w in own[".badge.warn"])
