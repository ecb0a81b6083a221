"""`x[i, j] = v` and `x.index_put((i, j), v, accumulate=True)`: index_put through several index
tensors, against eager PyTorch: adjacent and separated indexed dims, broadcast index tensors,
negative indices, repeated positions, dynamic sizes; an index past its own dim fails the call as
eager raises, even where the combined position would lie inside the tensor."""
import pytest
import torch

import cuvil
from cuvil.errors import CuvilIndexError


def put(x, i, j, v):
    y = x.clone()
    y[i, j] = v
    return y


def add_at(x, i, j, v):
    return x.index_put((i, j), v, accumulate=True)


def put_middle(x, i, j, v):
    y = x.clone()
    y[:, i, j] = v
    return y


def put_apart(x, i, j, v):
    y = x.clone()
    y[i, :, j] = v
    return y


def put_number(x, i, j):
    y = x.clone()
    y[i, j] = -1.0
    return y


def check(fn, *args, **options):
    compiled = cuvil.compile(fn, cache=False, **options)
    torch.testing.assert_close(compiled(*args), fn(*args), rtol=0, atol=0)
    return compiled


I = torch.tensor([0, 2, 4, -1])
J = torch.tensor([1, -6, 5, 0])


@pytest.mark.parametrize("fn, x, v", [
    (put, torch.randn(5, 6), torch.randn(4)),
    (put, torch.randn(5, 6, 3), torch.randn(4, 3)),
    (put, torch.randn(5, 6, 3), torch.randn(3)),                  # values broadcast along the index
    (put_middle, torch.randn(2, 5, 6, 3), torch.randn(2, 4, 3)),
    (put_apart, torch.randn(5, 2, 6), torch.randn(4, 2)),         # index dims first, as torch puts them
    (add_at, torch.randn(5, 6), torch.randn(4)),
])
def test_matches_eager(fn, x, v):
    check(fn, x, I, J, v)


def test_repeated_positions_accumulate_and_the_last_write_wins():
    i, j = torch.tensor([1, 1, 3, 1]), torch.tensor([2, 2, 0, 2])
    v = torch.tensor([1.0, 2.0, 3.0, 4.0])
    check(add_at, torch.zeros(5, 6), i, j, v)
    check(put, torch.zeros(5, 6), i, j, v)


def test_index_tensors_broadcast_together():
    rows, cols = torch.tensor([[0], [2], [4]]), torch.tensor([1, 3, 5, 0])
    check(put_number, torch.randn(5, 6), rows, cols)
    check(put, torch.randn(5, 6), rows, cols, torch.randn(3, 4))


def test_dynamic_sizes():
    compiled = check(put, torch.randn(5, 6), I, J, torch.randn(4), dynamic=[{0: "n"}, {0: "k"}, {0: "k"}, {0: "k"}])
    x, i, j, v = torch.randn(9, 6), torch.tensor([8, 0, -9]), torch.tensor([5, 2, 1]), torch.randn(3)
    torch.testing.assert_close(compiled(x, i, j, v), put(x, i, j, v), rtol=0, atol=0)


@pytest.mark.parametrize("i, j", [
    ([0, 1], [2, 6]),      # j past its dim: position 1*6 + 6 = 12 would lie inside the 5x6 tensor
    ([0, -6], [2, 1]),     # i past its dim, from the end
])
def test_an_index_past_its_own_dim_fails_the_call(i, j):
    x, v = torch.randn(5, 6), torch.randn(2)
    i, j = torch.tensor(i), torch.tensor(j)
    with pytest.raises(IndexError):
        put(x, i, j, v)
    compiled = cuvil.compile(put, cache=False)
    compiled(x, torch.tensor([0, 1]), torch.tensor([2, 3]), v)
    with pytest.raises(CuvilIndexError, match="index_put at .*test_index_put_several.py"):
        compiled(x, i, j, v)


def test_a_computed_index_along_another_dim_is_named_with_its_dim_and_range():
    """index_fill along dim 1 (torch decomposes it to an index_put there): a computed index past
    the dim names dim 1 and the range torch accepts, negative indices included."""
    def fill(x, i):
        return x.index_fill(1, i * 2, -1.0)
    compiled = cuvil.compile(fill, cache=False)
    x = torch.randn(3, 5)
    torch.testing.assert_close(compiled(x, torch.tensor([0, -2])), fill(x, torch.tensor([0, -2])), rtol=0, atol=0)
    with pytest.raises(CuvilIndexError, match=r"size 5 in dim 1\): indices must lie in \[-5, 4\]"):
        compiled(x, torch.tensor([0, 3]))
