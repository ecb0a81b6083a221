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


class DenseBlock(torch.nn.Module):
    """DenseNet's dense block: each layer reads every earlier layer's features, concatenated, through
    a batch norm and a ReLU (pre-activation), then a 1x1 and a 3x3 convolution."""
    def __init__(self, channels=16, growth=8, layers=5):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.layers = torch.nn.ModuleList(torch.nn.Sequential(
            torch.nn.BatchNorm2d(channels + growth * i), torch.nn.ReLU(),
            torch.nn.Conv2d(channels + growth * i, 2 * growth, 1), torch.nn.BatchNorm2d(2 * growth), torch.nn.ReLU(),
            torch.nn.Conv2d(2 * growth, growth, 3, padding=1)) for i in range(layers))
        self.norm = torch.nn.BatchNorm2d(channels + growth * layers)
        for m in self.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
                m.weight.data.uniform_(0.5, 1.5)
                m.bias.data.uniform_(-0.5, 0.5)

    def forward(self, x):
        features = [self.stem(x)]
        for layer in self.layers:
            features.append(layer(torch.cat(features, 1)))
        return torch.relu(self.norm(torch.cat(features, 1)))


def test_a_dense_block_runs_channels_last_with_its_concatenations_split_per_piece():
    """The concatenations join NHWC pieces along the channels (`sink_conversion_through_cat`), the
    batch norms after them are per-channel affine maps (fold-batchnorm), and each kernel that
    reads a concatenation loops over its pieces one by one (`_inner_loop`): no select among
    them, no transposed tiles (the per-channel constants' permutes move no element)."""
    import cuvil
    model = DenseBlock().eval()
    x = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(5))
    compiled = cuvil.compile(model, cache=False)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    layout = next(p["statistics"] for p in compiled.report.passes if p["name"] == "layout")
    assert layout["conversions-left"] == 2      # the model's input and output
    folds = next(p["statistics"] for p in compiled.report.passes if p["name"] == "fold-batchnorm")
    assert folds["folded"] == 5 and folds["affine"] == 6
    # (the last one also converts the output to NCHW: its tiles of channels still select)
    cat_kernels = [k["kernel_ir"] for k in compiled.report.kernels if k["kernel_ir"].count("in f32[2, 12, 12, ") >= 2
                   and "%y0: out f32[2, 12, 12, " in k["kernel_ir"] and "conv2d" not in k["name"]]
    assert len(cat_kernels) == 4
    for kernel in cat_kernels:
        assert "select(and(ge(index(" not in kernel and "for tb in" not in kernel
        assert kernel.count("for i3 in 0..") == kernel.count("in f32[2, 12, 12, ")    # a loop per piece


class ShuffleStage(torch.nn.Module):
    """ShuffleNetV2's stride-1 units: half of the channels pass through, the other half go through
    a 1x1, a depthwise 3x3 and a 1x1 convolution; the halves are concatenated and shuffled."""
    def __init__(self, channels=16, units=6):
        super().__init__()
        half = channels // 2
        self.branches = torch.nn.ModuleList(torch.nn.Sequential(
            torch.nn.Conv2d(half, half, 1), torch.nn.ReLU(), torch.nn.Conv2d(half, half, 3, padding=1, groups=half),
            torch.nn.Conv2d(half, half, 1), torch.nn.ReLU()) for _ in range(units))

    def forward(self, x):
        for branch in self.branches:
            kept, changed = x.chunk(2, dim=1)
            x = torch.cat([kept, branch(changed)], 1)
            n, c, h, w = x.shape
            x = x.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)
        return x


def test_concatenations_read_through_each_other_are_kept_in_memory_past_two():
    """Each unit's concatenation is read through the next unit's split and shuffle. Recomputed in
    one kernel, the innermost piece's index would compose every shuffle inside every condition
    between; from the third on, one is computed into memory (`fuse.in_memory`) and loaded."""
    import cuvil
    model = ShuffleStage().eval()
    x = torch.randn(1, 16, 10, 10, generator=torch.Generator().manual_seed(6))
    compiled = cuvil.compile(model, cache=False)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    kept = {r["candidate"] for r in compiled.report.fusion["refused"] if r["rule"] == "nested-cats"}
    assert len(kept) == 2           # units 3 and 6 (with the two before each recomputed in its kernel)
    for kernel in compiled.report.kernels:
        assert kernel["kernel_ir"].count("select(and(ge(index(") <= 4, kernel["name"]


def test_global_pools_of_an_nhwc_image_are_reductions_along_its_channels():
    """A 1x1 adaptive pool after an NHWC convolution, or a window pool whose window is the whole
    image, becomes a mean / amax over H and W (`canonicalize`): its kernel folds a vector of
    channels per position (`for col in`) where the pool's window loop gathered one channel a row
    of channels apart. NaN and infinities pass as they do in eager's pools."""
    import cuvil
    conv = torch.nn.Conv2d(3, 24, 3, padding=1).eval()

    def pools(x):
        y = conv(x)
        return (F.adaptive_avg_pool2d(y, 1).flatten(1), F.adaptive_max_pool2d(y, (1, 1)).flatten(1),
                F.avg_pool2d(y, 9).flatten(1), F.max_pool2d(y, (9, 9), ceil_mode=True).flatten(1))
    x = torch.randn(3, 3, 9, 9, generator=torch.Generator().manual_seed(7))
    x[0, 1, 4, 4], x[1, 0, 2, 3], x[2, :, :, :2] = float("nan"), float("inf"), -float("inf")
    compiled = cuvil.compile(pools, cache=False)
    with torch.no_grad():
        for out, ref in zip(compiled(x), pools(x)):
            torch.testing.assert_close(out, ref, equal_nan=True)
    reductions = [k["kernel_ir"] for k in compiled.report.kernels if "mean" in k["name"] or "amax" in k["name"]]
    assert not any("pool2d" in k["name"] for k in compiled.report.kernels)
    assert len(reductions) == 2         # the window pools' mean and amax are the adaptive ones' (cse)
    for kernel in reductions:
        assert "in f32[3, 9, 9, 24]" in kernel and "for col in 0..24" in kernel
