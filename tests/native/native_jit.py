"""Hand-written LLVM IR kernels in the runtime ABI, JIT-compiled with llvmlite for the engine tests."""
from __future__ import annotations

import llvmlite.binding as llvm

from cuvil.runtime import Kernel, load_module
from cuvil.runtime import blas

llvm.initialize_native_target()
llvm.initialize_native_asmprinter()
llvm.add_symbol(blas.SGEMM, blas.address(blas.SGEMM))


def _load(buf: int) -> str:
    return f"  %b{buf}.p = getelementptr ptr, ptr %bufs, i64 {buf}\n  %b{buf} = load ptr, ptr %b{buf}.p\n"


def _dim(i: int) -> str:
    return f"  %d{i}.p = getelementptr i64, ptr %dims, i64 {i}\n  %d{i} = load i64, ptr %d{i}.p\n"


def elementwise(name: str, n_inputs: int, body: str) -> str:
    """Splittable flat loop: dims = [begin, end, n]; out[i] = body(%x0, %x1, ...) for i in [begin, end)."""
    loads = "".join(f"  %x{k}.p = getelementptr float, ptr %b{k}, i64 %i\n  %x{k} = load float, ptr %x{k}.p\n"
                    for k in range(n_inputs))
    return f"""
define void @{name}(ptr %bufs, ptr %dims) {{
entry:
{"".join(_load(k) for k in range(n_inputs + 1))}{_dim(0)}{_dim(1)}
  %empty = icmp sge i64 %d0, %d1
  br i1 %empty, label %exit, label %loop
loop:
  %i = phi i64 [ %d0, %entry ], [ %next, %loop ]
{loads}{body}
  %o.p = getelementptr float, ptr %b{n_inputs}, i64 %i
  store float %y, ptr %o.p
  %next = add i64 %i, 1
  %done = icmp eq i64 %next, %d1
  br i1 %done, label %exit, label %loop
exit:
  ret void
}}
"""


ADD = elementwise("add", 2, "  %y = fadd float %x0, %x1")
MUL = elementwise("mul", 2, "  %y = fmul float %x0, %x1")

# Not splittable: dims = [n]; out = max(x, 0).
RELU = f"""
define void @relu(ptr %bufs, ptr %dims) {{
entry:
{_load(0)}{_load(1)}{_dim(0)}
  %empty = icmp sle i64 %d0, 0
  br i1 %empty, label %exit, label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %next, %loop ]
  %x.p = getelementptr float, ptr %b0, i64 %i
  %x = load float, ptr %x.p
  %pos = fcmp ogt float %x, 0.0
  %y = select i1 %pos, float %x, float 0.0
  %o.p = getelementptr float, ptr %b1, i64 %i
  store float %y, ptr %o.p
  %next = add i64 %i, 1
  %done = icmp eq i64 %next, %d0
  br i1 %done, label %exit, label %loop
exit:
  ret void
}}
"""

# Splittable along the rows of C = A @ B through OpenBLAS: dims = [begin, end, M, N, K].
MATMUL = f"""
declare void @scipy_cblas_sgemm(i32, i32, i32, i32, i32, i32, float, ptr, i32, ptr, i32, float, ptr, i32)

define void @matmul(ptr %bufs, ptr %dims) {{
entry:
{_load(0)}{_load(1)}{_load(2)}{_dim(0)}{_dim(1)}{_dim(3)}{_dim(4)}
  %rows = sub i64 %d1, %d0
  %empty = icmp sle i64 %rows, 0
  br i1 %empty, label %exit, label %call
call:
  %aoff = mul i64 %d0, %d4
  %a = getelementptr float, ptr %b0, i64 %aoff
  %coff = mul i64 %d0, %d3
  %c = getelementptr float, ptr %b2, i64 %coff
  %m = trunc i64 %rows to i32
  %n = trunc i64 %d3 to i32
  %k = trunc i64 %d4 to i32
  call void @scipy_cblas_sgemm(i32 101, i32 111, i32 111, i32 %m, i32 %n, i32 %k, float 1.0,
                               ptr %a, i32 %k, ptr %b1, i32 %n, float 0.0, ptr %c, i32 %n)
  br label %exit
exit:
  ret void
}}
"""

# Splittable: dims = [begin, end, n]; out[i] = begin (i64) for i in [begin, end): shows each chunk.
MARK_CHUNK = f"""
define void @mark_chunk(ptr %bufs, ptr %dims) {{
entry:
{_load(0)}{_dim(0)}{_dim(1)}
  %empty = icmp sge i64 %d0, %d1
  br i1 %empty, label %exit, label %loop
loop:
  %i = phi i64 [ %d0, %entry ], [ %next, %loop ]
  %o.p = getelementptr i64, ptr %b0, i64 %i
  store i64 %d0, ptr %o.p
  %next = add i64 %i, 1
  %done = icmp eq i64 %next, %d1
  br i1 %done, label %exit, label %loop
exit:
  ret void
}}
"""

# Not splittable: dims = [d0, d1, d2, d3]; writes them to out (i64 x 4).
ECHO_DIMS = f"""
define void @echo_dims(ptr %bufs, ptr %dims) {{
entry:
{_load(0)}
  call void @llvm.memcpy.p0.p0.i64(ptr %b0, ptr %dims, i64 32, i1 false)
  ret void
}}
declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)
"""

# Not splittable: bufs = [flag (i32 in), started (i32 out), seen (i32 out)], dims = [max_iters].
# Sets started, then spins until another thread sets flag (seen = 1) or max_iters pass (seen = 0).
SPIN = f"""
define void @spin(ptr %bufs, ptr %dims) {{
entry:
{_load(0)}{_load(1)}{_load(2)}{_dim(0)}
  store atomic i32 1, ptr %b1 release, align 4
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %next, %cont ]
  %f = load atomic i32, ptr %b0 acquire, align 4
  %set = icmp ne i32 %f, 0
  br i1 %set, label %yes, label %cont
cont:
  %next = add i64 %i, 1
  %more = icmp slt i64 %next, %d0
  br i1 %more, label %loop, label %no
yes:
  store i32 1, ptr %b2
  ret void
no:
  store i32 0, ptr %b2
  ret void
}}
"""

KERNELS = {  # name: (IR, n_slots, n_dims, splittable)
    "add": (ADD, 3, 1, True),
    "mul": (MUL, 3, 1, True),
    "relu": (RELU, 2, 1, False),
    "matmul": (MATMUL, 3, 3, True),
    "mark_chunk": (MARK_CHUNK, 1, 1, True),
    "echo_dims": (ECHO_DIMS, 1, 4, False),
    "spin": (SPIN, 3, 1, False),
}


class JitCode:
    """Owns an MCJIT engine (and with it the machine code); one fresh target machine per engine."""

    def __init__(self, names):
        target = llvm.Target.from_triple(llvm.get_process_triple())
        tm = target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                          features=llvm.get_host_cpu_features().flatten(), opt=2, jit=True)
        mod = llvm.parse_assembly("\n".join(KERNELS[n][0] for n in names))
        mod.triple, mod.data_layout = tm.triple, str(tm.target_data)
        mod.verify()
        pto = llvm.create_pipeline_tuning_options(speed_level=2)
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(mod, pb)
        self.ee = llvm.create_mcjit_compiler(mod, tm)
        self.ee.finalize_object()
        self.kernels = [Kernel(n, self.ee.get_function_address(n), *KERNELS[n][1:]) for n in names]

    def address(self, name: str) -> int:
        return next(k.address for k in self.kernels if k.name == name)


def jit(*names: str):
    """(JitCode, JitModule) for the named kernels (all of them when none are named)."""
    code = JitCode(names or list(KERNELS))
    return code, load_module(code, code.kernels)
