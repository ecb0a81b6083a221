"""The program-stage passes (schedule, plan-memory): their place in pipelines, what they do to the
program, their records, and latency anchors."""
import pytest
import torch

from cuvil.compiler import compile_module
from cuvil.errors import CuvilPipelineError
from cuvil.ir import parse
from cuvil.passes import PassManager
from cuvil.schedule import anchor_misses

# Two branches, each a big intermediate reduced to a small one. Written branch-by-branch
# interleaved, both big buffers are alive at once; run one branch after the other, only one is.
BRANCHES = """
cuvil.func @f(%x: tensor<256x256xf32>) -> tensor<256xf32> {
  %a = cuvil.exp %x : tensor<256x256xf32> -> tensor<256x256xf32>
  %b = cuvil.sin %x : tensor<256x256xf32> -> tensor<256x256xf32>
  %ra = cuvil.sum %a {dims = [1]} : tensor<256x256xf32> -> tensor<256xf32>
  %rb = cuvil.sum %b {dims = [1]ANCHOR} : tensor<256x256xf32> -> tensor<256xf32>
  %o = cuvil.add %ra, %rb : (tensor<256xf32>, tensor<256xf32>) -> tensor<256xf32>
  cuvil.return %o : tensor<256xf32>
}
"""
UNFUSED = "verify,shape-infer"


def compiled(pipeline: str, anchor: str = ""):
    module = parse(BRANCHES.replace("ANCHOR", anchor))
    return compile_module(module, pipeline=pipeline, cache=None)


def reference(x):
    return torch.exp(x).sum(1) + torch.sin(x).sum(1)


def program_record(report, name):
    return next(p for p in report.passes if p["name"] == name)


def test_program_passes_come_after_graph_passes():
    with pytest.raises(CuvilPipelineError, match="pass 'cse' runs on graph IR but comes after 'plan-memory'"):
        PassManager("verify,plan-memory,cse")


def test_without_program_passes_buffers_do_not_share_memory():
    c = compiled(UNFUSED)
    assert c.report.memory["arena_bytes"] == c.report.memory["naive_bytes"] == 2 * 256 * 256 * 4 + 2 * 1024
    x = torch.randn(256, 256)
    torch.testing.assert_close(c.native(x)[0], reference(x))


def test_schedule_then_plan_memory_halves_the_arena():
    plain = compiled(UNFUSED + ",plan-memory")
    both = compiled(UNFUSED + ",schedule{slack=1},plan-memory")
    # in written order both big buffers are alive at step 2; with every ready step competing on
    # memory (slack=1), sum(a) runs before sin
    assert plain.report.memory["arena_bytes"] >= 2 * 256 * 256 * 4
    assert both.report.memory["arena_bytes"] < 256 * 256 * 4 + 4096
    sched = program_record(both.report, "schedule")
    assert sched["stage"] == "program" and sched["changed"] and sched["statistics"]["moved"] > 0
    assert sched["statistics"]["peak_live_bytes"] < sched["statistics"]["peak_live_bytes_before"]
    kernels = [line.split()[2].split("(")[0] for line in sched["ir_after"].splitlines() if line.startswith("  step")]
    assert [k.split("_", 2)[2] for k in kernels] == ["exp", "sum", "sin", "sum", "add"]
    plan = program_record(both.report, "plan-memory")
    assert plan["statistics"]["arena_bytes"] == both.report.memory["arena_bytes"]
    assert plan["statistics"]["arena_bytes"] >= plan["statistics"]["peak_live_bytes"]
    assert "arena" in plan["ir_after"] and "arena" not in plan["ir_before"]
    x = torch.randn(256, 256)
    torch.testing.assert_close(both.native(x)[0], reference(x))


def test_naive_strategy_is_the_naive_sum():
    c = compiled(UNFUSED + ",schedule,plan-memory{strategy=naive}")
    assert c.report.memory["arena_bytes"] == c.report.memory["naive_bytes"]


def test_options_are_checked_when_the_pipeline_is_parsed():
    with pytest.raises(CuvilPipelineError, match="align must be a power of two"):
        PassManager("plan-memory{align=48}")
    with pytest.raises(CuvilPipelineError, match="strategy"):
        PassManager("plan-memory{strategy=first-fit}")


def test_default_schedule_keeps_the_longest_path_first():
    c = compiled(UNFUSED + ",schedule,plan-memory")
    sched = program_record(c.report, "schedule")
    assert sched["statistics"]["moved"] == 0 and sched["statistics"]["critical_path_ns"] > 0


def test_anchored_branch_runs_first_and_misses_are_reported():
    c = compiled(UNFUSED + ",schedule,plan-memory", anchor=", schedule.max_latency_us = 0.001")
    text = program_record(c.report, "schedule")["ir_after"]
    steps = [line for line in text.splitlines() if line.startswith("  step")]
    assert "sin" in steps[0] and "max_latency_us=0.001" in steps[1]
    anchored = c.native.build.anchors_us
    assert anchored == {1: 0.001}
    x = torch.randn(256, 256)
    out, timings = c.native.executable.profile(x)
    torch.testing.assert_close(out[0], reference(x))
    misses = anchor_misses(timings, anchored)
    assert [(m.step, m.max_latency_us) for m in misses] == [(1, 0.001)] and misses[0].over_us > 0
    assert anchor_misses(timings, {1: 1e9}) == []


def test_records_of_program_passes_when_nothing_is_compiled():
    c = compile_module(parse(BRANCHES.replace("ANCHOR", "")), pipeline=UNFUSED + ",schedule,plan-memory",
                       native=False)
    assert [(p["name"], p["stage"], p["skipped"]) for p in c.report.passes][-2:] == [
        ("schedule", "program", "native=False"), ("plan-memory", "program", "native=False")]
