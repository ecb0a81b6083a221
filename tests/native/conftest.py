import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from native_jit import jit  # noqa: E402

from cuvil.ir.types import DType, TensorType, sym  # noqa: E402
from cuvil.runtime import Executable, Program, Slot, Split, Step, get_num_threads, set_num_threads  # noqa: E402

S0 = sym("s0")
K, N = 64, 32


@pytest.fixture
def pool_threads():
    """Sets the pool size for one test, then restores it."""
    before = get_num_threads()
    yield set_num_threads
    set_num_threads(before)


@pytest.fixture(scope="session")
def jitted():
    """(JitCode, JitModule) with every test kernel; kept alive for the whole session."""
    return jit()


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


@pytest.fixture
def weight():
    g = torch.Generator().manual_seed(7)
    return torch.randint(-3, 4, (K, N), generator=g).float()


@pytest.fixture
def make_dag(jitted, weight):
    """Executable of the DAG program; min_chunk_ns=1 splits every splittable step."""
    def make(min_chunk_ns=None):
        return Executable(dag_program(weight), jitted[1], min_chunk_ns=min_chunk_ns)
    return make


def int_inputs(rows: int, seed: int):
    """Small integers as floats: every result is exact, so any wrong element shows."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(-4, 5, (rows, K), generator=g).float() for _ in range(2)]
