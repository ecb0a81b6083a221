"""Updates of the elements a bool mask selects, computed from elements the same mask selects
(`x[mask] += v`, `x[mask] *= 2`, `x[mask] = f(x[mask], y[mask])`), compile as one `where` over the
whole tensors (cuvil/frontend/masked_updates.py), against eager. Before 2026-12-03 they were
refused: the selection's size is read from the data."""
import pytest
import torch

import cuvil
from cuvil import CuvilError


@pytest.fixture(scope="module", autouse=True)
def _private_cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUVIL_CACHE_DIR", str(tmp_path_factory.mktemp("cuvil-cache")))
        yield


def add_number(x, m):
    y = x.clone()
    y[m] += 1.5
    return y


def scale_positive(x):
    y = x.clone()
    y[y > 0] *= 2
    return y


def from_two_tensors(x, m, z):
    y = x.clone()
    y[m] = torch.tanh(y[m]) * z[m] - 1
    return y


def rows_by_a_mask(x, m, bias):
    y = x.clone()
    y[m] += bias            # bias broadcasts along each selected row, as along every row
    return y


def integer_counts(n, m):
    c = n.clone()
    c[m] += 1
    c[m] //= 2
    return c


@pytest.mark.parametrize("f, make", [
    (add_number, lambda: (torch.randn(4, 5), torch.randn(4, 5) > 0)),
    (scale_positive, lambda: (torch.randn(3, 7),)),
    (from_two_tensors, lambda: (torch.randn(6, 3), torch.randn(6, 3) > 0.3, torch.randn(6, 3))),
    (rows_by_a_mask, lambda: (torch.randn(5, 4), torch.tensor([True, False, True, True, False]), torch.randn(4))),
    (integer_counts, lambda: (torch.arange(12).reshape(3, 4), torch.rand(3, 4) > 0.5)),
])
def test_a_masked_update_matches_eager(f, make):
    compiled = cuvil.compile(f)
    for seed in range(3):
        torch.manual_seed(seed)
        args = make()
        torch.testing.assert_close(compiled(*args), f(*args))
    empty = tuple(torch.zeros_like(a) if a.dtype == torch.bool else a for a in make())
    torch.testing.assert_close(compiled(*empty), f(*empty))       # a mask selecting nothing


class LanguageAdapters(torch.nn.Module):
    """X-MOD's per-language adapters: each language's rows put through its own small network,
    `out[mask] = adapter(h[mask])`, with the mask over the batch, then over batch and tokens."""

    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, h, lang, keep):
        out = torch.zeros_like(h)
        for code in (0, 1):
            mask = lang == code
            out[mask] = self.down(torch.relu(self.up(self.norm(h[mask])))) + code
        tokens = keep > 0
        out[tokens] += torch.softmax(h[tokens] * 2, -1)      # the mask over two dims: rows of the last
        return out


def test_rows_a_mask_selects_put_through_row_ops_match_eager():
    model = LanguageAdapters().eval()
    compiled = cuvil.compile(model)
    with torch.no_grad():
        for seed in range(3):
            g = torch.Generator().manual_seed(seed)
            h = torch.randn(4, 5, 8, generator=g)
            lang = torch.randint(0, 3, (4,), generator=g)
            keep = torch.randint(0, 2, (4, 5), generator=g)
            torch.testing.assert_close(compiled(h, lang, keep), model(h, lang, keep), rtol=1e-5, atol=1e-6)


def test_a_row_op_mixing_the_selected_rows_stays_refused():
    def f(h, m):
        out = torch.zeros_like(h)
        out[m] = torch.softmax(h[m], 0)      # along the selection's count: its size matters
        return out
    with pytest.raises(CuvilError, match="boolean-mask indexing"):
        cuvil.compile(f)(torch.randn(4, 8), torch.tensor([True, False, True, True]))


def test_a_selection_used_otherwise_stays_refused():
    def f(x, m):
        y = x.clone()
        y[m] += x[m].sum()          # the selection summed: its size matters
        return y
    with pytest.raises(CuvilError, match="boolean-mask indexing"):
        cuvil.compile(f)(torch.randn(4, 5), torch.randn(4, 5) > 0)

    def g(x, m, k):
        y = x.clone()
        y[m] = x[k]                 # values selected by another mask
        return y
    with pytest.raises(CuvilError, match="boolean-mask indexing"):
        m = torch.tensor([True, False, True])
        cuvil.compile(g)(torch.randn(3), m, m.clone())


def test_a_masked_update_serves_every_size_of_a_dynamic_dim():
    compiled = cuvil.compile(add_number, dynamic={"x": {0: "n"}, "m": {0: "n"}})
    for n in (3, 8, 1):
        x = torch.randn(n, 5)
        torch.testing.assert_close(compiled(x, x > 0), add_number(x, x > 0))
    assert compiled.num_variants == 1


def test_leading_ones_and_a_mask_written_out_twice():
    def f(x, b):
        y = x.clone()
        y[x[:, 0] > 0] += b         # b [1, 4]: broadcast over the selected rows as over all
        y[y > 1] = y[y > 1] * 3     # the mask computed twice, from the same values
        return y
    compiled = cuvil.compile(f)
    x, b = torch.randn(5, 4), torch.randn(1, 4)
    torch.testing.assert_close(compiled(x, b), f(x, b))


def test_float_values_into_an_integer_tensor_are_refused_as_eager_raises():
    def f(y, m):
        y = y.clone()
        y[m] = y[m] * 1.5
        return y

    def g(y, i):
        y = y.clone()
        y[i] = y[i] * 1.5
        return y
    y = torch.arange(6).reshape(2, 3)
    with pytest.raises(RuntimeError, match="dtypes match"):
        f(y, y > 2)
    for fn, index in ((f, y > 2), (g, torch.tensor([1]))):
        with pytest.raises(CuvilError, match="values of f32 put into a tensor of i64: eager raises"):
            cuvil.compile(fn)(y, index)


def test_a_mask_after_dims_taken_whole():
    def f(x, cols, bias):
        y = x.clone()
        y[:, cols] += 1
        y[:, cols] *= bias          # bias [3, 1]: one value per row, 1 along the selected columns
        return y
    compiled = cuvil.compile(f)
    x, cols, bias = torch.randn(3, 5), torch.tensor([True, False, True, True, False]), torch.randn(3, 1)
    torch.testing.assert_close(compiled(x, cols, bias), f(x, cols, bias))

    def g(x, cols):
        y = x.clone()
        y[:, :, cols] -= y[:, :, cols] * 0.5        # a mask after two whole dims, rows after it
        return y
    x3 = torch.randn(2, 3, 4, 6)
    torch.testing.assert_close(cuvil.compile(g)(x3, torch.tensor([True, False, False, True])),
                               g(x3, torch.tensor([True, False, False, True])))
