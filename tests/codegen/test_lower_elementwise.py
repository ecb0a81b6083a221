"""Elementwise groups: every elementwise op against eager torch, broadcasting over symbolic dims
bound at call time, dtype handling, views folded into load indexing, and the default grouping.
All graphs compile into one LLVM module."""
import pytest
import sympy
import torch
import torch.nn.functional as F

from cuvil import CuvilIndexError
from cuvil.codegen.kernel_ir import Cast, Load, loop_var
from cuvil.codegen.jit import build_module
from cuvil.codegen.kernel_text import print_kernel
from cuvil.codegen.target import Target
from cuvil.passes.fuse import fusion_groups
from cuvil.ir import DType, sym

from codegen_helpers import Graph, T, compile_graphs, run

UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "relu": torch.relu, "silu": F.silu, "erf": torch.erf, "reciprocal": torch.reciprocal, "floor": torch.floor,
    "ceil": torch.ceil, "round": torch.round, "sign": torch.sign,
}
BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
    "maximum": torch.maximum, "minimum": torch.minimum, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt,
    "le": torch.le, "gt": torch.gt, "ge": torch.ge, "floor_div": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "remainder": torch.remainder, "fmod": torch.fmod,
}
INT_BINARY = {"add": torch.add, "mul": torch.mul, "maximum": torch.maximum, "floor_div":
              lambda a, b: torch.div(a, b, rounding_mode="floor"), "remainder": torch.remainder,
              "fmod": torch.fmod, "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or, "lt": torch.lt}


def _ops(names, arity):
    return lambda b, *args: [b(f"cuvil.{n}", *args[:arity]) for n in names]


GRAPHS = {
    "unary": Graph("unary", _ops(UNARY, 1), [T("s0", 7)]),
    # broadcasting: [s0, 1, s1] against [s1] and [s0, 3, 1]
    "binary": Graph("binary", _ops(BINARY, 2), [T("s0", 1, "s1"), T("s1")]),
    "binary3": Graph("binary3", lambda b, x, y: b("cuvil.mul", b("cuvil.add", x, y), x), [T("s0", 1, "s1"),
                                                                                         T("s0", 3, 1)]),
    "ints": Graph("ints", _ops(INT_BINARY, 2), [T("s0", 9, dtype=DType.i64), T(9, dtype=DType.i64)]),
    "mixed": Graph("mixed", lambda b, x, i: [
        b("cuvil.add", x, i),                                     # f32 + i64 -> f32
        b("cuvil.cast", x, dtype=DType.i64),                      # truncation toward zero
        b("cuvil.cast", b("cuvil.gt", x, i), dtype=DType.f32),
        b("cuvil.where", b("cuvil.logical_and", b("cuvil.gt", x, i), b("cuvil.logical_not", b("cuvil.lt", x,
          b("cuvil.literal", value=-1.5, dtype=DType.f32)))), x, b("cuvil.literal", value=7.0, dtype=DType.f32)),
    ], [T("s0", 5), T(5, dtype=DType.i64)]),
    "activations": Graph("activations", lambda b, x: [
        b("cuvil.gelu", x), b("cuvil.gelu", x, approximate="tanh"), b("cuvil.clamp", x, min=-0.5, max=2.0),
        b("cuvil.clamp", x, min=0.25), b("cuvil.pow", x, b("cuvil.literal", value=2, dtype=DType.i64)),
        b("cuvil.pow", b("cuvil.abs", x), b("cuvil.literal", value=0.5, dtype=DType.f32)),
        b("cuvil.pow", b("cuvil.abs", x), b("cuvil.literal", value=1.7, dtype=DType.f32)),
    ], [T("s0", 33)]),
    "half": Graph("half", lambda b, x, y: [b("cuvil.add", x, y), b("cuvil.mul", b("cuvil.cast", x, dtype=DType.f32),
                                                                    b("cuvil.literal", value=3.0, dtype=DType.f32))],
                  [T("s0", 6, dtype=DType.f16), T(6, dtype=DType.f16)]),
    "bf16": Graph("bf16", lambda b, x: b("cuvil.sigmoid", x), [T("s0", 6, dtype=DType.bf16)]),
    # views folded into the loads of one kernel
    "views": Graph("views", lambda b, x, bias: b("cuvil.gelu", b("cuvil.permute", b("cuvil.reshape", b(
        "cuvil.add", x, bias), shape=[sym("s0"), 8, 64]), perm=[1, 0, 2])), [T("s0", 512), T(512)]),
    "slices": Graph("slices", lambda b, x: b("cuvil.add", b("cuvil.slice", x, dim=1, start=[1], end=[9], step=2),
                                             b("cuvil.unsqueeze", b("cuvil.select", x, dim=1, index=-1), dim=1)),
                    [T("s0", 10)]),
    "expand": Graph("expand", lambda b, x, y: b("cuvil.sub", b("cuvil.expand", b("cuvil.squeeze", x, dims=[0]),
                                                                   shape=[4, 3, sym("s1")]), y),
                    [T(1, 3, 1), T(4, 3, "s1")]),
    "split_cat": Graph("split_cat", lambda b, x, y: b("cuvil.cat", *[b("cuvil.neg", r) for r in b.create(
        "cuvil.split", [x], {"dim": 1, "sizes": [2, 3]}).results], y, dim=1), [T("s0", 5), T("s0", 4)]),
    "triangle": Graph("triangle", lambda b, x: [b("cuvil.triu", x, diagonal=1), b("cuvil.tril", x)], [T("s0", "s1")]),
    # NHWC -> NCHW (a conv's output leaving the layout pass's region), plus an NCHW operand
    "to_nchw": Graph("to_nchw", lambda b, x, y: b("cuvil.add", b("cuvil.permute", x, perm=[0, 3, 1, 2]), y),
                     [T("s0", 5, 7, 12), T("s0", 12, 5, 7)]),
    "inline": Graph("inline", lambda b, x: b("cuvil.mul", b("cuvil.add", x, b("cuvil.full", shape=[4], value=2.5,
                                                                               dtype=DType.f32)),
                                             b("cuvil.arange", end=[4], dtype=DType.f32)), [T("s0", 4)]),
    "batch_norm": Graph("batch_norm", lambda b, x, m, v, w, bb: b("cuvil.batch_norm", x, m, v, w, bb, eps=1e-3),
                        [T("s0", 3, 4, 5), T(3), T(3), T(3), T(3)]),
}


@pytest.fixture(scope="module")
def compiled():
    return compile_graphs(GRAPHS.values())


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 3).to(dtype)


def test_unary(compiled):
    x = rand(11, 7)
    x[0, :5] = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0, -0.0])
    for out, (name, fn) in zip(run(GRAPHS["unary"], compiled, x), UNARY.items()):
        torch.testing.assert_close(out, fn(x), equal_nan=True, msg=name)
        if name in ("neg", "abs", "relu", "sqrt", "sin", "tanh", "floor", "ceil", "round"):   # signed zeros too
            zeros = fn(x) == 0
            assert torch.equal(out[zeros].signbit(), fn(x)[zeros].signbit()), name


@pytest.mark.parametrize("s0, s1", [(3, 5), (1, 17), (6, 1)])
def test_binary_broadcasting_over_symbolic_dims(compiled, s0, s1):
    a, b = rand(s0, 1, s1), rand(s1, seed=1)
    b[0] = 0.0                      # division and remainder by zero, like torch
    for out, (name, fn) in zip(run(GRAPHS["binary"], compiled, a, b), BINARY.items()):
        torch.testing.assert_close(out, fn(a, b), equal_nan=True, msg=name)
    c = rand(s0, 3, 1, seed=2)
    torch.testing.assert_close(run(GRAPHS["binary3"], compiled, a, c), (a + c) * a)


def test_integer_ops_follow_python_rounding(compiled):
    a = torch.randint(-20, 20, (4, 9))
    b = torch.tensor([3, -3, 7, -7, 1, -1, 5, 2, -4])
    for out, (name, fn) in zip(run(GRAPHS["ints"], compiled, a, b), INT_BINARY.items()):
        torch.testing.assert_close(out, fn(a, b), msg=name)


def test_mixed_dtypes_casts_where(compiled):
    x, i = rand(6, 5), torch.tensor([-2, -1, 0, 1, 2])
    x[0, :3] = torch.tensor([2.7, -2.7, -1.5])
    ref = [x + i, x.to(torch.int64), (x > i).float(), torch.where((x > i) & ~(x < -1.5), x, 7.0)]
    for out, r in zip(run(GRAPHS["mixed"], compiled, x, i), ref):
        torch.testing.assert_close(out, r)


def test_float_to_integer_casts_give_eagers_values_outside_the_integers_range_too():
    """Eager's casts are the CPU's truncating conversion: on x86, NaN and values outside the range
    give the smallest integer. One vector conversion in the kernel (a whole vector of them: the
    tensor is long enough for the vectorised loop)."""
    import cuvil
    special = [2.7, -2.7, 0.5, -0.99, 1e10, -1e10, 3e19, -3e19, 2.0 ** 31, -(2.0 ** 31), 2.0 ** 63, -(2.0 ** 63),
               float("inf"), float("-inf"), float("nan"), 123456.7]
    x = torch.tensor(special * 8)
    got = cuvil.compile(lambda x: (x.long(), x.int(), (x * 0.5).long()))(x)
    for g, w in zip(got, (x.long(), x.int(), (x * 0.5).long())):
        assert g.dtype == w.dtype and torch.equal(g, w)


def test_activations(compiled):
    x = torch.cat([torch.linspace(-12, 12, 3297), torch.tensor([float("inf"), float("-inf"), float("nan")])])
    x = x.reshape(-1, 33)
    ref = [F.gelu(x), F.gelu(x, approximate="tanh"), x.clamp(-0.5, 2.0), x.clamp(min=0.25), x ** 2,
           x.abs() ** 0.5, x.abs() ** 1.7]
    outs = run(GRAPHS["activations"], compiled, x)
    # torch's exact gelu gives nan at +inf with its AVX-512 kernel (+inf with AVX2); the limit (and
    # Cuvil's answer on every host) is +inf
    assert outs[0].reshape(-1)[-3].item() == float("inf")
    ref[0].view(-1)[-3] = float("inf")
    for k, (out, r) in enumerate(zip(outs, ref)):
        torch.testing.assert_close(out, r, equal_nan=True, msg=str(k))


def test_half_precision_computes_in_f32_and_rounds(compiled):
    x, y = rand(5, 6, dtype=torch.float16), rand(6, dtype=torch.float16, seed=3)
    s, m = run(GRAPHS["half"], compiled, x, y)
    assert s.dtype == torch.float16
    torch.testing.assert_close(s, x + y, rtol=0, atol=0)
    torch.testing.assert_close(m, x.float() * 3)
    z = rand(5, 6, dtype=torch.bfloat16)
    torch.testing.assert_close(run(GRAPHS["bf16"], compiled, z), torch.sigmoid(z))


def test_views_fold_into_one_kernel(compiled):
    for name in ("views", "slices", "expand", "split_cat"):
        assert len(GRAPHS[name].kernels) == 1, name
    inner = GRAPHS["views"].kernels[0].body[0].body[0]
    assert inner.var == "i2"
    divisions = [e for e in _index_exprs(inner.body) for sub in sympy.preorder_traversal(e)
                 if isinstance(sub, (sympy.floor, sympy.Mod)) and loop_var("i2") in sub.free_symbols]
    assert not divisions, "the inner loop of a reshape needs no division:\n" + print_kernel(GRAPHS["views"].kernels[0])
    x, bias = rand(3, 512), rand(512, seed=1)
    torch.testing.assert_close(run(GRAPHS["views"], compiled, x, bias),
                               F.gelu((x + bias).reshape(3, 8, 64).permute(1, 0, 2)))
    x = rand(4, 10)
    torch.testing.assert_close(run(GRAPHS["slices"], compiled, x), x[:, 1:9:2] + x[:, -1:])
    x, y = rand(1, 3, 1), rand(4, 3, 6, seed=1)
    torch.testing.assert_close(run(GRAPHS["expand"], compiled, x, y), x.squeeze(0).expand(4, 3, 6) - y)
    x, y = rand(3, 5), rand(3, 4, seed=1)
    torch.testing.assert_close(run(GRAPHS["split_cat"], compiled, x, y), torch.cat([-x[:, :2], -x[:, 2:], y], 1))
    x = rand(5, 7)
    up, low = run(GRAPHS["triangle"], compiled, x)
    torch.testing.assert_close(up, torch.triu(x, 1))
    torch.testing.assert_close(low, torch.tril(x))


def _index_exprs(stmts):
    loads = []

    def walk(e):
        if isinstance(e, Load):
            loads.extend(e.index)
        for sub in getattr(e, "args", ()):
            walk(sub)
        if isinstance(e, Cast):
            walk(e.value)
    for s in stmts:
        walk(s.value)
        loads.extend(getattr(s, "index", ()))
    return [sympy.sympify(i) for i in loads]


def test_inline_constants_and_batch_norm(compiled):
    x = rand(3, 4)
    torch.testing.assert_close(run(GRAPHS["inline"], compiled, x), (x + 2.5) * torch.arange(4.0))
    assert len(GRAPHS["inline"].kernels) == 1
    x, m, v, w, bb = rand(2, 3, 4, 5), rand(3), rand(3).abs(), rand(3), rand(3)
    torch.testing.assert_close(run(GRAPHS["batch_norm"], compiled, x, m, v, w, bb),
                               F.batch_norm(x, m, v, w, bb, eps=1e-3))


def test_grouping_fuses_chains_and_splits_shared_values():
    def build(b, x, y, w):
        h = b("cuvil.relu", b("cuvil.add", x, y))           # used twice below: materialised once
        e = b("cuvil.exp", b("cuvil.mul", h, h))
        s = b("cuvil.sum", b("cuvil.tanh", h), dims=[1])    # reduction absorbs its tanh prologue
        lin = b("cuvil.gelu", b("cuvil.linear", e, w))      # GEMM with a gelu epilogue
        return [s, lin]
    g = Graph("grouping", build, [T("s0", 8), T(8), T(4, 8)])
    names = [[op.name.split(".")[1] for op in grp] for grp in fusion_groups(g.fn)]
    assert names == [["add", "relu"], ["mul", "exp"], ["tanh", "sum"], ["linear", "gelu"]]
    x, y, w = rand(5, 8) / 3, rand(8, seed=1) / 3, rand(4, 8, seed=2) / 8
    s, lin = run(g, compile_graphs([g]), x, y, w)
    h = torch.relu(x + y)
    torch.testing.assert_close(s, torch.tanh(h).sum(1))
    torch.testing.assert_close(lin, F.gelu(F.linear(torch.exp(h * h), w)))


def test_a_transposing_permute_runs_in_tiles(compiled):
    # rows of 7 (shorter than a tile): the channels whole per (image, row), one line read in turn
    (kernel,) = GRAPHS["to_nchw"].kernels
    text = print_kernel(kernel)
    assert "%a0[p//5, p % 5, ib, ia]" in text and "tb" not in text, text
    for n, split in ((1, 1), (3, 2), (2, 7)):
        x, y = rand(n, 5, 7, 12), rand(n, 12, 5, 7, seed=1)
        torch.testing.assert_close(run(GRAPHS["to_nchw"], compiled, x, y, split=split), x.permute(0, 3, 1, 2) + y,
                                   rtol=0, atol=0)


@pytest.mark.parametrize("rows, cols", [(20, 12), (8, 16), (3, 5), (17, 9)])
def test_transposes_in_tiles_with_partial_edges(rows, cols):
    # 8 x 8 tiles of (the gathered dim, the last dim), the edge tiles partial; a symbolic matrix,
    # an NHWC -> NCHW conversion with an operand in output order, and a permute of computed values
    g2 = Graph("t2", lambda b, x: b("cuvil.relu", b("cuvil.permute", x, perm=[1, 0])), [T("s0", "s1")])
    g4 = Graph("t4", lambda b, x, y: b("cuvil.mul", b("cuvil.permute", b("cuvil.neg", x), perm=[0, 3, 1, 2]), y),
               [T("s0", 5, cols, rows), T("s0", rows, 5, cols)])
    text = print_kernel(g2.kernels[0])
    assert "for tb in 0..cdiv(s0, 8)" in text and "%y0[ia + 8*p, ib + 8*tb] = select(lt(%a0[ib + 8*tb, ia + 8*p]" in text, text
    compiled = compile_graphs([g2, g4])
    x = rand(rows, cols)
    torch.testing.assert_close(run(g2, compiled, x), torch.relu(x.t()), rtol=0, atol=0)
    for n, split in ((1, 1), (2, 3)):
        x, y = rand(n, 5, cols, rows, seed=2), rand(n, rows, 5, cols, seed=3)
        torch.testing.assert_close(run(g4, compiled, x, y, split=split), -x.permute(0, 3, 1, 2) * y, rtol=0, atol=0)


@pytest.mark.parametrize("dtype, shuffled", [(DType.f32, True), (DType.i64, True), (DType.bool, False)])
def test_whole_tiles_of_a_plain_transpose_are_shuffled_in_registers(dtype, shuffled):
    # 8 x 8 tiles whose value is a plain load: eight vector loads, three stages of shuffles,
    # eight vector stores (`llvm_emit._transpose_tile`); the edge tiles, and bools, stay loops
    g = Graph("tt", lambda b, x: b("cuvil.permute", x, perm=[0, 3, 1, 2]), [T("s0", 5, 19, 24, dtype=dtype)])
    compiled = compile_graphs([g])
    ir = compiled.llvm_ir(g.kernels[0].name)
    assert (ir.count("shufflevector") >= 24) == shuffled, ir
    torch_dtype = {DType.f32: torch.float32, DType.i64: torch.int64, DType.bool: torch.bool}[dtype]
    for n, split in ((1, 1), (3, 2)):
        x = (rand(n, 5, 19, 24, seed=n) * 10).to(torch_dtype)
        torch.testing.assert_close(run(g, compiled, x, split=split), x.permute(0, 3, 1, 2), rtol=0, atol=0)


def test_a_tile_that_computes_on_a_transposed_operand_is_vector_rows():
    # relu(permute(x) * scale + y): x transposed in registers, y read as vectors along the rows,
    # the per-channel scale (fixed along a row) broadcast; then one vector expression per row
    g = Graph("tile_expr", lambda b, x, s, y: b("cuvil.relu", b("cuvil.add", b("cuvil.mul", b(
        "cuvil.permute", x, perm=[0, 3, 1, 2]), s), y)), [T("s0", 5, 19, 24), T(24, 1, 1), T("s0", 24, 5, 19)])
    ir = str(build_module(g.kernels, {k.name: k.name for k in g.kernels}, Target.host(), debug=False))
    assert ir.count("shufflevector") >= 24 and ir.count("fmul <8 x float>") == 8, ir     # before LLVM's passes
    compiled = compile_graphs([g])
    for n, split in ((1, 1), (3, 2)):
        x, s, y = rand(n, 5, 19, 24, seed=n), rand(24, 1, 1, seed=7), rand(n, 24, 5, 19, seed=8)
        torch.testing.assert_close(run(g, compiled, x, s, y, split=split), torch.relu(x.permute(0, 3, 1, 2) * s + y),
                                   rtol=0, atol=0)


def test_a_transposed_tile_calls_intrinsics_on_vector_rows():
    # maximum (NaN-propagating llvm.maximum) and abs (llvm.fabs) of a transposed operand: the
    # tile's rows are vectors, and the intrinsics are declared for the vector type (llvm.maximum
    # .v8f32); a generated graph found them declared for scalars only
    g = Graph("tile_max", lambda b, x, y: b("cuvil.abs", b("cuvil.maximum", b("cuvil.permute", x, perm=[0, 2, 1]), y)),
              [T("s0", 16, 24), T("s0", 24, 16)])
    compiled = compile_graphs([g])
    x, y = rand(2, 16, 24, seed=1), rand(2, 24, 16, seed=2)
    x[0, 3, 5] = float("nan")
    expected = torch.abs(torch.maximum(x.transpose(1, 2), y))
    torch.testing.assert_close(run(g, compiled, x, y), expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("head_dim, runs", [(64, True), (3, False)])
def test_a_merged_last_dim_is_looped_in_runs_of_its_last_part(head_dim, runs):
    # attention's heads back into rows: [b, h, s, d] -> [b, s, h, d] -> [b, s, h*d]; a loop per
    # head over d reads contiguous lines (one loop over h*d reads through i // d and i % d)
    g = Graph("heads", lambda b, x: b("cuvil.reshape", b("cuvil.permute", x, perm=[0, 2, 1, 3]),
                                      shape=[2, 16, 4 * head_dim]), [T(2, 4, 16, head_dim)])
    text = print_kernel(g.kernels[0])
    expected = ("for i2r in 0..4 {\n      for i2 in 0..64 {\n        "
                "%y0[p//16, p % 16, i2 + 64*i2r] = %a0[p//16, i2r, p % 16, i2]")
    assert (expected in text) == runs and ("i2r" in text) == runs, text
    x = rand(2, 4, 16, head_dim)
    torch.testing.assert_close(run(g, compile_graphs([g]), x), x.permute(0, 2, 1, 3).reshape(2, 16, -1),
                               rtol=0, atol=0)


def test_views_are_recomputed_in_each_consumer():
    def build(b, x):
        q, k = b.create("cuvil.split", [x], {"dim": 1, "sizes": [4, 4]}).results
        t = b("cuvil.permute", q, perm=[1, 0])
        return [b("cuvil.relu", t), b("cuvil.exp", k), t]    # t is also returned: stored by its own kernel
    g = Graph("qkv", build, [T("s0", 8)])
    names = [[op.name.split(".")[1] for op in grp] for grp in fusion_groups(g.fn)]
    assert names == [["split", "permute"], ["split", "permute", "relu"], ["split", "exp"]]
    assert [[b.role for b in k.buffers] for k in g.kernels] == [["in", "out"]] * 3
    x = rand(5, 8)
    relu, e, t = run(g, compile_graphs([g]), x)
    torch.testing.assert_close(relu, torch.relu(x[:, :4].t()))
    torch.testing.assert_close(e, torch.exp(x[:, 4:]))
    torch.testing.assert_close(t, x[:, :4].t())


def test_gathers_read_indices_from_memory():
    g = Graph("gathers", lambda b, w, ids, x, i2, i3, i4: [
        b("cuvil.mul", b("cuvil.embedding", w, ids), b("cuvil.literal", value=2.0, dtype=DType.f32)),
        b("cuvil.index_select", x, i2, dim=1),
        b("cuvil.gather", x, i3, dim=1),
        b("cuvil.index", x, i4)],
        [T(10, 4), T("s0", 3, dtype=DType.i64), T(5, 6), T(4, dtype=DType.i64), T(5, 2, dtype=DType.i64),
         T(4, dtype=DType.i64)])
    assert len(g.kernels) == 4
    compiled = compile_graphs([g])
    w, x = rand(10, 4), rand(5, 6, seed=1)
    ids = torch.tensor([[0, 9, 3], [2, 2, 7]])
    i2, i3, i4 = torch.tensor([4, 0, 1, 3]), torch.tensor([[0, 5]] * 5), torch.tensor([4, 0, -1, -5])
    emb, sel, gat, adv = run(g, compiled, w, ids, x, i2, i3, i4)
    torch.testing.assert_close(emb, w[ids] * 2)
    torch.testing.assert_close(sel, torch.index_select(x, 1, i2))
    torch.testing.assert_close(gat, torch.gather(x, 1, i3))
    torch.testing.assert_close(adv, x[i4])                  # advanced indexing counts -1 from the end
    for bad in ([ids.clone().fill_(10), i2, i3, i4], [ids, torch.tensor([0, -1, 0, 0]), i3, i4],
                [ids, i2, torch.full((5, 2), 6), i4], [ids, i2, i3, torch.tensor([0, 0, 5, 0])],
                [ids, i2, i3, torch.tensor([-6, 0, 0, 0])]):
        with pytest.raises(CuvilIndexError, match="index check 0 failed"):     # torch raises on each
            run(g, compiled, w, bad[0], x, *bad[1:])


def test_a_cat_along_the_last_dim_is_a_loop_per_piece():
    """Each piece of a cat along the output's last dim gets a loop of its own, reading it alone
    (`_inner_loop`; a select among them per element made a concatenation of k pieces cost k times
    over). A piece of a run-time size shifts the pieces after it; a cat along another dim keeps
    its select."""
    def build(b, x, y, z):
        joined = b("cuvil.cat", b("cuvil.neg", x), y, z, dim=1)
        return [b("cuvil.relu", joined), b("cuvil.cat", x, x, dim=0)]
    g = Graph("cat_last", build, [T("s0", 5), T("s0", "s1"), T("s0", 1)])
    kernel = next(print_kernel(k) for k in g.kernels if "relu" in k.name or "neg" in k.name)
    assert kernel.count("for i1 in 0..") == 3 and "select(and(ge" not in kernel, kernel
    assert "for i1 in 0..s1 {" in kernel and "i1 + s1 + 5]" in kernel, kernel
    compiled = compile_graphs([g])
    for s1 in (1, 300):
        x, y, z = rand(3, 5), rand(3, s1, seed=1), rand(3, 1, seed=2)
        relu, stacked = run(g, compiled, x, y, z)
        torch.testing.assert_close(relu, torch.relu(torch.cat([-x, y, z], 1)), rtol=0, atol=0)
        torch.testing.assert_close(stacked, torch.cat([x, x], 0), rtol=0, atol=0)
