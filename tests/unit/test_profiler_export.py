"""cuvil.profiler: the compile and run profiles of a report, and their export to Chrome trace JSON,
speedscope JSON and folded stacks, checked against the formats and against hand-computed times."""
from __future__ import annotations

import json

import jsonschema
import pytest
import torch

import cuvil
from cuvil import profiler
from cuvil.report import CompileReport

MS = 1_000_000

# speedscope's file format (src/lib/file-format-spec.ts in jlfwong/speedscope), as JSON Schema
SPEEDSCOPE = {
    "type": "object",
    "required": ["$schema", "shared", "profiles"],
    "properties": {
        "$schema": {"const": "https://www.speedscope.app/file-format-schema.json"},
        "shared": {"type": "object", "required": ["frames"], "properties": {"frames": {"type": "array", "items": {
            "type": "object", "required": ["name"],
            "properties": {"name": {"type": "string"}, "file": {"type": "string"}, "line": {"type": "number"},
                           "col": {"type": "number"}}}}}},
        "profiles": {"type": "array", "items": {
            "type": "object", "required": ["type", "name", "unit", "startValue", "endValue", "events"],
            "properties": {
                "type": {"const": "evented"}, "name": {"type": "string"},
                "unit": {"enum": ["none", "nanoseconds", "microseconds", "milliseconds", "seconds", "bytes"]},
                "startValue": {"type": "number"}, "endValue": {"type": "number"},
                "events": {"type": "array", "items": {
                    "type": "object", "required": ["type", "at", "frame"],
                    "properties": {"type": {"enum": ["O", "C"]}, "at": {"type": "number"},
                                   "frame": {"type": "integer", "minimum": 0}}}}}}},
        "name": {"type": "string"}, "activeProfileIndex": {"type": "integer"}, "exporter": {"type": "string"},
    },
}


@pytest.fixture
def report() -> CompileReport:
    """Hand-made: phases import 0.5 s, passes 0.1 s (a 30 ms, b 50 ms), lowering 0.2 s, codegen 0.1 s;
    a run of three kernel calls on two threads. Step 2 runs code it shares with step 0."""
    return CompileReport(
        name="toy",
        passes=[{"name": "a", "spec": "a", "time_s": 0.03, "changed": True},
                {"name": "b", "spec": "b{x=1}", "time_s": 0.05, "changed": False}],
        phases=[{"name": "import", "time_s": 0.5}, {"name": "passes", "time_s": 0.1},
                {"name": "lowering", "time_s": 0.2}, {"name": "codegen", "time_s": 0.1}],
        kernels=[{"name": "k0", "sources": ["/src/model.py:7"], "ops": []},
                 {"name": "k1", "sources": [], "ops": []}, {"name": "k2", "sources": ["/src/model.py:9"], "ops": []}],
        schedule=[{"step": 0, "kernel": "k0"}, {"step": 1, "kernel": "k1"}, {"step": 2, "kernel": "k2"}],
        profile={"compile": [], "run": [
            {"step": 0, "kernel": "k0", "chunk": 0, "thread": 0, "start_ns": 1000, "end_ns": 4000},
            {"step": 1, "kernel": "k1", "chunk": 0, "thread": 1, "start_ns": 2000, "end_ns": 2500},
            {"step": 2, "kernel": "k0", "chunk": 0, "thread": 0, "start_ns": 4500, "end_ns": 6000}]})


def test_compile_profile_lays_phases_back_to_back(report):
    prof = profiler.compile_profile(report)
    got = [(s.stack, s.start_ns, s.end_ns) for s in prof.spans]
    assert got == [
        (("import",), 0, 500 * MS),
        (("passes",), 500 * MS, 600 * MS),
        (("passes", "a"), 500 * MS, 530 * MS),
        (("passes", "b{x=1}"), 530 * MS, 580 * MS),
        (("native code",), 600 * MS, 900 * MS),
        (("native code", "lowering"), 600 * MS, 800 * MS),
        (("native code", "codegen"), 800 * MS, 900 * MS),
    ]
    assert prof.total_ns() == 900 * MS and prof.tracks == ["compile"]


def test_run_profile_names_steps_after_their_own_kernel(report):
    prof = profiler.run_profile(report)
    assert [(s.track, s.name, s.start_ns, s.end_ns) for s in prof.spans] == [
        ("thread 0", "k0", 0, 3000), ("thread 0", "k2", 3500, 5000), ("thread 1", "k1", 1000, 1500)]
    assert prof.sources == {"k0": ("/src/model.py", 7), "k2": ("/src/model.py", 9)}
    assert profiler.run_profile(CompileReport(name="none")) is None


def test_chrome_trace_events(report):
    profs = profiler.profiles(report)
    trace = json.loads(profiler.render("chrome", *profs))
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == 7 + 3
    for e in complete:
        assert set(e) >= {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"} and e["dur"] >= 0
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names == {(1, 1): "compile", (2, 1): "thread 0", (2, 2): "thread 1"}
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert processes == {1: "cuvil compile", 2: "cuvil run"}
    # microseconds; a pass lies inside the passes phase on the same track
    (b,) = [e for e in complete if e["name"] == "b{x=1}"]
    (passes,) = [e for e in complete if e["name"] == "passes"]
    assert (b["ts"], b["dur"]) == (530_000.0, 50_000.0)
    assert passes["ts"] <= b["ts"] and b["ts"] + b["dur"] <= passes["ts"] + passes["dur"] and b["tid"] == passes["tid"]
    (k1,) = [e for e in complete if e["name"] == "k1"]
    assert (k1["pid"], k1["tid"], k1["ts"], k1["dur"], k1["args"]) == (2, 2, 1.0, 0.5, {"step": 1, "chunk": 0})


def check_speedscope(doc: dict) -> None:
    """The schema, and what it cannot say: events balanced, closing the frame they opened, in time order."""
    jsonschema.validate(doc, SPEEDSCOPE)
    frames = doc["shared"]["frames"]
    for p in doc["profiles"]:
        stack, last = [], p["startValue"]
        for e in p["events"]:
            assert e["frame"] < len(frames) and e["at"] >= last
            last = e["at"]
            if e["type"] == "O":
                stack.append(e["frame"])
            else:
                assert stack.pop() == e["frame"]
        assert stack == [] and last <= p["endValue"]


def test_speedscope_document(report):
    doc = profiler.speedscope(*profiler.profiles(report), name="toy")
    check_speedscope(doc)
    assert [p["name"] for p in doc["profiles"]] == ["compile", "run · thread 0", "run · thread 1"]
    frames = doc["shared"]["frames"]
    assert {"name": "k2", "file": "/src/model.py", "line": 9} in frames
    thread0 = doc["profiles"][1]
    assert [(e["type"], frames[e["frame"]]["name"], e["at"]) for e in thread0["events"]] == [
        ("O", "k0", 0), ("C", "k0", 3000), ("O", "k2", 3500), ("C", "k2", 5000)]
    compile_events = [(e["type"], frames[e["frame"]]["name"]) for e in doc["profiles"][0]["events"]][:6]
    assert compile_events == [("O", "import"), ("C", "import"), ("O", "passes"), ("O", "a"), ("C", "a"), ("O", "b{x=1}")]
    with pytest.raises(jsonschema.ValidationError):    # the schema is not vacuous
        jsonschema.validate({**doc, "$schema": "x"}, SPEEDSCOPE)


def parse_folded(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        stack, value = line.rsplit(" ", 1)
        out[stack] = int(value)
    return out


def test_folded_stacks_sum_to_the_totals(report):
    comp, run = profiler.profiles(report)
    folded = parse_folded(profiler.folded_stacks(comp))
    assert folded == {"import": 500 * MS, "passes": 20 * MS, "passes;a": 30 * MS, "passes;b{x=1}": 50 * MS,
                      "native code;lowering": 200 * MS, "native code;codegen": 100 * MS}
    assert sum(folded.values()) == comp.total_ns()
    assert parse_folded(profiler.folded_stacks(run)) == {"thread 0;k0": 3000, "thread 0;k2": 1500, "thread 1;k1": 500}


def test_save_and_unknown_format(report, tmp_path):
    profs = profiler.profiles(report)
    path = profiler.save(tmp_path / "t.json", "chrome", *profs)
    assert json.loads(path.read_text())["traceEvents"]
    with pytest.raises(ValueError, match="unknown profile format 'pprof'"):
        profiler.render("pprof", *profs)


def test_a_real_compiled_run_exports_cleanly():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    x = torch.randn(3, 16)
    compiled = cuvil.compile(model)
    out, timings = compiled.profile(x)
    with torch.no_grad():
        assert torch.allclose(out, model(x), atol=1e-5)
    comp, run = profiler.profiles(compiled.report)
    assert sorted(s.name for s in run.spans) == sorted(compiled.report.schedule[t.step]["kernel"] for t in timings)
    check_speedscope(profiler.speedscope(comp, run))
    folded = parse_folded(profiler.folded_stacks(run))
    assert sum(folded.values()) == sum(t.end_ns - t.start_ns for t in timings)
    trace = profiler.chrome_trace(comp, run)
    passes = [e["name"] for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "compile"]
    assert [p["spec"] for p in compiled.report.passes] == passes[passes.index("passes") + 1:][:len(compiled.report.passes)]
