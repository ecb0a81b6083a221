"""PyTorch's OpInfo samples (torch 2.13 `op_db`) through Cuvil, against eager.

`OPINFOS` maps every row of the frontend's `ATEN_TABLE` to the OpInfos whose samples reach it
after torch.export, `DECOMPOSED` every op Cuvil decomposes itself; `skips.UNMAPPED` explains the
rows no OpInfo reaches. `TESTED_DTYPES` says in
which dtypes each OpInfo runs (float32, plus the integer and bool dtypes where both the OpInfo and
Cuvil's op support them). Every sample must match eager through the imported IR, the O1 IR and the
native code, or be refused with a CuvilError that `skips.REFUSALS` lists with a reason; `skips.NOT_RUN`
names the (OpInfo, dtype)s Cuvil refuses as a whole.
"""
from __future__ import annotations

import functools

import pytest
import torch

from cuvil.frontend.aten_table import ATEN_TABLE
from cuvil.frontend.decompositions import cuvil_decompositions
from cuvil.frontend.importer import op_name

import skips
from opinfo_harness import op_db, refusal_of_first_sample, run_opinfo

pytestmark = [
    # torch.export copying the samples' pytree specs (torch's own deprecation, not Cuvil's)
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning"),
    # var samples with fewer elements than the correction: torch warns, and the result is inf/nan in both
    pytest.mark.filterwarnings("ignore:var\\(\\). degrees of freedom is <= 0:UserWarning"),
]

f32, i64, i32, b8 = torch.float32, torch.int64, torch.int32, torch.bool

# ATen row -> the OpInfos whose samples exercise it
OPINFOS: dict[str, list[str]] = {
    # elementwise, unary
    "aten.relu.default": ["nn.functional.relu"],
    "aten.neg.default": ["neg"],
    "aten.abs.default": ["abs"],
    "aten.exp.default": ["exp"],
    "aten.log.default": ["log"],
    "aten.log1p.default": ["log1p"],
    "aten.expm1.default": ["expm1"],
    "aten.elu.default": ["nn.functional.elu"],
    "aten.selu.default": ["nn.functional.selu"],
    "aten.celu.default": ["nn.functional.celu"],
    "aten.softplus.default": ["nn.functional.softplus"],
    "aten.mish.default": ["nn.functional.mish"],
    "aten.log_sigmoid.default": ["nn.functional.logsigmoid"],
    "aten.sqrt.default": ["sqrt"],
    "aten.rsqrt.default": ["rsqrt"],
    "aten.sin.default": ["sin"],
    "aten.cos.default": ["cos"],
    "aten.tan.default": ["tan"],
    "aten.atan.default": ["atan"],
    "aten.asin.default": ["asin"],
    "aten.acos.default": ["acos"],
    "aten.sinh.default": ["sinh"],
    "aten.cosh.default": ["cosh"],
    "aten.asinh.default": ["asinh"],
    "aten.acosh.default": ["acosh"],
    "aten.atanh.default": ["atanh"],
    "aten.tanh.default": ["tanh"],
    "aten.sigmoid.default": ["sigmoid"],
    "aten.silu.default": ["nn.functional.silu"],
    "aten.erf.default": ["erf"],
    "aten.reciprocal.default": ["reciprocal"],
    "aten.logical_not.default": ["logical_not"],
    "aten.bitwise_not.default": ["bitwise_not"],
    "aten.floor.default": ["floor"],
    "aten.trunc.default": ["trunc"],
    "aten.frac.default": ["frac"],
    "aten.ceil.default": ["ceil"],
    "aten.round.default": ["round"],
    "aten.sign.default": ["sign"],
    "aten.gelu.default": ["nn.functional.gelu"],
    "aten.hardsigmoid.default": ["nn.functional.hardsigmoid"],
    "aten.hardswish.default": ["nn.functional.hardswish"],
    "aten.glu.default": ["nn.functional.glu"],
    "aten.clamp.Tensor": ["clamp"],
    "aten.isnan.default": ["isnan"],
    "aten.isinf.default": ["isinf"],
    "aten.isfinite.default": ["isfinite"],
    "aten.isposinf.default": ["isposinf"],
    "aten.isneginf.default": ["isneginf"],
    "aten.clamp_min.default": ["nn.functional.margin_ranking_loss"],
    "aten.hardtanh.default": ["nn.functional.hardtanh"],
    "aten.leaky_relu.default": ["nn.functional.leaky_relu"],
    "aten.to.dtype": ["float", "long", "bool"],
    # elementwise, binary
    "aten.add.Tensor": ["add"],
    "aten.add.Scalar": ["special.ndtr"],
    "aten.sub.Tensor": ["sub"],
    "aten.rsub.Scalar": ["linspace"],
    "aten.mul.Tensor": ["mul"],
    "aten.mul.Scalar": ["special.ndtr"],
    "aten.div.Tensor": ["div[no_rounding_mode]"],
    "aten.div.Scalar": ["trapz"],
    "aten.div.Tensor_mode": ["div[floor_rounding]", "div[trunc_rounding]"],
    "aten.floor_divide.default": ["floor_divide"],
    "aten.remainder.Tensor": ["remainder"],
    "aten.remainder.Scalar": ["take_along_dim"],
    "aten.fmod.Tensor": ["fmod"],
    "aten.pow.Tensor_Scalar": ["pow", "square"],
    "aten.pow.Tensor_Tensor": ["pow"],
    "aten.topk.default": ["topk"],
    "aten.kthvalue.default": ["kthvalue"],
    "aten.median.dim": ["median"],
    "aten.median.default": ["median"],
    "aten.sort.default": ["sort"],
    "aten.sort.stable": ["sort"],
    "aten.argsort.default": ["argsort"],
    "aten.argsort.stable": ["argsort"],
    "aten.atan2.default": ["atan2"],
    "aten.maximum.default": ["maximum"],
    "aten.minimum.default": ["minimum"],
    "aten.max.other": ["max[binary]"],
    "aten.min.other": ["min[binary]"],
    "aten.eq.Tensor": ["eq"],
    "aten._assert_async.msg": ["nn.functional.one_hot"],
    "aten.eq.Scalar": ["sinc"],
    "aten.ne.Tensor": ["ne"],
    "aten.ne.Scalar": ["count_nonzero"],
    "aten.lt.Tensor": ["lt"],
    "aten.lt.Scalar": ["nn.functional.huber_loss"],
    "aten.le.Tensor": ["le"],
    "aten.le.Scalar": ["nn.functional.threshold"],
    "aten.gt.Tensor": ["gt"],
    "aten.gt.Scalar": ["nn.functional.softshrink"],
    "aten.ge.Tensor": ["ge"],
    "aten.ge.Scalar": ["lerp"],
    "aten.logical_and.default": ["logical_and"],
    "aten.logical_or.default": ["logical_or"],
    "aten.bitwise_and.Tensor": ["bitwise_and"],
    "aten.bitwise_or.Tensor": ["bitwise_or"],
    "aten.bitwise_xor.Tensor": ["bitwise_xor"],
    "aten.where.self": ["where"],
    "aten.where.ScalarSelf": ["sinc"],
    "aten.where.Scalar": ["heaviside"],
    "aten.masked_fill.Scalar": ["masked_fill"],
    "aten.masked_fill.Tensor": ["masked_fill"],
    # reductions and normalisations
    "aten.sum.default": ["sum"],
    "aten.sum.dim_IntList": ["sum"],
    "aten.mean.default": ["mean"],
    "aten.mean.dim": ["mean"],
    "aten.amax.default": ["amax"],
    "aten.amin.default": ["amin"],
    "aten.prod.default": ["prod"],
    "aten.prod.dim_int": ["prod"],
    "aten.var.correction": ["var", "var[unbiased]"],
    "aten.max.dim": ["max[reduction_with_dim]"],
    "aten.max.default": ["max[reduction_no_dim]"],
    "aten.min.default": ["min[reduction_no_dim]"],
    "aten.argmax.default": ["argmax"],
    "aten.min.dim": ["min[reduction_with_dim]"],
    "aten.any.default": ["any"],
    "aten.any.dim": ["any"],
    "aten.any.dims": ["any"],
    "aten.all.default": ["all"],
    "aten.all.dim": ["all"],
    "aten.all.dims": ["all"],
    "aten.linalg_vector_norm.default": ["linalg.vector_norm"],
    "aten.argmin.default": ["argmin"],
    "aten.softmax.int": ["softmax"],
    "aten.log_softmax.int": ["log_softmax"],
    "aten.cumsum.default": ["cumsum"],
    "aten.cumprod.default": ["cumprod"],
    "aten.logcumsumexp.default": ["logcumsumexp"],
    "aten.cummax.default": ["cummax"],
    "aten.cummin.default": ["cummin"],
    "aten.layer_norm.default": ["nn.functional.layer_norm"],
    "aten.native_layer_norm.default": ["native_layer_norm"],
    "aten.rms_norm.default": ["nn.functional.rms_norm"],
    "aten.group_norm.default": ["nn.functional.group_norm"],
    "aten.native_group_norm.default": ["native_group_norm"],
    "aten.instance_norm.default": ["nn.functional.instance_norm"],
    "aten.batch_norm.default": ["nn.functional.batch_norm"],
    # linear algebra, convolution, pooling, attention
    "aten.linear.default": ["nn.functional.linear"],
    "aten.matmul.default": ["matmul"],
    "aten.mm.default": ["mm"],
    "aten.bmm.default": ["bmm"],
    "aten.einsum.default": ["einsum"],
    "aten.addmm.default": ["addmm"],
    "aten.baddbmm.default": ["baddbmm"],
    "aten.conv1d.default": ["nn.functional.conv1d"],
    "aten.conv2d.default": ["nn.functional.conv2d"],
    "aten.conv3d.default": ["nn.functional.conv3d"],
    "aten.conv1d.padding": ["nn.functional.conv1d"],
    "aten.conv3d.padding": ["nn.functional.conv3d"],
    "aten.max_pool3d.default": ["nn.functional.max_pool3d"],
    "aten.avg_pool3d.default": ["nn.functional.avg_pool3d"],
    "aten.adaptive_avg_pool3d.default": ["nn.functional.adaptive_avg_pool3d"],
    "aten.conv_transpose1d.default": ["nn.functional.conv_transpose1d"],
    "aten.conv_transpose2d.input": ["nn.functional.conv_transpose2d"],
    "aten.conv_transpose3d.input": ["nn.functional.conv_transpose3d"],
    "aten.max_pool2d.default": ["nn.functional.max_pool2d"],
    "aten.max_pool1d.default": ["nn.functional.max_pool1d"],
    "aten.upsample_nearest1d.vec": ["nn.functional.interpolate[nearest]"],
    "aten.upsample_nearest2d.vec": ["nn.functional.interpolate[nearest]", "nn.functional.upsample_nearest"],
    "aten._upsample_nearest_exact1d.vec": ["nn.functional.interpolate[nearest-exact]"],
    "aten._upsample_nearest_exact2d.vec": ["nn.functional.interpolate[nearest-exact]"],
    "aten.upsample_linear1d.vec": ["nn.functional.interpolate[linear]"],
    "aten.upsample_bilinear2d.vec": ["nn.functional.interpolate[bilinear]", "nn.functional.upsample_bilinear"],
    "aten.upsample_bicubic2d.vec": ["nn.functional.interpolate[bicubic]"],
    "aten.pixel_shuffle.default": ["nn.functional.pixel_shuffle"],
    "aten.pixel_unshuffle.default": ["nn.functional.pixel_unshuffle"],
    "aten.diff.default": ["diff"],
    "aten.flip.default": ["flip", "fliplr", "flipud"],
    "aten.unfold.default": ["unfold", "unfold_copy"],
    "aten.im2col.default": ["nn.functional.unfold"],
    "aten.eye.default": ["eye"],
    "aten.eye.m": ["eye"],
    "aten.slice_scatter.default": ["slice_scatter"],
    "aten.select_scatter.default": ["select_scatter"],
    "aten.roll.default": ["roll"],
    "aten.repeat.default": ["repeat", "tile"],
    "aten.repeat_interleave.self_int": ["repeat_interleave"],
    "aten.avg_pool2d.default": ["nn.functional.avg_pool2d"],
    "aten.adaptive_avg_pool2d.default": ["nn.functional.adaptive_avg_pool2d"],
    "aten.adaptive_avg_pool1d.default": ["nn.functional.adaptive_avg_pool1d"],
    "aten.adaptive_max_pool2d.default": ["nn.functional.adaptive_max_pool2d"],
    "aten.embedding.default": ["nn.functional.embedding"],
    "aten.scaled_dot_product_attention.default": ["nn.functional.scaled_dot_product_attention"],
    # shapes, views, indexing
    "aten.view.default": ["view", "reshape"],
    "aten.flatten.using_ints": ["flatten"],
    "aten._unsafe_view.default": ["nn.functional.channel_shuffle"],
    "aten.expand.default": ["expand"],
    "aten.permute.default": ["permute"],
    "aten.transpose.int": ["transpose"],
    "aten.t.default": ["t"],
    "aten.numpy_T.default": ["T"],
    "aten.slice.Tensor": ["slice", "narrow"],
    "aten.select.int": ["select"],
    "aten.split_with_sizes.default": ["split_with_sizes", "split[list_args]"],
    "aten.split.Tensor": ["split"],
    "aten.chunk.default": ["chunk"],
    "aten.cat.default": ["cat"],
    "aten.stack.default": ["stack"],
    "aten.pad.default": ["nn.functional.pad[constant]", "nn.functional.pad[reflect]", "nn.functional.pad[replicate]",
                         "nn.functional.pad[replicate_negative]", "nn.functional.pad[circular]"],
    "aten.constant_pad_nd.default": ["constant_pad_nd"],
    "aten.unsqueeze.default": ["unsqueeze"],
    "aten.squeeze.default": ["squeeze"],
    "aten.squeeze.dim": ["squeeze"],
    "aten.squeeze.dims": ["squeeze[multiple]"],
    "aten.index_select.default": ["index_select"],
    "aten.gather.default": ["gather"],
    "aten.index_put.default": ["index_put"],
    "aten.index.Tensor": ["__getitem__"],
    "aten.triu.default": ["triu"],
    "aten.tril.default": ["tril"],
    # tensor factories
    "aten.full.default": ["full"],
    "aten.full_like.default": ["full_like"],
    "aten.fill.Scalar": ["fill"],
    "aten.new_full.default": ["new_full"],
    "aten.zeros.default": ["zeros"],
    "aten.zeros_like.default": ["zeros_like"],
    "aten.new_zeros.default": ["new_zeros"],
    "aten.ones.default": ["ones"],
    "aten.ones_like.default": ["ones_like"],
    "aten.new_ones.default": ["new_ones"],
    "aten.scalar_tensor.default": ["scalar_tensor"],
    "aten.arange.default": ["diag_embed"],
    "aten.arange.start": ["linspace", "diag_embed"],
    "aten.arange.start_step": ["arange"],
    # value-semantics no-ops
    "aten.clone.default": ["clone"],
    "aten.alias.default": ["alias_copy"],
    # what torch.export inserts around the ops
    "aten._assert_tensor_metadata.default": ["long"],
    "getitem": ["split", "max[reduction_with_dim]"],
}

# Cuvil's own decompositions (frontend/decompositions.py: ops with no row, written in ops that have
# one) -> the OpInfos whose samples reach them
DECOMPOSED: dict[str, list[str]] = {
    "aten.scatter.value": ["scatter"],
    "aten.scatter.src": ["scatter"],
    "aten.scatter_add.default": ["scatter_add"],
    "aten.scatter_reduce.two": [f"scatter_reduce[{r}]" for r in ("sum", "prod", "mean", "amax", "amin")],
    "aten.histc.default": ["histc"],
    "aten.grid_sampler_2d.default": ["nn.functional.grid_sample", "grid_sampler_2d"],
}

F = (f32,)
FI = (f32, i64)
FIB = (f32, i64, b8)
FIIB = (f32, i64, i32, b8)

# OpInfo -> dtypes it runs in (float32 only unless listed)
TESTED_DTYPES: dict[str, tuple[torch.dtype, ...]] = {
    "neg": FI, "abs": FI, "exp": FI, "sign": FIB, "logical_not": FIB, "bitwise_not": (b8,),
    "float": FIB, "long": FIB, "bool": FIB,
    "add": FIIB, "sub": FI, "mul": FIIB, "div[no_rounding_mode]": FI, "div[floor_rounding]": FI,
    "div[trunc_rounding]": FI,
    "floor_divide": FI, "remainder": FI, "fmod": FI, "pow": F, "atan2": FI, "atan": FI, "maximum": FIB, "minimum": FI,
    "max[binary]": FI, "min[binary]": FI, "diff": FIB,
    "topk": FI, "sort": FI, "argsort": FI, "kthvalue": FI, "median": FI,
    "nn.functional.one_hot": (i64,), "eq": FIB, "ne": FIB, "lt": FI, "le": FI, "gt": FI, "ge": FI, "logical_and": FIB, "logical_or": FIB,
    "bitwise_and": (i64, b8), "bitwise_or": (i64, b8), "bitwise_xor": (i64, b8), "where": FIB, "masked_fill": FIB,
    "sum": FIB, "amax": FIB, "amin": FI, "prod": FI, "max[reduction_with_dim]": FIB, "max[reduction_no_dim]": FIB, "min[reduction_no_dim]": FIB, "argmax": FI, "argmin": FI,
    "cumsum": FI, "cumprod": FI, "cummax": FIB, "cummin": FI, "cat": FIIB, "permute": FIB, "expand": FIB, "view": FI, "narrow": FIB, "select": FIB,
    "split": FI, "index_select": FIB, "gather": FI, "__getitem__": FIB, "triu": FIB, "tril": FI,
    "nn.functional.pad[constant]": FIB, "constant_pad_nd": FIB, "nn.functional.pad[replicate]": FI,
    "any": FIB, "all": FIB, "min[reduction_with_dim]": FIB, "isnan": (f32,), "isinf": FI, "isfinite": FI, "isposinf": FI, "isneginf": FI, "roll": FIB, "repeat": FIB, "tile": FI,
    "full": FIB, "zeros": FI, "ones": FIB, "arange": FI, "clone": FIB,
}


# OpInfo -> the outputs compared, where Cuvil produces only the inference ones
OUTPUTS: dict[str, tuple[int, ...]] = {
    "native_layer_norm": (0,),      # not the saved mean/rstd (training-only; Cuvil's row leaves them out)
    "native_group_norm": (0,),
}


def mapped_opinfos() -> list[str]:
    return sorted({k for keys in (*OPINFOS.values(), *DECOMPOSED.values()) for k in keys})


CASES = [(key, dt) for key in mapped_opinfos() for dt in TESTED_DTYPES.get(key, F)]


@functools.cache
def results(key: str):
    return run_opinfo(key, TESTED_DTYPES.get(key, F), OUTPUTS.get(key))


def result(key: str, dtype: torch.dtype):
    return results(key)[dtype]


def _id(case) -> str:
    key, dtype = case
    return f"{key}-{str(dtype).removeprefix('torch.')}"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_opinfo_samples_match_eager(case):
    key, dtype = case
    assert dtype in op_db()[key].supported_dtypes("cpu"), f"{key} has no {dtype} samples; fix TESTED_DTYPES"
    r = result(key, dtype)
    assert r.outcomes, f"{key} yields no {dtype} samples"
    report = [f"{o.case.describe()}: {o.detail}" for o in r.failures]
    assert not report, (f"{len(report)} of {len(r.outcomes)} samples of {key} ({dtype}) failed:\n\n"
                        + "\n\n".join(report))
    assert r.count("passed") > 0, f"every sample of {key} ({dtype}) is refused: list it in skips.NOT_RUN instead"


def test_every_aten_row_is_mapped_or_explained():
    rows = {op_name(target) for target in ATEN_TABLE}
    missing = sorted(r for r in rows if not OPINFOS.get(r) and r not in skips.UNMAPPED)
    assert not missing, f"ATen rows with neither an OpInfo nor a skips.UNMAPPED reason: {missing}"
    stale = sorted((set(OPINFOS) | set(skips.UNMAPPED)) - rows)
    assert not stale, f"mapped or explained rows that ATEN_TABLE no longer has: {stale}"
    both = sorted(set(OPINFOS) & set(skips.UNMAPPED))
    assert not both, f"rows both mapped and explained as unmapped: {both}"
    assert all(reason.strip() for reason in skips.UNMAPPED.values())


def test_every_decomposition_of_cuvils_is_mapped():
    aten_ops = {op_name(t) for t in cuvil_decompositions() if t.namespace == "aten"}
    assert aten_ops == set(DECOMPOSED)


def test_every_mapped_opinfo_exists():
    unknown = [k for k in mapped_opinfos() if k not in op_db()]
    assert not unknown, f"no OpInfo named {unknown} in torch's op_db"
    stale = sorted((set(TESTED_DTYPES) | set(OUTPUTS)) - set(mapped_opinfos()))
    assert not stale, f"TESTED_DTYPES/OUTPUTS name OpInfos that OPINFOS does not map: {stale}"


def test_each_row_is_reached_by_its_opinfos():
    """The mapping is honest: importing some sample of the row's OpInfos uses that row."""
    unreached = []
    for row, keys in OPINFOS.items():
        if not any(row in result(k, dt).rows for k in keys for dt in TESTED_DTYPES.get(k, F)):
            unreached.append(f"{row} (by {keys})")
    assert not unreached, "rows no sample of their mapped OpInfos reaches:\n" + "\n".join(unreached)


def test_every_skip_entry_is_used():
    """An entry no sample needs any more is stale: delete it so the list stays short and true."""
    used = {id(o.refusal) for key, dt in CASES for o in result(key, dt).outcomes if o.refusal is not None}
    unused = [f"{r.op}: {r.message!r}" for r in skips.REFUSALS if id(r) not in used]
    assert not unused, "skip entries no sample needs:\n" + "\n".join(unused)
    assert all(r.reason.strip() for r in skips.REFUSALS)


@pytest.mark.parametrize("entry", skips.NOT_RUN, ids=lambda e: e.op)
def test_not_run_entries_are_still_refused(entry):
    assert entry.dtypes, "a NOT_RUN entry names its dtypes"
    assert not [dt for dt in entry.dtypes if (entry.op, dt) in CASES], f"{entry.op} is both run and NOT_RUN"
    for dtype in entry.dtypes:
        error = refusal_of_first_sample(entry.op, dtype)
        assert error is not None, f"Cuvil now takes the first {dtype} sample of {entry.op}: run it (TESTED_DTYPES)"
        assert entry.matches(entry.op, dtype, error), f"{entry.op} ({dtype}) is refused for another reason: {error}"
