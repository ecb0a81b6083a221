"""LLVM over a model's modules while they are still being built.

`jit` writes the LLVM IR of a model's kernels one module at a time, in Python, which holds this
process's core. Each module goes to `CompileTasks.add` as soon as it is written: once the model
is known to be large enough to gain from a second process, the compile workers (`workers.py`)
take the modules as they come, so their LLVM runs while this process writes the next modules'
IR; `finish` then compiles what no worker took, here. Before, every module was written first and
only then compiled: on 2 cores a convolution model's 0.08-0.14 s of IR writing came on top of
its LLVM time instead of beside it.

A task is one module of at least TASK_MIN_LINES lines, or smaller modules gathered to that size
(LLVM spends ~2 ms on any module however small). Waiting tasks are taken largest first, so the
last to be taken are short and the processes finish close together.
"""
from __future__ import annotations

import queue
import threading
import time

from ..errors import CuvilError
from . import llvm_compile, workers
from .target import Target, init_llvm

# Below this many lines of unoptimised LLVM IR (about 30 ms of LLVM here) a model is compiled in
# one piece: a second process would save less than sending the modules costs.
PARALLEL_MIN_LINES = 800
TASK_MIN_LINES = 300
_NO_MORE = float("inf")      # the priority of the sign that tells a helper thread to stop: after every task


class CompileTasks:
    """Module texts in (`add`), (object, optimised IR) per module out (`finish`). A context
    manager: leaving it, normally or by an exception, stops the threads that feed the workers and
    gives the workers back."""

    def __init__(self, target: Target, opt_level: int, most_helpers: int, llvm_lock: threading.RLock):
        self.target, self.llvm_lock, self.most_helpers = target, llvm_lock, most_helpers
        self.request = {"triple": target.triple, "cpu": target.cpu, "features": target.features,
                        "abiname": target.abiname, "opt": opt_level}
        self.tasks: list[list[str]] = []        # in the order they were formed
        self.answers: dict[int, dict | CuvilError] = {}
        self.gathering: list[str] = []          # small modules not yet a task
        self.lines = 0                          # of every module added
        self.helpers: list[workers.Worker] = []
        self.threads: list[threading.Thread] = []
        self.waiting: queue.PriorityQueue = queue.PriorityQueue()   # (-lines, task index)
        self.own = {"parse": 0.0, "optimize": 0.0, "codegen": 0.0}

    def __enter__(self) -> "CompileTasks":
        return self

    def __exit__(self, *exc) -> None:
        self._stop_helpers()

    def add(self, text: str) -> None:
        lines = text.count("\n")
        self.lines += lines
        if lines >= TASK_MIN_LINES:
            self._form([text])
        else:
            self.gathering.append(text)
            if sum(t.count("\n") for t in self.gathering) >= TASK_MIN_LINES:
                self._form(self.gathering)
                self.gathering = []
        if self.lines >= PARALLEL_MIN_LINES and not self.threads and self.most_helpers > 0:
            self.helpers = workers.pool().borrow(self.most_helpers)
            self.threads = [threading.Thread(target=self._remote, args=(w,), daemon=True) for w in self.helpers]
            for th in self.threads:
                th.start()

    def finish(self, timings: dict[str, float]) -> dict[str, tuple[bytes, str]]:
        """Compile every task no worker took, here, and wait for the workers' last ones. Adds
        this process's LLVM time to `timings` (parsing to `llvm_ir`, `optimize`, `codegen`) and
        the wait for the workers after it (`workers`)."""
        if self.gathering:
            self._form(self.gathering)
            self.gathering = []
        helped = bool(self.helpers)
        try:
            with self.llvm_lock:
                init_llvm(all_targets=self.target.arch != Target.host().arch)
                while (i := self._next(block=False)) is not None:
                    self.answers[i] = self._compile_here(self.tasks[i])
        except RuntimeError as e:
            raise CuvilError(f"LLVM could not compile the kernels: {e}") from None
        finally:
            t = time.perf_counter()
            self._stop_helpers()
            if helped:
                timings["workers"] = time.perf_counter() - t
        timings["llvm_ir"] = timings.get("llvm_ir", 0.0) + self.own["parse"]
        timings["optimize"], timings["codegen"] = self.own["optimize"], self.own["codegen"]
        failed = next((a for a in self.answers.values() if isinstance(a, CuvilError)), None)
        if failed is not None:
            raise failed
        return {u: (obj, ir) for i, task in enumerate(self.tasks)
                for u, obj, ir in zip(task, self.answers[i]["objects"], self.answers[i]["ir"])}

    def _form(self, units: list[str]) -> None:
        self.waiting.put((-sum(u.count("\n") for u in units), len(self.tasks)))
        self.tasks.append(list(units))

    def _next(self, block: bool) -> int | None:
        """The largest waiting task's index; None when none is left (`block=False`) or when a
        helper thread is told to stop."""
        try:
            priority, i = self.waiting.get(block=block)
        except queue.Empty:
            return None
        if priority == _NO_MORE:
            if not block:
                self.waiting.put((priority, i))     # a helper's sign: every task before it is taken
            return None
        return i

    def _remote(self, worker: workers.Worker) -> None:
        while (i := self._next(block=True)) is not None:
            try:
                self.answers[i] = worker.compile({**self.request, "texts": self.tasks[i]})
            except CuvilError as e:     # it failed or died: the compile raises this
                self.answers[i] = e
                return

    def _compile_here(self, units: list[str]) -> dict:
        answer = llvm_compile.compile_texts(**self.request, texts=units)
        for phase, seconds in answer["timings"].items():
            self.own[phase] += seconds
        return answer

    def _stop_helpers(self) -> None:
        for _ in self.threads:
            self.waiting.put((_NO_MORE, 0))
        for th in self.threads:
            th.join()
        workers.pool().give_back(self.helpers)
        self.threads, self.helpers = [], []
