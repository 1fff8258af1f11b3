"""Call an image classifier on a pixel tensor: logits, example inputs, devices and timed forward passes."""

from __future__ import annotations

import functools
import inspect
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

_PIXEL_KWARG: dict[type, bool] = {}  # model class -> whether forward takes `pixel_values` (cached: no timing cost)


def _takes_pixel_values(model: nn.Module) -> bool:
    cls = type(model)
    if cls not in _PIXEL_KWARG:
        try:
            _PIXEL_KWARG[cls] = "pixel_values" in inspect.signature(model.forward).parameters
        except (TypeError, ValueError):
            _PIXEL_KWARG[cls] = False
    return _PIXEL_KWARG[cls]


def run_model(model: nn.Module, inputs: torch.Tensor | Mapping[str, Any]) -> Any:
    """Run `model` on a pixel tensor (as `pixel_values=` for HF models, else positional) or a dict of keyword inputs."""
    if isinstance(inputs, Mapping):
        return model(**inputs)
    return model(pixel_values=inputs) if _takes_pixel_values(model) else model(inputs)


def logits_of(output: Any) -> torch.Tensor:
    """Extract the logits from a model output (ModelOutput, tuple or tensor)."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f"cannot find logits in a {type(output).__name__}")


def forward_logits(model: nn.Module, inputs: torch.Tensor | Mapping[str, Any]) -> torch.Tensor:
    """Run `model` on a pixel batch (or keyword inputs) and return its logits: the one way every tool calls a model."""
    return logits_of(run_model(model, inputs))


@torch.inference_mode()
def batched_logits(model: nn.Module, pixels: torch.Tensor, batch_size: int = 64) -> torch.Tensor:
    """Return float32 logits of `model` (put in eval mode) on `pixels`, `batch_size` images per forward pass."""
    model.eval()
    device = model_device(model)
    outs = [
        forward_logits(model, pixels[i : i + batch_size].to(device)).float().cpu()
        for i in range(0, len(pixels), batch_size)
    ]
    return torch.cat(outs) if outs else torch.empty(0)


class PixelWrapper(nn.Module):
    """Wrap an image classifier so it takes one tensor and returns logits (what ptflops calls)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Return the wrapped model's logits (the argument name becomes an exported graph's input name)."""
        return forward_logits(self.model, pixel_values)


def input_chw(input_shape: Sequence[int] | Mapping[str, Any]) -> tuple[int, int, int]:
    """Normalize (C, H, W) or {"channels", "height", "width"} to a (C, H, W) tuple of ints."""
    if isinstance(input_shape, Mapping):
        shape = tuple(int(input_shape[k]) for k in ("channels", "height", "width"))
    else:
        shape = tuple(int(v) for v in input_shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"input_shape must be (channels, height, width), got {input_shape!r}")
    return shape


def model_device(model: nn.Module) -> torch.device:
    """Return the device of the model's first parameter or buffer (CPU when it has none)."""
    for tensor in model.parameters():
        return tensor.device
    for buffer in model.buffers():
        return buffer.device
    return torch.device("cpu")


def example_input(
    input_shape: Sequence[int] | Mapping[str, Any], *, batch: int = 1, seed: int = 0, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Build a seeded standard-normal pixel batch of shape (batch, C, H, W)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((batch, *input_chw(input_shape)), generator=generator).to(device)


def sync_device(device: torch.device) -> None:
    """Wait for queued work on a CUDA device so timings measure it; a no-op elsewhere."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_forward_ms(model: nn.Module, pixels: torch.Tensor) -> float:
    """Time one forward pass in ms (synchronizing CUDA); call under torch.inference_mode()."""
    return timed_calls_ms(functools.partial(forward_logits, model, pixels), 1, pixels.device)


def native_call(model: nn.Module, pixels: torch.Tensor) -> Callable[[], Any]:
    """Return a zero-argument call of `model` on `pixels`: its runtime's own call where it has one, else the forward.

    An ONNX Runtime or OpenVINO form (`native_call` method) runs its session or infer request on the input converted
    once; a torch model runs `forward_logits`, its own call.
    """
    own = getattr(model, "native_call", None)
    if callable(own):
        call: Callable[[], Any] = own(pixels)
        return call
    return functools.partial(forward_logits, model, pixels)


def timed_calls_ms(call: Callable[[], Any], calls: int, device: torch.device) -> float:
    """Time `calls` consecutive runs of `call` in ms, all in one clock span (synchronizing CUDA at both ends)."""
    sync_device(device)
    start = time.perf_counter()
    for _ in range(calls):
        call()
    sync_device(device)
    return (time.perf_counter() - start) * 1e3


def median_forward_ms(model: nn.Module, pixels: torch.Tensor, *, warmup: int = 2, repeats: int = 5) -> float:
    """Return the median forward latency in ms after `warmup` untimed runs."""
    model.eval()
    with torch.inference_mode():
        for _ in range(warmup):
            forward_logits(model, pixels)
        return statistics.median(timed_forward_ms(model, pixels) for _ in range(max(repeats, 1)))
