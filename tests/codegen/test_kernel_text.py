"""Kernel IR text: printing and parsing round-trip; clear errors with line:col; the verifier."""
import pytest

from cuvil.codegen.kernel_ir import (Buffer, Call, Cast, Const, Index, Kernel, Let, Load, Loop, Store, Var, loop_var,
                                     scalar_index, verify_kernel)
from cuvil.codegen.kernel_text import parse_kernel, parse_kernels, print_kernel, print_kernels
from cuvil.errors import CuvilParseError, CuvilVerifyError
from cuvil.ir import DType, sym

SOFTMAX = """\
kernel @softmax_0(%x: in f32[s0, 512], %out: out f32[s0, 512]) dims(s0) {
  parallel for i0 in 0..s0 {
    %m = reduce max(-inf:f32) for i1 in 0..512 {
      yield %x[i0, i1]
    }
    %s = reduce sum(0.0:f32) for i1 in 0..512 {
      %e = exp(sub(%x[i0, i1], %m))
      yield %e
    }
    %r = div(1.0:f32, %s)
    for i1 in 0..512 {
      %out[i0, i1] = mul(exp(sub(%x[i0, i1], %m)), %r)
    }
  }
}
"""

EVERYTHING = """\
// a comment line
kernel @pool(%x: in f32[2, 3, s1, 9] strides [27*s1, 9*s1, 9, 1], %o: out f32[2, 3, (s1 + 1)//2, 4], %w: scratch f32[4], %f: in i1[4]) dims(s1) {
  for i0 in 0..2 {
    for i1 in 1..3 {  // start 1: extent 2
      for i2 in 0..(s1 + 1)//2 {
        for i3 in 0..4 {
          %v = reduce max(-inf:f32) for j0 in 0..3, j1 in max(0, 2*i3 - 1)..min(9, 2*i3 + 2) {
            yield masked(%x[i0, i1, 2*i2 + j0 - 1, j1], and(ge(index(2*i2 + j0 - 1), 0:i64), lt(index(2*i2 + j0), index(s1 + 1))), -inf:f32)
          }
          %c = select(%f[i3], cast<f32>(index((i2 + 2) % 3)), 1e-05:f32)
          %o[i0, i1, i2, i3] = select(not(gt(%v, 0.5:f32)), %v, pow(%c, -2.5:f32))
        }
      }
    }
  }
  gemm c=%o[0], a=%x[5*s1], b=%w[0], m=s1, n=4, k=1, lda=1, ldb=4, ldc=4, trans_a=false, trans_b=true, alpha=1.0, beta=0.5
}
"""


def test_round_trip_prints_identically():
    for text in (SOFTMAX, EVERYTHING):
        kernels = parse_kernels(text)
        printed = print_kernels(kernels)
        assert print_kernels(parse_kernels(printed)) == printed
    assert print_kernel(parse_kernel(SOFTMAX)) == SOFTMAX


def test_parsed_structure():
    k = parse_kernels(EVERYTHING)[0]
    assert [b.role for b in k.buffers] == ["in", "out", "scratch", "in"]
    assert k.buffers[0].strides == (27 * sym("s1"), 9 * sym("s1"), 9, 1)
    loop = k.body[0].body[0]
    assert (loop.var, loop.start, loop.extent) == ("i1", 1, 2)
    reduce = loop.body[0].body[0].body[0]
    assert reduce.kind == "max" and [r.var for r in reduce.loops] == ["j0", "j1"]
    assert reduce.value.mask is not None and reduce.value.other == Const(float("-inf"), DType.f32)
    gemm = k.body[1]
    assert gemm.trans_b and not gemm.trans_a and gemm.beta == 0.5 and gemm.a.offset == 5 * sym("s1")
    verify_kernel(k)


def test_canonical_text_ignores_names():
    a = parse_kernel(SOFTMAX)
    b = parse_kernel(SOFTMAX.replace("%x", "%input").replace("%m", "%max").replace("@softmax_0", "@other"))
    assert print_kernel(a) != print_kernel(b)
    assert print_kernel(a, canonical=True) == print_kernel(b, canonical=True)
    c = parse_kernel(SOFTMAX.replace("512", "256"))
    assert print_kernel(a, canonical=True) != print_kernel(c, canonical=True)


def test_built_kernel_prints_and_parses():
    x = Buffer("x", DType.f32, [sym("s0")])
    y = Buffer("y", DType.f32, [sym("s0")], "out")
    i = loop_var("i")
    t = Var("t", DType.f32)
    k = Kernel("k", [x, y], ["s0"], [Loop("i", 0, sym("s0"), [
        Let(t, Call("mul", (Load(x, [i]), Const(2.0, DType.f32)))),
        Store(y, [i], Call("add", (t, Const(0.1, DType.f32))))], parallel=True)])
    verify_kernel(k)
    text = print_kernel(k)
    assert "%y[i] = add(%t, 0.1:f32)" in text
    assert print_kernel(parse_kernel(text)) == text


@pytest.mark.parametrize("text, line, col, message", [
    ("kernel @k(%x: in f32[4]) {\n  %y = exp(%x[0]\n}\n", 2, 17, "expected ')'"),
    ("kernel @k(%x: in f32[4]) {\n  %y = expo(%x[0])\n}\n", 2, 8, "unknown scalar function 'expo'"),
    ("kernel @k(%x: in f32[4]) {\n  %y = exp(%z)\n}\n", 2, 12, "unknown value %z"),
    ("kernel @k(%x: in f32[4]) {\n  for i in 0..4 {\n    %x[j] = 1.0:f32\n  }\n}\n", 3, 8, "unknown index name 'j'"),
    ("kernel @k(%x: in f32[4]) {\n  %x[0] = 1.0:f32\n}\n", 2, 3, "cannot store into input buffer %x"),
    ("kernel @k(%x: in f32[4], %y: out f32[4]) {\n  %y[0] = add(%x[0], 1:i64)\n}\n", 2, 11,
     "arguments have different dtypes"),
    ("kernel @k(%x: in f32[4]) {\n  %y = %x[0, 1]\n}\n", 2, 8, "has rank 1 but is indexed with 2"),
    ("kernel @k(%x: in f32[s0]) {\n}\n", 1, 22, "unknown index name 's0'"),
    ("kernel @k(%x: inout f32[4]) {\n}\n", 1, 15, "unknown buffer role 'inout'"),
    ("kernel @k(%x: in f33[4]) {\n}\n", 1, 18, "unknown dtype 'f33'"),
    ("kernel @k(%x: in f32[4]) {\n  %a = reduce sum(0.0:f32) for i in 0..4 {\n  }\n}\n", 3, 3,
     "must end with 'yield"),
    ("kernel @k(%x: in f32[4]) {\n  %a = 1.5:i64\n}\n", 2, 8, "cannot have integer type"),
    ("kernel @k(%x: in f32[4]) {\n  %a = 1.0:f32 $\n}\n", 2, 16, "unexpected character '$'"),
    ("kernel @k(%x: in f32[4]) {\n  for i in 0..4 {\n    for i in 0..2 {\n    }\n  }\n}\n", 3, 5,
     "i is already defined"),
    ("kernel @k(%x: out i32[1]) {\n  check %x, 1:i32\n}\n", 2, 3,
     "a check writes the kernel's status word (an i32 buffer of role status), not %x"),
])
def test_parse_errors_name_line_and_column(text, line, col, message):
    with pytest.raises(CuvilParseError) as e:
        parse_kernels(text, "bad.kir")
    assert (e.value.line, e.value.col) == (line, col), str(e.value)
    assert message in e.value.message
    assert str(e.value).startswith(f"bad.kir:{line}:{col}: error:")


def test_verifier_rejects_misplaced_parallel_loop_and_unknown_names():
    x = Buffer("x", DType.f32, [8], "out")
    inner = Loop("j", 0, 8, [Store(x, [loop_var("j")], Const(0.0, DType.f32))], parallel=True)
    with pytest.raises(CuvilVerifyError, match="parallel loop j is not at the top level"):
        verify_kernel(Kernel("k", [x], [], [Loop("i", 0, 1, [inner])]))
    with pytest.raises(CuvilVerifyError, match="neither a loop variable in scope, an integer scalar defined before it, nor a kernel symbol"):
        verify_kernel(Kernel("k", [x], [], [Store(x, [loop_var("j")], Const(0.0, DType.f32))]))
    with pytest.raises(CuvilVerifyError, match="%t is used before it is defined"):
        verify_kernel(Kernel("k", [x], [], [Store(x, [0], Var("t", DType.f32))]))
    two = [Loop(v, 0, 8, [Store(x, [loop_var(v)], Const(0.0, DType.f32))], parallel=True) for v in "ab"]
    with pytest.raises(CuvilVerifyError, match="more than one parallel loop"):
        verify_kernel(Kernel("k", [x], [], two))


def test_an_index_value_may_use_an_integer_scalar_defined_before_it():
    # a depthwise convolution's border code binds each tap's clamped column once per output
    # position, from the position itself bound as a scalar
    text = """\
kernel @k(%x: in i64[4], %y: out f32[4]) {
  %n = %x[0]
  %i = index(min(3, max(0, n - 1)))
  %y[i] = cast<f32>(index(n + 1))
}
"""
    kernel = parse_kernel(text)
    verify_kernel(kernel)
    assert print_kernel(kernel) == text
    x, y = Buffer("x", DType.i64, [4], "in"), Buffer("y", DType.f32, [4], "out")
    with pytest.raises(CuvilVerifyError, match="index\\(...\\) uses n, which is neither"):
        verify_kernel(Kernel("k", [x, y], [], [Store(y, [0], Cast(Index(scalar_index("n") + 1), DType.f32))]))
