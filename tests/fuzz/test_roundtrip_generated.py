"""Round trip of generated modules: random modules built through the object API (odd names, every
attribute kind with edge values, symbolic dimension expressions, locations) must print, parse back
to the same objects, and print identically."""
from __future__ import annotations

import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from cuvil.ir import (OP_REGISTRY, Builder, DType, Function, Loc, Module, OpDef, TensorType, optional,
                      print_module, register_op, required, sym)
from cuvil.ir.types import dims_equal, floordiv, norm_dim

FUZZ = settings.get_profile("cuvil-fuzz")
SYMBOLS = {"s0": (1, 64), "s1": (1, 2 ** 63 - 1), "batch": (2, 8)}
INT64 = st.integers(-2 ** 63, 2 ** 63 - 1)
FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([-0.0, 1e-05, 5e-324, 1e16])
TEXT = st.text(st.characters(exclude_categories=()), max_size=12)


class KindsOp(OpDef):
    """Test-only: one attribute of every kind; results repeat the first operand's type."""
    name = "test.fuzz.kinds"
    operands = ("x", "rest*")
    attrs = {"i": required("int"), "f": optional("float", 1e-05), "b": optional("bool", False),
             "s": optional("str", "none"), "ints": optional("ints", []), "floats": optional("floats", [0.5]),
             "dims": optional("dims", []), "dtype": optional("dtype", DType.f32), "maybe_int": optional("int?"),
             "maybe_float": optional("float?"), "any": optional("any", 0)}

    @staticmethod
    def infer(types, attrs):
        return [types[0]] * (1 + len(attrs["ints"]) % 3)


@pytest.fixture(scope="module", autouse=True)
def kinds_op():
    register_op(KindsOp)
    yield
    del OP_REGISTRY[KindsOp.name]


def _combine(op, a, b):
    if op == "+":
        return norm_dim(a + b)
    if op == "-":
        return norm_dim(a - b)
    if op == "*":
        return norm_dim(a * b)
    if op == "//":
        return floordiv(a, b)
    return norm_dim(sympy.Mod(a, b)) if not (isinstance(a, int) and isinstance(b, int)) else a % b


def _extend(children):
    """The operations the text has: + - * on any dims, // by an integer, % by an integer or symbol."""
    return st.builds(_combine, st.sampled_from(["+", "-", "*"]), children, children) | \
        st.builds(_combine, st.just("//"), children, st.integers(1, 6)) | \
        st.builds(_combine, st.just("%"), children, st.integers(1, 6) | st.sampled_from([sym("s0"), sym("s1")]))


DIM_EXPRS = st.recursive(st.integers(0, 40) | st.sampled_from([sym(s) for s in SYMBOLS]), _extend, max_leaves=6)


LIST_DIMS = DIM_EXPRS.filter(lambda d: not isinstance(d, int) or -2 ** 63 <= d < 2 ** 63)
TYPE_DIMS = LIST_DIMS.filter(lambda d: not isinstance(d, int) or d >= 0)
TYPES = st.builds(TensorType, st.sampled_from(list(DType)), st.lists(TYPE_DIMS, max_size=3).map(tuple))
STATIC_TYPES = st.builds(TensorType, st.sampled_from(list(DType)),
                         st.lists(st.integers(0, 2 ** 63 - 1), max_size=3).map(tuple))

ATTRS = st.fixed_dictionaries({"i": INT64}, optional={
    "f": FLOATS | INT64, "b": st.booleans(), "s": TEXT, "ints": st.lists(INT64, max_size=4),
    "floats": st.lists(FLOATS | st.integers(-5, 5), max_size=3), "dims": st.lists(LIST_DIMS, max_size=3),
    "dtype": st.sampled_from(list(DType)), "maybe_int": st.none() | INT64, "maybe_float": st.none() | FLOATS,
    "any": st.booleans() | INT64 | FLOATS})
LOCS = st.none() | st.builds(Loc, TEXT, st.integers(0, 2 ** 63 - 1), st.integers(0, 2 ** 63 - 1))
HINTS = st.none() | TEXT | st.sampled_from(["x", "y.1", "_a", "0", "x"])


@st.composite
def functions(draw, name):
    arg_types = draw(st.lists(TYPES, min_size=1, max_size=3))
    fn = Function(name, arg_types, draw(st.lists(HINTS, min_size=len(arg_types), max_size=len(arg_types))),
                  SYMBOLS)
    b = Builder(fn)
    values = list(fn.args)
    for _ in range(draw(st.integers(0, 5))):
        if draw(st.booleans()):
            op = b.create("cuvil.const", attrs={"name": draw(TEXT)}, result_types=[draw(STATIC_TYPES)],
                          loc=draw(LOCS))
        else:
            operands = draw(st.lists(st.sampled_from(values), min_size=1, max_size=3))
            op = b.create(KindsOp.name, operands, draw(ATTRS), loc=draw(LOCS))
        for r in op.results:
            r.name = draw(HINTS)
        values += op.results
    b.create("cuvil.return", draw(st.lists(st.sampled_from(values), max_size=3)), loc=draw(LOCS))
    return fn


@st.composite
def modules(draw):
    module = Module()
    for name in draw(st.lists(TEXT, min_size=1, max_size=2, unique=True)):
        module.add_function(draw(functions(name)))
    return module


def _same(a, b) -> bool:
    """Equal values of the same kind (bool vs int vs float kept apart; nan and -0.0 by their text;
    dimension expressions by value, as sympy may hold one expression in several forms)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, float) and isinstance(b, float):
        return repr(a) == repr(b)
    if isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr):
        return dims_equal(a, b)
    return type(a) is type(b) and a == b


def _same_type(a: TensorType, b: TensorType) -> bool:
    return a.dtype == b.dtype and _same(a.shape, b.shape)


@FUZZ
@given(modules())
def test_generated_modules_round_trip(oracle, module):
    text = print_module(module)
    parsed = oracle.check(text)
    assert parsed is not None, text
    assert print_module(parsed) == text
    assert list(parsed.functions) == list(module.functions)
    for fn in module.functions.values():
        again = parsed.functions[fn.name]
        assert all(map(_same_type, [v.type for v in again.args], [v.type for v in fn.args]))
        assert again.symbols == fn.symbols
        assert len(again.ops) == len(fn.ops)
        for op, op2 in zip(fn.ops, again.ops):
            assert op2.name == op.name and op2.loc == op.loc
            assert all(map(_same_type, [r.type for r in op2.results], [r.type for r in op.results]))
            assert op2.attrs.keys() == op.attrs.keys()
            for key in op.attrs:
                assert _same(op2.attrs[key], op.attrs[key]), (key, op.attrs[key], op2.attrs[key])
