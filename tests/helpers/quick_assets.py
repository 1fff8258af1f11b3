"""Quickly trained digits models in private caches and fast run settings, for tests that drive whole runs."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

# subset/calibration small enough for seconds-long runs; the digits test split has 360 images
FAST_DATASET = {"subset": 160, "calibration": 32}
# latency settings that keep evaluation cheap, for runs that check no timing; no charts (a run's report draws them
# in seconds of matplotlib; the runs that check them set "plots": True)
FAST_LATENCY = {"latency_repeats": 2, "latency_warmup": 1, "latency_batch": 8, "threads": 1, "plots": False}
# latency settings that keep evaluation and the final report cheap
# recover_steps: distillation runs (recovery is on by default) but stays a few steps long
FAST_CONTEXT = {
    "latency_repeats": 3, "latency_warmup": 1, "latency_batch": 8, "threads": 1, "recover_steps": 8, "plots": False,
}  # fmt: skip


@contextmanager
def cache_env(cache: Path):
    """Point PROFILING_AGENT_CACHE at `cache` for the duration of the block."""
    old = os.environ.get("PROFILING_AGENT_CACHE")
    os.environ["PROFILING_AGENT_CACHE"] = str(cache)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PROFILING_AGENT_CACHE", None)
        else:
            os.environ["PROFILING_AGENT_CACHE"] = old


def build_quick_resnet(cache: Path) -> tuple[Path, Path]:
    """Build the digits dataset and a ResNet trained to ~99% in seconds, where `embedded:resnet-digits` finds it.

    Unlike the quick ViT it is accurate, so strong pruning misses a tight accuracy budget and the planner
    keeps iterating (bisecting) instead of converging after one round. The training record `build_model` returned
    is kept as CACHE/record.json (test_embedded compares it with the model's training.json).
    """
    from profiling_agent.tools.models import embedded

    with cache_env(cache):
        dataset = embedded.ensure_dataset()
        model_dir = embedded.model_path("resnet-digits")
        config = embedded.TrainConfig(epochs=4, max_train=800, batch_size=16, threads=1)
        record = embedded.build_model("resnet-digits", model_dir, config)
    write_json(cache / "record.json", record)
    assert record["test_accuracy"] > 80.0, record
    return model_dir, dataset


def spy_prepared_reads(monkeypatch, readers: list) -> None:
    """Record in `readers` every read of a run's prepared data: (parts read, [node, *the functions that asked])."""
    import inspect

    import profiling_agent.tools.data.prepare as prepare

    real = prepare.load_prepared

    def spying(path, with_indices=False, parts=("eval", "calib"), **kwargs):
        callers = [f.function for f in inspect.stack()[1:8]]
        node = next(f for f in callers if f not in ("open_prepared", "open_run_data", "prepared"))
        readers.append((tuple(parts), [node, *callers]))
        return real(path, with_indices=with_indices, parts=parts, **kwargs)

    monkeypatch.setattr(prepare, "load_prepared", spying)


def shared_dir(tmp_path_factory) -> Path:
    """Return a folder every pytest-xdist worker of this test session sees (the session's base temp without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """Return the folder `name` that the session's workers share, filled by `build(folder)` in the first to ask.

    `make test` runs test files on two processes, and each builds its own session fixtures: an asset that whole-run
    tests only read (a trained model, a finished run) is built once for both under a file lock. A build that fails
    leaves no mark, so the next worker to ask builds it again (and fails the same way, in its own tests).
    """
    from filelock import FileLock

    root = shared_dir(tmp_path_factory)
    folder = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            build(folder)
            (folder / ".built").touch()
    return folder


def write_json(path: Path, value) -> None:
    """Write `value` as JSON (the shared fixtures' records)."""
    path.write_text(json.dumps(value, default=str))


def read_json(path: Path):
    """Read a shared fixture's JSON record."""
    return json.loads(path.read_text())
