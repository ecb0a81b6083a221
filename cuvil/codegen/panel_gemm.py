"""GEMM with a pre-packed right-hand side: C[m, n] = A[m, k] @ B[k, n], with B stored in panels of
`width` columns (16, 32, 48 or 64), `Bp[p][k][j] = B[k][width * p + j]` (the last panel zero-padded).

The `layout` pass packs a linear's constant weight this way at compile time, so no run-time packing
is needed (OpenBLAS packs B on every call: for a batch of 64 rows that is as much memory traffic
as the arithmetic can hide). The microkernel keeps an MR x width block of C in vector registers
while it walks k: per step, width / lanes vector loads of the panel and MR broadcasts of A feed
MR * width / lanes fused multiply-adds. MR follows the target's vector registers (`Target`).

A is read through a window, which makes a convolution an implicit GEMM (no im2col copy):

    A[r][kk] = a[(r / a_rows) * a_rows_stride + (r % a_rows) * lda
                 + (j / row_runs) * k_run_stride + (j % row_runs) * k_run_step + kk % k_run],  j = kk / k_run

For a plain row-major A: a_rows = m, k_run = k, row_runs = 1 (the strides are then never used).
For an NHWC convolution over a zero-padded input, a row is an output position (a_rows = output
width, and an output row further is a_rows_stride = stride_h * padded row), and k walks the
window's kernel rows, each a contiguous run of k_run = kw * channels floats (row_runs = 1), a
padded input row (times the dilation) apart. A kernel row dilated along the width is row_runs = kw
runs of the channels, k_run_step = dilation * channels floats apart.

    void cuvil.panel_gemm.<width>[.bias][.relu](ptr C, ptr A, ptr Bp, i64 m, i64 n, i64 k, i64 lda,
                                  i64 ldc, i64 a_rows, i64 a_rows_stride, i64 k_run, i64 k_run_stride,
                                  i64 row_runs, i64 k_run_step, ptr bias)

The `.bias` and `.relu` variants finish each block of C in registers before storing it: + bias[j]
for column j, then relu as C < 0 ? 0 : C (NaN and -0 pass, as in torch and the epilogue loop they
replace). The plain variant ignores `bias`. The `.rowbias` variant adds bias[i] to row i instead: a
convolution whose rows of C are its output channels (`conv2d_columns`).

The `.chunked` variant walks k in chunks of whole runs, each chunk's part of a panel at most
CHUNK_BYTES, over every block of rows before the next chunk: the part stays in L2 while the blocks
read it. Each block after the first chunk starts from the C that the chunks before it stored, and
only the last chunk's store is finished. A convolution's panel of 3 x 3 x 2048 channels (FCN's
head) is 2.4 MB: unchunked, every block of rows streamed it from L3.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import llvmlite.ir as ir

from .mathlib import F32, I32, I64

PTR = ir.PointerType()
ARGS = [PTR] * 3 + [I64] * 11 + [PTR]
MAX_ACCUMULATORS = 24
MAX_ROWS = 12
CHAIN_FMAS = 8      # FMAs in flight to fill two FMA units of 4 cycles' latency
MAX_CHAINS = 4
CHUNK_BYTES = 1 << 20   # a chunk's part of a panel (`.chunked`): half of this Xeon's 2 MB of L2 a core
STREAMED_PANEL_BYTES = 32 << 10     # a larger panel does not stay in L1 while the row blocks read it
PREFETCH_AHEAD = 32     # steps of k ahead that a streamed panel is prefetched


def panel_rows(lanes: int, registers: int, width: int) -> int:
    """Rows of C per microkernel call: as many as the accumulators (at most 24, in at most 12
    rows), the panel's vectors and one broadcast leave registers for. With 32 registers a 32-wide
    panel takes 12 rows: each vector of the panel loaded feeds twice the FMAs of 6 rows (MLP b64
    11% faster on a Xeon with AVX-512); a 64-wide one 6 rows and a 48-wide one 8, 10 and 11 loads
    for 24 FMAs against the 32-wide block's 14 (`ir.ops.nn.panel_width`); a 16-wide one stays at 12 (24 rows measured 5%
    slower on the small CNN's convolutions)."""
    vectors = width // lanes
    return max(1, min(MAX_ACCUMULATORS // vectors, MAX_ROWS, (registers - vectors - 1) // vectors))


def row_blocks(m, rows: int) -> frozenset[int] | None:
    """The blocks of rows (`rows`, then 4, then 1) that `emit_panel_gemm`'s loops compute C's m
    rows in, for an m known at compile time; None (every block) for one that is not."""
    if not (isinstance(m, int) or getattr(m, "is_Integer", False)):
        return None
    m = int(m)
    full = m // rows * rows
    fours = full + (m - full) // 4 * 4 if rows > 4 else full
    return frozenset(size for size, count in ((rows, full), (4, fours - full), (1, m - fours)) if count > 0)


@dataclass(frozen=True)
class PanelNeeds:
    """What the calls of one panel GEMM routine need of it: the loops of the row `blocks` of their
    m (`row_blocks`; None: every block), and `prefetch`, where one of them streams its panels
    (`streams`). Every block of rows then reads the panel from L2 or beyond, and the routine
    prefetches it PREFETCH_AHEAD steps of k ahead: MLP b64 (k 512 and 1024) 5-7% and BERT-small
    3-4% faster. Small panels stay in L1, and the prefetches only cost issue slots (the small
    CNN's convolutions and attention's products 2-3% slower)."""
    blocks: frozenset[int] | None
    prefetch: bool = False

    def __or__(self, other: "PanelNeeds") -> "PanelNeeds":
        blocks = None if self.blocks is None or other.blocks is None else self.blocks | other.blocks
        return PanelNeeds(blocks, self.prefetch or other.prefetch)


def streams(k, width: int) -> bool:
    """Whether a panel of `k` rows (known at compile time) of `width` floats is larger than
    STREAMED_PANEL_BYTES."""
    return isinstance(k, int) and k * width * 4 > STREAMED_PANEL_BYTES


def panel_gemm_name(width: int, bias: bool = False, relu: bool = False, chunked: bool = False,
                    bias_rows: bool = False) -> str:
    return f"cuvil.panel_gemm.{width}" + (".chunked" if chunked else "") + \
        ((".rowbias" if bias_rows else ".bias") if bias else "") + \
        (".relu" if relu else "")


def chunks_k(k, k_run, width: int) -> bool:
    """Whether a product of static `k` in runs of `k_run` wants the `.chunked` variant: its panels
    are larger than a chunk, and have runs to cut them at."""
    return isinstance(k, int) and isinstance(k_run, int) and 0 < k_run < k and k * width * 4 > CHUNK_BYTES


def _intrinsic(module: ir.Module, name: str, ty: ir.Type, arity: int) -> ir.Function:
    suffix = f"v{ty.count}f32" if isinstance(ty, ir.VectorType) else "f32"
    return module.globals.get(f"llvm.{name}.{suffix}") or \
        ir.Function(module, ir.FunctionType(ty, [ty] * arity), f"llvm.{name}.{suffix}")


def emit_panel_gemm(fn: ir.Function, lanes: int, rows: int, width: int, bias: bool = False,
                    relu: bool = False, needs: PanelNeeds | None = None, chunked: bool = False,
                    bias_rows: bool = False) -> None:
    """The body of `panel_gemm_name(width, bias, relu, chunked, bias_rows)` (see the module docstring) for
    `lanes`-wide vectors, with what its callers `needs` (None: every block of rows, for any m, and
    no prefetching). A block's loop left out would run no iterations for those m; each one kept is
    unrolled code LLVM spends time on (12, 4 and 1 rows: 86 ms, 12 and 4: 68, 1 alone: 26)."""
    blocks = None if needs is None else needs.blocks
    prefetch = needs is not None and needs.prefetch
    vec = ir.VectorType(F32, lanes)
    vectors = width // lanes
    fma = _intrinsic(fn.module, "fma", vec, 3)
    prefetch_fn = fn.module.globals.get("llvm.prefetch.p0") or ir.Function(
        fn.module, ir.FunctionType(ir.VoidType(), [PTR, I32, I32, I32]), "llvm.prefetch.p0")
    c, a, bp, m, n, k, lda, ldc, a_rows, a_rows_stride, k_run, k_run_stride, row_runs, k_run_step, bias_ptr = fn.args
    for p in (c, a, bp, bias_ptr):
        p.add_attribute("noalias")
    bias_ptr.name = "bias"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    # chains of accumulators for a block of few rows: a single row's FMAs would each wait for the
    # last (a GEMV); `CHAIN_FMAS` independent ones keep both FMA units busy, k split among them
    chains = {count: max(1, min(MAX_CHAINS, CHAIN_FMAS // (count * vectors))) for count in (rows, 4, 1)}
    acc = [[[b.alloca(vec, name=f"acc{r}.{v}.{h}") for v in range(vectors)] for r in range(rows)]
           for h in range(max(chains.values()))]
    tile = b.alloca(vec, size=ir.Constant(I64, rows * vectors), name="tile")   # a partial panel, then copied
    tile_floats = b.bitcast(tile, F32.as_pointer())
    i64 = lambda x: ir.Constant(I64, x)   # noqa: E731
    zero = ir.Constant(vec, None)
    undef = ir.Constant(vec, ir.Undefined)
    splat_mask = ir.Constant(ir.VectorType(I32, lanes), [0] * lanes)

    def resume_from_c(corner, count: int, whole, left) -> None:
        """acc[0] += the C block the chunks before stored (a partial panel's through the tile)."""
        def add(r, v, at):
            b.store(b.fadd(b.load(acc[0][r][v], typ=vec), b.load(at, typ=vec, align=4)), acc[0][r][v])
        with b.if_else(whole) as (then, otherwise):
            with then:
                for r in range(count):
                    row = b.gep(corner, [b.mul(i64(r), ldc)], inbounds=True, source_etype=F32)
                    for v in range(vectors):
                        add(r, v, b.gep(row, [i64(v * lanes)], inbounds=True, source_etype=F32))
            with otherwise:
                for r in range(count):
                    for v in range(vectors):
                        b.store(zero, b.gep(tile, [i64(r * vectors + v)], inbounds=True, source_etype=vec))

                def copy_row(r):
                    row, kept = (b.gep(base, [b.mul(r, stride)], inbounds=True, source_etype=F32)
                                 for base, stride in ((corner, ldc), (tile_floats, i64(width))))
                    for_range(b, i64(0), left, i64(1), "j", lambda j: b.store(
                        b.load(b.gep(row, [j], inbounds=True, source_etype=F32), typ=F32),
                        b.gep(kept, [j], inbounds=True, source_etype=F32)),
                        ("llvm.loop.vectorize.width", 1), ("llvm.loop.unroll.disable",))
                for_range(b, i64(0), i64(count), i64(1), "r", copy_row, ("llvm.loop.unroll.disable",))
                for r in range(count):
                    for v in range(vectors):
                        add(r, v, b.gep(tile, [i64(r * vectors + v)], inbounds=True, source_etype=vec))

    def block(p, first: ir.Value, count: int, runs: tuple, resume: ir.Value | None, last: ir.Value | None) -> None:
        """C[first : first+count, panel p] for a static count of rows, over k's runs [runs[0],
        runs[1]); `resume`: start from C (a chunk after the first), `last`: finish the store."""
        panel = b.gep(bp, [b.mul(p, b.mul(k, i64(width)))], inbounds=True, source_etype=F32)
        chain = chains[count]
        for h in range(chain):
            for r in range(count):
                for v in range(vectors):
                    b.store(zero, acc[h][r][v])
        column = b.mul(p, i64(width))
        left = b.sub(n, column)
        whole = b.icmp_signed(">=", left, i64(width))
        corner = b.gep(c, [b.add(b.mul(first, ldc), column)], inbounds=True, source_etype=F32)
        if resume is not None:
            with b.if_then(resume):
                resume_from_c(corner, count, whole, left)
        rows_of_a = []
        for r in range(count):
            row = b.add(first, i64(r))
            at = b.add(b.mul(b.sdiv(row, a_rows), a_rows_stride), b.mul(b.srem(row, a_rows), lda))
            rows_of_a.append(b.gep(a, [at], inbounds=True, source_etype=F32))

        def run(j):     # one contiguous run of k: A at +kk in every row, B `width` floats per kk
            at = b.add(b.mul(b.sdiv(j, row_runs), k_run_stride), b.mul(b.srem(j, row_runs), k_run_step))
            a_run = [b.gep(row, [at], inbounds=True, source_etype=F32) for row in rows_of_a]
            b_run = b.gep(panel, [b.mul(b.mul(j, k_run), i64(width))], inbounds=True, source_etype=F32)

            def step(kk, at, h=0):       # `at`: the panel at kk, a pointer stepped by the loop itself,
                # so that the loop needs no strength reduction (code generation runs without it on x86)
                if prefetch:    # (read, to every cache level, data) a 64-byte line at a time
                    for line in range(0, width, 16):
                        ahead = b.gep(at, [i64(PREFETCH_AHEAD * width + line)], source_etype=F32)
                        b.call(prefetch_fn, [ahead, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])
                bv = [b.load(b.gep(at, [i64(v * lanes)], inbounds=True, source_etype=F32), typ=vec, align=4)
                      for v in range(vectors)]
                for r in range(count):
                    x = b.load(b.gep(a_run[r], [kk], inbounds=True, source_etype=F32), typ=F32, align=4)
                    xs = b.shuffle_vector(b.insert_element(undef, x, ir.Constant(I32, 0)), undef, splat_mask)
                    for v in range(vectors):
                        b.store(b.call(fma, [xs, bv[v], b.load(acc[h][r][v], typ=vec)]), acc[h][r][v])
                return b.gep(at, [i64(width)], inbounds=True, source_etype=F32)

            def steps(kk, at):      # `chain` steps of k, each into its own accumulators
                for h in range(chain):
                    at = step(b.add(kk, i64(h)), at, h)
                return at
            # not unrolled: a short constant run (an RGB stem's 9) would be unrolled fully in every
            # row-block variant (compile time tenfold), and unrolling by 2 measured no faster than
            # the loop (one FMA per row and vector already fills an iteration) for 15% more LLVM time
            if chain == 1:
                for_range(b, i64(0), k_run, i64(1), "k", step, ("llvm.loop.unroll.disable",), carry=b_run)
                return
            split = b.mul(b.sdiv(k_run, i64(chain)), i64(chain))
            for_range(b, i64(0), split, i64(chain), "kc", steps, ("llvm.loop.unroll.disable",), carry=b_run)
            for_range(b, split, k_run, i64(1), "k", step, ("llvm.loop.unroll.disable",),
                      carry=b.gep(b_run, [b.mul(split, i64(width))], inbounds=True, source_etype=F32))
        for_range(b, runs[0], runs[1], i64(1), "run", run, ("llvm.loop.unroll.disable",))
        for h in range(1, chain):
            for r in range(count):
                for v in range(vectors):
                    b.store(b.fadd(b.load(acc[0][r][v], typ=vec), b.load(acc[h][r][v], typ=vec)), acc[0][r][v])
        bias_at = b.gep(bias_ptr, [first if bias_rows else column], inbounds=True, source_etype=F32)

        def finish(x, r, at, ty):
            """The epilogue in registers: x (of type `ty`, at row `r` of the block and column `at`
            of the panel) + bias at `at` (at `r`: `bias_rows`), then relu (after the last chunk only)."""
            done = x
            if bias_rows:
                one = b.load(b.gep(bias_at, [r], inbounds=True, source_etype=F32), typ=F32, align=4)
                done = b.fadd(done, one if ty == F32 else b.shuffle_vector(
                    b.insert_element(undef, one, ir.Constant(I32, 0)), undef, splat_mask))
            elif bias:
                done = b.fadd(done, b.load(b.gep(bias_at, [at], inbounds=True, source_etype=F32), typ=ty, align=4))
            if relu:        # x < 0 ? 0 : x, like torch.relu (-0.0 and NaN pass)
                zero = ir.Constant(ty, None)
                done = b.select(b.fcmp_ordered("<", done, zero), zero, done)
            return done if last is None or done is x else b.select(last, done, x)
        with b.if_else(whole) as (then, otherwise):
            with then:
                for r in range(count):
                    row = b.gep(corner, [b.mul(i64(r), ldc)], inbounds=True, source_etype=F32)
                    for v in range(vectors):
                        b.store(finish(b.load(acc[0][r][v], typ=vec), i64(r), i64(v * lanes), vec),
                                b.gep(row, [i64(v * lanes)], inbounds=True, source_etype=F32), align=4)
            with otherwise:      # the last, partial panel: through the stack, then `left` floats a row
                for r in range(count):
                    for v in range(vectors):
                        b.store(b.load(acc[0][r][v], typ=vec),
                                b.gep(tile, [i64(r * vectors + v)], inbounds=True, source_etype=vec))

                def copy_row(r):
                    row, kept = (b.gep(base, [b.mul(r, stride)], inbounds=True, source_etype=F32)
                                 for base, stride in ((corner, ldc), (tile_floats, i64(width))))
                    # one scalar loop for every row count: once per call, not worth vectorising
                    for_range(b, i64(0), left, i64(1), "j", lambda j: b.store(
                        finish(b.load(b.gep(kept, [j], inbounds=True, source_etype=F32), typ=F32), r, j, F32),
                        b.gep(row, [j], inbounds=True, source_etype=F32)),
                        ("llvm.loop.vectorize.width", 1), ("llvm.loop.unroll.disable",))
                for_range(b, i64(0), i64(count), i64(1), "r", copy_row, ("llvm.loop.unroll.disable",))

    panels = b.sdiv(b.add(n, i64(width - 1)), i64(width))
    full = b.mul(b.sdiv(m, i64(rows)), i64(rows))

    # the last rows (fewer than `rows`) in blocks of 4, then of 1: two more block variants to
    # generate instead of rows - 1. Every variant is unrolled into its own code, and LLVM's time
    # on the function grows with their total rows (12 + 4 + 1 here, against 12 + 8 + 4 + 2 + 1 with
    # blocks of every power of two: a third less LLVM time for the same speed).
    fours = b.add(full, b.mul(b.sdiv(b.sub(m, full), i64(4)), i64(4))) if rows > 4 else full

    def kept(size: int) -> bool:
        return blocks is None or size in blocks

    def rows_of(p, runs: tuple, resume=None, last=None):
        if kept(rows):
            for_range(b, i64(0), full, i64(rows), "i", lambda first: block(p, first, rows, runs, resume, last))
        if rows > 4 and kept(4):
            for_range(b, full, fours, i64(4), "i4", lambda first: block(p, first, 4, runs, resume, last))
        if rows > 1 and kept(1):
            for_range(b, fours, m, i64(1), "i1", lambda first: block(p, first, 1, runs, resume, last))

    all_runs = b.sdiv(k, k_run)
    if chunked:     # chunks of whole runs, a chunk's part of a panel at most CHUNK_BYTES
        per_chunk = b.sdiv(i64(CHUNK_BYTES // 4), b.mul(k_run, i64(width)))
        per_chunk = b.select(b.icmp_signed("<", per_chunk, i64(1)), i64(1), per_chunk)

        def chunk(p, lo):
            hi = b.add(lo, per_chunk)
            hi = b.select(b.icmp_signed("<", hi, all_runs), hi, all_runs)
            rows_of(p, (lo, hi), b.icmp_signed(">", lo, i64(0)), b.icmp_signed("==", hi, all_runs))
        for_range(b, i64(0), panels, i64(1), "p", lambda p: for_range(
            b, i64(0), all_runs, per_chunk, "chunk", lambda lo: chunk(p, lo), ("llvm.loop.unroll.disable",)))
    else:
        for_range(b, i64(0), panels, i64(1), "p", lambda p: rows_of(p, (i64(0), all_runs)))
    b.ret_void()


def for_range(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value, step: ir.Value, name: str,
              body: Callable, *loop_properties: tuple, carry: ir.Value | None = None) -> None:
    """for (i = lo; i < hi; i += step) body(i), with LLVM loop properties (`loop_metadata`).
    With `carry`, a value carried around the loop: body(i, value) returns the next iteration's."""
    pre = b.block
    header, inner, exit_ = (b.function.append_basic_block(f"{name}.{part}") for part in ("header", "body", "exit"))
    b.branch(header)
    b.position_at_end(header)
    i = b.phi(I64, name=name)
    i.add_incoming(lo, pre)
    carried = None
    if carry is not None:
        carried = b.phi(carry.type, name=name + ".carry")
        carried.add_incoming(carry, pre)
    b.cbranch(b.icmp_signed("<", i, hi), inner, exit_)
    b.position_at_end(inner)
    if carried is None:
        body(i)
    else:
        carried.add_incoming(body(i, carried), b.block)
    i.add_incoming(b.add(i, step, flags=["nsw"]), b.block)
    latch = b.branch(header)
    if loop_properties:
        latch.set_metadata("llvm.loop", loop_metadata(b.module, *loop_properties))
    b.position_at_end(exit_)


def loop_metadata(module: ir.Module, *props: tuple) -> ir.values.MDValue:
    """A loop ID: a fresh node whose first operand is itself, then one node per property
    (its name and any i32 values)."""
    loop = ir.values.MDValue(module, [], name=str(len(module.metadata)))
    loop.operands = (loop, *(module.add_metadata([ir.MetaDataString(module, name),
                                                  *(ir.Constant(ir.IntType(32), v) for v in values)])
                             for name, *values in props))
    return loop
