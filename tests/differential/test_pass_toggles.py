"""Switching passes off never changes results: models compiled with O3 minus one pass, minus seeded
random subsets of its passes, and minus all of them, match eager PyTorch at two batch sizes."""
import random

import pytest
import torch

import cuvil
from cuvil import zoo
from cuvil.passes import Pipeline
from test_compile_models import assert_within_eager_error, reduces

O3_PASSES = [p.name for p in Pipeline.of("O3")]


def _subsets():
    rng = random.Random(2026)
    yield from ([name] for name in O3_PASSES)
    for _ in range(3):
        yield sorted(rng.sample(O3_PASSES, rng.randint(2, len(O3_PASSES) - 1)))
    yield list(O3_PASSES)


CASES = [(model, off) for model in ("cnn", "transformer") for off in _subsets()]
CASES += [(model, off) for model in ("mlp", "resnet") for off in list(_subsets())[-4:]]


@pytest.fixture(scope="module", autouse=True)
def _private_cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUVIL_CACHE_DIR", str(tmp_path_factory.mktemp("cuvil-cache")))
        yield


@pytest.mark.parametrize("name,off", CASES, ids=[f"{m}-without-{'+'.join(o)}" for m, o in CASES])
def test_results_hold_with_passes_switched_off(name, off):
    entry = zoo.get(name)
    model = cuvil.compile(entry.model, dynamic=entry.dynamic, ranges=entry.ranges, pipeline="O3", disable_passes=off)
    for batch in (1, 3):
        inputs = entry.inputs(batch=batch)
        out = model(*inputs)
        with torch.no_grad():
            eager = entry.model(*inputs)
            ref64 = entry.model.double()(*[x.double() if x.is_floating_point() else x for x in inputs])
            entry.model.float()
        assert out.shape == eager.shape
        if reduces(model.report):
            assert_within_eager_error(out, eager, ref64)
        else:
            torch.testing.assert_close(out, eager)
    ran = [p["name"] for p in model.report.passes if p["skipped"] is None]
    assert not set(ran) & set(off), f"switched-off passes ran: {set(ran) & set(off)}"


class DeadValues(torch.nn.Module):
    """Values nothing returned depends on: one op, a chain of two, a reduction of a live value, and
    an attention reading a view of a live value."""

    def forward(self, x):
        y = torch.relu(x) * 2
        torch.tanh(x)
        torch.exp(torch.sigmoid(y))
        y.sum(-1)
        v = y.unsqueeze(0)
        torch.nn.functional.scaled_dot_product_attention(v, v, v * 2)
        return y + 1


@pytest.mark.parametrize("pipeline, off", [("O0", []), ("O1", ["dce"]), ("O3", ["dce"]), ("O3", ["dce", "fuse"])])
def test_dead_values_get_no_kernel_without_dce(pipeline, off):
    """Without `dce`, dead ops stay in the IR; lowering computes only what the results need (it
    once failed on a kernel with no output)."""
    model = DeadValues()
    compiled = cuvil.compile(model, pipeline=pipeline, disable_passes=off)
    x = torch.randn(4, 6)
    torch.testing.assert_close(compiled(x), model(x))
    assert "cuvil.tanh" in compiled.report.output_ir             # still in the IR: no pass removed it
    assert not any(op["name"] in ("cuvil.tanh", "cuvil.exp", "cuvil.sum", "cuvil.sdpa", "cuvil.unsqueeze")
                   for k in compiled.report.kernels for op in k["ops"])


@pytest.mark.parametrize("pipeline", ["O1", "O3"])
def test_a_dead_reader_from_memory_does_not_count_without_dce(pipeline):
    """A dead attention reads conv1d's squeezed output from memory: that squeeze needs no buffer
    (fuse once failed with a KeyError, counting the dead reader)."""
    w = torch.randn(4, 3, 3)

    def f(x):
        y = torch.nn.functional.conv1d(x, w)
        torch.nn.functional.scaled_dot_product_attention(y, y, y * 2)
        return y + 1

    x = torch.randn(1, 3, 8)
    torch.testing.assert_close(cuvil.compile(f, pipeline=pipeline, disable_passes=["dce"])(x), f(x))
