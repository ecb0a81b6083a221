"""Conditions on input sizes that torch.export leaves as `_assert_scalar`: Cuvil decides them over
the ranges at capture (cuvil/frontend/size_conditions.py), and nested floor divisions of sizes
(two strided convolutions) compare equal to torch's single division."""
import pytest
import sympy
import torch
import torch.utils._sympy.functions as tfn
from torch import nn
from torch.export import Dim

import cuvil
from cuvil.frontend import CuvilExportError, import_model
from cuvil.frontend.export import suggested_ranges
from cuvil.frontend.size_conditions import _true_from_lower_bounds
from cuvil.ir.types import floordiv, sym


class PositionalPadding(nn.Module):
    """wav2vec2's positional convolution guards `1 % (n//20 - 1) != 0` on the audio length in
    miniature: a guard torch's solver cannot prove over a range, though it holds for n >= 60."""
    def forward(self, x):
        k = x.shape[1] // 20 - 1
        if 1 % k == 0:
            return x - 1
        return x * 2


def test_torch_alone_rejects_the_range_the_condition_holds_over():
    # the reason for size_conditions.py: without it, this range is refused
    with pytest.raises(Exception, match="Constraints violated"):
        torch.export.export(PositionalPadding(), (torch.randn(2, 100),),
                            dynamic_shapes=({1: Dim("n", min=60, max=4000)},))


def test_a_condition_true_over_the_range_compiles_one_program_for_every_size():
    m = PositionalPadding()
    c = cuvil.compile(m, dynamic=[{1: "n"}], ranges={"n": (60, 4000)})
    for n in (60, 61, 100, 1999, 4000):
        x = torch.randn(2, n)
        assert torch.equal(c(x), m(x))
    assert c.explain_recompiles() == []


def test_a_condition_false_somewhere_in_a_declared_range_names_the_size():
    with pytest.raises(CuvilExportError) as info:
        import_model(PositionalPadding(), (torch.randn(2, 100),), dynamic=[{1: "n"}], ranges={"n": (20, 4000)})
    message = str(info.value)
    assert "fails at n=20 within the range n in [20, 4000]" in message
    assert "Mod(1, n//20 - 1)" in message.replace("((n//20))", "n//20")
    assert info.value.suggested_ranges == {"n": (60, 4000)}


def test_without_a_declared_range_the_widest_range_around_the_example_is_taken():
    r = import_model(PositionalPadding(), (torch.randn(2, 100),), dynamic=[{1: "n"}])
    assert r.function.symbols == {"s0": (60, 4096)}


def test_dynamic_true_decides_a_branch_on_sizes_instead_of_taking_the_examples_at_every_size():
    """With dynamic=True (`Dim.AUTO`) torch.export keeps such a guard only in its ShapeEnv, and the
    program took the example's branch at every size: n = 40 (1 % 1 == 0) got x * 2, not x - 1.
    The guard is decided over the range, which narrows to where the branch holds."""
    m = PositionalPadding()
    c = cuvil.compile(m, dynamic=True, cache=False)
    for n in (100, 40, 4000, 59):
        x = torch.randn(2, n)
        assert torch.equal(c(x), m(x))
    assert c.num_variants == 2
    assert "range of x_dim1 set to [40, 59], the one torch.export suggests" in c.explain_recompiles()[0]
    assert "s1 = [60, 4096]" in c._variants[0].compilation.report.input_ir


class ModThree(nn.Module):
    def forward(self, x):
        torch._check(x.shape[1] % 3 != 1)
        return x * 2


def test_a_checked_condition_is_decided_at_every_size():
    with pytest.raises(CuvilExportError, match=r"requires Ne\(Mod\(n, 3\), 1\), which fails at n=4 "
                                               r"within the range n in \[2, 50\]"):
        import_model(ModThree(), (torch.randn(2, 9),), dynamic=[{1: "n"}], ranges={"n": (2, 50)})
    r = import_model(ModThree(), (torch.randn(2, 9),), dynamic=[{1: "n"}], ranges={"n": (8, 9)})
    assert r.function.symbols == {"s0": (8, 9)}


def test_a_condition_over_ranges_too_wide_to_evaluate_is_proved_from_the_lower_bounds():
    """Hugging Face's mask code with a cache passed in and dynamic new tokens leaves
    `min(16*(p + t), 32*(p + t)) == 16*(p + t)`: over two dims of 4096 sizes each, too many to
    evaluate one by one (tests/differential/test_hf_models.py's decoding loop fails without this).
    Each size is written as its lower bound + a non-negative integer, and sympy decides."""
    p, t = sympy.symbols("s0 s1", integer=True, positive=True)
    wide = [(1, 4096), (1, 4096)]
    assert _true_from_lower_bounds(sympy.Eq(tfn.Min(16 * p + 16 * t, 32 * p + 32 * t), 16 * p + 16 * t), [p, t], wide)
    assert _true_from_lower_bounds(sympy.Eq(tfn.Max(p + t, 2), p + t), [p, t], wide)
    assert not _true_from_lower_bounds(sympy.Eq(tfn.Max(p + t, 3), p + t), [p, t], wide)     # p = t = 1
    assert not _true_from_lower_bounds(sympy.Gt(p + t, 13), [p, t], wide)
    assert _true_from_lower_bounds(sympy.Gt(p + t, 13), [p, t], [(7, 4096), (7, 4096)])


def test_a_range_from_a_violated_guard_where_torch_suggests_a_derived_dim():
    text = ("Constraints violated (n)!\n  - Not all values of n = L['input_values'].size()[1] in the specified "
            "range n <= 4096 satisfy the generated guard 60 <= L['input_values'].size()[1] and "
            "L['input_values'].size()[1] <= 4096\nSuggested fixes:\n  _n = Dim('_n', min=3, max=204)\n  n = 20*_n")
    assert suggested_ranges(Exception(text)) == {"n": (60, 4096), "_n": (3, 204)}


# ----------------------------------------------------------------------------- nested floor divisions

@pytest.mark.parametrize("inner, outer", [(2, 2), (2, 3), (5, 4)])
def test_nested_floor_divisions_merge_into_one(inner, outer):
    s = sym("s0")
    for offset in (0, 1, -1):
        merged = floordiv(floordiv(s - 1, inner) + offset, outer)
        assert isinstance(merged, sympy.floor) and not merged.args[0].has(sympy.floor)
        for n in range(1, 60):
            assert merged.subs(s, n) == ((n - 1) // inner + offset) // outer


def test_two_strided_convolutions_keep_height_and_width_dynamic():
    m = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
                      nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.MaxPool2d(3, 2, 1), nn.Flatten(2)).eval()
    c = cuvil.compile(m, dynamic=[{2: "h", 3: "w"}], ranges={"h": (16, 64), "w": (16, 64)})
    for h, w in ((32, 32), (33, 47), (16, 64)):
        x = torch.randn(1, 3, h, w)
        torch.testing.assert_close(c(x), m(x))
    assert c.explain_recompiles() == []


def test_ceil_mode_pooling_keeps_height_and_width_dynamic():
    # a window longer than padding + stride - 1 always starts its last window inside the input,
    # so ceil_mode's output size is one expression for every size
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.MaxPool2d(3, 2, ceil_mode=True),
                      nn.AvgPool2d(2, ceil_mode=True)).eval()
    c = cuvil.compile(m, dynamic=[{2: "h", 3: "w"}], ranges={"h": (8, 64), "w": (8, 64)})
    for h, w in ((16, 16), (17, 30), (8, 63)):
        x = torch.randn(1, 3, h, w)
        torch.testing.assert_close(c(x), m(x))
    assert c.explain_recompiles() == []


def test_a_global_pool_window_pins_its_output_to_one_over_the_ranges():
    # EfficientNet's pooler: a window larger than the feature map, ceil_mode, then a linear. Its
    # output size, 1 + (h//4 - 64)//64, is 1 over the ranges; the importer reshapes it to the 1
    # torch.export has, and the verifier checks that reshape's element counts over the ranges
    class Pooler(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.pool, self.fc = nn.Conv2d(3, 16, 4, stride=4), nn.AvgPool2d(64, ceil_mode=True), nn.Linear(16, 5)

        def forward(self, x):
            return self.fc(self.pool(self.conv(x)).flatten(1))

    m = Pooler().eval()
    c = cuvil.compile(m, dynamic=[{2: "h", 3: "w"}], ranges={"h": (8, 256), "w": (8, 256)})
    for h, w in ((40, 48), (64, 100), (252, 8)):
        x = torch.randn(1, 3, h, w)
        torch.testing.assert_close(c(x), m(x))
    assert c.explain_recompiles() == []


def test_a_declared_range_whose_failing_guard_torch_cannot_report_says_what_to_do():
    # (1 + n)//3 != 1 fails for n < 5: torch's report of it crashes on the bound 11/2 <= n; the
    # error said only "Expected op to be '==', got <= for 11/2 <= n"
    def f(x):
        y = x[:-1:3]
        return y.split([1, y.shape[0] - 1])
    c = cuvil.compile(f, dynamic={"x": {0: "n"}}, ranges={"n": (2, 10)})
    with pytest.raises(CuvilExportError, match="fails somewhere in their declared ranges.*Declare a narrower range"):
        c(torch.randn(10, 4))
    undeclared = cuvil.compile(f, dynamic={"x": {0: "n"}})
    for n in (10, 7):
        assert [p.shape for p in undeclared(torch.randn(n, 4))] == [p.shape for p in f(torch.randn(n, 4))]


def test_a_condition_that_holds_on_the_multiples_of_q():
    from cuvil.frontend.size_conditions import _multiple_where_holds
    n = torch.arange(2, 51)
    assert _multiple_where_holds(n % 4 == 0, 2, 16) == (4, (4, 50))
    # n // (n // 4) == 4 holds for every size from 16, for the even ones from 12: the smallest q
    holds = torch.where(n // 4 > 0, n // torch.clamp(n // 4, min=1) == 4, False)
    assert _multiple_where_holds(holds, 2, 16) == (2, (12, 50))
    assert _multiple_where_holds(n % 4 == 0, 2, 18) is None      # the example is no multiple of 4
    assert _multiple_where_holds(n % 3 != 1, 2, 9) == (3, (3, 50))


def _padded_even(s):
    """s padded to an even size, as torch writes `s + (2 - s % 2) % 2`."""
    return s + tfn.PythonMod(2 - tfn.PythonMod(s, 2), 2)


def test_conditions_on_products_of_one_size_each_are_decided_over_wide_ranges():
    """A reshape of two padded dims (pixel_unshuffle after padding h and w to even sizes) makes
    torch keep element-count, stride and divisibility conditions over 4096 x 4096 sizes, too many
    to evaluate one by one: decided by each size's share, or at one size per distinct value of the
    parts of one size."""
    from cuvil.frontend.size_conditions import _failing_representative, _holds_as_a_product
    h, w = sympy.symbols("s0 s1", integer=True, positive=True)
    wide, steps = [(3, 4096), (3, 4096)], [1, 1]
    ph, pw = _padded_even(h), _padded_even(w)
    half_h, half_w = tfn.FloorDiv(ph, 2), tfn.FloorDiv(pw, 2)
    assert _holds_as_a_product(sympy.Eq(6 * ph * pw, 24 * half_h * half_w), [h, w], wide, steps)
    assert not _holds_as_a_product(sympy.Eq(6 * ph * pw, 24 * half_h * half_w + 1), [h, w], wide, steps)
    assert not _holds_as_a_product(sympy.Eq(6 * h * w, 24 * half_h * half_w), [h, w], wide, steps)  # odd sizes
    assert _holds_as_a_product(sympy.Ne(half_h * half_w, 0), [h, w], wide, steps)
    assert _holds_as_a_product(sympy.Ge(3 * half_h * half_w, 1), [h, w], wide, steps)
    assert not _holds_as_a_product(sympy.Ge(3 * half_h * half_w, 13), [h, w], wide, steps)   # 3*2*2 at h = w = 3
    assert _holds_as_a_product(sympy.Ne(pw * tfn.FloorDiv(ph, half_h), half_w), [h, w], wide, steps)
    assert not _holds_as_a_product(sympy.Ne(pw * tfn.FloorDiv(ph, half_h), 4 * half_w), [h, w], wide, steps)
    # ph // (ph // 2) is 2 at every h, pw // (pw // 2) at every w: one size each stands for all
    twos = 3 * tfn.FloorDiv(ph, half_h) * tfn.FloorDiv(pw, half_w)
    assert _failing_representative(sympy.Eq(tfn.PythonMod(twos, 12), 0), [h, w], wide, steps) == {}
    assert _failing_representative(sympy.Eq(tfn.PythonMod(twos, 24), 0), [h, w], wide, steps) == {h: 3, w: 3}
    assert _failing_representative(sympy.Eq(tfn.PythonMod(h * w, 2), 0), [h, w], wide, steps) is None  # too many


def test_a_reshape_of_two_padded_dynamic_dims_compiles_once():
    def unshuffle_padded(x):
        x = torch.nn.functional.pad(x, (0, (2 - x.shape[3] % 2) % 2, 0, (2 - x.shape[2] % 2) % 2))
        return torch.nn.functional.pixel_unshuffle(x, 2)
    c = cuvil.compile(unshuffle_padded, dynamic=[{2: "h", 3: "w"}], cache=False)
    for h, w in ((16, 20), (7, 9), (13, 11), (5, 40)):
        x = torch.randn(2, 3, h, w)
        assert torch.equal(c(x), unshuffle_padded(x))
    assert c.num_variants == 1
