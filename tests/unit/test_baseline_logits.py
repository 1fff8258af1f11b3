"""The baseline's kept logits (tools/evaluation/baseline_logits.py): an image set predicted once per run, then read."""

import torch
from torch import nn

from profiling_agent.tools import run_layout
from profiling_agent.tools.evaluation.baseline_logits import NAME_CHARS, kept_baseline_logits, logits_key


class Counting(nn.Module):
    """A linear classifier that counts its forward passes."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(12, 5)
        self.calls = 0

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.head(pixels.flatten(1))


def test_the_slice_is_predicted_once_then_read_back(tmp_path):
    model, pixels = Counting(), torch.randn(6, 3, 2, 2)
    first = kept_baseline_logits(tmp_path, pixels, "sha-a", model)
    assert model.calls == 1 and len(list((tmp_path / run_layout.BASELINE_LOGITS).iterdir())) == 1
    again = kept_baseline_logits(tmp_path, pixels, "sha-a", model)
    assert model.calls == 1
    assert torch.equal(first, again) and torch.allclose(first, model.head(pixels.flatten(1)).detach())


def test_other_images_or_another_baseline_are_predicted_again(tmp_path):
    model, pixels = Counting(), torch.randn(6, 3, 2, 2)
    kept_baseline_logits(tmp_path, pixels, "sha-a", model)
    other = kept_baseline_logits(tmp_path, pixels + 1, "sha-a", model)
    assert model.calls == 2 and torch.allclose(other, model.head((pixels + 1).flatten(1)).detach())
    kept_baseline_logits(tmp_path, pixels + 1, "sha-b", model)
    assert model.calls == 3
    kept_baseline_logits(tmp_path, pixels, "sha-a", model)  # each set keeps its own file
    assert model.calls == 3


def test_a_file_cut_short_is_replaced(tmp_path):
    model, pixels = Counting(), torch.randn(4, 3, 2, 2)
    path = tmp_path / run_layout.BASELINE_LOGITS / f"{logits_key(pixels, 'sha-a', 'cpu')[:NAME_CHARS]}.safetensors"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    logits = kept_baseline_logits(tmp_path, pixels, "sha-a", model)
    assert model.calls == 1 and logits.shape == (4, 5)
    kept_baseline_logits(tmp_path, pixels, "sha-a", model)
    assert model.calls == 1
