"""The built-in passes, each checked against the reference interpreter on the unoptimised module."""
from __future__ import annotations

import random

import pytest
import torch

from cuvil.errors import CuvilVerifyError
from cuvil.ir import Builder, DType, Function, Module, TensorType, interpret, parse, print_module, verify
from cuvil.passes import PassManager, VerifyEach


def run(module: Module, pipeline: str):
    """Run a pipeline with the verifier after every pass; the records."""
    return PassManager(pipeline, instruments=[VerifyEach()], assume={"verified"}).run(module)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where NaN, and the same sign of zero."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    nan = a.isnan() & b.isnan()
    equal = (a == b) & (a.signbit() == b.signbit())
    return bool((nan | equal).all())


def assert_same_results(before: Module, after: Module, *inputs: torch.Tensor, exact: bool = True) -> None:
    """Bit-identical results, or (exact=False) equal up to float rounding."""
    expected = interpret(before, *inputs)
    actual = interpret(after, *inputs)
    assert len(expected) == len(actual)
    for e, a in zip(expected, actual):
        if exact:
            assert same_bits(e, a), (e, a)
        else:
            torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)


def ops(module: Module, fn: str | None = None) -> list[str]:
    f = module.functions[fn] if fn else module.main
    return [op.name.removeprefix("cuvil.") for op in f.ops]


SPECIAL = torch.tensor([-0.0, 0.0, 1.5, -2.25, float("inf"), float("-inf"), float("nan"), 3.0])


# ----------------------------------------------------------------------------- canonicalize

ALGEBRA = """
cuvil.func @forward(%x: tensor<8xf32>, %i: tensor<8xi64>) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xi64>, tensor<8xi64>) {
  %nz = cuvil.literal {value = -0.0, dtype = f32} : tensor<f32>
  %pz = cuvil.literal {value = 0.0, dtype = f32} : tensor<f32>
  %one = cuvil.literal {value = 1.0, dtype = f32} : tensor<f32>
  %izero = cuvil.literal {value = 0, dtype = i64} : tensor<i64>
  %a = cuvil.add %x, %nz : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  %b = cuvil.add %x, %pz : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  %c = cuvil.sub %x, %pz : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  %d = cuvil.div %x, %one : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  %e = cuvil.mul %x, %pz : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  %f = cuvil.mul %i, %izero : (tensor<8xi64>, tensor<i64>) -> tensor<8xi64>
  %n1 = cuvil.neg %i : tensor<8xi64> -> tensor<8xi64>
  %n2 = cuvil.neg %n1 : tensor<8xi64> -> tensor<8xi64>
  cuvil.return %a, %b, %c, %d, %e, %f, %n2 : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xi64>, tensor<8xi64>
}
"""


def test_canonicalize_identities_are_exact_on_special_values():
    before, after = parse(ALGEBRA), parse(ALGEBRA)
    (record,) = run(after, "canonicalize")
    assert record.statistics == {"add-zero": 1, "div-one": 1, "mul-zero-int": 1, "neg-neg": 1, "sub-zero": 1}
    # x + 0.0 and x * 0.0 stay: they are not the identity on -0.0, inf and NaN.
    assert ops(after) == ["literal", "add", "mul", "full", "return"]
    i = torch.tensor([0, 1, -1, 7, -8, 2 ** 40, -(2 ** 62), 5])
    assert_same_results(before, after, SPECIAL, i)


def test_the_identities_canonicalize_refuses_would_be_wrong():
    """x + 0.0 turns -0.0 into +0.0 and x * 0.0 turns inf into NaN: results differ in bits."""
    m = parse(ALGEBRA)
    x = SPECIAL
    _, b, _, _, e, _, _ = interpret(m, x, torch.zeros(8, dtype=torch.int64))
    assert not same_bits(b, x) and not same_bits(e, torch.zeros(8))


FOLD = """
cuvil.func @forward(%x: tensor<s0x4xf32>) -> (tensor<s0x3xf32>, tensor<s0x3xf32>, tensor<3xf32>) attributes {symbols = {s0 = [1, 16]}} {
  %w = cuvil.const @fc.weight : tensor<3x4xf32>
  %b = cuvil.const @fc.bias : tensor<3xf32>
  %wt = cuvil.permute %w {perm = [1, 0]} : tensor<3x4xf32> -> tensor<4x3xf32>
  %y = cuvil.matmul %x, %wt : (tensor<s0x4xf32>, tensor<4x3xf32>) -> tensor<s0x3xf32>
  %wtt = cuvil.permute %wt {perm = [1, 0]} : tensor<4x3xf32> -> tensor<3x4xf32>
  %z = cuvil.linear %x, %wtt, %b : (tensor<s0x4xf32>, tensor<3x4xf32>, tensor<3xf32>) -> tensor<s0x3xf32>
  %two = cuvil.literal {value = 2.0, dtype = f32} : tensor<f32>
  %b2 = cuvil.mul %b, %two : (tensor<3xf32>, tensor<f32>) -> tensor<3xf32>
  %s = cuvil.sum %wt {dims = [0]} : tensor<4x3xf32> -> tensor<3xf32>
  %bs = cuvil.add %b2, %s : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
  cuvil.return %y, %z, %bs : tensor<s0x3xf32>, tensor<s0x3xf32>, tensor<3xf32>
}
"""


def fold_module() -> Module:
    m = parse(FOLD)
    gen = torch.Generator().manual_seed(1)
    m.constants["fc.weight"] = torch.randn(3, 4, generator=gen)
    m.constants["fc.bias"] = torch.randn(3, generator=gen)
    return m


def test_canonicalize_folds_constants_into_new_named_constants():
    before, after = fold_module(), fold_module()
    records = run(after, "canonicalize,dce")
    # The permute of a permute was removed before folding, so linear uses the weight itself; so
    # does the matmul by the other permute, now a linear of the weight; the scaled bias and the
    # sum (through the chain) are folded, and the permute with them (nothing reads it at run time).
    text = print_module(after)
    assert "%y = cuvil.linear %x, %w :" in text
    assert "%z = cuvil.linear %x, %w, %b" in text
    assert "%bs = cuvil.const @fc.bias.mul.add : tensor<3xf32>" in text
    assert ops(after) == ["const", "const", "linear", "linear", "const", "return"]
    assert records[0].statistics == {"fold-constant": 4, "matmul-of-transpose": 1, "permute-identity": 1,
                                     "permute-permute": 1}
    expected = before.constants["fc.bias"] * 2 + before.constants["fc.weight"].sum(1)
    assert torch.equal(after.constants["fc.bias.mul.add"], expected)
    # dce drops the constants the folds left unreferenced (the folded permute among them), and
    # nothing else.
    assert sorted(after.constants) == ["fc.bias", "fc.bias.mul.add", "fc.weight"]
    assert records[1].statistics == {"ops-removed": 0, "constants-removed": 3}
    # The linear reads the weight transposed, so it may sum in another order: not bit-identical.
    assert_same_results(before, after, torch.randn(5, 4), exact=False)


def test_folded_constant_names_are_unique_and_folding_can_be_off():
    text = """
cuvil.func @forward() -> (tensor<2xf32>, tensor<2xf32>) {
  %w = cuvil.const @w : tensor<2xf32>
  %a = cuvil.neg %w : tensor<2xf32> -> tensor<2xf32>
  %b = cuvil.neg %a : tensor<2xf32> -> tensor<2xf32>
  %c = cuvil.exp %w : tensor<2xf32> -> tensor<2xf32>
  %d = cuvil.exp %c : tensor<2xf32> -> tensor<2xf32>
  %e = cuvil.exp %w : tensor<2xf32> -> tensor<2xf32>
  cuvil.return %d, %e : tensor<2xf32>, tensor<2xf32>
}
"""
    before = parse(text)
    before.constants["w"] = torch.tensor([0.5, -1.0])
    m = parse(text)
    m.constants["w"] = before.constants["w"]
    m.constants["w.exp"] = torch.zeros(3)       # a name already taken
    run(m, "canonicalize")
    # %c = exp(w) and %e = exp(w) get fresh names next to the taken one; %d = exp(%c) derives from %c's.
    assert sorted(m.constants) == ["w", "w.exp", "w.exp.1", "w.exp.1.exp", "w.exp.2"]
    assert torch.equal(m.constants["w.exp.2"], before.constants["w"].exp())
    assert torch.equal(m.constants["w.exp.1.exp"], before.constants["w"].exp().exp())
    assert_same_results(before, m)

    off = parse(text)
    off.constants["w"] = before.constants["w"]
    run(off, "canonicalize{fold-constants=false}")
    assert ops(off) == ["const", "exp", "exp", "exp", "return"]      # neg(neg w) is still removed


def test_a_splat_fold_becomes_a_full_and_nan_does_not():
    text = """
cuvil.func @forward() -> (tensor<2x2xf32>, tensor<2x2xf32>, tensor<2xf32>) {
  %w = cuvil.const @w : tensor<2x2xf32>
  %a = cuvil.mul %w, %w : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
  %n = cuvil.log %w : tensor<2x2xf32> -> tensor<2x2xf32>
  %z = cuvil.const @z : tensor<2xf32>
  %e = cuvil.neg %z : tensor<2xf32> -> tensor<2xf32>
  cuvil.return %a, %n, %e : tensor<2x2xf32>, tensor<2x2xf32>, tensor<2xf32>
}
"""
    m = parse(text)
    m.constants["w"] = torch.full((2, 2), -3.0)
    m.constants["z"] = torch.tensor([0.0, -0.0])     # neg gives [-0.0, 0.0]: not one value bit for bit
    before = parse(text)
    before.constants.update(m.constants)
    run(m, "canonicalize")
    text = print_module(m)
    assert "%a = cuvil.full {shape = [2, 2], value = 9.0, dtype = f32}" in text
    assert "%n = cuvil.const @w.log" in text            # log(-3) is NaN everywhere: not a splat
    assert "%e = cuvil.const @z.neg" in text
    assert_same_results(before, m)


# ----------------------------------------------------------------------------- cse and dce

CSE = """
cuvil.func @forward(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) {
  %u = cuvil.const @u : tensor<4xf32>
  %v = cuvil.const @v : tensor<4xf32>
  %t = cuvil.const @t : tensor<4xf32>
  %a = cuvil.mul %x, %u : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %b = cuvil.mul %v, %x : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %c = cuvil.mul %x, %t : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  cuvil.return %a, %b, %c : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}
"""


def cse_module() -> Module:
    m = parse(CSE)
    shared = torch.tensor([1.0, 2.0, 3.0, 4.0])
    m.constants.update(u=shared, v=shared, t=shared.clone())   # u and v are tied; t only equal
    return m


def test_cse_merges_tied_constants_only_when_aggressive():
    before = cse_module()
    plain = cse_module()
    assert run(plain, "cse")[0].statistics == {"merged": 0}
    aggressive = cse_module()
    assert run(aggressive, "cse{aggressive=true},dce")[0].statistics == {"merged": 2}
    # v merges into u (same memory), then mul(v, x) into mul(x, u) (mul commutes); t stays.
    text = print_module(aggressive)
    assert "cuvil.return %a, %a, %c" in text and "@v" not in text and "@t" in text
    assert sorted(aggressive.constants) == ["t", "u"]
    assert_same_results(before, aggressive, torch.randn(4))


def test_dce_keeps_user_ops_that_are_not_pure():
    from cuvil.ir import custom_op

    @custom_op("passtest.noisy", operands=("x",), tags={"elementwise"}, replace=True)
    def noisy(x):
        return x

    m = Module()
    fn = m.add_function(Function("forward", [TensorType(DType.f32, (4,))], ["x"]))
    b = Builder(fn)
    b("passtest.noisy", fn.args[0])
    b("cuvil.exp", fn.args[0])
    b.create("cuvil.return", [fn.args[0]])
    x = torch.randn(4)
    expected = interpret(m, x)
    assert run(m, "dce")[0].statistics == {"ops-removed": 1, "constants-removed": 0}
    assert ops(m) == ["passtest.noisy", "return"]
    assert same_bits(interpret(m, x)[0], expected[0])


def test_an_op_made_after_an_erase_is_alive_even_at_a_reused_address():
    import gc
    from cuvil.passes.rewrite import Rewriter
    m = Module()
    fn = m.add_function(Function("forward", [TensorType(DType.f32, (4,))], ["x"]))
    b = Builder(fn)
    dead = [b("cuvil.exp", fn.args[0]).owner for _ in range(300)]
    ret = b.create("cuvil.return", [fn.args[0]])
    rw = Rewriter(m, fn)
    addresses = {id(op) for op in dead}
    assert sum(rw.erase_dead(op) for op in dead) == 300
    del dead
    gc.collect()        # an op and its result refer to each other: only the collector frees them
    # CPython hands freed ops' memory to later objects: some of the new ops land there (in a full
    # test run other free blocks of that size may come first, so make more until some do)
    made = []
    for _ in range(30):
        made += [rw.create(ret, "cuvil.neg", [fn.args[0]]) for _ in range(300)]
        if any(id(op) in addresses for op in made):
            break
    assert any(id(op) in addresses for op in made)
    assert all(rw.alive(op) for op in made)


def test_verify_pass_reports_invalid_ir_and_provides_verified():
    m = parse(CSE)
    records = PassManager("verify,cse").run(m)        # cse requires what verify provides
    assert [r.changed for r in records] == [False, False]
    m.main.ops[3].attrs["extra"] = 1
    with pytest.raises(CuvilVerifyError, match="unknown attribute 'extra' \\(known: none\\) in 'cuvil.mul'"):
        PassManager("verify").run(m)


# ----------------------------------------------------------------------------- shape-infer

def test_shape_infer_rederives_types_from_new_argument_types():
    text = """
cuvil.func @forward(%x: tensor<s0x6xf32>) -> tensor<3xs0xf32> attributes {symbols = {s0 = [1, 32]}} {
  %w = cuvil.const @w : tensor<6xf32>
  %a = cuvil.add %x, %w : (tensor<s0x6xf32>, tensor<6xf32>) -> tensor<s0x6xf32>
  %r = cuvil.reshape %a {shape = [-1, 2, 3]} : tensor<s0x6xf32> -> tensor<s0x2x3xf32>
  %s = cuvil.sum %r {dims = [1]} : tensor<s0x2x3xf32> -> tensor<s0x3xf32>
  %p = cuvil.permute %s {perm = [1, 0]} : tensor<s0x3xf32> -> tensor<3xs0xf32>
  cuvil.return %p : tensor<3xs0xf32>
}
"""
    m = parse(text)
    m.constants["w"] = torch.arange(6.0)
    x = torch.randn(4, 6)
    (expected,) = interpret(m, x)
    assert run(m, "shape-infer")[0].statistics == {"ops": 4, "result-types-changed": 0}

    m.main.args[0].type = TensorType(DType.f32, (4, 6))      # specialise the dynamic dim
    record, _ = PassManager("shape-infer,verify").run(m)     # the input is stale until shape-infer ran
    assert record.changed and record.statistics == {"ops": 4, "result-types-changed": 4}
    assert [str(op.results[0].type) for op in m.main.ops[1:-1]] == [
        "tensor<4x6xf32>", "tensor<4x2x3xf32>", "tensor<4x3xf32>", "tensor<3x4xf32>"]
    (out,) = interpret(m, x)
    assert torch.equal(out, expected)


def test_shape_infer_reports_an_op_that_no_longer_fits():
    m = parse("""
cuvil.func @forward(%x: tensor<4xf32>) -> tensor<4xf32> {
  %s = cuvil.silu %x : tensor<4xf32> -> tensor<4xf32>
  cuvil.return %s : tensor<4xf32>
}
""")
    m.main.args[0].type = TensorType(DType.i64, (4,))
    with pytest.raises(CuvilVerifyError, match="shape inference failed: x must be a floating-point tensor, "
                                               "got tensor<4xi64> in 'cuvil.silu'"):
        PassManager("shape-infer").run(m)


# ----------------------------------------------------------------------------- O1 on random programs

def random_program(rng: random.Random) -> Module:
    """A chain of 12 random ops over x: 2x3x4 f32, built to give the canonicalizer, cse and dce
    something to do (identities, view round trips, duplicates, dead values)."""
    m = Module()
    fn = m.add_function(Function("forward", [TensorType(DType.f32, (2, 3, 4))], ["x"]))
    b = Builder(fn)
    values = [fn.args[0]]
    shapes = [[24], [2, 12], [4, 6], [2, 3, 4], [6, 4], [3, 8], [2, 2, 6]]

    def literal(v):
        return b("cuvil.literal", value=v, dtype=DType.f32)

    for _ in range(12):
        x = rng.choice(values[-3:])
        kind = rng.randrange(9)
        if kind == 0:
            y = b(rng.choice(["cuvil.neg", "cuvil.relu", "cuvil.exp", "cuvil.tanh"]), x)
        elif kind == 1:
            y = b("cuvil.add", x, literal(rng.choice([-0.0, 0.0, 1.0])))
        elif kind == 2:
            y = b(rng.choice(["cuvil.mul", "cuvil.div"]), x, literal(rng.choice([1.0, 2.0, 0.0])))
        elif kind == 3:
            y = b("cuvil.reshape", x, shape=rng.choice(shapes))
        elif kind == 4:
            perm = list(range(x.type.rank))
            rng.shuffle(perm)
            y = b("cuvil.permute", x, perm=perm)
        elif kind == 5:
            mid = rng.choice([DType.f32, DType.f16, DType.i32])
            y = b("cuvil.cast", b("cuvil.cast", x, dtype=mid), dtype=DType.f32)
        elif kind == 6:
            d = rng.randrange(x.type.rank + 1)
            y = b("cuvil.squeeze", b("cuvil.unsqueeze", x, dim=d), dims=[d])
        elif kind == 7:
            producer = x.owner if not x.is_arg else None
            if producer is None or not producer.operands:
                continue
            y = b.create(producer.name, producer.operands, dict(producer.attrs)).results[0]   # a duplicate
        else:
            same = [v for v in values if v.type == x.type]
            y = b("cuvil.add", x, rng.choice(same))
        values.append(y)
    b.create("cuvil.return", [values[-1], rng.choice(values)])
    verify(m)
    return m


@pytest.mark.parametrize("seed", range(25))
def test_o1_keeps_results_bit_identical_on_random_programs(seed):
    before = random_program(random.Random(seed))
    after = random_program(random.Random(seed))
    records = run(after, "O1")
    assert len(after.main.ops) <= len(before.main.ops)
    x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(seed))
    x.view(-1)[:8] = SPECIAL
    assert_same_results(before, after, x)
    assert all(r.skipped is None for r in records)
