"""Cells shared by the explorer tests."""

# A function with work for O1: `* 1.0` and `t().t()` fold (canonicalize), the two relus merge (cse).
# Hand-checked: imported, it has 9 ops (literal, mul, full, add, relu, relu, add, permute, permute);
# after O1, 4 (full, add, relu, add).
FOLDABLE = '''import torch

def f(x: "f32[B,8]"):
    y = x * 1.0 + torch.zeros(8)
    z = torch.relu(y) + torch.relu(y)
    return z.t().t()
'''

# The same computation as IR text (static shapes, so it runs on random inputs).
FOLDABLE_IR = """// x * 1.0, then relu twice
cuvil.func @g(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = cuvil.literal {value = 1.0, dtype = f32} : tensor<f32>
  %1 = cuvil.mul %x, %0 : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  %2 = cuvil.relu %1 : tensor<4x8xf32> -> tensor<4x8xf32>
  %3 = cuvil.relu %1 : tensor<4x8xf32> -> tensor<4x8xf32>
  %4 = cuvil.add %2, %3 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  cuvil.return %4 : tensor<4x8xf32>
}
"""

# A block with one of each kind of fusion: GEMM + bias + ReLU (an epilogue), a GEMM + residual add,
# a layer norm, an RMS norm written out (pow, mean, add, rsqrt, mul, mul) and a softmax.
FUSION_BLOCK = '''import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, d), nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        y = self.fc2(h) + x
        z = self.norm(y)
        r = z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-6) * self.scale
        return torch.softmax(r, dim=-1)


torch.manual_seed(0)
block = Block().eval()
x = torch.randn(8, 64)
block(x)
'''
