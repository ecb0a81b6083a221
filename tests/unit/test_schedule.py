"""The step scheduler: topological orders, critical path first, memory-aware choice among near-critical
steps, class biases, latency anchors, and the anchor misses of a profiled run."""
import random

import pytest

from cuvil.memory_plan import BufferUse, plan_memory
from cuvil.runtime import StepTiming
from cuvil.schedule import AnchorMiss, Buffer, anchor_misses, peak_live_bytes, schedule_steps


def buf(nbytes, writer, *readers):
    return Buffer(nbytes, writer, frozenset(readers))


def random_dag(rng, n):
    deps = [set(rng.sample(range(k), rng.randint(0, min(k, 3)))) for k in range(n)]
    perm = list(range(n))
    rng.shuffle(perm)                       # steps need not be listed in a topological order
    where = {old: new for new, old in enumerate(perm)}
    out = [set() for _ in range(n)]
    for k, d in enumerate(deps):
        out[where[k]] = {where[x] for x in d}
    return out


def test_ranks_are_the_longest_cost_weighted_path_to_the_end():
    #   0 -> 1 -> 3,  0 -> 2 -> 3
    s = schedule_steps([set(), {0}, {0}, {1, 2}], [10, 5, 20, 1])
    assert s.rank_ns == [31, 6, 21, 1] and s.critical_path_ns == 31
    assert s.order == [0, 2, 1, 3] and s.priorities == [4, 3, 2, 1]


@pytest.mark.parametrize("seed", range(5))
def test_random_schedules_respect_every_dependency(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 40)
    deps = random_dag(rng, n)
    buffers = [buf(rng.randint(1, 10_000), k, *{s for s in range(n) if k in deps[s]}) for k in range(n)]
    s = schedule_steps(deps, [rng.uniform(1, 1000) for _ in range(n)], buffers,
                       kinds=[rng.choice(["gemm", "copy", "elementwise"]) for _ in range(n)],
                       bias_ns={"gemm": 500.0}, slack=rng.choice([0.0, 0.1, 1.0]))
    assert sorted(s.order) == list(range(n))
    position = {k: p for p, k in enumerate(s.order)}
    assert all(position[d] < position[k] for k in range(n) for d in deps[k])
    assert all(a > b for a, b in zip(s.priorities, s.priorities[1:]))
    assert s.peak_bytes == peak_live_bytes(s.order, buffers)


def test_the_critical_chain_goes_first():
    # step 0 is short and independent; 1 -> 2 -> 3 is long
    s = schedule_steps([set(), set(), {1}, {2}], [1, 100, 100, 100])
    assert s.order == [1, 2, 3, 0]


def test_finishing_a_branch_first_lowers_the_peak():
    # two branches: A_i writes 1 MB that R_i reduces to 1 KB; J joins them; T is a long tail.
    # Program order runs both A's before the R's: two megabytes live at once.
    mb, kb = 1 << 20, 1 << 10
    A1, A2, R1, R2, J, T = range(6)
    deps = [set(), set(), {A1}, {A2}, {R1, R2}, {J}]
    buffers = [buf(mb, A1, R1), buf(mb, A2, R2), buf(kb, R1, J), buf(kb, R2, J), buf(kb, J, T)]
    s = schedule_steps(deps, [10, 10, 10, 10, 1, 1000], buffers)
    assert s.order == [A1, R1, A2, R2, J, T]
    assert s.peak_bytes_before == 2 * mb + kb and s.peak_bytes == mb + 2 * kb
    # with no slack the scheduler follows ranks only (A2's path is longer than R1's): the peak stays
    assert schedule_steps(deps, [10, 10, 10, 10, 1, 1000], buffers, slack=0.0).peak_bytes == 2 * mb + kb
    # the arena planned over the new order is smaller too
    arenas = []
    for order in (list(range(6)), s.order):
        pos = {k: p for p, k in enumerate(order)}
        uses = [BufferUse(f"b{i}", b.nbytes, pos[b.writer], max(pos[r] for r in b.readers),
                          frozenset({pos[b.writer], *(pos[r] for r in b.readers)})) for i, b in enumerate(buffers)]
        arenas.append(plan_memory(uses, lambda e: e).arena_bytes)
    assert arenas == [2 * mb + kb, mb + 2 * kb]


def test_class_bias_breaks_ties_between_equal_ranks():
    deps, cost = [set(), set()], [50, 50]
    assert schedule_steps(deps, cost, kinds=["copy", "gemm"]).order == [0, 1]
    assert schedule_steps(deps, cost, kinds=["copy", "gemm"], bias_ns={"gemm": 10}).order == [1, 0]
    assert schedule_steps(deps, cost, kinds=["copy", "gemm"], bias_ns={"copy": -10}).order == [1, 0]


def test_an_anchored_step_and_its_ancestors_run_before_a_longer_branch():
    # branch X: 0 -> 1 (1 ns each), step 1 anchored at 50 us; branch Y: 2 -> 3 (1000 ns each)
    deps, cost = [set(), {0}, set(), {2}], [1, 1, 1000, 1000]
    assert schedule_steps(deps, cost).order == [2, 3, 0, 1]
    assert schedule_steps(deps, cost, anchors_us={1: 50.0}).order == [0, 1, 2, 3]
    # of two anchors the tighter one's branch goes first
    assert schedule_steps(deps, cost, anchors_us={1: 50.0, 3: 20.0}).order == [2, 3, 0, 1]


def test_bad_inputs_are_refused_with_the_step_named():
    with pytest.raises(ValueError, match=r"steps \[0, 1\] form a cycle"):
        schedule_steps([{1}, {0}], [1, 1])
    with pytest.raises(ValueError, match="step 1 depends on 7, which is not another step"):
        schedule_steps([set(), {7}], [1, 1])
    with pytest.raises(ValueError, match="2 steps but 1 costs"):
        schedule_steps([set(), set()], [1])
    with pytest.raises(ValueError, match="slack must be a fraction"):
        schedule_steps([set()], [1], slack=2)


def test_anchor_misses_of_a_profiled_run():
    t0 = 1_000_000
    timings = [StepTiming(0, "k0", 0, 0, t0, t0 + 10_000),
               StepTiming(1, "k1", 0, 1, t0 + 10_000, t0 + 40_000),      # two chunks: ends at 70 us
               StepTiming(1, "k1", 1, 2, t0 + 10_000, t0 + 70_000),
               StepTiming(2, "k2", 0, 0, t0 + 70_000, t0 + 75_000)]
    misses = anchor_misses(timings, {0: 10.0, 1: 50.0, 2: 100.0})
    assert misses == [AnchorMiss(1, "k1", 50.0, 70.0)] and misses[0].over_us == 20.0
    assert anchor_misses(timings, {}) == []
    with pytest.raises(ValueError, match="no step timings"):
        anchor_misses([], {0: 1.0})
