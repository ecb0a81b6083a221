"""Value ranges of scalar expressions (value_range.py) against hand-worked intervals, and the
cheaper forms of exp and log they allow: chosen only where the argument's range allows, and as
exact as the general functions there (against float64), NaN in giving NaN out."""
import math
import re

import numpy as np
import pytest
import torch

from cuvil.codegen.call import call_kernel
from cuvil.codegen.jit import build_units, compile_kernels
from cuvil.codegen.kernel_ir import Buffer, Call, Const, DType, Load, Var
from cuvil.codegen.kernel_text import parse_kernels
from cuvil.codegen.target import Target
from cuvil.codegen.value_range import ANY, Span, ValueRanges, math_form

X = Load(Buffer("x", DType.f32, (8,)), (0,))


def c(v):
    return Const(v, DType.f32)


def f(name, *args):
    return Call(name, args)


def close(span: Span, lo: float, hi: float, nan: bool) -> bool:
    return span.nan == nan and math.isclose(span.lo, lo, rel_tol=1e-5, abs_tol=1e-5) and \
        math.isclose(span.hi, hi, rel_tol=1e-5, abs_tol=1e-5)


def test_the_chain_of_the_benchmarks():
    """exp's argument in the 20-op chain: -(sqrt(|2 sigmoid(.) - 1| + 1) * tanh(x)), in
    [-sqrt 2, sqrt 2]; log's: that exp plus 0.5, in [e^-sqrt2 + 0.5, e^sqrt2 + 0.5]. NaN stays
    possible throughout (x can be NaN)."""
    s = f("sigmoid", f("add", X, c(1.0)))
    root = f("sqrt", f("add", f("abs", f("sub", f("mul", s, c(2.0)), c(1.0))), c(1.0)))
    arg = f("neg", f("mul", root, f("tanh", X)))
    r = ValueRanges()
    assert close(r.span(root), 1.0, math.sqrt(2), True)
    assert close(r.span(arg), -math.sqrt(2), math.sqrt(2), True)
    log_arg = f("add", f("exp", arg), c(0.5))
    assert close(r.span(log_arg), math.exp(-math.sqrt(2)) + 0.5, math.exp(math.sqrt(2)) + 0.5, True)
    assert math_form("exp", r.span(arg)) == "exp.narrow" and math_form("log", r.span(log_arg)) == "log.normal"


def test_what_can_be_nan_and_infinite():
    r = ValueRanges()
    assert r.span(X) == ANY and r.span(c(float("nan"))) == ANY
    finite = f("tanh", X)                                   # [-1, 1], NaN where x is
    assert close(r.span(f("mul", finite, c(3.0))), -3.0, 3.0, True)
    inf = c(math.inf)
    assert r.span(f("sub", inf, inf)).nan                   # inf - inf
    assert r.span(f("mul", c(0.0), inf)).nan                # 0 * inf
    assert r.span(f("mul", f("sigmoid", c(-5.0)), f("add", f("exp", c(2.0)), inf))) == Span(
        r.span(f("sigmoid", c(-5.0))).lo * math.inf, math.inf, False)     # positive times +inf: +inf, no NaN
    assert r.span(f("sqrt", f("sub", f("sigmoid", c(0.0)), c(1.0)))).nan  # sqrt of a negative
    assert not r.span(f("sqrt", f("sigmoid", c(0.0)))).nan
    assert r.span(f("div", c(1.0), f("tanh", c(0.5)))).lo > 2.0          # 1 / tanh(0.5) = 2.16
    assert r.span(f("div", c(1.0), f("tanh", X))) == ANY                 # the divisor can be 0
    assert close(r.span(f("abs", f("tanh", X))), 0.0, 1.0, True)
    # f32 overflows where float64 does not: (tanh(x) + 2) * 1e30 * 1e30 * 1e-30 is inf in f32
    big = f("mul", f("mul", f("mul", f("add", f("tanh", X), c(2.0)), c(1e30)), c(1e30)), c(1e-30))
    assert r.span(big).hi == math.inf and math_form("log", r.span(big)) == "log"
    assert close(r.span(f("log", f("sigmoid", X))), -math.inf, 0.0, True)  # log of [0, 1]
    assert close(r.span(f("max", f("min", X, c(80.0)), c(-80.0))), -80.0, 80.0, True)
    assert close(r.span(f("select", f("lt", X, c(0.0)), c(-2.0), f("sigmoid", X))), -2.0, 1.0, True)
    assert close(r.span(f("fma", c(3.0), f("tanh", X), c(1.0))), -2.0, 4.0, True)   # 3 * [-1, 1] + 1


def test_scalars_carry_their_definition_and_reductions_do_not():
    r = ValueRanges()
    t = Var("t", DType.f32)
    r.let("t", f("tanh", X))
    assert close(r.span(f("exp", t)), math.exp(-1), math.e, True)
    r.let("t", None)                                        # t is now a reduction's result
    assert r.span(f("exp", t)) == Span(0.0, math.inf, True)


KERNELS = """kernel @forms(%x: in f32[s0], %e: out f32[s0], %l: out f32[s0], %ge: out f32[s0], %gl: out f32[s0]) dims(s0) {
  parallel for i in 0..s0 {
    %t = tanh(%x[i])
    %e[i] = exp(max(min(%x[i], 80.0:f32), -80.0:f32))
    %l[i] = log(max(min(%x[i], 1e30:f32), 1e-30:f32))
    %ge[i] = exp(mul(%x[i], %t))
    %gl[i] = log(add(exp(mul(%t, 3.0:f32)), 0.5:f32))
  }
}
"""


def test_the_emitter_picks_a_form_only_where_the_range_allows():
    kernels = parse_kernels(KERNELS)
    [text] = build_units(kernels, {"forms": "forms"}, Target.host(), {})
    calls = re.findall(r"call \w+ @\"?(cuvil\.math\.[\w.]+)\"?\(", text)
    # exp: the clamped x (narrow) and x * tanh(x) (general); log: the clamped x (normal) and
    # e^(3 tanh x) + 0.5 in [0.55, 20.6] (normal)
    assert sorted(calls) == ["cuvil.math.exp.f32", "cuvil.math.exp.narrow.f32", "cuvil.math.exp.narrow.f32",
                             "cuvil.math.log.normal.f32", "cuvil.math.log.normal.f32", "cuvil.math.tanh.f32"]


@pytest.fixture(scope="module")
def forms():
    return compile_kernels(parse_kernels(KERNELS), cache=None)


def _ulp(out: torch.Tensor, ref: np.ndarray) -> float:
    spacing = np.spacing(np.abs(ref.astype(np.float32))).astype(np.float64)
    return float(np.max(np.abs(out.double().numpy() - ref) / spacing))


def test_the_forms_are_as_exact_as_the_general_functions(forms):
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.linspace(-90, 90, 200_001), torch.logspace(-35, 35, 100_001), torch.randn(10_000, generator=g),
                   torch.tensor([1e-30, 1e30, 80.0, -80.0, 1e-45, 1e38])]).float()
    e, lg = torch.empty_like(x), torch.empty_like(x)
    call_kernel(forms, "forms", [x, e, lg, torch.empty_like(x), torch.empty_like(x)], split=2)
    xd = x.double().numpy()
    assert _ulp(e, np.exp(np.clip(xd, -80, 80))) <= 1.0
    assert _ulp(lg, np.log(np.clip(xd, 1e-30, 1e30))) <= 1.0


def test_nan_gives_nan_in_every_form(forms):
    x = torch.tensor([float("nan"), 1.0, float("inf"), -float("inf")])
    outs = [torch.empty_like(x) for _ in range(4)]
    call_kernel(forms, "forms", [x, *outs], split=1)
    assert all(torch.isnan(o[0]) for o in outs)
    torch.testing.assert_close(outs[0][2:], torch.exp(torch.tensor([80.0, -80.0])), rtol=2e-7, atol=0)
