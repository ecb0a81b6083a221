"""Frontend API: dynamic hints, string annotations, source locations and error reporting."""
import linecache

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cuvil
from cuvil import ir, zoo
from cuvil.errors import CuvilError, CuvilUnsupportedOpError
from cuvil.frontend import CuvilExportError, import_model
from cuvil.frontend.annotations import parse_annotation
from cuvil.frontend.locations import frames_from_text, user_frame


def source_text(loc):
    return linecache.getline(loc.file, loc.line).strip()


# ----------------------------------------------------------------------------- hints and symbols

class AddBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(8))

    def forward(self, x, y):
        return x + y + self.bias


def test_hints_by_parameter_name_with_ranges_inside():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    r = import_model(AddBias().eval(), (x, y), dynamic={"x": {0: "batch"}, "y": {0: "batch"}, "batch": (2, 32)})
    fn = r.function
    assert [str(a.type) for a in fn.args] == ["tensor<s0x8xf32>", "tensor<s0x8xf32>"]
    assert fn.symbols == {"s0": (2, 32)}
    assert r.symbol_for("batch") == "s0" and r.input_names == ["x", "y"]
    assert "bias" in r.module.constants


def test_hints_by_position_two_symbols_numbered_in_input_order():
    class M(nn.Module):
        def forward(self, a, b):
            return a @ b

    r = import_model(M(), (torch.randn(3, 5), torch.randn(5, 7)), dynamic=[{0: "rows"}, {1: "cols"}],
                     ranges={"rows": (1, 10)})
    assert str(r.function.args[0].type) == "tensor<s0x5xf32>"
    assert str(r.function.args[1].type) == "tensor<5xs1xf32>"
    assert r.symbols["s0"].hint == "rows" and r.symbols["s1"].hint == "cols"
    assert r.function.symbols == {"s0": (1, 10), "s1": (1, 4096)}   # cols: the default range
    a, b = torch.randn(9, 5), torch.randn(5, 2)
    torch.testing.assert_close(ir.interpret(r.module, a, b)[0], a @ b)


def test_static_import_has_no_symbols():
    r = import_model(AddBias().eval(), (torch.randn(4, 8), torch.randn(4, 8)))
    assert r.function.symbols == {} and r.symbols == {}
    assert str(r.function.args[0].type) == "tensor<4x8xf32>"


@pytest.mark.parametrize("dynamic, message", [
    ({"z": {0: "batch"}}, r"unknown input\(s\) \['z'\]; the inputs are \['x', 'y'\]"),
    ([{2: "batch"}], "rank 2"),
    ([{0: "not a name"}], "identifier"),
    ({"x": {0: "batch"}, "batch": (5, 2)}, "min <= max"),
    ([None, None, {0: "b"}], "3 dynamic hints for 2 positional inputs"),
])
def test_bad_hints_are_clear_errors(dynamic, message):
    with pytest.raises(CuvilError, match=message):
        import_model(AddBias().eval(), (torch.randn(4, 8), torch.randn(4, 8)), dynamic=dynamic)


def test_a_size_torch_computes_as_a_power_of_a_dynamic_dim():
    """A tensor broadcast to [b, b, ...] and then reshaped: torch's size arithmetic writes b * b as
    b**2 (operator.pow on symbolic ints), which once stopped the import as an unsupported 'pow'."""
    import cuvil
    w = torch.randn(17, 17)

    def f(x):
        t = x.transpose(-1, -2)
        return ((t + t[:, -1]) @ w).unflatten(3, (-1, 1))

    fast = cuvil.compile(f, dynamic=[{0: "b"}])
    for b in (3, 5, 1):
        x = torch.randn(b, 1, 17, 8)
        torch.testing.assert_close(fast(x), f(x))
    assert fast.num_variants == 1


def test_unfold_of_a_dynamic_length_serves_every_length():
    """Frames of a signal whose length is dynamic: the window count (n - 4) // 2 + 1 is symbolic,
    and the frames are a view that the reduction reads through."""
    import cuvil

    def frames(x):
        w = x.unfold(1, 4, 2)
        return w.sum(-1), w[:, -1]

    fast = cuvil.compile(frames, dynamic=[{1: "n"}], ranges={"n": (6, 4096)})
    for n in (9, 12, 31):
        x = torch.randn(3, n)
        for got, want in zip(fast(x), frames(x)):
            torch.testing.assert_close(got, want)
    assert fast.num_variants == 1


@pytest.mark.parametrize("divisor", [2.5, -3, 7])
def test_fmod_and_remainder_by_a_python_number(divisor):
    """aten.fmod.Scalar / remainder.Scalar: C's sign (x's) and Python's (the divisor's)."""
    import cuvil

    def f(x, i):
        return torch.fmod(x, divisor), torch.remainder(x, divisor), torch.fmod(i, 3), x % divisor

    x, i = torch.randn(64) * 20, torch.arange(-20, 20)
    for got, want in zip(cuvil.compile(f)(x, i), f(x, i)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_ops_imported_without_decompositions():
    """Ops Hugging Face models leave in the exported graph (T5's `torch.where(c, x, min)` and
    `.contiguous()`, RoBERTa's `type_as`, Swin's adaptive_avg_pool1d, triplet losses' `torch.min(a, b)`)
    import directly: the graph needs no `run_decompositions` (which traces the model again)."""
    from cuvil.frontend.export import capture, needs_decomposition

    def f(x, i):
        y = torch.where(x > 0, x, -0.5) + torch.where(x < 1, 2.0, x)
        t = x.t().contiguous() * 2
        pooled = F.adaptive_avg_pool1d(x.unsqueeze(0), 3)
        return y, t, i.type_as(x) + x[:, :1], torch.min(x, y), torch.max(y, x * 2), pooled

    x, i = torch.randn(5, 7), torch.arange(5).reshape(5, 1)
    assert not needs_decomposition(capture(f, (x, i)).program)
    for got, want in zip(cuvil.compile(f, cache=False)(x, i), f(x, i)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


CONV_PADDING_BY_NAME = [((1, 3, 9, 10), (4, 3, 3, 3), {"padding": "same"}),
                        ((2, 4, 8, 7), (6, 2, 4, 2), {"padding": "same", "groups": 2}),     # even kernels: one more after
                        ((1, 3, 9, 10), (5, 3, 3, 2), {"padding": "same", "dilation": (2, 3)}),
                        ((1, 3, 9, 10), (5, 3, 3, 4), {"padding": "valid", "stride": 2}),
                        ((3, 9, 10), (5, 3, 2, 3), {"padding": "same"})]                 # unbatched


@pytest.mark.parametrize("x_shape,w_shape,options", CONV_PADDING_BY_NAME,
                         ids=[str(o) for *_, o in CONV_PADDING_BY_NAME])
def test_conv2d_padding_by_name(x_shape, w_shape, options):
    """padding="same" / "valid" (TensorFlow ports: EfficientNet) imports directly, against eager,
    with no `run_decompositions`; an even kernel pads its extra element after, as torch does."""
    from cuvil.frontend.export import capture, needs_decomposition
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(x_shape, generator=g), torch.randn(w_shape, generator=g), torch.randn(w_shape[0], generator=g)

    def f(x):
        return F.conv2d(x, w, b, **options)

    assert not needs_decomposition(capture(f, (x,)).program)
    torch.testing.assert_close(cuvil.compile(f, cache=False)(x), f(x), rtol=1e-5, atol=1e-5)


def test_max_pool1d_imports_directly_and_through_its_indices_form():
    """`F.max_pool1d` (CANINE's downsampling) imports as a 2-d pool over rows one high, without
    `run_decompositions`; asked for its indices, it decomposes to max_pool2d_with_indices, whose
    values Cuvil computes (the indices unused here)."""
    from cuvil.frontend.export import capture, needs_decomposition
    x = torch.randn(2, 5, 17, generator=torch.Generator().manual_seed(2))

    def direct(x):
        return F.max_pool1d(x, 4, stride=3, padding=1, ceil_mode=True), F.max_pool1d(x[0], 3, dilation=2)

    def through_indices(x):
        return F.max_pool1d(x, 3, stride=2, return_indices=True)[0] * 2

    assert not needs_decomposition(capture(direct, (x,)).program)
    for got, want in zip(cuvil.compile(direct, cache=False)(x), direct(x)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    decomposed = capture(through_indices, (x,)).program.graph.nodes
    assert torch.ops.aten.max_pool2d_with_indices.default in {n.target for n in decomposed}
    torch.testing.assert_close(cuvil.compile(through_indices, cache=False)(x), through_indices(x), rtol=0, atol=0)


def test_baddbmm_stack_and_numpy_t_import_directly():
    """BLOOM's `baddbmm` (ALiBi added to the scores), GPT-J's `torch.stack` and Falcon's `x.T`
    import without `run_decompositions`; with beta = 0, addmm and baddbmm do not read the bias, so
    its NaN does not reach the result (as in eager)."""
    from cuvil.frontend.export import capture, needs_decomposition

    def f(bias, a, b):
        return (torch.baddbmm(bias, a, b, beta=0.5, alpha=0.25), torch.baddbmm(bias.nan_to_num(), a, b),
                torch.baddbmm(bias * torch.nan, a, b, beta=0), torch.addmm(bias[0] * torch.nan, a[0], b[0], beta=0.0),
                torch.stack([a[0], a[1] * 2], -1), torch.stack([a[0], a[1]]), a.T)

    g = torch.Generator().manual_seed(3)
    xs = torch.randn(2, 3, 4, generator=g), torch.randn(2, 3, 5, generator=g), torch.randn(2, 5, 4, generator=g)
    assert not needs_decomposition(capture(f, xs).program)
    for got, want in zip(cuvil.compile(f, cache=False)(*xs), f(*xs)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


EINSUMS = [("bind,bjnd->bnij", [(2, 5, 3, 4), (2, 6, 3, 4)]),      # Funnel's attention scores
           ("td,dnh->tnh", [(7, 8), (8, 3, 4)]), ("ij->ji", [(3, 4)]), ("ij->i", [(3, 4)]), ("ij,jk", [(3, 4), (4, 5)]),
           ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]), ("i,i->", [(5,), (5,)]), ("i,j->ij", [(3,), (4,)]),
           ("bij,bjk,bkl->bil", [(2, 3, 4), (2, 4, 5), (2, 5, 6)]), ("ijk->", [(2, 3, 4)]),
           ("b i d, b j d -> b i j", [(2, 3, 4), (2, 5, 4)]), ("bij,jk->bik", [(1, 3, 4), (4, 5)]),
           ("aij,bjk->abik", [(2, 3, 4), (3, 4, 5)]), ("bij,bjk->bik", [(1, 3, 4), (2, 4, 5)])]


@pytest.mark.parametrize("equation,shapes", EINSUMS, ids=[e for e, _ in EINSUMS])
def test_einsum_imports_as_batched_products(equation, shapes):
    """Implicit outputs, ellipses, spaces, sums over one operand's letters, outer products, three
    operands and broadcast batch letters, against eager, with no `run_decompositions`."""
    from cuvil.frontend.export import capture, needs_decomposition
    g = torch.Generator().manual_seed(len(equation))
    xs = [torch.randn(s, generator=g) for s in shapes]

    def f(*xs):
        return torch.einsum(equation, *xs)
    assert not needs_decomposition(capture(f, tuple(xs)).program)
    torch.testing.assert_close(cuvil.compile(f, cache=False)(*xs), f(*xs), rtol=0, atol=2e-6)


def test_einsum_with_a_dynamic_length_and_a_diagonal_refused():
    def scores(q, k):
        return torch.einsum("bhqd,bhkd->bhqk", q, k)
    c = cuvil.compile(scores, dynamic=[{2: "q"}, {2: "k"}], cache=False)
    g = torch.Generator().manual_seed(0)
    for n, m in ((5, 7), (9, 3)):
        q, k = torch.randn(1, 2, n, 8, generator=g), torch.randn(1, 2, m, 8, generator=g)
        torch.testing.assert_close(c(q, k), scores(q, k), rtol=0, atol=2e-6)
    assert c.num_variants == 1
    with pytest.raises(CuvilError, match=r"einsum 'ii->i': a subscript repeated within one operand \(a diagonal\)"):
        cuvil.compile(lambda x: torch.einsum("ii->i", x), cache=False)(torch.randn(3, 3))


UNFOLDS = [((2, 3, 9, 11), dict(kernel_size=3)), ((1, 4, 8, 8), dict(kernel_size=(2, 3), stride=2, padding=1)),
           ((1, 2, 10, 12), dict(kernel_size=3, dilation=2, padding=(1, 2), stride=(1, 2))),
           ((3, 7, 7), dict(kernel_size=2)), ((1, 8, 16, 1), dict(kernel_size=(9, 1), padding=(4, 0)))]


@pytest.mark.parametrize("shape,options", UNFOLDS, ids=[str(o) for _, o in UNFOLDS])
def test_unfold_imports_as_window_views(shape, options):
    """F.unfold (aten.im2col; ConvBERT's span convolution): dilation, stride, padding, an unbatched
    image, bit-identical to eager, with no `run_decompositions`."""
    from cuvil.frontend.export import capture, needs_decomposition
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))

    def f(x):
        return F.unfold(x, **options)
    assert not needs_decomposition(capture(f, (x,)).program)
    assert torch.equal(cuvil.compile(f, cache=False)(x), f(x))


def test_a_dynamic_size_used_as_a_tensor_value():
    """`torch.arange(n) + n`, `x * n` with n a dynamic size (Llama's positions after a cache:
    `arange(new) + past_length`): a `cuvil.size` value, one program for every n."""
    def f(x):
        n = x.shape[0]
        return x * n + torch.arange(n).unsqueeze(1) + n

    c = cuvil.compile(f, dynamic=[{0: "n"}], cache=False)
    for n in (3, 7, 12):
        x = torch.randn(n, 5, generator=torch.Generator().manual_seed(n))
        torch.testing.assert_close(c(x), f(x), rtol=0, atol=0)
    assert c.num_variants == 1
    assert "cuvil.size {size = [s0]" in c.report.input_ir


def test_a_max_of_sizes_is_the_argument_the_ranges_decide():
    """torch's sym_max / sym_min (`max(0, n - s)` in MPT's attention bias) become the argument that
    is the larger (smaller) over the symbols' ranges; a Max they do not decide is a clear refusal."""
    import sympy
    import torch.utils._sympy.functions as tfn

    from cuvil.frontend.symbols import SymbolTable
    from cuvil.ir.types import sym
    s = sympy.Symbol("s70", integer=True, positive=True)
    table = SymbolTable()
    table.add(s, "seq", 2, 127)
    s0 = sym("s0")
    assert table.dim(tfn.Max(0, 128 - s)) == 128 - s0
    assert table.dim(tfn.Max(0, 1 - s)) == 0
    assert table.dim(tfn.Min(s, 200)) == s0
    # spans that overlap ([32, 2048] and [64, 4096]) but an order that holds at every size
    assert table.dim(tfn.Min(16 * s + 16, 32 * s + 32)) == 16 * s0 + 16
    assert table.dim(tfn.Max(16 * s + 16, 32 * s + 32)) == 32 * s0 + 32
    with pytest.raises(CuvilError, match=r"max\(0, 100 - s0\) takes the larger or smaller of sizes"):
        table.dim(tfn.Max(0, 100 - s))


@pytest.mark.parametrize("pipeline", ["O0", "O3"])
def test_assignments_into_tensors_made_in_the_model(pipeline):
    """In-place assignments torch.export makes functional: `z.copy_(y)` (aten.copy, y broadcast and
    cast), `a[:, 1:4] = y` (slice_scatter), `b[:, 0] = z` (select_scatter), a strided slice filled
    with a number, a negative index; with a dynamic batch. BEiT's relative position index is built
    so in its forward."""
    import cuvil

    def f(x, y, z):
        c = torch.zeros(x.shape[0], 3, dtype=torch.int64)
        c.copy_(y * 10)
        a = x.clone()
        a[:, 1:4] = y
        b = x.clone()
        b[:, 0] = z
        s = x.clone()
        s[:, ::2] = 0.5
        n = x.clone()
        n[-1] = x[0] * 2
        return c, a * 2, b + 1, s, n

    fast = cuvil.compile(f, pipeline=pipeline, dynamic=[{0: "b"}, {0: "b"}, {0: "b"}])
    for b in (3, 5, 2):
        x, y, z = torch.randn(b, 6), torch.randn(b, 3), torch.randn(b)
        for got, want in zip(fast(x, y, z), f(x, y, z)):
            torch.testing.assert_close(got, want)
    assert fast.num_variants == 1


_I, _J = torch.tensor([0, 2, 4]), torch.tensor([[1, 0, 3], [2, 2, 1]])
INDEXING = {
    "x[:, i]": lambda x: x[:, _I], "x[:, i, j]": lambda x: x[:, _I, _J], "x[j, :, i]": lambda x: x[_J, :, _I],
    "x[..., j]": lambda x: x[..., _J], "x[:, :, i] * 2": lambda x: x[:, :, _I] * 2,
    "x[:, j, :, i]": lambda x: x[:, _J, :, _I],
}


@pytest.mark.parametrize("name", INDEXING)
def test_index_tensors_after_whole_dims(name):
    """torch puts the index tensors' dims where the indexed dims were when those are adjacent
    (x[:, i, j]: [4, 2, 3, 7]), first otherwise (x[:, j, :, i]: [2, 3, 4, 6])."""
    import cuvil
    f = INDEXING[name]
    x = torch.randn(4, 5, 6, 7)
    got, want = cuvil.compile(f)(x), f(x)
    assert got.shape == want.shape and torch.equal(got, want)


def test_a_run_time_check_of_tensor_values_fails_the_call_with_torchs_message():
    # F.one_hot checks its classes with torch._assert_async: the kernel of the model's first output
    # checks them, and a call that breaks them raises as eager does
    import cuvil
    f = lambda x: torch.nn.functional.one_hot(x.argmax(-1), 5).float() * x   # noqa: E731
    x = torch.randn(3, 5)
    torch.testing.assert_close(cuvil.compile(f)(x), f(x))
    g = lambda i: torch.nn.functional.one_hot(i - 1, 4) * 2             # noqa: E731
    compiled = cuvil.compile(g)
    i = torch.tensor([1, 4, 2])
    torch.testing.assert_close(compiled(i), g(i))
    for bad, message in ((torch.tensor([0, 1]), "must be non-negative"), (torch.tensor([5, 1]), "smaller than")):
        with pytest.raises(RuntimeError, match=message):
            g(bad)
        with pytest.raises(CuvilError, match=f"a check of tensor values failed at .*test_frontend.py:.*{message}"):
            compiled(bad)
    torch.testing.assert_close(compiled(i), g(i))


def test_training_mode_is_refused():
    with pytest.raises(CuvilError, match="training mode"):
        import_model(nn.Sequential(nn.Linear(2, 2), nn.Dropout()), (torch.randn(2, 2),))


# ----------------------------------------------------------------------------- string annotations

def scaled_matmul(x: "f32[B,512]", w: "f32[512,10]"):
    return torch.relu(x @ w) * 0.5


def test_annotations_are_hints_and_examples():
    r = import_model(scaled_matmul)
    fn = r.function
    assert [str(a.type) for a in fn.args] == ["tensor<s0x512xf32>", "tensor<512x10xf32>"]
    assert r.symbols["s0"].hint == "B" and r.input_names == ["x", "w"]
    for batch in (1, 6):
        x, w = torch.randn(batch, 512), torch.randn(512, 10)
        torch.testing.assert_close(ir.interpret(r.module, x, w)[0], scaled_matmul(x, w))


def test_annotation_must_agree_with_example():
    with pytest.raises(CuvilError, match=r"parameter 'w' is annotated \"f32\[512,10\]\" but its example has size 11"):
        import_model(scaled_matmul, (torch.randn(4, 512), torch.randn(512, 11)))


class TypeHinted(nn.Module):
    """Under `from __future__ import annotations` every hint is a string, and Hugging Face models
    write `Optional[torch.Tensor]`, `list[int]` and `Unpack[...]`: type hints, not shapes."""
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: "torch.Tensor", mask: "Optional[torch.Tensor]" = None, sizes: "list[int] | None" = None,
                **kwargs: "Unpack[dict]"):
        y = self.fc(x)
        return y if mask is None else y * mask


def test_type_hints_in_strings_are_not_shape_annotations():
    m = TypeHinted().eval()
    x, mask = torch.randn(2, 8), torch.rand(2, 4)
    r = import_model(m, (x, mask))
    torch.testing.assert_close(ir.interpret(r.module, x, mask)[0], m(x, mask))


def mistyped_shape(x: "f31[B,8]"):
    return x * 2


def test_a_mistyped_shape_annotation_is_still_an_error():
    with pytest.raises(CuvilError, match="parameter 'x' of mistyped_shape: unknown dtype 'f31'"):
        import_model(mistyped_shape, (torch.randn(2, 8),))


@pytest.mark.parametrize("text, dtype, dims", [
    ("f32[B,512]", "f32", ("B", 512)),
    (" i64[ batch , seq ] ", "i64", ("batch", "seq")),
    ("bool[4]", "i1", (4,)),
    ("f16[]", "f16", ()),
])
def test_parse_annotation(text, dtype, dims):
    ann = parse_annotation(text)
    assert str(ann.dtype) == dtype and ann.dims == dims


@pytest.mark.parametrize("text, message", [
    ("f32(B,512)", "expected e.g."),
    ("f31[B]", "unknown dtype 'f31'"),
    ("f32[B+1]", r"'B\+1' in 'f32\[B\+1\]' is neither an integer nor a name"),
])
def test_bad_annotations(text, message):
    with pytest.raises(CuvilError, match=message):
        parse_annotation(text)


def test_batch_norm_over_the_batchs_own_statistics():
    # training mode without running statistics (BiT standardises its convolution weights so)
    def normalise(x, w, b):
        return F.batch_norm(x, None, None, w, b, training=True, eps=1e-3) * 2

    x, w, b = torch.randn(4, 3, 5, 6), torch.randn(3), torch.randn(3)
    r = import_model(normalise, (x, w, b))
    assert [op.name for op in r.function.ops][:3] == ["cuvil.mean", "cuvil.var", "cuvil.batch_norm"]
    torch.testing.assert_close(ir.interpret(r.module, x, w, b)[0], normalise(x, w, b))
    torch.testing.assert_close(cuvil.compile(normalise)(x, w, b), normalise(x, w, b))


# ----------------------------------------------------------------------------- source locations

def test_locations_point_at_the_users_line():
    entry = zoo.get("mlp")
    r = import_model(entry.model, entry.example_inputs, entry.dynamic)
    linears = [op for op in r.function.ops if op.name == "cuvil.linear"]
    assert [source_text(op.loc) for op in linears] == [
        "x = torch.relu(self.fc1(x))", "x = torch.relu(self.fc2(x))", "return self.fc3(x)"]
    assert all(op.loc.file.endswith("cuvil/zoo.py") for op in linears)


def test_locations_reach_helper_methods():
    entry = zoo.get("transformer")
    r = import_model(entry.model, entry.example_inputs, entry.dynamic)
    lines = {source_text(op.loc) for op in r.function.ops if op.name == "cuvil.permute" and op.loc}
    assert "return t.view(b, s, self.heads, -1).transpose(1, 2)" in lines     # inside split_heads


def test_user_frame_skips_torch_frames():
    trace = ('File "/home/u/model.py", line 12, in forward\n    y = self.fc(x)\n'
             '  File "/x/site-packages/torch/nn/modules/linear.py", line 134, in forward\n'
             '    return F.linear(input, self.weight, self.bias)')
    frames = frames_from_text(trace)
    assert len(frames) == 2
    found = user_frame(frames)
    assert (found.file, found.line, found.code) == ("/home/u/model.py", 12, "y = self.fc(x)")
    assert str(found) == "/home/u/model.py:12: y = self.fc(x)"


# ----------------------------------------------------------------------------- errors

class UsesDet(nn.Module):
    def forward(self, x):
        y = x * 2
        return torch.linalg.det(y)


class UsesBessel(nn.Module):
    def forward(self, x):
        return torch.special.i0(x)


@pytest.mark.parametrize("model, text", [(UsesDet(), "return torch.linalg.det(y)"),
                                         (UsesBessel(), "return torch.special.i0(x)")])
def test_unsupported_op_names_op_and_source_line(model, text):
    with pytest.raises(CuvilUnsupportedOpError) as info:
        import_model(model, (torch.randn(3, 4, 4),))
    err = info.value
    assert err.op_name.startswith("aten.")
    assert err.source.startswith(f"{__file__}:") and err.source.endswith(text)
    assert f"unsupported op '{err.op_name}'" in str(err)


class DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x


def test_export_failure_is_summarised_with_user_line():
    with pytest.raises(CuvilExportError) as info:
        import_model(DataDependent(), (torch.randn(4),))
    err = info.value
    assert "data-dependent" in err.reason
    assert err.source.endswith("if x.sum() > 0:") and __file__ in err.source
    assert len(str(err).splitlines()) <= 12


class NeedsAtLeastThree(nn.Module):
    def forward(self, x):
        return x[:, :3].reshape(x.shape[0], 3)


def test_constraint_violation_explains_the_fix():
    with pytest.raises(CuvilExportError, match=r"(?s)Constraints violated.*Suggested fixes"):
        import_model(NeedsAtLeastThree(), (torch.randn(4, 8),), dynamic=[{1: "n"}], ranges={"n": (1, 64)})


def test_float64_is_reported_not_crashed():
    with pytest.raises(CuvilUnsupportedOpError, match="float64"):
        import_model(lambda x: x + 1, (torch.randn(3, dtype=torch.float64),))


class WithScalarArg(nn.Module):
    def forward(self, x, scale, y):
        return x * scale + y


def test_non_tensor_inputs_are_baked_in_and_skipped():
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    r = import_model(WithScalarArg(), (x, 2.5, y), dynamic=[{0: "batch"}, None, {0: "batch"}])
    assert r.input_names == ["x", "y"] and r.symbols["s0"].hint == "batch"
    x, y = torch.randn(6, 3), torch.randn(6, 3)
    args = r.flatten_inputs(x, 2.5, y)
    assert len(args) == 2 and args[0] is x and args[1] is y
    torch.testing.assert_close(r.unflatten(ir.interpret(r.module, *args)), x * 2.5 + y)
    with pytest.raises(CuvilError, match="does not match the inputs the model was imported with"):
        r.flatten_inputs(x, y)


class KeywordInputs(nn.Module):
    def forward(self, input_ids, attention_mask=None, scale=None):
        return input_ids.float() * attention_mask


def test_keyword_example_inputs():
    ids, mask = torch.randint(0, 9, (2, 5)), torch.rand(2, 5)
    r = import_model(KeywordInputs(), {"attention_mask": mask, "input_ids": ids},
                     dynamic={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}})
    assert sorted(r.input_names) == ["attention_mask", "input_ids"]
    assert {s.hint for s in r.symbols.values()} == {"batch", "seq"}
    ids, mask = torch.randint(0, 9, (3, 7)), torch.rand(3, 7)
    args = r.flatten_inputs(input_ids=ids, attention_mask=mask)
    torch.testing.assert_close(r.unflatten(ir.interpret(r.module, *args)), ids.float() * mask)


def test_zoo_is_deterministic_and_leaves_the_rng_alone():
    torch.manual_seed(7)
    before = torch.rand(3)
    torch.manual_seed(7)
    a, b = zoo.get("cnn"), zoo.get("cnn")
    assert torch.equal(torch.rand(3), before)
    for (name, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(x, y), name
    assert torch.equal(a.example_inputs[0], b.example_inputs[0])
    assert a.inputs(batch=5)[0].shape == (5, 3, 32, 32)
    with pytest.raises(ValueError, match="no dimension"):
        a.inputs(seq=4)
    with pytest.raises(KeyError, match="available"):
        zoo.get("resnet9000")


def test_a_negated_size_as_a_slice_bound():
    # XLNet's -qlen: operator.neg on a size was refused; as a slice bound it counts from the end
    def f(x):
        k = -(x.shape[0] // 2)
        return x[k:] * 2 + x[:k].sum()
    c = cuvil.compile(f, dynamic={"x": {0: "n"}})
    for n in (6, 9, 4):
        x = torch.randn(n, 3)
        torch.testing.assert_close(c(x), f(x))


def test_torch_cond_and_a_range_that_excludes_the_call_are_refused_by_name_and_place():
    def branches(x):
        return torch.cond(x.sum() > 0, lambda x: x + 1, lambda x: x - 1, (x,))
    with pytest.raises(cuvil.CuvilError, match=r"unsupported op 'torch.cond': control flow as a higher-order op"
                                               r"(.|\n)*test_frontend.py:\d+: return torch.cond"):
        cuvil.compile(branches, cache=False)(torch.randn(3))
    with pytest.raises(cuvil.CuvilError, match=r"input 'x' dim 0 \(b\) is 4, outside the range \[8, 16\] that "
                                               r"ranges= declares for b"):
        cuvil.compile(lambda x: x * 2, dynamic={"x": {0: "b"}}, ranges={"b": (8, 16)}, cache=False)(torch.randn(4, 3))


def test_a_refused_export_prints_nothing_of_torch_s_own(capfd):
    # torch logs a meta kernel's traceback for a shape error and prints the partial graph of a
    # data-dependent size to stderr; Cuvil's error says why and where
    with pytest.raises(cuvil.CuvilError, match="must have same reduction dim"):
        cuvil.compile(lambda a, b: a @ b, cache=False)(torch.randn(3, 4), torch.randn(5, 6))
    with pytest.raises(cuvil.CuvilError, match="tensor values"):
        cuvil.compile(lambda x: torch.ones(int((x > 0).sum())), cache=False)(torch.randn(10))
    err = capfd.readouterr().err
    assert "failed while attempting to run meta" not in err and "def forward" not in err, err
