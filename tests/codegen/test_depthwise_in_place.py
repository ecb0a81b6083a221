"""An NHWC depthwise convolution whose input is in memory reads it where it lies (no zero-padded
copy) and applies its elementwise epilogue before each store (library._depthwise_in_place): the
kernel's shape, and its results against eager torch where the border code matters: uneven padding,
strides and dilations, an image smaller than the window, and infinities next to the padding. And
the copying kernel's blocks of columns (library.conv2d_depthwise)."""
import pytest
import torch
import torch.nn.functional as F

import cuvil
from cuvil.codegen.kernel_ir import Call, Let, Loop
from cuvil.codegen.kernel_text import parse_kernels, print_kernel
from cuvil.codegen.llvm_emit import _latency_bound
from cuvil.ir.ops.nn import TO_NCHW, TO_NHWC, WEIGHT_TO_HWIO

from codegen_helpers import Graph, T, compile_graphs, run
from test_library import rand

# (channels, multiplier, kernel, stride, padding, dilation, padding after the image): over
# symbolic sizes; the last one is TensorFlow's "same" padding of a stride-2 convolution
CASES = [(16, 1, (3, 3), (1, 1), (1, 1), (1, 1), []), (16, 1, (3, 5), (2, 1), (2, 1), (1, 2), []),
         (8, 2, (5, 5), (1, 2), (0, 3), (1, 1), []), (24, 1, (7, 7), (1, 1), (3, 3), (1, 1), []),
         (16, 1, (3, 3), (2, 2), (0, 0), (1, 1), (1, 1))]


def _relu6(i, c, mult, k, s, p, d, high):
    return Graph(f"dw_relu6_{i}", lambda b, x, w, bi: b("cuvil.clamp", b(
        "cuvil.conv2d", x, w, bi, stride=list(s), padding=list(p), padding_high=list(high), dilation=list(d),
        groups=c, layout="nhwc"), min=0.0, max=6.0), [T("s0", "s1", "s2", c), T(*k, 1, c * mult), T(c * mult)])


GRAPHS = {i: _relu6(i, *case) for i, case in enumerate(CASES)}


@pytest.fixture(scope="module")
def compiled():
    return compile_graphs(GRAPHS.values())


def _eager(x, w, bias, c, s, p, d, high=()):
    (ph, pw), (qh, qw) = p, high or p
    return F.relu6(F.conv2d(F.pad(x, (pw, qw, ph, qh)), w, bias, s, 0, d, c))


def _run(compiled, i, x, w, bias):
    out = run(GRAPHS[i], compiled, x.permute(*TO_NHWC).contiguous(), w.permute(*WEIGHT_TO_HWIO).contiguous(),
              bias, split=2)
    return out.permute(*TO_NCHW)


def _static(size, k):
    return Graph(f"dw_static_{size}_{k}", lambda b, x, w: b("cuvil.conv2d", x, w, padding=[k // 2, k // 2], groups=8,
                                                             layout="nhwc"), [T(1, size, size, 8), T(k, k, 1, 8)])


def _copies(graph) -> bool:
    """Whether the kernel copies its input into a padded buffer (scratch, or its own local one)."""
    return any(b.role == "scratch" for k in graph.kernels for b in k.buffers) or any(k.locals for k in graph.kernels)


def test_the_kernel_reads_its_input_in_place_and_stores_each_output_once():
    kernels = GRAPHS[0].kernels
    assert len(kernels) == 1
    kernel = kernels[0]
    assert not _copies(GRAPHS[0])       # no padded copy
    text = print_kernel(kernel)
    out = next(b.name for b in kernel.buffers if b.role == "out")
    uses = [line.strip() for line in text.splitlines()[1:] if f"%{out}[" in line]
    assert uses and all(u.startswith(f"%{out}[") and u.count(f"%{out}[") == 1 for u in uses)   # stores only
    assert all("min(max(" in u for u in uses)        # relu6 applied to each sum before its store


def test_border_taps_read_at_indices_bound_once_per_output_position():
    # each tap's clamped row (per output row) and column (per output position) is a scalar bound
    # outside the channel loop: written out in every load instead, the min/max expressions made
    # up most of a 7x7 kernel's compile time
    kernel = GRAPHS[1].kernels[0]
    text = print_kernel(kernel)
    x = kernel.buffers[0].name
    loads = [line for line in text.splitlines() if f"%{x}[" in line]
    assert loads and not any("min(" in line or "max(" in line for line in loads)
    assert sum(" = index(min(" in line for line in text.splitlines()) == 3 + 5   # a 3x5 window


def _has_outputs(case, size) -> bool:
    _, _, k, _, p, d, high = case
    return all(n + pad + after - dil * (kk - 1) - 1 >= 0 for n, pad, after, dil, kk in zip(size, p, high or p, d, k))


@pytest.mark.parametrize("i, h, w", [(i, h, w) for i, case in enumerate(CASES)
                                     for h, w in [(12, 11), (3, 2), (1, 9)] if _has_outputs(case, (h, w))])
def test_matches_eager_over_border_and_interior(compiled, i, h, w):
    c, mult, k, s, p, d, high = CASES[i]
    x, weight, bias = rand(2, c, h, w) * 2, rand(c * mult, 1, *k, seed=1), rand(c * mult, seed=2)
    torch.testing.assert_close(_run(compiled, i, x, weight, bias), _eager(x, weight, bias, c, s, p, d, high),
                               rtol=1e-5, atol=1e-5)


def test_infinities_next_to_the_padding_stay_out_of_the_padded_taps(compiled):
    # a border tap reads the image at an index clamped inside it and selects 0: the clamped read of
    # an inf (or NaN) pixel must not turn the padded tap into inf * 0 = NaN
    c, mult, k, s, p, d, _ = CASES[0]
    x = rand(1, c, 8, 9)
    x[0, :, 0, :] = float("inf")
    x[0, :, :, -1] = float("-inf")
    x[0, 3, 4, 0] = float("nan")
    weight, bias = rand(c, 1, *k, seed=1), rand(c, seed=2)
    torch.testing.assert_close(_run(compiled, 0, x, weight, bias), _eager(x, weight, bias, c, s, p, d),
                               rtol=1e-5, atol=1e-5, equal_nan=True)


def test_a_wide_window_over_a_small_image_copies_it_padded():
    # border positions take a select per tap, one output at a time: a 7x7 window over 14x14 has
    # two thirds of its outputs there (33 border taps an output), and copying pays
    assert not _copies(_static(56, 7)) and not _copies(_static(7, 3)) and not _copies(_static(14, 5))
    assert _copies(_static(30, 7)) and _copies(_static(14, 7)) and _copies(_static(7, 7))


@pytest.mark.parametrize("size", [56, 14])
def test_both_choices_match_eager(size):
    graph = _static(size, 7)
    compiled = compile_graphs([graph])
    x, weight = rand(1, 8, size, size), rand(8, 1, 7, 7, seed=1)
    out = run(graph, compiled, x.permute(*TO_NHWC).contiguous(), weight.permute(*WEIGHT_TO_HWIO).contiguous())
    torch.testing.assert_close(out.permute(*TO_NCHW), F.conv2d(x, weight, None, 1, 3, 1, 8), rtol=1e-5, atol=1e-5)


def _loops(stmts):
    for s in stmts:
        if isinstance(s, Loop):
            yield s
            yield from _loops(s.body)


def test_a_long_window_row_is_summed_in_short_chains_and_its_loop_is_not_interleaved():
    """A Conformer's 31-tap 1-d depthwise convolution with SiLU (over a copy: its length is
    dynamic): a lone output's taps in fused multiply-add chains of at most CHAIN_FMAS (one chain
    of 31 waited on each FMA's latency), a block of DEPTHWISE_COPY_BLOCK = 4 outputs' in two chains
    each (16 and 15 taps), so the channel loop has independent chains enough and LLVM is not asked
    to interleave copies of it (`_latency_bound`), as it is for a lone SiLU."""
    graph = Graph("dw_conformer", lambda b, x, w, bi: b("cuvil.silu", b(
        "cuvil.conv2d", x, w, bi, padding=[0, 15], groups=32, layout="nhwc")), [T(1, 1, "s0", 32), T(1, 31, 1, 32),
                                                                               T(32)])
    (kernel,) = graph.kernels
    sums = [s.value for loop in _loops(kernel.body) for s in loop.body if isinstance(s, Let)]
    chains = sorted(sorted(_chains(v)) for v in sums if max(_chains(v)))     # the window sums
    assert chains == [[6, 7, 7, 7], [14, 15], [14, 15], [14, 15], [14, 15]]    # a mul, then 7 fmas: 8 taps
    channel_loops = [loop for loop in _loops(kernel.body) if loop.var.startswith("oc")]
    assert channel_loops and not any(_latency_bound(loop.body) for loop in channel_loops)
    silu = Graph("silu_alone", lambda b, x: b("cuvil.silu", x), [T(4, 64)])
    assert any(_latency_bound(loop.body) for loop in _loops(silu.kernels[0].body))

    x, weight, bias = rand(1, 32, 1, 70), rand(32, 1, 1, 31, seed=1), rand(32, seed=2)
    out = run(graph, compile_graphs([graph]), x.permute(*TO_NHWC).contiguous(),
              weight.permute(*WEIGHT_TO_HWIO).contiguous(), bias, split=2)
    torch.testing.assert_close(out.permute(*TO_NCHW), F.silu(F.conv2d(x, weight, bias, 1, (0, 15), 1, 32)),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("size, stride, dilation, rows", [(56, 1, 1, 14), (30, 1, 2, 24), (57, 2, 1, 15)])
def test_a_copied_depthwise_input_is_copied_in_tall_tiles(size, stride, dilation, rows):
    """An NCHW image into an NHWC 7x7 depthwise convolution (ConvNeXt's block) is copied per tile
    of output rows, with the window's extra rows: tiles of at least twice those rows, an even
    number of them (`_depthwise_tile_rows`), against eager at their edges."""
    import cuvil
    from cuvil.codegen.library import _depthwise_tile_rows
    out_size = (size + 6 - 6 * dilation - 1) // stride + 1
    assert _depthwise_tile_rows(out_size, out_size, 6 * dilation) == rows
    conv = torch.nn.Conv2d(32, 32, 7, stride=stride, padding=3, dilation=dilation, groups=32).eval()
    block = lambda x: conv(x).permute(0, 2, 3, 1)       # noqa: E731
    compiled = cuvil.compile(block, cache=False)
    x = rand(2, 32, size, size, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), block(x), rtol=1e-5, atol=1e-5)
    (kernel,) = compiled.report.kernels
    assert kernel["name"].endswith("permute_conv2d")      # the copy is the transpose


def _chains(e) -> list[int]:
    """The fused multiply-adds in each chain that a window sum adds up (its adds, pairwise)."""
    if isinstance(e, Call) and e.fn == "add":
        return _chains(e.args[0]) + _chains(e.args[1])
    fmas = 0
    while isinstance(e, Call) and e.fn == "fma":
        fmas, e = fmas + 1, e.args[2]
    return [fmas]


def test_a_copied_input_is_summed_four_columns_at_a_time_in_two_chains_each():
    """Over its zero-padded NHWC copy (an NCHW image converted, as ConvNeXt's block does), a 7x7
    depthwise convolution computes DEPTHWISE_COPY_BLOCK = 4 output columns together, each sum in
    two chains of consecutive taps (25 and 24 taps: a mul, then 24 or 23 fmas), and the columns
    left over (10 = 2 x 4 + 2) one at a time, in a chain per kernel row (a mul, then 6 fmas).
    Against fp64."""
    model = torch.nn.Conv2d(24, 24, 7, padding=3, groups=24).eval()
    x = rand(2, 24, 9, 10)
    forward = lambda x: model(x).permute(0, 2, 3, 1)   # noqa: E731
    (kernel,) = parse_kernels(cuvil.explain(forward, x).kernels[0]["kernel_ir"])
    assert "permute_conv2d" in kernel.name
    sums = [sorted(_chains(s.value)) for loop in _loops(kernel.body) for s in loop.body if isinstance(s, Let)]
    assert sums.count([23, 24]) == 4 and sums.count([6] * 7) == 1 and len(sums) == 5
    with torch.no_grad():
        expected = F.conv2d(x.double(), model.weight.double(), model.bias.double(), 1, 3, 1, 24).permute(0, 2, 3, 1)
        torch.testing.assert_close(cuvil.compile(forward, cache=False)(x).double(), expected, rtol=1e-5, atol=1e-5)
