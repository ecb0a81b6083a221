"""torch's symbolic sizes -> Cuvil dimensions.

torch.export names its shape symbols after a hash of their source (`s77`, `s27`). Cuvil renames
them `s0, s1, ...` in the order they first appear in the inputs (so they print bare inside
`tensor<s0x512xf32>`), and remembers the user's hint name (`batch`) and range of each.
torch's integer functions (FloorDiv, CeilDiv, CleanDiv, Mod, PythonMod) become plain sympy with
`floor` and `Mod`, which is what Cuvil's dimension printer and parser read.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np
import sympy
import torch
import torch.utils._sympy.functions as tfn

from ..errors import CuvilUnsupportedOpError
from ..ir.types import Dim, floordiv, norm_dim, sym


@dataclass(frozen=True)
class SymbolInfo:
    """One dynamic dimension: its Cuvil symbol, the user's name for it, its range (inclusive) and
    its size in the example torch.export traced. A dim the model needs a multiple of q (Swin's image
    sides) is q times its symbol: `hint` names that product."""
    symbol: str
    hint: str | None
    range: tuple[int, int]
    example: int | None = None


class SymbolTable:
    def __init__(self, same: dict[sympy.Symbol, sympy.Symbol] | None = None) -> None:
        """`same`: torch symbols that stand for another's size (`import_graph`'s `_required_equal`)."""
        self._map: dict[sympy.Symbol, sympy.Symbol] = {}
        self.info: dict[str, SymbolInfo] = {}
        self._same = same or {}

    def add(self, torch_symbol: sympy.Symbol, hint: str | None, lo: int, hi: int, example: int | None = None) -> None:
        """A torch symbol with its range; one that stands for another's size (`same`) maps to that
        one's Cuvil symbol, whose range is then where both ranges hold (torch may have narrowed one
        input's: `y[:3]` kept `y`'s from 3)."""
        if torch_symbol in self._same:
            self.add(self._same[torch_symbol], hint, lo, hi, example)
            self._map[torch_symbol] = self._map[self._same[torch_symbol]]
            return
        if torch_symbol in self._map:
            info = self.info[str(self._map[torch_symbol])]
            self.info[info.symbol] = replace(info, range=(max(lo, info.range[0]), min(hi, info.range[1])))
            return
        name = f"s{len(self.info)}"
        self._map[torch_symbol] = sym(name)
        self.info[name] = SymbolInfo(name, hint, (lo, hi), example)

    def require_at_least(self, d: Dim, n: int) -> None:
        """Narrow the range of size `d` to sizes of at least `n`, where `d` is one symbol: what an
        op's constant bound needs (`x[:, 1:2]` is one column wide only from 2). torch's trace
        assumes sizes 0 and 1 away, so its shapes say so where the range it reports starts at 1;
        a call below is compiled again, that dim static (`CompiledModel._compile_for`)."""
        if isinstance(d, sympy.Symbol) and str(d) in self.info:
            info = self.info[str(d)]
            if info.range[0] < n <= info.range[1]:
                self.info[info.symbol] = replace(info, range=(n, info.range[1]))

    def require_at_most(self, d: Dim, n: int) -> None:
        """Narrow the range of size `d`, one symbol, to sizes of at most `n` (see require_at_least)."""
        if isinstance(d, sympy.Symbol) and str(d) in self.info:
            info = self.info[str(d)]
            if info.range[0] <= n < info.range[1]:
                self.info[info.symbol] = replace(info, range=(info.range[0], n))

    def bind(self, torch_symbol: sympy.Symbol, d: Dim) -> None:
        """A symbol torch made for a value it could not see (`u0` of an `.item()`) that Cuvil knows
        to be the size `d`."""
        self._map[torch_symbol] = sympy.sympify(d)

    def knows(self, torch_symbol) -> bool:
        return torch_symbol in self._map

    @property
    def ranges(self) -> dict[str, tuple[int, int]]:
        return {name: i.range for name, i in self.info.items()}

    def dim(self, x) -> Dim:
        """An int, SymInt or torch sympy expression as a Cuvil dimension."""
        if isinstance(x, bool):
            raise TypeError("a dimension cannot be a bool")
        if isinstance(x, int):
            return x
        if isinstance(x, torch.SymInt):
            x = x.node.expr
        return norm_dim(self._convert(sympy.sympify(x)))

    def shape(self, t: torch.Tensor) -> tuple:
        return tuple(self.dim(d) for d in t.shape)

    def span(self, d: Dim) -> tuple | None:
        """(lo, hi) of dim `d` over the ranges of its symbols, or None where they do not bound it."""
        from ..codegen.index_math import bounds
        return bounds(d, {sym(name): i.range for name, i in self.info.items()})

    def never_negative(self, d: Dim, most_points: int = 1 << 16) -> bool:
        """Whether `d` is >= 0 over the ranges: by its bounds, or for a dim of one symbol, at every
        size in its range (the bounds of a remainder written -(h + 4*((-h)//4)) are too wide)."""
        if isinstance(d, int):
            return d >= 0
        span = self.span(d)
        if span is not None and span[0] >= 0:
            return True
        (s,) = d.free_symbols if len(d.free_symbols) == 1 else (None,)
        if s is None or str(s) not in self.info:
            return False
        lo, hi = self.info[str(s)].range
        if hi - lo >= most_points:
            return False
        values = sympy.lambdify(s, d, "numpy")(np.arange(lo, hi + 1, dtype=np.int64))
        return bool((np.asarray(values) >= 0).all())

    def pin(self, d: Dim) -> Dim:
        """`d`, or the one value it takes over the ranges (`(W - 3)//2 + 1` with W in [9, 10] is 4)."""
        if isinstance(d, int):
            return d
        span = self.span(d)
        return int(span[0]) if span is not None and span[0] == span[1] else d

    def _extreme(self, args: list, largest: bool):
        """The argument of a Max (Min) that is at least (most) every other one over the ranges of
        the symbols (`max(0, 1 - s)` with s >= 1 is 0), else the one that is at the example's sizes,
        its symbols' ranges narrowed to where it stays so; None where neither decides it."""
        def margins(a):     # a's lead over each other argument: never negative where a wins
            return [sympy.expand(sympy.sympify(a) - o if largest else o - sympy.sympify(a))
                    for o in args if o is not a]
        for a in args:
            if all(self._never_negative(m) for m in margins(a)):
                return a
        at_example = {sym(n): i.example for n, i in self.info.items() if i.example is not None}
        values = [sympy.sympify(a).subs(at_example) for a in args]
        if not all(v.is_Integer for v in values):
            return None
        winner = args[values.index(max(values) if largest else min(values))]
        bounds = [self._linear_bound(m) for m in margins(winner)]
        if any(b is None for b in bounds):
            return None
        for symbol, at_least, n in (b for b in bounds if b):
            (self.require_at_least if at_least else self.require_at_most)(symbol, n)
        return winner if all(self._never_negative(m) for m in margins(winner)) else None

    def _linear_bound(self, margin):
        """margin = c*s + k >= 0 as a bound on the one symbol s: (s, True, n) for s >= n, (s, False, n)
        for s <= n; () for a margin with no symbol; None for any other margin."""
        if margin.is_number:
            return ()
        if len(margin.free_symbols) != 1:
            return None
        s, = margin.free_symbols
        try:
            poly = sympy.Poly(margin, s)
        except sympy.PolynomialError:       # s inside a floor or Mod
            return None
        if poly.degree() != 1 or not all(v.is_Integer for v in poly.all_coeffs()):
            return None
        c, k = (int(v) for v in poly.all_coeffs())
        return (s, True, -(k // c)) if c > 0 else (s, False, k // -c)

    def _rounded_quotient(self, e, num, den):
        """ceil or floor of a size divided by an integral constant (the length of `torch.arange`
        with a float step, `ceil(float(end - start) / step)`)."""
        if isinstance(num, tfn.ToFloat):
            num = num.args[0]
        if not (den.is_number and float(den).is_integer() and den != 0) or not num.is_integer:
            raise CuvilUnsupportedOpError("symbolic shape expression",
                                          detail=f"size '{e}' divides by {den}, which Cuvil dims cannot express")
        n, d = self._convert(num), int(den)
        if d < 0:
            n, d = -n, -d
        return floordiv(n + d - 1, d) if isinstance(e, tfn.CeilToInt) else floordiv(n, d)

    def _scaled_size(self, e, factor: float, size):
        """int(size * factor) in f64, F.interpolate's output size for a scale factor, as
        floor(p*size / q): p/q the simplest fraction that gives torch's value at every size the
        range allows (1.5 is 3/2, 1.7 is 17/10), checked at each one."""
        n = self._convert(size)
        ratio = Fraction(factor).limit_denominator(1 << 12)
        d = floordiv(ratio.numerator * n, ratio.denominator)
        if factor > 0 and (ratio == factor or self._agrees(n, d, lambda v: np.trunc(v * factor))):
            return d
        raise CuvilUnsupportedOpError("symbolic shape expression",
                                      detail=f"size '{e}' scales a size by {factor}, which no fraction with a "
                                             f"small denominator reproduces over the range; give the size instead")

    def _agrees(self, n: Dim, d: Dim, reference, most_points: int = 1 << 16) -> bool:
        """Whether dim `d` equals reference(value of n) at every size in the range of n's one
        symbol."""
        (s,) = n.free_symbols if len(getattr(n, "free_symbols", ())) == 1 else (None,)
        if s is None or str(s) not in self.info:
            return False
        lo, hi = self.info[str(s)].range
        if hi - lo >= most_points:
            return False
        sizes = np.arange(lo, hi + 1, dtype=np.int64)

        def at(dim):
            return np.broadcast_to(np.asarray(sympy.lambdify(s, dim, "numpy")(sizes), dtype=np.float64), sizes.shape)
        return bool((at(d) == reference(at(n))).all())

    def _never_negative(self, d) -> bool:
        """d >= 0 at every point of the ranges (a difference, so that `min(16*s + 16, 32*s + 32)`
        is decided where the two sizes' own spans overlap)."""
        span = self.span(norm_dim(d))
        return span is not None and span[0] >= 0

    def _convert(self, e):
        if e.is_Integer:
            return int(e)
        if e.is_Symbol:
            if e not in self._map:
                raise CuvilUnsupportedOpError(
                    "data-dependent size", detail=f"size '{e}' depends on tensor values, which Cuvil cannot compile")
            return self._map[e]
        if isinstance(e, (tfn.CeilToInt, tfn.FloorToInt)) and isinstance(e.args[0], (tfn.FloatTrueDiv, tfn.IntTrueDiv)):
            return self._rounded_quotient(e, *e.args[0].args)
        if isinstance(e, (tfn.TruncToInt, tfn.FloorToInt)) and _float_times_size(e.args[0]) is not None:
            return self._scaled_size(e, *_float_times_size(e.args[0]))
        args = [self._convert(a) for a in e.args]
        if e.is_Add:
            return sympy.Add(*args)
        if e.is_Mul:
            return sympy.Mul(*args)
        if e.is_Pow and e.exp.is_Integer and e.exp > 0:
            return sympy.Pow(*args)
        if isinstance(e, (tfn.FloorDiv, tfn.CleanDiv, tfn.CeilDiv)):
            num, den = args
            q = floordiv(num + den - 1 if isinstance(e, tfn.CeilDiv) else num, den)
            if not isinstance(den, int) and _divides_by_size(q):
                # expanded, a sum that is a multiple of the divisor cancels (Swin's window count:
                # h padded to whole windows, over the windows)
                num, den = (sympy.factor_terms(sympy.expand(a)) for a in (num, den))
                q = floordiv(num + den - 1 if isinstance(e, tfn.CeilDiv) else num, den)
            if not isinstance(den, int) and _divides_by_size(q):
                raise CuvilUnsupportedOpError("symbolic shape expression",
                                              detail=f"size ({num}) // {den} divides by a size, which Cuvil dims "
                                                     f"cannot express (a step or stride that is itself dynamic)")
            return q
        if isinstance(e, (tfn.Mod, tfn.PythonMod, sympy.Mod)):
            a, b = args
            if isinstance(b, int) and b > 0:
                # a - b*(a//b): it cancels where a sum is a multiple of b, as a Mod does not (Swin pads
                # its side h to h + (-h) % 4, which a reshape then splits into windows of 4)
                return sympy.expand(a - b * floordiv(a, b))
            return sympy.Mod(*args)
        if isinstance(e, (sympy.Max, sympy.Min, tfn.Max, tfn.Min)):
            decided = self._extreme(args, isinstance(e, (sympy.Max, tfn.Max)))
            if decided is not None:
                return decided
            raise CuvilUnsupportedOpError(
                "symbolic shape expression",
                detail=f"size {type(e).__name__.lower()}({', '.join(str(a) for a in args)}) takes the larger or "
                       f"smaller of sizes whose order the ranges of their dims do not decide; give ranges= that "
                       f"decide it (a size at most the model's largest)")
        raise CuvilUnsupportedOpError("symbolic shape expression",
                                      detail=f"size '{e}' uses {type(e).__name__}, which Cuvil dims cannot express")


def _float_times_size(e) -> tuple[float, object] | None:
    """(c, x) of `c * ToFloat(x)`, torch's form of a size times a float scale factor."""
    if not e.is_Mul or len(e.args) != 2:
        return None
    c, x = sorted(e.args, key=lambda a: not a.is_Float)
    return (float(c), x.args[0]) if c.is_Float and isinstance(x, tfn.ToFloat) else None


def _divides_by_size(d) -> bool:
    """Whether dim `d` has a floor division by a symbolic size."""
    return any(not sympy.fraction(sympy.together(f.args[0]))[1].is_Integer for f in sympy.sympify(d).atoms(sympy.floor))

