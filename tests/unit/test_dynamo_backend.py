"""`torch.compile(..., backend="cuvil")`: the entry point, native runs per Dynamo graph (graph breaks,
dims Dynamo made dynamic), and eager fallback for graphs Cuvil cannot compile."""
import logging

import pytest
import torch
import torch.nn as nn

from cuvil.dynamo import CompiledGraph, cuvil_backend


@pytest.fixture(scope="module", autouse=True)
def _private_cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUVIL_CACHE_DIR", str(tmp_path_factory.mktemp("cuvil-cache")))
        yield


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Recorder:
    """The cuvil backend, keeping what it returned for each graph."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        out = cuvil_backend(gm, example_inputs)
        self.graphs.append(out)
        return out

    def all_native(self) -> bool:
        return bool(self.graphs) and all(isinstance(g, CompiledGraph) and g.compiled.num_variants >= 1
                                         and g.compiled.fallback_reason is None for g in self.graphs)


def small_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4), nn.LayerNorm(4)).eval()


def test_entry_point_registers_the_backend():
    assert "cuvil" in torch._dynamo.list_backends()


def test_torch_compile_with_the_registered_backend_matches_eager():
    model = small_model()
    compiled = torch.compile(model, backend="cuvil")
    for b in (2, 3, 5):
        x = torch.randn(b, 8)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))


def test_graphs_run_natively_including_dims_dynamo_made_dynamic():
    model, backend = small_model(), Recorder()
    compiled = torch.compile(model, backend=backend)
    for b in (2, 3, 5, 9):        # Dynamo recompiles once at 3 with a dynamic batch, then reuses it
        x = torch.randn(b, 8)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))
    assert len(backend.graphs) == 2 and backend.all_native()
    dynamic = backend.graphs[1]
    assert dynamic.graph.sizes                   # Dynamo's size input is read off the tensor instead
    assert dynamic.compiled.num_variants == 1     # one native variant served batch 3, 5 and 9


def test_graph_breaks_give_graphs_that_each_run_natively():
    def f(x):
        y = torch.relu(x) * 3
        print("a graph break")
        return (y + 1).sum(-1)

    backend = Recorder()
    cf = torch.compile(f, backend=backend)
    x = torch.randn(4, 6)
    torch.testing.assert_close(cf(x), f(x))
    assert len(backend.graphs) == 2 and backend.all_native()


class Masked(nn.Module):
    """Sizes read from tensor values: a selection by a mask, `nonzero`."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        y = self.proj(x)
        picked = y[y > 0] * 2
        return picked.sum() + torch.nonzero(y > 0.5).sum(), torch.tanh(y)


def test_sizes_read_from_values_are_refused_by_cuvil_compile_pointing_at_the_dynamo_backend():
    """cuvil.compile names the op, the reason and torch.compile's route; that route compiles the
    graphs around the data-sized ops with Cuvil, the ops themselves running in eager between them."""
    import cuvil
    from cuvil.errors import CuvilUnsupportedOpError
    model = Masked().eval()
    x = torch.randn(5, 8)
    with pytest.raises(CuvilUnsupportedOpError, match=r"(?s)aten.index.Tensor.*size depends on tensor values.*"
                                                     r"backend=\"cuvil\".*picked = y\[y > 0\] \* 2"):
        cuvil.compile(model)(x)
    with pytest.raises(CuvilUnsupportedOpError, match=r"(?s)aten.nonzero.default.*size depends on tensor values"):
        cuvil.compile(lambda y: torch.nonzero(y > 0.5))(x)
    backend = Recorder()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for rows in (5, 9):
            x = torch.randn(rows, 8)
            for got, want in zip(compiled(x), model(x)):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert len(backend.graphs) >= 2 and backend.all_native()


def test_a_branch_on_tensor_values_points_at_the_dynamo_backend_which_compiles_around_it():
    """FSMT's `if not padding_mask.any():`, Longformer's `if is_global_attn:`: torch.export cannot
    capture the branch; Dynamo runs it in Python between graphs Cuvil compiles."""
    import cuvil

    def f(x, mask):
        y = torch.tanh(x) * 2
        if not mask.any():
            return y + 1
        return y.masked_fill(mask, 0.0)
    x = torch.randn(4, 6)
    with pytest.raises(cuvil.CuvilError, match=r"(?s)data-dependent control flow.*backend=\"cuvil\""):
        cuvil.compile(f)(x, x > 0)
    backend = Recorder()
    compiled = torch.compile(f, backend=backend)
    for mask in (x > 0, torch.zeros_like(x, dtype=torch.bool)):
        torch.testing.assert_close(compiled(x, mask), f(x, mask))
    assert backend.all_native()


def test_a_graph_cuvil_cannot_compile_runs_eagerly_and_logs_why(caplog):
    def f(x):
        y = x * 2
        return torch.mode(y, dim=1).values + 1

    backend = Recorder()
    cf = torch.compile(f, backend=backend)
    x = torch.randn(3, 5)
    with caplog.at_level(logging.WARNING, logger="cuvil"):
        torch.testing.assert_close(cf(x), f(x))
    assert "running a Dynamo graph in eager PyTorch" in caplog.text and "aten.mode" in caplog.text
    [graph] = backend.graphs
    assert "aten.mode" in graph.compiled.fallback_reason
    # the user's line, from the stack trace Dynamo recorded (not the graph code's own frame)
    assert "test_dynamo_backend.py" in graph.compiled.fallback_reason
    assert "return torch.mode(y, dim=1).values + 1" in graph.compiled.fallback_reason


def test_options_reach_cuvil_and_bad_ones_are_errors():
    model = small_model()
    x = torch.randn(3, 8)
    unfused = torch.compile(model, backend="cuvil", options={"enable_fusion": False})
    with torch.no_grad():
        torch.testing.assert_close(unfused(x), model(x))
    torch._dynamo.reset()
    bad = torch.compile(model, backend="cuvil", options={"enable_fusoin": False})
    with pytest.raises(Exception, match="unknown option 'enable_fusoin'"):
        bad(x)


def test_a_decoding_step_whose_keys_and_values_dynamo_sizes_apart_runs_natively():
    """Dynamo gives a growing cache's keys and values a length each (`1 + s0`, `1 + s1`); attention
    needs them equal, as eager checks when it runs. The import takes them as one size, and the
    guard checks it per call."""
    def step(q, past_k, past_v, k, v):
        keys, values = torch.cat([past_k, k], 2), torch.cat([past_v, v], 2)
        return torch.nn.functional.scaled_dot_product_attention(q, keys, values), keys, values

    backend = Recorder()
    cf = torch.compile(step, backend=backend)
    gen = torch.Generator().manual_seed(0)
    past_k, past_v = torch.randn(1, 2, 5, 8, generator=gen), torch.randn(1, 2, 5, 8, generator=gen)
    for _ in range(5):
        q, k, v = (torch.randn(1, 2, 1, 8, generator=gen) for _ in range(3))
        got, want = cf(q, past_k, past_v, k, v), step(q, past_k, past_v, k, v)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
        past_k, past_v = want[1], want[2]
    assert backend.all_native(), [g.compiled.fallback_reason for g in backend.graphs]
    assert backend.graphs[-1].compiled.num_variants == 1         # every later length


def test_a_call_autograd_records_runs_in_eager_with_its_gradients(caplog):
    # with grad enabled the parameters require grad: Cuvil's outputs were detached, and a backward
    # through them gave the input a wrong gradient and the weights none
    model = small_model()
    backend = Recorder()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(3, 8, requires_grad=True)
    with caplog.at_level(logging.WARNING, logger="cuvil"):
        compiled(x).square().sum().backward()
    got, weight = x.grad.clone(), model[0].weight.grad.clone()
    x.grad = None
    model.zero_grad()
    model(x).square().sum().backward()
    torch.testing.assert_close(got, x.grad)
    torch.testing.assert_close(weight, model[0].weight.grad)
    assert "Cuvil computes no gradients" in caplog.text
    with torch.no_grad():        # and without autograd (a graph of its own for Dynamo), Cuvil's kernels
        torch.testing.assert_close(compiled(x), model(x))
    last = backend.graphs[-1]
    assert isinstance(last, CompiledGraph) and last.compiled.num_variants == 1 and last.compiled.fallback_reason is None
