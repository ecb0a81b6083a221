"""User ops declared from Python behave like built-ins: builder, verifier, interpreter, text."""
import numpy as np
import pytest
import torch

from cuvil.errors import CuvilError, CuvilVerifyError
from cuvil.ir import (Builder, DType, Function, Module, TensorType, custom_op, interpret, optional, parse,
                      print_module, sym, verify)
from cuvil.ir.core import OP_REGISTRY
from cuvil.ir.ops import ops_with_tag

F32 = DType.f32
s0, s1 = sym("s0"), sym("s1")


def T(dtype, *shape):
    return TensorType(dtype, shape)


@pytest.fixture(autouse=True)
def clean_registry():
    before = dict(OP_REGISTRY)
    yield
    OP_REGISTRY.clear()
    OP_REGISTRY.update(before)


def declare_scale():
    @custom_op("mylib.scale", operands=("x",), attrs={"factor": optional("float", 1.0)}, tags={"elementwise"})
    def scale(x, *, factor):
        """x * factor"""
        return x * factor
    return scale


def one_op_module(name, arg_types, attrs=None, symbols=None):
    fn = Function("forward", arg_types, [f"a{i}" for i in range(len(arg_types))], symbols=symbols or {})
    b = Builder(fn)
    op = b.create(name, fn.args, attrs or {})
    b.create("cuvil.return", op.results)
    m = Module()
    m.add_function(fn)
    return m, op


def test_elementwise_custom_op_builds_verifies_runs_and_round_trips():
    scale = declare_scale()
    assert OP_REGISTRY["mylib.scale"] is scale and "elementwise" in scale.tags
    assert scale in ops_with_tag("elementwise")
    m, op = one_op_module("mylib.scale", [T(F32, s0, 3)], {"factor": 2.5}, {"s0": (1, 8)})
    assert op.result.type == T(F32, s0, 3)
    verify(m)
    x = torch.randn(4, 3)
    (out,) = interpret(m, x)
    np.testing.assert_allclose(out.numpy(), x.numpy() * 2.5, rtol=1e-6)
    text = print_module(m)
    assert "mylib.scale %a0 {factor = 2.5} : tensor<s0x3xf32> -> tensor<s0x3xf32>" in text
    again = parse(text)
    verify(again)
    assert print_module(again) == text
    (out2,) = interpret(again, x)
    assert torch.equal(out, out2)


def test_default_attribute_and_broadcasting_of_elementwise_ops():
    @custom_op("mylib.lerp", operands=("a", "b"), attrs={"w": optional("float", 0.25)}, tags={"elementwise"})
    def lerp(a, b, *, w):
        return a + w * (b - a)
    m, op = one_op_module("mylib.lerp", [T(F32, s0, 1), T(F32, 5)], symbols={"s0": (1, 8)})
    assert op.result.type == T(F32, s0, 5) and op.attrs == {"w": 0.25}
    verify(m)
    a, b = torch.randn(2, 1), torch.randn(5)
    (out,) = interpret(m, a, b)
    np.testing.assert_allclose(out.numpy(), a.numpy() * 0.75 + b.numpy() * 0.25, rtol=1e-5, atol=1e-6)
    with pytest.raises(CuvilVerifyError, match=r"mylib.lerp: cannot broadcast tensor<3xf32>, tensor<5xf32>"):
        one_op_module("mylib.lerp", [T(F32, 3), T(F32, 5)])


def test_custom_shape_function_with_two_results_and_an_optional_operand():
    def infer(types, attrs):
        x = types[0]
        return [x.with_shape(x.shape[:-1] + (attrs["k"],)), x.with_shape(x.shape[:-1]).with_dtype(DType.i64)]

    @custom_op("mylib.topk", operands=("x", "bias?"), attrs={"k": "int"}, infer=infer, tags={"reduction"})
    def topk(x, bias=None, *, k):
        values, indices = torch.topk(x if bias is None else x + bias, k, dim=-1)
        return values, indices[..., 0]

    m, op = one_op_module("mylib.topk", [T(F32, s0, 6), T(F32, 6)], {"k": 2}, {"s0": (1, 8)})
    assert [r.type for r in op.results] == [T(F32, s0, 2), T(DType.i64, s0)]
    verify(m)
    x, bias = torch.randn(3, 6), torch.randn(6)
    values, first = interpret(m, x, bias)
    ref = np.sort(x.numpy() + bias.numpy(), axis=-1)[:, ::-1]
    np.testing.assert_allclose(values.numpy(), ref[:, :2], rtol=1e-6)
    np.testing.assert_array_equal(first.numpy(), np.argmax(x.numpy() + bias.numpy(), axis=-1))
    m2, _ = one_op_module("mylib.topk", [T(F32, 2, 6)], {"k": 1})
    (v, _) = interpret(m2, x[:2])
    np.testing.assert_allclose(v.numpy()[:, 0], x[:2].numpy().max(axis=-1), rtol=1e-6)
    with pytest.raises(CuvilVerifyError, match=r"missing attribute 'k' \(int\)"):
        del m2.main.ops[0].attrs["k"]
        verify(m2)


def test_redeclaring_the_same_definition_is_a_no_op():
    first = declare_scale()
    assert declare_scale() is first


def test_redeclaring_with_another_definition_is_an_error():
    declare_scale()
    with pytest.raises(ValueError, match=r"op 'mylib.scale' is already registered with a different definition"):
        @custom_op("mylib.scale", operands=("x",), attrs={"factor": optional("float", 1.0)}, tags={"elementwise"})
        def scale(x, *, factor):
            return x * factor + 1

    @custom_op("mylib.scale", operands=("x",), attrs={"factor": optional("float", 1.0)}, tags={"elementwise"},
               replace=True)
    def scale2(x, *, factor):
        return x * factor + 1
    m, _ = one_op_module("mylib.scale", [T(F32, 2)], {"factor": 3.0})
    (out,) = interpret(m, torch.tensor([1.0, 2.0]))
    assert out.tolist() == [4.0, 7.0]


def test_builtin_names_cannot_be_taken():
    with pytest.raises(ValueError, match=r"reserved 'cuvil.' namespace"):
        custom_op("cuvil.relu", tags={"elementwise"})


@pytest.mark.parametrize("kwargs,pattern", [
    ({"name": "scale", "tags": {"elementwise"}}, "must be dotted"),
    ({"name": "mylib.gather"}, r"needs infer=fn\(types, attrs\) unless it is tagged elementwise"),
    ({"name": "mylib.x", "tags": {"fast"}}, r"unknown tags \['fast'\]"),
    ({"name": "mylib.x", "tags": {"elementwise"}, "amp": "sometimes"}, "amp of 'mylib.x' must be one of"),
    ({"name": "mylib.x", "tags": {"elementwise"}, "operands": ("a?", "b")}, "must come last"),
    ({"name": "mylib.x", "tags": {"elementwise"}, "attrs": {"k": 3}}, "must be declared with optional"),
])
def test_bad_declarations(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        custom_op(kwargs.pop("name"), **kwargs)


def test_shape_function_bugs_are_reported_as_the_user_ops():
    @custom_op("mylib.broken", infer=lambda types, attrs: types[3])
    def broken(x):
        return x
    with pytest.raises(CuvilVerifyError, match=r"the shape function of 'mylib.broken' raised IndexError"):
        one_op_module("mylib.broken", [T(F32, 2)])


def test_reference_semantics_that_disagree_with_the_shape_function_are_caught():
    @custom_op("mylib.liar", tags={"elementwise"})
    def liar(x):
        return torch.cat([x, x])
    m, _ = one_op_module("mylib.liar", [T(F32, 2)])
    verify(m)
    with pytest.raises(CuvilError, match=r"mylib.liar #\d+ produced torch.float32 \[4\], but its type tensor<2xf32>"):
        interpret(m, torch.randn(2))


def test_reference_code_errors_name_the_op():
    @custom_op("mylib.fails", tags={"elementwise"})
    def fails(x):
        raise RuntimeError("boom")
    m, _ = one_op_module("mylib.fails", [T(F32, 2)])
    with pytest.raises(CuvilError, match=r"evaluating mylib.fails #\d+ failed: RuntimeError: boom"):
        interpret(m, torch.randn(2))


def test_reference_code_returning_too_few_results_is_caught():
    @custom_op("mylib.pair", infer=lambda types, attrs: [types[0], types[0]])
    def pair(x):
        return x
    m, _ = one_op_module("mylib.pair", [T(F32, 2)])
    verify(m)
    with pytest.raises(CuvilError, match=r"mylib.pair #\d+ produced 1 results, its declaration has 2"):
        interpret(m, torch.randn(2))
