"""Latency- and memory-aware list scheduling of a program's steps, and latency anchors.

`schedule_steps` orders the steps (a topological order of their dependencies) the way a list
scheduler does: repeatedly take one of the steps whose dependencies have all run. Which one:

1. Latency anchors first. A step may carry `max_latency_us`: it should finish that long after the
   call starts. Every step inherits the tightest anchor of the steps that depend on it, and among
   ready steps only those with the tightest anchor are considered (earliest deadline first).
2. The critical path. A step's rank is the longest cost-weighted path from it to the end of the
   program (its own cost included) plus the bias of its class ("gemm", "reduction", ...). Steps
   whose rank is within `slack` (a fraction) of the highest ready rank are the candidates:
   running a long chain early lets the engine overlap the rest with it.
3. Memory. Among the candidates, the step that adds the fewest live bytes: what it writes for
   later steps minus what it is the last to read. Finishing one branch before starting the next
   keeps fewer buffers alive at once, so the arena planned over the order is smaller.
4. Ties: the higher rank, then the current order.

The engine runs any ready step when a thread is free and picks the highest priority among ready
ones, so the priorities follow the order: concurrency stays, and the order is what a single thread
runs. `anchor_misses` compares a profiled run with the anchors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence


@dataclass(frozen=True)
class Buffer:
    """An arena buffer as the scheduler sees it: its bytes at the hint sizes, the step that writes
    it and the steps that read it (none: it lives during its writer only, like a scratch buffer)."""
    nbytes: int
    writer: int
    readers: frozenset[int] = frozenset()


@dataclass
class Schedule:
    order: list[int]            # the steps, by their current index, in the order they run
    priorities: list[int]       # for each position of `order`: higher runs first among ready steps
    rank_ns: list[float]        # for each current step: the longest cost-weighted path from it to the end
    critical_path_ns: float
    peak_bytes: int             # the most bytes live at one step in the new order (hint sizes)
    peak_bytes_before: int      # ... in the current order

    def statistics(self) -> dict:
        return {"steps": len(self.order), "moved": sum(k != s for k, s in enumerate(self.order)),
                "critical_path_ns": round(self.critical_path_ns), "peak_live_bytes": self.peak_bytes,
                "peak_live_bytes_before": self.peak_bytes_before}


@dataclass(frozen=True)
class AnchorMiss:
    step: int
    kernel: str
    max_latency_us: float
    finished_us: float          # when the step's last chunk ended, after the call's first step started

    @property
    def over_us(self) -> float:
        return self.finished_us - self.max_latency_us


def schedule_steps(deps: Sequence[Iterable[int]], cost_ns: Sequence[float], buffers: Iterable[Buffer] = (), *,
                   kinds: Sequence[str] | None = None, bias_ns: Mapping[str, float] | None = None,
                   anchors_us: Mapping[int, float] | None = None, slack: float = 0.1) -> Schedule:
    """Order the steps; `deps[k]`: the steps that must run before step k, `cost_ns[k]`: its
    estimated time, `kinds[k]`: its class, `bias_ns[kind]`: added to the rank of that class's
    steps, `anchors_us`: step -> max_latency_us, `slack`: see the module doc."""
    n = len(deps)
    deps = [set(d) for d in deps]
    if len(cost_ns) != n or (kinds is not None and len(kinds) != n):
        raise ValueError(f"schedule_steps: {n} steps but {len(cost_ns)} costs"
                         + ("" if kinds is None else f" and {len(kinds)} kinds"))
    if not 0 <= slack <= 1:
        raise ValueError(f"schedule_steps: slack must be a fraction in [0, 1], not {slack}")
    for k, d in enumerate(deps):
        bad = [s for s in d if not 0 <= s < n or s == k]
        if bad:
            raise ValueError(f"schedule_steps: step {k} depends on {bad[0]}, which is not another step")
    buffers = list(buffers)
    succs: list[list[int]] = [[] for _ in range(n)]
    for k, d in enumerate(deps):
        for s in d:
            succs[s].append(k)
    topo = _topological(deps, succs)
    rank = [0.0] * n
    deadline = [math.inf] * n
    for k in reversed(topo):
        rank[k] = cost_ns[k] + max((rank[s] for s in succs[k]), default=0.0)
        deadline[k] = min([(anchors_us or {}).get(k, math.inf)] + [deadline[s] for s in succs[k]])
    key = [rank[k] + (bias_ns or {}).get(kinds[k], 0.0) if kinds else rank[k] for k in range(n)]

    written: list[list[Buffer]] = [[] for _ in range(n)]
    read: list[list[Buffer]] = [[] for _ in range(n)]
    for b in buffers:
        written[b.writer].append(b)
        for r in b.readers:
            read[r].append(b)
    pending = {id(b): len(b.readers) for b in buffers}

    def added_bytes(k: int) -> int:
        grows = sum(b.nbytes for b in written[k] if b.readers)
        frees = sum(b.nbytes for b in read[k] if pending[id(b)] == 1)
        return grows - frees

    waiting = [len(d) for d in deps]
    ready = {k for k in range(n) if not waiting[k]}
    order = []
    while ready:
        urgent = min(deadline[k] for k in ready)
        cands = [k for k in ready if deadline[k] == urgent]
        top = max(key[k] for k in cands)
        cands = [k for k in cands if key[k] >= top - slack * abs(top)]
        k = min(cands, key=lambda k: (added_bytes(k), -key[k], k))
        order.append(k)
        ready.remove(k)
        for b in read[k]:
            pending[id(b)] -= 1
        for s in succs[k]:
            waiting[s] -= 1
            if not waiting[s]:
                ready.add(s)
    return Schedule(order, [n - p for p in range(n)], rank, max(rank, default=0.0),
                    peak_live_bytes(order, buffers), peak_live_bytes(list(range(n)), buffers))


def peak_live_bytes(order: Sequence[int], buffers: Iterable[Buffer]) -> int:
    """The most bytes live at one position of `order`: a buffer lives from its writer to its last reader."""
    position = {k: p for p, k in enumerate(order)}
    live = [0] * (len(order) + 1)
    for b in buffers:
        start = position[b.writer]
        end = max((position[r] for r in b.readers), default=start)
        live[start] += b.nbytes
        live[end + 1] -= b.nbytes
    peak = running = 0
    for delta in live:
        running += delta
        peak = max(peak, running)
    return peak


def anchor_misses(timings: Iterable, anchors_us: Mapping[int, float]) -> list[AnchorMiss]:
    """The anchored steps of a profiled call (`runtime.StepTiming`s, one per chunk) that finished
    later than their `max_latency_us` after the call's first step started; a step that did not run
    is reported as missing it by infinity."""
    timings = list(timings)
    if not anchors_us:
        return []
    if not timings:
        raise ValueError("anchor_misses: no step timings (profile a call first)")
    start = min(t.start_ns for t in timings)
    end: dict[int, int] = {}
    kernel: dict[int, str] = {}
    for t in timings:
        end[t.step] = max(end.get(t.step, t.end_ns), t.end_ns)
        kernel[t.step] = t.kernel
    misses = []
    for step, limit in sorted(anchors_us.items()):
        finished = (end[step] - start) / 1000 if step in end else math.inf
        if finished > limit:
            misses.append(AnchorMiss(step, kernel.get(step, ""), limit, finished))
    return misses


def _topological(deps: list[set[int]], succs: list[list[int]]) -> list[int]:
    waiting = [len(d) for d in deps]
    todo = [k for k in range(len(deps)) if not waiting[k]]
    out = []
    while todo:
        k = todo.pop()
        out.append(k)
        for s in succs[k]:
            waiting[s] -= 1
            if not waiting[s]:
                todo.append(s)
    if len(out) != len(deps):
        cycle = sorted(k for k in range(len(deps)) if waiting[k])
        raise ValueError(f"schedule_steps: the dependencies of steps {cycle} form a cycle")
    return out
