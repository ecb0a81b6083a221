"""Benchmark-only models: the zoo has no pure elementwise chain, no sampling step, no ConvNeXt block
and no Conformer convolution module."""
from __future__ import annotations

import torch
from torch import nn


class EltwiseChain(nn.Module):
    """Twenty elementwise ops in a row, all fusable into one loop: per-op dispatch cost and memory
    traffic dominate. The values stay finite for any finite input (log sees values >= 0.5)."""

    def forward(self, x):
        y = x * 0.5
        y = y + 0.25
        y = torch.tanh(y)
        y = y * x
        y = torch.relu(y)
        y = y + x
        y = torch.sigmoid(y)
        y = y * 2.0
        y = y - 1.0
        y = torch.abs(y)
        y = y + 1.0
        y = torch.sqrt(y)
        y = y * torch.tanh(x)
        y = torch.neg(y)
        y = torch.exp(y)
        y = y + 0.5
        y = torch.log(y)
        y = y * 0.75
        return torch.maximum(y, x)


class SamplingFilters(nn.Module):
    """The filtering step of sampling from a language model's logits: the top-50 (top-k) and the
    top-p nucleus (0.9) of the softmax, sorted, by a running sum. Values only: engines may order
    equal probabilities differently."""

    def forward(self, logits):
        top = torch.topk(logits, 50).values
        probs = torch.sort(torch.softmax(logits, -1), dim=-1, descending=True).values
        keep = torch.cumsum(probs, -1) - probs < 0.9
        return top, torch.where(keep, probs, 0.0)


class ConvNeXtBlock(nn.Module):
    """ConvNeXt's block: a 7x7 depthwise convolution, layer norm over the channels (channels last),
    a 4x inverted MLP with GELU, a per-channel scale and the residual."""

    def __init__(self, dim: int = 96):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.5))

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.pwconv2(torch.nn.functional.gelu(self.pwconv1(self.norm(y))))
        return x + (self.gamma * y).permute(0, 3, 1, 2)


class ConformerConvModule(nn.Module):
    """A Conformer's convolution module over a sequence of frames: layer norm, a pointwise 1-d
    convolution to twice the width and a GLU, a depthwise 1-d convolution, batch norm, SiLU, a
    pointwise convolution back, and the residual, with the transposes between the token order and
    the convolutions' channels-first order."""

    def __init__(self, dim: int = 144, kernel: int = 31):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.pointwise1 = nn.Conv1d(dim, 2 * dim, 1)
        self.depthwise = nn.Conv1d(dim, dim, kernel, padding=kernel // 2, groups=dim)
        self.batch_norm = nn.BatchNorm1d(dim)
        self.pointwise2 = nn.Conv1d(dim, dim, 1)

    def forward(self, x):
        y = torch.nn.functional.glu(self.pointwise1(self.norm(x).transpose(1, 2)), dim=1)
        y = torch.nn.functional.silu(self.batch_norm(self.depthwise(y)))
        return x + self.pointwise2(y).transpose(1, 2)
