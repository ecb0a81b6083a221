"""Worker processes: one per (engine, thread count), driven by the parent over a pipe.

A process of its own keeps each engine's thread pools (torch's OpenMP, ORT's, OpenBLAS's,
Cuvil's) from fighting the others' on a 2-core machine: while the parent times one worker, the
others block on their pipe. This module imports no torch at the top: `main` sets the thread
environment first.
"""
from __future__ import annotations

import multiprocessing
import os
import threading
import time
import traceback
from pathlib import Path
from statistics import median

import numpy as np


def describe_error(exc: BaseException) -> str:
    """`Type: first line of the message`, short enough for a table note."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def timed_calls(run, seconds: float, min_calls: int) -> list[int]:
    """Call `run` at least `min_calls` times and for at least `seconds`; each call's time in ns."""
    samples: list[int] = []
    deadline = time.perf_counter() + seconds
    while len(samples) < min_calls or time.perf_counter() < deadline:
        t0 = time.perf_counter_ns()
        run()
        samples.append(time.perf_counter_ns() - t0)
    return samples


class Worker:
    """One engine at one thread count; holds the compiled model of the current case."""

    def __init__(self, engine: str, threads: int, workdir: Path):
        self.engine_name, self.threads, self.workdir = engine, threads, Path(workdir)
        self.engine = self.runner = None

    def start(self) -> dict:
        from . import engines   # imports torch
        self.engines = engines
        self.engine = engines.ENGINES[self.engine_name](self.threads, self.workdir)
        t0 = time.perf_counter()
        info = self.engine.start()
        return {"startup_s": time.perf_counter() - t0, "torch_threads": engines.torch.get_num_threads(), **info}

    def build(self, case_name: str, warmup_s: float, min_calls: int, dynamic: bool) -> dict:
        """Compile the case cold; the compile time includes the first call (where Inductor compiles)."""
        from .suite import CASES
        self.runner = None
        built = CASES[case_name].build()
        t0 = time.perf_counter()
        runner, parts = self.engine.build(built.model, built.inputs, built.dynamic if dynamic else None)
        t1 = time.perf_counter()
        with self.engines.inference_mode():
            out = runner()
            t2 = time.perf_counter()
            timed_calls(runner, warmup_s, min_calls)
        self.runner = runner
        parts.update(self.engine.compiled_parts())
        return {"compile_s": t2 - t0, "parts": {**parts, "build_s": t1 - t0, "first_call_s": t2 - t1},
                "outputs": self.engine.leaves(out)}

    def time(self, seconds: float, min_calls: int) -> list[int]:
        with self.engines.inference_mode():
            return timed_calls(self.runner, seconds, min_calls)

    def serve(self, seconds: float, reps: int, quiet_wait_s: float = 0.0, quiet_cores: float = 0.3) -> dict:
        """Calls/s of 1 vs 2 Python threads sharing the compiled model; every output is compared
        with a single-threaded reference for bit equality. Each rep (1 then 2 threads) first waits up
        to `quiet_wait_s` for a quiet machine and records the cores other processes used meanwhile:
        on a 2-core box, two threads can only scale while nothing else runs."""
        from .machine import OtherLoad, wait_for_quiet
        with self.engines.inference_mode():
            reference = self.engine.leaves(self.runner())
        ours = [os.getpid(), os.getppid()]
        runs, calls, mismatched = [], 0, 0
        for _ in range(reps):
            wait_for_quiet(ours, quiet_wait_s, quiet_cores)
            load = OtherLoad(ours)
            rate = {}
            for n in (1, 2):
                done, bad, elapsed = self._serve_once(n, seconds, reference)
                rate[n] = done / elapsed
                calls, mismatched = calls + done, mismatched + bad
            runs.append({"calls_per_s_1": rate[1], "calls_per_s_2": rate[2], "scaling": rate[2] / rate[1],
                         "other_load_cores": load.cores()})
        one, two = median(r["calls_per_s_1"] for r in runs), median(r["calls_per_s_2"] for r in runs)
        quietest = min(runs, key=lambda r: (r["other_load_cores"] is None, r["other_load_cores"] or 0.0))
        return {"calls_per_s_1": one, "calls_per_s_2": two, "scaling": two / one, "reps": runs,
                "quietest": quietest, "calls_checked": calls, "mismatched": mismatched}

    def _serve_once(self, n: int, seconds: float, reference: list[np.ndarray]) -> tuple[int, int, float]:
        stop, start = threading.Event(), threading.Barrier(n + 1)
        counts = [[0, 0] for _ in range(n)]     # calls, mismatches
        errors: list[BaseException] = []

        def loop(count):
            try:
                with self.engines.inference_mode():   # thread-local
                    start.wait()
                    while not stop.is_set():
                        got = self.engine.leaves(self.runner())
                        count[0] += 1
                        count[1] += not (len(got) == len(reference)
                                         and all(np.array_equal(a, b) for a, b in zip(got, reference)))
            except BaseException as exc:
                errors.append(exc)
                start.abort()

        threads = [threading.Thread(target=loop, args=(c,)) for c in counts]
        for t in threads:
            t.start()
        try:
            start.wait()
        except threading.BrokenBarrierError:
            pass
        t0 = time.perf_counter()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return sum(c[0] for c in counts), sum(c[1] for c in counts), time.perf_counter() - t0

    def drop(self) -> None:
        self.runner = None


def dispatch(worker: Worker, method: str, args: tuple) -> tuple[str, object]:
    try:
        return "ok", getattr(worker, method)(*args)
    except Exception as exc:
        traceback.print_exc()      # the full story goes to the worker's log
        return "error", describe_error(exc)


def main(conn, engine: str, threads: int, workdir: str) -> None:
    workdir_path = Path(workdir)
    workdir_path.mkdir(parents=True, exist_ok=True)
    log = os.open(workdir_path / "worker.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)
    # fresh caches: every engine's compile is cold (Cuvil's object cache too, which otherwise lives
    # in ~/.cache/cuvil across runs and would serve kernels an earlier run compiled)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(workdir_path / "inductor-cache")
    os.environ["CUVIL_CACHE_DIR"] = str(workdir_path / "cuvil-cache")
    import torch
    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    worker = Worker(engine, threads, workdir_path)
    while True:
        try:
            method, args = conn.recv()
        except EOFError:
            return
        if method == "close":
            return
        conn.send(dispatch(worker, method, args))


class WorkerError(Exception):
    """A worker's call failed (the message is `describe_error` of the cause), or the worker died."""


class WorkerProcess:
    """The parent's handle on one worker process."""

    def __init__(self, engine: str, threads: int, workdir: Path):
        ctx = multiprocessing.get_context("spawn")   # never fork a process that may hold thread pools
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=main, args=(child, engine, threads, str(workdir)),
                                   name=f"bench-{engine}-t{threads}")
        self.process.start()
        child.close()

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def call(self, method: str, *args, timeout: float = 900.0):
        if not self.alive:
            raise WorkerError(f"worker process is gone (exit code {self.process.exitcode})")
        self.conn.send((method, args))
        if not self.conn.poll(timeout):
            self.process.kill()
            self.process.join()
            raise WorkerError(f"no answer to '{method}' within {timeout:.0f} s; worker stopped")
        try:
            status, value = self.conn.recv()
        except EOFError:
            self.process.join(10)
            raise WorkerError(f"worker process died during '{method}' (exit code {self.process.exitcode})") from None
        if status == "error":
            raise WorkerError(value)
        return value

    def close(self) -> None:
        if self.alive:
            try:
                self.conn.send(("close", ()))
            except OSError:
                pass
            self.process.join(10)
        if self.alive:
            self.process.kill()
            self.process.join()
        self.conn.close()
