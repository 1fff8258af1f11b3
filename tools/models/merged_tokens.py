"""Token merging (ToMe) inside ViT and DeiT layers: the layer surgery `compression.token_merge` does, artifacts redo.

After each layer's attention, bipartite soft matching on the keys' mean over heads pairs the tokens (alternately
A and B; each A token's most similar B token by cosine similarity) and the `r` A tokens with the closest match are
merged into their B token by a size-weighted average; the token count each merged token stands for ("size") is
carried to the next layers, whose attention adds log(size) to its logits (proportional attention). The CLS token
(and DeiT's distillation token) are never matched or merged and keep their positions. `r` per layer is fixed (a
schedule), so every shape is known when the model is exported and only the batch axis stays dynamic.

The layers keep their class's parameters and names (the class is swapped for a subclass with a merging forward),
so a saved artifact records only the schedule (`token_schedule`) and the loader installs it again
(`install_token_merging`). The matching runs in a child module named `MATCH_SCOPE`: its exported nodes carry that
name, which NNCF's INT8 keeps in float (`runtimes.openvino_forms.KEEP_FLOAT_SCOPE`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from profiling_agent.tools.runtimes.openvino_forms import KEEP_FLOAT_SCOPE

MATCH_SCOPE = f"{KEEP_FLOAT_SCOPE}_token_match"  # the child module that matches and merges tokens (kept in float)
LAYER_CLASSES = {"vit": "ViTLayer", "deit": "DeiTLayer"}  # model_type -> the layer class merging patches
PROTECTED = {"vit": 1, "deit": 2}  # leading tokens never merged: CLS (and DeiT's distillation token)


class TokenScheduleError(ValueError):
    """A token schedule does not fit the model (wrong length, negative r, too few tokens left, no token axis)."""


class _Sizes:
    """The size of each token (how many patches it stands for), passed from one merging layer to the next."""

    def __init__(self) -> None:
        self.size: torch.Tensor | None = None


class TokenMatch(nn.Module):
    """Merge the `r` most similar tokens of a layer's output by bipartite soft matching (no parameters).

    The gathers and the scatter-add of the merge are products with one-hot matrices built from the matching's
    indices (exact in float, about 1% of a ViT-B layer's MACs): exported, they are a few MatMuls with static shapes
    where index gathers need Expand and shape arithmetic per call, which OpenVINO re-runs at every inference on a
    dynamic batch.
    """

    def __init__(self, r: int, protected: int, tokens: int) -> None:
        super().__init__()
        self.r, self.protected, self.tokens = int(r), int(protected), int(tokens)

    def extra_repr(self) -> str:
        """Show r, the protected token count and the tokens the layer sees in the model's repr."""
        return f"r={self.r}, protected={self.protected}, tokens={self.tokens}"

    def forward(
        self, hidden: torch.Tensor, metric: torch.Tensor, size: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the merged tokens (B, N - r, C) and their sizes (B, N - r, 1).

        Args:
            hidden: The layer's tokens after attention and its residual (B, N, C); N must be `tokens`.
            metric: The keys' mean over heads (B, N, head_dim): the similarity the tokens are matched on.
            size: Each token's size (B, N, 1); None before any merge (every token is one patch).
        """
        p, r = self.protected, self.r
        if not torch.jit.is_tracing() and hidden.shape[1] != self.tokens:
            raise ValueError(f"this layer merges {r} of {self.tokens} tokens and got {hidden.shape[1]}")
        if size is None:
            size = torch.ones_like(hidden[..., :1])
        count_a, count_b = (self.tokens - p + 1) // 2, (self.tokens - p) // 2  # python ints: constants when exported
        with torch.no_grad():
            keys = metric[:, p:]
            keys = keys / keys.norm(dim=-1, keepdim=True)
            scores = keys[:, ::2] @ keys[:, 1::2].transpose(-1, -2)  # A tokens x B tokens, cosine similarity
            best, partner = scores.max(dim=-1)  # each A token's closest B token
            order = best.argsort(dim=-1, descending=True)  # A tokens, most similar first
            merged, kept = order[:, :r], order[:, r:]
            target = partner.gather(1, merged)  # the B token each merged A token joins
            slots_a = torch.arange(count_a, device=hidden.device)
            pick_kept = (kept.unsqueeze(-1) == slots_a).to(hidden.dtype)  # (B, A - r, A) one-hot rows
            pick_merged = (merged.unsqueeze(-1) == slots_a).to(hidden.dtype)  # (B, r, A)
            into = (target.unsqueeze(-1) == torch.arange(count_b, device=hidden.device)).to(hidden.dtype)
            route = into.transpose(1, 2) @ pick_merged  # (B, B tokens, A): which A tokens join each B token
        weighted = torch.cat([hidden[:, p:] * size[:, p:], size[:, p:]], dim=-1)  # x * size and size, one tensor
        side_a, side_b = weighted[:, ::2], weighted[:, 1::2]
        rest = torch.cat([pick_kept @ side_a, side_b + route @ side_a], dim=1)  # sums; the mean is sum / size
        new_size = rest[..., -1:]
        tokens = torch.cat([hidden[:, :p], rest[..., :-1] / new_size], dim=1)
        return tokens, torch.cat([size[:, :p], new_size], dim=1)


def proportional_attention(
    attention: Any, hidden: torch.Tensor, size: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run a ViT/DeiT attention module with log(size) added to its logits; return its output and the keys' mean."""
    shape = (*hidden.shape[:-1], -1, attention.head_dim)
    query = attention.q_proj(hidden).view(shape).transpose(1, 2)
    key = attention.k_proj(hidden).view(shape).transpose(1, 2)
    value = attention.v_proj(hidden).view(shape).transpose(1, 2)
    logits = torch.matmul(query, key.transpose(2, 3)) * attention.scaling
    if size is not None:  # proportional attention: a token standing for s patches counts s times
        logits = logits + size.log().transpose(1, 2).unsqueeze(1)
    weights = nn.functional.softmax(logits, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = nn.functional.dropout(weights, p=attention.attention_dropout, training=attention.training)
    out = torch.matmul(weights, value).transpose(1, 2).reshape(*hidden.shape[:-1], -1)
    return attention.o_proj(out), key.mean(dim=1)


class TokenMergingLayer:
    """The forward of a ViT/DeiT layer that merges tokens after its attention (mixed into the layer's class)."""

    token_r: int
    token_first: bool
    token_last: bool
    token_sizes: _Sizes

    def forward(self, hidden_states: torch.Tensor, attention_mask: Any = None, **kwargs: Any) -> torch.Tensor:
        """Attention (proportional), residual, merge `token_r` tokens, MLP, residual (attention_mask is unused)."""
        layer: Any = self
        if self.token_first:
            self.token_sizes.size = None
        size = self.token_sizes.size
        out, metric = proportional_attention(layer.attention, layer.layernorm_before(hidden_states), size)
        hidden = layer.dropout(out) + hidden_states
        if self.token_r > 0:
            hidden, size = layer.get_submodule(MATCH_SCOPE)(hidden, metric, size)
        hidden = layer.dropout(layer.mlp(layer.layernorm_after(hidden))) + hidden
        self.token_sizes.size = None if self.token_last else size
        return hidden


_CLASSES: dict[type, type] = {}


def _merging_class(base: type) -> type:
    """Return (once per class) the subclass of a layer class whose forward merges tokens."""
    if base not in _CLASSES:
        _CLASSES[base] = type(f"TokenMerging{base.__name__}", (TokenMergingLayer, base), {})
    return _CLASSES[base]


def token_layers(model: nn.Module) -> tuple[str, list[nn.Module]]:
    """Return the model_type and the transformer layers token merging works on (in order).

    Raises:
        TokenScheduleError: The model has no token axis to merge (a CNN, or windowed attention such as Swin).
    """
    model_type = str(getattr(getattr(model, "config", None), "model_type", "") or "").lower()
    if model_type == "swin":
        raise TokenScheduleError(
            "Swin has no global token axis: its attention runs in fixed windows of 7x7 patches and patch merging "
            "halves the grid, so merging tokens would break the window partition"
        )
    if model_type not in LAYER_CLASSES:
        what = model_type or type(model).__name__
        raise TokenScheduleError(
            f"{what} has no token axis to merge: token merging needs a ViT or DeiT (a CNN such as ResNet has "
            "feature maps, not tokens)"
        )
    backbone = getattr(model, model_type, None)
    layers = list(getattr(backbone, "layers", None) or [])
    if not layers:
        raise TokenScheduleError(f"{type(model).__name__} has no {model_type}.layers to merge tokens in")
    return model_type, layers


def token_count(model: nn.Module) -> int:
    """Return the tokens the first layer sees: the patches plus the protected tokens."""
    model_type, _ = token_layers(model)
    embeddings: Any = getattr(model, model_type).embeddings
    return int(embeddings.patch_embeddings.num_patches) + PROTECTED[model_type]


def check_schedule(model: nn.Module, schedule: Sequence[Any]) -> list[int]:
    """Check a per-layer schedule against the model and return it as ints.

    Raises:
        TokenScheduleError: Not one whole r >= 0 per layer, or a layer would merge more than half its unprotected
            tokens (at least the protected tokens + 1 always remain).
    """
    model_type, layers = token_layers(model)
    values = list(schedule) if isinstance(schedule, (list, tuple)) else None
    if values is None or len(values) != len(layers):
        got = len(values) if values is not None else type(schedule).__name__
        raise TokenScheduleError(f"a token schedule needs one r per layer ({len(layers)} layers), got {got}")
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values):
        raise TokenScheduleError(f"every r in a token schedule must be a whole number >= 0, got {values}")
    tokens, protected = token_count(model), PROTECTED[model_type]
    for i, (r, layer) in enumerate(zip(values, layers, strict=True)):
        if r and not hasattr(layer, "attention"):
            raise TokenScheduleError(f"layer {i} is not a transformer layer ({type(layer).__name__}): its r must be 0")
        cap = (tokens - protected) // 2  # each merged token joins one of the other half
        if r > cap:
            raise TokenScheduleError(
                f"layer {i} sees {tokens} tokens ({protected} protected) and can merge at most {cap}, not {r} "
                f"(at least {protected + 1} tokens must remain)"
            )
        tokens -= r
    return [int(v) for v in values]


def install_token_merging(model: nn.Module, schedule: Sequence[int]) -> nn.Module:
    """Make every layer merge its scheduled number of tokens (in place; a schedule of zeros changes no output).

    Raises:
        TokenScheduleError: See `check_schedule` and `token_layers`.
    """
    values = check_schedule(model, schedule)
    model_type, layers = token_layers(model)
    remove_token_merging(model)
    sizes = _Sizes()
    patched = [(i, layer) for i, layer in enumerate(layers) if hasattr(layer, "attention")]  # not replaced blocks
    seen = [token_count(model) - sum(values[:i]) for i in range(len(values))]  # tokens each layer sees
    for k, (i, layer) in enumerate(patched):
        layer.__class__ = _merging_class(type(layer))
        merging: Any = layer
        merging.token_r, merging.token_sizes = values[i], sizes
        merging.token_first, merging.token_last = k == 0, k == len(patched) - 1
        layer.add_module(MATCH_SCOPE, TokenMatch(values[i], PROTECTED[model_type], seen[i]))
    return model


def remove_token_merging(model: nn.Module) -> nn.Module:
    """Give every merging layer its own class and forward back (in place)."""
    for module in model.modules():
        if isinstance(module, TokenMergingLayer):
            base = next(c for c in type(module).__mro__[1:] if c is not TokenMergingLayer)
            delattr(module, MATCH_SCOPE)
            module.__class__ = base
            for name in ("token_r", "token_sizes", "token_first", "token_last"):
                module.__dict__.pop(name, None)
    return model


def token_schedule(model: nn.Module) -> list[int] | None:
    """Return the installed schedule (one r per layer), or None when the model merges no tokens."""
    try:
        _, layers = token_layers(model)
    except TokenScheduleError:
        return None
    if not any(isinstance(layer, TokenMergingLayer) for layer in layers):
        return None
    return [int(getattr(layer, "token_r", 0)) for layer in layers]
