"""NCHW convolutions with few output channels computed along the image rows (`library.conv2d_columns`):
out[OC, positions] = W @ col on the panel microkernel, col packed per tile from zero-padded input
planes in the call's own local buffers. Checked against float64 convolutions: whole and partial
panels, strides and dilations along the rows, paddings wider or narrower than the window needs,
a symbolic batch and height, bias and relu in the epilogue, several threads' ranges (each call
its own local buffers); which shapes take the path; the layout pass keeping a stem and its pool
NCHW end to end."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cuvil
from cuvil.codegen.kernel_text import print_kernels
from cuvil.codegen.library import conv_algorithm
from cuvil.ir import parse

from codegen_helpers import Graph, T, compile_graphs, run
from test_library import rand

# (in channels, out channels, kernel, stride, padding, image[, dilation]); every output width a
# multiple of 16
CONVS = [
    (3, 16, (3, 3), (1, 1), (1, 1), (32, 32)),         # the small CNN's stem: 4 panels of 64 a tile
    (3, 8, (3, 3), (2, 1), (1, 1), (21, 16)),          # stride 2 down the rows, a last tile of 3 rows
    (2, 5, (3, 5), (1, 1), (1, 2), (9, 48)),           # 5 rows of C (blocks of 4 and 1), runs of 16
    (2, 16, (3, 3), (1, 1), (2, 1), (12, 32), (2, 1)),  # dilated down the rows
    (3, 12, (3, 3), (1, 1), (0, 0), (18, 18)),         # unpadded: 16 columns
    (2, 7, (1, 3), (1, 1), (3, 1), (4, 64)),           # padding wider than the window needs
]


def _graph(i, c, oc, k, s, p, image, d=(1, 1), height=None):
    return Graph(f"columns{i}", lambda b, x, w, bi: b("cuvil.relu", b(
        "cuvil.conv2d", x, w, bi, stride=list(s), padding=list(p), dilation=list(d))),
        [T("s0", c, height or image[0], image[1]), T(oc, c, *k), T(oc)])


GRAPHS = {i: _graph(i, *cfg) for i, cfg in enumerate(CONVS)}
GRAPHS["sym"] = _graph("sym", 3, 16, (3, 3), (1, 1), (1, 1), (None, 32), height="s1")
# no bias: the relu alone in registers; a sigmoid after the bias: the bias in registers, the rest a
# loop over each tile's block of the output
GRAPHS["nobias"] = Graph("columns_nobias", lambda b, x, w: b("cuvil.relu", b("cuvil.conv2d", x, w, padding=[1, 1])),
                         [T("s0", 3, 8, 32), T(16, 3, 3, 3)])
GRAPHS["sigmoid"] = Graph("columns_sigmoid", lambda b, x, w, bi: b("cuvil.sigmoid", b(
    "cuvil.conv2d", x, w, bi, padding=[1, 1])), [T("s0", 3, 8, 32), T(16, 3, 3, 3), T(16)])


@pytest.fixture(scope="module")
def compiled():
    return compile_graphs(GRAPHS.values())


def _reference(x, w, bias, stride, padding, dilation=(1, 1)):
    return F.relu(F.conv2d(x.double(), w.double(), bias.double(), stride, padding, dilation)).float()


def test_every_graph_runs_along_the_rows_in_local_buffers():
    for name, g in GRAPHS.items():
        (kernel,) = g.kernels
        assert [conv_algorithm(op) for op in g.fn.ops if op.name == "cuvil.conv2d"] == ["columns"]
        # the input planes and the panels are the call's own; no scratch in the arena
        assert [b.role for b in kernel.locals] == ["local", "local"]
        assert not any(b.role == "scratch" for b in kernel.buffers)
        text = print_kernels([kernel])
        (gemm,) = [line.strip() for line in text.splitlines() if line.strip().startswith("gemm")]
        # the bias (one per output channel: a row of C) and the relu in the microkernel's registers
        epilogue = {"nobias": "b_panels=64, relu=true", "sigmoid": "b_panels=64, bias=%a2[0], bias_rows=true"}
        assert gemm.endswith(epilogue.get(name, "bias=%a2[0], bias_rows=true, relu=true")), gemm
        assert ("sigmoid" in text.split(gemm)[1]) == (name == "sigmoid")      # an epilogue loop after it


@pytest.mark.parametrize("i", range(len(CONVS)))
def test_columns_conv_matches_float64(compiled, i):
    c, oc, k, s, p, (h, w_), *dilation = CONVS[i]
    d = dilation[0] if dilation else (1, 1)
    w, bias = rand(oc, c, *k, seed=1), rand(oc, seed=2)
    for n, split in ((1, 1), (3, 2), (2, 5)):      # split: consecutive calls of sub-ranges, as threads run it
        x = rand(n, c, h, w_)
        torch.testing.assert_close(run(GRAPHS[i], compiled, x, w, bias, split=split),
                                   _reference(x, w, bias, s, p, d), rtol=1e-5, atol=1e-5)


def test_symbolic_height(compiled):
    w, bias = rand(16, 3, 3, 3, seed=3), rand(16, seed=4)
    for n, h in ((1, 32), (2, 13), (1, 1), (3, 70)):
        x = rand(n, 3, h, 32)
        torch.testing.assert_close(run(GRAPHS["sym"], compiled, x, w, bias, split=2),
                                   _reference(x, w, bias, (1, 1), (1, 1)), rtol=1e-5, atol=1e-5)


def test_epilogues_match_float64(compiled):
    w, bias = rand(16, 3, 3, 3, seed=5), rand(16, seed=6)
    x = rand(3, 3, 8, 32)
    conv = F.conv2d(x.double(), w.double(), None, 1, 1)
    torch.testing.assert_close(run(GRAPHS["nobias"], compiled, x, w, split=2), F.relu(conv).float(),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(run(GRAPHS["sigmoid"], compiled, x, w, bias, split=2),
                               torch.sigmoid(conv + bias.double()[:, None, None]).float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("conv, along_rows", [
    (nn.Conv2d(3, 16, 3, padding=1), True),
    (nn.Conv2d(3, 4, (3, 1), stride=(2, 1)), True),
    (nn.Conv2d(3, 17, 3, padding=1), False),                    # more than a vector of output channels
    (nn.Conv2d(3, 16, 3, stride=(1, 2), padding=1), False),     # strided along the rows' vectors
    (nn.Conv2d(3, 16, 3, padding=1, dilation=(1, 2)), False),
    (nn.Conv2d(4, 16, 3, padding=1), False),                    # a reduction of 36 taps
    (nn.Conv2d(6, 12, 3, padding=1, groups=3), False),          # grouped
])
def test_which_convolutions_run_along_the_rows(conv, along_rows):
    def algorithm(width):
        module = cuvil.import_model(conv.eval(), (torch.randn(1, conv.in_channels, 16, width),)).module
        (op,) = [op for op in module.main.ops if op.name == "cuvil.conv2d"]
        return conv_algorithm(op)
    assert (algorithm(32) == "columns") == along_rows
    assert algorithm(24) != "columns"      # rows of whole vectors only


class Stem(nn.Module):
    """An RGB stem with batch norm and relu, a max pool, then a dense convolution."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2))
        self.next = nn.Conv2d(16, 32, 3, stride=2, padding=1)

    def forward(self, x):
        return torch.relu(self.next(self.stem(x)))


def test_the_layout_pass_keeps_a_stem_and_its_pool_nchw_end_to_end():
    torch.manual_seed(0)
    model = Stem().eval()
    with torch.no_grad():
        model.stem[1].running_mean.uniform_(-0.5, 0.5)
        model.stem[1].running_var.uniform_(0.5, 2.0)
    compiled = cuvil.compile(model, dynamic=[{0: "batch"}], threads=2)
    for batch in (1, 4, 7):
        x = torch.randn(batch, 3, 32, 32)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    stats = next(p["statistics"] for p in compiled.report.passes if p["name"] == "layout")
    assert stats["kept"] == {"conv2d": 1, "max_pool2d": 1} and stats["converted"] == {"conv2d": 1}
    (staying,) = [r for r in stats["regions"] if r["layout"] == "nchw"]
    assert len(staying["ops"]) == 2 and "few output channels" in staying["why"]
    convs = [op for op in parse(compiled.report.output_ir).main.ops if op.name == "cuvil.conv2d"]
    assert [conv_algorithm(op) for op in convs] == ["columns", "implicit"]


def test_a_stem_whose_result_is_returned_stays_nchw_and_a_residual_one_converts():
    x = torch.randn(2, 3, 16, 32)
    alone = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU()).eval()
    stats = next(p["statistics"] for p in cuvil.explain(alone, x).passes if p["name"] == "layout")
    assert stats["kept"] == {"conv2d": 1} and stats["converted"] == {} and stats["conversions-left"] == 0

    class Residual(nn.Module):      # the stem's result feeds an add with a dense convolution's
        def __init__(self):
            super().__init__()
            self.stem, self.conv = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)

        def forward(self, x):
            y = torch.relu(self.stem(x))
            return y + self.conv(y)
    model = Residual().eval()
    compiled = cuvil.compile(model)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    stats = next(p["statistics"] for p in compiled.report.passes if p["name"] == "layout")
    assert stats["kept"] == {} and stats["converted"] == {"conv2d": 2}


# a pool over the product in the epilogue (`library.pool_in_tiles_problem`): (in, out channels, image,
# pool, kernel, stride of the pool, bias); every one's tiles rounded to whole windows
POOLED = {
    "stem": (3, 16, (32, 32), "cuvil.max_pool2d", 2, True),      # the small CNN's: tiles of 8 rows
    "odd": (2, 5, (31, 48), "cuvil.avg_pool2d", 2, True),        # 31 rows (floor), tiles of 5 -> 4 rows
    "wide": (2, 4, ("s1", 256), "cuvil.max_pool2d", 2, False),   # tiles of 1 row -> 2; a symbolic height
    "three": (3, 8, (12, 48), "cuvil.max_pool2d", 3, True),      # 3x3 windows: tiles of 5 -> 3 rows
}


def _pooled_graph(name, c, oc, image, pool, k, bias):
    def build(b, x, w, *bi):
        y = b("cuvil.conv2d", x, w, *bi, padding=[1, 1])
        y = b("cuvil.relu", y) if pool == "cuvil.max_pool2d" else y
        y = b(pool, y, kernel=[k, k])
        return b("cuvil.relu", y) if pool == "cuvil.avg_pool2d" else y      # an elementwise op after the pool
    return Graph(f"pooled_{name}", build, [T("s0", c, *image), T(oc, c, 3, 3)] + ([T(oc)] if bias else []))


POOLED_GRAPHS = {name: _pooled_graph(name, *cfg) for name, cfg in POOLED.items()}


@pytest.fixture(scope="module")
def pooled():
    return compile_graphs(POOLED_GRAPHS.values())


def _pooled_reference(x, w, bias, pool, k):
    y = F.conv2d(x.double(), w.double(), None if bias is None else bias.double(), 1, 1)
    if pool == "cuvil.max_pool2d":
        return F.max_pool2d(F.relu(y), k).float()
    return F.relu(F.avg_pool2d(y, k)).float()


@pytest.mark.parametrize("name", POOLED)
def test_a_pool_runs_in_the_epilogue_over_the_tiles_product(pooled, name):
    c, oc, (h, w_), pool, k, has_bias = POOLED[name]
    g = POOLED_GRAPHS[name]
    (kernel,) = g.kernels      # the convolution, its pool and what follows: one kernel
    # the product is the call's own (beside the planes and the panels); only the pooled result is stored
    assert [b.role for b in kernel.locals] == ["local"] * 3
    (out,) = [b for b in kernel.buffers if b.role == "out"]
    assert out.shape[1:] == g.fn.return_op.operands[0].type.shape[1:]
    text = print_kernels([kernel])
    (gemm,) = [line.strip() for line in text.splitlines() if line.strip().startswith("gemm")]
    assert gemm.startswith("gemm c=%loc2[0]") and ("relu=true" in gemm) == (pool == "cuvil.max_pool2d")
    w, bias = rand(oc, c, 3, 3, seed=7), (rand(oc, seed=8) if has_bias else None)
    for n, rows, split in ((1, 32, 1), (3, 21, 2), (2, 9, 5)):
        x = rand(n, c, rows if h == "s1" else h, w_)
        args = (x, w) + ((bias,) if has_bias else ())
        torch.testing.assert_close(run(g, pooled, *args, split=split), _pooled_reference(x, w, bias, pool, k),
                                   rtol=1e-5, atol=1e-5)


def _stem(pool):
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), pool)


@pytest.mark.parametrize("model, reason", [
    (_stem(nn.MaxPool2d(3, 2, 1)), "max_pool2d's windows overlap (kernel (3, 3), stride (2, 2))"),
    (_stem(nn.MaxPool2d(2, ceil_mode=True)),
     "max_pool2d's windows reach past the image (padding (0, 0), ceil_mode True)"),
    (_stem(nn.AdaptiveAvgPool2d(3)), "adaptive_avg_pool2d's windows are not whole in tiles"),
    # a depthwise convolution (NHWC) computes no GEMM over tiles of rows
    (nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3)),
     "only a convolution computed over tiles of its output rows"),
])
def test_pools_a_convolution_cannot_take_stay_out_and_say_why(model, reason):
    model = model.eval()
    x = torch.randn(2, model[0].in_channels, 16, 32)
    stats = next(p["statistics"] for p in cuvil.explain(model, x).passes if p["name"] == "fuse")
    convs = [g["summary"] for g in stats["fusion"]["groups"] if "conv2d + relu" in g["summary"]]
    assert convs and not any("pool" in summary for summary in convs)
    (refusal,) = [r for r in stats["fusion"]["refused"] if r["candidate_name"] == "cuvil.relu"]
    assert refusal["rule"] == "gemm-epilogue" and reason in refusal["reason"], refusal
    compiled = cuvil.compile(model)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)


def test_a_pooled_product_read_elsewhere_is_not_pooled_in_the_epilogue():
    class Both(nn.Module):      # the relu's result is returned as well as pooled
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 16, 3, padding=1)

        def forward(self, x):
            y = torch.relu(self.conv(x))
            return y, F.max_pool2d(y, 2)
    model, x = Both().eval(), torch.randn(2, 3, 16, 32)
    stats = next(p["statistics"] for p in cuvil.explain(model, x).passes if p["name"] == "fuse")
    assert [g["summary"] for g in stats["fusion"]["groups"]] == ["conv2d + relu", "max_pool2d"]
    compiled = cuvil.compile(model)
    with torch.no_grad():
        for got, want in zip(compiled(x), model(x)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
