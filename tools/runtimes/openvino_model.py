"""OpenVINO models as classifiers: a compiled IR that runs like a torch model, and OpenVINO folders on disk.

An OpenVINO folder is what a run delivers when an OpenVINO form is the fastest within the budget:
`openvino_model.xml` + `openvino_model.bin` (the IR, loadable by `openvino.Core().read_model` alone), a
`recipe.json` (format `profiling-agent-openvino`: how the IR was made, the precision hint it was measured with,
NNCF settings, the logit check), the model's `config.json` (labels) and its image processor. Nothing is unpickled.

Every compiled model is set up for fair side-by-side timing: one stream (`NUM_STREAMS=1`), no CPU pinning
(the other runtimes in the process and on the machine keep their cores), `INFERENCE_NUM_THREADS` threads, and
an explicit `INFERENCE_PRECISION_HINT` (OpenVINO's default on a bf16-capable CPU is bf16, so "f32" must be set).
"""

from __future__ import annotations

import atexit
import gc
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from profiling_agent.tools.device import native_bf16_cpu
from profiling_agent.tools.runtimes.form_folder import FolderFormat, open_folder

OV_FORMAT = "profiling-agent-openvino"
OV_FORMAT_VERSION = 1
OV_FILE = "openvino_model.xml"
OV_WEIGHTS = "openvino_model.bin"
OV_RECIPE = "recipe.json"

Precision = Literal["f32", "bf16", "default"]

__all__ = [
    "OV_FOLDER",
    "OV_FILE",
    "OV_FORMAT",
    "OV_FORMAT_VERSION",
    "OV_RECIPE",
    "OV_WEIGHTS",
    "OpenVinoFolderError",
    "OvClassifier",
    "bf16_unsupported",
    "compile_config",
    "load_openvino_folder",
    "nncf_missing",
    "openvino_missing",
    "static_model",
]


class OpenVinoFolderError(RuntimeError):
    """An OpenVINO folder is incomplete, of an unknown format version, or cannot be compiled."""


OV_FOLDER = FolderFormat(
    "OpenVINO", OV_FILE, OV_RECIPE, OV_FORMAT, OV_FORMAT_VERSION, OpenVinoFolderError, "OpenVINO cannot compile"
)


REINSTALL = "pip install openvino nncf (default dependencies of profiling-agent; there is no extra for them)"


def openvino_missing() -> str | None:
    """Return why OpenVINO cannot be used here (one line), or None when `openvino` imports."""
    try:
        import openvino  # noqa: F401  # lazy: openvino; probes it, reporting a missing or broken install
    except Exception as exc:  # noqa: BLE001 - ImportError, or a broken build failing on import
        return f"OpenVINO is unavailable ({type(exc).__name__}: {exc}); {REINSTALL}"
    return None


def nncf_missing() -> str | None:
    """Return why NNCF (OpenVINO INT8 quantization) cannot be used here, or None when `nncf` imports."""
    missing = openvino_missing()
    if missing:
        return missing
    try:
        import nncf  # noqa: F401  # lazy: nncf; probes it, reporting a missing or broken install
    except Exception as exc:  # noqa: BLE001 - ImportError or a broken dependency
        return f"NNCF is unavailable ({type(exc).__name__}: {exc}); {REINSTALL}"
    return None


_CORE: list[Any] = []  # the process's one openvino.Core, created on first use and kept until exit


def shared_core() -> Any:
    """Return the process's one `openvino.Core` (created on first use, never destroyed before exit).

    A Core per compiled model, created and freed over a long process (a run, the test suite), ended in a
    segmentation fault at an unrelated later point; OpenVINO's own advice is one Core per process.
    """
    if not _CORE:
        import openvino as ov  # lazy: openvino; graph.cli.export loads this module without it

        _CORE.append(ov.Core())
        atexit.register(_release_core)
    return _CORE[0]


def _release_core() -> None:
    """Free unreachable compiled models, then the Core, while OpenVINO's runtime is still whole (at exit)."""
    gc.collect()
    _CORE.clear()


def bf16_unsupported() -> str | None:
    """Return why OpenVINO bf16 would not be native on this CPU (no AVX-512 BF16 and no AMX), or None.

    OpenVINO's own view wins when it can be asked (the CPU plugin's OPTIMIZATION_CAPABILITIES lists BF16);
    /proc/cpuinfo flags are the fallback.
    """
    try:
        caps = shared_core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
        if "BF16" in {str(c).upper() for c in caps}:
            return None
        return "this CPU has no native bf16 (OpenVINO's CPU capabilities lack BF16: no AVX-512 BF16, no AMX)"
    except Exception:  # noqa: BLE001 - OpenVINO missing or no CPU plugin: read the flags
        pass
    if native_bf16_cpu():  # tools.device
        return None
    return "this CPU has no native bf16 (no avx512_bf16 or amx_bf16 in /proc/cpuinfo)"


def compile_config(precision: Precision, threads: int | None) -> dict[str, str]:
    """Return OpenVINO CPU settings for fair timing: one stream, no pinning, `threads` threads, a precision hint.

    Args:
        precision: "f32" or "bf16" set the inference precision hint; "default" leaves OpenVINO's choice (the
            CPU's best: bf16 where it is native), which is what an INT8 IR's non-quantized layers run in.
        threads: Inference threads (default: torch's current count).
    """
    config = {
        "NUM_STREAMS": "1",
        "ENABLE_CPU_PINNING": "NO",
        "INFERENCE_NUM_THREADS": str(int(threads or torch.get_num_threads())),
        "PERFORMANCE_HINT": "LATENCY",
    }
    if precision != "default":
        config["INFERENCE_PRECISION_HINT"] = precision
    return config


SHAPE_DEPENDENT_OPS = frozenset({"TopK"})  # token merging's matching: what runs slower on a dynamic batch


def static_model(model: Any, shape: tuple[int, ...]) -> Any:
    """Return a copy of an `openvino.Model` whose input has the static `shape`, or None when it is not worth one.

    Only an IR with shape-dependent ops (token merging's TopK, with its gathers and slices) is reshaped: OpenVINO
    ran those with extra layout conversions on a dynamic batch, while an IR without them ran alike either way (an
    unmerged ViT-B/16 INT8 form: 104 ms dynamic, 106 static), so its extra compilation would only cost time.
    """
    if not any(op.get_type_name() in SHAPE_DEPENDENT_OPS for op in model.get_ops()):
        return None
    try:
        static = model.clone()
        static.reshape({static.inputs[0].get_any_name(): list(shape)})
    except Exception:  # noqa: BLE001 - an IR that does not reshape keeps its dynamic compilation
        return None
    return static


@dataclass
class OvOutput:
    """What `OvClassifier.forward` returns: the logits, like a transformers ImageClassifierOutput."""

    logits: torch.Tensor


class OvClassifier(nn.Module):
    """A compiled OpenVINO model that behaves like an HF image classifier: forward(pixel_values=...).logits.

    It has no parameters; evaluation.predict and evaluation.measure_latency use it unchanged. One infer request
    is reused (synchronous calls, one at a time). `config` (labels) and `recipe` are set when it is loaded from
    an OpenVINO folder.
    """

    def __init__(self, model: Any, precision: Precision = "f32", threads: int | None = None) -> None:
        """Compile `model` (an `openvino.Model` or the path of an IR/ONNX file) on the CPU."""
        super().__init__()
        core = shared_core()
        self.path = str(model) if isinstance(model, (str, os.PathLike)) else ""
        source = core.read_model(str(model)) if isinstance(model, (str, os.PathLike)) else model
        self.precision = precision
        self.settings = compile_config(precision, threads)
        self.source = source
        self.compiled = core.compile_model(source, "CPU", self.settings)
        self.request = self.compiled.create_infer_request()
        self.static: dict[tuple[int, ...], Any] = {}  # input shape -> the IR compiled for it (`native_call`)
        self.config: Any = None
        self.recipe: dict[str, Any] = {}

    def forward(self, pixel_values: torch.Tensor) -> OvOutput:
        """Run the compiled model on a pixel batch and return its logits as a CPU float tensor."""
        array = pixel_values.detach().to("cpu", torch.float32).contiguous().numpy()
        result = self.request.infer({0: array})
        logits = next(iter(result.values()))
        return OvOutput(logits=torch.from_numpy(logits.copy()).float())

    def native_call(self, pixel_values: torch.Tensor) -> Callable[[], Any]:
        """Return a call of an infer request of its own on `pixel_values`, converted to an array once.

        `measure_latency` times this, as benchmark_app does: the conversion and copies of `forward` are ours. The
        request runs the IR compiled for this input's shape (`compiled_for`), as benchmark_app's `-shape` and a
        server compiled for one batch size run it; the IR and `forward` keep the dynamic batch. The request is
        this input's alone. Each call copies the array into the request (`share_inputs=False`): with the array
        shared, runs that had built and timed several OpenVINO forms in one process ended by a segmentation fault
        in their next accuracy pass (facts.md, "Native crash records"); the copy costs microseconds.
        """
        feeds = {0: pixel_values.detach().to("cpu", torch.float32).contiguous().numpy()}
        infer = self.compiled_for(tuple(pixel_values.shape)).create_infer_request().infer
        return lambda: infer(feeds, share_inputs=False)

    def compiled_for(self, shape: tuple[int, ...]) -> Any:
        """Return the IR compiled for a static input `shape` (cached), or the dynamic one (`static_model`: no need).

        With a dynamic batch OpenVINO's CPU plugin runs shape-dependent graphs (token merging's TopK, gathers and
        slices) with extra layout conversions: a merged ViT-B/16 INT8 form ran its batch of 1 in 88 ms of CPU
        dynamic and 79 ms static, the unmerged form 104 and 106 ms (facts.md).
        """
        if shape not in self.static:
            model = static_model(self.source, shape)
            self.static[shape] = (
                self.compiled if model is None else shared_core().compile_model(model, "CPU", self.settings)
            )
        return self.static[shape]

    @property
    def size_bytes(self) -> int:
        """Bytes of the IR's weights file (0 when compiled from memory)."""
        if not self.path:
            return 0
        weights = Path(self.path).with_suffix(".bin")
        return weights.stat().st_size if weights.is_file() else 0


def load_openvino_folder(path: str | os.PathLike, threads: int | None = None) -> OvClassifier:
    """Compile an OpenVINO folder as an `OvClassifier` with the recorded precision hint, config and recipe.

    Raises:
        OpenVinoFolderError: Not an OpenVINO folder, a newer format, OpenVINO missing, or the IR not compiling.
    """

    def build(file: Path, recipe: dict[str, Any]) -> OvClassifier:
        precision = str((recipe.get("runtime") or {}).get("precision_hint") or "f32")
        if precision not in ("f32", "bf16", "default"):
            raise OpenVinoFolderError(f"{file.parent / OV_RECIPE}: unknown precision hint {precision!r}")
        return OvClassifier(file, precision, threads)  # type: ignore[arg-type]

    return open_folder(path, OV_FOLDER, openvino_missing, build)
