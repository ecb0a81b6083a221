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
