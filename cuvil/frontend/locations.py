"""Source locations: the user's innermost frame in an FX node's stack trace, as a `Loc`.

"User" means any file outside torch, the Python standard library and Cuvil's own frontend, so for
a Hugging Face model it is the line in the transformers modeling file that called the op.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import linecache
import os
import re
import sys
import traceback
from dataclasses import dataclass

import torch

from ..ir import Loc

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>[^\n]*)(?:\n(?P<code>    [^\n]*))?')

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_STDLIB_DIR = os.path.realpath(os.path.dirname(os.__file__)) + os.sep
_INSTALLED_TORCH = re.compile(r"(site|dist)-packages[/\\]torch[/\\]")
_FRONTEND_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


@dataclass(frozen=True)
class SourceFrame:
    file: str
    line: int
    code: str = ""

    @property
    def loc(self) -> Loc:
        return Loc(self.file, self.line)

    def __str__(self) -> str:
        text = self.code or linecache.getline(self.file, self.line).strip()
        return f"{self.file}:{self.line}: {text}" if text else f"{self.file}:{self.line}"


@functools.lru_cache(maxsize=None)
def is_user_file(path: str) -> bool:
    """False for torch internals (absolute or `torch/...` relative, and the code FX generates),
    the stdlib and this frontend."""
    if path.startswith(("torch" + os.sep, "<frozen", "<eval_with_key>")) or _INSTALLED_TORCH.search(path):
        return False
    real = os.path.realpath(path)
    in_stdlib = real.startswith(_STDLIB_DIR) and not re.search(r"(site|dist)-packages", real[len(_STDLIB_DIR):])
    return not (path.startswith(_TORCH_DIR) or real.startswith(_TORCH_DIR) or in_stdlib
                or path.startswith(_FRONTEND_DIR))


def record_user_frames(model_or_fn) -> None:
    """Ask torch to keep the user's frames in recorded stack traces. torch.export keeps only frames
    named `forward` (plus registered anchors), which loses a plain function's lines and those of
    helper methods; register those as anchors (a private torch hook; without it, locations are
    just coarser)."""
    register = getattr(torch.fx.proxy, "_register_stack_trace_anchor", None)
    if register is None:
        return
    if not isinstance(model_or_fn, torch.nn.Module):
        register(model_or_fn)
        return
    for cls in {type(m) for m in model_or_fn.modules()}:
        for attr in vars(cls).values():
            fn = inspect.unwrap(attr) if callable(attr) else None   # decorators' wrappers are not user lines
            code = getattr(fn, "__code__", None)
            if code is not None and is_user_file(code.co_filename):
                register(fn)


@contextlib.contextmanager
def user_stack_traces():
    """While torch traces: each new FX node's stack trace holds the user's frames only, found by a
    walk of the live frames. torch would capture, symbolise and format the whole Python stack of
    every node (~100 frames under torch.export) to keep those few: 50 of BERT-small's 300 ms of
    torch.export. The frames kept are torch's own choice for export: user files' `forward`
    methods and the anchors of `record_user_frames`; the text is a traceback's, as torch writes it.
    Callers hold the export lock: the switch is torch's process-wide config."""
    tracer = torch.fx.proxy.TracerBase
    anchors = getattr(torch.fx.proxy, "_STACK_TRACE_ANCHORS", set())
    if not hasattr(torch.fx.config, "do_not_emit_stack_traces"):
        yield
        return
    create = tracer.create_node

    def create_node(self, *args, **kwargs):
        node = create(self, *args, **kwargs)
        if not node.stack_trace:
            node.stack_trace = _user_trace(sys._getframe(1), anchors)
        return node

    emitting = torch.fx.config.do_not_emit_stack_traces
    torch.fx.config.do_not_emit_stack_traces, tracer.create_node = True, create_node
    try:
        yield
    finally:
        torch.fx.config.do_not_emit_stack_traces, tracer.create_node = emitting, create


def _user_trace(frame, anchors) -> str | None:
    lines = []
    while frame is not None:
        code = frame.f_code
        if (code.co_name == "forward" or (code.co_filename, code.co_name) in anchors) \
                and is_user_file(code.co_filename):
            text = linecache.getline(code.co_filename, frame.f_lineno).strip()
            lines.append(f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}\n    {text}')
        frame = frame.f_back
    return "\n".join(reversed(lines)) or None


def frames_from_text(text: str) -> list[SourceFrame]:
    """Every `File "...", line N` frame in a printed traceback, outermost first."""
    return [SourceFrame(m["file"], int(m["line"]), (m["code"] or "").strip()) for m in _FRAME.finditer(text)]


def user_frame(frames: list[SourceFrame]) -> SourceFrame | None:
    """The innermost frame in user code."""
    for f in reversed(frames):
        if is_user_file(f.file):
            return f
    return None


def node_frame(node: torch.fx.Node) -> SourceFrame | None:
    """The user's source line that produced an FX node, from its recorded stack trace."""
    trace = node.meta.get("stack_trace")
    return user_frame(frames_from_text(trace)) if trace else None


def exception_frame(exc: BaseException) -> SourceFrame | None:
    """The user's innermost frame in an exception: its traceback first, then any trace quoted in
    its message (strict-mode export errors quote the user's code there), through chained causes."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = [SourceFrame(f.filename, f.lineno or 0, (f.line or "").strip())
              for f in traceback.extract_tb(exc.__traceback__)]
        found = user_frame(frames_from_text(str(exc))) or user_frame(tb)
        if found is not None:
            return found
        exc = exc.__cause__ or exc.__context__
    return None
