"""Compile workers: LLVM over a share of a model's kernels in other processes (codegen/workers.py)."""
import re
import time

import pytest
import torch

import cuvil
from cuvil import zoo
from cuvil.codegen import compile_tasks, jit, llvm_compile, workers
from cuvil.codegen.target import Target
from cuvil.errors import CuvilError


@pytest.fixture
def pool(monkeypatch):
    """A pool of one worker, ready, as this process's pool."""
    p = workers.Pool(1)
    monkeypatch.setattr(workers, "_pool", p)
    p.start()
    p.give_back(p.borrow(1, wait_s=30))
    assert p.idle and p.idle[0].ready
    yield p
    p.close()


def block():
    entry = zoo.get("transformer")
    return entry.model, entry.inputs(batch=1, seq=16)


def compiled_kernels(model) -> jit.CompiledKernels:
    [variant] = model._variants
    return variant.native.kernels


def test_a_model_compiled_in_two_processes_runs_as_one_compiled_in_one(pool):
    model, inputs = block()
    split = cuvil.compile(model, cache=False)
    out = split(*inputs)
    kernels = compiled_kernels(split)
    assert len(kernels.objects) > 1 and "workers" in kernels.timings
    # each kernel's entry point is defined in exactly one of the objects
    defined = [e for text in kernels.llvm_ir_texts for e in re.findall(r"^define void @(cuvil_k_\w+)\(ptr", text, re.M)]
    assert sorted(defined) == sorted(set(kernels.symbols.values()))

    workers._pool = workers.Pool(0)
    whole = cuvil.compile(model, cache=False)
    torch.testing.assert_close(out, whole(*inputs), rtol=0, atol=0)
    assert "workers" not in compiled_kernels(whole).timings
    # one object per module, the same bytes whichever process compiled it
    assert compiled_kernels(whole).objects == kernels.objects
    with torch.no_grad():
        torch.testing.assert_close(out, model(*inputs), rtol=1e-4, atol=1e-5)


def test_the_code_views_cover_every_object(pool):
    model, inputs = block()
    compiled = cuvil.compile(model, cache=False)
    compiled(*inputs)
    kernels = compiled_kernels(compiled)
    assert len(kernels.objects) > 1
    for name in kernels.kernels:
        assert kernels.llvm_ir(name).startswith("define void @" + kernels.symbols[name])
        assert kernels.asm(name).startswith(kernels.symbols[name] + ":")
        assert any(entry["asm"] for entry in kernels.op_lines(name))


def test_the_object_cache_and_saved_models_keep_every_object(pool, tmp_path):
    model, inputs = block()
    compiled = cuvil.compile(model)
    expected = compiled(*inputs)
    objects = compiled_kernels(compiled).objects
    assert len(objects) > 1
    again = cuvil.compile(model)
    again(*inputs)
    assert compiled_kernels(again).cache_hit and compiled_kernels(again).objects == objects
    compiled.save(tmp_path / "block.cuvil")
    loaded = cuvil.load(tmp_path / "block.cuvil")
    torch.testing.assert_close(loaded(*inputs), expected, rtol=0, atol=0)


def test_small_models_stay_in_one_process(pool):
    compiled = cuvil.compile(lambda x: torch.relu(x) + 1)
    compiled(torch.randn(8))
    kernels = compiled_kernels(compiled)
    assert len(kernels.objects) == 1 and "workers" not in kernels.timings
    assert pool.idle                 # the worker went back unused


def test_tasks_form_as_modules_come_and_small_ones_travel_together():
    """A module of TASK_MIN_LINES lines or more is a task at once; smaller ones gather until they
    reach that size. Every module comes back compiled (comment-only modules are empty ones)."""
    units = [f"; {n}\n" * n for n in (50, 900, 120, 400, 60, 200, 10)]
    with compile_tasks.CompileTasks(Target.host(), 3, 0, jit._llvm_lock) as compiles:
        formed = []
        for u in units:
            compiles.add(u)
            formed.append([[t.count("\n") for t in task] for task in compiles.tasks])
        compiled = compiles.finish(timings := {})
    assert formed[:2] == [[], [[900]]]
    assert formed[-1] == [[900], [400], [50, 120, 60, 200]]
    assert [[t.count("\n") for t in task] for task in compiles.tasks] == [[900], [400], [50, 120, 60, 200], [10]]
    assert sorted(compiled) == sorted(units) and all(obj[:4] == b"\x7fELF" for obj, _ in compiled.values())
    assert "workers" not in timings and timings["optimize"] > 0


def test_a_worker_compiles_modules_while_the_rest_are_still_being_written(pool):
    """Once the modules pass PARALLEL_MIN_LINES, the worker takes each task as it is formed: here it
    compiles the first before the second module exists."""
    first, second = "; a\n" * compile_tasks.PARALLEL_MIN_LINES, "; b\n" * compile_tasks.TASK_MIN_LINES
    with compile_tasks.CompileTasks(Target.host(), 3, 1, jit._llvm_lock) as compiles:
        compiles.add(first)
        deadline = time.monotonic() + 30
        while 0 not in compiles.answers and time.monotonic() < deadline:
            time.sleep(0.01)
        assert 0 in compiles.answers         # the worker answered the first task
        compiles.add(second)
        compiled = compiles.finish(timings := {})
    assert sorted(compiled) == sorted([first, second]) and "workers" in timings
    assert pool.idle                            # the worker went back


def test_an_llvm_error_in_a_worker_is_a_cuvil_error(pool):
    [worker] = pool.borrow(1)
    host = Target.host()
    request = {"triple": host.triple, "cpu": host.cpu, "features": host.features, "abiname": "", "opt": 3}
    with pytest.raises(CuvilError, match=r"(?s)LLVM could not compile the kernels: RuntimeError: LLVM IR parsing error.*2:1: error: expected type"):
        worker.compile({**request, "texts": ["define void @f( {\n"]})
    # the worker is still there and compiles the next request
    answer = worker.compile({**request, "texts": ["define void @f() {\n  ret void\n}\n"]})
    [obj], [ir_text] = answer["objects"], answer["ir"]
    assert obj[:4] == b"\x7fELF" and "define void @f()" in ir_text
    pool.give_back([worker])


def test_a_worker_that_dies_is_reported_and_replaced(pool):
    [worker] = pool.borrow(1)
    worker.proc.kill()
    worker.proc.wait()
    host = Target.host()
    with pytest.raises(CuvilError, match=r"compile worker \(pid \d+\) exited while compiling .*CUVIL_COMPILE_WORKERS=0"):
        worker.compile({"triple": host.triple, "cpu": host.cpu, "features": host.features, "abiname": "", "opt": 3,
                        "texts": ["define void @f() {\n  ret void\n}\n"]})
    pool.give_back([worker])
    assert worker not in pool.idle
    pool.start()
    assert len(pool.workers) == 1 and pool.workers[0] is not worker and pool.workers[0].alive()


def test_the_worker_count_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("CUVIL_COMPILE_WORKERS", "0")
    assert workers.worker_count() == 0
    monkeypatch.setenv("CUVIL_COMPILE_WORKERS", "2")
    assert workers.worker_count() == 2
    monkeypatch.setenv("CUVIL_COMPILE_WORKERS", "two")
    with pytest.raises(CuvilError, match=r"CUVIL_COMPILE_WORKERS must be a whole number, not 'two'"):
        workers.worker_count()


def test_the_worker_protocol_round_trips_messages():
    import io
    stream = io.BytesIO()
    llvm_compile.write_message(stream, {"texts": ["x"], "opt": 3})
    llvm_compile.write_message(stream, {"obj": b"\x7fELF"})
    stream.seek(0)
    assert llvm_compile.read_message(stream) == {"texts": ["x"], "opt": 3}
    assert llvm_compile.read_message(stream) == {"obj": b"\x7fELF"}
    assert llvm_compile.read_message(stream) is None


def test_a_worker_that_cannot_start_leaves_the_compile_in_this_process(monkeypatch):
    p = workers.Pool(1)
    monkeypatch.setattr(workers, "_pool", p)
    monkeypatch.setattr(workers.sys, "executable", "/nonexistent/python")
    with pytest.warns(UserWarning, match="could not start a compile worker"):
        p.start()
    assert p.size == 0 and p.workers == []
    model, inputs = block()
    compiled = cuvil.compile(model, cache=False)
    out = compiled(*inputs)
    assert "workers" not in compiled_kernels(compiled).timings
    with torch.no_grad():
        torch.testing.assert_close(out, model(*inputs), rtol=1e-4, atol=1e-5)
