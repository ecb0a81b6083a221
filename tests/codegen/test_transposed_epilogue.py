"""A linear's epilogue that stores its result permuted (`lower.epilogue_frames`,
`library._transposed_epilogue`): ConvNeXt's `x + (gamma * pwconv2(y)).permute(0, 3, 1, 2)` is one
kernel, which stores the NHWC product NCHW in 8 x 8 tiles transposed in registers. Checked
against eager and fp64 at sizes that leave edge tiles (rows and columns not multiples of 8), with
a dynamic batch, and the cases that stay two kernels with their reasons."""
import pytest
import torch
import torch.nn.functional as F

import cuvil


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _groups(compiled):
    return [(g["kind"], g["summary"]) for g in compiled.report.fusion["groups"]]


def _refusals(compiled):
    return [(r["rule"], r["reason"]) for r in compiled.report.fusion["refused"]]


def _check(compiled, fn, *args):
    out = compiled(*args)
    torch.testing.assert_close(out, fn(*args))
    exact = fn(*(a.double() for a in args))
    torch.testing.assert_close(out.double(), exact, rtol=1e-5, atol=1e-5)


def _convnext_end(x, y, w, b, gamma):
    """NHWC y -> linear -> per-channel scale -> NCHW, plus the NCHW residual x."""
    return x + (gamma * F.linear(y, w, b)).permute(0, 3, 1, 2)


@pytest.mark.parametrize("batch", [1, 3])
def test_convnext_end_is_one_kernel(batch):
    C, H, W, K = 20, 5, 12, 36      # 12 columns a line: an edge tile of 4; 20 channels: one of 4
    args = lambda n: (_rand(n, C, H, W), _rand(n, H, W, K, seed=1), _rand(C, K, seed=2), _rand(C, seed=3),
                      _rand(C, seed=4))
    c = cuvil.compile(_convnext_end, dynamic=[{0: "n"}, {0: "n"}, None, None, None], cache=False)
    _check(c, _convnext_end, *args(2))
    _check(c, _convnext_end, *args(batch))     # the same program at another batch
    assert _groups(c) == [("gemm-epilogue", "linear + mul + add")]
    assert [k["name"] for k in c.report.kernels] == ["_convnext_end_0_mul_permute_add"]
    ir = c.report.kernels[0]["kernel_ir"]
    # the product into scratch, then y0 stored from it transposed, in 8 x 8 tiles
    assert "%tmp0: scratch f32[s0, 5, 12, 20]" in ir and "for ib in 0..min(8, -8*tl + 12)" in ir


def test_convnext_block_matches_eager():
    from benchmarks.models import ConvNeXtBlock
    torch.manual_seed(0)
    m = ConvNeXtBlock(24).eval()
    x = _rand(2, 24, 14, 14)
    c = cuvil.compile(m, cache=False)
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x), rtol=1e-5, atol=1e-5)
    assert c.report.kernels[-1]["name"].endswith("_mul_permute_add")
    assert ("gemm-epilogue", "linear + mul + add") in _groups(c)


def test_matrix_and_sequence_transposed():
    def matrix(x, w, b, r):                      # [37, 19] stored as [19, 37]
        return torch.relu(F.linear(x, w, b)).t() * 2.0 + r

    def sequence(x, w, r):                       # [B, 10, 16] -> [B, 16, 10]
        return F.linear(x, w).transpose(1, 2) - r

    c = cuvil.compile(matrix, cache=False)
    _check(c, matrix, _rand(37, 11), _rand(19, 11, seed=1), _rand(19, seed=2), _rand(19, 37, seed=3))
    assert _groups(c) == [("gemm-epilogue", "linear + relu + mul + add")]
    s = cuvil.compile(sequence, dynamic=[{0: "b"}, None, {0: "b"}], cache=False)
    _check(s, sequence, _rand(3, 10, 24), _rand(16, 24, seed=1), _rand(3, 16, 10, seed=2))
    assert _groups(s) == [("gemm-epilogue", "linear + sub")]


def test_what_stays_two_kernels():
    def square(x, w):                            # the product read in both orders: not one index
        p = F.linear(x, w)
        return p + p.t()

    def dynamic_line(x, w, r):                   # the rows' last dim (seq) is not static
        return F.linear(x, w).transpose(1, 2) + r

    c = cuvil.compile(square, cache=False)
    _check(c, square, _rand(16, 8), _rand(16, 8, seed=1))
    assert _refusals(c) == [("gemm-epilogue", "cuvil.add reads cuvil.linear's product both in its order and "
                                              "permuted; its epilogue computes each element at one index")]
    d = cuvil.compile(dynamic_line, dynamic=[{1: "seq"}, None, {2: "seq"}], cache=False)
    _check(d, dynamic_line, _rand(2, 7, 12), _rand(5, 12, seed=1), _rand(2, 5, 7, seed=2))
    assert len(d.report.kernels) == 2
    assert [r[0] for r in _refusals(d)] == ["gemm-epilogue"]
    assert _refusals(d)[0][1] == ("cuvil.permute reads the result of cuvil.linear in its epilogue, which stores a "
                                  "permute of the product only where it puts the rows' last dim, a static one, last")
