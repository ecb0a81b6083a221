"""The results as JSON (everything) and Markdown (the tables for the README)."""
from __future__ import annotations

import json
import math
from pathlib import Path


def fmt_ms(ms: float) -> str:
    if ms < 0.1:
        return f"{ms * 1000:.1f} µs"
    return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.3g} ms" if ms >= 1 else f"{ms:.3f} ms"


def fmt_err(err: float) -> str:
    return "0" if err == 0 else "inf" if math.isinf(err) else f"{err:.1e}"


def fmt_s(s: float) -> str:
    return f"{s:.3f}" if s < 1 else f"{s:.2f}" if s < 10 else f"{s:.1f}"


class Notes:
    """Numbered footnotes, one per distinct reason."""

    def __init__(self):
        self.reasons: list[str] = []

    def ref(self, reason: str) -> str:
        if reason not in self.reasons:
            self.reasons.append(reason)
        return f"[{self.reasons.index(reason) + 1}]"

    def na(self, cell: dict) -> str:
        return f"n/a {self.ref(cell['reason'])}"

    def lines(self) -> list[str]:
        return [f"{i}. n/a ({reason})" for i, reason in enumerate(self.reasons, 1)]


def unavailable_cells(results: dict) -> list[tuple[str, str, str, str]]:
    """(case, threads, engine, reason) for every latency cell that is n/a."""
    return [(row["case"], t, engine, cell["reason"])
            for row in results["cases"] for t, per in row["threads"].items()
            for engine, cell in per["engines"].items() if cell["status"] != "ok"]


def _columns(results: dict) -> list[tuple[str, str]]:
    s = results["settings"]
    return [(engine, str(t)) for engine in s["engines"] for t in s["threads"]]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def _cell(row: dict, engine: str, t: str) -> dict:
    return row["threads"][t]["engines"][engine]


def _latency(cell: dict, notes: Notes) -> str:
    if cell["status"] != "ok":
        return notes.na(cell)
    ms = fmt_ms(cell["median_ms"])
    return f"{cell['speedup']:.2f}× · {ms}" if "speedup" in cell else ms


def _errors(row: dict, engines: list[str], notes: Notes) -> str:
    parts = []
    for engine in engines:
        cells = [per["engines"][engine] for per in row["threads"].values()]
        mismatch = next((c["output_mismatch"] for c in cells if "output_mismatch" in c), None)
        errs = [c["max_abs_err"] for c in cells if "max_abs_err" in c]
        if mismatch:
            parts.append(f"{engine} wrong outputs {notes.ref(mismatch)}")
        elif errs:
            parts.append(f"{engine} {fmt_err(max(errs))}")
        else:
            parts.append(f"{engine} n/a")
    return " · ".join(parts)


def _compile(cell: dict, notes: Notes) -> str:
    if cell["status"] != "ok":
        return notes.na(cell)
    parts = cell["parts"]
    if "export_s" in parts:
        return f"{fmt_s(cell['compile_s'])} (export {fmt_s(parts['export_s'])})"
    if "phases" in parts:     # Cuvil's: torch.export and the frontend; lowering and LLVM IR; LLVM
        ph = parts["phases"]
        share = {"export": ("import",), "IR": ("lowering", "llvm_ir"), "LLVM": ("optimize", "codegen", "workers")}
        return fmt_s(cell["compile_s"]) + " (" + ", ".join(
            f"{name} {fmt_s(sum(ph.get(k, 0.0) for k in keys))}" for name, keys in share.items()) + ")"
    return fmt_s(cell["compile_s"])


def _serving(results: dict, notes: Notes) -> list[str]:
    serving = results["serving"]
    if serving is None:
        return [f"Not run: it needs the case {results['settings']['serve_case']} at 1 thread."]
    cores = results["machine"]["cores"] or 1
    rows, crowded_reps = [], False
    for engine, r in serving["engines"].items():
        if r["status"] != "ok":
            rows.append([engine, notes.na(r), "", "", "", ""])
            continue
        same = (f"yes ({r['calls_checked']} calls)" if r["mismatched"] == 0
                else f"NO: {r['mismatched']} of {r['calls_checked']} calls differ")
        reps = []
        for rep in r.get("reps", []):
            busy = rep["other_load_cores"] is not None and cores - rep["other_load_cores"] < 1.5
            crowded_reps |= busy
            reps.append(f"{rep['scaling']:.2f}× ({_fmt_cores(rep['other_load_cores'])}{' ‡' if busy else ''})")
        rows.append([engine, f"{r['calls_per_s_1']:.0f}", f"{r['calls_per_s_2']:.0f}", f"{r['scaling']:.2f}×",
                     ", ".join(reps), same])
    load = serving["other_load_cores"]
    avg = serving.get("load_average") or {}
    s = results["settings"]
    return [f"Case {serving['case']}, each engine compiled for 1 thread; N Python threads call one compiled "
            f"model in a loop for {s['serve_s']} s. Each rep runs 1 then 2 threads, after waiting up to "
            f"{s.get('serve_quiet_wait_s', 0)} s for other processes to use < {s['quiet_cores']} cores; scaling = "
            f"calls/s with 2 threads / with 1 (ideal 2.0 on 2 free cores), median of {s['serve_reps']} reps, then "
            f"each rep with the cores other processes used during it. Every output is compared with a "
            f"single-threaded reference."
            + (f" Other processes used {load:.2f} cores over the whole check" if load is not None else "")
            + (f"; load average {_fmt_load(avg.get('start'))} at the start, {_fmt_load(avg.get('end'))} at the end."
               if avg else ".")
            + (" ‡: that rep had less than 1.5 free cores, so it measures the other load, not the engine."
               if crowded_reps else ""), ""] + _table(
        ["engine", "calls/s, 1 thread", "calls/s, 2 threads", "scaling (median)", "scaling per rep (other load)",
         "outputs bit-identical"], rows)


def _fmt_cores(cores: float | None) -> str:
    return "load unknown" if cores is None else f"other load {cores:.2f} cores"


def _fmt_load(load_average: list[float] | None) -> str:
    return " / ".join(f"{x:.2f}" for x in load_average) if load_average else "unknown"


def _header(results: dict) -> list[str]:
    m, s, load = results["machine"], results["settings"], results["load_average"]
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v)
    cases = "; ".join(f"{row['case']} = {row['description']}" for row in results["cases"])
    return [
        f"# Cuvil benchmarks{' (quick run: few repetitions, not for quoting)' if s['quick'] else ''}",
        "",
        f"Measured {results['started']}, {results['wall_s'] / 60:.1f} min wall. CPU: {m['cpu_model']} "
        f"({m['cores']} cores; {', '.join(m['simd'])}), {m['memory_gib']} GiB; Python {m['python']}; {versions}.",
        "",
        f"Load average (1 / 5 / 15 min) at start {_fmt_load(load['start'])}, at end {_fmt_load(load.get('end'))}; "
        f"the machine is shared, so compare the ratios (taken together) more than the absolute times.",
        "",
        f"Method: each engine at each thread count runs in its own worker process. Per row, every engine "
        f"compiles cold, warms up ({s['warmup_s']} s, at least {s['min_calls']} calls), then {s['rounds']} rounds "
        f"give every engine a {s['block_s']} s timing block (at least {s['min_calls']} calls; order rotated). "
        f"Before each round the parent waits (at most {s['quiet_wait_s']} s, {s['quiet_budget_s']} s per row) "
        f"for other processes to use under {s['quiet_cores']} cores. "
        f"torch.inference_mode, float32, random weights, eval mode. Cases: {cases}.",
    ]


def crowded(per_threads: dict, threads: int, cores: int) -> bool:
    """Other processes left fewer free cores than the run has threads (with half a core of slack)."""
    load = per_threads["other_load_cores"]
    return load is not None and cores - load < threads - 0.5


def render_markdown(results: dict) -> str:
    notes = Notes()
    engines = results["settings"]["engines"]
    columns = _columns(results)
    names = [f"{e} {t}t" for e, t in columns]
    rows = results["cases"]
    threads = [str(t) for t in results["settings"]["threads"]]

    cores = results["machine"]["cores_usable"] or results["machine"]["cores"]

    def load(row):
        per = [row["threads"][t] for t in threads]
        return " / ".join("?" if p["other_load_cores"] is None
                          else f"{p['other_load_cores']:.2f} ({p['quiet_rounds']}/{p['rounds']} quiet)" for p in per)

    def latency_cell(row, engine, t):
        text = _latency(_cell(row, engine, t), notes)
        return text + " ‡" if crowded(row["threads"][t], int(t), cores) else text

    latency = _table(["model"] + names + ["max abs err vs eager", f"other load ({' / '.join(threads)}t)"],
                     [[r["case"]] + [latency_cell(r, e, t) for e, t in columns]
                      + [_errors(r, [e for e in engines if e != "eager"], notes), load(r)] for r in rows])

    def spread(cell):
        if cell["status"] != "ok":
            return notes.na(cell)
        return " / ".join(f"{cell[k]:.3g}" for k in ("min_ms", "median_ms", "p90_ms"))

    spreads = _table(["model"] + names, [[r["case"]] + [spread(_cell(r, e, t)) for e, t in columns] for r in rows])
    compiles = _table(["model"] + names, [[r["case"]] + [_compile(_cell(r, e, t), notes) for e, t in columns]
                                          for r in rows])
    startups = [f"{e} {t}t {fmt_s(info['startup_s'])} s" for e, per in results.get("engines", {}).items()
                for t, info in per.items() if info["status"] == "ok" and info["startup_s"] >= 0.5]
    exporters = sorted({c["parts"]["exporter"] for r in rows for per in r["threads"].values()
                        for c in per["engines"].values() if c["status"] == "ok" and "exporter" in c["parts"]})

    lines = _header(results) + [
        "", "## Latency", "",
        "Each cell: speedup = eager median / engine median at the same thread count (> 1: faster than eager), "
        "then the engine's median latency. Max abs err: the largest difference of any output element from "
        "eager's (over the thread counts). Other load: cores used by other processes while the row was timed "
        "(mean over the rounds; quiet = rounds under the threshold). With other load near 1 core or more, "
        "two-thread timings mostly measure scheduler stalls at thread barriers, not the engines. "
        "‡: other processes left fewer free cores than the run had threads (free < threads - 0.5): "
        "not representative of the engine.",
        "", *latency,
        "", "## Latency spread: min / median / p90 (ms)", "", *spreads,
        "", "## Cold compile time (s)", "",
        "Eager: its first call. Inductor: `torch.compile` + first call with an empty cache. ORT: ONNX export "
        "+ session creation + first call. Cuvil: `cuvil.compile` + first call; in brackets torch.export and "
        "the import of its graph, lowering and writing the LLVM IR, and LLVM in this process with the wait for "
        "the compile workers' last modules. The full breakdown is in the JSON.",
        "", *compiles, "",
        "One-off process start-up, not counted above (Inductor and Cuvil: the imports and a trivial compile "
        "with no cache, which every later compile of the process is spared): "
        + (", ".join(startups) or "none over 0.5 s") + "."
        + (f" ONNX exporter used: {', '.join(exporters)}." if exporters else ""),
        "", "## Two Python threads sharing one compiled model", "", *_serving(results, notes),
    ]
    if notes.reasons:
        lines += ["", "## Notes", "", *notes.lines()]
    return "\n".join(lines) + "\n"


def write_results(results: dict, out: Path, stem: str) -> tuple[Path, Path]:
    json_path, md_path = write_json(results, out, stem), out / f"{stem}.md"
    md_path.write_text(render_markdown(results))
    return json_path, md_path


def write_json(results: dict, out: Path | str, stem: str) -> Path:
    """`out/stem.json` (the folder made if needed)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    return path
