"""Cuvil's own vectorisable math functions, written as LLVM IR.

Generated code may call nothing outside its module except BLAS, so exp, log, log1p, expm1, tanh,
erf, sigmoid, sin, cos, tan, atan, asin, acos, sinh, cosh, asinh, acosh, atanh, pow and atan2 are
defined here: branch-free (selects only) internal `alwaysinline` functions
that LLVM inlines into the kernel loops and then vectorises like any other arithmetic.

The f32 polynomials (exp, log, tanh, erf) were fitted for Cuvil by iteratively reweighted least
squares on Chebyshev nodes (near-minimax relative error, 1e-9..1e-7 before rounding the
coefficients to f32); tests/codegen/test_mathlib.py measures the final error against float64
references over wide ranges. sin, cos, tan, atan, asin, acos, atan2, the hyperbolic functions
and pow work in f64 internally (range reduction, the series, exp/log of the product), which keeps them correctly
rounded to f32 in practice.
"""
from __future__ import annotations

import functools
import math

import mpmath
from llvmlite import ir

F32, F64, I32, I64, I1 = ir.FloatType(), ir.DoubleType(), ir.IntType(32), ir.IntType(64), ir.IntType(1)

# e^r = 1 + r + r^2 * EXP(r) on [-ln2/2, ln2/2] (fitted on [-0.3472, 0.3472] for the reduction's
# rounding: 0.05 ulp before rounding; a sixth coefficient gains nothing visible in f32)
EXP = (0.4999999403953552, 0.1666651964187622, 0.041668400168418884, 0.008368837647140026, 0.0013814348494634032)
# log(1+f) = f - f^2/2 + f^3 * LOG(f) on [sqrt(1/2)-1, sqrt(2)-1]
LOG = (0.3333333134651184, -0.24999994039535522, 0.2000066339969635, -0.16667994856834412, 0.14250448346138,
       -0.12421862035989761, 0.11669778823852539, -0.11501748859882355, 0.07039384543895721)
# tanh(x) = x + x^3 * TANH(x^2) for |x| < 0.625
TANH = (-0.333333283662796, 0.1333278864622116, -0.053852628916502, 0.021003058180212975, -0.006103407125920057)
# erf(x) = x * ERF_SMALL(x^2) for |x| < 1
ERF_SMALL = (1.1283791065216064, -0.3761262595653534, 0.1128358542919159, -0.026853816583752632,
             0.005188334733247757, -0.0008010247838683426, 7.854026625864208e-05)
# erf(x) = 1 - ERFC_POLY(t), t = (x - 2.5) / 1.5, for 1 <= x <= 4 (erf(x) rounds to 1 in f32 above
# 3.92); erfc there to 9e-9 absolute, well under erf's half ulp of 3e-8, with no exp or division.
# Evaluated in two chains (`poly_two_chains`): erf runs 1.4x as fast, at the same max error.
ERFC_POLY = (0.0004069526621606201, -0.0032672833185642958, 0.012252772226929665, -0.028187040239572525,
             0.04365234449505806, -0.04639251530170441, 0.03186355531215668, -0.009569230489432812,
             -0.006624590139836073, 0.010395025834441185, -0.004685649182647467, -0.0015294369077309966,
             0.00204582791775465, -9.912302630254999e-05, -0.0002616049605421722)

LN2_HI, LN2_LO = 0.693359375, -2.12194440e-4          # Cody-Waite split of ln 2 (f32)
LN2_HI_D, LN2_LO_D = 6.93147180369123816490e-01, 1.90821492927058770002e-10   # (f64)
# pi/2 in three f64 parts with 33 + 33 + 53 significant bits (n * part is exact for n < 2^20)
PIO2 = (1.57079632673412561417e+00, 6.07710050630396597660e-11, 2.02226624871116645580e-21)


def _suffix(ty: ir.Type) -> str:
    if isinstance(ty, ir.VectorType):       # (a transposed tile's rows: `transpose_tile.py`)
        return f"v{ty.count}{_suffix(ty.element)}"
    if isinstance(ty, ir.IntType):
        return f"i{ty.width}"
    return {"float": "f32", "double": "f64", "half": "f16", "bfloat": "bf16"}[str(ty)]


def intrinsic(module: ir.Module, name: str, ret: ir.Type, args: list[ir.Type], overload: list[ir.Type]):
    """Get or declare `llvm.<name>.<overload suffixes>`."""
    full = ".".join(["llvm", name] + [_suffix(t) for t in overload])
    fn = module.globals.get(full)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ret, args), name=full)
    return fn


class Ops:
    """Small helpers over an IRBuilder for floating-point code of one type (f32 or f64)."""

    def __init__(self, builder: ir.IRBuilder, ty: ir.Type, scalef: bool = False):
        self.b, self.ty = builder, ty
        self.ity = I32 if ty == F32 else I64
        self.scalef = scalef      # the target scales by 2^n in one instruction (AVX-512 vscalefps)

    @property
    def module(self) -> ir.Module:
        return self.b.module

    def c(self, v: float) -> ir.Constant:
        return ir.Constant(self.ty, v)

    def ic(self, v: int) -> ir.Constant:
        return ir.Constant(self.ity, v)

    def unary(self, name: str, x):
        return self.b.call(intrinsic(self.module, name, self.ty, [self.ty], [self.ty]), [x])

    def binary(self, name: str, x, y):
        return self.b.call(intrinsic(self.module, name, self.ty, [self.ty, self.ty], [self.ty]), [x, y])

    def fma(self, a, x, y):
        """a*x + y, fused where the target has FMA (never a libm call)."""
        f = intrinsic(self.module, "fmuladd", self.ty, [self.ty] * 3, [self.ty])
        return self.b.call(f, [a, x, y])

    def poly(self, x, coeffs):
        """coeffs[0] + coeffs[1]*x + ... by Horner's rule."""
        acc = self.c(coeffs[-1])
        for k in reversed(coeffs[:-1]):
            acc = self.fma(acc, x, self.c(k))
        return acc

    def poly_two_chains(self, x, coeffs):
        """The same polynomial as E(x^2) + x O(x^2), its even and odd coefficients by Horner's rule:
        two independent chains of half the length, for a long polynomial whose chain of dependent
        FMAs, not their count, bounds the loop (one more multiply and FMA)."""
        x2 = self.mul(x, x)
        return self.fma(self.poly(x2, coeffs[1::2]), x, self.poly(x2, coeffs[0::2]))

    def sel(self, cond, a, b):
        return self.b.select(cond, a, b)

    def cmp(self, op: str, x, y):
        return self.b.fcmp_ordered(op, x, y)

    def isnan(self, x):
        return self.b.fcmp_unordered("uno", x, x)

    def add(self, x, y):
        return self.b.fadd(x, y)

    def sub(self, x, y):
        return self.b.fsub(x, y)

    def mul(self, x, y):
        return self.b.fmul(x, y)

    def div(self, x, y):
        return self.b.fdiv(x, y)

    def to_int(self, x):
        """Float -> int for a value the caller has made integral, in range and not NaN (a plain
        fptosi vectorises to one instruction; the saturating form does not)."""
        return self.b.fptosi(x, self.ity)

    def pow2(self, n):
        """2^n as a float for an integer n inside the normal exponent range."""
        bias, shift = (127, 23) if self.ty == F32 else (1023, 52)
        bits = self.b.shl(self.b.add(n, self.ic(bias)), self.ic(shift))
        return self.b.bitcast(bits, self.ty)


# ----------------------------------------------------------------------------- f32 functions

def _exp(o: Ops, x, low: bool = True, high: bool = True, narrow: bool = False):
    # reduce x = n ln2 + r, then scale by 2^n, so that results from 2^-149 (denormal) to 2^128
    # (overflow to inf) come out right. `low` / `high`: x may lie below -104 / above 89 (callers
    # that know their range leave the clamps out). `narrow`: x lies in [-87, 88], where 2^n is a
    # normal float and one multiplication scales. Below -104 the result is 0, selected at the end:
    # computing it would underflow, and an underflow costs a microcode assist of ~100 cycles per
    # vector (softmax over a causal mask has half its inputs at -inf). A NaN passes the clamps and
    # every step after them, and comes out NaN.
    xs = o.sel(o.cmp(">", x, o.c(89.0)), o.c(89.0), x) if high else x
    if low:
        zero = o.cmp("<", x, o.c(-104.0))
        xs = o.sel(zero, o.c(0.0), xs)
    # narrow: the rounding constant carries the exponent bias, so 2^n is t's bits shifted into the
    # exponent field (the constant's own high bits shift out): one integer op, where ldexp takes three
    n, ni, t = _round_log2e(o, xs, bias=127 if narrow else 0)
    r = o.fma(n, o.c(-LN2_HI), xs)
    r = o.fma(n, o.c(-LN2_LO), r)
    y = o.add(o.c(1.0), o.fma(o.mul(r, r), o.poly(r, EXP), r))
    if narrow:
        y = o.mul(y, _exponent_of(o, t))
    elif o.scalef:
        y = o.b.call(intrinsic(o.module, "ldexp", o.ty, [o.ty, o.ity], [o.ty, o.ity]), [y, ni])
    else:       # two steps: 2^n alone over- or underflows at the ends of the range
        n1 = o.b.ashr(ni, o.ic(1))
        y = o.mul(o.mul(y, o.pow2(n1)), o.pow2(o.b.sub(ni, n1)))
    return o.sel(zero, o.c(0.0), y) if low else y


EXP_FTZ = -87.33654022216797   # the float just above ln(2^-126): below ln(2^-126) exp is a denormal


def _exp_ftz(o: Ops, x):
    # softmax's exp(x - max) (x <= 0, or NaN): results below the smallest normal float are 0. They
    # are under 2^-126 of a sum of at least 1. A denormal costs a microcode assist when it is made
    # and again in each product that reads it: a row of them made Swin's attention 5.5x slower
    # and the linear after it 75x (eager's flash-attention kernel gave 0 there). The argument is
    # clamped first so that no lane computes a denormal on its way to the 0 selected for it.
    ftz = o.cmp("<", x, o.c(EXP_FTZ))
    y = _exp(o, o.sel(ftz, o.c(EXP_FTZ), x), low=False, high=False, narrow=True)
    return o.sel(ftz, o.c(0.0), y)


SHIFTER = 12582912.0        # 1.5 * 2^23: adding it rounds an f32 of magnitude below 2^22 to an integer


def _round_log2e(o: Ops, x, bias: int = 0):
    """n = x / ln 2 rounded to an integer, as a float and as an integer (|x| < 2^21), and the
    rounded sum t = n + bias + SHIFTER, whose low bits hold n + bias (for 0 <= n + bias < 2^22). The
    integer is read from t's bits, not converted from the float: no conversion, and a NaN x gives
    some integer instead of poison."""
    shifter = o.c(SHIFTER + bias)
    t = o.fma(x, o.c(1.4426950408889634), shifter)
    n = o.sub(t, shifter)
    ni = o.b.sub(o.b.bitcast(t, o.ity), o.b.bitcast(shifter, o.ity))
    return n, ni, t


def _exponent_of(o: Ops, t):
    """2^(n + bias - 127) for the rounded sum t of `_round_log2e` with 0 < n + bias < 255: t's low
    bits shifted into the exponent field, SHIFTER's own bits shifted out."""
    return o.b.bitcast(o.b.shl(o.b.bitcast(t, o.ity), o.ic(23)), o.ty)


def _log(o: Ops, x, normal: bool = False):
    # `normal`: x is NaN or a positive normal finite float (no denormals, zero or infinity to handle)
    b = o.b
    tiny = None if normal else o.cmp("<", x, o.c(1.1754943508222875e-38))    # denormals: scale up by 2^23 first
    xs = x if normal else o.sel(tiny, o.mul(x, o.c(8388608.0)), x)
    # x = 2^e m with m in [sqrt(1/2), sqrt(2)): subtracting m's lower bound from the bits carries
    # into the exponent field exactly where m must be halved
    bits = b.sub(b.bitcast(xs, I32), o.ic(0x3F3504F3))
    e = b.ashr(bits, o.ic(23))
    if not normal:
        e = b.sub(e, b.select(tiny, o.ic(23), o.ic(0)))
    m = b.bitcast(b.sub(b.bitcast(xs, I32), b.and_(bits, o.ic(-0x800000))), F32)
    f = o.sub(m, o.c(1.0))
    ef = b.sitofp(e, F32)
    z = o.mul(f, f)
    y = o.mul(o.mul(f, z), o.poly(f, LOG))
    y = o.fma(ef, o.c(LN2_LO), y)
    y = o.fma(z, o.c(-0.5), y)
    y = o.fma(ef, o.c(LN2_HI), o.add(f, y))
    if not normal:
        y = o.sel(o.cmp("==", x, o.c(math.inf)), x, y)
        y = o.sel(o.cmp("==", x, o.c(0.0)), o.c(-math.inf), y)
    return o.sel(o.cmp(">=", x, o.c(0.0)), y, o.c(math.nan))          # x < 0 and nan -> nan


def _log1p(o: Ops, x):
    # log(u) for u = 1 + x, plus the rounding error of that sum relative to u: (x - (u - 1)) / u
    # (u - 1 is exact). Where u rounds to 1, x itself is the answer (-0 stays -0); at x = -1 and
    # x = inf the correction is 0/0 or inf - inf, and log(u) alone is the answer.
    u = o.add(o.c(1.0), x)
    correction = o.div(o.sub(x, o.sub(u, o.c(1.0))), u)
    edge = o.b.or_(o.cmp("==", u, o.c(0.0)), o.cmp("==", x, o.c(math.inf)))
    y = o.add(_log(o, u), o.sel(edge, o.c(0.0), correction))
    return o.sel(o.cmp("==", u, o.c(1.0)), x, y)


def _expm1(o: Ops, x):
    # x = n ln2 + r: expm1(x) = 2^n expm1(r) + (2^n - 1), with expm1(r) = r + r^2 EXP(r) (exp's
    # polynomial without its 1) and one rounding in the fused multiply-add. It is computed as
    # 2 (h expm1(r) + h - 1/2) with h = 2^(n-1), so that n = 128 (x near 88.7, a finite result)
    # does not overflow h. Below -30 the result rounds to -1 (clamped there: h stays normal);
    # above 89 it is inf.
    xs = o.sel(o.cmp(">", x, o.c(89.0)), o.c(89.0), o.sel(o.cmp("<", x, o.c(-30.0)), o.c(-30.0), x))
    n, _, t = _round_log2e(o, xs, bias=126)
    r = o.fma(n, o.c(-LN2_HI), xs)
    r = o.fma(n, o.c(-LN2_LO), r)
    p = o.fma(o.mul(r, r), o.poly(r, EXP), r)
    h = _exponent_of(o, t)
    y = o.mul(o.c(2.0), o.fma(h, p, o.sub(h, o.c(0.5))))
    return o.sel(o.cmp("==", x, o.c(0.0)), x, y)      # -0 stays -0


TANH_ONE = 9.1      # tanh(z) rounds to 1 in f32 from z = 13 ln 2 (9.01) on


def _tanh(o: Ops, x):
    z = o.unary("fabs", x)
    z2 = o.mul(z, z)
    small = o.fma(o.mul(z, z2), o.poly(z2, TANH), z)
    # 1 - 2 / (e^2z + 1), with z clamped where the result is 1: e^2z stays in exp's narrow range
    # (a NaN passes the clamp)
    zc = o.sel(o.cmp(">", z, o.c(TANH_ONE)), o.c(TANH_ONE), z)
    large = o.sub(o.c(1.0), o.div(o.c(2.0), o.add(_exp(o, o.add(zc, zc), low=False, high=False, narrow=True),
                                                  o.c(1.0))))
    return o.binary("copysign", o.sel(o.cmp("<", z, o.c(0.625)), small, large), x)   # odd, -0 stays -0


def _erf(o: Ops, x):
    z = o.unary("fabs", x)
    small = o.mul(x, o.poly(o.mul(x, x), ERF_SMALL))
    t = o.mul(o.sub(o.sel(o.cmp(">", z, o.c(4.0)), o.c(4.0), z), o.c(2.5)), o.c(1 / 1.5))
    large = o.sub(o.c(1.0), o.poly_two_chains(t, ERFC_POLY))
    return o.sel(o.cmp("<", z, o.c(1.0)), small, o.binary("copysign", large, x))


def _sigmoid(o: Ops, x):
    # e = exp(-|x|) never overflows; sigmoid = 1/(1+e) for x >= 0 and e/(1+e) below (keeps
    # denormals), each one division: e * (1/(1+e)) rounds once more (2.66 ulp at x = -4.14, against
    # 2.26 at most)
    e = _exp(o, o.b.fneg(o.unary("fabs", x)), high=False)
    return o.div(o.sel(o.cmp("<", x, o.c(0.0)), e, o.c(1.0)), o.add(o.c(1.0), e))


# ----------------------------------------------------------------------------- f64-internal functions

def _sincos_f64(o: Ops, xd, kind: str):
    """sin, cos or tan of an f64 with |x| < 2^20 * pi/2 (Cody-Waite reduction, exact there)."""
    n = o.unary("roundeven", o.mul(xd, o.c(0.6366197723675814)))
    r = o.fma(n, o.c(-PIO2[0]), xd)
    r = o.fma(n, o.c(-PIO2[1]), r)
    r = o.fma(n, o.c(-PIO2[2]), r)
    return _sincos_quadrant(o, r, o.to_int(n), kind)


def _sincos_quadrant(o: Ops, r, n, kind: str):
    """sin, cos or tan of n*pi/2 + r for |r| <= pi/4 and an integer n (i64)."""
    b = o.b
    r2 = o.mul(r, r)
    sin_r = o.fma(o.mul(r, r2), o.poly(r2, [(-1) ** (k + 1) / math.factorial(2 * k + 3) for k in range(6)]), r)
    cos_r = o.fma(r2, o.poly(r2, [(-1) ** (k + 1) / math.factorial(2 * k + 2) for k in range(7)]), o.c(1.0))
    if kind == "tan":           # tan(r + pi/2) = -cos(r) / sin(r); r is never 0 there (pi/2 is irrational)
        return o.sel(b.trunc(n, I1), o.div(b.fneg(cos_r), sin_r), o.div(sin_r, cos_r))
    q = b.and_(b.add(n, ir.Constant(I64, 1 if kind == "cos" else 0)), ir.Constant(I64, 3))
    val = b.select(b.trunc(q, I1), cos_r, sin_r)                       # odd quadrant: the other one
    neg = b.icmp_unsigned(">=", q, ir.Constant(I64, 2))
    return b.select(neg, b.fneg(val), val)


@functools.cache
def _reduction_table() -> tuple[float, ...]:
    """(2^e * 2/pi) mod 4 as double-double (hi, lo) for e = TABLE_MIN_EXP .. 104, computed with mpmath."""
    with mpmath.workprec(400):
        out = []
        for e in range(TABLE_MIN_EXP, 105):
            c = mpmath.fmod(mpmath.ldexp(2 / mpmath.pi, e), 4)
            hi = float(c)
            out += [hi, float(c - hi)]
    return tuple(out)


TABLE_MIN_EXP = -3      # x = M * 2^e with a 24-bit M; |x| >= 2^20 pi/2 means e >= -3


def _large_sincos_f64(o: Ops, x32, kind: str):
    """sin, cos or tan of a finite f32 of any size: x * 2/pi mod 4 from a table of (2^e * 2/pi) mod 4
    (Payne-Hanek for 24-bit mantissas), then the f64 polynomials on the remainder."""
    b = o.b
    bits = b.bitcast(x32, I32)
    e = b.sub(b.and_(b.lshr(bits, ir.Constant(I32, 23)), ir.Constant(I32, 0xFF)), ir.Constant(I32, 150))
    e = b.select(b.icmp_signed("<", e, ir.Constant(I32, TABLE_MIN_EXP)), ir.Constant(I32, TABLE_MIN_EXP), e)
    mant = b.or_(b.and_(bits, ir.Constant(I32, 0x7FFFFF)), ir.Constant(I32, 0x800000))
    m = b.sitofp(mant, F64)
    table = _table_global(o.module)
    slot = b.zext(b.mul(b.sub(e, ir.Constant(I32, TABLE_MIN_EXP)), ir.Constant(I32, 2)), I64)
    hi = b.load(b.gep(table, [ir.Constant(I64, 0), slot], inbounds=True), typ=F64)
    lo = b.load(b.gep(table, [ir.Constant(I64, 0), b.add(slot, ir.Constant(I64, 1))], inbounds=True), typ=F64)
    p1 = o.mul(m, hi)
    p1_err = b.call(intrinsic(o.module, "fma", F64, [F64] * 3, [F64]), [m, hi, b.fneg(p1)])   # exact: TwoProd
    s = o.sub(p1, o.mul(o.c(4.0), o.unary("floor", o.mul(p1, o.c(0.25)))))
    t = o.add(o.add(s, p1_err), o.mul(m, lo))
    n = o.unary("roundeven", t)
    r = o.mul(o.sub(t, n), o.c(math.pi / 2))
    sign = b.icmp_signed("<", bits, ir.Constant(I32, 0))            # sin and tan are odd, cos even
    q = o.to_int(n)
    val = _sincos_quadrant(o, r, q, kind)
    return b.select(b.and_(sign, ir.Constant(I1, int(kind != "cos"))), b.fneg(val), val)


def _table_global(module: ir.Module):
    name = "cuvil.math.two_over_pi_mod4"
    g = module.globals.get(name)
    if g is None:
        values = _reduction_table()
        ty = ir.ArrayType(F64, len(values))
        g = ir.GlobalVariable(module, ty, name)
        g.initializer = ir.Constant(ty, list(values))
        g.global_constant = True
        g.linkage = "internal"
    return g


def _trig(o32: Ops, x, kind: str):
    b = o32.b
    o = Ops(b, F64)
    xd = b.fpext(x, F64)
    small = o.cmp("<", o.unary("fabs", xd), o.c(1647099.0))          # 2^20 * pi/2: Cody-Waite is exact
    val = o.sel(small, _sincos_f64(o, o.sel(small, xd, o.c(0.0)), kind),
                _large_sincos_f64(o, b.fptrunc(o.sel(small, o.c(1e30), xd), F32), kind))
    finite = o.cmp("<", o.unary("fabs", xd), o.c(math.inf))
    result = o32.sel(finite, b.fptrunc(val, F32), o32.c(math.nan))
    return result if kind == "cos" else o32.sel(o32.cmp("==", x, o32.c(0.0)), x, result)   # sin(-0) = -0


def _sin(o: Ops, x):
    return _trig(o, x, "sin")


def _cos(o: Ops, x):
    return _trig(o, x, "cos")


def _tan(o: Ops, x):
    return _trig(o, x, "tan")


PI = math.pi
# atan(u) = u + u^3 * ATAN(u^2) for |u| <= tan(pi/8): the Taylor series, 12 terms (truncation
# below 1e-11 of the result, far under an f32 ulp)
ATAN = [(-1) ** (k + 1) / (2 * k + 3) for k in range(12)]


def _atan_f64(o: Ops, a):
    """atan of an f64 a >= 0 (or +inf, or NaN): atan(a) = pi/2 - atan(1/a) above 1, then
    atan(t) = pi/4 + atan((t-1)/(t+1)) above tan(pi/8), then the series."""
    inverted = o.cmp(">", a, o.c(1.0))
    t = o.sel(inverted, o.div(o.c(1.0), a), a)                        # [0, 1]; 1/inf = 0
    shifted = o.cmp(">", t, o.c(0.41421356237309503))
    u = o.sel(shifted, o.div(o.sub(t, o.c(1.0)), o.add(t, o.c(1.0))), t)
    u2 = o.mul(u, u)
    r = o.fma(o.mul(u, u2), o.poly(u2, ATAN), u)
    r = o.sel(shifted, o.add(o.c(PI / 4), r), r)
    return o.sel(inverted, o.sub(o.c(PI / 2), r), r)


def _atan(o32: Ops, x):
    b = o32.b
    o = Ops(b, F64)
    xd = b.fpext(x, F64)
    return b.fptrunc(o.binary("copysign", _atan_f64(o, o.unary("fabs", xd)), xd), F32)   # odd: -0 stays -0


def _asin_f64(o: Ops, xd):
    """asin x = atan(x / sqrt((1-x)(1+x))): both factors exact in f64 for an f32 x, so the
    ratio stays accurate next to +-1; NaN for |x| > 1 (the square root of a negative)."""
    a = o.unary("fabs", xd)
    root = o.unary("sqrt", o.mul(o.sub(o.c(1.0), a), o.add(o.c(1.0), a)))
    return o.binary("copysign", _atan_f64(o, o.div(a, root)), xd)


def _asin(o32: Ops, x):
    o = Ops(o32.b, F64)
    return o32.b.fptrunc(_asin_f64(o, o32.b.fpext(x, F64)), F32)


def _acos(o32: Ops, x):
    o = Ops(o32.b, F64)
    # in f64 the difference loses nothing an f32 result keeps: acos of the f32 below 1 is 3.4e-4
    return o32.b.fptrunc(o.sub(o.c(PI / 2), _asin_f64(o, o32.b.fpext(x, F64))), F32)


def _atan2(o32: Ops, y, x):
    """atan2 with torch's signs and special cases: atan(|y|/|x|) in f64 (no f32 quotient
    overflows or underflows there), pi minus it where x is negative or -0, y's sign."""
    b = o32.b
    o = Ops(b, F64)
    yd, xd = b.fpext(y, F64), b.fpext(x, F64)
    ay, ax = o.unary("fabs", yd), o.unary("fabs", xd)
    r = _atan_f64(o, o.div(ay, ax))
    r = o.sel(b.and_(o.cmp("==", ay, o.c(0.0)), o.cmp("==", ax, o.c(0.0))), o.c(0.0), r)            # 0/0
    r = o.sel(b.and_(o.cmp("==", ay, o.c(math.inf)), o.cmp("==", ax, o.c(math.inf))), o.c(PI / 4), r)  # inf/inf
    x_negative = b.icmp_signed("<", b.bitcast(xd, I64), o.ic(0))     # the sign bit: -0 counts
    r = o.sel(x_negative, o.sub(o.c(PI), r), r)
    return b.fptrunc(o.binary("copysign", r, yd), F32)


# |y| 2^j for the steps of `_fmod`: each takes 40 bits off the quotient; f32 exponents differ by at most 277
FMOD_STEPS = tuple(range(240, -1, -40))


def _fmod(o32: Ops, x, y):
    """C's fmod (torch.fmod), exact for every quotient: |x| reduced modulo |y| 2^j for j = 240, 200,
    ..., 0 in f64, then x's sign. Each step's quotient is below 2^41 and the remainders are multiples
    of the finer of the operands' last bits, so each f64 product and difference is exact; a quotient
    one off (through the reciprocal) leaves a remainder in (-t, 2t), which the next step, and
    after the last a correction by |y|, takes in."""
    b = o32.b
    o = Ops(b, F64)
    xd = b.fpext(x, F64)
    ax, ay = o.unary("fabs", xd), o.unary("fabs", b.fpext(y, F64))
    inverse = o.div(o.c(1.0), ay)
    r = ax
    for j in FMOD_STEPS:
        q = o.unary("trunc", o.mul(r, o.mul(inverse, o.c(2.0 ** -j))))
        r = o.fma(b.fneg(q), o.mul(ay, o.c(2.0 ** j)), r)
    r = o.sel(o.cmp("<", r, o.c(0.0)), o.add(r, ay), r)
    r = o.sel(o.cmp(">=", r, ay), o.sub(r, ay), r)
    # x mod inf = x for a finite x (the steps computed 0 * inf); inf mod y and x mod 0 are NaN already
    r = o.sel(o.cmp("==", ay, o.c(math.inf)), o.sel(o.cmp("<", ax, o.c(math.inf)), ax, o.c(math.nan)), r)
    return b.fptrunc(o.binary("copysign", r, xd), F32)


def _log_f64(o: Ops, a):
    """log of a positive, finite, normal f64 (any f32 magnitude is normal in f64)."""
    b = o.b
    bits = b.bitcast(a, I64)
    e = b.sub(b.lshr(bits, o.ic(52)), o.ic(1022))
    m = b.bitcast(b.or_(b.and_(bits, o.ic(0x000FFFFFFFFFFFFF)), o.ic(0x3FE0000000000000)), F64)   # [0.5, 1)
    small = o.cmp("<", m, o.c(0.7071067811865476))
    e = b.sub(e, b.zext(small, I64))
    f = o.sub(o.sel(small, o.add(m, m), m), o.c(1.0))
    s = o.div(f, o.add(f, o.c(2.0)))          # log(1+f) = 2 atanh(s), |s| < 0.172
    s2 = o.mul(s, s)
    series = o.mul(o.mul(s, s2), o.poly(s2, [2.0 / (2 * k + 3) for k in range(8)]))
    ef = b.sitofp(e, F64)
    return o.fma(ef, o.c(LN2_HI_D), o.fma(ef, o.c(LN2_LO_D), o.add(o.add(s, s), series)))


def _exp_f64(o: Ops, t):
    """exp of an f64 already clamped to [-110, 90] (the f32 result range and a little more)."""
    n = o.unary("roundeven", o.mul(t, o.c(1.4426950408889634)))
    r = o.fma(n, o.c(-LN2_HI_D), t)
    r = o.fma(n, o.c(-LN2_LO_D), r)
    p = o.poly(r, [1.0 / math.factorial(k) for k in range(13)])
    return o.mul(p, o.pow2(o.to_int(n)))


def _pow(o32: Ops, a, y):
    """a**y with torch's special cases; |a|^y = exp(y log|a|) in f64, sign for integer y."""
    b = o32.b
    o = Ops(b, F64)
    ad, yd = b.fpext(a, F64), b.fpext(y, F64)
    mag = o.unary("fabs", ad)
    finite_pos = b.and_(o.cmp(">", mag, o.c(0.0)), o.cmp("<", mag, o.c(math.inf)))
    log_mag = o.sel(finite_pos, _log_f64(o, o.sel(finite_pos, mag, o.c(1.0))),
                    o.sel(o.cmp("==", mag, o.c(0.0)), o.c(-math.inf), mag))
    t = o.mul(yd, log_mag)
    tc = o.sel(o.cmp(">", t, o.c(90.0)), o.c(90.0), o.sel(o.cmp("<", t, o.c(-110.0)), o.c(-110.0), t))
    tc = o.sel(o.isnan(tc), o.c(0.0), tc)
    res = _exp_f64(o, tc)
    res = o.sel(o.cmp("==", t, o.c(math.inf)), t, o.sel(o.cmp("==", t, o.c(-math.inf)), o.c(0.0), res))
    res = o.sel(o.isnan(t), t, res)
    y_int = o.cmp("==", o.unary("floor", yd), yd)
    half = o.mul(yd, o.c(0.5))
    y_odd = b.and_(y_int, o.cmp("!=", o.unary("floor", half), half))
    negative = b.icmp_unsigned("!=", b.lshr(b.bitcast(ad, I64), o.ic(63)), o.ic(0))   # sign bit, -0 too
    res = o.sel(b.and_(negative, y_odd), b.fneg(res), res)
    finite_negative = b.and_(o.cmp("<", ad, o.c(0.0)), o.cmp(">", ad, o.c(-math.inf)))
    res = o.sel(b.and_(finite_negative, b.not_(y_int)), o.c(math.nan), res)
    one = o.cmp("==", ad, o.c(1.0))
    res = o.sel(b.or_(one, o.cmp("==", yd, o.c(0.0))), o.c(1.0), res)
    # (-1)^(+-inf) = 1 like torch
    res = o.sel(b.and_(o.cmp("==", ad, o.c(-1.0)), o.cmp("==", o.unary("fabs", yd), o.c(math.inf))), o.c(1.0), res)
    return b.fptrunc(res, F32)


def _f64_unary(body):
    """An f32 function computed in f64 by `body(o64, x64)`: rounded once, at the end."""
    def fn(o32: Ops, x):
        o = Ops(o32.b, F64)
        return o32.b.fptrunc(body(o, o32.b.fpext(x, F64)), F32)
    return fn


def _log_any_f64(o: Ops, a):
    """log of any f64 (_log_f64 takes positive finite normal values): -inf at 0, inf at inf, NaN below 0."""
    ok = o.b.and_(o.cmp(">", a, o.c(0.0)), o.cmp("<", a, o.c(math.inf)))
    out = _log_f64(o, o.sel(ok, a, o.c(1.0)))
    out = o.sel(o.cmp("==", a, o.c(0.0)), o.c(-math.inf), o.sel(o.cmp("==", a, o.c(math.inf)), a, out))
    return o.sel(o.b.or_(o.cmp("<", a, o.c(0.0)), o.isnan(a)), o.c(math.nan), out)


def _exp_any_f64(o: Ops, t):
    """exp of any f64 that rounds in f32 like the true value: t clamped to [-110, 90], NaN kept."""
    tc = o.sel(o.cmp(">", t, o.c(90.0)), o.c(90.0), o.sel(o.cmp("<", t, o.c(-110.0)), o.c(-110.0), t))
    return o.sel(o.isnan(t), t, _exp_f64(o, o.sel(o.isnan(t), o.c(0.0), tc)))


def _odd_series(o: Ops, a, coeffs):
    """a + a^3 * (coeffs[0] + coeffs[1] a^2 + ...)."""
    a2 = o.mul(a, a)
    return o.fma(o.mul(a, a2), o.poly(a2, coeffs), a)


# Taylor coefficients past the first term, for |x| below 1 (sinh) or 1/8 (asinh, atanh): 9 or 10 terms
# leave under 1e-17 of the result
SINH = [1 / math.factorial(2 * k + 3) for k in range(9)]
ASINH = [(-1) ** (k + 1) * math.factorial(2 * k + 2) / (4 ** (k + 1) * math.factorial(k + 1) ** 2 * (2 * k + 3))
         for k in range(10)]
ATANH = [1 / (2 * k + 3) for k in range(10)]


def _sinh64(o: Ops, x):
    a = o.unary("fabs", x)
    e = _exp_any_f64(o, a)
    large = o.mul(o.sub(e, o.div(o.c(1.0), e)), o.c(0.5))
    return o.binary("copysign", o.sel(o.cmp("<", a, o.c(1.0)), _odd_series(o, a, SINH), large), x)


def _cosh64(o: Ops, x):
    e = _exp_any_f64(o, o.unary("fabs", x))
    return o.mul(o.add(e, o.div(o.c(1.0), e)), o.c(0.5))


def _asinh64(o: Ops, x):
    a = o.unary("fabs", x)
    large = _log_any_f64(o, o.add(a, o.unary("sqrt", o.fma(a, a, o.c(1.0)))))
    return o.binary("copysign", o.sel(o.cmp("<", a, o.c(0.125)), _odd_series(o, a, ASINH), large), x)


def _acosh64(o: Ops, x):
    # (x-1)(x+1): both exact in f64 for an f32 x, so nothing cancels next to 1
    out = _log_any_f64(o, o.add(x, o.unary("sqrt", o.mul(o.sub(x, o.c(1.0)), o.add(x, o.c(1.0))))))
    return o.sel(o.cmp("<", x, o.c(1.0)), o.c(math.nan), out)


def _atanh64(o: Ops, x):
    a = o.unary("fabs", x)
    large = o.mul(o.c(0.5), _log_any_f64(o, o.div(o.add(o.c(1.0), a), o.sub(o.c(1.0), a))))
    return o.binary("copysign", o.sel(o.cmp("<", a, o.c(0.125)), _odd_series(o, a, ATANH), large), x)


F32_FUNCS = {"exp": _exp, "exp_ftz": _exp_ftz, "log": _log,
             # the forms for arguments known to lie where the special cases cannot arise (value_range.py)
             "exp.narrow": lambda o, x: _exp(o, x, low=False, high=False, narrow=True),
             "log.normal": lambda o, x: _log(o, x, normal=True),
             "log1p": _log1p, "expm1": _expm1, "tanh": _tanh, "erf": _erf,
             "sigmoid": _sigmoid, "sin": _sin, "cos": _cos, "tan": _tan, "atan": _atan, "asin": _asin, "acos": _acos,
             "sinh": _f64_unary(_sinh64), "cosh": _f64_unary(_cosh64), "asinh": _f64_unary(_asinh64),
             "acosh": _f64_unary(_acosh64), "atanh": _f64_unary(_atanh64), "pow": _pow, "atan2": _atan2,
             "fmod": _fmod}


class MathLib:
    """Adds the math functions a module uses, once each, as `cuvil.math.<name>.f32`."""

    def __init__(self, module: ir.Module, scalef: bool = False):
        self.module, self.scalef = module, scalef

    def call(self, builder: ir.IRBuilder, name: str, args: list):
        return builder.call(self.function(name, len(args)), args)

    def function(self, name: str, arity: int) -> ir.Function:
        full = f"cuvil.math.{name}.f32"
        fn = self.module.globals.get(full)
        if fn is not None:
            return fn
        fn = ir.Function(self.module, ir.FunctionType(F32, [F32] * arity), name=full)
        fn.linkage = "internal"
        fn.attributes.add("alwaysinline")
        fn.attributes.add("nounwind")
        builder = ir.IRBuilder(fn.append_basic_block("entry"))
        builder.ret(F32_FUNCS[name](Ops(builder, F32, self.scalef), *fn.args))
        return fn
