"""User-facing errors. Each one names the problem and where it is.

Internal bugs are ordinary Python exceptions; everything a user can cause by bad input
(text, models, pipelines, options) is a `CuvilError` subclass with a location.
"""
from __future__ import annotations

import os
import sys
import warnings

_PACKAGE = os.path.dirname(os.path.realpath(__file__)) + os.sep


class CuvilError(Exception):
    """Base class of every error Cuvil raises on purpose."""


class CuvilParseError(CuvilError):
    """Malformed textual IR: carries line, column, the source line and a caret."""

    def __init__(self, message: str, line: int, col: int, source_line: str = "", filename: str = "<text>"):
        self.message, self.line, self.col = message, line, col
        self.source_line, self.filename = source_line, filename
        caret = " " * (col - 1) + "^"
        super().__init__(f"{filename}:{line}:{col}: error: {message}\n{source_line}\n{caret}")


class CuvilVerifyError(CuvilError):
    """The IR breaks an invariant (types, SSA, op constraints)."""

    def __init__(self, message: str, op=None):
        self.message, self.op = message, op
        where = ""
        if op is not None:
            where = f" in '{op.name}'"
            if op.loc is not None:
                where += f" at {op.loc.file}:{op.loc.line}"
        super().__init__(f"{message}{where}")


class CuvilUnsupportedOpError(CuvilError):
    """An ATen op (or other construct) the frontend cannot import."""

    def __init__(self, op_name: str, source: str | None = None, detail: str = ""):
        self.op_name, self.source, self.detail = op_name, source, detail
        text = f"unsupported op '{op_name}'"
        if detail:
            text += f": {detail}"
        if source:
            text += f"\n  at {source}"
        super().__init__(text)


class CuvilIndexError(CuvilError, IndexError, RuntimeError):
    """An index input holds a value outside the table it indexes: eager raises an IndexError there
    (embedding, index_select, advanced indexing) or a RuntimeError (gather), and this is both."""


class CuvilPipelineError(CuvilError):
    """A bad pipeline string: unknown pass, unknown or ill-typed option."""


class CuvilPassError(CuvilError):
    """A pass failed or broke the IR; names the pass."""


def warn_user(message: str) -> None:
    """A UserWarning attributed to the user's line: the first caller outside Cuvil (and the
    standard library's decorators it calls through)."""
    frame, level = sys._getframe(1), 2
    while frame is not None and (frame.f_code.co_filename.startswith(_PACKAGE)
                                 or frame.f_code.co_filename.endswith("contextlib.py")):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, stacklevel=level)
