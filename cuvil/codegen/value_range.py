"""Value ranges of f32 scalar expressions, for cheaper forms of exp and log.

A `Span` holds every value an expression can take: an interval [lo, hi] (its ends may be
infinite) and whether it can be NaN. Loads, casts, reduction results and functions without a rule
can be anything. The rules follow the ops' monotonic pieces; each computed end moves outwards by a
relative 1e-6, more than f32 rounding and Cuvil's own functions (at most 2.5 ulp) can add.

The emitter (`llvm_emit.KernelEmitter.call`) asks `math_form` which form of a math function an
argument allows: `exp.narrow` for an argument in [-80, 80] (no clamps, one multiplication by 2^n)
and `log.normal` for one in [1e-30, 1e30] (no handling of denormals, zero or infinity; NaN still
gives NaN). In the 20-op chain of the benchmarks, exp sees a product of a square root in [1, 1.42]
and a tanh, and log that exp plus 0.5.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from .kernel_ir import Call, Const, DType, Expr, Var

SLACK = 1e-6


@dataclass(frozen=True)
class Span:
    lo: float
    hi: float
    nan: bool

    def within(self, lo: float, hi: float) -> bool:
        return lo <= self.lo and self.hi <= hi


ANY = Span(-math.inf, math.inf, True)


F32_MAX = 3.4028234663852886e38


def _span(ends: list[float], nan: bool) -> Span:
    """The span of the finite-or-infinite values among `ends` (a NaN among them: NaN is possible),
    widened by SLACK; an end beyond f32's largest finite value is infinite (f32 overflows there,
    where float64 does not)."""
    values = [v for v in ends if not math.isnan(v)]
    if not values:
        return ANY
    lo, hi = min(values), max(values)
    lo = lo if math.isinf(lo) else -math.inf if lo < -F32_MAX / 2 else lo - abs(lo) * SLACK
    hi = hi if math.isinf(hi) else math.inf if hi > F32_MAX / 2 else hi + abs(hi) * SLACK
    return Span(lo, hi, nan or len(values) < len(ends))


def _exp(x: float) -> float:
    return math.inf if x > 709 else math.exp(x)


def _monotonic(f: Callable[[float], float]) -> Callable[[Span], Span]:
    return lambda a: _span([f(a.lo), f(a.hi)], a.nan)


def _sigmoid(x: float) -> float:
    return 1 / (1 + _exp(-x)) if x >= 0 else _exp(x) / (1 + _exp(x))


def _tanh(x: float) -> float:
    return math.copysign(1.0, x) if math.isinf(x) else math.tanh(x)


def _erf(x: float) -> float:
    return math.copysign(1.0, x) if math.isinf(x) else math.erf(x)


def _add(a: Span, b: Span) -> Span:
    return _span([a.lo + b.lo, a.hi + b.hi], a.nan or b.nan or (a.hi == math.inf and b.lo == -math.inf)
                  or (a.lo == -math.inf and b.hi == math.inf))


def _neg(a: Span) -> Span:
    return Span(-a.hi, -a.lo, a.nan)


def _mul(a: Span, b: Span) -> Span:
    zero_by_inf = any(x.lo <= 0 <= x.hi and math.inf in (abs(y.lo), abs(y.hi)) for x, y in ((a, b), (b, a)))
    return _span([x * y for x in (a.lo, a.hi) for y in (b.lo, b.hi)], a.nan or b.nan or zero_by_inf)


def _div(a: Span, b: Span) -> Span:
    if b.lo <= 0 <= b.hi:
        return ANY
    return _span([x / y if not (math.isinf(x) and math.isinf(y)) else math.nan
                  for x in (a.lo, a.hi) for y in (b.lo, b.hi)], a.nan or b.nan)


def _abs(a: Span) -> Span:
    if a.lo >= 0:
        return a
    if a.hi <= 0:
        return _neg(a)
    return Span(0.0, max(-a.lo, a.hi), a.nan)


def _sqrt(a: Span) -> Span:
    return _span([math.sqrt(max(a.lo, 0.0)), math.sqrt(max(a.hi, 0.0))], a.nan or a.lo < 0)


def _log(a: Span) -> Span:
    if a.hi < 0:
        return ANY
    lo = -math.inf if a.lo <= 0 else math.log(a.lo)
    return _span([lo, math.log(a.hi) if a.hi > 0 else -math.inf], a.nan or a.lo < 0)


RULES: dict[str, Callable[..., Span]] = {
    "add": _add,
    "sub": lambda a, b: _add(a, _neg(b)),
    "mul": _mul,
    "fma": lambda a, b, c: _add(_mul(a, b), c),
    "div": _div,
    "neg": _neg,
    "abs": _abs,
    "sqrt": _sqrt,
    "exp": _monotonic(_exp),
    "exp_ftz": _monotonic(_exp),
    "log": _log,
    "tanh": _monotonic(_tanh),
    "sigmoid": _monotonic(_sigmoid),
    "erf": _monotonic(_erf),
    # NaN-propagating, like torch.maximum and torch.minimum
    "max": lambda a, b: Span(max(a.lo, b.lo), max(a.hi, b.hi), a.nan or b.nan),
    "min": lambda a, b: Span(min(a.lo, b.lo), min(a.hi, b.hi), a.nan or b.nan),
}


class ValueRanges:
    """The spans of one kernel's f32 expressions; `let` records a scalar's definition."""

    def __init__(self):
        self.lets: dict[str, Expr] = {}
        self.memo: dict[int, tuple[Expr, Span]] = {}

    def let(self, name: str, value: Expr | None) -> None:
        """`name` is `value` from here on (None: a value without a rule, such as a reduction's)."""
        self.memo.clear()           # spans worked out before may have read the old definition
        if value is None:
            self.lets.pop(name, None)
        else:
            self.lets[name] = value

    def span(self, e: Expr) -> Span:
        if e.dtype != DType.f32:
            return ANY
        hit = self.memo.get(id(e))
        if hit is not None and hit[0] is e:
            return hit[1]
        if isinstance(e, Const):
            s = ANY if math.isnan(e.value) else Span(e.value, e.value, False)
        elif isinstance(e, Var):
            s = self.span(self.lets[e.name]) if e.name in self.lets else ANY
        elif isinstance(e, Call) and e.fn == "select":
            a, b = self.span(e.args[1]), self.span(e.args[2])
            s = Span(min(a.lo, b.lo), max(a.hi, b.hi), a.nan or b.nan)
        elif isinstance(e, Call) and e.fn in RULES:
            s = RULES[e.fn](*(self.span(a) for a in e.args))
        else:
            s = ANY
        self.memo[id(e)] = (e, s)
        return s


# the forms of a math function an argument's span allows (mathlib.F32_FUNCS has each)
FORMS: dict[str, tuple[str, tuple[float, float]]] = {"exp": ("exp.narrow", (-80.0, 80.0)),
                                                      "log": ("log.normal", (1e-30, 1e30))}


def math_form(fn: str, arg: Span) -> str:
    """The name of the form of `fn` to emit for an argument in `arg`."""
    form = FORMS.get(fn)
    return form[0] if form is not None and arg.within(*form[1]) else fn
