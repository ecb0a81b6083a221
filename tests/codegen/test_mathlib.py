"""Cuvil's own exp/log/log1p/expm1/tanh/erf/sigmoid, trigonometric and hyperbolic functions, pow, atan2 and fmod (mathlib.py): accuracy in ULPs against float64
over wide ranges, agreement with eager torch, and IEEE special values (inf, nan, 0, denormals)."""
import math

import numpy as np
import pytest
import torch

from cuvil.codegen import llvm_emit
from cuvil.codegen.call import call_kernel
from cuvil.codegen.jit import compile_kernels
from cuvil.codegen.kernel_text import parse_kernels
from cuvil.codegen.mathlib import EXP_FTZ, MathLib
from cuvil.codegen.target import Target

UNARY = ["exp", "log", "log1p", "expm1", "tanh", "erf", "sigmoid", "sin", "cos", "tan", "atan", "asin", "acos", "sinh",
         "cosh", "asinh", "acosh", "atanh"]
# max error in units in the last place of the f32 result, measured against float64
MAX_ULP = {"exp": 1.0, "log": 1.0, "log1p": 2.0, "expm1": 2.0, "tanh": 1.5, "erf": 2.5, "sigmoid": 2.5, "sin": 1.0, "cos": 1.0, "tan": 1.0,
           "atan": 1.0, "asin": 1.0, "acos": 1.0, "sinh": 1.0, "cosh": 1.0, "asinh": 1.0, "acosh": 1.0, "atanh": 1.0,
           "pow": 1.0, "atan2": 1.0}
REFERENCE = {"exp": torch.exp, "log": torch.log, "log1p": torch.log1p, "expm1": torch.expm1, "tanh": torch.tanh, "erf": torch.erf, "sigmoid": torch.sigmoid,
             "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "atan": torch.atan, "asin": torch.asin,
             "acos": torch.acos, "sinh": torch.sinh, "cosh": torch.cosh, "asinh": torch.asinh, "acosh": torch.acosh,
             "atanh": torch.atanh}

KERNELS = (
    "kernel @unary(%x: in f32[s0], " + ", ".join(f"%{f}: out f32[s0]" for f in UNARY) + ") dims(s0) {\n"
    "  parallel for i in 0..s0 {\n" + "".join(f"    %{f}[i] = {f}(%x[i])\n" for f in UNARY) + "  }\n}\n"
    "kernel @power(%a: in f32[s0], %b: in f32[s0], %out: out f32[s0]) dims(s0) {\n"
    "  parallel for i in 0..s0 {\n    %out[i] = pow(%a[i], %b[i])\n  }\n}\n"
    "kernel @angle(%y: in f32[s0], %x: in f32[s0], %out: out f32[s0]) dims(s0) {\n"
    "  parallel for i in 0..s0 {\n    %out[i] = atan2(%y[i], %x[i])\n  }\n}\n"
    "kernel @flushed(%x: in f32[s0], %out: out f32[s0]) dims(s0) {\n"
    "  parallel for i in 0..s0 {\n    %out[i] = exp_ftz(%x[i])\n  }\n}\n"
    "kernel @modulo(%x: in f32[s0], %y: in f32[s0], %fmod: out f32[s0], %rem: out f32[s0]) dims(s0) {\n"
    "  parallel for i in 0..s0 {\n    %fmod[i] = fmod(%x[i], %y[i])\n    %rem[i] = rem(%x[i], %y[i])\n  }\n}\n")


@pytest.fixture(scope="module", params=["host", "portable"])
def compiled(request):
    """The host's code (with AVX-512, exp scales by 2^n with vscalefps), and the portable code
    that other targets get, run here by withholding the host's scalef."""
    if request.param == "host":
        return compile_kernels(parse_kernels(KERNELS), cache=None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(llvm_emit, "MathLib", lambda module, scalef: MathLib(module, scalef=False))
        return compile_kernels(parse_kernels(KERNELS), cache=None)


def test_exp_scales_in_one_instruction_only_where_the_target_has_it(compiled, request):
    # llvm.ldexp is vscalefps with AVX-512; elsewhere it could become a libm call, which kernels
    # must not make
    has_ldexp = any("@llvm.ldexp" in text for text in compiled.llvm_ir_texts)
    assert has_ldexp == (request.node.callspec.params["compiled"] == "host" and Target.host().has_feature("avx512f"))
    assert not any(b"ldexp" in obj for obj in compiled.objects)        # no libm symbol to import


def run_unary(compiled, x):
    outs = [torch.empty_like(x) for _ in UNARY]
    call_kernel(compiled, "unary", [x] + outs, split=4)
    return dict(zip(UNARY, outs))


def max_ulp(out: torch.Tensor, ref64: torch.Tensor) -> float:
    """Largest error in f32 ULPs of the reference; where the reference rounds to inf/nan in f32 the
    result must be exactly that."""
    ref32 = ref64.float()
    special = ~torch.isfinite(ref32)
    torch.testing.assert_close(out[special], ref32[special], equal_nan=True, rtol=0, atol=0)
    r = ref64[~special].numpy()
    spacing = np.spacing(np.abs(r.astype(np.float32))).astype(np.float64)
    err = np.abs(out[~special].double().numpy() - r) / spacing
    return float(err.max()) if err.size else 0.0


def wide_inputs() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    # with a dense grid over [-10, 10], where the largest errors of tanh, sigmoid and erf lie (a
    # sigmoid 2.66 ulp off at x = -4.1447 passed the coarser grids)
    return torch.cat([torch.linspace(-110, 110, 100_001), torch.linspace(-10, 10, 2_000_001), torch.logspace(-38, 38, 50_001),
                      -torch.logspace(-38, 38, 50_001), torch.randn(50_000, generator=g) * 4,
                      torch.tensor([1e-45, -1e-45, 1.2e-38, 88.72, 88.73, -87.3, -103.9, -104.0, 3.4e38])]).float()


def test_unary_accuracy_against_float64(compiled):
    x = wide_inputs()
    outs = run_unary(compiled, x)
    for name, out in outs.items():
        ref = REFERENCE[name](x.double())
        assert max_ulp(out, ref) <= MAX_ULP[name], name
        eager = REFERENCE[name](x)
        # torch's own f32 sinh and cosh overflow from |x| = 88.72 (where e^x does), although the
        # true values are finite up to 89.41: there the float64 reference decides, above
        agree = ~(torch.isinf(eager) & torch.isfinite(ref.float()))
        assert name in ("sinh", "cosh") or agree.all(), name
        torch.testing.assert_close(out[agree], eager[agree], equal_nan=True, msg=name)


def test_unary_special_values(compiled):
    x = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0, -0.0, 1e-40, -1e-40, 1.0, -1.0])
    outs = run_unary(compiled, x)
    for name, out in outs.items():
        special = REFERENCE[name](x[:5])        # inf, -inf, nan, 0, -0: exactly torch's answer
        torch.testing.assert_close(out[:5], special, equal_nan=True, rtol=0, atol=0, msg=name)
        zeros = special[3:] == 0                # signed zeros (a NaN's sign means nothing)
        assert torch.equal(torch.signbit(out[3:5][zeros]), torch.signbit(special[3:][zeros])), name
        assert max_ulp(out[5:], REFERENCE[name](x[5:].double())) <= MAX_ULP[name], name


def test_softmax_exp_is_0_below_the_smallest_normal_float(compiled):
    """exp_ftz, softmax's exp(x - max) (x <= 0): exp's accuracy down to 2^-126, 0 below it (no
    denormal ever made), 0 at -inf and NaN for NaN."""
    x = torch.cat([-torch.logspace(-38, 2.1, 200_001), torch.linspace(-110, 0, 100_001),
                   torch.tensor([0.0, -0.0, EXP_FTZ, -87.3366, float("-inf"), float("nan")])]).float()
    out = torch.empty_like(x)
    call_kernel(compiled, "flushed", [x, out], split=4)
    normal = x >= EXP_FTZ
    assert max_ulp(out[normal], torch.exp(x[normal].double())) <= MAX_ULP["exp"]
    assert out[normal].min() >= 2.0 ** -126
    assert (out[~normal & ~x.isnan()] == 0).all() and out[-1].isnan()


def test_sin_cos_far_from_zero(compiled):
    # exact range reduction for every f32 magnitude (Cody-Waite below 2^20 pi/2, a table above)
    x = torch.cat([torch.logspace(6, 38.5, 20_001), torch.tensor([1647099.0, 1647100.0, 16777216.0, 1e22, 3.4e38])])
    x = torch.cat([x, -x]).float()
    outs = run_unary(compiled, x)
    for name in ("sin", "cos"):
        assert max_ulp(outs[name], REFERENCE[name](x.double())) <= MAX_ULP[name], name


def test_pow_accuracy_and_special_cases(compiled):
    g = torch.Generator().manual_seed(1)
    a = torch.cat([torch.rand(50_000, generator=g) * 20, torch.logspace(-30, 30, 20_001)]).float()
    b = torch.cat([torch.randn(50_000, generator=g) * 6, torch.randn(20_001, generator=g)]).float()
    out = torch.empty_like(a)
    call_kernel(compiled, "power", [a, b, out])
    assert max_ulp(out, a.double() ** b.double()) <= MAX_ULP["pow"]
    values = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, float("inf"), float("-inf"), float("nan"), -8.0]
    exps = [0.0, -0.0, 1.0, 2.0, 3.0, -1.0, -3.0, 0.5, -0.5, 1.5, float("inf"), float("-inf"), float("nan")]
    a, b = (t.reshape(-1).float() for t in torch.meshgrid(torch.tensor(values), torch.tensor(exps), indexing="ij"))
    out = torch.empty_like(a)
    call_kernel(compiled, "power", [a, b, out])
    torch.testing.assert_close(out, torch.pow(a, b), equal_nan=True, rtol=0, atol=0)
    assert torch.equal(torch.signbit(out[out == 0]), torch.signbit(torch.pow(a, b)[out == 0]))


def test_trigonometric_inverses_next_to_their_edges(compiled):
    # asin/acos next to +-1 (where 1 - x^2 cancels in f32) and atan next to its reduction points
    below_one = torch.nextafter(torch.ones(1), torch.zeros(1)).item()
    x = torch.cat([torch.linspace(-1, 1, 200_001), torch.tensor([below_one, -below_one, 0.41421356, 0.41421357]),
                   1 - torch.logspace(-7.2, -1, 5_001), torch.linspace(0.999, 1.001, 2_001)]).float()
    outs = run_unary(compiled, x)
    for name in ("asin", "acos", "atan", "tan", "atanh", "acosh", "asinh", "sinh"):
        assert max_ulp(outs[name], REFERENCE[name](x.double())) <= MAX_ULP[name], name


def test_tan_next_to_its_poles(compiled):
    # the f32 values nearest odd multiples of pi/2, where tan is largest and most sensitive
    poles = torch.tensor([(2 * k + 1) * torch.pi / 2 for k in range(-50, 50)], dtype=torch.float64).float()
    x = torch.cat([poles, torch.nextafter(poles, poles + 1), torch.nextafter(poles, poles - 1)])
    outs = run_unary(compiled, x)
    assert max_ulp(outs["tan"], torch.tan(x.double())) <= MAX_ULP["tan"]


def test_atan2_accuracy_and_special_cases(compiled):
    g = torch.Generator().manual_seed(2)
    y = torch.cat([torch.randn(50_000, generator=g) * 10, torch.logspace(-38, 38, 10_001),
                   -torch.logspace(-38, 38, 10_001)]).float()
    x = torch.cat([torch.randn(50_000, generator=g) * 10, torch.logspace(38, -38, 10_001),
                   torch.logspace(-38, 38, 10_001)]).float()
    out = torch.empty_like(y)
    call_kernel(compiled, "angle", [y, x, out])
    assert max_ulp(out, torch.atan2(y.double(), x.double())) <= MAX_ULP["atan2"]
    values = [0.0, -0.0, 1.0, -1.0, 1e-45, -3e38, float("inf"), float("-inf"), float("nan")]
    y, x = (t.reshape(-1).float() for t in torch.meshgrid(torch.tensor(values), torch.tensor(values), indexing="ij"))
    out = torch.empty_like(y)
    call_kernel(compiled, "angle", [y, x, out])
    # zeros, infinities and nan on either side: exactly torch's answer (signed zeros, +-pi, +-pi/4, ...)
    special = (y == 0) | (x == 0) | ~torch.isfinite(y) | ~torch.isfinite(x)
    torch.testing.assert_close(out[special], torch.atan2(y, x)[special], equal_nan=True, rtol=0, atol=0)
    assert torch.equal(torch.signbit(out[out == 0]), torch.signbit(torch.atan2(y, x)[out == 0]))
    # the others correctly rounded (torch's own f32 atan2(1, 1) is an ulp off pi/4)
    assert max_ulp(out[~special], torch.atan2(y[~special].double(), x[~special].double())) <= 0.5 + 1e-6


def test_fmod_is_exact_for_every_quotient(compiled):
    """fmod's result is representable, so it must be exact: against Python's math.fmod (exact, in
    float64) on operands whose quotients reach 2^276, where torch's own f32 fmod gives NaN (its
    quotient overflows). remainder (fmod plus y where the signs differ) equals torch wherever
    torch's is finite."""
    g = torch.Generator().manual_seed(3)
    n = 20_000
    scale = lambda: 10.0 ** torch.randint(-40, 39, (n,), generator=g)   # noqa: E731
    special = [0.0, -0.0, 5.0, -5.0, 1e-45, -3e38, 3.4e38, math.inf, -math.inf, math.nan]
    sx, sy = (t.reshape(-1) for t in torch.meshgrid(torch.tensor(special), torch.tensor(special), indexing="ij"))
    x = torch.cat([torch.randn(n, generator=g) * scale(), sx]).float()
    y = torch.cat([torch.randn(n, generator=g) * scale(), sy]).float()
    fmod, rem = torch.empty_like(x), torch.empty_like(x)
    call_kernel(compiled, "modulo", [x, y, fmod, rem])
    exact = torch.tensor([math.fmod(a, b) if math.isfinite(a) and b != 0 and not math.isnan(b) else math.nan
                          for a, b in zip(x.tolist(), y.tolist())]).float()
    torch.testing.assert_close(fmod, exact, equal_nan=True, rtol=0, atol=0)
    assert torch.equal(torch.signbit(fmod[fmod == 0]), torch.signbit(exact[fmod == 0]))
    assert (torch.fmod(x, y).isnan() & ~exact.isnan()).any()         # the quotients torch cannot do
    eager = torch.remainder(x, y)
    finite = ~eager.isnan()
    torch.testing.assert_close(rem[finite], eager[finite], rtol=0, atol=0)
    assert torch.equal(rem.isnan() & finite, torch.zeros_like(finite))
