"""topk, sort, argsort, kthvalue and median: `cuvil.argtopk`, one call of the runtime's topk
(native/src/select.cpp) per row, then a gather of the values."""
import pytest
import torch

import cuvil
from codegen_helpers import Graph, T, compile_graphs, run
from cuvil.codegen.kernel_text import parse_kernels, print_kernels
from cuvil.errors import CuvilError

NAN, INF = float("nan"), float("inf")


def assert_selection(values, indices, x, dim, ref_values):
    """The values are torch's (NaN where torch has NaN), and the indices point at them, each once."""
    torch.testing.assert_close(values, ref_values, equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(torch.gather(x, dim, indices), values, equal_nan=True, rtol=0, atol=0)
    picked = indices.movedim(dim, -1)
    assert all(len(set(row.tolist())) == len(row) for row in picked.reshape(-1, picked.shape[-1]))


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_topk_matches_torch_along_any_dim(largest, dim):
    x = torch.randn(6, 9, 5, generator=torch.Generator().manual_seed(dim + 3))
    compiled = cuvil.compile(lambda x: torch.topk(x, 4, dim=dim, largest=largest))
    values, indices = compiled(x)
    ref = torch.topk(x, 4, dim=dim, largest=largest)
    torch.testing.assert_close(values, ref.values, rtol=0, atol=0)
    assert torch.equal(indices, ref.indices)            # no ties in random floats: the same indices


@pytest.mark.parametrize("largest", [True, False])
def test_nan_infinities_and_ties_in_torch_order(largest):
    # torch counts NaN above every number; equal values (NaNs, -0 and +0 too) come in the order
    # torch.topk's CPU kernel leaves them, which its selection's steps decide: eager's indices
    x = torch.tensor([[1.0, NAN, 3.0, 3.0, -INF, NAN, 0.0, INF],
                      [2.0, 2.0, 2.0, -INF, -INF, 5.0, 1.0, -0.0],
                      [NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN]])
    for k in (1, 3, 8):
        values, indices = cuvil.compile(lambda x: torch.topk(x, k, largest=largest))(x)
        ref = torch.topk(x, k, largest=largest)
        assert_selection(values, indices, x, 1, ref.values)
        assert torch.equal(indices, ref.indices)


@pytest.mark.parametrize("n", [8, 100, 640, 32000])
def test_equal_values_pick_eagers_indices(n):
    """A router whose scores tie (a zero-initialised gate: every score 0.5) picks the experts eager
    picks: torch.topk's CPU kernel selects with std::partial_sort (k * 64 <= n) or std::nth_element,
    and the runtime repeats those steps where equal values decide the result. Unsorted too."""
    g = torch.Generator().manual_seed(n)
    rows = torch.stack([torch.full((n,), 0.5), torch.randint(0, 3, (n,), generator=g).float(),
                        torch.randint(-1, 2, (n,), generator=g) * 0.0])     # ties, and -0 with +0
    for k in (k for k in (1, 2, 6, 50) if k <= n):
        for sorted_ in (True, False):
            def f(x):
                return torch.topk(x, k, dim=1, sorted=sorted_)
            assert torch.equal(cuvil.compile(f)(rows).indices, f(rows).indices), (k, sorted_)


def test_sort_and_argsort_keep_equal_values_in_order():
    x = torch.tensor([[3.0, 1.0, 3.0, NAN, 1.0, -INF, 2.0], [0.0, 0.0, -1.0, 5.0, 5.0, 0.0, NAN]])
    for descending in (False, True):
        compiled = cuvil.compile(lambda x: torch.sort(x, dim=1, descending=descending, stable=True))
        values, indices = compiled(x)
        ref = torch.sort(x, dim=1, descending=descending, stable=True)
        torch.testing.assert_close(values, ref.values, equal_nan=True, rtol=0, atol=0)
        assert torch.equal(indices, ref.indices)        # a stable sort's order is defined
        argsort = cuvil.compile(lambda x: torch.argsort(x, dim=1, descending=descending, stable=True))
        assert torch.equal(argsort(x), torch.argsort(x, dim=1, descending=descending, stable=True))


@pytest.mark.parametrize("n", [2, 5, 33, 1000])
def test_kthvalue_and_median_of_equal_values_pick_eagers_index(n):
    """Of equal values, kthvalue gives the index torch.kthvalue's quickselect (ATen's, from TH)
    picks, which the runtime repeats step for step; median gives the lowest index, as torch's
    nth_element by (value, index) does. NaN and -0 too."""
    g = torch.Generator().manual_seed(n)
    x = torch.randint(0, 3, (3, n), generator=g).float()
    x[0, 0], x[1, -1] = -0.0, NAN
    for k in sorted({1, 2, (n + 1) // 2, n}):
        for f in (lambda x: torch.kthvalue(x, k, dim=1), lambda x: torch.kthvalue(x.t(), k, dim=0, keepdim=True)):
            got, want = cuvil.compile(f)(x), f(x)
            torch.testing.assert_close(got.values, want.values, equal_nan=True, rtol=0, atol=0)
            assert torch.equal(got.indices, want.indices), k
    got, want = cuvil.compile(lambda x: torch.median(x, dim=1))(x), torch.median(x, dim=1)
    assert torch.equal(got.indices, want.indices)
    ints = torch.randint(-2, 2, (2, n), generator=g)
    assert torch.equal(cuvil.compile(lambda x: torch.kthvalue(x, 1, dim=1))(ints).indices,
                       torch.kthvalue(ints, 1, dim=1).indices)


def test_integer_tensors_and_their_extreme_values():
    info = torch.iinfo(torch.int32)
    x = torch.tensor([[info.min, 5, info.max, -2, info.min, 0], [7, 7, 7, info.max, info.max, 1]], dtype=torch.int32)
    for largest in (True, False):
        values, indices = cuvil.compile(lambda x: torch.topk(x, 6, largest=largest))(x)
        assert_selection(values, indices, x, 1, torch.topk(x, 6, largest=largest).values)
        assert torch.equal(indices, torch.topk(x, 6, largest=largest).indices)


def test_dynamic_batch_and_row_length():
    compiled = cuvil.compile(lambda x: torch.topk(x, 3), dynamic={"x": {0: "batch", 1: "n"}}, ranges={"n": (3, 4096)})
    g = torch.Generator().manual_seed(7)
    for shape in ((2, 10), (5, 40), (1, 3)):
        x = torch.randn(*shape, generator=g)
        values, indices = compiled(x)
        ref = torch.topk(x, 3)
        torch.testing.assert_close(values, ref.values, rtol=0, atol=0)
        assert torch.equal(indices, ref.indices)
    assert len(compiled._variants) == 1


def stable_order(x, dim, descending):
    """torch's order with equal values by index: what Cuvil's sort returns."""
    return torch.sort(x, dim=dim, descending=descending, stable=True)


@pytest.mark.parametrize("largest", [True, False])
def test_long_rows_and_large_k_in_one_call_per_row(largest):
    # a vocabulary-sized row (sampling), and k past the heap's share of the row (a partial sort)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(3, 32000, generator=g)
    x[1, ::7] = x[1, 3]                                  # many ties
    x[2, 100:200] = NAN
    for k in (1, 50, 5000):
        compiled = cuvil.compile(lambda x: torch.topk(x, k, largest=largest))
        values, indices = compiled(x)
        ref = torch.topk(x, k, largest=largest)
        torch.testing.assert_close(values, ref.values, equal_nan=True, rtol=0, atol=0)
        assert torch.equal(indices, ref.indices)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int8, torch.float16, torch.bfloat16])
def test_other_dtypes_sort_like_torch(dtype):
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(4, 2000, generator=g) * 50).to(dtype)      # long enough for the radix sort
    for descending in (False, True):
        values, indices = cuvil.compile(lambda x: torch.sort(x, dim=1, descending=descending, stable=True))(x)
        ref = stable_order(x, 1, descending)
        assert torch.equal(values, ref.values) and torch.equal(indices, ref.indices)


def test_sort_of_a_row_of_dynamic_length():
    compiled = cuvil.compile(lambda x: torch.sort(x, dim=1), dynamic={"x": {1: "n"}})
    g = torch.Generator().manual_seed(2)
    for n in (1, 10, 1000):
        x = torch.randint(-5, 5, (3, n), generator=g).float()
        values, indices = compiled(x)
        ref = stable_order(x, 1, False)
        assert torch.equal(values, ref.values) and torch.equal(indices, ref.indices)


def test_the_topk_statement_along_a_strided_dim_prints_parses_and_runs():
    graph = Graph("argtopk0", lambda b, x: b.create("cuvil.argtopk", [x], {"k": 5, "dim": 0, "largest": False}).result,
                  [T(40, 7)])
    (kernel,) = graph.kernels
    text = print_kernels([kernel])
    (call,) = [line.strip() for line in text.splitlines() if line.strip().startswith("topk")]
    # one call per column: the row runs down a column, 7 elements apart, and so do its 5 indices
    assert call == "topk dst=%y0[p], src=%a0[p], n=40, stride=7, k=5, dst_stride=7, largest=false"
    assert print_kernels(parse_kernels(text)) == text
    x = torch.randint(-4, 4, (40, 7)).float()
    out = run(graph, compile_graphs([graph]), x)
    assert torch.equal(out, torch.sort(x, dim=0, stable=True).indices[:5])
    graph = Graph("argtopk1", lambda b, x: b.create("cuvil.argtopk", [x], {"k": 5, "dim": 0, "order": "topk"}).result,
                  [T(40, 7)])
    text = print_kernels(graph.kernels)
    assert "topk dst=%y0[p], src=%a0[p], n=40, stride=7, k=5, dst_stride=7, largest=true, order=topk" in text
    assert print_kernels(parse_kernels(text)) == text
    assert torch.equal(run(graph, compile_graphs([graph]), x), torch.topk(x, 5, dim=0).indices)


def test_what_topk_and_sort_refuse_says_why():
    with pytest.raises(CuvilError, match=r"a bool tensor"):
        cuvil.compile(lambda x: torch.topk(x, 2))(torch.rand(2, 10) > 0.5)
    with pytest.raises(CuvilError, match=r"row of symbolic length .* median's position"):
        cuvil.compile(lambda x: torch.median(x, 1), dynamic={"x": {1: "n"}})(torch.randn(2, 10))


def test_median_and_kthvalue_pick_torchs_values_and_propagate_nan():
    x = torch.tensor([[1.0, NAN, 2.0, 0.0], [3.0, 1.0, 2.0, 1.0], [5.0, -INF, 3.0, 2.0]])
    values, indices = cuvil.compile(lambda x: torch.median(x, 1))(x)
    ref = torch.median(x, 1)
    torch.testing.assert_close(values, ref.values, equal_nan=True, rtol=0, atol=0)
    assert indices[0] == 1                          # a row with NaN: NaN, at its first NaN
    torch.testing.assert_close(torch.gather(x, 1, indices[:, None])[:, 0], values, equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(cuvil.compile(lambda x: torch.median(x))(x[1:]), torch.median(x[1:]))
    assert torch.isnan(cuvil.compile(lambda x: torch.median(x))(x))
    for k in (1, 3, 4):
        values, indices = cuvil.compile(lambda x: torch.kthvalue(x, k, 1, keepdim=True))(x)
        ref = torch.kthvalue(x, k, 1, keepdim=True)
        torch.testing.assert_close(values, ref.values, equal_nan=True, rtol=0, atol=0)
        torch.testing.assert_close(torch.gather(x, 1, indices), values, equal_nan=True, rtol=0, atol=0)


def test_a_saved_model_keeps_the_runtime_call_and_torchs_result_type(tmp_path):
    x = torch.randn(4, 300, generator=torch.Generator().manual_seed(9))
    compiled = cuvil.compile(lambda x: (torch.topk(x, 7), torch.max(x, 1)))
    path = tmp_path / "topk.cuvil"
    compiled(x)
    compiled.save(path)
    (top, biggest) = cuvil.load(path)(x)
    assert type(top) is torch.return_types.topk and type(biggest) is torch.return_types.max
    ref = torch.topk(x, 7)
    assert torch.equal(top.values, ref.values) and torch.equal(top.indices, ref.indices)
    assert torch.equal(biggest.indices, torch.max(x, 1).indices)


def test_a_topk_along_an_outer_dim_copies_a_tile_of_rows_out_first():
    """Along dim 0 of [300, 40] (tiles of 16 columns, the last one of 8), the columns are copied out
    as contiguous rows (`library.TOPK_COLUMNS`) and the runtime walks them with stride 1 (in place,
    each element was a row of 40 floats apart). Ties and NaN as torch orders them."""
    x = torch.randint(-3, 3, (300, 40), generator=torch.Generator().manual_seed(12)).float()
    x[7, 3], x[100, 3], x[5, 39] = NAN, NAN, -INF
    compiled = cuvil.compile(lambda t: torch.topk(t, 6, dim=0), cache=False)
    values, indices = compiled(x)
    ref = torch.topk(x, 6, dim=0)
    assert_selection(values, indices, x, 0, ref.values)
    assert torch.equal(indices, ref.indices)
    kernel = next(k["kernel_ir"] for k in compiled.report.kernels if "topk " in k["kernel_ir"])
    assert "stride=1," in kernel and "for col in" in kernel
    for fn in (lambda t: torch.sort(t, dim=0, stable=True), lambda t: torch.kthvalue(t, 100, dim=0),
               lambda t: torch.median(t, dim=0)):
        got, want = cuvil.compile(fn, cache=False)(x), fn(x)
        torch.testing.assert_close(got.values, want.values, equal_nan=True, rtol=0, atol=0)
        assert torch.equal(got.indices, want.indices)


def test_a_topk_along_a_middle_dim_of_a_dynamic_batch():
    compiled = cuvil.compile(lambda t: torch.topk(t, 3, dim=1, largest=False), dynamic=[{0: "b"}], cache=False)
    for b in (1, 3):
        x = torch.randn(b, 50, 21, generator=torch.Generator().manual_seed(b))
        values, indices = compiled(x)
        ref = torch.topk(x, 3, dim=1, largest=False)
        torch.testing.assert_close(values, ref.values, rtol=0, atol=0)
        assert torch.equal(indices, ref.indices)
