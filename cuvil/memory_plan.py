"""Arena planning: every intermediate buffer of a program gets a byte offset in one per-call arena.

A buffer lives from the step that writes it to the last step that reads it, in the program's step
order. Strategy "best-fit" places the buffers one at a time like a heap allocator: the buffers
already placed whose lifetimes meet the new one's occupy byte ranges, the holes between them are
taken from that set (so freed neighbours coalesce), and the buffer takes the smallest hole that
holds it, at the hole's bottom, or else goes on top of them all. It places them in step order
(which suits chains: each buffer takes the bytes of one that just died) and, separately, largest
first (which suits buffers of mixed sizes), and keeps the smaller arena. Strategy "naive" gives
every buffer bytes of its own (the sum the statistics compare against).

Symbolic sizes. Sizes are expressions over the program's symbols (positive integers). Holes are
measured at hint values (`hint(expr) -> int`), but offsets must be right at every value, so a
placement records relations, not numbers: placing B in a hole puts each placed buffer whose
lifetime meets B's either *below* B (it ends under the hole) or *above* it. These edges form a DAG
(they go up at the hint values), and a buffer's offset is the `Max`, over the buffers below it, of
their offset + size: the longest path to it. Every edge then holds at every symbol value (the
upper buffer starts at or above the lower one's end), and every two buffers whose lifetimes meet
have an edge, so they never share a byte. At the hint values a buffer's offset is its hole's
bottom; at other values a buffer that outgrew its hole pushes the ones above it up instead of
overlapping them. The arena, the Max of offset + size, never exceeds the naive sum (a path meets
each buffer once). Terms of a Max that another term is never below are dropped; that comparison is
coefficient-wise over the expanded polynomials (symbols >= 1), so what it cannot prove is simply
kept. Sizes are rounded up to the alignment, so every offset is a multiple of it.

In place. A buffer written by step k may take exactly the bytes of an input of step k that dies at
step k, when the caller lists that input in `BufferUse.inplace_of` (a kernel that reads each
element of the input before it writes the same element of the output) and both sizes are equal.

Waits. The engine runs independent steps at the same time, so "dead after step k" is not enough:
the writer of a buffer that may share bytes with an earlier, dead buffer at some symbol values
(unless an edge path or the offset expressions prove them apart) waits for every step that touched
it (`MemoryPlan.waits`: write-after-read and write-after-write dependencies the program builder
adds to the data ones). A wait already implied by the other waits is left out.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Iterable, Sequence

import sympy

from .ir.types import norm_dim

ALIGN = 64
STRATEGIES = ("best-fit", "naive")


@dataclass(frozen=True)
class BufferUse:
    """What the planner needs to know of a buffer: its size and the steps that touch it."""
    name: str
    nbytes: Any                 # int or sympy expression over the program's symbols
    first: int                  # the step that writes it
    last: int                   # the last step that reads it
    steps: frozenset[int]       # every step that reads or writes it
    inplace_of: tuple[str, ...] = ()    # inputs of the writer whose bytes it may take (see the module doc)


@dataclass
class PlacedBuffer:
    use: BufferUse
    region: int                 # buffers that took over one another's bytes share a region
    offset: Any
    reuses: str | None          # the dead buffer whose bytes (at the hint sizes) it starts in, if any
    inplace: bool = False       # it takes exactly the bytes of `reuses`, an input of its writer


@dataclass
class MemoryPlan:
    buffers: list[PlacedBuffer]
    region_bytes: list[Any]     # the largest buffer of each region (for the report; offsets do not use it)
    arena_bytes: Any
    naive_bytes: Any            # bytes of their own for every buffer: the arena without reuse
    waits: dict[int, set[int]] = field(default_factory=dict)   # step -> earlier steps to wait for
    peak_bytes: Any = 0         # the most bytes live at one step: no plan's arena is smaller
    strategy: str = "best-fit"

    def placed(self, name: str) -> PlacedBuffer:
        for b in self.buffers:
            if b.use.name == name:
                return b
        raise KeyError(name)

    @property
    def inplace_reuses(self) -> int:
        return sum(b.inplace for b in self.buffers)

    def statistics(self, at: Callable[[Any], int]) -> dict:
        """The plan's figures at the symbol values `at` evaluates expressions at."""
        arena, naive, peak = at(self.arena_bytes), at(self.naive_bytes), at(self.peak_bytes)
        return {"strategy": self.strategy, "buffers": len(self.buffers), "arena_bytes": arena,
                "naive_bytes": naive, "peak_live_bytes": peak,
                "arena_vs_naive": round(arena / naive, 4) if naive else 1.0,
                "fragmentation": round(1 - peak / arena, 4) if arena else 0.0,
                "reused": sum(b.reuses is not None for b in self.buffers),
                "inplace_reuses": self.inplace_reuses, "waits": sum(len(w) for w in self.waits.values())}


def round_up(nbytes, align: int = ALIGN):
    """`nbytes` rounded up to a multiple of `align` (an int, or an expression the runtime evaluates)."""
    if isinstance(nbytes, int):
        return -(-nbytes // align) * align
    return norm_dim(align * sympy.floor((nbytes + align - 1) / align))


def plan_memory(uses: Iterable[BufferUse], hint: Callable[[Any], int], align: int = ALIGN, *,
                inplace: bool = True, strategy: str = "best-fit") -> MemoryPlan:
    """Place `uses` in one arena; `hint(nbytes)` is a size's value at the symbols' hint values."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown memory planning strategy '{strategy}' (choose from {', '.join(STRATEGIES)})")
    uses = sorted(uses, key=lambda u: (u.first, -hint(u.nbytes), u.name))
    for u in uses:
        if not (u.first <= u.last and {u.first, u.last} <= u.steps and min(u.steps) == u.first
                and max(u.steps) == u.last):
            raise ValueError(f"buffer {u.name}: steps {sorted(u.steps)} do not run from first={u.first} "
                             f"to last={u.last}")
    sizes = {u.name: round_up(u.nbytes, align) for u in uses}
    naive = _sum(sizes[u.name] for u in uses)
    if strategy == "naive":
        offsets = _prefix_sums([sizes[u.name] for u in uses])
        buffers = [PlacedBuffer(u, i, offsets[i], None) for i, u in enumerate(uses)]
        return MemoryPlan(buffers, [sizes[u.name] for u in uses], naive, naive, {},
                          _peak([([u], sizes[u.name]) for u in uses]), strategy)
    # placing in step order suits chains, largest first suits buffers of mixed sizes: keep the better
    fits = [_BestFit(uses, sizes, hint, align, inplace, by_size) for by_size in (False, True)]
    return min(fits, key=lambda f: hint(f.arena)).plan(naive)


# ----------------------------------------------------------------------------- best fit


class _Node:
    """Bytes of the arena: one buffer's, and those of the buffers that take them over in place."""

    def __init__(self, index: int, use: BufferUse, size, need: int):
        self.index = index
        self.holders = [use]
        self.size = size
        self.need = need                    # bytes at the hint sizes (at least the alignment)
        self.lo = self.hi = 0               # the byte range at the hint sizes, once placed
        self.first, self.last = use.first, use.last
        self.below: list[_Node] = []        # nodes whose end this one starts at or above
        self.above: list[_Node] = []
        self.offset: tuple = ()             # Max of these polynomials (once every node is placed)


class _BestFit:
    """Nodes (buffers, with those that take them over in place) placed one by one, each in the
    smallest hole among the placed nodes whose lifetimes meet its own, or on top of them all."""

    def __init__(self, uses: list[BufferUse], sizes: dict, hint: Callable, align: int, inplace: bool,
                 by_size: bool):
        self.uses, self.sizes, self.hint, self.align = uses, sizes, hint, align
        self.by_name = {u.name: u for u in uses}
        self.nodes: list[_Node] = []
        self.node_of: dict[str, _Node] = {}
        self.in_place: set[str] = set()
        for u in uses:
            self._add_buffer(u, inplace)
        order = (lambda n: (-n.need, n.first)) if by_size else (lambda n: n.first)    # sorts are stable
        placed: list[_Node] = []
        for n in sorted(self.nodes, key=order):
            self._place(n, placed)
            placed.append(n)
        for n in sorted(self.nodes, key=lambda n: n.lo):      # edges go up: this order is topological
            n.offset = _merge([t for b in n.below for t in _add(b.offset, _poly(b.size))], hint) if n.below else (ZERO,)
        tops = [t for n in self.nodes if not n.above for t in _add(n.offset, _poly(n.size))]
        self.arena = _as_max(_merge(tops, hint)) if tops else 0

    def _add_buffer(self, u: BufferUse, inplace: bool) -> None:
        host = self._inplace_host(u) if inplace else None
        if host is None:
            node = _Node(len(self.nodes), u, self.sizes[u.name], max(self.hint(self.sizes[u.name]), self.align))
            self.nodes.append(node)
        else:
            node = self.node_of[host.name]
            node.holders.append(u)
            node.last = u.last
            self.in_place.add(u.name)
        self.node_of[u.name] = node

    def _inplace_host(self, u: BufferUse) -> BufferUse | None:
        for name in u.inplace_of:
            host = self.by_name.get(name)
            if (host is not None and host.first < u.first == host.last and u.first in host.steps
                    and self.node_of[name].holders[-1] is host and _same(host.nbytes, u.nbytes)):
                return host
        return None

    def _place(self, node: _Node, placed: list[_Node]) -> None:
        meets = sorted((n for n in placed if n.first <= node.last and node.first <= n.last), key=lambda n: n.lo)
        holes, bottom = [], 0
        for n in meets:
            if n.lo - bottom >= node.need:
                holes.append((n.lo - bottom, bottom))
            bottom = max(bottom, n.hi)
        node.lo = min(holes)[1] if holes else bottom
        node.hi = node.lo + node.need
        for n in meets:         # the hole is free at the hint sizes: each of them is below or above it
            lower, upper = (n, node) if n.hi <= node.lo else (node, n)
            lower.above.append(upper)
            upper.below.append(lower)

    def plan(self, naive) -> MemoryPlan:
        region: dict[str, int] = {}
        region_sizes: list[list] = []
        buffers = []
        for u in self.uses:
            r = self._reuses(u)
            if r is None:
                region[u.name] = len(region_sizes)
                region_sizes.append([])
            else:
                region[u.name] = region[r]
            region_sizes[region[u.name]].append(self.sizes[u.name])
            buffers.append(PlacedBuffer(u, region[u.name], _as_max(self.node_of[u.name].offset), r,
                                        u.name in self.in_place))
        peak = _peak([(n.holders, n.size) for n in self.nodes])
        return MemoryPlan(buffers, [_max(s) for s in region_sizes], self.arena, naive, self._waits(), peak)

    def _reuses(self, u: BufferUse) -> str | None:
        """The buffer u takes over in place, or the last dead one whose bytes held u's first byte."""
        node = self.node_of[u.name]
        if u.name in self.in_place:
            return node.holders[node.holders.index(u) - 1].name
        dead = [b for n in self.nodes if n.lo <= node.lo < n.hi for b in n.holders if b.last < u.first]
        return max(dead, key=lambda b: (b.last, b.first)).name if dead else None

    def _waits(self) -> dict[int, set[int]]:
        reach = self._reachable()
        waits: dict[int, set[int]] = {}
        closure: dict[int, set[int]] = {}      # step -> every step it waits for, directly or not

        def covered_by(steps: Iterable[int]) -> set[int]:
            out = set(steps)
            for s in steps:
                out |= closure.get(s, set())
            return out

        done: list[BufferUse] = []          # placed buffers, by first step
        covered: set[int] = set()
        for i, u in enumerate(self.uses):
            k = u.first
            if i == 0 or self.uses[i - 1].first != k:
                for s in sorted({w for d in done for w in d.steps if w < k} - closure.keys()):
                    closure[s] = covered_by(waits.get(s, set()))
                covered = set(closure.get(k, ()))
            node = self.node_of[u.name]
            wait = set()
            if u.name in self.in_place:     # the host's other readers may still run
                wait |= self.by_name[self._reuses(u)].steps - {k}
                covered |= covered_by(wait)
            for d in sorted((d for d in done if d.last < k), key=lambda d: -d.last):
                if d.steps <= covered:
                    continue
                if self._may_overlap(self.node_of[d.name], node, reach):
                    wait |= d.steps
                    covered |= covered_by(d.steps)
            if wait:
                waits.setdefault(k, set()).update(wait)
            done.append(u)
        return waits

    def _reachable(self) -> list[int]:
        """For each node, the bit set of the nodes above it along edges."""
        reach = [0] * len(self.nodes)
        for n in sorted(self.nodes, key=lambda n: -n.lo):
            for a in n.above:
                reach[n.index] |= reach[a.index] | 1 << a.index
        return reach

    def _may_overlap(self, a: _Node, b: _Node, reach: list[int]) -> bool:
        if a is b:
            return True
        if reach[a.index] >> b.index & 1 or reach[b.index] >> a.index & 1:
            return False
        return not (_never_below_all(b.offset, _add(a.offset, _poly(a.size)))
                    or _never_below_all(a.offset, _add(b.offset, _poly(b.size))))


# ----------------------------------------------------------------------------- expressions
# Sizes, offsets and their sums are kept as polynomials: frozensets of (monomial, coefficient),
# a monomial being a product of symbols and of other factors such as `floor(...)`.

Poly = frozenset
ZERO: Poly = frozenset()


@lru_cache(maxsize=None)
def _poly(e) -> Poly:
    if isinstance(e, int):
        return frozenset({(sympy.S.One, e)}) if e else ZERO
    return frozenset((m, int(c) if c.is_Integer else c) for m, c in sympy.expand(e).as_coefficients_dict().items()
                     if c != 0)


def _plus(a: Poly, b: Poly) -> Poly:
    out = dict(a)
    for m, c in b:
        out[m] = out.get(m, 0) + c
    return frozenset((m, c) for m, c in out.items() if c != 0)


def _expr(p: Poly):
    if all(m == 1 for m, _ in p):
        return int(sum(c for _, c in p))
    return norm_dim(sympy.Add(*(c * m for m, c in p)))


def _value(p: Poly, hint: Callable[[Any], int]) -> int:
    return sum(c * (1 if m == 1 else hint(m)) for m, c in p)


def _add(terms: tuple, size: Poly) -> tuple:
    return tuple(_plus(t, size) for t in terms)


def _merge(terms: Sequence[Poly], hint: Callable[[Any], int] | None) -> tuple:
    """The terms of a Max, without those another term is never below."""
    terms = list(dict.fromkeys(terms))
    if hint is not None:
        terms.sort(key=lambda t: _value(t, hint), reverse=True)
    kept: list = []
    for t in terms:
        if any(_never_below(k, t) for k in kept):
            continue
        kept = [k for k in kept if not _never_below(t, k)] + [t]
    return tuple(kept)


def _as_max(terms: tuple):
    exprs = [_expr(t) for t in terms]
    return exprs[0] if len(exprs) == 1 else norm_dim(sympy.Max(*exprs, evaluate=False))


def _max(sizes: Sequence):
    return _as_max(_merge([_poly(s) for s in sizes], None))


def _peak(groups: Sequence[tuple[list[BufferUse], Any]]):
    """The Max over steps of the bytes live there; `groups` share bytes (a buffer and those taking
    it over in place) and live from the first holder's first step to the last one's last."""
    sums = []
    for k in sorted({g[0][0].first for g in groups}):
        total = ZERO
        for holders, size in groups:
            if holders[0].first <= k <= holders[-1].last:
                total = _plus(total, _poly(size))
        sums.append(total)
    return _as_max(_merge(sums, None)) if sums else 0


def _never_below_all(upper: tuple, lower: tuple) -> bool:
    """Max(upper) >= Max(lower) at every symbol value: each lower term is under some upper term."""
    return all(any(_never_below(u, t) for u in upper) for t in lower)


def _same(a, b) -> bool:
    return _poly(a) == _poly(b)


@lru_cache(maxsize=None)
def _never_below(a: Poly, b: Poly) -> bool:
    """a >= b for every value of the symbols (positive integers), proved coefficient-wise: in a - b,
    each negative monomial is paid for by positive ones that are multiples of it by symbols only
    (s >= 1 makes m*s >= m). A monomial with a factor that may be negative fails the proof."""
    diff = _plus(a, frozenset((m, -c) for m, c in b))
    if any(not _nonnegative(m) for m, _ in diff):
        return False
    budget = {m: c for m, c in diff if c > 0}
    for m, c in sorted(((m, -c) for m, c in diff if c < 0), key=lambda mc: -_degree(mc[0])):
        for p in budget:
            if c <= 0:
                break
            if budget[p] > 0 and _multiple(p, m):
                take = min(budget[p], c)
                budget[p] -= take
                c -= take
        if c > 0:
            return False
    return True


@lru_cache(maxsize=None)
def _powers(m) -> dict:
    return {} if m == 1 else dict(m.as_powers_dict())


@lru_cache(maxsize=None)
def _nonnegative(m) -> bool:
    return all(b.is_nonnegative and e.is_Integer and e > 0 for b, e in _powers(m).items())


def _degree(m) -> int:
    return sum(int(e) for e in _powers(m).values())


def _multiple(p, m) -> bool:
    """p >= m at every symbol value: p is m times symbols (each >= 1)."""
    pp, mp = _powers(p), _powers(m)
    if any(pp.get(b, 0) < e for b, e in mp.items()):
        return False
    return all(b.is_Symbol and b.is_integer and b.is_positive for b, e in pp.items() if e > mp.get(b, 0))


def _prefix_sums(sizes: Sequence) -> list:
    out = [0]
    for s in sizes:
        out.append(norm_dim(out[-1] + s) if not (isinstance(s, int) and isinstance(out[-1], int)) else out[-1] + s)
    return out


def _sum(values: Iterable):
    return _prefix_sums(list(values))[-1]
