"""Interval bounds of index and size expressions (`index_math.bounds`), hand-checked."""
from cuvil.codegen.index_math import bounds
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


def test_what_the_ranges_do_not_bound_is_unknown():
    assert bounds(S0 * (S1 - 4), KNOWN) is None           # a factor that can be negative
    assert bounds(S1 + 1, {S0: (2, 5)}) is None
