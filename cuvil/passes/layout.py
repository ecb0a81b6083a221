"""The `layout` pass: convolution-heavy functions run in NHWC (channels last).

In NHWC a convolution's im2col rows are runs of contiguous channels, a 1x1 convolution is one GEMM
over every image at once, and the epilogues and pools that follow walk the channels with unit
stride. The pass works in three steps:

1. convert: each NCHW conv2d and pooling op becomes its NHWC form between two conversions,
       permute(x, to NHWC) -> op {layout = "nhwc"} -> permute(result, to NCHW),
   and a convolution's weight is pre-packed at compile time (a new module constant): blocked in
   GEMM panels, `[groups * ceil(out / groups / P), kh, kw, in/groups, P]` (`stem.0.weight.panels`),
   for the implicit-GEMM kernel, unless it is depthwise (`pack-conv`); else as
   `[kh, kw, in/groups, out]` (`.hwio`); a weight that is not a constant is permuted at run time;
2. sink: a conversion to NCHW moves below the elementwise ops that read it, when their other
   operands are conversions too, already converted (a residual input that also feeds a converted
   conv), constants or broadcasts of lower rank (these are reshaped and permuted instead, which is
   folded work for a constant and a cheap view otherwise), and below a pad;
3. cancel: `permute(permute(x, p), q)` with `p` then `q` the identity is `x` (canonicalize's
   patterns). What is left are the conversions at the function's edges and before ops that need
   NCHW, such as a flatten; the statistics count them;
4. hoist: a conversion left below an op that reads an NCHW value through its NHWC view (a
   residual of the function's input) moves back above it (`hoist_conversion`).

Which ops convert is decided per region: image ops joined by the elementwise ops and pads between
them, along which conversions sink and meet. A region with a dense convolution (an implicit GEMM,
1.6x faster in NHWC) or a pool converts, as does one that meets the model's own permutes to or
from channels last (ConvNeXt's), whose conversions cancel. A region of depthwise convolutions
alone converts only where their gain pays for the conversions at its edges (`_region_pays`): a
lone depthwise convolution between NCHW tensors ran 1.7x faster left in NCHW.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import sympy
import torch

from ..ir.core import Module, Operation, Value
from ..ir.printer import value_names
from ..codegen.target import Target
from ..ir.ops.nn import PANEL_WIDTHS, TO_NCHW, TO_NHWC, WEIGHT_TO_HWIO, pack_conv_panels, pack_panels
from .base import ModulePass
from .canonicalize import permute_identity, permute_permute
from .fold_constants import add_constant
from .registry import register_pass
from .rewrite import ANY_OP, Rewriter, apply_patterns, producer

IMAGE_OPS = frozenset({"cuvil.conv2d", "cuvil.max_pool2d", "cuvil.avg_pool2d", "cuvil.adaptive_avg_pool2d",
                       "cuvil.adaptive_max_pool2d"})
CONSTANT_SOURCES = frozenset({"cuvil.const", "cuvil.literal", "cuvil.full"})


@register_pass
@dataclass(frozen=True)
class LayoutPass(ModulePass):
    """Run convolutions and pools in NHWC with pre-packed weights, conversions sunk and cancelled.

    The conversions move through elementwise ops and the pairs that meet cancel. A function is
    converted when it has at least `min-convs` convolutions, region by region where converting
    pays (`_region_pays`; `convert-all`: every image op); `pack-conv` and `pack-linear` block
    weights in GEMM panels of at most `panel-width` columns (0: the host's `Target.panel_width`;
    a cross compile sets its target's). Statistics: ops converted and kept (by op), weights packed
    (of them in conv panels), linears packed, the panel width, regions converted and kept,
    conversions inserted, sunk, hoisted, cancelled and left."""
    name = "layout"
    priority = 85
    requires = frozenset({"verified"})
    min_convs: int = 1
    convert_all: bool = False
    pack_linear: bool = True
    pack_conv: bool = True
    panel_width: int = 0

    def __post_init__(self):
        if self.panel_width not in (0, *PANEL_WIDTHS):
            raise ValueError(f"panel-width must be 0 (the host's) or one of {PANEL_WIDTHS}, not {self.panel_width}")

    def run(self, module: Module) -> dict:
        widest = self.panel_width or Target.host().panel_width
        converted: Counter = Counter()
        kept: Counter = Counter()
        packed: Counter = Counter()
        regions: Counter = Counter()
        decisions: list[dict] = []
        inserted = 0
        before = _conversions(module)
        for fn in module.functions.values():
            ops = [op for op in fn.ops if _convertible(op)]
            if sum(op.name == "cuvil.conv2d" for op in ops) < self.min_convs:
                kept.update(op.name.removeprefix("cuvil.") for op in ops)
                continue
            chosen: set[int] = set()
            names, image = value_names(fn), {id(op) for op in ops}
            for members in _regions(fn, ops):
                pays, why = (True, "convert-all") if self.convert_all else _region_pays(members)
                regions["converted" if pays else "kept"] += 1
                decisions.append({"ops": ["%" + names[op.result] for op in members if id(op) in image],
                                  "layout": "nhwc" if pays else "nchw", "why": why})
                if pays:
                    chosen.update(id(op) for op in members)
            rw = Rewriter(module, fn)
            for op in ops:
                if id(op) not in chosen:
                    kept[op.name.removeprefix("cuvil.")] += 1
                    continue
                packed[_to_nhwc(rw, op, self.pack_conv, widest)] += 1
                converted[op.name.removeprefix("cuvil.")] += 1
                inserted += 2
        linears = sum(_pack_linear(Rewriter(module, fn), op, widest) for fn in module.functions.values()
                      for op in list(fn.ops) if self.pack_linear and op.name == "cuvil.linear")
        fired = apply_patterns(module, {ANY_OP: [sink_conversion], "cuvil.pad": [sink_conversion_through_pad],
                                        "cuvil.permute": [permute_permute, permute_identity,
                                                          hoist_conversion_above_pad]})
        fired += apply_patterns(module, {"cuvil.permute": [hoist_conversion, permute_permute, permute_identity]})
        return {"converted": dict(sorted(converted.items())), "kept": dict(sorted(kept.items())),
                "weights-packed": packed["hwio"] + packed["panels"], "conv-panels": packed["panels"],
                "linears-packed": linears, "panel-width": widest,
                "regions-converted": regions["converted"], "regions-kept": regions["kept"], "regions": decisions,
                "conversions-inserted": inserted,
                "sunk": fired["sink_conversion"] + fired["sink_conversion_through_pad"],
                "hoisted": fired["hoist_conversion"] + fired["hoist_conversion_above_pad"],
                "cancelled": fired["permute_identity"], "conversions-left": _conversions(module) - before}


def _convertible(op: Operation) -> bool:
    return op.name in IMAGE_OPS and op.attrs["layout"] == "nchw" and op.operands[0].type.rank == 4


def _carries_layout(op: Operation) -> bool:
    """An op a conversion sinks through: elementwise over rank-4 tensors, or a pad."""
    return len(op.results) == 1 and op.result.type.rank == 4 and (op.has_tag("elementwise") or op.name == "cuvil.pad")


def _regions(fn, image_ops: list[Operation]) -> list[list[Operation]]:
    """The image ops and the ops that carry a layout between them, grouped by the data flow
    among them (an image op's image operand; an elementwise op's every operand): conversions
    inserted around one region's ops can meet and cancel only within it. Regions without an
    image op are left out."""
    image = {id(op) for op in image_ops}
    members = {id(op): op for op in fn.ops if id(op) in image or _carries_layout(op)}
    parent = {k: k for k in members}

    def root(k):
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k
    for op in members.values():
        for v in op.operands[:1] if id(op) in image else op.operands:
            p = producer(v)
            if p is not None and id(p) in members:
                parent[root(id(op))] = root(id(p))
    groups: dict[int, list[Operation]] = {}
    for k, op in members.items():
        groups.setdefault(root(k), []).append(op)
    return [ops for ops in groups.values() if any(id(op) in image for op in ops)]


# Measured (1 thread, this Xeon at ~3 GHz; microseconds a MB of output): a depthwise convolution
# runs at 180 in NCHW, 313 over images narrower than 28 (its rows are its vectors), and 83 in NHWC;
# a conversion between the layouts moves a MB in 111.
DEPTHWISE_NCHW_US, DEPTHWISE_NARROW_NCHW_US, DEPTHWISE_NHWC_US, CONVERSION_US = 180, 313, 83, 111
NARROW_IMAGE = 28


def _region_pays(region: list[Operation]) -> tuple[bool, str]:
    """Whether running `region` in NHWC beats leaving it in NCHW, and why: always with a dense
    convolution (an implicit GEMM) or a pool in it, or where it meets the model's own permutes to
    or from channels last (the conversions cancel); for depthwise convolutions alone, where their
    gain outweighs the conversions at the region's edges (its inputs from outside, its results
    read outside)."""
    inside = {id(op) for op in region}
    depthwise = []
    for op in region:
        if op.name in IMAGE_OPS and not (op.name == "cuvil.conv2d" and _depthwise(op)):
            return True, "a dense convolution (an implicit GEMM)" if op.name == "cuvil.conv2d" else "a pool"
        if op.name == "cuvil.conv2d":
            depthwise.append(op)
        if any(u.name == "cuvil.permute" and tuple(u.attrs["perm"]) == TO_NHWC for u in op.result.uses):
            return True, "the model permutes its result to channels last"
        if any((p := producer(v)) is not None and p.name == "cuvil.permute" and tuple(p.attrs["perm"]) == TO_NCHW
               for v in op.operands):
            return True, "the model permutes its input from channels last"
    edges: dict[int, Value] = {}
    for op in region:
        image = op.name in IMAGE_OPS
        for v in op.operands[:1] if image else op.operands:
            if v.type.rank == 4 and not _constant(v) and (producer(v) is None or id(producer(v)) not in inside):
                edges[id(v)] = v
        if any(id(u) not in inside for u in op.result.uses):
            edges[id(op.result)] = op.result
    gain = sum(((DEPTHWISE_NARROW_NCHW_US if _width(op.result) < NARROW_IMAGE else DEPTHWISE_NCHW_US)
                - DEPTHWISE_NHWC_US) * _megabytes(op.result) for op in depthwise)
    cost = CONVERSION_US * sum(_megabytes(v) for v in edges.values())
    return gain > cost, (f"NHWC would save {len(depthwise)} depthwise convolution(s) ~{gain:.3g} us for "
                         f"{len(edges)} conversion(s) of ~{cost:.3g} us")


def _depthwise(op: Operation) -> bool:
    return op.attrs["groups"] > 1 and op.operands[1].type.shape[1] == 1


def _megabytes(v: Value) -> float:
    return _estimate(v.type.numel()) * v.type.dtype.itemsize / 1e6


def _width(v: Value) -> float:
    return _estimate(v.type.shape[3])


def _estimate(size) -> float:
    """A size with each dynamic dim in it taken at 16."""
    size = sympy.sympify(size)
    return float(size.subs({s: 16 for s in size.free_symbols}))


def _pack_linear(rw: Rewriter, op: Operation, widest: int) -> int:
    """Pack a linear's constant fp32 weight in panels (`codegen/panel_gemm.py`): 1 if it did."""
    weight = op.operands[1]
    p = producer(weight)
    data = rw.module.constants.get(p.attrs["name"]) if p is not None and p.name == "cuvil.const" else None
    if data is None or op.attrs["out_features"] is not None or data.dtype != torch.float32 or data.dim() != 2:
        return 0
    if any(u is not op for u in weight.uses):   # tied (an embedding's table): packing would store it twice
        return 0
    name = add_constant(rw.module, f"{p.attrs['name']}.panels", pack_panels(data, widest))
    packed = rw.create(op, "cuvil.const", attrs={"name": name},
                       result_types=[weight.type.with_shape(tuple(rw.module.constants[name].shape))]).result
    new = rw.create(op, "cuvil.linear", [op.operands[0], packed, *op.operands[2:]],
                    {**op.attrs, "out_features": data.shape[0]})
    rw.replace(op, new.results)
    return 1


def _to_nhwc(rw: Rewriter, op: Operation, pack_conv: bool, widest: int) -> str | None:
    """Rewrite `op` to NHWC between conversions; says how a weight was packed at compile time:
    "hwio", "panels" (`_panel_packable`), or None."""
    x, *rest = op.operands
    packed, attrs = None, {**op.attrs, "layout": "nhwc"}
    if op.name == "cuvil.conv2d":
        weight = rest[0]
        data = rw.module.constants.get(producer(weight).attrs["name"]) \
            if producer(weight) is not None and producer(weight).name == "cuvil.const" else None
        if data is not None:
            hwio, packed = data.permute(*WEIGHT_TO_HWIO), "hwio"
            if pack_conv and _panel_packable(op, data):
                hwio, packed = pack_conv_panels(hwio, op.attrs["groups"], widest), "panels"
                attrs["out_channels"] = data.shape[0]
            name = add_constant(rw.module, f"{producer(weight).attrs['name']}.{packed}", hwio)
            rest[0] = rw.create(op, "cuvil.const", attrs={"name": name},
                                result_types=[weight.type.with_shape(tuple(hwio.shape))]).result
        else:
            rest[0] = rw.create(op, "cuvil.permute", [weight], {"perm": list(WEIGHT_TO_HWIO)}).result
    x_nhwc = rw.create(op, "cuvil.permute", [x], {"perm": list(TO_NHWC)}).result
    nhwc = rw.create(op, op.name, [x_nhwc, *rest], attrs)
    back = rw.create(op, "cuvil.permute", [nhwc.result], {"perm": list(TO_NCHW)})
    rw.replace(op, back.results)
    return packed


def _panel_packable(op: Operation, weight: torch.Tensor) -> bool:
    """An fp32 convolution runs as an implicit GEMM on panels, one per group
    (`codegen/library.py`); a depthwise one (one input channel per group: its direct kernel walks
    the channels innermost) keeps its `[kh, kw, in/groups, out]` weight."""
    return weight.dtype == torch.float32 and not _depthwise(op)


def _is_conversion(v: Value) -> bool:
    p = producer(v)
    return p is not None and p.name == "cuvil.permute" and tuple(p.attrs["perm"]) == TO_NCHW


def _nhwc_copy(v: Value, op: Operation, rw: Rewriter) -> Value | None:
    """A conversion of `v` to NHWC that already runs before `op` (a residual input that also
    feeds a converted conv), or None."""
    for u in v.uses:
        if u.name == "cuvil.permute" and tuple(u.attrs["perm"]) == TO_NHWC and rw.alive(u) \
                and rw.fn.ops.index(u) < rw.fn.ops.index(op):
            return u.result
    return None


def _cheap_to_convert(v: Value, op: Operation, rw: Rewriter) -> bool:
    """Operands an elementwise op may take in NHWC at no run-time cost: conversions (they cancel),
    values already converted, constants (the conversion folds) and lower-rank broadcasts."""
    return v.type.rank < 4 or _is_conversion(v) or _constant(v) or _nhwc_copy(v, op, rw) is not None


def sink_conversion(op: Operation, rw: Rewriter) -> bool:
    """elementwise(permute(y, to NCHW), ...) -> permute(elementwise(y, ...), to NCHW)."""
    if not op.has_tag("elementwise") or len(op.results) != 1 or op.result.type.rank != 4:
        return False
    if not any(_is_conversion(v) for v in op.operands) or \
            not all(_cheap_to_convert(v, op, rw) for v in op.operands):
        return False
    operands = []
    for v in op.operands:
        if v.type.rank == 0 or _nhwc_copy(v, op, rw) is not None:
            operands.append(v if v.type.rank == 0 else _nhwc_copy(v, op, rw))
            continue
        if v.type.rank < 4:     # broadcast: the same elements at rank 4, then to NHWC
            v = rw.create(op, "cuvil.reshape", [v], {"shape": [1] * (4 - v.type.rank) + list(v.type.shape)}).result
        operands.append(rw.create(op, "cuvil.permute", [v], {"perm": list(TO_NHWC)}).result)
    nhwc = rw.create(op, op.name, operands, dict(op.attrs))
    rw.replace(op, rw.create(op, "cuvil.permute", [nhwc.result], {"perm": list(TO_NCHW)}).results)
    return True


def sink_conversion_through_pad(op: Operation, rw: Rewriter) -> bool:
    """pad(permute(y, to NCHW)) -> permute(pad(y), to NCHW), the amounts moved to y's dims: a pad
    between two convolutions (TensorFlow's "same" padding, as Hugging Face's MobileNets and
    EfficientNets write it) otherwise keeps a conversion to NCHW and back around it."""
    if not _is_conversion(op.operands[0]):
        return False
    padded = rw.create(op, "cuvil.pad", [producer(op.operands[0]).operands[0]], _nhwc_pad(op)).result
    rw.replace(op, rw.create(op, "cuvil.permute", [padded], {"perm": list(TO_NCHW)}).results)
    return True


def hoist_conversion_above_pad(op: Operation, rw: Rewriter) -> bool:
    """permute(pad(x), to NHWC) -> pad(permute(x, to NHWC)) for a pad only the conversion reads:
    the pad then sits next to the convolution that reads it, which canonicalize folds it into
    (the model's own input padded before its first convolution)."""
    pad = producer(op.operands[0])
    if tuple(op.attrs["perm"]) != TO_NHWC or pad is None or pad.name != "cuvil.pad" or len(pad.result.uses) != 1:
        return False
    nhwc = rw.create(op, "cuvil.permute", [pad.operands[0]], {"perm": list(TO_NHWC)}).result
    rw.replace(op, rw.create(op, "cuvil.pad", [nhwc], _nhwc_pad(pad)).results)
    return True


def _nhwc_pad(pad: Operation) -> dict:
    """The attributes of an NCHW `pad` for the same image in NHWC: NCHW dim i is NHWC dim
    TO_NCHW[i]."""
    attrs = dict(pad.attrs)
    for key in ("low", "high"):
        amounts = [0] * 4
        for i, d in enumerate(TO_NCHW):
            amounts[d] = pad.attrs[key][i]
        attrs[key] = amounts
    return attrs


def hoist_conversion(op: Operation, rw: Rewriter) -> bool:
    """permute(elementwise(permute(x, to NHWC), y, ...), to NCHW) -> elementwise(x, permute(y, to
    NCHW), ...): a conversion left at the end of a sunk chain moves back above the last op when one
    of its operands is an NCHW value read in NHWC (a residual input whose NHWC form is only a view,
    folded into a convolution's input copy). Sunk, that op read the residual across channels
    (gathers) and the conversion was a kernel of its own; hoisted, it reads the residual in order
    and the conversion folds into its indexing (a transposed tile)."""
    if tuple(op.attrs["perm"]) != TO_NCHW:
        return False
    ew = producer(op.operands[0])
    if ew is None or not ew.has_tag("elementwise") or len(ew.results) != 1 or len(ew.result.uses) != 1:
        return False
    views = [p.operands[0] for v in ew.operands
             if (p := producer(v)) is not None and p.name == "cuvil.permute" and tuple(p.attrs["perm"]) == TO_NHWC]
    if not views:
        return False
    operands = []
    for v in ew.operands:
        p = producer(v)
        if p is not None and p.name == "cuvil.permute" and tuple(p.attrs["perm"]) == TO_NHWC:
            operands.append(p.operands[0])
        elif v.type.rank == 0:
            operands.append(v)
        else:
            if v.type.rank < 4:
                v = rw.create(ew, "cuvil.reshape", [v], {"shape": [1] * (4 - v.type.rank) + list(v.type.shape)}).result
            operands.append(rw.create(ew, "cuvil.permute", [v], {"perm": list(TO_NCHW)}).result)
    rw.replace(op, rw.create(ew, ew.name, operands, dict(ew.attrs)).results)
    return True


def _conversions(module: Module) -> int:
    """Layout conversions that run: those of constants are folded work."""
    return sum(op.name == "cuvil.permute" and tuple(op.attrs["perm"]) in (TO_NCHW, TO_NHWC)
               and not _constant(op.operands[0]) for fn in module.functions.values() for op in fn.ops)


def _constant(v: Value) -> bool:
    """A constant, or a view of one."""
    p = producer(v)
    while p is not None and p.has_tag("view"):
        p = producer(p.operands[0])
    return p is not None and p.name in CONSTANT_SOURCES
