"""Conditions on input sizes that torch.export could not prove over the declared ranges.

torch.export turns a guard on sizes into a range or an equality where it can, and rejects a range
for which its solver cannot prove any other guard (`1 % (n//20 - 1) != 0` in wav2vec2's positional
convolution, true for every n >= 60). Cuvil then exports again with
`prefer_deferred_runtime_asserts_over_guards`, which keeps such guards as `_assert_scalar` nodes in
the graph, and decides each one by evaluating it at every size in the ranges at once (int64
tensors): true everywhere, and the compiled program serves the whole range; false somewhere, and
the capture fails with the condition, a source line near the check, and the widest range around
the example where it holds (which a dim without a declared range then takes).
"""
from __future__ import annotations

import math
from fractions import Fraction
import operator
import traceback

import sympy
import torch
import torch.utils._sympy.functions as tfn

from .locations import SourceFrame, is_user_file, node_frame

MAX_POINTS = 1 << 22      # sizes evaluated at once; a condition over more is refused (narrow the ranges)


MAX_PASSES = 3            # of deciding the guards again within what the last pass found
MAX_MULTIPLE = 64         # the largest q a condition that holds on multiples of q is recognised for


class SizeConditionError(Exception):
    """A condition fails for some sizes in the ranges, or cannot be decided. `suggested`: ranges
    where it holds, {name: (lo, hi)}; `multiples`: {name: q} where it holds on the multiples of q."""
    def __init__(self, reason: str, source: str | None, suggested: dict[str, tuple[int, int]],
                 multiples: dict[str, int] | None = None):
        super().__init__(reason)
        self.reason, self.source, self.suggested = reason, source, suggested
        self.multiples = multiples or {}


def check_size_conditions(ep: torch.export.ExportedProgram, names: dict, examples: dict[str, int]) -> None:
    """Raise SizeConditionError for the first `_assert_scalar` on sizes that some size in the ranges
    fails. `names` maps torch's input symbols to the user's dim names, `examples` those names to the
    example sizes."""
    ranges = {s: (int(vr.lower), vr.upper) for s, vr in ep.range_constraints.items()}
    for node in ep.graph.nodes:
        if node.target is not torch.ops.aten._assert_scalar.default:
            continue
        cond = node.args[0]
        value = cond.meta.get("val") if isinstance(cond, torch.fx.Node) else cond
        if not isinstance(value, torch.SymBool):
            continue            # a constant condition, or one on tensor values (refused at import)
        expr = value.node.expr
        if not expr.free_symbols:
            continue            # settled when torch simplified it
        if not expr.free_symbols <= set(names):
            continue            # a data-dependent size: the importer refuses it with its own message
        frame = node_frame(cond) or node_frame(node)    # the user's check; the assertion may be later
        _decide(expr, str(frame) if frame else None, ranges, names, examples)


def check_kept_guards(ep: torch.export.ExportedProgram, names: dict, examples: dict[str, int]) -> None:
    """The same for the guards of an export with `Dim.AUTO` or `Dim.DYNAMIC` dims, which torch
    keeps only in its ShapeEnv where they are no bounds: for such dims a branch on sizes is no
    error, and the program would take the example's branch at every size. The model's own branches
    are such guards, and so are torch's own decisions (`x.split(3)` of 6 rows has two pieces: its
    last is `n - 3` rows only while (n + 2)//3 is 2). Each is decided over torch's own ranges (from
    2, as its trace assumes; one of torch's that Cuvil cannot evaluate is left, as most are layout
    choices); where several fail, the error suggests for each dim the range where all hold."""
    shape_env = next((n.meta["val"].fake_mode.shape_env for n in ep.graph.nodes if n.op == "placeholder"
                      and isinstance(n.meta.get("val"), torch._subclasses.FakeTensor)), None)
    if shape_env is None:
        return
    ranges = {s: (int(vr.lower), vr.upper) for s, vr in shape_env.var_to_range.items()}
    guards = []
    for guard in shape_env.guards:
        expr = shape_env.simplify(guard.expr)
        if not (expr.free_symbols and expr.free_symbols <= set(names)):
            continue
        loc = guard.sloc.framework_loc
        users = isinstance(loc, traceback.FrameSummary) and is_user_file(loc.filename)
        source = str(SourceFrame(loc.filename, loc.lineno or 0, (loc.line or "").strip())) \
            if isinstance(loc, traceback.FrameSummary) else None
        guards.append((expr, source, not users))
    first = _decide_all(guards, ranges, names, examples, {}, {})
    within: dict[str, tuple[int, int]] = {}
    for _ in range(MAX_PASSES):
        if first is None or not first.multiples:
            break
        # again over the multiples the last pass found, within the ranges of one dim found over them:
        # `n//(n//4) == 4` holds for every multiple of 4, but for every size only from 16; a
        # condition on two dims may fail only below the range one on each dim sets
        again = _decide_all(guards, ranges, names, examples, first.multiples, within)
        if again is None:
            first = SizeConditionError(first.reason, first.source, within, first.multiples)
            break
        if (again.ranges, again.multiples) == (within, first.multiples):
            first = again       # no progress: its ranges, with the dims conditions on several pin
            break
        first, within = again, again.ranges
    if first is not None:
        raise first


def _decide_all(guards: list, ranges, names: dict, examples: dict[str, int],
                multiples: dict[str, int], within: dict[str, tuple[int, int]]) -> SizeConditionError | None:
    """Each guard decided over the ranges narrowed to `within` ({name: (lo, hi)}), sizes that are not
    a multiple asked in `multiples` left out: None if all hold, else the first failure's error with
    the ranges where all hold and the multiples they hold on (its `ranges`: those that conditions
    on one dim set, before the dims a condition on several pins to the example)."""
    first, one_dim, pins, found = None, dict(within), {}, dict(multiples)
    by_name = {n: s for s, n in names.items()}
    ranges = {**ranges, **{by_name[n]: r for n, r in within.items() if n in by_name}}
    for expr, source, undecided_ok in guards:
        try:
            _decide(expr, source, ranges, names, examples, undecided_ok=undecided_ok, multiples=multiples)
        except SizeConditionError as e:
            if not (e.suggested or e.multiples):
                raise
            first = first or e
            _narrow(pins if len(e.suggested) > 1 else one_dim, e.suggested)
            for d, q in e.multiples.items():
                found[d] = math.lcm(q, found.get(d, 1))
    if first is None:
        return None
    error = SizeConditionError(first.reason, first.source, _narrow(dict(one_dim), pins), found)
    error.ranges = one_dim
    return error


def _narrow(ranges: dict[str, tuple[int, int]], more: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """`ranges` narrowed in place to where `more` holds too; returned."""
    for d, (lo, hi) in more.items():
        was = ranges.get(d, (lo, hi))
        ranges[d] = (max(lo, was[0]), min(hi, was[1]))
    return ranges


def _decide(expr, source: str | None, ranges, names: dict, examples: dict[str, int],
            undecided_ok: bool = False, multiples: dict[str, int] | None = None) -> None:
    symbols = sorted(expr.free_symbols, key=str)
    text = str(expr.xreplace({s: sympy.Symbol(names[s]) for s in symbols}))
    spans = [ranges.get(s, (1, sympy.oo)) for s in symbols]
    if _true_from_lower_bounds(expr, symbols, spans):
        return
    steps = [(multiples or {}).get(names[s], 1) for s in symbols]     # only the multiples of q are asked
    points = 1
    for (lo, hi), q in zip(spans, steps):  # an unbounded range (torch's int_oo is not an Integer) is too many points
        points *= (int(hi) - lo) // q + 1 if sympy.sympify(hi).is_Integer else MAX_POINTS + 1
    holds = _evaluate(expr, symbols, spans, steps) if points <= MAX_POINTS else None
    if holds is None and (undecided_ok or _holds_as_a_product(expr, symbols, spans, steps)):
        return
    if holds is None:
        where = ", ".join(f"{names[s]} in [{lo}, {hi}]" for s, (lo, hi) in zip(symbols, spans))
        failing = _failing_representative(expr, symbols, spans, steps)
        if failing == {}:
            return
        if failing is None:
            raise SizeConditionError(f"the model requires {text}, which Cuvil cannot check for every size ({where}); "
                                     f"declare narrower ranges= or static sizes", source, {})
        raise SizeConditionError(f"the model requires {text}, which fails at "
                                 f"{', '.join(f'{names[s]}={v}' for s, v in failing.items())} within the range {where}",
                                 source, {})
    if bool(holds.all()):
        return
    grids = torch.meshgrid(*[torch.arange(lo, int(hi) + 1) for lo, hi in spans], indexing="ij")
    failing = ", ".join(f"{names[s]}={int(g[~holds][0])}" for s, g in zip(symbols, grids))
    suggested, multiples = {}, {}
    if len(symbols) == 1 and names[symbols[0]] in examples:
        name, lo = names[symbols[0]], spans[0][0]
        suggested = _widest_around(holds, lo, examples[name], name)
        q = _multiple_where_holds(holds, lo, examples[name])
        if q is not None and (not suggested or suggested[name][1] - suggested[name][0] < len(holds) // 2):
            # holds on the multiples of q (Swin's `h % 4 == 0`), where a range around the example
            # would keep little of the span
            suggested, multiples = {name: q[1]}, {name: q[0]}
    elif all(names[s] in examples for s in symbols):     # no one range: each dim at the example's size
        suggested = {names[s]: (examples[names[s]],) * 2 for s in symbols}
    where = ", ".join(f"{names[s]} in [{lo}, {hi}]" for s, (lo, hi) in zip(symbols, spans))
    raise SizeConditionError(f"the model requires {text}, which fails at {failing} within the range {where}",
                             source, suggested, multiples)


_ORDER = {sympy.Ge: operator.ge, sympy.Gt: operator.gt, sympy.Le: operator.le, sympy.Lt: operator.lt}


def _holds_as_a_product(expr, symbols: list, spans: list, steps: list[int]) -> bool:
    """Whether a condition on products of factors of one symbol each holds at every point of
    ranges too many to evaluate: the element counts and strides that a reshape of several dynamic
    dims compares (`6*(h + pad_h)*(w + pad_w) == 24*((h + pad_h)//2)*((w + pad_w)//2)`, `!=`, or
    `3*((h + pad_h)//2)*((w + pad_w)//2) >= 1`). Each symbol's share of a side is the product of
    its factors, taken at every size of its range.
    - `lhs == rhs` where the shares' ratios lhs_s/rhs_s multiply to rhs's constant over lhs's:
      everywhere when each ratio is one value and those multiply to it;
    - `lhs != rhs` when no choice of ratios does (decided for two symbols at most);
    - `product <op> constant` by the product's least and greatest values, its shares all positive.
    False for any other condition, or a factor that is 0 somewhere."""
    if not isinstance(expr, (sympy.Eq, sympy.Ne, *_ORDER)):
        return False
    sides = [sympy.Mul.make_args(side) for side in expr.args]
    if any(len(f.free_symbols) > 1 or (not f.free_symbols and not f.is_Rational) for side in sides for f in side):
        return False
    constants = [math.prod(Fraction(int(f.p), int(f.q)) for f in side if not f.free_symbols) for side in sides]
    shares = []     # per symbol, per side: its share at every size
    for s, (lo, hi), q in zip(symbols, spans, steps):
        sizes = torch.arange(-(-lo // q) * q, int(hi) + 1, q)
        by_zero = torch.zeros(sizes.shape, dtype=torch.bool)
        try:
            parts = [torch.as_tensor(_Evaluator({s: sizes}, by_zero).eval(
                sympy.Mul(*[f for f in side if s in f.free_symbols]))).broadcast_to(sizes.shape).tolist()
                for side in sides]
        except _Undecided:
            return False
        if by_zero.any() or any(v == 0 for part in parts for v in part):
            return False
        shares.append(parts)
    if type(expr) in _ORDER:
        varying = [i for i, side in enumerate(sides) if any(f.free_symbols for f in side)]
        if len(varying) != 1 or any(min(parts[varying[0]]) < 0 for parts in shares):
            return False
        k = varying[0]
        ends = [constants[k] * math.prod(pick(parts[k]) for parts in shares) for pick in (min, max)]
        compare = _ORDER[type(expr)]
        return all(compare(e, constants[1]) if k == 0 else compare(constants[0], e) for e in ends)
    if constants[0] == 0:
        return False
    target = constants[1] / constants[0]
    ratios = [{Fraction(a, b) for a, b in zip(*parts)} for parts in shares]
    if isinstance(expr, sympy.Eq):
        return all(len(r) == 1 for r in ratios) and math.prod(next(iter(r)) for r in ratios) == target
    if target == 0 or len(ratios) == 1:
        return target == 0 or target not in ratios[0]
    return len(ratios) == 2 and not ({target / a for a in ratios[0]} & ratios[1])


def _failing_representative(expr, symbols: list, spans: list, steps: list[int]) -> dict | None:
    """A point of the ranges where `expr` fails ({} where it holds at every point), for ranges
    too many to evaluate whole where each symbol enters only through parts of its own that take
    few values (`(h + pad_h)//((h + pad_h)//2)` is 2 at every h): the condition then depends on a
    size only through the values of its parts, so one size for each distinct tuple of them stands
    for all the others. None where there are still too many points, or a part divides by 0."""
    representatives = []
    for s, (lo, hi), q in zip(symbols, spans, steps):
        if not sympy.sympify(hi).is_Integer:
            return None
        sizes = torch.arange(-(-lo // q) * q, int(hi) + 1, q)
        by_zero = torch.zeros(sizes.shape, dtype=torch.bool)
        try:
            values = torch.stack([torch.as_tensor(_Evaluator({s: sizes}, by_zero).eval(part)).broadcast_to(sizes.shape)
                                  .to(torch.int64) for part in _parts_of(expr, s)])
        except _Undecided:
            return None
        if by_zero.any():
            return None
        _, which = torch.unique(values, dim=1, return_inverse=True)
        first = torch.full((int(which.max()) + 1,), len(sizes)).scatter_reduce(0, which, torch.arange(len(sizes)), "amin")
        representatives.append(sizes[first])
    if math.prod(len(r) for r in representatives) > MAX_POINTS:
        return None
    grids = torch.meshgrid(*representatives, indexing="ij")
    by_zero = torch.zeros(grids[0].shape, dtype=torch.bool)
    try:
        holds = torch.as_tensor(_Evaluator(dict(zip(symbols, grids)), by_zero).eval(expr)).broadcast_to(by_zero.shape)
    except _Undecided:
        return None
    holds = holds & ~by_zero
    return {} if bool(holds.all()) else {s: int(g[~holds][0]) for s, g in zip(symbols, grids)}


def _parts_of(e, symbol) -> list:
    """The largest subexpressions of `e` whose only symbol is `symbol`."""
    if e.free_symbols == {symbol}:
        return [e]
    return [p for a in e.args for p in _parts_of(a, symbol)] if symbol in e.free_symbols else []


def _multiple_where_holds(holds: torch.Tensor, lo: int, example: int) -> tuple[int, tuple[int, int]] | None:
    """(q, (from, to)): the smallest q (2 to MAX_MULTIPLE) of which the example is a multiple and for
    whose multiples from `from` on (to the span's end, `to`) the condition holds, `from` as low as
    that allows; None if there is none."""
    hi = lo + len(holds) - 1
    for q in range(2, MAX_MULTIPLE + 1):
        if example % q:
            continue
        start = -(-lo // q) * q
        at = holds[start - lo::q]
        failing = (~at).nonzero()
        first = start if len(failing) == 0 else start + q * (int(failing[-1]) + 1)
        if first <= example:
            return q, (first, hi)
    return None


def _true_from_lower_bounds(expr, symbols: list, spans: list) -> bool:
    """Whether sympy proves `expr` for every size at or above the ranges' lower bounds: each size
    written as its bound + a non-negative integer. This decides a min or max of sizes whose
    difference keeps its sign (HF's mask sizes with a cache: `min(16*(p + t), 32*(p + t))`) over
    ranges too wide to evaluate point by point."""
    shifted = {s: lo + sympy.Symbol(f"_{s}", integer=True, nonnegative=True) for s, (lo, _) in zip(symbols, spans)}
    plain = expr.replace(tfn.Min, sympy.Min).replace(tfn.Max, sympy.Max)
    try:
        return plain.xreplace(shifted) is sympy.true
    except (TypeError, ValueError):
        return False


def _widest_around(holds: torch.Tensor, lo: int, example: int, name: str) -> dict[str, tuple[int, int]]:
    """The widest range around the example size where the condition holds everywhere."""
    i = example - lo
    if not 0 <= i < len(holds) or not holds[i]:
        return {}
    start, end = i, i
    while start > 0 and holds[start - 1]:
        start -= 1
    while end + 1 < len(holds) and holds[end + 1]:
        end += 1
    return {name: (lo + start, lo + end)}


_RELATIONS = {sympy.Eq: operator.eq, sympy.Ne: operator.ne, sympy.Lt: operator.lt, sympy.Le: operator.le,
              sympy.Gt: operator.gt, sympy.Ge: operator.ge}


def _evaluate(expr, symbols: list, spans: list, steps: list[int] | None = None) -> torch.Tensor | None:
    """expr at every point of the ranges, as a bool tensor; None where it uses a function Cuvil does
    not evaluate. Where a division in it is by zero the model cannot run, so the condition fails there.
    `steps`: per symbol, evaluate only its multiples of that step (True at the other points)."""
    steps = steps or [1] * len(symbols)
    firsts = [-(-lo // q) * q for (lo, _), q in zip(spans, steps)]
    grids = torch.meshgrid(*[torch.arange(f, int(hi) + 1, q) for f, (_, hi), q in zip(firsts, spans, steps)],
                           indexing="ij")
    by_zero = torch.zeros(grids[0].shape, dtype=torch.bool)
    try:
        result = _Evaluator(dict(zip(symbols, grids)), by_zero).eval(expr)
    except _Undecided:
        return None
    asked = torch.as_tensor(result).broadcast_to(by_zero.shape) & ~by_zero
    if steps == [1] * len(symbols):
        return asked
    holds = torch.ones([int(hi) - lo + 1 for lo, hi in spans], dtype=torch.bool)
    holds[tuple(slice(f - lo, None, q) for f, (lo, _), q in zip(firsts, spans, steps))] = asked
    return holds


class _Undecided(Exception):
    pass


class _Evaluator:
    def __init__(self, env: dict, by_zero: torch.Tensor):
        self.env, self.by_zero = env, by_zero

    def eval(self, e):
        if e in self.env:
            return self.env[e]
        if e.is_Integer:
            return int(e)
        if e is sympy.true or e is sympy.false:
            return bool(e)
        args = [self.eval(a) for a in e.args]
        if e.is_Add:
            return sum(args[1:], args[0])
        if e.is_Mul:
            out = args[0]
            for a in args[1:]:
                out = out * a
            return out
        if e.is_Pow and e.exp.is_Integer and e.exp >= 0:
            return args[0] ** int(e.exp)
        if isinstance(e, (tfn.FloorDiv, tfn.CleanDiv)):
            return self.floordiv(args[0], args[1])
        if isinstance(e, tfn.CeilDiv):
            return -self.floordiv(-torch.as_tensor(args[0]), args[1])
        if isinstance(e, (tfn.Mod, tfn.PythonMod, sympy.Mod)):
            return args[0] - args[1] * self.floordiv(args[0], args[1])
        if isinstance(e, (sympy.Max, tfn.Max)):
            return _fold(torch.maximum, args)
        if isinstance(e, (sympy.Min, tfn.Min)):
            return _fold(torch.minimum, args)
        for kind, op in _RELATIONS.items():
            if isinstance(e, kind):
                return op(torch.as_tensor(args[0]), torch.as_tensor(args[1]))
        if isinstance(e, sympy.And):
            return _fold(torch.logical_and, args)
        if isinstance(e, sympy.Or):
            return _fold(torch.logical_or, args)
        if isinstance(e, sympy.Not):
            return torch.logical_not(torch.as_tensor(args[0]))
        raise _Undecided(type(e).__name__)

    def floordiv(self, a, b):
        b = torch.as_tensor(b)
        zero = b == 0
        self.by_zero |= zero.broadcast_to(self.by_zero.shape)
        return torch.div(torch.as_tensor(a), torch.where(zero, 1, b), rounding_mode="floor")


def _fold(fn, args):
    out = torch.as_tensor(args[0])
    for a in args[1:]:
        out = fn(out, torch.as_tensor(a))
    return out
