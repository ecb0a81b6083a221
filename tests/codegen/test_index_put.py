"""`x[idx] = v` and `index_put_(..., accumulate=True)` natively (`cuvil.index_put`,
`library.index_put`) against eager PyTorch: repeated and negative indices, other dtypes, an index
along another dim, an index argument outside the rows (raises as eager raises), dynamic sizes."""
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


@pytest.mark.parametrize("bad", [9, -10])
def test_an_index_outside_the_rows_raises_as_in_eager(bad):
    x, v = torch.zeros(9, 2), torch.ones(3, 2)
    idx = torch.tensor([1, bad, 4])
    with pytest.raises(IndexError):
        put(x, idx, v)
    compiled = cuvil.compile(put)
    torch.testing.assert_close(compiled(x, torch.tensor([1, -9, 4]), v), put(x, torch.tensor([1, -9, 4]), v))
    with pytest.raises(cuvil.CuvilIndexError, match=rf"holds {bad} at \[1\].*\[-9, 8\]"):
        compiled(x, idx, v)


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


def test_an_index_along_another_dim():
    def put_cols(x, idx, v):
        y = x.clone()
        y[:, idx] = v
        return y

    def add_last(x, idx, v):
        y = x.clone()
        y[:, :, idx] += v
        return y
    g = torch.Generator().manual_seed(4)
    x, idx = torch.randn(3, 5, 2, generator=g), torch.tensor([4, -1, 0])
    for v in (torch.randn(3, 3, 2, generator=g), torch.randn(2, generator=g)):     # broadcast values too
        assert torch.equal(cuvil.compile(put_cols)(x, idx, v), put_cols(x, idx, v))
    x, idx, v = torch.randn(2, 3, 6, generator=g), torch.tensor([5, 1, 5]), torch.randn(2, 3, 3, generator=g)
    assert torch.equal(cuvil.compile(add_last)(x, idx, v), add_last(x, idx, v))


def test_other_dtypes_and_an_empty_index():
    g = torch.Generator().manual_seed(5)
    x, v = torch.randn(6, 2, generator=g).half(), torch.randn(2, 2, generator=g).half()
    idx = torch.tensor([1, 5], dtype=torch.int32)
    assert torch.equal(cuvil.compile(put)(x, idx, v), put(x, idx, v))
    ints = torch.arange(12).reshape(6, 2)
    assert torch.equal(cuvil.compile(put_added)(ints, torch.tensor([1, 1, 3]), torch.tensor([1, 2])),
                       put_added(ints, torch.tensor([1, 1, 3]), torch.tensor([1, 2])))
    x, none = torch.randn(5, 3, generator=g), torch.zeros(0, dtype=torch.long)
    assert torch.equal(cuvil.compile(put)(x, none, torch.randn(0, 3)), x)


def test_a_large_permutation_and_rows():
    """Linear in the indices: 4096 of them, each naming a row of 256 floats (a comparison of every
    row with every index, the decomposition this op replaced, took 2.2 ms here)."""
    g = torch.Generator().manual_seed(6)
    perm = torch.randperm(4096, generator=g)
    assert torch.equal(cuvil.compile(inverse_permutation)(perm), inverse_permutation(perm))
    x, v = torch.randn(4096, 256, generator=g), torch.randn(4096, 256, generator=g)
    assert torch.equal(cuvil.compile(put)(x, perm, v), put(x, perm, v))


def test_a_computed_index():
    def by_rank(x, scores, v):      # rows written in the order of their scores
        y = x.clone()
        y[scores.argsort()] = v
        return y
    g = torch.Generator().manual_seed(7)
    x, scores, v = torch.randn(6, 2, generator=g), torch.randn(6, generator=g), torch.randn(6, 2, generator=g)
    assert torch.equal(cuvil.compile(by_rank)(x, scores, v), by_rank(x, scores, v))
