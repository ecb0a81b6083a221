"""Column reductions (`cuvil/codegen/reductions.py`, `ColumnLanes`): a reduction whose input is
contiguous along a kept dim (a sum over dim 0, a mean over the tokens of `[B, S, H]`, a group norm
of an NHWC activation) carries a tile of columns per parallel iteration, its loop over the columns
innermost. Each case is checked against eager (and an fp64 reference where eager rounds) and for
the kernel's structure: the column loop, and no scalar `reduce` walking a column."""
import pytest
import torch
from torch import nn

import cuvil

from codegen_helpers import assert_within_eager_error


def _column_kernels(compiled) -> list[str]:
    return [k["kernel_ir"] for k in compiled.report.kernels if "for col in" in k["kernel_ir"]]


def _compile(fn, *inputs, **kw):
    compiled = cuvil.compile(fn, cache=False, **kw)
    compiled(*inputs)
    return compiled


def _data(*shape, seed=0, offset=0.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) + offset


FLOAT_CASES = {
    "sum0": (lambda x: x.sum(0), _data(300, 40)),
    "sum0_two_tiles": (lambda x: x.sum(0), _data(77, 150, offset=10.0)),
    "mean_tokens": (lambda x: x.mean(1), _data(2, 257, 96)),
    "mean_keepdim": (lambda x: x.mean(0, keepdim=True), _data(64, 24)),
    "sum_two_axes": (lambda x: x.sum((0, 1)), _data(4, 50, 24)),
    "var0": (lambda x: x.var(0), _data(500, 33, offset=100.0)),
    "var0_biased": (lambda x: x.var(0, correction=0, keepdim=True), _data(129, 20)),
    "amax0": (lambda x: x.amax(0), _data(100, 70)),
    "amin0": (lambda x: x.amin(0), _data(100, 70)),
    "prod0": (lambda x: (1 + 0.01 * x).prod(0), _data(200, 16)),
    "softmax0": (lambda x: torch.softmax(x, 0), _data(333, 48)),
    "log_softmax0": (lambda x: torch.log_softmax(x, 0), _data(65, 19)),
    "centered": (lambda x: x - x.mean(0, keepdim=True), _data(90, 64, offset=3.0)),
    "norm_over_tokens": (lambda x: torch.nn.functional.layer_norm(x.transpose(0, 1), (100,)), _data(100, 40)),
}


@pytest.mark.parametrize("name", list(FLOAT_CASES))
def test_column_reduction_matches_eager(name):
    fn, x = FLOAT_CASES[name]
    compiled = _compile(fn, x)
    kernels = _column_kernels(compiled)
    assert kernels, "expected a column reduction"
    assert not any("reduce " in k for k in kernels)     # no scalar fold down a column
    ref = fn(x.double())
    assert_within_eager_error(compiled(x), ref, (fn(x).double() - ref).abs().max().item())


def test_a_mean_over_a_dynamic_token_count():
    """The tokens' count is bound at the call: one kernel serves every length, the last tile of
    the hidden dim partial (96 = 64 + 32)."""
    compiled = cuvil.compile(lambda x: x.mean(1), dynamic=[{1: "seq"}], cache=False)
    for seq in (1, 16, 17, 300):
        x = _data(3, seq, 96, seed=seq)
        ref = x.double().mean(1)
        assert_within_eager_error(compiled(x), ref, (x.mean(1).double() - ref).abs().max().item())
    assert _column_kernels(compiled)


def test_non_finite_columns_match_eager():
    x = _data(300, 20)
    x[7, 0] = float("inf")                          # inf
    x[3, 1], x[250, 1] = float("inf"), -float("inf")  # inf - inf: NaN
    x[100, 2] = float("nan")
    x[299, 3] = -float("inf")
    x[0, 4] = 3.0e38                                # finite terms whose sum overflows
    x[1, 4] = 3.0e38
    for fn in (lambda t: t.sum(0), lambda t: t.mean(0), lambda t: t.amax(0), lambda t: t.amin(0),
               lambda t: torch.softmax(t, 0), lambda t: t.var(0)):
        compiled = _compile(fn, x)
        assert _column_kernels(compiled)
        torch.testing.assert_close(compiled(x), fn(x), equal_nan=True, rtol=2e-5, atol=1e-5)


def test_argmax_and_argmin_down_columns_take_the_first_extreme():
    x = torch.randint(0, 4, (300, 24), generator=torch.Generator().manual_seed(2)).float()   # ties everywhere
    x[10, 5] = float("nan")             # NaN counts as the extreme, like torch
    for fn in (lambda t: t.argmax(0), lambda t: t.argmin(0, keepdim=True)):
        compiled = _compile(fn, x)
        assert _column_kernels(compiled)
        assert torch.equal(compiled(x), fn(x))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_integer_and_bool_columns(dtype):
    x = torch.randint(-1000, 1000, (400, 17), generator=torch.Generator().manual_seed(3)).to(dtype)
    if dtype == torch.bool:
        x[:, 3] = True
        fns = (lambda t: t.any(0), lambda t: t.all(0))
    else:
        fns = (lambda t: t.sum(0), lambda t: t.amax(0), lambda t: t.amin(0))
    for fn in fns:
        compiled = _compile(fn, x)
        assert torch.equal(compiled(x), fn(x))


def test_group_norm_of_a_convolution_in_nhwc_reads_channels_in_order():
    """wav2vec2's first feature layer: a strided 1-d convolution into a group norm with a group
    per channel, then GELU. The `layout` pass runs the convolution in NHWC, so the norm's
    statistics run down the positions of each channel: a column reduction (it had walked each
    channel a cache line per element: 19.9 ms of the model's 55 for a [512, 3199] activation)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(1, 64, 10, stride=5, bias=False), nn.GroupNorm(64, 64), nn.GELU()).eval()
    x = torch.randn(1, 1, 4000)
    compiled = _compile(model, x)
    assert _column_kernels(compiled)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
