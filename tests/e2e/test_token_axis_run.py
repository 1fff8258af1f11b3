"""A latency run on a ViT with many tokens: the token axis is measured, weighed, planned, applied and reported."""

from __future__ import annotations

import json

import pytest


def _many_token_vit(folder):
    """Save a random 2-layer ViT reading the digits' 32x32 images in 4x4 patches (64 tokens + CLS)."""
    from helpers.tiny import digit_labels, seeded, vit_config
    from transformers import ViTForImageClassification

    from profiling_agent.tools.models.embedded import digits_processor

    model = seeded(ViTForImageClassification, vit_config(image_size=32, patch_size=4, **digit_labels()))
    model.save_pretrained(folder)
    digits_processor().save_pretrained(folder)
    return folder


def _steady_torch_time(model, example, repeats):
    """Eager torch's latency, steadied: proportional to the tokens the layers see (merging pays, measurably)."""
    from profiling_agent.tools.compression.token_merge import token_schedule, tokens_per_layer
    from profiling_agent.tools.models.merged_tokens import token_count

    schedule = token_schedule(model) or [0] * len(model.vit.layers)
    seen = tokens_per_layer(model, schedule)
    return 1.0 * sum(seen) / (len(seen) * token_count(model))


@pytest.mark.slow
def test_a_latency_run_on_a_many_token_vit_plans_merges_and_reports_the_tokens(tmp_path, monkeypatch):
    from helpers.quick_assets import cache_env

    from profiling_agent.graph.cli.main import main
    from profiling_agent.tools.models import embedded
    from profiling_agent.tools.models.artifact_load import load_artifact
    from profiling_agent.tools.profiling import planning_latency, token_latency

    monkeypatch.setattr(token_latency, "_time_torch", _steady_torch_time)
    monkeypatch.setattr(planning_latency, "records_dir", lambda: tmp_path / "records")  # not the machine's record
    with cache_env(tmp_path / "cache"):
        dataset = embedded.ensure_dataset()
    model = _many_token_vit(tmp_path / "vit64")
    code = main(["run", "--model", str(model), "--dataset", str(dataset), "--target", "latency",
                 "--target-reduction", "0.5", "--max-acc-drop", "30", "--iterations", "2", "--planner",
                 "deterministic", "--backend", "torch", "--recover-steps", "4", "--subset", "100", "--test-subset",
                 "60", "--calibration", "16", "--repeats", "2", "--threads", "1", "--run-dir", str(tmp_path),
                 "--thread-id", "tokens"])  # fmt: skip
    assert code == 0
    run = tmp_path / "tokens"
    result = json.loads((run / "result.json").read_text())
    axis = result["token_axis"]
    assert axis["form"] == "torch" and axis["batch"] == 1
    assert [r["rate"] for r in axis["rates"]] == [0, 11, 21, 32, None]
    assert axis["rates"][-1]["schedule"] == [16, 12]  # the front-loaded schedule, timed beside the uniform rates
    paying = [r for r in axis["rates"][1:] if r["dropped"] is None]
    assert paying and all(r["saved_share"] > 0.05 and r["drop_pp"] is not None for r in paying)
    first = result["candidates"][0]
    weighed = first["tokens"]["weighed"]  # round 1 tried merging against pruning alone on the trial slice
    assert weighed["with_pp"] is not None and weighed["without_pp"] is not None
    assert weighed["chosen"] == (weighed["with_pp"] <= weighed["without_pp"])
    merged = [c for c in result["candidates"] if (c.get("tokens") or {}).get("entry")]
    assert bool(merged) == weighed["chosen"]  # later rounds keep round 1's choice
    for cand in merged:
        tokens = cand["tokens"]
        entry = tokens["entry"]
        assert (entry.get("rate"), entry.get("schedule")) == (weighed["rate"], weighed.get("schedule"))
        assert tokens["bought"]["saved_share"] > 0.05
        loaded = load_artifact(run / cand["path"])  # the delivered candidate merges as planned
        # one entry per layer the candidate kept: a plan that removed a block (latency plans may) leaves one
        assert tokens["schedule"] is not None and len(tokens["schedule"]) == loaded.model.config.num_hidden_layers
        assert loaded.recipe["token_schedule"] == tokens["schedule"]
    report = (run / "report.md").read_text()
    assert "Token merging on torch at batch 1" in report and "token merging weighed" in report
    if merged:
        assert "merge tokens at " in report
