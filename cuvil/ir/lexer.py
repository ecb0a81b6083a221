"""Tokens of the graph IR text (docs/ir.md, "Grammar"), and the lexical rules the printer follows.

The lexer is lazy (one token at a time, so a nesting bomb is refused before the rest of the
input is read) and linear: every token is matched by a regular expression without backtracking.
Inside `[...]`, `%` and `//` are the dimension operators; elsewhere `%name` is a value and `//`
starts a comment.
"""
from __future__ import annotations

import bisect
import re

from ..errors import CuvilParseError
from .types import DType

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
BARE_NAME = re.compile(r"[A-Za-z0-9_.$]+")        # after '@' (const and function names)
VALUE_HINT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")  # a name hint the printer keeps: %x, %fc1.out
SYMBOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a dynamic-dimension symbol
DTYPE_NAMES = frozenset(d.value for d in DType)
KEYWORDS = DTYPE_NAMES | {"true", "false", "none", "inf", "nan"}

_VALUE_NAME = re.compile(r"[A-Za-z0-9_.]+")         # after '%'
_NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_SPACE = re.compile(r"[ \t\r\n]+")
_TO_EOL = re.compile(r"[^\r\n]*")
_TYPE_BODY = re.compile(r"[^>\r\n]*>")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_STRING_CHUNK = re.compile(r'[^"\\\x00-\x1f\x7f-\x9f]+')
_UNSHOWABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")   # shown as '?' in an error's source line
_PUNCT = frozenset("()[]{},:=*+-<>")
_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t", "r": "\r"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


class Token:
    """kind: ident, value (%name), symbol (@name), int, float, string, type (`tensor<body>`;
    `value` is the body), punct, eof. `start` is the offset in the source text."""
    __slots__ = ("kind", "text", "start", "value")

    def __init__(self, kind: str, text: str, start: int, value=None):
        self.kind, self.text, self.start, self.value = kind, text, start, value

    def is_punct(self, p: str) -> bool:
        return self.kind == "punct" and self.text == p

    def is_ident(self, word: str) -> bool:
        return self.kind == "ident" and self.text == word

    def describe(self) -> str:
        """How an error message names this token: `'{'`, `'%x'`, `end of input`."""
        if self.kind == "eof":   # a sub-lexer's end is the character after its range, e.g. '>'
            return f"'{self.text}'" if self.text else "end of input"
        text = self.text if len(self.text) <= 40 else self.text[:37] + "..."
        return f"'{text}'"

    def __repr__(self) -> str:
        return f"Token({self.kind}, {self.text!r}, {self.start})"


class Source:
    """The text being parsed: offsets -> line:column, and errors pointing into it."""

    def __init__(self, text: str, filename: str):
        self.text, self.filename = text, filename
        self.line_starts = [0] + [m.end() for m in _LINE_BREAK.finditer(text)]

    def position(self, offset: int) -> tuple[int, int]:
        i = bisect.bisect_right(self.line_starts, offset) - 1
        return i + 1, offset - self.line_starts[i] + 1

    def line_text(self, line: int) -> str:
        return _TO_EOL.match(self.text, self.line_starts[line - 1]).group()

    def error(self, message: str, offset: int) -> CuvilParseError:
        line, col = self.position(offset)
        shown = _UNSHOWABLE.sub(lambda m: " " if m.group() == "\t" else "?", self.line_text(line))
        return CuvilParseError(message, line, col, shown, self.filename)


def describe_char(c: str) -> str:
    code = f"U+{ord(c):04X}"
    return f"'{c}' ({code})" if c.isprintable() else code


def quote_string(s: str) -> str:
    """A string literal the lexer reads back as `s`: escapes quotes, backslashes, non-printables."""
    if s.isprintable() and '"' not in s and "\\" not in s:
        return f'"{s}"'
    out = ['"']
    for c in s:
        if c in '"\\':
            out.append("\\" + c)
        elif c.isprintable():
            out.append(c)
        elif c in "\n\t\r":
            out.append({"\n": "\\n", "\t": "\\t", "\r": "\\r"}[c])
        elif ord(c) < 0x100:
            out.append(f"\\x{ord(c):02x}")
        elif ord(c) < 0x10000:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(f"\\U{ord(c):08x}")
    out.append('"')
    return "".join(out)


class Lexer:
    """Tokens of `source.text[start:end]`; offsets stay those of the whole text. `in_brackets`
    lexes a dimension expression cut out of a tensor type (`%` and `//` are operators)."""

    def __init__(self, source: Source, start: int = 0, end: int | None = None, in_brackets: bool = False):
        self.src = source
        self.text = source.text
        self.pos = start
        self.end = len(self.text) if end is None else end
        self.bracket_depth = 1 if in_brackets else 0   # inside [...], '%' and '//' are operators

    def next(self) -> Token:
        text, end = self.text, self.end
        pos = self._skip_space_and_comments(self.pos)
        if pos >= end:
            self.pos = pos
            return Token("eof", text[end:end + 1], pos)
        c = text[pos]
        if c.isascii() and (c.isalpha() or c == "_"):
            tok = self._ident_or_type(pos)
        elif c.isascii() and c.isdigit():
            m = _NUMBER.match(text, pos, end)
            kind = "float" if m.group(1) or m.group(2) else "int"
            tok = Token(kind, m.group(), pos)
        elif c == '"':
            value, stop = self._string(pos)
            tok = Token("string", text[pos:stop], pos, value)
        elif c == "%" and not self.bracket_depth:
            tok = self._prefixed(pos, "value", _VALUE_NAME, "a value name")
        elif c == "@":
            if text.startswith('"', pos + 1, end):
                value, stop = self._string(pos + 1)
                tok = Token("symbol", text[pos:stop], pos, value)
            else:
                tok = self._prefixed(pos, "symbol", BARE_NAME, "a name")
        elif text.startswith("->", pos, end):
            tok = Token("punct", "->", pos)
        elif self.bracket_depth and text.startswith("//", pos, end):
            tok = Token("punct", "//", pos)
        elif c in _PUNCT or (c == "%" and self.bracket_depth):
            tok = Token("punct", c, pos)
            if c == "[":
                self.bracket_depth += 1
            elif c == "]" and self.bracket_depth:
                self.bracket_depth -= 1
        else:
            raise self.src.error(f"unexpected character {describe_char(c)}", pos)
        self.pos = pos + len(tok.text)
        return tok

    def _skip_space_and_comments(self, pos: int) -> int:
        text, end = self.text, self.end
        while True:
            m = _SPACE.match(text, pos, end)
            if m:
                pos = m.end()
            if self.bracket_depth or not text.startswith("//", pos, end):
                return pos
            pos = _TO_EOL.match(text, pos, end).end()

    def _ident_or_type(self, pos: int) -> Token:
        word = IDENTIFIER.match(self.text, pos, self.end).group()
        if word == "tensor" and self.text.startswith("<", pos + 6, self.end):
            m = _TYPE_BODY.match(self.text, pos + 7, self.end)
            if m is None:
                raise self.src.error("unterminated tensor type: expected '>' before the end of the line", pos)
            return Token("type", self.text[pos:m.end()], pos, m.group()[:-1])
        return Token("ident", word, pos)

    def _prefixed(self, pos: int, kind: str, name_re: re.Pattern, what: str) -> Token:
        m = name_re.match(self.text, pos + 1, self.end)
        if m is None:
            raise self.src.error(f"expected {what} after '{self.text[pos]}'", pos)
        return Token(kind, self.text[pos:m.end()], pos, m.group())

    def _string(self, start: int) -> tuple[str, int]:
        """Decode the string literal whose opening quote is at `start`; return it and its end."""
        text, end, pos, out = self.text, self.end, start + 1, []
        while True:
            m = _STRING_CHUNK.match(text, pos, end)
            if m:
                chunk = m.group()
                if not chunk.isprintable():
                    bad = next(i for i, c in enumerate(chunk) if not c.isprintable())
                    raise self.src.error(f"character {describe_char(chunk[bad])} must be escaped in a string",
                                         pos + bad)
                out.append(chunk)
                pos = m.end()
            if pos >= end or text[pos] in "\r\n":
                raise self.src.error("unterminated string: expected '\"' before the end of the line", start)
            c = text[pos]
            if c == '"':
                return "".join(out), pos + 1
            if c != "\\":
                raise self.src.error(f"character {describe_char(c)} must be escaped in a string", pos)
            out.append(self._escape(pos))
            pos += 2 + _HEX_ESCAPES.get(text[pos + 1: pos + 2], 0)

    def _escape(self, pos: int) -> str:
        kind = self.text[pos + 1: min(pos + 2, self.end)]
        if kind in _ESCAPES:
            return _ESCAPES[kind]
        if kind in _HEX_ESCAPES:
            digits = self.text[pos + 2: min(pos + 2 + _HEX_ESCAPES[kind], self.end)]
            if len(digits) == _HEX_ESCAPES[kind] and all(c in "0123456789abcdefABCDEF" for c in digits):
                code = int(digits, 16)
                if code <= 0x10FFFF:
                    return chr(code)
            raise self.src.error(f"bad escape '\\{kind}{digits}': expected {_HEX_ESCAPES[kind]} hex digits "
                                 f"of a code point up to 10FFFF", pos)
        shown = describe_char(kind) if kind else "end of input"
        raise self.src.error(f"unknown escape '\\' followed by {shown} (known: \\\" \\\\ \\n \\t \\r \\xHH "
                             f"\\uHHHH \\UHHHHHHHH)", pos)
