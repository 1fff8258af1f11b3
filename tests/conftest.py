"""Shared fixtures: tiny transformers image classifiers built from configs (no download)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Order the files longest first (tests/file_seconds.json), each file's tests in their order.

    `make test` spreads whole files over 2 processes in this order (`--dist loadfile --no-loadscope-reorder`): the
    long files start first and overlap each other, and the quick ones fill the end, where one long file starting last
    would run alone. A file missing from the table counts as one second a test.
    """
    from helpers.file_seconds import read_table

    root, table = Path(__file__).parent.parent, read_table()
    counts: dict[str, int] = {}
    for item in items:
        name = item.path.relative_to(root).as_posix()
        counts[name] = counts.get(name, 0) + 1

    def seconds(item) -> float:
        name = item.path.relative_to(root).as_posix()
        return table.get(name, float(counts[name]))

    items.sort(key=lambda item: -seconds(item))  # a stable sort: the order within each file stays


@pytest.fixture(autouse=True)
def _training_logger_restored():
    """Put the first-use training logger back as it was after each test.

    The CLI's main, run in a test's process, gives that logger a handler on the test's stderr and stops it
    propagating (graph/cli/main.py). A later test in the same process would log into a closed stream, and on a
    pytest whose caplog handler sits only on the root logger (the declared floor) it would capture nothing.
    """
    logger = logging.getLogger("profiling_agent.tools.models.embedded")
    handlers, propagate, level = list(logger.handlers), logger.propagate, logger.level
    yield
    logger.handlers[:] = handlers
    logger.propagate = propagate
    logger.setLevel(level)


@pytest.fixture
def tiny_vit():
    """A 2-layer ViT (hidden 32, 4 heads, 1x16x16 images, 10 labels), random weights, eval mode."""
    from helpers.tiny import seeded, vit_config
    from transformers import ViTForImageClassification

    return seeded(ViTForImageClassification, vit_config())


@pytest.fixture
def one_layer_vit():
    """The tiny ViT with one encoder layer: for tests that build ONNX, OpenVINO or NNCF forms whatever the depth.

    Each export, conversion and NNCF quantization of it takes about half the time of the two-layer one.
    """
    from helpers.tiny import seeded, vit_config
    from transformers import ViTForImageClassification

    return seeded(ViTForImageClassification, vit_config(num_hidden_layers=1))


@pytest.fixture
def tiny_resnet():
    """A 2-stage bottleneck ResNet (1x16x16 images, 10 labels), random weights, eval mode."""
    from helpers.tiny import resnet_config, seeded
    from transformers import ResNetForImageClassification

    return seeded(ResNetForImageClassification, resnet_config())


@pytest.fixture
def tiny_resnet_basic():
    """A 2-stage basic-block ResNet (3x16x16 images, 10 labels), random weights, eval mode."""
    from helpers.tiny import resnet_config, seeded
    from transformers import ResNetForImageClassification

    config = resnet_config(num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")
    return seeded(ResNetForImageClassification, config)


@pytest.fixture(scope="session")
def digits():
    """The embedded digits test split (real 8x8 handwritten digits), for the streamed-evaluation tests."""
    from profiling_agent.tools.data.sources import load_split

    return load_split("embedded:digits", "test")


@pytest.fixture
def processor():
    """A 16x16 one-channel ViT image processor (mean/std 0.5): what the streamed-evaluation tests preprocess with."""
    from helpers.tiny import digits_processor

    return digits_processor()


@pytest.fixture(scope="session")
def postgres_server():
    """A throwaway PostgreSQL server for the session (skipped when PostgreSQL is not installed)."""
    from helpers.pg_server import PgServer, find_bin_dir

    bin_dir = find_bin_dir()
    if bin_dir is None:
        pytest.skip(
            "PostgreSQL is not installed (no initdb/pg_ctl on PATH or in /usr/lib/postgresql/*/bin): "
            "apt-get install postgresql"
        )
    server = PgServer(bin_dir)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """The URL of a fresh, empty database on the session's PostgreSQL server."""
    return postgres_server.new_database()


@pytest.fixture(scope="session")
def digits_vit(tmp_path_factory):
    """The digits ViT every whole-run test shares, trained once per test session (save_pretrained, 12 epochs).

    Returns a namespace with `model` (its folder), `dataset` (the digits DatasetDict folder), `cache` (a
    PROFILING_AGENT_CACHE in which it is also `embedded:vit-digits`, so `{}` inputs run on it) and `record`
    (its training record). Built once for all test processes; tests only read it: runs write their own folders.
    """
    from types import SimpleNamespace

    from helpers.quick_assets import built_once, cache_env, read_json, write_json

    from profiling_agent.tools.models import embedded

    def build(cache):
        with cache_env(cache):
            embedded.ensure_dataset()
            config = embedded.TrainConfig(epochs=12, threads=1)
            write_json(
                cache / "record.json", embedded.build_model("vit-digits", embedded.model_path("vit-digits"), config)
            )

    cache = built_once(tmp_path_factory, "digits-vit-cache", build)
    with cache_env(cache):
        dataset, model = embedded.ensure_dataset(), embedded.model_path("vit-digits")
    record = read_json(cache / "record.json")
    assert record["test_accuracy"] > 60.0, record  # trained: well above chance (10%)
    return SimpleNamespace(model=model, dataset=dataset, cache=cache, record=record)


@pytest.fixture(scope="session")
def quick_resnet(tmp_path_factory):
    """(model, dataset, cache): the quickly trained digits ResNet, also `embedded:resnet-digits` in that cache.

    Built once for all test processes.
    """
    from helpers.quick_assets import build_quick_resnet, built_once, cache_env

    from profiling_agent.tools.models import embedded

    cache = built_once(tmp_path_factory, "quick-resnet-cache", build_quick_resnet)
    with cache_env(cache):
        return embedded.model_path("resnet-digits"), embedded.ensure_dataset(), cache


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory, digits_vit):
    """One finished run that test_graph, test_report_html and test_protocol all read: the whole graph runs once.

    Two deterministic rounds on the session's digits ViT through the checkpointed graph (thread "t1"), 120
    validation and 150 held-out test images, recovery and every backend form on. Returns a namespace: `run` (its
    folder), `out` (the graph's final state) and `readers`: for every read of the prepared data during the run, the
    parts read and the functions that asked, the node first. Tests only read it: copy the folder to change anything.
    """
    from types import SimpleNamespace

    from helpers.quick_assets import FAST_CONTEXT, built_once, read_json, spy_prepared_reads, write_json

    from profiling_agent.graph.builder import build_graph
    from profiling_agent.graph.checkpoint import open_checkpointer
    from profiling_agent.state import Context

    config = {"configurable": {"thread_id": "t1"}}

    def build(root):
        inputs = {
            "model": str(digits_vit.model),  # a plain string, as people type it in Studio
            "dataset": {"ref": str(digits_vit.dataset), "subset": 120, "test_subset": 150, "calibration": 32},
            "objective": {"planner": "deterministic", "iterations": 2, "target_reduction": 0.9, "max_acc_drop": 0.5},
        }
        graph = build_graph(checkpointer=open_checkpointer(root))
        readers: list = []
        with pytest.MonkeyPatch.context() as patch:
            spy_prepared_reads(patch, readers)
            context = Context(run_root=str(root), **{**FAST_CONTEXT, "plots": True})  # its charts are read
            graph.invoke(inputs, config, context=context, durability="sync")
        write_json(root / "readers.json", readers)

    root = built_once(tmp_path_factory, "digits-run", build)
    out = (
        build_graph(checkpointer=open_checkpointer(root, read_only=True)).get_state(config).values
    )  # the final state, as invoked
    assert out["status"] == "done"
    readers = [(tuple(parts), callers) for parts, callers in read_json(root / "readers.json")]
    return SimpleNamespace(run=root / "t1", out=out, readers=readers)
