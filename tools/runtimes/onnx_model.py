"""ONNX models as classifiers: an ONNX Runtime session that runs like a torch model, and ONNX folders on disk.

An ONNX folder is what a run delivers when ONNX Runtime is the fastest backend: `model.onnx`, a `recipe.json`
(format `profiling-agent-onnx`: how the file was exported and quantized, how it was checked), the model's
`config.json` (labels) and its image processor. Nothing in it is unpickled.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from profiling_agent.tools.runtimes.form_folder import FolderFormat, open_folder

ONNX_FORMAT = "profiling-agent-onnx"
ONNX_FORMAT_VERSION = 1
ONNX_FILE = "model.onnx"
ONNX_RECIPE = "recipe.json"

__all__ = [
    "ONNX_FOLDER",
    "ONNX_FILE",
    "ONNX_FORMAT",
    "ONNX_FORMAT_VERSION",
    "ONNX_RECIPE",
    "OnnxFolderError",
    "OrtClassifier",
    "OrtOutput",
    "load_onnx_folder",
    "onnxruntime_missing",
    "ort_session",
]


class OnnxFolderError(RuntimeError):
    """An ONNX folder is incomplete, of an unknown format version, or cannot be opened by ONNX Runtime."""


ONNX_FOLDER = FolderFormat(
    "ONNX", ONNX_FILE, ONNX_RECIPE, ONNX_FORMAT, ONNX_FORMAT_VERSION, OnnxFolderError, "ONNX Runtime cannot open"
)


def onnxruntime_missing() -> str | None:
    """Return why ONNX Runtime cannot be used here (one line), or None when `onnxruntime` and `onnx` import."""
    try:
        import onnx  # noqa: F401  # lazy: onnx; probes it, reporting a missing or broken install
        import onnxruntime  # noqa: F401  # lazy: onnxruntime; probes it, reporting a missing or broken install
    except Exception as exc:  # noqa: BLE001 - ImportError, or a broken build failing on import
        return f"ONNX Runtime is unavailable ({type(exc).__name__}: {exc}); pip install onnx onnxruntime"
    return None


def ort_session(path: str | os.PathLike, threads: int | None = None) -> Any:
    """Open a CPU InferenceSession with `threads` intra-op threads (default: torch's current count)."""
    import onnxruntime as ort  # lazy: onnxruntime; graph.cli.export loads this module without it

    options = ort.SessionOptions()
    options.intra_op_num_threads = int(threads or torch.get_num_threads())
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only
    # ONNX Runtime's intra-op threads spin after each call by default: they would eat the cores of whatever is timed
    # next (another form, another runtime) and make side-by-side numbers unfair; a few % of its own latency is lost
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


@dataclass
class OrtOutput:
    """What `OrtClassifier.forward` returns: the logits, like a transformers ImageClassifierOutput."""

    logits: torch.Tensor


class OrtClassifier(nn.Module):
    """An ONNX Runtime session that behaves like an HF image classifier: forward(pixel_values=...).logits.

    It has no parameters; evaluation.predict and evaluation.measure_latency use it unchanged. Inputs are handed
    to ONNX Runtime as float32 CPU arrays (zero-copy for contiguous CPU tensors). `config` (the transformers
    config, for labels) and `recipe` are set when it is loaded from an ONNX folder.
    """

    def __init__(self, path: str | os.PathLike, threads: int | None = None) -> None:
        super().__init__()
        self.path = str(path)
        self.session = ort_session(path, threads)
        self.input_name = self.session.get_inputs()[0].name
        self.config: Any = None
        self.recipe: dict[str, Any] = {}

    def forward(self, pixel_values: torch.Tensor) -> OrtOutput:
        """Run the session on a pixel batch and return its logits as a CPU float tensor."""
        array = pixel_values.detach().to("cpu", torch.float32).contiguous().numpy()
        (logits,) = self.session.run(None, {self.input_name: array})[:1]
        return OrtOutput(logits=torch.from_numpy(logits))

    def native_call(self, pixel_values: torch.Tensor) -> Callable[[], Any]:
        """Return a call of the session alone on `pixel_values`, converted once: what a deployment runs.

        `measure_latency` times this, as onnxruntime_perf_test does: the tensor-to-array conversion and the
        module call around `session.run` are ours, not the runtime's (7 us a call, a fifth of the zoo ResNet's).
        """
        feeds = {self.input_name: pixel_values.detach().to("cpu", torch.float32).contiguous().numpy()}
        run = self.session.run
        return lambda: run(None, feeds)

    @property
    def size_bytes(self) -> int:
        """Bytes of the .onnx file this session runs."""
        return Path(self.path).stat().st_size


def load_onnx_folder(path: str | os.PathLike, threads: int | None = None) -> OrtClassifier:
    """Open an ONNX folder as an `OrtClassifier` with its transformers config (labels) and recipe attached.

    Raises:
        OnnxFolderError: Not an ONNX folder, a newer format version, ONNX Runtime missing, or the file unreadable.
    """
    return open_folder(path, ONNX_FOLDER, onnxruntime_missing, lambda file, _recipe: OrtClassifier(file, threads))
