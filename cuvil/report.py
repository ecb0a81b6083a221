"""CompileReport: the one data object the explorer, the static HTML report and tools read.

Everything in it is plain JSON data (str, int, float, bool, None, list, dict), so a report can be
saved, attached to a bug report and reopened without a kernel. Sections that a compilation did not
produce yet (kernels before native code generation, say) are empty lists, never missing keys.
"""
from __future__ import annotations

import json
import linecache
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPORT_VERSION = 1


@dataclass
class SourceLine:
    """A user source line that some IR op came from."""
    file: str
    line: int
    text: str
    ops: list[int] = field(default_factory=list)   # ids of the ops carrying this location


@dataclass
class CompileReport:
    name: str
    input_ir: str = ""                      # graph IR right after import
    output_ir: str = ""                     # graph IR after the pipeline
    pipeline: str = ""                      # the canonical pipeline string that ran
    passes: list[dict] = field(default_factory=list)       # PassRecord.to_json() per pass
    sources: list[SourceLine] = field(default_factory=list)
    phases: list[dict] = field(default_factory=list)       # {"name", "time_s"} per compile phase
    fusion: dict = field(default_factory=lambda: {"groups": [], "refused": []})
    memory: dict = field(default_factory=lambda: {"buffers": [], "arena_bytes": 0, "naive_bytes": 0})
    kernels: list[dict] = field(default_factory=list)
    schedule: list[dict] = field(default_factory=list)
    profile: dict = field(default_factory=lambda: {"compile": [], "run": []})
    version: int = REPORT_VERSION

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1)

    def save_json(self, path: str | Path) -> None:
        Path(path).write_text(self.dumps())

    def save_html(self, path: str | Path) -> None:
        """Write one self-contained HTML page (pipeline, graph, summary, IR) viewable without a kernel."""
        from .report_html import render_report_html
        Path(path).write_text(render_report_html(self), encoding="utf-8")

    @staticmethod
    def from_json(data: dict[str, Any]) -> "CompileReport":
        data = dict(data)
        data["sources"] = [SourceLine(**s) for s in data.get("sources", [])]
        return CompileReport(**data)

    @staticmethod
    def load_json(path: str | Path) -> "CompileReport":
        return CompileReport.from_json(json.loads(Path(path).read_text()))

    def summary(self) -> str:
        changed = sum(1 for p in self.passes if p.get("changed"))
        total = sum(p.get("time_s", 0.0) for p in self.passes)
        return (f"CompileReport {self.name}: {len(self.passes)} passes ({changed} changed IR, "
                f"{total * 1e3:.1f} ms), {len(self.sources)} source lines")


def source_lines(fn) -> list[SourceLine]:
    """Group the ops of a function by their source location, with the text of each line."""
    by_line: dict[tuple[str, int], SourceLine] = {}
    for op in fn.ops:
        if op.loc is None:
            continue
        key = (op.loc.file, op.loc.line)
        if key not in by_line:
            text = linecache.getline(op.loc.file, op.loc.line).rstrip()
            by_line[key] = SourceLine(op.loc.file, op.loc.line, text)
        by_line[key].ops.append(op.id)
    return sorted(by_line.values(), key=lambda s: (s.file, s.line))
