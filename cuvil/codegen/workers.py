"""Compile workers: processes that run LLVM on a share of a model's kernels (`llvm_compile.py`).

One pool per process, started on the first compile (`prestart`, before `torch.export`, so a
worker has initialised LLVM by the time the kernels are ready) and kept for later compiles. A
worker only takes work once it has said it is ready, and is lent to one compile at a time; a
compile that finds none ready compiles everything itself. `$CUVIL_COMPILE_WORKERS` sets how many
(default: the usable cores less one, at most 3; 0 turns them off). A worker that dies is
replaced on the next compile; what it was compiling raises a `CuvilError`.
"""
from __future__ import annotations

import atexit
import os
import select
import subprocess
import sys
import threading
import warnings
from pathlib import Path

from ..errors import CuvilError
from . import llvm_compile

# the worker runs llvm_compile.py as a script, without the caller's directory on sys.path
_BOOT = "import sys, runpy; del sys.path[0]; runpy.run_path(sys.argv[1], run_name='__main__')"
MAX_WORKERS = 3


def worker_count() -> int:
    env = os.environ.get("CUVIL_COMPILE_WORKERS")
    if env is not None:
        try:
            return max(0, int(env))
        except ValueError:
            raise CuvilError(f"$CUVIL_COMPILE_WORKERS must be a whole number, not {env!r}") from None
    return max(0, min(len(os.sched_getaffinity(0)) - 1, MAX_WORKERS))


class Worker:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", _BOOT, str(Path(llvm_compile.__file__))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.ready = False

    def poll_ready(self, timeout: float = 0.0) -> bool:
        """Whether the worker has initialised LLVM (reads its READY byte once it is there)."""
        if not self.ready and self.alive() and select.select([self.proc.stdout], [], [], timeout)[0]:
            self.ready = self.proc.stdout.read(1) == llvm_compile.READY
        return self.ready

    def alive(self) -> bool:
        return self.proc.poll() is None

    def compile(self, request: dict) -> dict:
        try:
            llvm_compile.write_message(self.proc.stdin, request)
            answer = llvm_compile.read_message(self.proc.stdout)
        except (OSError, EOFError, ValueError):
            answer = None
        if answer is None:
            self.ready = False
            raise CuvilError(f"a compile worker (pid {self.proc.pid}) exited while compiling "
                             f"(exit status {self.proc.wait()}); set CUVIL_COMPILE_WORKERS=0 to compile in this process")
        if "error" in answer:
            raise CuvilError(f"LLVM could not compile the kernels: {answer['error']}")
        return answer

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


class Pool:
    def __init__(self, size: int):
        self.pid = os.getpid()
        self.size = size
        self.workers: list[Worker] = []
        self.idle: list[Worker] = []
        self.lock = threading.Lock()

    def start(self) -> None:
        with self.lock:
            self.workers = [w for w in self.workers if w.alive()]
            self.idle = [w for w in self.idle if w.alive()]
            while len(self.workers) < self.size:
                try:
                    w = Worker()
                except OSError as e:        # no interpreter to start (an embedded Python): compile here
                    warnings.warn(f"cuvil: could not start a compile worker ({e}); compiling in this process")
                    self.size = len(self.workers)
                    break
                self.workers.append(w)
                self.idle.append(w)

    def borrow(self, most: int, wait_s: float = 0.0) -> list[Worker]:
        """Up to `most` idle workers that are ready (waiting up to `wait_s` for the first one)."""
        with self.lock:
            ready = [w for w in self.idle if w.poll_ready(wait_s if w is self.idle[0] else 0.0)][:most]
            for w in ready:
                self.idle.remove(w)
            return ready

    def give_back(self, workers: list[Worker]) -> None:
        with self.lock:
            self.idle += [w for w in workers if w.alive()]

    def close(self) -> None:
        with self.lock:
            for w in self.workers:
                w.close()
            self.workers, self.idle = [], []


_pool: Pool | None = None
_pool_lock = threading.Lock()


def pool() -> Pool:
    """This process's pool (a forked child gets its own: the parent's pipes are not its to use)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool.pid != os.getpid():
            _pool = Pool(worker_count())
            atexit.register(_pool.close)
        return _pool


def prestart() -> None:
    """Start the workers now (they take ~0.1 s to initialise LLVM); cheap when they are running."""
    pool().start()
