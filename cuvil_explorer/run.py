"""Compile a cell's target with `cuvil.explain`, run the compiled model in the kernel, and compare
its result with a reference: eager PyTorch for Python code, the input IR for an IR cell."""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

import cuvil
from cuvil import CompileReport, CuvilError
from cuvil.ir.interpreter import random_constants
from cuvil.passes import random_inputs
from cuvil.report_html import Stage, ir_stages

from .cell import Target


class InterpretedModel:
    """A model compiled by Cuvil, run by its reference interpreter (`cuvil.interpret`) until the
    native engine lands. Call it like the original model."""

    def __init__(self, imported: cuvil.frontend.ImportResult):
        self.imported = imported

    @property
    def module(self) -> cuvil.Module:
        return self.imported.module

    def __call__(self, *args, **kwargs):
        flat = self.imported.flatten_inputs(*args, **kwargs)
        with torch.no_grad():   # inference: weights are parameters, results need no autograd history
            return self.imported.unflatten(cuvil.interpret(self.module, *flat))


class InterpretedIR:
    """An IR module run with fixed constants (random ones: IR text carries no weights)."""

    def __init__(self, module: cuvil.Module, constants: dict[str, torch.Tensor]):
        self.module, self.constants = module, constants

    def __call__(self, *inputs):
        out = cuvil.interpret(self.module, *inputs, constants=self.constants)
        return out[0] if len(out) == 1 else tuple(out)


@dataclass
class CellRun:
    """Everything one `%%cuvil` cell produced."""
    target: Target
    report: CompileReport
    compiled: Callable
    result: Any = None                 # compiled(*example inputs); None with --no-run
    reference: str = ""                # what the result was compared with
    max_abs_err: float | None = None
    times: dict[str, float] = field(default_factory=dict)
    cached: bool = False               # True when this display came from the cell cache
    svgs: dict[int, str | None] = field(default_factory=dict)   # graph drawings by stage, drawn on demand
    _stages: list[Stage] | None = None

    @property
    def stages(self) -> list[Stage]:
        if self._stages is None:
            self._stages = ir_stages(self.report)
        return self._stages


def compile_target(target: Target, pipeline: str, dynamic=None, run: bool = True) -> CellRun:
    if target.is_ir:
        return _compile_ir(target, pipeline, run)
    example = target.kwargs if target.kwargs else target.args
    with warnings.catch_warnings():   # torch.export's own deprecation notices are not the user's business
        warnings.simplefilter("ignore", FutureWarning)
        imported = cuvil.import_model(target.fn, example, dynamic=dynamic, ranges=target.ranges)
    report = cuvil.explain(imported, pipeline=pipeline, name=target.label)
    out = CellRun(target, report, InterpretedModel(imported), reference="eager PyTorch")
    if run:
        t0 = time.perf_counter()
        out.result = out.compiled(*target.args, **target.kwargs)
        out.times["run (interpreter)"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        with torch.no_grad():
            expected = target.fn(*target.args, **target.kwargs)
        out.times["eager"] = time.perf_counter() - t0
        out.max_abs_err = max_abs_error(expected, out.result)
    return out


def _compile_ir(target: Target, pipeline: str, run: bool) -> CellRun:
    module = cuvil.parse(target.ir_text, filename=target.filename)
    constants = random_constants(module)
    inputs = list(target.args) or random_inputs(module, None, 0, {})
    expected = cuvil.interpret(module, *inputs, constants=constants) if run else None   # before passes
    report = cuvil.explain(module, pipeline=pipeline, name=module.main.name)
    out = CellRun(target, report, InterpretedIR(module, constants), reference="the input IR (random constants)")
    if run:
        t0 = time.perf_counter()
        out.result = out.compiled(*inputs)
        out.times["run (interpreter)"] = time.perf_counter() - t0
        out.max_abs_err = max_abs_error(expected, out.result)
    return out


def max_abs_error(expected: Any, actual: Any) -> float:
    """The largest absolute difference over the tensors of two results of the same structure."""
    want = [t for t in pytree.tree_leaves(expected) if isinstance(t, torch.Tensor)]
    got = [t for t in pytree.tree_leaves(actual) if isinstance(t, torch.Tensor)]
    if len(want) != len(got):
        raise CuvilError(f"the compiled model returned {len(got)} tensors, the reference {len(want)}")
    worst = 0.0
    for i, (e, a) in enumerate(zip(want, got)):
        if e.shape != a.shape:
            raise CuvilError(f"result {i} has shape {list(a.shape)}, the reference {list(e.shape)}")
        if e.numel():
            worst = max(worst, float((e.double() - a.double()).abs().max()))
    return worst
