"""bench/tokens.py --quick: the four ov_int8 forms (unpruned, merged, pruned, both) build and time side by side."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.bench_scripts import bench_module

pytest.importorskip("openvino")
pytest.importorskip("nncf")


@pytest.mark.slow  # four NNCF INT8 forms: a minute on a loaded 2-core machine
def test_quick_tokens_bench_runs_and_reports_each_variant(tmp_path, capsys):
    """The script's main in this process (nothing here is about the process): its JSON rows and printed table."""
    out, threads = tmp_path / "tokens.json", torch.get_num_threads()
    try:
        code = bench_module("tokens").main(["--quick", "--models", "vit-b16", "--json", str(out)])
    finally:
        torch.set_num_threads(threads)
    stdout = capsys.readouterr().out
    assert code == 0, stdout[-2000:]
    rows = json.loads(out.read_text())["models"]["vit-b16"]
    assert list(rows) == ["unpruned", "merged", "pruned", "merged+pruned"]
    assert rows["unpruned"]["speedup_b1"] == 1.0 and all(r["latency_b1_cpu_ms"] > 0 for r in rows.values())
    assert rows["merged"]["schedule"] == [8, 8] and rows["merged"]["tokens_per_layer"] == [57, 49]  # 2 layers
    assert rows["pruned"]["mlp_widths"] == rows["merged+pruned"]["mlp_widths"] and rows["pruned"]["mlp_widths"][0] < 256
    assert "| merged+pruned |" in stdout and "target (merged + pruned >= 2.0x at batch 1)" in stdout
