"""The arena planner: best-fit offsets with coalescing, in-place reuse, symbolic sizes that stay
right at every symbol value, alignment, statistics, and the waits that keep concurrently running
steps off each other's bytes."""
import random

import pytest
import sympy

from cuvil.ir.types import sym
from cuvil.memory_plan import ALIGN, BufferUse, plan_memory, round_up

s0, s1 = sym("s0"), sym("s1")


def use(name, nbytes, first, last, *readers, inplace_of=()):
    return BufferUse(name, nbytes, first, last, frozenset({first, last, *readers}), tuple(inplace_of))


def at(expr, **values) -> int:
    if isinstance(expr, int):
        return expr
    return int(sympy.sympify(expr).xreplace({sym(k): sympy.Integer(v) for k, v in values.items()}))


def hint_at(**values):
    return lambda e: at(e, **values)


def offsets(plan, **values):
    return {b.use.name: at(b.offset, **values) for b in plan.buffers}


# ----------------------------------------------------------------------------- hand-checked plans

def test_a_freed_gap_is_reused_and_its_users_are_waited_for():
    plan = plan_memory([use("a", 1000, 0, 1), use("b", 500, 1, 2), use("c", 900, 2, 3)], hint_at())
    assert offsets(plan) == {"a": 0, "b": 1024, "c": 0}
    assert plan.placed("c").reuses == "a" and plan.placed("b").reuses is None
    assert plan.placed("c").region == plan.placed("a").region != plan.placed("b").region
    assert plan.waits == {2: {0, 1}}                 # c's writer waits for a's writer and reader
    assert plan.arena_bytes == 1536 and plan.naive_bytes == 1024 + 512 + 960
    assert plan.peak_bytes == 1024 + 512


def test_buffers_live_at_the_same_step_never_share():
    plan = plan_memory([use("a", 64, 0, 2), use("b", 64, 1, 2), use("c", 64, 2, 3)], hint_at())
    assert sorted(offsets(plan).values()) == [0, 64, 128]
    assert plan.waits == {}


def test_best_fit_takes_the_smallest_hole_that_holds_the_buffer():
    uses = [use("B", 1024, 0, 2, 1), use("A", 256, 1, 9), use("D", 512, 2, 3), use("C", 256, 2, 9),
            use("X", 500, 4, 5), use("Y", 1000, 5, 6)]
    plan = plan_memory(uses, hint_at())
    # at step 4 A [1024, 1280) and C [1792, 2048) are live: holes of 1024 at 0 and 512 at 1280
    assert offsets(plan) == {"B": 0, "A": 1024, "D": 1280, "C": 1792, "X": 1280, "Y": 0}
    assert plan.placed("X").reuses == "D" and plan.placed("Y").reuses == "B"
    assert plan.waits == {4: {2, 3}, 5: {0, 1, 2}}
    assert plan.arena_bytes == 2048


def test_freed_neighbours_coalesce_into_one_hole():
    uses = [use("a", 512, 0, 1), use("b", 512, 0, 1), use("top", 256, 0, 5), use("d", 1024, 2, 3)]
    plan = plan_memory(uses, hint_at())
    assert offsets(plan)["d"] == 0 and offsets(plan)["top"] == 1024
    assert plan.arena_bytes == 1280                  # d fits under `top`: the arena does not grow
    assert plan.waits == {2: {0, 1}}


def test_a_ping_pong_chain_with_symbolic_sizes_has_polynomial_offsets():
    size = 1024 * s0
    uses = [use(f"b{i}", size, i, i + 1) for i in range(5)]
    plan = plan_memory(uses, hint_at(s0=8))
    assert [sympy.sympify(b.offset) for b in plan.buffers] == [0, size, 0, size, 0]
    assert [b.reuses for b in plan.buffers] == [None, None, "b0", "b1", "b2"]
    assert sympy.simplify(plan.arena_bytes - 2 * size) == 0 and sympy.simplify(plan.peak_bytes - 2 * size) == 0
    assert len(plan.region_bytes) == 2


def test_a_buffer_that_outgrows_its_gap_pushes_the_buffers_above_it_up():
    # at the hint (s0=64) `d` fits in a's 4096 bytes under `c`; for s0 < 32 it does not
    uses = [use("a", 64 * s0, 0, 1), use("c", 256, 0, 5), use("d", 2048, 2, 3)]
    plan = plan_memory(uses, hint_at(s0=64))
    assert offsets(plan, s0=64) == {"a": 0, "c": 4096, "d": 0}
    assert offsets(plan, s0=1) == {"a": 0, "c": 2048, "d": 0}
    assert sympy.simplify(plan.placed("c").offset - sympy.Max(64 * s0, 2048)) == 0
    for v in (1, 31, 32, 33, 64):
        assert at(plan.arena_bytes, s0=v) == max(64 * v, 2048) + 256


def test_alignment_option():
    uses = [use("a", 100, 0, 1), use("b", 10, 0, 2), use("c", 200, 2, 3)]
    plan = plan_memory(uses, hint_at(), align=256)
    assert offsets(plan) == {"a": 0, "b": 256, "c": 0} and plan.arena_bytes == 512
    assert round_up(1, 256) == 256 and round_up(257, 256) == 512 and at(round_up(4 * s0, 64), s0=17) == 128


def test_placing_the_largest_first_when_that_packs_better():
    uses = [use("a", 128, 0, 1), use("b", 64, 0, 2), use("c", 256, 2, 3)]
    # in step order a [0, 128) and b [128, 192) leave c a hole of 128: c would go on top (448 bytes);
    # largest first: c at 0, a under it too (they never meet), b on top of both
    plan = plan_memory(uses, hint_at())
    assert offsets(plan) == {"a": 0, "b": 256, "c": 0} and plan.arena_bytes == 320 == plan.peak_bytes


def test_the_naive_strategy_gives_every_buffer_bytes_of_its_own():
    uses = [use("a", 1000, 0, 1), use("b", 500, 1, 2), use("c", 900, 2, 3, inplace_of=["b"])]
    plan = plan_memory(uses, hint_at(), strategy="naive")
    assert offsets(plan) == {"a": 0, "b": 1024, "c": 1536}
    assert plan.arena_bytes == plan.naive_bytes == 2496 and plan.waits == {} and plan.inplace_reuses == 0
    with pytest.raises(ValueError, match="unknown memory planning strategy 'first-fit'"):
        plan_memory(uses, hint_at(), strategy="first-fit")


def test_steps_outside_the_lifetime_are_refused():
    with pytest.raises(ValueError, match="buffer a: steps .* first=2 to last=1"):
        plan_memory([BufferUse("a", 64, 2, 1, frozenset({1, 2}))], hint_at())


# ----------------------------------------------------------------------------- in place

def test_an_output_takes_the_bytes_of_an_input_that_dies_at_its_writer():
    # step 0 writes x; steps 1 and 2 read x; step 2 writes y in place of x; step 3 reads y
    uses = [use("x", 4096, 0, 2, 1), use("other", 64, 1, 3), use("y", 4096, 2, 3, inplace_of=["x"])]
    plan = plan_memory(uses, hint_at())
    y = plan.placed("y")
    assert y.inplace and y.reuses == "x" and y.offset == plan.placed("x").offset == 0
    assert plan.arena_bytes == 4096 + 64 and plan.peak_bytes == 4096 + 64
    assert plan.waits == {2: {0, 1}}                 # y's writer waits for x's other reader
    assert plan.statistics(hint_at())["inplace_reuses"] == 1
    without = plan_memory(uses, hint_at(), inplace=False)
    assert not without.placed("y").inplace and without.arena_bytes == 2 * 4096 + 64


@pytest.mark.parametrize("y", [use("y", 2048, 2, 3, inplace_of=["x"]),       # another size
                               use("y", 4096, 1, 3, inplace_of=["x"]),       # x lives on after y's writer
                               use("y", 4096, 2, 3, inplace_of=["%input"])])  # not a planned buffer
def test_in_place_is_refused_when_unsafe(y):
    plan = plan_memory([use("x", 4096, 0, 2, 1), y], hint_at())
    assert not plan.placed("y").inplace and plan.inplace_reuses == 0
    assert plan.placed("y").offset == 4096


def test_one_input_is_taken_over_in_place_by_one_output_only():
    uses = [use("x", 4096, 0, 2, 1), use("y", 4096, 2, 3, inplace_of=["x"]), use("z", 4096, 2, 4, inplace_of=["x"])]
    plan = plan_memory(uses, hint_at())
    assert plan.placed("y").inplace and not plan.placed("z").inplace
    assert offsets(plan) == {"x": 0, "y": 0, "z": 4096}


# ----------------------------------------------------------------------------- statistics

def test_statistics_at_given_sizes():
    uses = [use("a", 256 * s0, 0, 1), use("b", 128 * s0, 1, 2), use("c", 256 * s0, 2, 3)]
    plan = plan_memory(uses, hint_at(s0=4))
    stats = plan.statistics(hint_at(s0=2))
    assert stats["arena_bytes"] == 768 and stats["naive_bytes"] == 1280 and stats["peak_live_bytes"] == 768
    assert stats["fragmentation"] == 0.0 and stats["reused"] == 1 and stats["inplace_reuses"] == 0
    assert stats["arena_vs_naive"] == round(768 / 1280, 4) and stats["waits"] == 2
    # b [0, 192) dies at step 3, where c goes on top [192, 320); at step 4 a takes b's hole, and
    # what is left of it (64) is too small for d: d goes on top. Placing the largest first does
    # the same. 384 bytes would do (c, b, then a and d above c); fragmentation = 1 - 384 / 448.
    uses = [use("b", 192, 1, 3), use("c", 128, 3, 6), use("a", 128, 4, 5), use("d", 128, 4, 4)]
    frag = plan_memory(uses, hint_at())
    assert offsets(frag) == {"b": 0, "c": 192, "a": 0, "d": 320}
    assert frag.arena_bytes == 448 and frag.peak_bytes == 384
    assert frag.statistics(hint_at())["fragmentation"] == round(1 - 384 / 448, 4)


# ----------------------------------------------------------------------------- soundness, exhaustively

def _random_program(rng):
    uses = []
    for i in range(rng.randint(1, 25)):
        hosts = [u for u in uses if u.first < u.last]
        if hosts and rng.random() < 0.3:        # an output of a step that kills one of its inputs
            h = rng.choice(hosts)
            uses.append(use(f"b{i}", h.nbytes, h.last, h.last + rng.randint(0, 4), inplace_of=[h.name]))
            continue
        first = rng.randint(0, 20)
        last = first + rng.randint(0, 5)
        size = rng.choice([rng.randint(1, 5000), rng.randint(1, 64) * s0, rng.randint(1, 16) * s0 * s1 + 8,
                           rng.randint(1, 300) * s1, 4 * s0 + 3 * s1])
        readers = {rng.randint(first, last) for _ in range(2)}
        uses.append(use(f"b{i}", size, first, last, *readers))
    return uses


def _waits_for(waits, step) -> set:
    """Every step `step` waits for, directly or through the waits of the steps it waits for."""
    seen, todo = set(), [step]
    while todo:
        for w in waits.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


@pytest.mark.parametrize("seed", range(4))
def test_random_plans_never_overlap_live_buffers(seed):
    rng = random.Random(seed)
    for _ in range(12):
        uses = _random_program(rng)
        plan = plan_memory(uses, hint_at(s0=rng.randint(1, 64), s1=rng.randint(1, 64)), inplace=rng.random() < 0.8)
        for v0, v1 in ((1, 1), (3, 50), (64, 2), (64, 64), (17, 5)):
            arena = at(plan.arena_bytes, s0=v0, s1=v1)
            spans = [(b, at(b.offset, s0=v0, s1=v1), at(b.use.nbytes, s0=v0, s1=v1)) for b in plan.buffers]
            assert at(plan.naive_bytes, s0=v0, s1=v1) >= arena >= at(plan.peak_bytes, s0=v0, s1=v1)
            for b, off, n in spans:
                assert off % ALIGN == 0 and off + n <= arena
            for i, (b, off, n) in enumerate(spans):
                for c, off2, n2 in spans[i + 1:]:
                    if not (off < off2 + n2 and off2 < off + n):
                        continue
                    early, late = sorted((b, c), key=lambda p: (p.use.first, p.inplace))
                    if late.inplace and late.reuses == early.use.name:
                        assert off == off2 and early.use.last == late.use.first
                        assert early.use.steps - {late.use.first} <= _waits_for(plan.waits, late.use.first)
                        continue
                    # sharing bytes is fine only when the later buffer's writer waits for every step
                    # that touched the earlier one
                    assert early.use.last < late.use.first
                    assert early.use.steps <= _waits_for(plan.waits, late.use.first)
            _check_peak(plan, v0, v1)


def _check_peak(plan, v0, v1):
    """The peak is the most bytes live at one step (a buffer and the one taking it over in place
    counted once): computed here directly."""
    steps = {s for b in plan.buffers for s in b.use.steps}
    live = []
    for k in steps:
        here = [b for b in plan.buffers if b.use.first <= k <= b.use.last]
        hosts = {b.reuses for b in here if b.inplace and b.use.first == k}
        live.append(sum(at(round_up(b.use.nbytes), s0=v0, s1=v1) for b in here if b.use.name not in hosts))
    assert at(plan.peak_bytes, s0=v0, s1=v1) == max(live, default=0)
