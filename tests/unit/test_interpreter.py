"""The reference interpreter: symbol binding, input checks, constants, per-op result checks."""
import numpy as np
import pytest
import torch

from cuvil.errors import CuvilError
from cuvil.ir import Builder, DType, Function, Loc, Module, TensorType, interpret, parse, sym, verify
from cuvil.ir.interpreter import random_constants

F32, I64 = DType.f32, DType.i64
s0, s1 = sym("s0"), sym("s1")


def T(dtype, *shape):
    return TensorType(dtype, shape)


def mlp_module():
    """forward(x: s0x4, y: s0x(2*s1)) -> relu(linear(x)) and y * 2, with a weight constant."""
    fn = Function("forward", [T(F32, s0, 4), T(F32, s0, 2 * s1), T(F32, s1)], ["x", "y", "z"],
                  symbols={"s0": (1, 64), "s1": (1, 8)})
    b = Builder(fn)
    w = b.create("cuvil.const", attrs={"name": "fc.weight"}, result_types=[T(F32, 3, 4)]).result
    h = b("cuvil.relu", b("cuvil.linear", fn.args[0], w))
    two = b("cuvil.literal", value=2.0, dtype=F32)
    b.create("cuvil.return", [h, b("cuvil.mul", fn.args[1], two)])
    m = Module(constants={"fc.weight": torch.randn(3, 4, generator=torch.Generator().manual_seed(0))})
    m.add_function(fn)
    verify(m)
    return m


@pytest.mark.parametrize("n,k", [(1, 1), (3, 2), (17, 8)])
def test_dynamic_dims_bind_to_each_call(n, k):
    m = mlp_module()
    x, y, z = torch.randn(n, 4), torch.randn(n, 2 * k), torch.randn(k)
    h, y2 = interpret(m, x, y, z)
    w = m.constants["fc.weight"].numpy()
    np.testing.assert_allclose(h.numpy(), np.maximum(x.numpy() @ w.T, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(y2.numpy(), y.numpy() * 2)


def test_wrong_number_of_inputs():
    with pytest.raises(CuvilError, match="@forward takes 3 inputs, got 1"):
        interpret(mlp_module(), torch.randn(2, 4))


def test_input_not_a_tensor():
    with pytest.raises(CuvilError, match=r"input 2 \(%z\) must be a torch.Tensor of type tensor<s1xf32>, got list"):
        interpret(mlp_module(), torch.randn(2, 4), torch.randn(2, 2), [1.0])


def test_input_dtype():
    with pytest.raises(CuvilError, match=r"input 0 \(%x\) has dtype torch.float64, expected torch.float32"):
        interpret(mlp_module(), torch.randn(2, 4, dtype=torch.float64), torch.randn(2, 2), torch.randn(1))


def test_input_rank():
    with pytest.raises(CuvilError, match=r"input 0 \(%x\) has rank 1 \(shape \[4\]\), expected 2"):
        interpret(mlp_module(), torch.randn(4), torch.randn(2, 2), torch.randn(1))


def test_static_dim_mismatch():
    with pytest.raises(CuvilError, match=r"dim 1 of input 0 \(%x\) is 5, expected 4 for type tensor<s0x4xf32>"):
        interpret(mlp_module(), torch.randn(2, 5), torch.randn(2, 2), torch.randn(1))


def test_symbol_bound_by_an_earlier_input_must_agree():
    with pytest.raises(CuvilError, match=r"dim 0 of input 1 \(%y\) is 3, expected 2 \(s0\)"):
        interpret(mlp_module(), torch.randn(2, 4), torch.randn(3, 2), torch.randn(1))


def test_compound_dim_checked_after_binding():
    # s1 is bound by %z (its only whole-symbol dim), then %y's dim 1 must be 2*s1
    with pytest.raises(CuvilError, match=r"dim 1 of input 1 \(%y\) is 5, expected 6 \(2\*s1\)"):
        interpret(mlp_module(), torch.randn(2, 4), torch.randn(2, 5), torch.randn(3))


def test_symbol_out_of_range():
    with pytest.raises(CuvilError, match=r"symbol s1 = 9 \(from dim 0 of input 2 \(%z\)\) is outside its range \[1, 8\]"):
        interpret(mlp_module(), torch.randn(2, 4), torch.randn(2, 18), torch.randn(9))


def test_symbol_only_in_a_compound_dim_cannot_be_bound():
    fn = Function("forward", [T(F32, s0 + 1)], ["x"], symbols={"s0": (1, 8)})
    b = Builder(fn)
    b.create("cuvil.return", [b("cuvil.neg", fn.args[0])])
    m = Module()
    m.add_function(fn)
    with pytest.raises(CuvilError, match=r"dim 0 of input 0 \(%x\) is s0 \+ 1: symbol s0 is not the whole of any"):
        interpret(m, torch.randn(3))


def test_constant_without_data():
    m = mlp_module()
    data = m.constants.pop("fc.weight")
    args = torch.randn(2, 4), torch.randn(2, 2), torch.randn(1)
    with pytest.raises(CuvilError, match=r"constant @fc.weight has no data .* constants=\{'fc.weight': tensor\}"):
        interpret(m, *args)
    h, _ = interpret(m, *args, constants={"fc.weight": data})
    np.testing.assert_allclose(h.numpy(), np.maximum(args[0].numpy() @ data.numpy().T, 0), rtol=1e-5, atol=1e-6)


def test_constants_argument_overrides_module_data():
    m = mlp_module()
    args = torch.randn(2, 4), torch.randn(2, 2), torch.randn(1)
    h, _ = interpret(m, *args, constants={"fc.weight": torch.zeros(3, 4)})
    assert torch.count_nonzero(h) == 0


PARSED = """
cuvil.func @forward(%x: tensor<s0x4xf32>, %i: tensor<s0xi64>) -> (tensor<s0x8xf32>, tensor<s0x2xf32>) attributes {symbols = {s0 = [1, 64]}} {
  %w = cuvil.const @fc.weight : tensor<8x4xf32>
  %e = cuvil.const @emb : tensor<4x2xf32>
  %m = cuvil.const @mask : tensor<8xi1>
  %0 = cuvil.linear %x, %w : (tensor<s0x4xf32>, tensor<8x4xf32>) -> tensor<s0x8xf32>
  %z = cuvil.full {shape = [s0, 8], value = 0.0, dtype = f32} : tensor<s0x8xf32>
  %1 = cuvil.where %m, %0, %z : (tensor<8xi1>, tensor<s0x8xf32>, tensor<s0x8xf32>) -> tensor<s0x8xf32>
  %2 = cuvil.embedding %e, %i : (tensor<4x2xf32>, tensor<s0xi64>) -> tensor<s0x2xf32>
  cuvil.return %1, %2 : tensor<s0x8xf32>, tensor<s0x2xf32>
}
"""


def test_random_constants_run_parsed_ir():
    m = parse(PARSED)
    consts = random_constants(m, seed=3)
    assert consts["fc.weight"].dtype == torch.float32 and consts["fc.weight"].shape == (8, 4)
    assert consts["mask"].dtype == torch.bool and consts["emb"].shape == (4, 2)
    x, i = torch.randn(5, 4), torch.tensor([0, 3, 1, 1, 2])
    masked, emb = interpret(m, x, i, constants=consts)
    ref = np.where(consts["mask"].numpy(), x.numpy() @ consts["fc.weight"].numpy().T, 0)
    np.testing.assert_allclose(masked.numpy(), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(emb.numpy(), consts["emb"].numpy()[i.numpy()])


def test_random_constants_are_deterministic():
    m = parse(PARSED)
    a, b, c = random_constants(m), random_constants(parse(PARSED)), random_constants(m, seed=1)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["fc.weight"], c["fc.weight"])
    ints = random_constants(parse("""
cuvil.func @f() -> tensor<64xi32> {
  %c = cuvil.const @table : tensor<64xi32>
  cuvil.return %c : tensor<64xi32>
}"""))
    assert ints["table"].dtype == torch.int32 and set(ints["table"].tolist()) == {0, 1, 2, 3}


def test_pick_function_by_name():
    m = mlp_module()
    fn = Function("double", [T(F32, 2)], ["a"])
    b = Builder(fn)
    b.create("cuvil.return", [b("cuvil.add", fn.args[0], fn.args[0])])
    m.add_function(fn)
    (out,) = interpret(m, torch.tensor([1.0, 2.0]), function="double")
    assert out.tolist() == [2.0, 4.0]
    (out,) = interpret(m, torch.tensor([1.0, 2.0]), function=fn)
    assert out.tolist() == [2.0, 4.0]
    with pytest.raises(CuvilError, match=r"no function @triple in the module \(has: forward, double\)"):
        interpret(m, function="triple")


def test_runtime_failure_names_the_op_and_location():
    fn = Function("forward", [T(F32, 4, 2), T(I64, 3)], ["w", "i"])
    b = Builder(fn)
    op = b.create("cuvil.embedding", fn.args, loc=Loc("model.py", 12))
    b.create("cuvil.return", [op.result])
    m = Module()
    m.add_function(fn)
    with pytest.raises(CuvilError, match=rf"evaluating cuvil.embedding #{op.id} at model.py:12 failed: IndexError"):
        interpret(m, torch.randn(4, 2), torch.tensor([0, 7, 1]))


def test_result_that_contradicts_its_type_is_caught():
    fn = Function("forward", [T(F32, 3)], ["x"])
    b = Builder(fn)
    op = b.create("cuvil.neg", fn.args, result_types=[T(F32, 4)])   # a wrong type, as a buggy pass might leave
    b.create("cuvil.return", [op.result])
    m = Module()
    m.add_function(fn)
    with pytest.raises(CuvilError, match=r"cuvil.neg #\d+ produced torch.float32 \[3\], but its type tensor<4xf32> "
                                         r"says torch.float32 \[4\]"):
        interpret(m, torch.randn(3))


def test_symbolic_attributes_are_substituted():
    fn = Function("forward", [T(F32, s0, 6)], ["x"], symbols={"s0": (1, 32)})
    b = Builder(fn)
    r = b("cuvil.reshape", fn.args[0], shape=[3 * s0, 2])
    sl = b("cuvil.slice", r, dim=0, start=[1], end=[s0 + 1])
    b.create("cuvil.return", [sl])
    m = Module()
    m.add_function(fn)
    verify(m)
    for n in (1, 4):
        x = torch.randn(n, 6)
        (out,) = interpret(m, x)
        np.testing.assert_array_equal(out.numpy(), x.numpy().reshape(3 * n, 2)[1:n + 1])


def test_unverified_use_before_definition_is_a_clear_error():
    fn = Function("forward", [T(F32, 3)], ["x"])
    b = Builder(fn)
    a = b.create("cuvil.neg", fn.args)
    c = b.create("cuvil.abs", [a.result])
    b.create("cuvil.return", [c.result])
    fn.ops[0], fn.ops[1] = fn.ops[1], fn.ops[0]
    m = Module()
    m.add_function(fn)
    with pytest.raises(CuvilError, match=rf"cuvil.abs #{c.id} uses a value before it is defined"):
        interpret(m, torch.randn(3))
