"""Cuvil's own decompositions (cuvil/frontend/decompositions.py), compiled natively against eager
PyTorch: `x[idx] = v` and `x.index_put_(..., accumulate=True)` by an index tensor, `torch.histc`
with a range. (The grouped product of a mixture of experts is compared in
tests/differential/test_hf_models.py, on Mixtral.)"""
import pytest
import torch

import cuvil


def put(x, idx, v):
    out = x.clone()
    out[idx] = v
    return out


def put_added(x, idx, v):
    return x.clone().index_put_((idx,), v, accumulate=True)


def inverse_permutation(perm):
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.shape[0])
    return inv


def test_assignment_through_an_index_tensor():
    g = torch.Generator().manual_seed(0)
    x, v = torch.randn(9, 5, generator=g), torch.randn(4, 5, generator=g)
    idx = torch.tensor([7, -1, 2, 0])                        # -1 is the last row
    torch.testing.assert_close(cuvil.compile(put)(x, idx, v), put(x, idx, v), rtol=0, atol=0)
    scalar = cuvil.compile(lambda x, idx: put(x, idx, 2.5))   # a value broadcast to every row named
    torch.testing.assert_close(scalar(x, idx), put(x, idx, 2.5), rtol=0, atol=0)


def test_accumulation_through_repeated_indices():
    g = torch.Generator().manual_seed(1)
    x, v = torch.randn(6, 3, generator=g), torch.randn(7, 3, generator=g)
    idx = torch.tensor([1, 4, 1, 1, 0, 4, 5])
    torch.testing.assert_close(cuvil.compile(put_added)(x, idx, v), put_added(x, idx, v))


@pytest.mark.parametrize("n", [5, 13, 40])
def test_the_inverse_of_a_permutation_at_dynamic_sizes(n):
    compiled = cuvil.compile(inverse_permutation, dynamic={"perm": {0: "n"}})
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(n))
    assert torch.equal(compiled(perm), inverse_permutation(perm))


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
