"""Products by a matrix that is transposed or constant: `x @ w.t()` reads w's rows as the product's
columns (canonicalize: a linear), and `x @ W` with W a weight runs on W packed in panels (layout).
Before, the first copied w transposed on every call and the second ran OpenBLAS on W as stored."""
import torch

import cuvil
from cuvil.codegen.target import Target
from cuvil.ir.ops.nn import panel_width


def _kernel_names(compiled) -> list[str]:
    return [k["name"] for k in compiled.report.kernels]


def _stats(compiled, name: str) -> dict:
    return next(p["statistics"] for p in compiled.report.passes if p["name"] == name)


def test_a_product_by_a_transposed_matrix_passed_in_copies_nothing():
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(48, 64, generator=gen, dtype=torch.float64)
    w[7, 5] = float("nan")              # reaches column 7 of every row, and only it

    def product(a, w):
        return a @ w.t()
    compiled = cuvil.compile(product, dynamic=[{0: "rows"}, {}], cache=False)
    for rows in (5, 3, 130):
        a = torch.randn(rows, 64, generator=gen, dtype=torch.float64)
        out = compiled(a.float(), w.float())
        torch.testing.assert_close(out.double(), product(a, w), rtol=1e-5, atol=1e-5, equal_nan=True)
        assert out[:, 7].isnan().all() and not out[:, :7].isnan().any()
    assert not any("permute" in name for name in _kernel_names(compiled))
    assert any("linear" in name for name in _kernel_names(compiled))
    assert _stats(compiled, "canonicalize")["matmul-of-transpose"] == 1


def test_a_batch_or_a_vector_times_a_transposed_matrix_is_a_linear_too():
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(40, 32, generator=gen, dtype=torch.float64)
    for a in (torch.randn(2, 3, 32, generator=gen, dtype=torch.float64), torch.randn(32, generator=gen, dtype=torch.float64)):
        compiled = cuvil.compile(lambda a, w: a @ w.t(), cache=False)
        out = compiled(a.float(), w.float())
        assert out.shape == (a @ w.t()).shape
        torch.testing.assert_close(out.double(), a @ w.t(), rtol=1e-5, atol=1e-5)
        assert _kernel_names(compiled) == [k for k in _kernel_names(compiled) if "linear" in k] != []


class _Projections(torch.nn.Module):
    """A weight stored [in, out] (`x @ W`) and one stored [out, in] used transposed (`x @ V.t()`)."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(5)
        self.W = torch.nn.Parameter(torch.randn(64, 40, generator=gen))
        self.V = torch.nn.Parameter(torch.randn(24, 40, generator=gen))

    def forward(self, x):
        return torch.relu(x @ self.W) @ self.V.t()


def test_products_by_weights_run_on_packed_panels():
    model = _Projections().eval()
    compiled = cuvil.compile(model, dynamic=[{0: "rows"}], cache=False)
    with torch.no_grad():
        for rows in (1, 9, 100):
            x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows))
            expected = torch.relu(x.double() @ model.W.double()) @ model.V.double().t()
            torch.testing.assert_close(compiled(x).double(), expected, rtol=1e-5, atol=1e-5)
    assert _stats(compiled, "layout")["matmuls-packed"] == 2
    assert not any("matmul" in name or "permute" in name for name in _kernel_names(compiled))
    # panels [ceil(out / P), in, P] (`pack_panels`): 40 outputs of 64 inputs, then 24 of 40
    irs = "\n".join(k["kernel_ir"] for k in compiled.report.kernels)
    width = panel_width(40, Target.host().panel_width)      # 64 with AVX-512 (40 pads to 64 either way)
    assert f"f32[{-(-40 // width)}, 64, {width}]" in irs


def test_a_vector_or_a_batch_times_a_weight_runs_on_its_panels():
    """`x @ W` for x a vector ([in] -> [out]) or a batch of matrices ([2, 3, in]): a linear of W's
    panels all the same, of eager's shape and values."""
    W = torch.randn(64, 40, generator=torch.Generator().manual_seed(6))
    for x in (torch.randn(64), torch.randn(2, 3, 64)):
        compiled = cuvil.compile(lambda x: x @ W, cache=False)
        out = compiled(x)
        assert out.shape == (x @ W).shape
        torch.testing.assert_close(out.double(), x.double() @ W.double(), rtol=1e-5, atol=1e-5)
        assert _stats(compiled, "layout")["matmuls-packed"] == 1
        assert [k["name"] for k in compiled.report.kernels] == ["forward_0_linear"]
