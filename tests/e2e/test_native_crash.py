"""A run whose process (or its child) dies by a real SIGSEGV in a step: the step, its stack and the resume, named.

Each crashing CLI is a process of its own, forked with the libraries already imported (helpers.forked_cli), whose
graph has one step replaced by helpers.crash_cli before the CLI starts; the child process of step 3 is the run's
own spawned child.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from helpers.crash_cli import install
from helpers.crash_helpers import THREAD, cli, start_forked

pytestmark = pytest.mark.slow


@pytest.fixture
def tiny_run(tmp_path):
    """A tiny random ViT saved with its processor, an offline environment, and the `run` flags of a short run."""
    from helpers.tiny import digit_labels, seeded, vit_config
    from transformers import ViTForImageClassification
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    model = tmp_path / "model"
    seeded(ViTForImageClassification, vit_config(**digit_labels())).save_pretrained(model)
    ViTImageProcessorPil(size={"height": 16, "width": 16}, image_mean=[0.5], image_std=[0.5]).save_pretrained(model)
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    env.update(PROFILING_AGENT_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1")
    runs = tmp_path / "runs"
    flags = [
        "--model", str(model), "--dataset", "embedded:digits", "--subset", "32", "--calibration", "8",
        "--iterations", "1", "--planner", "deterministic", "--threads", "1", "--repeats", "2",
        "--run-dir", str(runs), "--thread-id", THREAD, "--backend", "torch",
    ]  # fmt: skip  # torch's forms: the profile step the resume runs builds no ONNX Runtime or OpenVINO form
    return runs, env, flags


def _crashing(function: str, where: str, *args: str, env: dict[str, str], cwd: Path) -> tuple[int | None, str]:
    """Run the CLI on `args` with node function `function` crashing (`where`: "run" or "child"); (exit, stderr)."""
    proc = start_forked(cli(*args), env, cwd, prepare=functools.partial(install, function, where))
    _, err = proc.communicate(timeout=600)
    return proc.returncode, err


def _runs(runs: Path, capsys) -> str:
    """What `profiling-agent runs` prints, from the CLI's `main` in this process (the listing starts no step)."""
    from profiling_agent.graph.cli.main import main

    capsys.readouterr()
    code = main(["runs", "--run-dir", str(runs)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_a_native_crash_names_its_step_stack_and_resume(tiny_run, monkeypatch, capsys):
    runs, env, flags = tiny_run
    for key in ("PROFILING_AGENT_CACHE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(key, env[key])
    resume = f"profiling-agent resume {THREAD} --run-dir {runs}"
    folder = runs / THREAD / "crash"

    # 1. the run's own process dies by SIGSEGV in the profile step: its stack is on record
    code, err = _crashing("profile", "run", "run", *flags, env=env, cwd=runs.parent)
    assert code == -11, err[-3000:]
    [fault] = list(folder.glob("faulthandler-run-*.log"))
    stack = fault.read_text()
    assert stack.startswith("Fatal Python error: Segmentation fault")
    assert "in segfault_in_step" in stack and "in crashing_step" in stack  # the Python stack names the functions

    # 2. `runs` says which step it died in, where its stack is and how to resume
    first = f"run {THREAD} died by SIGSEGV in step profile: stack in {fault}; resume with `{resume}`"
    listing = _runs(runs, capsys)
    assert listing.strip().splitlines()[-1] == first
    assert f"{THREAD}     died" in listing

    # 3. `resume` says it once, sets the record aside and goes on; a child process of the next step dies by SIGSEGV:
    #    the run says so in one line and exits 1, without a traceback
    code, err = _crashing("probe", "child", "resume", THREAD, "--run-dir", str(runs), env=env, cwd=runs.parent)
    assert code == 1 and "Traceback" not in err, err[-3000:]
    assert err.splitlines()[0] == first.replace(str(fault), str(folder / "earlier" / fault.name))
    [child] = list(folder.glob("faulthandler-child-*.log"))
    assert err.strip().splitlines()[-1] == (
        f"profiling-agent: error: run {THREAD}: a child process of step probe_sensitivity died by SIGSEGV: "
        f"stack in {child} (then resume with `{resume}`)"
    )
    assert "in segfault_in_step" in child.read_text()
    assert not list(folder.glob("faulthandler-run-*.log"))  # the resumed run ended without a fault of its own

    # 4. the next `runs` names the child's crash, not the one already reported
    second = f"run {THREAD}: a child process died by SIGSEGV in step probe_sensitivity: stack in {child}; "
    assert _runs(runs, capsys).strip().splitlines()[-1] == second + f"resume with `{resume}`"
