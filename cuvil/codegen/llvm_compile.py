"""LLVM's part of compiling: textual LLVM modules -> one optimised module -> object code.

This file imports nothing from Cuvil (only llvmlite), because it is also the program of the compile
workers (`workers.py`): other processes, started without torch or Cuvil, that compile a share of a
model's kernels while this process compiles the rest. llvmlite serialises every call into LLVM
behind one process-wide lock, so the cores of one process cannot share the work.

Worker protocol, on the worker's stdin and stdout: the worker writes READY once LLVM is
initialised; then each request is a length-prefixed pickle of `compile_texts`'s arguments as a
dict, and each answer a length-prefixed pickle of {"objects", "ir", "timings"} or {"error"}.
"""
from __future__ import annotations

import contextlib
import pickle
import struct
import sys
import time

import llvmlite.binding as llvm

READY = b"R"
_LENGTH = struct.Struct("<Q")


def init_llvm(all_targets: bool = False) -> None:
    """Register LLVM's native target (and all others on request); repeated calls are cheap."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    if all_targets:
        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()


def target_machine(triple: str, cpu: str, features: str, abiname: str = "", opt: int = 3,
                   jit: bool = False) -> llvm.TargetMachine:
    """A fresh TargetMachine (MCJIT and LLJIT take ownership of the one they are given); raises
    RuntimeError when LLVM has no target for `triple`."""
    target = llvm.Target.from_triple(triple)
    return target.create_target_machine(cpu=cpu, features=features, opt=opt, reloc="pic",
                                        codemodel="jitdefault" if jit else "default", jit=jit, abiname=abiname)


def optimize(mod: llvm.ModuleRef, tm: llvm.TargetMachine, opt_level: int = 3) -> None:
    """LLVM's standard per-module pipeline (new pass manager) with loop and SLP vectorisation."""
    pto = llvm.create_pipeline_tuning_options(speed_level=opt_level)
    pto.loop_vectorization = opt_level >= 2
    pto.slp_vectorization = opt_level >= 2
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)


def emit(mod: llvm.ModuleRef, tm: llvm.TargetMachine, arch: str, assembly: bool = False):
    """Code generation: `mod` (optimised) as object code, or as assembly text."""
    with codegen_options(arch):
        return tm.emit_assembly(mod) if assembly else tm.emit_object(mod)


@contextlib.contextmanager
def codegen_options(arch: str):
    # x86-64: no Loop Strength Reduction. Cuvil's loops step few, simple induction variables and
    # measured no faster with it (MLP, CNN, BERT-small, the chain), while LSR took half of code
    # generation on the CNN (0.13 of 0.24 s). It is an LLVM command-line option, global to the
    # process, so it is set only around Cuvil's own code generation (under the LLVM lock).
    if arch != "x86_64":
        yield
        return
    llvm.set_option("cuvil", "-disable-lsr=true")
    try:
        yield
    finally:
        llvm.set_option("cuvil", "-disable-lsr=false")


def parse(text: str) -> llvm.ModuleRef:
    mod = llvm.parse_assembly(text)
    mod.verify()
    return mod


def compile_texts(texts: list[str], triple: str, cpu: str, features: str, abiname: str, opt: int) -> dict:
    """Each module on its own (so that each object can be cached by its module's text), optimised at
    `opt`, as object code: {"objects", "ir" (each optimised module's text), "timings" (parse,
    optimize, codegen: seconds)}."""
    tm = target_machine(triple, cpu, features, abiname, opt)
    timings = {"parse": 0.0, "optimize": 0.0, "codegen": 0.0}
    objects, irs = [], []
    for text in texts:
        t0 = time.perf_counter()
        mod = parse(text)
        mod.triple = triple
        mod.data_layout = str(tm.target_data)
        t1 = time.perf_counter()
        optimize(mod, tm, opt)
        t2 = time.perf_counter()
        objects.append(emit(mod, tm, triple.split("-")[0]))
        t3 = time.perf_counter()
        irs.append(str(mod))
        for phase, seconds in zip(timings, (t1 - t0, t2 - t1, t3 - t2)):
            timings[phase] += seconds
    return {"objects": objects, "ir": irs, "timings": timings}


def write_message(stream, message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def read_message(stream):
    """The next message, or None at the end of the stream."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    return pickle.loads(stream.read(_LENGTH.unpack(head)[0]))


def serve(inp, out) -> None:
    """The worker's loop: answer requests until stdin closes."""
    init_llvm()
    host_arch = llvm.get_process_triple().split("-")[0]
    out.write(READY)
    out.flush()
    while (request := read_message(inp)) is not None:
        try:
            init_llvm(all_targets=request["triple"].split("-")[0] != host_arch)
            answer = compile_texts(**request)
        except Exception as e:      # reported to the compiling process, which raises it there
            answer = {"error": f"{type(e).__name__}: {e}"}
        write_message(out, answer)


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
