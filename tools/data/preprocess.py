"""Turn decoded images into model inputs, in one step or in two (uint8 geometry, then float normalization)."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from profiling_agent.tools.data.sources import DataError
from profiling_agent.tools.hub import quiet_hf
from profiling_agent.tools.text import one_line

MODES = {1: "L", 3: "RGB", 4: "RGBA"}  # model channels -> the PIL mode images are converted to
SPLIT_TOLERANCE = 1e-4  # largest |two-step - processor| pixel difference for the two-step path to be used
FALLBACK = {"scale": 1 / 255, "mean": 0.5, "std": 0.5}  # no processor: scale to [0, 1], normalize to [-1, 1]


def _to_pil(image: Any, mode: str) -> Any:
    """Convert a decoded dataset image (PIL, array, tensor or {"bytes"/"path"}) to a PIL image in `mode`."""
    if isinstance(image, Mapping):
        image = Image.open(io.BytesIO(image["bytes"])) if image.get("bytes") else Image.open(image["path"])
    if isinstance(image, torch.Tensor):
        image = image.numpy()
    if isinstance(image, (np.ndarray, list)):
        arr = np.asarray(image)
        if arr.ndim == 3 and arr.shape[0] in (1, 3, 4) and arr.shape[-1] not in (1, 3, 4):
            arr = np.moveaxis(arr, 0, -1)
        if arr.ndim == 3 and arr.shape[-1] == 1:
            arr = arr[..., 0]
        if arr.dtype != np.uint8:
            scale = 255.0 if arr.max(initial=0) <= 1.0 else 1.0
            arr = np.clip(arr.astype(np.float32) * scale, 0, 255).round().astype(np.uint8)
        image = Image.fromarray(arr)
    if not hasattr(image, "convert"):
        raise DataError(f"unsupported image value of type {type(image).__name__}")
    return image.convert(mode)


def _fit(pixels: torch.Tensor, channels: int, height: int, width: int, notes: set[str]) -> torch.Tensor:
    """Bring processor output to (N, channels, height, width), noting any conversion made."""
    got = pixels.shape[1]
    if got != channels:
        if got == 3 and channels == 1:
            pixels = pixels.mean(dim=1, keepdim=True)
        elif got == 1 and channels == 3:
            pixels = pixels.repeat(1, 3, 1, 1)
        else:
            raise DataError(f"processor gives {got} channels but the model expects {channels}")
        notes.add(f"processor output converted from {got} to {channels} channels")
    if tuple(pixels.shape[-2:]) != (height, width):
        notes.add(f"processor output {tuple(pixels.shape[-2:])} resized to {height}x{width}")
        pixels = F.interpolate(pixels, size=(height, width), mode="bilinear", align_corners=False, antialias=True)
    return pixels.contiguous()


def _normalization(processor: Any | None) -> tuple[float, torch.Tensor, torch.Tensor] | None:
    """Return (scale, mean, std) the processor applies after its geometry, or None when it does not say."""
    if processor is None:
        return FALLBACK["scale"], torch.tensor([FALLBACK["mean"]]), torch.tensor([FALLBACK["std"]])
    needed = ("do_rescale", "rescale_factor", "do_normalize", "image_mean", "image_std")
    if not all(hasattr(processor, name) for name in needed):
        return None
    scale = float(processor.rescale_factor) if processor.do_rescale else 1.0
    if not processor.do_normalize:
        return scale, torch.zeros(1), torch.ones(1)
    mean = torch.as_tensor(processor.image_mean, dtype=torch.float32).flatten()
    std = torch.as_tensor(processor.image_std, dtype=torch.float32).flatten()
    return scale, mean, std


class Preprocessing:
    """A processor (or the fallback: resize, scale, normalize 0.5/0.5) applied to images at a model's input shape.

    `full` is the processor's own call. `geometry` + `normalize` split it in two: images resized and cropped as
    uint8 (what a cache can keep at a quarter of float32's size), then scaled and normalized as float32. The split
    is only used when `check` finds it equals `full` on real images.
    """

    def __init__(self, processor: Any | None, shape: Mapping[str, Any]) -> None:
        self.processor = processor
        self.channels, self.height, self.width = (int(shape[k]) for k in ("channels", "height", "width"))
        if self.channels not in MODES:
            raise DataError(f"cannot build {self.channels}-channel inputs from images (supported: 1, 3, 4)")
        mean = getattr(processor, "image_mean", None)
        fed = len(mean) if isinstance(mean, (list, tuple)) and len(mean) in MODES else self.channels
        self.mode = MODES[self.channels if processor is None else fed]  # the channels the processor normalizes
        self.norm = _normalization(processor)

    def full(self, images: Sequence[Any], notes: set[str] | None = None) -> torch.Tensor:
        """Preprocess in one step: float32 (N, C, H, W) at the model's shape."""
        notes = notes if notes is not None else set()
        pil = [_to_pil(image, self.mode) for image in images]
        if self.processor is None:
            return self.normalize(self._fallback_geometry(pil), notes)
        pixels = self._call(pil, "the image processor failed")
        return _fit(pixels.float(), self.channels, self.height, self.width, notes)

    def geometry(self, images: Sequence[Any]) -> torch.Tensor:
        """Convert, resize and crop as the processor does, without scaling: uint8 (N, C', H', W').

        Raises:
            DataError: The processor cannot leave out scaling and normalization, or its output is not whole
                numbers in 0..255 (e.g. it resizes in floating point).
        """
        pil = [_to_pil(image, self.mode) for image in images]
        if self.processor is None:
            return self._fallback_geometry(pil)
        pixels = self._call(
            pil, "the image processor cannot leave out normalization", do_rescale=False, do_normalize=False
        )
        if pixels.dtype != torch.uint8:
            if pixels.numel() and (pixels.min() < 0 or pixels.max() > 255 or not torch.equal(pixels, pixels.round())):
                raise DataError("the image processor resizes to fractional values: it cannot be cached as uint8")
            pixels = pixels.to(torch.uint8)
        return pixels.contiguous()

    def normalize(self, pixels: torch.Tensor, notes: set[str] | None = None) -> torch.Tensor:
        """Scale and normalize uint8 geometry output into float32 (N, C, H, W) at the model's shape."""
        if self.norm is None:
            raise DataError("the image processor does not state its scale and normalization")
        scale, mean, std = self.norm
        # (x * scale - mean) / std as one multiply and one add per pixel, in place (within float rounding of the
        # processor's steps). numpy, not torch: torch faults in fresh pages for every large float tensor it
        # allocates, which costs more than the arithmetic itself.
        gain = (scale / std).numpy().reshape(1, -1, 1, 1)
        shift = (-mean / std).numpy().reshape(1, -1, 1, 1)
        x = np.multiply(pixels.numpy(), gain, dtype=np.float32)
        x += shift
        return _fit(torch.from_numpy(x), self.channels, self.height, self.width, notes if notes is not None else set())

    def check(self, images: Sequence[Any]) -> tuple[torch.Tensor | None, str | None]:
        """Compare the two-step path with `full` on these images.

        Returns:
            (their uint8 geometry, None) when both agree, else (None, why they differ).
        """
        try:
            geometry = self.geometry(images)
            split = self.normalize(geometry)
        except DataError as err:
            return None, str(err)
        whole = self.full(images)
        if split.shape != whole.shape:
            return None, f"two-step preprocessing gives {tuple(split.shape)}, the processor {tuple(whole.shape)}"
        gap = float((split - whole).abs().max()) if whole.numel() else 0.0
        if gap > SPLIT_TOLERANCE:
            return None, f"two-step preprocessing differs from the processor by {gap:.2g}"
        return geometry, None

    def _call(self, pil: list, failure: str, **options: Any) -> torch.Tensor:
        """Run the processor on PIL images; a failure becomes a one-line DataError starting with `failure`."""
        processor: Any = self.processor
        try:
            with quiet_hf():
                return torch.as_tensor(processor(images=pil, return_tensors="pt", **options)["pixel_values"])
        except Exception as err:  # noqa: BLE001 - processors raise many types
            raise DataError(f"{failure}: {one_line(err)}") from None

    def _fallback_geometry(self, pil: list) -> torch.Tensor:
        arrays = []
        for image in pil:
            arr = np.asarray(image.resize((self.width, self.height), Image.Resampling.BILINEAR), dtype=np.uint8)
            arrays.append(arr[None] if arr.ndim == 2 else np.moveaxis(arr, -1, 0))
        return torch.from_numpy(np.stack(arrays))


def preprocess_images(
    images: Sequence[Any], processor: Any | None, shape: Mapping[str, Any], notes: set[str] | None = None
) -> torch.Tensor:
    """Turn decoded images into a float32 (N, C, H, W) tensor at `shape`.

    Images are converted to grayscale ("L") or "RGB" as the processor's image_mean expects (else as the
    model expects) and passed through the processor; without one they are converted to the model's
    channels, resized, scaled to [0, 1] and normalized with mean 0.5 and std 0.5. Processor output at
    another size or channel count than `shape` is adapted: RGB -> gray by channel mean, gray -> RGB by
    repetition, bilinear resize (each noted).

    Args:
        images: PIL images, arrays, tensors or datasets {"bytes", "path"} dicts.
        processor: A transformers image processor or None.
        shape: {"channels", "height", "width"}.
        notes: A set that collects notes on conversions made.

    Returns:
        float32 tensor (N, C, H, W).
    """
    return Preprocessing(processor, shape).full(images, notes)


__all__ = ["Preprocessing", "preprocess_images"]
