"""Text -> graph IR: a hand-written recursive-descent parser (grammar in docs/ir.md).

Every malformed input raises `CuvilParseError` at the offending token, saying what was expected.
Result types are taken from the text; the verifier then checks them against shape inference, and
its errors are reported at the op's line:column. Recursion only follows nesting in the text, which
is capped at `MAX_NESTING` levels; every loop consumes a token per round.
"""
from __future__ import annotations

import difflib
import math
import os
from typing import Any

import sympy

from ..errors import CuvilParseError, CuvilVerifyError
from .core import OP_REGISTRY, Function, Loc, Module, Operation, Value, is_discardable, lookup_op
from .lexer import DTYPE_NAMES, KEYWORDS, SYMBOL_NAME, VALUE_HINT, Lexer, Source, Token
from .printer import NAME_ATTR, RETURN_OP, attr_value_str
from .types import DType, TensorType, expr_str, floordiv, norm_dim, sym
from .verifier import attr_kind_ok, verify

MAX_NESTING = 64        # nested lists/dicts in attribute values plus parentheses in dimension expressions
MAX_DIM_ATOMS = 100     # numbers and symbols in one dimension expression
MAX_NUMBER_CHARS = 400  # a longer number literal is refused before it is converted
MAX_RANK = 64           # dimensions of one tensor type (torch's own limit)
INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1

_WORD_VALUES: dict[str, Any] = {"true": True, "false": False, "none": None,
                                **{d.value: d for d in DType}}
_FLOAT_WORDS = {"inf": math.inf, "nan": math.nan}
_KIND_TEXT = {"int": "an int", "float": "a number", "bool": "true or false", "str": "a string",
              "ints": "a list of ints", "floats": "a list of numbers", "dims": "a list of dimensions",
              "dtype": "a dtype (" + ", ".join(d.value for d in DType) + ")", "int?": "an int or none",
              "float?": "a number or none", "any": "a number or true/false"}


def parse(text: str | bytes, filename: str = "<text>") -> Module:
    """Parse a module from IR text (bytes are decoded as UTF-8) and verify it."""
    if isinstance(text, bytes):
        text = _decode(text, filename)
    if text.startswith("\ufeff"):
        text = text[1:]
    return _Parser(text, filename).parse_module()


def parse_file(path: str | os.PathLike) -> Module:
    with open(path, "rb") as f:
        return parse(f.read(), os.fspath(path))


def _decode(data: bytes, filename: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        valid = data[:e.start].decode("utf-8")
        raise Source(valid, filename).error(f"invalid UTF-8 byte 0x{data[e.start]:02x}", len(valid)) from None


class _Parser:
    def __init__(self, text: str, filename: str):
        self.src = Source(text, filename)
        self.lexer = Lexer(self.src)
        self.tok = self.lexer.next()
        self.prev_end = 0                       # end offset of the last consumed token
        self.op_offsets: dict[int, int] = {}    # Operation.id -> offset of its name, for verifier errors
        self.first_function = 0
        # per function
        self.fn_name = ""
        self.values: dict[str, tuple[Value, int]] = {}
        self.symbols: dict[str, tuple[int, int]] = {}
        self.symbol_uses: list[tuple[str, int]] = []
        self.in_body = False
        self.dim_atoms = 0
        self.types: dict[str, tuple[TensorType, list[tuple[str, int]]]] = {}   # type body -> type, symbols
        self.symbols_in_type: list[tuple[str, int]] = []
        self.sympy_symbols: dict[str, sympy.Symbol] = {}

    # ------------------------------------------------------------------------- tokens

    def error(self, message: str, at: Token | int) -> CuvilParseError:
        return self.src.error(message, at if isinstance(at, int) else at.start)

    def advance(self) -> Token:
        tok = self.tok
        self.prev_end = tok.start + len(tok.text)
        self.tok = self.lexer.next()
        return tok

    def accept(self, punct: str) -> bool:
        if self.tok.is_punct(punct):
            self.advance()
            return True
        return False

    def expect(self, punct: str, context: str) -> Token:
        if not self.tok.is_punct(punct):
            raise self.error(f"expected '{punct}' {context}, got {self.tok.describe()}", self.tok)
        return self.advance()

    def expect_kind(self, kind: str, what: str) -> Token:
        if self.tok.kind != kind:
            raise self.error(f"expected {what}, got {self.tok.describe()}", self.tok)
        return self.advance()

    def check_depth(self, depth: int) -> None:
        if depth > MAX_NESTING:
            raise self.error(f"nesting deeper than {MAX_NESTING} levels", self.tok)

    # ------------------------------------------------------------------------- module and functions

    def parse_module(self) -> Module:
        module = Module()
        offsets: dict[str, int] = {}
        self.first_function = self.tok.start
        while self.tok.kind != "eof":
            start = self.tok.start
            fn = self.parse_function()
            if fn.name in offsets:
                line, col = self.src.position(offsets[fn.name])
                raise self.error(f"redefinition of function @{fn.name} (first defined at {line}:{col})", start)
            offsets[fn.name] = start
            module.add_function(fn)
        self.verify(module)
        return module

    def verify(self, module: Module) -> None:
        try:
            verify(module)
        except CuvilVerifyError as e:
            if e.op is None:
                raise self.error(e.message, self.first_function) from None
            message = e.message if e.message.startswith(e.op.name) else f"{e.op.name}: {e.message}"
            raise self.error(message, self.op_offsets.get(e.op.id, self.first_function)) from None

    def parse_function(self) -> Function:
        if not self.tok.is_ident("cuvil.func"):
            raise self.error(f"expected 'cuvil.func', got {self.tok.describe()}", self.tok)
        self.advance()
        name = self.expect_kind("symbol", "a function name '@name' after 'cuvil.func'").value
        self.fn_name, self.values, self.symbols, self.symbol_uses = name, {}, {}, []
        self.in_body = False
        self.expect("(", "after the function name")
        arg_toks, arg_types = [], []
        if not self.accept(")"):
            while True:
                tok = self.expect_kind("value", "an argument '%name'")
                self.check_new_value(tok, arg_toks)
                arg_toks.append(tok)
                self.expect(":", "after the argument name")
                arg_types.append(self.parse_type())
                if self.accept(")"):
                    break
                if not self.tok.is_punct(","):
                    raise self.error(f"expected ',' or ')' in the argument list, got {self.tok.describe()}", self.tok)
                self.advance()
        self.expect("->", "and the result types after the arguments")
        results = self.parse_result_types()
        if self.tok.is_ident("attributes"):
            self.advance()
            self.parse_function_attrs()
        self.check_symbol_uses()
        self.in_body = True
        open_brace = self.expect("{", "to open the function body")
        fn = Function(name, arg_types, [self.hint(t) for t in arg_toks], self.symbols)
        for tok, v in zip(arg_toks, fn.args):
            self.values[tok.value] = (v, tok.start)
        while not self.tok.is_punct("}"):
            if self.tok.kind == "eof" or self.tok.is_ident("cuvil.func"):
                line, col = self.src.position(open_brace.start)
                raise self.error(f"expected '}}' to close @{name} (opened at {line}:{col}), got "
                                 f"{self.tok.describe()}", self.tok)
            self.parse_op(fn)
        close = self.advance()
        self.check_return(fn, results, close)
        return fn

    def check_return(self, fn: Function, declared: list[tuple[TensorType, int]], close: Token) -> None:
        if not fn.ops or fn.ops[-1].name != RETURN_OP:
            raise self.error(f"function @{fn.name} must end in {RETURN_OP}", close)
        returned = [v.type for v in fn.ops[-1].operands]
        if returned != [t for t, _ in declared]:
            raise self.error(f"{RETURN_OP} gives ({', '.join(map(str, returned))}) but @{fn.name} declares "
                             f"-> ({', '.join(str(t) for t, _ in declared)})", self.op_offsets[fn.ops[-1].id])

    def parse_function_attrs(self) -> None:
        self.expect("{", "after 'attributes'")
        if self.accept("}"):
            return
        seen = set()
        while True:
            key = self.expect_kind("ident", "a function attribute name")
            if key.text != "symbols":
                raise self.error(f"unknown function attribute '{key.text}' (known: symbols)", key)
            if key.text in seen:
                raise self.error(f"duplicate function attribute '{key.text}'", key)
            seen.add(key.text)
            self.expect("=", "after the attribute name")
            self.parse_symbols()
            if self.accept("}"):
                return
            if not self.tok.is_punct(","):
                raise self.error(f"expected ',' or '}}' in the function attributes, got {self.tok.describe()}",
                                 self.tok)
            self.advance()

    def parse_symbols(self) -> None:
        """`{s0 = [1, 4096], ...}`: each dynamic-dimension symbol and its inclusive range."""
        self.expect("{", "to open the symbol ranges")
        if self.accept("}"):
            return
        while True:
            tok = self.expect_kind("ident", "a symbol name")
            if not SYMBOL_NAME.fullmatch(tok.text) or tok.text in KEYWORDS:
                raise self.error(f"'{tok.text}' cannot name a symbol (use letters, digits and '_'; "
                                 f"not a dtype or a keyword)", tok)
            if tok.text in self.symbols:
                raise self.error(f"symbol '{tok.text}' is declared twice", tok)
            self.expect("=", "after the symbol name")
            bracket = self.expect("[", "to open the symbol's range [lo, hi]")
            lo = self.parse_signed_int("the lower bound")
            self.expect(",", "between the bounds of the range")
            hi = self.parse_signed_int("the upper bound")
            self.expect("]", "to close the range")
            if lo > hi:
                raise self.error(f"symbol '{tok.text}' has an empty range [{lo}, {hi}]", bracket)
            self.symbols[tok.text] = (lo, hi)
            if self.accept("}"):
                return
            if not self.tok.is_punct(","):
                raise self.error(f"expected ',' or '}}' in the symbols, got {self.tok.describe()}", self.tok)
            self.advance()

    # ------------------------------------------------------------------------- values

    def hint(self, tok: Token) -> str | None:
        """The name hint a value keeps: its text name unless that is a plain number."""
        return None if tok.value.isdigit() else tok.value

    def check_new_value(self, tok: Token, pending: list[Token]) -> None:
        name = tok.value
        if not (VALUE_HINT.fullmatch(name) or name.isdigit()):
            raise self.error(f"invalid value name '{tok.text}': use an identifier or a number", tok)
        earlier = self.values[name][1] if name in self.values else \
            next((t.start for t in pending if t.value == name), None)
        if earlier is not None:
            line, col = self.src.position(earlier)
            raise self.error(f"redefinition of '{tok.text}' (first defined at {line}:{col})", tok)

    def use_value(self, tok: Token) -> Value:
        if tok.value not in self.values:
            raise self.error(f"use of undefined value '{tok.text}'", tok)
        return self.values[tok.value][0]

    # ------------------------------------------------------------------------- operations

    def parse_op(self, fn: Function) -> None:
        start = self.tok
        if fn.ops and fn.ops[-1].name == RETURN_OP:
            raise self.error(f"operation after {RETURN_OP}, which must be the last operation of @{fn.name}",
                             start)
        result_toks: list[Token] = []
        if start.kind == "value":
            while True:
                tok = self.expect_kind("value", "a result name '%name'")
                self.check_new_value(tok, result_toks)
                result_toks.append(tok)
                if not self.accept(","):
                    break
            self.expect("=", "after the result names")
        elif start.kind != "ident":
            raise self.error(f"expected an operation or '}}', got {start.describe()}", start)
        name_tok = self.expect_kind("ident", "an operation name")
        opdef = lookup_op(name_tok.text)
        if opdef is None:
            close = difflib.get_close_matches(name_tok.text, list(OP_REGISTRY), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise self.error(f"unknown op '{name_tok.text}'{hint}", name_tok)
        attrs: dict[str, Any] = {}
        name_attr = NAME_ATTR.get(opdef.name)
        if name_attr is not None:
            attrs[name_attr] = self.expect_kind("symbol", f"'@name' after '{opdef.name}'").value
        operands, operand_toks = self.parse_operands()
        self.check_operand_count(opdef, operand_toks, name_tok)
        context = "after the operands" if operands else f"after '{opdef.name}'"
        if self.tok.is_punct("{"):
            self.parse_op_attrs(opdef, attrs)
            context = "after the attributes"
        missing = next((k for k, a in opdef.attrs.items() if a.required and k not in attrs), None)
        if missing is not None:
            raise self.error(f"{opdef.name} requires attribute '{missing}' ({_kind_text(opdef.attrs[missing])})",
                             name_tok)
        if opdef.name == RETURN_OP:
            if result_toks:
                raise self.error(f"{RETURN_OP} has no results", result_toks[0])
            operand_types, result_types = self.parse_return_types(operands, context), []
        else:
            self.expect(":", context)
            operand_types, result_types = self.parse_signature(operands, result_toks)
        for tok, v, (t, offset) in zip(operand_toks, operands, operand_types):
            if v.type != t:
                raise self.error(f"operand '{tok.text}' has type {v.type}, but the signature says {t}", offset)
        loc = self.parse_loc() if self.tok.is_ident("loc") else None
        op = Operation(opdef, operands, result_types, attrs, loc)
        for tok, r in zip(result_toks, op.results):
            r.name = self.hint(tok)
            self.values[tok.value] = (r, tok.start)
        fn.ops.append(op)
        self.op_offsets[op.id] = name_tok.start

    def parse_operands(self) -> tuple[list[Value], list[Token]]:
        if self.tok.kind == "symbol":
            raise self.error(f"'{self.tok.text}': only {', '.join(NAME_ATTR)} takes an '@name' operand", self.tok)
        toks: list[Token] = []
        if self.tok.kind != "value":
            return [], toks
        while True:
            toks.append(self.expect_kind("value", "an operand '%name'"))
            if not self.accept(","):
                break
        return [self.use_value(t) for t in toks], toks

    def check_operand_count(self, opdef, toks: list[Token], name_tok: Token) -> None:
        lo, hi = opdef.operand_range()
        n = len(toks)
        if lo <= n and (hi is None or n <= hi):
            return
        expected = f"at least {lo}" if hi is None else (str(lo) if lo == hi else f"{lo} to {hi}")
        listed = f" ({', '.join(opdef.operands)})" if opdef.operands else ""
        message = f"{opdef.name} takes {expected} operands{listed}, got {n}"
        raise self.error(message, toks[hi] if hi is not None and n > hi else name_tok)

    def parse_op_attrs(self, opdef, attrs: dict[str, Any]) -> None:
        self.advance()  # '{'
        if self.accept("}"):
            return
        while True:
            key = self.expect_kind("ident", "an attribute name")
            decl = opdef.attrs.get(key.text)
            if decl is None and not is_discardable(key.text):
                known = ", ".join(opdef.attrs) or "it has none"
                raise self.error(f"unknown attribute '{key.text}' for {opdef.name} (known: {known})", key)
            if key.text in attrs:
                how = " (given as '@name')" if NAME_ATTR.get(opdef.name) == key.text else ""
                raise self.error(f"duplicate attribute '{key.text}'{how}", key)
            self.expect("=", "after the attribute name")
            value_tok = self.tok
            value = self.parse_attr_value(0)
            if decl is not None and not attr_kind_ok(decl, value):
                shown = attr_value_str(value)
                shown = shown if len(shown) <= 40 else shown[:37] + "..."
                raise self.error(f"attribute '{key.text}' of {opdef.name} must be {_kind_text(decl)}, got {shown}",
                                 value_tok)
            attrs[key.text] = value
            if self.accept("}"):
                return
            if not self.tok.is_punct(","):
                raise self.error(f"expected ',' or '}}' in the attributes, got {self.tok.describe()}", self.tok)
            self.advance()

    def parse_signature(self, operands: list[Value], result_toks: list[Token]):
        """`T -> T`, `(T, ...) -> R`, or only `R` for an op without operands; checks the counts."""
        if operands:
            start = self.tok
            if self.accept("("):
                operand_types = self.parse_type_list(")")
                self.advance()
            else:
                operand_types = [(self.parse_type(), start.start)]
            if len(operand_types) != len(operands):
                raise self.error(f"the signature lists {_count(len(operand_types), 'operand type')} for "
                                 f"{_count(len(operands), 'operand')}", start)
            self.expect("->", "after the operand types")
        else:
            operand_types = []
        start = self.tok
        result_types = self.parse_result_types()
        if len(result_types) != len(result_toks):
            raise self.error(f"the signature lists {_count(len(result_types), 'result type')} for "
                             f"{_count(len(result_toks), 'result name')}", start)
        return operand_types, [t for t, _ in result_types]

    def parse_return_types(self, operands: list[Value], context: str) -> list[tuple[TensorType, int]]:
        if not operands:
            return []
        self.expect(":", f"and the operand types {context}")
        start = self.tok
        types = [(self.parse_type(), start.start)]
        while self.accept(","):
            offset = self.tok.start
            types.append((self.parse_type(), offset))
        if len(types) != len(operands):
            raise self.error(f"{RETURN_OP} lists {_count(len(types), 'type')} for "
                             f"{_count(len(operands), 'operand')}", start)
        return types

    def parse_loc(self) -> Loc:
        self.advance()  # 'loc'
        self.expect("(", "after 'loc'")
        file = self.expect_kind("string", "a file name string in loc(...)").value
        self.expect(":", "after the file name in loc(...)")
        line = self.parse_unsigned_int("a line number")
        col = self.parse_unsigned_int("a column number") if self.accept(":") else 0
        self.expect(")", "to close loc(...)")
        return Loc(file, line, col)

    # ------------------------------------------------------------------------- types

    def parse_result_types(self) -> list[tuple[TensorType, int]]:
        start = self.tok
        if self.accept("("):
            types = self.parse_type_list(")")
            self.advance()
            return types
        return [(self.parse_type(), start.start)]

    def parse_type_list(self, close: str) -> list[tuple[TensorType, int]]:
        """Types separated by commas up to (not consuming) `close`; each with its offset."""
        types: list[tuple[TensorType, int]] = []
        if self.tok.is_punct(close):
            return types
        while True:
            start = self.tok.start
            types.append((self.parse_type(), start))
            if self.tok.is_punct(close):
                return types
            if not self.tok.is_punct(","):
                raise self.error(f"expected ',' or '{close}' in the type list, got {self.tok.describe()}", self.tok)
            self.advance()

    def parse_type(self) -> TensorType:
        tok = self.tok
        if tok.kind != "type":
            raise self.error(f"expected a type 'tensor<...>', got {tok.describe()}", tok)
        self.advance()
        base = tok.start + len("tensor<")
        if tok.value in self.types:   # models repeat a few types many times
            t, symbols = self.types[tok.value]
            for name, offset in symbols:
                self.use_symbol(name, base + offset)
            return t
        self.symbols_in_type = []
        t = self.type_from_body(tok.value, base)
        self.types[tok.value] = t, [(name, offset - base) for name, offset in self.symbols_in_type]
        return t

    def type_from_body(self, body: str, base: int) -> TensorType:
        """`(dim 'x')* dtype` where dim is an integer, `s<digits>`, or a parenthesised expression."""
        shape, i = [], 0
        while True:
            if body[i:i + 1].isdigit() and body[i].isascii():
                j = i
                while j < len(body) and body[j].isascii() and body[j].isdigit():
                    j += 1
                dim = self.int_literal(body[i:j], base + i, INT64_MAX, "dimension")
            elif body.startswith("(", i):
                dim, j = self.parenthesised_dim(base + i, base + len(body))
                j -= base
            elif _bare_symbol_end(body, i):
                j = _bare_symbol_end(body, i)
                dim = self.use_symbol(body[i:j], base + i)
            else:
                word = body[i:]
                if word in DTYPE_NAMES:
                    return TensorType(DType.from_name(word), tuple(shape))
                dtype = next((d for d in DTYPE_NAMES if word.startswith(d) and not word[len(d)].isalnum()), None)
                if dtype is not None:
                    raise self.error(f"expected '>' after the dtype '{dtype}'", base + i + len(dtype))
                shown = word if len(word) <= 40 else word[:37] + "..."
                raise self.error(f"expected a dimension or a dtype ({', '.join(sorted(DTYPE_NAMES))}) "
                                 f"in the tensor type, got '{shown}'", base + i)
            if not body.startswith("x", j):
                got = f"'{body[j]}'" if j < len(body) else "'>'"
                raise self.error(f"expected 'x' after a dimension in the tensor type, got {got}", base + j)
            shape.append(dim)
            if len(shape) > MAX_RANK:
                raise self.error(f"tensor type with more than {MAX_RANK} dimensions", base + i)
            i = j + 1

    def parenthesised_dim(self, start: int, end: int):
        """Parse `( dim-expr )` at `start` with a sub-lexer; return the dim and the offset after ')'."""
        saved = self.lexer, self.tok, self.prev_end
        self.lexer = Lexer(self.src, start, end, in_brackets=True)
        self.tok = self.lexer.next()
        self.dim_atoms = 0
        dim = self.finish_dim(self.parse_dim_atom(0), start, min_value=0)
        if isinstance(dim, float):
            raise self.error(f"a dimension must be an integer, got {dim!r}", start)
        after = self.prev_end
        self.lexer, self.tok, self.prev_end = saved
        return dim, after

    # ------------------------------------------------------------------------- dimension expressions

    def use_symbol(self, name: str, offset: int) -> sympy.Symbol:
        if not SYMBOL_NAME.fullmatch(name) or name in KEYWORDS:
            raise self.error(f"'{name}' is not a symbol name", offset)
        self.symbol_uses.append((name, offset))
        self.symbols_in_type.append((name, offset))
        if self.in_body:
            self.check_symbol_uses()
        if name not in self.sympy_symbols:
            self.sympy_symbols[name] = sym(name)
        return self.sympy_symbols[name]

    def check_symbol_uses(self) -> None:
        """Symbols used in the header are checked once its `symbols` are read, the others at once."""
        for name, offset in self.symbol_uses:
            if name not in self.symbols:
                declared = ", ".join(self.symbols) or "none"
                raise self.error(f"symbol '{name}' is not declared in the symbols of @{self.fn_name} "
                                 f"(declared: {declared})", offset)
        self.symbol_uses.clear()

    def parse_dim_expr(self, depth: int):
        value = self.parse_dim_term(depth)
        while self.tok.kind == "punct" and self.tok.text in ("+", "-"):
            op = self.advance()
            value = self.combine(op, value, self.parse_dim_term(depth))
        return value

    def parse_dim_term(self, depth: int):
        """Factors joined by '*' are multiplied in one step, like sympy builds a product it prints:
        pairwise, `2*(1 + s0)` would be distributed first and the term would not read back the same."""
        factors = self.parse_dim_factor(depth)
        while self.tok.kind == "punct" and self.tok.text in ("*", "//", "%"):
            op = self.advance()
            rhs = self.parse_dim_factor(depth)
            if op.text == "*":
                if any(isinstance(f, float) for f in factors + rhs):
                    raise self.error("a float cannot be an operand of '*' in a dimension expression", op)
                factors += rhs
            else:
                factors = [self.combine(op, self.product(factors), self.product(rhs))]
        return self.product(factors)

    def parse_dim_factor(self, depth: int) -> list:
        """A unary '-'* then an atom, as factors: `-s0` is [-1, s0], `-3` is [-3]."""
        negate = False
        while self.accept("-"):
            negate = not negate
        value = self.parse_dim_atom(depth)
        if not negate:
            return [value]
        return [-value] if isinstance(value, (int, float)) else [-1, value]

    @staticmethod
    def product(factors: list):
        if len(factors) == 1:
            return factors[0]
        if all(isinstance(f, int) for f in factors):
            return math.prod(factors)
        return norm_dim(sympy.Mul(*factors))

    def parse_dim_atom(self, depth: int):
        """An integer, a float (only alone), a symbol, or `( dim-expr )`."""
        tok = self.tok
        self.dim_atoms += 1
        if self.dim_atoms > MAX_DIM_ATOMS:
            raise self.error(f"dimension expression longer than {MAX_DIM_ATOMS} terms", tok)
        if tok.kind == "int":
            self.advance()
            return self.int_literal(tok.text, tok.start, 2 ** 63, "integer")
        if tok.kind == "float" or (tok.kind == "ident" and tok.text in _FLOAT_WORDS):
            self.advance()
            return self.float_literal(tok)
        if tok.kind == "ident" and tok.text not in KEYWORDS:
            self.advance()
            return self.use_symbol(tok.text, tok.start)
        if tok.is_punct("("):
            self.check_depth(depth + 1)
            self.advance()
            value = self.parse_dim_expr(depth + 1)
            self.expect(")", "to close the dimension expression")
            return value
        raise self.error(f"expected a dimension (an integer, a symbol or '('), got {tok.describe()}", tok)

    def combine(self, op: Token, a, b):
        if isinstance(a, float) or isinstance(b, float):
            raise self.error(f"a float cannot be an operand of '{op.text}' in a dimension expression", op)
        if op.text in ("//", "%") and b == 0:
            raise self.error(f"division by zero in a dimension expression ('{op.text}')", op)
        if op.text == "//" and not isinstance(b, int):
            raise self.error("the divisor of '//' must be an integer", op)
        if op.text == "+":
            return norm_dim(a + b)
        if op.text == "-":
            return norm_dim(a - b)
        if op.text == "//":
            return floordiv(a, b)
        if isinstance(a, int) and isinstance(b, int):
            return a % b
        return norm_dim(sympy.Mod(a, b))

    def finish_dim(self, value, offset: int, min_value: int = INT64_MIN):
        """Check a complete dimension value: ints in range, expressions printable."""
        if isinstance(value, int):
            if not min_value <= value <= INT64_MAX:
                raise self.error(f"dimension expression evaluates to {value}, outside [{min_value}, {INT64_MAX}]",
                                 offset)
        elif isinstance(value, sympy.Expr):
            try:
                expr_str(value)
            except ValueError as e:
                raise self.error(f"dimension expression has no text form: {e}", offset) from None
        return value

    # ------------------------------------------------------------------------- attribute values

    def parse_attr_value(self, depth: int):
        tok = self.tok
        if tok.kind == "string":
            self.advance()
            return tok.value
        if tok.is_punct("["):
            return self.parse_list(depth + 1)
        if tok.is_punct("{"):
            return self.parse_dict(depth + 1)
        if tok.kind == "ident" and tok.text in _WORD_VALUES:
            self.advance()
            return _WORD_VALUES[tok.text]
        if tok.kind in ("int", "float") or tok.is_punct("-") or (tok.kind == "ident" and tok.text in _FLOAT_WORDS):
            return self.parse_number()
        raise self.error(f"expected an attribute value, got {tok.describe()}", tok)

    def parse_number(self):
        """`-`* then an integer, a float, inf or nan (outside lists no expression is allowed)."""
        negate = False
        while self.accept("-"):
            negate = not negate
        tok = self.tok
        if tok.kind == "int":
            self.advance()
            return self.signed(self.int_literal(tok.text, tok.start, 2 ** 63, "integer"), negate, tok)
        if tok.kind == "float" or (tok.kind == "ident" and tok.text in _FLOAT_WORDS):
            self.advance()
            value = self.float_literal(tok)
            return -value if negate else value
        raise self.error(f"expected a number, got {tok.describe()}", tok)

    def parse_list(self, depth: int) -> list:
        self.check_depth(depth)
        self.advance()  # '['
        items: list = []
        if self.accept("]"):
            return items
        while True:
            tok = self.tok
            if tok.kind == "string" or tok.is_punct("[") or tok.is_punct("{") or \
                    (tok.kind == "ident" and tok.text in _WORD_VALUES):
                items.append(self.parse_attr_value(depth))
            else:
                self.dim_atoms = 0
                items.append(self.finish_dim(self.parse_dim_expr(depth), tok.start))
            if self.accept("]"):
                return items
            if not self.tok.is_punct(","):
                raise self.error(f"expected ',' or ']' in the list, got {self.tok.describe()}", self.tok)
            self.advance()

    def parse_dict(self, depth: int) -> dict:
        self.check_depth(depth)
        self.advance()  # '{'
        items: dict = {}
        if self.accept("}"):
            return items
        while True:
            key = self.expect_kind("ident", "a key")
            if key.text in items:
                raise self.error(f"duplicate key '{key.text}'", key)
            self.expect("=", "after the key")
            items[key.text] = self.parse_attr_value(depth)
            if self.accept("}"):
                return items
            if not self.tok.is_punct(","):
                raise self.error(f"expected ',' or '}}' in the dictionary, got {self.tok.describe()}", self.tok)
            self.advance()

    # ------------------------------------------------------------------------- literals

    def int_literal(self, text: str, offset: int, hi: int, what: str) -> int:
        """An unsigned integer literal up to `hi` (2**63 - 1, or 2**63 where a '-' may precede it)."""
        digits = text.lstrip("0") or "0"
        if len(digits) > 19 or int(digits) > hi:
            shown = text if len(text) <= 40 else text[:37] + "..."
            raise self.error(f"{what} {shown} does not fit in 64 bits", offset)
        return int(digits)

    def float_literal(self, tok: Token) -> float:
        if tok.kind == "ident":
            return _FLOAT_WORDS[tok.text]
        if len(tok.text) > MAX_NUMBER_CHARS:
            raise self.error(f"number literal longer than {MAX_NUMBER_CHARS} characters", tok)
        value = float(tok.text)
        if math.isinf(value):
            raise self.error(f"float {tok.describe()} is too large for f64 (write inf)", tok)
        return value

    def parse_signed_int(self, what: str) -> int:
        negate = self.accept("-")
        tok = self.expect_kind("int", what)
        return self.signed(self.int_literal(tok.text, tok.start, 2 ** 63, "integer"), negate, tok)

    def signed(self, value: int, negate: bool, tok: Token) -> int:
        if negate:
            return -value
        if value > INT64_MAX:
            raise self.error(f"integer {value} does not fit in 64 bits", tok)
        return value

    def parse_unsigned_int(self, what: str) -> int:
        tok = self.expect_kind("int", what)
        return self.int_literal(tok.text, tok.start, INT64_MAX, what)


def _kind_text(attr) -> str:
    return _KIND_TEXT.get(attr.kind, attr.kind)


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _bare_symbol_end(body: str, i: int) -> int:
    """End of an `s<digits>` symbol at `i` inside a tensor type (0 if there is none)."""
    if not body.startswith("s", i):
        return 0
    j = i + 1
    while j < len(body) and body[j].isascii() and body[j].isdigit():
        j += 1
    return j if j > i + 1 else 0
