"""The compiled-model cache (cuvil/model_cache.py, cuvil/fingerprint.py): a second compile of the
same model loads the cached program without torch.export, in this process and in a fresh one, and
computes what eager PyTorch does; every change that changes the traced graph (weights, attributes,
code, helpers in another file, globals, closures, options, input dtypes and sizes) is a miss whose
result is again eager's; a model the fingerprint cannot digest, or a broken entry, compiles the
long way."""
import importlib
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cuvil
import cuvil.compiled
from cuvil import model_cache
from cuvil.codegen.cache import ObjectCache
from cuvil.compiled import CachedVariant, Variant
from cuvil.fingerprint import Digest, Unfingerprintable
from cuvil.tools import cuvil_cache


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


class Net(nn.Module):
    def __init__(self, scale=0.5):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(24, 32), nn.Linear(32, 8)
        self.scale = scale

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x))) * self.scale


def compiled(model, *inputs, **options):
    c = cuvil.compile(model, **options)
    c.compile_for(*inputs)
    return c


def entry_files(cache_dir) -> list:
    model_cache.flush()      # entries are written in the background
    return list((cache_dir / "models").glob("*/*.cuvil"))


def kind(c) -> type:
    return type(c._variants[-1])


def assert_eager(c, model, *inputs):
    torch.testing.assert_close(c(*inputs), model(*inputs), rtol=1e-5, atol=1e-5)


def test_a_second_compile_loads_the_cached_program(cache_dir, monkeypatch):
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(3, 24)
    first = compiled(model, x)
    assert kind(first) is Variant
    assert len(entry_files(cache_dir)) == 1
    stored = [p for p in first.report.phases if p["name"] == "model_cache_store"]
    assert stored and "error" not in stored[0] and stored[0]["background"]

    def refuse(*args, **kwargs):
        raise AssertionError("torch.export ran")
    with monkeypatch.context() as m:
        m.setattr(cuvil.compiled, "import_model", refuse)
        again = compiled(model, x)
        assert kind(again) is CachedVariant and again.from_model_cache and not first.from_model_cache
        assert torch.equal(again(x), first(x))
        assert_eager(again, model, x)
    # what a hit lacks is compiled on demand: the report (with kernels) and the capture
    assert again.report.kernels and again.imported.function is not None
    out, timings = again.profile(x)
    assert torch.equal(out, first(x)) and len(timings) == len(first.report.schedule)


def test_a_fresh_process_loads_without_torch_export(tmp_path, cache_dir):
    script = textwrap.dedent("""
        import sys
        import torch, torch.nn as nn
        import cuvil
        from cuvil.compiled import CachedVariant
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
        x = torch.randn(5, 16)
        c = cuvil.compile(model)
        c.compile_for(x)
        out = c(x)
        print(type(c._variants[0]).__name__, "torch.export._trace" in sys.modules,
              torch.allclose(out, model(x), rtol=1e-5, atol=1e-5))
        torch.save(out, sys.argv[1])
    """)
    path = tmp_path / "m.py"
    path.write_text(script)
    env = {**os.environ, "CUVIL_CACHE_DIR": str(cache_dir)}
    runs = [subprocess.run([sys.executable, str(path), str(tmp_path / f"out{i}.pt")], env=env, capture_output=True,
                           text=True, check=True).stdout.split() for i in range(2)]
    assert runs[0] == ["Variant", "True", "True"]
    assert runs[1] == ["CachedVariant", "False", "True"]      # no torch.export in the second process
    assert torch.equal(torch.load(tmp_path / "out0.pt"), torch.load(tmp_path / "out1.pt"))


def _changes():
    """(name, change the model or its inputs in place) pairs; each must miss the cache."""
    def weight(m, x):
        with torch.no_grad():
            m.fc1.weight[0, 0] += 1.0
        return m, x

    def attribute(m, x):
        m.scale = 0.25
        return m, x

    def size(m, x):
        return m, torch.randn(4, 24)

    def eval_mode(m, x):
        m.fc1 = nn.Sequential(m.fc1, nn.Dropout(0.5))
        return m, x
    return [("weight", weight), ("attribute", attribute), ("static size", size),
            ("submodule", eval_mode)]


@pytest.mark.parametrize("name,change", _changes(), ids=[n for n, _ in _changes()])
def test_a_change_to_the_model_or_the_call_misses(name, change):
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(3, 24)
    compiled(model, x)
    model, x = change(model, x)
    model.eval()
    c = compiled(model, x)
    assert kind(c) is Variant
    assert_eager(c, model, x)


def test_new_weights_rewrite_the_entry(cache_dir):
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(3, 24)
    before = compiled(model, x)(x)
    with torch.no_grad():
        model.fc2.bias += 1.0
    c = compiled(model, x)
    assert kind(c) is Variant
    torch.testing.assert_close(c(x), before + 0.5)       # the output is scaled by 0.5
    assert len(entry_files(cache_dir)) == 1   # one entry, rewritten
    assert kind(compiled(model, x)) is CachedVariant


def test_other_options_miss():
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(3, 24)
    compiled(model, x)
    for options in ({"pipeline": "O1"}, {"disable_passes": ("fuse",)}, {"dynamic": [{0: "batch"}]}):
        c = compiled(model, x, **options)
        assert kind(c) is Variant, options
        assert_eager(c, model, x)
    assert kind(compiled(model, x, pipeline="O1")) is CachedVariant


def test_changed_code_misses(tmp_path, monkeypatch):
    """The forward, a helper in another file, and a module-level value it reads: each a miss."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "mc_helpers.py").write_text("def act(x):\n    return x.relu()\n")
    (tmp_path / "mc_model.py").write_text(textwrap.dedent("""
        import torch
        import mc_helpers
        OFFSET = 1.0

        class M(torch.nn.Module):
            def forward(self, x):
                return mc_helpers.act(x) + OFFSET
    """))
    x = torch.randn(4, 8)

    def load():
        for name in ("mc_helpers", "mc_model"):
            sys.modules.pop(name, None)
        importlib.invalidate_caches()
        return importlib.import_module("mc_model")

    mod = load()
    assert kind(compiled(mod.M(), x)) is Variant
    assert kind(compiled(load().M(), x)) is CachedVariant       # the same code imported again hits

    mod.OFFSET = 2.0                                               # a global the forward reads
    c = compiled(mod.M(), x)
    assert kind(c) is Variant
    torch.testing.assert_close(c(x), x.relu() + 2.0)

    (tmp_path / "mc_helpers.py").write_text("def act(x):\n    return x.tanh()\n")    # a helper's file
    mod = load()
    c = compiled(mod.M(), x)
    assert kind(c) is Variant
    torch.testing.assert_close(c(x), x.tanh() + 1.0)

    (tmp_path / "mc_model.py").write_text((tmp_path / "mc_model.py").read_text().replace("+ OFFSET", "- OFFSET"))
    mod = load()
    c = compiled(mod.M(), x)
    assert kind(c) is Variant
    torch.testing.assert_close(c(x), x.tanh() - 1.0)


def test_a_function_and_its_closure():
    x = torch.randn(6, 6)

    def make(w):
        def f(x):
            return torch.relu(x @ w)
        return f
    w1, w2 = torch.randn(6, 6), torch.randn(6, 6)
    assert kind(compiled(make(w1), x)) is Variant
    assert kind(compiled(make(w1.clone()), x)) is CachedVariant     # the same values
    c = compiled(make(w2), x)
    assert kind(c) is Variant
    torch.testing.assert_close(c(x), torch.relu(x @ w2))


def test_another_input_dtype_misses():
    def f(x):
        return torch.relu(x) * 3 + 1
    x = torch.randn(5, 7)
    assert kind(compiled(f, x)) is Variant
    xi = (x * 10).to(torch.int32)
    c = compiled(f, xi)
    assert kind(c) is Variant
    assert torch.equal(c(xi), f(xi))


def test_dynamic_dims_hit_at_another_size_and_recompile_past_the_range():
    torch.manual_seed(0)
    model = Net().eval()
    compiled(model, torch.randn(4, 24), dynamic=[{0: "batch"}], ranges={"batch": (1, 16)})
    c = compiled(model, torch.randn(9, 24), dynamic=[{0: "batch"}], ranges={"batch": (1, 16)})
    assert kind(c) is CachedVariant
    for n in (1, 9, 16):
        x = torch.randn(n, 24)
        assert_eager(c, model, x)
    x = torch.randn(40, 24)               # outside the range: a recompile that widens it
    assert_eager(c, model, x)
    assert c.num_variants == 2 and "range of batch widened to [1, 40]" in c.explain_recompiles()[0]


def test_a_model_the_fingerprint_cannot_digest_compiles_the_long_way(cache_dir):
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(3, 24)
    model.encoder = None
    model.blocks = [nn.Identity(), {"where": torch.empty(2, device="meta")}]
    c = compiled(model, x)
    phase = next(p for p in c.report.phases if p["name"] == "fingerprint")
    assert "a torch.strided tensor on meta" in phase["error"] and "Net.blocks[1]['where']" in phase["error"]
    assert not entry_files(cache_dir)
    assert kind(compiled(model, x)) is Variant
    assert_eager(c, model, x)


class Touchy:
    """An attribute whose state cannot be read without an error."""

    @property
    def __dict__(self):
        raise RuntimeError("do not touch")


def test_an_error_while_digesting_compiles_the_long_way(cache_dir):
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(3, 24)
    model.touchy = Touchy()
    c = compiled(model, x)
    phase = next(p for p in c.report.phases if p["name"] == "fingerprint")
    assert phase["error"] == "not cached: RuntimeError while digesting the model: do not touch"
    assert_eager(c, model, x)


def test_a_broken_entry_is_a_miss_and_is_rewritten(cache_dir):
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(3, 24)
    compiled(model, x)
    [entry] = entry_files(cache_dir)
    entry.write_bytes(b"not a saved model")
    c = compiled(model, x)
    assert kind(c) is Variant
    assert_eager(c, model, x)
    assert kind(compiled(model, x)) is CachedVariant


def test_a_model_over_the_size_limit_is_not_stored(cache_dir, monkeypatch):
    monkeypatch.setenv("CUVIL_MODEL_CACHE_MAX_GIB", str(1000 / 2**30))     # 1000 bytes
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(3, 24)
    c = compiled(model, x)
    phase = next(p for p in c.report.phases if p["name"] == "model_cache_store")
    assert "GiB of tensors are over the limit" in phase["error"] and "CUVIL_MODEL_CACHE_MAX_GIB" in phase["error"]
    assert not entry_files(cache_dir)
    assert_eager(c, model, x)


@pytest.mark.parametrize("cache", ["objects", False])
def test_other_cache_settings_write_no_entry(cache_dir, cache):
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(3, 24)
    for _ in range(2):
        assert kind(compiled(model, x, cache=cache)) is Variant
    assert not entry_files(cache_dir)
    with pytest.raises(cuvil.CuvilError, match="cache must be one of"):
        cuvil.compile(model, cache="yes")


def test_a_model_from_the_cache_saves_and_loads_without_compiling(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model, x, y = Net().eval(), torch.randn(3, 24), torch.randn(5, 24)
    compiled(model, x)
    c = compiled(model, x)
    assert kind(c) is CachedVariant
    c(y)                    # a second variant, compiled (batch made dynamic)
    assert c.num_variants == 2 and kind(c) is Variant
    monkeypatch.setattr(cuvil.compiled, "import_model", lambda *a, **k: pytest.fail("torch.export ran"))
    c.save(tmp_path / "m.cuvil")         # the cached variant is saved from its entry, not compiled again
    loaded = cuvil.load(tmp_path / "m.cuvil")
    assert len(loaded.variants) == 2
    for inputs in (x, y):
        assert torch.equal(loaded(inputs), c(inputs))


def test_the_entries_are_listed_and_cleared(cache_dir, capsys):
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(3, 24)
    compiled(model, x)
    compiled(lambda x: x * 2, x)
    listed = model_cache.entries()
    assert sorted(e.model for e in listed) == ["<lambda>", "Net"] and all(e.bytes > 0 for e in listed)
    objects = ObjectCache()
    modules = [f for f in objects.files() if f.suffix == ".o"]
    assert len(modules) >= 2                      # at least a kernel of each model
    cuvil_cache.main([])
    out = capsys.readouterr().out
    assert "Net" in out and "2 model entries" in out
    assert f"object cache: {len(modules)} compiled modules, 2 model indexes" in out
    cuvil_cache.main(["--clear"])
    assert re.search(r"removed 2 model entries .* and \d+ object cache files", capsys.readouterr().out)
    assert model_cache.entries() == [] and objects.files() == []
    assert kind(compiled(model, x)) is Variant


# ----------------------------------------------------------------------------- the digest itself

def digest(obj) -> str:
    d = Digest()
    d.add(obj)
    return d.hexdigest()


def test_digest_follows_values_and_not_identities():
    a = {"k": [1, 2.0, "s", (None, True)], "t": torch.arange(6).reshape(2, 3)}
    b = {"k": [1, 2.0, "s", (None, True)], "t": torch.arange(6).reshape(2, 3)}
    assert digest(a) == digest(b)
    b["t"][0, 0] = 7
    assert digest(a) != digest(b)
    assert digest({1, 2, 3}) == digest({3, 2, 1})
    assert digest(torch.arange(6).reshape(2, 3)) != digest(torch.arange(6).reshape(3, 2))
    assert digest(torch.zeros(3)) != digest(torch.zeros(3, dtype=torch.float64))
    assert digest(torch.tensor(5)) != digest(torch.tensor(6))           # 0-dim tensors too
    cyclic = []
    cyclic.append(cyclic)
    assert digest(cyclic) == digest(cyclic)


def test_digest_reads_user_code_but_not_installed_code():
    def f(x):
        return x + 1

    def g(x):
        return x + 2
    assert digest(f) != digest(g)
    assert digest(F.relu) == digest(F.relu)
    assert "torch==" in " ".join(_parts(F.relu))
    with pytest.raises(Unfingerprintable, match=r"a torch.strided tensor on meta \(at \[0\]\['x'\]\)"):
        digest([{"x": torch.empty(1, device="meta")}])

    class Tagged(torch.Tensor):
        pass
    with pytest.raises(Unfingerprintable, match=r"a Tagged \(at \[1\]\)"):      # a subclass's bytes are its own
        digest([torch.zeros(2), torch.zeros(2).as_subclass(Tagged)])


def _parts(obj) -> list[str]:
    d = Digest()
    d.add(obj)
    return d._parts



def test_flushing_from_several_threads_at_once():
    # `while _writes: _writes.pop(0).join()` raised IndexError when two threads flushed together
    import threading
    import time
    errors = []

    def flush():
        try:
            model_cache.flush()
        except Exception as e:      # noqa: BLE001 (any error fails the test)
            errors.append(e)
    for _ in range(20):
        writes = [threading.Thread(target=time.sleep, args=(0.002,)) for _ in range(3)]
        with model_cache._writes_lock:
            model_cache._writes.extend(writes)
        for w in writes:
            w.start()
        flushers = [threading.Thread(target=flush) for _ in range(4)]
        for th in flushers:
            th.start()
        for th in flushers:
            th.join()
    assert errors == [] and model_cache._writes == []
