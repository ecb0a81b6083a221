"""Random tensors a model makes (cuvil/frontend/random_draws.py): drawn from torch's generator at
each call, in eager's order, so that after `torch.manual_seed` the outputs are eager's exactly, at
every size of a dynamic dim, from a saved model and from the compiled-model cache; random ops whose
draws depend on computed values are rewritten as eager's CPU kernels compute them (`bernoulli(p)`,
training-mode dropout, `torch.multinomial` without replacement), their other forms refused by name at
the user's line."""
import re
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cuvil
from cuvil.errors import CuvilUnsupportedOpError


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))


class Noisy(nn.Module):
    """Every drawn op, mixed with computed values (a VAE's reparameterisation, a noise schedule)."""

    def forward(self, x):
        eps = torch.randn_like(x)
        z = x + 0.5 * eps
        u = torch.rand(x.shape[0], 3)
        k = torch.randint(0, 10, (4,))
        g = torch.empty_like(x).normal_(2.0, 0.5)
        v = torch.empty_like(x).uniform_(-1, 1)
        order = torch.randperm(5)
        h = torch.normal(0.0, 2.0, size=(2, 3))
        keep = torch.empty_like(x).bernoulli_(0.25)
        j = torch.randint_like(x, 3, 7)
        e = torch.empty_like(x).exponential_(2.0)
        wide = torch.randn(x.shape[0] * 2, 3)
        return z * keep + g - v, u.sum(1), k, order, h, j + e, x[:, order], wide.exp()


def eager_and_compiled(model, compiled, *args, seed=7):
    torch.manual_seed(seed)
    want = model(*args)
    torch.manual_seed(seed)
    got = compiled(*args)
    return want, got


def assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


def test_draws_equal_eagers_after_the_same_seed_at_every_size():
    model = Noisy()
    compiled = cuvil.compile(model, dynamic={"x": {0: "batch"}})
    for n in (4, 9, 1):
        x = torch.randn(n, 5)
        want, got = eager_and_compiled(model, compiled, x)
        assert_same(got, want)
    assert compiled.num_variants == 1
    # each call draws anew, as eager does
    torch.manual_seed(7)
    first, second = compiled(x)[0], compiled(x)[0]
    assert not torch.equal(first, second)


def test_draws_are_the_programs_last_arguments_named_after_their_ops():
    compiled = cuvil.compile(lambda x: x * torch.randn_like(x))
    x = torch.randn(3, 4)
    want, got = eager_and_compiled(lambda x: x * torch.randn_like(x), compiled, x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    [variant] = compiled._variants
    assert [a.name for a in variant.imported.function.args] == ["x", "randn_like"]
    assert [d.op for d in variant.guard.draws] == ["aten.randn_like.default"]


def test_a_saved_model_draws_in_another_process(tmp_path):
    model = Noisy()
    compiled = cuvil.compile(model, dynamic={"x": {0: "batch"}})
    x = torch.randn(6, 5)
    compiled.compile_for(x)
    torch.manual_seed(11)
    expected = model(x)
    compiled.save(tmp_path / "noisy.cuvil")
    torch.save({"x": x}, tmp_path / "x.pt")
    script = textwrap.dedent(f"""
        import torch, cuvil
        m = cuvil.load({str(tmp_path / 'noisy.cuvil')!r})
        x = torch.load({str(tmp_path / 'x.pt')!r})["x"]
        torch.manual_seed(11)
        torch.save(list(m(x)), {str(tmp_path / 'y.pt')!r})
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300,
                   env={"CUVIL_CACHE_DIR": str(tmp_path / "other-cache"), "PATH": "/usr/bin:/bin"})
    assert_same(torch.load(tmp_path / "y.pt"), expected)


def test_the_compiled_model_cache_keeps_the_draws():
    model = Noisy()
    cuvil.compile(model)(torch.randn(4, 5))      # fills the cache
    again = cuvil.compile(model)
    x = torch.randn(4, 5)
    want, got = eager_and_compiled(model, again, x)
    assert type(again._variants[0]).__name__ == "CachedVariant"
    assert_same(got, want)


def test_profile_draws_too():
    model = Noisy()
    compiled = cuvil.compile(model)
    x = torch.randn(4, 5)
    compiled(x)
    torch.manual_seed(3)
    outputs, timings = compiled.profile(x)     # a plain call (which compiles if needed), then the profiled one
    torch.manual_seed(3)
    model(x)
    want = model(x)
    assert_same(outputs, want)
    assert timings


def test_under_dynamo():
    model = Noisy()
    compiled = torch.compile(model, backend="cuvil", options={"fallback": "error"})
    x = torch.randn(4, 5)
    want, got = eager_and_compiled(model, compiled, x)
    assert_same(got, want)
    torch._dynamo.reset()


@pytest.mark.parametrize("fn, op", [
    (lambda x: torch.bernoulli(torch.sigmoid(x).bfloat16()), "aten.bernoulli.default"),
    (lambda x: torch.bernoulli(torch.sigmoid(x).t()), "aten.bernoulli.default"),
    (lambda x: torch.multinomial(torch.softmax(x, -1), 2, replacement=True), "aten.multinomial.default"),
    (lambda x: torch.native_dropout(x, 0.5, True)[1], "aten.native_dropout.default"),
], ids=["bernoulli-bf16", "bernoulli-transposed", "multinomial-with-replacement", "dropout-mask"])
def test_draws_that_depend_on_computed_values_are_refused_at_the_users_line(fn, op):
    with pytest.raises(CuvilUnsupportedOpError) as info:
        cuvil.compile(fn, cache=False)(torch.randn(4, 5))
    text = str(info.value)
    assert op in text and "depend on values the model computes" in text
    assert "test_random_draws.py" in text


@pytest.mark.parametrize("fn", [
    lambda x: torch.bernoulli(torch.sigmoid(x)) * x,
    lambda x: F.dropout(x, 0.3, training=True) * 2,
    lambda x: F.dropout(F.dropout(x, 0.5, True), 0.2, True) + torch.bernoulli(x.sigmoid()),
    lambda x: F.dropout(x, 1.0, training=True),
    lambda x: F.dropout(x, 0.0, training=True),
    lambda x: F.dropout2d(x.view(1, -1, 2, 3), 0.3, training=True),
    lambda x: F.alpha_dropout(x, 0.2, training=True),
], ids=["bernoulli", "dropout", "two-dropouts-and-bernoulli", "dropout-all", "dropout-none", "dropout2d",
        "alpha-dropout"])
def test_bernoulli_of_values_and_training_dropout_draw_eagers_numbers(fn):
    """Monte Carlo dropout and stochastic masks: eager's CPU kernels compare a uniform draw with p
    (bernoulli) or scale a bernoulli_(1 - p) draw (dropout), so the compiled model draws those."""
    compiled = cuvil.compile(fn, dynamic=[{0: "rows"}])
    for rows in (4, 9):
        x = torch.randn(rows, 6)
        x[0, 0] = float("inf")          # dropped as eager drops it: inf * 0 is NaN
        want, got = eager_and_compiled(fn, compiled, x, seed=rows)
        assert got.dtype == want.dtype and torch.equal(got.isnan(), want.isnan())
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    assert compiled.num_variants == 1


def test_bernoulli_checks_its_probabilities_as_eager():
    compiled = cuvil.compile(lambda p: torch.bernoulli(p))
    compiled(torch.tensor([0.2, 0.7]))
    with pytest.raises(RuntimeError, match="p_in >= 0 && p_in <= 1"):
        torch.bernoulli(torch.tensor([0.2, 1.5]))
    with pytest.raises(IndexError, match=r"failed at .*test_random_draws.py:.*p_in >= 0 && p_in <= 1"):
        compiled(torch.tensor([0.2, 1.5]))


def test_a_generator_the_model_makes_is_refused_at_its_line():
    def seeded(x):
        g = torch.Generator().manual_seed(1)
        return torch.randn(5, generator=g) + x
    with pytest.raises(CuvilUnsupportedOpError, match=r"torch.Generator.*\n.*return torch.randn\(5, generator=g\) \+ x"):
        cuvil.compile(seeded, cache=False)(torch.randn(4, 5))


def sample_top_p(logits, temperature: float = 0.7, top_p: float = 0.9):
    """A language model's sampling step: temperature, the top-p nucleus, one token a row."""
    probs = torch.softmax(logits / temperature, -1)
    sorted_probs, order = torch.sort(probs, -1, descending=True)
    outside = torch.cumsum(sorted_probs, -1) - sorted_probs > top_p
    sorted_probs = sorted_probs.masked_fill(outside, 0.0)
    picked = torch.multinomial(sorted_probs / sorted_probs.sum(-1, keepdim=True), 1)
    return torch.gather(order, -1, picked)


@pytest.mark.parametrize("fn, shape", [
    (sample_top_p, (3, 4000)),
    (lambda x: torch.multinomial(torch.softmax(x, -1), 5), (3, 500)),
    (lambda x: torch.multinomial(torch.softmax(x, -1), 1, replacement=True), (32000,)),
], ids=["top-p", "five-without-replacement", "one-with-replacement"])
def test_multinomial_picks_eagers_tokens_after_the_same_seed(fn, shape):
    """Eager's CPU kernel: argmax (topk) of p / q, q an Exp(1) draw of p's size."""
    compiled = cuvil.compile(fn, dynamic=[{0: "rows"}] if len(shape) == 2 else None)
    for seed in range(4):
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3
        want, got = eager_and_compiled(fn, compiled, x, seed=seed)
        assert got.dtype == torch.int64 and torch.equal(got, want)
    assert compiled.num_variants == 1


@pytest.mark.parametrize("p, message", [
    ([[0.5, -0.1, 0.6]], "element < 0"),
    ([[0.5, float("nan"), 0.1]], "element < 0"),
    ([[0.0, 0.0, 0.0]], "sum of probabilities <= 0"),
])
def test_multinomial_checks_its_probabilities_as_eager(p, message):
    compiled = cuvil.compile(lambda p: torch.multinomial(p, 1))
    compiled(torch.tensor([[0.2, 0.3, 0.5]]))
    with pytest.raises(RuntimeError, match=message):
        torch.multinomial(torch.tensor(p), 1)
    with pytest.raises(IndexError, match="failed at .*test_random_draws.py:.*" + re.escape(message)):
        compiled(torch.tensor(p))

