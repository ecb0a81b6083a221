"""The error panel: any failure of a `%%cuvil` cell as a short, readable message that points at the
user's own line (cell line and column with a caret for IR and syntax errors), not a traceback.

Cell line numbers count the `%%cuvil` line as line 1, as the notebook shows them. Only an error
that does not come from the user's input (a bug in Cuvil) keeps its traceback, folded away.
"""
from __future__ import annotations

import html
import linecache
import re
import traceback
from dataclasses import dataclass, field

from IPython.core.error import UsageError

from cuvil import (CuvilError, CuvilParseError, CuvilPassError, CuvilPipelineError, CuvilUnsupportedOpError,
                   CuvilVerifyError)
from cuvil.frontend import CuvilExportError
from cuvil.report_html import CSS

from .cell import CellError

_SOURCE = re.compile(r"^(?P<file>.+?):(?P<line>\d+)(?::|$)")


@dataclass
class ErrorInfo:
    kind: str                          # "IR parse error", "error in your code", ...
    message: str
    where: str = ""                    # "cell line 3, column 7", "model.py:12"
    snippet: list[tuple[int, str]] = field(default_factory=list)   # (line number, text)
    focus: int | None = None           # the line number of the offending line
    col: int | None = None             # 1-based column of the caret on that line
    hint: str = ""
    details: str = ""                  # a traceback, only for internal errors

    def to_html(self) -> str:
        return error_html(self)


def describe_error(exc: BaseException, cell: str, filename: str) -> ErrorInfo:
    """Turn an exception raised while handling a cell into an ErrorInfo."""
    if isinstance(exc, SyntaxError) and exc.filename == filename:
        return _in_cell("Python syntax error", exc.msg, cell, exc.lineno, exc.offset)
    if isinstance(exc, CuvilParseError):
        return _in_cell("IR error", exc.message, cell, exc.line, exc.col)
    if isinstance(exc, CellError):
        info = _in_cell(exc.kind, exc.message, cell, exc.line, exc.col)
        info.hint = exc.hint
        return info
    if isinstance(exc, UsageError):
        return ErrorInfo("bad %%cuvil options", str(exc), hint="see `%%cuvil?` for the options")
    if isinstance(exc, CuvilPipelineError):
        first, *rest = str(exc).splitlines()
        return ErrorInfo("bad pipeline (--passes)", first, snippet=[(0, r.strip("\n")) for r in rest])
    if isinstance(exc, CuvilError):
        return _cuvil_error(exc, cell, filename)
    frame = _cell_frame(exc, filename)
    if frame is not None:
        return _in_cell("error in your code", f"{type(exc).__name__}: {exc}", cell, frame, None)
    return ErrorInfo(f"internal error in Cuvil ({type(exc).__name__})", str(exc) or type(exc).__name__,
                     hint="this is a bug in Cuvil, not in your code; the traceback is below",
                     details="".join(traceback.format_exception(exc)))


def _kind(exc: CuvilError) -> str:
    if isinstance(exc, CuvilUnsupportedOpError):
        return "unsupported op"
    if isinstance(exc, CuvilPassError):
        return "a pass failed"
    if isinstance(exc, CuvilVerifyError):
        return "invalid IR"
    if isinstance(exc, CuvilExportError):
        return "torch.export could not capture the model"
    return "Cuvil error"


def _cuvil_error(exc: CuvilError, cell: str, filename: str) -> ErrorInfo:
    message = str(exc).split("\n  at ", 1)[0]
    source = getattr(exc, "source", None)
    m = _SOURCE.match(source) if source else None
    if m and m["file"] == filename:
        return _in_cell(_kind(exc), message, cell, int(m["line"]), None)
    if m:
        line = int(m["line"])
        text = linecache.getline(m["file"], line).rstrip("\n")
        return ErrorInfo(_kind(exc), message, where=f"{m['file']}:{line}",
                         snippet=[(line, text)] if text else [], focus=line if text else None)
    frame = _cell_frame(exc, filename)
    if frame is not None:
        return _in_cell(_kind(exc), message, cell, frame, None)
    return ErrorInfo(_kind(exc), message)


def _cell_frame(exc: BaseException, filename: str) -> int | None:
    """The innermost line of the cell in the exception's traceback (or in what caused it)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
        if lines:
            return lines[-1]
        exc = exc.__cause__ or exc.__context__
    return None


def _in_cell(kind: str, message: str, cell: str, line: int | None, col: int | None) -> ErrorInfo:
    """An error at `line` (1-based in the cell body) of the cell; shown with two lines around it."""
    if line is None:
        return ErrorInfo(kind, message)
    lines = cell.splitlines()
    shown = line + 1   # the %%cuvil line is line 1 of the cell
    snippet = [(i + 2, lines[i]) for i in range(max(0, line - 3), min(len(lines), line + 2))]
    where = f"cell line {shown}" + (f", column {col}" if col else "")
    return ErrorInfo(kind, message, where, snippet, shown, col)


def error_html(info: ErrorInfo) -> str:
    width = max((len(str(n)) for n, _ in info.snippet), default=1)
    rows = []
    for n, text in info.snippet:
        number = f"{n:>{width}} | " if n else ""
        row = html.escape(number + text)
        if n and n == info.focus:
            rows.append(f'<span class="cv-focus">{row}</span>')
            if info.col:
                rows.append(" " * (len(number) + info.col - 1) + "^")
        else:
            rows.append(row)
    parts = [f'<div class="cv-title">{html.escape(info.kind)}'
             + (f" at {html.escape(info.where)}" if info.where else "") + "</div>",
             f"<div>{html.escape(info.message)}</div>"]
    if rows:
        parts.append("<pre>" + "\n".join(rows) + "</pre>")
    if info.hint:
        parts.append(f'<div class="cv-hint">{html.escape(info.hint)}</div>')
    if info.details:
        parts.append(f"<details><summary>traceback</summary><pre>{html.escape(info.details)}</pre></details>")
    return f'<style>{CSS}</style><div class="cv-root cv-error">{"".join(parts)}</div>'
