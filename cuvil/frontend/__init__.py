"""Frontend: PyTorch model or function -> Cuvil graph IR, through torch.export and core ATen.

    result = import_model(model, (x,), dynamic={"x": {0: "batch"}}, ranges={"batch": (1, 64)})
    result.module            # cuvil Module; constants are the model's parameters/buffers by FX name
    result.unflatten(outs)   # the model's own output structure (e.g. a Hugging Face ModelOutput)

Symbols: torch's shape symbols are renamed `s0, s1, ...` in the order the inputs first use them;
`result.symbols` maps each to the user's hint name and its range (`symbol_for("batch")` -> "s0").
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..errors import CuvilError
from ..ir import Function, Module
from .aten_table import ATEN_TABLE
from .export import DEFAULT_RANGE, CuvilExportError, capture
from .hf_caches import flatten_like
from .importer import import_graph
from .symbols import SymbolInfo

__all__ = ["import_model", "ImportResult", "unflatten_outputs", "CuvilExportError", "DEFAULT_RANGE", "ATEN_TABLE"]


@dataclass
class ImportResult:
    module: Module
    input_names: list[str]
    output_structure: pytree.TreeSpec
    symbols: dict[str, SymbolInfo]            # "s0" -> SymbolInfo(symbol, hint, range)
    exported: torch.export.ExportedProgram
    tensor_positions: list[int]               # flattened call inputs that are the IR's first arguments
    draws: list = field(default_factory=list)  # random_draws.Draw: the random tensors, its last arguments
    time_s: float = 0.0                       # capture + import wall time

    @property
    def function(self) -> Function:
        return self.module.main

    def symbol_for(self, hint: str) -> str:
        """The Cuvil symbol of a user dim name: `symbol_for("batch")` -> "s0"."""
        for s in self.symbols.values():
            if s.hint == hint:
                return s.symbol
        raise KeyError(f"no dynamic dim named '{hint}'; known: {[s.hint for s in self.symbols.values()]}")

    def flatten_inputs(self, *args, **kwargs) -> list[torch.Tensor]:
        """The IR function's arguments from a call like the model's (same structure as the example)."""
        try:
            leaves = flatten_like(self.exported.call_spec.in_spec, (args, kwargs))
        except (ValueError, TypeError, KeyError) as e:
            raise CuvilError(f"the call does not match the inputs the model was imported with: {e}") from None
        return [leaves[i] for i in self.tensor_positions]

    def unflatten(self, outputs: list[torch.Tensor]) -> Any:
        """Rebuild the model's output (tensor, tuple, dict, ModelOutput...) from the IR's flat results."""
        return unflatten_outputs(self.output_structure, outputs)


def unflatten_outputs(spec: pytree.TreeSpec, outputs: list[torch.Tensor]) -> Any:
    """The output structure `spec` rebuilt around the flat results."""
    if spec.is_leaf():          # the common cases without a pytree walk (microseconds per call)
        return outputs[0]
    if spec.type is tuple and all(c.is_leaf() for c in spec.children()):
        return tuple(outputs)
    return pytree.tree_unflatten(list(outputs), spec)


def import_model(model_or_fn, example_inputs=None, dynamic=None, name: str = "forward",
                 ranges: dict[str, tuple[int, int]] | None = None) -> ImportResult:
    """Capture `model_or_fn` with torch.export and import it as a Cuvil module.

    `dynamic`: per position `[{0: "batch", 1: "seq"}]` or per parameter `{"x": {0: "batch"}}`, or
    True (every dim torch.export can keep dynamic, named `x_dim0`, ...);
    ranges go in `ranges={"batch": (1, 64)}` or inside the `dynamic` dict. A plain function's
    string annotations (`x: "f32[B,512]"`) are hints too, and stand in for missing example inputs.
    """
    t0 = time.perf_counter()
    captured = capture(model_or_fn, example_inputs, dynamic, ranges)
    ep = captured.program
    graph = import_graph(ep, ATEN_TABLE, name, captured.hints, DEFAULT_RANGE[1])
    return ImportResult(graph.module, graph.input_names, ep.call_spec.out_spec, dict(graph.symbols.info), ep,
                        graph.tensor_positions, graph.draws, time.perf_counter() - t0)
