"""fold-batchnorm and fold-constants: the zoo CNNs folded and run by the interpreter and natively
against eager PyTorch, the folded arithmetic against an fp64 computation, and cuvil-opt's
--random-constants."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cuvil
from cuvil import zoo
from cuvil.compiler import compile_module
from cuvil.errors import CuvilPassError
from cuvil.ir import Builder, DType, Function, Module, TensorType, interpret, parse
from cuvil.ir.interpreter import random_constants
from cuvil.passes import PassManager, VerifyEach
from cuvil.tools.cuvil_opt import main as cuvil_opt

FOLDING = "verify,shape-infer,fold-constants,fold-batchnorm,canonicalize,cse,dce"


@pytest.fixture(scope="module", autouse=True)
def _private_cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUVIL_CACHE_DIR", str(tmp_path_factory.mktemp("cuvil-cache")))
        yield


def op_names(module: Module) -> list[str]:
    return [op.name for op in module.main.ops]


def statistics(compilation, name: str) -> dict:
    return next(p["statistics"] for p in compilation.report.passes if p["name"] == name)


# ----------------------------------------------------------------------------- the zoo CNNs

@pytest.fixture(scope="module", params=["cnn", "resnet"])
def folded(request):
    entry = zoo.get(request.param)
    module = cuvil.import_model(entry.model, entry.example_inputs, dynamic=entry.dynamic,
                                ranges=entry.ranges).module
    assert "cuvil.batch_norm" in op_names(module)
    return entry, compile_module(module, pipeline=FOLDING, name=request.param), module


def test_every_batch_norm_is_folded_into_its_conv(folded):
    entry, compilation, module = folded
    layers = list(entry.model.modules())
    convs = [m for m in layers if isinstance(m, (nn.Conv2d, nn.Linear))]
    norms = [m for m in layers if isinstance(m, nn.BatchNorm2d)]
    # in these models every conv has a bias or a batch norm after it (never both), so after folding
    # each conv and linear reads exactly two constants: its weight and its bias
    assert len(norms) + sum(m.bias is not None for m in convs) == len(convs)
    assert statistics(compilation, "fold-batchnorm") == {"folded": len(norms), "affine": 0, "skipped": {}}
    names = op_names(module)
    assert "cuvil.batch_norm" not in names
    assert names.count("cuvil.const") == 2 * len(convs) == len(module.constants)
    assert sum(name.endswith(".bn_folded") for name in module.constants) == 2 * len(norms)


@pytest.mark.parametrize("batch", [1, 5])
def test_folded_model_matches_eager_in_the_interpreter_and_natively(folded, batch):
    entry, compilation, module = folded
    (x,) = entry.inputs(batch=batch)
    with torch.no_grad():
        eager = entry.model(x)
    torch.testing.assert_close(interpret(module, x)[0], eager)
    torch.testing.assert_close(compilation.native(x)[0], eager)


# ----------------------------------------------------------------------------- fold-batchnorm arithmetic

def conv_bn_module(with_bias: bool, affine: bool, groups: int = 1) -> Module:
    fn = Function("forward", [TensorType(DType.f32, (2, 4, 6, 6))], ["x"])
    b = Builder(fn)

    def const(name, shape):
        return b.create("cuvil.const", attrs={"name": name}, result_types=[TensorType(DType.f32, shape)]).result

    conv_operands = [fn.args[0], const("conv.weight", (8, 4 // groups, 3, 3))]
    if with_bias:
        conv_operands.append(const("conv.bias", (8,)))
    y = b.create("cuvil.conv2d", conv_operands, {"padding": [1, 1], "groups": groups}).result
    stats = [const("bn.mean", (8,)), const("bn.var", (8,))]
    if affine:
        stats += [const("bn.weight", (8,)), const("bn.bias", (8,))]
    out = b.create("cuvil.batch_norm", [y, *stats], {"eps": 1e-3}).result
    b.create("cuvil.return", [out])
    module = Module({"forward": fn})
    module.constants = random_constants(module, seed=3)
    module.constants["bn.var"] = module.constants["bn.var"].abs() + 0.1
    return module


@pytest.mark.parametrize("with_bias,affine,groups", [(False, True, 1), (True, True, 2), (True, False, 4)])
def test_folded_conv_matches_an_fp64_batch_norm(with_bias, affine, groups):
    module = conv_bn_module(with_bias, affine, groups)
    x = torch.randn(2, 4, 6, 6)
    c = {k: v.double() for k, v in module.constants.items()}
    y = F.conv2d(x.double(), c["conv.weight"], c.get("conv.bias"), padding=1, groups=groups)
    ref = F.batch_norm(y, c["bn.mean"], c["bn.var"], c.get("bn.weight"), c.get("bn.bias"), training=False, eps=1e-3)
    records = PassManager("fold-batchnorm", instruments=[VerifyEach()], assume={"verified"}).run(module)
    assert records[0].statistics == {"folded": 1, "affine": 0, "skipped": {}}
    assert [n.removeprefix("cuvil.") for n in op_names(module)] == ["const", "const", "conv2d", "return"]
    torch.testing.assert_close(interpret(module, x)[0].double(), ref, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- fold-constants

WEIGHT_MATH = """
cuvil.func @forward(%x: tensor<s0x8xf32>) -> tensor<s0x4xf32> attributes {symbols = {s0 = [1, 16]}} {
  %w = cuvil.const @w : tensor<4x8xf32>
  %s = cuvil.const @s : tensor<4xf32>
  %e = cuvil.exp %s : tensor<4xf32> -> tensor<4xf32>
  %u = cuvil.unsqueeze %e {dim = 1} : tensor<4xf32> -> tensor<4x1xf32>
  %ws = cuvil.mul %w, %u : (tensor<4x8xf32>, tensor<4x1xf32>) -> tensor<4x8xf32>
  %r = cuvil.arange {end = [4], dtype = i64} : tensor<4xi64>
  %rf = cuvil.cast %r {dtype = f32} : tensor<4xi64> -> tensor<4xf32>
  %y = cuvil.linear %x, %ws, %rf : (tensor<s0x8xf32>, tensor<4x8xf32>, tensor<4xf32>) -> tensor<s0x4xf32>
  cuvil.return %y : tensor<s0x4xf32>
}
"""


def test_fold_constants_keeps_the_results_and_adds_only_the_frontier():
    module = parse(WEIGHT_MATH)
    module.constants = random_constants(module)
    x = torch.randn(3, 8)
    expected = interpret(module, x)[0]
    records = PassManager("fold-constants,dce", instruments=[VerifyEach()], assume={"verified"}).run(module)
    assert records[0].statistics == {"folded-ops": 4, "new-constants": 2, "new-splats": 0, "bytes": 4 * (32 + 4),
                                     "skipped": {}}
    assert [n.removeprefix("cuvil.") for n in op_names(module)] == ["const", "const", "linear", "return"]
    assert sorted(module.constants) == ["folded.cast", "w.mul"]
    assert torch.equal(interpret(module, x)[0], expected)   # the same fp32 ops, evaluated earlier


def test_fold_constants_reports_an_op_that_fails_on_its_constants():
    module = parse("""
cuvil.func @forward() -> tensor<2xf32> {
  %t = cuvil.const @table : tensor<4xf32>
  %i = cuvil.const @idx : tensor<2xi64>
  %g = cuvil.index_select %t, %i {dim = 0} : (tensor<4xf32>, tensor<2xi64>) -> tensor<2xf32>
  cuvil.return %g : tensor<2xf32>
}
""")
    module.constants = {"table": torch.zeros(4), "idx": torch.tensor([1, 9])}
    with pytest.raises(CuvilPassError, match="fold-constants: evaluating cuvil.index_select .*failed"):
        PassManager("fold-constants", assume={"verified"}).run(module)


def test_cuvil_opt_random_constants_gives_the_interpreters_data(tmp_path, capsys):
    text = """
cuvil.func @forward() -> tensor<f32> {
  %w = cuvil.const @w : tensor<3x5xf32>
  %s = cuvil.sum %w : tensor<3x5xf32> -> tensor<f32>
  cuvil.return %s : tensor<f32>
}
"""
    path = tmp_path / "sum.cvl"
    path.write_text(text)
    assert cuvil_opt([str(path), "-p", "fold-constants"]) == 0
    assert "cuvil.sum %w" in capsys.readouterr().out          # no data: nothing to fold
    assert cuvil_opt([str(path), "--random-constants", "-p", "fold-constants"]) == 0
    folded = parse(capsys.readouterr().out)
    (literal,) = [op for op in folded.main.ops if op.name == "cuvil.literal"]
    assert literal.attrs["value"] == random_constants(parse(text))["w"].sum().item()
