"""The explicit skip list of the OpInfo tests: every entry says why.

`REFUSALS`: CuvilErrors that are Cuvil's legitimate answer for some samples of an OpInfo (an
argument or a form a row does not support). A refusal counts only if an entry here matches the
OpInfo, the dtype, and the error's text; an unlisted refusal fails the test, and an entry that
no sample needs any more fails `test_every_skip_entry_is_used`.

`NOT_RUN`: (OpInfo, dtype)s that Cuvil refuses as a whole; only their first sample is run, to check
that it still is refused.

`UNMAPPED`: rows of `ATEN_TABLE` that no OpInfo exercises, and why they are covered elsewhere or
cannot be.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Refusal:
    op: str                        # OpInfo key: `name` or `name[variant]`
    message: str                   # regex searched in the CuvilError's text
    reason: str                    # why this refusal is right (or which missing feature it is)
    dtypes: tuple[torch.dtype, ...] = ()    # empty: every dtype the OpInfo is tested in

    def matches(self, key: str, dtype: torch.dtype, text: str) -> bool:
        in_dtypes = not self.dtypes or dtype in self.dtypes
        return self.op == key and in_dtypes and re.search(self.message, text) is not None


F64 = "a float64 result: Cuvil has no f64 dtype (f32, f16, bf16, i64, i32, i8, i1)"
U8 = "a uint8 tensor: Cuvil has no unsigned 8-bit dtype"
POOL_INDICES = ("return_indices=True: Cuvil's pooling computes no argmax indices (its max_pool2d/3d_with_indices "
                "rows keep output 0 only)")

REFUSALS: list[Refusal] = [
    Refusal("full_like", r"dtype torch\.float64", F64),
    Refusal("new_full", r"dtype torch\.float64", F64),
    Refusal("new_ones", r"dtype torch\.float64", F64),
    Refusal("new_zeros", r"dtype torch\.float64", F64),
    Refusal("ones_like", r"dtype torch\.float64", F64),
    Refusal("zeros_like", r"dtype torch\.float64", F64),
    Refusal("gather", r"dtype torch\.uint8", U8 + " (the sample's index tensor)"),
    Refusal("narrow", r"torch\.export could not capture.*unbacked", "narrow with a tensor `start`: the slice "
            "bounds depend on tensor data, which torch.export cannot capture with static shapes"),
    Refusal("nn.functional.one_hot", r"torch\.export could not capture.*data-dependent", "num_classes=-1: the "
            "result's size is the largest class value plus one, read from the data, which torch.export cannot "
            "capture"),
    Refusal("nn.functional.batch_norm", r"'mutation'.*in place", "training=True updates running_mean/var in "
            "place; Cuvil imports inference functions"),
    Refusal("nn.functional.embedding", r"'mutation'.*in place", "max_norm renormalises rows of the weight in "
            "place; Cuvil imports inference functions"),
    Refusal("nn.functional.max_pool1d", r"indices output of max_pool2d_with_indices", POOL_INDICES),
    Refusal("nn.functional.max_pool2d", r"indices output of max_pool2d_with_indices", POOL_INDICES),
    Refusal("nn.functional.adaptive_max_pool2d", r"indices output of adaptive_max_pool2d", POOL_INDICES),
    Refusal("nn.functional.max_pool3d", r"indices output of max_pool3d_with_indices", POOL_INDICES),
    Refusal("scatter", r"unsupported op 'aten\.scatter\.reduce'", "scatter with reduce='add' or 'multiply' "
            "(deprecated in torch): no decomposition of Cuvil's takes it"),
    Refusal("scatter_add", r"unsupported op 'aten\.scatter_add\.default'", "a 0-d input: Cuvil's decomposition "
            "compares the index with positions along `dim` (frontend/decompositions.py), which a 0-d input has none of"),
    Refusal("histc", r"unsupported op 'aten\.histc\.default'", "min == max: the bins span the data's own range, "
            "a value torch.export would read as a size"),
    Refusal("repeat_interleave", r"unsupported op 'aten\.repeat_interleave\.Tensor'", "repeats given as a tensor: "
            "the output's size depends on its values, a shape no static or symbolic size describes"),
    Refusal("nn.functional.scaled_dot_product_attention", r"dropout_p=", "dropout_p > 0 is random (training); "
            "inference attention needs dropout_p=0"),
]

# (OpInfo, dtypes) whose first samples Cuvil refuses every one of: not run sample by sample (each
# refused sample costs a separate export); `test_not_run_entries_are_still_refused` checks the first
NOT_RUN: list[Refusal] = [
    Refusal("to", r"dtype torch\.float64", "its first samples all convert to float64, which Cuvil lacks "
            "(float/long/bool cover _to_copy)", (torch.float32,)),
    Refusal("pow", r"integer pow needs a constant non-negative exponent", "native integer pow takes only a "
            "constant non-negative exponent; the samples raise to tensors", (torch.int64,)),
    Refusal("bitwise_not", r"bitwise not of an integer tensor", "Cuvil's IR has no integer bitwise not (bool "
            "logical_not only)", (torch.int64,)),
]

_NOT_COMPUTE = ("not a computation but symbolic-int arithmetic or a shape check, which torch.export emits "
                "only for dynamic shapes; OpInfo samples are imported with static ones")

_DECOMPOSED = ("torch.export emits it only when Cuvil runs run_decompositions (a graph with an op Cuvil does not "
               "import directly); OpInfo samples whose graphs Cuvil imports whole reach {} instead")
_ZOO = ("no OpInfo sample exports to it; the Hugging Face zoo models (tests/differential) do, in eval mode, "
        "through {}")

UNMAPPED: dict[str, str] = {
    "aten.max_pool2d_with_indices.default": _DECOMPOSED.format("aten.max_pool2d.default and aten.max_pool1d.default")
                                            + "; samples asking for the indices are refused (POOL_INDICES)",
    "aten.conv2d.padding": "nn.functional.conv2d's OpInfo samples give the padding as numbers (conv1d's and "
                           "conv3d's give 'same' and 'valid'); tests/unit/test_frontend.py::"
                           "test_conv2d_padding_by_name compiles both against eager",
    "aten._upsample_bilinear2d_aa.vec": "OpInfo's interpolate samples never set antialias=True; "
                                        "tests/codegen/test_resample.py compares it with eager",
    "aten._upsample_bicubic2d_aa.vec": "as _upsample_bilinear2d_aa: no antialiased OpInfo sample; "
                                       "tests/codegen/test_resample.py compares it with eager",
    "aten._to_copy.default": _DECOMPOSED.format("aten.to.dtype (the float, long and bool OpInfos)"),
    "aten._native_batch_norm_legit_no_training.default": _DECOMPOSED.format("aten.batch_norm.default"),
    "aten.dropout.default": "OpInfo's dropout samples run in training mode (random), which Cuvil sends through "
                            "decompositions and refuses; " + _ZOO.format("nn.Dropout in BERT, GPT2 and ViT"),
    **{f"aten.bitwise_{op}.Scalar": f"OpInfo's bitwise_{op} samples take two tensors; `x {sym} 5` exports to it, "
                                    f"which tests/unit/test_frontend_ops.py compares with eager"
       for op, sym in (("and", "&"), ("or", "|"), ("xor", "^"))},
    "aten.__and__.Tensor": "OpInfo's `&` samples (__rand__) export as aten.bitwise_and.Tensor; "
                           + _ZOO.format("the `&` of BERT's and GPT2's attention masks"),
    "aten.to.device": _ZOO.format("BERT's attention-mask `.to(device)`"),
    "aten.clamp.default": "OpInfo's clamp samples bound by tensors (aten.clamp.Tensor), and hardsigmoid and hardswish, "
                          "which decomposed to it, have rows of their own; tests/unit/test_frontend_ops.py::"
                          "test_elementwise compiles x.clamp(-0.5, 0.5) and x.clamp(min=0.1) against eager",
    "aten.__or__.Tensor": "OpInfo's `|` samples (__ror__) export as aten.bitwise_or.Tensor; "
                          + _ZOO.format("Funnel's attention-mask `|`"),
    "aten.multiply.Tensor": "no OpInfo is named multiply (mul's export as aten.mul.Tensor); "
                            + _ZOO.format("ConvBERT's `torch.multiply`"),
    "aten.reshape_as.default": "OpInfo's reshape_as samples export as aten.view.default; "
                               + _ZOO.format("LeViT's `reshape_as`"),
    "aten._weight_norm.default": "no OpInfo for weight_norm; " + _ZOO.format("wav2vec2's and HuBERT's positional "
                                                                            "convolution (torch.nn.utils.weight_norm)"),
    "aten.to.dtype_layout": _ZOO.format("BERT's and GPT2's mask `.to(dtype=...)`"),
    "aten.clamp_max.default": "OpInfo's clamp_max samples bound by tensors, which export as aten.clamp.Tensor "
                              "(no row), and no OpInfo decomposes to the scalar form",
    "aten.pow.Scalar": "only logspace decomposes to it, in float64 on constants, which torch computes at import "
                       "(frontend/static_values.py; tests/unit/test_static_values.py compiles logspace)",
    "aten.copy.default": "no OpInfo exports to it (a model's `x.copy_(y)` and `x[...] = y` do); tests/unit/"
                         "test_frontend.py::test_assignments_into_tensors_made_in_the_model compiles them against eager",
    "aten.fill.Tensor": "no OpInfo exports to it (fill's samples fill with numbers; Swin's `mask[a:b, c:d] = count` "
                        "does, through frontend/inplace.py); tests/unit/test_inplace_import.py::"
                        "test_writes_through_views_of_fresh_tensors_import_without_decomposition compiles it against eager",
    "aten._assert_async.default": "no OpInfo exports to it (F.one_hot gives the .msg form); tests/unit/"
                                  "test_index_checks.py::test_an_assertion_without_a_message_and_one_beside_an_"
                                  "empty_output_are_checked compiles it against eager",
    "aten.fmod.Scalar": "OpInfo's fmod samples divide by tensors only; tests/unit/test_frontend.py::"
                        "test_fmod_and_remainder_by_a_python_number compiles the scalar form against eager",
    "cuvil.check_index.default": "Cuvil's own op (a scatter's index, checked), with no OpInfo; the scatter "
                                 "OpInfo samples run through it, and tests/unit/test_index_checks.py::"
                                 "test_a_scatter_index_outside_the_input_raises_where_it_wrote_nothing checks "
                                 "what it refuses",
    "cuvil.grouped_mm.default": "Cuvil's own op (a mixture of experts' grouped product), with no OpInfo; "
                                "tests/codegen/test_grouped_matmul.py compares it with its torch loop of products",
    "aten.empty.memory_format": "an empty tensor's values are undefined, so no OpInfo sample can compare them; "
                                "DeepSeek-V3's attention fills one it makes with two slices (`new_empty`, then "
                                "`copy_`), which tests/differential/test_hf_models.py compares",
    "aten.empty_permuted.default": "an empty tensor's values are undefined, so no OpInfo sample can compare them; "
                                   "tests/differential/test_hf_models.py::test_a_mixture_of_experts_decodes_as_eager "
                                   "fills one made in the model (Mixtral's `torch.empty_like(perm)`)",
    "aten.sub.Scalar": "only cosine_embedding_loss and nanquantile decompose to it, and both also need ops "
                       "without a row (empty_permuted; sort, isnan)",
    "aten._softmax.default": "torch.export keeps softmax.int whole for Cuvil (its decomposition table leaves it "
                             "out), so no exported OpInfo sample holds the decomposed form",
    "aten._log_softmax.default": "as _softmax: log_softmax.int stays whole, so no OpInfo sample exports to it",
    "aten._adaptive_avg_pool2d.default": "adaptive_avg_pool2d stays whole under Cuvil's decomposition table, "
                                         "so no OpInfo sample exports to the underscored form",
    "aten._adaptive_avg_pool3d.default": "as _adaptive_avg_pool2d (tests/codegen/test_conv3d.py calls it directly)",
    "aten.max_pool3d_with_indices.default": "max_pool3d stays whole, and the return_indices samples are refused "
                                            "(POOL_INDICES); tests/codegen/test_conv3d.py calls the row directly",
    "aten.where.ScalarOther": "no OpInfo sample exports to it (torch.where(c, x, 0.5)); tests/unit/test_frontend.py::"
                              "test_ops_imported_without_decompositions compiles it against eager",
    "aten.type_as.default": "op_db has no type_as OpInfo; tests/unit/test_frontend.py::"
                            "test_ops_imported_without_decompositions compiles it against eager",
    "aten.contiguous.default": "torch.export drops the contiguous OpInfo's calls (its samples are contiguous); "
                               "tests/unit/test_frontend.py::test_ops_imported_without_decompositions keeps one",
    "aten.reshape.default": "reshape is CompositeImplicitAutograd: torch.export always turns it into "
                            "view/_unsafe_view (the reshape OpInfo runs under aten.view.default)",
    "aten.convolution.default": "OpInfo's 1-d and 2-d convolutions export as aten.conv1d, aten.conv2d and "
                                "aten.conv_transpose1d/2d/3d; aten.convolution comes from a module's forward and "
                                "from decompositions (covered by the model tests: tests/codegen/"
                                "test_transposed_conv.py and test_conv3d.py)",
    "aten.lift_fresh_copy.default": "no OpInfo sample reaches it: torch 2.13 exports a tensor literal as a lifted "
                                    "constant plus aten.clone",
    "aten.detach.default": "of the OpInfos only nanmean calls .detach(), and its decomposition also needs isnan, "
                           "which has no row",
    "aten._native_batch_norm_legit.no_stats": "OpInfo's training-mode batch_norm samples carry running statistics "
                                               "(refused: they update them in place); tests/unit/test_frontend.py::"
                                               "test_batch_norm_over_the_batchs_own_statistics and BiT in "
                                               "tests/differential/test_hf_models.py compare it with eager",
    "aten._assert_scalar.default": _NOT_COMPUTE,
    "aten.sym_constrain_range_for_size.default": _NOT_COMPUTE,
    "aten.sym_size.int": _NOT_COMPUTE,
    "aten._local_scalar_dense.default": _NOT_COMPUTE + " (.item() of a tensor holding a size); tests/unit/"
                                        "test_dynamic_sizes_against_eager.py::test_a_size_held_in_a_tensor_bounds_a_"
                                        "slice_and_a_clamp",
    "aten.sym_storage_offset.default": _NOT_COMPUTE + " (a slice between .item() bounds); tests/unit/"
                                       "test_dynamic_sizes_against_eager.py::test_a_size_held_in_a_tensor_bounds_a_"
                                       "slice_and_a_clamp",
    "aten.sym_numel.default": _NOT_COMPUTE,
    "add": _NOT_COMPUTE,
    "sub": _NOT_COMPUTE,
    "mul": _NOT_COMPUTE,
    "floordiv": _NOT_COMPUTE,
    "neg": _NOT_COMPUTE + "; tests/unit/test_frontend.py::test_a_negated_size_as_a_slice_bound",
    "mod": _NOT_COMPUTE,
    "pow": _NOT_COMPUTE,
    "sym_max": _NOT_COMPUTE + "; tests/unit/test_frontend.py::test_a_max_of_sizes_is_the_argument_the_ranges_decide",
    "sym_min": _NOT_COMPUTE + "; tests/unit/test_frontend.py::test_a_max_of_sizes_is_the_argument_the_ranges_decide",
    **{name: _NOT_COMPUTE + "; a condition on sizes, decided at capture (tests/unit/test_size_conditions.py)"
       for name in ("eq", "ne", "lt", "le", "gt", "ge", "sym_not", "and_", "or_")},
}


def matching_refusal(key: str, dtype: torch.dtype, text: str) -> Refusal | None:
    return next((r for r in REFUSALS if r.matches(key, dtype, text)), None)
