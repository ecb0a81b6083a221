"""Every notebook in notebooks/ runs top to bottom in a real kernel (nbclient); the saved widget
state and the outputs are checked against what the cells should have produced."""
from __future__ import annotations

import json
import re
from html import escape, unescape
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import cuvil
from cuvil.explain import DEFAULT_PIPELINE

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
VIEW = "application/vnd.jupyter.widget-view+json"
STATE = "application/vnd.jupyter.widget-state+json"
O1 = [p.spec() for p in cuvil.Pipeline.parse("O1")]
DEFAULT = [p.spec() for p in cuvil.Pipeline.parse(DEFAULT_PIPELINE)]   # what a bare %%cuvil runs


def execute(name: str, tmp_path_factory) -> nbformat.NotebookNode:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    cwd = tmp_path_factory.mktemp("nb")    # notebooks must not write next to themselves
    NotebookClient(nb, timeout=300, startup_timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(cwd)}}).execute()
    nb.cwd = cwd                           # what the notebook wrote is there
    return nb


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    return execute("01_quickstart.ipynb", tmp_path_factory)


@pytest.fixture(scope="module")
def pass_pipeline(tmp_path_factory):
    return execute("02_pass_pipeline.ipynb", tmp_path_factory)


@pytest.fixture(scope="module")
def codegen(tmp_path_factory):
    return execute("03_codegen_and_profile.ipynb", tmp_path_factory)


@pytest.fixture(scope="module")
def memory(tmp_path_factory):
    return execute("04_memory_planning.ipynb", tmp_path_factory)


@pytest.fixture(scope="module")
def fusion(tmp_path_factory):
    return execute("05_fusion.ipynb", tmp_path_factory)


@pytest.fixture(scope="module")
def writing_a_pass(tmp_path_factory):
    return execute("06_writing_a_pass.ipynb", tmp_path_factory)


def test_every_notebook_is_tested():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == [
        "01_quickstart.ipynb", "02_pass_pipeline.ipynb", "03_codegen_and_profile.ipynb", "04_memory_planning.ipynb",
        "05_fusion.ipynb", "06_writing_a_pass.ipynb"]


# ----------------------------------------------------------------------------- helpers

def code_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]


def cell_starting(nb, prefix: str):
    (cell,) = [c for c in code_cells(nb) if c.source.startswith(prefix)]
    return cell


def stdout(cell) -> str:
    return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")


def no_errors(nb) -> None:
    errors = [(c.source[:40], o.ename, o.evalue) for c in code_cells(nb) for o in c.outputs
              if o.output_type == "error"]
    assert errors == []


class Widgets:
    """The widget models saved in a notebook's metadata, navigable from a displayed view."""

    def __init__(self, nb):
        self.state = nb.metadata["widgets"][STATE]["state"]

    def tree(self, model_id: str) -> list[dict]:
        """The model and everything under it (children, in order)."""
        model = self.state[model_id]
        out = [model]
        for child in model["state"].get("children", []):
            out += self.tree(child.removeprefix("IPY_MODEL_"))
        return out

    def of_cell(self, cell) -> list[dict]:
        (view,) = [o for o in cell.outputs if o.output_type == "display_data" and VIEW in o.data]
        return self.tree(view.data[VIEW]["model_id"])


def named(models: list[dict], name: str) -> list[dict]:
    return [m["state"] for m in models if m["model_name"] == name]


def pass_list(models: list[dict]) -> list[str]:
    """The pass names in the pipeline panel's list (labels are `3. ● canonicalize  0.4 ms`)."""
    (select,) = [m for m in named(models, "SelectModel") if not m["description"]]
    return [label.split()[2] for label in select["_options_labels"]]


# ----------------------------------------------------------------------------- 01 quickstart

def test_quickstart_runs_and_the_mlp_matches_eager(quickstart):
    no_errors(quickstart)
    out = stdout(cell_starting(quickstart, "with torch.no_grad():\n    expected"))
    assert "result shape: (8, 10)" in out
    err = float(re.search(r"max abs error vs eager: (\S+)", out)[1])
    assert err <= 1e-5
    err5 = float(re.search(r"batch 5, max abs error vs eager: (\S+)", stdout(
        cell_starting(quickstart, "x5 = "))) [1])
    assert err5 <= 1e-5


def test_quickstart_panels_in_the_saved_widget_state(quickstart):
    widgets = Widgets(quickstart)
    models = widgets.of_cell(cell_starting(quickstart, "%%cuvil --dynamic"))
    (tab,) = named(models, "TabModel")
    assert tab["titles"] == ["Pipeline", "Graph", "Fusion", "Code", "Memory", "Profile", "Summary"]
    assert pass_list(models) == DEFAULT
    summary = [h["value"] for h in named(models, "HTMLModel") if "cv-summary" in h["value"]]
    assert len(summary) == 1 and "max abs error vs eager PyTorch" in summary[0]


def test_quickstart_stepping_reached_canonicalize(quickstart):
    widgets = Widgets(quickstart)
    block = cell_starting(quickstart, "%%cuvil\ndef block")
    models = widgets.of_cell(block)
    # the next cell clicked "next" up to canonicalize: the saved diff is its, with `x * 1.0` removed
    html = [h["value"] for h in named(models, "HTMLModel")]
    k = 1 + next(i for i, spec in enumerate(DEFAULT) if spec.startswith("canonicalize"))
    (position,) = [v for v in html if v.startswith(f"<b>{k} / {len(DEFAULT)}</b>")]
    assert "canonicalize" in position
    (diff,) = [v for v in html if 'class="cv-diff"' in v]
    removed = re.findall(r'<td class="cv-code cv-del">(.*?)</td>', diff)
    assert any("cuvil.mul" in r for r in removed)
    assert f"{k} / {len(DEFAULT)}</b>: canonicalize" in stdout(cell_starting(quickstart, 'pipeline = _cuvil_explorer'))


def test_quickstart_static_report(quickstart):
    out = stdout(cell_starting(quickstart, "import pathlib, tempfile"))
    path = Path(out.split()[0])
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "Cuvil report: block" in page


def test_quickstart_error_panel_shows_the_users_line(quickstart):
    cell = cell_starting(quickstart, "%%cuvil\ndef bessel")
    (html,) = [o.data["text/html"] for o in cell.outputs if o.output_type == "display_data"]
    assert "unsupported op" in html and "cell line 3" in html
    assert "return torch.special.i0(x)" in html and "Traceback" not in html


# ----------------------------------------------------------------------------- 02 pass pipeline

def test_pass_pipeline_stepping_output(pass_pipeline):
    no_errors(pass_pipeline)
    lines = stdout(cell_starting(pass_pipeline, 'pipeline = _cuvil_explorer')).splitlines()
    assert [line.split()[1] for line in lines] == DEFAULT
    changed = {line.split()[1].split("{")[0]: line.split()[2] for line in lines}   # by pass name
    assert changed["verify"] == "changed=False" and changed["canonicalize"] == "changed=True"


def test_pass_pipeline_custom_pipeline(pass_pipeline):
    widgets = Widgets(pass_pipeline)
    models = widgets.of_cell(cell_starting(pass_pipeline, "%%cuvil --passes canonicalize"))
    assert pass_list(models) == ["canonicalize", "cse{aggressive=true}", "dce"]
    (tab,) = named(models, "TabModel")
    assert tab["titles"] == ["Pipeline", "Summary"]


USER_PIPELINE = ["verify", "shape-infer", "canonicalize", "cse", "add-self-to-mul", "dce", "fuse"]


def test_writing_a_pass_function_pass(writing_a_pass):
    no_errors(writing_a_pass)      # the option error of the last %%cuvil is a panel, not a Python error
    widgets = Widgets(writing_a_pass)
    models = widgets.of_cell(cell_starting(writing_a_pass, "%%cuvil --passes verify,shape-infer,canonicalize,cse,add"))
    assert pass_list(models) == USER_PIPELINE
    (select,) = [m for m in named(models, "SelectModel") if not m["description"]]
    assert select["_options_labels"][USER_PIPELINE.index("add-self-to-mul")].split()[1] == "●"   # it changed the IR
    out = stdout(cell_starting(writing_a_pass, "record = "))
    assert "add-self-to-mul changed: True {'rewritten': 1}" in out
    assert float(re.search(r"max abs error vs eager: (\S+)", out)[1]) <= 1e-6
    ir = out[out.index("cuvil.func"):]
    # x + x became x * 2.0: a mul by a 2.0 literal, and no add of a value to itself
    assert re.search(r"cuvil\.literal \{value = 2\.0, dtype = f32\}", ir) and "cuvil.mul" in ir
    assert not re.search(r"cuvil\.add (%\w+), \1 ", ir)


def test_writing_a_pass_dataclass_pass_and_option_error(writing_a_pass):
    widgets = Widgets(writing_a_pass)
    models = widgets.of_cell(cell_starting(writing_a_pass, "%%cuvil --passes O1,count-ops{op="))
    assert pass_list(models) == O1 + ["count-ops{op=cuvil.relu}"]
    out = stdout(cell_starting(writing_a_pass, "counted = "))
    assert "count-ops{op=cuvil.relu} changed: False {'count': 1}" in out     # one relu left after CSE
    assert "unknown option 'opp' for pass 'count-ops' (did you mean 'op'?" in stdout(
        cell_starting(writing_a_pass, "print(_cuvil_error"))


def test_notebooks_are_saved_without_outputs():
    for path in NOTEBOOKS.glob("*.ipynb"):
        nb = json.loads(path.read_text())
        assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code"), path.name
        assert nb["metadata"]["kernelspec"]["name"] == "python3", path.name


# ----------------------------------------------------------------------------- 03 codegen and profile

def described(models: list[dict], kind: str, description: str) -> dict:
    (model,) = [m for m in named(models, kind) if m["description"] == description]
    return model


def test_codegen_code_panel_marks_the_kernels_of_the_source_line(codegen):
    no_errors(codegen)
    report = json.loads((codegen.cwd / "cnn-report.json").read_text())
    models = Widgets(codegen).of_cell(cell_starting(codegen, "%%cuvil"))
    (tab,) = named(models, "TabModel")
    assert tab["titles"] == ["Pipeline", "Graph", "Fusion", "Code", "Memory", "Profile", "Summary"]
    (line,) = [s for s in report["sources"] if "self.depthwise" in s["text"]]
    # the kernels that hold an op carrying the line's location, from the report itself
    expected = [k["name"] for k in report["kernels"] if {op["id"] for op in k["ops"]} & set(line["ops"])]
    kernels = described(models, "SelectModel", "kernel")
    marked = [kernels["_options_labels"][i].split()[2] for i, label in enumerate(kernels["_options_labels"])
              if label.startswith("◆")]
    assert marked == expected and len(expected) >= 2
    sources = described(models, "SelectModel", "source")
    assert sources["_options_labels"][sources["index"]].endswith("x = self.depthwise(self.block(x))")
    printed = re.findall(r"  kernel (\S+):", stdout(cell_starting(codegen, 'code = _cuvil_explorer.select("code")')))
    assert printed == expected
    # the notebook switched the view to side by side: the three codes of the first marked kernel
    (view,) = [m for m in named(models, "ToggleButtonsModel") if "Side by side" in m["_options_labels"]]
    assert view["_options_labels"][view["index"]] == "Side by side"
    (side,) = [h["value"] for h in named(models, "HTMLModel") if 'class="cv-side"' in h["value"]]
    assert side.count("cv-codeblock") == 3 and f"kernel @{expected[0]}(" in side


def test_codegen_profile_panel_and_chrome_trace(codegen):
    report = json.loads((codegen.cwd / "cnn-report.json").read_text())
    models = Widgets(codegen).of_cell(cell_starting(codegen, "%%cuvil"))
    # the notebook switched the flame chart to the compile phases: a frame per phase and per pass
    (flame,) = [h["value"] for h in named(models, "HTMLModel") if "<svg class=\"cv-flamesvg\"" in h["value"]]
    frames = re.findall(r'<g class="cv-fl" data-s="\d+" data-e="\d+" data-n="([^"]*)"', flame)
    assert frames[0] == "compile" and {"import", "passes", "native code"} <= set(frames)
    assert [p["spec"] for p in report["passes"]] == [f for f in frames if f in {p["spec"] for p in report["passes"]}]
    trace = json.loads((codegen.cwd / "cnn.trace.json").read_text())
    runs = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "run"]
    assert len(runs) == len(report["profile"]["run"])
    steps = {st["step"]: st["kernel"] for st in report["schedule"]}
    assert sorted(e["name"] for e in runs) == sorted(steps[r["step"]] for r in report["profile"]["run"])
    assert f"{len(trace['traceEvents'])} events, {len(runs)} kernel calls" in stdout(
        cell_starting(codegen, "profs = profiler.profiles"))
    speedscope = json.loads((codegen.cwd / "cnn.speedscope.json").read_text())
    assert {f["name"] for f in speedscope["shared"]["frames"]} >= set(steps.values())
    err = float(re.search(r"batch 5: max abs error vs eager (\S+)", stdout(cell_starting(codegen, "x5 = ")))[1])
    assert err <= 1e-5


# ----------------------------------------------------------------------------- 04 memory planning

def test_memory_chain_plan_is_ping_pong(memory):
    no_errors(memory)
    out = stdout(cell_starting(memory, 'mem = _cuvil_report.memory\nfor b'))
    # hand-checked: five 8x256 f32 intermediates (8 KiB each), each read only by the next layer: two regions
    assert "arena 16384 naive 40960 peak live 16384" in out
    assert re.findall(r"takes over (%\d+)", out) == ["%3", "%7", "%11"]
    sizes = stdout(cell_starting(memory, "arena, naive = sympy"))
    assert "batch 64: arena  131072 bytes, naive  327680 bytes" in sizes


def test_memory_panel_state(memory):
    models = Widgets(memory).of_cell(cell_starting(memory, "%%cuvil --dynamic '[{0"))
    assert described(models, "DropdownModel", "buffer")["_options_labels"][0] == "(none)"
    buffer = described(models, "DropdownModel", "buffer")
    assert buffer["_options_labels"][buffer["index"]].startswith("%11 ")
    step = described(models, "DropdownModel", "step")
    assert step["_options_labels"][step["index"]].startswith("2 · ")
    html = [h["value"] for h in named(models, "HTMLModel")]
    (timeline,) = [v for v in html if "cv-timeline" in v]
    (packing,) = [v for v in html if "cv-packing" in v]
    for svg in (timeline, packing):
        assert svg.count('<g class="cv-buf') == 5 and svg.count("cv-stepon") == 1
        assert re.findall(r'<g class="cv-buf cv-on" data-name="([^"]+)"', svg) == ["%11"]
    (details,) = [v for v in html if "Buffer %11" in v]
    assert "steps 2 to 3" in details and "Step 2" in details
    (summary,) = [v for v in html if "peak live bytes" in v]
    assert "16.0 KiB" in summary and "40.0 KiB" in summary and "60% less" in summary


def test_memory_transformer_block(memory):
    models = Widgets(memory).of_cell(cell_starting(memory, "%%cuvil --dynamic block"))
    (tab,) = named(models, "TabModel")
    assert "Memory" in tab["titles"]
    out = stdout(cell_starting(memory, 'mem = _cuvil_report.memory\nprint(len'))
    n, regions = map(int, re.search(r"(\d+) buffers in (\d+) regions", out).groups())
    arena, naive, peak = map(int, re.search(r"(\d+) bytes, naive (\d+) bytes, peak live (\d+)", out).groups())
    assert regions < n and peak <= arena < naive


# ----------------------------------------------------------------------------- 05 fusion

FUSION_CELL = "%%cuvil --dynamic '[{0: \"batch\"}]' --passes O1\n"
CAPPED_CELL = "%%cuvil --dynamic '[{0: \"batch\"}]' --passes 'verify"


def ir_line(report: dict, name: str) -> str:
    """The output-IR line defining `name`, without its location."""
    (line,) = [ln for ln in report["output_ir"].splitlines()
               if " = " in ln and name in ln.strip().split(" = ", 1)[0].split(", ")]
    return re.sub(r' loc\(.*\)$', "", line)


def ir_marks(html_value: str, cls: str) -> list[str]:
    return [unescape(t) for t in re.findall(rf'<span class="cv-irline {cls}"[^>]*>(.*?)</span>', html_value)]


def fusion_panel(nb, prefix: str) -> list[dict]:
    """The widget models of the Fusion tab of the explorer a cell showed."""
    widgets = Widgets(nb)
    (tab,) = named(widgets.of_cell(cell_starting(nb, prefix)), "TabModel")
    assert tab["titles"] == ["Pipeline", "Graph", "Fusion", "Code", "Memory", "Profile", "Summary"]
    return widgets.tree(tab["children"][tab["titles"].index("Fusion")].removeprefix("IPY_MODEL_"))


def test_fusion_groups_of_the_block(fusion):
    no_errors(fusion)
    report = json.loads((fusion.cwd / "fusion-O1.json").read_text())
    groups = report["fusion"]["groups"]
    by_op = {}
    for g in groups:
        for name in g["values"]:
            by_op[re.search(r"= (cuvil\.\w+)", ir_line(report, name))[1], name] = g
    ops = {op for op, _ in by_op}
    assert {"cuvil.linear", "cuvil.relu", "cuvil.add", "cuvil.layer_norm", "cuvil.mean", "cuvil.softmax"} <= ops
    # hand-checked: fc1's bias and ReLU are its GEMM's epilogue; the residual add is fc2's; the norms and the
    # softmax are one reduction group
    relu = next(g for (op, _), g in by_op.items() if op == "cuvil.relu")
    assert relu["kind"] == "gemm-epilogue" and relu["summary"] == "linear + relu"
    softmax = next(g for (op, _), g in by_op.items() if op == "cuvil.softmax")
    assert softmax["kind"] == "reduction" and {"layer_norm", "mean", "rsqrt", "softmax"} <= set(
        softmax["summary"].split(" + "))
    out = stdout(cell_starting(fusion, "fused = _cuvil_report"))
    assert [line.split()[0] for line in out.splitlines() if line.startswith("g")] == [g["name"] for g in groups]
    assert out.count("refused ") == len(report["fusion"]["refused"]) >= 1


def test_fusion_panel_state_shows_the_largest_group_and_its_kernel(fusion):
    report = json.loads((fusion.cwd / "fusion-O1.json").read_text())
    groups, refused = report["fusion"]["groups"], report["fusion"]["refused"]
    models = fusion_panel(fusion, FUSION_CELL)
    group_list = described(models, "SelectModel", "groups")
    assert len(group_list["_options_labels"]) == len(groups)
    big = max(range(len(groups)), key=lambda i: groups[i]["size"])
    assert group_list["index"] == big and groups[big]["summary"] in group_list["_options_labels"][big]
    # the rule filter the notebook set: only the refusals of the first refusal's rule are listed
    rule = described(models, "DropdownModel", "rule")
    assert rule["_options_labels"][rule["index"]].startswith(refused[0]["rule"] + " (")
    refused_list = described(models, "SelectModel", "refused")
    assert len(refused_list["_options_labels"]) == sum(r["rule"] == refused[0]["rule"] for r in refused)
    assert refused_list["index"] is None
    (kernel,) = [k for k in report["kernels"] if k["name"] == groups[big]["kernel"]]
    html_values = [h["value"] for h in named(models, "HTMLModel")]
    (code,) = [v for v in html_values if "cv-codeblock" in v]
    assert escape(kernel["kernel_ir"].splitlines()[0]) in code
    (ir,) = [v for v in html_values if "cv-fuseir" in v]
    assert ir_marks(ir, "cv-hit") == [ir_line(report, v) for v in groups[big]["values"]]
    out = stdout(cell_starting(fusion, "biggest = "))
    assert out.splitlines() == [f"selected {groups[big]['name']} -> kernel {kernel['name']}",
                                kernel["kernel_ir"].splitlines()[0]]


def test_fusion_max_ops_option(fusion):
    fused = json.loads((fusion.cwd / "fusion-O1.json").read_text())
    capped = json.loads((fusion.cwd / "fusion-max-ops-4.json").read_text())
    assert capped["pipeline"] == "verify,shape-infer,canonicalize,cse,dce,fuse{max-ops=4}"
    assert max(g["size"] for g in fused["fusion"]["groups"]) > 4 >= max(g["size"] for g in capped["fusion"]["groups"])
    assert len(capped["kernels"]) > len(fused["kernels"])
    cut = [r for r in capped["fusion"]["refused"] if r["rule"] == "max-ops"]
    assert cut and all("max-ops=4" in r["reason"] for r in cut)
    models = fusion_panel(fusion, CAPPED_CELL)
    refused_list = described(models, "SelectModel", "refused")
    assert refused_list["_options_labels"] == [f"max-ops: {r['candidate']} {r['candidate_name'].removeprefix('cuvil.')}"
                                               f" → {r['consumer']}" for r in cut]
    out = stdout(cell_starting(fusion, "capped = _cuvil_report"))
    assert float(re.search(r"max abs error vs eager: (\S+)", out)[1]) <= 1e-5
    assert f"max-ops=4  {len(capped['kernels'])} kernels, largest group" in out
