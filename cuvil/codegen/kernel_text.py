"""Kernel IR text form: printer and parser (`parse_kernels(print_kernel(k))` prints identically).

```
kernel @softmax_0(%x: in f32[s0, 512], %out: out f32[s0, 512]) dims(s0) {
  parallel for i0 in 0..s0 {
    %m = reduce max(-inf:f32) for i1 in 0..512 {
      yield %x[i0, i1]
    }
    ...
    for i1 in 0..512 {
      %out[i0, i1] = div(exp(sub(%x[i0, i1], %m)), %s)
    }
  }
}
```

Bare names (`i0`, `s0`) are integers of the index space: loop variables and symbols. `%` names are
buffers and scalars. Constants carry their type (`0.5:f32`, `3:i64`, `true:i1`). A comment is `// `
(slashes then a space, or alone at the end of a line) after whitespace or at the start of a line;
`a//b` is floor division.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

import sympy

from ..errors import CuvilParseError
from ..ir.types import DType, sym
from .kernel_ir import (FUNCS, GEMM_INTS, GEMM_TAPS, GEMM_WINDOW, REDUCE_KINDS, ROLES, TOPK_INTS, BufRef, Buffer,
                        Call, Cast, Check, Const, Expr, Gemm, Index, Kernel, Let, Load, Loop, Range, Reduce, Store, TopK, Var,
                        loop_var, operands, scalar_index)

INDENT = "  "


# ----------------------------------------------------------------------------- index expressions

def index_str(e) -> str:
    """Print an index expression with + - * // % min max and parentheses."""
    if isinstance(e, int):
        return str(e)
    e = sympy.sympify(e)
    if e.is_Integer:
        return str(int(e))
    if e.is_Symbol:
        return e.name
    if e.is_Add:  # constants last: `2*i0 + j0 - 1`
        terms = sorted(e.args, key=lambda t: (t.is_Number, sympy.default_sort_key(t)))
        out = _operand(terms[0], loose=True)
        for t in terms[1:]:
            s = _operand(t, loose=True)
            out += f" - {s[1:]}" if s.startswith("-") else f" + {s}"
        return out
    if e.is_Mul:
        coeff, rest = e.as_coeff_Mul()
        if not coeff.is_Integer:
            raise ValueError(f"index expression {e} is not an integer expression")
        body = "*".join(_operand(f) for f in sorted(sympy.Mul.make_args(rest), key=sympy.default_sort_key))
        return {1: body, -1: "-" + body}.get(int(coeff), f"{int(coeff)}*{body}")
    if e.is_Pow and e.exp.is_Integer and e.exp > 0:
        return "*".join([_operand(e.base)] * int(e.exp))
    if isinstance(e, (sympy.floor, sympy.ceiling)):
        num, den = sympy.fraction(sympy.together(e.args[0]))
        if isinstance(e, sympy.floor):
            return f"{_operand(num)}//{_operand(den)}"
        return f"cdiv({index_str(num)}, {index_str(den)})"
    if isinstance(e, sympy.Mod):
        return f"{_operand(e.args[0])} % {_operand(e.args[1])}"
    if isinstance(e, (sympy.Min, sympy.Max)):
        name = "min" if isinstance(e, sympy.Min) else "max"
        args = sorted(e.args, key=sympy.default_sort_key)
        return f"{name}({', '.join(index_str(a) for a in args)})"
    raise ValueError(f"index expression {e} cannot be printed")


def _operand(e, loose: bool = False) -> str:
    s = index_str(e)
    if e.is_Atom or isinstance(e, (sympy.Min, sympy.Max, sympy.ceiling)) or (loose and e.is_Mul):
        return s
    return "(" + s + ")"


# ----------------------------------------------------------------------------- printer

class _Names:
    """Maps buffer/scalar names for printing; `canonical` numbers them by first appearance."""

    def __init__(self, canonical: bool):
        self.canonical = canonical
        self.map: dict[tuple[str, str], str] = {}

    def __call__(self, name: str, prefix: str = "v") -> str:
        if not self.canonical:
            return name
        key = (prefix, name)
        if key not in self.map:
            self.map[key] = f"{prefix}{sum(1 for p, _ in self.map if p == prefix)}"
        return self.map[key]


def format_float(v: float) -> str:
    return repr(float(v))


@dataclass
class LineMap:
    """Where `print_kernel` put a kernel's statements (1-based lines; names do not move them, so
    the canonical and the readable text agree) and which graph ops (`origin`) each line computes."""
    statements: dict[int, int] = field(default_factory=dict)    # id(statement) -> its line
    yields: dict[int, int] = field(default_factory=dict)        # id(Reduce) -> the line of its `yield`
    nodes: list[tuple[int, int | None]] = field(default_factory=list)   # (line, origin) per node, in text order

    def statement(self, s, line: int) -> None:
        self.statements[id(s)] = line
        if not isinstance(s, Loop):
            self.nodes.append((line, s.origin))

    def expression(self, e: Expr, line: int) -> None:
        self.nodes.append((line, e.origin))
        for sub in operands(e):
            self.expression(sub, line)

    def slots(self) -> dict[int, int]:
        """op id -> 1, 2, ... in the order the ops first appear: the column of their debug locations
        (a number that depends only on the kernel's structure, unlike op ids)."""
        out: dict[int, int] = {}
        for _, origin in self.nodes:
            if origin is not None and origin not in out:
                out[origin] = len(out) + 1
        return out

    def layout(self) -> str:
        """The slot of every node, line by line: kernels that print alike but whose nodes come from
        differently split ops differ here (their debug locations differ)."""
        slots, by_line = self.slots(), {}
        for line, origin in self.nodes:
            by_line.setdefault(line, []).append(str(slots.get(origin, 0)))
        return ";".join(f"{line}:{','.join(s)}" for line, s in by_line.items())

    def ops_by_line(self) -> dict[int, list[int]]:
        """line -> the ops its statement and expressions came from, in slot order."""
        slots, out = self.slots(), {}
        for line, origin in self.nodes:
            if origin is not None:
                out.setdefault(line, set()).add(origin)
        return {line: sorted(ops, key=slots.get) for line, ops in out.items()}


def print_kernel(k: Kernel, canonical: bool = False, lines: LineMap | None = None) -> str:
    """The kernel's text. `canonical=True` renames the kernel, buffers and scalars by position, so
    kernels that differ only in names print the same (the structural-identity key). `lines`, when
    given, records where each statement went."""
    names = _Names(canonical)
    params = []
    for b in k.buffers + k.locals:
        text = f"%{names(b.name, 'b')}: {b.role} {b.dtype}[{', '.join(index_str(d) for d in b.shape)}]"
        if b.strides is not None:
            text += f" strides [{', '.join(index_str(d) for d in b.strides)}]"
        params.append(text)
    dims = f" dims({', '.join(k.symbols)})" if k.symbols else ""
    text = [f"kernel @{'kernel' if canonical else k.name}({', '.join(params)}){dims} {{"]
    _print_block(k.body, 1, text, names, lines if lines is not None else LineMap())
    text.append("}")
    return "\n".join(text) + "\n"


def print_kernels(kernels) -> str:
    return "\n".join(print_kernel(k) for k in kernels)


def _range_str(var: str, start, extent) -> str:
    return f"{var} in {index_str(start)}..{index_str(sympy.sympify(start) + extent)}"


def _print_block(stmts, depth: int, lines: list[str], names: _Names, where: LineMap) -> None:
    pad = INDENT * depth
    for s in stmts:
        here = len(lines) + 1
        where.statement(s, here)
        if isinstance(s, Loop):
            par = "parallel " if s.parallel else ""
            lines.append(f"{pad}{par}for {_range_str(s.var, s.start, s.extent)} {{")
            _print_block(s.body, depth + 1, lines, names, where)
            lines.append(pad + "}")
        elif isinstance(s, Let):
            where.expression(s.value, here)
            lines.append(f"{pad}%{names(s.var.name)} = {expr_str(s.value, names)}")
        elif isinstance(s, Check):
            where.expression(s.value, here)
            lines.append(f"{pad}check %{names(s.buf.name, 'b')}, {expr_str(s.value, names)}")
        elif isinstance(s, Store):
            where.expression(s.value, here)
            lines.append(f"{pad}{_access(s.buf, s.index, names)} = {expr_str(s.value, names)}")
        elif isinstance(s, Reduce):
            where.expression(s.init, here)
            ranges = ", ".join(_range_str(r.var, r.start, r.extent) for r in s.loops)
            lines.append(f"{pad}%{names(s.var.name)} = reduce {s.kind}({expr_str(s.init, names)}) for {ranges} {{")
            _print_block(s.body, depth + 1, lines, names, where)
            where.yields[id(s)] = len(lines) + 1
            where.expression(s.value, len(lines) + 1)
            lines.append(f"{pad}{INDENT}yield {expr_str(s.value, names)}")
            lines.append(pad + "}")
        elif isinstance(s, Gemm):
            refs = [_ref_str(r, getattr(s, r), names) for r in ("c", "a", "b")]
            ints = [f"{f}={index_str(getattr(s, f))}" for f in GEMM_INTS]
            rest = [f"trans_a={str(s.trans_a).lower()}", f"trans_b={str(s.trans_b).lower()}",
                    f"alpha={format_float(s.alpha)}", f"beta={format_float(s.beta)}"] + \
                ([f"b_panels={s.b_panels}"] if s.b_panels else []) + \
                ([f"{f}={index_str(getattr(s, f))}" for f in GEMM_WINDOW] if s.a_rows is not None else []) + \
                ([f"{f}={index_str(getattr(s, f))}" for f in GEMM_TAPS] if s.dilated else []) + \
                ([_ref_str("bias", s.bias, names)] if s.bias is not None else []) + \
                (["bias_rows=true"] if s.bias_rows else []) + (["relu=true"] if s.relu else [])
            lines.append(f"{pad}gemm {', '.join(refs + ints + rest)}")
        elif isinstance(s, TopK):
            refs = [_ref_str(r, getattr(s, r), names) for r in ("dst", "src")]
            ints = [f"{f}={index_str(getattr(s, f))}" for f in TOPK_INTS]
            order = [f"order={s.order}"] if s.order != "stable" else []
            lines.append(f"{pad}topk {', '.join(refs + ints + [f'largest={str(s.largest).lower()}'] + order)}")
        else:
            raise TypeError(f"unknown statement {s!r}")


def _ref_str(field: str, ref: BufRef, names: _Names) -> str:
    return f"{field}=%{names(ref.buf.name, 'b')}[{index_str(ref.offset)}]"


def _access(buf: Buffer, index, names: _Names) -> str:
    entries = (expr_str(i, names) if isinstance(i, Expr) else index_str(i) for i in index)
    return f"%{names(buf.name, 'b')}[{', '.join(entries)}]"


def expr_str(e: Expr, names: Callable[[str], str] = lambda n: n) -> str:
    if isinstance(e, Const):
        if e.dtype == DType.bool:
            v = str(e.value).lower()
        elif e.dtype.is_float:
            v = format_float(e.value)
        else:
            v = str(e.value)
        return f"{v}:{e.dtype}"
    if isinstance(e, Var):
        return f"%{names(e.name)}"
    if isinstance(e, Load):
        access = _access(e.buf, e.index, names)
        if e.mask is None:
            return access
        return f"masked({access}, {expr_str(e.mask, names)}, {expr_str(e.other, names)})"
    if isinstance(e, Index):
        return f"index({index_str(e.expr)})"
    if isinstance(e, Call):
        return f"{e.fn}({', '.join(expr_str(a, names) for a in e.args)})"
    if isinstance(e, Cast):
        return f"cast<{e.dtype}>({expr_str(e.value, names)})"
    raise TypeError(f"unknown expression {e!r}")


# ----------------------------------------------------------------------------- tokenizer

_TOKEN = re.compile(r"""
    (?P<comment>(?:^|(?<=[ \t]))//(?:[ \t][^\n]*)?$) | (?P<ws>[ \t]+) | (?P<nl>\n)
  | (?P<kname>@[A-Za-z0-9_.$]+) | (?P<pname>%[A-Za-z0-9_][A-Za-z0-9_.$]*)
  | (?P<num>\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>\.\.|//|[-+*%()\[\]{},:=<>])
""", re.VERBOSE | re.MULTILINE)


class _Tok:
    __slots__ = ("kind", "text", "line", "col")

    def __init__(self, kind, text, line, col):
        self.kind, self.text, self.line, self.col = kind, text, line, col


def _tokenize(text: str, filename: str) -> list[_Tok]:
    toks, line, line_start, pos = [], 1, 0, 0
    lines = text.split("\n")
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            col = pos - line_start + 1
            raise CuvilParseError(f"unexpected character {text[pos]!r}", line, col, lines[line - 1], filename)
        kind = m.lastgroup
        if kind == "nl":
            toks.append(_Tok("nl", "\n", line, pos - line_start + 1))
            line, line_start = line + 1, m.end()
        elif kind not in ("ws", "comment"):
            toks.append(_Tok(kind, m.group(), line, pos - line_start + 1))
        pos = m.end()
    toks.append(_Tok("eof", "", line, pos - line_start + 1))
    return toks


# ----------------------------------------------------------------------------- parser

class _Parser:
    def __init__(self, text: str, filename: str):
        self.lines = text.split("\n")
        self.filename = filename
        self.toks = _tokenize(text, filename)
        self.i = 0
        # per kernel
        self.buffers: dict[str, Buffer] = {}
        self.symbols: set[str] = set()
        self.scopes: list[dict[str, object]] = []

    # -- token helpers
    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def error(self, msg: str, tok: _Tok | None = None):
        tok = tok or self.tok
        src = self.lines[tok.line - 1] if tok.line - 1 < len(self.lines) else ""
        return CuvilParseError(msg, tok.line, tok.col, src, self.filename)

    def skip_nl(self):
        while self.tok.kind == "nl":
            self.i += 1

    def next(self) -> _Tok:
        t = self.tok
        self.i += 1
        return t

    def at(self, text: str) -> bool:
        return self.tok.text == text and self.tok.kind in ("punct", "ident")

    def accept(self, text: str) -> bool:
        if self.at(text):
            self.i += 1
            return True
        return False

    def expect(self, text: str, what: str | None = None) -> _Tok:
        if not self.at(text):
            got = "end of line" if self.tok.kind == "nl" else repr(self.tok.text) or "end of input"
            raise self.error(f"expected {what or repr(text)}, got {got}")
        return self.next()

    def expect_kind(self, kind: str, what: str) -> _Tok:
        if self.tok.kind != kind:
            got = "end of line" if self.tok.kind == "nl" else repr(self.tok.text) or "end of input"
            raise self.error(f"expected {what}, got {got}")
        return self.next()

    def end_of_line(self):
        if self.tok.kind not in ("nl", "eof"):
            raise self.error(f"expected end of line, got {self.tok.text!r}")
        self.skip_nl()

    # -- kernels
    def parse(self) -> list[Kernel]:
        kernels = []
        self.skip_nl()
        while self.tok.kind != "eof":
            kernels.append(self.kernel())
            self.skip_nl()
        return kernels

    def kernel(self) -> Kernel:
        self.expect("kernel", "'kernel'")
        name = self.expect_kind("kname", "a kernel name like @k0").text[1:]
        self.buffers, self.symbols, self.scopes = {}, set(), [{}]
        pending = []
        self.expect("(")
        if not self.at(")"):
            while True:
                pending.append(self.buffer_decl())
                if not self.accept(","):
                    break
        self.expect(")")
        symbols = []
        if self.accept("dims"):
            self.expect("(")
            while not self.at(")"):
                t = self.expect_kind("ident", "a symbol name")
                if t.text in symbols:
                    raise self.error(f"symbol {t.text} is listed twice", t)
                symbols.append(t.text)
                if not self.accept(","):
                    break
            self.expect(")")
        self.symbols = set(symbols)
        buffers = []
        for tok, make in pending:  # shapes may use symbols declared after the parameters
            buffers.append(make())
            if buffers[-1].name in self.buffers:
                raise self.error(f"buffer %{buffers[-1].name} is declared twice", tok)
            self.buffers[buffers[-1].name] = buffers[-1]
        self.expect("{")
        self.end_of_line()
        body = self.block()
        return Kernel(name, [b for b in buffers if b.role != "local"], symbols, body,
                      [b for b in buffers if b.role == "local"])

    def buffer_decl(self):
        tok = self.expect_kind("pname", "a buffer parameter like %x")
        self.expect(":")
        role_tok = self.expect_kind("ident", "a role (in, out, scratch, status, local)")
        if role_tok.text not in ROLES:
            raise self.error(f"unknown buffer role '{role_tok.text}' (expected {', '.join(ROLES)})", role_tok)
        dtype = self.dtype()
        shape_toks = self.raw_bracket()
        stride_toks = None
        if self.accept("strides"):
            stride_toks = self.raw_bracket()

        def make():
            shape = self.reparse_index_list(shape_toks)
            strides = None if stride_toks is None else self.reparse_index_list(stride_toks)
            try:
                return Buffer(tok.text[1:], dtype, shape, role_tok.text, strides)
            except ValueError as e:
                raise self.error(str(e), tok) from None
        return tok, make

    def raw_bracket(self) -> tuple[int, int]:
        """Skip `[ ... ]` and return its token span; parsed once the symbols are known."""
        start = self.i
        self.expect("[")
        while not self.at("]"):
            if self.tok.kind in ("nl", "eof"):
                raise self.error("expected ']'")
            self.i += 1
        self.i += 1
        return start, self.i

    def reparse_index_list(self, span) -> list:
        saved = self.i
        self.i = span[0]
        out = self.index_list("[", "]")
        self.i = saved
        return out

    def dtype(self) -> DType:
        t = self.expect_kind("ident", "a dtype")
        try:
            return DType.from_name(t.text)
        except KeyError:
            raise self.error(f"unknown dtype '{t.text}'", t) from None

    # -- scopes
    def define(self, name: str, value, tok: _Tok):
        for scope in self.scopes:
            if name in scope:
                raise self.error(f"{name} is already defined", tok)
        if name in self.symbols:
            raise self.error(f"{name} is already a symbol", tok)
        if name.startswith("%") and name[1:] in self.buffers:
            raise self.error(f"{name} is already a buffer", tok)
        self.scopes[-1][name] = value

    def lookup(self, name: str):
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    # -- statements
    def block(self) -> list:
        stmts = []
        while not self.at("}"):
            if self.tok.kind == "eof":
                raise self.error("expected '}' to close the block")
            stmts.append(self.statement())
        self.next()
        self.end_of_line()
        return stmts

    def statement(self):
        tok = self.tok
        if self.at("parallel") or self.at("for"):
            parallel = self.accept("parallel")
            self.expect("for")
            rng = self.range_head()
            self.expect("{")
            self.end_of_line()
            self.scopes.append({})
            self.define(rng.var, "loop", tok)
            body = self.block()
            self.scopes.pop()
            return Loop(rng.var, rng.start, rng.extent, body, parallel)
        if self.at("gemm"):
            return self.gemm()
        if self.at("topk"):
            return self.topk()
        if self.at("check"):
            return self.check()
        if tok.kind != "pname":
            raise self.error(f"expected a statement, got {tok.text!r}")
        if self.toks[self.i + 1].text == "[":
            buf = self.buffer_ref()
            index = self.index_list("[", "]")
            self.expect("=")
            value = self.expr()
            self.end_of_line()
            if buf.role == "in":
                raise self.error(f"cannot store into input buffer %{buf.name}", tok)
            return self.build(tok, Store, buf, index, value)
        self.next()
        self.expect("=")
        name = tok.text[1:]
        if self.accept("reduce"):
            return self.reduce(tok, name)
        value = self.expr()
        self.end_of_line()
        var = Var(name, value.dtype)
        self.define("%" + name, var, tok)
        return Let(var, value)

    def build(self, tok: _Tok, cls, *args):
        try:
            return cls(*args)
        except ValueError as e:
            raise self.error(str(e), tok) from None

    def range_head(self) -> Range:
        t = self.expect_kind("ident", "a loop variable")
        self.expect("in")
        start = self.index_expr()
        self.expect("..")
        end = self.index_expr()
        return Range(t.text, start, sympy.sympify(end) - start)

    def reduce(self, tok: _Tok, name: str):
        kind = self.expect_kind("ident", "a reduction kind")
        if kind.text not in REDUCE_KINDS:
            raise self.error(f"unknown reduction '{kind.text}' (expected {', '.join(REDUCE_KINDS)})", kind)
        self.expect("(")
        init = self.expr()
        self.expect(")")
        self.expect("for")
        self.scopes.append({})
        loops = []
        while True:
            head_tok = self.tok
            rng = self.range_head()
            self.define(rng.var, "loop", head_tok)
            loops.append(rng)
            if not self.accept(","):
                break
        self.expect("{")
        self.end_of_line()
        body = []
        while not self.at("yield"):
            if self.at("}") or self.tok.kind == "eof":
                raise self.error("a reduction body must end with 'yield <value>'")
            body.append(self.statement())
        self.next()
        value = self.expr()
        self.end_of_line()
        self.expect("}")
        self.end_of_line()
        self.scopes.pop()
        var = Var(name, init.dtype)
        stmt = self.build(tok, Reduce, var, kind.text, loops, init, body, value)
        self.define("%" + name, var, tok)
        return stmt

    def gemm(self):
        tok = self.next()
        fields = self.call_fields("gemm", {**dict.fromkeys(("a", "b", "c", "bias"), "ref"),
                                           **dict.fromkeys(GEMM_INTS + GEMM_WINDOW + GEMM_TAPS, "index"),
                                           "b_panels": "int", **dict.fromkeys(("trans_a", "trans_b", "relu", "bias_rows"), "bool"),
                                           "alpha": "float", "beta": "float"})
        missing = [f for f in ("c", "a", "b") + GEMM_INTS if f not in fields]
        if missing:
            raise self.error(f"gemm is missing {', '.join(missing)}", tok)
        return self.build(tok, lambda: Gemm(**fields))

    def topk(self):
        tok = self.next()
        fields = self.call_fields("topk", {"dst": "ref", "src": "ref", **dict.fromkeys(TOPK_INTS, "index"),
                                           "largest": "bool", "order": "word"})
        missing = [f for f in ("dst", "src") + TOPK_INTS if f not in fields]
        if missing:
            raise self.error(f"topk is missing {', '.join(missing)}", tok)
        return self.build(tok, lambda: TopK(**fields))

    def check(self):
        tok = self.next()
        buf = self.buffer_ref()
        self.expect(",")
        value = self.expr()
        self.end_of_line()
        return self.build(tok, Check, buf, value)

    def call_fields(self, what: str, kinds: dict[str, str]) -> dict:
        """`name=value, ...` to the end of the line, each value parsed as its kind says: a buffer
        reference (`%b[offset]`), an index expression, a whole number, true/false or a float."""
        fields = {}
        while True:
            key = self.expect_kind("ident", f"a {what} field")
            if key.text in fields:
                raise self.error(f"{what} field '{key.text}' given twice", key)
            if key.text not in kinds:
                raise self.error(f"unknown {what} field '{key.text}'", key)
            self.expect("=")
            kind = kinds[key.text]
            if kind == "ref":
                buf = self.buffer_ref()
                self.expect("[")
                off = self.index_expr()
                self.expect("]")
                fields[key.text] = BufRef(buf, off)
            elif kind == "index":
                fields[key.text] = self.index_expr()
            elif kind == "int":
                width = self.expect_kind("num", "a whole number")
                if not width.text.isdigit():
                    raise self.error(f"expected a whole number, got {width.text!r}", width)
                fields[key.text] = int(width.text)
            elif kind == "word":
                fields[key.text] = self.expect_kind("ident", "a word").text
            elif kind == "bool":
                v = self.expect_kind("ident", "true or false")
                if v.text not in ("true", "false"):
                    raise self.error("expected true or false", v)
                fields[key.text] = v.text == "true"
            else:
                fields[key.text] = self.float_literal()
            if not self.accept(","):
                break
        self.end_of_line()
        return fields

    def buffer_ref(self) -> Buffer:
        t = self.expect_kind("pname", "a buffer")
        buf = self.buffers.get(t.text[1:])
        if buf is None:
            raise self.error(f"unknown buffer {t.text}", t)
        return buf

    # -- scalar expressions
    def float_literal(self) -> float:
        neg = self.accept("-")
        t = self.tok
        if t.kind == "num":
            v = float(self.next().text)
        elif t.text in ("inf", "nan"):
            v = float(self.next().text)
        else:
            raise self.error("expected a number")
        return -v if neg else v

    def expr(self) -> Expr:
        t = self.tok
        if t.kind == "num" or t.text in ("-", "inf", "nan", "true", "false"):
            return self.const()
        if t.kind == "pname":
            if self.toks[self.i + 1].text == "[":
                buf = self.buffer_ref()
                return self.build(t, Load, buf, self.index_list("[", "]", scalars=True))
            self.next()
            var = self.lookup(t.text)
            if var is None:
                raise self.error(f"unknown value {t.text}", t)
            return var
        if t.kind != "ident":
            raise self.error(f"expected an expression, got {t.text!r}")
        self.next()
        if t.text == "index":
            self.expect("(")
            e = self.index_expr()
            self.expect(")")
            return Index(e)
        if t.text == "cast":
            self.expect("<")
            dt = self.dtype()
            self.expect(">")
            self.expect("(")
            v = self.expr()
            self.expect(")")
            return Cast(v, dt)
        if t.text == "masked":
            self.expect("(")
            lt = self.tok
            buf = self.buffer_ref()
            idx = self.index_list("[", "]", scalars=True)
            self.expect(",")
            mask = self.expr()
            self.expect(",")
            other = self.expr()
            self.expect(")")
            return self.build(lt, Load, buf, idx, mask, other)
        if t.text not in FUNCS:
            raise self.error(f"unknown scalar function '{t.text}'", t)
        self.expect("(")
        args = []
        while True:
            args.append(self.expr())
            if not self.accept(","):
                break
        self.expect(")")
        return self.build(t, Call, t.text, args)

    def const(self) -> Const:
        t = self.tok
        if t.text in ("true", "false"):
            self.next()
            value = t.text == "true"
        else:
            neg = self.accept("-")
            n = self.tok
            if n.kind != "num" and n.text not in ("inf", "nan"):
                raise self.error("expected a number")
            self.next()
            text = ("-" if neg else "") + n.text
            value = int(text) if re.fullmatch(r"-?\d+", text) else float(text)
        self.expect(":", "':' and the constant's dtype")
        dt = self.dtype()
        if isinstance(value, bool) != (dt == DType.bool):
            raise self.error(f"constant {t.text} cannot have type {dt}", t)
        if isinstance(value, float) and not dt.is_float:
            raise self.error(f"constant {value!r} cannot have integer type {dt}", t)
        return self.build(t, Const, value, dt)

    # -- index expressions
    def index_list(self, open_: str, close: str, scalars: bool = False) -> list:
        """Index expressions; with `scalars`, an entry starting with `%` or `cast<` is an integer
        scalar expression (a load index read from memory)."""
        self.expect(open_)
        out = []
        if not self.at(close):
            while True:
                if scalars and (self.tok.kind == "pname" or (self.at("cast") and self.toks[self.i + 1].text == "<")):
                    out.append(self.expr())
                else:
                    out.append(self.index_expr())
                if not self.accept(","):
                    break
        self.expect(close)
        return out

    def index_expr(self):
        e = self.index_term()
        while self.at("+") or self.at("-"):
            op = self.next().text
            rhs = self.index_term()
            e = e + rhs if op == "+" else e - rhs
        return e

    def index_term(self):
        e = self.index_unary()
        while self.at("*") or self.at("//") or self.at("%") or self.tok.kind == "pname":
            if self.tok.kind == "pname":  # `a%3` lexes as a name: read it as `a % 3`
                t = self.next()
                rhs = self.index_atom(_Tok("num" if t.text[1:].isdigit() else "ident", t.text[1:], t.line, t.col + 1))
                e = sympy.Mod(e, rhs)
                continue
            op = self.next().text
            rhs = self.index_unary()
            if op == "*":
                e = e * rhs
            elif op == "//":
                e = sympy.floor(sympy.sympify(e) / rhs)
            else:
                e = sympy.Mod(e, rhs)
        return e

    def index_unary(self):
        if self.accept("-"):
            return -self.index_unary()
        if self.accept("("):
            e = self.index_expr()
            self.expect(")")
            return e
        t = self.next()
        if t.kind == "ident" and t.text in ("min", "max", "cdiv") and self.at("("):
            args = self.index_list("(", ")")
            if t.text == "cdiv":
                if len(args) != 2:
                    raise self.error("cdiv takes two arguments", t)
                return sympy.ceiling(sympy.sympify(args[0]) / args[1])
            if not args:
                raise self.error(f"{t.text} needs arguments", t)
            return (sympy.Min if t.text == "min" else sympy.Max)(*args)
        return self.index_atom(t)

    def index_atom(self, t: _Tok):
        if t.kind == "num":
            if not t.text.isdigit():
                raise self.error(f"index expressions are integers, not {t.text}", t)
            return sympy.Integer(int(t.text))
        if t.kind == "ident":
            if self.lookup(t.text) == "loop":
                return loop_var(t.text)
            if t.text in self.symbols:
                return sym(t.text)
            scalar = self.lookup("%" + t.text)      # an integer scalar read at run time (a grouped GEMM's rows)
            if isinstance(scalar, Var) and scalar.dtype in (DType.i64, DType.i32, DType.i8):
                return scalar_index(t.text)
            raise self.error(f"unknown index name '{t.text}' (not a loop variable in scope, an integer scalar "
                             f"defined before it, or a symbol listed in dims(...))", t)
        raise self.error(f"expected an index expression, got {t.text!r}", t)


def parse_kernels(text: str, filename: str = "<text>") -> list[Kernel]:
    """Parse kernel IR text (one or more kernels)."""
    return _Parser(text, filename).parse()


def parse_kernel(text: str, filename: str = "<text>") -> Kernel:
    kernels = parse_kernels(text, filename)
    if len(kernels) != 1:
        raise CuvilParseError(f"expected one kernel, found {len(kernels)}", 1, 1, text.split("\n")[0], filename)
    return kernels[0]
