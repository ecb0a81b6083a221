"""Linears whose weight the layout pass packed in panels (`codegen/panel_gemm.py`) against eager
torch: every remainder of rows and of panel columns, row and column tiles, thread splits, fused
epilogues, the kernel text form, and the code for other targets."""
import copy
import re

import pytest
import sympy
import torch
import torch.nn.functional as F
from torch import nn

import cuvil
from cuvil.codegen.jit import build_units
from cuvil.codegen.kernel_text import parse_kernels, print_kernels
from cuvil.codegen.panel_gemm import panel_rows, row_blocks
from cuvil.codegen.target import Target
from cuvil.ir.ops.nn import pack_panels, panel_width, unpack_panels

from codegen_helpers import Graph, T, compile_graphs, run
from test_library import rand

# (rows, in features, out features): rows around the microkernel's blocks of 6 (AVX2) and 12
# (AVX-512) and their remainders in blocks of 4 and 1 (1..7, 11..13, 17, 28), two row tiles (300);
# out features within one panel, one over, a partial last panel, and column tiles
SHAPES = [(1, 64, 10), (2, 64, 33), (5, 3, 32), (6, 17, 100), (7, 64, 64), (11, 8, 40), (12, 16, 64),
          (13, 1, 40), (17, 24, 33), (28, 9, 96), (64, 96, 600), (300, 32, 70)]


def _graph(i, k, n):
    return Graph(f"packed{i}", lambda b, x, w, bias: b("cuvil.relu", b("cuvil.linear", x, w, bias, out_features=n)),
                 [T("s0", k), T(*pack_panels(torch.zeros(n, k)).shape), T(n)])


GRAPHS = {i: _graph(i, k, n) for i, (_, k, n) in enumerate(SHAPES)}
# (name, epilogue after the packed linear, eager reference): the microkernel applies bias and relu
# in registers; anything else stays a loop over each tile's block
EPILOGUES = {
    "gelu": (lambda b, y, r: b("cuvil.gelu", y, approximate="none"), lambda y, r: F.gelu(y)),
    "residual": (lambda b, y, r: b("cuvil.relu", b("cuvil.add", y, r)), lambda y, r: F.relu(y + r)),
    "none": (lambda b, y, r: y, lambda y, r: y),
}
OTHER = {name: Graph(f"epilogue_{name}", lambda b, x, w, bias, r, f=f: f(b, b("cuvil.linear", x, w, bias,
                                                                                out_features=40), r),
                     [T("s0", 24), T(*pack_panels(torch.zeros(40, 24)).shape), T(40), T("s0", 40)])
         for name, (f, _) in EPILOGUES.items()}
NO_BIAS = Graph("no_bias", lambda b, x, w: b("cuvil.relu", b("cuvil.linear", x, w, out_features=40)),
                [T("s0", 24), T(*pack_panels(torch.zeros(40, 24)).shape)])


@pytest.fixture(scope="module")
def compiled():
    return compile_graphs([*GRAPHS.values(), *OTHER.values(), NO_BIAS])


def test_packing_round_trips():
    w = rand(70, 5)
    packed = pack_panels(w, widest=32)
    assert packed.shape == (3, 5, 32)
    assert torch.equal(packed[1, :, 3], w[32 + 3]) and not packed[2, :, 6:].any()   # zero padding
    assert torch.equal(unpack_panels(packed, 70), w)
    wide = pack_panels(w)       # 70 columns pad to 96 in panels of 32 or 48 (128 in 64): 48 wins the tie
    assert wide.shape == (2, 5, 48) and torch.equal(unpack_panels(wide, 70), w) and not wide[1, :, 22:].any()
    head = pack_panels(rand(10, 7))             # a narrow output: one 16-wide panel
    assert head.shape == (1, 7, 16) and panel_width(10) == 16 and not head[..., 10:].any()


@pytest.mark.parametrize("i", range(len(SHAPES)))
def test_packed_linear_matches_eager(compiled, i):
    m, k, n = SHAPES[i]
    x, w, bias = rand(m, k), rand(n, k, seed=1), rand(n, seed=2)
    for split in (1, 3):
        out = run(GRAPHS[i], compiled, x, pack_panels(w), bias, split=split)
        torch.testing.assert_close(out, F.relu(F.linear(x, w, bias)), rtol=1e-5, atol=1e-5)


def test_kernel_text_keeps_the_packed_operand():
    (kernel,) = GRAPHS[0].kernels
    text = print_kernels([kernel])
    assert "b_panels=16" in text
    assert print_kernels(parse_kernels(text)) == text


def test_bias_and_relu_run_in_the_microkernel_registers(compiled):
    (kernel,) = GRAPHS[SHAPES.index((64, 96, 600))].kernels     # column tiles of 128, each its part of the bias
    text = print_kernels([kernel])
    assert "b_panels=32, bias=%a2[128*(p % 5)], relu=true\n  }\n}" in text   # and no epilogue loop after it
    assert "max(" not in text
    assert print_kernels(parse_kernels(text)) == text
    (kernel,) = NO_BIAS.kernels
    assert "relu=true" in print_kernels([kernel]) and "bias=" not in print_kernels([kernel])
    x, w = rand(9, 24), rand(40, 24, seed=1)
    x[2, 5] = float("nan")                   # NaN stays NaN through the bias and the relu
    out = run(NO_BIAS, compiled, x, pack_panels(w))
    torch.testing.assert_close(out, F.relu(F.linear(x, w)), rtol=1e-5, atol=1e-5, equal_nan=True)
    assert out[2].isnan().all() and not out[[0, 1, 3]].isnan().any()


@pytest.mark.parametrize("name", list(EPILOGUES))
def test_other_epilogues_run_as_loops_after_the_microkernel(compiled, name):
    # the bias is added in registers whatever follows (so that every kernel calls the one `.bias`
    # GEMM routine); the rest runs as loops that read the product with its bias, not adding it again
    (kernel,) = OTHER[name].kernels
    text = print_kernels([kernel])
    gemm = next(line for line in text.splitlines() if "gemm" in line)
    assert "relu=" not in gemm and "bias=" in gemm
    after = text.split(gemm, 1)[1]
    assert re.search(r"bias=(%\w+)\[", gemm).group(1) not in after
    assert ("for " in after) == (name != "none")
    x, w, bias, r = rand(70, 24), rand(40, 24, seed=1), rand(40, seed=2), rand(70, 40, seed=3)
    out = run(OTHER[name], compiled, x, pack_panels(w), bias, r)
    torch.testing.assert_close(out, EPILOGUES[name][1](F.linear(x, w, bias), r), rtol=1e-5, atol=1e-5)


def test_an_epilogue_in_registers_needs_a_packed_operand():
    text = print_kernels(GRAPHS[0].kernels).replace("b_panels=16, ", "")
    with pytest.raises(cuvil.CuvilParseError, match="only a gemm with b_panels applies bias and relu"):
        parse_kernels(text)


def test_layout_pass_packs_constant_linear_weights_only():
    mlp = nn.Sequential(nn.Linear(16, 40), nn.ReLU(), nn.Linear(40, 5)).eval()
    x = torch.randn(3, 16)
    report = cuvil.explain(mlp, x)
    (stats,) = [p["statistics"] for p in report.passes if p["name"] == "layout"]
    assert stats["linears-packed"] == 2
    assert re.findall(r"out_features = (\d+)", report.output_ir) == ["40", "5"]
    off = cuvil.explain(mlp, x, pipeline="verify,shape-infer,layout{pack-linear=false}", native=False)
    assert "out_features" not in off.output_ir
    # a weight that is an input cannot be packed at compile time
    report = cuvil.explain(lambda x, w: F.linear(x, w), x, torch.randn(8, 16))
    assert "out_features" not in report.output_ir
    compiled = cuvil.compile(mlp)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), mlp(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target,instruction", [("aarch64", r"\bfmla\b"), ("x86_64", r"\bvfmadd\w+ps\b.*ymm")])
def test_panel_kernel_for_other_targets(target, instruction):
    # NEON and AVX2 (x86-64-v3) have 4- or 8-float vectors: panels of 16 columns, whatever the host's
    mlp = nn.Sequential(nn.Linear(64, 96)).eval()
    report = cuvil.explain(mlp, torch.randn(8, 64), target=target)
    (kernel,) = report.kernels
    (stats,) = [p["statistics"] for p in report.passes if p["name"] == "layout"]
    assert stats["panel-width"] == 16 and "layout{panel-width=16}" in report.pipeline
    assert "b_panels=16" in kernel["kernel_ir"] and re.search(instruction, kernel["asm"])


@pytest.mark.parametrize("width", [16, 32, 48, 64])
@pytest.mark.parametrize("rows", [1, 2, 5, 13])
def test_every_panel_width_on_the_host(width, rows):
    """Every width runs on any host (48 or 64 on AVX2: blocks of one row); a block of few rows splits k
    among chains of accumulators (k = 67: a remainder after the chains)."""
    mlp = nn.Sequential(nn.Linear(67, 50), nn.ReLU(), nn.Linear(50, 7)).eval()
    pipeline = f"verify,shape-infer,layout{{panel-width={width}}},fuse,schedule,plan-memory"
    compiled = cuvil.compile(mlp, pipeline=pipeline)
    x = torch.randn(rows, 67, dtype=torch.float64).float()
    (stats,) = [p["statistics"] for p in cuvil.explain(mlp, x, pipeline=pipeline).passes if p["name"] == "layout"]
    assert stats["panel-width"] == width
    with torch.no_grad():
        expected = copy.deepcopy(mlp).double()(x.double()).float()     # an fp64 reference
        torch.testing.assert_close(compiled(x), expected, rtol=1e-5, atol=1e-5)

def test_even_tiles_have_constant_extents():
    """Tiles that divide the output evenly get constant extents, so the epilogue loop after the
    GEMM is a vector loop of known trip count (a `min(128, 256 - 128*p)` extent left the GELU
    epilogue scalar); an uneven split keeps the `min`."""
    even = nn.Sequential(nn.Linear(64, 256), nn.GELU()).eval()
    kernel = cuvil.explain(even, torch.randn(128, 64)).kernels[0]["kernel_ir"]
    assert "for e1 in 0..128 {" in kernel and "min(" not in kernel
    assert re.search(r"\bvfmadd\w+ps\b", cuvil.explain(even, torch.randn(128, 64)).kernels[0]["asm"])
    uneven = nn.Sequential(nn.Linear(64, 320), nn.GELU()).eval()
    x = torch.randn(128, 64)
    assert "min(128, -128*p + 320)" in cuvil.explain(uneven, x).kernels[0]["kernel_ir"]
    with torch.no_grad():
        torch.testing.assert_close(cuvil.compile(uneven)(x), uneven(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(cuvil.compile(even)(x), even(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("a_shape,b_shape", [((4, 128, 16), (4, 16, 128)), ((2, 3, 20, 5), (3, 5, 17)),
                                             ((2, 1, 33, 7), (1, 4, 7, 40)), ((5, 16, 9), (5, 9, 16))])
def test_a_product_of_computed_matrices_packs_panels_at_run_time(a_shape, b_shape):
    """Batched products of two computed operands (broadcast batch dims, a partial last panel) pack
    the right-hand side per batch entry and run the panel GEMM, against an fp64 reference."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(*a_shape, generator=g), torch.randn(*b_shape, generator=g)
    fn = lambda a, b: torch.tanh(a) @ (b * 2.0)       # noqa: E731
    kernels = "\n".join(k["kernel_ir"] for k in cuvil.explain(fn, a, b).kernels)
    # panels as wide as the target's for weights: 16 columns for at most 16, else 32 with AVX-512
    assert f"b_panels={panel_width(b_shape[-1], Target.host().panel_width)}" in kernels and "ldb=0" in kernels
    expected = (torch.tanh(a.double()) @ (b.double() * 2.0)).float()
    torch.testing.assert_close(cuvil.compile(fn)(a, b), expected, rtol=1e-5, atol=1e-5)


def test_a_left_operand_that_is_an_input_in_order_is_read_in_place():
    """A reshape of an input keeps its order: the batched product's left-hand side is the input's
    memory, entry by entry, and the GEMM reads it there instead of copying each entry to scratch
    (`[16, 64, 1024] @ [16, 1024, 64]` from one [1024, 1024] input: 1.41 -> 0.95 ms)."""
    x = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(6))
    fn = lambda x: x.reshape(16, 64, 1024) @ x.reshape(16, 1024, 64)     # noqa: E731
    (kernel,) = cuvil.explain(fn, x).kernels
    assert "a=%x[" in kernel["kernel_ir"] and "b_panels=" in kernel["kernel_ir"]
    expected = (x.double().reshape(16, 64, 1024) @ x.double().reshape(16, 1024, 64)).float()
    torch.testing.assert_close(cuvil.compile(fn)(x), expected, rtol=1e-5, atol=1e-4)


def test_a_product_with_few_rows_keeps_blas():
    a, b = torch.randn(4, 8, 32), torch.randn(4, 32, 64)
    kernels = "\n".join(k["kernel_ir"] for k in cuvil.explain(lambda a, b: a @ b, a, b).kernels)
    assert "gemm" in kernels and "b_panels" not in kernels
    torch.testing.assert_close(cuvil.compile(lambda a, b: a @ b)(a, b), a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m,rows,blocks", [(128, 12, {12, 4}), (1, 12, {1}), (13, 12, {12, 1}), (24, 12, {12}),
                                          (11, 12, {4, 1}), (7, 6, {6, 1}), (10, 6, {6, 4}), (3, 4, {1}),
                                          (9, 4, {4, 1})])
def test_row_blocks_of_a_constant_m(m, rows, blocks):
    """The microkernel's blocks that compute m rows: as many of `rows` as fit, then blocks of 4
    (when `rows` is over 4), then single rows."""
    assert row_blocks(m, rows) == blocks
    assert row_blocks(sympy.Symbol("s0", positive=True, integer=True), 12) is None


@pytest.mark.parametrize("k_small,k_large,prefetches", [(24, 64, False), (24, 2048, True)])
def test_the_panel_gemm_prefetches_its_panels_where_a_call_streams_them(k_small, k_large, prefetches):
    """A panel of 2048 x 64 floats (512 KB; 2048 x 16 on AVX2) is read from beyond L1 by every
    block of rows: the routine prefetches it ahead (`PanelNeeds`), for both of its calls (64 or 2048
    and 64 columns, all in the host's widest panels); panels that fit in L1 are not prefetched.
    Either way the results are an fp64 reference's."""
    model = nn.Sequential(nn.Linear(k_small, k_large), nn.ReLU(), nn.Linear(k_large, 64), nn.ReLU()).eval()
    x = torch.randn(30, k_small)
    kernels = parse_kernels("\n".join(k["kernel_ir"] for k in cuvil.explain(model, x).kernels))
    (helper,) = [u for u in build_units(kernels, {k.name: k.name for k in kernels}, Target.host(), {})
                 if f'define void @"cuvil.panel_gemm.{panel_width(64, Target.host().panel_width)}.bias.relu"' in u]
    assert ("call void @\"llvm.prefetch.p0\"" in helper) == prefetches
    with torch.no_grad():
        torch.testing.assert_close(cuvil.compile(model)(x), copy.deepcopy(model).double()(x.double()).float(),
                                   rtol=1e-5, atol=1e-5)


class TwoLinears(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(24, 64), nn.Linear(24, 64)

    def forward(self, x, y):
        return torch.relu(self.a(x)), torch.relu(self.b(y))


@pytest.mark.parametrize("m_x,m_y", [(13, 25), (1, 2), (24, 36), (13, 28), (11, 5)])
def test_the_shared_panel_gemm_keeps_the_row_blocks_its_calls_need(m_x, m_y):
    """Two linears of constant row counts call one shared panel GEMM: it has the loops of the row
    blocks either call needs and no other (each block is unrolled code LLVM spends time on), and
    both compute what an fp64 reference does."""
    model = TwoLinears().eval()
    x, y = torch.randn(m_x, 24), torch.randn(m_y, 24)
    kernels = parse_kernels("\n".join(k["kernel_ir"] for k in cuvil.explain(model, x, y).kernels))
    target = Target.host()
    width = panel_width(64, target.panel_width)
    (helper,) = [u for u in build_units(kernels, {k.name: k.name for k in kernels}, target, {})
                 if f'define void @"cuvil.panel_gemm.{width}.bias.relu"' in u]
    rows = panel_rows(target.vector_floats, target.vector_registers, width)
    label = {rows: "i", 4: "i4", 1: "i1"}
    assert set(re.findall(r'^"?(i\d?)\.header"?:', helper, re.M)) == \
        {label[size] for size in row_blocks(m_x, rows) | row_blocks(m_y, rows)}
    with torch.no_grad():
        expected = copy.deepcopy(model).double()(x.double(), y.double())
        for out, ref in zip(cuvil.compile(model)(x, y), expected):
            torch.testing.assert_close(out, ref.float(), rtol=1e-5, atol=1e-5)
