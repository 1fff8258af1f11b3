"""Small non-Hugging-Face models shared by the adapter and pruning tests."""

import torch
from torch import nn


class ToyBlockNet(nn.Module):
    """A non-HF classifier: embedding conv, a residual conv block, a residual MLP block, a classifier."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Conv2d(1, 8, 3, padding=1)
        self.convblock = nn.Module()
        self.convblock.conv1 = nn.Conv2d(8, 12, 3, padding=1)
        self.convblock.bn1 = nn.BatchNorm2d(12)
        self.convblock.conv2 = nn.Conv2d(12, 8, 3, padding=1)
        self.convblock.bn2 = nn.BatchNorm2d(8)
        self.proj = nn.Linear(8, 16)
        self.mlp = nn.Module()
        self.mlp.norm = nn.LayerNorm(16)
        self.mlp.fc1 = nn.Linear(16, 48)
        self.mlp.act = nn.GELU()
        self.mlp.fc2 = nn.Linear(48, 16)
        self.classifier = nn.Linear(16, 10)

    def forward(self, x):
        x = torch.relu(self.embed(x))
        b = self.convblock
        x = torch.relu(x + b.bn2(b.conv2(torch.relu(b.bn1(b.conv1(x))))))
        x = self.proj(x.mean((2, 3)))
        x = x + self.mlp.fc2(self.mlp.act(self.mlp.fc1(self.mlp.norm(x))))
        return self.classifier(x)


def all_logits(model: nn.Module, pixels: torch.Tensor) -> list[torch.Tensor]:
    """Return every logits tensor the model produces (the distilled DeiT has three)."""
    model.eval()
    with torch.inference_mode():
        out = model(pixel_values=pixels)
    names = ("logits", "cls_logits", "distillation_logits")
    return [getattr(out, n) for n in names if getattr(out, n, None) is not None]
