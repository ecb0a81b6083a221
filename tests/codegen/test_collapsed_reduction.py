"""Reductions over several dims: of one contiguous run (`collapse.collapsed_loops`), the emitter
runs their nest as one loop over the flat position; read contiguously along a reduced dim other
than the last (a group norm of an NHWC activation), that dim's loop runs innermost
(`lower._contiguous_last`). Checked against an fp64 reference with the two-times-eager rule (the
pairwise sum now blocks the whole run), and for the loops they run."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cuvil

from codegen_helpers import assert_within_eager_error


def _data(*shape, seed=0, offset=0.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) + offset


CASES = {
    "global_mean": (lambda x: x.mean((2, 3)), _data(2, 16, 100, 100, offset=50.0)),
    "global_mean_small": (lambda x: x.mean((2, 3), keepdim=True), _data(8, 64, 7, 7)),
    "sum_three_dims": (lambda x: x.sum((1, 2, 3)), _data(3, 5, 30, 41, offset=10.0)),
    "amax_two_dims": (lambda x: x.amax((1, 2)), _data(4, 33, 65)),
    "group_norm": (nn.GroupNorm(8, 64).eval(), _data(2, 64, 23, 23, offset=20.0)),
    "layer_norm_chw": (lambda x: F.layer_norm(x, x.shape[1:]), _data(3, 24, 28, 28)),
    "var_hw": (lambda x: x.var((2, 3)), _data(2, 8, 50, 50, offset=100.0)),
    "softmax_of_a_reshape": (lambda x: torch.softmax(x.reshape(4, -1), 1), _data(4, 6, 50)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_reduction_over_a_contiguous_run_matches_fp64(name):
    fn, x = CASES[name]
    compiled = cuvil.compile(fn, cache=False)
    with torch.no_grad():
        out = compiled(x)
        ref = fn(x.double()) if not isinstance(fn, nn.Module) else fn.double()(x.double())
        eager = fn.float()(x) if isinstance(fn, nn.Module) else fn(x)
    assert_within_eager_error(out, ref, (eager.double() - ref).abs().max().item())


def test_the_nest_becomes_one_loop_over_the_run():
    """A global average pool over 56 x 56 positions: one loop over the 3136 positions, in blocks
    of 256 (the pairwise sum's `r3.block` loop), and no loop over the image's rows (`r2`)."""
    compiled = cuvil.compile(lambda x: x.mean((2, 3)), cache=False)
    compiled(_data(1, 8, 56, 56))
    (kernel,) = compiled.report.kernels
    assert "reduce sum(0.0:f32) for r2 in 0..56, r3 in 0..56" in kernel["kernel_ir"]
    llvm = kernel["llvm_ir"]
    assert "r3.block.body" in llvm and "r2." not in llvm


def test_a_group_norm_after_an_nhwc_convolution_runs_down_the_channels():
    """The `layout` pass runs the convolutions in NHWC; the group norm between them reads the
    first one's result through the conversion to NCHW, the 4 channels of a group together at each
    position. It runs as a column reduction over the channels (`lower._grouped_lanes`), each
    group's statistics combining its 4 columns, and writes its NCHW result in runs of 16 (it had
    walked the image's columns innermost, 128 floats apart: 504 against 52 µs in a UNet block)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 64, 3, padding=1), nn.GroupNorm(16, 64), nn.SiLU(),
                          nn.Conv2d(64, 16, 3, padding=1)).eval()
    x = _data(1, 16, 20, 20, seed=4)
    compiled = cuvil.compile(model, cache=False)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    norm = next(k["kernel_ir"] for k in compiled.report.kernels if "for col in" in k["kernel_ir"])
    assert "reduce sum(0.0:f32) for k in 0..4 {" in norm
    assert "for j4t in 0..2 {" in norm          # 20 columns of the image: tiles of 16


@pytest.mark.parametrize("groups", [2, 8, 32])
def test_group_norms_of_nhwc_activations_match_eager(groups):
    """Groups of 32, 8 and 2 channels (2: fewer columns than a tile's 64; 32: half a tile)."""
    torch.manual_seed(groups)
    norm = nn.GroupNorm(groups, 64).eval()
    nn.init.normal_(norm.weight)
    nn.init.normal_(norm.bias)
    x = _data(2, 9, 11, 64, seed=groups, offset=5.0)
    fn = lambda t: norm(t.permute(0, 3, 1, 2))      # noqa: E731
    compiled = cuvil.compile(fn, cache=False)
    with torch.no_grad():
        out = compiled(x)
        ref = nn.GroupNorm(groups, 64).double()
        ref.load_state_dict(norm.state_dict())
        expected = ref(x.double().permute(0, 3, 1, 2))
        assert_within_eager_error(out, expected, (fn(x).double() - expected).abs().max().item())
    assert any("for col in" in k["kernel_ir"] for k in compiled.report.kernels)


def test_argmax_over_all_dims_of_a_transpose_counts_row_major():
    """Reading x.t() is contiguous along its first dim, so that dim's loop runs innermost; the
    position found is still the flat row-major one of x.t()."""
    x = torch.randint(0, 5, (30, 40), generator=torch.Generator().manual_seed(5)).float()
    for fn in (lambda t: t.t().argmax(), lambda t: t.t().argmin()):
        compiled = cuvil.compile(fn, cache=False)
        assert torch.equal(compiled(x), fn(x))


@pytest.mark.parametrize("dynamic", [None, [{0: "batch"}]], ids=["static", "dynamic"])
def test_a_group_norms_affine_and_activation_join_its_kernel(dynamic):
    """A group norm reshapes [N, C, H, W] to [N, G, C/G, H, W] for its statistics and back for
    its per-channel affine: the affine and the SiLU after it are stored in the reduction's loop
    over the full shape, each at the reshape's index of the element (one kernel, not two)."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.GroupNorm(8, 64), nn.SiLU()).eval()
    nn.init.normal_(model[0].weight)
    nn.init.normal_(model[0].bias)
    compiled = cuvil.compile(model, dynamic=dynamic, cache=False)
    reference = nn.Sequential(nn.GroupNorm(8, 64), nn.SiLU()).double()
    reference.load_state_dict(model.state_dict())
    for batch in (2, 3) if dynamic else (2,):
        x = _data(batch, 64, 15, 15, seed=batch, offset=3.0)
        with torch.no_grad():
            out, expected = compiled(x), reference(x.double())
            assert_within_eager_error(out, expected, (model(x).double() - expected).abs().max().item())
    (kernel,) = compiled.report.kernels
    assert "reduce sum" in kernel["kernel_ir"] and "exp(neg(" in kernel["kernel_ir"]     # the SiLU
