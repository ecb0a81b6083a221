"""Complex tensors computed as pairs of floats (frontend/complex_pairs.py): Meta-style rotary
embeddings (`polar`, `view_as_complex`, a complex product, `view_as_real`), `exp(1j * t)`, a
complex buffer, arithmetic with complex and real operands, and views, each against eager; and the
refusals, which name the input, the output or the op with its source line."""
import pytest
import torch
from torch import nn

import cuvil
from cuvil.errors import CuvilUnsupportedOpError


def _close(got, want):
    for g, w in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


class Rotary(nn.Module):
    """Llama 4's rotary embedding: the angles' unit complex numbers (scaled), and the query's
    pairs of features multiplied by them."""

    def forward(self, q, angles):
        freqs = torch.polar(torch.ones_like(angles), angles) * 0.5
        z = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
        return torch.view_as_real(z * freqs[:, :, None, :]).flatten(3)


def test_rotary_embedding_of_any_length_is_eagers():
    model = Rotary()
    gen = torch.Generator().manual_seed(0)
    compiled = cuvil.compile(model, dynamic={"q": {1: "seq"}, "angles": {1: "seq"}}, cache=False)
    for seq in (5, 9, 1):
        q, angles = torch.randn(2, seq, 3, 8, generator=gen), torch.randn(2, seq, 4, generator=gen)
        _close(compiled(q, angles), model(q, angles))
    assert compiled.num_variants == 1
    graph = compiled.imported.exported.graph
    vals = [n.meta.get("val") for n in graph.nodes]
    assert not any(isinstance(v, torch.Tensor) and v.is_complex() for v in vals)
    assert not any("complex" in str(n.target) or "view_as_real" in str(n.target) for n in graph.nodes)


class Arithmetic(nn.Module):
    """exp(1j * t), a complex buffer, + - * / with complex and real tensors and numbers, abs,
    angle, conj, a sum, a concatenation, a transpose and a choice."""

    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randn(4, dtype=torch.complex64, generator=torch.Generator().manual_seed(1)))

    def forward(self, x, t):
        z = torch.exp(1j * t) * self.w + 2.0
        q = torch.view_as_complex(x.reshape(5, 4, 2))
        y = (q * z - 1j) / (z + 0.5j) + t / (q + 3)
        y = 2 - y * t - (0.5 - 1j) * y.conj() / 4
        both = torch.cat([y, z], 0).transpose(0, 1)
        chosen = torch.where(t > 0, y, z)
        return (y.abs(), y.angle(), torch.view_as_real(both.sum(1)), torch.view_as_real(chosen[1:3].unsqueeze(0)),
                (y - z).abs().mean(-1))


def test_complex_arithmetic_is_eagers():
    model = Arithmetic()
    gen = torch.Generator().manual_seed(2)
    x, t = torch.randn(5, 8, generator=gen), torch.randn(5, 4, generator=gen)
    _close(cuvil.compile(model, cache=False)(x, t), model(x, t))


@pytest.mark.parametrize("fn", [
    lambda x: torch.view_as_real(torch.exp(x.to(torch.complex64))),
    lambda x: x.to(torch.complex64).abs(),
    lambda x: (x.to(torch.complex64) * 2).real + x.to(torch.complex64).imag,
    lambda x: (x.to(torch.complex64).conj() * 1j).angle(),
    lambda x: torch.view_as_real(torch.full_like(x.to(torch.complex64), 2 + 1j) * x),
    lambda x: (x.to(torch.complex64) + 1j).to(torch.float32),
], ids=["exp", "abs", "real-imag", "angle-conj", "full_like", "to-real"])
def test_a_real_tensor_made_complex(fn):
    """A real tensor cast to complex: its imaginary part is known to be 0 (no ops computed for it)."""
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(6))
    torch.testing.assert_close(cuvil.compile(fn, cache=False)(x), fn(x))


def test_a_complex_input_an_output_or_op_is_refused_by_name():
    with pytest.raises(CuvilUnsupportedOpError, match=r"input 'z' is complex.*view_as_real\(z\)"):
        cuvil.compile(lambda z: z * 2, cache=False)(torch.randn(3, dtype=torch.complex64))
    with pytest.raises(CuvilUnsupportedOpError, match="returns a complex tensor"):
        cuvil.compile(lambda x: torch.view_as_complex(x) * 2, cache=False)(torch.randn(3, 2))

    def sine(x):
        return torch.view_as_real(torch.sin(torch.view_as_complex(x)))
    with pytest.raises(CuvilUnsupportedOpError, match=r"'aten.sin.default': on complex values.*\n.*test_complex_pairs.py"):
        cuvil.compile(sine, cache=False)(torch.randn(3, 2))


@pytest.mark.parametrize("transform", [
    lambda x: torch.fft.fftn(x, dim=(1, 2)).real,                                  # FNet's mixing
    lambda x: torch.view_as_real(torch.fft.fft(x, dim=-1)),
    lambda x: torch.view_as_real(torch.fft.ifft(torch.fft.fft(x, dim=1, norm="ortho"), dim=1)),
    lambda x: torch.fft.fft2(x, norm="forward").imag,
    lambda x: torch.view_as_real(torch.fft.rfft(x, dim=-1)),                       # one-sided: n//2 + 1
], ids=["fftn-real", "fft", "ifft-of-fft", "fft2-imag", "rfft"])
def test_fourier_transforms_of_static_sizes_are_eagers(transform):
    """The transform as products by its cosine and sine matrices, along each dim."""
    x = torch.randn(2, 12, 7, generator=torch.Generator().manual_seed(3))
    want = transform(x)
    torch.testing.assert_close(cuvil.compile(transform, cache=False)(x), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


@pytest.mark.parametrize("n", [97, 128, 268, 768, 4096, 65536])      # 268 = 4 x 67: one split
def test_long_transforms_split_in_four_steps_match_float64(n):
    """Past 128 points a transform splits n = n1 n2 near its square root (65536: 256 x 256, each
    split again); a prime length is one product. Against torch's transform in float64, as close
    as float32's rounding allows (eager's own float32 error is 1.1e-7 to 1.9e-7 of the largest)."""
    x = torch.randn(3, n, generator=torch.Generator().manual_seed(n))
    got = cuvil.compile(lambda x: torch.view_as_real(torch.fft.fft(x, dim=-1)), cache=False)(x)
    ref = torch.view_as_real(torch.fft.fft(x.double(), dim=-1))
    assert float((got.double() - ref).abs().max() / ref.abs().max()) < 1.5e-6
    z = torch.randn(n, 2, 2, generator=torch.Generator().manual_seed(n + 1))     # complex, along a dim not last
    got = cuvil.compile(lambda z: torch.view_as_real(torch.fft.ifft(torch.view_as_complex(z), dim=0)), cache=False)(z)
    ref = torch.view_as_real(torch.fft.ifft(torch.view_as_complex(z.double()), dim=0))
    assert float((got.double() - ref).abs().max() / ref.abs().max()) < 1.5e-6


def test_fnet_mixes_tokens_with_a_fourier_transform_as_eager():
    """FNet was refused at its complex FFT (`torch.fft.fftn(x, dim=(1, 2)).real`)."""
    import transformers
    model = transformers.FNetModel(transformers.FNetConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, intermediate_size=64, max_position_embeddings=64)).eval()
    ids = torch.randint(1, 100, (2, 16), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = model(ids).last_hidden_state
    got = cuvil.compile(model, cache=False)(ids).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_fourier_transform_along_a_dynamic_dim_is_refused_by_name():
    with pytest.raises(CuvilUnsupportedOpError, match="Fourier transform along a dynamic dim"):
        cuvil.compile(lambda x: torch.fft.fft(x, dim=0).real, dynamic={"x": {0: "n"}}, cache=False)(torch.randn(6, 3))
