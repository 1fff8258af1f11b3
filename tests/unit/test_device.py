"""Device names: what the CLI accepts and what a model on a GPU calls its device ('cuda:0')."""

from __future__ import annotations

import pytest
import torch

from profiling_agent.tools.device import resolve_device


def test_cpu_and_auto_resolve_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cpu")


def test_a_gpu_model_s_own_device_name_resolves(monkeypatch: pytest.MonkeyPatch) -> None:
    # recovery asks for str(model's device) after distillation moved the student to the GPU: 'cuda:0'
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("cuda") == torch.device("cuda")


@pytest.mark.parametrize("name", ["cuda:0", "cuda"])
def test_cuda_without_a_gpu_says_so(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=f"--device {name} was requested but no CUDA device is available"):
        resolve_device(name)


@pytest.mark.parametrize("name", ["gpu", "cuda:x", "cpu:0", "cuda:", "mps"])
def test_other_names_are_refused_in_one_line(name: str) -> None:
    with pytest.raises(ValueError, match="unknown device .*: use cpu, cuda, cuda:N or auto"):
        resolve_device(name)
