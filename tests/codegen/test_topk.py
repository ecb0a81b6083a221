"""topk, sort and argsort (`aten_table.topk`): one selection pass over the row per element taken."""
import pytest
import torch

import cuvil
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
    # torch counts NaN above every number; among equal values the order of indices is not
    # specified, so the indices are checked to hold the values, each once
    x = torch.tensor([[1.0, NAN, 3.0, 3.0, -INF, NAN, 0.0, INF],
                      [2.0, 2.0, 2.0, -INF, -INF, 5.0, 1.0, -0.0],
                      [NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN]])
    compiled = cuvil.compile(lambda x: torch.topk(x, 8, largest=largest))
    values, indices = compiled(x)
    assert_selection(values, indices, x, 1, torch.topk(x, 8, largest=largest).values)


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


def test_integer_tensors_and_their_extreme_values():
    info = torch.iinfo(torch.int32)
    x = torch.tensor([[info.min, 5, info.max, -2, info.min, 0], [7, 7, 7, info.max, info.max, 1]], dtype=torch.int32)
    for largest in (True, False):
        values, indices = cuvil.compile(lambda x: torch.topk(x, 6, largest=largest))(x)
        assert_selection(values, indices, x, 1, torch.topk(x, 6, largest=largest).values)


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


def test_what_topk_and_sort_refuse_says_why():
    with pytest.raises(CuvilError, match=r"k=65: Cuvil selects 1 to 64 elements"):
        cuvil.compile(lambda x: torch.topk(x, 65))(torch.randn(2, 100))
    with pytest.raises(CuvilError, match=r"rows of 100 elements: Cuvil sorts rows of at most 64"):
        cuvil.compile(lambda x: torch.sort(x))(torch.randn(2, 100))
    with pytest.raises(CuvilError, match=r"row of symbolic length"):
        cuvil.compile(lambda x: torch.sort(x), dynamic={"x": {1: "n"}})(torch.randn(2, 10))


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
