"""`cuvil.grouped_matmul` natively (a mixture of experts' grouped product: `library.grouped_matmul`,
one GEMM per expert over its rows, their count read at run time), against the torch op's own
loop of products: experts without rows, rows past the last offset, offsets past the rows, a
dynamic count of rows, and an epilogue fused after it."""
import pytest
import torch

import cuvil
from cuvil.frontend.decompositions import grouped_mm_op


def grouped(rows, weight, offsets):
    return torch.ops.cuvil.grouped_mm(rows, weight, offsets)


def grouped_relu(rows, weight, offsets):
    return torch.relu(torch.ops.cuvil.grouped_mm(rows, weight, offsets)) * 2.0


@pytest.mark.parametrize("counts", [[3, 0, 5, 2], [0, 0, 0, 10], [10, 0, 0, 0], [1, 2, 3, 1], [4, 4, 4, 4]],
                         ids=["empty-expert", "all-last", "all-first", "rows-left-over", "offsets-past-the-rows"])
def test_each_experts_rows_times_its_matrix(counts):
    g = torch.Generator().manual_seed(sum(counts))
    rows, weight = torch.randn(10, 24, generator=g), torch.randn(4, 24, 40, generator=g)
    offsets = torch.tensor(counts).cumsum(0).to(torch.int32)
    want = grouped_mm_op(rows, weight, offsets)
    torch.testing.assert_close(cuvil.compile(grouped)(rows, weight, offsets), want)
    torch.testing.assert_close(cuvil.compile(grouped_relu)(rows, weight, offsets), torch.relu(want) * 2.0)


def test_a_dynamic_count_of_rows_compiles_once():
    compiled = cuvil.compile(grouped, dynamic={"rows": {0: "rows"}})
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(3, 16, 8, generator=g)
    for n in (5, 40, 300):
        rows = torch.randn(n, 16, generator=g)
        counts = torch.randint(0, 3, (n,), generator=g).bincount(minlength=3)
        offsets = counts.cumsum(0).to(torch.int64)
        torch.testing.assert_close(compiled(rows, weight, offsets), grouped_mm_op(rows, weight, offsets))
    assert compiled.num_variants == 1


def test_its_kernel_reads_the_row_counts_as_sizes_and_round_trips_as_text():
    from cuvil.codegen.kernel_text import parse_kernel, print_kernel
    report = cuvil.explain(grouped_relu, torch.randn(10, 8), torch.randn(3, 8, 4), torch.tensor([3, 3, 10]))
    text = next(k["kernel_ir"] for k in report.kernels if "grouped_matmul" in k["name"])
    assert "%end1 = %offsets[e]" in text and "m=-min(10, max(0, start0)) + min(10, max(end1, max(0, start0)))" in text
    once = print_kernel(parse_kernel(text))      # sympy flattens max(a, max(0, b)) as it reads it back
    assert print_kernel(parse_kernel(once)) == once and once.replace("max(0, end1, start0)", "max(end1, max(0, start0))") == text
