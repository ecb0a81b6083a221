"""Float64 values a model computes from constants alone (cuvil/frontend/static_values.py): run by
torch at import and taken as constants, so that they are eager's to the bit; float64 ops on data,
or on a dynamic size, stay refused by name."""
import pytest
import torch

import cuvil


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))


class SinusoidalPositions(torch.nn.Module):
    """RT-DETR's 2-d sinusoidal position embedding of the feature map, in float64, added in float32."""

    def forward(self, x):
        h, w = x.shape[-2:]
        omega = 1.0 / 10000.0 ** (torch.arange(4, dtype=torch.float64) / 4)
        gh, gw = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64),
                                indexing="ij")
        eh, ew = gh.flatten().outer(omega), gw.flatten().outer(omega)
        pos = torch.cat([eh.sin(), eh.cos(), ew.sin(), ew.cos()], 1).to(torch.float32)
        return x.flatten(2).transpose(1, 2) + pos


def test_float64_values_from_constants_are_torchs_own():
    model = SinusoidalPositions()
    x = torch.randn(2, 16, 5, 6)
    torch.testing.assert_close(cuvil.compile(model)(x), model(x), rtol=0, atol=0)


def test_logspace_which_torch_decomposes_in_float64():
    def f(x):
        return x * torch.logspace(-1, 2, x.shape[-1], base=3.0)
    x = torch.randn(3, 7)
    torch.testing.assert_close(cuvil.compile(f)(x), f(x))


def test_float64_ops_on_a_dynamic_size_or_on_data_stay_refused():
    x = torch.randn(2, 16, 5, 6)
    with pytest.raises(cuvil.CuvilError, match="float64"):
        cuvil.compile(SinusoidalPositions(), dynamic={"x": {2: "h"}})(x)
    with pytest.raises(cuvil.CuvilError, match="float64"):
        cuvil.compile(lambda x: (x.double() * torch.arange(6, dtype=torch.float64)).float())(x)
