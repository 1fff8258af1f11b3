"""Arrays handed back by the runtimes and by safetensors stay valid after the call that made them (issue 49, item 5).

docs/facts.md ("Who owns the memory of an output") says which memory each of them points to: ONNX Runtime's and
OpenVINO's outputs own theirs (a held OrtValue, a copy), safetensors' tensors view a private mapping of the file,
which a rewrite of the file in place changes under them, so the project's readers clone what they keep.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from torch import nn

from profiling_agent.tools.data.prepare import load_prepared, save_tensors
from profiling_agent.tools.evaluation.baseline_eval import (
    PREDICTIONS_FILE,
    baseline_predictions,
    save_baseline_predictions,
)


def _linear_onnx(tmp_path) -> str:
    """Export a seeded 8 -> 4 Linear layer with a dynamic batch; return the .onnx path."""
    torch.manual_seed(0)
    path = str(tmp_path / "m.onnx")
    torch.onnx.export(
        nn.Linear(8, 4).eval(),
        (torch.randn(1, 8),),
        path,
        input_names=["x"],
        dynamic_axes={"x": {0: "batch"}},
        dynamo=False,
    )
    return path


def _outputs_outlive(make, path: str) -> None:
    """Check logits from one call stay equal to a copy after another call on other inputs and after the model goes."""
    model = make(path)
    first_in, second_in = torch.rand(2, 8), torch.rand(2, 8) + 5
    first = model(pixel_values=first_in).logits
    kept = first.clone()
    second = model(pixel_values=second_in).logits
    assert not torch.allclose(first, second)  # the second call really computed other numbers
    assert torch.equal(first, kept)
    del model
    gc.collect()
    junk = [torch.full((2, 4), 123.0) for _ in range(64)]  # reuse of freed memory would show here
    assert torch.equal(first, kept) and len(junk) == 64


def test_onnx_runtime_logits_outlive_the_next_run_and_the_session(tmp_path):
    pytest.importorskip("onnxruntime")
    from profiling_agent.tools.runtimes.onnx_model import OrtClassifier

    _outputs_outlive(lambda p: OrtClassifier(p, threads=1), _linear_onnx(tmp_path))


def test_openvino_logits_outlive_the_next_infer_and_the_compiled_model(tmp_path):
    pytest.importorskip("openvino")
    from profiling_agent.tools.runtimes.openvino_model import OvClassifier

    _outputs_outlive(lambda p: OvClassifier(p, "f32", threads=1), _linear_onnx(tmp_path))


def test_openvino_outputs_are_copies_unless_shared(tmp_path):
    """The lifetimes forms._validation_fn and OvClassifier rely on: a call's outputs are copies by default."""
    ov = pytest.importorskip("openvino")
    compiled = ov.Core().compile_model(_linear_onnx(tmp_path), "CPU")
    x = np.random.default_rng(0).random((2, 8), dtype=np.float32)
    owned = next(iter(compiled(x).values()))
    assert owned.flags.owndata and owned.base is None
    request = compiled.create_infer_request()
    shared = next(iter(request.infer({0: x}, share_outputs=True).values()))
    before = shared.copy()
    request.infer({0: x + 5}, share_outputs=True)
    assert not np.allclose(shared, before)  # a shared output is the request's buffer, rewritten by its next call


def _rewrite_in_place(path, data: bytes) -> None:
    """Overwrite a file's bytes without replacing it (what a writer that opens the path itself does)."""
    with open(path, "r+b") as handle:
        handle.write(data)


def test_prepared_labels_do_not_change_when_the_file_is_rewritten_in_place(tmp_path):
    path, other = tmp_path / "data.safetensors", tmp_path / "other.safetensors"
    labels = torch.arange(1000, dtype=torch.int64)
    save_tensors(path, {"eval_labels": labels, "calib_labels": labels[:10].clone()}, {"seed": 0})
    save_tensors(other, {"eval_labels": labels.flip(0), "calib_labels": labels[:10].clone()}, {"seed": 0})
    assert path.stat().st_size == other.stat().st_size  # same layout: only the label bytes differ
    loaded = load_prepared(path)
    _rewrite_in_place(path, other.read_bytes())
    assert torch.equal(loaded["eval_labels"], labels)


def test_saved_baseline_predictions_do_not_change_when_the_file_is_rewritten_in_place(tmp_path):
    labels, preds = torch.arange(1000) % 7, torch.arange(1000) % 5
    save_baseline_predictions(tmp_path / "a", preds, labels, "cpu")
    save_baseline_predictions(tmp_path / "b", preds.flip(0), labels, "cpu")
    loaded = baseline_predictions(tmp_path / "a", labels, "cpu")
    assert loaded is not None and torch.equal(loaded, preds)
    _rewrite_in_place(tmp_path / "a" / PREDICTIONS_FILE, (tmp_path / "b" / PREDICTIONS_FILE).read_bytes())
    assert torch.equal(loaded, preds)
