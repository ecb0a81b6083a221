"""Saved models (`CompiledModel.save`, `cuvil.load`): a loaded model computes what the compiled one
did (bit for bit) and what eager PyTorch does, in this process and in a fresh one; dynamic dims,
several variants, keyword calls; and clear errors for calls no variant accepts, files that are not
saved models, and code for another machine."""
import json
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch
import torch.nn as nn
import torch.utils._pytree as pytree

import cuvil
from cuvil import zoo
from cuvil.codegen.target import Target
from cuvil.compiled import Guard
from cuvil.saved import _check_target


@pytest.fixture(scope="module", autouse=True)
def _private_cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUVIL_CACHE_DIR", str(tmp_path_factory.mktemp("cuvil-cache")))
        yield


def leaves(out):
    return pytree.tree_leaves(out)


def assert_same(a, b):
    la, lb = leaves(a), leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert torch.equal(x, y)


@pytest.mark.parametrize("name,sizes,dynamic", [
    ("mlp", {"batch": 3}, False),
    ("cnn", {"batch": 2}, False),
    ("cnn", {"batch": 2}, True),
    ("transformer", {"batch": 1, "seq": 16}, True),
    ("bert_small", {"batch": 1, "seq": 16}, False),
])
def test_loaded_zoo_model_matches_the_compiled_one_and_eager(tmp_path, name, sizes, dynamic):
    entry = zoo.get(name)
    inputs = entry.inputs(**sizes)
    compiled = cuvil.compile(entry.model, dynamic=entry.dynamic if dynamic else None)
    expected = compiled(*inputs)
    compiled.save(tmp_path / "m.cuvil")
    loaded = cuvil.load(tmp_path / "m.cuvil")
    out = loaded(*inputs)
    assert type(out) is type(expected)             # the model's own output structure (ModelOutput for BERT)
    assert_same(out, expected)
    with torch.no_grad():
        eager = entry.model(*inputs)
    for x, y in zip(leaves(out), leaves(eager)):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)


def test_a_fresh_process_loads_and_runs_without_the_model(tmp_path):
    entry = zoo.get("cnn")
    x = entry.inputs(batch=2)[0]
    compiled = cuvil.compile(entry.model)
    expected = compiled(x)
    compiled.save(tmp_path / "cnn.cuvil")
    torch.save({"x": x}, tmp_path / "x.pt")
    script = textwrap.dedent(f"""
        import torch, cuvil
        m = cuvil.load({str(tmp_path / 'cnn.cuvil')!r})
        x = torch.load({str(tmp_path / 'x.pt')!r})["x"]
        torch.save(m(x), {str(tmp_path / 'y.pt')!r})
    """)
    # an empty object cache: the code comes from the saved file, not from the compiler's cache
    env = {"CUVIL_CACHE_DIR": str(tmp_path / "empty-cache"), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=300)
    assert torch.equal(torch.load(tmp_path / "y.pt"), expected)
    assert not (tmp_path / "empty-cache").exists() or not any((tmp_path / "empty-cache").iterdir())


def test_dynamic_dims_serve_every_size_in_range_and_refuse_others(tmp_path):
    def f(x):
        return torch.softmax(x * 2.0, dim=-1) + x.mean(dim=0)

    compiled = cuvil.compile(f, dynamic={"x": {0: "batch"}}, ranges={"batch": (1, 16)})
    compiled(torch.randn(4, 24))
    compiled.save(tmp_path / "f.cuvil")
    loaded = cuvil.load(tmp_path / "f.cuvil")
    for b in (1, 7, 16):
        x = torch.randn(b, 24)
        torch.testing.assert_close(loaded(x), f(x))
        assert_same(loaded(x), compiled(x))
    with pytest.raises(cuvil.CuvilError, match=r"no saved variant accepts this call: .*dim 0 is 17.*range \[1, 16\]"):
        loaded(torch.randn(17, 24))
    with pytest.raises(cuvil.CuvilError, match=r"dim 1 is 25, compiled for 24"):
        loaded(torch.randn(4, 25))
    with pytest.raises(cuvil.CuvilError, match=r"dtype torch.float64, compiled for torch.float32"):
        loaded(torch.randn(4, 24, dtype=torch.float64))


def test_every_variant_is_saved_and_keyword_calls_bind(tmp_path):
    def g(x, y, scale=1.0):
        return (x @ y) * scale

    compiled = cuvil.compile(g)
    a, b = torch.randn(3, 5), torch.randn(5, 2)
    batched = torch.randn(4, 3, 5)
    compiled(a, b, scale=2.0)
    compiled(batched, b, scale=2.0)           # a rank change: a second variant
    assert compiled.num_variants == 2
    compiled.save(tmp_path / "g.cuvil")
    loaded = cuvil.load(tmp_path / "g.cuvil")
    assert len(loaded.variants) == 2
    torch.testing.assert_close(loaded(a, b, scale=2.0), g(a, b, 2.0))
    torch.testing.assert_close(loaded(x=batched, y=b, scale=2.0), g(batched, b, 2.0))
    with pytest.raises(cuvil.CuvilError, match=r"non-tensor argument .* is 3.0, compiled for 2.0"):
        loaded(a, b, scale=3.0)               # non-tensor arguments were compiled in
    with pytest.raises(cuvil.CuvilError, match=r"does not match the saved model's signature"):
        loaded(a, b, nope=1)


def test_saved_weights_are_the_compiled_ones(tmp_path):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    x = torch.randn(2, 8)
    compiled = cuvil.compile(net)
    expected = compiled(x)
    compiled.save(tmp_path / "net.cuvil")
    with torch.no_grad():
        net[0].weight.mul_(3.0)                # after compiling: neither copy sees it
    assert_same(cuvil.load(tmp_path / "net.cuvil")(x), expected)


def test_nothing_to_save_before_the_first_compile(tmp_path):
    with pytest.raises(cuvil.CuvilError, match="nothing compiled to save yet"):
        cuvil.compile(lambda x: x + 1).save(tmp_path / "none.cuvil")


def test_files_that_are_not_saved_models(tmp_path):
    with pytest.raises(cuvil.CuvilError, match="no such file"):
        cuvil.load(tmp_path / "missing.cuvil")
    (tmp_path / "junk.cuvil").write_bytes(b"\x00not a zip at all")
    with pytest.raises(cuvil.CuvilError, match="not a saved Cuvil model"):
        cuvil.load(tmp_path / "junk.cuvil")
    torch.save({"manifest": json.dumps({"format": "something-else"})}, tmp_path / "other.cuvil")
    with pytest.raises(cuvil.CuvilError, match="not a saved Cuvil model"):
        cuvil.load(tmp_path / "other.cuvil")
    torch.save({"manifest": json.dumps({"format": "cuvil-saved-model", "version": 99, "cuvil": "9.9"})},
               tmp_path / "future.cuvil")
    with pytest.raises(cuvil.CuvilError, match="format version 99"):
        cuvil.load(tmp_path / "future.cuvil")


def test_damaged_saved_models_are_refused_by_name(tmp_path):
    # a pickle cut in half raised torch's EOFError, whose empty message broke the error's own
    # formatting (IndexError); a manifest that names what the file lacks raised a bare KeyError
    c = cuvil.compile(lambda x: x * 2, cache=False)
    c(torch.randn(3))
    c.save(tmp_path / "f.cuvil")
    with zipfile.ZipFile(tmp_path / "f.cuvil") as z, zipfile.ZipFile(tmp_path / "cut.cuvil", "w") as out:
        for n in z.namelist():
            b = z.read(n)
            out.writestr(n, b[:len(b) // 2] if n.endswith("data.pkl") else b)
    with pytest.raises(cuvil.CuvilError, match="not a saved Cuvil model"):
        cuvil.load(tmp_path / "cut.cuvil")
    data = torch.load(tmp_path / "f.cuvil", weights_only=True)
    manifest = json.loads(data["manifest"])
    del manifest["variants"][0]["program"]
    torch.save({**data, "manifest": json.dumps(manifest)}, tmp_path / "lies.cuvil")
    with pytest.raises(cuvil.CuvilError, match="the saved model is damaged .KeyError: 'program'"):
        cuvil.load(tmp_path / "lies.cuvil")


def test_flipped_bytes_in_the_weights_or_code_are_refused(tmp_path):
    # a saved model whose weights are damaged loaded and answered wrongly; damaged code could crash
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
    x = torch.randn(2, 64)
    c = cuvil.compile(model, cache=False)
    c(x)
    c.save(tmp_path / "m.cuvil")
    torch.testing.assert_close(cuvil.load(tmp_path / "m.cuvil")(x), model(x))
    data = torch.load(tmp_path / "m.cuvil", weights_only=True)
    for at in (0, data["blob"].numel() // 2, data["blob"].numel() - 1):
        blob = data["blob"].clone()
        blob[at] ^= 0x5A
        torch.save({**data, "blob": blob}, tmp_path / "bad.cuvil")
        with pytest.raises(cuvil.CuvilError, match="damaged .ValueError: its weights and code do not match their "
                                                   "checksum"):
            cuvil.load(tmp_path / "bad.cuvil")
    with pytest.raises(cuvil.CuvilError, match="cuvil.load: threads must be an int from 1 to 1024, not 0"):
        cuvil.load(tmp_path / "m.cuvil", threads=0)


def test_a_file_of_the_previous_format_still_loads(tmp_path):
    """Version 2 kept each constant and object as a tensor of its own; version 3 keeps them in one
    blob (version 4 adds status slots, which this model's kernels have none of; version 5 random
    draws, which it makes none of). A version-2 file, made here from a version-5 one, loads and
    computes the same."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 5))
    x = torch.randn(2, 3, 8, 8)
    compiled = cuvil.compile(model.eval())
    compiled.compile_for(x)
    compiled.save(tmp_path / "v3.cuvil")
    data = torch.load(tmp_path / "v3.cuvil", weights_only=True)
    manifest = json.loads(data["manifest"])
    assert manifest["version"] == 5 and data["blob"].dtype == torch.uint8
    blob = data["blob"]
    constants = [blob[o:o + getattr(torch, d).itemsize * int(torch.tensor(s).prod())].view(getattr(torch, d)).reshape(s)
                 .clone() for o, d, s in manifest.pop("constants")]
    objects = [blob[o:o + n].clone() for o, n in manifest.pop("objects")]
    manifest["version"] = 2
    torch.save({"manifest": json.dumps(manifest), "constants": constants, "objects": objects}, tmp_path / "v2.cuvil")
    assert torch.equal(cuvil.load(tmp_path / "v2.cuvil")(x), compiled(x))
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)


def test_code_for_another_architecture_saves_but_loads_only_there(tmp_path):
    compiled = cuvil.compile(lambda x: torch.relu(x) * 2, target="aarch64")
    with pytest.raises(cuvil.CuvilError, match="cannot run on this machine"):
        compiled(torch.randn(4, 8))
    compiled.save(tmp_path / "arm.cuvil")                     # the object code is there to ship
    if Target.host().arch == "aarch64":
        pytest.skip("this machine is an aarch64 one: the file would load")
    with pytest.raises(cuvil.CuvilError, match=r"compiled for aarch64.*this machine is"):
        cuvil.load(tmp_path / "arm.cuvil")


def test_a_cpu_without_the_compiled_features_is_refused():
    host = Target.host()
    saved = Target(host.triple, "future-cpu", host.features + ",+cuvil-imaginary-ext")
    with pytest.raises(cuvil.CuvilError, match="compiled for a future-cpu CPU with cuvil-imaginary-ext"):
        _check_target("m.cuvil", saved)
    _check_target("m.cuvil", host)            # the host's own code loads


def test_guard_state_round_trips_and_refuses_unsavable_constants():
    compiled = cuvil.compile(lambda x, k: x * k, dynamic={"x": {0: "n"}})
    compiled(torch.randn(5, 3), 2)
    guard = compiled._variants[0].guard
    again = Guard.from_state(json.loads(json.dumps(guard.state())))
    def verdict(g, args):
        hit = g.match(args, {})
        return None if hit is None else hit[1]       # the symbol values, or refused

    cases = [(torch.randn(5, 3), 2), (torch.randn(9, 3), 2), (torch.randn(9, 4), 2), (torch.randn(5, 3), 3),
             (torch.randn(5, 3).double(), 2)]
    assert [verdict(again, a) for a in cases] == [verdict(guard, a) for a in cases] == [[5], [9], None, None, None]
    guard.constants[1] = object()
    with pytest.raises(cuvil.CuvilError, match="a saved model keeps non-tensor arguments"):
        guard.state()


def test_a_loaded_model_profiles_its_steps_like_the_compiled_one(tmp_path):
    entry = zoo.get("cnn")
    x = entry.inputs(batch=1)[0]
    compiled = cuvil.compile(entry.model)
    expected, timings = compiled.profile(x)
    compiled.save(tmp_path / "cnn.cuvil")
    out, loaded_timings = cuvil.load(tmp_path / "cnn.cuvil").profile(x)
    assert torch.equal(out, expected)
    # every step, under its own kernel's name (a split step records one entry per chunk)
    assert {(t.step, t.kernel) for t in loaded_timings} == {(t.step, t.kernel) for t in timings}
    assert all(t.end_ns >= t.start_ns for t in loaded_timings)


def test_saving_over_a_loaded_model_leaves_it_running(tmp_path):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU()).eval()
    x = torch.randn(2, 8)
    compiled = cuvil.compile(net)
    expected = compiled(x)
    compiled.save(tmp_path / "net.cuvil")
    loaded = cuvil.load(tmp_path / "net.cuvil")           # its weights are mapped from the file
    other = cuvil.compile(nn.Sequential(nn.Linear(8, 16)).eval())
    other(x)
    other.save(tmp_path / "net.cuvil")                    # a new file under the same name
    assert torch.equal(loaded(x), expected)
    assert not torch.equal(cuvil.load(tmp_path / "net.cuvil")(x), expected)
    assert [p.name for p in tmp_path.iterdir()] == ["net.cuvil"]       # no partial file left behind
    with pytest.raises(cuvil.CuvilError, match="cannot write the saved model"):
        compiled.save(tmp_path / "missing-folder" / "net.cuvil")
