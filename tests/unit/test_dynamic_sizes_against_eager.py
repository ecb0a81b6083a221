"""Programs whose shapes torch.export decided from the example (a guard it keeps aside, a size it
assumes to be 2 or more), compiled with dynamic dims and called at sizes where that decision no
longer holds: each call must equal eager's output or raise as eager does. Each of these returned a
wrong shape, or read past the end of its input, before 2026-12-02 (found by a fuzzer of random
programs over views, slices, splits and reshapes)."""
import pytest
import torch

import cuvil


def _check(compiled, fn, *inputs):
    """compiled(*inputs) equals fn(*inputs) in shape and values, or both raise."""
    try:
        want = fn(*inputs)
    except (IndexError, RuntimeError):
        with pytest.raises(cuvil.CuvilError):
            compiled(*inputs)
        return
    got = compiled(*inputs)
    assert got.shape == want.shape, (tuple(got.shape), tuple(want.shape))
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("expr", ["x[:, 1:2]", "x[:, 1]", "x[:, -2]", "x.narrow(1, 1, 1)"])
def test_a_constant_bound_holds_only_from_its_size(expr):
    # torch's trace assumes a dynamic size of 2 or more: x[:, 1:2] is one column wide in its shapes
    # at every size, and the compiled program read past a one-column input
    fn = eval(f"lambda x: ({expr}) * 2.0")
    c = cuvil.compile(fn, dynamic={"x": {1: "A"}}, cache=False)
    for width in (5, 1, 2, 7):
        _check(c, fn, torch.randn(3, width))


def test_the_last_piece_of_a_split_follows_the_size():
    # torch keeps the example's count of pieces ((C + 2)//3 == 2 at C = 6) as a guard aside; the
    # last piece was C - 3 rows at every size
    def f(x: "f32[C,2]"):
        return x.split(3, 0)[-1]
    c = cuvil.compile(f, cache=False)
    for rows in (6, 12, 13, 3, 4):
        _check(c, f, torch.randn(rows, 2))


def test_a_reshape_whose_count_the_example_fixed():
    # reshape(4, -1) of a 2 x 2 example: torch's guard A*B == 4 left aside, the result was A*B x 1
    def f(y):
        return y.reshape(4, -1) * 2.0
    for dynamic in (True, {"y": {0: "A", 1: "B"}}):
        c = cuvil.compile(f, dynamic=dynamic, cache=False)
        for shape in ((2, 2), (4, 4), (6, 6), (8, 3)):
            _check(c, f, torch.randn(*shape))


def test_one_name_over_two_inputs_takes_the_narrower_range():
    # torch narrowed y's size (y[:3] from 3) and not x's; Cuvil's one symbol for C kept x's range
    # and served C = 2 with three rows, the third read past y
    def f(x, y):
        return y[:3] + x[:1]
    c = cuvil.compile(f, dynamic={"x": {0: "C"}, "y": {0: "C"}}, cache=False)
    for rows in (4, 2, 9, 3):
        _check(c, f, torch.ones(rows, 2), torch.ones(rows, 2))


def test_a_slice_from_the_end_of_a_square_input():
    def f(y):
        return y[:, -1:3] + 1.0
    for first in (5, 4):
        c = cuvil.compile(f, dynamic={"y": {0: "C", 1: "C"}}, cache=False)
        for size in (first, 2, 1, 7):
            _check(c, f, torch.randn(size, size))


@pytest.mark.parametrize("expr", ["x[2:]", "x[1:5]", "x[:-1:3]"])
@pytest.mark.parametrize("first", [4, 5])
def test_a_size_below_a_slice_start_after_a_larger_one(expr, first):
    # the call of size 1 widened the range to it, torch's trace saw it as 2 (an empty slice there)
    # and fixed the dim at 2, not at the call's 1: "Constraints violated (n)" until 2026-12-02.
    # Now that call's variant has the dim static.
    fn = eval(f"lambda x: ({expr}) * 2.0")
    c = cuvil.compile(fn, dynamic={"x": {0: "n"}}, cache=False)
    for n in (first, 1, 0, 3, 8):
        _check(c, fn, torch.randn(n, 2))


def test_a_square_patch_grid_fixed_by_a_size_check():
    # HF ViT's `num_patches == 16 and height == width` narrows h to where (h//8)**2 is 16; the
    # reshape pinning that count failed the verifier, which could not bound a power (ViT with
    # interpolate_pos_encoding, DINOv2: found by an architecture sweep)
    class Patches(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Conv2d(3, 8, 8, 8)
            self.pos = torch.nn.Parameter(torch.randn(1, 16, 8))

        def forward(self, x):
            e = self.proj(x).flatten(2).transpose(1, 2)
            if e.shape[1] == 16 and x.shape[2] == x.shape[3]:
                return e + self.pos
            return e
    torch.manual_seed(0)
    model = Patches().eval()
    c = cuvil.compile(model, dynamic={"x": {2: "h", 3: "w"}}, cache=False)
    with torch.no_grad():
        for hw in ((32, 32), (35, 35), (40, 48), (32, 32)):
            x = torch.randn(2, 3, *hw)
            torch.testing.assert_close(c(x), model(x))


def test_a_slice_reaching_back_further_than_the_example():
    # XLNet's memory, x[-512:] of a 12-long sequence: torch clamps the start to 0 while the size
    # stays below 512; Cuvil took the start for size - 512 and failed its own shape check
    def f(x):
        return x[-512:] * 2.0
    c = cuvil.compile(f, dynamic={"x": {0: "S"}}, cache=False)
    for rows in (12, 7, 512, 600, 3):
        _check(c, f, torch.randn(rows, 4))


def test_ranges_over_dynamic_sizes_one_program():
    # XLNet's relative positions count down from the key length to minus the query length, with
    # a float step and an integer dtype; a float step's count is a ceiling torch writes in floats
    def f(x, y):
        k, q = x.shape[1], y.shape[1]
        down = torch.arange(k, -q, -1.0, dtype=torch.int64)
        up = torch.arange(-k, q, 1.0)
        halves = torch.arange(0, k, 2.0)
        odd = torch.arange(q, 3 * k + 7, 3)
        return down, up, halves, odd
    c = cuvil.compile(f, dynamic={"x": {1: "K"}, "y": {1: "Q"}}, cache=False)
    for k, q in ((5, 3), (9, 4), (6, 6), (12, 2)):
        x, y = torch.randn(2, k), torch.randn(2, q)
        for got, want in zip(c(x, y), f(x, y)):
            assert got.dtype == want.dtype
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert len(c._variants) == 1, c.explain_recompiles()


def test_a_range_whose_step_is_a_size_is_refused_at_its_line():
    def f(x, y):
        return torch.arange(y.shape[1], 3 * x.shape[1] + 7, x.shape[1])
    c = cuvil.compile(f, dynamic={"x": {1: "K"}, "y": {1: "Q"}}, fallback="error", cache=False)
    with pytest.raises(cuvil.CuvilUnsupportedOpError, match=r"divides by a size(.|\n)*test_dynamic_sizes_against_eager.py:\d+"):
        c(torch.randn(2, 5), torch.randn(2, 3))


def test_a_size_held_in_a_tensor_bounds_a_slice_and_a_clamp():
    # DeBERTa's relative attention: the span is torch.tensor(min(length, 8)), read back as slice
    # bounds (.item(), whose slice torch cannot size) and used as a clamp bound
    table = torch.randn(16, 4)

    def f(x):
        span = torch.tensor(min(x.shape[1], 8))
        rows = table[8 - span: 8 + span]
        pos = torch.clamp(torch.arange(x.shape[1]) + span, 0, span * 2 - 1)
        return rows * 2.0, pos
    c = cuvil.compile(f, dynamic={"x": {1: "L"}}, cache=False)
    for length in (5, 3, 8, 7, 12, 20):
        x = torch.randn(2, length)
        for got, want in zip(c(x), f(x)):
            assert got.shape == want.shape and got.dtype == want.dtype
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        if length == 7:         # one program up to the span's limit
            assert len(c._variants) == 1, c.explain_recompiles()


def test_the_greatest_position_read_back_as_a_size():
    """Reformer's axial position encodings: `position_ids.max().item()` of positions made by an
    arange over the sequence (broadcast over the batch) is that size less one, a slice bound."""
    table = torch.randn(1, 8, 6)

    def f(x):
        positions = torch.arange(x.shape[1]).unsqueeze(0).expand(x.shape[0], -1)
        last, first = positions.max().item(), positions.min().item()
        torch._check(last < 16)
        return x + table[:, : (last + 2) // 2].reshape(1, -1)[:, : x.shape[1] - first]
    c = cuvil.compile(f, dynamic={"x": {1: "L"}}, ranges={"L": (2, 16)}, cache=False)
    for length in (5, 2, 16, 9):
        x = torch.randn(2, length)
        torch.testing.assert_close(c(x), f(x), rtol=0, atol=0)
    assert len(c._variants) == 1, c.explain_recompiles()


def test_a_tensor_value_as_a_slice_bound_is_refused_at_its_line():
    def f(x, n):
        return x[: n.item()] * 2.0
    c = cuvil.compile(f, fallback="error", cache=False)
    with pytest.raises(cuvil.CuvilUnsupportedOpError, match=r"depend on tensor values(.|\n)*test_dynamic_sizes_against_eager.py:\d+"):
        c(torch.randn(6, 2), torch.tensor(3))


def test_a_min_of_sizes_the_ranges_leave_open_is_decided_by_the_example():
    # torch.sym_min keeps min(8, L) in torch's shapes, unguarded: Cuvil refused it; now each
    # variant serves the side of 8 its example lies on, its range narrowed there
    def f(x):
        n = torch.sym_min(x.shape[1], 8)
        return torch.ones(n) * 2.0, torch.arange(n)
    c = cuvil.compile(f, dynamic={"x": {1: "L"}}, cache=False)
    for length in (5, 3, 8, 7, 12, 20, 9, 2):
        x = torch.randn(2, length)
        for got, want in zip(c(x), f(x)):
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        if length == 7:
            assert len(c._variants) == 1, c.explain_recompiles()
    assert c._variants[0].guard.ranges == [(1, 8)]


class _Groups(torch.nn.Module):
    """Rows in groups of 4: torch.export accepts the dim only as a multiple of 4."""
    def forward(self, x):
        return x.view(-1, 4, x.shape[1]).sum(1) * 2.0


def test_a_dim_the_model_needs_a_multiple_of_serves_every_multiple(tmp_path):
    # before: the dim was compiled static, and each size compiled a variant of its own
    model = _Groups()
    c = cuvil.compile(model, dynamic={"x": {0: "n"}}, cache=False)
    for n in (16, 8, 40, 4096):
        x = torch.randn(n, 3)
        torch.testing.assert_close(c(x), model(x))
    assert len(c._variants) == 1
    guard = c._variants[0].guard
    assert guard.size_range(guard.symbols[0]) == (8, 4096)      # n = 4*s0, s0 from 2 as torch assumes
    x = torch.randn(24, 3)
    out, _ = c.profile(x)      # the engine's own binding of the dims
    torch.testing.assert_close(out, model(x))
    assert guard.match((torch.randn(13, 3),), {}) is None
    assert [m.kind for m in guard.mismatches((torch.randn(13, 3),), {})] == ["multiple"]
    c.save(tmp_path / "groups.cuvil")
    loaded = cuvil.load(tmp_path / "groups.cuvil")
    x = torch.randn(32, 3)
    torch.testing.assert_close(loaded(x), model(x))


def test_padding_to_whole_windows_by_a_size():
    # Swin pads its feature map to whole windows by (4 - n % 4) % 4 rows, then splits it into
    # windows: the padding is a size, and the windows' count divides by nothing dynamic
    def f(x):
        pad = (4 - x.shape[0] % 4) % 4
        y = torch.nn.functional.pad(x, (0, 0, 0, pad))
        return y.view(-1, 4, x.shape[1]).amax(1) + 1.0
    c = cuvil.compile(f, dynamic={"x": {0: "n"}}, cache=False)
    for n in (13, 9, 16, 30, 5):
        _check(c, f, torch.randn(n, 3))
    assert len(c._variants) == 1


def test_groups_of_a_padded_dim_behind_a_batch_dim():
    # the output's rows are ceil(n/4), written -((-n)//4): the flat index's batch part divides by
    # -3*((-n)//4), a negative divisor, which the generated code floored as if it were positive
    # (wrong sums at every size, and writes past the output at 7)
    def f(x):
        y = torch.nn.functional.pad(x, (0, 0, 0, (4 - x.shape[1] % 4) % 4))
        return y.view(y.shape[0], -1, 4, y.shape[2]).sum(2)
    c = cuvil.compile(f, dynamic={"x": {1: "n"}}, cache=False)
    for n in (32, 7, 13, 40, 5):
        _check(c, f, torch.randn(2, n, 3))
    assert len(c._variants) == 1


def test_a_pool_after_a_strided_slice_of_dynamic_sizes():
    # torch states the pooled height (1 + h)//2, Cuvil inferred 1 + (h - 1)//2: the same size,
    # which the import once could not tell and stopped with an internal error
    def f(x):
        return torch.nn.functional.avg_pool2d(x[:, :, ::2, 1:], 3, 1, padding=1)
    c = cuvil.compile(f, dynamic={"x": {2: "h", 3: "w"}}, cache=False)
    for h, w in ((5, 7), (4, 4), (9, 3), (12, 13)):
        _check(c, f, torch.randn(2, 3, h, w))
    assert len(c._variants) == 1


def test_roll_along_dynamic_dims():
    # Swin's shifted windows roll the padded feature map by half a window both ways
    def f(x):
        return torch.roll(x, (-2, 3), (1, 2)) * 2
    c = cuvil.compile(f, dynamic={"x": {1: "h", 2: "w"}}, ranges={"h": (3, 64), "w": (3, 64)}, cache=False)
    for h, w in ((3, 3), (8, 5), (13, 40)):
        _check(c, f, torch.randn(2, h, w, 4))
    assert len(c._variants) == 1
    small = cuvil.compile(f, dynamic={"x": {1: "h", 2: "w"}}, ranges={"h": (1, 64), "w": (1, 64)}, cache=False)
    with pytest.raises(cuvil.CuvilUnsupportedOpError, match=r"roll by -2 along a dim of symbolic size .* sizes below 2"):
        small(torch.randn(2, 8, 5, 4))
