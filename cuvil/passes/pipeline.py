"""Pipeline strings, MLIR style: `canonicalize,cse{aggressive=true},fuse{max-ops=16 keep=a,b}`.

    pipeline ::= element (',' element)*
    element  ::= name ('{' option (' ' option)* '}')?      name: a pass or a named pipeline
    option   ::= key ('=' value)?                          a bare key sets a bool option to true
    value    ::= word (',' word)* | '"' chars '"'          commas make lists; quotes keep spaces

Errors are `CuvilPipelineError`s naming the pass or option and the column (1-based).
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass
from typing import Any, Iterable, Literal, NamedTuple

from ..errors import CuvilPipelineError
from .base import ModulePass, option_name
from .registry import get_pass, get_pipeline, suggest


def pipeline_error(message: str, text: str, col: int) -> CuvilPipelineError:
    """An error pointing at column `col` (0-based here, printed 1-based) of the pipeline string."""
    err = CuvilPipelineError(f"pipeline column {col + 1}: {message}\n  {text}\n  {' ' * col}^")
    err.column, err.pipeline = col + 1, text
    return err


@dataclass(frozen=True)
class Pipeline:
    """An ordered list of configured passes. `str(p)` is the canonical string (dumps, cache keys)."""
    passes: tuple[ModulePass, ...] = ()

    @staticmethod
    def parse(text: str) -> "Pipeline":
        return parse_pipeline(text)

    @staticmethod
    def of(items: "Pipeline | str | Iterable[ModulePass | str]") -> "Pipeline":
        """A pipeline from a string, a list of passes and strings, or a pipeline."""
        if isinstance(items, Pipeline):
            return items
        if isinstance(items, str):
            return parse_pipeline(items)
        out: list[ModulePass] = []
        for item in items:
            if isinstance(item, ModulePass):
                out.append(item)
            elif isinstance(item, type) and issubclass(item, ModulePass):
                out.append(item())
            elif isinstance(item, str):
                out.extend(parse_pipeline(item).passes)
            else:
                raise TypeError(f"a pipeline holds passes or pipeline strings, not {item!r}")
        return Pipeline(tuple(out))

    def __str__(self) -> str:
        return ",".join(p.spec() for p in self.passes)

    def spec(self, include_defaults: bool = False) -> str:
        return ",".join(p.spec(include_defaults) for p in self.passes)

    def __iter__(self):
        return iter(self.passes)

    def __len__(self) -> int:
        return len(self.passes)

    def __add__(self, other: "Pipeline | str") -> "Pipeline":
        return Pipeline(self.passes + Pipeline.of(other).passes)

    def without(self, names: Iterable[str]) -> "Pipeline":
        """A copy with every pass named in `names` left out (switching passes off by name)."""
        names = set(names)
        unknown = sorted(n for n in names if get_pass(n) is None)
        if unknown:
            raise CuvilPipelineError(f"cannot switch off unknown pass '{unknown[0]}'{suggest(unknown[0])}")
        return Pipeline(tuple(p for p in self.passes if p.name not in names))

    def insert_by_priority(self, p: ModulePass) -> "Pipeline":
        """A copy with `p` placed after the last pass whose priority is <= its own."""
        at = 0
        for i, q in enumerate(self.passes):
            if q.priority <= p.priority:
                at = i + 1
        return Pipeline(self.passes[:at] + (p,) + self.passes[at:])


# ----------------------------------------------------------------------------- parsing

class _RawOption(NamedTuple):
    value: str | None        # None for a bare key (`{aggressive}`)
    key_col: int
    value_col: int
    quoted: bool


def parse_pipeline(text: str) -> Pipeline:
    return Pipeline(tuple(_Parser(text).parse(expanding=())))


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def error(self, message: str, col: int | None = None) -> CuvilPipelineError:
        return pipeline_error(message, self.text, self.pos if col is None else col)

    def skip_spaces(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def parse(self, expanding: tuple[str, ...]) -> list[ModulePass]:
        passes: list[ModulePass] = []
        self.skip_spaces()
        if not self.peek():
            return passes
        while True:
            passes.extend(self.element(expanding))
            self.skip_spaces()
            c = self.peek()
            if not c:
                return passes
            if c == "}":
                raise self.error("unbalanced '}' (no matching '{')")
            if c != ",":
                raise self.error(f"expected ',' between passes, got '{c}'")
            self.pos += 1
            self.skip_spaces()
            if not self.peek():
                raise self.error("expected a pass name after ','")

    def element(self, expanding: tuple[str, ...]) -> list[ModulePass]:
        start = self.pos
        name = self.word("-_.")
        if not name:
            raise self.error(f"expected a pass name, got '{self.peek()}'")
        cls = get_pass(name)
        named = get_pipeline(name) if cls is None else None
        if cls is None and named is None:
            raise self.error(f"unknown pass '{name}'{suggest(name)}", start)
        raw = self.options_block(name) if self.peek() == "{" else {}
        if named is not None:
            if raw:
                raise self.error(f"named pipeline '{name}' takes no options", start)
            if name in expanding:
                raise self.error(f"named pipeline '{name}' includes itself", start)
            try:
                return _Parser(named).parse(expanding + (name,))
            except CuvilPipelineError as e:
                raise self.error(f"in named pipeline '{name}' = '{named}': {e}", start) from None
        return [self.build(cls, raw, start)]

    def word(self, extra: str) -> str:
        start = self.pos
        while self.pos < len(self.text) and (self.text[self.pos].isalnum() or self.text[self.pos] in extra):
            self.pos += 1
        return self.text[start:self.pos]

    def options_block(self, pass_name: str) -> dict[str, _RawOption]:
        """`{k=v k2=v2}` -> {key: its raw value and columns}."""
        open_col = self.pos
        self.pos += 1
        raw: dict[str, _RawOption] = {}
        while True:
            self.skip_spaces()
            c = self.peek()
            if not c:
                raise self.error(f"unbalanced '{{' in the options of '{pass_name}' (missing '}}')", open_col)
            if c == "}":
                self.pos += 1
                return raw
            key_col = self.pos
            key = self.word("-_")
            if not key:
                raise self.error(f"expected an option name in the options of '{pass_name}', got '{c}'")
            if key in raw:
                raise self.error(f"option '{key}' of pass '{pass_name}' is given twice", key_col)
            if self.peek() != "=":
                if self.peek() and not self.peek().isspace() and self.peek() != "}":
                    raise self.error(f"expected '=' after option '{key}', got '{self.peek()}'")
                raw[key] = _RawOption(None, key_col, key_col, False)
                continue
            self.pos += 1
            value_col = self.pos
            value, quoted = self.value(pass_name, key)
            raw[key] = _RawOption(value, key_col, value_col, quoted)

    def value(self, pass_name: str, key: str) -> tuple[str, bool]:
        if self.peek() == '"':
            return self.quoted(), True
        start = self.pos
        while self.pos < len(self.text) and not self.text[self.pos].isspace() and self.text[self.pos] not in "{}":
            self.pos += 1
        if self.peek() == "{":
            raise self.error(f"unexpected '{{' in the value of option '{key}' of pass '{pass_name}'")
        return self.text[start:self.pos], False

    def quoted(self) -> str:
        start = self.pos
        self.pos += 1
        out = []
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c == "\\" and self.pos + 1 < len(self.text):
                out.append(self.text[self.pos + 1])
                self.pos += 2
                continue
            self.pos += 1
            if c == '"':
                return "".join(out)
            out.append(c)
        raise self.error("unterminated string (missing '\"')", start)

    def build(self, cls: type[ModulePass], raw: dict[str, _RawOption], start: int) -> ModulePass:
        fields = {option_name(f.name): f.name for f in cls.option_fields()}
        hints = cls.option_types()
        kwargs = {}
        for key, opt in raw.items():
            if key not in fields:
                close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.6)
                hint = f"did you mean '{close[0]}'? " if close else ""
                valid = ", ".join(fields) if fields else "none"
                raise self.error(f"unknown option '{key}' for pass '{cls.name}' ({hint}valid options: {valid})",
                                 opt.key_col)
            field_name = fields[key]
            try:
                kwargs[field_name] = convert_option(opt.value, hints[field_name], opt.quoted)
            except ValueError as e:
                raise self.error(f"option '{key}' of pass '{cls.name}': {e}", opt.value_col) from None
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as e:
            missing = [option_name(f.name) for f in cls.option_fields() if f.name not in kwargs
                       and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
            detail = f"missing required option(s) {', '.join(missing)}" if missing else str(e)
            raise self.error(f"pass '{cls.name}': {detail}", start) from None


# ----------------------------------------------------------------------------- option values

def convert_option(raw: str | None, annotation: Any, quoted: bool = False) -> Any:
    """Convert an option's text to the field's type; raises ValueError saying what was expected."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if raw == "none" and not quoted and len(inner) < len(args):
            return None
        errors = []
        for a in inner:
            try:
                return convert_option(raw, a, quoted)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(" or ".join(errors))
    if raw is None:
        if annotation is bool:
            return True
        raise ValueError(f"needs a value ({type_name(annotation)})")
    if origin in (tuple, list):
        elem = args[0] if args else str
        parts = [raw] if quoted else raw.split(",")
        if parts == [""]:
            parts = []
        values = [convert_option(p, elem) for p in parts]
        return tuple(values) if origin is tuple else values
    if origin is Literal:
        if raw not in args:
            raise ValueError(f"expected one of {', '.join(map(str, args))}, got '{raw}'")
        return raw
    if annotation is bool:
        if raw in ("true", "1"):
            return True
        if raw in ("false", "0"):
            return False
        raise ValueError(f"expected true or false, got '{raw}'")
    if annotation is int:
        try:
            return int(raw, 0)
        except ValueError:
            raise ValueError(f"expected an integer, got '{raw}'") from None
    if annotation is float:
        try:
            return float(raw)
        except ValueError:
            raise ValueError(f"expected a number, got '{raw}'") from None
    if annotation is str:
        return raw
    raise ValueError(f"options of type {annotation!r} cannot be set from a pipeline string")


def type_name(annotation: Any) -> str:
    """An option type as text: `int`, `best-fit|naive` (a Literal), `a comma-separated list of str`."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "|".join(map(str, typing.get_args(annotation)))
    if origin in (tuple, list):
        args = typing.get_args(annotation)
        return f"a comma-separated list of {type_name(args[0]) if args else 'str'}"
    return getattr(annotation, "__name__", str(annotation))
