"""Status slots: a kernel's index checks set bits in a status word the engine zeroes before each
call; after the call the engine raises CuvilIndexError with the message of the lowest bit set in
the first status slot that has one (runtime/engine.py). Kernels from kernel IR text, run through
the engine directly."""
import pytest
import torch

from cuvil import CuvilIndexError
from cuvil.codegen.jit import compile_kernels
from cuvil.codegen.kernel_text import parse_kernels
from cuvil.ir.types import DType, TensorType
from cuvil.runtime import Executable, Program, ProgramError, Slot, Split, Step, load_module

TAKE = """
kernel @take(%t: in f32[8], %i: in i64[64], %y: out f32[64], %s: status i32[1]) {
  parallel for k in 0..64 {
    %j = %i[k]
    %in = and(ge(%j, 0:i64), lt(%j, 8:i64))
    check %s, select(%in, 0:i32, 4:i32)
    check %s, select(ne(%j, 7:i64), 0:i32, 2:i32)
    %y[k] = masked(%t[%j], %in, nan:f32)
  }
}
"""
ERRORS = ("bit 0: unused", "seven is refused", "outside the table")


@pytest.fixture(scope="module")
def take():
    compiled = compile_kernels(parse_kernels(TAKE), cache=None)
    module = load_module(compiled, compiled.runtime_kernels())
    i64, f32 = DType.i64, DType.f32
    program = Program(inputs=[TensorType(f32, (8,)), TensorType(i64, (64,))], outputs=[TensorType(f32, (64,))],
                      slots=[Slot.input(0, TensorType(f32, (8,))), Slot.input(1, TensorType(i64, (64,))),
                             Slot.output(0, TensorType(f32, (64,))), Slot.status(ERRORS)],
                      steps=[Step("take", [0, 1, 2, 3], [64], split=Split(0, 10_000))])
    return Executable(program, module, min_chunk_ns=1), compiled


def test_a_failed_check_raises_its_message_after_the_call(take, pool_threads):
    pool_threads(2)                           # the chunks run at once: the status word takes an atomic or
    run, _ = take
    t, i = torch.randn(8), torch.randint(0, 7, (64,))
    for _ in range(2):
        torch.testing.assert_close(run(t, i)[0], t[i])
        for where in (0, 63):                 # in the first chunk and the last
            bad = i.clone()
            bad[where] = 9
            with pytest.raises(CuvilIndexError, match="^outside the table$"):
                run(t, bad)
        bad = i.clone()
        bad[5], bad[40] = 7, -1               # bits 1 and 2: the lowest one's message
        with pytest.raises(CuvilIndexError, match="^seven is refused$"):
            run(t, bad)
    torch.testing.assert_close(run(t, i)[0], t[i])      # the status is zeroed for the next call


def test_a_status_slot_takes_a_list_of_messages(take):
    _, compiled = take
    module = load_module(compiled, compiled.runtime_kernels())
    program = Program(inputs=[], outputs=[], slots=[Slot.status(("ok",))], steps=[])
    description = program.describe({})
    description["slots"][0]["errors"] = ["ok", 3]
    from cuvil import _native
    with pytest.raises(ProgramError, match=r"slots\[0\]\.errors\[1\]: expected a str"):
        _native.Engine(module, description)
