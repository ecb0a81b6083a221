"""`cuvil.explain`: import a model, run a pipeline with every instrument on, and return the report."""
from __future__ import annotations

import time
from typing import Any, Sequence

import torch

from .frontend import ImportResult, import_model
from .ir import Module, parse, print_module
from .passes import Instrument, IRSnapshot, PassManager, VerifyEach
from .report import CompileReport, source_lines

DEFAULT_PIPELINE = "O1"


def explain(fn_or_module: Any, *example_inputs: torch.Tensor, pipeline: str = DEFAULT_PIPELINE,
            dynamic=None, ranges=None, name: str | None = None, instruments: Sequence[Instrument] = ()) -> CompileReport:
    """Compile `fn_or_module` (an `nn.Module`, a function, a cuvil `Module` or IR text) and report
    what every pass did: IR before and after, time, changed or not, statistics.

        report = cuvil.explain(model, x, dynamic={"x": {0: "batch"}})
        report.passes[2]["ir_after"]
    """
    t0 = time.perf_counter()
    imported = _to_module(fn_or_module, example_inputs, dynamic, ranges)
    module = imported.module if isinstance(imported, ImportResult) else imported
    import_s = imported.time_s if isinstance(imported, ImportResult) else time.perf_counter() - t0
    phases = [{"name": "import", "time_s": import_s}]
    input_ir = print_module(module)

    t0 = time.perf_counter()
    manager = PassManager(pipeline, instruments=[IRSnapshot(), VerifyEach(), *instruments])
    records = manager.run(module)
    phases.append({"name": "passes", "time_s": time.perf_counter() - t0})

    return CompileReport(
        name=name or _name_of(fn_or_module),
        input_ir=input_ir,
        output_ir=print_module(module),
        pipeline=manager.spec,
        passes=[r.to_json() for r in records],
        sources=source_lines(module.main),
        phases=phases,
    )


def _to_module(obj, example_inputs, dynamic, ranges) -> Module | ImportResult:
    if isinstance(obj, (Module, ImportResult)):
        return obj
    if isinstance(obj, str):
        return parse(obj)
    return import_model(obj, example_inputs or None, dynamic=dynamic, ranges=ranges)


def _name_of(obj) -> str:
    if isinstance(obj, torch.nn.Module):
        return type(obj).__name__
    return getattr(obj, "__name__", type(obj).__name__)
