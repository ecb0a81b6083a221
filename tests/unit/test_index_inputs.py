"""Index inputs (token ids into an embedding, indices of index_select, gather and advanced
indexing) holding a value outside their table are refused as eager refuses them, with an
IndexError naming the input, the value, where it is and the gather (cuvil/index_inputs.py).
A compiled gather reads NaN there, so until 2026-12-02 such a call returned NaN rows."""
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


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.out = nn.Embedding(50, 8), nn.Linear(8, 3)

    def forward(self, ids):
        return self.out(self.emb(ids))


def _both_refuse(compiled, model, *args, **kwargs):
    with pytest.raises(IndexError):
        model(*args, **kwargs)
    with pytest.raises(CuvilIndexError) as e:
        compiled(*args, **kwargs)
    return str(e.value)


@pytest.mark.parametrize("dynamic", [None, {"ids": {1: "n"}}])
def test_token_ids_outside_the_vocabulary_raise_as_in_eager(dynamic):
    model = Tagger().eval()
    compiled = cuvil.compile(model, dynamic=dynamic)
    ids = torch.randint(0, 50, (2, 6))
    torch.testing.assert_close(compiled(ids), model(ids))
    bad = ids.clone()
    bad[1, 4] = 50
    text = _both_refuse(compiled, model, bad)
    assert "input 'ids' holds 50 at [1, 4]" in text and "embedding" in text and "[0, 49]" in text
    _both_refuse(compiled, model, bad.t().contiguous().t())     # not contiguous: the general path
    _both_refuse(compiled, model, ids=bad)                      # a keyword: the general path
    neg = ids.clone()
    neg[0, 0] = -1
    assert "holds -1 at [0, 0]" in _both_refuse(compiled, model, neg)
    torch.testing.assert_close(compiled(ids), model(ids))       # the variant still serves good calls


def test_indices_through_a_cast_and_a_reshape_are_checked_and_a_slice_only_where_read():
    model = Tagger().eval()
    through = cuvil.compile(lambda ids: model(ids.reshape(-1).long()))
    ids = torch.randint(0, 50, (3, 4), dtype=torch.int32)
    torch.testing.assert_close(through(ids), model(ids.reshape(-1).long()))
    ids[2, 3] = 77
    with pytest.raises(CuvilIndexError, match="holds 77 at \\[2, 3\\]"):
        through(ids)
    # a slice reads part of the input: the rest may hold anything, as in eager
    head = cuvil.compile(lambda ids: model(ids[:, :2]))
    torch.testing.assert_close(head(ids.long()), model(ids.long()[:, :2]))


def test_advanced_indexing_takes_negative_indices_and_refuses_past_either_end():
    f = cuvil.compile(lambda t, i: t[i] * 2)
    t = torch.randn(10, 3)
    good = torch.tensor([0, -1, -10, 9])
    torch.testing.assert_close(f(t, good), t[good] * 2)
    for value in (10, -11):
        with pytest.raises(IndexError):
            t[torch.tensor([value])]
        with pytest.raises(CuvilIndexError, match=f"holds {value} at \\[0\\].*\\[-10, 9\\]"):
            f(t, torch.tensor([value]))
    g = cuvil.compile(lambda t, i: torch.index_select(t, 1, i) + torch.gather(t, 0, i.expand(10, -1)))
    i = torch.tensor([2, 0, 1])
    torch.testing.assert_close(g(t, i), torch.index_select(t, 1, i) + torch.gather(t, 0, i.expand(10, -1)))
    with pytest.raises(CuvilIndexError, match="holds 3 at \\[1\\]"):
        g(t, torch.tensor([0, 3, 1]))


def test_a_saved_model_keeps_the_check(tmp_path):
    model = Tagger().eval()
    compiled = cuvil.compile(model)
    ids = torch.randint(0, 50, (2, 6))
    compiled(ids)
    compiled.save(tmp_path / "tagger.cuvil")
    loaded = cuvil.load(tmp_path / "tagger.cuvil")
    torch.testing.assert_close(loaded(ids), model(ids))
    ids[0, 1] = 1000
    with pytest.raises(CuvilIndexError, match="holds 1000 at \\[0, 1\\]"):
        loaded(ids)


def test_an_index_read_by_two_gathers_must_suit_both():
    emb = nn.Embedding(10, 4)
    small = torch.randn(3, 4)
    f = cuvil.compile(lambda i: small[i] + emb(i))
    with torch.no_grad():
        torch.testing.assert_close(f(torch.tensor([0, 2])), small[torch.tensor([0, 2])] + emb(torch.tensor([0, 2])))
        for value in (-1, 5):       # -1: small's, not the embedding's; 5: the embedding's, not small's
            with pytest.raises(CuvilIndexError):
                f(torch.tensor([value]))


def test_a_refused_call_is_its_own_error_not_a_failed_compile():
    # with fallback="eager", a first call with a bad id (a compile, or a compiled-model cache hit)
    # counted as a failed compile: every later call ran in eager
    for _ in range(2):          # the second compile is a compiled-model cache hit
        model = Tagger().eval()
        compiled = cuvil.compile(model, fallback="eager")
        bad = torch.tensor([[1, 99]])
        with pytest.raises(CuvilIndexError):
            compiled(bad)
        assert compiled.fallback_reason is None and compiled.num_variants == 1
        good = torch.tensor([[1, 2]])
        torch.testing.assert_close(compiled(good), model(good))


def test_gather_raises_what_eager_raises():
    f = cuvil.compile(lambda t, i: torch.gather(t, 0, i))
    t, i = torch.randn(4, 3), torch.tensor([[0, 1, 4]])
    with pytest.raises(RuntimeError):
        torch.gather(t, 0, i)
    with pytest.raises(RuntimeError, match="holds 4"):
        f(t, i)


class Positions(nn.Module):
    def __init__(self):
        super().__init__()
        self.pe = nn.Embedding(8, 4)

    def forward(self, x):
        return x + self.pe(torch.arange(x.shape[1]))


@pytest.mark.parametrize("dynamic", [{"x": {1: "t"}}, None])
def test_a_dynamic_dim_counted_past_a_table_raises_as_in_eager(dynamic, tmp_path):
    # positions arange(t) into 8 rows: t = 9 would read NaN rows; the guard refuses it by name,
    # with the native fast path as without it, and so does the saved model
    model = Positions()
    compiled = cuvil.compile(model, dynamic=dynamic, cache=False)
    for t in (5, 6, 8, 3):
        torch.testing.assert_close(compiled(torch.zeros(1, t, 4)), model(torch.zeros(1, t, 4)))
    assert compiled.num_variants == (1 if dynamic else 2)      # automatic dynamic: static first
    with pytest.raises(IndexError):
        model(torch.zeros(1, 9, 4))
    for t in (9, 10):
        with pytest.raises(CuvilIndexError, match=rf"is {t}, above 8: the indices the model counts up to it run "
                                                  r"past the embedding at .*test_index_inputs.py:\d+ \(8 rows\)"):
            compiled(torch.zeros(1, t, 4))
    compiled.save(tmp_path / "m.cuvil")
    loaded = cuvil.load(tmp_path / "m.cuvil")
    torch.testing.assert_close(loaded(torch.zeros(1, 7, 4)), model(torch.zeros(1, 7, 4)))
    with pytest.raises(CuvilIndexError, match="is 10, above 8"):
        loaded(torch.zeros(1, 10, 4))


def test_a_topk_of_more_elements_than_a_dynamic_dim_raises_as_in_eager():
    f = lambda a: a.topk(2, 1)      # noqa: E731
    compiled = cuvil.compile(f, dynamic=True, cache=False)
    for shape in ((4, 6), (3, 2)):
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x).values, f(x).values)
    with pytest.raises(RuntimeError):
        f(torch.randn(2, 1))
    with pytest.raises(CuvilIndexError, match=r"is 1, below 2: the topk at .*test_index_inputs.py:\d+ selects k = 2"):
        compiled(torch.randn(2, 1))
