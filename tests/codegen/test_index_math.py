"""Interval bounds of index and size expressions (`index_math.bounds`), hand-checked."""
import sympy

from cuvil.codegen.index_math import bounds, floor_div, modulo
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
