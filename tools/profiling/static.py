"""Static profile: MACs (ptflops plus functional attention) and parameters per layer and in total."""

from __future__ import annotations

import contextlib
import io
import logging
import threading
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from profiling_agent.tools.models.sizes import linear_packed_params_type, own_params, packed_linear_tensors
from profiling_agent.tools.runtimes.forward import PixelWrapper, example_input, input_chw, model_device

logger = logging.getLogger(__name__)

MACS_COUNTED = (
    "MACs of one image (batch 1), fp32 architecture. Counted: ptflops module hooks (conv, linear incl. bias adds, "
    "norms, activations, pooling), dynamically quantized Linear as its fp32 Linear, transformers activation "
    "modules (1 per output element), functional matmul/mm/bmm/addmm/baddbmm, torch.add/torch.mul, softmax, "
    "F.* activations and pooling, and scaled_dot_product_attention (QK^T + softmax + AV). Functional MACs go to "
    "the innermost module running. Not counted: ops written as Python operators (x + y, x * y, x @ y), "
    "reshapes, dropout, embedding lookups."
)

# ptflops and the SDPA counter patch torch functions globally: one counting pass at a time per process.
_PATCH_LOCK = threading.Lock()


# ---------------------------------------------------------------- parameters


def type_name(module: nn.Module) -> str:
    """Return the module's class name, prefixed "DynamicQuantized" for torch.ao dynamically quantized modules."""
    cls = type(module)
    prefix = "DynamicQuantized" if cls.__module__.startswith("torch.ao.nn.quantized.dynamic") else ""
    return prefix + cls.__name__


def _is_leaf(module: nn.Module) -> bool:
    """Return True when the module has no children (a quantized Linear's packed params do not count)."""
    packed_type = linear_packed_params_type()
    return not any(packed_type is None or not isinstance(child, packed_type) for child in module.children())


# ---------------------------------------------------------------- static profile (ptflops)


def _quantized_linear_macs_hook(module: Any, inputs: tuple, output: Any) -> None:
    x = inputs[0]
    tokens = x.numel() // max(x.shape[-1], 1)
    bias = module.bias() if callable(getattr(module, "bias", None)) else None
    per_token = module.in_features * module.out_features + (module.out_features if bias is not None else 0)
    module.__flops__ += int(tokens * per_token)


def _numel_macs_hook(module: Any, inputs: tuple, output: Any) -> None:
    if torch.is_tensor(output):
        module.__flops__ += int(output.numel())


def _is_transformers_activation(cls: type) -> bool:
    return cls.__module__.startswith("transformers.activations")


def _sdpa_macs(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    """MACs of scaled dot-product attention as eager attention counts them: QK^T, softmax, AV."""
    batch_heads = query.numel() // (query.shape[-2] * query.shape[-1])
    q_len, dim = query.shape[-2], query.shape[-1]
    k_len, v_dim = key.shape[-2], value.shape[-1]
    return int(batch_heads * q_len * k_len * (dim + 1 + v_dim))


class _MacRecorder:
    """Attribute ptflops module counts and functional-op counts to module names.

    It is also the collector ptflops' functional patches append to: `append(macs)` books the MACs on the
    innermost module running, unless that module's own ptflops hook already counts it (e.g. nn.GELU calling
    F.gelu), which would count it twice.
    """

    def __init__(self, model: nn.Module) -> None:
        self.names = {id(module): name for name, module in model.named_modules()}
        self.module_macs: dict[str, int] = defaultdict(int)
        self.functional_macs: dict[str, int] = defaultdict(int)
        self.skipped = 0
        self.hooked_types: set[type] = set()
        self.stack: list[nn.Module] = []
        self.handles: list[Any] = []
        self.model = model

    def module_hooks(self) -> dict[type, Any]:
        """Return custom ptflops hooks, one per module type present, that also record per-module counts."""
        from ptflops.pytorch_ops import MODULES_MAPPING  # lazy: ptflops; nodes.prune loads this module without it

        quantized = {type(m) for m in self.model.modules() if packed_linear_tensors(m) is not None}
        hooks = {}
        for cls in {type(m) for m in self.model.modules()}:
            if cls in MODULES_MAPPING:
                base = MODULES_MAPPING[cls]
            elif cls in quantized:
                base = _quantized_linear_macs_hook
            elif _is_transformers_activation(cls):
                base = _numel_macs_hook
            else:
                continue
            hooks[cls] = self._recording(base)
            self.hooked_types.add(cls)
        return hooks

    def _recording(self, base: Any) -> Any:
        def hook(module: Any, inputs: tuple, output: Any) -> None:  # ptflops adds __flops__ to modules
            before = module.__flops__
            base(module, inputs, output)
            self.module_macs[self.names.get(id(module), "")] += int(module.__flops__ - before)

        return hook

    def append(self, macs: Any) -> None:
        """Book functional-op MACs on the innermost running module (ptflops collector interface)."""
        top = self.stack[-1] if self.stack else self.model
        if type(top) in self.hooked_types:
            self.skipped += int(macs)
        else:
            self.functional_macs[self.names.get(id(top), "")] += int(macs)

    def attach(self) -> None:
        """Track the running module with forward pre/post hooks on every module."""
        for module in self.model.modules():
            self.handles.append(module.register_forward_pre_hook(self._enter))
            self.handles.append(module.register_forward_hook(self._exit))

    def _enter(self, module: nn.Module, args: tuple) -> None:
        self.stack.append(module)

    def _exit(self, module: nn.Module, args: tuple, output: Any) -> None:
        if self.stack and self.stack[-1] is module:
            self.stack.pop()

    def detach(self) -> None:
        """Remove the tracking hooks."""
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        self.stack.clear()


@contextlib.contextmanager
def _functional_counting(recorder: _MacRecorder):
    """Patch torch functional ops (ptflops' patches, plus SDPA) to report MACs to `recorder`."""
    from ptflops.pytorch_engine import (
        patch_functional,
        patch_tensor_ops,
        unpatch_functional,
        unpatch_tensor_ops,
    )  # lazy: ptflops; nodes.prune loads this module without it

    sdpa = F.scaled_dot_product_attention

    def counted_sdpa(query, key, value, *args, **kwargs):
        recorder.append(_sdpa_macs(query, key, value))
        return sdpa(query, key, value, *args, **kwargs)

    patch_functional(recorder)
    patch_tensor_ops(recorder)
    F.scaled_dot_product_attention = counted_sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = sdpa
        unpatch_tensor_ops()
        unpatch_functional()


def _count_macs(model: nn.Module, pixels: torch.Tensor) -> tuple[_MacRecorder, int | None, str]:
    """Run ptflops (pytorch backend) once; return the recorder, ptflops' own module total and its output."""
    from ptflops import get_model_complexity_info  # lazy: ptflops; nodes.prune loads this module without it

    recorder = _MacRecorder(model)
    wrapper = PixelWrapper(model)
    captured = io.StringIO()
    with _PATCH_LOCK, contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
        recorder.attach()
        try:
            with _functional_counting(recorder), torch.inference_mode():
                macs, _ = get_model_complexity_info(
                    wrapper,
                    tuple(pixels.shape[1:]),
                    print_per_layer_stat=False,
                    as_strings=False,
                    input_constructor=lambda _res: pixels,
                    ost=captured,
                    verbose=False,
                    custom_modules_hooks=recorder.module_hooks(),
                    backend="pytorch",
                    backend_specific_config={"count_functional": False},
                )
        finally:
            recorder.detach()
    return recorder, macs, captured.getvalue()


def static_profile(model: nn.Module, input_shape: Sequence[int] | Mapping[str, Any]) -> dict[str, Any]:
    """Count MACs and parameters of one image, per module and in total, with ptflops.

    Rows cover every module with its own parameters or MACs (leaf layers, plus containers that hold
    parameters such as embeddings or run functional ops such as attention matmuls), so per-row MACs and
    params sum exactly to the totals. When counting fails (an unsupported model), `total_macs` is None,
    rows carry params only and `error` says why.

    Args:
        model: The classifier; it stays on its device and in eval mode.
        input_shape: (C, H, W) or {"channels", "height", "width"}.

    Returns:
        {"total_macs", "total_params", "module_macs", "functional_macs", "ptflops_macs", "input_shape",
        "batch", "counted", "layers": [{"name", "type", "macs", "params", "leaf"}]} (plus "error" on failure).
    """
    chw = input_chw(input_shape)
    model.eval()
    pixels = example_input(chw, device=model_device(model))
    error = ""
    try:
        recorder, ptflops_macs, output = _count_macs(model, pixels)
        if ptflops_macs is None:
            error = "ptflops failed: " + (output.strip().splitlines() or ["no output"])[-1]
    except Exception as exc:  # noqa: BLE001 - any failure of the counter must not stop profiling
        recorder, ptflops_macs, error = _MacRecorder(model), None, f"MAC counting failed: {type(exc).__name__}: {exc}"
    if error:
        logger.warning("%s; MACs are not available for this model", error)
    elif sum(recorder.module_macs.values()) != ptflops_macs:
        logger.warning(
            "per-module MACs %d differ from ptflops' total %d", sum(recorder.module_macs.values()), ptflops_macs
        )
    seen: set[int] = set()
    layers = []
    for name, module in model.named_modules():
        params = own_params(module, seen)
        macs = 0 if error else recorder.module_macs.get(name, 0) + recorder.functional_macs.get(name, 0)
        if params or macs:
            layers.append(
                {
                    "name": name or "(model)",
                    "type": type_name(module),
                    "macs": int(macs),
                    "params": int(params),
                    "leaf": _is_leaf(module),
                }
            )
    result: dict[str, Any] = {
        "total_macs": None if error else sum(row["macs"] for row in layers),
        "total_params": sum(row["params"] for row in layers),
        "module_macs": None if error else int(sum(recorder.module_macs.values())),
        "functional_macs": None if error else int(sum(recorder.functional_macs.values())),
        "ptflops_macs": None if ptflops_macs is None else int(ptflops_macs),
        "input_shape": list(chw),
        "batch": 1,
        "counted": MACS_COUNTED,
        "layers": layers,
    }
    if error:
        result["error"] = error
    return result
