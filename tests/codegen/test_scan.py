"""Running folds (`library.scan`): cumsum, cumprod, logcumsumexp, cummax and cummin, each row in
order, element i from element i-1's result; against eager torch."""
import pytest
import torch

import cuvil
from codegen_helpers import Graph, T, compile_graphs, run
from cuvil.codegen.kernel_text import print_kernels

NAN, INF = float("nan"), float("inf")


def same(got, ref):
    """Equal, NaN where torch has NaN, and the same sign of zero."""
    assert got.dtype == ref.dtype
    assert torch.equal(torch.isnan(got), torch.isnan(ref)) if got.is_floating_point() else True
    torch.testing.assert_close(got, ref, equal_nan=True, rtol=0, atol=0)
    if got.is_floating_point():
        assert torch.equal(torch.signbit(got), torch.signbit(ref))


SPECIAL = torch.tensor([[0.0, -0.0, 1.0, NAN, 2.0, NAN, 3.0, -INF],
                        [-INF, -INF, 1.0, INF, INF, 2.0, 1.0, 1.0],
                        [2.0, 2.0, -1.0, 2.0, 5.0, 5.0, -3.0, 0.5]])


@pytest.mark.parametrize("name", ["cummax", "cummin"])
def test_running_extremes_and_their_indices_follow_torch_through_nan_ties_and_signed_zeros(name):
    fn = getattr(torch, name)
    for dim in (0, 1):
        got = cuvil.compile(lambda x: fn(x, dim))(SPECIAL)
        ref = fn(SPECIAL, dim)
        assert type(got) is type(ref)
        same(got.values, ref.values)
        assert torch.equal(got.indices, ref.indices)


@pytest.mark.parametrize("name", ["cumsum", "cumprod", "logcumsumexp"])
def test_sums_products_and_log_sums_keep_torchs_special_values(name):
    fn = getattr(torch, name)
    got = cuvil.compile(lambda x: fn(x, 1))(SPECIAL)
    torch.testing.assert_close(got, fn(SPECIAL, 1), equal_nan=True, rtol=1e-6, atol=1e-6)


def test_integer_and_bool_inputs():
    x = torch.tensor([[3, 1, 3, 2, 5, 5, 0], [-2, 7, 7, -9, 1, 0, 7]], dtype=torch.int32)
    compiled = cuvil.compile(lambda x: (torch.cumsum(x, 1), torch.cumprod(x, 1), torch.cummax(x, 1), torch.cummin(x, 0)))
    s, p, mx, mn = compiled(x)
    assert s.dtype == p.dtype == torch.int64
    assert torch.equal(s, torch.cumsum(x, 1)) and torch.equal(p, torch.cumprod(x, 1))
    for got, ref in ((mx, torch.cummax(x, 1)), (mn, torch.cummin(x, 0))):
        assert torch.equal(got.values, ref.values) and torch.equal(got.indices, ref.indices)
    flags = torch.tensor([[True, False, True, False], [False, False, True, True]])
    counts, (top, where) = cuvil.compile(lambda b: (b.cumsum(1), torch.cummax(b, 1)))(flags)
    assert torch.equal(counts, flags.cumsum(1))
    assert torch.equal(top, torch.cummax(flags, 1).values) and torch.equal(where, torch.cummax(flags, 1).indices)


def test_long_rows_are_linear_and_half_floats_carry_in_f32():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 20000, generator=g)
    got = cuvil.compile(lambda x: torch.cumsum(x, -1))(x)
    # torch accumulates in f64: the f32 running sum drifts by rounding only
    torch.testing.assert_close(got, torch.cumsum(x.double(), -1).float(), rtol=0, atol=2e-3)
    h = torch.rand(2, 3000, generator=g).half()
    torch.testing.assert_close(cuvil.compile(lambda h: torch.cumsum(h, 1))(h), torch.cumsum(h, 1), rtol=2e-3, atol=0)


def test_dynamic_row_length_and_a_fused_epilogue():
    compiled = cuvil.compile(lambda x: torch.logcumsumexp(x, 1) * 2.0 - x, dynamic={"x": {1: "n"}})
    g = torch.Generator().manual_seed(8)
    for n in (1, 7, 500):
        x = torch.randn(4, n, generator=g) * 30
        torch.testing.assert_close(compiled(x), torch.logcumsumexp(x, 1) * 2.0 - x, rtol=1e-5, atol=1e-5)


def test_top_p_sampling_masks_like_eager():
    # the nucleus of a softmax: sort, running sum, keep until p (sort and cumsum over a vocabulary)
    def top_p(logits):
        probs, order = torch.sort(torch.softmax(logits, -1), descending=True)
        keep = torch.cumsum(probs, -1) - probs < 0.9
        return torch.where(keep, probs, 0.0), order
    logits = torch.randn(2, 32000, generator=torch.Generator().manual_seed(3)) * 4
    (probs, order), (ref_probs, _) = cuvil.compile(top_p)(logits), top_p(logits)
    torch.testing.assert_close(probs, ref_probs, rtol=1e-5, atol=1e-6)
    # softmax's last bits differ from eager's, so nearly equal probabilities may trade places:
    # the order must sort eager's probabilities all the same
    ranked = torch.gather(torch.softmax(logits, -1), 1, order)
    torch.testing.assert_close(ranked, torch.sort(torch.softmax(logits, -1), descending=True).values, rtol=1e-6, atol=0)
    assert all(len(set(row.tolist())) == 32000 for row in order)


def test_the_scan_kernel_reads_the_previous_result_back():
    graph = Graph("cumprod1", lambda b, x: b.create("cuvil.cumprod", [x], {"dim": 1}).result, [T(4, "n")])
    lines = [line.strip() for line in print_kernels(graph.kernels).splitlines()]
    # the first element as it is (none when n = 0), then each from the one before it
    assert lines[2:9] == ["for i in 0..min(1, n) {", "%y0[p, i] = %a0[p, i]", "}",
                          "for i in 1..max(0, n - 1) + 1 {", "%x0 = %a0[p, i]", "%y0[p, i] = mul(%y0[p, i - 1], %x0)", "}"]
    x = torch.rand(4, 9) + 0.5
    torch.testing.assert_close(run(graph, compile_graphs([graph]), x), torch.cumprod(x, 1), rtol=1e-6, atol=0)


@pytest.mark.parametrize("name", ["cumsum", "cumprod", "logcumsumexp", "cummax", "cummin"])
def test_a_scan_along_an_outer_dim_folds_a_tile_of_rows_at_a_time(name):
    """Along dim 1 of [3, 400, 70] (70 = 64 + 6 columns: a partial tile), each step of the fold is
    a loop over a tile of the input's contiguous rows (`library.SCAN_COLUMNS`): the kernel's `col`
    loop. The values as eager's, the compensated cumsum's to its f64 reference."""
    fn = getattr(torch, name)
    x = torch.randn(3, 400, 70, generator=torch.Generator().manual_seed(9))
    if name == "cumprod":
        x = 1 + 0.01 * x
    x[0, 5, 3], x[1, 10, 66] = NAN, INF
    compiled = cuvil.compile(lambda t: fn(t, 1), cache=False)
    got, ref = compiled(x), fn(x, 1)
    assert "for col in" in compiled.report.kernels[0]["kernel_ir"]
    if name in ("cummax", "cummin"):
        same(got.values, ref.values)
        assert torch.equal(got.indices, ref.indices)
    elif name == "cumsum":
        torch.testing.assert_close(got, fn(x.double(), 1).float(), equal_nan=True, rtol=0, atol=1e-5)
    else:
        torch.testing.assert_close(got, ref, equal_nan=True, rtol=1e-5, atol=1e-5)


def test_a_scan_over_rows_of_a_dynamic_count_with_an_epilogue():
    compiled = cuvil.compile(lambda x: torch.cumsum(x, 0) * 0.5, dynamic={"x": {0: "n", 1: "m"}}, cache=False)
    g = torch.Generator().manual_seed(10)
    for n, m in ((1, 8), (300, 100), (17, 130)):
        x = torch.randn(n, m, generator=g)
        torch.testing.assert_close(compiled(x), torch.cumsum(x.double(), 0).float() * 0.5, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["cumsum", "cumprod", "logcumsumexp", "cummax", "cummin"])
def test_a_scan_along_the_last_dim_folds_a_vector_of_rows_at_a_time(name):
    """Along the last dim of [2, 37, 203] (37 = 2 x 16 + 5 rows: a partial tile; 203 = 25 x 8 + 3
    steps: partial transposed tiles), a vector of rows goes together (`SCAN_ROW_BYTES`), copied transposed in and out
    (`library._transposed_copy`): the kernel's `col` loop inside the step loop. Special values in
    rows of the first, a middle and the last tile."""
    fn = getattr(torch, name)
    x = torch.randn(2, 37, 203, generator=torch.Generator().manual_seed(11))
    if name == "cumprod":
        x = 1 + 0.01 * x
    x[0, 3, 5], x[0, 20, 200], x[1, 36, 7], x[1, 33, 100], x[1, 0, 202] = NAN, INF, -INF, NAN, INF
    compiled = cuvil.compile(lambda t: fn(t, -1), cache=False)
    got, ref = compiled(x), fn(x, -1)
    kernel = compiled.report.kernels[0]["kernel_ir"]
    assert "for col in" in kernel and "for ia in" in kernel
    if name in ("cummax", "cummin"):
        same(got.values, ref.values)
        assert torch.equal(got.indices, ref.indices)
    elif name == "cumsum":
        torch.testing.assert_close(got, fn(x.double(), -1).float(), equal_nan=True, rtol=0, atol=1e-5)
    else:
        torch.testing.assert_close(got, ref, equal_nan=True, rtol=1e-5, atol=1e-5)


def test_a_last_dim_scan_of_dynamic_rows_and_length_with_an_epilogue_and_integers():
    compiled = cuvil.compile(lambda x: torch.relu(torch.cumsum(x, 1)) * 0.5, dynamic={"x": {0: "n", 1: "m"}},
                             cache=False)
    g = torch.Generator().manual_seed(12)
    for n, m in ((1, 8), (40, 9), (16, 300), (3, 1000)):
        x = torch.randn(n, m, generator=g)
        torch.testing.assert_close(compiled(x), torch.relu(torch.cumsum(x.double(), 1).float()) * 0.5,
                                   rtol=0, atol=1e-5)
    ints = torch.randint(-50, 50, (32, 77), generator=g, dtype=torch.int32)
    counts = cuvil.compile(lambda t: (t.cumsum(1), torch.cummax(t, 1)), cache=False)(ints)
    assert torch.equal(counts[0], ints.cumsum(1))
    assert torch.equal(counts[1].values, torch.cummax(ints, 1).values)
    assert torch.equal(counts[1].indices, torch.cummax(ints, 1).indices)
