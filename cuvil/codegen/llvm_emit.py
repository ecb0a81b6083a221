"""Kernel IR -> LLVM IR (llvmlite.ir): a module of kernels (`ModuleBuilder`), or one module per kernel
(`jit.iter_units`, with `SharedHelpers` placing the GEMM loop nests they call).

Each kernel becomes two functions:

- `void @<symbol>(ptr %bufs, ptr %dims)`: the exported ABI entry. It loads the buffer pointers and
  dims and calls
- `internal void @<symbol>.body(ptr noalias %b0, ..., i64 %begin, i64 %end, i64 %s0, ...)`: the code.
  `noalias` tells LLVM the buffers do not overlap (the vectoriser needs it); after inlining into
  the entry it becomes alias-scope metadata.

Loop variables are phis; reduction accumulators are allocas that LLVM promotes to phis. Float
arithmetic is plain IEEE except the combine step of reductions, which carries `reassoc contract`
so LLVM may vectorise and reorder the sum (Cuvil's reductions are compared against an fp64
reference, not bit-for-bit against eager); long float sums are blocked and the blocks added
pairwise (`KernelEmitter._pairwise_sum`, docs/codegen.md#llvm-emission). Scalar functions come from two tables, `FLOAT_OPS` and
`INT_OPS` (one small emitter per function); exp/log/tanh/erf/sigmoid, the trigonometric and hyperbolic functions, pow and atan2 are Cuvil's own
branch-free implementations in `mathlib`.

Debug locations tie the code to the kernel IR: each kernel's functions get a DISubprogram (file
`<symbol>.kir`, line table only), and each instruction a location whose line is the line of its
statement in the kernel IR text (`print_kernel`) and whose column is the slot of the graph op it
was built for (`LineMap.slots`: 1, 2, ... in order of first appearance; 0 for the kernel's own
loops). Both depend only on the kernel's structure, so kernels that share code share them too.
LLVM keeps locations through optimisation (vectorised and inlined code keeps its origin) and the
assembly gets them as `.loc` lines (`jit.CompiledKernels.op_lines` reads them back). They do not
change the generated code.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import sympy
from llvmlite import ir

from ..ir.types import DType, norm_dim
from .kernel_ir import (Buffer, Call, Cast, Check, Const, Expr, Gemm, Index, Kernel, Let, Load, Loop, Reduce, Store, TopK,
                        Var, GEMM_TAPS, GEMM_WINDOW, loop_var, operands)
from .collapse import collapsed_loops
from .kernel_text import LineMap, print_kernel
from .mathlib import F32, I1, I64, MathLib, intrinsic
from .panel_gemm import (ARGS as PANEL_GEMM_ARGS, PanelNeeds, chunks_k, emit_panel_gemm, for_range, loop_metadata,
                         panel_gemm_name, panel_rows, row_blocks, streams)
from .target import Target
from .transpose_tile import (COLUMN, ROW, TILE, TRANSPOSE_ORDER, TRANSPOSE_STAGES, TransposedTile,
                             transposed_tile)
from .value_range import FORMS, ValueRanges, math_form

I8, I16, I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
PTR = ir.PointerType()

VALUE_TYPES = {DType.f32: F32, DType.f16: ir.HalfType(), DType.bf16: I16, DType.i64: I64, DType.i32: I32,
               DType.i8: I8, DType.bool: I1}
MEMORY_TYPES = {**VALUE_TYPES, DType.bool: I8}

GEMM_SYMBOL = "scipy_cblas_sgemm"
CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_TRANS = 101, 111, 112
# Up to this many rows of C, a GEMM runs Cuvil's own loops (`small_gemm_function`) instead of
# OpenBLAS, whose sgemm packs a whole panel of B even for one row (measured: 3.4x slower at
# 1x1024x1024); the loops stream B once, at memory speed.
SMALL_GEMM_MAX_ROWS = 8
REDUCE_FLAGS = ("reassoc", "contract")
# Float sums longer than this many elements are summed in blocks of it, the block sums pairwise
# (`KernelEmitter._pairwise_sum`); PAIRWISE_DEPTH bounds the stack of pending block sums (2**64 blocks).
SUM_BLOCK = 256
VECTOR_FLOATS = 8   # f32 lanes of a ymm register (16 in a zmm)
# What LLVM's vector loop sums per iteration, in vector registers of the target's width (8 floats
# with AVX2, 16 with AVX-512, 4 with NEON)
SUM_INTERLEAVE = 4
# Independent vectors a latency-bound elementwise loop works on at once (`_latency_bound`); the
# 20-op chain with six transcendental ops measured 29 -> 19 -> 18 us per 4096 elements for 1, 2, 4
LATENCY_INTERLEAVE = 4
LOCAL_ALIGN = 64        # a local buffer starts on a cache line (vector loads and stores that do not split)
LATENCY_FUNCS = frozenset({"exp", "exp_ftz", "log", "log1p", "expm1", "tanh", "erf", "sigmoid", "sin", "cos", "tan", "atan", "asin",
                           "acos", "sinh", "cosh", "asinh", "acosh", "atanh", "atan2", "pow", "sqrt", "rsqrt",
                           "div", "reciprocal"})
PAIRWISE_DEPTH = 64


class ModuleBuilder:
    """Collects kernels into one llvmlite module (with debug locations unless `debug=False`)."""

    def __init__(self, name: str = "cuvil", debug: bool = True, target: Target | None = None,
                 helpers: "SharedHelpers | None" = None):
        self.target = target or Target.host()
        self.module = ir.Module(name)
        self.module.triple = self.target.triple
        self.math = MathLib(self.module, scalef=self.target.has_feature("avx512f"))
        self.unit = self._compile_unit() if debug else None
        self.helpers = helpers

    def _compile_unit(self) -> ir.DIValue:
        m = self.module
        for flag, value in (("Dwarf Version", 4), ("Debug Info Version", 3)):
            m.add_named_metadata("llvm.module.flags", [ir.Constant(I32, 2), flag, ir.Constant(I32, value)])
        unit = m.add_debug_info("DICompileUnit", {
            "language": ir.DIToken("DW_LANG_C99"), "file": self.file("cuvil.kir"), "producer": "cuvil",
            "isOptimized": True, "runtimeVersion": 0, "emissionKind": ir.DIToken("LineTablesOnly")}, is_distinct=True)
        m.add_named_metadata("llvm.dbg.cu", unit)
        return unit

    def file(self, name: str) -> ir.DIValue:
        return self.module.add_debug_info("DIFile", {"filename": name, "directory": ""})

    def subprogram(self, name: str, file: ir.DIValue) -> ir.DIValue | None:
        """A function's debug scope (None without debug info)."""
        if self.unit is None:
            return None
        m = self.module
        return m.add_debug_info("DISubprogram", {
            "name": name, "scope": file, "file": file, "line": 1, "scopeLine": 1, "unit": self.unit,
            "type": m.add_debug_info("DISubroutineType", {"types": m.add_metadata([])}),
            "spFlags": ir.DIToken("DISPFlagDefinition | DISPFlagOptimized")}, is_distinct=True)

    def add_kernel(self, kernel: Kernel, symbol: str | None = None, lines: LineMap | None = None) -> str:
        """Emit `kernel` as `symbol`; `lines`: where `print_kernel` puts its statements (printed
        here when not given)."""
        symbol = symbol or kernel.name
        if lines is None:
            lines = LineMap()
            print_kernel(kernel, lines=lines)
        KernelEmitter(self, kernel, symbol, lines).emit()
        return symbol

    def gemm_function(self) -> ir.Function:
        fn = self.module.globals.get(GEMM_SYMBOL)
        if fn is None:
            fnty = ir.FunctionType(ir.VoidType(), [I32] * 6 + [F32, PTR, I32, PTR, I32, F32, PTR, I32])
            fn = ir.Function(self.module, fnty, name=GEMM_SYMBOL)
        return fn

    def topk_function(self, symbol: str) -> ir.Function:
        """The runtime's `void cuvil_topk_<dtype>(ptr x, i64 n, i64 stride, i64 k, i32 mode,
        ptr out, i64 out_stride)` (native/src/select.h)."""
        fn = self.module.globals.get(symbol)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [PTR, I64, I64, I64, I32, PTR, I64]),
                             name=symbol)
            fn.attributes.add("nounwind")
        return fn

    def small_gemm_function(self, trans_b: bool, beta: bool) -> ir.Function:
        """`void (i64 m, i64 n, i64 k, float alpha, ptr A, i64 lda, ptr B, i64 ldb, float beta, ptr C,
        i64 ldc)`: C = alpha * A @ op(B) (+ beta * C when `beta`), row-major, A not transposed.
        LLVM vectorises the inner loops at O3."""
        return self._helper(small_gemm_name(trans_b, beta),
                            ir.FunctionType(ir.VoidType(), [I64] * 3 + [F32, PTR, I64, PTR, I64, F32, PTR, I64]),
                            lambda fn, _: (_emit_small_gemm_nt if trans_b else _emit_small_gemm_nn)(fn, beta))

    def panel_gemm_function(self, width: int, bias: bool, relu: bool, m, k, chunked: bool = False,
                            bias_rows: bool = False) -> ir.Function:
        """C = A @ B (+ bias, relu) with B packed in panels of `width` columns, A read through a
        window (`panel_gemm.py`), blocked for the target's vector registers; `m`, `k`: this call's
        rows and reduction (expressions); `chunked`: k walked in chunks that keep a panel's part in L2;
        `bias_rows`: a bias per row of C, not per column."""
        lanes = self.target.vector_floats
        rows = panel_rows(lanes, self.target.vector_registers, width)
        name = panel_gemm_name(width, bias, relu, chunked, bias_rows)
        if self.helpers is not None:
            self.helpers.need(name, PanelNeeds(row_blocks(m, rows), streams(k, width)))
        return self._helper(name, ir.FunctionType(ir.VoidType(), PANEL_GEMM_ARGS),
                            lambda fn, needs: emit_panel_gemm(fn, lanes, rows, width, bias, relu, needs, chunked,
                                                              bias_rows))

    def _helper(self, name: str, fnty: ir.FunctionType, define: Callable) -> ir.Function:
        """A GEMM loop nest kernels call: defined in this module (internal, for every call:
        `define(fn, None)`), or, when kernels are modules of their own, declared here and left to
        `self.helpers` to place."""
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, fnty, name=name)
            fn.attributes.add("nounwind")
            if self.helpers is None:
                fn.linkage = "internal"
                define(fn, None)
            else:
                self.helpers.declared(fn, define)
        return fn


class SharedHelpers:
    """The GEMM loop nests of kernels built one module each (`jit.iter_units`): a helper one
    module calls is defined in it (internal, so LLVM may inline it); one that several call
    (`shared`, known before any module is written: `helper_names`) is defined once, in a module of
    its own that they link against (LLVM would not inline a body that large into several callers
    either). A helper is defined with what all its calls need (`need`): the panel GEMM only with
    the row blocks of its callers' m, and prefetching where one of them streams its panels
    (`PanelNeeds`)."""

    def __init__(self, target: Target, shared: set[str] = frozenset()):
        self.target, self.shared = target, shared
        self.uses: dict[str, list[tuple[ir.Function, Callable]]] = {}
        self.needs: dict[str, PanelNeeds] = {}

    def declared(self, fn: ir.Function, define: Callable) -> None:
        self.uses.setdefault(fn.name, []).append((fn, define))

    def need(self, name: str, what: PanelNeeds) -> None:
        """One call of helper `name` needs `what`."""
        self.needs[name] = self.needs[name] | what if name in self.needs else what

    def define_own(self) -> None:
        """Define, where they were declared, the helpers declared so far that are not shared: a
        module is complete once its kernel is emitted and this has run."""
        for name in [n for n in self.uses if n not in self.shared]:
            for fn, define in self.uses.pop(name):
                fn.linkage = "internal"
                define(fn, self.needs.pop(name, None))

    def place(self) -> "ModuleBuilder | None":
        """Define the shared helpers; returns their module (None when there are none)."""
        self.define_own()
        shared = None
        for name, uses in self.uses.items():
            shared = shared or ModuleBuilder("cuvil.shared", debug=False, target=self.target)
            fn = ir.Function(shared.module, uses[0][0].ftype, name=name)
            fn.attributes.add("nounwind")
            fn.attributes.add("noinline")   # the same code whichever callers share its object
            uses[0][1](fn, self.needs.get(name))
        return shared


def helper_names(kernel: Kernel) -> set[str]:
    """The GEMM loop nests `kernel`'s code will call (`KernelEmitter.gemm`)."""
    out = set()

    def walk(stmts):
        for s in stmts:
            if isinstance(s, Loop):
                walk(s.body)
            elif isinstance(s, Gemm):
                if s.b_panels:
                    out.add(panel_gemm_name(s.b_panels, s.bias is not None, s.relu, panel_chunked(s), s.bias_rows))
                elif not blas_only(s):
                    out.add(small_gemm_name(s.trans_b, s.beta != 0.0))
    walk(kernel.body)
    return out


def small_gemm_name(trans_b: bool, beta: bool) -> str:
    return f"cuvil.small_gemm.{'nt' if trans_b else 'nn'}{'.beta' if beta else ''}"


def panel_chunked(s: Gemm) -> bool:
    """Whether a panel GEMM walks k in chunks (`panel_gemm.chunks_k`): a convolution's, over runs."""
    return s.a_rows is not None and chunks_k(norm_dim(s.k), norm_dim(s.k_run), s.b_panels)


def blas_only(s: Gemm) -> bool:
    """Whether a GEMM without panels always goes to OpenBLAS: A transposed, or more rows than
    Cuvil's small GEMM takes."""
    m = sympy.sympify(s.m)
    return s.trans_a or (m.is_Integer and m > SMALL_GEMM_MAX_ROWS)


class KernelEmitter:
    def __init__(self, mb: ModuleBuilder, kernel: Kernel, symbol: str, lines: LineMap):
        self.mb, self.kernel, self.symbol = mb, kernel, symbol
        self.scalars: dict[str, ir.Value] = {}
        self.ranges = ValueRanges()             # for the cheaper forms of exp and log
        self.indices: dict[sympy.Symbol, ir.Value] = {}
        self._emitted_indices: dict[tuple, ir.Value] = {}   # (block, expression) -> value (`index`)
        self._loaded: dict[tuple, ir.Value] = {}            # (block, buffer, index) -> value (`_plain_load`)
        self.bufs: dict[str, ir.Value] = {}
        self.lines, self.slots = lines, lines.slots()
        self.line = 1                   # the kernel IR line of the statement being emitted
        self.file = mb.file(symbol + ".kir") if mb.unit is not None else None
        self.scope: ir.DIValue | None = None
        self._locations: dict[tuple, ir.DIValue] = {}
        self.hidden_infinities = False      # inside a float max/min reduction (`_hidden_constant`)
        self._hidden: dict[tuple, ir.Value] = {}

    # -- debug locations
    def location(self, line: int, origin: int | None) -> ir.DIValue | None:
        """The debug location of kernel IR line `line`, column the slot of op `origin`."""
        if self.scope is None:
            return None
        key = (self.scope, line, origin)
        loc = self._locations.get(key)
        if loc is None:
            loc = self._locations[key] = self.mb.module.add_debug_info(
                "DILocation", {"line": line, "column": self.slots.get(origin, 0), "scope": self.scope})
        return loc

    def at(self, line: int, origin: int | None) -> None:
        """Attribute the instructions emitted from now on to `line` and op `origin`."""
        self.line = line
        self.b.debug_metadata = self.location(line, origin)

    # -- functions
    def emit(self) -> None:
        k = self.kernel
        args = [PTR] * len(k.buffers) + [I64] * self.n_dims
        body = ir.Function(self.mb.module, ir.FunctionType(ir.VoidType(), args), name=self.symbol + ".body")
        body.linkage = "internal"
        body.attributes.add("nounwind")
        self.scope = self._debug_scope(body)
        for a, buf in zip(body.args, k.buffers):
            a.add_attribute("noalias")
            a.name = "b_" + _llvm_name(buf.name)
            self.bufs[buf.name] = a
        dims = body.args[len(k.buffers):]
        if k.parallel_loop is not None:
            self.begin, self.end, *dims = dims
            self.begin.name, self.end.name = "begin", "end"
        for a, name in zip(dims, k.symbols + ["extent"]):
            a.name = _llvm_name(name)
            self.indices[sympy.Symbol(name, integer=True, positive=True)] = a
        self.fn = body
        self.entry = body.append_basic_block("entry")
        start = body.append_basic_block("start")
        for buf in k.locals:
            slot = ir.IRBuilder(self.entry).alloca(MEMORY_TYPES[buf.dtype], size=ir.Constant(I64, math.prod(buf.shape)),
                                                   name="l_" + _llvm_name(buf.name))
            slot.align = LOCAL_ALIGN
            slot.type = PTR      # an opaque pointer, as the parameters are (llvmlite types it float*)
            self.bufs[buf.name] = slot
        self.b = ir.IRBuilder(start)
        self.at(1, None)
        self.failed = None
        status = next((b for b in k.buffers if b.role == "status"), None)
        if status is not None:
            self.failed = self._accumulator(I32, "failed")
            ir.IRBuilder(self.entry).store(ir.Constant(I32, 0), self.failed)
        self.block(k.body)
        if status is not None:
            self._report_failed(self.bufs[status.name])
        self.b.ret_void()
        ir.IRBuilder(self.entry).branch(start)   # allocas go into `entry`, before this branch
        self._entry_point(body)

    def _entry_point(self, body: ir.Function) -> None:
        k = self.kernel
        fn = ir.Function(self.mb.module, ir.FunctionType(ir.VoidType(), [PTR, PTR]), name=self.symbol)
        fn.attributes.add("nounwind")
        bufs, dims = fn.args
        bufs.name, dims.name = "bufs", "dims"
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        self.scope = self._debug_scope(fn)
        b.debug_metadata = self.location(1, None)
        args = [b.load(b.gep(bufs, [ir.Constant(I64, i)], inbounds=True, source_etype=PTR), typ=PTR, align=8)
                for i in range(len(k.buffers))]
        args += [b.load(b.gep(dims, [ir.Constant(I64, i)], inbounds=True, source_etype=I64), typ=I64, align=8)
                 for i in range(self.n_dims)]
        b.call(body, args)
        b.ret_void()

    def _debug_scope(self, fn: ir.Function) -> ir.DIValue | None:
        sp = self.mb.subprogram(fn.name, self.file) if self.file is not None else None
        if sp is not None:
            fn.set_metadata("dbg", sp)
        return sp

    @property
    def n_dims(self) -> int:
        """Entries of `dims` the kernel reads: begin and end when splittable, then the dim values."""
        k = self.kernel
        return (2 if k.parallel_loop is not None else 0) + len(k.dim_exprs)

    # -- statements
    def block(self, stmts) -> None:
        outer = self.line, self.b.debug_metadata
        for s in stmts:
            if not isinstance(s, Let):      # a Let writes no memory: loads before it still hold
                self._loaded.clear()
            self.at(self.lines.statements[id(s)], s.origin)
            STATEMENTS[type(s)](self, s)
        self.line, self.b.debug_metadata = outer     # a loop's latch is the loop's

    def let(self, s: Let) -> None:
        self.scalars[s.var.name] = self.expr(s.value)
        self.ranges.let(s.var.name, s.value)

    def store(self, s: Store) -> None:
        value = self.expr(s.value)
        if s.buf.dtype == DType.bool:
            value = self.b.zext(value, I8)
        self.b.store(value, self.address(s.buf, s.index), align=s.buf.dtype.itemsize)

    def check(self, s: Check) -> None:
        """The checks failed so far, or-ed into a local that LLVM promotes to a phi: an or
        reduction (one cycle a step on the loop's critical path), where a store per check would
        stop vectorisation (`_report_failed` stores it once)."""
        self.b.store(self.b.or_(self.b.load(self.failed, typ=I32), self.expr(s.value)), self.failed)

    def _report_failed(self, status: ir.Value) -> None:
        """At the end of the call, the failed checks into the status word: an atomic or, as the
        chunks of a split kernel run at once on several threads."""
        failed = self.b.load(self.failed, typ=I32)
        with self.b.if_then(self.b.icmp_unsigned("!=", failed, ir.Constant(I32, 0)), likely=False):
            self.b.atomic_rmw("or", status, failed, "monotonic")

    def loop(self, s: Loop) -> None:
        tile = transposed_tile(s)
        if tile is None:
            self._loop(s)
            return
        # an edge tile (extents min(8, ...) of the tiles' loops) runs the loops
        whole = [self.b.icmp_signed("==", self.index(loop.extent), ir.Constant(I64, TILE))
                 for loop in (s, s.body[0]) if not sympy.sympify(loop.extent).is_Integer]
        if not whole:
            self._transpose_tile(s, tile)
            return
        with self.b.if_else(self.b.and_(*whole) if len(whole) == 2 else whole[0]) as (then, otherwise):
            with then:
                self._transpose_tile(s, tile)
            with otherwise:
                self._loop(s)

    def _loop(self, s: Loop) -> None:
        start = self.index(s.start)
        if s.parallel:   # the runtime gives this call the sub-range [begin, end) of 0..extent
            lo, hi = self.b.add(start, self.begin, flags=["nsw"]), self.b.add(start, self.end, flags=["nsw"])
        else:
            lo, hi = start, self.b.add(start, self.index(s.extent), flags=["nsw"])
        latch = self.counted_loop(s.var, lo, hi, lambda: self.block(s.body))
        if _vector_loop(s):
            props = [("llvm.loop.unroll.disable",)]
            if _latency_bound(s.body):
                props.append(("llvm.loop.interleave.count", LATENCY_INTERLEAVE))
            latch.set_metadata("llvm.loop", loop_metadata(self.mb.module, *props))
        elif not s.parallel and not _innermost(s):
            # LLVM would fully unroll a short loop around other loops. Around a vector loop it does
            # so before vectorising, then vectorises one copy: a 3x3 depthwise's 4 column copies
            # left 3 scalar (44 -> 12 us), and 56 copies of a transposing copy's gathers took 0.9 s
            # to schedule. Around other loop nests the copies only cost compile time: unrolling
            # attention's packing copies and its two row blocks took BERT-small's attention
            # module from 144 to 180 ms of LLVM, and ran no faster
            latch.set_metadata("llvm.loop", loop_metadata(self.mb.module, ("llvm.loop.unroll.disable",)))
        elif s.parallel and _innermost(s) and _latency_bound(s.body):    # a 1-d elementwise kernel
            latch.set_metadata("llvm.loop", loop_metadata(self.mb.module, ("llvm.loop.interleave.count",
                                                                           LATENCY_INTERLEAVE)))

    def _transpose_tile(self, outer: Loop, tile: TransposedTile) -> None:
        """`transpose_tile`'s tile in registers: each transposed input as TILE vector loads and the
        shuffles of `TRANSPOSE_STAGES`, then per row of the tile one vector expression and one
        vector store."""
        store = tile.store
        self.at(self.lines.statements[id(store)], store.origin)
        a, b = loop_var(outer.var), loop_var(outer.body[0].var)
        a0, b0 = self.index(outer.start), self.index(outer.body[0].start)
        step = lambda start, k: self.b.add(start, ir.Constant(I64, k), flags=["nsw"])   # noqa: E731

        def address(access, ka: int, kb: int) -> ir.Value:
            self.bind(a, step(a0, ka))
            self.bind(b, step(b0, kb))
            return self.address(access.buf, access.index)

        def load(x: Load, ka: int, kb: int) -> ir.Value:
            vec = ir.VectorType(MEMORY_TYPES[x.buf.dtype], TILE)
            return self.b.load(address(x, ka, kb), typ=vec, align=x.buf.dtype.itemsize)

        columns = {}
        for x in tile.columns:
            rows = [load(x, 0, k) for k in range(TILE)]
            for pairs, masks in TRANSPOSE_STAGES:
                rows = [self.b.shuffle_vector(rows[i], rows[j], ir.Constant(ir.VectorType(I32, TILE), m))
                        for i, j in pairs for m in masks]
            columns[id(x)] = {TRANSPOSE_ORDER[k]: row for k, row in enumerate(rows)}

        done: dict[tuple[int, int], ir.Value] = {}     # a row's shared subexpressions (relu's select) once

        def value(e: Expr, ka: int) -> ir.Value:
            if (id(e), ka) not in done:
                done[id(e), ka] = row_value(e, ka)
            return done[id(e), ka]

        def row_value(e: Expr, ka: int) -> ir.Value:
            if isinstance(e, Load):
                kind = tile.reads[id(e)]
                if kind == COLUMN:
                    return columns[id(e)][ka]
                if kind == ROW:
                    return load(e, ka, 0)
                address(e, ka, 0)
                return self._splat(self._plain_load(e))
            if isinstance(e, Call):
                table = SHARED_OPS if e.fn in SHARED_OPS else FLOAT_OPS
                return table[e.fn](self, *(value(x, ka) for x in e.args))
            return self._splat(self.expr(e))

        for ka in range(TILE):
            row = value(store.value, ka)
            self.b.store(row, address(store, ka, 0), align=store.buf.dtype.itemsize)

    def _splat(self, v: ir.Value) -> ir.Value:
        one = self.b.insert_element(ir.Constant(ir.VectorType(v.type, TILE), ir.Undefined), v, ir.Constant(I32, 0))
        return self.b.shuffle_vector(one, one, ir.Constant(ir.VectorType(I32, TILE), [0] * TILE))

    def counted_loop(self, var: str, lo, hi, body: Callable[[], None]) -> ir.Instruction:
        """for var in lo..hi: body(); returns the back-edge branch (for loop metadata)."""
        b = self.b
        pre = b.block
        header = self.fn.append_basic_block(f"{var}.header")
        inner = self.fn.append_basic_block(f"{var}.body")
        exit_ = self.fn.append_basic_block(f"{var}.exit")
        b.branch(header)
        b.position_at_end(header)
        i = b.phi(I64, name=var)
        i.add_incoming(lo, pre)
        b.cbranch(b.icmp_signed("<", i, hi), inner, exit_)
        b.position_at_end(inner)
        self.bind(loop_var(var), i)
        body()
        nxt = b.add(i, ir.Constant(I64, 1), flags=["nsw"])
        i.add_incoming(nxt, b.block)
        latch = b.branch(header)
        b.position_at_end(exit_)
        return latch

    def reduce(self, s: Reduce) -> None:
        self.ranges.let(s.var.name, None)
        ty = VALUE_TYPES[s.var.dtype]
        init = self.expr(s.init)
        loops = s.loops
        flat = collapsed_loops(s)
        if flat is not None:        # one loop over a contiguous run: the outer variables are 0
            for r in loops[:-1]:
                self.bind(loop_var(r.var), ir.Constant(I64, 0))
            loops = (flat,)
        if s.kind == "sum" and s.var.dtype.is_float and not _static_at_most(loops, SUM_BLOCK):
            self.scalars[s.var.name] = self._pairwise_sum(s, loops, ty, init)
            return
        acc = self._accumulator(ty, s.var.name + ".acc")
        self.b.store(init, acc)
        # a float max or min is NaN-propagating `llvm.maximum`, 6 dependent instructions a vector on
        # x86: one accumulator chain ran 11 cycles a vector, LLVM interleaves none by itself
        chains = LATENCY_INTERLEAVE if s.kind in ("max", "min") and s.var.dtype.is_float else None
        self._reduce_nest(loops, lambda: self._accumulate(s, acc, ty), chains)
        self.scalars[s.var.name] = self.b.load(acc, typ=ty, name=s.var.name)

    def _accumulator(self, ty, name: str, count: int | None = None) -> ir.Value:
        """A stack slot, allocated in `entry` (LLVM promotes scalar ones to phis)."""
        size = None if count is None else ir.Constant(I64, count)
        return ir.IRBuilder(self.entry).alloca(ty, size=size, name=name)

    def _reduce_nest(self, loops, innermost: Callable[[], None], chains: int | None = None) -> None:
        """The reduction's loops around `innermost`; `chains`: vector accumulators LLVM keeps in its
        innermost loop (its interleave count), where it would pick too few."""
        def nest(level: int) -> None:
            if level == len(loops):
                innermost()
                return
            r = loops[level]
            lo = self.index(r.start)
            latch = self.counted_loop(r.var, lo, self.b.add(lo, self.index(r.extent), flags=["nsw"]),
                                      lambda: nest(level + 1))
            if level < len(loops) - 1:
                return
            extent = sympy.sympify(r.extent)
            lanes = self.mb.target.vector_floats
            # (not a short static loop, such as a pooling window's: LLVM unrolls that whole)
            long = not extent.is_Integer or int(extent) >= (chains or 1) * lanes
            props = [("llvm.loop.interleave.count", chains)] if chains and long else []
            if extent.is_Integer and int(extent) >= lanes:
                # LLVM would unroll a short static row fully before the vectoriser sees it: layer
                # norm's sum over 64 channels became one chain of 64 scalar adds (3x the time)
                props.append(("llvm.loop.unroll.disable",))
            if props:
                latch.set_metadata("llvm.loop", loop_metadata(self.mb.module, *props))
        nest(0)

    def _accumulate(self, s: Reduce, acc, ty) -> None:
        """acc = combine(acc, value) for one iteration (the combine is `reassoc`: it vectorises)."""
        outer_hidden = self.hidden_infinities
        self.hidden_infinities = s.kind in ("max", "min") and s.var.dtype.is_float
        self.block(s.body)
        outer = self.line, self.b.debug_metadata
        self.at(self.lines.yields[id(s)], s.origin)
        value = self.expr(s.value)
        self.b.store(REDUCERS[(s.kind, s.var.dtype.is_float)](self, self.b.load(acc, typ=ty), value), acc)
        self.line, self.b.debug_metadata = outer
        self.hidden_infinities = outer_hidden

    def _pairwise_sum(self, s: Reduce, loops, ty, init) -> ir.Value:
        """A float sum in blocks of SUM_BLOCK elements of the innermost loop, the block sums added
        pairwise. Within a block the combine is `reassoc`, so LLVM sums it in 32 or 64 vector lanes
        (4 interleaved ymm or zmm registers: 8 or 4 elements per lane, cf. the 16 of torch's first
        cascade level); the block sums go onto a binary-counter stack: the k-th block merges with as
        many stacked sums as k has trailing zero bits, so only sums of equal size are ever added.
        The error then grows with log2(blocks) instead of the length (a plain vectorised loop: with
        length / lanes), at one horizontal add and one stack push per block."""
        b = self.b
        stack = self._accumulator(ty, s.var.name + ".stack", PAIRWISE_DEPTH)
        depth = self._accumulator(I64, s.var.name + ".depth")
        blocks = self._accumulator(I64, s.var.name + ".blocks")
        part = self._accumulator(ty, s.var.name + ".part")
        b.store(ir.Constant(I64, 0), depth)
        b.store(ir.Constant(I64, 0), blocks)
        *outer, inner = loops
        size = ir.Constant(I64, SUM_BLOCK)

        def row() -> None:
            lo = self.index(inner.start)
            hi = b.add(lo, self.index(inner.extent), flags=["nsw"])
            count = b.sdiv(b.add(self.index(inner.extent), ir.Constant(I64, SUM_BLOCK - 1), flags=["nsw"]), size)

            def block() -> None:
                start = b.add(lo, b.mul(self.indices[loop_var(inner.var + ".block")], size, flags=["nsw"]),
                              flags=["nsw"])
                end = b.add(start, size, flags=["nsw"])
                end = b.select(b.icmp_signed("<", end, hi), end, hi)
                # the vector loop leaves fewer elements than its lanes, which LLVM would add one by one
                # to the block's total: sum them apart, so that they meet the total in one addition
                lanes = ir.Constant(I64, SUM_INTERLEAVE * self.mb.target.vector_floats)
                cut = b.add(start, b.mul(b.sdiv(b.sub(end, start), lanes), lanes, flags=["nsw"]), flags=["nsw"])
                b.store(ir.Constant(ty, 0.0), part)
                self.counted_loop(inner.var, start, cut, lambda: self._accumulate(s, part, ty))
                main = b.load(part, typ=ty)
                b.store(ir.Constant(ty, 0.0), part)
                self.counted_loop(inner.var, cut, end, lambda: self._accumulate(s, part, ty))
                self._push(stack, depth, blocks, b.fadd(main, b.load(part, typ=ty)))
            # unrolled, a static number of blocks lets GVN merge the loads of consecutive reductions
            # over the same row (layer norm) and spill hundreds of vectors: keep it a loop
            latch = self.counted_loop(inner.var + ".block", ir.Constant(I64, 0), count, block)
            latch.set_metadata("llvm.loop", loop_metadata(self.mb.module, ("llvm.loop.unroll.disable",)))
        self._reduce_nest(outer, row)
        return self._sum_stack(stack, b.load(depth, typ=I64), init, s.var.name)

    def _push(self, stack, depth, blocks, value) -> None:
        """Push a block sum: merge it with the top of the stack once per trailing zero bit of the
        new block count (sums of 1, 2, 4, ... blocks), then store it on top."""
        b = self.b
        k0 = b.add(b.load(blocks, typ=I64), ir.Constant(I64, 1), flags=["nsw"])
        b.store(k0, blocks)
        top0 = b.load(depth, typ=I64)
        pre = b.block
        header, merge, done = (self.fn.append_basic_block(f"push.{part}") for part in ("header", "merge", "done"))
        b.branch(header)
        b.position_at_end(header)
        k = b.phi(I64)
        top = b.phi(I64)
        acc = b.phi(value.type)
        k.add_incoming(k0, pre)
        top.add_incoming(top0, pre)
        acc.add_incoming(value, pre)
        even = b.icmp_signed("==", b.and_(k, ir.Constant(I64, 1)), ir.Constant(I64, 0))
        b.cbranch(even, merge, done)
        b.position_at_end(merge)
        below = b.sub(top, ir.Constant(I64, 1), flags=["nsw"])
        merged = b.fadd(b.load(self._slot(stack, below, value.type), typ=value.type), acc)
        k.add_incoming(b.ashr(k, ir.Constant(I64, 1)), merge)
        top.add_incoming(below, merge)
        acc.add_incoming(merged, merge)
        b.branch(header)
        b.position_at_end(done)
        b.store(acc, self._slot(stack, top, value.type))
        b.store(b.add(top, ir.Constant(I64, 1), flags=["nsw"]), depth)

    def _sum_stack(self, stack, depth, init, name: str) -> ir.Value:
        """init + the stacked sums, smallest (top) first."""
        b = self.b
        pre = b.block
        header, body, done = (self.fn.append_basic_block(f"{name}.total.{p}") for p in ("header", "body", "done"))
        b.branch(header)
        b.position_at_end(header)
        j = b.phi(I64)
        total = b.phi(init.type)
        j.add_incoming(depth, pre)
        total.add_incoming(init, pre)
        b.cbranch(b.icmp_signed(">", j, ir.Constant(I64, 0)), body, done)
        b.position_at_end(body)
        below = b.sub(j, ir.Constant(I64, 1), flags=["nsw"])
        j.add_incoming(below, body)
        total.add_incoming(b.fadd(total, b.load(self._slot(stack, below, init.type), typ=init.type)), body)
        b.branch(header)
        b.position_at_end(done)
        return total

    def _slot(self, stack, i, ty) -> ir.Value:
        return self.b.gep(stack, [i], inbounds=True, source_etype=ty)

    def gemm(self, s: Gemm) -> None:
        """OpenBLAS sgemm, or Cuvil's small-GEMM loops when C has at most SMALL_GEMM_MAX_ROWS rows
        (decided here when m is a constant, else by a branch at run time)."""
        b = self.b
        m = sympy.sympify(s.m)
        if s.b_panels:
            k = self.index(s.k)
            one = ir.Constant(I64, 1)
            window = [self.index(getattr(s, f)) for f in GEMM_WINDOW + GEMM_TAPS] if s.a_rows is not None else \
                [self.index(s.m), one, b.select(b.icmp_signed(">", k, one), k, one), one, one,   # plain: one run
                 ir.Constant(I64, 0)]
            bias = self._ref_ptr(s.bias) if s.bias is not None else ir.Constant(ir.PointerType(), None)
            b.call(self.mb.panel_gemm_function(s.b_panels, s.bias is not None, s.relu, m, norm_dim(s.k),
                                               panel_chunked(s), s.bias_rows),
                   [self._ref_ptr(s.c), self._ref_ptr(s.a), self._ref_ptr(s.b), self.index(s.m),
                    self.index(s.n), k, self.index(s.lda), self.index(s.ldc), *window, bias])
            return
        if blas_only(s):
            self._sgemm(s)
        elif m.is_Integer:
            self._small_gemm(s)
        else:
            small = b.icmp_signed("<=", self.index(m), ir.Constant(I64, SMALL_GEMM_MAX_ROWS))
            with b.if_else(small) as (then, otherwise):
                with then:
                    # not inlined: LLVM would specialise the loops to the call's constant k and n
                    # (attention's k = 16: the dot loop unrolled, the rows of A gathered) for a
                    # branch that a few rows take at most. The block's attention kernel: 262 ->
                    # 168 ms of LLVM, no slower at 4, 128, 130 or 136 tokens.
                    self._small_gemm(s, inline=False)
                with otherwise:
                    self._sgemm(s)

    def _ref_ptr(self, ref) -> ir.Value:
        """The address of a call operand (a buffer plus an element offset)."""
        return self.b.gep(self.bufs[ref.buf.name], [self.index(ref.offset)], inbounds=True,
                          source_etype=MEMORY_TYPES[ref.buf.dtype])

    def topk(self, s: TopK) -> None:
        self.b.call(self.mb.topk_function(s.symbol), [
            self._ref_ptr(s.src), self.index(s.n), self.index(s.stride), self.index(s.k),
            ir.Constant(I32, s.mode), self._ref_ptr(s.dst), self.index(s.dst_stride)])

    def _sgemm(self, s: Gemm) -> None:
        b = self.b

        def i32(e):
            return b.trunc(self.index(e), I32)
        trans = {False: ir.Constant(I32, CBLAS_NO_TRANS), True: ir.Constant(I32, CBLAS_TRANS)}
        b.call(self.mb.gemm_function(), [
            ir.Constant(I32, CBLAS_ROW_MAJOR), trans[s.trans_a], trans[s.trans_b], i32(s.m), i32(s.n), i32(s.k),
            ir.Constant(F32, s.alpha), self._ref_ptr(s.a), i32(s.lda), self._ref_ptr(s.b), i32(s.ldb),
            ir.Constant(F32, s.beta), self._ref_ptr(s.c), i32(s.ldc)])

    def _small_gemm(self, s: Gemm, inline: bool = True) -> None:
        self.b.call(self.mb.small_gemm_function(s.trans_b, s.beta != 0.0), [
            self.index(s.m), self.index(s.n), self.index(s.k), ir.Constant(F32, s.alpha), self._ref_ptr(s.a),
            self.index(s.lda), self._ref_ptr(s.b), self.index(s.ldb), ir.Constant(F32, s.beta),
            self._ref_ptr(s.c), self.index(s.ldc)], attrs=() if inline else ("noinline",))

    # -- memory
    def address(self, buf: Buffer, index) -> ir.Value:
        static, dynamic = buf.offset(index)
        offset = self.index(static)
        for scalar, stride in dynamic:
            term = self.b.mul(convert(self, self.expr(scalar), scalar.dtype, DType.i64), self.index(stride))
            offset = self.b.add(offset, term)
        return self.b.gep(self.bufs[buf.name], [offset], inbounds=True, source_etype=MEMORY_TYPES[buf.dtype])

    def load(self, e: Load) -> ir.Value:
        if e.mask is None:
            return self._plain_load(e)
        b = self.b
        other = self.expr(e.other)
        cond = self.expr(e.mask)
        before = b.block
        then = self.fn.append_basic_block("masked.load")
        merge = self.fn.append_basic_block("masked.merge")
        b.cbranch(cond, then, merge)
        b.position_at_end(then)
        value = self._plain_load(e)
        then_end = b.block
        b.branch(merge)
        b.position_at_end(merge)
        phi = b.phi(value.type)
        phi.add_incoming(value, then_end)
        phi.add_incoming(other, before)
        return phi

    def _plain_load(self, e: Load) -> ir.Value:
        """A load, read once per block between stores: the 4 output columns a depthwise
        convolution computes together load each weight once, and the 70 input values of their
        windows once each, not 196 times."""
        key = None if any(isinstance(i, Expr) for i in e.index) else (self.b.block, e.buf.name, e.index)
        if key in self._loaded:
            return self._loaded[key]
        v = self.b.load(self.address(e.buf, e.index), typ=MEMORY_TYPES[e.buf.dtype], align=e.buf.dtype.itemsize)
        if e.buf.dtype == DType.bool:
            v = self.b.icmp_unsigned("!=", v, ir.Constant(I8, 0))
        if key is not None:
            self._loaded[key] = v
        return v

    # -- index expressions
    def index(self, e) -> ir.Value:
        """An index expression's value. Each one is computed once per basic block, and an offset
        by a constant from the same variable part: the window of a 7x7 depthwise convolution
        is 49 loads from one base (written out in full, its 3216 lines of LLVM IR took 60-80 ms
        to emit, as long as LLVM took on them)."""
        e = sympy.sympify(e)
        if e.is_Integer:
            return ir.Constant(I64, int(e))
        if e.is_Symbol:
            return self._symbol_index(e)
        key = (self.b.block, e)         # the builder only appends: a value there dominates the rest
        value = self._emitted_indices.get(key)
        if value is None:
            value = self._emitted_indices[key] = self._index(e)
        return value

    def bind(self, var: sympy.Symbol, value: ir.Value) -> None:
        """Give index variable `var` its value from here on: what `index` and `_plain_load` hold
        may have been computed from the old one."""
        self.indices[var] = value
        self._emitted_indices.clear()
        self._loaded.clear()

    def _symbol_index(self, e: sympy.Symbol) -> ir.Value:
        if e in self.indices:
            return self.indices[e]
        scalar = self.scalars.get(e.name)       # a size read at run time (grouped_matmul's rows)
        if scalar is None or not isinstance(scalar.type, ir.IntType):
            raise ValueError(f"kernel {self.kernel.name}: index name '{e}' is not in scope")
        return scalar if scalar.type.width == 64 else self.b.sext(scalar, I64)

    def _index(self, e) -> ir.Value:
        b = self.b
        if e.is_Add:
            constant, variable = e.as_coeff_Add()
            if constant.is_Integer and constant != 0:
                return b.add(self.index(variable), ir.Constant(I64, int(constant)), flags=["nsw"])
            terms = [self.index(t) for t in e.args]
            out = terms[0]
            for t in terms[1:]:
                out = b.add(out, t, flags=["nsw"])
            return out
        if e.is_Mul:
            factors = [self.index(f) for f in e.args]
            out = factors[0]
            for f in factors[1:]:
                out = b.mul(out, f, flags=["nsw"])
            return out
        if e.is_Pow and e.exp.is_Integer and e.exp > 0:
            return self.index(sympy.Mul(*([e.base] * int(e.exp)), evaluate=False))
        if isinstance(e, (sympy.floor, sympy.ceiling)):
            num, den = sympy.fraction(sympy.together(e.args[0]))
            if isinstance(e, sympy.ceiling):
                return b.neg(self.floordiv(-num, den))
            return self.floordiv(num, den)
        if isinstance(e, sympy.Mod):
            num, den = e.args
            r = b.srem(self.index(num), self.index(den))
            if num.is_nonnegative and den.is_positive:
                return r
            return b.select(self.floor_fix(r, den), b.add(r, self.index(den)), r)
        if isinstance(e, (sympy.Min, sympy.Max)):
            op = "<" if isinstance(e, sympy.Min) else ">"
            vals = [self.index(a) for a in e.args]
            out = vals[0]
            for v in vals[1:]:
                out = b.select(b.icmp_signed(op, out, v), out, v)
            return out
        raise ValueError(f"kernel {self.kernel.name}: cannot emit index expression {e}")

    def floordiv(self, num, den) -> ir.Value:
        """Floor division, as in Python. Dims are positive, but a ceiling written -((-s)//4) puts a
        negative divisor into some indices (`p // (-3*((-s)//4))`), where truncating division
        corrected as for a positive one is off by one."""
        b = self.b
        q = b.sdiv(self.index(num), self.index(den))
        if num.is_nonnegative and den.is_positive:
            return q
        return b.sub(q, b.zext(self.floor_fix(b.srem(self.index(num), self.index(den)), den), I64))

    def floor_fix(self, remainder: ir.Value, den) -> ir.Value:
        """Whether truncating division left `remainder` on the other side of zero from the
        divisor `den` (then floor division is one less, and the floor remainder `den` more)."""
        b, zero = self.b, ir.Constant(I64, 0)
        negative = b.icmp_signed("<", remainder, zero)
        if den.is_positive:
            return negative
        return b.and_(b.icmp_signed("!=", remainder, zero),
                      b.icmp_signed("!=", negative, b.icmp_signed("<", self.index(den), zero)))

    # -- scalar expressions
    def expr(self, e: Expr) -> ir.Value:
        if e.origin is None or self.scope is None:
            return EXPRESSIONS[type(e)](self, e)
        outer = self.b.debug_metadata
        self.b.debug_metadata = self.location(self.line, e.origin)
        value = EXPRESSIONS[type(e)](self, e)
        self.b.debug_metadata = outer
        return value

    def const(self, e: Const) -> ir.Value:
        if e.dtype == DType.bf16:
            return ir.Constant(I16, _bf16_bits(e.value))
        if self.hidden_infinities and e.dtype == DType.f32 and math.isinf(e.value):
            return self._hidden_constant(e.value)
        return ir.Constant(VALUE_TYPES[e.dtype], e.value)

    def _hidden_constant(self, value: float) -> ir.Value:
        """An f32 constant LLVM cannot see, made once per function in `entry` by an empty inline asm.
        In a max/min reduction over select(c, x, -inf) (a masked row maximum, max pooling's
        padding), a visible -inf lets InstCombine turn max(acc, select(c, x, -inf)) into
        select(c, max(acc, x), acc), a conditional reduction the loop vectoriser leaves scalar:
        a masked row maximum of 32000 ran 204 us instead of 7."""
        if value not in self._hidden:
            b = ir.IRBuilder(self.entry)
            bits = ir.Constant(I32, int(np.array(value, np.float32).view(np.int32)))
            opaque = b.asm(ir.FunctionType(I32, [I32]), "", "=r,0", [bits], side_effect=False)
            self._hidden[value] = b.bitcast(opaque, F32)
        return self._hidden[value]

    def var(self, e: Var) -> ir.Value:
        try:
            return self.scalars[e.name]
        except KeyError:
            raise ValueError(f"kernel {self.kernel.name}: %{e.name} is used before it is defined") from None

    def call(self, e: Call) -> ir.Value:
        args = [self.expr(a) for a in e.args]
        dt = e.args[-1].dtype
        if dt == DType.f32 and e.fn in FORMS:
            return self.mb.math.call(self.b, math_form(e.fn, self.ranges.span(e.args[0])), args)
        table = FLOAT_OPS if dt.is_float else INT_OPS
        emit = table.get(e.fn) or SHARED_OPS.get(e.fn)
        if emit is None:
            raise ValueError(f"kernel {self.kernel.name}: {e.fn} is not defined for {dt}")
        if dt.is_float and dt != DType.f32:
            raise ValueError(f"kernel {self.kernel.name}: {e.fn} on {dt}: compute half types in f32 (cast first)")
        return emit(self, *args)

    def cast(self, e: Cast) -> ir.Value:
        return convert(self, self.expr(e.value), e.value.dtype, e.dtype)

    def index_value(self, e: Index) -> ir.Value:
        return self.index(e.expr)


# ----------------------------------------------------------------------------- small GEMM

def _small_gemm_args(fn: ir.Function):
    for a, name in zip(fn.args, ("m", "n", "k", "alpha", "A", "lda", "B", "ldb", "beta", "C", "ldc")):
        a.name = name
        if name in ("A", "B", "C"):
            a.add_attribute("noalias")
    return fn.args


def _for(b: ir.IRBuilder, n: ir.Value, name: str, body: Callable[[ir.Value], None]) -> None:
    """for (i = 0; i < n; ++i) body(i)"""
    for_range(b, ir.Constant(I64, 0), n, ir.Constant(I64, 1), name, body)


def _at(b: ir.IRBuilder, base, row, ld, col) -> ir.Value:
    return b.gep(base, [b.add(b.mul(row, ld, flags=["nsw"]), col, flags=["nsw"])], inbounds=True, source_etype=F32)


def _finish(b: ir.IRBuilder, acc, alpha, beta, c_ptr, with_beta: bool) -> None:
    """*c_ptr = alpha * acc (+ beta * *c_ptr)"""
    out = b.fmul(alpha, acc)
    if with_beta:
        out = b.fadd(out, b.fmul(beta, b.load(c_ptr, typ=F32, align=4)))
    b.store(out, c_ptr, align=4)


def _dots(b: ir.IRBuilder, k, a_row, b_rows) -> list:
    """sum_p a_row[p] * b_row[p] for each of `b_rows` (pointers), in one loop over p: each load of
    a_row serves every B row. The sums carry `reassoc` so LLVM vectorises them."""
    fn = b.function
    pre = b.block
    header, inner, done = (fn.append_basic_block(f"dot.{part}") for part in ("header", "body", "exit"))
    b.branch(header)
    b.position_at_end(header)
    p = b.phi(I64, name="p")
    p.add_incoming(ir.Constant(I64, 0), pre)
    accs = [b.phi(F32, name=f"acc{r}") for r in range(len(b_rows))]
    for acc in accs:
        acc.add_incoming(ir.Constant(F32, 0.0), pre)
    b.cbranch(b.icmp_signed("<", p, k), inner, done)
    b.position_at_end(inner)
    x = b.load(b.gep(a_row, [p], inbounds=True, source_etype=F32), typ=F32, align=4)
    for acc, row in zip(accs, b_rows):
        w = b.load(b.gep(row, [p], inbounds=True, source_etype=F32), typ=F32, align=4)
        acc.add_incoming(b.fadd(acc, b.fmul(x, w, flags=REDUCE_FLAGS), flags=REDUCE_FLAGS), inner)
    p.add_incoming(b.add(p, ir.Constant(I64, 1), flags=["nsw"]), inner)
    b.branch(header)
    b.position_at_end(done)
    return accs


SMALL_GEMM_B_ROWS = 4   # rows of B per pass of the dot loop (4 input streams; a row of A loaded once for 4)


def _emit_small_gemm_nt(fn: ir.Function, with_beta: bool) -> None:
    """C[i, j] = alpha * dot(A[i, :], B[j, :]): B's rows stream once from memory, SMALL_GEMM_B_ROWS
    at a time (then one at a time for the rest), each against every row of A (A stays in cache)."""
    m, n, k, alpha, A, lda, B, ldb, beta, C, ldc = _small_gemm_args(fn)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    zero = ir.Constant(I64, 0)

    def rows_of_b(first, count):
        def row_of_a(i):
            b_rows = [_at(b, B, b.add(first, ir.Constant(I64, r), flags=["nsw"]), ldb, zero) for r in range(count)]
            for r, acc in enumerate(_dots(b, k, _at(b, A, i, lda, zero), b_rows)):
                j = b.add(first, ir.Constant(I64, r), flags=["nsw"])
                _finish(b, acc, alpha, beta, _at(b, C, i, ldc, j), with_beta)
        _for(b, m, "i", row_of_a)
    blocks = b.sdiv(n, ir.Constant(I64, SMALL_GEMM_B_ROWS))
    _for(b, blocks, "jb", lambda jb: rows_of_b(b.mul(jb, ir.Constant(I64, SMALL_GEMM_B_ROWS), flags=["nsw"]),
                                                 SMALL_GEMM_B_ROWS))
    rest = b.mul(blocks, ir.Constant(I64, SMALL_GEMM_B_ROWS), flags=["nsw"])
    _for(b, b.sub(n, rest), "jr", lambda r: rows_of_b(b.add(rest, r, flags=["nsw"]), 1))
    b.ret_void()


def _emit_small_gemm_nn(fn: ir.Function, with_beta: bool) -> None:
    """C[i, :] = beta * C[i, :] + sum_p (alpha * A[i, p]) * B[p, :]: C's rows (in cache) accumulate
    while each row of B streams once; the inner loop over C's columns vectorises."""
    m, n, k, alpha, A, lda, B, ldb, beta, C, ldc = _small_gemm_args(fn)
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def start(i):
        def one(j):
            ptr = _at(b, C, i, ldc, j)
            b.store(b.fmul(beta, b.load(ptr, typ=F32, align=4)) if with_beta else ir.Constant(F32, 0.0), ptr,
                    align=4)
        _for(b, n, "j0", one)
    _for(b, m, "i0", start)

    def row_of_b(p):
        def row_of_a(i):
            x = b.fmul(alpha, b.load(_at(b, A, i, lda, p), typ=F32, align=4))

            def column(j):
                ptr = _at(b, C, i, ldc, j)
                prod = b.fmul(x, b.load(_at(b, B, p, ldb, j), typ=F32, align=4), flags=["contract"])
                b.store(b.fadd(b.load(ptr, typ=F32, align=4), prod, flags=["contract"]), ptr, align=4)
            _for(b, n, "j", column)
        _for(b, m, "i", row_of_a)
    _for(b, k, "p", row_of_b)
    b.ret_void()


def _llvm_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._" else "_" for c in name)


def _bf16_bits(v: float) -> int:
    """bf16 = the f32 bits rounded to their upper half, nearest-even."""
    if v != v:
        return 0x7FC0
    bits = int(np.array(v, dtype=np.float32).view(np.uint32))
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


# ----------------------------------------------------------------------------- op tables

def _f(name):
    def emit(em, *a):      # on f32 scalars or vectors (a transposed tile's rows)
        t = a[0].type
        return em.b.call(intrinsic(em.b.module, name, t, [t] * len(a), [t]), list(a))
    return emit


def _i(name):
    def emit(em, x, y):
        return em.b.call(intrinsic(em.b.module, name, x.type, [x.type, x.type], [x.type]), [x, y])
    return emit


def _math(name):
    return lambda em, *a: em.mb.math.call(em.b, name, list(a))


def _one(em):
    return ir.Constant(F32, 1.0)


def _float_sign(em, x):
    """(x > 0) - (x < 0): 0 for zeros and NaN, like torch.sign."""
    b = em.b
    zero = ir.Constant(F32, 0.0)
    return b.fsub(b.uitofp(b.fcmp_ordered(">", x, zero), F32), b.uitofp(b.fcmp_ordered("<", x, zero), F32))


def _float_floordiv(em, x, y):
    """torch's floor division as ATen computes it (Python's rules): (x - fmod(x, y)) / y, one less
    where the remainder's sign differs from y's, rounded to the nearest integer; the quotient's
    signed zero where that is 0, x / y for y = 0. So inf // 0.7 is NaN and -5 // inf is -1, where
    floor(x / y) gives inf and -0."""
    b = em.b
    zero, one, half = (ir.Constant(F32, v) for v in (0.0, 1.0, 0.5))
    mod = em.mb.math.call(b, "fmod", [x, y])
    div = b.fdiv(b.fsub(x, mod), y)
    differ = b.and_(b.fcmp_ordered("!=", mod, zero), b.icmp_unsigned("!=", b.fcmp_ordered("<", mod, zero),
                                                                      b.fcmp_ordered("<", y, zero)))
    div = b.select(differ, b.fsub(div, one), div)
    floor = _f("floor")(em, div)
    floor = b.select(b.fcmp_ordered(">", b.fsub(div, floor), half), b.fadd(floor, one), floor)
    quotient = b.fdiv(x, y)
    floor = b.select(b.fcmp_ordered("==", div, zero), _f("copysign")(em, zero, quotient), floor)
    return b.select(b.fcmp_ordered("==", y, zero), quotient, floor)


def _float_rem(em, x, y):
    """torch.remainder, as ATen computes it: fmod (exact), plus y where the signs differ."""
    b = em.b
    r = em.mb.math.call(b, "fmod", [x, y])
    zero = ir.Constant(F32, 0.0)
    fix = b.and_(b.fcmp_ordered("!=", r, zero), b.icmp_unsigned("!=", b.fcmp_ordered("<", r, zero),
                                                                 b.fcmp_ordered("<", y, zero)))
    return b.select(fix, b.fadd(r, y), r)


FLOAT_OPS: dict[str, Callable] = {
    "add": lambda em, x, y: em.b.fadd(x, y),
    "sub": lambda em, x, y: em.b.fsub(x, y),
    "mul": lambda em, x, y: em.b.fmul(x, y),
    "div": lambda em, x, y: em.b.fdiv(x, y),
    "max": _f("maximum"),                     # NaN-propagating, like torch.maximum
    "min": _f("minimum"),
    "neg": lambda em, x: em.b.fneg(x),
    "abs": _f("fabs"),
    "sqrt": _f("sqrt"),
    "fma": _f("fma"),
    "rsqrt": lambda em, x: em.b.fdiv(_one(em), _f("sqrt")(em, x)),
    "reciprocal": lambda em, x: em.b.fdiv(_one(em), x),
    "floor": _f("floor"),
    "trunc": _f("trunc"),
    "ceil": _f("ceil"),
    "round": _f("roundeven"),                 # torch.round: half to even
    "sign": _float_sign,
    "floordiv": _float_floordiv,
    "rem": _float_rem,
    **{f: _math(f) for f in ("exp", "exp_ftz", "log", "log1p", "expm1", "tanh", "erf", "sigmoid", "sin", "cos", "tan", "atan",
                             "asin", "acos", "sinh", "cosh", "asinh", "acosh", "atanh", "pow", "atan2", "fmod")},
    **{c: (lambda p: lambda em, x, y: em.b.fcmp_ordered(p, x, y))(p)
       for c, p in (("eq", "=="), ("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">="))},
    "ne": lambda em, x, y: em.b.fcmp_unordered("!=", x, y),
}


def _int_divisor(em, x, y):
    """Division by zero and INT_MIN / -1 trap on x86: divide by 1 instead (the result is then 0 / x)."""
    b = em.b
    bad = b.or_(b.icmp_signed("==", y, ir.Constant(y.type, 0)), b.icmp_signed("==", y, ir.Constant(y.type, -1)))
    return b.select(bad, ir.Constant(y.type, 1), y), bad


def _int_floordiv(em, x, y):
    b = em.b
    d, bad = _int_divisor(em, x, y)
    q = b.sdiv(x, d)
    r = b.srem(x, d)
    fix = b.and_(b.icmp_signed("!=", r, ir.Constant(x.type, 0)),
                 b.icmp_signed("!=", b.icmp_signed("<", r, ir.Constant(x.type, 0)),
                               b.icmp_signed("<", d, ir.Constant(x.type, 0))))
    q = b.sub(q, b.zext(fix, x.type))
    neg_one = b.icmp_signed("==", y, ir.Constant(y.type, -1))
    return b.select(neg_one, b.neg(x), b.select(bad, ir.Constant(x.type, 0), q))


def _int_rem(em, x, y):
    b = em.b
    d, bad = _int_divisor(em, x, y)
    r = b.srem(x, d)
    fix = b.and_(b.icmp_signed("!=", r, ir.Constant(x.type, 0)),
                 b.icmp_signed("!=", b.icmp_signed("<", r, ir.Constant(x.type, 0)),
                               b.icmp_signed("<", d, ir.Constant(x.type, 0))))
    r = b.select(fix, b.add(r, d), r)
    return b.select(bad, ir.Constant(x.type, 0), r)


def _int_fmod(em, x, y):
    """C's remainder (the sign follows x); 0 for a zero divisor, as `_int_rem`."""
    d, bad = _int_divisor(em, x, y)
    return em.b.select(bad, ir.Constant(x.type, 0), em.b.srem(x, d))


def _int_sign(em, x):
    b = em.b
    zero = ir.Constant(x.type, 0)
    return b.sub(b.zext(b.icmp_signed(">", x, zero), x.type), b.zext(b.icmp_signed("<", x, zero), x.type))


INT_OPS: dict[str, Callable] = {
    "add": lambda em, x, y: em.b.add(x, y),
    "sub": lambda em, x, y: em.b.sub(x, y),
    "mul": lambda em, x, y: em.b.mul(x, y),
    "max": _i("smax"),
    "min": _i("smin"),
    "neg": lambda em, x: em.b.neg(x),
    "abs": lambda em, x: em.b.call(intrinsic(em.b.module, "abs", x.type, [x.type, I1], [x.type]),
                                   [x, ir.Constant(I1, 0)]),
    "sign": _int_sign,
    "floordiv": _int_floordiv,
    "rem": _int_rem,
    "fmod": _int_fmod,
    "not": lambda em, x: em.b.not_(x),
    **{c: (lambda p: lambda em, x, y: (em.b.icmp_unsigned if x.type == I1 else em.b.icmp_signed)(p, x, y))(p)
       for c, p in (("eq", "=="), ("ne", "!="), ("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">="))},
}

SHARED_OPS: dict[str, Callable] = {
    "and": lambda em, x, y: em.b.and_(x, y),
    "or": lambda em, x, y: em.b.or_(x, y),
    "xor": lambda em, x, y: em.b.xor(x, y),
    "select": lambda em, c, x, y: em.b.select(c, x, y),
}


def _latency_bound(stmts) -> bool:
    """The statements compute a long-latency function (Cuvil's polynomial math, a division or a
    square root) on every element: one vector's chain of dependent steps is longer than the core can
    overlap, so LLVM should interleave independent vectors (it picks 1 for such a body by itself).
    Not when the body already has LATENCY_INTERLEAVE chains side by side (its operations over its
    longest chain of them): copies of it would only multiply LLVM's work (a Conformer's depthwise
    convolution of 31 taps in chains of 8 with a SiLU: 200 ms more of LLVM, no faster)."""
    slow, calls, depth = False, 0, {}          # depth: of each Let's value, in dependent operations

    def walk(e) -> int:
        nonlocal slow, calls
        if isinstance(e, Var):
            return depth.get(e.name, 0)
        below = max((walk(o) for o in operands(e)), default=0)
        if not isinstance(e, Call):
            return below
        slow |= e.fn in LATENCY_FUNCS
        calls += 1
        return below + 1
    longest = 0
    for s in stmts:
        if isinstance(s, (Let, Store)):
            d = walk(s.value)
            longest = max(longest, d)
            if isinstance(s, Let):
                depth[s.var.name] = d
    return slow and calls < LATENCY_INTERLEAVE * longest


def _innermost(s: Loop) -> bool:
    return not any(isinstance(t, (Loop, Reduce, Gemm, TopK)) for t in s.body)


def _vector_loop(s: Loop) -> bool:
    """An innermost loop of at least one vector's worth of iterations, known at compile time: the
    lowering puts the contiguous dim there, so it is the loop to vectorise. LLVM would first unroll
    it fully when it is short (a conv epilogue's 32 columns) and then vectorise the loop around it,
    whose accesses are strided: gathers and scatters (measured: 64 of each in the CNN stem conv)."""
    extent = sympy.sympify(s.extent)
    return not s.parallel and extent.is_Integer and int(extent) >= VECTOR_FLOATS and _innermost(s)


def _static_at_most(loops, n: int) -> bool:
    """The reduction's loops run at most `n` iterations, known at compile time."""
    total = 1
    for r in loops:
        extent = sympy.sympify(r.extent)
        if not extent.is_Integer:
            return False
        total *= int(extent)
    return total <= n


def _reduce_float(name):
    if name in ("fadd", "fmul"):
        return lambda em, acc, v: getattr(em.b, name)(acc, v, flags=REDUCE_FLAGS)
    return lambda em, acc, v: em.b.call(intrinsic(em.b.module, name, acc.type, [acc.type] * 2, [acc.type]),
                                        [acc, v], fastmath=REDUCE_FLAGS)


REDUCERS = {
    ("sum", True): _reduce_float("fadd"), ("prod", True): _reduce_float("fmul"),
    ("max", True): _reduce_float("maximum"), ("min", True): _reduce_float("minimum"),
    ("sum", False): lambda em, acc, v: em.b.add(acc, v), ("prod", False): lambda em, acc, v: em.b.mul(acc, v),
    ("max", False): _i("smax"), ("min", False): _i("smin"),
}


# ----------------------------------------------------------------------------- casts

def _truncate_like_x86(b: ir.IRBuilder, v: ir.Value, sty: ir.Type, dty: ir.IntType) -> ir.Value:
    """Float -> i32/i64 as x86's truncating conversion gives it, which eager's casts compile to
    there: NaN and values outside the integer's range give its smallest value (the "integer
    indefinite": `torch.tensor(nan).long()` is -2^63). Written so that LLVM emits one vector
    conversion (AVX-512's vcvttps2qq): its saturating fptosi.sat, which gives 0 for NaN, was
    scalarised, 16 conversions and compares a vector (grid_sample's index computation)."""
    limit = float(2 ** (dty.width - 1))
    inside = b.and_(b.fcmp_ordered(">=", v, ir.Constant(sty, -limit)), b.fcmp_ordered("<", v, ir.Constant(sty, limit)))
    whole = b.fptosi(b.select(inside, v, ir.Constant(sty, 0.0)), dty)
    return b.select(inside, whole, ir.Constant(dty, -(1 << (dty.width - 1))))


def convert(em: KernelEmitter, v: ir.Value, src: DType, dst: DType) -> ir.Value:
    b = em.b
    if src == dst:
        return v
    if src == DType.bf16:
        return convert(em, b.bitcast(b.shl(b.zext(v, I32), ir.Constant(I32, 16)), F32), DType.f32, dst)
    if dst == DType.bf16:
        return _f32_to_bf16(em, convert(em, v, src, DType.f32))
    sty, dty = VALUE_TYPES[src], VALUE_TYPES[dst]
    if src.is_float and dst.is_float:
        return b.fpext(v, dty) if src == DType.f16 else b.fptrunc(v, dty)
    if src.is_float:
        if dst == DType.bool:
            return b.fcmp_unordered("!=", v, ir.Constant(sty, 0.0))
        if em.mb.target.arch == "x86_64" and src == DType.f32 and dty.width in (32, 64):
            return _truncate_like_x86(b, v, sty, dty)
        return b.call(intrinsic(b.module, "fptosi.sat", dty, [sty], [dty, sty]), [v])
    if dst.is_float:
        return b.uitofp(v, dty) if src == DType.bool else b.sitofp(v, dty)
    if dst == DType.bool:
        return b.icmp_signed("!=", v, ir.Constant(sty, 0))
    if src == DType.bool:
        return b.zext(v, dty)
    return b.sext(v, dty) if dty.width > sty.width else b.trunc(v, dty)


def _f32_to_bf16(em: KernelEmitter, v: ir.Value) -> ir.Value:
    b = em.b
    bits = b.bitcast(v, I32)
    lsb = b.and_(b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 1))
    rounded = b.lshr(b.add(bits, b.add(ir.Constant(I32, 0x7FFF), lsb)), ir.Constant(I32, 16))
    nan = b.fcmp_unordered("uno", v, v)
    return b.trunc(b.select(nan, ir.Constant(I32, 0x7FC0), rounded), I16)


STATEMENTS = {Let: KernelEmitter.let, Store: KernelEmitter.store, Check: KernelEmitter.check, Loop: KernelEmitter.loop,
              Reduce: KernelEmitter.reduce, Gemm: KernelEmitter.gemm, TopK: KernelEmitter.topk}
EXPRESSIONS = {Const: KernelEmitter.const, Var: KernelEmitter.var, Load: KernelEmitter.load,
               Call: KernelEmitter.call, Cast: KernelEmitter.cast, Index: KernelEmitter.index_value}
