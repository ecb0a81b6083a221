"""Helpers for the codegen tests: build graph functions, lower and compile many of them in one
LLVM module (compiling is the slow part), and run them kernel by kernel through the ABI.
(A module of its own: `conftest` is a name every test folder uses.)"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import sympy
import torch

from cuvil.codegen.call import call_kernel, evaluate
from cuvil.codegen.jit import CompiledKernels, compile_kernels
from cuvil.codegen.lower import lower_function
from cuvil.ir import Builder, DType, Function, TensorType, sym


def T(*shape, dtype=DType.f32) -> TensorType:
    return TensorType(dtype, tuple(sym(d) if isinstance(d, str) else d for d in shape))


@dataclass
class Graph:
    """A graph function built by `build(builder, *args) -> value(s)`, lowered with the default grouping."""
    name: str
    build: Callable
    arg_types: list
    constants: dict = field(default_factory=dict)
    fn: Function = None
    lowered: list = None

    def __post_init__(self):
        symbols = {s.name: (1, 1 << 16) for t in self.arg_types for d in t.shape if not isinstance(d, int)
                   for s in d.free_symbols}
        self.fn = Function(self.name, self.arg_types, [f"a{i}" for i in range(len(self.arg_types))], symbols)
        b = Builder(self.fn)
        outs = self.build(b, *self.fn.args)
        b.create("cuvil.return", list(outs) if isinstance(outs, (tuple, list)) else [outs])
        self.lowered = lower_function(self.fn)

    @property
    def kernels(self):
        return [lk.kernel for lk in self.lowered]


def compile_graphs(graphs, **kw) -> CompiledKernels:
    return compile_kernels([k for g in graphs for k in g.kernels], cache=None, **kw)


def run(graph: Graph, compiled: CompiledKernels, *inputs: torch.Tensor, split: int = 3):
    """Run a lowered graph: each kernel in turn, outputs allocated from the bound symbol values."""
    sizes: dict[str, int] = {}
    for a, x in zip(graph.fn.args, inputs):
        for d, n in zip(a.type.shape, x.shape):
            if isinstance(d, sympy.Symbol):
                sizes[d.name] = int(n)
    env = {id(a): x for a, x in zip(graph.fn.args, inputs)}
    for op in graph.fn.ops:
        if op.name == "cuvil.const":
            env[id(op.result)] = graph.constants[op.attrs["name"]]
    for lk in graph.lowered:
        tensors = []
        for buf, v in zip(lk.kernel.buffers, lk.values):
            if buf.role == "in":
                tensors.append(env[id(v)])
            elif buf.role == "out":
                env[id(v)] = torch.empty([evaluate(d, sizes) for d in buf.shape], dtype=buf.dtype.torch)
                tensors.append(env[id(v)])
        call_kernel(compiled, lk.kernel.name, tensors, sizes, split=split)
    outs = [env[id(v)] for v in graph.fn.return_op.operands]
    return outs[0] if len(outs) == 1 else outs


def fp64_error_bound(fn, *inputs):
    """(reference in fp64, eager fp32 error against it): the ≤2x-eager tolerance of reductions."""
    ref = fn(*(x.double() for x in inputs))
    eager = fn(*inputs)
    return ref, (eager.double() - ref).abs().max().item()


def assert_within_eager_error(out, ref, eager_err, factor=2.0, floor=1e-6):
    err = (out.double() - ref).abs().max().item()
    assert err <= factor * eager_err + floor * ref.abs().max().item(), \
        f"error {err:.3g} > {factor} x eager's {eager_err:.3g}"
