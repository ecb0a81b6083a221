"""Resampling, compiled: F.interpolate in every mode Cuvil imports (nearest, nearest-exact,
linear, bilinear, bicubic, antialiased bilinear and bicubic; sizes and scale factors; align_corners),
pixel shuffles and flips, compared with eager. The taps and weights come from torch's own kernels
run on one-hot probes at compile time, or for a symbolic size computed per call in torch's own
arithmetic; nearest upscaling by an integer factor is a view that fuses into its reader."""
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
    # torch's antialiased kernels resize an axis beside one of size 1 with every output taking the
    # first output's weights: eager's result, which Cuvil once missed (by 0.8)
    "bilinear antialiased to one column": lambda x: F.interpolate(x, size=(3, 1), mode="bilinear", antialias=True),
    "bicubic antialiased from one row": lambda x: F.interpolate(x[:, :, :1], size=(1, 4), mode="bicubic",
                                                                antialias=True),
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


DYNAMIC_CASES = {
    "bilinear x2": lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
    "bilinear x2 aligned": lambda x: F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True),
    "bilinear 0.5": lambda x: F.interpolate(x, scale_factor=0.5, mode="bilinear"),
    "bilinear to a computed size": lambda x: F.interpolate(x, size=(x.shape[2] * 3 - 1, x.shape[3] + 5),
                                                           mode="bilinear"),
    "bilinear aligned to a computed size": lambda x: F.interpolate(x, size=(x.shape[2] * 3 - 1, 7), mode="bilinear",
                                                                   align_corners=True),
    "bicubic 1.7 aligned": lambda x: F.interpolate(x, scale_factor=1.7, mode="bicubic", align_corners=True),
    "bicubic to a computed size": lambda x: F.interpolate(x, size=(x.shape[2] + 3, x.shape[3] * 2 + 1),
                                                          mode="bicubic"),
    "nearest 1.5": lambda x: F.interpolate(x, scale_factor=1.5, mode="nearest"),
    "nearest to a computed size": lambda x: F.interpolate(x, size=(x.shape[2] * 3 - 1, x.shape[3] + 5)),
    "nearest-exact to a computed size": lambda x: F.interpolate(x, size=(x.shape[2] * 2 + 3, x.shape[3] // 2 + 1),
                                                                mode="nearest-exact"),
    # thousands of positions: torch computes the source index with one rounding (an FMA), and
    # rounding twice there moved weights by 5e-4
    "linear x3, long rows": lambda x: F.interpolate(x.flatten(2), scale_factor=3, mode="linear"),
}


@pytest.mark.parametrize("name", list(DYNAMIC_CASES))
def test_resampling_a_symbolic_size_serves_every_size_like_eager(name):
    """Taps and weights computed per call, in torch's arithmetic: nearest's floors pick eager's
    pixels (compared exactly) and the weights are eager's to the last bits."""
    torch.manual_seed(0)
    f = DYNAMIC_CASES[name]
    compiled = cuvil.compile(f, dynamic=[{2: "h", 3: "w"}], ranges={"h": (2, 300), "w": (2, 300)})
    for h, w in ((5, 6), (2, 9), (17, 3), (33, 64), (101, 7), (250, 41)):
        x = torch.randn(1, 2, h, w)
        got, want = compiled(x), f(x)
        assert got.shape == want.shape
        exact = "nearest" in name
        torch.testing.assert_close(got, want, rtol=0 if exact else 1e-5, atol=0 if exact else 1e-5)
    assert compiled.num_variants == 1


def test_a_unet_level_with_a_dynamic_image_size_compiles_once():
    """Down by a pool, up by bilinear x2, joined with the skip: a U-Net's level, any even size."""
    class Level(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.down, self.up = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8 + 3, 4, 3, padding=1)

        def forward(self, x):
            y = torch.relu(self.down(F.max_pool2d(x, 2)))
            y = F.interpolate(y, scale_factor=2, mode="bilinear", align_corners=False)
            return self.up(torch.cat([y, x], 1))
    torch.manual_seed(0)
    model = Level().eval()
    compiled = cuvil.compile(model, dynamic={"x": {2: "h", 3: "w"}})
    for h, w in ((32, 48), (64, 64), (18, 130)):
        x = torch.randn(1, 3, h, w)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    assert compiled.num_variants == 1


def test_resampling_a_symbolic_size_that_cuvil_cannot_express_is_refused_with_the_reason():
    antialiased = cuvil.compile(lambda x: F.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True),
                                dynamic=[{2: "h"}], ranges={"h": (4, 64)})
    with pytest.raises(cuvil.CuvilUnsupportedOpError, match=r"_upsample_bilinear2d_aa.*symbolic size.*antialiased"):
        antialiased(torch.randn(1, 2, 8, 6))
    # 0.7 times the product of two sizes: no range of one size to check a fraction over
    flat = cuvil.compile(lambda x: F.interpolate(x.flatten(2), scale_factor=0.7, mode="linear"),
                         dynamic=[{2: "h", 3: "w"}], ranges={"h": (2, 64), "w": (2, 64)})
    with pytest.raises(cuvil.CuvilUnsupportedOpError, match=r"scales a size by 0.7.*give the size instead"):
        flat(torch.randn(1, 2, 5, 6))
