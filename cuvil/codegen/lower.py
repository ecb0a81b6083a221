"""Graph IR -> kernel IR: one kernel per group of ops.

A group is a set of graph ops lowered into ONE kernel: an elementwise chain with broadcasting,
views/slices/permutes folded into load indexing, reductions with their prologue and epilogue
(softmax, layer_norm, ..., and written-out ones: `x * rsqrt(mean(x*x) + eps)`, several reductions
over the same axes), window ops (pooling, direct convolution), or one GEMM-based op (matmul,
linear, conv via im2col) with an elementwise epilogue. `group_legality` says which groups these
are; the fuse pass (cuvil/passes/fuse.py) chooses them.

How a group becomes loops:

- The iteration space is the shape of the group's outputs (elementwise), or of the reductions'
  input with the reduced axes split off (reductions). All outer dims but the last are flattened
  into one parallel loop; the runtime splits it across threads.
- Every value is produced on demand at an index (`value(v, idx)`): a group input is a load, an
  elementwise op is its scalar emitter (`scalar_ops`) applied to its operands at the broadcast
  index, a view maps the index to its operand's index, a reduction is a `Reduce` statement
  emitted once per outer iteration (an epilogue reads its result as a scalar of that iteration).
  A value used more than once at the same index becomes a `Let`.
- GEMM-based ops (`library.py`) bring their own parallel loop; the group's epilogue runs inside
  it over the block of the output each iteration computed.
- Every statement and expression records the graph op it was built for (`origin`, stamped as soon
  as the op's part is built: `GroupLowering.built_by`), for the report's per-op provenance.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import re
from dataclasses import dataclass, field
from typing import Callable

import sympy

from ..errors import CuvilUnsupportedOpError, CuvilVerifyError
from ..index_inputs import index_outside
from ..ir.core import Function, Operation, Value
from ..ir.ops.common import is_one
from ..ir.ops.layout import RESHAPES
from ..ir.types import DType, bounds, dim_str, dims_equal, norm_dim
from . import scalar_ops
from .index_math import (TRANSPOSE_TILE, Bounds, broadcast_index, decompose, floor_div, index_max, index_min,
                         modulo, reshape_groups, tile_extent)
from .kernel_ir import (Buffer, Check, Const, Expr, Index, Kernel, Let, Load, Loop, Range, Reduce, Store, Var,
                        compute_dtype, free_symbols, identity, index_names, loop_var, stamp)
from .library import LIBRARY, WINDOW_OPS, classify, gathered_operands, pool_in_tiles_problem
from .reductions import (LANE_TILE, MIN_LANES, REDUCTION_BODIES, REDUCTION_EPILOGUES, ColumnLanes,
                         reduction_space)
from .scalar_ops import call, cast, const
from .target import Target

MIN_RUN = 8      # a merged dim's runs shorter than a vector of floats keep one loop
ROW_TILE = 16    # the run of an output row a column reduction's transposing store loop writes

INLINE_OPS = frozenset({"cuvil.literal", "cuvil.size", "cuvil.full", "cuvil.arange"})
REDUCTIONS = frozenset({"cuvil.sum", "cuvil.mean", "cuvil.amax", "cuvil.amin", "cuvil.prod", "cuvil.var",
                        "cuvil.argmax", "cuvil.argmin", "cuvil.softmax", "cuvil.log_softmax", "cuvil.layer_norm",
                        "cuvil.rms_norm"})
SKIP_OPS = frozenset({"cuvil.const", "cuvil.return"})


def _natural(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


# ----------------------------------------------------------------------------- classification

def cat_offsets(op: Operation) -> list:
    """Where each piece of a cat starts along its dim."""
    d, offsets, at = op.attrs["dim"], [], sympy.Integer(0)
    for x in op.operands:
        offsets.append(at)
        at = at + x.type.shape[d]
    return offsets


def _moves_elements(permute: Operation) -> bool:
    """Whether a permute changes the order of its operand's elements: it moves dims of more than
    one element past each other (a per-channel constant [1, C, 1, 1] permuted to NHWC does not)."""
    shape = permute.operands[0].type.shape
    moved = [d for d in permute.attrs["perm"] if shape[d] != 1]
    return moved != sorted(moved)


def op_kind(op: Operation) -> str:
    """How the lowering treats an op: inline, elementwise, view, reduction, window, library, or
    unsupported."""
    name = op.name
    kind = _KIND_OF_NAME.get(name)     # (the fuse pass asks millions of times of a large model)
    if kind is None:
        kind = _op_kind(name, op)
        if kind != "unsupported" and name != "cuvil.conv2d":     # a conv's algorithm follows its attributes
            _KIND_OF_NAME[name] = kind
    return kind


_KIND_OF_NAME: dict[str, str] = {}


def _op_kind(name: str, op: Operation) -> str:
    if name in INLINE_OPS:
        return "inline"
    if name in REDUCTIONS:
        return "reduction"
    if name in VIEWS or name in ("cuvil.cat", "cuvil.slice_scatter", "cuvil.triu", "cuvil.tril"):
        return "view"
    if name in scalar_ops.EMITTERS or name in ("cuvil.check_index", "cuvil.check_true"):   # `_elementwise`
        return "elementwise"
    if name in GATHERS:
        return "gather"
    return classify(op) or "unsupported"


REMATERIALIZED = frozenset({"inline", "view"})
# set by the fuse pass on a view that its readers load from memory rather than recompute
# (concatenations nested too deep: `fuse.MAX_NESTED_CATS`)
KEPT_ATTR = "fuse.in_memory"


def recomputed(op: Operation) -> bool:
    """Whether the kernels that read op's result compute it themselves (a view or inline constant
    not kept in memory)."""
    return op_kind(op) in REMATERIALIZED and not op.attrs.get(KEPT_ATTR)


def alias_base(v: Value) -> Value | None:
    """The value whose memory `v` reads, when `v` needs no kernel of its own: a reshape (squeeze,
    unsqueeze) lists the elements of its operand in their order, so where the operand is in memory
    (an argument, a weight, a value a kernel computes, or another such view of one) it is the
    operand's buffer read at another shape. A gather's table or a GEMM's operand read so was
    copied first (`hidden.view(-1, d)[rows]`: the whole hidden state per lookup). None for any
    other value, and for a returned one, which gets a buffer of its own."""
    op = v.owner
    if not isinstance(op, Operation) or op.name not in RESHAPES or any(u.name == "cuvil.return" for u in v.uses):
        return None
    src = op.operands[0]
    owner = src.owner
    if isinstance(owner, Function) or owner.name == "cuvil.const" or not recomputed(owner):
        return src
    return alias_base(src)


def stored(v: Value) -> Value:
    """The value whose buffer holds `v` (`alias_base`, else v itself)."""
    return alias_base(v) or v


def needs_memory(op: Operation, live: set[int]) -> bool:
    """Some live user (`live`: ids, `grouping.live_ops`) reads op's result from memory: a return, or
    an operand outside `fusible_operands`; but for an alias view (`alias_base`), whose readers read
    its operand's memory. A view the fuse pass keeps in memory (`KEPT_ATTR`) always does."""
    if op.attrs.get(KEPT_ATTR):
        return True
    if op.results and alias_base(op.results[0]) is not None:
        return False
    return any(u.name == "cuvil.return" or (id(u) in live and not any(o is r for o in fusible_operands(u)))
               for r in op.results for u in r.uses)


def fusible_operands(op: Operation) -> list[Value]:
    """The operands of op whose producers may be computed inside op's kernel. The others are read
    from memory: the operands BLAS reads in a GEMM-based op (an im2col convolution gathers its
    input element by element, so that one may be computed, e.g. a fused permute), and the table of a gather
    (read at a data-dependent index, which on-demand recomputation cannot follow), and a copy's
    operand: a copy duplicates a buffer (a value returned twice), and a view it read through would
    be recomputed from a value its own kernel may not have stored."""
    if op.name == "cuvil.copy":
        return []
    kind = op_kind(op)
    if kind == "library":
        return gathered_operands(op)
    if kind == "unsupported":
        return []
    return list(op.operands[1:]) if kind == "gather" else list(op.operands)


def group_outputs(fn: Function, ops: list[Operation]) -> list[Value]:
    """The results of a group that its kernel stores: those returned or used outside the group,
    but for views and inline constants that are not the group's last op (recomputed by readers)."""
    members = {id(op) for op in ops}
    returned = {id(v) for v in fn.return_op.operands}
    last = max(ops, key=fn.ops.index) if ops else None
    return [r for op in ops if not (op_kind(op) in REMATERIALIZED and op is not last) for r in op.results
            if id(r) in returned or any(id(u) not in members for u in r.uses)]


@dataclass(frozen=True)
class Refusal:
    """Why ops cannot share one kernel: a rule id (kebab-case, docs/passes.md#fuse) and one sentence."""
    rule: str
    reason: str

    def __str__(self) -> str:
        return self.reason


def shape_text(shape) -> str:
    """`s0x128` (`scalar` for rank 0): how fusion decisions print shapes."""
    return "x".join(dim_str(d) for d in shape) or "scalar"


def _same_shape(a, b) -> bool:
    return len(a) == len(b) and all(map(dims_equal, a, b))


def _reshapes(shape, full, axes) -> bool:
    """Whether a tensor of `shape` is a reshape of one of `full` (as many elements, another shape)
    and not of the shape a reduction over `axes` of `full` gives (with or without keepdim: empty,
    or with the reduced dims 1, those have as many elements too)."""
    kept = [1 if k in axes else d for k, d in enumerate(full)]
    reduced = [d for k, d in enumerate(full) if k not in axes]
    if any(_same_shape(shape, s) for s in (full, kept, reduced)):
        return False
    n, m = sympy.Integer(1), sympy.Integer(1)
    for d in shape:
        n = n * d
    for d in full:
        m = m * d
    return sympy.expand(n - m) == 0


def reshape_index(in_shape, out_shape, idx, known: Bounds) -> list:
    """The operand index of a reshape, group by group: dims that merge or split into each other
    (`reshape_groups`) are linearised and split by the operand's strides within their group
    only, and a dim kept whole passes its index through. One group of all the dims where they
    do not pair up (sizes whose ratio is not known to be whole)."""
    out = [sympy.Integer(0)] * len(in_shape)
    for ins, outs in reshape_groups(in_shape, out_shape):
        linear, acc = sympy.Integer(0), sympy.Integer(1)
        for k in reversed(outs):
            linear, acc = linear + sympy.sympify(idx[k]) * acc, acc * out_shape[k]
        acc = sympy.Integer(1)
        for pos, k in enumerate(reversed(ins)):
            q = linear if acc == 1 else floor_div(linear, acc, known)
            out[k] = q if pos == len(ins) - 1 else modulo(q, in_shape[k], known)
            acc = acc * in_shape[k]
    return out


def group_legality(fn: Function, ops: list[Operation]) -> Refusal | None:
    """None when `lower_group` computes the group correctly, else the rule it breaks and why.

    Values read from memory must come from outside the group (an inline constant read so gets a
    kernel of its own: `grouping.kernel_roots`). A GEMM-based op's epilogue runs inside the GEMM's parallel loop over the block
    of the product each iteration computed, so everything that reads the product in the group must
    read it at that same index: only elementwise ops of the product's shape, and every output of
    the group must have that shape too. A window op or a view of the product would read elements
    another iteration computes. Reductions: see `_reduction_legality`."""
    members = {id(op) for op in ops}
    # views the group recomputes for their readers in it; one that an op also reads from memory is
    # stored by a kernel of its own too (`needs_memory`), which that op reads
    rematerialized = {id(f.owner) for op in ops for f in fusible_operands(op)
                      if isinstance(f.owner, Operation) and id(f.owner) in members and recomputed(f.owner)}
    for op in ops:
        if op_kind(op) == "unsupported":
            return Refusal("lowering", f"{op.name} has no native lowering")
        fusible = fusible_operands(op)
        for v in op.operands:
            if any(v is f for f in fusible) or isinstance(v.owner, Function):
                continue
            v = stored(v)
            if isinstance(v.owner, Operation) and id(v.owner) in members and id(v.owner) not in rematerialized:
                what = "its table" if op_kind(op) == "gather" else "its operands"
                return Refusal("memory-operand", f"{op.name} reads {what} from memory, but {v.owner.name} is "
                                                 f"computed in the group (it needs a kernel of its own)")
    roots = [op for op in ops if op_kind(op) == "library"]
    if not roots:
        return _reduction_legality(fn, ops, members)
    root = roots[0]
    if len(roots) > 1:
        return Refusal("two-gemms", f"two GEMM-based ops ({root.name}, {roots[1].name}) cannot share one kernel")
    reduction = next((op for op in ops if op_kind(op) == "reduction"), None)
    if reduction is not None:
        return Refusal("gemm-epilogue", f"{root.name} can only be fused with an elementwise epilogue, "
                                        f"not with {reduction.name}")
    frames = epilogue_frames(root, members)
    if isinstance(frames, Refusal):
        return frames
    shape = root.result.type.shape
    pooled = any(isinstance(f, Windowed) for f in frames.values())
    for v in group_outputs(fn, ops):
        if pooled and not isinstance(frames.get(id(v)), Windowed):
            return Refusal("gemm-epilogue", f"{root.name}'s epilogue pools its product, which it then does not "
                                            f"store: {v.owner.name}'s result, of the product's shape, is read "
                                            f"outside the group")
        want = frame_shape(shape, frames.get(id(v)))
        if not _same_shape(v.type.shape, want):
            return Refusal("shape", f"shape {shape_text(v.type.shape)} vs {shape_text(want)}: an output of "
                                    f"{v.owner.name} differs from the shape of {root.name}'s epilogue")
    return None


def permuted(shape, perm: tuple | None) -> list:
    return list(shape) if perm is None else [shape[k] for k in perm]


@dataclass(frozen=True)
class Windowed:
    """The frame of values a GEMM-based op's epilogue computes per window of a pool over its
    product, which its tiles hold whole (`library.pool_in_tiles_problem`): indexed as the pool's
    result (`shape`), permuted by `perm` behind a permute of it (the layout pass's conversion
    back to NCHW at the end of an NHWC region), stored so (`store_perm`)."""
    shape: tuple
    perm: tuple | None = None


def frame_shape(shape, frame) -> list:
    """The shape of the values of frame `frame` after a product of shape `shape`."""
    return permuted(frame.shape, frame.perm) if isinstance(frame, Windowed) else permuted(shape, frame)


def frame_perm(frame) -> tuple | None:
    """The permutation an output of frame `frame` is stored at, from the index its epilogue walks."""
    return frame.perm if isinstance(frame, Windowed) else frame


def epilogue_frames(root: Operation, members: set[int]) -> dict[int, tuple | None] | Refusal:
    """How each value after a GEMM-based `root` in its group is indexed (id -> frame), or why the
    group's epilogue cannot compute it. Frame None: at the product's own index (elementwise ops of
    its shape). A permutation `perm`: at the product's index permuted, behind one permute view of
    a linear's product that makes the rows' last dim the last (an NHWC linear's result converted to
    NCHW and added to the residual, ConvNeXt's block's end); the group then stores those outputs
    transposed (`library._transposed_epilogue`) and needs that dim static. `Windowed`: at the index
    of one pool's result, a pool whose windows the convolution's tiles hold whole (a CNN's stem's
    2x2 max pool), and of elementwise ops after it."""
    shape = root.result.type.shape
    frames: dict[int, tuple | None] = {id(root.result): None}
    stack = [root.result]
    while stack:
        v = stack.pop()
        frame = frames[id(v)]
        for u in v.uses:
            if id(u) not in members:
                continue
            if u.name == "cuvil.permute" and frame is None and _stores_transposed(root, u):
                new = tuple(u.attrs["perm"])
            elif op_kind(u) == "elementwise" and _same_shape(u.results[0].type.shape, frame_shape(shape, frame)):
                new = frame
            elif u.name == "cuvil.permute" and isinstance(frame, Windowed) and frame.perm is None:
                new = Windowed(frame.shape, tuple(u.attrs["perm"]))
            elif frame is None and u.name in WINDOW_OPS and u.name != "cuvil.conv2d":
                problem = pool_in_tiles_problem(root, u)
                if problem is not None:
                    return Refusal("gemm-epilogue", f"{u.name} reads the result of {root.name} in its epilogue: "
                                                    f"{problem}")
                if any(isinstance(f, Windowed) for f in frames.values()):
                    return Refusal("gemm-epilogue", f"{root.name}'s epilogue runs one pool over its product, "
                                                    f"not two")
                new = Windowed(tuple(u.results[0].type.shape))
            elif u.name == "cuvil.permute" and root.name == "cuvil.linear":
                return Refusal("gemm-epilogue", f"{u.name} reads the result of {root.name} in its epilogue, which "
                                                f"stores a permute of the product only where it puts the rows' "
                                                f"last dim, a static one, last")
            else:
                return Refusal("gemm-epilogue", f"{u.name} reads the result of {root.name} in its epilogue, which "
                                                f"sees only the block of the product one parallel iteration "
                                                f"computed; only elementwise ops of its shape can")
            r = u.results[0]
            if id(r) in frames:
                if frames[id(r)] != new:
                    return Refusal("gemm-epilogue", f"{u.name} reads {root.name}'s product both in its order and "
                                                    f"permuted; its epilogue computes each element at one index")
                continue
            frames[id(r)] = new
            stack.append(r)
    if len({f for f in frames.values() if isinstance(f, tuple)}) > 1:
        return Refusal("gemm-epilogue", f"{root.name}'s epilogue stores its product in two permuted orders")
    return frames


def _stores_transposed(root: Operation, permute: Operation) -> bool:
    """Whether the group of linear `root` can store `permute` of its product: the permute puts the
    rows' last dim (static) last and moves the columns away from it."""
    perm, shape = list(permute.attrs["perm"]), root.result.type.shape
    return (root.name == "cuvil.linear" and len(shape) >= 2 and perm[-1] == len(shape) - 2
            and isinstance(shape[-2], int) and _moves_elements(permute))


def _reduction_legality(fn: Function, ops: list[Operation], members: set[int]) -> Refusal | None:
    """A group with reductions is one loop nest over the reductions' outer (kept) axes: per outer
    index it folds each reduction (in program order, so one may read another), then stores the
    outputs of the reduced shape and, in an inner loop over the reduced axes, those of the full
    shape. So all reductions iterate the same space, every output has the full, the kept (keepdim)
    or the reduced shape, or is a reshape of the full shape (a group norm's affine and activation
    after the reshape back to the channels, stored in the full shape's loop), and every read of a
    reduction's result inside the group must be at the current outer index: through elementwise
    ops (broadcasting) and index-remapping views only. Anything else would need the reduction at
    another outer index, i.e. recomputing it."""
    reductions = [op for op in ops if op_kind(op) == "reduction"]
    if not reductions:
        return None
    first = reductions[0]
    full, axes = reduction_space(first)
    for r in reductions[1:]:
        f2, a2 = reduction_space(r)
        if not _same_shape(f2, full):
            return Refusal("shape", f"shape {shape_text(f2)} vs {shape_text(full)}: {r.name} and {first.name} reduce "
                                    f"tensors of different shapes (one kernel folds over one index space)")
        if a2 != axes:
            return Refusal("shape", f"axes {a2} vs {axes}: {r.name} and {first.name} reduce different axes of "
                                    f"{shape_text(full)} (one kernel folds over one index space)")
    outer = [k for k in range(len(full)) if k not in axes]
    kept = [1 if k in axes else full[k] for k in range(len(full))]
    reduced = [full[k] for k in outer]
    outputs = group_outputs(fn, ops)
    for v in outputs:
        if not _same_shape(v.type.shape, full) and not _same_shape(v.type.shape, kept) \
                and not _same_shape(v.type.shape, reduced) and not _reshapes(v.type.shape, full, axes):
            return Refusal("shape", f"shape {shape_text(v.type.shape)} vs {shape_text(full)}: an output of "
                                    f"{v.owner.name} is neither the reductions' input shape, a reshape of it, nor "
                                    f"their result shape {shape_text(reduced)}")
    # (a dim of one element is index 0: a reshape's index maps give 0 there)
    i = [sympy.Integer(0) if is_one(full[k]) else sympy.Symbol(f"_fuse_i{k}", integer=True, nonnegative=True)
         for k in range(len(full))]
    known: Bounds = {s: (sympy.Integer(0), sympy.sympify(d) - 1) for s, d in zip(i, full)     # (none for an empty dim)
                     if isinstance(s, sympy.Symbol) and not (isinstance(d, int) and d == 0)}
    stack = []
    for v in outputs:
        if _same_shape(v.type.shape, full):
            stack.append((v, list(i)))
        elif _reshapes(v.type.shape, full, axes):
            stack.append((v, reshape_index(v.type.shape, full, i, known)))
        elif len(v.type.shape) == len(full):
            stack.append((v, [0 if k in axes else i[k] for k in range(len(full))]))
        else:
            stack.append((v, [i[k] for k in outer]))
    seen = set()
    while stack:
        v, idx = stack.pop()
        op = v.owner
        if isinstance(op, Function) or id(op) not in members:
            continue
        key = (id(v), None if idx is None else tuple(map(sympy.sympify, idx)))
        if key in seen:
            continue
        seen.add(key)
        kind = op_kind(op)
        if kind == "reduction":
            at = [sympy.sympify(e) for e in idx] if idx is not None else None
            want = [i[k] for k in outer]
            got = None if at is None else ([at[k] for k in outer] if len(at) == len(full) else at)
            if got != want:
                return Refusal("reduction-recompute", f"would recompute a reduction: {op.name} is read at an index "
                                                      f"other than the outer index of the kernel's loop")
            stack.append((op.operands[0], list(i)))
            stack.extend((o, None) for o in op.operands[1:])
        elif idx is not None and kind == "elementwise" and op.name != "cuvil.batch_norm":
            shape = op.results[0].type.shape
            stack.extend((o, broadcast_index(idx, shape, o.type.shape)) for o in op.operands)
        elif idx is not None and op.name == "cuvil.reshape":
            stack.append((op.operands[0], reshape_index(op.operands[0].type.shape, v.type.shape, idx, known)))
        elif idx is not None and VIEWS.get(op.name) is not None:
            stack.append((op.operands[0], VIEWS[op.name](op, idx, v)[0]))
        else:
            stack.extend((o, None) for o in op.operands)
    return None


def can_group(fn: Function, ops: list[Operation]) -> bool:
    return group_legality(fn, ops) is None


# ----------------------------------------------------------------------------- views

def _permute(op, idx, v):
    out = [None] * len(idx)
    for k, p in enumerate(op.attrs["perm"]):
        out[p] = idx[k]
    return [out]


def _expand(op, idx, v):
    src = op.operands[0].type.shape
    out_shape = v.type.shape
    lead = len(out_shape) - len(src)
    return [[0 if is_one(d) and not is_one(out_shape[lead + k]) else idx[lead + k] for k, d in enumerate(src)]]


def slice_start(op) -> sympy.Expr:
    size = op.operands[0].type.shape[op.attrs["dim"]]
    start = norm_dim(op.attrs["start"][0])
    if isinstance(start, int) and start < 0:
        start = norm_dim(sympy.sympify(size) + start)
    if isinstance(start, int) and isinstance(size, int):
        start = min(max(start, 0), size)
    return start


def _slice(op, idx, v):
    d = op.attrs["dim"]
    out = list(idx)
    out[d] = slice_start(op) + op.attrs["step"] * sympy.sympify(idx[d])
    return [out]


def _flip(op, idx, v):
    out = list(idx)
    for d in op.attrs["dims"]:
        out[d] = sympy.sympify(op.operands[0].type.shape[d]) - 1 - sympy.sympify(idx[d])
    return [out]


def _unfold(op, idx, v):
    """Window w's element j along dim d is element w * step + j."""
    d = op.attrs["dim"]
    out = list(idx[:-1])
    if out:
        out[d] = op.attrs["step"] * sympy.sympify(idx[d]) + sympy.sympify(idx[-1])
    return [out]


def _squeeze(op, idx, v):
    out, it = [], iter(idx)
    for k in range(op.operands[0].type.rank):
        out.append(0 if k in op.attrs["dims"] else next(it))
    return [out]


def _unsqueeze(op, idx, v):
    out = list(idx)
    del out[op.attrs["dim"]]
    return [out]


def _select(op, idx, v):
    d, index = op.attrs["dim"], op.attrs["index"]
    if index < 0:
        index = norm_dim(sympy.sympify(op.operands[0].type.shape[d]) + index)
    out = list(idx)
    out.insert(d, index)
    return [out]


def _split(op, idx, v):
    d = op.attrs["dim"]
    offset = sum((sympy.sympify(s) for s in op.attrs["sizes"][:v.index]), sympy.Integer(0))
    out = list(idx)
    out[d] = offset + idx[d]
    return [out]


def _same(op, idx, v):
    return [list(idx)]


def _pad(op, idx, v):
    """The operand index a pad reads: shifted by the low amount, then mirrored, clamped or wrapped
    into the dim (constant padding reads only inside it: `Lowerer._pad` masks the read)."""
    mode, out = op.attrs["mode"], []
    for i, lo, hi, size in zip(idx, op.attrs["low"], op.attrs["high"], op.operands[0].type.shape):
        j = sympy.sympify(i) - lo
        if mode == "constant" or not (lo or hi):
            out.append(j)
        elif mode == "replicate":
            out.append(index_min(index_max(j, 0), size - 1))
        elif mode == "reflect":        # the amounts are below the size: one mirror at either end
            out.append(index_min(index_max(j, -j), 2 * (size - 1) - j))
        else:                           # circular: crop by the negative amounts, wrap what is left
            cut = max(-lo, 0)
            out.append(sympy.Mod(sympy.sympify(i) - max(lo, 0), size - cut - max(-hi, 0)) + cut)
    return [out]


VIEWS: dict[str, Callable] = {
    "cuvil.permute": _permute, "cuvil.expand": _expand, "cuvil.slice": _slice, "cuvil.squeeze": _squeeze,
    "cuvil.unsqueeze": _unsqueeze, "cuvil.select": _select, "cuvil.split": _split, "cuvil.reshape": None,
    "cuvil.pad": _pad, "cuvil.flip": _flip, "cuvil.unfold": _unfold,
}


def _embedding(op, idx):
    weight, indices = op.operands
    return weight, [(indices, idx[:-1]), idx[-1]]


def _index_select(op, idx):
    x, index = op.operands
    d = op.attrs["dim"]
    return x, list(idx[:d]) + [(index, [idx[d]])] + list(idx[d + 1:])


def _gather_op(op, idx):
    x, index = op.operands
    d = op.attrs["dim"]
    return x, list(idx[:d]) + [(index, list(idx))] + list(idx[d + 1:])


def _advanced_index(op, idx):
    x, *indices = op.operands
    out_shape = op.results[0].type.shape
    batch = len(out_shape) - (x.type.rank - len(indices))
    picks = [(t, broadcast_index(idx[:batch], out_shape[:batch], t.type.shape)) for t in indices]
    return x, picks + list(idx[batch:])


# (table, index entries) of a gather at an output index; an entry is an index expression or
# (index tensor, the index to read it at)
GATHERS: dict[str, Callable] = {"cuvil.embedding": _embedding, "cuvil.index_select": _index_select,
                                "cuvil.gather": _gather_op, "cuvil.index": _advanced_index}


# ----------------------------------------------------------------------------- the lowering

STATUS_BITS = 31       # the checks of one kernel with a bit of their own in its (i32) status word

def _moves(index, var) -> bool:
    return var in sympy.sympify(index).free_symbols


def _steps_by_one(index, var) -> bool:
    """Consecutive values of `var` read consecutive positions (of that index)."""
    e = sympy.sympify(index)
    if e == var:
        return True
    if not _moves(e, var) or any(_moves(a, var) for a in e.atoms(sympy.Mod, sympy.floor)):
        return False        # a wrapped index jumps where it wraps
    terms = sympy.Add.make_args(e)
    if var in terms and not any(_moves(t, var) for t in terms if t != var):
        return True         # var plus terms free of it; sympy's expand costs milliseconds
    return sympy.expand(e.subs(var, var + 1) - e) == 1


@dataclass
class LoweredKernel:
    """A kernel and the graph values its buffers hold (`None` for scratch and the status word),
    in buffer order; `checks[k]` says what the call refused where its status has bit k set."""
    ops: list[Operation]
    kernel: Kernel
    values: list[Value | None]
    checks: list[str] = field(default_factory=list)


class GroupLowering:
    """Lower one group of ops (`ops`, from function `fn`) to a kernel named `name`."""

    def __init__(self, fn: Function, ops: list[Operation], name: str, panel_width: int | None = None,
                 order: dict[int, int] | None = None):
        self.fn, self.name = fn, name
        # the widest panel a product packs its right-hand side in at run time: the target's
        # (`Target.panel_width`), the host's unless given, as the `layout` pass packs weights
        self.widest_panel = panel_width or Target.host().panel_width
        ids = {id(op) for op in ops}
        if order is not None and all(i in order for i in ids):
            self.ops = sorted(ops, key=lambda op: order[id(op)])
        else:
            self.ops = [op for op in fn.ops if id(op) in ids]
        if len(self.ops) != len(ops):
            raise CuvilVerifyError(f"group {name}: some ops are not in function @{fn.name}")
        self.members = ids
        for op in self.ops:
            if op_kind(op) == "unsupported":
                raise CuvilUnsupportedOpError(op.name, _where(op), "no native lowering for this op yet")
        problem = group_legality(fn, self.ops)
        if problem is not None:
            raise CuvilVerifyError(f"internal error: group {name} cannot be lowered as one kernel: {problem}",
                                   self.ops[-1])
        self.inputs: dict[int, Buffer] = {}
        self.outputs: dict[int, tuple[Value, Buffer]] = {}
        self.buffers: list[Buffer] = []
        self.locals: list[Buffer] = []
        self.values: list[Value | None] = []
        self.materialized: dict[int, Callable] = {}
        self.blocks: list[list] = [[]]
        self.memo: list[dict] = [{}]
        self.reductions: dict[int, dict[str, Var]] = {}   # op -> scalars it made in this outer iteration
        self.known: Bounds = {}
        self.mask: Expr | None = None
        self.lanes: ColumnLanes | None = None    # the columns of a column reduction's iteration
        self.status: Buffer | None = None    # the status word, once a check needs it
        self.checks: list[str] = []          # what each check refuses: check k sets bit k
        self._names = itertools.count()
        self._enclosing: list[str] = []      # loop and reduction variables of the statements being built
        self._collect_buffers()
        # outputs a GEMM's epilogue stores at its product's index permuted (`epilogue_frames`)
        root = next((op for op in self.ops if op_kind(op) == "library"), None)
        frames = epilogue_frames(root, self.members) if root is not None else {}
        self.store_perm: dict[int, tuple] = {i: frame_perm(frames[i]) for i in self.outputs
                                             if frame_perm(frames.get(i))}

    # -- buffers
    def _collect_buffers(self) -> None:
        self.read_from_memory = {id(v) for op in self.ops for v in op.operands
                                 if not any(v is f for f in fusible_operands(op))}
        for op in self.ops:
            for v in op.operands:
                if self._is_source(v) and id(v) not in self.inputs:
                    self.inputs[id(v)] = self._buffer(v, "in")
        for r in group_outputs(self.fn, self.ops):
            self.outputs[id(r)] = (r, self._buffer(r, "out"))
        if not self.outputs:
            raise CuvilVerifyError(f"group {self.name}: no op result is used outside the group")

    def _is_source(self, v: Value) -> bool:
        """Read from memory: arguments and values of ops outside the group, but inline constants
        that no op of the group reads from memory (a GEMM's operand): the others recompute them;
        and a view (an alias view, `alias_base`, or one stored by a kernel of its own) that the
        group recomputes for some readers and some op of the group reads from memory."""
        if isinstance(v.owner, Function):
            return True
        if id(v.owner) in self.members:
            return id(v) in self.read_from_memory and (alias_base(v) is not None or recomputed(v.owner))
        return v.owner.name not in INLINE_OPS or id(v) in self.read_from_memory

    def reads_row_major(self, v: Value) -> bool:
        return self.row_major_input(v) is not None

    def row_major_input(self, v: Value) -> Buffer | None:
        """The input buffer holding `v` in row-major order, where the group reads it so: an input
        so stored, or a reshape in the group of one (a reshape keeps the order: a transformer's
        tokens read as an NHWC image, a batched product's operand viewed with other batch dims)."""
        while not (self._is_source(v) and id(v) in self.inputs):
            p = v.owner
            if isinstance(p, Function) or id(p) not in self.members or p.name not in RESHAPES:
                return None
            v = p.operands[0]
        buf = self.inputs[id(v)]
        return buf if buf.strides is None else None

    def _buffer(self, v: Value, role: str) -> Buffer:
        self.values.append(stored(v) if role == "in" else v)
        base = re.sub(r"[^A-Za-z0-9_.]", "_", v.name) if v.name else ("x" if role == "in" else "y")
        taken = {b.name for b in self.buffers}
        name = base if base not in taken and v.name else next(f"{base}{k}" for k in itertools.count() if
                                                                f"{base}{k}" not in taken)
        buf = Buffer(name, v.type.dtype, v.type.shape, role)
        self.buffers.append(buf)
        return buf

    def scratch(self, dtype: DType, shape) -> Buffer:
        buf = Buffer(f"tmp{sum(b.role == 'scratch' for b in self.buffers)}", dtype, shape, "scratch")
        self.buffers.append(buf)
        self.values.append(None)
        return buf

    def local(self, dtype: DType, shape: tuple[int, ...]) -> Buffer:
        """A buffer of each call's own, on its stack (`Kernel.locals`): for what one iteration of
        the parallel loop writes and reads, kept in cache for the next iteration of the call."""
        buf = Buffer(f"loc{len(self.locals)}", dtype, shape, "local")
        self.locals.append(buf)
        return buf

    @property
    def local_bytes(self) -> int:
        return sum(math.prod(b.shape) * b.dtype.itemsize for b in self.locals)

    # -- statements and names
    def fresh(self, prefix: str = "t") -> str:
        return f"{prefix}{next(self._names)}"

    def emit(self, stmt) -> None:
        self.blocks[-1].append(stmt)

    def let(self, e: Expr, prefix: str = "t") -> Expr:
        if self.lanes is not None and not self.lanes.inside:
            return self.lanes.let(e)
        var = Var(self.fresh(prefix), e.dtype)
        self.emit(Let(var, e))
        return var

    def push(self) -> list:
        self.blocks.append([])
        self.memo.append({})
        return self.blocks[-1]

    def pop(self) -> list:
        self.memo.pop()
        return self.blocks.pop()

    @contextlib.contextmanager
    def own_values(self):
        """Values computed inside are remembered only inside (one output element of several
        computed from different definitions of the same value)."""
        self.memo.append({})
        try:
            yield
        finally:
            self.memo.pop()

    def _unshadowed(self, var: str) -> str:
        """`var`, or a variant of it when an enclosing loop has that name (a window op computed
        inside another's window: a pool over a depthwise convolution, both over kh and kw)."""
        name, n = var, 1
        while name in self._enclosing:
            name, n = f"{var}_{n}", n + 1
        return name

    def loop(self, var: str, extent, body: Callable[[sympy.Symbol], None], start=0, parallel=False) -> None:
        var = self._unshadowed(var)
        v = loop_var(var)
        self.known[v] = (sympy.Integer(0) + start, sympy.sympify(start) + extent - 1)
        self.push()
        self._enclosing.append(var)
        body(v)
        self._enclosing.pop()
        stmts = self.pop()
        if stmts:
            self.emit(Loop(var, start, extent, stmts, parallel))

    def reduce(self, kind: str, ranges: list[tuple[str, object, object]], value: Callable[[list], Expr],
               dtype: DType, prefix: str | None = None) -> Expr:
        """Emit `Reduce(kind)` over `ranges` ((var, start, extent) each); `value(vars)` builds the
        per-iteration value inside the reduction body. In a column reduction, its columns' folds."""
        if not ranges:      # no axes to fold (a 0-d tensor): the one value is the result
            return self.let(cast(value([]), dtype), prefix or kind)
        if dtype == DType.bool and kind in ("max", "min"):     # LLVM's i1 is signed (true < false): fold as i8
            folded = self.reduce(kind, ranges, lambda vars: cast(value(vars), DType.i8), DType.i8, prefix)
            return self.let(cast(folded, DType.bool), prefix or kind)
        if self.lanes is not None and not self.lanes.inside:
            return self.lanes.reduce(kind, ranges, value, dtype)
        syms = []
        ranges = [(self._unshadowed(var), start, extent) for var, start, extent in ranges]
        for var, start, extent in ranges:
            s = loop_var(var)
            self.known[s] = (sympy.sympify(start), sympy.sympify(start) + extent - 1)
            syms.append(s)
        self.push()
        self._enclosing.extend(var for var, _, _ in ranges)
        v = cast(value(syms), dtype)
        del self._enclosing[len(self._enclosing) - len(ranges):]
        body = self.pop()
        out = Var(self.fresh(prefix or kind), dtype)
        self.emit(Reduce(out, kind, [Range(n, s, e) for n, s, e in ranges], identity(kind, dtype), body, v))
        return out

    # -- values
    def value(self, v: Value, idx) -> Expr:
        idx = tuple(norm_dim(i) for i in idx)
        key = (id(v), idx, self.mask)
        for scope in reversed(self.memo):
            if key in scope:
                return scope[key]
        def compute():
            e = self._compute(v, idx)
            uses = sum(1 for u in v.uses if id(u) in self.members)
            if uses > 1 and not isinstance(e, (Var, Const, Load, Index)):
                e = self.let(e)
            return e
        # a group input, or a constant from outside the group, is part of the op that reads it
        e = self.built_by(v.owner, compute) if id(v.owner) in self.members else compute()
        self.memo[-1][key] = e
        return e

    def built_by(self, op: Operation, build: Callable[[], object]):
        """`build()`, with what it emits and returns attributed to `op` (what the ops it reads built
        is theirs already: they were built inside, and stamped first). A load of a group input is
        its reader's."""
        block = self.blocks[-1]
        start = len(block)
        out = build()
        stamp(block[start:], op.id)
        if isinstance(out, Expr):
            stamp([out], op.id)
        return out

    def _compute(self, v: Value, idx) -> Expr:
        if id(v) in self.materialized:
            return self.materialized[id(v)](idx)
        if self._is_source(v):
            buf = self.inputs[id(v)]
            other = None if self.mask is None else Const(0, buf.dtype)
            return cast(Load(buf, idx, self.mask, other), compute_dtype(buf.dtype))
        op = v.owner
        kind = op_kind(op)
        if kind == "inline":
            return self._inline(op, idx)
        if kind == "elementwise":
            return self._elementwise(op, idx)
        if kind == "view":
            return self._view(op, v, idx)
        if kind == "gather":
            return self._gather(op, idx)
        if kind == "reduction":
            return self._reduction_value(op, idx)
        if kind == "window":
            return WINDOW_OPS[op.name](self, op, idx)
        raise CuvilVerifyError(f"group {self.name}: {op.name} must be the root of its group", op)

    def _inline(self, op: Operation, idx) -> Expr:
        dtype = compute_dtype(op.attrs["dtype"])
        if op.name == "cuvil.arange":
            start, step = op.attrs["start"], op.attrs["step"]
            if not dtype.is_float and all(float(x).is_integer() for x in (start, step)):
                return cast(Index(int(start) + int(step) * sympy.sympify(idx[0])), dtype)
            i = cast(Index(idx[0]), DType.f32)
            return cast(call("add", const(start, DType.f32), call("mul", i, const(step, DType.f32))), dtype)
        if op.name == "cuvil.size":
            return cast(Index(op.attrs["size"][0]), dtype)
        return const(op.attrs["value"], dtype)

    def _elementwise(self, op: Operation, idx) -> Expr:
        out_shape = op.results[0].type.shape
        if op.name == "cuvil.batch_norm":   # statistics are per channel (dim 1)
            args = [self.value(op.operands[0], idx)] + [self.value(s, (idx[1],)) for s in op.operands[1:]]
        else:
            args = [self.value(o, broadcast_index(idx, out_shape, o.type.shape)) for o in op.operands]
        if op.name == "cuvil.check_index":
            (size,), x = op.attrs["size"], args[0]
            n = cast(Index(size), x.dtype)
            lo = call("neg", n) if op.attrs["negative"] else const(0, x.dtype)
            self.check(call("and", call("ge", x, lo), call("lt", x, n)),
                       index_outside(op, op.attrs["dim"], size, -size if op.attrs["negative"] else 0))
            return call("select", call("lt", x, const(0, x.dtype)), call("add", x, n), x) \
                if op.attrs["negative"] else x
        if op.name == "cuvil.check_true":
            where = f" at {op.loc.file}:{op.loc.line}" if op.loc else ""
            self.check(args[1], f"a check of tensor values failed{where}: {op.attrs['message']} "
                                f"(eager PyTorch raises too)")
            return args[0]
        return scalar_ops.emit(op, args, self.let)

    def _view(self, op: Operation, v: Value, idx) -> Expr:
        if op.name == "cuvil.reshape":
            return self.value(op.operands[0], self.reshape_index(op.operands[0].type.shape, v.type.shape, idx))
        if op.name == "cuvil.cat":
            return self._cat(op, idx)
        if op.name == "cuvil.slice_scatter":
            return self._slice_scatter(op, idx)
        if op.name == "cuvil.pad" and op.attrs["mode"] == "constant":
            return self._constant_pad(op, idx)
        if op.name in ("cuvil.triu", "cuvil.tril"):
            row, col = sympy.sympify(idx[-2]), sympy.sympify(idx[-1])
            diff = Index(col - row - op.attrs["diagonal"])
            keep = call("ge" if op.name == "cuvil.triu" else "le", diff, const(0, DType.i64))
            x = self.value(op.operands[0], idx)
            return call("select", keep, x, const(0, x.dtype))
        (operand_idx,) = VIEWS[op.name](op, idx, v)
        return self.value(op.operands[0], operand_idx)

    def reshape_index(self, in_shape, out_shape, idx) -> list:
        return reshape_index(in_shape, out_shape, idx, self.known)

    def _cat(self, op: Operation, idx) -> Expr:
        """The piece the position along the cat's dim falls in: a select over the pieces, but for
        those its known bounds rule out (a loop split at the pieces' offsets, `_inner_loop`, reads
        one piece per loop, unmasked)."""
        d = op.attrs["dim"]
        dtype = compute_dtype(op.results[0].type.dtype)
        pos = sympy.sympify(idx[d])
        pieces = [(x, off) for x, off in zip(op.operands, cat_offsets(op))
                  if self._may_hold(pos, off, x.type.shape[d])] or list(zip(op.operands, cat_offsets(op)))
        if len(pieces) == 1 and self._holds(pos, pieces[0][1], pieces[0][0].type.shape[d]):
            (x, off), = pieces
            return cast(self.value(x, [*idx[:d], pos - off, *idx[d + 1:]]), dtype)
        result = None
        for x, off in reversed(pieces):
            inside = call("and", call("ge", Index(pos), Index(off)),
                          call("lt", Index(pos), Index(off + x.type.shape[d])))
            saved = self.mask
            self.mask = inside if saved is None else call("and", saved, inside)
            piece_idx = list(idx)
            piece_idx[d] = pos - off
            piece = cast(self.value(x, piece_idx), dtype)
            self.mask = saved
            result = piece if result is None else call("select", inside, piece, result)
        return result

    def _span(self, pos) -> tuple | None:
        """Inclusive bounds of an index: its loop variables' terms by their known bounds, the rest
        (sizes, positive symbols) as it is; None when unknown."""
        pos = sympy.sympify(pos)
        varying = sympy.Add(*(t for t in sympy.Add.make_args(pos) if t.free_symbols & set(self.known)))
        b = bounds(varying, self.known) if varying != 0 else (0, 0)
        if b is None:
            return None
        return sympy.sympify(b[0]) + pos - varying, sympy.sympify(b[1]) + pos - varying

    def _may_hold(self, pos, off, size) -> bool:
        """Whether `pos` may fall in [off, off + size), by its known bounds (True when unknown)."""
        span = self._span(pos)
        return span is None or not ((span[1] - off).is_negative or (span[0] - off - size).is_nonnegative)

    def _holds(self, pos, off, size) -> bool:
        """Whether `pos` always falls in [off, off + size), by its known bounds."""
        span = self._span(pos)
        return span is not None and (span[0] - off).is_nonnegative is True and \
            (off + size - 1 - span[1]).is_nonnegative is True

    def _slice_scatter(self, op: Operation, idx) -> Expr:
        """src where the index falls on the slice (src's read masked elsewhere), x everywhere else."""
        x, src = op.operands
        d, step = op.attrs["dim"], op.attrs["step"]
        start = slice_start(op)
        rel = sympy.sympify(idx[d]) - start
        inside = call("and", call("ge", Index(rel), Index(0)),
                      call("lt", Index(rel), Index(sympy.sympify(src.type.shape[d]) * step)))
        if step > 1:
            inside = call("and", inside, call("eq", Index(modulo(rel, step, self.known)), Index(0)))
        saved = self.mask
        self.mask = inside if saved is None else call("and", saved, inside)
        src_idx = list(idx)
        src_idx[d] = floor_div(rel, step, self.known)
        piece = self.value(src, src_idx)
        self.mask = saved
        return call("select", inside, piece, self.value(x, idx))

    def _constant_pad(self, op: Operation, idx) -> Expr:
        """The operand where the index falls inside it (the read masked elsewhere), the fill value outside."""
        (at,) = _pad(op, idx, None)
        inside = None
        for j, lo, hi, size in zip(at, op.attrs["low"], op.attrs["high"], op.operands[0].type.shape):
            for keep in ([call("ge", Index(j), Index(0))] if lo > 0 else []) + \
                        ([call("lt", Index(j), Index(size))] if hi > 0 else []):
                inside = keep if inside is None else call("and", inside, keep)
        if inside is None:          # cropping only
            return self.value(op.operands[0], at)
        saved = self.mask
        self.mask = inside if saved is None else call("and", saved, inside)
        piece = self.value(op.operands[0], at)
        self.mask = saved
        return call("select", inside, piece, const(op.attrs["value"], piece.dtype))

    def _gather(self, op: Operation, idx) -> Expr:
        """A load whose index is read from an index tensor. An index outside the table fails the
        call, as torch raises (`check`); the load is masked all the same, never reading outside
        the buffer (NaN there, 0 for integer tables)."""
        table, picks = GATHERS[op.name](op, idx)
        if not self._is_source(table):
            raise CuvilUnsupportedOpError(op.name, _where(op), "the table must be a weight or an input of the kernel")
        buf = self.inputs[id(table)]
        index, inside = [], []
        for k, entry in enumerate(picks):
            if isinstance(entry, tuple):          # (index tensor, its index): a dynamic entry
                j, holds = self._table_index(op, k, entry, table.type.shape[k])
                inside.append(holds)
                index.append(j)
            else:
                index.append(entry)
        mask = inside[0]
        for m in inside[1:]:
            mask = call("and", mask, m)
        other = Const(float("nan") if buf.dtype.is_float else 0, buf.dtype)
        return cast(Load(buf, index, mask, other), compute_dtype(buf.dtype))

    def _table_index(self, op: Operation, k: int, entry: tuple, n) -> tuple[Expr, Expr]:
        """Entry k of a gather's table index, read from its index tensor at `entry`, and whether it
        lies inside the table (checked). Remembered like a value: a row of a table read along an
        inner loop (an embedding's, under a layer norm's reductions) reads and checks its index
        once, outside that loop, where each element read it and checked it again (and the check,
        a store, kept LLVM from vectorising the loop: BERT's embeddings took 212 us)."""
        tensor, at = entry
        key = ("table-index", id(op), k, tuple(norm_dim(i) for i in at), self.mask)
        for scope in reversed(self.memo):
            if key in scope:
                return scope[key]
        j = cast(self.value(tensor, at), DType.i64)
        size = Index(n)
        lo = -n if op.name == "cuvil.index" else 0
        if op.name == "cuvil.index":      # advanced indexing counts negative indices from the end
            j = call("select", call("lt", j, const(0, DType.i64)), call("add", j, size), j)
        j = self.let(j, "j") if not isinstance(j, (Var, Const)) else j
        holds = self.let(call("and", call("ge", j, const(0, DType.i64)), call("lt", j, size)), "in")
        self.check(holds, index_outside(op, k, n, lo))
        self.memo[-1][key] = (j, holds)
        return j, holds

    def check(self, holds: Expr, what: str) -> None:
        """Fail the call with `what` where `holds` is false (within a masked read, where the read
        happens). The kernel's status word carries the failure to the runtime, which raises
        `CuvilIndexError` with `what`."""
        if self.status is None:
            self.status = Buffer("status", DType.i32, (1,), "status")
            self.buffers.append(self.status)
            self.values.append(None)
        if what in self.checks:
            bit = self.checks.index(what)
        elif len(self.checks) < STATUS_BITS:
            bit = len(self.checks)
            self.checks.append(what)
        else:       # the last bit stands for every further check
            bit = STATUS_BITS - 1
            self.checks[bit] += f"; or {what}"
        if self.mask is not None:
            holds = call("or", call("not", self.mask), holds)
        self.emit(Check(self.status, call("select", holds, Const(0, DType.i32), Const(1 << bit, DType.i32))))

    # -- reductions
    def _reduction_value(self, op: Operation, idx) -> Expr:
        scalars = self.reductions.get(id(op))
        if scalars is None:
            raise CuvilVerifyError(f"group {self.name}: {op.name} is used outside its reduction loop", op)
        if op.name in REDUCTION_EPILOGUES:
            return REDUCTION_EPILOGUES[op.name](self, op, scalars, idx)
        return scalars["result"]

    # -- building the kernel
    def lower(self) -> LoweredKernel:
        roots = [op for op in self.ops if op_kind(op) == "library"]
        reductions = [op for op in self.ops if op_kind(op) == "reduction"]
        if all(_is_empty(v.type.shape) for v, _ in self.outputs.values()):
            pass        # every output is empty: nothing to compute (and no strides to divide by)
        elif roots:
            self.built_by(roots[0], lambda: LIBRARY[roots[0].name](self, roots[0]))
        elif reductions:
            self._lower_reductions(reductions)
        else:
            self._lower_elementwise()
        body = self.blocks[0]
        symbols = set()
        for b in self.buffers:
            for d in b.shape:
                symbols |= free_symbols(d)
        symbols |= index_names(body)
        symbols -= {str(s) for s in self.known if isinstance(s, sympy.Symbol)}
        kernel = Kernel(self.name, self.buffers, sorted(symbols, key=_natural), body, self.locals)
        return LoweredKernel(self.ops, kernel, self.values, self.checks)

    def iterate(self, shape, body: Callable[[list], None], outer_only: bool = False, parallel: bool = True,
                prefix: str = "") -> None:
        """Loops over `shape`: the dims before the last flattened into one parallel loop, the last dim
        an inner loop (`outer_only`: all dims flattened, no inner loop). body(idx) runs innermost.
        `prefix` names the loop variables apart from those of another nest in the same kernel."""
        shape = list(shape)
        if _is_empty(shape):
            return      # no iterations (and no strides to divide by)
        flat = shape if outer_only else shape[:-1]
        inner = [] if outer_only else shape[-1:]
        if not flat:
            if inner:
                self.loop(f"{prefix}i0", inner[0], lambda i: body([i]), parallel=parallel)
            else:
                body([])
            return
        total = sympy.Integer(1)
        for d in flat:
            total = total * d

        def outer(p):
            idx, stride = [None] * len(flat), total
            for pos in range(len(flat)):
                d = flat[pos]
                stride = stride / d
                e = modulo(floor_div(p, stride, self.known), d, self.known)
                self.known.setdefault(e, (sympy.Integer(0), sympy.sympify(d) - 1))
                idx[pos] = e
            if inner:
                self._inner_loop(f"{prefix}i{len(flat)}", inner[0], lambda i: body(idx + [i]))
            else:
                body(idx)
        self.loop(f"{prefix}p", norm_dim(total), outer, parallel=parallel)

    def _inner_loop(self, name: str, extent, body: Callable) -> None:
        """The loop over an output's last dim; in runs of F when a reshape in the group merged it
        from dims whose last has F elements (attention's heads back into one row: [4, 64] -> 256),
        so that the reads along a run are contiguous (one loop over the merged dim reads through
        `i // 64` and `i % 64`, which LLVM vectorised with gathers). A cat along that dim splits it
        into a loop per piece, each reading its piece alone (a select over all of them, per
        element, made DenseNet's concatenation of up to 49 pieces quadratic)."""
        cat = self._cat_along_last(extent)
        if cat is not None:
            d = cat.attrs["dim"]
            for x, off in zip(cat.operands, cat_offsets(cat)):
                self.loop(name, x.type.shape[d], lambda i, off=off: body(off + i))
            return
        F = self._merged_run(extent)
        if F is None:
            self.loop(name, extent, body)
            return
        self.loop(name + "r", extent // F, lambda r: self.loop(name, F, lambda i: body(F * r + i)))

    def _cat_along_last(self, extent) -> Operation | None:
        """The group's cat of the most pieces along its last dim, of `extent` elements."""
        cats = [op for op in self.ops if op.name == "cuvil.cat" and op.attrs["dim"] == op.result.type.rank - 1
                and dims_equal(op.result.type.shape[-1], extent)]
        return max(cats, key=lambda op: len(op.operands), default=None)

    def _merged_run(self, extent) -> int | None:
        if not isinstance(extent, int):
            return None
        for op in self.ops:
            if op.name == "cuvil.reshape" and op.operands[0].type.rank > 1:
                run, merged = op.operands[0].type.shape[-1], op.result.type.shape[-1]
                if isinstance(run, int) and merged == extent and MIN_RUN <= run < extent and extent % run == 0:
                    return run
        return None

    def store_outputs(self, idx, which: Callable[[Value], bool] = lambda v: True) -> None:
        for v, buf in self.outputs.values():
            if which(v):
                at = permuted(idx, self.store_perm.get(id(v)))
                e = self.value(v, at)
                if not (isinstance(e, Load) and e.buf == buf and tuple(e.index) == tuple(map(norm_dim, at))):
                    self.built_by(v.owner, lambda: self.emit(Store(buf, at, cast(e, buf.dtype))))

    def _lower_elementwise(self) -> None:
        nests: list[tuple[tuple, set[int]]] = []     # (shape, the outputs of that shape)
        for v, _ in self.outputs.values():
            shape = v.type.shape
            same = next((ids for s, ids in nests if len(s) == len(shape) and all(map(dims_equal, s, shape))), None)
            if same is None:
                nests.append((shape, {id(v)}))
            else:
                same.add(id(v))
        if len(nests) == 1:
            shape = nests[0][0]
            gathered = self.gathered_axis(len(shape))
            if gathered is None:
                self.iterate(shape, self.store_outputs)
            else:
                self._iterate_transposed(shape, gathered, self.store_outputs)
            return
        # outputs of different shapes (the pieces of a split): a loop nest each, all serial, because
        # the runtime splits only one parallel loop of a kernel across threads
        for k, (shape, ids) in enumerate(nests):
            self.iterate(shape, lambda idx, ids=ids: self.store_outputs(idx, lambda v: id(v) in ids),
                         parallel=False, prefix=f"n{k}")

    def gathered_axis(self, rank: int) -> int | None:
        """The output dim that the group's inputs are contiguous along, when it reads them through a
        permute that moves their last dim away from the last (an NHWC -> NCHW conversion, a
        transpose; of an input or of elementwise ops on inputs, which are computed at the permuted
        index): the output's rows then gather those inputs."""
        for op in self.ops:
            if op.name == "cuvil.permute" and op.result.type.rank == rank and _moves_elements(op):
                perm = list(op.attrs["perm"])
                if perm[-1] != rank - 1:
                    return perm.index(rank - 1)
        return self._followed_axis(rank)

    def _followed_axis(self, rank: int) -> int | None:
        """The output dim some input is contiguous along when no input is contiguous along the
        output's last dim, and that input's reads move with the last dim too: a permute seen
        through reshapes (the phase interleave of a transposed 3-d convolution, whose plain loops
        read each line of the convolution's result once per output channel). Worked out from
        the index each input is read at, with the output's index as symbols."""
        if len(self.outputs) != 1 or rank < 2:
            return None
        (v, _), = self.outputs.values()
        out = [sympy.Symbol(f"_o{k}", integer=True, nonnegative=True) for k in range(rank)]
        reads: list[tuple[Value, list]] = []
        if not self._source_reads(v, out, reads):
            return None
        last, found = out[-1], None
        for src, idx in reads:
            if src.type.rank == 0:
                continue
            if _steps_by_one(idx[-1], last) and not any(_moves(i, last) for i in idx[:-1]):
                return None         # contiguous along the output's rows already
            for k in range(rank - 1):
                if found is None and _steps_by_one(idx[-1], out[k]) and not any(_moves(i, out[k]) for i in idx[:-1]) \
                        and any(_moves(i, last) for i in idx):
                    found = k
        return found

    def _source_reads(self, v: Value, idx, reads: list) -> bool:
        """The inputs `v` reads at `idx` through the group's views and elementwise ops, appended to
        `reads`; False where another kind of op stands between (nothing emitted either way)."""
        if self._is_source(v):
            reads.append((v, [sympy.sympify(i) for i in idx]))
            return True
        op = v.owner
        kind = op_kind(op)
        if kind == "inline":
            return True
        if kind == "reduction" and id(op) in self.members:
            return True         # read where it is computed
        if kind == "elementwise" and op.name != "cuvil.batch_norm":
            shape = op.results[0].type.shape
            return all(self._source_reads(o, broadcast_index(idx, shape, o.type.shape), reads) for o in op.operands)
        if op.name == "cuvil.reshape":
            return self._source_reads(op.operands[0], self.reshape_index(op.operands[0].type.shape, v.type.shape,
                                                                         idx), reads)
        if kind == "view" and VIEWS.get(op.name) and op.name != "cuvil.pad":
            (operand_idx,) = VIEWS[op.name](op, idx, v)
            return self._source_reads(op.operands[0], operand_idx, reads)
        return False

    def _iterate_transposed(self, shape, a: int, body: Callable[[list], None]) -> None:
        """Loops over `shape` in tiles of TRANSPOSE_TILE x TRANSPOSE_TILE of (dim `a`, last dim),
        the parallel loop over the other dims and the tiles of `a`. Row by row a tile writes a run
        of the output and reads a line of the gathered input per column: the lines one row reads
        are read again by the rows after it, from L1, and each output line is finished before it
        leaves the cache (a plain loop order keeps one side's lines for a whole sweep of the tensor:
        a [1024, 1024] transpose ran 3.5x, an NHWC -> NCHW conversion of 56x56x96 3x the time).
        Rows shorter than a tile (an HWC image of 3 channels) take dim `a` whole: its loop then
        reads each line in turn."""
        rank = len(shape)
        others = [k for k in range(rank - 1) if k != a]
        A, B = shape[a], shape[-1]
        T = TRANSPOSE_TILE
        tiled = not (isinstance(B, int) and B < T)
        a_tiles = norm_dim(sympy.ceiling(sympy.sympify(A) / T)) if tiled else 1
        total = sympy.Integer(1)
        for d in [shape[k] for k in others] + [a_tiles]:
            total = total * d

        def tile(p):
            *outer, ta = decompose(self.known, p, [shape[k] for k in others] + [a_tiles])

            def rows(tb):
                self.loop("ia", tile_extent(T, A, T * ta) if tiled else A, lambda i: self.loop(
                    "ib", tile_extent(T, B, T * tb) if tiled else B,
                    lambda j: body(_place(rank, others, outer, a, T * ta + i, T * tb + j))))
            if tiled:
                self.loop("tb", norm_dim(sympy.ceiling(sympy.sympify(B) / T)), rows)
            else:
                rows(0)
        self.loop("p", norm_dim(total), tile, parallel=True)

    def _lower_reductions(self, reductions: list[Operation]) -> None:
        full, axes = reduction_space(reductions[0])
        for r in reductions[1:]:
            f2, a2 = reduction_space(r)
            if a2 != axes or len(f2) != len(full) or not all(dims_equal(a, b) for a, b in zip(f2, full)):
                raise CuvilVerifyError(f"group {self.name}: reductions over different index spaces cannot "
                                       f"share one kernel", r)
        outer_axes = [k for k in range(len(full)) if k not in axes]
        syms = [sympy.Symbol(f"_r{k}", integer=True, nonnegative=True) for k in range(len(full))]
        reads: list[tuple[Value, list]] | None = []
        if not all(self._source_reads(r.operands[0], syms, reads) for r in reductions):
            reads = None
        lane = None if reads is None else _lane_axis(reads, syms, full, axes)
        grouped = None if reads is None or lane is not None else _grouped_lanes(reads, syms, full, axes)
        if grouped is not None:
            lane, carried = grouped
        elif reads is not None:
            axes = _contiguous_last(reads, syms, axes)

        def body(outer_idx):
            def full_index(inner):      # inner: the reduced dims' indices, in the order of `axes`
                idx, it_o, at = [], iter(outer_idx), dict(zip(axes, inner))
                for k in range(len(full)):
                    idx.append(at[k] if k in at else next(it_o))
                return idx
            for r in reductions:
                self.reductions[id(r)] = self.built_by(r, lambda r=r: REDUCTION_BODIES[r.name](self, r, axes, full,
                                                                                          full_index))
            self._store_reduction_outputs(reductions, full, axes, outer_idx, full_index)
        if grouped is not None:
            self._iterate_columns([full[k] for k in outer_axes], outer_axes.index(lane), carried, body,
                                  (axes.index(carried), full[carried]))
        elif lane is not None:
            self._iterate_columns([full[k] for k in outer_axes], outer_axes.index(lane), lane, body)
        elif outer_axes:
            self.iterate([full[k] for k in outer_axes], body, outer_only=True)
        else:
            body([])

    def _iterate_columns(self, shape, a: int, axis: int, body: Callable[[list], None], carried=None) -> None:
        """The parallel loop of a column reduction over kept dims `shape`: over the dims but `a`
        and tiles of LANE_TILE columns of `a`; body(idx) runs once per item, `a`'s index the tile's
        first column plus the lane (`ColumnLanes`); `axis` is the reduction space's dim along which
        the columns are consecutive. With `carried` ((its place among the reduced dims, its extent
        n)), the columns are those of `a` and a reduced dim merged (a group of n channels each):
        column c is index c // n of `a` and c % n of the reduced dim."""
        others = [k for k in range(len(shape)) if k != a]
        n = 1 if carried is None else carried[1]
        columns = norm_dim(sympy.sympify(shape[a]) * n)
        tiles = norm_dim(sympy.ceiling(sympy.sympify(columns) / LANE_TILE))
        items = norm_dim(sympy.Mul(*[shape[k] for k in others], tiles))

        def item(p):
            *outer, t = decompose(self.known, p, [shape[k] for k in others] + [tiles])
            lane = loop_var(ColumnLanes.VAR)
            self.known[lane] = (sympy.Integer(0), sympy.Integer(LANE_TILE - 1))
            column = LANE_TILE * t + lane
            group = column if carried is None else floor_div(column, n, self.known)
            # the carried index as column - n*group (not column % n): a read at n*group + index is
            # then the column itself, which the vectoriser sees through
            self.lanes = ColumnLanes(self, p, items, tile_extent(LANE_TILE, columns, LANE_TILE * t), axis,
                                     None if carried is None else (carried[0], column - n * group, n))
            idx = [None] * len(shape)
            for k, v in zip(others, outer):
                idx[k] = v
            idx[a] = group
            try:
                body(idx)
            finally:
                self.lanes = None
        self.loop("p", items, item, parallel=True)

    def _in_columns(self, body: Callable[[], None]) -> None:
        """body() inside a loop over the columns of a column reduction, else directly."""
        if self.lanes is None:
            body()
        else:
            self.lanes.loop(body)

    def _store_reduction_outputs(self, reductions, full, axes, outer_idx, full_index) -> None:
        def is_full(v):     # stored in the loop over the full shape (a reshape of it at its own index)
            return _same_shape(v.type.shape, full) or _reshapes(v.type.shape, full, axes)
        for v, buf in self.outputs.values():
            if is_full(v):
                continue
            rank = v.type.rank
            if rank == len(full):       # keepdim: reduced axes are 1
                idx = full_index([0] * len(axes))
            elif rank == len(full) - len(axes):
                idx = list(outer_idx)
            else:
                raise CuvilVerifyError(f"group {self.name}: output {v.type} fits neither the reduced nor the "
                                       f"full index space {list(full)}", v.owner)

            def store(v=v, buf=buf, idx=idx):
                e = self.value(v, idx)
                self.built_by(v.owner, lambda: self.emit(Store(buf, idx, cast(e, buf.dtype))))
            self._in_columns(store)
        fulls = [v for v, _ in self.outputs.values() if is_full(v)]
        if fulls:
            carried = None if self.lanes is None else self.lanes.carried
            ranges = [(f"j{k}", full[k]) for k in axes]

            # The column loop innermost where the outputs are contiguous along the columns. Else
            # the outputs' rows (the last dim, reduced) go in tiles of ROW_TILE: a tile's loop
            # inside the column loop writes a run of each row and gathers the input's lines,
            # which the next columns read again from L1 (a group norm of an NHWC image into NCHW).
            columns_last = self.lanes is None or self.lanes.axis == len(full) - 1
            rows_tiled = not columns_last and ranges[-1][0] == f"j{len(full) - 1}"

            def nest(level, inner):
                if carried is not None and level == carried[0]:     # the columns carry this dim
                    inner, level = inner + [carried[1]], level + 1
                if level == len(ranges):
                    store = lambda: self._store_full_outputs(full, axes, full_index(inner))     # noqa: E731
                    self._in_columns(store) if columns_last else store()
                    return
                var, extent = ranges[level]
                if rows_tiled and level == len(ranges) - 1:
                    self.loop(var + "t", norm_dim(sympy.ceiling(sympy.sympify(extent) / ROW_TILE)), lambda t: (
                        self._in_columns(lambda: self.loop(var, tile_extent(ROW_TILE, extent, ROW_TILE * t), lambda j: (
                            nest(level + 1, inner + [ROW_TILE * t + j]))))))
                    return
                self.loop(var, extent, lambda j: nest(level + 1, inner + [j]))
            if columns_last or rows_tiled:
                nest(0, [])
            else:
                self._in_columns(lambda: nest(0, []))

    def _store_full_outputs(self, full, axes, idx) -> None:
        """Store the outputs of the full shape at `idx`, and those of a reshape of it at the index
        of the same element."""
        self.store_outputs(idx, lambda v: _same_shape(v.type.shape, full))
        for v, _ in self.outputs.values():
            if _reshapes(v.type.shape, full, axes):
                self.store_outputs(self.reshape_index(v.type.shape, full, idx), lambda w, v=v: w is v)


def _place(rank: int, others: list[int], outer: list, a: int, at_a, at_last) -> list:
    """A full index of `rank` dims from the values of dims `others`, dim `a` and the last dim."""
    idx = [None] * rank
    for k, v in zip(others, outer):
        idx[k] = v
    idx[a], idx[-1] = at_a, at_last
    return idx


def _lane_axis(reads: list[tuple[Value, list]], syms: list, full, axes) -> int | None:
    """The kept dim to run the reductions as a column reduction along (`reductions.py`): one
    that an input is contiguous along while no input is contiguous along a reduced dim, of at
    least MIN_LANES elements. `reads`: the index each input is read at, the reduction space's
    index as `syms`."""
    found = None
    for src, idx in reads:
        if src.type.rank == 0:
            continue
        if any(_steps_by_one(idx[-1], syms[k]) for k in axes):
            return None
        for k in range(len(full)):
            if found is None and k not in axes and _steps_by_one(idx[-1], syms[k]) \
                    and not any(_moves(i, syms[k]) for i in idx[:-1]):
                found = k
    if found is None or (isinstance(full[found], int) and full[found] < MIN_LANES):
        return None
    return found


def _grouped_lanes(reads: list[tuple[Value, list]], syms: list, full, axes) -> tuple[int, int] | None:
    """(kept dim g, reduced dim c) whose merged index `n*g + c` an input is contiguous along, n
    the extent of c and a divisor of LANE_TILE, with other dims reduced too: a group norm of an NHWC
    activation, whose group's n channels lie together at each position. Then the columns of a
    column reduction are the channels, and each group's fold combines its n columns."""
    if len(axes) < 2:
        return None
    for src, idx in reads:
        if src.type.rank == 0:
            continue
        last = sympy.expand(idx[-1])
        for c in axes:
            n = full[c]
            if not (isinstance(n, int) and 1 < n < LANE_TILE and LANE_TILE % n == 0) \
                    or not _steps_by_one(last, syms[c]):
                continue
            for g in range(len(full)):
                if g not in axes and last.coeff(syms[g]) == n \
                        and not any(_moves(i, syms[g]) or _moves(i, syms[c]) for i in idx[:-1]):
                    columns = full[g] * n
                    return (g, c) if not isinstance(columns, int) or columns >= MIN_LANES else None
        return None
    return None


def _contiguous_last(reads: list[tuple[Value, list]], syms: list, axes: list[int]) -> list[int]:
    """The reduced dims in the order of their loops: the last the one an input is contiguous
    along, where that is not the last dim (a group norm of an NHWC image, read through the
    conversion to NCHW: the channels of a group innermost, not the image's columns, a row of
    channels apart)."""
    if len(axes) < 2:
        return axes
    for src, idx in reads:
        if src.type.rank == 0:
            continue
        if _steps_by_one(idx[-1], syms[axes[-1]]):
            return axes
        for k in axes[:-1]:
            if _steps_by_one(idx[-1], syms[k]) and not any(_moves(i, syms[k]) for i in idx[:-1]):
                return [a for a in axes if a != k] + [k]
    return axes


def _is_empty(shape) -> bool:
    return any(isinstance(d, int) and d == 0 for d in shape)


def _where(op: Operation) -> str | None:
    return f"{op.loc.file}:{op.loc.line}" if op.loc else None


# ----------------------------------------------------------------------------- entry points

def lower_group(fn: Function, ops: list[Operation], name: str, panel_width: int | None = None,
                order: dict[int, int] | None = None) -> LoweredKernel:
    """Lower one group of ops of `fn` to one kernel. Results used outside the group become output
    buffers, except those of views and inline constants that are not the group's last op: those
    are recomputed wherever they are read (the grouping gives them their own group when they must
    be in memory). `panel_width`: the target's widest GEMM panel (default the host's); `order`:
    each op's position in `fn` (`op_positions`), for a caller that lowers many groups (found by a
    walk over `fn` otherwise: RAFT's 906 groups spent 0.5 s walking its 7600 ops)."""
    return GroupLowering(fn, ops, name, panel_width, order).lower()


def op_positions(fn: Function) -> dict[int, int]:
    return {id(op): i for i, op in enumerate(fn.ops)}


def kernel_name(fn: Function, i: int, ops: list[Operation]) -> str:
    labels = [op.name.split(".")[-1] for op in ops if op.name not in INLINE_OPS][-3:] or ["const"]
    return f"{fn.name}_{i}_{'_'.join(labels)}"


def lower_function(fn: Function, groups: list[list[Operation]] | None = None,
                   panel_width: int | None = None) -> list[LoweredKernel]:
    """Lower every group of `fn` (default: the groups the fuse pass would form, `fusion_groups(fn)`)
    to a kernel, in order."""
    if groups is None:
        from ..passes.fuse import fusion_groups
        groups = fusion_groups(fn)
    order = op_positions(fn)
    return [lower_group(fn, g, kernel_name(fn, i, g), panel_width, order) for i, g in enumerate(groups)]
