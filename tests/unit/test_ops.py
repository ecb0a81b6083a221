"""Every built-in op: inferred types (static and symbolic) and interpreter results against an
independent numpy computation."""
import math

import numpy as np
import pytest
import torch

from cuvil.errors import CuvilError, CuvilParseError, CuvilVerifyError
from cuvil.ir import Builder, DType, Function, Module, TensorType, interpret, parse, sym, verify
from cuvil.ir.core import OP_REGISTRY
from cuvil.ir.ops import builtin_ops, ops_with_tag
from cuvil.ir.types import floordiv

F32, F16, I64, I32, BOOL = DType.f32, DType.f16, DType.i64, DType.i32, DType.bool
s0, s1 = sym("s0"), sym("s1")
TESTED: set[str] = set()


def T(dtype, *shape):
    return TensorType(dtype, shape)


def type_of(x: torch.Tensor) -> TensorType:
    return TensorType(DType.from_torch(x.dtype), tuple(x.shape))


def build(name, arg_types, attrs=None, n_extra=()):
    """A function `f(args) { r = name(args) {attrs}; return r }`; returns (module, op)."""
    TESTED.add(name)
    symbols = set()
    for t in arg_types:
        symbols |= set().union(*(getattr(d, "free_symbols", set()) for d in t.shape))
    for v in (attrs or {}).values():
        if isinstance(v, list):
            symbols |= set().union(*(getattr(d, "free_symbols", set()) for d in v))
    fn = Function("f", arg_types, [f"a{i}" for i in range(len(arg_types))],
                  symbols={s.name: (1, 64) for s in symbols})
    b = Builder(fn)
    op = b.create(name, fn.args, attrs or {})
    b.create("cuvil.return", op.results)
    m = Module()
    m.add_function(fn)
    verify(m)
    return m, op


def run(name, inputs, attrs=None, types=None):
    """Build `name` over `inputs` (typed by `types` or statically) and interpret it."""
    m, op = build(name, types or [type_of(x) for x in inputs], attrs)
    return [str(r.type) for r in op.results], interpret(m, *inputs)


def close(actual: torch.Tensor, expected, rtol=1e-5, atol=1e-5):
    expected = np.asarray(expected)
    assert tuple(actual.shape) == expected.shape, (actual.shape, expected.shape)
    if actual.dtype == torch.bool or not actual.is_floating_point():
        np.testing.assert_array_equal(actual.numpy(), expected)
    else:
        np.testing.assert_allclose(actual.float().numpy(), expected, rtol=rtol, atol=atol)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- unary elementwise

_erf = np.vectorize(math.erf)
UNARY = {
    "neg": lambda x: -x, "abs": np.abs, "exp": np.exp, "log": np.log, "log1p": np.log1p, "expm1": np.expm1,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x), "sin": np.sin, "cos": np.cos, "tan": np.tan, "atan": np.arctan,
    "asin": np.arcsin, "acos": np.arccos, "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh,
    "acosh": np.arccosh, "atanh": np.arctanh, "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "relu": lambda x: np.maximum(x, 0),
    "silu": lambda x: x / (1 + np.exp(-x)), "erf": _erf, "reciprocal": lambda x: 1 / x,
    "logical_not": np.logical_not, "floor": np.floor, "ceil": np.ceil, "round": np.round, "trunc": np.trunc,
    "sign": np.sign,
}
POSITIVE_ONLY = {"log", "log1p", "sqrt", "rsqrt"}
UNIT_INTERVAL = {"asin", "acos", "atanh"}
AT_LEAST_ONE = {"acosh"}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name):
    x = randn(3, 5) * 3
    if name in POSITIVE_ONLY:
        x = x.abs() + 0.1
    if name in UNIT_INTERVAL:
        x = torch.tanh(x)
    if name in AT_LEAST_ONE:
        x = x.abs() + 1
    types, (out,) = run(f"cuvil.{name}", [x], types=[T(F32, s0, 5)])
    assert types == ["tensor<s0x5xbool>".replace("bool", "i1" if name == "logical_not" else "f32")]
    close(out, UNARY[name](x.numpy()), rtol=1e-5, atol=1e-6)


ALL_DTYPES = [F32, F16, I64, I32, BOOL]


def _torch_result_dtype(fn, *dtypes):
    try:
        return fn(*(torch.ones(2, dtype=d.torch) for d in dtypes)).dtype
    except RuntimeError:
        return None


@pytest.mark.parametrize("name", sorted(UNARY) + ["gelu"])
def test_unary_dtypes_follow_torch(name):
    """Which input dtypes are accepted and what they give agrees with torch for every dtype."""
    fn = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu}.get(name) or getattr(torch, name)
    opdef = OP_REGISTRY[f"cuvil.{name}"]
    for dt in ALL_DTYPES:
        expected = _torch_result_dtype(fn, dt)
        if expected is None:
            with pytest.raises(ValueError):
                opdef.infer([T(dt, 2)], opdef.full_attrs({}))
        else:
            assert opdef.infer([T(dt, 2)], opdef.full_attrs({}))[0].dtype.torch == expected, dt


# ----------------------------------------------------------------------------- binary elementwise

BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "pow": np.power,
    "maximum": np.maximum, "minimum": np.minimum, "eq": np.equal, "ne": np.not_equal, "lt": np.less,
    "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "logical_and": np.logical_and,
    "logical_or": np.logical_or, "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor,
    "floor_div": np.floor_divide, "remainder": np.remainder, "fmod": np.fmod, "atan2": np.arctan2,
}
PREDICATES = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or"}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_broadcasting(name):
    integer = name.startswith("bitwise")
    if integer:
        a = torch.randint(0, 16, (3, 4), generator=torch.Generator().manual_seed(1))
        b = torch.randint(0, 16, (4,), generator=torch.Generator().manual_seed(2))
    else:
        a, b = randn(3, 4, seed=1).round(), randn(4, seed=2).round()
        if name in ("pow", "div", "floor_div", "remainder", "fmod"):
            a, b = a.abs() + 1, b.abs() + 1
    types, (out,) = run(f"cuvil.{name}", [a, b], types=[type_of(a).with_shape((s0, 4)), type_of(b)])
    dtype = "i1" if name in PREDICATES else ("i64" if integer else "f32")
    assert types == [f"tensor<s0x4x{dtype}>"]
    close(out, BINARY[name](a.numpy(), b.numpy()))


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_dtypes_follow_torch(name):
    fn = {"floor_div": lambda a, b: torch.div(a, b, rounding_mode="floor")}.get(name) or getattr(torch, name)
    opdef = OP_REGISTRY[f"cuvil.{name}"]
    for da in ALL_DTYPES:
        for db in ALL_DTYPES:
            expected = _torch_result_dtype(fn, da, db)
            if expected is None:
                with pytest.raises(ValueError):
                    opdef.infer([T(da, 2), T(db, 2)], {})
            else:
                assert opdef.infer([T(da, 2), T(db, 2)], {})[0].dtype.torch == expected, (da, db)


def test_rank0_operand_promotes_like_a_scalar():
    out = OP_REGISTRY["cuvil.mul"].infer([T(F16, 3), T(F32)], {})[0]
    assert str(out) == "tensor<3xf16>"
    assert torch.mul(torch.ones(3, dtype=torch.float16), torch.tensor(2.0)).dtype == torch.float16


def test_symbolic_broadcasting():
    add = OP_REGISTRY["cuvil.add"]
    assert str(add.infer([T(F32, s0, 1), T(F32, 1, s1)], {})[0]) == "tensor<s0xs1xf32>"
    assert str(add.infer([T(F32, 2 * s0, 8), T(F32, s0 + s0, 1)], {})[0]) == "tensor<(2*s0)x8xf32>"
    with pytest.raises(ValueError, match=r"cannot broadcast tensor<s0x128xf32>, tensor<64xf32>"):
        add.infer([T(F32, s0, 128), T(F32, 64)], {})
    with pytest.raises(ValueError, match="cannot broadcast"):
        add.infer([T(F32, s0), T(F32, s1)], {})


def test_builder_reports_broadcast_error_with_op_name():
    fn = Function("f", [T(F32, s0, 128), T(F32, 64)], symbols={"s0": (1, 8)})
    with pytest.raises(CuvilVerifyError, match=r"cuvil.add: cannot broadcast tensor<s0x128xf32>"):
        Builder(fn)("cuvil.add", *fn.args)


def test_commutative_tags():
    names = {op.name for op in ops_with_tag("commutative")}
    assert {"cuvil.add", "cuvil.mul", "cuvil.eq", "cuvil.maximum"} <= names
    assert not {"cuvil.sub", "cuvil.div", "cuvil.lt", "cuvil.pow"} & names


# ----------------------------------------------------------------------------- other elementwise

@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate):
    x = randn(4, 6)
    types, (out,) = run("cuvil.gelu", [x], {"approximate": approximate}, types=[T(F32, s0, 6)])
    assert types == ["tensor<s0x6xf32>"]
    v = x.double().numpy()
    if approximate == "none":
        ref = 0.5 * v * (1 + _erf(v / math.sqrt(2)))
    else:
        ref = 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
    close(out, ref)
    with pytest.raises(CuvilVerifyError, match="approximate must be"):
        build("cuvil.gelu", [T(F32, 3)], {"approximate": "fast"})


def test_clamp():
    x = randn(5, 3) * 3
    types, (out,) = run("cuvil.clamp", [x], {"min": -1.0, "max": 0.5}, types=[T(F32, s0, 3)])
    assert types == ["tensor<s0x3xf32>"]
    close(out, np.minimum(np.maximum(x.numpy(), -1.0), 0.5))
    _, (upper,) = run("cuvil.clamp", [x], {"max": 0.0})
    close(upper, np.minimum(x.numpy(), 0.0))
    xi = torch.arange(-5, 5)
    types, (outi,) = run("cuvil.clamp", [xi], {"min": -2.0, "max": 3})
    assert types == ["tensor<10xi64>"]
    close(outi, np.clip(xi.numpy(), -2, 3))
    with pytest.raises(CuvilVerifyError, match="whole numbers"):
        build("cuvil.clamp", [T(I64, 3)], {"min": 0.5})


def test_cast():
    x = randn(2, 3) * 4
    types, (out,) = run("cuvil.cast", [x], {"dtype": I32}, types=[T(F32, s0, 3)])
    assert types == ["tensor<s0x3xi32>"]
    close(out, np.trunc(x.numpy()).astype(np.int32))


def test_where():
    cond = randn(3, 1) > 0
    a, b = randn(3, 4, seed=1), randn(4, seed=2)
    types, (out,) = run("cuvil.where", [cond, a, b], types=[T(BOOL, s0, 1), T(F32, s0, 4), T(F32, 4)])
    assert types == ["tensor<s0x4xf32>"]
    close(out, np.where(cond.numpy(), a.numpy(), b.numpy()))
    with pytest.raises(CuvilVerifyError, match="cond must be an i1"):
        build("cuvil.where", [T(F32, 3), T(F32, 3), T(F32, 3)])


# ----------------------------------------------------------------------------- reductions

REDUCTIONS = {"sum": np.sum, "mean": np.mean, "amax": np.max, "amin": np.min, "prod": np.prod}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reductions(name):
    x = randn(3, 4, 5) + 1
    types, (out,) = run(f"cuvil.{name}", [x], {"dims": [0, 2]}, types=[T(F32, s0, 4, 5)])
    assert types == ["tensor<4xf32>"]
    close(out, REDUCTIONS[name](x.double().numpy(), axis=(0, 2)), rtol=1e-4)
    types, (kept,) = run(f"cuvil.{name}", [x], {"dims": [1], "keepdim": True}, types=[T(F32, s0, 4, 5)])
    assert types == ["tensor<s0x1x5xf32>"]
    close(kept, REDUCTIONS[name](x.double().numpy(), axis=1, keepdims=True), rtol=1e-4)
    types, (everything,) = run(f"cuvil.{name}", [x])
    assert types == ["tensor<f32>"]
    close(everything, REDUCTIONS[name](x.double().numpy()), rtol=1e-4)


def test_integer_sum_accumulates_in_i64():
    x = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    types, (out,) = run("cuvil.sum", [x], {"dims": [1]})
    assert types == ["tensor<3xi64>"]
    close(out, x.numpy().sum(axis=1))
    with pytest.raises(CuvilVerifyError, match="floating-point"):
        build("cuvil.mean", [T(I32, 3)])
    with pytest.raises(CuvilVerifyError, match="repeats"):
        build("cuvil.sum", [T(F32, 3, 4)], {"dims": [1, 1]})
    with pytest.raises(CuvilVerifyError, match="out of range"):
        build("cuvil.sum", [T(F32, 3, 4)], {"dims": [2]})


def test_var():
    x = randn(4, 6)
    types, (out,) = run("cuvil.var", [x], {"dims": [1]}, types=[T(F32, s0, 6)])
    assert types == ["tensor<s0xf32>"]
    close(out, x.double().numpy().var(axis=1, ddof=1))
    _, (pop,) = run("cuvil.var", [x], {"dims": [0], "correction": 0, "keepdim": True})
    close(pop, x.double().numpy().var(axis=0, ddof=0, keepdims=True))


@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_arg_reductions(name):
    x = randn(4, 7)
    ref = getattr(np, name)
    types, (out,) = run(f"cuvil.{name}", [x], {"dim": 1}, types=[T(F32, s0, 7)])
    assert types == ["tensor<s0xi64>"]
    close(out, ref(x.numpy(), axis=1))
    types, (flat,) = run(f"cuvil.{name}", [x])
    assert types == ["tensor<i64>"]
    close(flat, ref(x.numpy()))
    types, (kept,) = run(f"cuvil.{name}", [x], {"dim": 0, "keepdim": True})
    assert types == ["tensor<1x7xi64>"]
    close(kept, ref(x.numpy(), axis=0)[None])


def _softmax(v, axis):
    e = np.exp(v - v.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_softmax_and_log_softmax():
    x = randn(3, 5)
    types, (out,) = run("cuvil.softmax", [x], {"dim": 1}, types=[T(F32, s0, 5)])
    assert types == ["tensor<s0x5xf32>"]
    close(out, _softmax(x.double().numpy(), 1))
    types, (log,) = run("cuvil.log_softmax", [x], {"dim": 0})
    assert types == ["tensor<3x5xf32>"]
    close(log, np.log(_softmax(x.double().numpy(), 0)))


# ----------------------------------------------------------------------------- normalisation

def test_layer_norm():
    x, w, b = randn(2, 3, 4), randn(3, 4, seed=1), randn(3, 4, seed=2)
    types, (out,) = run("cuvil.layer_norm", [x, w, b], {"normalized_ndim": 2, "eps": 1e-5},
                        types=[T(F32, s0, 3, 4), T(F32, 3, 4), T(F32, 3, 4)])
    assert types == ["tensor<s0x3x4xf32>"]
    v = x.double().numpy()
    mu, var = v.mean(axis=(1, 2), keepdims=True), v.var(axis=(1, 2), keepdims=True)
    close(out, (v - mu) / np.sqrt(var + 1e-5) * w.numpy() + b.numpy(), rtol=1e-4, atol=1e-5)
    _, (plain,) = run("cuvil.layer_norm", [x], {"normalized_ndim": 1})
    mu, var = v.mean(axis=2, keepdims=True), v.var(axis=2, keepdims=True)
    close(plain, (v - mu) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-5)
    with pytest.raises(CuvilVerifyError, match=r"weight and bias must have shape \[3, 4\]"):
        build("cuvil.layer_norm", [T(F32, 2, 3, 4), T(F32, 4)], {"normalized_ndim": 2})


def test_rms_norm():
    x, w = randn(3, 8), randn(8, seed=1)
    types, (out,) = run("cuvil.rms_norm", [x, w], {"normalized_ndim": 1, "eps": 1e-6},
                        types=[T(F32, s0, 8), T(F32, 8)])
    assert types == ["tensor<s0x8xf32>"]
    v = x.double().numpy()
    close(out, v / np.sqrt((v ** 2).mean(axis=1, keepdims=True) + 1e-6) * w.numpy(), rtol=1e-4)
    _, (default_eps,) = run("cuvil.rms_norm", [x], {"normalized_ndim": 1})
    eps = np.finfo(np.float32).eps
    close(default_eps, v / np.sqrt((v ** 2).mean(axis=1, keepdims=True) + eps), rtol=1e-4)


def test_batch_norm():
    x = randn(2, 3, 4, 4)
    mean, var = randn(3, seed=1), randn(3, seed=2).abs() + 0.5
    w, b = randn(3, seed=3), randn(3, seed=4)
    types, (out,) = run("cuvil.batch_norm", [x, mean, var, w, b], {"eps": 1e-3},
                        types=[T(F32, s0, 3, s1, 4)] + [T(F32, 3)] * 4)
    assert types == ["tensor<s0x3xs1x4xf32>"]
    c = lambda t: t.double().numpy()[None, :, None, None]  # noqa: E731
    close(out, (x.double().numpy() - c(mean)) / np.sqrt(c(var) + 1e-3) * c(w) + c(b), rtol=1e-4, atol=1e-5)
    with pytest.raises(CuvilVerifyError, match=r"must have shape \[3\]"):
        build("cuvil.batch_norm", [T(F32, 2, 3, 4), T(F32, 4), T(F32, 3)])


# ----------------------------------------------------------------------------- matrix products

def test_linear():
    x, w, b = randn(2, 3, 4), randn(5, 4, seed=1), randn(5, seed=2)
    types, (out,) = run("cuvil.linear", [x, w, b], types=[T(F32, s0, 3, 4), T(F32, 5, 4), T(F32, 5)])
    assert types == ["tensor<s0x3x5xf32>"]
    close(out, x.numpy() @ w.numpy().T + b.numpy(), rtol=1e-5)
    _, (nobias,) = run("cuvil.linear", [x, w])
    close(nobias, x.numpy() @ w.numpy().T, rtol=1e-5)
    with pytest.raises(CuvilVerifyError, match="in-features differ"):
        build("cuvil.linear", [T(F32, 2, 3), T(F32, 5, 4)])
    with pytest.raises(CuvilVerifyError, match="one dtype"):
        build("cuvil.linear", [T(F16, 2, 4), T(F32, 5, 4)])


@pytest.mark.parametrize("a_shape,b_shape,expected", [
    ((3, 4), (4, 5), "tensor<3x5xf32>"),
    ((4,), (4,), "tensor<f32>"),
    ((4,), (2, 4, 5), "tensor<2x5xf32>"),
    ((2, 3, 4), (4,), "tensor<2x3xf32>"),
    ((2, 1, 3, 4), (5, 4, 6), "tensor<2x5x3x6xf32>"),
])
def test_matmul(a_shape, b_shape, expected):
    a, b = randn(*a_shape, seed=1), randn(*b_shape, seed=2)
    types, (out,) = run("cuvil.matmul", [a, b])
    assert types == [expected]
    close(out, np.matmul(a.numpy(), b.numpy()), rtol=1e-5)


def test_matmul_symbolic():
    a, b = randn(3, 2, 4), randn(3, 4, 6)
    types, (out,) = run("cuvil.matmul", [a, b], types=[T(F32, s0, s1, 4), T(F32, s0, 4, 6)])
    assert types == ["tensor<s0xs1x6xf32>"]
    close(out, a.numpy() @ b.numpy(), rtol=1e-5)
    with pytest.raises(CuvilVerifyError, match="contracted dims differ"):
        build("cuvil.matmul", [T(F32, s0, 4), T(F32, s0, 4)])


# ----------------------------------------------------------------------------- convolution and pooling

def _windows(v, kh, kw, stride, dilation):
    """(N, C, OH, OW, kh, kw) windows of an already padded NCHW array."""
    n, c, h, w = v.shape
    oh = (h - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.empty((n, c, oh, ow, kh, kw), v.dtype)
    for i in range(kh):
        for j in range(kw):
            r0, c0 = i * dilation[0], j * dilation[1]
            out[..., i, j] = v[:, :, r0:r0 + (oh - 1) * stride[0] + 1:stride[0],
                               c0:c0 + (ow - 1) * stride[1] + 1:stride[1]]
    return out


def _conv_ref(x, w, b, stride, padding, dilation, groups):
    v = np.pad(x, ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2))
    win = _windows(v, w.shape[2], w.shape[3], stride, dilation)
    cin, cout = x.shape[1] // groups, w.shape[0] // groups
    outs = [np.einsum("ncxyij,ocij->noxy", win[:, g * cin:(g + 1) * cin], w[g * cout:(g + 1) * cout])
            for g in range(groups)]
    return np.concatenate(outs, axis=1) + b[None, :, None, None]


@pytest.mark.parametrize("stride,padding,dilation,groups", [([1, 1], [0, 0], [1, 1], 1), ([2, 1], [1, 2], [1, 2], 2)])
def test_conv2d(stride, padding, dilation, groups):
    x, w, b = randn(2, 4, 9, 8), randn(6, 4 // groups, 3, 3, seed=1), randn(6, seed=2)
    attrs = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    types, (out,) = run("cuvil.conv2d", [x, w, b], attrs)
    ref = _conv_ref(x.double().numpy(), w.double().numpy(), b.double().numpy(), stride, padding, dilation, groups)
    assert types == [f"tensor<{'x'.join(map(str, ref.shape))}xf32>"]
    close(out, ref, rtol=1e-4, atol=1e-5)


def test_conv2d_symbolic_spatial():
    x, w = randn(1, 3, 10, 7), randn(4, 3, 3, 3, seed=1)
    types, (out,) = run("cuvil.conv2d", [x, w], {"stride": [2], "padding": [1]},
                        types=[T(F32, s0, 3, s1, 7), T(F32, 4, 3, 3, 3)])
    assert types == [str(T(F32, s0, 4, floordiv(s1 - 1, 2) + 1, 4))]
    close(out, _conv_ref(x.double().numpy(), w.double().numpy(), np.zeros(4), [2, 2], [1, 1], [1, 1], 1),
          rtol=1e-4, atol=1e-5)
    with pytest.raises(CuvilVerifyError, match="channels"):
        build("cuvil.conv2d", [T(F32, 1, 3, 8, 8), T(F32, 4, 2, 3, 3)])


def test_max_pool2d():
    x = randn(2, 3, 7, 8)
    attrs = {"kernel": [3, 2], "stride": [2, 2], "padding": [1, 1], "dilation": [1, 2]}
    types, (out,) = run("cuvil.max_pool2d", [x], attrs, types=[T(F32, s0, 3, s1, 8)])
    v = np.pad(x.numpy(), ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    ref = _windows(v, 3, 2, (2, 2), (1, 2)).max(axis=(4, 5))
    assert types == [str(T(F32, s0, 3, floordiv(s1 - 1, 2) + 1, 4))]
    close(out, ref)
    types, (ceil,) = run("cuvil.max_pool2d", [x], {"kernel": [2, 2], "ceil_mode": True})
    v = np.pad(x.numpy(), ((0, 0), (0, 0), (0, 1), (0, 0)), constant_values=-np.inf)
    assert types == ["tensor<2x3x4x4xf32>"]
    close(ceil, _windows(v, 2, 2, (2, 2), (1, 1)).max(axis=(4, 5)))
    for h in (7, 8):    # a symbolic height: ceil((h - 2) / 2) + 1, whose last window always fits
        x = randn(1, 1, h, 4)
        types, (ceil,) = run("cuvil.max_pool2d", [x], {"kernel": [2, 2], "ceil_mode": True},
                             types=[T(F32, 1, 1, s0, 4)])
        assert types == [str(T(F32, 1, 1, floordiv(s0 - 1, 2) + 1, 2))]
        close(ceil, torch.nn.functional.max_pool2d(x, 2, ceil_mode=True))
    with pytest.raises(CuvilVerifyError, match="ceil_mode pooling over a symbolic dim"):
        build("cuvil.max_pool2d", [T(F32, 1, 1, s0, 4)], {"kernel": [1], "stride": [2], "ceil_mode": True})


def test_avg_pool2d():
    x = randn(1, 2, 6, 6)
    types, (out,) = run("cuvil.avg_pool2d", [x], {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1]})
    assert types == ["tensor<1x2x3x3xf32>"]
    padded = np.pad(x.double().numpy(), ((0, 0), (0, 0), (1, 1), (1, 1)))
    close(out, _windows(padded, 3, 3, (2, 2), (1, 1)).mean(axis=(4, 5)))
    _, (excl,) = run("cuvil.avg_pool2d", [x], {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1],
                                               "count_include_pad": False})
    ones = np.pad(np.ones((1, 2, 6, 6)), ((0, 0), (0, 0), (1, 1), (1, 1)))
    counts = _windows(ones, 3, 3, (2, 2), (1, 1)).sum(axis=(4, 5))
    close(excl, _windows(padded, 3, 3, (2, 2), (1, 1)).sum(axis=(4, 5)) / counts)
    _, (div,) = run("cuvil.avg_pool2d", [x], {"kernel": [2, 2], "divisor": 3})
    close(div, _windows(x.double().numpy(), 2, 2, (2, 2), (1, 1)).sum(axis=(4, 5)) / 3)


@pytest.mark.parametrize("kind, fold", [("avg", np.mean), ("max", np.max)])
def test_adaptive_pool2d(kind, fold):
    x = randn(2, 3, 7, 5)
    types, (out,) = run(f"cuvil.adaptive_{kind}_pool2d", [x], {"output_size": [3, 2]}, types=[T(F32, s0, 3, 7, 5)])
    assert types == ["tensor<s0x3x3x2xf32>"]
    v = x.double().numpy()
    ref = np.empty((2, 3, 3, 2))
    for i in range(3):
        for j in range(2):
            h0, h1 = (i * 7) // 3, -(-((i + 1) * 7) // 3)
            w0, w1 = (j * 5) // 2, -(-((j + 1) * 5) // 2)
            ref[:, :, i, j] = fold(v[:, :, h0:h1, w0:w1], axis=(2, 3))
    close(out, ref)


# ----------------------------------------------------------------------------- lookup and attention

def test_embedding():
    w = randn(10, 4)
    idx = torch.tensor([[1, 9, 0], [3, 3, 2]])
    types, (out,) = run("cuvil.embedding", [w, idx], types=[T(F32, 10, 4), T(I64, s0, 3)])
    assert types == ["tensor<s0x3x4xf32>"]
    close(out, w.numpy()[idx.numpy()])
    with pytest.raises(CuvilVerifyError, match="indices must be an integer"):
        build("cuvil.embedding", [T(F32, 10, 4), T(F32, 3)])


def _attention(q, k, v, mask=None, causal=False, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        mask = np.tril(np.ones(scores.shape[-2:], dtype=bool))
    if mask is not None:
        scores = np.where(mask, scores, -np.inf) if mask.dtype == bool else scores + mask
    return _softmax(scores, -1) @ v


def test_sdpa():
    q, k, v = randn(2, 3, 5, 4, seed=1), randn(2, 3, 6, 4, seed=2), randn(2, 3, 6, 8, seed=3)
    types, (out,) = run("cuvil.sdpa", [q, k, v], types=[T(F32, s0, 3, 5, 4), T(F32, s0, 3, 6, 4), T(F32, s0, 3, 6, 8)])
    assert types == ["tensor<s0x3x5x8xf32>"]
    d = lambda t: t.double().numpy()  # noqa: E731
    close(out, _attention(d(q), d(k), d(v)), rtol=1e-4, atol=1e-5)
    mask = randn(5, 6, seed=4) > -0.5
    _, (masked,) = run("cuvil.sdpa", [q, k, v, mask], {"scale": 0.3})
    close(masked, _attention(d(q), d(k), d(v), mask.numpy(), scale=0.3), rtol=1e-4, atol=1e-5)
    bias = randn(1, 1, 5, 6, seed=5)
    _, (biased,) = run("cuvil.sdpa", [q, k, v, bias])
    close(biased, _attention(d(q), d(k), d(v), d(bias)), rtol=1e-4, atol=1e-5)
    qc = randn(2, 3, 6, 4, seed=6)
    _, (causal,) = run("cuvil.sdpa", [qc, k, v], {"is_causal": True})
    close(causal, _attention(d(qc), d(k), d(v), causal=True), rtol=1e-4, atol=1e-5)
    with pytest.raises(CuvilVerifyError, match=r"cannot broadcast tensor<1x5x6xf32>, tensor<5x5xi1>"):
        build("cuvil.sdpa", [T(F32, 1, 5, 4), T(F32, 1, 6, 4), T(F32, 1, 6, 4), T(BOOL, 5, 5)])


# ----------------------------------------------------------------------------- sources and return

def _module_with(body, arg_types=(), symbols=None):
    fn = Function("f", list(arg_types), symbols=symbols or {})
    b = Builder(fn)
    results = body(b, *fn.args)
    b.create("cuvil.return", results)
    m = Module()
    m.add_function(fn)
    return m


def test_const():
    TESTED.add("cuvil.const")
    data = randn(3, 2)

    def body(b):
        op = b.create("cuvil.const", attrs={"name": "layer.weight"}, result_types=[T(F32, 3, 2)])
        return [op.result]
    m = _module_with(body)
    m.constants["layer.weight"] = data
    verify(m)
    (out,) = interpret(m)
    assert out is data
    with pytest.raises(CuvilVerifyError, match="cannot be inferred; create cuvil.const with result_types"):
        Builder(Function("g", [])).create("cuvil.const", attrs={"name": "w"})


def test_literal():
    TESTED.add("cuvil.literal")
    m = _module_with(lambda b: [b("cuvil.literal", value=2.5, dtype=F16), b("cuvil.literal", value=7, dtype=I32)])
    verify(m)
    assert [str(v.type) for v in m.main.return_op.operands] == ["tensor<f16>", "tensor<i32>"]
    half, seven = interpret(m)
    assert half.dtype == torch.float16 and half.item() == 2.5 and half.dim() == 0
    assert seven.dtype == torch.int32 and seven.item() == 7
    with pytest.raises(CuvilVerifyError, match="does not fit dtype i64"):
        _module_with(lambda b: [b("cuvil.literal", value=0.5, dtype=I64)])


def test_full_symbolic():
    TESTED.add("cuvil.full")
    m = _module_with(lambda b, x: [b("cuvil.full", shape=[s0 + 1, 2], value=3, dtype=F32)],
                     [T(F32, s0)], {"s0": (1, 10)})
    verify(m)
    assert m.main.return_op.operands[0].type == T(F32, s0 + 1, 2)
    (out,) = interpret(m, torch.zeros(4))
    close(out, np.full((5, 2), 3.0))


def test_arange():
    TESTED.add("cuvil.arange")
    m = _module_with(lambda b, x: [b("cuvil.arange", end=[s0], dtype=I64),
                                   b("cuvil.arange", start=1, end=[2 * s0], step=3, dtype=I32),
                                   b("cuvil.arange", start=0.5, end=[3], step=0.25, dtype=F32)],
                     [T(F32, s0)], {"s0": (1, 10)})
    verify(m)
    types = [str(v.type) for v in m.main.return_op.operands]
    assert types == ["tensor<s0xi64>", str(T(I32, floordiv(2 * s0 + 1, 3))), "tensor<10xf32>"]
    for n in (1, 5):
        a, b, c = interpret(m, torch.zeros(n))
        close(a, np.arange(n))
        close(b, np.arange(1, 2 * n, 3).astype(np.int32))
        close(c, np.arange(0.5, 3, 0.25))


def test_size():
    """A size as a rank-0 value (the frontend's `arange(n) + past_length`); one dim, not bool."""
    TESTED.add("cuvil.size")
    m = _module_with(lambda b, x: [b("cuvil.size", size=[2 * s0 + 1], dtype=I64),
                                   b("cuvil.size", size=[s0], dtype=F32)],
                     [T(F32, s0)], {"s0": (1, 10)})
    verify(m)
    assert [str(v.type) for v in m.main.return_op.operands] == ["tensor<i64>", "tensor<f32>"]
    a, b = interpret(m, torch.zeros(4))
    assert a.item() == 9 and a.dtype == torch.int64 and b.item() == 4.0
    for attrs, message in (({"size": [s0, 2], "dtype": I64}, "one dim"), ({"size": [s0], "dtype": BOOL}, "bool")):
        with pytest.raises(ValueError, match=message):
            OP_REGISTRY["cuvil.size"].infer([], attrs)


def test_return_has_no_results():
    TESTED.add("cuvil.return")
    x = randn(2)
    m = _module_with(lambda b, a, c: [c, a, a], [T(F32, 2), T(F32, 3)])
    verify(m)
    assert m.main.return_op.results == []
    out = interpret(m, x, randn(3))
    assert len(out) == 3 and out[1] is x and out[2] is x


# ----------------------------------------------------------------------------- layout

def test_reshape():
    x = randn(4, 6)
    types, (out,) = run("cuvil.reshape", [x], {"shape": [-1, 3]}, types=[T(F32, s0, 6)])
    assert types == ["tensor<(2*s0)x3xf32>"]
    close(out, x.numpy().reshape(-1, 3))
    types, (flat,) = run("cuvil.reshape", [x], {"shape": [6 * s0]}, types=[T(F32, s0, 6)])
    assert types == ["tensor<(6*s0)xf32>"]
    close(flat, x.numpy().reshape(-1))
    types, (split,) = run("cuvil.reshape", [x], {"shape": [s0, 2, -1]}, types=[T(F32, s0, 6)])
    assert types == ["tensor<s0x2x3xf32>"]
    close(split, x.numpy().reshape(4, 2, 3))
    with pytest.raises(CuvilVerifyError, match="not a multiple"):
        build("cuvil.reshape", [T(F32, s0, 3)], {"shape": [2, -1]})
    with pytest.raises(CuvilVerifyError, match=r"\(12 elements\)"):
        build("cuvil.reshape", [T(F32, 3, 4)], {"shape": [5, 2]})


PINNED = """cuvil.func @f(%x: tensor<1x4x(1 + ((-4 + s0)//256))xf32>) -> tensor<1x4xf32> attributes {symbols = {s0 = [8, HI]}} {
  %0 = cuvil.reshape %x {shape = [1, 4]} : tensor<1x4x(1 + ((-4 + s0)//256))xf32> -> tensor<1x4xf32>
  cuvil.return %0 : tensor<1x4xf32>
}
"""


def test_a_reshape_may_drop_a_size_that_the_ranges_pin_to_one():
    # a ceil_mode pool's output size is 1 for s0 <= 259: the element counts agree over the range
    verify(parse(PINNED.replace("HI", "259")))
    with pytest.raises(CuvilParseError, match=r"2:8: error: cuvil.reshape: cannot reshape .* to \[1, 4\]"):
        parse(PINNED.replace("HI", "260"))     # s0 = 260 makes it 2


def test_permute():
    x = randn(2, 3, 4)
    types, (out,) = run("cuvil.permute", [x], {"perm": [2, 0, 1]}, types=[T(F32, s0, 3, 4)])
    assert types == ["tensor<4xs0x3xf32>"]
    close(out, np.transpose(x.numpy(), (2, 0, 1)))
    with pytest.raises(CuvilVerifyError, match="not a permutation"):
        build("cuvil.permute", [T(F32, 2, 3)], {"perm": [0, 0]})


def test_expand():
    x = randn(3, 1)
    types, (out,) = run("cuvil.expand", [x], {"shape": [2, -1, 4]})
    assert types == ["tensor<2x3x4xf32>"]
    close(out, np.broadcast_to(x.numpy(), (2, 3, 4)))
    m = _module_with(lambda b, a, y: [b("cuvil.expand", a, shape=[2, -1, s0])], [T(F32, 3, 1), T(F32, s0)],
                     {"s0": (1, 8)})
    verify(m)
    assert m.main.return_op.operands[0].type == T(F32, 2, 3, s0)
    (res,) = interpret(m, x, torch.zeros(5))
    close(res, np.broadcast_to(x.numpy(), (2, 3, 5)))
    with pytest.raises(CuvilVerifyError, match="cannot expand"):
        build("cuvil.expand", [T(F32, 3, 2)], {"shape": [3, 4]})


def test_slice():
    x = randn(10, 4)
    types, (out,) = run("cuvil.slice", [x], {"dim": 0, "start": [1], "end": [2 ** 63 - 1], "step": 2},
                        types=[T(F32, s0, 4)])
    assert types == [str(T(F32, floordiv(s0, 2), 4))]
    close(out, x.numpy()[1::2])
    types, (tail,) = run("cuvil.slice", [x], {"dim": 0, "start": [-3], "end": [s0]}, types=[T(F32, s0, 4)])
    assert types == ["tensor<3x4xf32>"]
    close(tail, x.numpy()[-3:])
    types, (clamped,) = run("cuvil.slice", [x], {"dim": 1, "start": [2], "end": [100]})
    assert types == ["tensor<10x2xf32>"]
    close(clamped, x.numpy()[:, 2:100])
    types, (empty,) = run("cuvil.slice", [x], {"dim": 1, "start": [3], "end": [1]})
    assert types == ["tensor<10x0xf32>"]
    assert empty.shape == (10, 0)


def test_slice_odd_length_symbolic():
    x = randn(7, 2)
    types, (out,) = run("cuvil.slice", [x], {"dim": 0, "start": [1], "end": [2 ** 63 - 1], "step": 2},
                        types=[T(F32, s0, 2)])
    assert types == [str(T(F32, floordiv(s0, 2), 2))]
    close(out, x.numpy()[1::2])


def test_cat():
    a, b = randn(2, 3, seed=1), randn(4, 3, seed=2)
    types, (out,) = run("cuvil.cat", [a, b], {"dim": 0}, types=[T(F32, s0, 3), T(F32, 4, 3)])
    assert types == [str(T(F32, s0 + 4, 3))]
    close(out, np.concatenate([a.numpy(), b.numpy()]))
    ints = torch.arange(3).reshape(1, 3)
    types, (mixed,) = run("cuvil.cat", [a, ints], {"dim": 0})
    assert types == ["tensor<3x3xf32>"]
    close(mixed, np.concatenate([a.numpy(), ints.numpy().astype(np.float32)]))
    with pytest.raises(CuvilVerifyError, match="needs equal other dims"):
        build("cuvil.cat", [T(F32, 2, 3), T(F32, 2, 4)], {"dim": 0})


def test_pad():
    x = randn(3, 4)
    types, (out,) = run("cuvil.pad", [x], {"low": [1, -1], "high": [0, 2], "value": 5.0}, types=[T(F32, s0, 4)])
    assert types == [str(T(F32, s0 + 1, 5))]
    want = np.full((4, 5), 5.0, np.float32)
    want[1:, :3] = x.numpy()[:, 1:]
    close(out, want)
    types, (mirrored,) = run("cuvil.pad", [x], {"low": [0, 3], "high": [0, 2], "mode": "reflect"})
    assert types == ["tensor<3x9xf32>"]
    close(mirrored, np.pad(x.numpy(), ((0, 0), (3, 2)), mode="reflect"))
    types, (edge,) = run("cuvil.pad", [x], {"low": [2, -1], "high": [0, 5], "mode": "replicate"})
    close(edge, np.pad(x.numpy(), ((2, 0), (0, 5)), mode="edge")[:, 1:])
    types, (wrapped,) = run("cuvil.pad", [x], {"low": [0, -1], "high": [0, 3], "mode": "circular"})
    close(wrapped, np.pad(x.numpy()[:, 1:], ((0, 0), (0, 3)), mode="wrap"))
    with pytest.raises(CuvilVerifyError, match="reflect padding of dim 1 needs a static size, got s0"):
        build("cuvil.pad", [T(F32, 3, s0)], {"low": [0, 1], "high": [0, 1], "mode": "reflect"})
    with pytest.raises(CuvilVerifyError, match="low and high amounts for each of the 2 dims"):
        build("cuvil.pad", [T(F32, 3, 4)], {"low": [1], "high": [1]})


def test_flip():
    x = randn(3, 4, 2)
    types, (out,) = run("cuvil.flip", [x], {"dims": [0, 2]}, types=[T(F32, s0, 4, 2)])
    assert types == [str(T(F32, s0, 4, 2))]
    close(out, x.numpy()[::-1, :, ::-1])
    with pytest.raises(CuvilVerifyError, match="repeats an axis"):
        build("cuvil.flip", [T(F32, 3, 4)], {"dims": [1, 1]})


def test_unfold():
    x = randn(3, 7)
    types, (out,) = run("cuvil.unfold", [x], {"dim": 1, "size": 3, "step": 2}, types=[T(F32, 3, s0)])
    assert types == [str(T(F32, 3, floordiv(s0 - 3, 2) + 1, 3))]
    close(out, x.unfold(1, 3, 2).numpy())
    with pytest.raises(CuvilVerifyError, match="dim 1 has 2 elements, fewer than the window size 3"):
        build("cuvil.unfold", [T(F32, 3, 2)], {"dim": 1, "size": 3, "step": 1})
    with pytest.raises(CuvilVerifyError, match="step >= 1"):
        build("cuvil.unfold", [T(F32, 3, 4)], {"dim": 1, "size": 2, "step": 0})


def test_slice_scatter():
    x, src = randn(3, 8), randn(3, 3)
    types, (out,) = run("cuvil.slice_scatter", [x, src], {"dim": 1, "start": [1], "end": [7], "step": 2},
                        types=[T(F32, s0, 8), T(F32, s0, 3)])
    assert types == [str(T(F32, s0, 8))]
    want = x.clone()
    want[:, 1:7:2] = src
    close(out, want.numpy())
    with pytest.raises(CuvilVerifyError, match="does not fit the slice"):
        build("cuvil.slice_scatter", [T(F32, 3, 8), T(F32, 3, 4)], {"dim": 1, "end": [3]})
    with pytest.raises(CuvilVerifyError, match="cast it first"):
        build("cuvil.slice_scatter", [T(F32, 3, 8), T(DType.i64, 3, 3)], {"dim": 1, "end": [3]})


def test_split():
    x = randn(7, 2)
    m, op = build("cuvil.split", [T(F32, s0, 2)], {"dim": 0, "sizes": [s0 - 3, 1, 2]})
    assert [r.type for r in op.results] == [T(F32, s0 - 3, 2), T(F32, 1, 2), T(F32, 2, 2)]
    a, b, c = interpret(m, x)
    close(a, x.numpy()[:4])
    close(b, x.numpy()[4:5])
    close(c, x.numpy()[5:])
    with pytest.raises(CuvilVerifyError, match="do not add up"):
        build("cuvil.split", [T(F32, 7, 2)], {"dim": 0, "sizes": [3, 3]})


def test_squeeze_unsqueeze():
    x = randn(3, 1, 4, 1)
    types, (out,) = run("cuvil.squeeze", [x], {"dims": [1, 3]}, types=[T(F32, s0, 1, 4, 1)])
    assert types == ["tensor<s0x4xf32>"]
    close(out, x.numpy().reshape(3, 4))
    with pytest.raises(CuvilVerifyError, match="must have size 1"):
        build("cuvil.squeeze", [T(F32, s0, 1)], {"dims": [0]})
    types, (un,) = run("cuvil.unsqueeze", [x], {"dim": 4}, types=[T(F32, s0, 1, 4, 1)])
    assert types == ["tensor<s0x1x4x1x1xf32>"]
    close(un, np.expand_dims(x.numpy(), 4))


def test_select():
    x = randn(3, 5)
    types, (out,) = run("cuvil.select", [x], {"dim": 1, "index": 2}, types=[T(F32, s0, 5)])
    assert types == ["tensor<s0xf32>"]
    close(out, x.numpy()[:, 2])
    _, (last,) = run("cuvil.select", [x], {"dim": 0, "index": -1}, types=[T(F32, s0, 5)])
    close(last, x.numpy()[-1])
    with pytest.raises(CuvilVerifyError, match="out of range"):
        build("cuvil.select", [T(F32, 3, 5)], {"dim": 1, "index": 5})


def test_index_select():
    x = randn(4, 6)
    idx = torch.tensor([5, 0, 5])
    types, (out,) = run("cuvil.index_select", [x, idx], {"dim": 1}, types=[T(F32, s0, 6), T(I64, s1)])
    assert types == ["tensor<s0xs1xf32>"]
    close(out, np.take(x.numpy(), idx.numpy(), axis=1))


def test_index():
    x = randn(5, 4, 3)
    rows, cols = torch.tensor([[0], [4]]), torch.tensor([1, 3, 0])
    types, (out,) = run("cuvil.index", [x, rows, cols], types=[T(F32, s0, 4, 3), T(I64, 2, 1), T(I64, s1)])
    assert types == ["tensor<2xs1x3xf32>"]
    close(out, x.numpy()[rows.numpy(), cols.numpy()])
    types, (one,) = run("cuvil.index", [x, cols])
    assert types == ["tensor<3x4x3xf32>"]
    close(one, x.numpy()[cols.numpy()])
    with pytest.raises(CuvilVerifyError, match="1 to 1 index tensors"):
        build("cuvil.index", [T(F32, 5), T(I64, 2), T(I64, 2)])


def test_gather():
    x = randn(3, 4)
    idx = torch.tensor([[0, 3], [2, 2], [1, 0]])
    types, (out,) = run("cuvil.gather", [x, idx], {"dim": 1}, types=[T(F32, s0, 4), T(I64, s0, 2)])
    assert types == ["tensor<s0x2xf32>"]
    close(out, np.take_along_axis(x.numpy(), idx.numpy(), axis=1))
    with pytest.raises(CuvilVerifyError, match="index must be an i64"):
        build("cuvil.gather", [T(F32, 3, 4), T(I32, 3, 2)], {"dim": 1})


@pytest.mark.parametrize("name", ["triu", "tril"])
def test_triangles(name):
    x = randn(2, 4, 5)
    for diagonal in (0, 1, -2):
        types, (out,) = run(f"cuvil.{name}", [x], {"diagonal": diagonal}, types=[T(F32, s0, 4, 5)])
        assert types == ["tensor<s0x4x5xf32>"]
        close(out, getattr(np, name)(x.numpy(), diagonal))


def test_cumsum():
    x = randn(3, 5)
    types, (out,) = run("cuvil.cumsum", [x], {"dim": 1}, types=[T(F32, s0, 5)])
    assert types == ["tensor<s0x5xf32>"]
    close(out, np.cumsum(x.double().numpy(), axis=1))
    b = x > 0
    types, (counts,) = run("cuvil.cumsum", [b], {"dim": 0})
    assert types == ["tensor<3x5xi64>"]
    close(counts, np.cumsum(b.numpy(), axis=0))


@pytest.mark.parametrize("name", ["cumprod", "logcumsumexp", "cummax", "cummin", "cumargmax", "cumargmin"])
def test_running_folds(name):
    x = randn(3, 6)
    x[1, 2] = float("nan")
    x[2, :] = 1.0                                        # ties: cummax/cummin's index moves to the last
    types, (out,) = run(f"cuvil.{name}", [x], {"dim": 1}, types=[T(F32, s0, 6)])
    assert types == [f"tensor<s0x6x{'i64' if 'arg' in name else 'f32'}>"]
    v = x.double().numpy()
    if name == "cumprod":
        ref = np.cumprod(v, axis=1)
    elif name == "logcumsumexp":
        with np.errstate(invalid="ignore"):             # NaN in, NaN out
            ref = np.logaddexp.accumulate(v, axis=1)
    else:
        # torch's rule, written out: x takes the place when it is at least the best so far, or NaN
        better = np.greater_equal if "max" in name else np.less_equal
        ref, best, at = np.empty_like(v), v[:, 0].copy(), np.zeros(3)
        for i in range(6):
            take = (i == 0) | better(v[:, i], best) | np.isnan(v[:, i])
            best, at = np.where(take, v[:, i], best), np.where(take, i, at)
            ref[:, i] = at if "arg" in name else best
    close(out, ref)
    with pytest.raises(CuvilVerifyError, match="out of range"):
        build(f"cuvil.{name}", [T(F32, 3, 4)], {"dim": 2})


def test_argtopk():
    x = torch.tensor([[3.0, 1.0, float("nan"), 3.0, -1.0], [0.0, 2.0, 2.0, 2.0, -0.0]])
    types, (top,) = run("cuvil.argtopk", [x], {"k": 3, "dim": 1}, types=[T(F32, s0, 5)])
    assert types == ["tensor<s0x3xi64>"]
    assert top.tolist() == [[2, 0, 3], [1, 2, 3]]            # NaN first, equal values by index
    _, (low,) = run("cuvil.argtopk", [x], {"k": 2, "dim": 0, "largest": False})
    assert low.tolist() == [[1, 0, 1, 1, 0], [0, 1, 0, 0, 1]]   # the NaN last; -0 and 0 are equal
    types, (order,) = run("cuvil.argtopk", [x], {"dim": 1}, types=[T(F32, 2, s0)])
    assert types == ["tensor<2xs0xi64>"]
    assert order.tolist() == [[2, 0, 3, 1, 4], [1, 2, 3, 0, 4]]
    with pytest.raises(CuvilVerifyError, match="k = 6 is out of range for 5 elements"):
        build("cuvil.argtopk", [T(F32, 2, 5)], {"k": 6, "dim": 1})
    with pytest.raises(CuvilVerifyError, match="x cannot be a bool tensor"):
        build("cuvil.argtopk", [T(DType.bool, 4)], {"k": 1, "dim": 0})
    ties = torch.tensor([[0.5] * 8, [1.0, 0.0, 1.0, 1.0, -0.0, 1.0, 0.0, 1.0]])
    for order, sorted_ in (("topk", True), ("topk_unsorted", False)):    # equal values as torch.topk leaves them
        _, (eager,) = run("cuvil.argtopk", [ties], {"k": 3, "dim": 1, "order": order})
        assert eager.tolist() == torch.topk(ties, 3, dim=1, sorted=sorted_).indices.tolist()
    types, (kth,) = run("cuvil.argtopk", [ties], {"k": 5, "dim": 1, "largest": False, "order": "kthvalue"})
    assert types == ["tensor<2x1xi64>"]                                  # the k-th alone, eager's pick
    assert kth.tolist() == torch.kthvalue(ties, 5, dim=1, keepdim=True).indices.tolist()
    with pytest.raises(CuvilVerifyError, match="order must be one of stable, topk, topk_unsorted, kthvalue"):
        build("cuvil.argtopk", [T(F32, 2, 5)], {"k": 2, "dim": 1, "order": "random"})
    with pytest.raises(CuvilVerifyError, match="order 'topk' needs a k"):
        build("cuvil.argtopk", [T(F32, 2, 5)], {"dim": 1, "order": "topk"})
    with pytest.raises(CuvilVerifyError, match="order 'kthvalue' picks the smallest"):
        build("cuvil.argtopk", [T(F32, 2, 5)], {"k": 2, "dim": 1, "order": "kthvalue"})


def test_grouped_matmul():
    """Each expert's rows (between consecutive offsets) times its matrix, hand-checked: 0 past
    the last offset, and an expert with no rows (offsets 2, 2) is skipped."""
    rows = torch.arange(10.0).reshape(5, 2)
    weight = torch.stack([torch.eye(2), 2 * torch.eye(2), torch.tensor([[0.0, 1.0], [1.0, 0.0]])])
    offsets = torch.tensor([2, 2, 4], dtype=torch.int32)
    types, (out,) = run("cuvil.grouped_matmul", [rows, weight, offsets], types=[T(F32, s0, 2), T(F32, 3, 2, 2),
                                                                                  T(DType.i32, 3)])
    assert types == ["tensor<s0x2xf32>"]
    assert out.tolist() == [[0, 1], [2, 3], [5, 4], [7, 6], [0, 0]]
    with pytest.raises(CuvilVerifyError, match="offsets must be an integer tensor"):
        build("cuvil.grouped_matmul", [T(F32, 5, 2), T(F32, 3, 2, 2), T(F32, 3)])
    with pytest.raises(CuvilVerifyError, match="contracted dims differ"):
        build("cuvil.grouped_matmul", [T(F32, 5, 3), T(F32, 3, 2, 2), T(DType.i64, 3)])
    with pytest.raises(CuvilVerifyError, match="offsets must have shape"):
        build("cuvil.grouped_matmul", [T(F32, 5, 2), T(F32, 3, 2, 2), T(DType.i64, 4)])


def test_check_index():
    """The index itself where every value lies in [0, size); the interpreter reports the IndexError
    naming the scatter elsewhere."""
    index = torch.tensor([[0, 4], [2, 3]])
    types, (out,) = run("cuvil.check_index", [index], {"size": [5], "dim": 1, "of": "scatter"},
                        types=[T(DType.i64, s0, 2)])
    assert types == ["tensor<s0x2xi64>"]
    assert out.tolist() == index.tolist()
    for bad in (5, -1):
        with pytest.raises(CuvilError, match="IndexError: scatter: an index outside \\[0, 4\\] in dim 1"):
            run("cuvil.check_index", [torch.tensor([0, bad])], {"size": [5], "dim": 1, "of": "scatter"})
    with pytest.raises(CuvilVerifyError, match="index must be i64 or i32"):
        build("cuvil.check_index", [T(F32, 3)], {"size": [5], "dim": 0, "of": "scatter"})
    # negative: [-size, size) passes, counted from the end
    _, (out,) = run("cuvil.check_index", [torch.tensor([-5, -1, 0, 4])],
                    {"size": [5], "dim": 2, "of": "index_put", "negative": True})
    assert out.tolist() == [0, 4, 0, 4]
    for bad in (5, -6):
        with pytest.raises(CuvilError, match="IndexError: index_put: an index outside \\[-5, 4\\] in dim 2"):
            run("cuvil.check_index", [torch.tensor([0, bad])], {"size": [5], "dim": 2, "of": "index_put", "negative": True})


def test_check_true():
    """x itself where cond holds everywhere (cond broadcast to x); the message otherwise."""
    x = torch.arange(6.0).reshape(2, 3)
    types, (out,) = run("cuvil.check_true", [x, torch.tensor(True)], {"message": "classes too large"})
    assert types == ["tensor<2x3xf32>"] and out.tolist() == x.tolist()
    with pytest.raises(CuvilError, match="RuntimeError: classes too large"):
        run("cuvil.check_true", [x, torch.tensor([True, False, True])], {"message": "classes too large"})
    with pytest.raises(CuvilVerifyError, match="cond must be bool"):
        build("cuvil.check_true", [T(F32, 3), T(F32)], {"message": "m"})
    with pytest.raises(CuvilVerifyError, match="does not broadcast to x"):
        build("cuvil.check_true", [T(F32, 3), T(DType.bool, 2, 3)], {"message": "m"})


def test_index_put():
    """Rows named by the index replaced (the last of repeated indices wins, -1 is the last row) or
    added to; an index outside the rows changes nothing. Hand-checked."""
    x = torch.zeros(4, 2)
    index = torch.tensor([1, -1, 1, 7])
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [9.0, 9.0]])
    types, (out,) = run("cuvil.index_put", [x, index, values], types=[T(F32, s0, 2), T(DType.i64, 4), T(F32, 4, 2)])
    assert types == ["tensor<s0x2xf32>"]
    assert out.tolist() == [[0, 0], [5, 6], [0, 0], [3, 4]]
    _, (added,) = run("cuvil.index_put", [x, index, values], {"accumulate": True})
    assert added.tolist() == [[0, 0], [6, 8], [0, 0], [3, 4]]
    with pytest.raises(CuvilVerifyError, match="index must be an integer tensor"):
        build("cuvil.index_put", [T(F32, 4, 2), T(F32, 3), T(F32, 3, 2)])
    with pytest.raises(CuvilVerifyError, match=r"values tensor<3x3xf32> must have shape \[3, 2\]"):
        build("cuvil.index_put", [T(F32, 4, 2), T(DType.i64, 3), T(F32, 3, 3)])
    with pytest.raises(CuvilVerifyError, match="values are i64, x is f32"):
        build("cuvil.index_put", [T(F32, 4, 2), T(DType.i64, 3), T(DType.i64, 3, 2)])


def test_copy():
    x = randn(3, 4).t()
    types, (out,) = run("cuvil.copy", [x], types=[T(F32, 4, s0)])
    assert types == ["tensor<4xs0xf32>"]
    assert out.is_contiguous() and out.data_ptr() != x.data_ptr()
    close(out, x.numpy())


# ----------------------------------------------------------------------------- registry

def test_ops_with_tag():
    elementwise = {op.name for op in ops_with_tag("elementwise")}
    assert {"cuvil.relu", "cuvil.add", "cuvil.where", "cuvil.cast", "cuvil.gelu"} <= elementwise
    assert "cuvil.matmul" not in elementwise
    views = {op.name for op in ops_with_tag("view")}
    assert {"cuvil.reshape", "cuvil.permute", "cuvil.slice"} <= views and "cuvil.cat" not in views
    assert {op.name for op in ops_with_tag("opaque")} >= {"cuvil.linear", "cuvil.conv2d", "cuvil.sdpa"}
    assert all(op.amp in ("always", "follow", "never") for op in builtin_ops())


def test_every_builtin_op_is_tested():
    # runs last in this file (pytest keeps definition order)
    untested = {op.name for op in builtin_ops()} - TESTED
    assert not untested, f"ops without a test: {sorted(untested)}"
