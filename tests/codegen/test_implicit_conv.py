"""NHWC convolutions with weights blocked in GEMM panels (`pack_conv_panels`), run as an implicit
GEMM on the panel microkernel (`library.conv2d_implicit`), against eager torch in NCHW: both panel
widths with full and partial last panels, grouped convolutions, strides, paddings that are wider or narrower than the
window needs, non-square kernels, 1x1 convolutions with and without stride, a symbolic batch,
symbolic image sizes, dilations (along either axis or both), thread splits, the stem's permuted
NCHW input, the layout pass choosing it end to end, and seeded random convolutions compiled
through O3."""
import copy
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cuvil
from cuvil.codegen.kernel_text import parse_kernels, print_kernels
from cuvil.codegen.library import conv_algorithm
from cuvil.ir import parse
from cuvil.codegen.target import Target
from cuvil.ir.ops.nn import TO_NCHW, TO_NHWC, WEIGHT_TO_HWIO, pack_conv_panels, panel_width, unpack_conv_panels

from codegen_helpers import Graph, T, compile_graphs, run
from test_library import rand

# (in channels, out channels, kernel (h, w), stride (h, w), padding (h, w), image (h, w)[, dilation (h, w)])
CONVS = [
    (3, 16, (3, 3), (1, 1), (1, 1), (12, 10)),      # an RGB stem: one 16-wide panel
    (3, 5, (3, 3), (1, 1), (1, 1), (7, 9)),         # a partial 16-wide panel
    (16, 40, (3, 3), (2, 2), (1, 1), (11, 13)),     # a 32-wide panel and a partial one, stride 2
    (8, 32, (5, 5), (2, 2), (2, 2), (9, 9)),
    (8, 17, (3, 3), (2, 2), (0, 0), (10, 10)),      # the last image column is never read
    (4, 24, (1, 3), (1, 1), (0, 1), (6, 8)),        # non-square kernel
    (16, 33, (1, 1), (2, 2), (0, 0), (9, 11)),      # 1x1 with stride (implicit), 33 = 32 + 1
    (32, 64, (1, 1), (1, 1), (0, 0), (5, 7)),       # 1x1 stride 1: one plain panel GEMM
    (6, 20, (3, 3), (3, 1), (2, 0), (13, 8)),       # padding wider than half the kernel is legal
    (2, 16, (7, 7), (2, 2), (3, 3), (15, 15)),
    (8, 24, (3, 3), (1, 1), (2, 2), (12, 11), (2, 2)),      # dilated: kw runs of the channels per kernel row
    (16, 40, (3, 3), (2, 1), (4, 1), (14, 9), (4, 1)),      # dilated along the height only: one run a row
    (3, 16, (3, 5), (1, 2), (1, 3), (9, 16), (1, 3)),       # along the width only, RGB
    (5, 17, (2, 3), (3, 2), (0, 0), (13, 13), (5, 2)),      # unpadded, the window's far taps near the edge
]


def _graph(i, c, oc, k, s, p, image, d=(1, 1), batch="s0"):
    weight = T(*pack_conv_panels(torch.zeros(*k, c, oc)).shape)
    return Graph(f"implicit{i}", lambda b, x, w, bi: b("cuvil.relu", b(
        "cuvil.conv2d", x, w, bi, stride=list(s), padding=list(p), dilation=list(d), layout="nhwc",
        out_channels=oc)), [T(batch, *image, c), weight, T(oc)])


GRAPHS = {i: _graph(i, *cfg) for i, cfg in enumerate(CONVS)}
# (in channels, out channels, groups, kernel, stride, padding, image): one panel or a partial one
# per group, a 1x1 grouped convolution, and groups of 3 channels (read along the image rows)
GROUPED = [(16, 32, 4, 3, 1, 1, (9, 11)), (12, 40, 2, 3, 2, 1, (10, 7)), (32, 64, 8, 1, 1, 0, (5, 6)),
           (9, 18, 3, 5, 2, 2, (11, 11))]


def _grouped_graph(i, c, oc, g, k, s, p, image):
    weight = T(*pack_conv_panels(torch.zeros(k, k, c // g, oc), g).shape)
    return Graph(f"grouped{i}", lambda b, x, w, bi: b("cuvil.conv2d", x, w, bi, stride=[s, s], padding=[p, p],
                                                      groups=g, layout="nhwc", out_channels=oc),
                 [T("s0", *image, c), weight, T(oc)])


GRAPHS.update({f"grouped{i}": _grouped_graph(i, *cfg) for i, cfg in enumerate(GROUPED)})
GRAPHS["sym"] = Graph("implicit_sym", lambda b, x, w, bi: b(
    "cuvil.conv2d", x, w, bi, stride=[2, 1], padding=[1, 1], layout="nhwc", out_channels=24),
    [T("s0", "s1", "s2", 8), T(*pack_conv_panels(torch.zeros(3, 3, 8, 24)).shape), T(24)])
# the stem after the layout pass: the NCHW input permuted to NHWC, read inside the conv's kernel
GRAPHS["stem"] = Graph("implicit_stem", lambda b, x, w, bi: b("cuvil.relu", b(
    "cuvil.conv2d", b("cuvil.permute", x, perm=list(TO_NHWC)), w, bi, padding=[1, 1], layout="nhwc",
    out_channels=16)), [T("s0", 3, 20, 20), T(1, 3, 3, 3, 16), T(16)])


@pytest.fixture(scope="module")
def compiled():
    return compile_graphs(GRAPHS.values())


def _reference(x_nchw, w_oihw, bias, stride, padding, relu=True, dilation=(1, 1)):
    out = F.conv2d(x_nchw, w_oihw, bias, stride, padding, dilation)
    return F.relu(out) if relu else out


def test_panel_packing_round_trips():
    w = rand(40, 16, 3, 3)
    packed = pack_conv_panels(w.permute(*WEIGHT_TO_HWIO), widest=32)
    assert packed.shape == (2, 3, 3, 16, 32)
    assert torch.equal(packed[1, 2, 0, 5, 7], w[32 + 7, 5, 2, 0]) and not packed[1, ..., 8:].any()
    assert torch.equal(unpack_conv_panels(packed, 40), w)
    wide = pack_conv_panels(w.permute(*WEIGHT_TO_HWIO))    # 40 columns: one panel of 48 pads least
    assert wide.shape == (1, 3, 3, 16, 48) and not wide[..., 40:].any()
    assert torch.equal(unpack_conv_panels(wide, 40), w)
    assert pack_conv_panels(rand(3, 3, 3, 16)).shape[-1] == 16


@pytest.mark.parametrize("i", range(len(GROUPED)))
def test_grouped_implicit_conv_matches_eager(compiled, i):
    c, oc, g, k, s, p, (h, w_) = GROUPED[i]
    w, bias = rand(oc, c // g, k, k, seed=1), rand(oc, seed=2)
    packed = pack_conv_panels(w.permute(*WEIGHT_TO_HWIO).contiguous(), g)
    assert torch.equal(unpack_conv_panels(packed, oc, g), w)
    for n, split in ((1, 1), (2, 3)):
        x = rand(n, c, h, w_)
        out = run(GRAPHS[f"grouped{i}"], compiled, x.permute(*TO_NHWC).contiguous(), packed, bias, split=split)
        torch.testing.assert_close(out.permute(*TO_NCHW), F.conv2d(x, w, bias, s, p, 1, g), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("i", range(len(CONVS)))
def test_implicit_conv_matches_eager(compiled, i):
    c, oc, k, s, p, (h, w_), *dilation = CONVS[i]
    d = dilation[0] if dilation else (1, 1)
    w = rand(oc, c, *k, seed=1)
    packed = pack_conv_panels(w.permute(*WEIGHT_TO_HWIO).contiguous())
    bias = rand(oc, seed=2)
    for n, split in ((1, 1), (3, 2), (2, 5)):
        x = rand(n, c, h, w_)
        out = run(GRAPHS[i], compiled, x.permute(*TO_NHWC).contiguous(), packed, bias, split=split)
        torch.testing.assert_close(out.permute(*TO_NCHW), _reference(x, w, bias, s, p, dilation=d),
                                   rtol=1e-4, atol=1e-4)


def test_symbolic_image_sizes(compiled):
    w, bias = rand(24, 8, 3, 3, seed=3), rand(24, seed=4)
    packed = pack_conv_panels(w.permute(*WEIGHT_TO_HWIO).contiguous())
    for n, h, w_ in ((1, 5, 9), (2, 12, 3), (1, 1, 1)):
        x = rand(n, 8, h, w_)
        out = run(GRAPHS["sym"], compiled, x.permute(*TO_NHWC).contiguous(), packed, bias)
        torch.testing.assert_close(out.permute(*TO_NCHW), _reference(x, w, bias, (2, 1), (1, 1), relu=False),
                                   rtol=1e-4, atol=1e-4)


def test_stem_reads_the_nchw_input_through_the_permute(compiled):
    w, bias = rand(16, 3, 3, 3, seed=5), rand(16, seed=6)
    assert len(GRAPHS["stem"].kernels) == 1     # the permute is read inside the conv's kernel
    # its copy into the padded buffer (the call's own: `loc0`) writes each column's 3 channels out in turn: no loop over
    # the channels (LLVM unrolled it and SLP-vectorised at length) and no loop over the columns
    # inside one (its stores had a stride of 3: scatters on AVX-512)
    text = print_kernels(GRAPHS["stem"].kernels)
    row = re.search(r"for j in 1\.\.21 \{\n((?:\s*%loc0\[.*\n){3})\s*\}", text)
    assert row is not None, text
    assert [re.search(r"%a0\[p//2, (\d), ", line)[1] for line in row[1].strip().splitlines()] == ["0", "1", "2"], text
    x = rand(2, 3, 20, 20)
    out = run(GRAPHS["stem"], compiled, x, pack_conv_panels(w.permute(*WEIGHT_TO_HWIO).contiguous()), bias)
    torch.testing.assert_close(out.permute(*TO_NCHW), _reference(x, w, bias, 1, 1), rtol=1e-4, atol=1e-4)


def test_kernel_text_round_trips_the_windowed_gemm():
    (kernel,) = GRAPHS[0].kernels
    text = print_kernels([kernel])
    (gemm,) = [line.strip() for line in text.splitlines() if line.strip().startswith("gemm")]
    # 12x10 image, 3 channels, padding 1: A rows are 3 floats apart, an output row further is
    # one padded row (12 columns * 3), each kernel row a run of 3 * 3 floats; the bias and the relu
    # after the convolution are applied in the microkernel's registers
    assert re.search(r"b_panels=16, a_rows=10, a_rows_stride=36, k_run=9, k_run_stride=36, bias=%a2\[0\], "
                     r"relu=true$", gemm)
    assert "lda=3" in gemm and "k=27" in gemm
    assert print_kernels(parse_kernels(text)) == text
    # dilated 2 along the width: per kernel row 3 runs of the 8 channels, 2 * 8 floats apart; the
    # rows 2 padded rows (15 columns * 8) apart
    (kernel,) = GRAPHS[10].kernels
    text = print_kernels([kernel])
    assert re.search(r"a_rows=11, a_rows_stride=120, k_run=8, k_run_stride=240, k_row_runs=3, k_run_step=16,", text)
    assert print_kernels(parse_kernels(text)) == text


def test_layout_pass_chooses_the_implicit_gemm_end_to_end():
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 40, 3, stride=2, padding=1),
                          nn.Conv2d(40, 40, 3, padding=2, dilation=2), nn.Conv2d(40, 40, 3, groups=4)).eval()
    x = torch.randn(2, 3, 18, 18)    # (16 columns would run the RGB stem along its rows: test_columns_conv.py)
    compiled = cuvil.compile(model)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    (stats,) = [p["statistics"] for p in compiled.report.passes if p["name"] == "layout"]
    assert stats["weights-packed"] == 4 and stats["conv-panels"] == 4
    algorithms = [conv_algorithm(op) for op in cuvil.parse(compiled.report.output_ir).main.ops
                  if op.name == "cuvil.conv2d"]
    assert algorithms == ["implicit"] * 4
    off = cuvil.compile(model, pipeline="verify,shape-infer,fold-constants,layout{pack-conv=false},"
                                        "canonicalize,fuse,plan-memory")
    with torch.no_grad():
        torch.testing.assert_close(off(x), model(x), rtol=1e-4, atol=1e-4)
    assert "out_channels" not in off.report.output_ir


def test_conv1d_runs_as_a_one_row_implicit_gemm():
    # a dilated temporal stack (TCN / WaveNet style), the length dynamic
    model = nn.Sequential(nn.Conv1d(6, 16, 3, padding=2, dilation=2), nn.ReLU(),
                          nn.Conv1d(16, 24, 5, stride=2, padding=8, dilation=4, groups=2)).eval()
    compiled = cuvil.compile(model, dynamic=[{2: "length"}], ranges={"length": (8, 512)})
    with torch.no_grad():
        for length in (40, 8, 301):
            x = torch.randn(3, 6, length)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    ops = [op for op in cuvil.parse(compiled.report.output_ir).main.ops if op.name == "cuvil.conv2d"]
    assert [conv_algorithm(op) for op in ops] == ["implicit", "implicit"]
    assert [op.attrs["dilation"] for op in ops] == [[1, 2], [1, 4]]
    assert len(compiled._variants) == 1                     # one program for every length


@pytest.mark.parametrize("target,instruction", [("aarch64", r"\bfmla\b"), ("x86_64", r"\bvfmadd\w+ps\b.*ymm")])
def test_implicit_conv_for_other_targets(target, instruction):
    # the stem without a bias: each convolution calls its own GEMM variant, inlined into its kernel
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.Conv2d(16, 40, 3)).eval()
    report = cuvil.explain(model, torch.randn(1, 3, 10, 10), target=target)
    irs = "\n".join(k["kernel_ir"] for k in report.kernels)
    # 4- and 8-float vectors: panels of 16 columns for 16 and for 40 output channels
    assert "b_panels=16" in irs and "b_panels=32" not in irs and "k_run=" in irs
    convs = [k for k in report.kernels if "k_run=" in k["kernel_ir"]]
    assert len(convs) == 2 and all(re.search(instruction, k["asm"]) for k in convs)


def _random_convs(count: int, seed: int = 7):
    """Seeded random convolutions the implicit GEMM takes (at least two input channels per group,
    dilated one time in three), each with an output of at least one position."""
    g = torch.Generator().manual_seed(seed)
    pick = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))   # noqa: E731
    out = []
    while len(out) < count:
        k, s, p = (pick(1, 5), pick(1, 5)), (pick(1, 3), pick(1, 3)), (pick(0, 2), pick(0, 2))
        d = (pick(1, 3), pick(1, 3)) if pick(1, 3) == 1 else (1, 1)
        size = (pick(1, 14), pick(1, 14))
        if all(size[i] + 2 * p[i] >= (k[i] - 1) * d[i] + 1 for i in range(2)):
            groups = pick(1, 3)
            out.append((groups * pick(2, 7), groups * pick(1, 24), groups, k, s, p, d, size, pick(1, 3)))
    return out


@pytest.mark.parametrize("cin,cout,groups,k,s,p,d,size,batch", _random_convs(16))
def test_random_convolutions_through_o3_match_eager(cin, cout, groups, k, s, p, d, size, batch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(cin, cout, k, s, p, dilation=d, groups=groups), nn.ReLU()).eval()
    x = torch.randn(batch, cin, *size)
    compiled = cuvil.compile(model)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    ops = [op for op in cuvil.parse(compiled.report.output_ir).main.ops if op.name == "cuvil.conv2d"]
    assert [op.attrs["out_channels"] for op in ops] == [cout]      # the weight went into panels


@pytest.mark.parametrize("dilation", [1, 2])
def test_a_large_panel_is_walked_in_chunks_of_runs(monkeypatch, dilation):
    """With CHUNK_BYTES down to one kernel row's part of a panel (3 x 64 channels x the host's
    panel width for 40 columns: 48 with AVX-512, 16 on AVX2), the panel GEMM takes k in three
    chunks (`.chunked`), every block of rows resuming from the C of the chunk before, a partial
    panel (40 of 48 columns, or 8 of 16) through the tile, bias and relu after the last chunk only.
    Against an fp64 convolution."""
    from cuvil.codegen import panel_gemm
    width = panel_width(40, Target.host().panel_width)
    monkeypatch.setattr(panel_gemm, "CHUNK_BYTES", 3 * 64 * width * 4)
    model = nn.Sequential(nn.Conv2d(64, 40, 3, padding=dilation, dilation=dilation), nn.ReLU()).eval()
    x = torch.randn(2, 64, 7, 5, generator=torch.Generator().manual_seed(6))
    compiled = cuvil.compile(model, cache=False)
    with torch.no_grad():
        got = compiled(x)
        torch.testing.assert_close(got, copy.deepcopy(model).double()(x.double()).float(), rtol=1e-5, atol=1e-5)
    assert any(f"cuvil.panel_gemm.{width}.chunked.bias.relu" in k["llvm_ir"] for k in compiled.report.kernels)


@pytest.mark.parametrize("target", ["aarch64", "riscv64"])
def test_a_chunked_panel_compiles_for_other_targets(monkeypatch, target):
    """The `.chunked` GEMM is target-neutral LLVM IR: with the chunk down to one kernel row's part,
    a cross compile calls it and code generation goes through."""
    from cuvil.codegen import panel_gemm
    monkeypatch.setattr(panel_gemm, "CHUNK_BYTES", 3 * 16 * 16 * 4)
    model = nn.Sequential(nn.Conv2d(16, 40, 3), nn.ReLU()).eval()
    report = cuvil.explain(model, torch.randn(1, 16, 10, 10), target=target)
    conv = next(k for k in report.kernels if "k_run=" in k["kernel_ir"])
    assert "panel_gemm.16.chunked.bias.relu" in conv["llvm_ir"] and conv["asm"]


class PooledBlocks(nn.Module):
    """VGG's pattern in NHWC: convolution, batch norm, ReLU, a 2x2 max pool, then a grouped
    convolution and a 3x3 average pool (both pools inside the NHWC region, so the layout pass adds
    no conversion after them), a last convolution."""

    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2))
        self.b = nn.Sequential(nn.Conv2d(32, 48, 3, padding=1, groups=2), nn.AvgPool2d(3))
        self.c = nn.Conv2d(48, 32, 1)

    def forward(self, x):
        return self.c(torch.sigmoid(self.b(self.a(x))))


def test_pools_run_in_the_implicit_gemms_epilogue_end_to_end():
    torch.manual_seed(0)
    model = PooledBlocks().eval()
    compiled = cuvil.compile(model, dynamic=[{0: "batch"}], threads=2)
    with torch.no_grad():
        for x in (torch.randn(1, 16, 36, 30), torch.randn(3, 16, 36, 30)):    # 36 rows: a last tile of 4
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    groups = [g["summary"] for g in compiled.report.fusion["groups"]]
    assert "conv2d + relu + max_pool2d" in groups and "conv2d + avg_pool2d + sigmoid" in groups, groups
    convs = [op for op in parse(compiled.report.output_ir).main.ops if op.name == "cuvil.conv2d"]
    assert [conv_algorithm(op) for op in convs][:2] == ["implicit", "implicit"]
    # each pooled kernel keeps its tile's product on the call's stack and stores only the pooled result
    pooled = [k for k in compiled.report.kernels if "pool" in k["name"] and "conv2d" in k["name"]]
    assert len(pooled) == 2
    for k, pooled_shape in zip(pooled, ("18, 15, 32", "6, 5, 48")):     # NHWC
        (gemm,) = [line.strip() for line in k["kernel_ir"].splitlines() if line.strip().startswith("gemm")]
        assert re.match(r"gemm c=%loc\d+\[0\]", gemm), gemm
        (out,) = re.findall(r"%y\d+: out f32\[([^\]]*)\]", k["kernel_ir"])
        assert out == f"s0, {pooled_shape}", out


def test_an_implicit_gemm_with_a_symbolic_width_does_not_pool_and_says_why():
    model = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 32, 1)).eval()
    x = torch.randn(2, 16, 12, 16)
    compiled = cuvil.compile(model, dynamic=[{3: "width"}], ranges={"width": (4, 64)})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    refused = [r for r in compiled.report.fusion["refused"] if r["candidate_name"] == "cuvil.relu"]
    assert [r["rule"] for r in refused] == ["gemm-epilogue"]
    assert "the output's rows have no static width" in refused[0]["reason"], refused


def test_a_pool_ending_the_nhwc_region_stores_its_result_nchw_from_the_epilogue():
    # the layout pass converts the pool's result back to NCHW: a permute, stored by the pooled epilogue
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)).eval()
    compiled = cuvil.compile(model, dynamic=[{0: "batch"}], threads=2)
    with torch.no_grad():
        for x in (torch.randn(1, 3, 16, 32), torch.randn(3, 3, 16, 32)):
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    assert [g["summary"] for g in compiled.report.fusion["groups"]] == ["conv2d + relu + max_pool2d + permute"]
    (kernel,) = compiled.report.kernels
    assert re.search(r"%y0: out f32\[s0, 32, 8, 16\]", kernel["kernel_ir"]), kernel["kernel_ir"][:300]
