"""NHWC convolutions and pools (what the `layout` pass produces) against eager torch in NCHW: every
convolution algorithm (direct, 1x1 GEMM over all images, im2col with channel runs, im2col along
image rows for few channels, grouped), pooling with padding, dilation and ceil mode, a symbolic
batch, and a permute in front of a convolution read inside its kernel."""
import pytest
import torch
import torch.nn.functional as F

from cuvil.codegen.library import conv_algorithm
from cuvil.ir.ops.nn import TO_NCHW, TO_NHWC, WEIGHT_TO_HWIO

from codegen_helpers import Graph, T, compile_graphs, run
from test_library import CONVS, POOLS, rand


def nhwc(t):
    return t.permute(*TO_NHWC).contiguous()


def nchw(t):
    return t.permute(*TO_NCHW)


def _conv(i, c, oc, g, k, s, p, d):
    return Graph(f"nhwc_conv{i}", lambda b, x, w, bi: b("cuvil.conv2d", x, w, bi, stride=[s, s], padding=[p, p],
                                                        dilation=[d, d], groups=g, layout="nhwc"),
                 [T("s0", 11, 13, c), T(k, k, c // g, oc), T(oc)])


GRAPHS = {
    **{f"conv{i}": _conv(i, *cfg) for i, cfg in enumerate(CONVS)},
    **{f"maxpool{i}": Graph(f"nhwc_maxpool{i}", lambda b, x, k=k, s=s, p=p, d=d, cm=cm: b(
        "cuvil.max_pool2d", x, kernel=[k, k], stride=[s, s], padding=[p, p], dilation=[d, d], ceil_mode=cm,
        layout="nhwc"), [T(2, 11, 12, 5)]) for i, (k, s, p, d, cm) in enumerate(POOLS)},
    **{f"avgpool{i}": Graph(f"nhwc_avgpool{i}", lambda b, x, k=k, s=s, p=p, cm=cm: b(
        "cuvil.avg_pool2d", x, kernel=[k, k], stride=[s, s], padding=[p, p], ceil_mode=cm, count_include_pad=False,
        layout="nhwc"), [T(2, 11, 12, 5)]) for i, (k, s, p, d, cm) in enumerate(POOLS)},
    "adaptive": Graph("nhwc_adaptive", lambda b, x: [b(f"cuvil.adaptive_{kind}_pool2d", x, output_size=list(o),
                                                       layout="nhwc") for kind in ("avg", "max")
                                                     for o in ((1, 1), (3, 5), (11, 12))],
                      [T("s0", 11, 12, 6)]),
    # the stem of a CNN after the layout pass: an NCHW input permuted to NHWC, then a 3-channel conv
    "stem": Graph("nhwc_stem", lambda b, x, w, bi: b("cuvil.relu", b(
        "cuvil.conv2d", b("cuvil.permute", x, perm=list(TO_NHWC)), w, bi, padding=[1, 1], layout="nhwc")),
        [T("s0", 3, 20, 20), T(3, 3, 3, 16), T(16)]),
}


@pytest.fixture(scope="module")
def compiled():
    return compile_graphs(GRAPHS.values())


@pytest.mark.parametrize("i", range(len(CONVS)))
def test_nhwc_conv2d_matches_nchw(compiled, i):
    c, oc, g, k, s, p, d = CONVS[i]
    for n in (1, 3):
        x, w, bias = rand(n, c, 11, 13), rand(oc, c // g, k, k, seed=1), rand(oc, seed=2)
        out = run(GRAPHS[f"conv{i}"], compiled, nhwc(x), w.permute(*WEIGHT_TO_HWIO).contiguous(), bias, split=2)
        torch.testing.assert_close(nchw(out), F.conv2d(x, w, bias, s, p, d, g), rtol=1e-4, atol=1e-4)


def test_nhwc_algorithms_cover_each_kind():
    chosen = [conv_algorithm(GRAPHS[f"conv{i}"].fn.ops[0]) for i in range(len(CONVS))]
    assert chosen == ["im2col", "im2col", "depthwise", "im2col", "gemm", "depthwise", "im2col", "direct",
                      "depthwise", "depthwise", "depthwise", "depthwise"]


@pytest.mark.parametrize("i", range(len(POOLS)))
def test_nhwc_pooling_matches_nchw(compiled, i):
    k, s, p, d, cm = POOLS[i]
    x = rand(2, 5, 11, 12)
    torch.testing.assert_close(nchw(run(GRAPHS[f"maxpool{i}"], compiled, nhwc(x))), F.max_pool2d(x, k, s, p, d, cm))
    torch.testing.assert_close(nchw(run(GRAPHS[f"avgpool{i}"], compiled, nhwc(x))),
                               F.avg_pool2d(x, k, s, p, cm, False))


def test_nhwc_adaptive_pooling(compiled):
    x = rand(4, 6, 11, 12)
    expected = [fn(x, size) for fn in (F.adaptive_avg_pool2d, F.adaptive_max_pool2d)
                for size in ((1, 1), (3, 5), (11, 12))]
    for out, ref in zip(run(GRAPHS["adaptive"], compiled, nhwc(x)), expected):
        torch.testing.assert_close(nchw(out), ref)


def test_permuted_input_is_read_inside_the_conv_kernel(compiled):
    graph = GRAPHS["stem"]
    assert len(graph.kernels) == 1        # the permute is a view the im2col gather reads through
    x, w, bias = rand(2, 3, 20, 20), rand(16, 3, 3, 3, seed=1), rand(16, seed=2)
    out = run(graph, compiled, x, w.permute(*WEIGHT_TO_HWIO).contiguous(), bias, split=2)
    torch.testing.assert_close(nchw(out), F.relu(F.conv2d(x, w, bias, padding=1)), rtol=1e-4, atol=1e-4)
