"""Per-op provenance inside a kernel: the lowering records the graph op each kernel-IR node was built
for, the emitter turns that into debug locations, and `CompiledKernels.op_lines` reads them back
from the optimised LLVM IR and the assembly. Checked on x -> linear -> relu -> add, one kernel (a
GEMM with a relu and a residual add in its epilogue), against facts about that kernel: the relu is
the only max, the linear the only GEMM call, the add the only addition after the bias."""
from __future__ import annotations

import re

import pytest

from cuvil.codegen.jit import CodeLines, build_module, compile_kernels, kernel_identity, optimize
from cuvil.codegen.kernel_ir import Call, Const, Load, stamp
from cuvil.codegen.kernel_text import parse_kernel
from cuvil.codegen.target import Target
from cuvil.ir import DType

from codegen_helpers import Graph, T

RELU = {"x86_64": r"\bv?maxps\b", "aarch64": r"\bfcmlt\b"}     # relu: x < 0 ? 0 : x
ADD = {"x86_64": r"\bv?addps\b", "aarch64": r"\bfadd\b"}


def linear_relu_add(rows: int = 64) -> Graph:
    """64 rows: more than the small-GEMM limit (8), so the linear calls OpenBLAS's sgemm."""
    return Graph("lra", lambda b, x, w, bias, r: b("cuvil.add", b("cuvil.relu", b("cuvil.linear", x, w, bias)), r),
                 [T(rows, 16), T(32, 16), T(32), T(rows, 32)])


@pytest.fixture(scope="module")
def compiled():
    g = linear_relu_add()
    (lk,) = g.lowered
    assert [op.name for op in lk.ops] == ["cuvil.linear", "cuvil.relu", "cuvil.add"]
    ops = {op.name.split(".")[1]: op.id for op in lk.ops}
    return g, ops, compile_kernels([lk.kernel], cache=None)


def lines_of(text: str, ranges) -> list[str]:
    rows = text.splitlines()
    return [rows[n - 1] for first, last in ranges for n in range(first, last + 1)]


def code_of(compiled, view: str) -> dict[int, list[str]]:
    """op id -> its lines of `view` (kernel_ir, llvm_ir or asm)."""
    ck = compiled
    (name,) = ck.kernels
    text = {"kernel_ir": ck.kernel_ir, "llvm_ir": ck.llvm_ir, "asm": ck.asm}[view](name)
    return {e["op"]: lines_of(text, e[view]) for e in ck.op_lines(name)}


def test_kernel_ir_lines_per_op(compiled):
    g, ops, ck = compiled
    ir = code_of(ck, "kernel_ir")
    store = [line for line in ck.kernel_ir(g.kernels[0].name).splitlines() if "= add(select(lt(add(" in line]
    gemm = [line for line in ck.kernel_ir(g.kernels[0].name).splitlines() if line.strip().startswith("gemm ")]
    assert len(store) == 1 and len(gemm) == 1
    # the linear made the GEMM and the bias add in the epilogue; relu and add only the epilogue's store
    assert ir[ops["linear"]] == gemm + store
    assert ir[ops["relu"]] == store and ir[ops["add"]] == store


def test_assembly_lines_per_op(compiled):
    g, ops, ck = compiled
    arch = Target.host().arch
    asm = code_of(ck, "asm")
    assert any(re.search(RELU[arch], line) for line in asm[ops["relu"]])
    assert any(re.search(r"call\w*\s+\*?scipy_cblas_sgemm", line) for line in asm[ops["linear"]])
    assert any(re.search(ADD[arch], line) for line in asm[ops["add"]])
    # and nowhere else: the only vmaxps is the relu's, the only GEMM call the linear's
    (name,) = ck.kernels
    every = ck.asm(name).splitlines()
    assert sorted(line for line in every if re.search(RELU[arch], line)) == sorted(
        line for line in asm[ops["relu"]] if re.search(RELU[arch], line))
    assert not any("sgemm" in line for op in ("relu", "add") for line in asm[ops[op]])


@pytest.mark.parametrize("view", ["llvm_ir", "asm"])
def test_each_line_of_code_has_one_op(compiled, view):
    g, ops, ck = compiled
    (name,) = ck.kernels
    entries = ck.op_lines(name)
    seen: dict[int, int] = {}
    for e in entries:
        for first, last in e[view]:
            for n in range(first, last + 1):
                assert seen.setdefault(n, e["op"]) == e["op"], f"line {n} of the {view} is claimed by two ops"
    assert {e["op"] for e in entries} == set(ops.values())
    assert all(e[view] for e in entries)      # every op of this kernel has code of its own


def test_debug_locations_do_not_change_the_code(compiled):
    g, ops, ck = compiled
    target = Target.host()
    asm = {}
    for debug in (True, False):
        mod = build_module(g.kernels, {k.name: k.name for k in g.kernels}, target, debug=debug)
        tm = target.target_machine()
        mod.data_layout = str(tm.target_data)
        optimize(mod, tm)
        asm[debug] = tm.emit_assembly(mod)
    assert "\t.loc\t" in asm[True] and "\t.loc\t" not in asm[False]
    code = {debug: CodeLines.of_asm(text.split("\t.section\t.debug_")[0].split('\t.section\t".note')[0]).text
            for debug, text in asm.items()}
    assert code[True] == code[False]
    # the texts the report shows carry no debug noise
    (name,) = ck.kernels
    assert any("!dbg" in text for text in ck.llvm_ir_texts) and "!dbg" not in ck.llvm_ir(name)
    assert not re.search(r"^\s*\.(loc|file|cfi_)", ck.asm(name), re.M)


ADD_RELU = """kernel @k(%a: in f32[64], %b: in f32[64], %y: out f32[64]) {
  parallel for i in 0..64 {
    %y[i] = max(add(%a[i], %b[i]), 0.0:f32)
  }
}
"""


def test_origins_shape_identity_but_not_values():
    def stamped(inner: int | None, outer: int):
        k = parse_kernel(ADD_RELU)
        store = k.body[0].body[0]
        if inner is not None:
            stamp([store.value.args[0]], inner)     # add(...) from one op
        stamp([store], outer)                       # the rest from another
        return k
    one_op, two_ops, two_other_ids = stamped(None, 5), stamped(3, 5), stamped(70, 90)
    # same text, different split into ops: different functions (their debug locations differ)
    assert kernel_identity(one_op).split("// ops")[0] == kernel_identity(two_ops).split("// ops")[0]
    assert kernel_identity(one_op) != kernel_identity(two_ops)
    # op ids do not enter: the same split with other ids is the same function (and cache key)
    assert kernel_identity(two_ops) == kernel_identity(two_other_ids)
    # an origin is not part of a node's value
    a, b = Load(parse_kernel(ADD_RELU).buffers[0], [0]), Const(0.0, DType.f32)
    x, y = Call("max", (a, b), origin=1), Call("max", (a, b), origin=2)
    assert x == y and hash(x) == hash(y)


def test_same_graph_lowered_twice_shares_identity():
    k1, k2 = linear_relu_add().kernels[0], linear_relu_add().kernels[0]    # fresh ops, fresh ids
    assert kernel_identity(k1) == kernel_identity(k2)


def test_cross_target_assembly_has_op_lines():
    g = linear_relu_add(rows=4)
    (lk,) = g.lowered
    relu = next(op.id for op in lk.ops if op.name == "cuvil.relu")
    ck = compile_kernels([lk.kernel], target=Target.cross("aarch64"), cache=None)
    asm = code_of(ck, "asm")
    assert any(re.search(RELU["aarch64"], line) for line in asm[relu])
