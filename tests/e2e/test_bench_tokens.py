"""bench/tokens.py --quick: the four ov_int8 forms (unpruned, merged, pruned, both) build and time side by side."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openvino")
pytest.importorskip("nncf")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a subprocess building four NNCF INT8 forms: minutes on a loaded 2-core machine
def test_quick_tokens_bench_runs_and_reports_each_variant(tmp_path):
    out = tmp_path / "tokens.json"
    cmd = [sys.executable, str(ROOT / "bench" / "tokens.py"), "--quick", "--models", "vit-b16", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["models"]["vit-b16"]
    assert list(rows) == ["unpruned", "merged", "pruned", "merged+pruned"]
    assert rows["unpruned"]["speedup_b1"] == 1.0 and all(r["latency_b1_cpu_ms"] > 0 for r in rows.values())
    assert rows["merged"]["schedule"] == [8, 8, 8, 8] and rows["merged"]["tokens_per_layer"] == [57, 49, 41, 33]
    assert rows["pruned"]["mlp_widths"] == rows["merged+pruned"]["mlp_widths"] and rows["pruned"]["mlp_widths"][0] < 256
    assert "| merged+pruned |" in done.stdout and "target (merged + pruned >= 2.0x at batch 1)" in done.stdout
