"""Ops without an importer row decomposed node by node (frontend/local_decompositions.py), not by
`run_decompositions` over the whole model; every case against eager."""
import pytest
import torch
import torch.nn.functional as F

import cuvil
from cuvil.frontend import local_decompositions
from cuvil.frontend.aten_table import decomposition_table
from cuvil.frontend.export import _has_no_row, as_module, needs_decomposition
from cuvil.frontend.inplace import functionalize_local_inplace


@pytest.fixture
def no_whole_retrace(monkeypatch):
    def refuse(*_, **__):
        raise AssertionError("run_decompositions was called")
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", refuse)


def _flow_lookup(image, grid):
    """RAFT's correlation lookup and coordinate grid, MaxViT's swapaxes, ViT's unflatten: ops
    torch.export keeps whole and Cuvil imports through their decompositions."""
    n, c, h, w = image.shape
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32), indexing="ij")
    coords = torch.stack([xs, ys], dim=-1) / torch.tensor([w - 1.0, h - 1.0]) * 2 - 1
    offsets = torch.linspace(-0.25, 0.25, 3)
    near = F.grid_sample(image, grid + offsets[0], mode="bilinear", padding_mode="zeros", align_corners=True)
    far = F.grid_sample(image, grid + offsets[2], mode="bilinear", padding_mode="zeros", align_corners=True)
    edge = F.grid_sample(image, coords.expand(n, h, w, 2), mode="nearest", padding_mode="border", align_corners=False)
    tokens = torch.swapaxes(near.flatten(2), 1, 2).unflatten(-1, (c // 2, 2))
    return tokens, far + edge.mean(), offsets


def test_ops_without_rows_decompose_one_node_at_a_time(no_whole_retrace):
    g = torch.Generator().manual_seed(3)
    image = torch.randn(2, 4, 6, 7, generator=g)
    grid = torch.rand(2, 5, 6, 2, generator=g) * 2.4 - 1.2
    got = cuvil.compile(_flow_lookup, cache=False)(image, grid)
    for a, b in zip(got, _flow_lookup(image, grid)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_alike_nodes_share_one_trace(monkeypatch):
    with torch.no_grad():       # as `capture` exports
        program = torch.export.export(as_module(_flow_lookup), (torch.randn(2, 4, 6, 7), torch.randn(2, 5, 6, 2)))
    functionalize_local_inplace(program.graph)      # `torch.tensor`'s detach_, as `capture` does first
    kinds = {str(n.target) for n in program.graph.nodes if n.op == "call_function" and _has_no_row(n)}
    assert {"aten.grid_sampler.default", "aten.meshgrid.indexing", "aten.linspace.default",
            "aten.swapaxes.default", "aten.unflatten.int"} <= kinds
    traced = []
    trace = local_decompositions._trace
    monkeypatch.setattr(local_decompositions, "_trace", lambda target, *rest: traced.append(target) or trace(target, *rest))
    calls = sum(1 for n in program.graph.nodes if n.op == "call_function" and _has_no_row(n))
    assert local_decompositions.decompose_locally(program.graph, decomposition_table(), _has_no_row) == calls
    assert not needs_decomposition(program)
    # the two bilinear samplers are alike (same shapes and arguments): one trace for both
    assert traced.count(torch.ops.aten.grid_sampler.default) == 2 and len(traced) == calls - 1


def test_a_symbolic_shape_goes_to_the_whole_retrace(monkeypatch):
    """With a dynamic batch the trace would bake the symbol in: the node is left to
    `run_decompositions`, and the result is still eager's at every batch."""
    def tokens(x):
        return torch.swapaxes(x, 1, 2).unflatten(-1, (2, 3)) * 2
    retraced = []
    whole = torch.export.ExportedProgram.run_decompositions
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions",
                        lambda self, *a, **k: retraced.append(1) or whole(self, *a, **k))
    fast = cuvil.compile(tokens, dynamic=[{0: "batch"}], cache=False)
    for batch in (1, 3):
        x = torch.randn(batch, 6, 5)
        torch.testing.assert_close(fast(x), tokens(x), rtol=0, atol=0)
    assert retraced
