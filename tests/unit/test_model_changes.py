"""A model changed after its compile (weights updated in place, `load_state_dict`, a parameter or
an attribute replaced, a hook registered, `.train()`, a global the function reads rebound) is
answered as eager answers the changed model: the compiled variants baked the old state in, so
`cuvil/module_state.py` watches it on every call and the model compiles again. Before, every one of
these returned the old model's result."""
import warnings

import pytest
import torch
import torch.nn as nn

import cuvil


@pytest.fixture(scope="module", autouse=True)
def _private_cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUVIL_CACHE_DIR", str(tmp_path_factory.mktemp("cuvil-cache")))
        yield


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)
        self.scale = 2.0

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))) * self.scale


X = torch.randn(3, 16)


def _agrees(compiled, model, x=X):
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)


def _compiled() -> tuple[Scaled, cuvil.CompiledModel]:
    model = Scaled().eval()
    compiled = cuvil.compile(model)
    _agrees(compiled, model)
    return model, compiled


def test_weights_updated_in_place_compile_again_and_say_which():
    model, compiled = _compiled()
    with torch.no_grad():
        model.fc1.weight.mul_(2)
    _agrees(compiled, model)
    assert any("model.fc1.weight was modified in place" in r for r in compiled.explain_recompiles())


def test_load_state_dict_and_a_replaced_parameter_are_seen():
    model, compiled = _compiled()
    torch.manual_seed(1)
    model.load_state_dict({k: torch.randn_like(v) for k, v in model.state_dict().items()})
    _agrees(compiled, model)
    model.fc2.bias = nn.Parameter(torch.randn(4))
    _agrees(compiled, model)
    assert any("parameter model.fc2.bias was rebound" in r for r in compiled.explain_recompiles())
    model.fc2.weight.data = torch.randn(4, 32)       # a new storage: no version bump, a new address
    _agrees(compiled, model)


def test_a_rebound_attribute_and_a_replaced_submodule_are_seen():
    model, compiled = _compiled()
    model.scale = 3.0
    _agrees(compiled, model)
    assert any("attribute model.scale was rebound" in r for r in compiled.explain_recompiles())
    model.fc2 = nn.Linear(32, 4)
    _agrees(compiled, model)
    assert compiled.explain_recompiles()[-1].startswith("the model changed after its compile (submodule model.fc2")


def test_an_equal_value_rebound_and_calls_alone_do_not_recompile():
    model, compiled = _compiled()
    for _ in range(3):
        model.scale = 2.0 + 0.0 * len(compiled.explain_recompiles())   # a new float object, the same value
        model.eval()
        _agrees(compiled, model)
    assert compiled.explain_recompiles() == [] and compiled.num_variants == 1


def test_hooks_registered_and_removed_after_the_compile_are_applied():
    model, compiled = _compiled()
    handle = model.fc1.register_forward_hook(lambda m, i, out: out - 0.5)
    _agrees(compiled, model)
    assert any("a forward hook of model.fc1 was registered" in r for r in compiled.explain_recompiles())
    handle.remove()
    _agrees(compiled, model)
    pre = model.register_forward_pre_hook(lambda m, args: (args[0] * 3,))
    _agrees(compiled, model)
    pre.remove()
    glob = nn.modules.module.register_module_forward_hook(lambda m, i, out: out + 1 if m is model else out)
    try:
        _agrees(compiled, model)
    finally:
        glob.remove()
    _agrees(compiled, model)


def test_train_mode_after_the_compile_is_seen():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8)).eval()
    compiled = cuvil.compile(model, fallback="eager")
    x = torch.randn(6, 8)
    _agrees(compiled, model, x)
    model.train()       # batch statistics instead of the running ones
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = nn.Sequential(model[0], nn.BatchNorm1d(8).train())(x)
        torch.testing.assert_close(compiled(x), expected, rtol=1e-4, atol=1e-4)
    assert any("attribute model.training was rebound" in r for r in compiled.explain_recompiles())


SCALE = 2.0
NET = nn.Linear(4, 4)


def test_a_function_sees_its_globals_and_the_modules_it_calls_change():
    global SCALE

    @cuvil.compile
    def f(x):
        return NET(x) * SCALE

    x = torch.randn(2, 4)
    torch.testing.assert_close(f(x), NET(x) * SCALE)
    SCALE = 5.0
    try:
        torch.testing.assert_close(f(x), NET(x) * 5.0)
        assert any("global SCALE" in r for r in f.explain_recompiles())
        with torch.no_grad():
            NET.weight.add_(1)
        torch.testing.assert_close(f(x), NET(x) * 5.0)
        assert any("NET.weight was modified in place" in r for r in f.explain_recompiles())
    finally:
        SCALE = 2.0


def test_a_model_that_keeps_changing_runs_in_eager_after_max_recompiles():
    model = Scaled().eval()
    compiled = cuvil.compile(model, max_recompiles=2, fallback="eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(5):
            model.scale = float(step)
            _agrees(compiled, model)
    assert compiled.fallback_reason is not None and "max_recompiles=2" in compiled.fallback_reason
    assert any("max_recompiles=2" in str(w.message) for w in caught)


def test_a_model_made_under_inference_mode_compiles_and_a_replaced_weight_is_seen():
    # inference tensors have no version counter (reading one raised inside the snapshot)
    with torch.inference_mode():
        model = Scaled().eval()
        compiled = cuvil.compile(model)
        _agrees(compiled, model)
        model.fc1.weight = nn.Parameter(torch.randn(32, 16))
        _agrees(compiled, model)


def test_a_global_named_like_an_attribute_the_code_reads_is_not_watched():
    # `torch.topk(x, 3).values` names `values` in co_names: a global of that name, rebound on every
    # call (`values = f(x)` in a script), recompiled every call until eager took over
    global values
    f = cuvil.compile(lambda x: torch.topk(x, 3).values * 2)
    x = torch.randn(5)
    for _ in range(4):
        values = f(x)
        torch.testing.assert_close(values, torch.topk(x, 3).values * 2)
    assert f.num_variants == 1 and f.explain_recompiles() == []


def test_what_a_function_reaches_through_compiled_models_methods_and_partials_is_watched():
    import functools
    model = Scaled().eval()
    inner = cuvil.compile(model)
    outer = cuvil.compile(lambda x: inner(x).relu() + 1)
    method = cuvil.compile(model.forward)
    partial = cuvil.compile(functools.partial(lambda m, x: m(x) * 3, model))
    with torch.no_grad():
        for _ in range(2):      # the second round after an in-place update: all stale until 2026-12-02
            torch.testing.assert_close(outer(X), model(X).relu() + 1)
            torch.testing.assert_close(method(X), model(X))
            torch.testing.assert_close(partial(X), model(X) * 3)
            model.fc1.weight.mul_(2)


def test_tracing_an_outer_model_leaves_an_inner_compiled_model_alone():
    # export puts fake tensors in the shared submodule's parameters while it traces: the inner
    # compiled model took that for a change and dropped its variant
    model = Scaled().eval()
    inner = cuvil.compile(model)
    _agrees(inner, model)

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner_model = model

        def forward(self, x):
            return inner(x) + 1
    outer = cuvil.compile(Outer().eval())
    torch.testing.assert_close(outer(X), model(X) + 1)
    _agrees(inner, model)
    assert inner.explain_recompiles() == []


def test_a_model_holding_its_compiled_model_is_freed():
    # the native snapshot held strong references the garbage collector could not see
    import gc
    import weakref
    model = Scaled().eval()
    model.fast = cuvil.compile(model)
    model.fast(X)
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


def test_save_after_a_change_saves_no_stale_variant(tmp_path):
    model = Scaled().eval()
    compiled = cuvil.compile(model)
    compiled(X)
    with torch.no_grad():
        model.fc1.weight.mul_(2)
    with pytest.raises(cuvil.CuvilError, match="model changed since"):
        compiled.save(tmp_path / "m.cuvil")
    compiled(X)
    compiled.save(tmp_path / "m.cuvil")
    torch.testing.assert_close(cuvil.load(tmp_path / "m.cuvil")(X), model(X))


def test_two_compiles_of_one_model_leave_each_other_alone():
    # torch.export restores every module attribute after its trace from a pytree copy: a dict
    # attribute (Hugging Face's `_tp_plan`) came back a new dict, each compile's trace looked like
    # a change to the other, and the two recompiled each other into eager
    from cuvil import zoo
    entry = zoo.get("bert")
    inputs = entry.example_inputs
    first, second = cuvil.compile(entry.model), cuvil.compile(entry.model, pipeline="O1")
    with torch.no_grad():
        expected = entry.model(*inputs).last_hidden_state
        for _ in range(3):
            for c in (first, second):
                torch.testing.assert_close(c(*inputs).last_hidden_state, expected, rtol=1e-4, atol=1e-4)
    assert first.explain_recompiles() == [] and second.explain_recompiles() == []
