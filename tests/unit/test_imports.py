"""Imports kept in the process (cuvil/imports.py): compiling a call imported before, with other
options, starts from a copy of that import without torch.export; a change to the model, or the
caches turned off, runs torch.export again; the passes of one compile never reach the kept import,
and neither do weights changed in place after it."""
import gc

import pytest
import torch
import torch.nn as nn

import cuvil
import cuvil.compiled
from cuvil import imports


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        return torch.tanh(self.fc2(torch.relu(self.fc1(x)))) * 2.0


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    imports.clear()
    yield
    imports.clear()


def no_export(monkeypatch):
    monkeypatch.setattr(cuvil.compiled, "import_model", lambda *a, **k: pytest.fail("torch.export ran"))


def compile_with(model, x, **options):
    c = cuvil.compile(model, **options)
    c.compile_for(x)
    return c


def test_other_pipelines_on_one_call_start_from_the_kept_import(monkeypatch):
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(4, 16)
    with torch.no_grad():
        expected = model(x)
    first = compile_with(model, x, cache="objects")
    before = first.report.input_ir
    no_export(monkeypatch)
    for passes in ("O0", "O1", "O3"):
        again = compile_with(model, x, cache="objects", pipeline=passes)
        [imported] = [p for p in again.report.phases if p["name"] == "import"]
        assert "copy of this process's import" in imported["note"]
        assert again.report.input_ir == before            # the earlier compile's passes did not change it
        torch.testing.assert_close(again(x), expected, rtol=1e-5, atol=1e-6)


def test_a_changed_model_or_the_caches_off_export_again(monkeypatch):
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(4, 16)
    compile_with(model, x, cache="objects")
    exports = []
    real = cuvil.compiled.import_model
    monkeypatch.setattr(cuvil.compiled, "import_model", lambda *a, **k: exports.append(1) or real(*a, **k))
    with torch.no_grad():
        model.fc1.weight.data.mul_(-1.0)           # in place: the kept import has the old weights' digest
    changed = compile_with(model, x, cache="objects")
    assert exports == [1]
    with torch.no_grad():
        torch.testing.assert_close(changed(x), model(x), rtol=1e-5, atol=1e-6)
    compile_with(model, torch.randn(5, 16), cache="objects")    # another static size
    assert exports == [1, 1]
    compile_with(model, x, cache=False)
    compile_with(model, x, cache=False)
    assert exports == [1, 1, 1, 1]


def test_weights_changed_in_place_after_the_import_never_reach_another_model(monkeypatch):
    """The kept import's constants are the first model's tensors. Changed in place after the
    import, they no longer match the key the import was kept under, which a second model with
    the first one's original weights has: it must export again, not compute with the changed
    weights (it used to, silently)."""
    torch.manual_seed(0)
    first, x = Net().eval(), torch.randn(4, 16)
    compile_with(first, x, cache="objects")
    with torch.no_grad():
        first.fc1.weight.add_(1.0)
    torch.manual_seed(0)
    second = Net().eval()                   # the first model's weights before the change
    exports = []
    real = cuvil.compiled.import_model
    monkeypatch.setattr(cuvil.compiled, "import_model", lambda *a, **k: exports.append(1) or real(*a, **k))
    fast = compile_with(second, x, cache="objects", pipeline="O1")
    assert exports == [1]
    with torch.no_grad():
        torch.testing.assert_close(fast(x), second(x), rtol=1e-5, atol=1e-6)


def test_an_import_is_kept_no_longer_than_its_model():
    model = Net().eval()
    compiled = compile_with(model, torch.randn(4, 16), cache="objects")
    assert len(imports._kept) == 1
    del model, compiled
    gc.collect()
    assert len(imports._kept) == 0


def test_a_model_over_the_size_limit_is_not_kept(monkeypatch):
    monkeypatch.setenv("CUVIL_MODEL_CACHE_MAX_GIB", str(1000 / 2**30))       # 1000 bytes: Net has 2.6 kB
    compile_with(Net().eval(), torch.randn(4, 16), cache="objects")
    assert len(imports._kept) == 0


def test_a_module_copy_prints_the_same_and_changes_alone():
    from cuvil.frontend import import_model
    from cuvil.ir import print_module, verify
    torch.manual_seed(0)
    imported = import_model(Net().eval(), (torch.randn(4, 16),))
    module = imported.module
    text = print_module(module)
    twin = module.copy()
    verify(twin)
    assert print_module(twin) == text and twin.constants == module.constants
    assert {op.id for op in twin.main.ops}.isdisjoint(op.id for op in module.main.ops)
    linear = next(op for op in twin.main.ops if op.attrs)
    key = next(iter(linear.attrs))
    linear.attrs[key] = "changed"
    twin.constants["new"] = torch.zeros(1)
    assert print_module(module) == text and "new" not in module.constants
