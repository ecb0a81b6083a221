"""Transposed convolutions, compiled: a stride-1 convolution over the input padded by the phases'
reach, whose extra output channels (one set per stride phase) a reshape, permute and slice
interleave into the output. Compared with eager over strides, paddings, output paddings,
dilations, groups, 1-d, 3-d and unbatched inputs, dynamic image sizes and a decoder with pads."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cuvil


@pytest.fixture(scope="module", autouse=True)
def _private_cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUVIL_CACHE_DIR", str(tmp_path_factory.mktemp("cuvil-cache")))
        yield


# (in, out, kernel, options): the decoder shapes (k4 s2 p1, k3 s2 p1 op1, k2 s2), strides above the
# kernel, uneven axes, dilation and groups together, a stride of 1
CASES = [
    (8, 6, 4, dict(stride=2, padding=1)),
    (6, 4, 3, dict(stride=2, padding=1, output_padding=1)),
    (4, 8, 2, dict(stride=2)),
    (3, 5, 2, dict(stride=3, padding=0, output_padding=2)),
    (4, 6, (3, 5), dict(stride=(2, 3), padding=(0, 2), output_padding=(1, 2))),
    (6, 4, 3, dict(stride=2, padding=2, dilation=2, output_padding=1, groups=2, bias=False)),
    (6, 6, 3, dict(stride=1, padding=1, groups=3)),
    (4, 4, 5, dict(stride=2, padding=4)),
]


@pytest.mark.parametrize("cin, cout, k, options", CASES)
def test_conv_transpose2d_matches_eager(cin, cout, k, options):
    torch.manual_seed(0)
    m = nn.ConvTranspose2d(cin, cout, k, **options).eval()
    x = torch.randn(2, cin, 7, 9)
    with torch.no_grad():
        got, want = cuvil.compile(m)(x), m(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_conv_transpose1d_and_unbatched_inputs_match_eager():
    torch.manual_seed(0)
    m1 = nn.ConvTranspose1d(4, 6, 5, stride=3, padding=1, output_padding=2).eval()
    m2 = nn.ConvTranspose2d(3, 2, 3, stride=2).eval()
    x1, x2 = torch.randn(2, 4, 11), torch.randn(3, 6, 5)
    with torch.no_grad():
        torch.testing.assert_close(cuvil.compile(m1)(x1), m1(x1), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(cuvil.compile(m1)(x1[0]), m1(x1[0]), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(cuvil.compile(m2)(x2), m2(x2), rtol=1e-5, atol=1e-5)


CASES_3D = [
    (4, 6, 2, dict(stride=2)),                      # a 3-d U-Net's upsampling
    (6, 4, 3, dict(stride=2, padding=1, output_padding=1)),
    (4, 6, (3, 2, 4), dict(stride=(1, 2, 3), padding=(1, 0, 2), output_padding=(0, 1, 2))),
    (6, 4, 3, dict(stride=2, padding=2, dilation=(2, 1, 2), output_padding=1, groups=2, bias=False)),
]


@pytest.mark.parametrize("cin, cout, k, options", CASES_3D)
def test_conv_transpose3d_matches_eager(cin, cout, k, options):
    """The phases of all three axes as channels of one `conv3d`, a 3-d shuffle after it."""
    torch.manual_seed(0)
    m = nn.ConvTranspose3d(cin, cout, k, **options).eval()
    x = torch.randn(2, cin, 4, 5, 6)
    with torch.no_grad():
        got, want = cuvil.compile(m)(x), m(x)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(cuvil.compile(m)(x[1]), m(x[1]), rtol=1e-5, atol=1e-5)


def test_one_compiled_transposed_conv3d_serves_every_depth():
    torch.manual_seed(0)
    m = nn.ConvTranspose3d(3, 2, 3, stride=2, padding=1, output_padding=1).eval()
    c = cuvil.compile(m, dynamic=[{2: "d"}], ranges={"d": (2, 16)})
    with torch.no_grad():
        for d in (3, 2, 9):
            x = torch.randn(1, 3, d, 4, 5)
            torch.testing.assert_close(c(x), m(x), rtol=1e-5, atol=1e-5)
    assert c.num_variants == 1


def test_one_compiled_transposed_conv_serves_every_image_size():
    torch.manual_seed(0)
    m = nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1).eval()
    c = cuvil.compile(m, dynamic=[{2: "h", 3: "w"}], ranges={"h": (2, 32), "w": (2, 32)})
    with torch.no_grad():
        for h, w in ((5, 7), (2, 2), (16, 9)):
            x = torch.randn(1, 4, h, w)
            torch.testing.assert_close(c(x), m(x), rtol=1e-5, atol=1e-5)
    assert c.num_variants == 1


class Decoder(nn.Module):
    """An upsampling path: reflect-padded conv, two transposed convs (k4 s2 p1, k2 s2), a skip
    concatenation and a zero pad to an odd size."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 3)
        self.up1 = nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1)
        self.up2 = nn.ConvTranspose2d(16, 4, 2, stride=2)

    def forward(self, x, skip):
        y = torch.relu(self.conv(F.pad(x, (1, 1, 1, 1), mode="reflect")))
        y = torch.relu(self.up1(y))
        y = self.up2(torch.cat([y, skip], 1))
        return F.pad(y, (0, 1, 0, 1))


def test_a_decoder_with_pads_and_transposed_convs_matches_eager_in_few_kernels():
    torch.manual_seed(0)
    m = Decoder().eval()
    x, skip = torch.randn(2, 16, 8, 8), torch.randn(2, 8, 16, 16)
    c = cuvil.compile(m)
    with torch.no_grad():
        torch.testing.assert_close(c(x, skip), m(x, skip), rtol=1e-5, atol=1e-5)
    report = c.report
    ops = report.output_ir
    assert "cuvil.conv2d" in ops and "conv_transpose" not in ops
    # the transposed convs' weights were rearranged at compile time: no index_select is left to run
    assert "cuvil.index_select" not in ops
    kernels = c._variants[0].native.kernels.kernels
    assert len(kernels) <= 8, list(kernels)
