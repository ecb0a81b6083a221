"""Cuvil's own decompositions (cuvil/frontend/decompositions.py), compiled natively against eager
PyTorch: `torch.histc` with a range, `scatter`, `scatter_add`, `scatter_reduce` and `F.grid_sample`. (The grouped product of a
mixture of experts is compared in tests/differential/test_hf_models.py, on Mixtral.)"""
import pytest
import torch

import cuvil


def test_a_histogram_with_a_range():
    def hist(x):
        return torch.histc(x, bins=6, min=-1.5, max=1.5)
    g = torch.Generator().manual_seed(2)
    x = torch.cat([torch.randn(200, generator=g), torch.tensor([-1.5, 1.5, 0.0, 3.0, -2.0])])   # edges, outside
    torch.testing.assert_close(cuvil.compile(hist)(x), hist(x), rtol=0, atol=0)
    ids = torch.randint(0, 4, (37,), generator=g).float()      # a mixture of experts' count of tokens per expert
    counts = cuvil.compile(lambda e: torch.histc(e, bins=4, min=0, max=3))(ids)
    assert torch.equal(counts, torch.histc(ids, bins=4, min=0, max=3))


def test_a_histogram_of_the_datas_own_range_is_refused_by_name():
    with pytest.raises(cuvil.CuvilError, match="aten.histc"):
        cuvil.compile(lambda x: torch.histc(x, bins=4))(torch.randn(10))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_of_a_value_a_tensor_and_a_sum(dim):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 6, generator=g)
    shape = [4, 6]
    shape[dim] = 3
    index = torch.randint(0, x.shape[dim], shape, generator=g)        # repeats along dim
    src = torch.randn(shape, generator=g)
    fns = {"value": lambda x, i: x.scatter(dim, i, float("-inf")),    # a router's mask of its top experts
           "add": lambda x, i, s: x.scatter_add(dim, i, s)}
    torch.testing.assert_close(cuvil.compile(fns["value"])(x, index), fns["value"](x, index), rtol=0, atol=0)
    torch.testing.assert_close(cuvil.compile(fns["add"])(x, index, src), fns["add"](x, index, src))
    unique = torch.argsort(torch.rand(x.shape, generator=g), dim=dim).narrow(dim, 0, 3)   # no repeats: one answer
    copied = cuvil.compile(lambda x, i, s: x.scatter(dim, i, s))(x, unique, src)
    torch.testing.assert_close(copied, x.scatter(dim, unique, src), rtol=0, atol=0)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_over_segments(reduce, include_self):
    """TAPAS's segment reductions: each segment's minimum (maximum, mean, ...) of the values whose
    segment index names it; a segment no index names keeps the input's value."""
    g = torch.Generator().manual_seed(5)
    values = torch.randn(3, 16, generator=g)
    values[1, 4] = float("nan")                     # propagates to its segment, as in eager
    segments = torch.randint(0, 6, (3, 16), generator=g)     # segment 7 is never named: kept as it was
    base = torch.randn(3, 8, generator=g)

    def reduced(base, segments, values):
        return base.scatter_reduce(1, segments, values, reduce=reduce, include_self=include_self)
    got = cuvil.compile(reduced)(base, segments, values)
    torch.testing.assert_close(got, reduced(base, segments, values), rtol=1e-5, atol=1e-6, equal_nan=True)
    ints = torch.randint(-50, 50, (3, 16), generator=g)
    if reduce != "mean":
        got = cuvil.compile(reduced)(torch.zeros(3, 8, dtype=torch.int64), segments, ints)
        assert torch.equal(got, reduced(torch.zeros(3, 8, dtype=torch.int64), segments, ints))


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample(mode, padding, align_corners):
    """Sample points inside, on the edges of and outside the image (the grid spans [-1.3, 1.3])."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 7, 9, generator=g)
    grid = torch.rand(2, 5, 6, 2, generator=g) * 2.6 - 1.3
    grid[0, 0, :3] = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [1.0, -1.0]])

    def sample(x, grid):
        return torch.nn.functional.grid_sample(x, grid, mode=mode, padding_mode=padding, align_corners=align_corners)
    torch.testing.assert_close(cuvil.compile(sample, cache=False)(x, grid), sample(x, grid), rtol=1e-5, atol=1e-5)
