"""`torch.compile(model, backend="cuvil")`: Cuvil as a TorchDynamo backend.

Dynamo hands the backend one FX GraphModule per captured graph (a model with graph breaks gives
several) and the graph's example inputs. Each graph is compiled with `cuvil.compile`, so a later
call with other shapes or dtypes recompiles the same way, and the backend returns a callable that
returns what the graph returns. A graph Cuvil cannot compile runs as Dynamo gave it (eager
PyTorch), and the reason is logged on the "cuvil" logger: a backend must not make a model fail.

Dims Dynamo made dynamic stay dynamic. Dynamo passes each dynamic size as an extra integer input
too; Cuvil reads it off the tensor it came from instead, so the compiled graph takes tensors only.

The entry point `cuvil = "cuvil.dynamo:cuvil_backend"` (pyproject.toml, group
`torch_dynamo_backends`) registers the backend when the package is installed.
"""
from __future__ import annotations

import inspect
import logging
from typing import Any, Callable, Sequence

import torch

from .compiled import CompiledModel, CompileOptions

log = logging.getLogger("cuvil")


def cuvil_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: dict | None = None,
                  **kwargs) -> Callable:
    """Compile one Dynamo graph. `options` (`torch.compile(..., options={...})`) are `cuvil.compile`'s;
    a bad option is an error, a graph Cuvil cannot compile is not.

    The graph compiles at its first call, not here: torch.export inside Dynamo's own compilation
    corrupts the guards Dynamo is building."""
    # the object cache only: a compiled-model cache key would have to digest Dynamo's FX graph,
    # nodes, metadata and fake tensors, at every compile Dynamo asks for
    options = {"fallback": "eager", "cache": "objects", **(options or {}), **kwargs}
    CompileOptions.of(options)
    try:
        graph = GraphFunction(gm)
        compiled = CompiledModel(graph, CompileOptions.of({"dynamic": graph.dynamic_dims(), **options}),
                                 on_fallback=_log_fallback)
    except Exception as e:     # a backend falls back instead of failing the user's model
        _log_fallback(f"{type(e).__name__}: {e}")
        return gm.forward
    return CompiledGraph(graph, compiled)


def _log_fallback(reason: str) -> None:
    log.warning("cuvil: running a Dynamo graph in eager PyTorch: %s", reason)


class CompiledGraph:
    """What the backend returns for a graph: called with all of Dynamo's inputs. A call that
    autograd records (grad enabled, an input that requires grad: a parameter, in training) runs
    the graph in eager PyTorch: Cuvil computes no gradients, and its outputs would be detached
    (a loss.backward() through them once ran and gave wrong gradients)."""

    def __init__(self, graph: "GraphFunction", compiled: CompiledModel):
        self.graph, self.compiled = graph, compiled
        self._warned = False

    def __call__(self, *args):
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            if not self._warned:
                self._warned = True
                _log_fallback("autograd records this call (an input requires grad and grad is enabled); Cuvil "
                              "computes no gradients. Call the model under torch.no_grad() or "
                              "torch.inference_mode() for Cuvil's kernels")
            return self.graph.gm(*args)
        return self.compiled(*self.graph.tensor_inputs(args))


class GraphFunction:
    """The graph as a function of its tensor inputs: the size inputs Dynamo adds are read off the
    tensors they belong to. Its signature names the graph's placeholders (for dynamic-dim hints)."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm
        self.placeholders = list(gm.graph.find_nodes(op="placeholder"))
        values = [n.meta.get("example_value", n.meta.get("val")) for n in self.placeholders]
        self.sizes: dict[int, tuple[int, int]] = {}     # size input -> (tensor input, axis)
        for i, v in enumerate(values):
            if isinstance(v, torch.SymInt) and v.node.expr.is_Symbol:
                where = _find_dim(values, v.node.expr)
                if where is not None:
                    self.sizes[i] = where
        self.kept = [i for i in range(len(self.placeholders)) if i not in self.sizes]
        self.values = values
        self.__name__ = "dynamo_graph"
        self.__signature__ = inspect.Signature([
            inspect.Parameter(self.placeholders[i].name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for i in self.kept])

    def __call__(self, *inputs):
        args: list[Any] = [None] * len(self.placeholders)
        for k, i in enumerate(self.kept):
            args[i] = inputs[k]
        for i, (j, axis) in self.sizes.items():
            args[i] = args[j].shape[axis]
        if torch.compiler.is_compiling():
            # traced by torch.export: each node it records takes the stack trace Dynamo recorded
            # for the graph node it came from (the user's line), not the graph code's frame
            with torch.fx.traceback.preserve_node_meta():
                return torch.fx.Interpreter(self.gm).run(*args)
        return self.gm(*args)

    def tensor_inputs(self, args: Sequence[Any]) -> list:
        return [args[i] for i in self.kept]

    def dynamic_dims(self) -> dict[str, dict[int, str]] | None:
        """Dims Dynamo treats as dynamic (symbolic sizes in the placeholders' fake values), named
        after Dynamo's symbols so that inputs sharing a size share a dimension."""
        hints = {}
        for i in self.kept:
            v = self.values[i]
            if isinstance(v, torch.Tensor):
                dims = {axis: f"d_{d.node.expr}" for axis, d in enumerate(v.shape)
                        if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol}
                if dims:
                    hints[self.placeholders[i].name] = dims
        return hints or None


def _find_dim(values: list, expr) -> tuple[int, int] | None:
    for j, t in enumerate(values):
        if isinstance(t, torch.Tensor):
            for axis, d in enumerate(t.shape):
                if isinstance(d, torch.SymInt) and d.node.expr == expr:
                    return j, axis
    return None
