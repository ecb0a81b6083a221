"""Zoo models compiled with `cuvil.compile` (dynamic batch and sequence length) against eager PyTorch,
at the export example sizes and at other sizes inside the declared ranges.

fp32 results must match eager within torch's default tolerances; where Cuvil's kernels reduce
(softmax, layer norm, means: its own summation order), the result is compared with an fp64 run of
the model instead, and may be off by at most twice eager fp32's own error."""
import copy

import pytest
import torch
import torch.utils._pytree as pytree

import cuvil
from cuvil import zoo
from cuvil.codegen.lower import REDUCTIONS

SIZES = {
    "batch": [{}, {"batch": 1}, {"batch": 3}],
    "batch_seq": [{}, {"batch": 1}, {"batch": 3}, {"seq": 5}, {"seq": 17}, {"batch": 3, "seq": 17}],
}
MODELS = [("mlp", True), ("cnn", True), ("resnet", True), ("transformer", True), ("transformer_sdpa", True),
          ("bert", True), ("gpt2", True), ("llama", True), ("vit", True), ("mlp", False), ("transformer", False)]


@pytest.fixture(scope="module", autouse=True)
def _private_cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUVIL_CACHE_DIR", str(tmp_path_factory.mktemp("cuvil-cache")))
        yield


_compiled: dict = {}


def compiled_model(name: str, fusion: bool):
    if (name, fusion) not in _compiled:
        entry = zoo.get(name)
        model = cuvil.compile(entry.model, dynamic=entry.dynamic, ranges=entry.ranges, enable_fusion=fusion)
        _compiled[name, fusion] = entry, model, copy.deepcopy(entry.model).double()
    return _compiled[name, fusion]


def cases():
    for name, fusion in MODELS:
        entry_sizes = SIZES["batch_seq" if name in ("transformer", "transformer_sdpa", "bert", "gpt2", "llama")
                            else "batch"]
        for sizes in entry_sizes:
            label = ",".join(f"{k}={v}" for k, v in sizes.items()) or "example"
            yield pytest.param(name, fusion, sizes, id=f"{name}{'' if fusion else '-unfused'}-{label}")


def reduces(report: cuvil.CompileReport) -> bool:
    return any(op["name"] in REDUCTIONS for k in report.kernels for op in k["ops"])


def assert_within_eager_error(out, eager, ref64, factor=2.0, floor=1e-6):
    """|out - ref64| <= factor * |eager - ref64| (max over elements), plus `floor` * max|ref64| for
    outputs eager computes exactly."""
    err = (out.double() - ref64).abs().max().item()
    eager_err = (eager.double() - ref64).abs().max().item()
    bound = factor * eager_err + floor * ref64.abs().max().item()
    assert err <= bound, f"error {err:.3g} vs fp64 > {factor} x eager's {eager_err:.3g} (+ floor)"


def _double(x):
    return x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def assert_matches_eager(model, model64, inputs, out, eager):
    assert type(out) is type(eager)                 # the model's own output structure
    outs, eagers = pytree.tree_leaves(out), pytree.tree_leaves(eager)
    assert len(outs) == len(eagers)
    if reduces(model.report):
        with torch.no_grad():
            refs = pytree.tree_leaves(model64(*map(_double, inputs)))
        for o, e, r in zip(outs, eagers, refs):
            assert o.shape == e.shape and o.dtype == e.dtype
            assert_within_eager_error(o, e, r)
    else:
        for o, e in zip(outs, eagers):
            torch.testing.assert_close(o, e)


@pytest.mark.parametrize("name,fusion,sizes", list(cases()))
def test_compiled_model_matches_eager(name, fusion, sizes):
    entry, model, model64 = compiled_model(name, fusion)
    inputs = entry.inputs(**sizes)
    out = model(*inputs)
    with torch.no_grad():
        eager = entry.model(*inputs)
    assert_matches_eager(model, model64, inputs, out, eager)
    # every size is inside the declared ranges: one compilation serves them all
    assert model.num_variants == 1, model.explain_recompiles()
    assert model.explain_recompiles() == []
    assert model.fallback_reason is None


@pytest.mark.parametrize("name", zoo.names())
def test_every_zoo_model_compiles_with_static_shapes(name):
    """Static shapes fold differently from dynamic ones (ViT's all-true attention mask is a `full`
    of a static shape, which sdpa reads from memory: it once failed to lower)."""
    entry = zoo.get(name)
    model = cuvil.compile(entry.model)
    inputs = entry.inputs()
    out = model(*inputs)
    with torch.no_grad():
        eager = entry.model(*inputs)
    assert_matches_eager(model, copy.deepcopy(entry.model).double(), inputs, out, eager)
    assert model.fallback_reason is None
