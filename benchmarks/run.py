"""`python -m benchmarks.run` (`make bench`): the benchmark suite, written to benchmarks/results/.

Each (engine, thread count) gets a worker process. For each case and thread count, every engine
compiles the model cold (timed) and its output is compared with eager's; then the parent runs
`rounds` rounds, each giving every engine one timing block (order rotated per round), so that
all engines see the same background load and the ratios to eager come from one run.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from .machine import OtherLoad, load_average, machine_info, wait_for_quiet
from .report import unavailable_cells, write_results
from .stats import max_abs_error, speedup, summarize
from .suite import CASES, Case, select
from .worker import WorkerError, WorkerProcess

ENGINE_NAMES = ("eager", "inductor", "ort", "cuvil")
RESULTS_DIR = Path(__file__).parent / "results"


@dataclass
class Settings:
    cases: list[str]
    engines: list[str]
    threads: list[int]
    quick: bool = False
    rounds: int = 20
    block_s: float = 0.1          # one engine's timing block per round: short blocks mix load bursts evenly
    min_calls: int = 3            # per block, and for the warm-up
    warmup_s: float = 0.5
    serve_case: str = "mlp_b1"    # the two-Python-thread throughput check, engines at 1 thread
    serve_s: float = 1.0
    serve_reps: int = 5
    serve_quiet_wait_s: float = 5.0   # per serving rep: the 2-thread check needs the other core free
    quiet_cores: float = 0.3      # before each round, wait for other processes to use fewer cores than this,
    quiet_wait_s: float = 1.0     # for at most this long per round
    quiet_budget_s: float = 6.0   # and this long per row
    cuvil_dynamic: bool = False   # pass the zoo's dynamic-dim hints to cuvil.compile

    @classmethod
    def for_run(cls, cases, engines, threads, quick: bool, **overrides) -> "Settings":
        speed = dict(rounds=2, block_s=0.02, min_calls=2, warmup_s=0.0, serve_s=0.1, serve_reps=1,
                     serve_quiet_wait_s=0.0, quiet_wait_s=0.0, quiet_budget_s=0.0) if quick else {}
        return cls(cases, engines, threads, quick, **{**speed, **overrides})


def not_available(reason: str) -> dict:
    return {"status": "n/a", "reason": reason}


class Workers:
    """The live worker of each (engine, threads): started on first use, restarted after a crash.
    An engine whose worker cannot start stays unavailable, with the reason."""

    def __init__(self, workdir: Path, start_worker: Callable, log: Callable[[str], None]):
        self.workdir, self.start_worker, self.log = workdir, start_worker, log
        self.handles: dict[tuple[str, int], object] = {}
        self.started: dict[tuple[str, int], dict] = {}
        self.unavailable: dict[tuple[str, int], str] = {}

    def get(self, engine: str, threads: int):
        key = (engine, threads)
        if key in self.unavailable:
            raise WorkerError(self.unavailable[key])
        handle = self.handles.get(key)
        if handle is not None and handle.alive:
            return handle
        handle = self.start_worker(engine, threads, self.workdir / f"{engine}-t{threads}")
        try:
            info = handle.call("start")
        except WorkerError as exc:
            handle.close()
            self.unavailable[key] = str(exc)
            self.log(f"  {engine} ({threads} thread{'s' * (threads > 1)}) unavailable: {exc}")
            raise
        self.handles[key] = handle
        self.started.setdefault(key, info)
        return handle

    def pids(self) -> list[int]:
        return [os.getpid()] + [h.pid for h in self.handles.values() if h.alive]

    def summary(self) -> dict:
        out: dict[str, dict] = {}
        for (engine, threads), info in self.started.items():
            out.setdefault(engine, {})[str(threads)] = {"status": "ok", **info}
        for (engine, threads), reason in self.unavailable.items():
            out.setdefault(engine, {}).setdefault(str(threads), not_available(reason))
        return out

    def close(self) -> None:
        for handle in self.handles.values():
            handle.close()


def _rotated(items: list, by: int) -> list:
    k = by % len(items) if items else 0
    return items[k:] + items[:k]


def build_all(workers: Workers, case: Case, threads: int, s: Settings, log) -> tuple[dict, dict, dict]:
    """Compile the case cold in every engine's worker: the cells, the live handles, the outputs."""
    cells, handles, outputs = {}, {}, {}
    for engine in s.engines:
        t0 = time.perf_counter()
        try:
            handle = workers.get(engine, threads)
            built = handle.call("build", case.name, s.warmup_s, s.min_calls, s.cuvil_dynamic)
        except WorkerError as exc:
            cells[engine] = not_available(str(exc))
            continue
        handles[engine], outputs[engine] = handle, built.pop("outputs")
        cells[engine] = {"status": "ok", **built}
        log(f"  {case.name} {threads}t {engine}: built in {time.perf_counter() - t0:.1f} s")
    return cells, handles, outputs


def time_interleaved(workers: Workers, handles: dict, cells: dict, s: Settings) -> tuple[dict, dict]:
    """`s.rounds` rounds, each giving every engine one timing block (order rotated), after waiting a
    little for a quiet machine. An engine whose worker fails is dropped from `handles` and marked n/a."""
    samples: dict[str, list[int]] = {e: [] for e in handles}
    round_loads, waited = [], 0.0
    for r in range(s.rounds):
        waited += wait_for_quiet(workers.pids(), min(s.quiet_wait_s, s.quiet_budget_s - waited), s.quiet_cores)
        load = OtherLoad(workers.pids())
        for engine in _rotated(list(handles), r):
            try:
                samples[engine] += handles[engine].call("time", s.block_s, s.min_calls)
            except WorkerError as exc:
                cells[engine] = not_available(str(exc))
                del handles[engine]
        round_loads.append(load.cores())
    known = [x for x in round_loads if x is not None]
    return samples, {"other_load_cores": sum(known) / len(known) if known else None,
                     "quiet_rounds": sum(x < s.quiet_cores for x in known), "rounds": s.rounds,
                     "waited_for_quiet_s": round(waited, 1)}


def add_numbers(cells: dict, samples: dict, outputs: dict) -> None:
    """Latency summaries, speedups over eager and output errors against eager, for the timed engines."""
    for engine in samples:
        if cells[engine]["status"] != "ok":
            continue
        cells[engine].update(summarize(samples[engine]))
        if "eager" in outputs and engine != "eager":
            try:
                cells[engine]["max_abs_err"] = max_abs_error(outputs["eager"], outputs[engine])
            except ValueError as exc:
                cells[engine]["output_mismatch"] = str(exc)
    if cells.get("eager", {}).get("status") == "ok":
        for cell in cells.values():
            if cell["status"] == "ok":
                cell["speedup"] = speedup(cells["eager"]["median_ms"], cell["median_ms"])


def serve_all(workers: Workers, case: Case, handles: dict, s: Settings) -> dict:
    load, load_avg = OtherLoad(workers.pids()), load_average()
    engines = {}
    for engine, handle in handles.items():
        try:
            engines[engine] = {"status": "ok", **handle.call("serve", s.serve_s, s.serve_reps, s.serve_quiet_wait_s,
                                                                s.quiet_cores)}
        except WorkerError as exc:
            engines[engine] = not_available(str(exc))
    return {"case": case.name, "engines": engines, "other_load_cores": load.cores(),
            "load_average": {"start": load_avg, "end": load_average()}}


def measure(workers: Workers, case: Case, threads: int, s: Settings, log) -> tuple[dict, dict | None]:
    """One case at one thread count: the row (cells and background load) and, for the serving case
    at 1 thread, the two-Python-thread check."""
    cells, handles, outputs = build_all(workers, case, threads, s, log)
    samples, row_load = time_interleaved(workers, handles, cells, s)
    add_numbers(cells, samples, outputs)
    serving = serve_all(workers, case, handles, s) if case.name == s.serve_case and threads == 1 else None
    for handle in handles.values():
        try:
            handle.call("drop")
        except WorkerError:
            pass    # a dead worker is restarted for the next case
    return {**row_load, "engines": cells}, serving


def run_suite(s: Settings, workdir: Path, start_worker: Callable = WorkerProcess,
              log: Callable[[str], None] = print) -> dict:
    started = time.time()
    results: dict = {"schema": 1, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)),
                     "settings": asdict(s), "machine": machine_info(),
                     "load_average": {"start": load_average()}, "cases": [], "serving": None}
    workers = Workers(workdir, start_worker, log)
    try:
        for case in (CASES[name] for name in s.cases):
            row = {"case": case.name, "model": case.model, "sizes": case.sizes,
                   "description": case.description, "threads": {}}
            for threads in s.threads:
                row["threads"][str(threads)], serving = measure(workers, case, threads, s, log)
                results["serving"] = serving or results["serving"]
            results["cases"].append(row)
    finally:
        workers.close()
    results["engines"] = workers.summary()
    results["load_average"]["end"] = load_average()
    results["wall_s"] = round(time.time() - started, 1)
    return results


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_settings(argv: list[str] | None) -> tuple[Settings, Path]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="few repetitions, for a smoke run (writes quick.json / quick.md, not latest.*)")
    p.add_argument("--models", default=",".join(CASES),
                   help=f"case or model names, comma-separated (default: all: {','.join(CASES)})")
    p.add_argument("--engines", default=",".join(ENGINE_NAMES),
                   help=f"engines, comma-separated, from {','.join(ENGINE_NAMES)}; eager is always added")
    p.add_argument("--threads", default="1,2", help="thread counts, comma-separated (default 1,2)")
    p.add_argument("--cuvil-dynamic", action="store_true",
                   help="give cuvil.compile the zoo's dynamic-dim hints (default: static shapes, like the others)")
    p.add_argument("--serve-quiet-wait", type=float, default=None, metavar="S",
                   help="two-thread check: wait up to S seconds per rep for a quiet machine (default "
                        f"{Settings.serve_quiet_wait_s})")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="output folder (default benchmarks/results)")
    args = p.parse_args(argv)
    try:
        cases = [c.name for c in select(_csv(args.models))]
    except ValueError as exc:
        p.error(str(exc))
    engines = _csv(args.engines)
    unknown = [e for e in engines if e not in ENGINE_NAMES]
    if unknown:
        p.error(f"unknown engine(s) {', '.join(unknown)}; choose from {', '.join(ENGINE_NAMES)}")
    engines = ["eager"] + [e for e in dict.fromkeys(engines) if e != "eager"]   # ratios need eager
    try:
        threads = sorted({int(t) for t in _csv(args.threads)})
    except ValueError:
        p.error(f"--threads takes whole numbers, got '{args.threads}'")
    if not threads or threads[0] < 1:
        p.error("--threads needs thread counts of 1 or more")
    overrides = {} if args.serve_quiet_wait is None else {"serve_quiet_wait_s": args.serve_quiet_wait}
    return Settings.for_run(cases, engines, threads, args.quick, cuvil_dynamic=args.cuvil_dynamic,
                            **overrides), args.out


def main(argv: list[str] | None = None) -> int:
    settings, out = parse_settings(argv)
    workdir = Path(tempfile.mkdtemp(prefix="cuvil-bench-"))
    print(f"benchmarks: {len(settings.cases)} case(s) x engines {','.join(settings.engines)} "
          f"x threads {','.join(map(str, settings.threads))}; worker logs in {workdir}", flush=True)
    results = run_suite(settings, workdir, log=lambda line: print(line, flush=True))
    json_path, md_path = write_results(results, out, "quick" if settings.quick else "latest")
    print(md_path.read_text())
    print(f"wrote {json_path} and {md_path} ({results['wall_s']} s)")
    if unavailable_cells(results):
        print(f"some engines were not available; worker logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
