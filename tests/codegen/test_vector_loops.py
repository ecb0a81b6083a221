"""Cuvil's innermost loops are its vector loops: the lowering puts the contiguous dim innermost,
and the emitter keeps LLVM from unrolling a short one fully (which would make the strided loop
around it the one LLVM vectorises, with gathers and scatters). The kernel is the CNN stem's
conv2d + bias + relu (after fold-batchnorm) as the lowering makes it: an im2col fill whose rows are
32 masked loads, a GEMM, and an epilogue over 32-column rows."""
import re

from cuvil.codegen.jit import build_units, compile_kernels
from cuvil.codegen.kernel_text import parse_kernels
from cuvil.codegen.target import Target

STEM = """
kernel @stem(%x: in f32[s0, 3, 32, 32], %w: in f32[16, 3, 3, 3], %bias: in f32[16], %y: out f32[s0, 16, 32, 32], %col: scratch f32[4*s0, 27, 256]) dims(s0) {
  parallel for p in 0..4*s0 {
    for c in 0..3 {
      for kh in 0..3 {
        for kw in 0..3 {
          for rr in 0..min(8, -8*(p % 4) + 32) {
            for ow in 0..32 {
              %col[p, 9*c + 3*kh + kw, ow + 32*rr] = masked(%x[p//4, c, kh + rr + 8*(p % 4) - 1, kw + ow - 1], and(and(ge(index(kh + rr + 8*(p % 4) - 1), 0:i64), lt(index(kh + rr + 8*(p % 4) - 1), index(32))), and(ge(index(kw + ow - 1), 0:i64), lt(index(kw + ow - 1), index(32)))), 0.0:f32)
            }
          }
        }
      }
    }
    gemm c=%y[256*(p % 4) + 16384*(p//4)], a=%w[0], b=%col[6912*p], m=16, n=32*min(8, -8*(p % 4) + 32), k=27, lda=27, ldb=256, ldc=1024, trans_a=false, trans_b=false, alpha=1.0, beta=0.0
    for e1 in 0..16 {
      for e2 in 0..min(8, -8*(p % 4) + 32) {
        for e3 in 0..32 {
          %y[p//4, e1, e2 + 8*(p % 4), e3] = max(add(%y[p//4, e1, e2 + 8*(p % 4), e3], %bias[e1]), 0.0:f32)
        }
      }
    }
  }
}
"""


def test_conv_fill_and_epilogue_vectorise_along_contiguous_columns_without_gathers():
    asm = compile_kernels(parse_kernels(STEM), cache=None).asm("stem")
    assert not re.search(r"gather|scatter", asm, re.I), "a strided loop was vectorised (gathers/scatters)"
    assert re.search(r"vmaxps\s+[^\n]*%[yz]mm", asm)              # the epilogue's relu, 8 or 16 lanes at a time
    assert re.search(r"vmovups\s+%[yz]mm\d+, [^\n]*\(", asm)       # contiguous vector stores


MASKED_MAX = """
kernel @masked_max(%m: in i1[4, 4096], %x: in f32[4, 4096], %y: out f32[4, 1], %z: out f32[4, 1]) {
  parallel for p in 0..4 {
    %hi = reduce max(-inf:f32) for r in 0..4096 {
      yield select(%m[p, r], %x[p, r], -inf:f32)
    }
    %y[p, 0] = %hi
    %lo = reduce min(inf:f32) for r in 0..4096 {
      yield select(%m[p, r], %x[p, r], inf:f32)
    }
    %z[p, 0] = %lo
  }
}
"""


def test_a_masked_row_maximum_vectorises():
    # with the fill's -inf in sight, LLVM turns max(acc, select(m, x, -inf)) into select(m, max(acc, x), acc),
    # which its vectoriser leaves scalar (25x slower); the emitter hides the infinity from it
    import torch
    from cuvil.codegen.call import call_kernel
    compiled = compile_kernels(parse_kernels(MASKED_MAX), cache=None)
    ir = compiled.llvm_ir("masked_max")
    assert re.search(r"@llvm\.maximum\.v\d+f32", ir) and re.search(r"@llvm\.minimum\.v\d+f32", ir), ir
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 4096, generator=g)
    m = torch.rand(4, 4096, generator=g) < 0.3
    m[3] = False                                    # nothing kept: the fills themselves
    x[1, 7], m[1, 7] = float("nan"), True           # a kept NaN wins, as in torch
    y, z = torch.empty(4, 1), torch.empty(4, 1)
    call_kernel(compiled, "masked_max", [m, x, y, z])
    torch.testing.assert_close(y, torch.where(m, x, -float("inf")).amax(1, keepdim=True), equal_nan=True)
    torch.testing.assert_close(z, torch.where(m, x, float("inf")).amin(1, keepdim=True), equal_nan=True)


ONE_DIM = """
kernel @exp1d(%x: in f32[s0], %y: out f32[s0]) dims(s0) {
  parallel for i in 0..s0 {
    %y[i] = exp(%x[i])
  }
}
kernel @add1d(%x: in f32[s0], %y: out f32[s0]) dims(s0) {
  parallel for i in 0..s0 {
    %y[i] = add(%x[i], 1.0:f32)
  }
}
"""


def test_a_one_dim_loop_of_long_latency_math_works_on_four_vectors_at_once():
    # a 1-d elementwise kernel's only loop is the parallel one: exp's chain of dependent steps
    # interleaves four vectors there too (1.4x the speed for exp on 65536 floats); an add does not
    exp1d, add1d = parse_kernels(ONE_DIM)
    (unit,) = build_units([exp1d], {"exp1d": "k_exp"}, Target.host(), {})
    assert '!"llvm.loop.interleave.count", i32 4 }' in unit
    (unit,) = build_units([add1d], {"add1d": "k_add"}, Target.host(), {})
    assert "llvm.loop.interleave.count" not in unit


SHORT_ROW_SUM = """
kernel @row_sums(%x: in f32[s0, 64], %y: out f32[s0, 1]) dims(s0) {
  parallel for p in 0..s0 {
    %x0 = %x[p, 0]
    %sum1 = reduce sum(0.0:f32) for r in 0..64 {
      yield sub(%x[p, r], %x0)
    }
    %y[p, 0] = %sum1
  }
}
"""


def test_a_short_static_row_sum_vectorises():
    # layer norm's first sum over 64 channels: unrolled fully before the vectoriser saw it, it
    # was one chain of 64 scalar adds (the block's layer norm 18 -> 6.3 us once a vector loop)
    import torch
    from cuvil.codegen.call import call_kernel
    compiled = compile_kernels(parse_kernels(SHORT_ROW_SUM), cache=None)
    ir = compiled.llvm_ir("row_sums")
    assert re.search(r"fadd reassoc[a-z ]* <\d+ x float>", ir), ir
    assert len(re.findall(r"fadd reassoc[a-z ]* float ", ir)) < 8, ir
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(0))
    y = torch.empty(5, 1)
    call_kernel(compiled, "row_sums", [x, y])
    torch.testing.assert_close(y, (x.double() - x[:, :1].double()).sum(1, keepdim=True).float(), rtol=1e-5, atol=1e-5)
