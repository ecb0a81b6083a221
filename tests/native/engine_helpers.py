"""Plain helpers of the native engine tests (a module of its own: test files import it by name,
and pytest may have another folder's `conftest` under that name)."""
import torch

from cuvil.ir.types import DType, TensorType, sym
from cuvil.runtime import Program, Slot, Split, Step

S0 = sym("s0")
K, N = 64, 32


def dag_program(weight: torch.Tensor) -> Program:
    """out0 = relu(a + b) @ W and out1 = (a * b) * (a + b), with a dynamic row count s0.

    Steps 0 and 1 are independent; elementwise steps and the GEMM are splittable.
    """
    f32 = DType.f32
    row = S0 * K * 4
    elems = S0 * K
    return Program(
        inputs=[TensorType(f32, (S0, K)), TensorType(f32, (S0, K))],
        outputs=[TensorType(f32, (S0, N)), TensorType(f32, (S0, K))],
        symbols={"s0": (1, 4096)},
        input_names=["a", "b"],
        arena_bytes=3 * row,
        slots=[Slot.input(0, TensorType(f32, (S0, K))), Slot.input(1, TensorType(f32, (S0, K))),
               Slot.const(weight),
               Slot.output(0, TensorType(f32, (S0, N))), Slot.output(1, TensorType(f32, (S0, K))),
               Slot.arena(0, row), Slot.arena(row, row), Slot.arena(2 * row, row)],
        steps=[Step("add", [0, 1, 5], [elems], split=Split(0, 1, align=16)),
               Step("mul", [0, 1, 6], [elems], split=Split(0, 1, align=16)),
               Step("relu", [5, 7], [elems], deps=[0]),
               Step("matmul", [7, 2, 3], [S0, N, K], deps=[2], priority=1, split=Split(0, 2 * N * K // 16)),
               Step("mul", [6, 5, 4], [elems], deps=[0, 1], split=Split(0, 1, align=16))],
    )


def dag_reference(a, b, w):
    return torch.relu(a + b) @ w, (a * b) * (a + b)


def int_inputs(rows: int, seed: int):
    """Small integers as floats: every result is exact, so any wrong element shows."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(-4, 5, (rows, K), generator=g).float() for _ in range(2)]
