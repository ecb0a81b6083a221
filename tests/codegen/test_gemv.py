"""GEMMs with few rows (batch-1 linears are GEMVs): Cuvil's own small-GEMM loops, chosen at run time
for a symbolic row count (`llvm_emit.SMALL_GEMM_MAX_ROWS`), against eager at M = 1, 2, 3, 7 (small
path), 9 and 64 (OpenBLAS), with odd K and N, epilogues, column tiles and thread splits."""
import pytest
import torch
import torch.nn.functional as F

from cuvil.codegen.call import call_kernel
from cuvil.codegen.jit import build_module, compile_kernels
from cuvil.codegen.kernel_text import parse_kernels
from cuvil.codegen.library import COL_TILE
from cuvil.codegen.llvm_emit import SMALL_GEMM_MAX_ROWS
from cuvil.codegen.target import Target

from codegen_helpers import Graph, T, compile_graphs, run

ROWS = (1, 2, 3, 7, 9, 64)
K, N, N_SMALL = 301, 2 * COL_TILE + 3, 13      # N: two full column tiles and a 3-wide one
TOL = dict(rtol=1e-5, atol=1e-4)


def _addmm_tanh(b, x, w, bias):
    return b("cuvil.tanh", b("cuvil.add", b("cuvil.matmul", x, w), bias))


GRAPHS = {
    "linear_relu": Graph("linear_relu", lambda b, x, w, bb: b("cuvil.relu", b("cuvil.linear", x, w, bb)),
                         [T("s0", K), T(N, K), T(N)]),
    "linear_narrow": Graph("linear_narrow", lambda b, x, w: b("cuvil.linear", x, w), [T("s0", K), T(N_SMALL, K)]),
    "linear_3d": Graph("linear_3d", lambda b, x, w, bb: b("cuvil.linear", x, w, bb), [T("s0", 3, K), T(N, K), T(N)]),
    "addmm_tanh": Graph("addmm_tanh", _addmm_tanh, [T("s0", K), T(K, N), T(N)]),
    "matvec": Graph("matvec", lambda b, x, v: b("cuvil.matmul", x, v), [T("s0", K), T(K)]),
    **{f"linear_static{m}": Graph(f"linear_static{m}", lambda b, x, w, bb: b("cuvil.linear", x, w, bb),
                                  [T(m, K), T(N, K), T(N)]) for m in (1, 7, 64)},
}


@pytest.fixture(scope="module")
def compiled():
    return compile_graphs(GRAPHS.values())


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _check_splits(name, compiled, expected, *inputs):
    """Matches eager, and splitting the tiles among 1 or 3 threads gives bit-identical results."""
    one = run(GRAPHS[name], compiled, *inputs, split=1)
    torch.testing.assert_close(one, expected, **TOL)
    assert torch.equal(one, run(GRAPHS[name], compiled, *inputs, split=3))


@pytest.mark.parametrize("m", ROWS)
def test_linear_with_bias_relu(compiled, m):
    x, w, bias = rand(m, K), rand(N, K, seed=1), rand(N, seed=2)
    _check_splits("linear_relu", compiled, F.relu(F.linear(x, w, bias)), x, w, bias)


@pytest.mark.parametrize("m", ROWS)
def test_linear_narrow_output_without_bias(compiled, m):
    x, w = rand(m, K), rand(N_SMALL, K, seed=1)
    _check_splits("linear_narrow", compiled, F.linear(x, w), x, w)


@pytest.mark.parametrize("m", (1, 2, 3))
def test_linear_folds_leading_dims_into_rows(compiled, m):
    x, w, bias = rand(m, 3, K), rand(N, K, seed=1), rand(N, seed=2)
    _check_splits("linear_3d", compiled, F.linear(x, w, bias), x, w, bias)


@pytest.mark.parametrize("m", ROWS)
def test_addmm_with_epilogue(compiled, m):
    x, w, bias = rand(m, K), rand(K, N, seed=1), rand(N, seed=2)
    _check_splits("addmm_tanh", compiled, torch.tanh(torch.addmm(bias, x, w)), x, w, bias)


@pytest.mark.parametrize("m", (1, 7, 64))
def test_matrix_vector(compiled, m):
    x, v = rand(m, K), rand(K, seed=1)
    _check_splits("matvec", compiled, x @ v, x, v)


@pytest.mark.parametrize("m", (1, 7, 64))
def test_static_row_count(compiled, m):
    x, w, bias = rand(m, K), rand(N, K, seed=1), rand(N, seed=2)
    _check_splits(f"linear_static{m}", compiled, F.linear(x, w, bias), x, w, bias)


def _gemm_calls(graph) -> set[str]:
    text = str(build_module(graph.kernels, {k.name: k.name for k in graph.kernels}, Target.host()))
    return {name for name in ("cuvil.small_gemm", "scipy_cblas_sgemm") if f"call void @{name}" in text}


def test_path_chosen_at_compile_time_when_rows_are_known():
    assert SMALL_GEMM_MAX_ROWS >= 7
    assert _gemm_calls(GRAPHS["linear_static1"]) == {"cuvil.small_gemm"}
    assert _gemm_calls(GRAPHS["linear_static7"]) == {"cuvil.small_gemm"}
    assert _gemm_calls(GRAPHS["linear_static64"]) == {"scipy_cblas_sgemm"}
    assert _gemm_calls(GRAPHS["linear_relu"]) == {"cuvil.small_gemm", "scipy_cblas_sgemm"}


# A bare gemm statement with alpha, beta and padded leading dimensions (lda > k, ldc > n).
GEMM_KERNELS = """
kernel @gemm_nt(%a: in f32[s1, 40], %b: in f32[21, 37], %c: out f32[s1, 24]) dims(s1) {
  gemm c=%c[0], a=%a[0], b=%b[0], m=s1, n=21, k=37, lda=40, ldb=37, ldc=24, trans_a=false, trans_b=true, alpha=2.0, beta=0.5
}
kernel @gemm_nn(%a: in f32[s1, 40], %b: in f32[37, 21], %c: out f32[s1, 24]) dims(s1) {
  gemm c=%c[0], a=%a[0], b=%b[0], m=s1, n=21, k=37, lda=40, ldb=21, ldc=24, trans_a=false, trans_b=false, alpha=2.0, beta=0.5
}
"""


@pytest.fixture(scope="module")
def gemm_module():
    return compile_kernels(parse_kernels(GEMM_KERNELS), cache=None)


@pytest.mark.parametrize("m", ROWS)
def test_gemm_statement_alpha_beta_and_leading_dims(gemm_module, m):
    a, c0 = rand(m, 40), rand(m, 24, seed=3)
    for name, b, op_b in (("gemm_nt", rand(21, 37, seed=1), lambda b: b.T), ("gemm_nn", rand(37, 21, seed=1),
                                                                              lambda b: b)):
        c = c0.clone()
        call_kernel(gemm_module, name, [a, b, c])
        expected = c0.clone()
        expected[:, :21] = 2.0 * (a[:, :37].double() @ op_b(b).double()) + 0.5 * c0[:, :21].double()
        torch.testing.assert_close(c, expected, **TOL)     # columns past n are left alone

