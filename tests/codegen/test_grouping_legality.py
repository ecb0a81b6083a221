"""The fuse pass forms only groups the lowering computes correctly (`group_legality`), and
`lower_group` refuses the others instead of miscompiling them: a GEMM whose product a window op
reads (its epilogue sees one tile of the product), and a gather whose table is computed in the
group (the table is read at a data-dependent index)."""
import pytest
import torch
import torch.nn.functional as F

import cuvil

from cuvil.codegen.lower import can_group, group_legality, lower_group
from cuvil.errors import CuvilVerifyError
from cuvil.ir import DType
from cuvil.passes.fuse import fusion_groups

from codegen_helpers import Graph, T, compile_graphs, run

C = 3


def _linear_small_conv(b, x, w, k):
    y = b("cuvil.linear", x, w)
    z = b("cuvil.conv2d", y, k, padding=[1, 1])     # in_channels * kh * kw = 12: direct, a window op
    return b("cuvil.relu", z)


def _computed_table(b, w, ids, x, idx):
    table = b("cuvil.mul", w, b("cuvil.literal", value=2.0, dtype=DType.f32))
    emb = b("cuvil.add", b("cuvil.embedding", table, ids), b("cuvil.literal", value=1.0, dtype=DType.f32))
    picked = b("cuvil.exp", b("cuvil.index_select", b("cuvil.permute", x, perm=[1, 0]), idx, dim=1))
    return [emb, picked]


def _names(fn, groups):
    return [[op.name.split(".")[1] for op in g] for g in groups]


def _ops(fn, *names):
    return [op for op in fn.ops if op.name.split(".")[1] in names]


@pytest.fixture(scope="module")
def graphs():
    gs = {"dw": Graph("gemm_then_small_conv", _linear_small_conv, [T("n", C, 5, 6), T(7, 6), T(C, C, 2, 2)]),
          "table": Graph("computed_table", _computed_table,
                         [T(10, 4), T("n", 3, dtype=DType.i64), T(6, 5), T(4, dtype=DType.i64)])}
    return gs, compile_graphs(gs.values())


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_gemm_feeding_a_direct_conv_gets_its_own_kernel(graphs):
    gs, compiled = graphs
    g = gs["dw"]
    assert _names(g.fn, fusion_groups(g.fn)) == [["linear"], ["conv2d", "relu"]]
    x, w, k = _rand(2, C, 5, 6), _rand(7, 6, seed=1), _rand(C, C, 2, 2, seed=2)
    torch.testing.assert_close(run(g, compiled, x, w, k), torch.relu(F.conv2d(F.linear(x, w), k, padding=1)))


def test_computed_table_gets_its_own_kernel(graphs):
    gs, compiled = graphs
    g = gs["table"]
    assert _names(g.fn, fusion_groups(g.fn)) == [
        ["literal", "mul"], ["embedding", "literal", "add"], ["permute"], ["index_select", "exp"]]
    w, ids, x, idx = _rand(10, 4), torch.tensor([[0, 9, 3], [2, 2, 7]]), _rand(6, 5, seed=1), torch.tensor([5, 0, 3, 3])
    emb, picked = run(g, compiled, w, ids, x, idx)
    torch.testing.assert_close(emb, F.embedding(ids, w * 2.0) + 1.0)
    torch.testing.assert_close(picked, torch.exp(x.t().index_select(1, idx)))


def test_legality_reasons(graphs):
    gs, _ = graphs
    dw = gs["dw"].fn
    whole = _ops(dw, "linear", "conv2d", "relu")
    refusal = group_legality(dw, whole)
    assert refusal.rule == "gemm-epilogue"
    assert refusal.reason.startswith("cuvil.conv2d reads the result of cuvil.linear in its epilogue")
    assert not can_group(dw, whole)
    assert can_group(dw, _ops(dw, "conv2d", "relu")) and can_group(dw, _ops(dw, "linear"))
    with pytest.raises(CuvilVerifyError, match="cannot be lowered as one kernel: cuvil.conv2d reads the result"):
        lower_group(dw, whole, "bad")

    table = gs["table"].fn
    fused = _ops(table, "literal", "mul", "embedding", "add")
    refusal = group_legality(table, fused)
    assert (refusal.rule, refusal.reason) == ("memory-operand", "cuvil.embedding reads its table from memory, but "
                                              "cuvil.mul is computed in the group (it needs a kernel of its own)")
    with pytest.raises(CuvilVerifyError, match="cuvil.embedding reads its table from memory"):
        lower_group(table, fused, "bad")
    assert "cuvil.index_select reads its table" in str(group_legality(table, _ops(table, "permute", "index_select",
                                                                                 "exp")))


def test_gemm_epilogue_at_another_index():
    """A permute of a square product has the product's shape but reads it at another index: a
    linear's epilogue stores it transposed (`epilogue_frames`); a matmul's cannot."""
    def build(b, x, w):
        return b("cuvil.permute", b("cuvil.linear", x, w), perm=[1, 0])

    def build_matmul(b, x, w):
        return b("cuvil.permute", b("cuvil.matmul", x, w), perm=[1, 0])
    g = Graph("gemm_then_permute", build, [T(4, 4), T(4, 4)])
    assert _names(g.fn, fusion_groups(g.fn)) == [["linear", "permute"]]
    x, w = _rand(4, 4), _rand(4, 4, seed=1)
    torch.testing.assert_close(run(g, compile_graphs([g]), x, w), F.linear(x, w).t())
    m = Graph("matmul_then_permute", build_matmul, [T(4, 4), T(4, 4)])
    assert _names(m.fn, fusion_groups(m.fn)) == [["matmul"], ["permute"]]
    assert "cuvil.permute reads the result of cuvil.matmul" in str(group_legality(m.fn, list(m.fn.ops[:-1])))
    torch.testing.assert_close(run(m, compile_graphs([m]), x, w), (x @ w).t())


def test_a_concatenation_read_from_memory_and_through_a_view_in_one_group():
    # the batched product packs its right-hand side through the transpose, recomputing the cat,
    # and reads its left-hand side, the cat itself, from memory: the cat gets a kernel of its own
    # that the product's reads (a generated graph found the group refused as one kernel)
    def f(y, z):
        c = torch.cat([y, z * z], dim=2)
        return c @ c.transpose(-1, -2)
    y, z = _rand(3, 16, 16), _rand(3, 16, 16, seed=1)
    torch.testing.assert_close(cuvil.compile(f, cache=False)(y, z), f(y, z))
