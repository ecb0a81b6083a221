"""Reentrancy, GIL release and inter-step parallelism of the native engine."""
import os
import subprocess
import sys
import threading

import pytest
import torch
from engine_helpers import dag_reference

from cuvil import _native
from cuvil.ir.types import DType, TensorType
from cuvil.runtime import Executable, Program, Slot, Split, Step

SPIN_FOREVER = 4_000_000_000  # a few seconds of spinning: only reached when the test is failing


@pytest.mark.parametrize("min_chunk_ns", [None, 1])
def test_two_python_threads_get_bit_identical_results(make_dag, weight, pool_threads, min_chunk_ns):
    pool_threads(3)
    exe = make_dag(min_chunk_ns)
    g = torch.Generator().manual_seed(11)
    work = {t: [(torch.randn(rows, 64, generator=g), torch.randn(rows, 64, generator=g))
                for rows in (300, 17, 1000, 64, 5, 513)] for t in range(2)}
    alone = {t: [exe(a, b) for a, b in work[t]] for t in work}
    together = {t: [] for t in work}
    start = threading.Barrier(2)

    def caller(t):
        start.wait()
        for _ in range(4):
            together[t].append([exe(a, b) for a, b in work[t]])

    threads = [threading.Thread(target=caller, args=(t,)) for t in work]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for t in work:
        for rounds in together[t]:
            for got, want in zip(rounds, alone[t]):
                assert all(torch.equal(x, y) for x, y in zip(got, want))
    a, b = work[0][0]
    assert torch.equal(alone[0][0][1], dag_reference(a, b, weight)[1])


def _spin_engine(jitted, max_iters):
    code, module = jitted
    i32 = {"dtype": "i32", "bytes": 4}
    return _native.Engine(module, {
        "inputs": 1, "outputs": 2, "arena_bytes": 0,
        "slots": [{"kind": "input", "index": 0, **i32}, {"kind": "output", "index": 0, **i32},
                  {"kind": "output", "index": 1, **i32}],
        "steps": [{"kernel": code.address("spin"), "slots": [0, 1, 2], "dims": [max_iters]}]})


def test_gil_is_released_while_kernels_run(jitted):
    """The kernel waits for a flag that only a Python thread sets, after seeing the kernel start."""
    engine = _spin_engine(jitted, SPIN_FOREVER)
    flag, started, seen = (torch.zeros(1, dtype=torch.int32) for _ in range(3))

    def release_kernel():
        while started.item() == 0:  # needs the GIL while the kernel runs
            pass
        flag.fill_(1)

    helper = threading.Thread(target=release_kernel)
    helper.start()
    engine.run([flag], [started, seen])
    helper.join()
    assert seen.item() == 1


def _rendezvous(jitted, max_iters):
    """Two independent steps: each announces itself and waits for the other."""
    code, module = jitted
    i32 = {"dtype": "i32", "bytes": 4}
    spin = code.address("spin")
    return _native.Engine(module, {
        "inputs": 0, "outputs": 4, "arena_bytes": 0,
        "slots": [{"kind": "output", "index": i, **i32} for i in range(4)],  # flag A, flag B, seen A, seen B
        "steps": [{"kernel": spin, "slots": [0, 1, 2], "dims": [max_iters]},
                  {"kernel": spin, "slots": [1, 0, 3], "dims": [max_iters]}]})


def test_independent_steps_run_at_the_same_time(jitted, pool_threads):
    pool_threads(2)
    outs = [torch.zeros(1, dtype=torch.int32) for _ in range(4)]
    records = _rendezvous(jitted, SPIN_FOREVER).run([], outs, profile=True)
    assert [outs[2].item(), outs[3].item()] == [1, 1]  # both saw the other running
    assert sorted(r[2] for r in records) == [0, 1]  # the calling thread and one pool worker


def test_one_thread_runs_steps_one_after_another(jitted, pool_threads):
    pool_threads(1)
    outs = [torch.zeros(1, dtype=torch.int32) for _ in range(4)]
    _rendezvous(jitted, 1_000_000).run([], outs)
    assert [outs[2].item(), outs[3].item()] == [0, 1]  # step 0 gave up waiting, step 1 found its flag


def test_pool_size_is_checked():
    for bad in (0, -3, 5000):
        with pytest.raises(ValueError, match=f"set_num_threads: expected 1 to 1024 threads, got {bad}"):
            _native.set_num_threads(bad)
    assert _native.get_num_threads() >= 1



SPIN_CHECK = """
import sys, torch
sys.path.insert(0, {helpers!r})
from cuvil import _native
from cuvil.runtime import Executable, set_num_threads
from engine_helpers import K, N, dag_program, dag_reference
from native_jit import jit
set_num_threads(2)
w = torch.randint(-3, 4, (K, N), generator=torch.Generator().manual_seed(7)).float()
exe = Executable(dag_program(w), jit()[1], min_chunk_ns=1)
g = torch.Generator().manual_seed(3)
for rows in (300, 17, 1000):
    a, b = torch.randn(rows, K, generator=g), torch.randn(rows, K, generator=g)
    (gemm, elementwise), (gemm_ref, elementwise_ref) = exe(a, b), dag_reference(a, b, w)
    torch.testing.assert_close(gemm, gemm_ref)
    assert torch.equal(elementwise, elementwise_ref)
print(_native.spin_us())
"""


@pytest.mark.parametrize("setting, spin", [("0", 0), ("200", 200), ("junk", 50), (None, 50)])
def test_spin_setting_is_read_and_results_do_not_depend_on_it(setting, spin, tmp_path):
    """$CUVIL_SPIN_US: how long an idle thread polls before it sleeps (a latency/idle-CPU trade)."""
    env = {k: v for k, v in os.environ.items() if k != "CUVIL_SPIN_US"}
    if setting is not None:
        env["CUVIL_SPIN_US"] = setting
    script = tmp_path / "spin.py"
    script.write_text(SPIN_CHECK.format(helpers=os.path.dirname(__file__)))
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) == spin


def test_a_chunk_runs_where_the_same_chunk_of_the_step_before_ran(jitted, pool_threads):
    """Chunk c of consecutive split steps goes to the same worker when it is free (it reads what
    that worker just wrote, from its own core's cache); whoever finished the step before last
    took chunk 0 before."""
    pool_threads(2)
    f32, n = DType.f32, 1 << 20
    t = TensorType(f32, (n,))
    program = Program(inputs=[t, t], outputs=[t], symbols={}, input_names=["a", "b"], arena_bytes=4 * n,
                      slots=[Slot.input(0, t), Slot.input(1, t), Slot.output(0, t), Slot.arena(0, 4 * n)],
                      steps=[Step("add", [0, 1, 3], [n], split=Split(0, 1, align=16)),
                             Step("add", [3, 0, 2], [n], deps=[0], split=Split(0, 1, align=16))])
    exe = Executable(program, jitted[1], min_chunk_ns=1)
    a, b = torch.randn(n), torch.randn(n)
    # a busy machine can leave a worker not free at the step's start: up to three rounds of 40
    # calls, one of which must keep both chunks on their workers in 32 (by chance, with two
    # workers: 1 in 2 per call, so 32 of 40 about once in 10,000 rounds)
    counts = []
    for _ in range(3):
        same = 0
        for _ in range(40):
            (out,), records = exe.profile(a, b)
            where = {(r.step, r.chunk): r.thread for r in records}
            assert sorted(where) == [(0, 0), (0, 1), (1, 0), (1, 1)]
            same += where[0, 0] == where[1, 0] and where[0, 1] == where[1, 1]
        assert torch.equal(out, (a + b) + a)
        counts.append(same)
        if same >= 32:
            break
    assert max(counts) >= 32, f"chunks kept their worker in {counts} of 40 calls per round"


def test_workers_run_chunks_under_the_callers_floating_point_modes(jitted, pool_threads):
    """`torch.set_flush_denormal(True)` sets flush-to-zero and denormals-are-zero on the calling
    thread: the chunks the pool's workers run get them too (a denormal plus 0 is 0 in every chunk),
    and the workers' own modes are back for the next call (the denormal is kept everywhere)."""
    pool_threads(2)
    n = 1 << 20
    t = TensorType(DType.f32, (n,))
    program = Program(inputs=[t, t], outputs=[t], symbols={}, input_names=["a", "b"], arena_bytes=0,
                      slots=[Slot.input(0, t), Slot.input(1, t), Slot.output(0, t)],
                      steps=[Step("add", [0, 1, 2], [n], split=Split(0, 1, align=16))])
    exe = Executable(program, jitted[1], min_chunk_ns=1)
    a, b = torch.full((n,), 1e-40), torch.zeros(n)
    assert a[0] != 0

    def calls(expected):
        on_workers = 0
        for _ in range(20):
            (out,), records = exe.profile(a, b)
            on_workers += any(r.thread != 0 for r in records)
            assert torch.equal(out, expected)
        return on_workers

    try:
        assert torch.set_flush_denormal(True)
        flushed = calls(torch.zeros(n))
    finally:
        torch.set_flush_denormal(False)
    kept = calls(a)
    assert flushed > 0 and kept > 0, "no chunk ran on a worker"
