"""`cuvil.explain`: import a model, run a pipeline with every instrument on, compile it natively, and
return the report."""
from __future__ import annotations

import time
from typing import Any, Sequence

import torch

from .codegen import workers
from .codegen.grouping import grouping_for
from .codegen.target import Target
from .compiler import compile_module, paused_gc, pipeline_for, symbol_sizes
from .frontend.hf_caches import flatten_like
from .frontend import ImportResult, import_model
from .ir import Module, parse
from .passes import Instrument
from .report import CompileReport

DEFAULT_PIPELINE = "O3"


@paused_gc()
def explain(fn_or_module: Any, *example_inputs: torch.Tensor, pipeline: str = DEFAULT_PIPELINE,
            dynamic=None, ranges=None, name: str | None = None, instruments: Sequence[Instrument] = (),
            native: bool = True, enable_fusion: Any = True, disable_passes: Sequence[str] = (),
            target: str = "host", precision: str = "fp32") -> CompileReport:
    """Compile `fn_or_module` (an `nn.Module`, a function, a cuvil `Module` or IR text) and report
    what every pass did: IR before and after, time, changed or not, statistics.

    With `native` (the default) the result of the pipeline is also compiled to native kernels, and
    the report gains the kernels (ops, source lines, kernel IR, LLVM IR, assembly), the schedule and
    the memory plan (for `target`: "host", or a cross target such as "aarch64", whose code is
    generated but not run). When Cuvil cannot compile the model natively, those sections stay empty and
    `report.phases` ends with a "native" entry holding the reason.

        report = cuvil.explain(model, x, dynamic={"x": {0: "batch"}})
        report.passes[2]["ir_after"]
    """
    t0 = time.perf_counter()
    imported = _to_module(fn_or_module, example_inputs, dynamic, ranges)
    if isinstance(imported, ImportResult):
        module, sizes, import_s = imported.module, _example_sizes(imported), imported.time_s
    else:
        module, sizes, import_s = imported, {}, time.perf_counter() - t0
    return compile_module(module, pipeline=pipeline_for(pipeline, disable_passes, enable_fusion, precision),
                          name=name or _name_of(fn_or_module), native=native, grouping=grouping_for(enable_fusion),
                          hint_sizes=sizes, instruments=instruments,
                          phases=[{"name": "import", "time_s": import_s}], raise_errors=False,
                          target=None if target == "host" else Target.cross(target)).report


def _to_module(obj, example_inputs, dynamic, ranges) -> Module | ImportResult:
    if isinstance(obj, (Module, ImportResult)):
        return obj
    if isinstance(obj, str):
        return parse(obj)
    workers.prestart()      # the compile workers get LLVM ready while torch.export runs
    return import_model(obj, example_inputs or None, dynamic=dynamic, ranges=ranges)


def _example_sizes(imported: ImportResult) -> dict[str, int]:
    """The sizes of the dynamic dims in the export example (the memory plan is shown at them)."""
    example = imported.exported.example_inputs
    if example is None:
        return {}
    leaves = flatten_like(imported.exported.call_spec.in_spec, example)
    return symbol_sizes(imported.function, [leaves[i] for i in imported.tensor_positions])


def _name_of(obj) -> str:
    if isinstance(obj, torch.nn.Module):
        return type(obj).__name__
    return getattr(obj, "__name__", type(obj).__name__)
