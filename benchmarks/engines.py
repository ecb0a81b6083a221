"""Engine adapters: set-up, compile, run, and outputs as numpy arrays.

Each adapter lives in its own worker process (see worker.py) whose thread settings are already
in place; `threads` is only for the engine's own knobs (ORT session options, Cuvil's pool).
"""
from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.utils._pytree as pytree

Runner = Callable[[], object]


def inference_mode():
    return torch.inference_mode()


class Engine:
    name = ""

    def __init__(self, threads: int, workdir: Path):
        self.threads = threads
        self.workdir = workdir

    def start(self) -> dict:
        """One-off set-up in the worker process; raising here marks the engine unavailable."""
        return {}

    def build(self, model, inputs: tuple, dynamic) -> tuple[Runner, dict]:
        """Compile `model` for `inputs`: a no-argument runner and a breakdown of the compile time."""
        raise NotImplementedError

    def compiled_parts(self) -> dict:
        """After the first call: more of the compile's breakdown, where the engine reports it."""
        return {}

    def leaves(self, out) -> list[np.ndarray]:
        """The output tensors in the model's pytree order (what ONNX export also follows)."""
        return [t.detach().numpy() for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


class Eager(Engine):
    name = "eager"

    def build(self, model, inputs, dynamic):
        return (lambda: model(*inputs)), {}


class Inductor(Engine):
    """`torch.compile(model)`: mode default, backend inductor; the compile happens on the first call."""
    name = "inductor"

    def start(self):
        # Imports, the compile-worker pool and a trivial compile: paid once per process, so kept
        # out of the per-model compile times.
        torch.compile(lambda x: x + 1)(torch.ones(1))
        torch._dynamo.reset()
        return {}

    def build(self, model, inputs, dynamic):
        # Without a reset the second size of a model (same forward code) would be recompiled with
        # dynamic shapes ("automatic dynamic"), not specialised like the first.
        torch._dynamo.reset()
        compiled = torch.compile(model)
        return (lambda: compiled(*inputs)), {}


def export_onnx(model, inputs: tuple, path: Path) -> str:
    """Export with the dynamo exporter (torch 2.13's default), else the TorchScript one; returns which."""
    try:
        torch.onnx.export(model, inputs, str(path), dynamo=True, verbose=False)
        return "dynamo"
    except Exception as dynamo_error:
        try:
            torch.onnx.export(model, inputs, str(path), dynamo=False)
        except Exception:
            raise dynamo_error from None
        return "torchscript"


def ort_session(ort, path: Path, threads: int):
    """An ONNX Runtime session on the model at `path`: CPU execution provider, all graph
    optimisations, sequential execution, `threads` intra-op threads."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class OnnxRuntime(Engine):
    """ONNX Runtime, CPU execution provider, all graph optimisations, sequential execution."""
    name = "ort"
    _model_ids = itertools.count()

    def start(self):
        import onnxruntime
        self.ort = onnxruntime
        return {"version": onnxruntime.__version__}

    def build(self, model, inputs, dynamic):
        path = self.workdir / f"model{next(self._model_ids)}.onnx"
        t0 = time.perf_counter()
        exporter = export_onnx(model, inputs, path)
        t1 = time.perf_counter()
        session = ort_session(self.ort, path, self.threads)
        t2 = time.perf_counter()
        names = [i.name for i in session.get_inputs()]
        if len(names) != len(inputs):
            raise ValueError(f"the ONNX model takes {len(names)} input(s) ({', '.join(names)}); "
                             f"the benchmark passes {len(inputs)}")
        feeds = {name: x.numpy() for name, x in zip(names, inputs)}
        return (lambda: session.run(None, feeds)), {"exporter": exporter, "export_s": t1 - t0,
                                                    "session_s": t2 - t1}

    def leaves(self, out):
        return list(out)


class Cuvil(Engine):
    """`cuvil.compile(model, dynamic=..., threads=N)`: a callable with the model's output structure."""
    name = "cuvil"

    def start(self):
        # As for Inductor: the imports a first compile pays (torch.export's, ~0.75 s here) and
        # trivial compiles, with no cache, so that nothing they build serves the models timed
        # later. One is a small convolution: the first one a process lowers imports sympy's tensor
        # and combinatorics modules (its window arithmetic makes sympy's first `Add`), a cost of
        # the process that fell on whichever convolution case came first in the suite.
        import cuvil
        cuvil.compile(lambda x: x + 1, cache=False)(torch.ones(1))
        tiny = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2)).eval()
        with torch.no_grad():
            cuvil.compile(tiny, cache=False)(torch.ones(1, 3, 8, 8))
        self.compile = cuvil.compile
        return {"version": cuvil.__version__}

    def build(self, model, inputs, dynamic):
        t0 = time.perf_counter()
        compiled = self.compile(model, dynamic=dynamic, threads=self.threads)
        self.compiled = compiled
        return (lambda: compiled(*inputs)), {"compile_call_s": time.perf_counter() - t0}

    def compiled_parts(self) -> dict:
        """The compile's phases (`report.phases`: torch.export's import, the passes, LLVM, ...),
        in seconds; the background write of the compiled-model cache is left out."""
        report = getattr(self.compiled, "report", None)
        phases = report.phases if report is not None else []
        return {"phases": {p["name"]: round(p["time_s"], 4) for p in phases if not p.get("background")}}


ENGINES: dict[str, type[Engine]] = {e.name: e for e in (Eager, Inductor, OnnxRuntime, Cuvil)}
