"""The native engine computes what eager PyTorch computes, splits kernels as specified, keeps
its code and constants alive, and reports sane per-step timestamps."""
import gc
import time
import weakref

import pytest
import sympy
import torch
from engine_helpers import K, N, S0, dag_reference, int_inputs
from hypothesis import given, settings
from hypothesis import strategies as st
from native_jit import jit

from cuvil import _native
from cuvil.ir.types import DType, TensorType, sym
from cuvil.runtime import Executable, Program, Slot, Split, Step
from cuvil.runtime.exprs import evaluate, to_postfix


@pytest.mark.parametrize("rows", [1, 7, 300])
@pytest.mark.parametrize("min_chunk_ns", [None, 1])
def test_dag_matches_eager_exactly(make_dag, weight, rows, min_chunk_ns):
    exe = make_dag(min_chunk_ns)
    a, b = int_inputs(rows, seed=rows)
    out0, out1 = exe(a, b)
    ref0, ref1 = dag_reference(a, b, weight)
    assert torch.equal(out0, ref0)
    assert torch.equal(out1, ref1)


def test_random_floats_elementwise_bit_exact_gemm_within_eager_error(make_dag, weight):
    g = torch.Generator().manual_seed(3)
    a, b = (torch.randn(200, K, generator=g) for _ in range(2))
    w = weight
    out0, out1 = make_dag(1)(a, b)
    ref0, ref1 = dag_reference(a, b, w)
    assert torch.equal(out1, ref1)  # IEEE fadd/fmul in the same order as eager
    exact = torch.relu(a.double() + b.double()) @ w.double()
    ours = (out0.double() - exact).abs().max().item()
    eager = (ref0.double() - exact).abs().max().item()
    assert ours <= 2 * eager + 1e-6 * exact.abs().max().item()


def test_non_contiguous_input_is_copied_not_misread(make_dag, weight):
    a, b = int_inputs(16, seed=1)
    at = a.t().contiguous().t()  # same values, column-major strides
    out0, _ = make_dag()(at, b)
    assert torch.equal(out0, dag_reference(a, b, weight)[0])


@pytest.mark.parametrize("extent,align,threads_n", [(100, 16, 4), (37, 1, 3), (5, 8, 4), (1, 1, 4)])
def test_split_chunks_cover_the_range_on_aligned_boundaries(jitted, pool_threads, extent, align, threads_n):
    pool_threads(threads_n)
    code, module = jitted
    program = {"inputs": 0, "outputs": 1, "arena_bytes": 0,
               "slots": [{"kind": "output", "index": 0, "bytes": extent * 8, "dtype": "i64"}],
               "steps": [{"kernel": code.address("mark_chunk"), "slots": [0], "dims": [extent],
                          "split": {"extent": 0, "cost_ns": 10**9, "align": align}}]}
    engine = _native.Engine(module, program, min_chunk_ns=1)
    out = torch.full((extent,), -1, dtype=torch.int64)
    records = engine.run([], [out], profile=True)
    begins = sorted({r[1] for r in records})
    assert begins == list(range(len(records)))  # chunk numbers 0..n-1, each once
    starts = sorted(set(out.tolist()))
    assert starts[0] == 0 and all(s % align == 0 for s in starts)
    assert len(starts) == len(records) <= threads_n
    length = -(-(-(-extent // threads_n)) // align) * align  # ceil(ceil(extent/n)/align)*align
    assert out.tolist() == [i // length * length for i in range(extent)]


def test_small_work_runs_in_one_chunk(jitted):
    code, module = jitted
    program = {"inputs": 0, "outputs": 1, "arena_bytes": 0,
               "slots": [{"kind": "output", "index": 0, "bytes": 64 * 8, "dtype": "i64"}],
               "steps": [{"kernel": code.address("mark_chunk"), "slots": [0], "dims": [64],
                          "split": {"extent": 0, "cost_ns": 1}}]}
    out = torch.full((64,), -1, dtype=torch.int64)
    records = _native.Engine(module, program).run([], [out], profile=True)  # 64 ns < min_chunk_ns
    assert len(records) == 1 and out.tolist() == [0] * 64


def test_profile_records_every_chunk_in_dependency_order(make_dag, pool_threads):
    pool_threads(3)
    exe = make_dag(1)
    a, b = int_inputs(64, seed=5)
    t0 = time.monotonic_ns()
    _, records = exe.profile(a, b)
    t1 = time.monotonic_ns()
    steps = exe.program.steps
    assert {r.step for r in records} == set(range(len(steps)))
    for r in records:
        assert t0 <= r.start_ns <= r.end_ns <= t1
        assert 0 <= r.thread < 3
        assert r.kernel == steps[r.step].kernel
    for s, step in enumerate(steps):
        chunks = sorted(r.chunk for r in records if r.step == s)
        assert chunks == list(range(len(chunks)))
        if step.split is None:
            assert chunks == [0]
        started = min(r.start_ns for r in records if r.step == s)
        for d in step.deps:
            assert started >= max(r.end_ns for r in records if r.step == d)


def test_engine_keeps_jit_code_and_constants_alive(weight):
    from engine_helpers import dag_program
    code, module = jit("add", "mul", "relu", "matmul")
    w = weight.clone()
    exe = Executable(dag_program(w), module)
    owner = weakref.ref(code)
    del code, module, w
    gc.collect()
    assert owner() is not None  # the engine holds the JIT module, which holds its owner
    junk = [torch.full((K, N), 99.0) for _ in range(50)]  # would reuse freed weight memory
    a, b = int_inputs(9, seed=2)
    assert torch.equal(exe(a, b)[0], dag_reference(a, b, weight)[0])
    del exe, junk
    gc.collect()
    assert owner() is None


def test_program_without_steps_or_with_zero_rows(jitted):
    code, module = jitted
    empty = _native.Engine(module, {"inputs": 0, "outputs": 0, "arena_bytes": 0, "slots": [], "steps": []})
    assert empty.run([], []) is None and empty.num_steps == 0
    f32 = DType.f32
    t = TensorType(f32, (S0,))
    prog = Program(inputs=[t, t], outputs=[t], symbols={"s0": (0, 10)},
                   slots=[Slot.input(0, t), Slot.input(1, t), Slot.output(0, t)],
                   steps=[Step("add", [0, 1, 2], [S0], split=Split(0, 1))])
    (y,) = Executable(prog, module)(torch.ones(0), torch.ones(0))
    assert y.shape == (0,)


def test_dlpack_inputs_and_outputs(jitted):
    np = pytest.importorskip("numpy")
    code, module = jitted
    program = {"inputs": 2, "outputs": 1, "arena_bytes": 0,
               "slots": [{"kind": "input", "index": 0, "bytes": 40, "dtype": "f32"},
                         {"kind": "input", "index": 1, "bytes": 40, "dtype": "f32"},
                         {"kind": "output", "index": 0, "bytes": 40, "dtype": "f32"}],
               "steps": [{"kernel": code.address("add"), "slots": [0, 1, 2], "dims": [10],
                          "split": {"extent": 0, "cost_ns": 1}}]}
    engine = _native.Engine(module, program)
    a = torch.arange(10, dtype=torch.float32)
    b = np.linspace(0, 1, 10, dtype=np.float32)
    out = np.zeros(10, dtype=np.float32)
    engine.run([a, b], [out])  # torch and numpy through DLPack, zero-copy
    assert np.array_equal(out, a.numpy() + b)
    sliced = torch.arange(20, dtype=torch.float32)[5:15]  # a view with a byte offset
    engine.run([sliced, b], [out])
    assert np.array_equal(out, sliced.numpy() + b)


SYMS = [sym(f"s{i}") for i in range(3)]
_leaf = st.one_of(st.integers(-50, 50), st.sampled_from(SYMS))


def _combine(children):
    pair = st.tuples(children, children)
    return st.one_of(pair.map(lambda p: p[0] + p[1]), pair.map(lambda p: p[0] * p[1]),
                     pair.map(lambda p: p[0] - p[1]),
                     pair.map(lambda p: sympy.floor(p[0] / p[1]) if p[1] != 0 else p[0]),
                     pair.map(lambda p: sympy.Mod(p[0], p[1]) if p[1] != 0 else p[0]),
                     children.map(lambda c: sympy.ceiling(c / 3)), children.map(lambda c: c**2),
                     pair.map(lambda p: sympy.Max(*p)), pair.map(lambda p: sympy.Min(*p)))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(exprs=st.lists(st.recursive(_leaf, _combine, max_leaves=6), min_size=4, max_size=4),
       values=st.lists(st.integers(1, 1000), min_size=3, max_size=3))
def test_native_dims_evaluate_like_sympy(jitted, exprs, values):
    code, module = jitted
    index = {s.name: i for i, s in enumerate(SYMS)}
    subs = dict(zip(SYMS, values))
    want = []
    for e in exprs:
        v = sympy.sympify(e).subs(subs)
        if not v.is_integer or v.has(sympy.zoo, sympy.nan):
            return  # e.g. a division by a symbol expression that evaluates to zero
        want.append(int(v))
    dims = [to_postfix(e, index) for e in exprs]
    assert [evaluate(d, values) for d in dims] == want
    program = {"symbols": 3, "inputs": 0, "outputs": 1, "arena_bytes": 0,
               "slots": [{"kind": "output", "index": 0, "bytes": 32, "dtype": "i64"}],
               "steps": [{"kernel": code.address("echo_dims"), "slots": [0], "dims": dims}]}
    out = torch.zeros(4, dtype=torch.int64)
    if any(abs(v) >= 2**63 for d in dims for v in _intermediates(d, values)):
        # found when the program is built (a constant expression) or when it runs
        with pytest.raises((_native.ProgramError, _native.RunError), match=r"steps\[0\]\.dims\[\d\]: int64 overflow"):
            _native.Engine(module, program).run([], [out], values)
    else:
        _native.Engine(module, program).run([], [out], values)
        assert out.tolist() == want


def _intermediates(postfix, values):
    """Every value the evaluation stack holds along the way."""
    stack, seen = [], []
    for t in postfix if isinstance(postfix, list) else [postfix]:
        if isinstance(t, int) or t[0] == "$":
            stack.append(evaluate([t], values))
        else:
            b = stack.pop()
            stack.append(evaluate([stack.pop(), b, t], values))
        seen.append(stack[-1])
    return seen


def test_ready_steps_run_in_priority_order(jitted, pool_threads):
    pool_threads(1)
    code, module = jitted
    mark = code.address("mark_chunk")
    priorities = [0, 5, -2, 5, 3]
    program = {"inputs": 0, "outputs": len(priorities), "arena_bytes": 0,
               "slots": [{"kind": "output", "index": i, "bytes": 8, "dtype": "i64"} for i in range(len(priorities))],
               "steps": [{"kernel": mark, "slots": [i], "dims": [1], "priority": p,
                          "split": {"extent": 0, "cost_ns": 1}} for i, p in enumerate(priorities)]}
    outs = [torch.zeros(1, dtype=torch.int64) for _ in priorities]
    records = _native.Engine(module, program).run([], outs, profile=True)
    order = [r[0] for r in sorted(records, key=lambda r: r[3])]
    assert order == [1, 3, 4, 0, 2]  # higher priority first; ties by step index


@pytest.mark.parametrize("dim,message", [
    (S0 / 2, r"dimension s0/2 is not an integer expression"),
    (sympy.sqrt(S0), r"dimension sqrt\(s0\) uses 'Pow', which the runtime cannot evaluate"),
    (sympy.Symbol("t") + 1, r"symbol 't' in dimension t \+ 1 is not a symbol of the program \(its symbols: s0\)"),
])
def test_dims_the_runtime_cannot_evaluate_are_refused(dim, message):
    with pytest.raises(ValueError, match=message):
        to_postfix(dim, {"s0": 0})
    with pytest.raises(TypeError, match="a dimension cannot be a bool"):
        to_postfix(True, {})


def test_blas_routines_are_found_by_name():
    from cuvil.runtime import blas
    assert blas.address(blas.SGEMM) == blas.address("scipy_cblas_sgemm") != 0
    with pytest.raises(ValueError, match="BLAS routine 'no_such_gemm' is not exported by"):
        blas.address("no_such_gemm")
