"""In-place ops on tensors the model made (`h += x`, `nn.ReLU(inplace=True)`, `x.mul_(2)`) imported as
their functional forms without `run_decompositions` (frontend/inplace.py), and the cases where the
mutation is observable, which still go through it. Every case is compared with eager."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cuvil
from cuvil.frontend.export import as_module, capture, needs_decomposition
from cuvil.frontend.inplace import functionalize_local_inplace


class Residual(nn.Module):
    """HF ResNet's `hidden_state += residual`, an in-place ReLU and a scale, and a reader of the
    tensor before it is changed."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(6, 6)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        h = self.linear(x)
        before = h.sum(dim=1)
        h += x
        h = self.relu(h)
        h.mul_(2)
        return h, before


def _targets(captured) -> list[str]:
    return [str(n.target) for n in captured.program.graph.nodes if n.op == "call_function"]


def test_unobservable_inplace_ops_import_without_decomposition():
    model = Residual().eval()
    x = torch.randn(4, 6)
    captured = capture(model, (x,))
    targets = _targets(captured)
    assert not needs_decomposition(captured.program)
    assert {"aten.add.Tensor", "aten.relu.default", "aten.mul.Tensor"} <= set(targets)
    assert not any(t.endswith("_.Tensor") or t.endswith("_.default") for t in targets)
    fast = cuvil.compile(model, cache=False)
    for got, want in zip(fast(x), model(x)):
        torch.testing.assert_close(got, want)


def _view_read_after(x, w):
    h = x @ w
    row = h[0]              # a view: the mutation shows through it
    h += 1
    return row * 1


def _view_kept_and_returned(x, w):
    h = x @ w
    flat = h.view(-1)
    h.mul_(3)
    return flat + 0


def _into_a_slice(x, w):
    h = x @ w
    h[:, 0] += 5            # the target is a view: the base changes
    return h


def _promoting(x, w):
    h = (x @ w).half()
    h += x                  # half += float stays half; the functional add would be float
    return h


def _slice_read_after_a_write_through_another(x, w):
    h = x @ w
    row = h[0]              # a view taken before the write, which shows through it
    h[0:2] = 1.0
    return row + x[0]


@pytest.mark.parametrize("fn", [_view_read_after, _view_kept_and_returned, _into_a_slice, _promoting,
                                _slice_read_after_a_write_through_another])
def test_observable_mutations_keep_torchs_meaning(fn):
    x, w = torch.randn(3, 3), torch.randn(3, 3)
    fast = cuvil.compile(fn, cache=False)
    got, want = fast(x, w), fn(x, w)
    for g, e in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert g.dtype == e.dtype
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("fn", [_view_read_after, _view_kept_and_returned, _promoting,
                                _slice_read_after_a_write_through_another])
def test_observable_mutations_are_not_rewritten(fn):
    program = torch.export.export(as_module(fn), (torch.randn(3, 3), torch.randn(3, 3)))
    assert functionalize_local_inplace(program.graph) == 0
    assert needs_decomposition(program)


def _shifted_window_mask(x, y):
    """Swin's attention mask: regions of a fresh tensor filled through two slices each; a row
    written through a selection, a block through a slice from a tensor of another dtype, and an
    in-place add through a slice."""
    mask = x.new_zeros(6, 7)
    count = 0
    for rows in (slice(0, -3), slice(-3, -1), slice(-1, None)):
        for cols in (slice(0, -4), slice(-4, None)):
            mask[rows, cols] = count
            count += 1
    codes = torch.zeros(6, 7, dtype=torch.int64)
    codes[2] = 7
    codes[:, 1:3] = y[:, :2] * 10       # float into int64: truncated, as copy_ does
    codes[4:].add_(3)
    return x + mask, codes


def _relative_positions(x, y):
    """BEiT's relative position index: `+=` and `*=` through a selection of a contiguous copy
    (Python's augmented assignment: the change in place, then a copy onto the same view), and
    Funnel's `*=` on a slice of a reshaped product that only the result is read through."""
    coords = torch.stack([torch.arange(12) // 4, torch.arange(12) % 4])
    relative = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
    relative[:, :, 0] += 2
    relative[:, :, 1] += 3
    relative[:, :, 0] *= 7
    scores = (x @ y.t()).reshape(3, 2, 6)[:, :, 1:]
    scores *= 0.5
    return relative.sum(-1), scores + 1


def _offset_counted_up(x, y):
    """Mamba's cache offset: a number made a tensor in the model, `.to(...)` (whose dtype and
    device torch.export checks) and added to in place."""
    offset = torch.tensor(0).to(device=x.device, dtype=torch.int64)
    offset += x.shape[0]
    return x * 2, offset


def _added_into_a_slice(x, y):
    return _into_a_slice(x, y.t())


def _eval_dropout_on_a_view(x, y):
    pooled = (x * 2).flatten(0)         # a view of the product, as EfficientNet's flatten of its pool
    return F.dropout(pooled, p=0.3, training=False, inplace=True) + 1, y


@pytest.mark.parametrize("fn, writes", [(_shifted_window_mask, 9), (_relative_positions, 7),
                                        (_eval_dropout_on_a_view, 1), (_added_into_a_slice, 2),
                                        (_offset_counted_up, 2)])
def test_writes_through_views_of_fresh_tensors_import_without_decomposition(fn, writes, monkeypatch):
    x, y = torch.randn(6, 7), torch.randn(6, 7) * 3
    with torch.no_grad():
        program = torch.export.export(as_module(fn), (x, y))
    assert functionalize_local_inplace(program.graph) == writes
    assert not needs_decomposition(program)

    def refuse(*_, **__):
        raise AssertionError("run_decompositions was called")
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", refuse)
    for got, want in zip(cuvil.compile(fn, cache=False)(x, y), fn(x, y)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_the_rewrite_counts_each_unobservable_op():
    program = torch.export.export(Residual().eval(), (torch.randn(4, 6),))
    assert functionalize_local_inplace(program.graph) == 3


class BufferReassigned(nn.Module):
    """CTRL's `self.pos_encoding = self.pos_encoding.to(device, dtype)`: torch.export records a
    buffer mutation whose new value is the buffer itself."""

    def __init__(self, counting: bool = False):
        super().__init__()
        self.counting = counting
        self.register_buffer("table", torch.arange(12.0).reshape(6, 2))
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, positions):
        self.table = self.table.to(device=positions.device, dtype=torch.float32)
        if self.counting:
            self.calls += 1         # a real mutation: every call changes the buffer
        return self.table[positions] * 2


def test_a_buffer_reassigned_to_itself_is_no_mutation_and_a_real_one_is_refused():
    positions = torch.tensor([[3, 0, 5]])
    model = BufferReassigned().eval()
    torch.testing.assert_close(cuvil.compile(model)(positions), model(positions), rtol=0, atol=0)
    with pytest.raises(cuvil.CuvilError, match=r"updates 'calls' in place \(buffer_mutation\)(.|\n)*"
                                               r"test_inplace_import.py:\d+: self.calls \+= 1"):
        cuvil.compile(BufferReassigned(counting=True).eval())(positions)

    def adds_to_its_input(x):
        x.add_(1)
        return x * 2
    with pytest.raises(cuvil.CuvilError, match=r"updates 'x' in place \(user_input_mutation\)(.|\n)*"
                                               r"test_inplace_import.py:\d+: x.add_\(1\)"):
        cuvil.compile(adds_to_its_input, cache=False)(torch.randn(3))
