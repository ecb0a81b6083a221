"""The benchmark harness's logic: statistics, case selection, n/a handling, the report.

No timing is asserted anywhere: runs use --quick settings and check structure and correctness only.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from benchmarks import engines
from benchmarks.models import EltwiseChain
from benchmarks.report import crowded, fmt_ms, render_markdown, unavailable_cells, write_results
from benchmarks.run import ENGINE_NAMES, Settings, main, parse_settings, run_suite
from benchmarks.stats import max_abs_error, speedup, summarize
from benchmarks.suite import select
from benchmarks.worker import Worker, WorkerError, describe_error, dispatch


def test_summarize_median_min_p90_in_ms():
    got = summarize([1_000_000, 2_000_000, 3_000_000, 4_000_000, 10_000_000])
    assert got == {"median_ms": 3.0, "min_ms": 1.0, "p90_ms": pytest.approx(7.6), "calls": 5}
    assert speedup(2.0, 0.5) == 4.0


def test_max_abs_error_against_reference():
    ref = [np.array([1.0, 2.0], np.float32), np.array([[0.0]], np.float32)]
    assert max_abs_error(ref, [np.array([1.0, 2.5], np.float32), np.array([[-0.25]], np.float32)]) == 0.5
    assert max_abs_error(ref, [np.array([1.0, np.nan], np.float32), ref[1]]) == float("inf")
    nan_ref = [np.array([np.nan, 1.0])]
    assert max_abs_error(nan_ref, [np.array([np.nan, 1.0])]) == 0.0
    with pytest.raises(ValueError, match=r"output 1 has shape \(1,\), eager's has \(1, 1\)"):
        max_abs_error(ref, [ref[0], np.zeros(1, np.float32)])
    with pytest.raises(ValueError, match="1 output\\(s\\), eager gives 2"):
        max_abs_error(ref, ref[:1])


def test_number_formats_and_crowded_rows():
    assert [fmt_ms(x) for x in (0.0123, 0.456, 4.567, 184.3)] == ["12.3 µs", "0.456 ms", "4.57 ms", "184 ms"]
    assert crowded({"other_load_cores": 1.2}, threads=2, cores=2)
    assert not crowded({"other_load_cores": 0.2}, threads=2, cores=2)
    assert not crowded({"other_load_cores": 1.0}, threads=1, cores=2)
    assert not crowded({"other_load_cores": None}, threads=2, cores=2)


def test_describe_error_keeps_type_and_first_line():
    assert describe_error(ValueError("boom\ndetails")) == "ValueError: boom"
    assert describe_error(KeyError()) == "KeyError"
    assert len(describe_error(RuntimeError("x" * 500))) == 200


def test_select_by_case_or_model_name_in_suite_order():
    assert [c.name for c in select(["mlp"])] == ["mlp_b1", "mlp_b64"]
    assert [c.name for c in select(["eltwise_4k", "cnn_b16"])] == ["cnn_b16", "eltwise_4k"]
    with pytest.raises(ValueError, match="unknown model\\(s\\) nope; cases: mlp_b1"):
        select(["nope", "mlp"])


def test_eltwise_chain_is_twenty_finite_ops():
    graph = torch.fx.symbolic_trace(EltwiseChain()).graph
    assert sum(n.op in ("call_function", "call_method") for n in graph.nodes) == 20
    x = torch.linspace(-50, 50, 1001)
    assert torch.isfinite(EltwiseChain()(x)).all()


def test_engine_names_match_the_adapters():
    assert set(ENGINE_NAMES) == set(engines.ENGINES)


def test_parse_settings_validates_and_always_adds_eager(tmp_path):
    settings, out = parse_settings(["--quick", "--models", "mlp", "--engines", "ort,inductor",
                                    "--threads", "2,1", "--out", str(tmp_path)])
    assert settings.engines == ["eager", "ort", "inductor"]
    assert settings.threads == [1, 2] and settings.cases == ["mlp_b1", "mlp_b64"] and out == tmp_path
    assert settings.rounds < Settings([], [], []).rounds
    for bad in (["--engines", "tvm"], ["--threads", "two"], ["--threads", "0"], ["--models", "resnet9"]):
        with pytest.raises(SystemExit):
            parse_settings(bad)


# --------------------------------------------------------------------------- a whole run, in-process

class Shifted(engines.Eager):
    """Fast but wrong: eager's output plus 0.5."""
    name = "shifted"

    def build(self, model, inputs, dynamic):
        return (lambda: model(*inputs) + 0.5), {}


class BreaksOnBuild(engines.Eager):
    name = "breaks"

    def build(self, model, inputs, dynamic):
        raise ValueError("boom\nmore detail")


class CannotStart(engines.Eager):
    name = "unstartable"

    def start(self):
        raise RuntimeError("no such runtime")


class InProcessWorker:
    """The worker protocol without a process, so tests can plug in engines defined here."""

    def __init__(self, engine, threads, workdir):
        self.worker, self.pid, self.alive = Worker(engine, threads, workdir), os.getpid(), True

    def call(self, method, *args):
        status, value = dispatch(self.worker, method, args)
        if status == "error":
            raise WorkerError(value)
        return value

    def close(self):
        self.alive = False


@pytest.fixture
def quick_results(tmp_path, monkeypatch):
    for engine in (Shifted, BreaksOnBuild, CannotStart):
        monkeypatch.setitem(engines.ENGINES, engine.name, engine)
    settings = Settings.for_run(["eltwise_4k"], ["eager", "shifted", "breaks", "unstartable"], [1], quick=True,
                                serve_case="eltwise_4k")
    return run_suite(settings, tmp_path, start_worker=InProcessWorker, log=lambda line: None)


def test_run_reports_ratios_errors_and_unavailable_engines(quick_results):
    row = quick_results["cases"][0]["threads"]["1"]
    assert row["rounds"] == 2 and 0 <= row["quiet_rounds"] <= 2 and row["waited_for_quiet_s"] == 0
    cells = row["engines"]
    eager, shifted = cells["eager"], cells["shifted"]
    assert eager["speedup"] == 1.0 and "max_abs_err" not in eager
    assert eager["calls"] >= 2 * 2 and 0 < eager["min_ms"] <= eager["median_ms"] <= eager["p90_ms"]
    assert shifted["max_abs_err"] == pytest.approx(0.5, abs=1e-6)
    assert shifted["speedup"] == pytest.approx(eager["median_ms"] / shifted["median_ms"])
    assert cells["breaks"] == {"status": "n/a", "reason": "ValueError: boom"}
    assert cells["unstartable"] == {"status": "n/a", "reason": "RuntimeError: no such runtime"}
    assert quick_results["engines"]["unstartable"]["1"]["status"] == "n/a"
    assert sorted(e for *_, e, _ in unavailable_cells(quick_results)) == ["breaks", "unstartable"]


def test_serving_check_counts_calls_and_compares_bits(quick_results):
    serving = quick_results["serving"]["engines"]
    for engine in ("eager", "shifted"):
        assert serving[engine]["mismatched"] == 0 and serving[engine]["calls_checked"] > 0
        assert serving[engine]["calls_per_s_1"] > 0 and serving[engine]["calls_per_s_2"] > 0
        [rep] = serving[engine]["reps"]      # quick: one rep, with the other load measured during it
        assert rep["scaling"] == pytest.approx(rep["calls_per_s_2"] / rep["calls_per_s_1"])
        assert rep["other_load_cores"] >= 0 and serving[engine]["quietest"] == rep


def test_markdown_and_json_report(quick_results, tmp_path):
    json_path, md_path = write_results(quick_results, tmp_path / "out", "quick")
    assert json.loads(json_path.read_text())["cases"][0]["case"] == "eltwise_4k"
    md = md_path.read_text()
    assert md == render_markdown(quick_results)
    row = next(line for line in md.splitlines() if line.startswith("| eltwise_4k | 1.00× · "))
    assert "shifted 5.0e-01" in row and row.count("n/a [") == 2
    assert "1. n/a (ValueError: boom)" in md and "2. n/a (RuntimeError: no such runtime)" in md
    assert "| shifted |" in md and "yes (" in md


def test_command_line_run_in_worker_processes(tmp_path, capsys):
    assert main(["--quick", "--models", "eltwise_4k", "--engines", "eager", "--threads", "1",
                 "--serve-quiet-wait", "0.5", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "quick.json").read_text())
    assert results["settings"]["serve_quiet_wait_s"] == 0.5
    cell = results["cases"][0]["threads"]["1"]["engines"]["eager"]
    assert cell["status"] == "ok" and cell["speedup"] == 1.0
    assert results["engines"]["eager"]["1"]["torch_threads"] == 1     # the worker's own thread setting
    assert results["serving"] is None and "Not run" in (tmp_path / "quick.md").read_text()


def test_compile_time_measures_saved_and_cached_models_that_compute_the_same(tmp_path):
    # as `make bench` runs it: each stage in a fresh process, the cache in a folder of its own
    from benchmarks.compile_time import main
    (row,) = main(["--out", str(tmp_path), "eltwise_4k"])
    assert row["same_outputs"] is True          # the loaded model's outputs equal the compiled model's, bit for bit
    assert row["saved_bytes"] > 0 and row["cold_s"] > 0 and row["load_s"] > 0
    assert row["model_cache_hit"] is True, (f"the cold compile's model cache store: {row['model_cache_store']}; "
                                            f"entries after it {row['model_cache_entries_cold']}, after the second "
                                            f"compile {row['model_cache_entries']}")
    assert row["model_cache_same_outputs"] is True
    assert row["cache_import_s"] > 0            # cache="objects" ran torch.export


def test_gemm_efficiency_measures_again_when_the_machine_changes_speed():
    from benchmarks.gemm_efficiency import bracketed
    peaks = iter([100.0, 60.0, 90.0, 95.0])            # first try: the speed fell mid-case
    calls = []

    def measure():
        calls.append(1)
        return 80.0 + len(calls), 10.0
    assert bracketed(measure, peak=lambda: next(peaks)) == (82.0, 10.0, 90.0, 95.0, True)
    unsteady = iter([100.0, 50.0] * 3)
    assert bracketed(lambda: (70.0, 5.0), peak=lambda: next(unsteady)) == (70.0, 5.0, 100.0, 50.0, False)


def test_floors_count_the_products_and_set_them_against_eager():
    from benchmarks.gemm_efficiency import floors, product_flops
    mlp_b64 = 2 * 64 * (512 * 1024 + 1024 * 1024 + 1024 * 10)     # MLP 512-1024-1024-10, by hand
    convnext_dw = 2 * 96 * 56 * 56 * 7 * 7                          # its 7x7 depthwise convolution
    convnext_mlp = 2 * 2 * 56 * 56 * 96 * 384                       # its two linears, 96 -> 384 -> 96
    assert product_flops("mlp_b64") == mlp_b64
    assert product_flops("convnext_b1") == convnext_dw + convnext_mlp
    latest = {"cases": [{"case": "mlp_b64", "threads": {"1": {"engines": {"eager": {"median_ms": 5.0}}}}}]}
    mlp, cnx = floors(100.0, latest, cases=("mlp_b64", "convnext_b1"))
    floor_ms = mlp_b64 / 100e9 * 1e3
    assert mlp == {"case": "mlp_b64", "product_mflop": round(mlp_b64 / 1e6, 1), "floor_ms": round(floor_ms, 3),
                   "eager_ms": 5.0, "floor_vs_eager": round(floor_ms / 5.0, 3)}
    assert "floor_vs_eager" not in cnx          # no eager time for it in those results


def test_cuvil_cells_carry_the_compile_phases(tmp_path, monkeypatch):
    """Cuvil's cold compile in a suite run keeps its breakdown: the phases in the JSON (each timed
    inside the compile, so together at most its time) and, in the Markdown table, torch.export,
    the IR and LLVM in brackets."""
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))     # cold: nothing compiled before
    settings = Settings.for_run(["eltwise_4k"], ["eager", "cuvil"], [1], quick=True, serve_case="eltwise_4k")
    results = run_suite(settings, tmp_path, start_worker=InProcessWorker, log=lambda line: None)
    cell = results["cases"][0]["threads"]["1"]["engines"]["cuvil"]
    phases = cell["parts"]["phases"]
    assert phases["import"] > 0 and phases["llvm_ir"] > 0 and phases["optimize"] > 0
    assert sum(phases.values()) <= cell["compile_s"]
    rows = [line for line in render_markdown(results).splitlines() if line.startswith("| eltwise_4k |")]
    compile_row = rows[-1]
    assert compile_row.endswith(") |") and "(export " in compile_row and ", IR " in compile_row \
        and ", LLVM " in compile_row
