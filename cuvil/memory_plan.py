"""Arena planning: every intermediate buffer of a program gets an offset in one per-call arena.

A buffer lives from the step that writes it to the last step that reads it. Walking the buffers in
the order their steps run, each takes a *region* that no live buffer occupies: the free region
whose size fits best, else the largest free one (grown), else a new one. Sizes are compared at
hint values of the symbols (say their upper bounds), but a region's size is the `Max` of the sizes
of every buffer placed in it, as an expression: the plan is right for every value of the symbols,
and the arena is as small as the plan allows at each call's sizes. Regions are laid out one after
another, each rounded up to the alignment.

The engine runs independent steps at the same time, so "free after step k" is not enough: a step
that takes over a region must wait for every step that used the region's previous buffer
(`MemoryPlan.waits`, write-after-read dependencies the program builder adds to the data ones).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import sympy

from .ir.types import norm_dim

ALIGN = 64


@dataclass(frozen=True)
class BufferUse:
    """What the planner needs to know of a buffer: its size and the steps that touch it."""
    name: str
    nbytes: Any                 # int or sympy expression over the program's symbols
    first: int                  # the step that writes it
    last: int                   # the last step that reads it
    steps: frozenset[int]       # every step that reads or writes it


@dataclass
class PlacedBuffer:
    use: BufferUse
    region: int
    offset: Any
    reuses: str | None          # the buffer that had the region before, if any


@dataclass
class MemoryPlan:
    buffers: list[PlacedBuffer]
    region_bytes: list[Any]     # each region's size, rounded up to the alignment
    arena_bytes: Any
    naive_bytes: Any            # one region per buffer: what the arena would be without reuse
    waits: dict[int, set[int]] = field(default_factory=dict)   # step -> earlier steps to wait for

    def placed(self, name: str) -> PlacedBuffer:
        for b in self.buffers:
            if b.use.name == name:
                return b
        raise KeyError(name)


def round_up(nbytes, align: int = ALIGN):
    """`nbytes` rounded up to a multiple of `align` (an int, or an expression the runtime evaluates)."""
    if isinstance(nbytes, int):
        return -(-nbytes // align) * align
    return norm_dim(align * sympy.floor((nbytes + align - 1) / align))


@dataclass
class _Region:
    sizes: list = field(default_factory=list)
    hint: int = 0
    occupant: BufferUse | None = None


def plan_memory(uses: Iterable[BufferUse], hint: Callable[[Any], int], align: int = ALIGN) -> MemoryPlan:
    """Place `uses` in one arena; `hint(nbytes)` is a size's value at the symbols' hint values."""
    uses = sorted(uses, key=lambda u: (u.first, -hint(u.nbytes), u.name))
    regions: list[_Region] = []
    placed: list[tuple[BufferUse, int, str | None]] = []
    waits: dict[int, set[int]] = defaultdict(set)
    for use in uses:
        need = hint(use.nbytes)
        free = [i for i, r in enumerate(regions) if r.occupant.last < use.first]
        fits = [i for i in free if regions[i].hint >= need]
        if fits:
            k = min(fits, key=lambda i: regions[i].hint)
        elif free:
            k = max(free, key=lambda i: regions[i].hint)
        else:
            regions.append(_Region())
            k = len(regions) - 1
        r = regions[k]
        reuses = None
        if r.occupant is not None:
            reuses = r.occupant.name
            waits[use.first] |= r.occupant.steps
        if not any(_same(use.nbytes, s) for s in r.sizes):
            r.sizes.append(use.nbytes)
        r.hint = max(r.hint, need)
        r.occupant = use
        placed.append((use, k, reuses))
    region_bytes = [round_up(_max(r.sizes), align) for r in regions]
    offsets = _prefix_sums(region_bytes)
    buffers = [PlacedBuffer(use, k, offsets[k], reuses) for use, k, reuses in placed]
    return MemoryPlan(buffers, region_bytes, offsets[-1], _sum(round_up(u.nbytes, align) for u in uses),
                      {s: w for s, w in waits.items() if w})


def _same(a, b) -> bool:
    return a == b if isinstance(a, int) and isinstance(b, int) else sympy.sympify(a) == sympy.sympify(b)


def _max(sizes: Sequence):
    """The Max of sizes, without those another size is never below (sympy's own Max compares
    arguments much more slowly)."""
    kept: list = []
    for s in sorted(sizes, key=lambda e: -len(str(e))):
        if any(_never_below(k, s) for k in kept):
            continue
        kept = [k for k in kept if not _never_below(s, k)] + [s]
    return kept[0] if len(kept) == 1 else norm_dim(sympy.Max(*kept, evaluate=False))


def _never_below(a, b) -> bool:
    """a >= b for every value of the (positive) symbols: a - b is a polynomial with no negative coefficient."""
    d = sympy.expand(sympy.sympify(a) - sympy.sympify(b))
    if d.is_Number:
        return d >= 0
    if not d.is_polynomial(*d.free_symbols):
        return False
    return all(c >= 0 for c in sympy.Poly(d, *d.free_symbols).coeffs())


def _prefix_sums(sizes: Sequence) -> list:
    out = [0]
    for s in sizes:
        out.append(norm_dim(out[-1] + s) if not (isinstance(s, int) and isinstance(out[-1], int)) else out[-1] + s)
    return out


def _sum(values: Iterable):
    return _prefix_sums(list(values))[-1]
