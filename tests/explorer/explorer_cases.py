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
