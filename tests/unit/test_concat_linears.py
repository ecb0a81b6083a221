"""concat-linears: linears that share their input become one GEMM over their stacked weights and a
split; against eager PyTorch with the pass on and off, and what it leaves alone."""
import torch
import torch.nn.functional as F
from torch import nn

import cuvil


class Attention(nn.Module):
    """Separate query, key and value projections of one input, as in BERT and Llama."""

    def __init__(self, dim=32, heads=4, kv=16):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, kv), nn.Linear(dim, kv)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.heads, -1).transpose(1, 2)
        k = self.k(x).view(b, n, self.heads // 2, -1).transpose(1, 2)
        v = self.v(x).view(b, n, self.heads // 2, -1).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return self.out(y.transpose(1, 2).reshape(b, n, -1))


class GatedMLP(nn.Module):
    """Llama's MLP: silu(gate(x)) * up(x), without biases, then down."""

    def __init__(self, dim=32, hidden=48):
        super().__init__()
        self.gate, self.up = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


def _statistics(compiled) -> dict:
    return next(p["statistics"] for p in compiled.report.passes if p["name"] == "concat-linears")


def test_projections_of_one_input_run_as_one_linear():
    torch.manual_seed(0)
    for model, stacked in ((Attention().eval(), 3), (GatedMLP().eval(), 2)):
        on = cuvil.compile(model, dynamic=[{1: "n"}], cache=False)
        off = cuvil.compile(model, dynamic=[{1: "n"}], cache=False, disable_passes=["concat-linears"])
        for n in (5, 17):
            x = torch.randn(2, n, 32)
            torch.testing.assert_close(on(x), model(x))
            torch.testing.assert_close(off(x), model(x))
        assert _statistics(on) == {"groups": 1, "linears": stacked, "skipped": {}}
        linears = [k for k in on.report.kernels if "linear" in k["name"]]
        assert len(linears) == len([k for k in off.report.kernels if "linear" in k["name"]]) - stacked + 1


def test_a_shared_weight_and_a_lone_linear_stay_as_they_are():
    torch.manual_seed(1)
    tied = nn.Linear(8, 8)
    other = nn.Linear(8, 4)

    def f(x):
        # the tied weight is read twice (by two linears of different inputs): stacking it with
        # `other` would store it twice
        return tied(x), other(x), tied(torch.tanh(x))

    c = cuvil.compile(f, cache=False)
    x = torch.randn(3, 8)
    for got, want in zip(c(x), f(x)):
        torch.testing.assert_close(got, want)
    assert _statistics(c) == {"groups": 0, "linears": 0, "skipped": {"alone": 1, "shared-weight": 1}}


def test_attention_reads_its_keys_and_values_through_the_split():
    # static sizes: attention packs K^T and V into panels element by element and copies its tile of
    # queries, so it reads all three through the split and the head views (and the grouped heads'
    # expand) of the joint projection: no kernel copies them out
    torch.manual_seed(2)
    model = Attention(dim=64, heads=4, kv=32).eval()
    c = cuvil.compile(model, cache=False)
    x = torch.randn(2, 40, 64)
    torch.testing.assert_close(c(x), model(x))
    names = [k["name"].split("_", 2)[-1] for k in c.report.kernels]
    assert names[0] == "linear" and names[1].endswith("sdpa"), names
    sdpa = next(k["kernel_ir"] for k in c.report.kernels if "sdpa" in k["name"])
    assert sdpa.splitlines()[0].count("in f32[2, 40, 128]") == 1, sdpa
