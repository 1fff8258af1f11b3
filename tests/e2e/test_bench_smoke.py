"""Every script under bench/ runs its smoke mode (`--tiny`) end to end and prints its table: benchmarks cannot rot.

Each script's `main(argv)` runs in this process (its module loaded from bench/, as `python bench/NAME.py` loads
it), so a renamed or removed function anywhere on a script's path fails here. The zoo benches share one tiny zoo
(`bench/zoo.py --tiny`: the zoo's four architectures, one epoch on a scikit-learn digits stand-in) built in a
temporary folder; the others build 2-block configs or use the embedded digits models. bench/budget.py,
bench/estimate.py and bench/global_pruning.py are libraries of the matched-budget scripts and run inside them.
The scripts that launch several processes or whole CLI runs of their own (distributed, resume_distill) are marked
slow: `make test` runs them, `make test-fast` does not.
"""

from __future__ import annotations

import json
import resource
import time

import pytest
import torch
from helpers.bench_scripts import BENCH, bench_module

SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py"))
LIBRARIES = {"budget", "cli_runs", "estimate", "global_pruning", "llm_fake_server"}  # imported by others; no main
TINY_ENV = "PROFILING_AGENT_ZOO_TINY"


@pytest.fixture
def bench_env(monkeypatch):
    """Undo what a script sets for its process: the tiny-zoo switch, torch's threads, HF variables."""
    monkeypatch.delenv(TINY_ENV, raising=False)
    for key in ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS", "KINETO_LOG_LEVEL"):
        monkeypatch.setenv(key, "error" if key == "TRANSFORMERS_VERBOSITY" else "1")
    threads = torch.get_num_threads()
    yield monkeypatch
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_zoo(tmp_path_factory):
    """The tiny zoo, built once by `bench/zoo.py --tiny --out DIR` (its own smoke test)."""
    out = tmp_path_factory.mktemp("tiny-zoo")
    zoo = bench_module("zoo")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(TINY_ENV, raising=False)
        threads = torch.get_num_threads()
        start = time.perf_counter()
        assert zoo.main(["--tiny", "--out", str(out)]) == 0
        torch.set_num_threads(threads)
    meta = json.loads((out / "zoo.json").read_text())
    assert sorted(meta["models"]) == sorted(zoo.FAMILIES) and meta["train_images"] == zoo.TINY.train_images
    assert all(m["epochs"] == 1 for m in meta["models"].values())
    print(f"tiny zoo built in {time.perf_counter() - start:.1f} s")
    return out


def _cpu_s() -> float:
    """CPU-seconds of this process and its finished children (the scripts that launch processes wait for them)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def smoke(name: str, argv: list[str], capsys) -> str:
    """Run bench/NAME.py's main(argv); assert it exits 0; return its stdout (wall and CPU seconds go to the log)."""
    module = bench_module(name)
    start, cpu = time.perf_counter(), _cpu_s()
    code = module.main(argv)
    out = capsys.readouterr().out
    assert code in (0, None), out[-2000:]
    with capsys.disabled():
        wall, used = time.perf_counter() - start, _cpu_s() - cpu
        print(f"\nbench/{name}.py {' '.join(argv)}: {wall:.1f} s wall, {used:.1f} CPU-s")
    return out


def table_rows(text: str) -> list[str]:
    """The Markdown table rows (not the separator lines) of a script's output."""
    return [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("|---")]


def test_every_script_has_a_smoke_test():
    tested = (
        {"zoo"}
        | set(ZOO_SMOKE)
        | set(PLAIN_SMOKE)
        | {"streaming", "llm_planners", "distributed", "resume_distill", "generalization"}
    )  # bench/tokens.py --quick (four NNCF INT8 forms, slow) is also run by tests/e2e/test_bench_tokens.py
    assert set(SCRIPTS) - LIBRARIES == tested
    for name in LIBRARIES:  # libraries: imported without error, used by the matched-budget smoke tests
        assert not hasattr(bench_module(name), "main")


# the zoo benches: (argv after --tiny --zoo DIR, a string the table must hold)
ZOO_SMOKE = {
    "recovery": (["vit", "resnet"], "| vit |"),
    "matched_budgets": ([], "| 20% | reconstruct |"),
    "paper_tables": ([], "## Table 4"),
    "latency_floor": ([], "| ort_dynamic ("),
    "resnet_depth": ([], "| unpruned |"),
    "tokens": (["--backends", "ort_dynamic"], "| ort_dynamic | pruned 30% + merged r=8 |"),  # zoo mode, vit-tokens
}


@pytest.mark.parametrize("name", sorted(ZOO_SMOKE))
def test_zoo_bench_smoke(name, tiny_zoo, bench_env, capsys, tmp_path):
    extra, marker = ZOO_SMOKE[name]
    argv = ["--tiny", "--zoo", str(tiny_zoo), *extra]
    if name == "paper_tables":
        argv += ["--json", str(tmp_path / "tables.json"), "--work", str(tmp_path / "work")]
    out = smoke(name, argv, capsys)
    assert marker in out and table_rows(out), out[-2000:]


# the benches on 2-block configs or the embedded digits models: (argv, a string the output must hold)
PLAIN_SMOKE = {
    "architectures": (["--tiny", "--threads", "1"], "| tiny ResNet-101 | pruned+qint8 |"),
    "latency_budget": (["--tiny", "--repeats", "2"], "ort_dynamic"),
    "probe_speed": (["--tiny"], "fast / full (all groups, extrapolated)"),
    "backends": (["--tiny"], "| vit-digits | pruned:ort_dynamic"),
    "time_to_result": (["--tiny", "--models", "vit"], "total:"),
    "contention": (["--tiny"], "false-flag rate (quiet blocks):"),
    "ties": (["--timings", "20"], "apart(equal)"),  # synthetic timings only
    # the state prepared in this process, one child running its profile step (a fresh process: both profile rows),
    # one whole short run of embedded:vit-digits on 16 images, ONNX Runtime's forms, recovery without distillation
    # (a crash found is reported in the table: the bench exits 1 for it only with --strict)
    "crash_stress": (["--tiny"], "whole short run (CLI)"),
    # the embedded ResNet run twice with one seed on 16 images, in this process: the two best/ folders compared
    "same_seed": (["--tiny"], "byte-identical best/:"),
}


@pytest.mark.parametrize("name", sorted(PLAIN_SMOKE))
def test_bench_smoke(name, bench_env, capsys, tmp_path):
    argv, marker = PLAIN_SMOKE[name]
    if name in ("time_to_result", "contention", "crash_stress", "same_seed"):
        argv = [*argv, "--work", str(tmp_path)]
    out = smoke(name, argv, capsys)
    assert marker in out, out[-2000:]


def test_streaming_smoke(bench_env, capsys, tmp_path):
    out = smoke("streaming", ["--tiny", "--work", str(tmp_path), "--threads", "1"], capsys)
    (row,) = [r for r in table_rows(out) if r.startswith("| 64 |")]
    assert "data.safetensors" in row


def test_llm_planners_smoke(bench_env, capsys, tmp_path):
    from helpers.fake_llm import ScriptedOpenAIServer, chat_completion

    plan = {
        "pruning": [
            {"layer": r"^vit\.layers\.(0|1)\.mlp\.fc1$", "type": "structured", "ratio": 0.25, "justification": "smoke"}
        ],
        "quantization": [],
    }
    with ScriptedOpenAIServer([chat_completion(json.dumps(plan))] * 20, lifetime=600) as server:
        argv = ["--tiny", "--base-url", server.base_url, "--model", "fake-model", "--work", str(tmp_path)]
        bench_env.setenv("OPENAI_API_KEY", "not-a-key")
        out = smoke("llm_planners", argv, capsys)
    assert server.requests and table_rows(out), out[-2000:]


@pytest.mark.slow
def test_distributed_smoke(tiny_zoo, bench_env, capsys):
    """The 2-process jobs fork their ranks (helpers.forked_ranks): torchrun's own start is not what this checks."""
    from helpers.forked_ranks import launcher

    out = smoke("distributed", ["--tiny", "--zoo", str(tiny_zoo), "--launcher", launcher()], capsys)
    assert "identical predictions: True" in out


@pytest.mark.slow
def test_resume_distill_smoke(quick_resnet, bench_env, capsys, tmp_path):
    """The session's quick digits ResNet, distilled whole and killed then resumed (three CLI processes)."""
    cache = str(quick_resnet[2])
    out = smoke("resume_distill", ["--tiny", "--work", str(tmp_path), "--cache", cache], capsys)
    assert "largest weight difference, resumed vs uninterrupted" in out


def test_generalization_smoke(bench_env, capsys, tmp_path):
    """One tiny model: trained, the agent's CLI run, one oracle level of each ranking; then the cached rerun."""
    argv = ["--tiny", "--threads", "1", "--out", str(tmp_path), "--json", str(tmp_path / "rows.json")]
    out = smoke("generalization", argv, capsys)
    (row,) = [r for r in table_rows(out) if r.startswith("| resnet-basic-digits-tiny |")]
    assert "Targets on the report half:" in out and "failed runs: 0" in out, out[-2000:]
    (first,) = json.loads((tmp_path / "rows.json").read_text())["rows"]
    assert [p["level"] for pts in first["oracle"]["points"].values() for p in pts] == [0.1, 0.1]
    assert first["agent"]["rounds"] and first["agent"]["rounds"][0]["predicted"] is not None
    again = smoke("generalization", argv, capsys)  # models, oracle and agent all cached: the same table, no run
    assert row in table_rows(again)
