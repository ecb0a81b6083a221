"""Interval bounds of index and size expressions (`index_math.bounds`), a reshape's groups of dims
and divisions recombined in flat offsets, hand-checked; reshapes read through in groups, against
eager."""
import re

import pytest
import sympy
import torch

import cuvil
from cuvil.codegen.index_math import bounds, floor_div, fold_divisions, modulo, reshape_groups
from cuvil.ir.types import floordiv, sym

S0, S1 = sym("s0"), sym("s1")
KNOWN = {S0: (2, 5), S1: (3, 4)}


def test_sums_products_and_floors_of_bounded_symbols():
    assert bounds(S0 + 3, KNOWN) == (5, 8)
    assert bounds(1 - S0, KNOWN) == (-4, -1)
    assert bounds(S0 * S1, KNOWN) == (6, 20)              # a product of bounded symbols (it once recursed forever)
    assert bounds(2 * S0 * S1 + 1, KNOWN) == (13, 41)
    assert bounds(-S0 * S1, KNOWN) == (-20, -6)
    assert bounds(floordiv(S0 - 3, 2) + 1, {S0: (9, 10)}) == (4, 4)
    assert bounds(S0 * (S1 - 4), KNOWN) == (-5, 0)        # a factor that can be negative: the corners
    # two negative factors (the halves of padded sizes, written floor(-s/2)): a positive product
    assert bounds(floordiv(-S0, 2) * floordiv(-S1, 2), KNOWN) == (2, 6)


def test_what_the_ranges_do_not_bound_is_unknown():
    assert bounds(S1 + 1, {S0: (2, 5)}) is None


def test_min_and_max_of_bounded_terms():
    assert bounds(sympy.Min(256, 3136 - 256 * S0), {S0: (0, 12)}) == (64, 256)
    assert bounds(sympy.Max(S0, 3), KNOWN) == (3, 5)
    assert bounds(sympy.Min(S0, S1), {S0: (2, 5)}) is None     # an argument the ranges do not bound


def test_a_last_partial_tile_is_settled_by_the_ranges_of_its_variables():
    # row r of tile t, 256 rows a tile over 3136 rows: r < min(256, 3136 - 256 t), t <= 12
    t, r = sym("t"), sym("r")
    known = {t: (0, 12), r: (0, sympy.Min(256, 3136 - 256 * t) - 1)}
    assert floor_div(r, 256, known) == 0 and modulo(r, 256, known) == r
    assert floor_div(r + 256 * t, 256, known) == t
    # 0 <= r < 64 holds in the last tile only: no simplification
    assert modulo(r, 64, known) == sympy.Mod(r, 64, evaluate=False)
    assert floor_div(r, 64, known) == sympy.floor(r / 64)


def test_a_reshape_pairs_the_dims_that_merge_or_split_into_each_other():
    # a grouped-query expand merged into the heads, with a dynamic cache length
    assert reshape_groups([1, 2, 2, S0 + 1, 32], [1, 4, S0 + 1, 32]) == [([1, 2], [1]), ([3], [2]), ([4], [3])]
    assert reshape_groups([4 * S0, 8], [S0, 4, 2, 4]) == [([0], [0, 1]), ([1], [2, 3])]
    assert reshape_groups([S0, S1], [S0 * S1]) == [([0, 1], [0])]
    assert reshape_groups([6, 4], [4, 6]) == [([0, 1], [0, 1])]          # no pairing: one group
    assert reshape_groups([S0, 3], [3, S0]) == [([0, 1], [0, 1])]
    assert reshape_groups([1, 1], [1]) == []


@pytest.mark.parametrize("shape, new", [((2, 3, 4), (6, 4)), ((6, 4), (4, 6)), ((2, 2, 9, 8), (4, 9, 8)),
                                        ((12, 5), (3, 4, 5)), ((1, 24), (2, 1, 3, 4)), ((4, 6), (2, 12))])
def test_reshapes_read_through_in_groups_match_torch(shape, new):
    """A reshape folded into its consumer's indexing (the add after it), every element against eager."""
    def f(x):
        return torch.reshape(x * 2, new) + 1

    x = torch.randn(shape)
    assert torch.equal(cuvil.compile(f, cache=False)(x), f(x))


def test_a_grouped_query_expand_with_a_dynamic_length_matches_torch():
    """A decoder's keys: the cache and the new token joined, then each of 2 heads repeated twice
    (HF's `repeat_kv`), with one program for every cache length."""
    def keys(past, new):
        k = torch.cat([past, new], 2)
        b, h, n, d = k.shape
        return k[:, :, None].expand(b, h, 2, n, d).reshape(b, 2 * h, n, d) * 3

    c = cuvil.compile(keys, cache=False, dynamic={"past": {2: "n"}})
    for n in (3, 7, 20):
        past, new = torch.randn(1, 2, n, 8), torch.randn(1, 2, 1, 8)
        assert torch.equal(c(past, new), keys(past, new))
    assert c.num_variants == 1


def test_divisions_that_cancel_in_a_flat_offset_are_recombined():
    """A reshape whose dims neither split nor merge into each other reads its contiguous source at
    `(L//5376)*5376 + ((L//96) % 56)*96 + L % 96`, which is L; with L's own divisions of the
    parallel index p, the offset is `i + 56*p`, a unit stride in the inner loop."""
    i, p = sym("i"), sym("p")
    mod = lambda x, n: sympy.Mod(x, n, evaluate=False)     # noqa: E731 (as the lowering builds them)
    flat = i + 56 * mod(p, 56) + 3136 * sympy.floor(p / 56)
    offset = 5376 * sympy.floor(flat / 5376) + 96 * mod(sympy.floor(flat / 96), 56) + mod(flat, 96)
    assert fold_divisions(offset) == i + 56 * p
    row = i + 32 * mod(p, 24)                                 # [12, 64] read as [24, 32]
    assert fold_divisions(768 * sympy.floor(p / 24) + mod(row, 64) + 64 * sympy.floor(row / 64)) == i + 32 * p
    kept = 3 * mod(p, 7) + 56 * sympy.floor(p / 56)           # nothing cancels: the offset stays as it was
    assert fold_divisions(kept) == kept


def test_an_add_through_a_reshape_across_dims_matches_torch_and_loads_vectors():
    def f(x, y):
        return x + y.reshape(1, 96, 56, 56)

    x, y = torch.randn(1, 96, 56, 56), torch.randn(1, 56, 56, 96)
    c = cuvil.compile(f, cache=False)
    assert torch.equal(c(x, y), f(x, y))
    native = c._variants[0].native
    (kernel,) = native.lowered
    ir = native.kernels.llvm_ir(kernel.kernel.name)      # the optimised LLVM IR: a vectorised loop,
    bodies = re.findall(r"^vector\.body[\w.]*:.*?(?=^\S|\Z)", ir, re.M | re.S)   # with no division in it
    assert bodies and all(re.search(r"\b[su](div|rem) ", b) is None for b in bodies)
    assert any("<16 x float>" in b or "<8 x float>" in b for b in bodies)


def test_dims_equal_decides_floors_of_sizes_by_their_periods():
    """torch writes a pooled size (1 + s)//2 where Cuvil infers 1 + (s - 1)//2: equal at every s,
    which sympy's simplify cannot tell (the import stopped with an internal error). On each
    residue class mod the divisors' product the floors are linear: a difference zero at enough
    points of each class is zero."""
    from cuvil.ir.types import dims_equal
    assert dims_equal(1 + floordiv(S0 - 1, 2), floordiv(S0 + 1, 2))
    assert not dims_equal(1 + floordiv(S0 - 1, 2), floordiv(S0 + 2, 2))          # differs at odd s
    assert dims_equal(floordiv(floordiv(S0, 2) + 1, 3) + S1, floordiv(S0 + 2, 6) + S1)    # nested
    assert dims_equal((floordiv(S0 - 1, 2) + 1) * S1, floordiv(S0 + 1, 2) * S1)  # a product: degree 2
    assert not dims_equal((floordiv(S0 - 1, 2) + 1) * S1, floordiv(S0 + 1, 2) * S1 + 1)
    assert dims_equal(sympy.Mod(S0, 4) + 4 * floordiv(S0, 4), S0)
