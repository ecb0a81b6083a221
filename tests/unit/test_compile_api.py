"""`cuvil.compile`: the decorator forms, options, dynamic dims from annotations, guards and
recompiles, outputs that alias inputs or weights, unsupported ops, eager fallback, threads, and the
report's native sections."""
import operator
import re
import threading
import warnings

import pytest
import torch
import torch.nn as nn

import cuvil
from cuvil.compiled import CompiledModel
from cuvil.runtime import get_num_threads, set_num_threads


@pytest.fixture(scope="module", autouse=True)
def _private_cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUVIL_CACHE_DIR", str(tmp_path_factory.mktemp("cuvil-cache")))
        yield


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


# ----------------------------------------------------------------------------- forms and options

def test_bare_decorator_with_annotations_compiles_once_for_every_batch():
    @cuvil.compile
    def f(x: "f32[B,16]", y: "f32[B,16]"):
        return torch.tanh(x) * y + 1

    assert isinstance(f, CompiledModel) and f.__name__ == "f"
    for b in (1, 5, 2):        # B=1 first: the capture sees it grown to 2, the range still starts at 1
        x, y = torch.randn(b, 16), torch.randn(b, 16)
        torch.testing.assert_close(f(x, y), torch.tanh(x) * y + 1)
    assert f.num_variants == 1 and f.explain_recompiles() == []
    assert "tensor<s0x16xf32>" in f.report.input_ir          # B became the symbol s0
    assert "s0 = [1, " in f.report.input_ir


def test_decorator_with_options_and_fusion_switch():
    def g(x):
        return torch.sigmoid(x * 3 - 1).sum(-1)

    fused = cuvil.compile(backend="llvm", enable_fusion=True)(g)
    unfused = cuvil.compile(backend="llvm", enable_fusion=False)(g)
    x = torch.randn(6, 10)
    torch.testing.assert_close(fused(x), g(x))
    torch.testing.assert_close(unfused(x), g(x))
    assert len(fused.report.kernels) == 1                  # mul, sub, sigmoid, sum in one kernel
    assert len(unfused.report.kernels) == 4


def test_unknown_option_is_a_clear_error():
    with pytest.raises(cuvil.CuvilError, match=r"unknown option 'enable_fusoin' \(did you mean 'enable_fusion'\?\)"):
        cuvil.compile(enable_fusoin=True)
    with pytest.raises(cuvil.CuvilError, match="unknown backend 'cuda'; available: llvm"):
        cuvil.compile(Net(), backend="cuda")
    with pytest.raises(cuvil.CuvilError, match="fallback must be one of"):
        cuvil.compile(Net(), fallback="maybe")
    with pytest.raises(cuvil.CuvilPipelineError, match="no-such-pass"):
        cuvil.compile(Net(), pipeline="canonicalize,no-such-pass")
    with pytest.raises(cuvil.CuvilError, match="takes a function or an nn.Module"):
        cuvil.compile(42)


def test_module_keeps_its_output_structure():
    class Two(nn.Module):
        def forward(self, x):
            return {"double": x * 2, "pair": (x + 1, x.sum(0))}

    m = cuvil.compile(Two())
    x = torch.randn(3, 5)
    out = m(x)
    assert set(out) == {"double", "pair"} and isinstance(out["pair"], tuple)
    torch.testing.assert_close(out["double"], x * 2)
    torch.testing.assert_close(out["pair"][0], x + 1)
    torch.testing.assert_close(out["pair"][1], x.sum(0))


def test_keyword_arguments():
    net = Net().eval()
    m = cuvil.compile(net, dynamic={"x": {0: "batch"}})
    x = torch.randn(3, 16)
    with torch.no_grad():
        torch.testing.assert_close(m(x=x), net(x))
        torch.testing.assert_close(m(x), net(x))            # the same call, positionally: the same variant
        y = torch.randn(7, 16)
        torch.testing.assert_close(m(x=y), net(y))
    assert m.num_variants == 1
    with pytest.raises(cuvil.CuvilError, match="does not match Net's signature"):
        m(x, x=x)


def test_a_tensor_passed_twice_compiles_two_inputs():
    # torch.export takes f(x, x) as one input read twice: a later call with two tensors must not
    # get the first tensor's answer (nor may the compiled-model cache keep such a program)
    x = torch.randn(3)
    sub = cuvil.compile(lambda a, b: a - b, cache=False)
    torch.testing.assert_close(sub(x, x), torch.zeros(3))
    torch.testing.assert_close(sub(torch.ones(3), torch.zeros(3)), torch.ones(3))
    nested = cuvil.compile(lambda a, pair: a - pair[0] * pair[1], cache=False)
    torch.testing.assert_close(nested(x, [x, x]), x - x * x)
    torch.testing.assert_close(nested(x, [torch.ones(3), torch.zeros(3)]), x)
    assert sub.num_variants == 1 and nested.num_variants == 1


def test_a_call_of_a_kept_import_s_key_that_its_program_does_not_take_is_exported_again():
    # the caches' key names dynamic dims, not their sizes: a broadcast size of 1, or a size that is
    # not the multiple of 3 a branch of the kept program needs, must not get that program
    add = cuvil.compile(lambda a, b: a + b)
    for shapes in (((4, 5), (4, 5)), ((6, 5), (6, 5)), ((6, 5), (1, 5)), ((7, 5), (5,))):
        a, b = torch.randn(shapes[0]), torch.randn(shapes[1])
        torch.testing.assert_close(add(a, b), a + b)

    def branchy(a):
        return a * 2 if a.shape[0] % 3 == 0 else a - 1
    first, second = cuvil.compile(branchy), cuvil.compile(branchy)
    for n in (3, 6):
        first(torch.randn(n, 2))
    for n in (4, 5, 10, 9):
        x = torch.randn(n, 2)
        torch.testing.assert_close(second(x), branchy(x))


def test_python_builtins_and_torchscript():
    x = torch.randn(3)
    for fn, args, want in [(operator.add, (x, x), x + x), (operator.mul, (x, 2.0), x * 2), (abs, (x,), x.abs())]:
        torch.testing.assert_close(cuvil.compile(fn, cache=False)(*args), want)   # positional-only parameters
    for scripted in (torch.jit.trace(nn.Linear(3, 2), x[None]), torch.jit.script(nn.Linear(3, 2))):
        with pytest.raises(cuvil.CuvilError, match="not a TorchScript"):
            cuvil.compile(scripted)


def test_builtins_and_star_args():
    # Python cannot read the signature of a builtin such as torch.tanh: it is called positionally
    x = torch.randn(4, 8)
    tanh = cuvil.compile(torch.tanh)
    torch.testing.assert_close(tanh(x), torch.tanh(x))
    add = cuvil.compile(torch.add)
    torch.testing.assert_close(add(x, x), x + x)
    with pytest.raises(cuvil.CuvilError, match="does not match add's signature: got an unexpected keyword"):
        add(x, x, alpha=2)
    # *args with keywords has no one form that names every argument
    clamp = cuvil.compile(lambda *a, **k: torch.clamp(*a, **k))
    torch.testing.assert_close(clamp(x, torch.tensor(0.1)), torch.clamp(x, torch.tensor(0.1)))
    with pytest.raises(cuvil.CuvilError, match=r"keywords and arguments that land in \*a"):
        clamp(x, min=torch.tensor(0.1))


def test_a_keyword_after_a_skipped_parameter_and_a_flag():
    # Hugging Face style: forward(input_ids, attention_mask=None, ..., use_cache=None), called with
    # the ids and a flag by name; the flag is a constant of the variant
    class Flagged(nn.Module):
        def forward(self, x, mask=None, scale=None, double=False):
            y = x * 2 if double else x + 1
            return y if mask is None else y * mask

    m = cuvil.compile(Flagged())
    x, mask = torch.randn(3, 4), torch.rand(3, 4)
    torch.testing.assert_close(m(x, double=True), x * 2)
    torch.testing.assert_close(m(x=x, double=True), x * 2)          # the same call, by name
    assert m.num_variants == 1
    torch.testing.assert_close(m(x, double=False), x + 1)          # another flag: another variant
    torch.testing.assert_close(m(x, mask=mask, double=True), x * 2 * mask)
    assert m.num_variants == 3


def test_keywords_that_land_in_var_keyword_parameters():
    # Hugging Face's forward(input_ids, ..., **kwargs): options such as output_hidden_states land in kwargs
    class Options(nn.Module):
        def forward(self, x, mask=None, **kwargs):
            y = x * kwargs.get("scale", 1.0)
            if kwargs.get("shifted", False):
                y = y + 1
            extra = kwargs.get("extra")
            return y if extra is None else (y, y * extra)

    net, m = Options(), cuvil.compile(Options(), dynamic={"x": {0: "batch"}, "extra": {0: "batch"}})
    x, e = torch.randn(3, 4), torch.randn(3, 4)
    torch.testing.assert_close(m(x, scale=2.0), net(x, scale=2.0))
    torch.testing.assert_close(m(x, scale=2.0, shifted=True), net(x, scale=2.0, shifted=True))
    torch.testing.assert_close(m(x, extra=e), net(x, extra=e))
    y = torch.randn(5, 4)
    torch.testing.assert_close(m(y, scale=2.0, shifted=True), net(y, scale=2.0, shifted=True))
    torch.testing.assert_close(m(y, extra=y), net(y, extra=y))
    assert m.num_variants == 3                    # one per set of options; the batch stays dynamic


# ----------------------------------------------------------------------------- outputs that alias

def test_outputs_that_are_inputs_weights_or_repeated_get_their_own_buffers():
    class Alias(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 3))

        def forward(self, x):
            y = x * 2
            return x, self.w, y, y, x.t()

    model = Alias()
    m = cuvil.compile(model)
    x = torch.randn(3, 4)
    outs = m(x)
    with torch.no_grad():
        want = model(x)
    for o, w in zip(outs, want):
        torch.testing.assert_close(o, w)
    # every output is fresh memory: writing one changes neither the input, the weight, nor another output
    ptrs = {o.data_ptr() for o in outs}
    assert len(ptrs) == 5 and x.data_ptr() not in ptrs and model.w.data_ptr() not in ptrs
    outs[2].zero_()
    torch.testing.assert_close(outs[3], x * 2)


@pytest.mark.parametrize("pipeline", ["O0", "O1", "O3"])
def test_a_view_of_a_fused_value_returned_twice(pipeline):
    """(y.t(), y.t()) with y = -x: cse makes it one value returned twice, fused with the negation;
    the second output's copy reads the stored view (it once recomputed the view from y, which the
    fused kernel never stored)."""
    def f(x):
        y = -x
        return y.t(), y.t(), y[1:], y[1:], x.t(), x.t()

    x = torch.randn(4, 5)
    outs = cuvil.compile(f, pipeline=pipeline)(x)
    for o, w in zip(outs, f(x)):
        torch.testing.assert_close(o, w)
    assert len({o.data_ptr() for o in outs}) == 6


def _matmul_by_ones(x):
    return x @ torch.ones(4, 4)


def _linear_by_full(x):
    return torch.nn.functional.linear(x, torch.full((5, 4), 0.5)) + torch.full((5,), 0.25)


def _attention_with_a_constant_mask(x):
    mask = torch.ones(1, 3, 3, dtype=torch.bool).tril()
    return torch.nn.functional.scaled_dot_product_attention(x, x, x, attn_mask=mask)


@pytest.mark.parametrize("pipeline", ["O0", "O1", "O3"])
@pytest.mark.parametrize("fn", [_matmul_by_ones, _linear_by_full, _attention_with_a_constant_mask])
def test_a_library_call_reads_a_constant_tensor_made_in_the_model(fn, pipeline):
    """torch.ones/full/tril in the model are inline constants; a GEMM or attention reads its
    operand from memory, so the constant gets a kernel of its own (lowering once failed with an
    internal error, or looked for a buffer it had not made)."""
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(cuvil.compile(fn, pipeline=pipeline)(x), fn(x))


def test_identity_matrices_and_empty_constants():
    """torch.eye (torch's decomposition builds uint8 aranges, which Cuvil lacks) as a GEMM operand,
    a bool mask and a dynamic size; and constants with no elements, whose strides DLPack leaves
    arbitrary (the engine once refused a [0, 0] constant as not contiguous)."""
    def f(x):
        return x @ torch.eye(4), torch.eye(3, 5, dtype=torch.bool), torch.eye(2, dtype=torch.int64), \
            torch.zeros(0, 0) + 1, torch.eye(x.shape[0]) @ x

    m = cuvil.compile(f, dynamic=[{0: "n"}])
    for n in (4, 6, 3):
        x = torch.randn(n, 4)
        for got, want in zip(m(x), f(x)):
            assert got.dtype == want.dtype and torch.equal(got, want)
    assert m.num_variants == 1


@pytest.mark.parametrize("enable_fusion", [True, False])
def test_a_round_trip_through_a_half_type_rounds(enable_fusion):
    """x.to(bf16).float() inside a kernel rounds to bf16 (it once came back unchanged when fused,
    and precision="bf16" then differed from autocast)."""
    def f(x):
        return (x * 1.5).to(torch.bfloat16).float() + 1, ((x * 1.5).half() + 1).float()

    x = torch.randn(1000) * 10
    for got, want in zip(cuvil.compile(f, enable_fusion=enable_fusion)(x), f(x)):
        assert torch.equal(got, want)


# ----------------------------------------------------------------------------- guards and recompiles

def test_recompile_on_dtype_change_says_why():
    h = cuvil.compile(lambda x: x * 2 + 1)
    a, b = torch.randn(3, 4), torch.arange(12).reshape(3, 4)
    torch.testing.assert_close(h(a), a * 2 + 1)
    torch.testing.assert_close(h(b), b * 2 + 1)
    torch.testing.assert_close(h(a), a * 2 + 1)            # the first variant still serves f32
    assert h.num_variants == 2
    [why] = h.explain_recompiles()
    assert "input 0 (x) has dtype torch.int64, compiled for torch.float32" in why


def test_after_max_recompiles_new_calls_run_eagerly():
    h = cuvil.compile(lambda x: x * 3, max_recompiles=1)
    a, b, c = torch.randn(4), torch.arange(4), torch.arange(4, dtype=torch.int32)
    torch.testing.assert_close(h(a), a * 3)
    torch.testing.assert_close(h(b), b * 3)
    with pytest.warns(UserWarning, match="max_recompiles=1 reached"):
        torch.testing.assert_close(h(c), c * 3)
    assert h.num_variants == 2
    assert "max_recompiles=1 reached" in h.explain_recompiles()[-1]
    assert "input 0 (x) has dtype torch.int32" in h.explain_recompiles()[-1]
    torch.testing.assert_close(h(a), a * 3)              # compiled variants keep serving their calls


def test_recompile_outside_the_range_widens_it():
    net = Net().eval()
    m = cuvil.compile(net, dynamic={"x": {0: "batch"}}, ranges={"batch": (1, 4)})
    for b in (2, 4, 9, 6):
        x = torch.randn(b, 16)
        with torch.no_grad():
            torch.testing.assert_close(m(x), net(x))
    assert m.num_variants == 2                             # 6 is inside the widened range
    [why] = m.explain_recompiles()
    assert "input 0 (x) dim 0 is 9: batch (s0) is outside its compiled range [1, 4]" in why
    assert "range of batch widened to [1, 9]" in why


def test_static_dim_change_makes_the_dim_dynamic():
    g = cuvil.compile(lambda x: x.sum(0))
    for n in (3, 4, 5, 8):
        x = torch.randn(n, 7)
        torch.testing.assert_close(g(x), x.sum(0))
    assert g.num_variants == 2
    [why] = g.explain_recompiles()
    assert "input 0 (x) dim 0 is 4, compiled for 3 (a static dim)" in why and "x dim 0 made dynamic" in why


def test_dynamic_true_makes_every_dim_dynamic_that_torch_export_can_keep():
    """dynamic=True, as in torch.compile: the batch dim is dynamic, the linear's input features
    (tied to its weight) are fixed; a later batch of 1 widens the batch's range in one recompile."""
    net = Net().eval()
    m = cuvil.compile(net, dynamic=True)
    for b in (3, 17, 1, 40):
        x = torch.randn(b, 16)
        with torch.no_grad():
            torch.testing.assert_close(m(x), net(x))
    assert m.num_variants == 2
    [why] = m.explain_recompiles()
    assert "input 0 (x) dim 0 is 1" in why and "range of x_dim0 widened to [1, " in why
    assert "tensor<s0x16xf32>" in m.report.input_ir and "s0 = [1, " in m.report.input_ir
    g = cuvil.compile(lambda x: torch.tanh(x) * 2, dynamic=True)
    for shape in ((3, 7), (5, 2), (9, 33)):
        x = torch.randn(*shape)
        torch.testing.assert_close(g(x), torch.tanh(x) * 2)
    assert g.num_variants == 1 and "tensor<s0xs1xf32>" in g.report.input_ir
    # cuvil.explain and cuvil.import_model (the explorer's paths) take it too
    assert "%x: tensor<s0x16xf32>" in cuvil.explain(net, torch.randn(3, 16), dynamic=True).input_ir


def test_a_slice_past_a_dynamic_dim_specialises_its_range_and_recompiles_at_the_boundary():
    """x[:, 1:18] with a dynamic width: torch.export keeps the width dynamic below 18 (range [2, 17],
    the slice clamped to it; the import once failed there), and a width past 17 is another program
    (17 columns, whatever the width): the recompile takes the range torch suggests, [18, ...],
    instead of failing on a range across the boundary."""
    def f(x):
        return x[:, 1:18] * 2, x[:, :100]

    m = cuvil.compile(f, dynamic=True)
    for n in (9, 30, 12, 17, 18, 40):
        x = torch.randn(2, n)
        for got, want in zip(m(x), f(x)):
            torch.testing.assert_close(got, want)
    assert m.num_variants == 3
    second, third = m.explain_recompiles()
    assert "range of x_dim1 set to [18, 30], the one torch.export suggests" in second
    assert "range of x_dim1 widened to [18, 40]" in third
    # a slice that is empty at every size of the range torch settles on (start s1 - 3 past 18)
    g = cuvil.compile(lambda x: x[:, -3:18:3] + 1, dynamic=True)
    for n in (9, 30, 25):
        x = torch.randn(2, n)
        torch.testing.assert_close(g(x), x[:, -3:18:3] + 1)
    assert g.num_variants == 2


class Positions(torch.nn.Module):
    """Learned positions: a sequence is at most 32 long, as BERT's positions end at 512."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(32, 8)
        self.register_buffer("ids", torch.arange(32))

    def forward(self, x):
        return x + self.table(self.ids[:x.shape[1]])


def test_a_dynamic_dim_without_a_range_takes_the_range_the_model_allows():
    """A dim declared without a range asks for DEFAULT_RANGE; where the model allows less, the
    range torch.export suggests is taken (it holds the example's size). A range the user declared
    stays theirs: too wide, it is a clear error that suggests the right one."""
    model = Positions().eval()
    m = cuvil.compile(model, dynamic=[{1: "seq"}])
    with torch.no_grad():
        for n in (5, 20, 32):
            x = torch.randn(2, n, 8)
            torch.testing.assert_close(m(x), model(x))
    assert m.num_variants == 1 and "s0 = [" in m.report.input_ir and ", 32]" in m.report.input_ir
    wide = cuvil.compile(model, dynamic=[{1: "seq"}], ranges={"seq": (1, 64)})
    with pytest.raises(cuvil.CuvilError, match=r"ranges=\{\"seq\": \(1, 32\)\}"):
        wide(torch.randn(2, 5, 8))


def test_a_dim_without_a_range_is_exported_once_where_the_model_allows_less(monkeypatch):
    """Such a dim is asked of torch.export as `Dim.DYNAMIC`, which settles the range the model
    allows in the same trace (asked by name with DEFAULT_RANGE, the export failed and was redone:
    BERT's compile paid two). Dims named alike stay one dim: inputs that torch keeps apart share
    one symbol, and sizes that differ are refused as torch refuses them for a named dim."""
    exports = []
    export = torch.export.export
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: exports.append(1) or export(*a, **k))
    model = Positions().eval()
    m = cuvil.compile(model, dynamic=[{0: "batch", 1: "seq"}], cache=False)
    with torch.no_grad():
        for b, n in ((2, 5), (1, 32), (3, 1)):
            x = torch.randn(b, n, 8)
            torch.testing.assert_close(m(x), model(x))
    assert len(exports) == 1 and m.num_variants == 1
    assert "symbols = {s0 = [1, 4096], s1 = [1, 32]}" in m.report.input_ir

    def f(x, y):
        return x * 2, y + 1
    g = cuvil.compile(f, dynamic={"x": {0: "batch"}, "y": {0: "batch"}}, cache=False)
    x, y = torch.randn(3, 4), torch.randn(3, 5)
    for got, want in zip(g(x, y), f(x, y)):
        torch.testing.assert_close(got, want)
    assert "(%x: tensor<s0x4xf32>, %y: tensor<s0x5xf32>)" in g.report.input_ir
    with pytest.raises(cuvil.CuvilError, match=r"size\(\)\[0\] = 2 is not equal to"):
        g(torch.randn(3, 4), torch.randn(2, 5))


def test_dynamic_true_compiles_static_where_the_dims_cannot_stay_dynamic():
    """A strided conv's output width feeds a linear: torch.export keeps the input width dynamic
    under a guard ((W - 3)//2 + 1 == 4) that leaves its range wide, and Cuvil cannot prove the
    width the linear needs (the reshape that flattens it, since Cuvil decides torch's guards too;
    before, the linear's in-features); dynamic=True then compiles this size static and says so (it
    once failed)."""
    wc, wl = torch.randn(4, 1, 3, 3), torch.randn(1, 4)

    def f(x):
        return torch.nn.functional.linear(torch.nn.functional.conv2d(x, wc, stride=2, groups=4), wl)

    m = cuvil.compile(f, dynamic=True)
    for shape in ((2, 4, 7, 9), (3, 4, 7, 10), (2, 4, 7, 9)):
        x = torch.randn(*shape)
        torch.testing.assert_close(m(x), f(x))
    assert m.num_variants == 2
    first, second = m.explain_recompiles()
    assert first.startswith("variant 1 compiled static: dynamic=True could not keep its dims dynamic")
    assert "cannot reshape" in first and "compiled static" in second


def test_a_second_size_that_cuvil_cannot_keep_dynamic_compiles_static():
    """Antialiased resizing of a dynamic size is outside what Cuvil lowers: at a second size the
    automatic dynamic dims go back to static for the new variant (the call once raised)."""
    def f(x):
        return torch.nn.functional.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True)

    m = cuvil.compile(f)
    for shape in ((1, 2, 5, 7), (2, 2, 6, 3), (1, 2, 5, 7)):
        x = torch.randn(*shape)
        torch.testing.assert_close(m(x), f(x))
    assert m.num_variants == 2
    [why] = m.explain_recompiles()
    assert "compiled static (the dims could not stay dynamic: unsupported op" in why


def test_dynamic_true_through_einsum_with_batch_dims():
    """einsum over `...` batch dims flattens them into one (a product of symbols, whose bounds once
    recursed forever)."""
    def f(x):
        return torch.einsum("...ij,...kj->...ik", x, x)

    m = cuvil.compile(f, dynamic=True)
    for shape in ((3, 7, 9, 7), (2, 5, 4, 7), (4, 3, 9, 7)):
        x = torch.randn(*shape)
        torch.testing.assert_close(m(x), f(x))


def test_dynamic_false_compiles_every_new_size_static():
    g = cuvil.compile(lambda x: x.sum(0), dynamic=False)
    for n in (3, 4, 5):
        x = torch.randn(n, 7)
        torch.testing.assert_close(g(x), x.sum(0))
    assert g.num_variants == 3 and "tensor<5x7xf32>" in g.report.input_ir
    assert all("(a static dim)" in why and "made dynamic" not in why for why in g.explain_recompiles())


@pytest.mark.parametrize("dynamic, says", [("yes", "not 'yes'"), (3, "not 3"), ({"x": [0]}, "the entry for 'x' is [0]"),
                                           ([{0: "b"}, 5], "the entry for 1 is 5")])
def test_a_malformed_dynamic_option_is_a_clear_error(dynamic, says):
    with pytest.raises(cuvil.CuvilError, match=r"dynamic must be True .*; " + re.escape(says)):
        cuvil.compile(Net(), dynamic=dynamic)


def test_non_tensor_arguments_are_compiled_in_and_guarded():
    def scale(x, k: float):
        return x * k

    s = cuvil.compile(scale)
    x = torch.randn(5)
    torch.testing.assert_close(s(x, 2.0), x * 2)
    torch.testing.assert_close(s(x, 3.0), x * 3)
    assert s.num_variants == 2
    assert "non-tensor argument 1 is 3.0, compiled for 2.0" in s.explain_recompiles()[0]


def test_guard_refuses_mismatched_calls():
    net = Net().eval()
    m = cuvil.compile(net, dynamic={"x": {0: "batch"}}, ranges={"batch": (1, 8)})
    m(torch.randn(2, 16))
    guard = m._variants[0].guard
    assert guard.match((torch.randn(3, 16),), {}) is not None
    for bad in (torch.randn(3, 15), torch.randn(3, 16, 1), torch.randn(9, 16), torch.randn(3, 16).half()):
        assert guard.match((bad,), {}) is None
        assert guard.mismatches((bad,), {})
    strided = torch.randn(16, 3).t()           # non-contiguous: accepted, copied before the run
    assert guard.match((strided,), {}) is not None
    with torch.no_grad():
        torch.testing.assert_close(m(strided), net(strided))
    assert m.num_variants == 1


def test_static_fast_path_takes_only_the_calls_the_guard_takes():
    from cuvil.compiled import MISS
    net = Net().eval()
    m = cuvil.compile(net)
    x = torch.randn(2, 16)
    with torch.no_grad():
        expected = net(x)
        torch.testing.assert_close(m(x), expected)
        fast = m._variants[0].fast
        assert fast is not None
        torch.testing.assert_close(fast((x,)), m._variants[0].run([x], []), rtol=0, atol=0)
        # what it leaves to the general path: a copy for a strided input, a subclass, a recompile
        strided = torch.randn(16, 2).t()
        parameter = nn.Parameter(x.clone(), requires_grad=False)
        for call in ((strided,), (parameter,), (x.double(),), (torch.randn(3, 16),), (x, x), ()):
            assert fast(call) is MISS
        torch.testing.assert_close(m(strided), net(strided))
        torch.testing.assert_close(m(parameter), expected)
        assert m.num_variants == 1
        torch.testing.assert_close(m(torch.zeros(3, 16)), net(torch.zeros(3, 16)))
    assert m.num_variants == 2


def _structures(x, y):
    return {"sum": x + y, "pair": (x * y, (x > y).float().sum(-1)), "flags": x > 0, "index": x.argmax(-1)}


@pytest.mark.parametrize("fn, kind", [(lambda x, y: torch.tanh(x) * y, "one tensor"),
                                      (lambda x, y: (x - y, x.sum(0)), "a flat tuple"),
                                      (_structures, "a nested structure")])
def test_the_native_fast_path_returns_every_output_structure_as_eager_does(fn, kind):
    x, y = torch.randn(5, 7), torch.randn(5, 7)
    m = cuvil.compile(fn)
    out = m(x, y)
    fast = m._variants[0].fast
    assert type(fast).__name__ == "TensorCall", kind
    for got in (out, fast((x, y)), m(x, y)):
        expected = fn(x, y)
        assert torch.utils._pytree.tree_structure(got) == torch.utils._pytree.tree_structure(expected)
        for g, e in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(expected)):
            assert g.dtype == e.dtype and g.shape == e.shape and g.is_contiguous()
            torch.testing.assert_close(g, e)
    a, b = fast((x, y)), fast((x, y))      # fresh outputs every call
    assert all(p.data_ptr() != q.data_ptr() for p, q in zip(torch.utils._pytree.tree_leaves(a),
                                                             torch.utils._pytree.tree_leaves(b)))


def test_the_native_fast_path_binds_dynamic_sizes_as_the_guard_does():
    from cuvil.compiled import MISS
    torch.manual_seed(0)
    m = cuvil.compile(lambda x, y: (x * y).sum(-1, keepdim=True) + x[:, :1], dynamic=[{0: "B", 1: "S"}, {0: "B", 1: "S"}],
                      ranges={"B": (1, 16), "S": (2, 32)})
    fast = None
    for b, s in ((3, 4), (16, 32), (1, 2), (7, 9)):
        x, y = torch.randn(b, s), torch.randn(b, s)
        out = m(x, y)
        fast = m._variants[0].fast
        torch.testing.assert_close(out, (x * y).sum(-1, keepdim=True) + x[:, :1])
        torch.testing.assert_close(fast((x, y)), out, rtol=0, atol=0)
    assert m.num_variants == 1 and type(fast).__name__ == "TensorCall"
    guard = m._variants[0].guard
    calls = [(torch.randn(17, 4), torch.randn(17, 4)),     # B above its range
             (torch.randn(3, 1), torch.randn(3, 1)),       # S below
             (torch.randn(3, 4), torch.randn(4, 4)),       # B bound to 3 by x, 4 by y
             (torch.randn(3, 4), torch.randn(3, 5)),       # S likewise
             (torch.randn(3, 4, 1), torch.randn(3, 4)),    # rank
             (torch.randn(3, 4).double(), torch.randn(3, 4))]
    for call in calls:
        assert guard.match(call, {}) is None
        assert fast(call) is MISS
    assert fast((torch.randn(5, 6), torch.randn(5, 6))) is not MISS


def test_the_native_fast_path_refuses_what_is_not_a_plain_cpu_tensor():
    from cuvil.compiled import MISS
    m = cuvil.compile(lambda x: x * 2)
    x = torch.randn(4, 4)
    m(x)
    fast = m._variants[0].fast
    for bad in (x.to_sparse(), torch.empty(4, 4, device="meta"), x.numpy(), [x], None, x[:, :2].contiguous(),
                x.to(torch.float64), x.t()):
        assert fast((bad,)) is MISS, repr(type(bad))
    torch.testing.assert_close(m(x.t()), x.t() * 2)
    with pytest.raises(cuvil.CuvilError):
        m(torch.empty(4, 4, device="meta"))


# ----------------------------------------------------------------------------- unsupported ops

def _mode(x):
    return torch.mode(x, dim=1).values * 2


def test_unsupported_op_is_a_clear_error():
    f = cuvil.compile(_mode)
    with pytest.raises(cuvil.CuvilUnsupportedOpError, match="unsupported op 'aten.mode.default'") as info:
        f(torch.randn(4, 6))
    assert "test_compile_api.py" in str(info.value)        # the user's source line


def test_eager_fallback_runs_the_model_and_says_why():
    f = cuvil.compile(_mode, fallback="eager")
    x = torch.randn(4, 6)
    with pytest.warns(UserWarning, match="runs in eager PyTorch.*aten.mode.default"):
        out = f(x)
    torch.testing.assert_close(out, _mode(x))
    assert "aten.mode.default" in f.fallback_reason
    [phase] = [p for p in f.report.phases if p["name"] == "fallback"]
    assert phase["fallback"] == "eager" and "aten.mode.default" in phase["reason"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")                     # later calls: eager, silently
        torch.testing.assert_close(f(x + 1), _mode(x + 1))


# ----------------------------------------------------------------------------- threads

def test_two_threads_give_bit_identical_results():
    net = Net().eval()
    m = cuvil.compile(net, dynamic={"x": {0: "batch"}})
    inputs = [torch.randn(b, 16) for b in (1, 7, 33, 64)]
    single = [m(x) for x in inputs]
    results, errors = {}, []

    def work(t):
        try:
            results[t] = [[m(x) for x in inputs] for _ in range(20)]
        except Exception as e:   # reported below: an exception in a thread would otherwise vanish
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for runs in results.values():
        for run in runs:
            for got, want in zip(run, single):
                assert torch.equal(got, want)


def test_threads_option_and_setter():
    before = get_num_threads()
    try:
        m = cuvil.compile(Net().eval(), threads=1)
        assert get_num_threads() == 1 and m.threads == 1
        m.threads = 2
        assert get_num_threads() == 2
        for bad in (0, 5000, True, 2.0):
            with pytest.raises(cuvil.CuvilError, match=r"threads must be an int from 1 to 1024"):
                cuvil.compile(Net(), threads=bad)
        with pytest.raises(cuvil.CuvilError, match=r"threads must be an int from 1 to 1024, not 5000"):
            m.threads = 5000
    finally:
        set_num_threads(before)


# ----------------------------------------------------------------------------- the report

def test_report_has_kernels_schedule_memory_and_phases():
    net = Net().eval()
    m = cuvil.compile(net, dynamic={"x": {0: "batch"}})
    m(torch.randn(5, 16))
    r = m.report
    names = [p["name"] for p in r.phases]
    for phase in ("import", "passes", "lowering", "program", "engine"):
        assert phase in names
    assert len(r.kernels) == 2 and len(r.schedule) == 2
    k = r.kernels[0]
    assert [op["name"] for op in k["ops"]] == ["cuvil.linear", "cuvil.relu"]
    assert any("test_compile_api.py" in s for s in k["sources"])
    assert k["kernel_ir"].startswith("kernel @") and "define" in k["llvm_ir"] and k["asm"]
    assert r.schedule[1]["deps"] == [0]
    mem = r.memory
    assert mem["sizes"] == {"s0": 5}
    [buf] = mem["buffers"]                   # the hidden activation: batch x 32 floats at batch 5
    assert buf["size"] == 5 * 32 * 4 and buf["first_step"] == 0 and buf["last_step"] == 1
    assert mem["arena_bytes"] >= buf["size"] and mem["naive_bytes"] >= mem["arena_bytes"]
    r.dumps()                                # plain JSON


def test_profile_records_every_step():
    m = cuvil.compile(Net().eval())
    x = torch.randn(3, 16)
    out, timings = m.profile(x)
    torch.testing.assert_close(out, m(x))
    assert {t.step for t in timings} == {0, 1} and all(t.end_ns >= t.start_ns for t in timings)
    assert len(m.report.profile["run"]) == len(timings)


def test_profiled_steps_carry_their_own_kernel_names():
    torch.manual_seed(0)
    twins = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU()).eval()
    m = cuvil.compile(twins, dynamic={"input": {0: "batch"}})
    x = torch.randn(3, 16)
    out, timings = m.profile(x)
    torch.testing.assert_close(out, twins(x))
    schedule = m.report.schedule
    assert schedule[1]["code_of"] == schedule[0]["kernel"]        # the second layer runs the first's code
    assert [t.kernel for t in sorted(timings, key=lambda t: t.step)] == [st["kernel"] for st in schedule]
    assert m.imported.function.name == "Sequential" and m.imported.tensor_positions == [0]


@pytest.mark.parametrize("arch, vector_insn", [("aarch64", r"fcmlt\s+v\d+\.4s"), ("riscv64", r"vmflt\.v")])
def test_cross_target_compiles_code_to_read_not_run(arch, vector_insn):
    m = cuvil.compile(Net().eval(), target=arch)
    x = torch.randn(3, 16)
    m.compile_for(x)
    report = m.report
    assert len(report.kernels) == 2 and report.memory["arena_bytes"] > 0
    asm = "".join(k["asm"] for k in report.kernels)
    assert re.search(vector_insn, asm), asm          # the relu epilogue, vectorised for that machine
    with pytest.raises(cuvil.CuvilError, match=f"compiled for {arch}.*cannot run on this machine"):
        m(x)
    with pytest.raises(cuvil.CuvilError, match="unknown target 'sparc'"):
        cuvil.compile(Net(), target="sparc")


def test_explain_native_sections():
    net = Net().eval()
    report = cuvil.explain(net, torch.randn(3, 16), dynamic={"x": {0: "batch"}})
    assert len(report.kernels) == 2 and report.schedule and report.memory["buffers"]
    assert report.memory["sizes"] == {"s0": 3}
    assert [g["kernel"] for g in report.fusion["groups"]] == [k["name"] for k in report.kernels]
    plain = cuvil.explain(net, torch.randn(3, 16), native=False)
    assert plain.kernels == [] and plain.schedule == []


def test_explain_records_why_native_compilation_failed():
    text = """
cuvil.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  %w = cuvil.const @w : tensor<4xf32>
  %0 = cuvil.add %x, %w : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  cuvil.return %0 : tensor<4xf32>
}
"""
    report = cuvil.explain(text)
    assert report.kernels == []
    [native] = [p for p in report.phases if p["name"] == "native"]
    assert "constant @w has no data" in native["error"]


def test_compiles_and_runs_under_inference_mode():
    """Constants folded under torch.inference_mode are inference tensors (no version counter)."""
    class Folds(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 4))

        def forward(self, x):
            return x @ (self.w * 2.0)          # weight-only math: canonicalize folds it into a new constant

    model = Folds().eval()
    with torch.inference_mode():
        x = torch.randn(3, 8)
        got = cuvil.compile(model)(x)
        expected = model(x)
    torch.testing.assert_close(got, expected)


def test_float_arguments_are_told_apart_by_their_bits():
    # a float argument is a constant of its variant: -0.0 == 0.0 let the variant of -0.0 serve 0.0
    # (1/(x*s) gave -inf for inf), and NaN != NaN left a NaN call unserved by its own variant
    def f(x, s):
        return 1.0 / (x * s)
    x = torch.ones(3)
    c = cuvil.compile(f, cache=False)
    for s in (-0.0, 0.0, -0.0, float("nan"), float("nan")):
        assert torch.equal(c(x, s).isnan(), f(x, s).isnan())
        torch.testing.assert_close(c(x, s), f(x, s), equal_nan=True, rtol=0, atol=0)
    assert c.num_variants == 3


def test_a_tensor_with_torchs_lazy_negation_is_read_as_its_values():
    # a complex conjugate's imaginary part is a view with torch's negation bit: its memory holds
    # the values negated, and the native path once read the memory (2.0 for -2.0)
    s = torch.tensor(1 + 2j).conj().imag
    neg = torch._neg_view(torch.arange(6.0))
    assert s.is_neg() and neg.is_neg()
    c = cuvil.compile(lambda x, s: x * s + 0.0, cache=False)
    x = torch.ones(6)
    for a, b in ((x, s), (neg, s), (x, neg), (x, neg)):     # compiles, then the native fast path
        torch.testing.assert_close(c(a, b), a * b + 0.0, rtol=0, atol=0)


def test_models_compiled_in_several_threads_at_once():
    # torch.export keeps its tracing state in the process: three first calls at once once failed
    # with "ProxyTorchDispatchMode slot already occupied" and other torch internals
    results = {}

    def first_call(j):
        m = torch.nn.Sequential(torch.nn.Linear(16 + j, 32), torch.nn.ReLU()).eval()
        x = torch.randn(3, 16 + j)
        try:
            results[j] = torch.allclose(cuvil.compile(m, cache=False)(x), m(x), atol=1e-5)
        except Exception as e:        # the assertion below names it
            results[j] = e
    threads = [threading.Thread(target=first_call, args=(j,)) for j in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {0: True, 1: True, 2: True}


def test_a_broadcast_input_after_automatic_dynamic_dims_compiles_static():
    # (n, 8) + (n, 8) made dim 0 of both dynamic, one name; a later (4, 8) + (8,) put that name on
    # the vector's 8 and failed ("L['y'].size()[0] = 8 is not equal to L['x'].size()[0] = 4")
    def f(x, y):
        return torch.relu(x) + y * 2
    c = cuvil.compile(f, cache=False)
    for shapes in (((4, 8), (4, 8)), ((5, 8), (5, 8)), ((4, 8), (8,)), ((6, 8), (6, 8))):
        x, y = (torch.randn(*s) for s in shapes)
        torch.testing.assert_close(c(x, y), f(x, y))
    assert "compiled static" in c.explain_recompiles()[1]


def test_an_empty_batch_after_a_full_one():
    # a size 0 after a compile for 4: the capture sees it as 2 and keeps the dim dynamic from 1 or 2,
    # a variant that does not serve 0 ("internal error: a variant compiled for this call does not
    # accept it"), or, for a named dim, a range widened to (0, 4096) that the checks refused
    def f(x, y):
        return torch.relu(x) + y * 2
    for dynamic in (None, {"x": {0: "b"}, "y": {0: "b"}}):
        c = cuvil.compile(f, cache=False, dynamic=dynamic)
        for n in (4, 0, 3):
            x, y = torch.randn(n, 8), torch.randn(n, 8)
            torch.testing.assert_close(c(x, y), f(x, y))


@pytest.mark.parametrize("options,message", [
    ({"dynamic": {"inp": {0: "batch"}}}, r"dynamic= names input\(s\) \['inp'\], which f does not take"),
    ({"dynamic": {"x": {3: "batch"}}}, r"axis 3 of input 'x', which has 1 dims"),
])
def test_a_typo_in_the_dynamic_hints_is_an_error(options, message):
    # each was ignored: the model compiled static, and every new size recompiled
    def f(x):
        return x + 1
    with pytest.raises(cuvil.CuvilError, match=message):
        cuvil.compile(f, cache=False, **options)(torch.ones(2))


def test_inputs_cuvil_cannot_run_are_refused_before_compiling():
    # a meta tensor was compiled for (a whole compile) and then refused as an internal error; a
    # nested tensor raised torch's "NestedTensorImpl doesn't support sizes" from the call path
    def f(x):
        return x * 2 + 1
    c = cuvil.compile(f, cache=False)
    c(torch.randn(4, 8))
    with pytest.raises(cuvil.CuvilError, match="input 0 is a torch.strided tensor on meta; Cuvil runs dense CPU"):
        c(torch.randn(4, 8, device="meta"))
    with pytest.raises(cuvil.CuvilError, match="input 0 is a nested tensor"):
        c(torch.nested.nested_tensor([torch.randn(2, 8), torch.randn(3, 8)]))
    assert c.num_variants == 1
    eager = cuvil.compile(f, cache=False, fallback="eager")
    nested = torch.nested.nested_tensor([torch.randn(2, 8), torch.randn(3, 8)])
    assert eager(nested).is_nested


def test_a_compiled_model_called_inside_another_compile_is_traced_as_its_model():
    # until 2026-12-02 the outer capture ran the inner variant on torch.export's fake tensors and
    # failed with "Cannot access data pointer of Tensor"
    model = Net().eval()
    inner = cuvil.compile(model)
    x = torch.randn(3, 16)
    fresh = cuvil.compile(lambda x: cuvil.compile(model)(x).relu())    # an inner one never called
    inner(x)
    outer = cuvil.compile(lambda x: inner(x).relu() + 1)
    with torch.no_grad():
        torch.testing.assert_close(outer(x), model(x).relu() + 1)
        torch.testing.assert_close(fresh(x), model(x).relu())
        torch.testing.assert_close(inner(x), model(x))


def test_a_range_no_hint_names_is_a_warning_naming_it():
    f = cuvil.compile(lambda x: x * 2, dynamic={"x": {0: "batch"}}, ranges={"btach": (1, 8)})
    with pytest.warns(UserWarning, match=r"ranges= names dim\(s\) \['btach'\], which no dynamic= hint .* \['batch'\]"):
        torch.testing.assert_close(f(torch.ones(3)), torch.full((3,), 2.0))


def test_a_dynamic_dim_the_model_specialises_is_said_not_left_silent():
    # CANINE's character length: torch.export specialises the dim; Cuvil compiled it static without
    # a word, and each other size's recompile said "made dynamic" while it stayed static
    def f(x):
        return x * float(int(x.shape[0]))       # int() of a size: torch specialises it at every size
    c = cuvil.compile(f, dynamic={"x": {0: "n"}}, cache=False)
    with pytest.warns(UserWarning, match=r"dynamic dim 'n' \(x dim 0\) is compiled static"):
        torch.testing.assert_close(c(torch.ones(16)), torch.full((16,), 16.0))
    torch.testing.assert_close(c(torch.ones(12)), torch.full((12,), 12.0))
    assert c.explain_recompiles() == ["recompiled (variant 2): input 0 (x) dim 0 is 12, compiled for 16 (a static "
                                      "dim) -> compiled static again (the model specialises the dim)"]


def test_a_size_the_model_refuses_raises_after_a_specialised_compile():
    # the retry of a failed static compile raised a KeyError from inside Cuvil
    def f(x):
        return x.reshape(4, 4) * 2.0
    c = cuvil.compile(f, dynamic={"x": {0: "n"}}, cache=False)
    with pytest.warns(UserWarning, match="is compiled static"):
        c(torch.randn(16))
    with pytest.raises(cuvil.CuvilError, match=r"invalid for input(.|\n)*test_compile_api.py:\d+"):
        c(torch.randn(12))
