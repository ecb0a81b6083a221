"""The verifier: one test per class of error, each checking the message names the problem."""
import pytest
import torch

from cuvil.errors import CuvilVerifyError
from cuvil.ir import Builder, DType, Function, Loc, Module, OpDef, Operation, TensorType, sym, verify

F32, I64 = DType.f32, DType.i64
s0, s1 = sym("s0"), sym("s1")


def T(dtype, *shape):
    return TensorType(dtype, shape)


def module(arg_types=(T(F32, s0, 4),), symbols=None):
    fn = Function("forward", list(arg_types), ["x", "y", "z"][:len(arg_types)],
                  symbols={"s0": (1, 16)} if symbols is None else symbols)
    m = Module()
    m.add_function(fn)
    return m, fn, Builder(fn)


def fails(m, pattern):
    with pytest.raises(CuvilVerifyError, match=pattern) as info:
        verify(m)
    return info.value


def test_valid_module_passes():
    m, fn, b = module()
    y = b("cuvil.relu", fn.args[0])
    w = b.create("cuvil.const", attrs={"name": "w"}, result_types=[T(F32, 8, 4)]).result
    z = b("cuvil.linear", y, w)
    b.create("cuvil.return", [z])
    m.constants["w"] = torch.zeros(8, 4)
    verify(m)


def test_unknown_op():
    class Mystery(OpDef):
        name = "mylib.mystery"
        operands = ("x",)
    m, fn, b = module()
    fn.ops.append(Operation(Mystery, [fn.args[0]], [T(F32, s0, 4)]))
    b.create("cuvil.return", [fn.ops[0].result])
    err = fails(m, r"unknown op 'mylib.mystery' \(not registered\)")
    assert err.op is fn.ops[0]


def test_operand_count():
    m, fn, b = module([T(F32, 4), T(F32, 4), T(F32, 4)])
    op = b.create("cuvil.relu", [fn.args[0]])
    b.create("cuvil.return", [op.result])
    op.operands.append(fn.args[1])
    fn.args[1].uses.append(op)
    fails(m, r"expects 1 operands \(x\), got 2 in 'cuvil.relu'")
    op.drop_operands()
    fails(m, r"expects 1 operands \(x\), got 0")


def test_operand_count_optional_range():
    m, fn, b = module([T(F32, 2, 4), T(F32, 8, 4), T(F32, 8)])
    op = b.create("cuvil.linear", fn.args)
    b.create("cuvil.return", [op.result])
    verify(m)
    op.drop_operands()
    op.operands = [fn.args[0]]
    fn.args[0].uses.append(op)
    fails(m, r"expects 2 to 3 operands \(x, weight, bias\?\), got 1")


def test_missing_attribute():
    m, fn, b = module()
    op = b.create("cuvil.softmax", [fn.args[0]], {"dim": 1})
    b.create("cuvil.return", [op.result])
    del op.attrs["dim"]
    fails(m, r"missing attribute 'dim' \(int\) in 'cuvil.softmax'")


def test_unknown_attribute():
    m, fn, b = module()
    op = b.create("cuvil.softmax", [fn.args[0]], {"dim": 1})
    b.create("cuvil.return", [op.result])
    op.attrs["axis"] = 1
    fails(m, r"unknown attribute 'axis' \(known: dim\)")


@pytest.mark.parametrize("key,value,kind", [
    ("dim", 1.0, "int"), ("dim", True, "int"), ("dim", "1", "int"),
])
def test_attribute_kind(key, value, kind):
    m, fn, b = module()
    op = b.create("cuvil.softmax", [fn.args[0]], {"dim": 1})
    b.create("cuvil.return", [op.result])
    op.attrs[key] = value
    fails(m, rf"attribute '{key}' must be of kind {kind}, got {value!r}")


def test_attribute_kinds_of_lists_dtypes_and_optionals():
    m, fn, b = module()
    r = b.create("cuvil.reshape", [fn.args[0]], {"shape": [s0, 2, 2]})
    s = b.create("cuvil.sum", [r.result], {"dims": [1]})
    c = b.create("cuvil.cast", [s.result], {"dtype": I64})
    k = b.create("cuvil.clamp", [fn.args[0]], {"min": 0})
    b.create("cuvil.return", [c.result, k.result])
    verify(m)
    for op, key, bad, kind in [(r, "shape", [s0, 2.5, 2], "dims"), (s, "dims", [1.0], "ints"),
                               (c, "dtype", torch.int64, "dtype"), (k, "min", "0", r"float\?")]:
        good = op.attrs[key]
        op.attrs[key] = bad
        fails(m, rf"attribute '{key}' must be of kind {kind}")
        op.attrs[key] = good
    verify(m)


def test_use_before_definition():
    m, fn, b = module()
    a = b.create("cuvil.relu", [fn.args[0]])
    c = b.create("cuvil.neg", [a.result])
    b.create("cuvil.return", [c.result])
    fn.ops[0], fn.ops[1] = fn.ops[1], fn.ops[0]
    err = fails(m, r"operand 0 \(result #0: tensor<s0x4xf32>\) is used before it is defined in 'cuvil.neg'")
    assert err.op is c


def test_value_from_another_function_is_undefined():
    m, fn, b = module()
    other = Function("other", [T(F32, s0, 4)], ["w"])
    op = b.create("cuvil.relu", [other.args[0]])
    b.create("cuvil.return", [op.result])
    fails(m, r"operand 0 \(%w: tensor<s0x4xf32>\) is used before it is defined")


def test_use_list_with_stray_entry():
    m, fn, b = module()
    op = b.create("cuvil.relu", [fn.args[0]])
    b.create("cuvil.return", [op.result])
    erased = Operation(op.opdef, [fn.args[0]], [T(F32, s0, 4)])   # never inserted: a stale use
    err = fails(m, r"use-list of %x lists cuvil.relu #\d+ \(an operation not in the function\)")
    assert err.op is None
    erased.drop_operands()
    verify(m)


def test_use_list_missing_entry():
    m, fn, b = module()
    a = b.create("cuvil.relu", [fn.args[0]])
    c = b.create("cuvil.neg", [a.result])
    b.create("cuvil.return", [c.result])
    a.result.uses.clear()
    err = fails(m, rf"use-list of result #0 misses its use by cuvil.neg #{c.id} in 'cuvil.relu'")
    assert err.op is a


def test_result_dtype_differs_from_inference():
    m, fn, b = module()
    op = b.create("cuvil.relu", [fn.args[0]], result_types=[T(I64, s0, 4)])
    b.create("cuvil.return", [op.result])
    fails(m, r"result 0 has type tensor<s0x4xi64> but its operands give tensor<s0x4xf32> in 'cuvil.relu'")


def test_result_dims_differ_from_inference():
    m, fn, b = module()
    op = b.create("cuvil.relu", [fn.args[0]], result_types=[T(F32, s0, 5)])
    b.create("cuvil.return", [op.result])
    fails(m, r"result 0 has type tensor<s0x5xf32> but its operands give tensor<s0x4xf32>")


def test_equal_symbolic_dims_in_another_form_pass():
    m, fn, b = module([T(F32, 2 * s0, 4)])
    op = b.create("cuvil.relu", [fn.args[0]], result_types=[T(F32, s0 + s0, 4)])
    b.create("cuvil.return", [op.result])
    verify(m)
    op.results[0].type = T(F32, s0 * s0, 4)
    fails(m, "result 0 has type")


def test_result_count_differs():
    m, fn, b = module([T(F32, 6)])
    op = b.create("cuvil.split", [fn.args[0]], {"dim": 0, "sizes": [2, 4]}, result_types=[T(F32, 2)])
    b.create("cuvil.return", [op.result])
    fails(m, "has 1 results but its operands give 2")


def test_infer_failure_is_reported_with_location():
    m, fn, b = module([T(F32, s0, 4), T(F32, 3)])
    op = b.create("cuvil.add", fn.args[:2], result_types=[T(F32, s0, 4)], loc=Loc("model.py", 7))
    b.create("cuvil.return", [op.result])
    fails(m, r"cuvil.add: cannot broadcast tensor<s0x4xf32>, tensor<3xf32>: dim 3 against 4 "
             r"in 'cuvil.add' at model.py:7")


def test_const_data_with_another_type():
    m, fn, b = module()
    op = b.create("cuvil.const", attrs={"name": "fc.w"}, result_types=[T(F32, 8, 4)])
    b.create("cuvil.return", [op.result])
    verify(m)      # no data yet: fine (IR parsed from text)
    m.constants["fc.w"] = torch.zeros(8, 5)
    fails(m, r"constant @fc.w is declared as tensor<8x4xf32> but its data is tensor<8x5xf32>")
    m.constants["fc.w"] = torch.zeros(8, 4, dtype=torch.float16)
    fails(m, r"but its data is tensor<8x4xf16>")
    m.constants["fc.w"] = torch.zeros(8, 4)
    verify(m)


def test_const_must_be_static():
    m, fn, b = module()
    op = b.create("cuvil.const", attrs={"name": "w"}, result_types=[T(F32, s0)])
    b.create("cuvil.return", [op.result])
    fails(m, r"constant @w must have a static type, got tensor<s0xf32>")


def test_undeclared_symbol_in_argument():
    m, fn, b = module([T(F32, s1, 4)])
    b.create("cuvil.return", [fn.args[0]])
    fails(m, r"argument %x has type tensor<s1x4xf32> with symbol s1 not declared in the symbols of @forward")


def test_undeclared_symbol_in_result_and_attribute():
    m, fn, b = module()
    op = b.create("cuvil.full", attrs={"shape": [s1], "value": 0, "dtype": F32})
    b.create("cuvil.return", [op.result])
    fails(m, r"attribute 'shape' uses symbol s1 not declared")
    fn.symbols["s1"] = (1, 4)
    verify(m)
    del fn.symbols["s1"]
    op.attrs["shape"] = [4]
    op.results[0].type = T(F32, s1)
    fails(m, r"result 0 has type tensor<s1xf32> with symbol s1 not declared")


def test_missing_return():
    m, fn, b = module()
    b.create("cuvil.relu", [fn.args[0]])
    fails(m, r"function @forward does not end in cuvil.return in 'cuvil.relu'")
    m.functions["empty"] = Function("empty", [])
    del m.functions["forward"]
    fails(m, r"function @empty does not end in cuvil.return$")


def test_return_in_the_middle():
    m, fn, b = module()
    b.create("cuvil.return", [fn.args[0]])
    b.create("cuvil.return", [fn.args[0]])
    fails(m, "cuvil.return must be the last operation of the function")
