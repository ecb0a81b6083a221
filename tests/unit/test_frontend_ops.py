"""ATen table rows, one small program each: imported with dynamic dims, run by the reference
interpreter at several sizes, compared with eager PyTorch."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cuvil
from cuvil import ir
from cuvil.frontend import import_model
from cuvil.frontend.annotations import function_annotations

SIZES = ({"B": 2, "S": 6}, {"B": 1, "S": 4}, {"B": 5, "S": 11})
# S >= 4: slicing 1:-1 and striding must not leave a size-1 dim, which torch would specialise on
RANGES = {"B": (1, 64), "S": (4, 64)}


def make_inputs(fn, sizes, seed=0):
    torch.manual_seed(seed)
    out = []
    for ann in function_annotations(fn).values():
        shape = [sizes[d] if isinstance(d, str) else d for d in ann.dims]
        if ann.dtype.is_float:
            out.append(torch.randn(shape))
        else:   # small indices/ints, valid for any indexed dim of size >= 3
            out.append(torch.randint(0, 3, shape, dtype=ann.dtype.torch))
    return out


def check(fn, model=None, inputs=None, dynamic=None):
    """Import `fn` (annotated) or `model`, then compare with eager at every size in SIZES."""
    target = model or fn
    result = import_model(target, inputs(SIZES[0]) if inputs else None, dynamic=dynamic, ranges=RANGES)
    ir.verify(result.module)
    for sizes in SIZES:
        args = inputs(sizes) if inputs else make_inputs(fn, sizes)
        with torch.no_grad():
            want = target(*args)
        got = result.unflatten(ir.interpret(result.module, *args))
        torch.testing.assert_close(got, want, equal_nan=True)
    return result


def ops_of(result):
    return [op.name for op in result.function.ops]


# ----------------------------------------------------------------------------- elementwise

def promotion(x: "i64[B,S]", y: "f32[B,S]"):
    return x * 0.5 + (x > 1), x / (x + 1), torch.div(x, 2, rounding_mode="floor"), x % 2, y + x


def where_and_masks(x: "f32[B,S]"):
    y = torch.where(x > 0, x, 0.1 * x).masked_fill(x < -1, float("-inf"))
    return y, torch.where(x > 0.5, 1.0, x), (x > 0) & ~(x > 1) | (x < -2)


def unary(x: "f32[B,S]"):
    return (x.exp(), (x.abs() + 1).log(), x.abs().sqrt(), (x.abs() + 1).rsqrt(), x.sin(), x.cos(), x.tanh(),
            x.sigmoid(), F.silu(x), torch.erf(x), (x.abs() + 1).reciprocal(), x.floor(), x.ceil(), x.round(),
            x.sign(), -x, x.relu(), F.gelu(x, approximate="tanh"), x.clamp(-0.5, 0.5), F.hardtanh(x), F.relu6(x),
            x.clamp(min=0.1), x ** 2, 2 ** x, x.abs() ** x, F.leaky_relu(x, 0.2))


def casts(x: "f32[B,S]"):
    return x.to(torch.int32).float() * 3, (x > 0).long().sum(1), (x > 0).cumsum(-1)


def bitwise_and_float_classes(x: "i64[B,S]", y: "f32[B,S]"):
    y = y.masked_fill(y > 1.5, float("inf")).masked_fill(y < -1.5, float("-inf")).masked_fill(y.abs() < 0.1, float("nan"))
    return ((x & 5) | (x ^ 3), x ^ (x + 1), (x > 0) ^ (x > 1), (x > 0) & True,
            y.isinf(), y.isfinite(), y.isposinf(), y.isneginf(), x.isinf(), x.isfinite())


@pytest.mark.parametrize("fn", [promotion, where_and_masks, unary, casts, bitwise_and_float_classes])
def test_elementwise(fn):
    check(fn)


def test_python_scalars_become_literals():
    result = check(promotion)
    literals = [op for op in result.function.ops if op.name == "cuvil.literal"]
    assert {op.attrs["value"] for op in literals} >= {0.5, 1, 2}


# ----------------------------------------------------------------------------- reductions

def reductions(x: "f32[B,S]"):
    return (x.sum(-1), x.mean(dim=(0,), keepdim=True), x.amax(1), x.amin(0), x.var(1), x.var(1, correction=0),
            x.argmax(-1), torch.max(x, 1).values, x.sum(), x.mean(), torch.softmax(x, -1), F.log_softmax(x, 0))


def test_reductions():
    check(reductions)


# ----------------------------------------------------------------------------- shapes and indexing

def slicing(x: "f32[B,S]"):
    return x[:, 1:-1] * 2, x[:, -1], x[-1], x[:, ::2], x[:, :x.shape[1] - 1], x[:1]


def reshaping(x: "f32[B,S]"):
    y = torch.cat([x, x * 2], dim=-1).unsqueeze(1).squeeze(1)
    return y.flatten().reshape(-1, 2), y.transpose(0, 1), y.t().contiguous(), y.permute(1, 0).clone(), \
        x.unsqueeze(-1).expand(-1, -1, 4)


def splitting(x: "f32[B,S]", w: "f32[B,4]"):
    a, b = w.split([1, 3], dim=1)
    c, d = torch.chunk(w, 2, dim=-1)
    return a + b.sum(1, keepdim=True), c * d, torch.cat([x, w], 1), torch.cat([w.long(), w], 0)


def indexing(x: "f32[B,6]", i: "i64[B,6]"):
    rows = torch.arange(x.shape[0])[:, None]
    return x.gather(1, i), x.index_select(1, i[0]), x[rows, i], x.t()[i[:, 0]]


def factories(x: "f32[B,S]"):
    s = x.shape[1]
    causal = torch.full((s, s), float("-inf")).triu(1)
    return (torch.arange(s) + torch.zeros(x.shape[0], 1), causal, torch.ones_like(x).tril(),
            x.new_zeros(x.shape), torch.arange(1, s + 1, 2), x + torch.tensor(3.0), torch.arange(4.0) * 0.5)


def padding(x: "f32[B,S]", i: "i64[B,6]"):
    img = x.unsqueeze(1).expand(-1, 3, -1)[:, :, :4]       # [B, 3, 4]: static padded dims
    return (F.pad(x, (2, 1)), F.pad(x, (-1, 3, 1, 0), value=2.5), F.pad(i, (1, 1), value=7),
            F.pad(img, (3, 2), mode="reflect"), F.pad(img, (2, -1, 1, 1), mode="replicate"),
            F.pad(img, (-1, 3), mode="circular"), torch.constant_pad_nd(x, (0, 0, 1, 1), -1.0))


def masked_puts(x: "f32[B,S]", i: "i64[B,S]"):
    # x[mask] = v where v does not run along the selected elements: where(mask, v, x)
    a = x.clone()
    a[i > 1] = 0.5
    rows = x.unsqueeze(-1).repeat(1, 1, 3)
    rows[i == 0] = torch.tensor([1.0, 2.0, 3.0])
    ids = i.clone()
    ids[i == 2] = 7
    b = x.clone()
    b.index_put_((i < 2,), torch.tensor(1.5), accumulate=True)
    c = x.clone()
    c[:, i[0] > 0] = -1.0
    return a, rows, ids, b, c


@pytest.mark.parametrize("fn", [slicing, reshaping, splitting, indexing, factories, padding, masked_puts])
def test_shapes_and_indexing(fn):
    check(fn)


@pytest.mark.parametrize("attrs, message", [
    ('low = [0, 4], high = [0, 0], mode = "reflect"', r"reflect padding of dim 1 \(size 4\) by 4 and 0 needs amounts "
                                                     r"from 0 to the size - 1"),
    ('low = [0, -3], high = [0, 2], mode = "circular"', r"needs what the negative amounts leave \(1\) to be at least "
                                                       r"1 and the positive amounts"),
    ('low = [0, -3], high = [0, -2]', r"padding dim 1 \(size 4\) by -3 and -2 leaves a negative size"),
    ('low = [1, 1], high = [1, 1], mode = "wrap"', r"pad mode must be one of constant, reflect, replicate, circular"),
])
def test_pad_amounts_that_torch_refuses_are_refused_with_the_rule_and_the_line(attrs, message):
    text = (f"cuvil.func @f(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {{\n"
            f"  %0 = cuvil.pad %x {{{attrs}}} : tensor<2x4xf32> -> tensor<2x4xf32>\n"
            f"  cuvil.return %0 : tensor<2x4xf32>\n}}\n")
    with pytest.raises(cuvil.CuvilError, match=message) as info:
        ir.parse(text)
    assert "<text>:2:" in str(info.value)


def test_symbolic_slice_bounds_and_strided_sizes():
    result = check(slicing)
    text = ir.print_function(result.function)
    assert "end = [-1 + s1]" in text            # x[:, 1:-1] on the dynamic seq dim
    assert "tensor<s0x((1 + s1)//2)xf32>" in text  # x[:, ::2]


# ----------------------------------------------------------------------------- nn ops through modules

class Convs(nn.Module):
    def __init__(self):
        super().__init__()
        self.grouped = nn.Conv2d(4, 8, 3, padding=2, dilation=2, groups=2, bias=False)
        self.bn = nn.BatchNorm2d(8, affine=False)
        self.strided = nn.Conv2d(8, 8, 3, stride=2)

    def forward(self, x):
        y = self.bn(self.grouped(x))
        y = F.max_pool2d(y, 3, stride=1, padding=1)
        y = F.avg_pool2d(self.strided(y), 2, ceil_mode=True, count_include_pad=False)
        return F.adaptive_avg_pool2d(y, (2, 2)), F.hardswish(y)


class Conv1ds(nn.Module):
    """1-d convolutions (run as 2-d ones one row high): padded, strided and dilated, grouped, a
    'same' padding, and an unbatched input."""
    def __init__(self):
        super().__init__()
        self.first = nn.Conv1d(4, 8, 3, padding=1)
        self.grouped = nn.Conv1d(8, 8, 3, stride=2, padding=2, dilation=2, groups=2)
        self.same = nn.Conv1d(8, 6, 5, padding="same", dilation=3, bias=False)

    def forward(self, x):
        y = self.grouped(torch.relu(self.first(x)))
        return y, self.same(y), self.first(x[0])


class Norms(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 8, padding_idx=0)
        self.weight = nn.Parameter(torch.rand(8) + 0.5)
        self.bias = nn.Parameter(torch.randn(8))

    def forward(self, ids, x):
        e = self.emb(ids) + x
        return (F.layer_norm(e, (8,)), F.layer_norm(e, (8,), None, self.bias), F.rms_norm(e, (8,), self.weight),
                F.layer_norm(e, (4, 8), eps=1e-3), torch.softmax(e, -1, dtype=torch.float32))


class Matmuls(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 5))
        self.b = nn.Parameter(torch.randn(5))

    def forward(self, x, y):
        flat = x.reshape(-1, 8)
        return (torch.addmm(self.b, flat, self.w), torch.addmm(self.b, flat, self.w, beta=0.5, alpha=2.0),
                flat.mm(self.w), torch.bmm(x, y), x @ self.w, torch.einsum("bsd,bds->bs", x, y))


class Attention(nn.Module):
    def forward(self, q, k, v, bias):
        return (F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.3),
                F.scaled_dot_product_attention(q, k, v, is_causal=True),
                F.scaled_dot_product_attention(q, k, v, attn_mask=bias > 0))


def conv_inputs(s):
    torch.manual_seed(1)
    return (torch.randn(s["B"], 4, 9, 9),)


def conv1d_inputs(s):
    torch.manual_seed(5)
    return (torch.randn(s["B"], 4, s["S"]),)


def norm_inputs(s):
    torch.manual_seed(2)
    return torch.randint(0, 10, (s["B"], 4)), torch.randn(s["B"], 4, 8)


def matmul_inputs(s):
    torch.manual_seed(3)
    return torch.randn(s["B"], s["S"], 8), torch.randn(s["B"], 8, s["S"])


def attention_inputs(s):
    torch.manual_seed(4)
    q, k, v = (torch.randn(s["B"], 2, s["S"], 4) for _ in range(3))
    return q, k, v, torch.randn(s["S"], s["S"])


@pytest.mark.parametrize("model, inputs, dynamic, expect", [
    (Convs(), conv_inputs, [{0: "B"}], {"cuvil.conv2d", "cuvil.batch_norm", "cuvil.max_pool2d", "cuvil.avg_pool2d",
                                        "cuvil.adaptive_avg_pool2d"}),
    (Conv1ds(), conv1d_inputs, [{0: "B", 2: "S"}], {"cuvil.conv2d", "cuvil.unsqueeze", "cuvil.squeeze"}),
    (Norms(), norm_inputs, [{0: "B"}, {0: "B"}], {"cuvil.embedding", "cuvil.layer_norm", "cuvil.rms_norm",
                                                  "cuvil.softmax"}),
    (Matmuls(), matmul_inputs, [{0: "B", 1: "S"}, {0: "B", 2: "S"}], {"cuvil.linear", "cuvil.matmul"}),
    (Attention(), attention_inputs, [{0: "B", 2: "S"}] * 3 + [{0: "S", 1: "S"}], {"cuvil.sdpa"}),
], ids=["convs", "conv1ds", "norms", "matmuls", "attention"])
def test_nn_ops(model, inputs, dynamic, expect):
    result = check(None, model.eval(), inputs, dynamic)
    assert expect <= set(ops_of(result))


def test_integer_truncating_division_rounds_toward_zero_natively():
    # the floor quotient, one up where the division is inexact and the signs differ
    a, b = torch.meshgrid(torch.arange(-9, 10), torch.tensor([-4, -3, -1, 1, 2, 5]), indexing="ij")
    a, b = a.reshape(-1).contiguous(), b.reshape(-1).contiguous()

    def f(a, b):
        return (torch.div(a, b, rounding_mode="trunc"), torch.div(a, -3, rounding_mode="trunc"),
                torch.div(a.int(), b.int(), rounding_mode="trunc"))
    for got, want in zip(cuvil.compile(f)(a, b), f(a, b)):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_a_product_of_mixed_float_dtypes_is_refused_by_name():
    # an f16 input into an f32 Linear: torch.export passes it, eager refuses it when it runs; the
    # import once failed with "internal error importing aten.linear.default"
    m = torch.nn.Linear(8, 4).eval()
    with pytest.raises(cuvil.CuvilError, match="operands of dtypes f16 and f32"):
        cuvil.compile(m, cache=False)(torch.randn(3, 8).half())


def test_integer_matmuls_are_exact_natively():
    # Cuvil's GEMMs are f32, which refused integer operands (with no source line) and would round
    # sums past 2**24: entries near 2**40 tell an exact product from an f32 one
    torch.manual_seed(0)
    big = torch.randint(-2**40, 2**40, (2, 3, 5))
    small = torch.randint(-9, 10, (2, 5, 4))
    assert not torch.equal((big.float() @ small.float()).long(), big @ small)
    cases = [(lambda a, b: a @ b, (big, small)), (lambda a, b: a @ b, (big[0, 0], small[0])),
             (lambda a, b: a @ b, (big, small[0, :, 0])), (lambda a, b: a @ b, (big[0, 0], small[0, :, 0])),
             (lambda a, b: torch.mm(a, b), ((big[0] // 2**20).int(), small[0].int())),
             (lambda a, b: torch.bmm(a, b), ((big // 2**20).int(), small.int())),
             (lambda a, b: torch.einsum("bij,bjk->bik", a, b), (big, small)),
             (lambda x, w, b: F.linear(x, w, b), (big[0], small[0].T.contiguous(), big[0, 0, :4])),
             (lambda b, x, y: torch.addmm(b, x, y, beta=3, alpha=2), (big[0, 0, :4], big[0], small[0]))]
    for f, args in cases:
        got, want = cuvil.compile(f, cache=False)(*args), f(*args)
        assert got.dtype == want.dtype and torch.equal(got, want)
    # a dynamic number of rows and of summed columns
    c = cuvil.compile(lambda a, b: a @ b, dynamic={"a": {0: "m", 1: "k"}, "b": {0: "k"}}, cache=False)
    for m, k in ((3, 5), (7, 9), (2, 33)):
        a, b = torch.randint(-2**40, 2**40, (m, k)), torch.randint(-9, 10, (k, 4))
        assert torch.equal(c(a, b), a @ b)
    # operands of two integer dtypes, which eager refuses, are refused rather than promoted
    with pytest.raises(cuvil.CuvilError, match=r"operands of dtypes i32 and i64(.|\n)*test_frontend_ops.py"):
        cuvil.compile(lambda a, b: a @ b, cache=False)(big[0].int(), small[0])


def test_a_product_of_bool_tensors_is_refused_with_the_source_line():
    # eager refuses both; Cuvil's codegen failed deep inside, without the user's line
    a = torch.rand(3, 3) > 0.5
    with pytest.raises(cuvil.CuvilError, match=r"aten.matmul(.|\n)*bool tensors(.|\n)*test_frontend_ops.py:\d+"):
        cuvil.compile(lambda a, b: a @ b, cache=False)(a, a)
    with pytest.raises(cuvil.CuvilError, match=r"aten.conv2d(.|\n)*bool tensors(.|\n)*test_frontend_ops.py:\d+"):
        cuvil.compile(lambda x, w: F.conv2d(x, w), cache=False)(a[None, None], a[None, None, :2, :2])


def test_integer_sums_and_products_in_the_dtype_asked_for():
    # torch sums integers in i64 unless dtype= says otherwise; i32 wraps as eager's does
    x, flags, big = torch.arange(1, 6), torch.tensor([True, False, True]), torch.full((3,), 2**30, dtype=torch.int32)
    for fn, a in [(lambda a: a.sum(dtype=torch.int32), x), (lambda a: a.sum(dtype=torch.int32), flags),
                  (lambda a: a.prod(dtype=torch.int32), x), (lambda a: a.view(5, 1).sum(0, dtype=torch.int32), x),
                  (lambda a: a.sum(dtype=torch.int32), big), (lambda a: a.view(5, 1).prod(1, dtype=torch.int32), x)]:
        got, want = cuvil.compile(fn, cache=False)(a), fn(a)
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_float_floor_division_follows_torch_at_infinities_and_zeros():
    # ATen's rules (Python's): inf // 0.7 is NaN, -5 // inf is -1, 3 // -0.0 is -inf; floor(a / b) gave
    # inf and -0 there
    inf, nan = float("inf"), float("nan")
    a = torch.tensor([inf, -inf, 5.0, -5.0, 1e30, 3.0, nan, 0.5, -0.5, 7.0, -7.0, 7.5, 0.0, -0.0, 3.0, 5.9])
    b = torch.tensor([0.7, 0.7, inf, inf, 0.7, 0.0, 1.0, -inf, inf, 2.0, 2.0, -2.5, 3.0, 3.0, -0.0, 0.1])
    x, y = torch.randn(10_000) * 100, torch.randn(10_000)
    fn = lambda a, b: a // b      # noqa: E731
    for p, q in ((a, b), (x, y)):
        got, want = cuvil.compile(fn, cache=False)(p, q), fn(p, q)
        torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
        numbers = ~torch.isnan(want)
        assert torch.equal(torch.signbit(got[numbers]), torch.signbit(want[numbers]))


def test_a_long_cumsum_is_as_accurate_as_eager_s():
    # ATen sums in f64 on CPU; a plain f32 running sum of 10^4 terms was 40x further from the f64 sum
    torch.manual_seed(0)
    fn = lambda a: a.cumsum(-1)     # noqa: E731
    for a in (torch.randn(4, 10_000), torch.rand(2, 50_000), torch.randn(3, 7, 300).half()):
        got, want, exact = cuvil.compile(fn, cache=False)(a), fn(a), a.double().cumsum(-1)
        torch.testing.assert_close(got, want)
        assert (got.double() - exact).abs().max() <= 2 * (want.double() - exact).abs().max() + 1e-12
    inf, nan = float("inf"), float("nan")
    special = torch.tensor([[1.0, inf, 2.0, -inf, 3.0], [1e8, 1.0, -1e8, 1.0, nan]])
    torch.testing.assert_close(cuvil.compile(fn, cache=False)(special), fn(special), equal_nan=True)
    scalar = torch.tensor(-8.5)
    assert cuvil.compile(lambda a: a.cumsum(0), cache=False)(scalar) == -8.5


def test_a_masked_put_of_values_for_each_selected_element_is_refused_with_the_source_line():
    def put(x):
        x = x.clone()
        x[x > 0] = torch.arange(5.0)
        return x
    with pytest.raises(cuvil.CuvilError, match=r"aten.index_put(.|\n)*values for each selected element"
                                               r"(.|\n)*test_frontend_ops.py:\d+"):
        cuvil.compile(put, cache=False)(torch.randn(10))


def _first_row_and_rest(x):
    y = x[:-1:3]
    return y.split([1, y.shape[0] - 1])


def _rest_and_last_row(x):
    y = x[2:-2:3]
    return torch.split(y, [y.shape[0] - 1, 1])


@pytest.mark.parametrize("fn, sizes", [
    # 4 rows leave the rest empty: torch narrows the range to [2, 4], where x[:-1:3] has one row
    # while torch's sizes of its pieces read `(1 + n)//3 - 1`: the split was refused, its sizes
    # "not adding up"
    (_first_row_and_rest, (4, 10, 16, 11, 12, 20, 21)),
    (_rest_and_last_row, (10, 16, 11, 12, 20, 21)),
], ids=["first-row-and-rest", "rest-and-last-row"])
def test_split_of_a_strided_slice_of_a_dynamic_dim(fn, sizes):
    # sizes where (n - 1) % 3 is 0, 1 and 2
    c = cuvil.compile(fn, dynamic={"x": {0: "n"}}, cache=False)
    for n in sizes:
        x = torch.randn(n, 4)
        got, want = c(x), fn(x)
        assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    assert c.fallback_reason is None
