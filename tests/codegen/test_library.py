"""GEMM-based ops (matmul, linear, bmm, conv2d: direct / 1x1 GEMM / im2col) and pooling against
eager torch, including symbolic batch sizes, broadcasting batch dims, epilogues and thread splits."""
import re

import pytest
import torch
import torch.nn.functional as F

from cuvil.codegen.kernel_text import print_kernel
from cuvil.codegen.library import conv_algorithm
from cuvil.ir import DType

from codegen_helpers import Graph, T, compile_graphs, run

MATMUL_SHAPES = [((5, 7, 9), (9, 4)), ((3, 5, 7, 9), (5, 9, 4)), ((2, 1, 7, 9), (1, 3, 9, 4)), ((9,), (9, 4)),
                 ((5, 9), (9,)), ((9,), (9,)), ((4, 9), (3, 2, 9, 5)), ((130, 33), (33, 70))]
# (in channels, out channels, groups, kernel, stride, padding, dilation)
CONVS = [(3, 8, 1, 3, 1, 1, 1), (16, 32, 1, 3, 2, 1, 1), (16, 16, 16, 3, 1, 1, 1), (16, 32, 4, 3, 2, 2, 2),
         (16, 8, 1, 1, 1, 0, 1), (8, 16, 8, 5, 2, 2, 1), (32, 8, 2, 3, 1, 0, 3), (4, 6, 1, 2, 1, 1, 1),
         (12, 12, 12, 7, 1, 3, 1), (8, 8, 8, 3, 2, 2, 2), (1, 4, 1, 3, 1, 1, 1), (64, 64, 64, 3, 1, 1, 1)]
# (kernel, stride, padding, dilation, ceil_mode); the last three are windows over CLIPPED_WINDOW
# elements, which loop over their part inside the image
POOLS = [(3, 2, 1, 1, False), (2, 2, 0, 1, True), (3, 1, 1, 2, False), (3, 2, 1, 1, True),
         (9, 3, 4, 1, True), (11, 2, 0, 1, False), (13, 13, 6, 1, True)]


def _conv(c, oc, g, k, s, p, d, bias):
    operands = (lambda x, w, bi: (x, w, bi)) if bias else (lambda x, w: (x, w))
    return Graph(f"conv_{c}_{oc}_{g}_{k}_{s}_{p}_{d}_{int(bias)}",
                 lambda b, *a: b("cuvil.conv2d", *operands(*a), stride=[s, s], padding=[p, p], dilation=[d, d],
                                 groups=g),
                 [T("s0", c, 11, 13), T(oc, c // g, k, k)] + ([T(oc)] if bias else []))


GRAPHS = {
    **{f"matmul{i}": Graph(f"matmul{i}", lambda b, x, y: b("cuvil.matmul", x, y), [T(*sa), T(*sb)])
       for i, (sa, sb) in enumerate(MATMUL_SHAPES)},
    "bmm_symbolic": Graph("bmm_symbolic", lambda b, x, y: b("cuvil.matmul", x, y), [T("s0", 6, 9), T("s0", 9, 4)]),
    "linear": Graph("linear", lambda b, x, w, bb: b("cuvil.linear", x, w, bb), [T("s0", 20, 64), T(48, 64), T(48)]),
    "linear_relu": Graph("linear_relu", lambda b, x, w, bb: b("cuvil.relu", b("cuvil.linear", x, w, bb)),
                         [T("s0", 64), T(48, 64), T(48)]),
    "linear_nobias": Graph("linear_nobias", lambda b, x, w: b("cuvil.linear", x, w), [T(3, 64), T(48, 64)]),
    **{f"conv{i}": _conv(*cfg, bias=i % 2 == 0) for i, cfg in enumerate(CONVS)},
    "conv_silu": Graph("conv_silu", lambda b, x, w, bb: b("cuvil.silu", b("cuvil.conv2d", x, w, bb, padding=[1, 1])),
                       [T("s0", 16, 9, 9), T(24, 16, 3, 3), T(24)]),
    **{f"maxpool{i}": Graph(f"maxpool{i}", lambda b, x, k=k, s=s, p=p, d=d, cm=cm: b(
        "cuvil.max_pool2d", x, kernel=[k, k], stride=[s, s], padding=[p, p], dilation=[d, d], ceil_mode=cm),
        [T(2, 3, 11, 12)]) for i, (k, s, p, d, cm) in enumerate(POOLS)},
    **{f"avgpool{i}_{cip}_{div}": Graph(
        f"avgpool{i}_{cip}_{div}", lambda b, x, k=k, s=s, p=p, cm=cm, cip=cip, div=div: b(
            "cuvil.avg_pool2d", x, kernel=[k, k], stride=[s, s], padding=[p, p], ceil_mode=cm, count_include_pad=cip,
            divisor=div), [T(2, 3, 11, 12)])
       for i, (k, s, p, d, cm) in enumerate(POOLS) for cip in (True, False) for div in (None, 5)},
    "adaptive": Graph("adaptive", lambda b, x: [b(f"cuvil.adaptive_{kind}_pool2d", x, output_size=list(o))
                                                for kind in ("avg", "max")
                                                for o in ((1, 1), (3, 5), (5, 7), (11, 12))], [T("s0", 3, 11, 12)]),
    **{f"depthwise_symbolic_{layout}": Graph(
        f"depthwise_symbolic_{layout}", lambda b, x, w, bi, layout=layout: [
            b("cuvil.relu", b("cuvil.conv2d", x, w, bi, stride=[s, s], padding=[3, 3], groups=8, layout=layout))
            for s in (1, 2)],
        [T(2, 8, "s0", "s1"), T(8, 1, 7, 7), T(8)] if layout == "nchw" else
        [T(2, "s0", "s1", 8), T(7, 7, 1, 8), T(8)]) for layout in ("nchw", "nhwc")},
    "large_windows_symbolic_height": Graph(
        "large_windows_symbolic_height", lambda b, x: [
            b("cuvil.max_pool2d", x, kernel=[9, 9], stride=[2, 2], padding=[4, 4], ceil_mode=True),
            b("cuvil.avg_pool2d", x, kernel=[12, 9], stride=[5, 1], padding=[0, 3], count_include_pad=False)],
        [T(2, 3, "s0", 12)]),
    "pool_3d_input": Graph("pool_3d_input", lambda b, x: b("cuvil.max_pool2d", x, kernel=[2, 2]), [T(3, 8, 8)]),
}


@pytest.fixture(scope="module")
def compiled():
    return compile_graphs(GRAPHS.values())


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("i", range(len(MATMUL_SHAPES)))
def test_matmul_shapes_and_batch_broadcasting(compiled, i):
    sa, sb = MATMUL_SHAPES[i]
    a, b = rand(*sa), rand(*sb, seed=1)
    torch.testing.assert_close(run(GRAPHS[f"matmul{i}"], compiled, a, b, split=4), a @ b, rtol=1e-5, atol=1e-5)


def test_bmm_and_linear_with_symbolic_batch(compiled):
    for n in (1, 5):
        a, b = rand(n, 6, 9), rand(n, 9, 4, seed=1)
        torch.testing.assert_close(run(GRAPHS["bmm_symbolic"], compiled, a, b), torch.bmm(a, b))
        x, w, bias = rand(n, 20, 64), rand(48, 64, seed=1), rand(48, seed=2)
        torch.testing.assert_close(run(GRAPHS["linear"], compiled, x, w, bias), F.linear(x, w, bias),
                                   rtol=1e-5, atol=1e-5)
    x = rand(200, 64)      # 4 row tiles, run as 3 thread chunks
    torch.testing.assert_close(run(GRAPHS["linear_relu"], compiled, x, w, bias, split=3),
                               F.relu(F.linear(x, w, bias)), rtol=1e-5, atol=1e-5)
    assert len(GRAPHS["linear_relu"].kernels) == 1
    x = rand(3, 64)
    torch.testing.assert_close(run(GRAPHS["linear_nobias"], compiled, x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("i", range(len(CONVS)))
def test_conv2d(compiled, i):
    c, oc, g, k, s, p, d = CONVS[i]
    x, w, bias = rand(2, c, 11, 13), rand(oc, c // g, k, k, seed=1), rand(oc, seed=2)
    args = (x, w, bias) if i % 2 == 0 else (x, w)
    ref = F.conv2d(x, w, bias if i % 2 == 0 else None, s, p, d, g)
    torch.testing.assert_close(run(GRAPHS[f"conv{i}"], compiled, *args), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("h, w", [(5, 9), (16, 17), (1, 30)])
def test_depthwise_over_a_symbolic_height_and_width(compiled, layout, h, w):
    x, weight, bias = rand(2, 8, h, w), rand(8, 1, 7, 7, seed=1), rand(8, seed=2)
    if layout == "nhwc":
        got = run(GRAPHS["depthwise_symbolic_nhwc"], compiled, x.permute(0, 2, 3, 1).contiguous(),
                  weight.permute(2, 3, 1, 0).contiguous(), bias)
        got = [t.permute(0, 3, 1, 2) for t in got]
    else:
        got = run(GRAPHS["depthwise_symbolic_nchw"], compiled, x, weight, bias)
    for s, out in zip((1, 2), got):
        torch.testing.assert_close(out, F.relu(F.conv2d(x, weight, bias, s, 3, 1, 8)), rtol=1e-4, atol=1e-4)


def test_conv_algorithm_choice():
    chosen = [conv_algorithm(GRAPHS[f"conv{i}"].fn.ops[0]) for i in range(len(CONVS))]
    assert chosen == ["im2col", "im2col", "depthwise", "im2col", "gemm", "depthwise", "im2col", "direct",
                      "depthwise", "depthwise", "depthwise", "depthwise"]


def test_conv_epilogue_fuses(compiled):
    x, w, bias = rand(3, 16, 9, 9), rand(24, 16, 3, 3, seed=1), rand(24, seed=2)
    assert len(GRAPHS["conv_silu"].kernels) == 1
    torch.testing.assert_close(run(GRAPHS["conv_silu"], compiled, x, w, bias, split=2),
                               F.silu(F.conv2d(x, w, bias, padding=1)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("i", range(len(POOLS)))
def test_pooling(compiled, i):
    k, s, p, d, cm = POOLS[i]
    x = rand(2, 3, 11, 12)
    x[0, 0, 0, 0] = float("nan")
    torch.testing.assert_close(run(GRAPHS[f"maxpool{i}"], compiled, x), F.max_pool2d(x, k, s, p, d, cm),
                               equal_nan=True)
    for cip in (True, False):
        for div in (None, 5):
            torch.testing.assert_close(run(GRAPHS[f"avgpool{i}_{cip}_{div}"], compiled, x),
                                       F.avg_pool2d(x, k, s, p, cm, cip, div), equal_nan=True)


@pytest.mark.parametrize("height", [12, 13, 30])
def test_large_windows_over_a_symbolic_height(compiled, height):
    x = rand(2, 3, height, 12)
    max_out, avg_out = run(GRAPHS["large_windows_symbolic_height"], compiled, x)
    torch.testing.assert_close(max_out, F.max_pool2d(x, 9, 2, 4, ceil_mode=True))
    torch.testing.assert_close(avg_out, F.avg_pool2d(x, (12, 9), (5, 1), (0, 3), count_include_pad=False))


def test_adaptive_pooling_and_rank3_input(compiled):
    x = rand(2, 3, 11, 12)
    x[0, 1, 4, 4] = float("nan")            # max pooling passes a NaN on, as torch's does
    expected = [fn(x, size) for fn in (F.adaptive_avg_pool2d, F.adaptive_max_pool2d)
                for size in ((1, 1), (3, 5), (5, 7), (11, 12))]
    for out, ref in zip(run(GRAPHS["adaptive"], compiled, x), expected):
        torch.testing.assert_close(out, ref, equal_nan=True)
    x = rand(3, 8, 8)
    torch.testing.assert_close(run(GRAPHS["pool_3d_input"], compiled, x), F.max_pool2d(x, 2))


ATTENTION = {
    "plain": (lambda b, q, k, v: b("cuvil.sdpa", q, k, v), [T(2, 3, 70, 16), T(2, 3, 33, 16), T(2, 3, 33, 8)], None),
    "causal": (lambda b, q, k, v: b("cuvil.sdpa", q, k, v, is_causal=True, scale=0.3),
               [T("s0", 70, 16), T("s0", 70, 16), T("s0", 70, 8)], None),
    "bool_mask": (lambda b, q, k, v, m: b("cuvil.sdpa", q, k, v, m), [T(2, 5, 16), T(2, 9, 16), T(2, 9, 4),
                                                                     T(5, 9, dtype=DType.bool)], torch.bool),
    "float_mask": (lambda b, q, k, v, m: b("cuvil.sdpa", q, k, v, m), [T(2, 3, 5, 16), T(2, 3, 9, 16),
                                                                      T(2, 3, 9, 4), T(2, 1, 5, 9)], torch.float32),
}


def test_scaled_dot_product_attention():
    graphs = {name: Graph(f"sdpa_{name}", build, types) for name, (build, types, _) in ATTENTION.items()}
    compiled = compile_graphs(graphs.values())
    for name, (_, types, mask_dtype) in ATTENTION.items():
        shapes = [[d if isinstance(d, int) else 3 for d in t.shape] for t in types]
        q, k, v = (rand(*s, seed=i) for i, s in enumerate(shapes[:3]))
        args = [q, k, v]
        if mask_dtype == torch.bool:
            mask = rand(*shapes[3], seed=5) > -0.5
            mask[:, 0] = True                   # no fully masked row
            args.append(mask)
        elif mask_dtype is not None:
            args.append(rand(*shapes[3], seed=5))
        attrs = {"is_causal": True, "scale": 0.3} if name == "causal" else {}
        ref = F.scaled_dot_product_attention(*args[:3], attn_mask=args[3] if len(args) > 3 else None, **attrs)
        torch.testing.assert_close(run(graphs[name], compiled, *args, split=2), ref, rtol=1e-5, atol=1e-5, msg=name)


def test_a_linear_epilogue_with_a_transposed_residual_runs_in_column_blocks():
    # ConvNeXt: an NHWC linear whose epilogue adds the NCHW block input, read through a permute
    # that is contiguous along the linear's rows: the epilogue takes 8 columns over every row
    def build(b, x, r, w, bias):
        y = b("cuvil.linear", x, w, bias)
        return b("cuvil.add", y, b("cuvil.permute", r, perm=[0, 2, 3, 1]))
    g = Graph("residual", build, [T("s0", 5, 7, 12), T("s0", 20, 5, 7), T(20, 12), T(20)])
    (kernel,) = g.kernels
    text = print_kernel(kernel)
    assert "for e1t in 0..3" in text and "for e1 in 0..min(8, -8*e1t + 20)" in text, text
    compiled = compile_graphs([g])
    for n in (1, 3):
        x, r, w, bias = torch.randn(n, 5, 7, 12), torch.randn(n, 20, 5, 7), torch.randn(20, 12), torch.randn(20)
        torch.testing.assert_close(run(g, compiled, x, r, w, bias), F.linear(x, w, bias) + r.permute(0, 2, 3, 1))


VIEW_OPS = {"split", "reshape", "permute", "transpose", "view", "slice"}


@pytest.mark.parametrize("seq", [20, 64])
def test_batched_matmuls_read_attention_heads_through_their_views(seq):
    """Manual attention (the suite's block): q, k^T and v are heads of one QKV projection, views
    the batched products read through (the left operand copied an entry at a time, the right one
    packed in panels), so no kernel only copies a view; a 20-long sequence leaves a partial panel."""
    import cuvil

    def attention(x, w, bias):
        n, s, _ = x.shape
        q, k, v = (x @ w).split(64, dim=-1)
        q, k, v = (t.reshape(n, s, 4, 16).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / 4.0 + bias
        return scores.softmax(-1) @ v

    x, w, bias = rand(2, seq, 64), rand(64, 192, seed=1) / 8, rand(seq, seq, seed=2)
    # written out as attention: fuse-attention would make it one sdpa (tests/unit/test_fuse_attention.py)
    fast = cuvil.compile(attention, cache=False, disable_passes=["fuse-attention"])
    torch.testing.assert_close(fast(x, w, bias), attention(x, w, bias), rtol=1e-5, atol=1e-5)
    names = [re.sub(r"^.*?_\d+_", "", k["name"]).split("_") for k in fast.report.kernels]
    assert not [n for n in names if set(n) <= VIEW_OPS], names
    assert sum("matmul" in n for n in names) == 3


def test_gemm_row_tiles_are_even_for_thread_splits():
    """A GEMM's static rows are cut into tiles of even height (a multiple of 8), an even number in
    all (the engine splits tiles into equal counts per thread): ConvNeXt's 3136 rows with three
    column tiles had been 12 tiles of 256 and one of 64, 19% more rows for one of two threads."""
    import sympy

    from cuvil.codegen.library import ROW_TILE, _row_tile_height
    assert _row_tile_height(3136, 3) == (14, 224)
    assert _row_tile_height(300, 1) == (2, 152)
    assert _row_tile_height(1000, 3) == (4, 256)
    assert _row_tile_height(128, 1) == (1, ROW_TILE)
    s = sympy.Symbol("s0", integer=True, positive=True)
    assert _row_tile_height(s, 1)[1] == ROW_TILE
    import cuvil
    linear = torch.nn.Linear(96, 384)
    x = rand(1, 3136, 96)
    got = cuvil.compile(linear, threads=2, cache=False)(x)
    torch.testing.assert_close(got, linear(x), rtol=1e-5, atol=1e-5)


def test_a_gemm_of_one_tile_splits_its_panels_in_two():
    """The transformer block's QKV projection (128 rows, 192 columns in panels of 16 or 32) fits
    one tile: it is cut at a panel into two column tiles, so that two threads share it."""
    import cuvil
    linear = torch.nn.Linear(64, 192)
    x = rand(1, 128, 64)
    fast = cuvil.compile(linear, threads=2, cache=False)
    torch.testing.assert_close(fast(x), linear(x), rtol=1e-5, atol=1e-5)
    (kernel,) = [k for k in fast.report.kernels if "linear" in k["name"]]
    assert re.search(r"parallel for p in 0\.\.2 \{", kernel["kernel_ir"]), kernel["kernel_ir"]
