"""Element types, symbolic dimensions and tensor types of the graph IR.

A dimension is either a Python int or a sympy expression over named positive integer
symbols (`s0`, `s1`, ...). Ranges of the symbols live on the function (`symbols = {s0 = [1, 4096]}`).
"""
from __future__ import annotations

import contextlib
import contextvars
import enum
import functools
import math
import re
from dataclasses import dataclass
from typing import Union

import sympy
import torch


class DType(enum.Enum):
    f32 = "f32"
    f16 = "f16"
    bf16 = "bf16"
    i64 = "i64"
    i32 = "i32"
    i8 = "i8"
    bool = "i1"

    @property
    def torch(self) -> torch.dtype:
        return _TO_TORCH[self]

    @property
    def is_float(self) -> bool:
        return self in (DType.f32, DType.f16, DType.bf16)

    @property
    def itemsize(self) -> int:
        return _TO_TORCH[self].itemsize

    @staticmethod
    def from_torch(dt: torch.dtype) -> "DType":
        try:
            return _FROM_TORCH[dt]
        except KeyError:
            raise TypeError(f"dtype {dt} is not supported by Cuvil "
                            f"(supported: {', '.join(d.value for d in DType)})") from None

    @staticmethod
    def from_name(name: str) -> "DType":
        return _BY_NAME[name]

    def __str__(self) -> str:
        return self.value


_TO_TORCH = {DType.f32: torch.float32, DType.f16: torch.float16, DType.bf16: torch.bfloat16,
             DType.i64: torch.int64, DType.i32: torch.int32, DType.i8: torch.int8, DType.bool: torch.bool}
_FROM_TORCH = {v: k for k, v in _TO_TORCH.items()}
_BY_NAME = {d.value: d for d in DType}

Dim = Union[int, sympy.Expr]

# Symbols print bare inside `tensor<...>` only when they cannot run into the `x` separator
# (`s0x512`); any other name is parenthesised: `tensor<(batch)x512xf32>`.
_BARE_SYMBOL = re.compile(r"s[0-9]+")


def sym(name: str) -> sympy.Symbol:
    """The symbol for a named dynamic dimension."""
    return sympy.Symbol(name, integer=True, positive=True)


def norm_dim(d) -> Dim:
    """ints stay ints; sympy integers become ints; other expressions stay symbolic."""
    if isinstance(d, bool):
        raise TypeError("a dimension cannot be a bool")
    if isinstance(d, int):
        return d
    d = sympy.sympify(d)
    if d.is_Integer:
        return int(d)
    return d


def dim_str(d: Dim) -> str:
    """Text form of one dimension: `128`, `s0`, `(batch)`, or `(128*s0)` for a compound expression."""
    if isinstance(d, int):
        return str(d)
    if d.is_Symbol and _BARE_SYMBOL.fullmatch(d.name):
        return d.name
    return "(" + expr_str(d) + ")"


def expr_str(e) -> str:
    """Print a dimension expression with the operators the parser reads: + - * // % and parens."""
    if isinstance(e, int):
        return str(e)
    if e.is_Integer:
        return str(int(e))
    if e.is_Symbol:
        return e.name
    if e.is_Add:
        terms = sorted(e.args, key=sympy.default_sort_key)
        out = _factor_str(terms[0], in_sum=True)
        for t in terms[1:]:
            s = _factor_str(t, in_sum=True)
            out += f" - {s[1:]}" if s.startswith("-") else f" + {s}"
        return out
    if e.is_Mul:
        coeff, rest = e.as_coeff_Mul()
        if coeff.is_Rational and not coeff.is_Integer:
            raise ValueError(f"dimension expression {e} is not an integer expression")
        factors = sympy.Mul.make_args(rest)
        parts = [_factor_str(f) for f in sorted(factors, key=sympy.default_sort_key)]
        body = "*".join(parts)
        if coeff == 1:
            return body
        if coeff == -1:
            return "-" + body
        return f"{int(coeff)}*{body}"
    if e.is_Pow and e.exp.is_Integer and e.exp > 0:
        return "*".join([_factor_str(e.base)] * int(e.exp))
    if isinstance(e, sympy.floor):
        num, den = sympy.fraction(sympy.together(e.args[0]))
        if den.is_Integer and den > 1:
            return f"{_factor_str(num)}//{int(den)}"
    if isinstance(e, sympy.Mod):
        return f"{_factor_str(e.args[0])}%{_factor_str(e.args[1])}"
    raise ValueError(f"dimension expression {e} cannot be printed")


def _factor_str(e, in_sum: bool = False) -> str:
    s = expr_str(e)
    if e.is_Atom or (in_sum and e.is_Mul) or isinstance(e, sympy.Pow):
        return s
    return "(" + s + ")"


def floordiv(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a // b
    a = sympy.sympify(a)
    if isinstance(b, int) and b > 0:
        a, b = _merge_inner_floor(a, b)
    return norm_dim(sympy.floor(a / b))


def _merge_inner_floor(a: sympy.Expr, b: int) -> tuple[sympy.Expr, sympy.Expr]:
    """(p//q + r)//b is (p + r*q)//(q*b) for integer r and positive q, b: two strided convs give
    `(h - 1)//4`, as torch writes it, rather than `((h - 1)//2)//2`, which sympy cannot prove equal."""
    floors = [t for t in sympy.Add.make_args(a) if isinstance(t, sympy.floor)]
    if len(floors) != 1:
        return a, b
    num, den = sympy.fraction(sympy.together(floors[0].args[0]))
    if not (den.is_Integer and den > 0):
        return a, b
    rest = a - floors[0]
    return num + rest * den, den * b


def symbols_of(d: Dim) -> set[str]:
    return set() if isinstance(d, int) else {s.name for s in d.free_symbols}


def dims_equal(a: Dim, b: Dim) -> bool:
    if a == b:
        return True
    if isinstance(a, int) and isinstance(b, int):
        return False
    return _symbolic_dims_equal(sympy.sympify(a), sympy.sympify(b))


@functools.lru_cache(maxsize=4096)
def _symbolic_dims_equal(a: sympy.Expr, b: sympy.Expr) -> bool:
    # passes compare the same few dims over and over; `simplify` is slow (its first call in a
    # process alone took 0.1 s), so expand first, and disprove at a few points before asking it
    diff = sympy.expand(a - b)
    if diff.is_Number:
        return diff == 0
    if diff.is_polynomial():            # expanded, a polynomial that is not 0 is not 0 everywhere
        return False
    symbols = sorted(diff.free_symbols, key=str)
    for base in (2, 3, 7, 64):          # dims are positive integers: a non-zero value there disproves it
        value = diff.xreplace({s: sympy.Integer(base + i) for i, s in enumerate(symbols)})
        if value.is_Number and value != 0:
            return False
    by_periods = _zero_over_periods(diff, symbols)
    return by_periods if by_periods is not None else sympy.simplify(diff) == 0


MOST_PERIOD_POINTS = 1 << 16


def _zero_over_periods(diff, symbols: list) -> bool | None:
    """Whether `diff`, a polynomial in the symbols and in floors (and remainders) of linear
    expressions by constants, is 0 at every size; None where it is not of that form or too costly.
    With L the product of the divisors, on each residue class of the symbols mod L every floor is
    linear, so there `diff` is a polynomial of degree at most D (its degree with the floors taken
    as symbols) in each symbol's multiple of L: zero at D + 1 of them in each, it is 0. (sympy's
    simplify cannot tell `1 + (s - 1)//2` from `(s + 1)//2`.)"""
    period = 1
    for atom in diff.atoms(sympy.floor, sympy.ceiling, sympy.Mod):
        num, den = (atom.args if isinstance(atom, sympy.Mod) else sympy.fraction(sympy.together(atom.args[0])))
        if not (den.is_Integer and den > 0) or _degree_over_atoms(num) not in (0, 1):
            return None
        period *= int(den)
    degree = _degree_over_atoms(diff)
    if degree is None or ((degree + 1) * period) ** len(symbols) > MOST_PERIOD_POINTS:
        return None
    span = torch.arange(1, 1 + (degree + 1) * period, dtype=torch.float64)
    grids = torch.meshgrid(*[span] * len(symbols), indexing="ij")
    values = sympy.lambdify(symbols, diff, "numpy")(*[g.numpy() for g in grids])
    return bool((torch.as_tensor(values) == 0).all())


def _degree_over_atoms(e) -> int | None:
    """e's total degree with its floors and remainders taken as symbols; None where it is no
    polynomial so."""
    stand_ins = {a: sympy.Dummy() for a in e.atoms(sympy.floor, sympy.ceiling, sympy.Mod)}
    plain = sympy.expand(e.xreplace(stand_ins))
    if not plain.free_symbols:
        return 0
    return sympy.Poly(plain, *plain.free_symbols).total_degree() if plain.is_polynomial() else None


Bounds = dict      # expression (a symbol, a loop variable) -> its inclusive (lo, hi)


def bounds(e, known: Bounds):
    """Inclusive (lo, hi) of an integer expression, or None when unknown."""
    e = sympy.sympify(e)
    if e in known:
        return known[e]
    if e.is_Integer:
        return e, e
    if e.is_Add:
        parts = [bounds(t, known) for t in e.args]
        if any(p is None for p in parts):
            return None
        return sympy.Add(*(p[0] for p in parts)), sympy.Add(*(p[1] for p in parts))
    if e.is_Mul:
        coeff, rest = e.as_independent(*[s for s in e.free_symbols if s in _bounded_symbols(known)])
        if coeff == 1:      # a product of bounded factors (s0*s1)
            parts = [bounds(f, known) for f in e.args]
            if any(p is None for p in parts):
                return None
            if all(sympy.sympify(x).is_number for p in parts for x in p):
                # numbers: the product's ends are among the corners' (two negative factors,
                # floor(-h/2)*floor(-w/2), make a positive product)
                lo, hi = parts[0]
                for a, b in parts[1:]:
                    corners = [lo * a, lo * b, hi * a, hi * b]
                    lo, hi = min(corners), max(corners)
                return lo, hi
            if any(p[0] < 0 for p in parts):    # symbolic ends: of non-negative factors only
                return None
            return sympy.Mul(*(p[0] for p in parts)), sympy.Mul(*(p[1] for p in parts))
        if rest == 1 or coeff.is_positive is not True and coeff.is_negative is not True:
            return None
        b = bounds(rest, known)
        if b is None:
            return None
        lo, hi = coeff * b[0], coeff * b[1]
        return (lo, hi) if coeff.is_positive else (hi, lo)
    if isinstance(e, sympy.floor):
        num, den = sympy.fraction(sympy.together(e.args[0]))
        b = bounds(num, known)
        if b is None or den.is_positive is not True:
            return None
        # a bound with a min in it (the last tile's extent) stays unevaluated: evaluating
        # floor(Min(256, n - 256*t)/56 + ...) asks sympy's assumptions about every term (20 ms a bound)
        return tuple(sympy.floor(x / den, evaluate=not sympy.sympify(x).has(sympy.Min, sympy.Max)) for x in b)
    if e.is_Pow and e.exp.is_Integer and e.exp > 0:     # a square patch grid's count, (h//8)**2
        b = bounds(e.base, known)
        if b is None:
            return None
        ends = (b[0] ** e.exp, b[1] ** e.exp)
        if b[0] >= 0 or e.exp % 2:      # monotone there
            return ends
        return (sympy.Integer(0) if b[1] >= 0 else min(ends)), max(ends)
    if isinstance(e, sympy.Mod) and e.args[1].is_positive:
        return sympy.Integer(0), e.args[1] - 1
    if isinstance(e, (sympy.Min, sympy.Max)):     # the last tile's extent, min(tile, n - first)
        parts = [bounds(a, known) for a in e.args]
        if any(p is None or not all(sympy.sympify(x).is_number for x in p) for p in parts):
            return None
        pick = min if isinstance(e, sympy.Min) else max
        return pick(p[0] for p in parts), pick(p[1] for p in parts)
    return None


def _bounded_symbols(known: Bounds) -> set:
    return {k for k in known if isinstance(k, sympy.Symbol)}


_RANGES: contextvars.ContextVar[dict[str, tuple[int, int]]] = contextvars.ContextVar("symbol_ranges", default={})


@contextlib.contextmanager
def symbol_ranges(ranges: dict[str, tuple[int, int]]):
    """The ranges of the function's symbols, in effect while its ops' types are inferred."""
    token = _RANGES.set(ranges)
    try:
        yield
    finally:
        _RANGES.reset(token)


def equal_over_ranges(a: Dim, b: Dim) -> bool:
    """Whether dims (or element counts) `a` and `b` are equal for every value of their symbols in
    the ranges in effect: a ceil_mode pool's `1 + (s0 - 32)//20480` is 1 for s0 in [32, 640]."""
    if dims_equal(a, b):
        return True
    ranges = _RANGES.get()
    span = bounds(sympy.sympify(a) - sympy.sympify(b), {sym(name): r for name, r in ranges.items()}) if ranges else None
    return span is not None and span[0] == span[1] == 0


@dataclass(frozen=True)
class TensorType:
    dtype: DType
    shape: tuple

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(norm_dim(d) for d in self.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def numel(self) -> Dim:
        if all(isinstance(d, int) for d in self.shape):
            return math.prod(self.shape)
        n = sympy.Integer(1)
        for d in self.shape:
            n = n * d
        return norm_dim(n)

    def with_shape(self, shape) -> "TensorType":
        return TensorType(self.dtype, tuple(shape))

    def with_dtype(self, dtype: DType) -> "TensorType":
        return TensorType(dtype, self.shape)

    def __str__(self) -> str:
        dims = "".join(dim_str(d) + "x" for d in self.shape)
        return f"tensor<{dims}{self.dtype}>"
