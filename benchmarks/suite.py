"""The benchmark suite: which model runs at which size.

Importing this module does not import torch (the parent process never needs it); `Case.build`
does, inside the worker process whose thread settings are already in place.
"""
from __future__ import annotations

from dataclasses import dataclass, field

ELTWISE = "eltwise"     # the model name of `benchmarks.models.EltwiseChain`
SAMPLING = "sampling"   # and of `benchmarks.models.SamplingFilters`
CONVNEXT = "convnext_block"   # and of `benchmarks.models.ConvNeXtBlock`
CONFORMER = "conformer_conv"  # and of `benchmarks.models.ConformerConvModule`


@dataclass(frozen=True)
class Built:
    model: object
    inputs: tuple
    dynamic: list[dict[int, str]]   # import hints in the zoo's form: one {axis: name} per input


@dataclass(frozen=True)
class Case:
    name: str
    model: str                      # a cuvil.zoo name, or ELTWISE
    sizes: dict[str, int] = field(default_factory=dict)
    description: str = ""

    def build(self) -> Built:
        if self.model == CONVNEXT:
            import torch
            from .models import ConvNeXtBlock
            model, gen = _seeded(ConvNeXtBlock(self.sizes["channels"]))
            x = torch.randn(self.sizes["batch"], self.sizes["channels"], self.sizes["size"], self.sizes["size"],
                            generator=gen)
            return Built(model, (x,), [{0: "batch"}])
        if self.model == CONFORMER:
            import torch
            from .models import ConformerConvModule
            model, gen = _seeded(ConformerConvModule(self.sizes["dim"]))
            with torch.no_grad():
                model.batch_norm.running_mean.copy_(torch.randn(self.sizes["dim"], generator=gen) * 0.1)
                model.batch_norm.running_var.copy_(torch.rand(self.sizes["dim"], generator=gen) + 0.5)
            x = torch.randn(self.sizes["batch"], self.sizes["frames"], self.sizes["dim"], generator=gen)
            return Built(model, (x,), [{0: "batch", 1: "frames"}])
        if self.model in (ELTWISE, SAMPLING):
            import torch
            from .models import EltwiseChain, SamplingFilters
            gen = torch.Generator().manual_seed(1234)
            x = torch.randn(self.sizes["rows"], self.sizes["cols"], generator=gen)
            if self.model == SAMPLING:
                return Built(SamplingFilters().eval(), (x * 4,), [{0: "rows"}])
            return Built(EltwiseChain().eval(), (x,), [{0: "rows"}])
        from cuvil import zoo
        entry = zoo.get(self.model)
        return Built(entry.model, entry.inputs(**self.sizes), entry.dynamic)


def _seeded(model):
    """`model` in eval mode, its parameters drawn from a fixed seed (times 0.1), and the generator
    for its inputs."""
    import torch
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model.eval(), gen


SUITE: tuple[Case, ...] = (
    Case("mlp_b1", "mlp", {"batch": 1}, "MLP 512-1024-1024-10, batch 1"),
    Case("mlp_b64", "mlp", {"batch": 64}, "MLP 512-1024-1024-10, batch 64"),
    Case("cnn_b1", "cnn", {"batch": 1}, "small CNN, 3x32x32, batch 1"),
    Case("cnn_b16", "cnn", {"batch": 16}, "small CNN, 3x32x32, batch 16"),
    Case("block_s128", "transformer", {"batch": 1, "seq": 128}, "pre-norm transformer block, dim 64, seq 128"),
    Case("bert_small_s128", "bert_small", {"batch": 1, "seq": 128}, "BERT, 4 layers, hidden 256, seq 128"),
    Case("eltwise_4k", ELTWISE, {"rows": 1, "cols": 4096}, "20-op elementwise chain, 1x4096"),
    Case("eltwise_1m", ELTWISE, {"rows": 1024, "cols": 1024}, "20-op elementwise chain, 1024x1024"),
    Case("convnext_b1", CONVNEXT, {"batch": 1, "channels": 96, "size": 56},
         "ConvNeXt block (7x7 depthwise, layer norm, 4x MLP), 96x56x56, batch 1"),
    Case("conformer_b1", CONFORMER, {"batch": 1, "frames": 500, "dim": 144},
         "Conformer convolution module (1-d convolutions, GLU, 31-tap depthwise, batch norm), 144 x 500 frames"),
    Case("sampling_32k", SAMPLING, {"rows": 1, "cols": 32000}, "sampling filters (top-50, top-p 0.9) over 32000 "
         "logits"),
)
CASES: dict[str, Case] = {c.name: c for c in SUITE}


def select(selectors: list[str]) -> list[Case]:
    """Cases named by case name (`mlp_b1`) or model name (`mlp`: every size), in suite order."""
    unknown = [s for s in selectors if s not in CASES and not any(c.model == s for c in SUITE)]
    if unknown:
        raise ValueError(f"unknown model(s) {', '.join(unknown)}; cases: {', '.join(CASES)}; "
                         f"models: {', '.join(dict.fromkeys(c.model for c in SUITE))}")
    return [c for c in SUITE if c.name in selectors or c.model in selectors]
