"""Resampling, compiled: F.interpolate in every mode Cuvil imports (nearest, nearest-exact,
linear, bilinear, bicubic, antialiased bilinear and bicubic; sizes and scale factors; align_corners),
pixel shuffles and flips, compared with eager. The taps and weights come from torch's own kernels
run on one-hot probes at compile time; nearest upscaling by an integer factor is a view that fuses
into its reader."""
import pytest
import torch
import torch.nn.functional as F

import cuvil


@pytest.fixture(scope="module", autouse=True)
def _private_cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUVIL_CACHE_DIR", str(tmp_path_factory.mktemp("cuvil-cache")))
        yield


CASES = {
    "nearest x2": lambda x: F.interpolate(x, scale_factor=2, mode="nearest"),
    "nearest to a size": lambda x: F.interpolate(x, size=(7, 11), mode="nearest"),
    "nearest down": lambda x: F.interpolate(x, size=(3, 4), mode="nearest"),
    "nearest-exact": lambda x: F.interpolate(x, size=(7, 11), mode="nearest-exact"),
    "nearest 2.5": lambda x: F.interpolate(x, scale_factor=2.5, mode="nearest"),
    "bilinear x2": lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
    "bilinear aligned": lambda x: F.interpolate(x, size=(9, 4), mode="bilinear", align_corners=True),
    "bicubic 1.7": lambda x: F.interpolate(x, scale_factor=1.7, mode="bicubic"),
    "bilinear antialiased": lambda x: F.interpolate(x, size=(3, 4), mode="bilinear", antialias=True),
    "bicubic antialiased": lambda x: F.interpolate(x, size=(2, 5), mode="bicubic", antialias=True),
    "linear x3": lambda x: F.interpolate(x.flatten(2), scale_factor=3, mode="linear"),
    "pixel shuffle": lambda x: F.pixel_shuffle(torch.cat([x, x, x, x], 1)[:, :, :4], 2),
    "pixel unshuffle": lambda x: F.pixel_unshuffle(x[:, :, :4], 2),
    "flip": lambda x: torch.flip(x, [1, 3]) + x.flip(-2),
}


@pytest.mark.parametrize("name", list(CASES))
def test_resampling_matches_eager(name):
    torch.manual_seed(0)
    f = CASES[name]
    x = torch.randn(2, 3, 5, 6)
    got, want = cuvil.compile(f)(x), f(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_nearest_integer_upscaling_is_a_view_for_any_size():
    f = cuvil.compile(lambda x: torch.relu(F.interpolate(x, scale_factor=(3, 2), mode="nearest")),
                      dynamic=[{2: "h", 3: "w"}], ranges={"h": (1, 64), "w": (1, 64)})
    for h, w in ((5, 6), (1, 9), (17, 3)):
        x = torch.randn(1, 2, h, w)
        torch.testing.assert_close(f(x), torch.relu(F.interpolate(x, scale_factor=(3, 2))), rtol=0, atol=0)
    assert f.num_variants == 1
    [kernel] = f._variants[0].native.kernels.kernels      # the repeat folded into the relu's reads
    assert "index_select" not in kernel


def test_other_resampling_of_a_symbolic_size_is_refused_with_the_reason():
    f = cuvil.compile(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), dynamic=[{2: "h"}],
                      ranges={"h": (2, 64)})
    with pytest.raises(cuvil.CuvilUnsupportedOpError, match=r"upsample_bilinear2d.*symbolic size"):
        f(torch.randn(1, 2, 5, 6))
