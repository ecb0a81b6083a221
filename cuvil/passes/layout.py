"""The `layout` pass: convolution-heavy functions run in NHWC (channels last).

In NHWC a convolution's im2col rows are runs of contiguous channels, a 1x1 convolution is one GEMM
over every image at once, and the epilogues and pools that follow walk the channels with unit
stride. The pass works in these steps:

0. views: the token views around image ops become rank-4 permutes (a transformer's
   `x.transpose(1, 2).reshape(B, C, H, W)`: `_expose_channels_last_views`), and elementwise ops
   and slices that read an image op's result through a reshape (a 1-d convolution's squeeze) move
   above it (`lift_through_view`), so that they join the image ops' regions;
1. convert: each NCHW conv2d and pooling op becomes its NHWC form between two conversions,
       permute(x, to NHWC) -> op {layout = "nhwc"} -> permute(result, to NCHW),
   and a convolution's weight is pre-packed at compile time (a new module constant): blocked in
   GEMM panels, `[groups * ceil(out / groups / P), kh, kw, in/groups, P]` (`stem.0.weight.panels`),
   for the implicit-GEMM kernel, unless it is depthwise (`pack-conv`); else as
   `[kh, kw, in/groups, out]` (`.hwio`); a weight that is not a constant is permuted at run time;
2. sink: a conversion to NCHW moves below the elementwise ops that read it, when their other
   operands are conversions too, already converted (a residual input that also feeds a converted
   conv), constants or broadcasts of lower rank (these are reshaped and permuted instead, which is
   folded work for a constant and a cheap view otherwise), and below a pad, a slice or a cat of
   conversions;
3. cancel: `permute(permute(x, p), q)` with `p` then `q` the identity is `x` (canonicalize's
   patterns). What is left are the conversions at the function's edges and before ops that need
   NCHW, such as a flatten; the statistics count them;
4. hoist: a conversion left below an op that reads an NCHW value through its NHWC view (a
   residual of the function's input) moves back above it (`hoist_conversion`).

Which ops convert is decided per region: image ops joined by the elementwise ops, pads and
slices between them, along which conversions sink and meet. A region with a dense convolution (an implicit GEMM,
1.6x faster in NHWC) or a pool converts, as does one that meets the model's own permutes to or
from channels last (ConvNeXt's), whose conversions cancel. A region of depthwise convolutions
alone converts only where their gain pays for the conversions at its edges (`_region_pays`): a
lone depthwise convolution between NCHW tensors ran 1.7x faster left in NCHW. Inside a converted
region, a convolution with few output channels (an RGB stem), which runs faster in NCHW along its
image rows, stays there with the pools after it where no NHWC op reads them (`_staying_nchw`).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import sympy
import torch

from ..ir.core import Module, Operation, Value
from ..ir.printer import value_names
from ..ir.types import dims_equal
from ..codegen.library import columns_pay
from ..codegen.target import Target
from ..ir.ops.layout import RESHAPES
from ..ir.ops.nn import PANEL_WIDTHS, TO_NCHW, TO_NHWC, WEIGHT_TO_HWIO, pack_conv_panels, pack_panels
from .base import ModulePass
from .canonicalize import permute_identity, permute_permute, view_noop, view_of_view
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
    (of them in conv panels), linears packed, matmuls by a constant matrix packed (as linears), the panel width, regions converted and kept,
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
        targets = [fn for fn in module.functions.values()
                   if sum(op.name == "cuvil.conv2d" and _convertible(op) for op in fn.ops) >= self.min_convs]
        views = sum(_expose_channels_last_views(Rewriter(module, fn)) for fn in targets)
        lifted = _lift_through_views(module) if targets else 0
        # again: a lifted activation leaves the model's transpose right after a squeeze (Whisper's
        # `gelu(conv(x)).permute(0, 2, 1)`)
        views += sum(_expose_channels_last_views(Rewriter(module, fn)) for fn in targets)
        for fn in module.functions.values():
            ops = [op for op in fn.ops if _convertible(op)]
            if not any(fn is t for t in targets):
                kept.update(op.name.removeprefix("cuvil.") for op in ops)
                continue
            chosen: set[int] = set()
            names, image = value_names(fn), {id(op) for op in ops}
            staying = set() if self.convert_all else _staying_nchw(ops)
            for members in _regions(fn, ops):
                pays, why = (True, "convert-all") if self.convert_all else _region_pays(members)
                regions["converted" if pays else "kept"] += 1
                stays = [op for op in members if pays and id(op) in staying]
                listed = ["%" + names[op.result] for op in members if id(op) in image and op not in stays]
                decisions.append({"ops": listed, "layout": "nhwc" if pays else "nchw", "why": why})
                inside = ["%" + names[op.result] for op in stays]
                if inside:
                    decisions.append({"ops": inside, "layout": "nchw", "why": STAYING_WHY})
                if pays:
                    chosen.update(id(op) for op in members)
            rw = Rewriter(module, fn)
            for op in ops:
                if id(op) not in chosen or id(op) in staying:
                    kept[op.name.removeprefix("cuvil.")] += 1
                    continue
                packed[_to_nhwc(rw, op, self.pack_conv, widest)] += 1
                converted[op.name.removeprefix("cuvil.")] += 1
                inserted += 2
        products = Counter(op.name.removeprefix("cuvil.") for fn in module.functions.values() for op in list(fn.ops)
                           if self.pack_linear and op.name in ("cuvil.linear", "cuvil.matmul")
                           and _pack_product(Rewriter(module, fn), op, widest))
        fired = apply_patterns(module, {ANY_OP: [sink_conversion], "cuvil.pad": [sink_conversion_through_pad],
                                        "cuvil.slice": [sink_conversion_through_slice],
                                        "cuvil.cat": [sink_conversion_through_cat],
                                        "cuvil.permute": [permute_permute, permute_identity,
                                                          hoist_conversion_above_pad]})
        fired += apply_patterns(module, {"cuvil.permute": [hoist_conversion, permute_permute, permute_identity]})
        lifted += _lift_through_views(module) if targets else 0
        return {"converted": dict(sorted(converted.items())), "kept": dict(sorted(kept.items())),
                "weights-packed": packed["hwio"] + packed["panels"], "conv-panels": packed["panels"],
                "linears-packed": products["linear"], "matmuls-packed": products["matmul"], "panel-width": widest,
                "regions-converted": regions["converted"], "regions-kept": regions["kept"], "regions": decisions,
                "channels-last-views": views, "lifted-through-views": lifted, "conversions-inserted": inserted,
                "sunk": fired["sink_conversion"] + fired["sink_conversion_through_pad"] +
                fired["sink_conversion_through_slice"] + fired["sink_conversion_through_cat"],
                "hoisted": fired["hoist_conversion"] + fired["hoist_conversion_above_pad"],
                "cancelled": fired["permute_identity"], "conversions-left": _conversions(module) - before}


def _expose_channels_last_views(rw: Rewriter) -> int:
    """Rewrite the token <-> image views around image ops so that their permutes are rank 4:
    reshape(permute(x, p)) that splits dims -> permute(reshape(x), p'), and permute(reshape(y))
    that merges dims -> reshape(permute(y, p'')). A transformer's `x.transpose(1, 2).reshape(B, C,
    H, W)` in front of a convolution (SegFormer's and PVTv2's MixFFN, a Conformer's convolution
    module) is then the model's own permute from channels last, which the conversion to NHWC
    cancels: the convolution reads the tokens where they lie. Returns the views rewritten."""
    count = 0
    for op in list(rw.fn.ops):
        if not rw.alive(op):
            continue
        if op.name in RESHAPES and op.result.type.rank == 4 and any(_in_region(u) for u in op.result.uses):
            count += _permute_after_reshape(rw, op)
        elif op.name == "cuvil.permute" and (r := producer(op.operands[0])) is not None and r.name in RESHAPES \
                and r.operands[0].type.rank == 4 and (y := producer(r.operands[0])) is not None and _in_region(y):
            count += _permute_before_reshape(rw, op, r)
    return count


def _lift_through_views(module: Module) -> int:
    """Elementwise ops that read an image op's result through a reshape (a 1-d convolution's
    squeeze, the flatten back to tokens) move above it, with the views of their other operands
    folded: a 1-d CNN's activations then sit between its convolutions at rank 4, in one region,
    and the fuser applies them in the convolutions' epilogues. Returns the ops moved."""
    views = {name: [view_noop, view_of_view] for name in RESHAPES}
    fired = apply_patterns(module, {ANY_OP: [lift_through_view], **views})
    return fired["lift_through_view"]


def lift_through_view(op: Operation, rw: Rewriter) -> bool:
    """elementwise(view(y), ...) -> view(elementwise(y, ...)) for a rank-4 y in an image region,
    when the op's other operands are scalars or have its shape (viewed as y's in turn); and
    slice(view(y)) -> view(slice(y)) along the dim of y that the sliced one is (a GLU's halves)."""
    if len(op.results) != 1 or op.result.type.rank == 4:
        return False
    if op.name == "cuvil.slice":
        return _lift_slice(op, rw)
    if not op.has_tag("elementwise"):
        return False
    view = next((p for v in op.operands if (p := _image_view(v)) is not None), None)
    shape, out = (view.operands[0].type.shape, op.result.type.shape) if view is not None else ((), ())
    if view is None or not all(v.type.rank == 0 or _same_shape(v.type.shape, out) for v in op.operands):
        return False
    operands = []
    for v in op.operands:
        p = producer(v)
        if v.type.rank == 0 or (p is not None and p.name in RESHAPES and _same_shape(p.operands[0].type.shape, shape)):
            operands.append(v if v.type.rank == 0 else p.operands[0])
        else:
            operands.append(rw.create(op, "cuvil.reshape", [v], {"shape": list(shape)}).result)
    lifted = rw.create(op, op.name, operands, dict(op.attrs))
    rw.replace(op, rw.create(op, "cuvil.reshape", [lifted.result], {"shape": list(out)}).results)
    return True


def _lift_slice(op: Operation, rw: Rewriter) -> bool:
    view = _image_view(op.operands[0])
    if view is None:
        return False
    y = view.operands[0]
    groups = _split(view.result.type.shape, y.type.shape)
    dims = [j for j in groups[op.attrs["dim"] % op.result.type.rank] if not dims_equal(y.type.shape[j], 1)] \
        if groups is not None else []
    if len(dims) != 1:
        return False
    sliced = rw.create(op, "cuvil.slice", [y], {**op.attrs, "dim": dims[0]}).result
    rw.replace(op, rw.create(op, "cuvil.reshape", [sliced], {"shape": list(op.result.type.shape)}).results)
    return True


def _image_view(v: Value) -> Operation | None:
    """The reshape (squeeze, unsqueeze) that `v` is of a rank-4 value in an image region, if any."""
    p = producer(v)
    ok = p is not None and p.name in RESHAPES and p.operands[0].type.rank == 4 and \
        (q := producer(p.operands[0])) is not None and _in_region(q)
    return p if ok else None


def _same_shape(a, b) -> bool:
    return len(a) == len(b) and all(dims_equal(x, y) for x, y in zip(a, b))


def _in_region(op: Operation) -> bool:
    return op.name in IMAGE_OPS or _carries_layout(op)


def _permute_after_reshape(rw: Rewriter, reshape: Operation) -> int:
    """reshape(permute(x, p)) whose reshape only splits dims -> permute(reshape(x), p')."""
    permute = producer(reshape.operands[0])
    if permute is None or permute.name != "cuvil.permute":
        return 0
    x, perm = permute.operands[0], permute.attrs["perm"]
    shape = reshape.result.type.shape
    groups = _split(permute.result.type.shape, shape)
    if groups is None:
        return 0
    order = [j for d in range(x.type.rank) for j in groups[perm.index(d)]]    # x's dims split, in x's order
    split = rw.create(reshape, "cuvil.reshape", [x], {"shape": [shape[j] for j in order]}).result
    perm = [order.index(j) for j in range(len(shape))]
    rw.replace(reshape, rw.create(reshape, "cuvil.permute", [split], {"perm": perm}).results)
    return 1


def _permute_before_reshape(rw: Rewriter, permute: Operation, reshape: Operation) -> int:
    """permute(reshape(y), p) whose reshape only merges dims of y -> reshape(permute(y, p''))."""
    y = reshape.operands[0]
    groups = _split(reshape.result.type.shape, y.type.shape)
    if groups is None:
        return 0
    moved = rw.create(permute, "cuvil.permute", [y], {"perm": [j for d in permute.attrs["perm"] for j in groups[d]]})
    rw.replace(permute, rw.create(permute, "cuvil.reshape", [moved.result],
                                  {"shape": list(permute.result.type.shape)}).results)
    return 1


def _split(whole, parts) -> list[list[int]] | None:
    """For each dim of `whole`, the consecutive dims of `parts` it splits into, in order (a 1 in
    `parts` goes with the dim after it, or the last); None when `parts` is not such a split."""
    groups, j = [], 0
    for size in whole:
        start, product = j, 1
        while j < len(parts):
            product, j = product * parts[j], j + 1
            if dims_equal(product, size):
                break
        else:
            return None
        groups.append(list(range(start, j)))
    if not all(dims_equal(parts[i], 1) for i in range(j, len(parts))) or not groups:
        return None
    groups[-1] += list(range(j, len(parts)))
    return groups


STAYING_WHY = ("in a converted region: few output channels, computed along the image rows, and no NHWC op "
               "reads it")


def _staying_nchw(image_ops: list[Operation]) -> set[int]:
    """The image ops that stay in NCHW in a converted region: convolutions that run faster there
    (`codegen.library.columns_pay`: few output channels, computed along the image rows), and the
    pools that read what such an op computes, each only where no NHWC op would read what it
    computes through a conversion (`_read_in_nchw`): image ops copy their input, a conversion
    included, once per tile, but an elementwise op in NHWC would read it a channel per element (a
    ResNet's residual add: 0.60 -> 0.74 ms, all the stem's gain), and a pool that read such a
    conversion ran 12x as long (an RGB stem's max pool: 29 -> 344 us)."""
    staying: set[int] = set()
    for op in image_ops:
        if op.name == "cuvil.conv2d":
            candidate = columns_pay(op)
        else:
            p = producer(op.operands[0])
            while p is not None and p.name not in IMAGE_OPS and _carries_layout(p) and p.has_tag("elementwise"):
                p = producer(p.operands[0])
            candidate = p is not None and id(p) in staying
        if candidate and _read_in_nchw(op.result):
            staying.add(id(op))
    return staying


def _read_in_nchw(v: Value) -> bool:
    """Whether no NHWC op would read `v` through a conversion: every read of it is an image op's
    image (its copy of the input converts it), an op outside any region (a return, a flatten:
    they read NCHW), or an elementwise op whose other operands are constants or of lower rank (an
    activation, a per-channel scale: it runs in NCHW too) whose result is read so in turn."""
    for u in v.uses:
        if u.name in IMAGE_OPS:
            if u.operands[0] is v and all(w is not v for w in u.operands[1:]):
                continue
            return False
        if not _carries_layout(u):
            continue
        alone = all(w is v or w.type.rank < 4 or _constant(w) for w in u.operands)
        if not (u.has_tag("elementwise") and alone and _read_in_nchw(u.result)):
            return False
    return True


def _convertible(op: Operation) -> bool:
    return op.name in IMAGE_OPS and op.attrs["layout"] == "nchw" and op.operands[0].type.rank == 4


def _carries_layout(op: Operation) -> bool:
    """An op a conversion sinks through: elementwise over rank-4 tensors, a pad, a slice or a cat."""
    return len(op.results) == 1 and op.result.type.rank == 4 and (
        op.has_tag("elementwise") or op.name in ("cuvil.pad", "cuvil.slice", "cuvil.cat"))


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


def _pack_product(rw: Rewriter, op: Operation, widest: int) -> int:
    """Pack the constant fp32 matrix of a linear (its weight, [out, in]) or of a matmul (its right
    side, [in, out]: `x @ W` with W stored so, or `x @ W.t()` after fold-constants) in panels
    (`codegen/panel_gemm.py`), the product then a linear of the panels: 1 if it did."""
    weight = op.operands[1]
    p = producer(weight)
    data = rw.module.constants.get(p.attrs["name"]) if p is not None and p.name == "cuvil.const" else None
    if data is None or op.attrs.get("out_features") is not None or data.dtype != torch.float32 or data.dim() != 2:
        return 0
    if any(u is not op for u in weight.uses):   # tied (an embedding's table): packing would store it twice
        return 0
    if op.name == "cuvil.matmul":
        data = data.t()
    name = add_constant(rw.module, f"{p.attrs['name']}.panels", pack_panels(data, widest))
    packed = rw.create(op, "cuvil.const", attrs={"name": name},
                       result_types=[weight.type.with_shape(tuple(rw.module.constants[name].shape))]).result
    new = rw.create(op, "cuvil.linear", [op.operands[0], packed, *op.operands[2:]], {"out_features": data.shape[0]})
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


def sink_conversion_through_slice(op: Operation, rw: Rewriter) -> bool:
    """slice(permute(y, to NCHW)) -> permute(slice(y), to NCHW), along y's own dim: the halves of
    a GLU between two convolutions (a Conformer's) otherwise keep a conversion to NCHW and back."""
    if op.result.type.rank != 4 or not _is_conversion(op.operands[0]):
        return False
    attrs = {**op.attrs, "dim": TO_NHWC.index(op.attrs["dim"] % 4)}
    sliced = rw.create(op, "cuvil.slice", [producer(op.operands[0]).operands[0]], attrs).result
    rw.replace(op, rw.create(op, "cuvil.permute", [sliced], {"perm": list(TO_NCHW)}).results)
    return True


def sink_conversion_through_cat(op: Operation, rw: Rewriter) -> bool:
    """cat(permute(y1, to NCHW), permute(y2, to NCHW), ...) -> permute(cat(y1, y2, ...), to NCHW),
    along the pieces' own dim: DenseNet's concatenation of every earlier layer's features (and
    Inception's branches) otherwise ran in NCHW between NHWC convolutions, each piece transposed
    on its way in and the whole on its way out."""
    if op.result.type.rank != 4 or not all(_is_conversion(v) for v in op.operands):
        return False
    attrs = {**op.attrs, "dim": TO_NHWC.index(op.attrs["dim"] % 4)}
    joined = rw.create(op, "cuvil.cat", [producer(v).operands[0] for v in op.operands], attrs).result
    rw.replace(op, rw.create(op, "cuvil.permute", [joined], {"perm": list(TO_NCHW)}).results)
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
