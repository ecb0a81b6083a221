"""The native path of `%%cuvil` and the code, memory, profile and fusion panels, in an in-process IPython
shell, on the zoo's CNN: the run against eager PyTorch, provenance from source lines to kernels and back,
the memory plan pictures, the profile exports and the pass bisection; and on a block with a GEMM epilogue,
a residual add, a layer norm, an RMS norm and a softmax: the fuse pass's groups and refusals."""
from __future__ import annotations

import html
import json
import re

import pytest
import torch

import cuvil
from cuvil import zoo
from cuvil import CuvilError
from cuvil.passes import unregister_pass

from explorer_cases import FOLDABLE_IR, FUSION_BLOCK

CNN_CELL = "cnn.model(*cnn.example_inputs)"


@pytest.fixture(scope="module")
def cnn(cuvil_cell, shell):
    shell.user_ns["cnn"] = zoo.get("cnn")
    return cuvil_cell("--dynamic cnn.dynamic --ranges cnn.ranges", CNN_CELL).explorer


def test_native_run_against_eager(cnn):
    run, report = cnn.run, cnn.run.report
    entry = cnn.run.target
    assert run.engine == "native" and isinstance(run.compiled, cuvil.CompiledModel)
    with torch.no_grad():
        expected = entry.fn(*entry.args)
    assert torch.allclose(run.result, expected, atol=1e-5)
    check = report.profile["vs_eager"]
    assert check["max_abs_err"] == pytest.approx(float((run.result - expected).abs().max()), abs=1e-7)
    assert check["runs"] >= 3 and check["reference_runs"] >= 3
    assert check["compiled_median_s"] > 0 and check["reference_median_s"] > 0
    # one profiled run: every step ran, each record on a step of the schedule
    records = report.profile["run"]
    assert {r["step"] for r in records} == set(range(len(report.schedule)))
    summary = cnn.panels["summary"].widget.value
    assert "as fast as eager PyTorch" in summary and f"{len(report.kernels)} ({len(report.schedule)} steps)" in summary
    assert cnn.tab.titles == ("Pipeline", "Graph", "Fusion", "Code", "Memory", "Profile", "Summary")
    assert f"native code: {len(report.kernels)} kernels" in cnn.widget.children[0].value


def test_code_panel_from_source_line_to_kernels_and_back(cnn):
    report = cnn.run.report
    code = cnn.select("code")
    (line,) = [s for s in report.sources if "self.depthwise" in s.text]
    key = f"{line.file}:{line.line}"
    # independently: the kernels holding an op that carries this line's location
    expected = [k["name"] for k in report.kernels if {op["id"] for op in k["ops"]} & set(line.ops)]
    assert len(expected) >= 2
    code.sources.value = key
    assert code.hits() == expected and code.current == expected[0] and cnn.state.kernel == expected[0]
    marked = [name for label, name in code.kernels.options if label.startswith("◆")]
    assert marked == expected
    # the ops of the shown kernel from that line are marked in its header
    kernel = next(k for k in report.kernels if k["name"] == expected[1])
    code.kernels.value = expected[1]
    hits = re.findall(r'<tr data-src="[^"]*" class="cv-hit"><td>(\d+)</td>', code.header.value)
    assert sorted(map(int, hits)) == sorted(op["id"] for op in kernel["ops"] if op["id"] in line.ops)
    # and back: the kernel's source lines are marked in the list
    from_kernel = {k for k in kernel["sources"]}
    assert {k for label, k in code.sources.options if label.startswith("◆")} == from_kernel
    code.view.value = "asm"
    assert kernel["asm"].splitlines()[0] in code.code.value
    code.view.value = "side"
    assert code.code.value.count('class="cv-pre cv-codeblock"') == 3


def test_memory_panel(cnn):
    report = cnn.run.report
    buffers = report.memory["buffers"]
    mem = cnn.select("memory")
    assert mem.timeline.value.count('<g class="cv-buf') == len(buffers)
    assert mem.packing.value.count('<g class="cv-buf') == len(buffers)
    name = buffers[1]["name"]
    mem.buffer.value = name
    assert mem.timeline.value.count("cv-buf cv-on") == 1 and mem.packing.value.count("cv-buf cv-on") == 1
    users = [f"step {st['step']}" for st in report.schedule if any(s["name"] == name for s in st["slots"])]
    used_by = re.search(r"<th>used by</th><td>(.*?)</td>", mem.details.value)[1]
    assert re.findall(r"step \d+", used_by) == users
    mem.step.value = 1
    live = sum(b["size"] for b in buffers if b["first_step"] <= 1 <= b["last_step"])
    assert "cv-stepon" in mem.timeline.value and f"{live / 1024:.1f} KiB" in mem.details.value


def test_profile_panel_saves_and_shows_code(cnn, tmp_path):
    prof = cnn.select("profile")
    assert prof.which.value == "run" and "cv-flamesvg" in prof.flame.value
    run = cnn.run.report.profile["run"]
    assert prof.flame.value.count('<g class="cv-fl"') == len(run) + 1      # a frame per call, and the top bar
    prof.which.value = "compile"
    assert all(f'data-n="{p["spec"]}"' in prof.flame.value for p in cnn.run.report.passes)
    prof.path.value = str(tmp_path / "cnn")
    for button in prof.saves.values():
        button.click()
    trace = json.loads((tmp_path / "cnn.trace.json").read_text())
    assert sum(e["ph"] == "X" and e["cat"] == "run" for e in trace["traceEvents"]) == len(run)
    speedscope = json.loads((tmp_path / "cnn.speedscope.json").read_text())
    assert speedscope["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    folded = (tmp_path / "cnn.folded.txt").read_text().splitlines()
    run_lines = [line for line in folded if line.startswith("thread ")]
    assert sum(int(line.rsplit(" ", 1)[1]) for line in run_lines) == sum(r["end_ns"] - r["start_ns"] for r in run)
    name = prof.kernel.options[-1][1]
    prof.kernel.value = name
    prof.show_code.click()
    assert list(cnn.panels)[cnn.tab.selected_index] == "code" and cnn.panels["code"].current == name


def test_bisect_names_the_pass_that_changed_the_results(cuvil_cell):
    @cuvil.register_pass("test-double-literals")
    def double_literals(module):
        for fn in module.functions.values():
            for op in fn.ops:
                if op.name == "cuvil.literal":
                    op.attrs["value"] = op.attrs["value"] * 2
        return True
    try:
        body = 'import torch\ndef k(x: "f32[B,4]"):\n    return torch.relu(x) * 3.0\n'
        ex = cuvil_cell("--passes O1,test-double-literals", body).explorer
        x = ex.run.target.args[0]
        assert ex.run.max_abs_err == pytest.approx(float((3 * torch.relu(x)).abs().max()), rel=1e-6)
        pipe = ex.panels["pipeline"]
        pipe.bisect.click()
        result = ex.run.bisection
        assert result.culprit == "test-double-literals" and result.first_bad == 6
        assert [c["ok"] for c in result.checks] == [True] * 6 + [False]
        assert result.checks[6]["max_abs_err"] == pytest.approx(float((3 * torch.relu(x)).abs().max()), rel=1e-6)
        assert pipe.current == 6 and "test-double-literals, changed the results" in pipe.bisection.value
        assert "numeric" in pipe.header.value
        ok = cuvil_cell("--passes O1", body).explorer
        ok.panels["pipeline"].bisect.click()
        assert ok.run.bisection.culprit is None and "No pass changed the results" in ok.panels["pipeline"].bisection.value
    finally:
        unregister_pass("test-double-literals")


def test_bisect_after_batch_norms_were_folded(cnn):
    """fold-batchnorm replaces the weights of the convolutions: the bisection still has the originals."""
    cnn.panels["pipeline"].bisect.click()
    result = cnn.run.bisection
    (fold,) = [c for c in result.checks if c["spec"] == "fold-batchnorm"]
    assert fold["changed"] and fold["max_abs_err"] is not None and fold["max_abs_err"] < 1e-4
    assert result.culprit is None and "No pass changed the results" in cnn.panels["pipeline"].bisection.value


def test_native_failure_falls_back_to_the_interpreter(cuvil_cell, monkeypatch):
    import cuvil.compiler

    def refuse(*args, **kwargs):
        raise CuvilError("no kernel for this op (test)")
    monkeypatch.setattr(cuvil.compiler, "compile_native", refuse)
    out = cuvil_cell("--force", 'import torch\ndef h(x: "f32[B,8]"):\n    return torch.tanh(x) * 2\n')
    ex = out.explorer
    x = ex.run.target.args[0]
    assert ex.run.engine == "interpreter" and "no kernel for this op (test)" in ex.run.note
    assert torch.allclose(out.bound["_cuvil_result"], torch.tanh(x) * 2, atol=1e-6)
    assert "reference interpreter: native compile failed: no kernel for this op (test)" in ex.widget.children[0].value
    assert "code" not in ex.panels and "memory" not in ex.panels and "profile" in ex.panels
    assert ex.run.report.profile["vs_eager"]["engine"].startswith("the reference interpreter")
    ir = cuvil_cell("--force", FOLDABLE_IR).explorer
    assert ir.run.engine == "interpreter" and ir.run.max_abs_err == 0.0


# ----------------------------------------------------------------------------- fusion


@pytest.fixture(scope="module")
def fused(cuvil_cell):
    return cuvil_cell("", FUSION_BLOCK).explorer


def defining_line(report, name: str) -> str:
    """The output-IR line that defines the value `name`, without its location (found independently
    of the renderers: the names left of ` = `)."""
    (line,) = [ln for ln in report.output_ir.splitlines()
               if " = " in ln and name in ln.strip().split(" = ", 1)[0].split(", ")]
    return re.sub(r' loc\(.*\)$', "", line)


def marked_lines(ir_html: str, cls: str) -> list[str]:
    return [html.unescape(t) for t in re.findall(rf'<span class="cv-irline {cls}"[^>]*>(.*?)</span>', ir_html)]


def test_fusion_panel_lists_groups_and_refusals_and_filters_by_rule(fused):
    report = fused.run.report
    groups, refused = report.fusion["groups"], report.fusion["refused"]
    assert "Fusion" in fused.tab.titles and any(g["kind"] != "single" for g in groups) and refused
    panel = fused.select("fusion")
    assert [i for _, i in panel.groups.options] == list(range(len(groups)))
    for (label, _), g in zip(panel.groups.options, groups):
        assert g["name"] in label and g["kind"] in label and g["summary"] in label
    assert [label for label, _ in panel.refused.options] == [
        f"{r['rule']}: {r['candidate']} {r['candidate_name'].removeprefix('cuvil.')} → {r['consumer']}" for r in refused]
    for rule in {r["rule"] for r in refused}:
        panel.rule.value = rule
        assert [j for _, j in panel.refused.options] == [j for j, r in enumerate(refused) if r["rule"] == rule]
    panel.rule.value = ""
    assert len(panel.refused.options) == len(refused)
    kind = groups[0]["kind"]
    panel.kind.value = kind
    assert [i for _, i in panel.groups.options] == [i for i, g in enumerate(groups) if g["kind"] == kind]
    panel.kind.value = ""


def test_selecting_a_group_shows_its_kernel_and_marks_its_values(fused):
    report = fused.run.report
    panel = fused.select("fusion")
    i, g = max(enumerate(report.fusion["groups"]), key=lambda ig: ig[1]["size"])
    panel.groups.value = i
    assert panel.selected == ("group", i) and panel.refused.value is None
    (kernel,) = [k for k in report.kernels if k["name"] == g["kernel"]]
    assert set(g["ops"]) <= {op["id"] for op in kernel["ops"]}    # the group's ops went into that kernel
    assert fused.state.kernel == kernel["name"] and panel.kernel_box.layout.display is None
    assert html.escape(kernel["kernel_ir"].splitlines()[0]) in panel.code.value
    panel.view.value = "asm"
    assert html.escape(kernel["asm"].splitlines()[0]) in panel.code.value
    panel.view.value = "kernel_ir"
    assert marked_lines(panel.ir.value, "cv-hit") == [defining_line(report, v) for v in g["values"]]
    assert g["summary"] in panel.details.value and f"<code>{kernel['name']}</code>" in panel.details.value
    for _ in range(2):     # opening the Code tab works again after coming back
        panel.open_code.click()
        assert list(fused.panels)[fused.tab.selected_index] == "code" and fused.panels["code"].current == kernel["name"]
        fused.select("fusion")


def test_selecting_a_refusal_marks_its_two_ops(fused):
    report = fused.run.report
    panel = fused.select("fusion")
    for j, r in enumerate(report.fusion["refused"]):
        panel.refused.value = j
        assert panel.selected == ("refused", j) and panel.groups.value is None
        assert panel.kernel_box.layout.display == "none" and panel.code.value == ""
        assert marked_lines(panel.ir.value, "cv-cand") == [defining_line(report, r["candidate"])]
        assert marked_lines(panel.ir.value, "cv-cons") == [defining_line(report, r["consumer"])]
        assert html.escape(r["reason"]) in panel.details.value and f"<b>{r['rule']}</b>" in panel.details.value
    panel.whole.value = True     # the whole IR, not only the lines around the marks
    assert "cv-gap" not in panel.ir.value
    assert len(re.findall(r'<span class="cv-irline', panel.ir.value)) == len(report.output_ir.splitlines())
