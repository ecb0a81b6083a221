"""The engine refuses bad programs and bad calls with a clear error, and never crashes."""
import copy

import numpy as np
import pytest
import torch
from engine_helpers import K, S0, int_inputs
from native_jit import jit

from cuvil import _native
from cuvil.errors import CuvilError
from cuvil.runtime import blas


def base(code):
    """add(in0, in1) -> arena; relu(arena) -> out0, with 8 elements and one symbol."""
    return {"symbols": 1, "inputs": 2, "outputs": 1, "arena_bytes": 64,
            "slots": [{"kind": "input", "index": 0, "bytes": 32, "dtype": "f32"},
                      {"kind": "input", "index": 1, "bytes": 32, "dtype": "f32"},
                      {"kind": "output", "index": 0, "bytes": 32, "dtype": "f32"},
                      {"kind": "arena", "offset": 0, "bytes": 32}],
            "steps": [{"kernel": code.address("add"), "slots": [0, 1, 3], "dims": [8],
                       "split": {"extent": 0, "cost_ns": 1}},
                      {"kernel": code.address("relu"), "slots": [3, 2], "dims": [8], "deps": [0]}]}


def test_base_program_runs(jitted):
    code, module = jitted
    a, b, out = torch.randn(8), torch.randn(8), torch.empty(8)
    _native.Engine(module, base(code)).run([a, b], [out], [1])
    assert torch.equal(out, torch.relu(a + b))


def _set(path, value):
    def mutate(p, code):
        *keys, last = path
        for k in keys:
            p = p[k]
        p[last] = value(code) if callable(value) else value
    return mutate


BAD_PROGRAMS = {
    "foreign address": (_set(["steps", 0, "kernel"], lambda c: blas.address(blas.SGEMM)),
                        r"steps\[0\]\.kernel: address 0x[0-9a-f]+ is not a kernel of this engine's JIT"),
    "slot out of range": (_set(["steps", 1, "slots", 1], 9),
                          r"steps\[1\]\.slots\[1\] \(kernel 'relu'\): slot 9 is out of range \(the program has 4"),
    "negative slot": (_set(["steps", 1, "slots", 0], -1),
                      r"steps\[1\]\.slots\[0\] \(kernel 'relu'\): slot -1 is out of range"),
    "arena overflow": (_set(["slots", 3, "offset"], 40), r"offset 40 \+ size 32 exceeds the arena size 64"),
    "negative offset": (_set(["slots", 3, "offset"], -8), r"slots\[3\] \(arena\): negative offset -8"),
    "dep on itself": (_set(["steps", 1, "deps"], [1]),
                      r"steps\[1\]\.deps\[0\] \(kernel 'relu'\): step 1 is not an earlier step"),
    "dep on later": (_set(["steps", 0, "deps"], [1]),
                     r"steps\[0\]\.deps\[0\] \(kernel 'add'\): step 1 is not an earlier step"),
    "dep twice": (_set(["steps", 1, "deps"], [0, 0]),
                  r"steps\[1\]\.deps\[1\] \(kernel 'relu'\): step 0 is listed twice"),
    "slot count": (_set(["steps", 1, "slots"], [3]),
                   r"steps\[1\]\.slots \(kernel 'relu'\): has 1 slots, the kernel takes 2"),
    "dim count": (_set(["steps", 1, "dims"], [8, 8]), r"has 2 dims, the kernel takes 1"),
    "split missing": (_set(["steps", 0, "split"], None), r"the kernel is splittable but the step has no split"),
    "split extra": (_set(["steps", 1, "split"], {"extent": 0, "cost_ns": 1}), r"the kernel is not splittable"),
    "split extent": (_set(["steps", 0, "split", "extent"], 3),
                     r"steps\[0\]\.split\.extent \(kernel 'add'\): dim index 3 is out of range \(the step has 1"),
    "input index": (_set(["slots", 1, "index"], 2), r"slots\[1\] \(input\): index 2 is out of range"),
    "input twice": (_set(["slots", 1, "index"], 0), r"input 0 is already bound to slots\[0\]"),
    "output unbound": (_set(["outputs"], 2), r"outputs: output 1 is bound to no slot"),
    "unknown key": (_set(["steps", 0, "prio"], 1), r"steps\[0\]: unknown key 'prio'"),
    "missing key": (lambda p, c: p.pop("arena_bytes"), r"program: missing 'arena_bytes'"),
    "bad kind": (_set(["slots", 3, "kind"], "scratch"), r"slots\[3\]\.kind: expected 'input', 'output'"),
    "bad dtype": (_set(["slots", 0, "dtype"], "f64"), r"unknown dtype 'f64'"),
    "bool as int": (_set(["steps", 0, "dims", 0], True),
                    r"steps\[0\]\.dims\[0\]: expected an int or a postfix token list, got bool"),
    "bad token": (_set(["steps", 0, "dims", 0], ["$0", 8, "**"]), r"dims\[0\]\[2\]: unknown token '\*\*'"),
    "symbol range": (_set(["steps", 0, "dims", 0], ["$1"]), r"symbol \$1 is out of range \(the program has 1"),
    "short expr": (_set(["steps", 0, "dims", 0], ["$0", "+"]), r"an operator lacks its two operands"),
    "const div 0": (_set(["arena_bytes"], [64, 0, "//"]), r"arena_bytes: division by zero"),
    "huge int": (_set(["arena_bytes"], 2**70), r"arena_bytes: the int does not fit in 64 bits"),
    "not a dict": (_set(["steps", 0], [1, 2]), r"steps\[0\]: expected a dict, got list"),
    "const dtype": (_set(["slots", 3], {"kind": "const", "data": torch.zeros(8), "dtype": "i32"}),
                    r"slots\[3\]\.data: expected dtype i32, got f32"),
    "const not tensor": (_set(["slots", 3], {"kind": "const", "data": [1.0], "dtype": "f32"}),
                         r"slots\[3\]\.data: expected a tensor or array with __dlpack__, got list"),
}


@pytest.mark.parametrize("name", BAD_PROGRAMS)
def test_bad_program_is_refused_with_a_clear_message(jitted, name):
    code, module = jitted
    mutate, message = BAD_PROGRAMS[name]
    program = copy.deepcopy(base(code))
    mutate(program, code)
    with pytest.raises(_native.ProgramError, match=r"^invalid program: .*" + message) as err:
        _native.Engine(module, program)
    assert isinstance(err.value, CuvilError)


def test_kernel_of_another_jit_module_is_refused(jitted):
    code, module = jitted
    other_code, _ = jit("add", "relu")
    program = base(code)
    program["steps"][0]["kernel"] = other_code.address("add")
    with pytest.raises(_native.ProgramError, match=r"is not a kernel of this engine's JIT module \(its kernels: add"):
        _native.Engine(module, program)


def test_bad_jit_module_is_refused():
    with pytest.raises(_native.ProgramError, match="kernel 'k' has a null address"):
        _native.JitModule(None, [("k", 0, 1, 1, False)])
    with pytest.raises(_native.ProgramError, match="kernel 'b' has the same address as kernel 'a'"):
        _native.JitModule(None, [("a", 64, 1, 1, False), ("b", 64, 1, 1, False)])


@pytest.fixture
def engine(jitted):
    code, module = jitted
    program = base(code)
    program["slots"][3]["offset"] = ["$0", 8, "*"]  # in range only when s0 <= 4
    program["steps"][0]["dims"] = [[8, "$0", "//"]]
    return _native.Engine(module, program)


def _raw(t):
    return (t.data_ptr(), t.nbytes)


BAD_CALLS = {
    "input count": (lambda a, b, o: ([a], [o], [1]), r"the program takes 2 inputs and 1 outputs; got 1 and 1"),
    "symbol count": (lambda a, b, o: ([a, b], [o], []),
                     r"the program takes 2 inputs, 1 outputs and 1 symbol values; got 2, 1 and 0"),
    "wrong size": (lambda a, b, o: ([a, torch.zeros(4)], [o], [1]), r"input 1: expected 32 bytes, got 16"),
    "raw wrong size": (lambda a, b, o: ([_raw(a), (b.data_ptr(), 16)], [o], [1]),
                       r"input 1: expected 32 bytes, got 16"),
    "raw null": (lambda a, b, o: ([(0, 32), b], [o], [1]), r"input 0: null data pointer"),
    "raw bad pair": (lambda a, b, o: ([(1, 2, 3), b], [o], [1]), r"input 0: expected an \(address, nbytes\) pair"),
    "dtype": (lambda a, b, o: ([a.double()[:4], b], [o], [1]), r"input 0: expected dtype f32, got f64"),
    "not contiguous": (lambda a, b, o: ([torch.zeros(16)[::2], b], [o], [1]), r"input 0: the tensor is not contiguous"),
    "not a tensor": (lambda a, b, o: ([[0.0] * 8, b], [o], [1]),
                     r"input 0: expected a tensor or array with __dlpack__ or"),
    "requires grad": (lambda a, b, o: ([a.requires_grad_(), b], [o], [1]), r"input 0: cannot take a DLPack view"),
    "arena range": (lambda a, b, o: ([a, b], [o], [5]),
                    r"slots\[3\]: arena range \[40, 40 \+ 32\) is outside the arena of 64"),
    "division by zero": (lambda a, b, o: ([a, b], [o], [0]), r"steps\[0\]\.dims\[0\]: division by zero"),
    "read-only output": (lambda a, b, o: ([a, b], [_readonly(np.zeros(8, np.float32))], [1]),
                         r"output 0: the tensor is read-only"),
}


def _readonly(arr):
    arr.flags.writeable = False
    return arr


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_is_refused_with_a_clear_message(engine, name):
    make, message = BAD_CALLS[name]
    out = torch.full((8,), 7.0)
    args = make(torch.randn(8), torch.randn(8), out)
    with pytest.raises(_native.RunError, match="^" + message):
        engine.run(*args)
    assert torch.equal(out, torch.full((8,), 7.0))  # nothing ran


def test_executable_checks_inputs_before_running(make_dag):
    exe = make_dag()
    a, b = int_inputs(4, seed=0)
    with pytest.raises(_native.RunError, match=r"input 1 \(b\): expected dtype torch.float32, got torch.float64"):
        exe(a, b.double())
    with pytest.raises(_native.RunError, match=r"input 0 \(a\): expected 2 dims tensor<s0x64xf32>, got shape \(64,\)"):
        exe(a[0], b)
    with pytest.raises(_native.RunError,
                       match=r"input 1 \(b\): expected shape \(4, 64\) \(tensor<s0x64xf32>\), got \(5, 64\)"):
        exe(a, torch.zeros(5, K))
    with pytest.raises(_native.RunError, match=r"dimension s0 = 5000 is outside its range \[1, 4096\]"):
        exe(torch.zeros(5000, K), torch.zeros(5000, K))
    with pytest.raises(_native.RunError, match=r"expected 2 inputs, got 1"):
        exe(a)
    with pytest.raises(_native.RunError, match=r"input 0 \(a\): expected a torch.Tensor, got list"):
        exe([1.0], b)


def test_symbol_that_no_input_binds_is_refused(jitted, weight):
    from engine_helpers import dag_program
    from cuvil.runtime import Executable
    program = dag_program(weight)
    program.symbols = {"s0": (1, 4096), "s1": (1, 8)}
    with pytest.raises(_native.ProgramError, match="symbol\\(s\\) s1 appear in no input shape"):
        Executable(program, jitted[1])
    program.symbols = {}
    with pytest.raises(ValueError, match="symbol 's0' in dimension .* is not a symbol of the program"):
        Executable(program, jitted[1])
    assert S0.name == "s0"


def test_program_objects_with_unknown_kernels_or_slot_kinds_are_refused(jitted, weight):
    from dataclasses import replace

    from engine_helpers import dag_program
    from cuvil.runtime import Executable, Slot
    program = dag_program(weight)
    program.steps[2] = replace(program.steps[2], kernel="gelu")
    with pytest.raises(_native.ProgramError, match=r"steps\[2\]: no kernel named 'gelu' in the JIT module"):
        Executable(program, jitted[1])
    program = dag_program(weight)
    program.slots[5] = Slot("scratch")
    with pytest.raises(ValueError, match="slot kind 'scratch' is not input, output, arena, const or status"):
        Executable(program, jitted[1])


def test_tensors_off_the_cpu_are_refused(make_dag):
    a, b = int_inputs(4, seed=0)
    with pytest.raises(_native.RunError, match=r"input 0 \(a\): expected a CPU tensor, got device meta"):
        make_dag()(a.to("meta"), b)
