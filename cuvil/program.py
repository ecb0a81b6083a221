"""From lowered kernels to the engine's Program.

    draft = ProgramDraft(fn, lowered, hint)      # the kernels in run order and what they read and write
    ...program-stage passes edit the draft...     # schedule: order and priorities; plan-memory: the arena
    build = build_program(draft, constants)      # slots, steps, deps, splits

The program binds each graph value to a slot: function arguments to input slots, `cuvil.const`
results to constant slots (the module's weights), returned values to output slots, and every
other buffer a kernel writes (values, and kernels' scratch buffers) to a region of one arena. A
step depends on the steps that wrote what it reads and, where it takes over arena bytes, on the
steps that used them before (`MemoryPlan.waits`). Without a schedule pass the steps run in
program order; without a plan-memory pass every buffer has bytes of its own (the naive plan).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from .codegen.aliasing import inplace_candidates
from .codegen.kernel_ir import Gemm, Kernel, Loop, Reduce, TopK
from .codegen.lower import LoweredKernel
from .errors import CuvilError
from .ir.core import Function, Operation, Value
from .ir.printer import value_names
from .ir.types import norm_dim, sym
from .memory_plan import BufferUse, MemoryPlan, plan_memory
from .runtime import Program, Slot, Split, Step

GEMM_FLOPS_PER_NS = 16     # one core, single precision, conservatively
NS_PER_STATEMENT = 1


class Sizes:
    """Values of a size expression at fixed symbol values (cached: the planner asks often)."""

    def __init__(self, values: dict[str, int]):
        self.values = {sym(k): sympy.Integer(v) for k, v in values.items()}
        self._cache: dict = {}

    def __call__(self, e) -> int:
        if isinstance(e, int):
            return e
        if e not in self._cache:
            self._cache[e] = int(sympy.sympify(e).xreplace(self.values))
        return self._cache[e]


# ----------------------------------------------------------------------------- costs


def iteration_cost_ns(kernel: Kernel, symbols: set[str]) -> Any:
    """Rough nanoseconds of one iteration of a kernel's parallel loop, as an expression over the
    program's symbols (inner extents that depend on loop variables are taken at variable 0)."""
    def at_zero(e):
        # loop variables go to 0 in each extent before the extents are combined: sympy is slow to
        # multiply out and simplify sums of products of Min(...) over loop variables
        e = sympy.sympify(e)
        return e.xreplace({s: sympy.Integer(0) for s in e.free_symbols if s.name not in symbols})
    total = _work(kernel.parallel_loop.body if kernel.parallel_loop else kernel.body, at_zero)
    # at least 1, left unevaluated: sympy's comparison of 1 with a sum of products of mins took
    # 40% of this function's time (the transformer block's kernels: 45 -> 27 ms)
    return max(1, int(total)) if total.is_Integer else sympy.Max(1, total, evaluate=False)


def _work(stmts, at_zero) -> Any:
    total = sympy.Integer(0)
    for s in stmts:
        if isinstance(s, Loop):
            total += at_zero(s.extent) * _work(s.body, at_zero)
        elif isinstance(s, Reduce):
            n = sympy.Integer(1)
            for r in s.loops:
                n *= at_zero(r.extent)
            total += n * (_work(s.body, at_zero) + NS_PER_STATEMENT)
        elif isinstance(s, Gemm):
            total += sympy.floor(2 * at_zero(s.m) * at_zero(s.n) * at_zero(s.k) / GEMM_FLOPS_PER_NS)
        elif isinstance(s, TopK):       # one look at each element of the row
            total += at_zero(s.n) * NS_PER_STATEMENT
        else:
            total += NS_PER_STATEMENT
    return total


# ----------------------------------------------------------------------------- the draft


@dataclass
class ProgramDraft:
    """The kernels of one function in run order, with their dataflow; what program passes edit.

    A buffer is keyed by its graph value's id, or by `kernel/buffer` for a kernel's scratch buffer.
    `priorities` (higher runs first among ready steps) and `plan` stay None until a pass sets them."""
    fn: Function
    lowered: list[LoweredKernel]
    hint: Sizes
    priorities: list[int] | None = None
    plan: MemoryPlan | None = None
    anchors_us: dict[int, float] = field(default_factory=dict)    # step -> max_latency_us
    same_code: dict[str, str] = field(default_factory=dict)   # kernel -> the first kernel sharing its code
    names: dict = field(init=False)

    def __post_init__(self):
        self.names = value_names(self.fn)
        self._costs: dict[str, Any] = {}
        self._analyse()

    # -- dataflow
    def _analyse(self) -> None:
        fn, names = self.fn, self.names
        external = {id(a) for a in fn.args} | {id(v) for v in fn.return_op.operands}
        self.keys: list[list] = []
        self.producer: dict[Any, int] = {}
        self.readers: dict[Any, set[int]] = {}
        self.arena: dict[str, tuple[Any, Any]] = {}      # planned buffer name -> (key, bytes)
        self.key_names: dict[Any, str] = {}
        for k, lk in enumerate(self.lowered):
            row = []
            for buf, v in zip(lk.kernel.buffers, lk.values):
                if buf.role == "status":    # no arena buffer: the runtime gives each call its own
                    key = f"{lk.kernel.name}/{buf.name}"
                elif v is None:
                    key = f"{lk.kernel.name}/{buf.name}"
                    self.arena[key] = (key, _nbytes(buf.shape, buf.dtype.itemsize))
                    self.producer[key] = k
                elif buf.role == "out":
                    key = id(v)
                    if key in self.producer:
                        raise CuvilError(f"internal error: %{names[v]} is written by two kernels "
                                         f"({self.lowered[self.producer[key]].kernel.name} and {lk.kernel.name})")
                    self.producer[key] = k
                    if key not in external:
                        self.arena["%" + names[v]] = (key, _nbytes(v.type.shape, v.type.dtype.itemsize))
                else:
                    key = id(v)
                    self.readers.setdefault(key, set()).add(k)
                    if key not in external and key not in self.producer and not _is_const(v):
                        raise CuvilError(f"internal error: kernel {lk.kernel.name} reads %{names[v]}, which no "
                                         f"earlier kernel writes")
                row.append(key)
                self.key_names[key] = key if v is None else ("@" + v.owner.attrs["name"]) if _is_const(v) \
                    else "%" + names[v]
            self.keys.append(row)
        missing = [names[v] for v in fn.return_op.operands if id(v) not in self.producer]
        if missing:
            raise CuvilError(f"internal error: output(s) %{', %'.join(missing)} are written by no kernel")

    def data_deps(self) -> list[set[int]]:
        """For each step, the steps that write what it reads."""
        return [{self.producer[key] for key, buf in zip(keys, lk.kernel.buffers) if buf.role == "in"
                 and key in self.producer} - {k} for k, (lk, keys) in enumerate(zip(self.lowered, self.keys))]

    def iteration_cost(self, kernel: Kernel) -> Any:
        """`iteration_cost_ns` of `kernel`, worked out once per code (the schedule and the splits both
        ask; the layers of a transformer share their kernels' code, and sympy makes each costly)."""
        key = self.same_code.get(kernel.name, kernel.name)
        if key not in self._costs:
            self._costs[key] = iteration_cost_ns(kernel, set(self.fn.symbols))
        return self._costs[key]

    def cost_ns(self) -> list[int]:
        """Each step's estimated time at the hint sizes."""
        out = []
        for lk in self.lowered:
            loop = lk.kernel.parallel_loop
            per = self.iteration_cost(lk.kernel)
            out.append(self.hint(norm_dim(per * loop.extent)) if loop is not None else self.hint(per))
        return out

    def step_kinds(self) -> list[str]:
        """Each step's class for the scheduler: gemm, reduction or elementwise."""
        def kind(stmts) -> str | None:
            for s in stmts:
                if isinstance(s, Gemm):
                    return "gemm"
                if isinstance(s, (Reduce, TopK)):
                    return "reduction"
                if isinstance(s, Loop) and (k := kind(s.body)):
                    return k
            return None
        return [kind(lk.kernel.body) or "elementwise" for lk in self.lowered]

    def buffer_uses(self) -> list[BufferUse]:
        """The arena buffers with their lifetimes over the current order, and for each buffer a kernel
        writes, the arena buffers of that kernel's inputs it could overwrite in place."""
        name_of = {key: name for name, (key, _) in self.arena.items()}
        uses = []
        for name, (key, nbytes) in self.arena.items():
            k = self.producer[key]
            touched = {k} | self.readers.get(key, set())
            uses.append(BufferUse(name, nbytes, k, max(touched), frozenset(touched),
                                  inplace_of=self._inplace_inputs(k, key, name_of)))
        return uses

    def _inplace_inputs(self, k: int, key, name_of: dict) -> tuple[str, ...]:
        kernel = self.lowered[k].kernel
        local = {buf.name: kk for buf, kk in zip(kernel.buffers, self.keys[k])}
        by_local = {kk: b for b, kk in local.items()}
        out = []
        for ins in inplace_candidates(kernel).get(by_local.get(key, ""), []):
            # another buffer of the kernel may read the same memory at another shape (an alias view)
            if local[ins] in name_of and list(local.values()).count(local[ins]) == 1:
                out.append(name_of[local[ins]])
        return tuple(out)

    # -- edits
    def reorder(self, order: list[int], priorities: list[int] | None = None) -> None:
        """Run the steps in `order` (a permutation of the current positions, respecting deps);
        `priorities` are given in the new order. The memory plan is dropped (lifetimes changed)."""
        if sorted(order) != list(range(len(self.lowered))):
            raise CuvilError(f"internal error: {order} is not an order of {len(self.lowered)} steps")
        position = {old: new for new, old in enumerate(order)}
        deps = self.data_deps()
        for new, old in enumerate(order):
            if any(position[d] > new for d in deps[old]):
                raise CuvilError(f"internal error: order {order} runs step {old} before a step it reads from")
        self.lowered = [self.lowered[i] for i in order]
        self.anchors_us = {position[k]: v for k, v in self.anchors_us.items()}
        self.priorities = priorities
        self.plan = None
        self._analyse()

    # -- text
    def text(self) -> str:
        """The draft as text: steps in order, with deps and priorities, then the arena plan."""
        lines = [f"program @{self.fn.name} ({len(self.lowered)} steps)"]
        deps = self.data_deps()
        for k, lk in enumerate(self.lowered):
            reads = [self.key_names[key] for key, b in zip(self.keys[k], lk.kernel.buffers) if b.role == "in"]
            writes = [self.key_names[key] for key, b in zip(self.keys[k], lk.kernel.buffers)
                      if b.role in ("out", "scratch")]
            prio = "" if self.priorities is None else f" priority={self.priorities[k]}"
            anchor = f" max_latency_us={self.anchors_us[k]:g}" if k in self.anchors_us else ""
            lines.append(f"  step {k} {lk.kernel.name}({', '.join(reads)}) -> {', '.join(writes)}"
                         f" deps={sorted(deps[k])}{prio}{anchor}")
        if self.plan is not None:
            lines.append(f"  arena {self.plan.arena_bytes} bytes (naive {self.plan.naive_bytes})")
            for b in self.plan.buffers:
                reuse = f" reuses {b.reuses}{' in place' if b.inplace else ''}" if b.reuses else ""
                lines.append(f"    {b.use.name} @ {b.offset} size {b.use.nbytes} "
                             f"steps {b.use.first}..{b.use.last}{reuse}")
        return "\n".join(lines) + "\n"


def _is_const(v: Value) -> bool:
    return isinstance(v.owner, Operation) and v.owner.name == "cuvil.const"


def _nbytes(shape, itemsize: int):
    n: Any = itemsize
    for d in shape:
        n = n * d
    return norm_dim(n)


# ----------------------------------------------------------------------------- the program


@dataclass
class SlotInfo:
    """What a program slot holds, for the report."""
    kind: str
    name: str          # the printed IR value (`%x`, `%12`), `@weight`, or `kernel/scratch`


@dataclass
class ProgramBuild:
    program: Program
    plan: MemoryPlan
    slots: list[SlotInfo]
    anchors_us: dict[int, float] = field(default_factory=dict)


def build_program(draft: ProgramDraft, constants: dict[str, torch.Tensor],
                  entry: dict[str, str] | None = None) -> ProgramBuild:
    """Slots, steps, deps, splits and the arena of `draft`; `entry` renames kernels that share code."""
    entry = entry or {}
    fn, names = draft.fn, draft.names
    slots: list[Slot] = []
    infos: list[SlotInfo] = []
    slot_of: dict[Any, int] = {}

    def add(slot: Slot, info: SlotInfo, key) -> None:
        slots.append(slot)
        infos.append(info)
        slot_of[key] = len(slots) - 1

    for i, a in enumerate(fn.args):
        add(Slot.input(i, a.type), SlotInfo("input", "%" + names[a]), id(a))
    for i, v in enumerate(fn.return_op.operands):
        add(Slot.output(i, v.type), SlotInfo("output", "%" + names[v]), id(v))
    for lk, keys in zip(draft.lowered, draft.keys):
        for buf, v, key in zip(lk.kernel.buffers, lk.values, keys):
            if v is not None and buf.role == "in" and _is_const(v) and id(v) not in slot_of:
                add(Slot.const(_constant(constants, v)), SlotInfo("const", "@" + v.owner.attrs["name"]), id(v))
            elif buf.role == "status":
                add(Slot.status(lk.checks), SlotInfo("status", key), key)

    plan = draft.plan or plan_memory(draft.buffer_uses(), draft.hint, strategy="naive")
    for b in plan.buffers:
        add(Slot.arena(b.offset, b.use.nbytes), SlotInfo("arena", b.use.name), draft.arena[b.use.name][0])

    data = draft.data_deps()
    deps_of = [(d | plan.waits.get(k, set())) - {k} for k, d in enumerate(data)]
    n = len(draft.lowered)
    priorities = draft.priorities or [n - k for k in range(n)]     # no schedule pass: program order
    symbols = set(fn.symbols)
    steps = []
    for lk, keys, deps, priority in zip(draft.lowered, draft.keys, deps_of, priorities):
        kernel = lk.kernel
        split = None
        if kernel.parallel_loop is not None:
            split = Split(len(kernel.dim_exprs) - 1, _cost_expr(draft.iteration_cost(kernel), symbols, draft.hint))
        steps.append(Step(entry.get(kernel.name, kernel.name), [slot_of[key] for key in keys],
                          list(kernel.dim_exprs), sorted(deps), priority, split))
    program = Program([a.type for a in fn.args], [v.type for v in fn.return_op.operands], slots, steps,
                      plan.arena_bytes, dict(fn.symbols), [a.name or f"arg{i}" for i, a in enumerate(fn.args)])
    return ProgramBuild(program, plan, infos, dict(draft.anchors_us))


def _constant(constants: dict[str, torch.Tensor], v: Value) -> torch.Tensor:
    name = v.owner.attrs["name"]
    if name not in constants:
        raise CuvilError(f"constant @{name} has no data in the module (a module parsed from text carries "
                         f"only the names of its weights); set module.constants[{name!r}]")
    t = constants[name].detach()
    if tuple(t.shape) != tuple(v.type.shape) or t.dtype != v.type.dtype.torch:
        raise CuvilError(f"constant @{name} is {t.dtype}{list(t.shape)} but the IR declares it {v.type}")
    return t.contiguous()


def _cost_expr(cost, symbols: set[str], hint: Sizes):
    """A split's per-iteration cost as the runtime will evaluate it."""
    from .runtime.exprs import to_postfix
    try:
        to_postfix(cost, {s: i for i, s in enumerate(symbols)})
        return cost
    except ValueError:      # an expression the runtime cannot evaluate: take its value at the hint sizes
        return max(1, hint(cost))
