"""Fuzzing the IR parser: token soups, generated programs (valid ones and ones with one planted
mistake), character and token mutations and every truncation of the corpus files, and size or
nesting bombs. The oracle (conftest.py) accepts only a round-tripping module or a positioned
CuvilParseError, each within the time budget."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuvil.ir.ops import builtin_ops

FUZZ = settings.get_profile("cuvil-fuzz")
CORPUS = {p.name: p.read_text() for p in sorted((Path(__file__).parent / "corpus").glob("*.cvl"))}

# A tokenizer of the test's own (not the parser's), for token-level mutations.
_TOKEN = re.compile(r'\s+|//[^\n]*|tensor<[^>\n]*>|%[\w.]+|@"[^"\n]*"|@[\w.$]+|"(?:[^"\\\n]|\\.)*"'
                    r'|[A-Za-z_][\w.]*|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|->|//|.', re.S)

EDGE_TOKENS = [
    "cuvil.func", "@f", "@fc1.weight", '@"a b"', "@", "%", "%0", "%x", "%0a", "%.", "(", ")", "{", "}", "[", "]",
    ",", ":", "=", "->", "<", ">", "*", "+", "-", "//", "/", ".", "attributes", "symbols", "loc", "tensor",
    'loc("m.py":3)', 'loc("m.py":3:4)', "tensor<4xf32>", "tensor<s0x4xf32>", "tensor<(s0 + 1)x2xi1>",
    "tensor<f32>", "tensor<", "tensor<4x", "tensor<s0>", "tensor<(s0//0)xf32>", "tensor<((((s0))))xf32>",
    "tensor<-1xf32>", "tensor<0xf32>", "tensor<18446744073709551616xf32>", "f32", "bf16", "i1", "s0", "s1",
    "true", "false", "none", "inf", "-inf", "nan", "0", "-0", "1", "-1", "2.5", "-0.0", "1e-05", "1e309",
    "9223372036854775807", "9223372036854775808", "-9223372036854775808", "18446744073709551616",
    "0" * 30 + "1", "1" * 5000, '"s"', '"\\n\\t\\x00\\u00e9"', '"\\q"', '"\\U00110000"', '"unterminated', '""',
    "{symbols = {s0 = [1, 8]}}", "[1, 2]", "[s0, 4]", "[(s0 + 1)//2]", "[s0 % 0]", "[[[[]]]]",
    "\n", " ", "\t", "\r", "\r\n", "// comment\n", "\x00", "\x7f", "é", "\ufeff", "\u2028", "\ud800", "🙂",
]
OP_NAMES = [op.name for op in builtin_ops()] + ["cuvil.nope", "mylib.op", "cuvil."]
VOCAB = EDGE_TOKENS + OP_NAMES


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


# ----------------------------------------------------------------------------- token soups

@FUZZ
@given(st.lists(st.sampled_from(VOCAB), max_size=60), st.sampled_from([" ", "", "\n"]))
def test_token_soup(oracle, tokens, sep):
    oracle.check(sep.join(tokens))


@FUZZ
@given(st.lists(st.sampled_from(VOCAB), max_size=40))
def test_token_soup_inside_a_function(oracle, tokens):
    oracle.check("cuvil.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n  " + " ".join(tokens)
                 + "\n  cuvil.return %x : tensor<4xf32>\n}\n")


@FUZZ
@given(st.text(max_size=200))
def test_arbitrary_text(oracle, text):
    oracle.check(text)


@FUZZ
@given(st.binary(max_size=200))
def test_arbitrary_bytes(oracle, data):
    oracle.check(data)


# ----------------------------------------------------------------------------- generated programs

UNARY = ["relu", "neg", "exp", "tanh", "sigmoid", "abs", "sqrt", "copy"]
BINARY = ["add", "sub", "mul", "maximum"]


def _type(shape, dtype="f32") -> str:
    return "tensor<" + "".join(f"{d}x" for d in shape) + dtype + ">"


@st.composite
def programs(draw):
    """A well-typed function as a list of lines (each a list of tokens), built from hand-written
    typing rules independent of the op declarations."""
    batch = draw(st.sampled_from(["s0", "2", "(s0 + 1)"]))
    shape = [batch, draw(st.integers(1, 5))]
    symbolic = batch != "2"
    t = _type(shape)
    values = [("%x", shape, "f32"), ("%y", shape, "f32")]
    lines = []
    for k in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["unary", "binary", "softmax", "sum", "clamp", "cast", "literal", "const",
                                     "permute"]))
        needs_matrix = kind in ("softmax", "sum", "permute")
        name, vshape, dtype = draw(st.sampled_from([v for v in values if v[2] == "f32"
                                                    and (len(v[1]) == 2 or not needs_matrix)]))
        res = f"%v{k}"
        vt = _type(vshape, dtype)
        if kind == "unary":
            line = [res, "=", f"cuvil.{draw(st.sampled_from(UNARY))}", name, ":", vt, "->", vt]
            out = (vshape, dtype)
        elif kind == "binary":
            other = draw(st.sampled_from([v[0] for v in values if v[1] == vshape and v[2] == dtype]))
            line = [res, "=", f"cuvil.{draw(st.sampled_from(BINARY))}", name, ",", other, ":",
                    "(", vt, ",", vt, ")", "->", vt]
            out = (vshape, dtype)
        elif kind == "softmax":
            line = [res, "=", "cuvil.softmax", name, "{", "dim", "=", str(draw(st.integers(0, 1))), "}", ":",
                    vt, "->", vt]
            out = (vshape, dtype)
        elif kind == "sum":
            dim = draw(st.integers(0, 1))
            rshape = [1 if i == dim else d for i, d in enumerate(vshape)]
            line = [res, "=", "cuvil.sum", name, "{", "dims", "=", "[", str(dim), "]", ",", "keepdim", "=",
                    "true", "}", ":", vt, "->", _type(rshape)]
            out = (rshape, dtype)
        elif kind == "clamp":
            lo = draw(st.sampled_from(["-1.5", "0.0", "-inf", "none", "-3"]))
            line = [res, "=", "cuvil.clamp", name, "{", "min", "=", lo, "}", ":", vt, "->", vt]
            out = (vshape, dtype)
        elif kind == "cast":
            line = [res, "=", "cuvil.cast", name, "{", "dtype", "=", "f16", "}", ":", vt, "->", _type(vshape, "f16")]
            out = (vshape, "f16")
        elif kind == "literal":
            value = draw(st.sampled_from(["0.5", "2", "true", "-1e-05"]))
            line = [res, "=", "cuvil.literal", "{", "value", "=", value, ",", "dtype", "=", "f32", "}", ":",
                    "tensor<f32>"]
            out = ([], "f32")
        elif kind == "const":
            cshape = [draw(st.integers(1, 4))]
            line = [res, "=", "cuvil.const", draw(st.sampled_from(["@w", "@fc.weight", '@"a b"'])), ":",
                    _type(cshape)]
            out = (cshape, "f32")
        else:
            rshape = [vshape[1], vshape[0]]
            line = [res, "=", "cuvil.permute", name, "{", "perm", "=", "[", "1", ",", "0", "]", "}", ":",
                    vt, "->", _type(rshape)]
            out = (rshape, dtype)
        if draw(st.booleans()):
            line += [f'loc("model.py":{k + 1})']
        lines.append(line)
        values.append((res, *out))
    last, lshape, ldtype = values[-1]
    lt = _type(lshape, ldtype)
    lines.append(["cuvil.return", last, ":", lt])
    attrs = ["attributes", "{symbols = {s0 = [1, 64]}}"] if symbolic else []
    header = ["cuvil.func", "@f", "(", "%x", ":", t, ",", "%y", ":", t, ")", "->", lt, *attrs, "{"]
    return [header, *lines, ["}"]]


def _render(lines) -> str:
    return "\n".join(" ".join(line) for line in lines) + "\n"


@FUZZ
@given(programs())
def test_generated_valid_programs_parse_and_round_trip(oracle, lines):
    assert oracle.check(_render(lines)) is not None


MISTAKES = ["delete", "duplicate", "replace", "swap_lines", "drop_line"]


@FUZZ
@given(programs(), st.sampled_from(MISTAKES), st.data())
def test_generated_programs_with_a_planted_mistake(oracle, lines, mistake, data):
    line_no = data.draw(st.integers(0, len(lines) - 1))
    line = list(lines[line_no])
    i = data.draw(st.integers(0, len(line) - 1))
    if mistake == "delete":
        del line[i]
    elif mistake == "duplicate":
        line.insert(i, line[i])
    elif mistake == "replace":
        line[i] = data.draw(st.sampled_from(VOCAB))
    if mistake in ("delete", "duplicate", "replace"):
        lines = lines[:line_no] + [line] + lines[line_no + 1:]
    elif mistake == "swap_lines":
        j = data.draw(st.integers(0, len(lines) - 1))
        lines = list(lines)
        lines[line_no], lines[j] = lines[j], lines[line_no]
    else:
        lines = lines[:line_no] + lines[line_no + 1:]
    oracle.check(_render(lines))


# ----------------------------------------------------------------------------- corpus mutations

@pytest.mark.parametrize("name", CORPUS)
def test_corpus_parses_and_round_trips(oracle, name):
    module = oracle.check(CORPUS[name])
    assert module is not None and "forward" in module.functions


@pytest.mark.parametrize("name", CORPUS)
def test_every_truncation_of_the_corpus(oracle, name):
    text = CORPUS[name]
    for i in range(len(text)):
        oracle.check(text[:i])


ALPHABET = st.characters(min_codepoint=0, max_codepoint=0x7f) | st.sampled_from(
    ["é", "\ufeff", "\u2028", "\ud800", "🙂", "\x85", "\xa0"])


@FUZZ
@given(st.sampled_from(sorted(CORPUS)), st.lists(st.tuples(
    st.sampled_from(["delete", "insert", "duplicate", "swap"]), st.floats(0, 1), st.integers(1, 8),
    st.text(ALPHABET, min_size=1, max_size=4)), min_size=1, max_size=3))
def test_character_mutations_of_the_corpus(oracle, name, mutations):
    text = CORPUS[name]
    for kind, where, length, payload in mutations:
        i = int(where * len(text))
        if kind == "delete":
            text = text[:i] + text[i + length:]
        elif kind == "insert":
            text = text[:i] + payload + text[i:]
        elif kind == "duplicate":
            text = text[:i] + text[i:i + length] + text[i:]
        else:
            j = min(i + length, len(text) - 1)
            if i < j:
                text = text[:i] + text[j] + text[i + 1:j] + text[i] + text[j + 1:]
    oracle.check(text)


@FUZZ
@given(st.sampled_from(sorted(CORPUS)), st.lists(st.tuples(
    st.sampled_from(["delete", "duplicate", "swap", "replace"]), st.floats(0, 1), st.floats(0, 1),
    st.sampled_from(VOCAB)), min_size=1, max_size=3))
def test_token_mutations_of_the_corpus(oracle, name, mutations):
    tokens = _tokens(CORPUS[name])
    for kind, where, other, replacement in mutations:
        i, j = int(where * (len(tokens) - 1)), int(other * (len(tokens) - 1))
        if kind == "delete":
            del tokens[i]
        elif kind == "duplicate":
            tokens.insert(i, tokens[i])
        elif kind == "swap":
            tokens[i], tokens[j] = tokens[j], tokens[i]
        else:
            tokens[i] = replacement
    oracle.check("".join(tokens))


# ----------------------------------------------------------------------------- bombs and edges

HEAD = "cuvil.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
TAIL = "  cuvil.return %x : tensor<4xf32>\n}\n"
N = 100_000

BOMBS = {
    "nested lists": HEAD + "  %0 = cuvil.reshape %x {shape = " + "[" * N,
    "nested dicts": HEAD + "  %0 = cuvil.reshape %x {shape = " + "{a = " * N,
    "nested parens in a type": HEAD + "  %0 = cuvil.relu %x : tensor<" + "(" * N + "4" + ")" * N + "xf32>",
    "nested parens in a list": HEAD + "  %0 = cuvil.reshape %x {shape = [" + "(" * N + "4" + ")" * N + "]}",
    "unary minus chain": HEAD + "  %0 = cuvil.reshape %x {shape = [" + "-" * N + "4]} : tensor<4xf32> -> "
                         "tensor<4xf32>\n" + TAIL,
    "long sum": HEAD + "  %0 = cuvil.reshape %x {shape = [" + "+".join("1" * N) + "]}",
    "10 MB identifier": "a" * 10_000_000,
    "10 MB number": "cuvil.func @f() -> () attributes {symbols = {s0 = [" + "7" * 10_000_000 + ", 1]}} {",
    "10 MB zeros": HEAD + "  %0 = cuvil.argmax %x {dim = " + "0" * 10_000_000 + "} : tensor<4xf32> -> "
                   "tensor<i64>\n" + TAIL,
    "10 MB float": HEAD + "  %0 = cuvil.clamp %x {min = 1." + "5" * 10_000_000 + "}",
    "10 MB string": HEAD + '  %0 = cuvil.gelu %x {approximate = "' + "a" * 10_000_000 + '"}',
    "10 MB comment": "// " + "x" * 10_000_000 + "\n",
    "10 MB line of spaces": " " * 10_000_000 + "x",
    "10 MB type": HEAD + "  %0 = cuvil.relu %x : tensor<" + "1x" * 5_000_000 + "f32> -> tensor<4xf32>",
    "many operands": HEAD + "  %0 = cuvil.cat " + ", ".join(["%x"] * 10_000) + " {dim = 0} : (" +
                     ", ".join(["tensor<4xf32>"] * 10_000) + ") -> tensor<40000xf32>\n" +
                     "  cuvil.return %x : tensor<4xf32>\n}\n",
    "many ops": HEAD + "".join(f"  %{i} = cuvil.relu %x : tensor<4xf32> -> tensor<4xf32>\n" for i in range(5000))
                + TAIL,
    "many functions": "".join(f"cuvil.func @f{i}() -> () {{\n  cuvil.return\n}}\n" for i in range(2000)),
    "NUL bytes": "\x00" * 1000,
    "CR only": HEAD.replace("\n", "\r") + TAIL.replace("\n", "\r"),
    "BOM then text": "\ufeff" + HEAD + TAIL,
    "BOM inside": HEAD + "\ufeff" + TAIL,
    "huge dims": HEAD.replace("tensor<4xf32>) ->", "tensor<18446744073709551616xf32>) ->") + TAIL,
    "dim 2**63 - 1": "cuvil.func @f(%x: tensor<9223372036854775807xf32>) -> tensor<9223372036854775807xf32> {\n"
                     "  cuvil.return %x : tensor<9223372036854775807xf32>\n}\n",
    "element count overflows int64": "cuvil.func @f(%x: tensor<4294967296x4294967296xf32>) -> "
                                     "tensor<4294967296x4294967296xf32> {\n  cuvil.return %x : "
                                     "tensor<4294967296x4294967296xf32>\n}\n",
    "zero dims": "cuvil.func @f(%x: tensor<0x4xf32>) -> tensor<0x4xf32> {\n  %0 = cuvil.relu %x : "
                 "tensor<0x4xf32> -> tensor<0x4xf32>\n  cuvil.return %0 : tensor<0x4xf32>\n}\n",
    "negative dim": HEAD.replace("tensor<4xf32>) ->", "tensor<-1xf32>) ->") + TAIL,
    "nan dim": HEAD.replace("tensor<4xf32>) ->", "tensor<nanxf32>) ->") + TAIL,
    "float dim": HEAD.replace("tensor<4xf32>) ->", "tensor<(1.5)xf32>) ->") + TAIL,
    "literal dtype mismatch": HEAD + "  %0 = cuvil.literal {value = 1.5, dtype = i64} : tensor<i64>\n" + TAIL,
    "big symbolic power": "cuvil.func @f(%x: tensor<(" + "*".join(["s0"] * 100) + ")xf32>) -> tensor<4xf32> "
                          "attributes {symbols = {s0 = [1, 2]}} {\n" + TAIL,
    "nested floor and mod": "cuvil.func @f(%x: tensor<(" + "(" * 40 + "s0" + "".join(
        f" {'//' if i % 2 else '%'} {i + 2})" for i in range(40)) + ")xf32>) -> tensor<4xf32> "
        "attributes {symbols = {s0 = [1, 2]}} {\n" + TAIL,
}


@pytest.mark.parametrize("name", BOMBS)
def test_bombs_and_edge_cases(oracle, name):
    oracle.check(BOMBS[name])


def test_invalid_utf8_bytes_are_a_parse_error(oracle):
    assert oracle.check(HEAD.encode() + b"  \xc3\x28\n" + TAIL.encode()) is None
    assert oracle.check(b"\xff\xfe" + HEAD.encode()) is None


# ----------------------------------------------------------------------------- every op, odd operands and attributes

OPERAND_TYPES = ["tensor<4xf32>", "tensor<2x3xf32>", "tensor<s0x3xf32>", "tensor<s0xs1x4x4xf32>", "tensor<f32>",
                 "tensor<0x3xi64>", "tensor<2x3xi1>", "tensor<(s0 + 1)x2xi32>", "tensor<3x(2*s1)xf16>"]
ATTR_VALUES = ["0", "1", "-1", "2", "5", "-9223372036854775808", "9223372036854775807", "1.5", "-0.0", "inf", "nan",
               "true", "false", "none", '"none"', '"tanh"', '"x"', "f32", "i1", "[]", "[0]", "[1, 0]", "[-1]",
               "[0, 0]", "[2, 2]", "[1, 2, 3, 4]", "[s0]", "[s0, 3]", "[s0 - 1]", "[s1 // 2, 4]", "[s0 % 2]",
               "[0, 9223372036854775807]", "[-5, 5]", "[1.5]", "[true]", "[[1]]", "{a = 1}", "[3, -1]", "[0, 1, 2, 3]"]


@st.composite
def op_calls(draw):
    """One op of the registry with operands of assorted types, attributes drawn from a pool of odd
    values (declared names mostly), and a result type that may or may not be the inferred one."""
    op = draw(st.sampled_from([op for op in builtin_ops() if op.name not in ("cuvil.return", "cuvil.const")]))
    lo, hi = op.operand_range()
    n = draw(st.integers(lo, lo + 2 if hi is None else hi))
    types = [draw(st.sampled_from(OPERAND_TYPES)) for _ in range(n)]
    names = list(op.attrs) + ["bogus"]
    keys = draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names)))
    attrs = ", ".join(f"{k} = {draw(st.sampled_from(ATTR_VALUES))}" for k in keys if k != "bogus" or
                      draw(st.integers(0, 9)) == 0)
    result = draw(st.sampled_from(OPERAND_TYPES + ["tensor<i64>", "tensor<2xf32>"]))
    args = ", ".join(f"%a{i}: {t}" for i, t in enumerate(types))
    operands = ", ".join(f"%a{i}" for i in range(n))
    signature = f"({', '.join(types)}) -> {result}" if n else result
    return (f"cuvil.func @f({args}) -> {result} attributes {{symbols = {{s0 = [1, 8], s1 = [1, 8]}}}} {{\n"
            f"  %0 = {op.name} {operands} {{{attrs}}} : {signature}\n  cuvil.return %0 : {result}\n}}\n")


@settings(FUZZ, max_examples=3 * FUZZ.max_examples)
@given(op_calls())
def test_every_op_with_odd_operands_and_attributes(oracle, text):
    oracle.check(text)
