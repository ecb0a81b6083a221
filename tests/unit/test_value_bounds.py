"""Assertions a model makes on its data (XLM's `assert lengths.max().item() <= slen`): proven at
compile time from the bounds the ops give the values (cuvil/frontend/value_bounds.py), else refused
by name. Compiled results against eager.

PYTEST_DONT_REWRITE: torch.export turns an `assert` on a tensor value into a run-time assertion
only when it sees the statement's own bytecode, which pytest's assertion rewriting replaces."""
import pytest
import sympy
import torch

import cuvil
from cuvil.frontend.value_bounds import proven


def masked_mean(ids, x):
    """XLM's check of its lengths (non-padding tokens per row) before it masks the padding."""
    lengths = (ids != 0).sum(dim=1).long()
    assert lengths.max().item() <= ids.shape[1]
    mask = torch.arange(ids.shape[1]) < lengths[:, None]
    return (x * mask[..., None]).sum(1) / lengths[:, None].clamp(min=1)


def test_an_assertion_the_bounds_prove_compiles_static_and_dynamic():
    g = torch.Generator().manual_seed(0)
    ids, x = torch.randint(0, 3, (2, 7), generator=g), torch.randn(2, 7, 4, generator=g)
    torch.testing.assert_close(cuvil.compile(masked_mean)(ids, x), masked_mean(ids, x))
    dynamic = cuvil.compile(masked_mean, dynamic={"ids": {1: "seq"}, "x": {1: "seq"}})
    for seq in (5, 9):
        ids, x = torch.randint(0, 3, (2, seq), generator=g), torch.randn(2, seq, 4, generator=g)
        torch.testing.assert_close(dynamic(ids, x), masked_mean(ids, x))
    assert len(dynamic._variants) == 1


def test_an_assertion_the_bounds_do_not_prove_or_on_an_input_is_refused_by_name():
    def too_tight(ids):
        assert (ids != 0).sum().item() < 3          # true for some calls only: eager raises on the others
        return ids * 2

    def on_an_input(ids):
        assert ids.max().item() < 100               # an argument's values have no bounds
        return ids * 2
    ids = torch.tensor([[1, 0, 2]])
    with pytest.raises(cuvil.CuvilError, match=r"assertion on tensor values \(u0 <= 2\).*u0 in \[0, 3\]"):
        cuvil.compile(too_tight)(ids)
    with pytest.raises(cuvil.CuvilError, match=r"tensor's value read as a Python number"):
        cuvil.compile(on_an_input)(ids)


def test_proven_checks_both_ends_of_a_linear_condition():
    u, n = sympy.Symbol("u", integer=True), sympy.Symbol("n", integer=True, positive=True)

    def span(e):        # over n in [2, 64]
        values = [e.subs(n, v) for v in (2, 64)]
        return min(values), max(values)

    def holds(condition, bounds):
        return proven(condition, bounds, lambda e: e, span)
    assert holds(u <= 16, {u: (0, 16)}) and not holds(u <= 15, {u: (0, 16)})
    assert holds(u <= n, {u: (0, n)}) and holds(sympy.And(u >= 0, 2 * u < 2 * n + 1), {u: (0, n)})
    assert holds(u <= 64, {u: (0, n)}) and not holds(u <= 63, {u: (0, n)})    # n reaches 64
    assert holds(16 >= u, {u: (0, 16)})                          # the data symbol on the right
    assert not holds(sympy.Ne(u, 3), {u: (0, 2)})                 # not a range condition: left unproven
    assert not holds(u * u <= 4, {u: (-2, 2)})                    # not linear in u
