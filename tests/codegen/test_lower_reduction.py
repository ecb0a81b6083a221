"""Reductions and the fused reduction patterns (softmax, log_softmax, layer_norm, rms_norm, var),
compared with an fp64 reference: Cuvil's error may be at most 2x eager fp32's own error (reductions
are reassociated and vectorised, so bit-equality with eager is not expected)."""
import pytest
import torch
import torch.nn.functional as F

from cuvil.codegen.lower import lower_group
from cuvil.ir import DType

from codegen_helpers import Graph, T, assert_within_eager_error, compile_graphs, fp64_error_bound, run

R = {
    "sum": (lambda b, x: b("cuvil.sum", x, dims=[1]), lambda x: x.sum(1)),
    "sum_all": (lambda b, x: b("cuvil.sum", x), lambda x: x.sum()),
    "mean_keep": (lambda b, x: b("cuvil.mean", x, dims=[0, 2], keepdim=True), lambda x: x.mean((0, 2), keepdim=True)),
    "amax": (lambda b, x: b("cuvil.amax", x, dims=[2]), lambda x: x.amax(2)),
    "amin": (lambda b, x: b("cuvil.amin", x, dims=[0], keepdim=True), lambda x: x.amin(0, keepdim=True)),
    "prod": (lambda b, x: b("cuvil.prod", b("cuvil.add", x, b("cuvil.literal", value=1.0, dtype=DType.f32)),
                            dims=[2]), lambda x: (x + 1).prod(2)),
    "var": (lambda b, x: b("cuvil.var", x, dims=[1, 2]), lambda x: x.var((1, 2))),
    "var0": (lambda b, x: b("cuvil.var", x, dims=[2], correction=0.0, keepdim=True),
             lambda x: x.var(2, correction=0, keepdim=True)),
    "argmax": (lambda b, x: b("cuvil.argmax", x, dim=1), lambda x: x.argmax(1)),
    "argmin_all": (lambda b, x: b("cuvil.argmin", x, keepdim=True), lambda x: x.argmin().reshape(1, 1, 1)),
    "cumsum": (lambda b, x: b("cuvil.cumsum", x, dim=2), lambda x: x.cumsum(2)),
    "softmax": (lambda b, x: b("cuvil.softmax", x, dim=2), lambda x: torch.softmax(x, 2)),
    "softmax_mid": (lambda b, x: b("cuvil.softmax", x, dim=1), lambda x: torch.softmax(x, 1)),
    "log_softmax": (lambda b, x: b("cuvil.log_softmax", x, dim=2), lambda x: torch.log_softmax(x, 2)),
    "scaled_softmax": (lambda b, x: b("cuvil.softmax", b("cuvil.mul", x, b("cuvil.literal", value=0.125,
                                                                             dtype=DType.f32)), dim=2),
                       lambda x: torch.softmax(x * 0.125, 2)),
    "layer_norm": (lambda b, x: b("cuvil.layer_norm", x, normalized_ndim=1),
                   lambda x: F.layer_norm(x, x.shape[-1:])),
    "layer_norm2": (lambda b, x: b("cuvil.layer_norm", x, normalized_ndim=2, eps=1e-3),
                    lambda x: F.layer_norm(x, x.shape[-2:], eps=1e-3)),
    "rms_norm": (lambda b, x: b("cuvil.rms_norm", x, normalized_ndim=1), lambda x: F.rms_norm(x, x.shape[-1:])),
    "rms_norm_eps": (lambda b, x: b("cuvil.rms_norm", x, normalized_ndim=1, eps=0.1),
                     lambda x: F.rms_norm(x, x.shape[-1:], eps=0.1)),
}
SHAPE = ["s0", 6, 37]
GRAPHS = {name: Graph(f"r_{name}", build, [T(*SHAPE)]) for name, (build, _) in R.items()}
AFFINE = {
    "layer_norm_affine": Graph("layer_norm_affine", lambda b, x, w, bb: b("cuvil.layer_norm", x, w, bb,
                                                                          normalized_ndim=1),
                               [T("s0", 300), T(300), T(300)]),
    "rms_norm_affine": Graph("rms_norm_affine", lambda b, x, w: b("cuvil.rms_norm", x, w, normalized_ndim=1, eps=1e-6),
                             [T("s0", 300), T(300)]),
    "int_sum": Graph("int_sum", lambda b, x: b("cuvil.sum", x, dims=[1]), [T("s0", 9, dtype=DType.i32)]),
}


def _explicit(name, build, arg_types, group_of):
    """A graph lowered as ONE group given explicitly (what the fusion pass will hand over)."""
    g = Graph(name, build, arg_types)
    ops = [op for op in g.fn.ops if op.name not in ("cuvil.return",)]
    g.lowered = [lower_group(g.fn, group_of(ops), name + "_0")]
    return g


FUSED = {
    # softmax spelled out: two reductions and their epilogue in one kernel
    "decomposed_softmax": _explicit("decomposed_softmax", lambda b, x: b("cuvil.div", b("cuvil.exp", b(
        "cuvil.sub", x, b("cuvil.amax", x, dims=[1], keepdim=True))), b("cuvil.sum", b("cuvil.exp", b(
            "cuvil.sub", x, b("cuvil.amax", x, dims=[1], keepdim=True))), dims=[1], keepdim=True)),
        [T("s0", 129)], lambda ops: ops),
    # layer norm with a gelu epilogue and a residual add as prologue
    "residual_ln_gelu": _explicit("residual_ln_gelu", lambda b, x, r, w: b("cuvil.gelu", b(
        "cuvil.layer_norm", b("cuvil.add", x, r), w, normalized_ndim=1)), [T("s0", 64), T("s0", 64), T(64)],
        lambda ops: ops),
}


@pytest.fixture(scope="module")
def compiled():
    return compile_graphs([*GRAPHS.values(), *AFFINE.values(), *FUSED.values()])


@pytest.mark.parametrize("name", list(R))
def test_reduction_against_fp64(compiled, name):
    g = torch.Generator().manual_seed(hash(name) % 1000)
    x = torch.randn(5, 6, 37, generator=g) * 4 + 1
    assert len(GRAPHS[name].kernels) == 1
    out = run(GRAPHS[name], compiled, x)
    if name.startswith("arg"):
        assert torch.equal(out, R[name][1](x))
        x[0, 0, 0] = float("nan")               # NaN is the extreme for both, like torch
        assert torch.equal(run(GRAPHS[name], compiled, x), R[name][1](x))
        return
    ref, eager_err = fp64_error_bound(R[name][1], x)
    assert out.shape == ref.shape
    assert_within_eager_error(out, ref, eager_err)


def test_symbolic_rows_bind_at_call_time(compiled):
    for rows in (1, 3, 64):
        x = torch.randn(rows, 6, 37)
        torch.testing.assert_close(run(GRAPHS["softmax"], compiled, x), torch.softmax(x, 2))


def test_softmax_rows_of_minus_inf_match_torch(compiled):
    x = torch.randn(2, 6, 37)
    x[0, 0] = float("-inf")         # an all-masked row: nan, like torch
    x[1, 2, :5] = float("-inf")     # partly masked: zeros there
    torch.testing.assert_close(run(GRAPHS["softmax"], compiled, x), torch.softmax(x, 2), equal_nan=True)


def test_affine_norms_and_integer_sum(compiled):
    x, w, b = torch.randn(7, 300) * 3, torch.randn(300), torch.randn(300)
    for graph, fn, args in ((AFFINE["layer_norm_affine"], lambda x, w, b: F.layer_norm(x, (300,), w, b), (x, w, b)),
                            (AFFINE["rms_norm_affine"], lambda x, w: F.rms_norm(x, (300,), w, 1e-6), (x, w))):
        ref, eager_err = fp64_error_bound(fn, *args)
        assert_within_eager_error(run(graph, compiled, *args), ref, eager_err)
    i = torch.randint(-1000, 1000, (4, 9), dtype=torch.int32)
    out = run(AFFINE["int_sum"], compiled, i)
    assert out.dtype == torch.int64 and torch.equal(out, i.sum(1))


def test_fused_reduction_groups(compiled):
    x = torch.randn(9, 129) * 5
    ref, eager_err = fp64_error_bound(lambda x: torch.exp(x - x.amax(1, keepdim=True)) /
                                      torch.exp(x - x.amax(1, keepdim=True)).sum(1, keepdim=True), x)
    assert_within_eager_error(run(FUSED["decomposed_softmax"], compiled, x), ref, eager_err)
    x, r, w = torch.randn(4, 64), torch.randn(4, 64), torch.randn(64)
    ref, eager_err = fp64_error_bound(lambda x, r, w: F.gelu(F.layer_norm(x + r, (64,), w)), x, r, w)
    assert_within_eager_error(run(FUSED["residual_ln_gelu"], compiled, x, r, w), ref, eager_err)


LONG_ROWS = {
    "amax": Graph("long_amax", lambda b, x: b("cuvil.amax", x, dims=[1]), [T("s0", 1000)]),
    "amin": Graph("long_amin", lambda b, x: b("cuvil.amin", x, dims=[1]), [T("s0", "s1")]),
}


@pytest.mark.parametrize("kind", list(LONG_ROWS))
def test_long_row_extremes_with_nan_and_infinities_anywhere(kind):
    """A long row's max and min run four vector accumulators: a NaN, an infinity or the extreme
    in any lane of any of them, or in the scalar tail, still decides the row, as in torch."""
    graph = LONG_ROWS[kind]
    compiled = compile_graphs([graph])
    ref = getattr(torch, kind)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(70, 1000, generator=g)
    for row, col in enumerate(range(0, 1000, 15)):      # every lane of the four accumulators, and the tail
        x[row, col] = (float("nan"), float("inf"), float("-inf"), 1e30, -1e30)[row % 5]
    out = run(graph, compiled, x)
    assert torch.equal(out.isnan(), ref(x, 1).isnan()) and out.isnan().sum() == 14
    assert torch.equal(torch.nan_to_num(out), torch.nan_to_num(ref(x, 1)))
    masked = torch.full((2, 1000), float("-inf"))
    assert torch.equal(run(graph, compiled, masked), ref(masked, 1))
