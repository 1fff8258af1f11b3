"""The OpenVINO request that latency times holds its own copy of the input, never the caller's memory.

With the caller's array shared (`share_inputs=True`), whole runs that had built and timed several OpenVINO forms in
one process ended by a segmentation fault in their next accuracy pass (docs/facts.md, "Native crash records").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("openvino")
pytest.importorskip("onnxruntime")

from helpers.tiny import family_model, random_pixels  # noqa: E402

from profiling_agent.tools.runtimes.forms import build_forms  # noqa: E402
from profiling_agent.tools.runtimes.openvino_model import OvClassifier  # noqa: E402


class RecordingCompiled:
    """A compiled model that keeps every infer request it creates, so a test can read their input tensors."""

    def __init__(self, compiled) -> None:
        self.compiled, self.requests = compiled, []

    def create_infer_request(self):
        request = self.compiled.create_infer_request()
        self.requests.append(request)
        return request


def test_the_timed_call_runs_on_a_copy_of_its_input(tmp_path, monkeypatch):
    model, size = family_model("vit")
    x = random_pixels(4, size)
    built = build_forms(model, x[:2], x[2:], tmp_path, forms=["ov_fp32"], threads=1)
    (fp32,) = [v for v in built if v.name == "ov_fp32"]
    ov = OvClassifier(Path(fp32.path) / "openvino_model.xml", "f32", threads=1)
    recording = RecordingCompiled(ov.compiled)
    monkeypatch.setattr(ov, "compiled_for", lambda shape: recording)
    pixels = random_pixels(2, size)
    call = ov.native_call(pixels)
    first = next(iter(call().values())).copy()
    (request,) = recording.requests
    held = request.get_input_tensor().data
    assert not np.shares_memory(held, pixels.numpy())  # the request's input is its own memory
    assert np.array_equal(held, pixels.numpy())
    assert torch.allclose(torch.from_numpy(first), ov(pixel_values=pixels).logits)
