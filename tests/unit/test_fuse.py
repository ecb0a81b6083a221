"""The fuse pass: which ops it groups (and in what priority), every refusal with its rule, its
options, the `fuse.group` attributes the compiler reads back, and fused reductions computed
natively against eager and an fp64 reference. Also the discardable (dotted) attributes it uses."""
import pytest
import torch

from cuvil.codegen.grouping import groups_from_attrs
from cuvil.compiler import compile_module
from cuvil.errors import CuvilError, CuvilVerifyError
from cuvil.ir import (Builder, DType, Function, Module, TensorType, custom_op, interpret, parse, print_module, sym,
                      verify)
from cuvil.ir.core import OP_REGISTRY
from cuvil.passes import PassManager
from cuvil.passes.fuse import FusePass

F32 = DType.f32
S = sym("s0")


def T(*shape, dtype=F32):
    return TensorType(dtype, tuple(shape))


def module(build, *arg_types) -> Module:
    symbols = {"s0": (1, 64)} if any(S in t.shape for t in arg_types) else {}
    fn = Function("forward", arg_types, [f"a{i}" for i in range(len(arg_types))], symbols)
    b = Builder(fn)
    outs = build(b, *fn.args)
    b.create("cuvil.return", list(outs) if isinstance(outs, (list, tuple)) else [outs])
    m = Module()
    m.add_function(fn)
    verify(m)
    return m


def fuse(m: Module, **options) -> dict:
    return FusePass(**options).run(m)


def summaries(stats) -> list[tuple[str, str]]:
    return [(g["kind"], g["summary"]) for g in stats["fusion"]["groups"]]


def refusals(stats) -> list[tuple[str, str, str]]:
    return [(r["candidate"], r["rule"], r["reason"]) for r in stats["fusion"]["refused"]]


def lit(b, value):
    return b("cuvil.literal", value=value, dtype=F32)


# ----------------------------------------------------------------------------- discardable attributes

ANNOTATED = """cuvil.func @forward(%x: tensor<s0x4xf32>) -> tensor<s0x4xf32> attributes {symbols = {s0 = [1, 8]}} {
  %0 = cuvil.relu %x {fuse.group = 3, note.text = "hot", sched.v = [1, 2]} : tensor<s0x4xf32> -> tensor<s0x4xf32>
  %1 = cuvil.softmax %0 {dim = 1, fuse.group = 3} : tensor<s0x4xf32> -> tensor<s0x4xf32>
  cuvil.return %1 : tensor<s0x4xf32>
}
"""


def test_discardable_attributes_round_trip_and_are_ignored_by_semantics():
    m = parse(ANNOTATED)
    assert print_module(m) == ANNOTATED
    relu, softmax = m.main.ops[:2]
    assert relu.attrs == {"fuse.group": 3, "note.text": "hot", "sched.v": [1, 2]}
    assert relu.semantic_attrs == {} and softmax.semantic_attrs == {"dim": 1}
    x = torch.randn(3, 4)
    torch.testing.assert_close(interpret(m, x)[0], torch.softmax(torch.relu(x), 1))
    PassManager("verify,shape-infer,canonicalize,cse,dce").run(m)
    assert m.main.ops[0].attrs["fuse.group"] == 3          # kept by passes that keep the op


def test_undotted_unknown_attributes_are_still_refused():
    with pytest.raises(CuvilError, match="unknown attribute 'group' for cuvil.relu"):
        parse(ANNOTATED.replace("fuse.group = 3, note", "group = 3, note"))
    m = parse(ANNOTATED)
    m.main.ops[0].attrs["group"] = 1
    with pytest.raises(CuvilVerifyError, match="unknown attribute 'group'"):
        verify(m)
    m.main.ops[0].attrs.pop("group")
    m.main.ops[0].attrs["bad.value"] = object()
    with pytest.raises(CuvilVerifyError, match="discardable attribute 'bad.value': a value of type object"):
        verify(m)


def test_user_op_reference_does_not_see_discardable_attributes():
    before = dict(OP_REGISTRY)
    try:
        @custom_op("mylib.twice", operands=("x",), tags={"elementwise"})
        def twice(x, **attrs):
            assert not attrs, attrs
            return x * 2
        m = module(lambda b, x: b.create("mylib.twice", [x], {"fuse.group": 0}).result, T(3))
        assert m.main.ops[0].attrs == {"fuse.group": 0}
        x = torch.randn(3)
        torch.testing.assert_close(interpret(m, x)[0], x * 2)
    finally:
        OP_REGISTRY.clear()
        OP_REGISTRY.update(before)


@pytest.mark.parametrize("groups, merged", [((1, 2), 0), ((1, 1), 1)])
def test_cse_merges_only_ops_with_equal_discardable_attributes(groups, merged):
    def build(b, x):
        a, c = (b.create("cuvil.relu", [x], {"fuse.group": g}).result for g in groups)
        return b("cuvil.add", a, c)
    m = module(build, T(3))
    assert PassManager("verify,cse").run(m)[1].statistics["merged"] == merged


# ----------------------------------------------------------------------------- decisions


def test_elementwise_chain_with_broadcasting_is_one_group():
    m = module(lambda b, x, y: b("cuvil.tanh", b("cuvil.mul", b("cuvil.add", x, y), lit(b, 0.5))), T(S, 8), T(8))
    stats = fuse(m)
    assert summaries(stats) == [("elementwise", "add + mul + tanh")]
    assert (stats["groups"], stats["fused-ops"], stats["refused"]) == (1, 3, 0)
    assert [op.attrs.get("fuse.group") for op in m.main.ops] == [0, None, 0, 0, None]   # literals: recomputed
    group = stats["fusion"]["groups"][0]
    assert group["root"] == "%3" and group["values"] == ["%0", "%2", "%3"]
    assert group["ops"] == [op.id for op in m.main.ops[:-1]]


def test_long_chain_is_one_kernel_until_max_ops():
    def build(b, x):
        for k in range(20):
            x = b(("cuvil.sin", "cuvil.exp", "cuvil.tanh", "cuvil.neg")[k % 4], x)
        return x
    assert [g["size"] for g in fuse(module(build, T(S, 4096)))["fusion"]["groups"]] == [20]
    stats = fuse(module(build, T(S, 4096)), max_ops=16)
    assert [g["size"] for g in stats["fusion"]["groups"]] == [4, 16]
    assert refusals(stats) == [("%3", "max-ops", "max-ops=16 reached (the groups have 4 + 16 ops)")]


def test_ops_a_kernel_would_recompute_per_broadcast_element_are_computed_once():
    """Six ops on a row of 8, added to each of 64 rows: fused, the kernel would compute each of
    them 64 times per element of the row. Past four such ops the rest stay in a kernel of their
    own. Over 3 rows (less than 4x) the chain is one kernel."""
    def build(b, x, y):
        for name in ("cuvil.sin", "cuvil.exp", "cuvil.tanh", "cuvil.neg", "cuvil.sin", "cuvil.exp"):
            y = b(name, y)
        return b("cuvil.add", x, y)
    stats = fuse(module(build, T(64, 8), T(8)))
    assert summaries(stats) == [("elementwise", "sin + exp"), ("elementwise", "tanh + neg + sin + exp + add")]
    assert refusals(stats) == [("%1", "recompute", "the kernel of %6 would recompute 6 elementwise ops it reads "
                                "broadcast, each at least 4x (max 4): they are computed once, in memory")]
    assert summaries(fuse(module(build, T(3, 8), T(8)))) == [("elementwise", "sin + exp + tanh + neg + sin + exp + add")]


def test_op_without_native_lowering_is_refused():
    before = dict(OP_REGISTRY)
    try:
        @custom_op("mylib.halve", operands=("x",), tags={"elementwise"})
        def halve(x):
            return x / 2
        stats = fuse(module(lambda b, x: b("mylib.halve", b("cuvil.relu", x)), T(3)))
        assert refusals(stats) == [("%0", "lowering", "mylib.halve has no native lowering")]
    finally:
        OP_REGISTRY.clear()
        OP_REGISTRY.update(before)


def test_gemm_epilogue_bias_activation_residual():
    def build(b, x, w, bias, res):
        return b("cuvil.add", b("cuvil.relu", b("cuvil.add", b("cuvil.linear", x, w), bias)), res)
    m = module(build, T(S, 16), T(8, 16), T(8), T(S, 8))
    assert summaries(fuse(m)) == [("gemm-epilogue", "linear + add + relu + add")]
    off = module(build, T(S, 16), T(8, 16), T(8), T(S, 8))
    stats = fuse(off, epilogue=False)
    assert summaries(stats) == [("single", "linear"), ("elementwise", "add + relu + add")]
    assert refusals(stats) == [("%0", "disabled", "epilogue=false: nothing is fused into GEMM-based kernels")]


def test_gemm_epilogue_priority_and_two_gemms():
    def build(b, x, w1, w2):
        return b("cuvil.add", b("cuvil.exp", b("cuvil.linear", x, w1)), b("cuvil.linear", x, w2))
    m = module(build, T(4, 16), T(8, 16), T(8, 16))
    stats = fuse(m)
    # the later GEMM joins the add first (GEMM epilogues score highest); then the exp cannot bring its own
    assert summaries(stats) == [("gemm-epilogue", "linear + exp"), ("gemm-epilogue", "linear + add")]
    assert refusals(stats) == [("%1", "two-gemms", "two GEMM-based ops (cuvil.linear, cuvil.linear) cannot share "
                                                   "one kernel")]


def test_score_decides_who_joins_under_max_ops():
    def build(b, x, y, w):
        return b("cuvil.add", b("cuvil.exp", y), b("cuvil.linear", x, w))
    m = module(build, T(4, 16), T(4, 8), T(8, 16))
    stats = fuse(m, max_ops=2)
    assert summaries(stats) == [("single", "exp"), ("gemm-epilogue", "linear + add")]
    assert refusals(stats) == [("%0", "max-ops", "max-ops=2 reached (the groups have 1 + 2 ops)")]
    assert stats["fusion"]["options"] == {"max-ops": 2, "epilogue": True, "reductions": True}


def test_a_value_a_convolution_gathers_through_views_is_computed_once():
    # im2col reads each input element up to kh*kw times: exp behind the permute stays out of the
    # convolution's kernel (the permute itself is read through), instead of being recomputed
    def build(b, x, w):
        return b("cuvil.conv2d", b("cuvil.permute", b("cuvil.exp", x), perm=[0, 1, 3, 2]), w, padding=[1, 1])
    m = module(build, T(2, 4, 8, 8), T(8, 4, 3, 3))
    stats = fuse(m)
    assert summaries(stats) == [("single", "exp"), ("single", "conv2d")]    # the permute: read through
    assert refusals(stats) == [("%0", "gathered-operand", "cuvil.conv2d gathers %0 through views, reading each "
                                                          "element several times")]
    x, w = torch.randn(2, 4, 8, 8), torch.randn(8, 4, 3, 3)
    (out,) = compile_module(m, pipeline="verify,fuse", cache=None, details=False).native(x, w)
    torch.testing.assert_close(out, torch.conv2d(x.exp().transpose(2, 3), w, padding=1), rtol=1e-4, atol=1e-4)


def test_multi_use_and_memory_operand_refusals():
    def build(b, x, w):
        e = b("cuvil.exp", x)
        return [b("cuvil.relu", e), e, b("cuvil.linear", b("cuvil.neg", x), w)]
    m = module(build, T(S, 8), T(4, 8))
    stats = fuse(m)
    assert summaries(stats) == [("single", "exp"), ("single", "relu"), ("single", "neg"), ("single", "linear")]
    assert refusals(stats) == [("%0", "multi-use", "%0 is returned"),
                               ("%2", "memory-operand", "cuvil.linear reads %2 from memory (an operand of a "
                                                        "library call: GEMM, topk, scan)")]
    refused = stats["fusion"]["refused"][0]
    assert refused == {"group": 1, "candidate": "%0", "candidate_op": m.main.ops[0].id, "candidate_name": "cuvil.exp",
                       "consumer": "%1", "rule": "multi-use", "reason": "%0 is returned"}


def test_reduction_read_at_another_index_is_not_fused():
    # t[a, b] = x[a, b] + s[b] with s = x.sum(1): the kernel's loop holds the sum of row a, not of row b
    m = module(lambda b, x: b("cuvil.add", x, b("cuvil.sum", x, dims=[1])), T(6, 6))
    stats = fuse(m)
    assert summaries(stats) == [("single", "sum"), ("single", "add")]
    assert refusals(stats) == [("%0", "reduction-recompute", "would recompute a reduction: cuvil.sum is read at an "
                                                              "index other than the outer index of the kernel's loop")]
    x = torch.randn(6, 6)
    torch.testing.assert_close(run_native(m, x)[0], x + x.sum(1))


def test_reductions_over_different_axes_and_disabled_reductions():
    def build(b, x):
        return b("cuvil.sum", b("cuvil.sub", x, b("cuvil.mean", x, dims=[1], keepdim=True)), dims=[0])
    stats = fuse(module(build, T(S, 8)))
    assert summaries(stats) == [("single", "mean"), ("reduction", "sub + sum")]
    (candidate, rule, reason), = refusals(stats)
    assert (candidate, rule) == ("%0", "shape")
    assert reason == "axes [0] vs [1]: cuvil.sum and cuvil.mean reduce different axes of s0x8 (one kernel folds over " \
                     "one index space)"
    stats = fuse(module(build, T(S, 8)), reductions=False)
    assert summaries(stats) == [("single", "mean"), ("single", "sub"), ("single", "sum")]
    assert {r[1] for r in refusals(stats)} == {"disabled"}


def test_gemm_result_used_twice_stays_alone():
    def build(b, x, w, bias):
        y = b("cuvil.linear", x, w)
        return b("cuvil.add", y, b("cuvil.unsqueeze", bias, dim=0)), b("cuvil.sum", y, dims=[1])
    stats = fuse(module(build, T(4, 16), T(8, 16), T(8)))
    assert ("%0", "multi-use", "%0 is also used by %3 (cuvil.sum) outside the group") in refusals(stats)


# ----------------------------------------------------------------------------- reductions fused natively


def run_native(m: Module, *inputs):
    return compile_module(m, pipeline="verify,fuse", cache=None, details=False).native(*inputs)


def rms_norm(b, x, w):
    ms = b("cuvil.mean", b("cuvil.mul", x, x), dims=[1], keepdim=True)
    return b("cuvil.mul", b("cuvil.mul", x, b("cuvil.rsqrt", b("cuvil.add", ms, lit(b, 1e-6)))), w)


def softmax(b, x):
    e = b("cuvil.exp", b("cuvil.sub", x, b("cuvil.amax", x, dims=[1], keepdim=True)))
    return b("cuvil.div", e, b("cuvil.sum", e, dims=[1], keepdim=True))


def standardize(b, x):
    d = b("cuvil.sub", x, b("cuvil.mean", x, dims=[1], keepdim=True))
    var = b("cuvil.mean", b("cuvil.mul", d, d), dims=[1], keepdim=True)
    return b("cuvil.mul", d, b("cuvil.rsqrt", b("cuvil.add", var, lit(b, 1e-5))))


EAGER = {
    "rms_norm": lambda x, w: x * torch.rsqrt((x * x).mean(1, keepdim=True) + 1e-6) * w,
    "softmax": lambda x: (lambda e: e / e.sum(1, keepdim=True))(torch.exp(x - x.amax(1, keepdim=True))),
    "standardize": lambda x: (lambda d: d * torch.rsqrt((d * d).mean(1, keepdim=True) + 1e-5))(x - x.mean(1, True)),
}


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("build, arg_types, inputs, summary", [
    (rms_norm, (T(S, 256), T(256)), (randn(7, 256) * 3, randn(256, seed=1)), "mul + mean + add + rsqrt + mul + mul"),
    # 64 rows: the largest error over a few rows is one draw of the summation order's rounding
    # (5 rows put a vectorised sum's 2.5e-7 against eager's lucky 3e-8)
    (softmax, (T(S, 77),), (randn(64, 77) * 8,), "amax + sub + exp + sum + div"),
    (standardize, (T(S, 300),), (randn(6, 300) + 3,), "mean + sub + mul + mean + add + rsqrt + mul"),
], ids=["rms_norm", "softmax", "standardize"])
def test_reduction_with_prologue_and_epilogue_is_one_kernel(build, arg_types, inputs, summary):
    m = module(build, *arg_types)
    assert summaries(fuse(module(build, *arg_types))) == [("reduction", summary)]
    compiled = compile_module(m, pipeline="verify,fuse", cache=None, details=False)
    assert len(compiled.native.lowered) == 1
    (out,) = compiled.native(*inputs)
    eager_fn = EAGER[build.__name__]
    ref = eager_fn(*(x.double() for x in inputs))
    eager = eager_fn(*inputs)
    eager_err = (eager.double() - ref).abs().max().item()
    err = (out.double() - ref).abs().max().item()
    assert err <= 2 * eager_err + 1e-7 * ref.abs().max().item(), (err, eager_err)


# ----------------------------------------------------------------------------- the attributes read back


def test_groups_from_attrs_follow_the_pass_and_check_hand_written_groups():
    m = module(lambda b, x, w: b("cuvil.relu", b("cuvil.linear", b("cuvil.exp", x), w)), T(S, 8), T(4, 8))
    stats = fuse(m)
    fn = m.main
    assert [[op.name for op in g] for g in groups_from_attrs(fn)] == [["cuvil.exp"], ["cuvil.linear", "cuvil.relu"]]
    assert fuse(m) == stats                      # idempotent: same groups, ids and attributes
    fn.ops[0].attrs["fuse.group"] = 1            # exp into the GEMM's group: its operand must be in memory
    with pytest.raises(CuvilError, match=r"fusion group fuse.group = 1 \(cuvil.exp #\d+, cuvil.linear #\d+, "
                                         r"cuvil.relu #\d+\) cannot be one kernel: cuvil.linear reads its operands "
                                         r"from memory.*\[memory-operand\]"):
        groups_from_attrs(fn)


def test_groups_that_read_each_other_are_refused():
    def build(b, x):
        a = b("cuvil.exp", x)
        c = b("cuvil.relu", b("cuvil.amax", a, dims=[0]))     # a reduction between a and the final add
        return b("cuvil.add", a, c)
    m = module(build, T(4, 4))
    fn = m.main
    exp, amax, relu, add = fn.ops[:4]
    for op in (exp, add):
        op.attrs["fuse.group"] = 7
    with pytest.raises(CuvilError, match="fusion groups read each other"):
        groups_from_attrs(fn)
