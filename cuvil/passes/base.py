"""The pass base class and the record the pass manager keeps of every pass it ran (or skipped).

A pass is a small frozen dataclass: its fields are its typed options, and its class attributes say
what it is (`name`, `priority`) and what it needs (`requires`, `provides`, `invalidates`).
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..ir.core import Module

# A pass's `run` says whether it changed anything (a bool), returns its statistics (a dict), or
# returns None (the manager finds out by comparing structural fingerprints either way).
PassResult = typing.Union[bool, dict, None]


@dataclass(frozen=True)
class ModulePass:
    """Base class of every pass. Subclass it as a frozen dataclass and decorate with `@register_pass`.

    - `name`: kebab-case, unique; how pipelines name the pass.
    - `priority`: where `Pipeline.insert_by_priority` places the pass among others (lower = earlier).
    - `requires`: conditions that must hold before the pass runs (e.g. "verified"); the pass manager
      refuses to run the pass otherwise.
    - `provides`: conditions that hold after it ran; `invalidates`: conditions it may break.
    - fields: the options, written `{max-ops=16}` in a pipeline for a field `max_ops: int = 16`.
    """
    name: ClassVar[str] = ""
    stage: ClassVar[str] = "graph"
    priority: ClassVar[int] = 100
    requires: ClassVar[frozenset[str]] = frozenset()
    provides: ClassVar[frozenset[str]] = frozenset()
    invalidates: ClassVar[frozenset[str]] = frozenset()

    def when(self, module: Module) -> bool:
        """Conditional triggering: return False to skip the pass on this module."""
        return True

    def run(self, module: Module) -> PassResult:
        raise NotImplementedError(f"pass '{self.name}' does not implement run()")

    # ------------------------------------------------------------------ options

    @classmethod
    def option_fields(cls) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(cls) if f.init]

    @classmethod
    def option_types(cls) -> dict[str, Any]:
        """Field name -> resolved type annotation."""
        hints = typing.get_type_hints(cls)
        return {f.name: hints[f.name] for f in cls.option_fields()}

    def options(self, include_defaults: bool = True) -> dict[str, Any]:
        """Option values by their pipeline (kebab-case) names."""
        out = {}
        for f in self.option_fields():
            value = getattr(self, f.name)
            if include_defaults or not _is_default(f, value):
                out[option_name(f.name)] = value
        return out

    def spec(self, include_defaults: bool = False) -> str:
        """The pass as a pipeline element: `cse{aggressive=true}`; options in declaration order."""
        opts = self.options(include_defaults)
        if not opts:
            return self.name
        body = " ".join(f"{k}={format_option_value(v)}" for k, v in opts.items())
        return f"{self.name}{{{body}}}"

    @classmethod
    def summary(cls) -> str:
        """First line of the docstring (used by `cuvil-opt --list-passes` and the explorer)."""
        doc = (cls.__doc__ or "").strip()
        return doc.splitlines()[0] if doc else ""


@dataclass(frozen=True)
class ProgramPass(ModulePass):
    """A pass over the native program, after lowering: it edits a `ProgramDraft` (cuvil/program.py)
    — the kernels in run order, their priorities, the memory plan — in `run_program`. Program passes
    come after every graph pass in a pipeline; the compiler runs them (`PassManager.run_program`)."""
    stage: ClassVar[str] = "program"

    def run(self, module: Module) -> PassResult:
        raise NotImplementedError(f"pass '{self.name}' runs on the program after lowering, not on graph IR")

    def run_program(self, draft: Any) -> PassResult:
        raise NotImplementedError(f"pass '{self.name}' does not implement run_program()")


def _is_default(f: dataclasses.Field, value: Any) -> bool:
    if f.default is not dataclasses.MISSING:
        return value == f.default
    if f.default_factory is not dataclasses.MISSING:
        return value == f.default_factory()
    return False


def option_name(field_name: str) -> str:
    return field_name.replace("_", "-")


def format_option_value(value: Any) -> str:
    """Text form of an option value, the inverse of the pipeline parser's conversion."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return ",".join(format_option_value(v) for v in value)
    if isinstance(value, str):
        needs_quotes = not value or any(c in value for c in ' ,{}"=')
        return '"' + value.replace('\\', '\\\\').replace('"', '\\"') + '"' if needs_quotes else value
    if value is None:
        return "none"
    return repr(value) if isinstance(value, float) else str(value)


@dataclass
class PassRecord:
    """What happened to one pipeline element. `to_json()` is what the CompileReport embeds."""
    name: str
    options: dict[str, Any]
    spec: str
    changed: bool = False
    time_s: float = 0.0
    statistics: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None          # why the pass did not run, e.g. "when=False"
    ir_before: str | None = None        # filled by the IRSnapshot instrument
    ir_after: str | None = None
    checks: dict[str, Any] = field(default_factory=dict)   # instrument results, e.g. numeric error
    stage: str = "graph"                # "program": ir_before/ir_after are the program's text

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "options": {k: _jsonable(v) for k, v in self.options.items()},
            "spec": self.spec,
            "changed": self.changed,
            "time_s": self.time_s,
            "statistics": {k: _jsonable(v) for k, v in self.statistics.items()},
            "skipped": self.skipped,
            "ir_before": self.ir_before,
            "ir_after": self.ir_after,
            "checks": {k: _jsonable(v) for k, v in self.checks.items()},
            "stage": self.stage,
        }


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else repr(v)
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return str(v)
