"""The arena planner: reuse of freed regions, symbolic sizes, alignment, and the waits that keep
concurrently running steps off each other's memory."""
import random

import sympy

from cuvil.ir.types import sym
from cuvil.memory_plan import ALIGN, BufferUse, plan_memory, round_up

s0, s1 = sym("s0"), sym("s1")


def use(name, nbytes, first, last, *readers):
    return BufferUse(name, nbytes, first, last, frozenset({first, last, *readers}))


def at(expr, **values) -> int:
    if isinstance(expr, int):
        return expr
    return int(sympy.sympify(expr).xreplace({sym(k): sympy.Integer(v) for k, v in values.items()}))


def hint_at(**values):
    return lambda e: at(e, **values)


def test_a_freed_region_is_reused_and_its_users_are_waited_for():
    plan = plan_memory([use("a", 1000, 0, 1), use("b", 500, 1, 2), use("c", 900, 2, 3)], hint_at())
    a, b, c = (plan.placed(n) for n in "abc")
    assert c.region == a.region and c.reuses == "a" and b.region != a.region
    assert plan.waits == {2: {0, 1}}                 # c's writer waits for a's writer and reader
    assert plan.arena_bytes == round_up(1000) + round_up(500) == 1536
    assert plan.naive_bytes == 1024 + 512 + 960


def test_buffers_live_at_the_same_step_never_share():
    plan = plan_memory([use("a", 64, 0, 2), use("b", 64, 1, 2), use("c", 64, 2, 3)], hint_at())
    assert len({plan.placed(n).region for n in "abc"}) == 3
    assert plan.waits == {}


def test_best_fit_picks_the_smallest_region_that_fits():
    uses = [use("big", 4096, 0, 1), use("small", 256, 0, 1), use("x", 200, 2, 3)]
    plan = plan_memory(uses, hint_at())
    assert plan.placed("x").reuses == "small"


def test_symbolic_sizes_take_the_max_of_what_a_region_holds():
    uses = [use("a", 4 * s0 * s1, 0, 1), use("b", 64 * s1, 1, 2), use("c", 256 * s1, 2, 3)]
    plan = plan_memory(uses, hint_at(s0=64, s1=128))
    assert plan.placed("c").region == plan.placed("a").region
    region = plan.region_bytes[plan.placed("a").region]
    for v0, v1 in ((1, 1), (1, 128), (64, 1), (64, 128)):
        size = at(region, s0=v0, s1=v1)
        assert size >= max(4 * v0 * v1, 256 * v1) and size % ALIGN == 0


def test_random_plans_never_overlap_live_buffers():
    rng = random.Random(0)
    for _ in range(30):
        uses = []
        for i in range(rng.randint(1, 25)):
            first = rng.randint(0, 20)
            last = first + rng.randint(0, 5)
            size = rng.choice([rng.randint(1, 5000), rng.randint(1, 64) * s0, rng.randint(1, 16) * s0 * s1 + 8,
                               rng.randint(1, 300) * s1])
            readers = {rng.randint(first, last) for _ in range(2)}
            uses.append(use(f"b{i}", size, first, last, *readers))
        plan = plan_memory(uses, hint_at(s0=rng.randint(1, 64), s1=rng.randint(1, 64)))
        for v0, v1 in ((1, 1), (3, 50), (64, 2), (64, 64)):
            arena = at(plan.arena_bytes, s0=v0, s1=v1)
            spans = [(b, at(b.offset, s0=v0, s1=v1), at(b.use.nbytes, s0=v0, s1=v1)) for b in plan.buffers]
            assert at(plan.naive_bytes, s0=v0, s1=v1) >= arena
            for b, off, n in spans:
                assert off % ALIGN == 0 and off + n <= arena
            for i, (b, off, n) in enumerate(spans):
                for c, off2, n2 in spans[i + 1:]:
                    overlap = off < off2 + n2 and off2 < off + n
                    if not overlap:
                        continue
                    # sharing memory is fine only when the later buffer's writer waits for every
                    # step that touched the earlier one (overlap means one region: a chain of waits)
                    early, late = sorted((b, c), key=lambda p: p.use.first)
                    assert early.use.last < late.use.first
                    assert _waits_for(plan.waits, late.use.first, early.use.steps)


def _waits_for(waits, step, steps) -> bool:
    """`step` waits, directly or through the waits of the region's later buffers, for all of `steps`."""
    seen, todo = set(), [step]
    while todo:
        for w in waits.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return steps <= seen
