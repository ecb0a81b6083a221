"""Printer and parser of the graph IR text: round trips over every op, structure checks, and a
table of malformed inputs with their exact error positions."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import sympy

from cuvil.errors import CuvilParseError
from cuvil.ir import (Builder, DType, Function, Loc, Module, OpDef, TensorType, optional, parse, parse_file,
                      print_function, print_module, register_op, required, sym, OP_REGISTRY)
from cuvil.ir.ops import builtin_ops
from cuvil.ir.printer import attr_value_str, print_op, value_names

UNARY = ["neg", "abs", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos", "tan", "atan", "asin", "acos",
         "sinh", "cosh", "asinh", "acosh", "atanh", "tanh", "sigmoid", "relu", "silu", "erf", "reciprocal", "floor", "ceil", "round", "trunc", "sign"]
ARITH = ["add", "sub", "mul", "div", "pow", "atan2", "maximum", "minimum", "floor_div", "remainder", "fmod"]
COMPARE = ["eq", "ne", "lt", "le", "gt", "ge"]


def _unary_chain() -> str:
    lines = ["cuvil.func @unary(%x: tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<2x3xi1>) {"]
    prev = "%x"
    for i, name in enumerate(UNARY):
        lines.append(f"  %{i} = cuvil.{name} {prev} : tensor<2x3xf32> -> tensor<2x3xf32>")
        prev = f"%{i}"
    n = len(UNARY)
    lines.append(f"  %{n} = cuvil.logical_not {prev} : tensor<2x3xf32> -> tensor<2x3xi1>")
    lines.append(f"  cuvil.return {prev}, %{n} : tensor<2x3xf32>, tensor<2x3xi1>")
    return "\n".join(lines) + "\n}\n"


def _binary_ops() -> str:
    """Every binary elementwise op, broadcasting a row against a matrix."""
    f, row, b, i = "tensor<2x3xf32>", "tensor<3xf32>", "tensor<2x3xi1>", "tensor<2x3xi32>"
    lines = [f"cuvil.func @binary(%a: {f}, %b: {row}, %p: {b}, %q: {b}, %m: {i}, %n: {i}) -> ({f}, {b}, {i}) {{"]
    k = 0
    for name in ARITH:
        lines.append(f"  %{k} = cuvil.{name} %a, %b : ({f}, {row}) -> {f}")
        k += 1
    for name in COMPARE:
        lines.append(f"  %{k} = cuvil.{name} %a, %b : ({f}, {row}) -> {b}")
        k += 1
    for name in ["logical_and", "logical_or"]:
        lines.append(f"  %{k} = cuvil.{name} %p, %q : ({b}, {b}) -> {b}")
        k += 1
    for name in ["bitwise_and", "bitwise_or", "bitwise_xor"]:
        lines.append(f"  %{k} = cuvil.{name} %m, %n : ({i}, {i}) -> {i}")
        k += 1
    lines.append(f"  %{k} = cuvil.where %p, %a, %b : ({b}, {f}, {row}) -> {f}")
    lines.append(f"  cuvil.return %{k}, %{k - 4}, %{k - 1} : {f}, {b}, {i}")
    return "\n".join(lines) + "\n}\n"


SOURCES = """\
cuvil.func @sources() -> (tensor<64x32xf32>, tensor<f32>, tensor<2x3xi64>, tensor<10xi64>, tensor<4xf32>, tensor<f32>) {
  %w = cuvil.const @encoder.layers.0.weight : tensor<64x32xf32>
  %0 = cuvil.literal {value = 2.5, dtype = f32} : tensor<f32>
  %1 = cuvil.full {shape = [2, 3], value = 0, dtype = i64} : tensor<2x3xi64>
  %2 = cuvil.arange {end = [10], dtype = i64} : tensor<10xi64>
  %3 = cuvil.arange {start = 1.0, end = [3], step = 0.5, dtype = f32} : tensor<4xf32>
  %4 = cuvil.const @"weights/odd name" : tensor<f32>
  cuvil.return %w, %0, %1, %2, %3, %4 : tensor<64x32xf32>, tensor<f32>, tensor<2x3xi64>, tensor<10xi64>, tensor<4xf32>, tensor<f32>
}
"""

SYMBOLIC_SOURCES = """\
cuvil.func @"dynamic sources"(%x: tensor<s0x(2*s1)xf32>) -> (tensor<s0x4xf32>, tensor<s1xi64>, tensor<s0x(2*s1)xf32>, tensor<i64>) attributes {symbols = {s0 = [1, 64], s1 = [2, 9223372036854775807]}} {
  %0 = cuvil.full {shape = [s0, 4], value = -inf, dtype = f32} : tensor<s0x4xf32>
  %1 = cuvil.arange {end = [s1], dtype = i64} : tensor<s1xi64>
  %2 = cuvil.literal {value = true, dtype = i1} : tensor<i1>
  %3 = cuvil.where %2, %x, %x : (tensor<i1>, tensor<s0x(2*s1)xf32>, tensor<s0x(2*s1)xf32>) -> tensor<s0x(2*s1)xf32>
  %4 = cuvil.size {size = [1 + s0], dtype = i64} : tensor<i64>
  cuvil.return %0, %1, %3, %4 : tensor<s0x4xf32>, tensor<s1xi64>, tensor<s0x(2*s1)xf32>, tensor<i64>
}
"""

ELEMENTWISE_ATTRS = """\
cuvil.func @elementwise_attrs(%x: tensor<8xf32>, %i: tensor<8xi64>) -> (tensor<8xf16>, tensor<8xi64>) {
  %0 = cuvil.gelu %x : tensor<8xf32> -> tensor<8xf32>
  %1 = cuvil.gelu %0 {approximate = "tanh"} : tensor<8xf32> -> tensor<8xf32>
  %2 = cuvil.clamp %1 {min = 0.0} : tensor<8xf32> -> tensor<8xf32>
  %3 = cuvil.clamp %2 {min = -1e-05, max = 1e+30} : tensor<8xf32> -> tensor<8xf32>
  %4 = cuvil.cast %3 {dtype = f16} : tensor<8xf32> -> tensor<8xf16>
  %5 = cuvil.clamp %i {max = 3} : tensor<8xi64> -> tensor<8xi64>
  cuvil.return %4, %5 : tensor<8xf16>, tensor<8xi64>
}
"""

REDUCTIONS = """\
cuvil.func @reductions(%x: tensor<s0x16x8xf32>) -> (tensor<s0x1x8xf32>, tensor<f32>, tensor<s0xi64>, tensor<i64>) attributes {symbols = {s0 = [1, 128]}} {
  %0 = cuvil.sum %x {dims = [1], keepdim = true} : tensor<s0x16x8xf32> -> tensor<s0x1x8xf32>
  %1 = cuvil.mean %x : tensor<s0x16x8xf32> -> tensor<f32>
  %2 = cuvil.amax %x {dims = [1, 2]} : tensor<s0x16x8xf32> -> tensor<s0xf32>
  %3 = cuvil.amin %2 {dims = [0]} : tensor<s0xf32> -> tensor<f32>
  %4 = cuvil.prod %x {dims = [2]} : tensor<s0x16x8xf32> -> tensor<s0x16xf32>
  %5 = cuvil.var %4 {dims = [1], correction = 0.0} : tensor<s0x16xf32> -> tensor<s0xf32>
  %6 = cuvil.argmax %4 {dim = 1} : tensor<s0x16xf32> -> tensor<s0xi64>
  %7 = cuvil.argmin %x : tensor<s0x16x8xf32> -> tensor<i64>
  %8 = cuvil.softmax %x {dim = 2} : tensor<s0x16x8xf32> -> tensor<s0x16x8xf32>
  %9 = cuvil.log_softmax %8 {dim = 0} : tensor<s0x16x8xf32> -> tensor<s0x16x8xf32>
  %10 = cuvil.cumsum %9 {dim = 1} : tensor<s0x16x8xf32> -> tensor<s0x16x8xf32>
  %11 = cuvil.sum %10 {dims = [1], keepdim = true} : tensor<s0x16x8xf32> -> tensor<s0x1x8xf32>
  %12 = cuvil.add %11, %0 : (tensor<s0x1x8xf32>, tensor<s0x1x8xf32>) -> tensor<s0x1x8xf32>
  %13 = cuvil.add %1, %3 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %14 = cuvil.argmax %5 {dim = 0} : tensor<s0xf32> -> tensor<i64>
  %15 = cuvil.cumprod %4 {dim = 1} : tensor<s0x16xf32> -> tensor<s0x16xf32>
  %16 = cuvil.logcumsumexp %15 {dim = 1} : tensor<s0x16xf32> -> tensor<s0x16xf32>
  %17 = cuvil.cummax %16 {dim = 0} : tensor<s0x16xf32> -> tensor<s0x16xf32>
  %18 = cuvil.cummin %17 {dim = 1} : tensor<s0x16xf32> -> tensor<s0x16xf32>
  %19 = cuvil.cumargmax %18 {dim = 1} : tensor<s0x16xf32> -> tensor<s0x16xi64>
  %20 = cuvil.cumargmin %4 {dim = 0} : tensor<s0x16xf32> -> tensor<s0x16xi64>
  %21 = cuvil.argtopk %4 {k = 3, dim = 1, order = "topk"} : tensor<s0x16xf32> -> tensor<s0x3xi64>
  %22 = cuvil.argtopk %x {dim = 2, largest = false} : tensor<s0x16x8xf32> -> tensor<s0x16x8xi64>
  cuvil.return %12, %13, %6, %7 : tensor<s0x1x8xf32>, tensor<f32>, tensor<s0xi64>, tensor<i64>
}
"""

NN = """\
cuvil.func @nn(%x: tensor<s0x3x17x17xf32>, %tokens: tensor<s0x5xi64>, %q: tensor<s0x2x5x8xf32>) -> (tensor<s0x6x3x3xf32>, tensor<s0x5x12xf32>, tensor<s0x2x5x8xf32>) attributes {symbols = {s0 = [1, 32]}} {
  %conv.weight = cuvil.const @conv.weight : tensor<6x3x3x3xf32>
  %conv.bias = cuvil.const @conv.bias : tensor<6xf32>
  %grouped.weight = cuvil.const @grouped.weight : tensor<6x2x1x1xf32>
  %bn.mean = cuvil.const @bn.running_mean : tensor<6xf32>
  %bn.var = cuvil.const @bn.running_var : tensor<6xf32>
  %emb = cuvil.const @embedding.weight : tensor<100x12xf32>
  %lin.weight = cuvil.const @lin.weight : tensor<12x12xf32>
  %ln.weight = cuvil.const @ln.weight : tensor<12xf32>
  %0 = cuvil.conv2d %x, %conv.weight, %conv.bias {stride = [2, 2], padding = [1, 1], dilation = [2, 2]} : (tensor<s0x3x17x17xf32>, tensor<6x3x3x3xf32>, tensor<6xf32>) -> tensor<s0x6x8x8xf32> loc("net.py":10)
  %1 = cuvil.conv2d %0, %grouped.weight {groups = 3} : (tensor<s0x6x8x8xf32>, tensor<6x2x1x1xf32>) -> tensor<s0x6x8x8xf32> loc("net.py":11:5)
  %2 = cuvil.batch_norm %1, %bn.mean, %bn.var {eps = 0.001} : (tensor<s0x6x8x8xf32>, tensor<6xf32>, tensor<6xf32>) -> tensor<s0x6x8x8xf32>
  %3 = cuvil.max_pool2d %2 {kernel = [3, 3], stride = [2, 2], padding = [1, 1], ceil_mode = true} : tensor<s0x6x8x8xf32> -> tensor<s0x6x5x5xf32>
  %4 = cuvil.avg_pool2d %3 {kernel = [2, 2], stride = [1, 1], divisor = 3} : tensor<s0x6x5x5xf32> -> tensor<s0x6x4x4xf32>
  %5 = cuvil.adaptive_avg_pool2d %4 {output_size = [3, 3]} : tensor<s0x6x4x4xf32> -> tensor<s0x6x3x3xf32>
  %m = cuvil.adaptive_max_pool2d %4 {output_size = [2, 3]} : tensor<s0x6x4x4xf32> -> tensor<s0x6x2x3xf32>
  %6 = cuvil.embedding %emb, %tokens : (tensor<100x12xf32>, tensor<s0x5xi64>) -> tensor<s0x5x12xf32>
  %7 = cuvil.linear %6, %lin.weight : (tensor<s0x5x12xf32>, tensor<12x12xf32>) -> tensor<s0x5x12xf32>
  %8 = cuvil.layer_norm %7 {normalized_ndim = 1} : tensor<s0x5x12xf32> -> tensor<s0x5x12xf32>
  %9 = cuvil.rms_norm %8, %ln.weight {normalized_ndim = 1, eps = 1e-06} : (tensor<s0x5x12xf32>, tensor<12xf32>) -> tensor<s0x5x12xf32>
  %10 = cuvil.matmul %9, %lin.weight : (tensor<s0x5x12xf32>, tensor<12x12xf32>) -> tensor<s0x5x12xf32>
  %11 = cuvil.sdpa %q, %q, %q {is_causal = true} : (tensor<s0x2x5x8xf32>, tensor<s0x2x5x8xf32>, tensor<s0x2x5x8xf32>) -> tensor<s0x2x5x8xf32>
  %experts = cuvil.const @experts.weight : tensor<4x12x12xf32>
  %offsets = cuvil.const @experts.offsets : tensor<4xi32>
  %12 = cuvil.grouped_matmul %emb, %experts, %offsets : (tensor<100x12xf32>, tensor<4x12x12xf32>, tensor<4xi32>) -> tensor<100x12xf32>
  %rows = cuvil.reshape %tokens {shape = [-1]} : tensor<s0x5xi64> -> tensor<(5*s0)xi64>
  %vals = cuvil.reshape %7 {shape = [-1, 12]} : tensor<s0x5x12xf32> -> tensor<(5*s0)x12xf32>
  %13 = cuvil.index_put %emb, %rows, %vals {accumulate = true} : (tensor<100x12xf32>, tensor<(5*s0)xi64>, tensor<(5*s0)x12xf32>) -> tensor<100x12xf32>
  %14 = cuvil.check_index %rows {size = [100], dim = 0, of = "scatter"} : tensor<(5*s0)xi64> -> tensor<(5*s0)xi64>
  %15 = cuvil.check_index %rows {size = [100], dim = 1, of = "index_put", negative = true} : tensor<(5*s0)xi64> -> tensor<(5*s0)xi64>
  %ok = cuvil.const @ok : tensor<i1>
  %16 = cuvil.check_true %rows, %ok {message = "one_hot: Class values must be non-negative."} : (tensor<(5*s0)xi64>, tensor<i1>) -> tensor<(5*s0)xi64>
  cuvil.return %5, %10, %11 : tensor<s0x6x3x3xf32>, tensor<s0x5x12xf32>, tensor<s0x2x5x8xf32>
}
"""

LAYOUT = """\
cuvil.func @layout(%x: tensor<s0x(1 + s1)x6xf32>, %idx: tensor<3xi64>) -> (tensor<(2*s0)x(1 + s1)x3xf32>, tensor<s0x3x6xf32>, tensor<6x6xf32>) attributes {symbols = {s0 = [1, 16], s1 = [0, 512]}} {
  %0 = cuvil.reshape %x {shape = [s0, 1 + s1, 2, 3]} : tensor<s0x(1 + s1)x6xf32> -> tensor<s0x(1 + s1)x2x3xf32>
  %1 = cuvil.permute %0 {perm = [0, 2, 1, 3]} : tensor<s0x(1 + s1)x2x3xf32> -> tensor<s0x2x(1 + s1)x3xf32>
  %2 = cuvil.reshape %1 {shape = [2*s0, 1 + s1, 3]} : tensor<s0x2x(1 + s1)x3xf32> -> tensor<(2*s0)x(1 + s1)x3xf32>
  %3 = cuvil.slice %x {dim = 1, start = [1], end = [1 + s1], step = 2} : tensor<s0x(1 + s1)x6xf32> -> tensor<s0x((1 + s1)//2)x6xf32>
  %4 = cuvil.slice %x {dim = 2, end = [3]} : tensor<s0x(1 + s1)x6xf32> -> tensor<s0x(1 + s1)x3xf32>
  %a, %b = cuvil.split %x {dim = 2, sizes = [2, 4]} : tensor<s0x(1 + s1)x6xf32> -> (tensor<s0x(1 + s1)x2xf32>, tensor<s0x(1 + s1)x4xf32>)
  %5 = cuvil.cat %a, %b, %a {dim = 2} : (tensor<s0x(1 + s1)x2xf32>, tensor<s0x(1 + s1)x4xf32>, tensor<s0x(1 + s1)x2xf32>) -> tensor<s0x(1 + s1)x8xf32>
  %6 = cuvil.unsqueeze %5 {dim = 0} : tensor<s0x(1 + s1)x8xf32> -> tensor<1xs0x(1 + s1)x8xf32>
  %7 = cuvil.squeeze %6 {dims = [0]} : tensor<1xs0x(1 + s1)x8xf32> -> tensor<s0x(1 + s1)x8xf32>
  %8 = cuvil.select %7 {dim = 1, index = 0} : tensor<s0x(1 + s1)x8xf32> -> tensor<s0x8xf32>
  %9 = cuvil.select %x {dim = 1, index = 0} : tensor<s0x(1 + s1)x6xf32> -> tensor<s0x6xf32>
  %10 = cuvil.index_select %9, %idx {dim = 0} : (tensor<s0x6xf32>, tensor<3xi64>) -> tensor<3x6xf32>
  %11 = cuvil.expand %10 {shape = [s0, 3, 6]} : tensor<3x6xf32> -> tensor<s0x3x6xf32>
  %12 = cuvil.full {shape = [6, 6], value = 1.0, dtype = f32} : tensor<6x6xf32>
  %13 = cuvil.triu %12 {diagonal = 1} : tensor<6x6xf32> -> tensor<6x6xf32>
  %14 = cuvil.tril %13 : tensor<6x6xf32> -> tensor<6x6xf32>
  %15 = cuvil.full {shape = [6, 6], value = 2, dtype = i64} : tensor<6x6xi64>
  %16 = cuvil.gather %14, %15 {dim = 1} : (tensor<6x6xf32>, tensor<6x6xi64>) -> tensor<6x6xf32>
  %17 = cuvil.copy %16 : tensor<6x6xf32> -> tensor<6x6xf32>
  %18 = cuvil.index %x, %idx : (tensor<s0x(1 + s1)x6xf32>, tensor<3xi64>) -> tensor<3x(1 + s1)x6xf32>
  %19 = cuvil.pad %x {low = [0, 1, -2], high = [1, 0, 3], value = 2.5} : tensor<s0x(1 + s1)x6xf32> -> tensor<(1 + s0)x(2 + s1)x7xf32>
  %20 = cuvil.pad %x {low = [0, 0, 2], high = [0, 0, 1], mode = "reflect"} : tensor<s0x(1 + s1)x6xf32> -> tensor<s0x(1 + s1)x9xf32>
  %21 = cuvil.flip %x {dims = [0, 2]} : tensor<s0x(1 + s1)x6xf32> -> tensor<s0x(1 + s1)x6xf32>
  %22 = cuvil.unfold %x {dim = 2, size = 4, step = 2} : tensor<s0x(1 + s1)x6xf32> -> tensor<s0x(1 + s1)x2x4xf32>
  %23 = cuvil.slice_scatter %x, %4 {dim = 2, end = [3]} : (tensor<s0x(1 + s1)x6xf32>, tensor<s0x(1 + s1)x3xf32>) -> tensor<s0x(1 + s1)x6xf32>
  cuvil.return %2, %11, %17 : tensor<(2*s0)x(1 + s1)x3xf32>, tensor<s0x3x6xf32>, tensor<6x6xf32>
}
"""

TWO_FUNCTIONS = """\
cuvil.func @forward(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = cuvil.relu %x : tensor<4xf32> -> tensor<4xf32>
  cuvil.return %0 : tensor<4xf32>
}

cuvil.func @nothing() -> () {
  cuvil.return
}
"""

CANONICAL = {"unary": _unary_chain(), "binary": _binary_ops(), "sources": SOURCES,
             "symbolic_sources": SYMBOLIC_SOURCES, "elementwise_attrs": ELEMENTWISE_ATTRS,
             "reductions": REDUCTIONS, "nn": NN, "layout": LAYOUT, "two_functions": TWO_FUNCTIONS}


@pytest.mark.parametrize("name", CANONICAL)
def test_canonical_text_round_trips(name):
    text = CANONICAL[name]
    module = parse(text)
    assert print_module(module) == text
    assert print_module(parse(print_module(module))) == text


def test_every_builtin_op_is_covered_by_a_round_trip():
    seen = {op.name for text in CANONICAL.values() for fn in parse(text).functions.values() for op in fn.ops}
    assert {op.name for op in builtin_ops()} - seen == set()


# ----------------------------------------------------------------------------- structure of parsed text

def test_parsed_structure_of_symbolic_function():
    fn = parse(LAYOUT).functions["layout"]
    s0, s1 = sym("s0"), sym("s1")
    assert fn.symbols == {"s0": (1, 16), "s1": (0, 512)}
    assert [v.type for v in fn.args] == [TensorType(DType.f32, (s0, s1 + 1, 6)), TensorType(DType.i64, (3,))]
    assert [v.name for v in fn.args] == ["x", "idx"]
    reshape = fn.ops[2]
    assert reshape.name == "cuvil.reshape"
    assert reshape.attrs == {"shape": [2 * s0, s1 + 1, 3]}
    assert reshape.result.type.shape == (2 * s0, s1 + 1, 3)
    sliced = fn.ops[3]
    assert sliced.attrs == {"dim": 1, "start": [1], "end": [s1 + 1], "step": 2}
    assert sliced.result.type.shape == (s0, sympy.floor((s1 + 1) / 2), 6)
    split = fn.ops[5]
    assert [r.name for r in split.results] == ["a", "b"]
    assert split.attrs["sizes"] == [2, 4]
    assert fn.ops[6].operands == [split.results[0], split.results[1], split.results[0]]
    assert fn.ops[-1].name == "cuvil.return"
    assert [v.type for v in fn.ops[-1].operands] == [TensorType(DType.f32, (2 * s0, s1 + 1, 3)),
                                                     TensorType(DType.f32, (s0, 3, 6)),
                                                     TensorType(DType.f32, (6, 6))]


def test_parsed_attribute_values_keep_their_kinds():
    fn = parse(SOURCES + ELEMENTWISE_ATTRS).functions
    src = fn["sources"].ops
    assert src[0].attrs == {"name": "encoder.layers.0.weight"} and src[0].result.name == "w"
    assert src[1].attrs == {"value": 2.5, "dtype": DType.f32}
    full_value = src[2].attrs["value"]
    assert full_value == 0 and type(full_value) is int
    assert src[3].attrs == {"start": 0, "end": [10], "step": 1, "dtype": DType.i64}
    start = src[4].attrs["start"]
    assert start == 1.0 and type(start) is float
    assert src[5].attrs["name"] == "weights/odd name"
    ew = fn["elementwise_attrs"].ops
    assert ew[0].attrs == {"approximate": "none"}
    assert ew[1].attrs == {"approximate": "tanh"}
    assert ew[2].attrs == {"min": 0.0, "max": None}
    assert ew[3].attrs == {"min": -1e-05, "max": 1e30}
    assert ew[4].attrs == {"dtype": DType.f16}
    assert all(op.loc is None for op in ew)
    assert parse(SOURCES).constants == {}


def test_parsed_locations_and_names():
    nn = parse(NN).functions["nn"]
    conv, grouped = nn.ops[8], nn.ops[9]
    assert conv.loc == Loc("net.py", 10, 0)
    assert grouped.loc == Loc("net.py", 11, 5)
    assert conv.attrs == {"stride": [2, 2], "padding": [1, 1], "padding_high": [], "dilation": [2, 2], "groups": 1,
                          "layout": "nchw", "out_channels": None}
    assert [v.name for v in conv.operands] == ["x", "conv.weight", "conv.bias"]
    assert nn.ops[11].attrs["ceil_mode"] is True
    assert conv.result.name is None   # '%0' is a number, not a name hint


def test_comments_blank_lines_and_spacing_are_accepted():
    text = ("// leading comment\n\n"
            "cuvil.func   @f ( %x :tensor<4xf32> )->tensor<4xf32>{ // header comment\n"
            "  %y=cuvil.clamp %x{min=-1,max=1.5}:tensor<4xf32>->tensor<4xf32>   // trailing\n"
            "\tcuvil.return %y:tensor<4xf32>\r\n"
            "}")
    assert print_module(parse(text)) == (
        "cuvil.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
        "  %y = cuvil.clamp %x {min = -1, max = 1.5} : tensor<4xf32> -> tensor<4xf32>\n"
        "  cuvil.return %y : tensor<4xf32>\n"
        "}\n")


def test_list_dimension_expressions_use_percent_and_floor_division():
    text = ("cuvil.func @f(%x: tensor<s0xf32>) -> tensor<((s0 + 1)//2)x(s0%3 + 1)xf32> "
            "attributes {symbols = {s0 = [1, 100]}} {\n"
            "  %0 = cuvil.full {shape = [(s0 + 1) // 2, s0 % 3 + 1], value = 0.0, dtype = f32} : "
            "tensor<((s0 + 1)//2)x(s0%3 + 1)xf32> // '//' after ']' is a comment again\n"
            "  cuvil.return %0 : tensor<((s0 + 1)//2)x(s0%3 + 1)xf32>\n}\n")
    s0 = sym("s0")
    full = parse(text).functions["f"].ops[0]
    assert full.attrs["shape"] == [sympy.floor((s0 + 1) / 2), sympy.Mod(s0, 3) + 1]
    printed = print_module(parse(text))
    assert "{shape = [(1 + s0)//2, 1 + (s0%3)], value = 0.0, dtype = f32}" in printed
    assert "-> tensor<((1 + s0)//2)x(1 + (s0%3))xf32>" in printed
    assert print_module(parse(printed)) == printed


def test_parse_file_and_bytes(tmp_path):
    path = tmp_path / "m.cvl"
    path.write_bytes(b"\xef\xbb\xbf" + TWO_FUNCTIONS.encode())
    assert print_module(parse_file(path)) == TWO_FUNCTIONS
    path.write_bytes(b"// caf\xc3\xa9\ncuvil.func @f() -> () {\n  cuvil.return \xff\n}\n")
    with pytest.raises(CuvilParseError) as e:
        parse_file(path)
    assert (e.value.line, e.value.col, e.value.filename) == (3, 16, str(path))
    assert "invalid UTF-8 byte 0xff" in e.value.message


# ----------------------------------------------------------------------------- printing objects

def _fn(arg_types, names=None, symbols=None) -> tuple[Function, Builder]:
    fn = Function("f", arg_types, names, symbols)
    return fn, Builder(fn)


def test_printer_names_values_from_valid_unique_hints_and_numbers_the_rest():
    t = TensorType(DType.f32, (4,))
    fn, b = _fn([t, t, t], ["x", "bad name", "x"])
    y = b("cuvil.add", *fn.args[:2])
    y.name = "y.1"
    z = b("cuvil.relu", y)
    z.name = "0"            # numbers are never hints
    w = b("cuvil.add", z, fn.args[2])
    w.name = "y.1"          # taken by an earlier value
    b.create("cuvil.return", [w])
    names = value_names(fn)
    assert [names[v] for v in [*fn.args, y, z, w]] == ["x", "0", "1", "y.1", "2", "3"]
    text = print_function(fn)
    assert text.splitlines()[1:4] == [
        "  %y.1 = cuvil.add %x, %0 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>",
        "  %2 = cuvil.relu %y.1 : tensor<4xf32> -> tensor<4xf32>",
        "  %3 = cuvil.add %2, %1 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>"]
    assert print_function(parse(text).functions["f"]) == text


def test_printer_attribute_values():
    s0 = sym("s0")
    assert [attr_value_str(v) for v in [1, -7, 1.0, 1e-05, 1e16, -0.0, math.inf, -math.inf, math.nan]] == \
        ["1", "-7", "1.0", "1e-05", "1e+16", "-0.0", "inf", "-inf", "nan"]
    assert [attr_value_str(v) for v in [True, False, None, DType.bool, DType.bf16]] == \
        ["true", "false", "none", "i1", "bf16"]
    assert attr_value_str('a "q" \\ \n\t\x00é\u2028') == '"a \\"q\\" \\\\ \\n\\t\\x00é\\u2028"'
    assert attr_value_str([s0, 2 * s0 + 1, sympy.floor(s0 / 4), (2, 3)]) == "[s0, 1 + 2*s0, s0//4, [2, 3]]"
    assert attr_value_str({"s0": (1, 8)}) == "{s0 = [1, 8]}"


def test_printer_omits_defaults_and_prints_floats_parsers_read_back():
    t = TensorType(DType.f32, (2, 3))
    fn, b = _fn([t], ["x"])
    x = fn.args[0]
    ops = [b.create("cuvil.var", [x], {"dims": [1], "correction": 1.0, "keepdim": False}),
           b.create("cuvil.clamp", [x], {"min": -math.inf, "max": math.nan}),
           b.create("cuvil.layer_norm", [x], {"normalized_ndim": 1, "eps": 1e-5}),
           b.create("cuvil.layer_norm", [x], {"normalized_ndim": 1, "eps": 1e-12}),
           b.create("cuvil.max_pool2d", [b.create("cuvil.reshape", [x], {"shape": (1, 1, 2, 3)}).result],
                    {"kernel": (1, 1), "padding": (0, 0)})]
    b.create("cuvil.return", [x])
    names = value_names(fn)
    assert [print_op(op, names).split(" : ")[0] for op in ops] == [
        "%0 = cuvil.var %x {dims = [1]}",
        "%1 = cuvil.clamp %x {min = -inf, max = nan}",
        "%2 = cuvil.layer_norm %x {normalized_ndim = 1}",
        "%3 = cuvil.layer_norm %x {normalized_ndim = 1, eps = 1e-12}",
        "%5 = cuvil.max_pool2d %4 {kernel = [1, 1]}"]
    text = print_function(fn)
    again = parse(text).functions["f"]
    assert print_function(again) == text
    clamp = again.ops[1]
    assert clamp.attrs["min"] == -math.inf and math.isnan(clamp.attrs["max"])


def test_print_op_alone_and_quoted_names_and_locations():
    t = TensorType(DType.f32, (4,))
    fn, b = _fn([t], ["x"])
    w = b.create("cuvil.const", attrs={"name": 'w "1"'}, result_types=[t], loc=Loc('dir "a"\\m.py', 3, 7))
    s = b.create("cuvil.add", [fn.args[0], w.result], loc=Loc("m.py", 4))
    assert print_op(s) == '%? = cuvil.add %?x, %? : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32> loc("m.py":4)'
    b.create("cuvil.return", [s.result])
    fn.name = "my model"
    text = print_function(fn)
    assert text.splitlines()[:2] == [
        'cuvil.func @"my model"(%x: tensor<4xf32>) -> tensor<4xf32> {',
        '  %0 = cuvil.const @"w \\"1\\"" : tensor<4xf32> loc("dir \\"a\\"\\\\m.py":3:7)']
    again = parse(text).functions["my model"]
    assert again.ops[0].attrs["name"] == 'w "1"'
    assert again.ops[0].loc == Loc('dir "a"\\m.py', 3, 7)
    assert print_function(again) == text


def test_empty_module_and_function_without_return_print():
    assert print_module(Module()) == ""
    assert parse("") .functions == {}
    fn, _ = _fn([])
    assert print_function(fn) == "cuvil.func @f() -> () {\n}\n"


# ----------------------------------------------------------------------------- a user op

@pytest.fixture(scope="module")
def kinds_op():
    """A test-only op with one attribute of every kind."""
    class KindsOp(OpDef):
        name = "test.printer.kinds"
        operands = ("x", "rest*")
        attrs = {"i": required("int"), "f": optional("float", 0.5), "b": optional("bool", False),
                 "s": optional("str", ""), "ints": optional("ints", []), "floats": optional("floats", []),
                 "dims": optional("dims", []), "dtype": optional("dtype", DType.f32),
                 "maybe_int": optional("int?"), "maybe_float": optional("float?"), "any": optional("any", 0)}

        @staticmethod
        def infer(types, attrs):
            return [types[0]] * attrs["i"]

    register_op(KindsOp)
    yield KindsOp
    del OP_REGISTRY[KindsOp.name]


def test_user_op_attributes_of_every_kind_round_trip(kinds_op):
    text = ("cuvil.func @f(%x: tensor<s0xf32>) -> (tensor<s0xf32>, tensor<s0xf32>) "
            "attributes {symbols = {s0 = [1, 9]}} {\n"
            "  %0, %1 = test.printer.kinds %x, %x, %x {i = 2, f = 3, b = true, s = \"\\u00e9\\t\", "
            "ints = [-1, 0], floats = [1.5, -inf, 2], dims = [s0, 2*s0 - 1, s0%2], dtype = bf16, "
            "maybe_int = -9223372036854775808, maybe_float = nan, any = false} : "
            "(tensor<s0xf32>, tensor<s0xf32>, tensor<s0xf32>) -> (tensor<s0xf32>, tensor<s0xf32>)\n"
            "  %2 = test.printer.kinds %x {i = 1} : tensor<s0xf32> -> tensor<s0xf32>\n"
            "  cuvil.return %0, %1 : tensor<s0xf32>, tensor<s0xf32>\n}\n")
    module = parse(text)
    op = module.functions["f"].ops[0]
    s0 = sym("s0")
    assert op.attrs["f"] == 3 and op.attrs["s"] == "é\t" and op.attrs["floats"] == [1.5, -math.inf, 2]
    assert op.attrs["dims"] == [s0, 2 * s0 - 1, sympy.Mod(s0, 2)]
    assert op.attrs["maybe_int"] == -2 ** 63 and math.isnan(op.attrs["maybe_float"]) and op.attrs["any"] is False
    printed = print_module(module)
    assert '{i = 2, f = 3, b = true, s = "é\\t", ints = [-1, 0], floats = [1.5, -inf, 2], ' \
           'dims = [s0, -1 + 2*s0, s0%2], dtype = bf16, maybe_int = -9223372036854775808, maybe_float = nan, ' \
           'any = false}' \
           in printed
    assert "test.printer.kinds %x {i = 1} : tensor<s0xf32> -> tensor<s0xf32>" in printed
    assert print_module(parse(printed)) == printed


# ----------------------------------------------------------------------------- malformed input

H = "cuvil.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
R = "  cuvil.return %x : tensor<4xf32>\n}\n"
RELU = "  %0 = cuvil.relu %x : tensor<4xf32> -> tensor<4xf32>\n"
SYM = "cuvil.func @g(%x: tensor<s0xf32>) -> tensor<s0xf32> attributes {symbols = {s0 = [1, 8]}} {\n"

ERRORS = [
    # (text, line, col, message fragment)
    ("garbage", 1, 1, "expected 'cuvil.func', got 'garbage'"),
    ("cuvil.func", 1, 11, "expected a function name '@name' after 'cuvil.func', got end of input"),
    ("cuvil.func @f(%x tensor<4xf32>)", 1, 18, "expected ':' after the argument name, got 'tensor<4xf32>'"),
    ("cuvil.func @f(%x: tensor<4xf32> %y", 1, 33, "expected ',' or ')' in the argument list"),
    ("cuvil.func @f() tensor<4xf32>", 1, 17, "expected '->' and the result types after the arguments"),
    ("cuvil.func @f() -> () attributes {sym = {}} {", 1, 35, "unknown function attribute 'sym' (known: symbols)"),
    ("cuvil.func @f() -> () attributes {symbols = {f32 = [1, 2]}} {", 1, 46, "'f32' cannot name a symbol"),
    ("cuvil.func @f() -> () attributes {symbols = {s0 = [3, 2]}} {", 1, 51, "empty range [3, 2]"),
    ("cuvil.func @f() -> () attributes {symbols = {s0 = [1 2]}} {", 1, 54, "expected ',' between the bounds"),
    ("cuvil.func @f() -> () {\n", 2, 1, "expected '}' to close @f (opened at 1:23), got end of input"),
    (H, 2, 1, "expected '}' to close @f (opened at 1:51)"),
    (H + R[:-2] + H + R, 3, 1, "expected '}' to close @f (opened at 1:51), got 'cuvil.func'"),
    (H + "}\n", 2, 1, "function @f must end in cuvil.return"),
    (H + "  %0 = cuvil.relu %x {} {} : tensor<4xf32> -> tensor<4xf32>\n", 2, 25,
     "expected ':' after the attributes, got '{'"),
    (H + "  %0 = cuvil.relu %x tensor<4xf32> -> tensor<4xf32>\n", 2, 22,
     "expected ':' after the operands, got 'tensor<4xf32>'"),
    (H + "  %0 = cuvil.relux %x : tensor<4xf32> -> tensor<4xf32>\n", 2, 8,
     "unknown op 'cuvil.relux' (did you mean 'cuvil.relu'?)"),
    (H + "  %0 cuvil.relu %x : tensor<4xf32> -> tensor<4xf32>\n", 2, 6, "expected '=' after the result names"),
    (H + "  %0 = cuvil.relu %y : tensor<4xf32> -> tensor<4xf32>\n", 2, 19, "use of undefined value '%y'"),
    (H + "  %0 = cuvil.relu %0 : tensor<4xf32> -> tensor<4xf32>\n", 2, 19, "use of undefined value '%0'"),
    (H + "  %x = cuvil.relu %x : tensor<4xf32> -> tensor<4xf32>\n", 2, 3,
     "redefinition of '%x' (first defined at 1:15)"),
    (H + "  %a, %a = cuvil.split %x {dim = 0, sizes = [2, 2]} : tensor<4xf32> -> (tensor<2xf32>, tensor<2xf32>)\n",
     2, 7, "redefinition of '%a' (first defined at 2:3)"),
    (H + "  %0a = cuvil.relu %x : tensor<4xf32> -> tensor<4xf32>\n", 2, 3, "invalid value name '%0a'"),
    (H + "  %0 = cuvil.relu %x : tensor<4xf16> -> tensor<4xf32>\n", 2, 24,
     "operand '%x' has type tensor<4xf32>, but the signature says tensor<4xf16>"),
    (H + "  %0 = cuvil.softmax %x : tensor<4xf32> -> tensor<4xf32>\n", 2, 8,
     "cuvil.softmax requires attribute 'dim' (an int)"),
    (H + "  %0 = cuvil.softmax %x {dim = 1.5} : tensor<4xf32> -> tensor<4xf32>\n", 2, 32,
     "attribute 'dim' of cuvil.softmax must be an int, got 1.5"),
    (H + "  %0 = cuvil.softmax %x {dim = true} : tensor<4xf32> -> tensor<4xf32>\n", 2, 32, "must be an int, got true"),
    (H + "  %0 = cuvil.softmax %x {dim = 0, foo = 1} : tensor<4xf32> -> tensor<4xf32>\n", 2, 35,
     "unknown attribute 'foo' for cuvil.softmax (known: dim)"),
    (H + "  %0 = cuvil.softmax %x {dim = 0, dim = 1} : tensor<4xf32> -> tensor<4xf32>\n", 2, 35,
     "duplicate attribute 'dim'"),
    (H + "  %0 = cuvil.softmax %x {dim 0} : tensor<4xf32> -> tensor<4xf32>\n", 2, 30,
     "expected '=' after the attribute"),
    (H + "  %0 = cuvil.softmax %x {dim = 0 : tensor<4xf32> -> tensor<4xf32>\n", 2, 34,
     "expected ',' or '}' in the attributes, got ':'"),
    (H + "  %0 = cuvil.softmax %x {dim = foo} : tensor<4xf32> -> tensor<4xf32>\n", 2, 32,
     "expected an attribute value, got 'foo'"),
    (H + "  %0 = cuvil.add %x : tensor<4xf32> -> tensor<4xf32>\n", 2, 8, "cuvil.add takes 2 operands (a, b), got 1"),
    (H + "  %0 = cuvil.add %x, %x, %x : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>\n", 2, 26,
     "cuvil.add takes 2 operands (a, b), got 3"),
    (H + "  %0 = cuvil.linear %x : tensor<4xf32> -> tensor<4xf32>\n", 2, 8, "takes 2 to 3 operands (x, weight, bias?)"),
    (H + "  %0 = cuvil.add %x, %x : (tensor<4xf32>) -> tensor<4xf32>\n", 2, 27,
     "the signature lists 1 operand type for 2 operands"),
    (H + "  %0 = cuvil.add %x, %x : (tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>\n", 2, 57,
     "expected ',' or ')' in the type list, got '->'"),
    (H + "  %0 = cuvil.relu %x : tensor<4xf32> -> (tensor<4xf32>, tensor<4xf32>)\n", 2, 41,
     "the signature lists 2 result types for 1 result name"),
    (H + "  %0 = cuvil.relu %x : tensor<4xf32> tensor<4xf32>\n", 2, 38, "expected '->' after the operand types"),
    (H + "  %0 = cuvil.relu %x : tensor<4xq32> -> tensor<4xf32>\n", 2, 33, "expected a dimension or a dtype"),
    (H + "  %0 = cuvil.relu %x : tensor<4xf32 -> tensor<4xf32>\n", 2, 36, "expected '>' after the dtype 'f32'"),
    (H + "  %0 = cuvil.relu %x : tensor<4f32> -> tensor<4xf32>\n", 2, 32, "expected 'x' after a dimension"),
    (H + "  %0 = cuvil.relu %x : tensor<4xf32\n", 2, 24, "unterminated tensor type"),
    (H + "  %0 = cuvil.relu %x : tensor<s0xf32> -> tensor<4xf32>\n", 2, 31, "symbol 's0' is not declared"),
    (H + "  %0 = cuvil.relu %x : tensor<99999999999999999999x4xf32> -> tensor<4xf32>\n", 2, 31,
     "dimension 99999999999999999999 does not fit in 64 bits"),
    (H + "  %0 = cuvil.relu %x : tensor<(3 - 5)xf32> -> tensor<4xf32>\n", 2, 31,
     "dimension expression evaluates to -2, outside [0, "),
    (H + "  %0 = cuvil.relu %x : tensor<(4 + )xf32> -> tensor<4xf32>\n", 2, 36,
     "expected a dimension (an integer, a symbol or '('), got ')'"),
    (H + "  %0 = cuvil.relu %x : tensor<(4 / 2)xf32> -> tensor<4xf32>\n", 2, 34, "unexpected character '/'"),
    (H + "  %0 = cuvil.relu %x : tensor<(4 + 1> -> tensor<4xf32>\n", 2, 37,
     "expected ')' to close the dimension expression, got '>'"),
    (H + "  %0 = cuvil.relu %x : tensor<(1.5)xf32> -> tensor<4xf32>\n", 2, 31, "a dimension must be an integer"),
    (H + "  %0 = cuvil.relu %x : tensor<" + "1x" * 65 + "f32> -> tensor<4xf32>\n", 2, 159,
     "tensor type with more than 64 dimensions"),
    (SYM + "  %0 = cuvil.relu %x : tensor<(s0 // s0)xf32> -> tensor<4xf32>\n", 2, 35,
     "the divisor of '//' must be an integer"),
    (SYM + "  %0 = cuvil.relu %x : tensor<(s0 % 0)xf32> -> tensor<4xf32>\n", 2, 35, "division by zero"),
    (SYM + "  %0 = cuvil.reshape %x {shape = [s0 + 1.5]} : tensor<s0xf32> -> tensor<s0xf32>\n", 2, 38,
     "a float cannot be an operand of '+'"),
    (SYM + "  %0 = cuvil.reshape %x {shape = [s1]} : tensor<s0xf32> -> tensor<s0xf32>\n", 2, 35,
     "symbol 's1' is not declared in the symbols of @g (declared: s0)"),
    (SYM + "  %0 = cuvil.reshape %x {shape = [s0 true]} : tensor<s0xf32> -> tensor<s0xf32>\n", 2, 38,
     "expected ',' or ']' in the list, got 'true'"),
    (H + "  %0 = cuvil.reshape %x {shape = [" + "[" * 80, 2, 98, "nesting deeper than 64 levels"),
    (H + "  %0 = cuvil.relu %x : tensor<" + "(" * 80 + "4" + ")" * 80 + "xf32> -> tensor<4xf32>\n", 2, 95,
     "nesting deeper than 64 levels"),
    (H + "  %0 = cuvil.reshape %x {shape = [" + "+".join(["1"] * 101) + "]} : tensor<4xf32> -> tensor<4xf32>\n",
     2, 235, "dimension expression longer than 100 terms"),
    (H + "  %0 = cuvil.reshape %x {shape = [99999999999999999999999]} : tensor<4xf32> -> tensor<4xf32>\n", 2, 35,
     "integer 99999999999999999999999 does not fit in 64 bits"),
    (H + "  %0 = cuvil.argmax %x {dim = 9223372036854775808} : tensor<4xf32> -> tensor<i64>\n", 2, 31,
     "integer 9223372036854775808 does not fit in 64 bits"),
    (H + "  %0 = cuvil.argmax %x {dim = " + "0" * 5000 + "1} : tensor<4xf32> -> tensor<i64>\n" + R, 2, 8,
     "cuvil.argmax: dim = 1 is out of range"),
    (H + "  %0 = cuvil.clamp %x {min = 1e999} : tensor<4xf32> -> tensor<4xf32>\n", 2, 30,
     "float '1e999' is too large for f64 (write inf)"),
    (H + "  %0 = cuvil.clamp %x {min = -} : tensor<4xf32> -> tensor<4xf32>\n", 2, 31, "expected a number, got '}'"),
    (H + '  %0 = cuvil.gelu %x {approximate = "tanh} : tensor<4xf32> -> tensor<4xf32>\n', 2, 37,
     "unterminated string"),
    (H + '  %0 = cuvil.gelu %x {approximate = "\\q"} : tensor<4xf32> -> tensor<4xf32>\n', 2, 38, "unknown escape"),
    (H + '  %0 = cuvil.gelu %x {approximate = "\\u12"} : tensor<4xf32> -> tensor<4xf32>\n', 2, 38,
     "bad escape '\\u12\"}'"),
    (H + '  %0 = cuvil.gelu %x {approximate = "a\tb"} : tensor<4xf32> -> tensor<4xf32>\n', 2, 39,
     "character U+0009 must be escaped in a string"),
    (H + '  %0 = cuvil.relu %x : tensor<4xf32> -> tensor<4xf32> loc("a.py")\n', 2, 65,
     "expected ':' after the file name in loc(...), got ')'"),
    (H + '  %0 = cuvil.relu %x : tensor<4xf32> -> tensor<4xf32> loc(a.py:1)\n', 2, 59,
     "expected a file name string in loc(...), got 'a.py'"),
    (H + "  %0 = cuvil.relu %x : tensor<4xf32> -> tensor<4xf32> \x00\n", 2, 55, "unexpected character U+0000"),
    (H + "  %0 = cuvil.relu %x : tensor<4xf32> -> tensor<4xf32> é\n", 2, 55, "unexpected character 'é' (U+00E9)"),
    (H + "  %0 = cuvil.relu % x : tensor<4xf32> -> tensor<4xf32>\n", 2, 19, "expected a value name after '%'"),
    (H + "  %0 = cuvil.const %x : tensor<4xf32>\n", 2, 20, "expected '@name' after 'cuvil.const', got '%x'"),
    (H + "  %0 = cuvil.const @w {name = \"v\"} : tensor<4xf32>\n", 2, 24,
     "duplicate attribute 'name' (given as '@name')"),
    (H + "  %0 = cuvil.relu @x : tensor<4xf32>\n", 2, 19, "'@x': only cuvil.const takes an '@name' operand"),
    (H + "  %0 = cuvil.return %x : tensor<4xf32>\n}\n", 2, 3, "cuvil.return has no results"),
    (H + "  cuvil.return %x\n}\n", 3, 1, "expected ':' and the operand types after the operands, got '}'"),
    (H + "  cuvil.return %x : tensor<4xf32>, tensor<4xf32>\n}\n", 2, 21, "cuvil.return lists 2 types for 1 operand"),
    (H + RELU + "  cuvil.return %0 : tensor<4xf32>\n  cuvil.return %x : tensor<4xf32>\n}\n", 4, 3,
     "operation after cuvil.return"),
    (H + "  %0 = cuvil.relu %x : tensor<4xf32> -> tensor<5xf32>\n  cuvil.return %0 : tensor<5xf32>\n}\n", 3, 3,
     "cuvil.return gives (tensor<5xf32>) but @f declares -> (tensor<4xf32>)"),
    (H + R + H + R, 4, 1, "redefinition of function @f (first defined at 1:1)"),
    # errors found by the verifier, reported at the op
    (H + "  %0 = cuvil.relu %x : tensor<4xf32> -> tensor<5xf32>\n  cuvil.return %x : tensor<4xf32>\n}\n", 2, 8,
     "cuvil.relu: result 0 has type tensor<5xf32> but its operands give tensor<4xf32>"),
    ("cuvil.func @f(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {\n  %0 = cuvil.softmax %x {dim = 5} : "
     "tensor<2x3xf32> -> tensor<2x3xf32>\n  cuvil.return %0 : tensor<2x3xf32>\n}\n", 2, 8,
     "cuvil.softmax: dim = 5 is out of range for rank 2"),
]


@pytest.mark.parametrize("text, line, col, fragment", ERRORS, ids=[e[3][:40] for e in ERRORS])
def test_malformed_input_reports_the_position(text, line, col, fragment):
    with pytest.raises(CuvilParseError) as info:
        parse(text, filename="bad.cvl")
    e = info.value
    assert fragment in e.message
    assert (e.line, e.col) == (line, col)
    source_line = (text.split("\n") + [""])[line - 1].replace("\t", " ").replace("\x00", "?")
    assert e.source_line == source_line
    assert str(e).splitlines() == [f"bad.cvl:{line}:{col}: error: {e.message}", source_line, " " * (col - 1) + "^"]


@pytest.mark.parametrize("text", ["", "   \n\n", "// nothing here\n", "\ufeff"])
def test_empty_input_is_an_empty_module(text):
    assert parse(text).functions == {}


def test_line_breaks_cr_and_crlf_count_as_lines():
    with pytest.raises(CuvilParseError) as info:
        parse("cuvil.func @f() -> () {\r  cuvil.return\r\n  bad\n}")
    assert (info.value.line, info.value.col, info.value.source_line) == (3, 3, "  bad")


def test_the_example_in_the_ir_reference_round_trips():
    doc = (Path(__file__).parents[2] / "docs" / "ir.md").read_text()
    example = doc.split("```\n")[1]
    assert example.startswith("cuvil.func @forward")
    assert print_module(parse(example)) == example


def test_symbolic_products_read_back_as_the_same_expression():
    s0, s1 = sym("s0"), sym("s1")
    dims = (sympy.Mul(2, 1 + s0, sympy.floor(s0 / 2)), -(1 + s0) * s1 + 3 * s1 * s1, sympy.Mod(2 * s0 + 1, s1))
    fn, b = _fn([TensorType(DType.f32, dims)], ["x"], {"s0": (1, 8), "s1": (1, 8)})
    b.create("cuvil.return", fn.args)
    text = print_function(fn)
    assert text.startswith("cuvil.func @f(%x: tensor<(2*(1 + s0)*(s0//2))x(3*s1*s1 + s1*(-1 - s0))x"
                           "((1 + 2*s0)%s1)xf32>)")
    again = parse(text).functions["f"]
    assert again.args[0].type.shape == dims
    assert print_function(again) == text
