"""Distillation killed (SIGKILL) and resumed vs uninterrupted, side by side: weights, steps, step times, threads.

    .venv/bin/python bench/resume_distill.py [--steps 120] [--kill-at 40] [--threads 1] [--work /tmp/resume-bench]
    .venv/bin/python bench/resume_distill.py --tiny   # smoke test: 12 steps, killed at 4, 48 + 32 images; the
                                                      # runs not killed run the CLI's main in this process

Prints the largest weight difference of the recovered models, both runs' step counts, the median step time of
every attempt (with its torch thread count) and the slowest resumed step over the uninterrupted median, next to
`uptime`'s load and the process CPU time, since wall times on a busy machine say little alone.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from profiling_agent.tools import run_layout

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "profiling_agent.graph.cli", *args]


def _run_args(model: Path, dataset: Path, runs: Path, thread: str, args: argparse.Namespace) -> list[str]:
    return _cli(
        "run",
        "--model",
        str(model),
        "--dataset",
        str(dataset),
        "--subset",
        str(args.subset),
        "--calibration",
        "16",
        "--iterations",
        "1",
        "--planner",
        "l2",
        "--ratio",
        "0.4",
        "--repeats",
        "2",
        "--threads",
        str(args.threads),
        "--recover",
        "auto",
        "--recover-steps",
        str(args.steps),
        "--recover-batch",
        "16",
        "--recover-minutes",
        str(args.minutes),
        "--backend",
        "torch",
        "--run-dir",
        str(runs),
        "--thread-id",
        thread,
        *(["--test-subset", str(args.test_subset)] if args.test_subset else []),
        *(["--no-plots"] if args.tiny else []),  # the smoke test: no report charts (matplotlib's drawing)
    )


def _run_to_end(cmd: list[str], env: dict[str, str], in_process: bool) -> tuple[int, str]:
    """Run the CLI command `cmd` to its end; return its exit code and stderr.

    `in_process` (--tiny): the CLI's main runs in this process, under `env`: a smoke's runs are seconds long and a
    fresh interpreter would spend longer importing the libraries than running.
    """
    if not in_process:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        return done.returncode, done.stderr
    from profiling_agent.graph.cli.main import main as cli_main

    err, saved = io.StringIO(), dict(os.environ)
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = cli_main(cmd[3:])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return code, err.getvalue()


def _cpu_seconds(times: os.times_result, own: bool) -> float:
    """CPU seconds of the finished children, and with `own` of this process too (where runs ran in it)."""
    return times.children_user + times.children_system + (times.user + times.system if own else 0.0)


def _weights(run: Path):
    from safetensors.torch import load_file

    return load_file(str(run_layout.iteration_dir(run, 1) / run_layout.RECOVERED / "model.safetensors"))


def _quick_resnet(work: Path, cache: str | None) -> tuple[Path, Path, Path]:
    """(model, dataset, cache): the quick digits ResNet trained into WORK/cache, or the one `cache` already holds."""
    from helpers.quick_assets import build_quick_resnet, cache_env

    from profiling_agent.tools.models import embedded

    if cache is None:
        return (*build_quick_resnet(work / "cache"), work / "cache")
    with cache_env(Path(cache)):
        return embedded.model_path("resnet-digits"), embedded.ensure_dataset(), Path(cache)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--kill-at", type=int, default=40, help="SIGKILL once this step is saved")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=0.0, help="--recover-minutes of both runs")
    parser.add_argument("--work", default="/tmp/resume-bench")
    parser.add_argument("--subset", type=int, default=96, help="validation images of both runs")
    parser.add_argument("--test-subset", type=int, default=None, help="held-out test images of both runs")
    parser.add_argument("--cache", default=None, help="a cache holding the quick ResNet (default: train it in WORK)")
    parser.add_argument("--tiny", action="store_true", help="smoke test: 12 steps, killed at 4, 48 + 32 images")
    args = parser.parse_args(argv)
    if args.tiny:
        args.steps, args.kill_at, args.subset, args.test_subset = 12, 4, 48, 32
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model, dataset, cache = _quick_resnet(work, args.cache)
    env = {**os.environ, "PROFILING_AGENT_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    runs = work / f"runs-{int(time.time())}"
    cpu0 = os.times()
    code, err = _run_to_end(_run_args(model, dataset, runs, "whole", args), env, args.tiny)
    assert code == 0, err[-2000:]
    saved = run_layout.iteration_dir(runs / "cut", 1) / run_layout.RECOVERY_STEPS / "latest.json"
    proc = subprocess.Popen(
        _run_args(model, dataset, runs, "cut", args), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    while proc.poll() is None:
        if saved.is_file() and json.loads(saved.read_text())["step"] + 1 >= args.kill_at:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait()
    killed_at = json.loads(saved.read_text())["step"] + 1
    resume = _cli("resume", "cut", "--run-dir", str(runs), *(["--no-plots"] if args.tiny else []))
    code, err = _run_to_end(resume, env, args.tiny)
    assert code == 0, err[-2000:]
    cpu1 = os.times()
    a, b = _weights(runs / "whole"), _weights(runs / "cut")
    gap = max(float((a[k] - b[k]).abs().max()) for k in a)
    info = {
        n: json.loads((run_layout.iteration_dir(runs / n, 1) / run_layout.RECOVERY).read_text())["distill"]
        for n in ("whole", "cut")
    }
    base = statistics.median(info["whole"]["step_seconds"])
    cpu = _cpu_seconds(cpu1, args.tiny) - _cpu_seconds(cpu0, args.tiny)
    print(f"load (uptime) {os.getloadavg()}; CPU seconds of the runs {cpu:.1f}")
    print(f"killed after step {killed_at}: steps whole {info['whole']['steps_done']}, cut {info['cut']['steps_done']}")
    print(f"largest weight difference, resumed vs uninterrupted: {gap:.3g}")
    for name, rec in info.items():
        times, attempts = rec["step_seconds"], rec["attempts"]
        for i, att in enumerate(attempts):
            end = attempts[i + 1]["from"] if i + 1 < len(attempts) else len(times)
            part = times[att["from"] : end]
            print(
                f"{name:5s} attempt from step {att['from']:4d}: threads {att['threads']}, median step "
                f"{statistics.median(part) * 1000:.1f} ms, slowest {max(part) * 1000:.1f} ms over {len(part)} steps"
            )
    rest = info["cut"]["step_seconds"][killed_at:]
    ratio, worst = statistics.median(rest) / base, max(rest) / base
    print(f"resumed steps: median {ratio:.2f}x, slowest {worst:.2f}x the uninterrupted median")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
