"""Indices the model computes itself, checked inside the kernels: a gather, index_put or scatter
whose index lies outside its table fails the call with `CuvilIndexError` naming the op and its
line, as eager raises IndexError (or RuntimeError). Before 2026-12-03 such a gather read NaN (0
from an integer table), an index_put row or a scatter position outside the tensor wrote nothing,
and the call returned. Index inputs are checked before the call (test_index_inputs.py)."""
import pytest
import torch
import torch.nn as nn

import cuvil
from cuvil import CuvilIndexError


@pytest.fixture(scope="module", autouse=True)
def _private_cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUVIL_CACHE_DIR", str(tmp_path_factory.mktemp("cuvil-cache")))
        yield


def _both_refuse(compiled, f, *args):
    with pytest.raises((IndexError, RuntimeError)):
        f(*args)
    with pytest.raises(CuvilIndexError) as e:
        compiled(*args)
    return str(e.value)


class Doubled(nn.Module):
    """Token ids doubled before the embedding: the ids the table sees are computed."""
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(8, 4)

    def forward(self, ids):
        return self.emb(ids * 2) + 1


@pytest.mark.parametrize("dynamic", [None, {"ids": {1: "n"}}])
def test_an_embedding_of_computed_ids_raises_past_its_table(dynamic):
    model = Doubled().eval()
    compiled = cuvil.compile(model, dynamic=dynamic)
    ids = torch.tensor([[0, 1, 3]])
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids), model(ids))
        bad = torch.tensor([[0, 4, 3]])
        for _ in range(2):          # the first call, then the native fast path
            text = _both_refuse(compiled, model, bad)
        assert "the embedding at " in text and "test_index_checks.py:" in text and "(8 rows)" in text
        assert "indices must lie in [0, 7]" in text
        torch.testing.assert_close(compiled(ids), model(ids))       # the next good call is served


def test_an_integer_table_raises_where_it_read_zero():
    table = torch.arange(10) * 7

    def f(i):
        return table[i + 3] + 1
    compiled = cuvil.compile(f)
    i = torch.tensor([0, 6, -12])
    torch.testing.assert_close(compiled(i), f(i))
    _both_refuse(compiled, f, torch.tensor([0, 7, 1]))
    _both_refuse(compiled, f, torch.tensor([0, -14, 1]))


def test_a_gather_split_across_threads_raises_from_any_chunk():
    def f(t, i):
        return torch.gather(t, 1, (i * 3) % 70) * 2
    compiled = cuvil.compile(f, threads=2)
    t, i = torch.randn(512, 64), torch.randint(0, 64, (512, 64))
    i = i.clamp(max=21)             # 3 * 21 = 63: inside
    torch.testing.assert_close(compiled(t, i), f(t, i))
    for row in (3, 500):            # in the first and in the last chunk
        bad = i.clone()
        bad[row, 5] = 22            # 66: outside
        assert "the gather at " in _both_refuse(compiled, f, t, bad)


def test_an_index_put_row_outside_the_tensor_raises_where_it_wrote_nothing():
    def f(x, i, v):
        y = x.clone()
        y[i + 2] = v
        return y
    compiled = cuvil.compile(f)
    x, v = torch.randn(6, 3), torch.randn(2, 3)
    torch.testing.assert_close(compiled(x, torch.tensor([0, 3]), v), f(x, torch.tensor([0, 3]), v))
    torch.testing.assert_close(compiled(x, torch.tensor([-8, -3]), v), f(x, torch.tensor([-8, -3]), v))
    assert "index_put" in _both_refuse(compiled, f, x, torch.tensor([0, 4]), v)
    _both_refuse(compiled, f, x, torch.tensor([-9, 0]), v)


@pytest.mark.parametrize("op", ["scatter", "scatter_add", "scatter_value"])
def test_a_scatter_index_outside_the_input_raises_where_it_wrote_nothing(op):
    def f(x, i, src):
        if op == "scatter":
            return x.scatter(1, i, src)
        if op == "scatter_add":
            return x.scatter_add(1, i, src)
        return x.scatter(1, i, -1.0)
    compiled = cuvil.compile(f)
    x, src = torch.randn(3, 5), torch.randn(3, 2)
    i = torch.tensor([[0, 4], [2, 2], [1, 3]])
    torch.testing.assert_close(compiled(x, i, src), f(x, i, src))
    for value in (5, -1):
        bad = i.clone()
        bad[1, 0] = value
        assert "scatter" in _both_refuse(compiled, f, x, bad, src)


def test_a_saved_model_keeps_its_kernel_checks(tmp_path):
    model = Doubled().eval()
    compiled = cuvil.compile(model)
    ids = torch.tensor([[0, 1, 3]])
    compiled(ids)
    compiled.save(tmp_path / "doubled.cuvil")
    loaded = cuvil.load(tmp_path / "doubled.cuvil")
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), model(ids))
    with pytest.raises(CuvilIndexError, match="the embedding at .*indices must lie in \\[0, 7\\]"):
        loaded(torch.tensor([[5, 0, 0]]))


def test_a_failed_check_is_not_a_failed_compile():
    for _ in range(2):          # the second compile is a compiled-model cache hit
        model = Doubled().eval()
        compiled = cuvil.compile(model, fallback="eager")
        with pytest.raises(CuvilIndexError):
            compiled(torch.tensor([[1, 9]]))
        assert compiled.fallback_reason is None and compiled.num_variants == 1
        good = torch.tensor([[1, 2]])
        with torch.no_grad():
            torch.testing.assert_close(compiled(good), model(good))


def test_a_table_of_dynamic_size_raises_past_its_end():
    # the table's rows are a dynamic dim: no compile-time bound; the kernel checks against the call's
    def f(table, i):
        return nn.functional.embedding(i.clamp(min=0) + 1, table)
    compiled = cuvil.compile(f, dynamic={"table": {0: "rows"}})
    table, i = torch.randn(6, 3), torch.tensor([0, 4])
    torch.testing.assert_close(compiled(table, i), f(table, i))
    big = torch.randn(9, 3)
    torch.testing.assert_close(compiled(big, torch.tensor([7])), f(big, torch.tensor([7])))
    _both_refuse(compiled, f, table, torch.tensor([5]))


def test_an_assertion_without_a_message_and_one_beside_an_empty_output_are_checked():
    def f(x):
        torch._assert_async(x.sum() > 0)
        return x.relu()

    def g(x, i):
        return x[:0], nn.functional.one_hot(i + 1, 3)     # the first output is empty: its kernel computes nothing
    compiled_f, compiled_g = cuvil.compile(f), cuvil.compile(g)
    positive = torch.rand(3) + 0.1
    torch.testing.assert_close(compiled_f(positive), f(positive))
    assert "single nonzero value" in _both_refuse(compiled_f, f, -torch.rand(3))
    x = torch.randn(4, 2)
    out = compiled_g(x, torch.tensor([0, 1]))
    torch.testing.assert_close(out[1], g(x, torch.tensor([0, 1]))[1])
    assert "smaller than num_classes" in _both_refuse(compiled_g, g, x, torch.tensor([2]))


class NormedEmbedding(nn.Module):
    """BERT's embeddings: token and position rows summed, then a layer norm over each row."""
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.tokens, self.positions = nn.Embedding(50, 32), nn.Embedding(16, 32)
        self.norm = nn.LayerNorm(32)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1]).unsqueeze(0)
        return self.norm(self.tokens(ids * 2) + self.positions(positions))


def test_a_row_gathered_under_a_layer_norm_reads_and_checks_its_index_once():
    """The layer norm reads each gathered row three times, along its reductions and its store loop:
    each index is read and checked once per row, outside those loops (a check inside one kept it
    scalar: BERT-small's embeddings took 212 us, now 45), and an index past the table still fails."""
    model = NormedEmbedding().eval()
    compiled = cuvil.compile(model, dynamic={"ids": {1: "n"}}, cache=False)
    ids = torch.tensor([[0, 5, 24, 7], [3, 3, 1, 0]])
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids), model(ids))
        text = _both_refuse(compiled, model, torch.tensor([[0, 25, 1, 2], [0, 0, 0, 0]]))
    assert "the embedding at " in text and "indices must lie in [0, 49]" in text
    kernel = next(k["kernel_ir"] for k in compiled.report.kernels if "layer_norm" in k["name"])
    body = kernel[kernel.index("reduce sum"):]
    assert kernel.count("check %status") == 2 and "check" not in body and "%ids[" not in body
