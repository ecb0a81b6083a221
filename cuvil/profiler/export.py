"""A CompileReport's profiles as spans, and their export: Chrome trace JSON (Perfetto,
chrome://tracing), speedscope JSON and folded stacks (Brendan Gregg's flamegraph.pl input).

Two profiles come from a report:

- `compile_profile`: the compile phases (`report.phases`: import, passes, then the native phases)
  with each pass inside "passes" and the native phases inside "native code". Phases and passes
  record how long they took, not when they started; they run one after another, so they are laid
  out back to back in the order they ran.
- `run_profile`: one native run (`report.profile["run"]`, filled by `CompiledModel.profile`): one
  span per kernel call (a step split across threads: one per chunk), named after the step's kernel
  (`report.schedule`), on its thread's track, at the times the engine recorded (monotonic ns),
  relative to the first call's start.

Times are integer nanoseconds throughout, so a parent's self time is exactly its duration less its
children's, and folded stacks add up to the profile's total.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..compiler import NATIVE_PHASES

if TYPE_CHECKING:
    from ..report import CompileReport

SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"
NATIVE_GROUP = "native code"
FORMATS = ("chrome", "speedscope", "folded")


@dataclass(frozen=True)
class Span:
    name: str
    stack: tuple[str, ...]      # frame names from the outermost down to this span (its name last)
    start_ns: int
    end_ns: int
    track: str                  # "compile", "thread 0", ...
    args: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def depth(self) -> int:
        return len(self.stack) - 1

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass
class Profile:
    name: str                   # "compile" or "run"
    spans: list[Span]
    per_thread: bool = False    # tracks are threads: folded stacks start with the thread
    sources: dict[str, tuple[str, int]] = field(default_factory=dict)   # frame name -> (file, line)

    @property
    def tracks(self) -> list[str]:
        return list(dict.fromkeys(s.track for s in self.spans))

    @property
    def start_ns(self) -> int:
        return min((s.start_ns for s in self.spans), default=0)

    @property
    def end_ns(self) -> int:
        return max((s.end_ns for s in self.spans), default=0)

    def total_ns(self) -> int:
        """The time the outermost spans cover (summed over tracks)."""
        return sum(s.dur_ns for s in self.spans if s.depth == 0)


def _ns(seconds: float) -> int:
    return max(0, round(seconds * 1e9))


def compile_profile(report: "CompileReport") -> Profile:
    """The compilation: phases back to back, passes inside "passes", native phases inside "native code"
    (not those that ran in the background, after the compile returned: the model cache's write)."""
    top: list[tuple[str, int, list[tuple[str, int, dict]], dict]] = []   # (name, ns, children, args)
    for ph in report.phases:
        if ph.get("background"):
            continue
        args = {k: v for k, v in ph.items() if k not in ("name", "time_s")}
        if ph["name"] in NATIVE_PHASES:
            if not top or top[-1][0] != NATIVE_GROUP:
                top.append((NATIVE_GROUP, 0, [], {}))
            name, ns, children, a = top[-1]
            children.append((ph["name"], _ns(ph["time_s"]), args))
            top[-1] = (name, ns + _ns(ph["time_s"]), children, a)
        elif ph["name"] == "passes":
            passes = [(p.get("spec") or p["name"], _ns(p.get("time_s", 0.0)),
                       {"changed": bool(p.get("changed")), **({"skipped": p["skipped"]} if p.get("skipped") else {})})
                      for p in report.passes]
            top.append(("passes", _ns(ph["time_s"]), passes, args))
        else:
            top.append((ph["name"], _ns(ph["time_s"]), [], args))
    spans, t = [], 0
    for name, ns, children, args in top:
        inner, c = [], t
        for child, cns, cargs in children:
            inner.append(Span(child, (name, child), c, c + cns, "compile", cargs))
            c += cns
        end = max(t + ns, c)     # a phase is never shorter than what ran inside it
        spans.append(Span(name, (name,), t, end, "compile", args))
        spans += inner
        t = end
    return Profile("compile", spans)


def run_profile(report: "CompileReport") -> Profile | None:
    """The profiled native run (None when the report has none): a span per kernel call, per thread."""
    records = report.profile.get("run") or []
    if not records:
        return None
    t0 = min(r["start_ns"] for r in records)
    # a record names the code it ran, which kernels of the same structure share: name the step's own
    steps = {st["step"]: st["kernel"] for st in report.schedule}
    spans = []
    for r in sorted(records, key=lambda r: (r["thread"], r["start_ns"])):
        name = steps.get(r["step"], r["kernel"])
        spans.append(Span(name, (name,), r["start_ns"] - t0, r["end_ns"] - t0, f"thread {r['thread']}",
                          {"step": r["step"], "chunk": r["chunk"]}))
    sources = {}
    for k in report.kernels:
        if k.get("sources"):
            file, _, line = k["sources"][0].rpartition(":")
            sources[k["name"]] = (file, int(line))
    return Profile("run", spans, per_thread=True, sources=sources)


def profiles(report: "CompileReport") -> list[Profile]:
    """The compile profile, and the run profile when the report has one."""
    run = run_profile(report)
    return [compile_profile(report)] + ([run] if run is not None else [])


# ----------------------------------------------------------------------------- Chrome trace


def chrome_trace(*profs: Profile) -> dict[str, Any]:
    """Trace Event Format (JSON object form): one process per profile, one thread per track, a
    complete ("X") event per span; `ts`/`dur` in microseconds. Opens in Perfetto and chrome://tracing."""
    events: list[dict] = []
    for pid, prof in enumerate(profs, 1):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"cuvil {prof.name}"}})
        tids = {track: tid for tid, track in enumerate(prof.tracks, 1)}
        for track, tid in tids.items():
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": track}})
        for s in prof.spans:
            events.append({"name": s.name, "cat": prof.name, "ph": "X", "pid": pid, "tid": tids[s.track],
                           "ts": s.start_ns / 1e3, "dur": s.dur_ns / 1e3, "args": dict(s.args)})
    return {"traceEvents": events, "displayTimeUnit": "ns"}


# ----------------------------------------------------------------------------- speedscope


def speedscope(*profs: Profile, name: str = "cuvil") -> dict[str, Any]:
    """speedscope's file format: one evented profile per track of each profile, frames shared (a
    kernel's frame carries the file and line of its first source line)."""
    from .. import __version__

    frames: list[dict] = []
    index: dict[tuple, int] = {}

    def frame(prof: Profile, frame_name: str) -> int:
        file_line = prof.sources.get(frame_name)
        key = (frame_name, file_line)
        if key not in index:
            index[key] = len(frames)
            f = {"name": frame_name}
            if file_line:
                f.update(file=file_line[0], line=file_line[1])
            frames.append(f)
        return index[key]

    out = []
    for prof in profs:
        for track in prof.tracks:
            spans = sorted((s for s in prof.spans if s.track == track), key=lambda s: (s.start_ns, -s.end_ns, s.depth))
            events: list[dict] = []
            open_: list[tuple[Span, int]] = []
            for s in spans:
                while open_ and open_[-1][0].end_ns <= s.start_ns:
                    done, f = open_.pop()
                    events.append({"type": "C", "frame": f, "at": done.end_ns})
                f = frame(prof, s.name)
                events.append({"type": "O", "frame": f, "at": s.start_ns})
                open_.append((s, f))
            while open_:
                done, f = open_.pop()
                events.append({"type": "C", "frame": f, "at": done.end_ns})
            label = prof.name if len(prof.tracks) == 1 and track == prof.name else f"{prof.name} · {track}"
            out.append({"type": "evented", "name": label, "unit": "nanoseconds", "startValue": 0,
                        "endValue": max((s.end_ns for s in spans), default=0), "events": events})
    return {"$schema": SPEEDSCOPE_SCHEMA, "shared": {"frames": frames}, "profiles": out, "name": name,
            "activeProfileIndex": 0, "exporter": f"cuvil {__version__}"}


# ----------------------------------------------------------------------------- folded stacks


def folded_stacks(*profs: Profile) -> str:
    """`frame;frame;frame value` lines, value = self time in ns, one line per distinct stack (self
    time summed), in first-seen order; a run's stacks start with their thread. Stacks with no self
    time are left out."""
    totals: dict[str, int] = defaultdict(int)
    for prof in profs:
        for s in prof.spans:
            prefix = (s.track,) if prof.per_thread else ()
            totals[";".join(prefix + s.stack)] += s.dur_ns
            if s.depth:     # a span's time is not its parent's self time
                totals[";".join(prefix + s.stack[:-1])] -= s.dur_ns
    return "".join(f"{stack} {value}\n" for stack, value in totals.items() if value > 0)


# ----------------------------------------------------------------------------- files


def render(fmt: str, *profs: Profile, name: str = "cuvil") -> str:
    """The text of an export: `fmt` is "chrome", "speedscope" or "folded"."""
    if fmt == "chrome":
        return json.dumps(chrome_trace(*profs))
    if fmt == "speedscope":
        return json.dumps(speedscope(*profs, name=name))
    if fmt == "folded":
        return folded_stacks(*profs)
    raise ValueError(f"unknown profile format {fmt!r}; the formats are {', '.join(FORMATS)}")


def save(path: str | Path, fmt: str, *profs: Profile, name: str = "cuvil") -> Path:
    """Write an export to `path`; returns the path."""
    path = Path(path)
    path.write_text(render(fmt, *profs, name=name), encoding="utf-8")
    return path
