"""Model zoo: small models with random weights used by tests, benchmarks and the demo.

Every entry is built from a fixed seed, so two builds give the same weights. An entry holds the
model (in eval mode), example inputs, and dynamic-dimension hints in the form that
`cuvil.frontend.import_model` takes: one `{axis: name}` dict per input, plus symbol ranges.
`entry.inputs(batch=3, seq=17)` makes fresh inputs with the named dims bound to other sizes.

Hugging Face models are built from tiny configs (nothing is downloaded) with
`attn_implementation="sdpa"`: it exports cleanly under torch.export and keeps attention as one
`scaled_dot_product_attention` op, which Cuvil imports whole as `cuvil.sdpa`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class ZooEntry:
    """One zoo model: `model(*example_inputs)` runs; `dynamic`/`ranges` are import hints."""
    name: str
    model: nn.Module
    example_sizes: dict[str, int]
    make_inputs: Callable[[dict[str, int]], tuple]
    dynamic: list[dict[int, str]]
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)

    def __post_init__(self):     # the shared ranges, of the dims this model's hints name
        named = {d for axes in self.dynamic for d in axes.values()}
        self.ranges = {d: r for d, r in self.ranges.items() if d in named}

    @property
    def example_inputs(self) -> tuple:
        return self.inputs()

    def inputs(self, **sizes: int) -> tuple:
        """Deterministic inputs with the named dims (`batch`, `seq`) set; others as in the example."""
        unknown = set(sizes) - set(self.example_sizes)
        if unknown:
            raise ValueError(f"zoo model '{self.name}' has no dimension(s) {sorted(unknown)}; "
                             f"it has {sorted(self.example_sizes)}")
        with torch.random.fork_rng(devices=[]):   # deterministic, and the caller's RNG state is untouched
            torch.manual_seed(1234)
            return self.make_inputs({**self.example_sizes, **sizes})


# ----------------------------------------------------------------------------- hand-written models

class MLP(nn.Module):
    def __init__(self, sizes=(512, 1024, 1024, 10)):
        super().__init__()
        self.fc1 = nn.Linear(sizes[0], sizes[1])
        self.fc2 = nn.Linear(sizes[1], sizes[2])
        self.fc3 = nn.Linear(sizes[2], sizes[3])

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


def conv_bn_relu(cin: int, cout: int, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU())


class SmallCNN(nn.Module):
    """conv/bn/relu blocks, a depthwise conv, max pool, adaptive average pool, linear head."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.stem = conv_bn_relu(3, 16)
        self.pool = nn.MaxPool2d(2)
        self.block = conv_bn_relu(16, 32, stride=2)
        self.depthwise = conv_bn_relu(32, 32, groups=32)
        self.pointwise = nn.Conv2d(32, 64, 1)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(64, num_classes)

    def forward(self, x):
        x = self.pool(self.stem(x))
        x = self.depthwise(self.block(x))
        x = F.relu(self.pointwise(x))
        return self.head(torch.flatten(self.gap(x), 1))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNetSmall(nn.Module):
    """ResNet-style CNN: a stem, three stages of two basic blocks, global pool, linear head."""

    def __init__(self, widths=(16, 32, 64), num_classes: int = 10):
        super().__init__()
        self.stem = conv_bn_relu(3, widths[0])
        layers, cin = [], widths[0]
        for i, w in enumerate(widths):
            layers += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
            cin = w
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention written out: matmul, a -inf upper-triangular mask, softmax."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def split_heads(self, t, b, s):
        return t.view(b, s, self.heads, -1).transpose(1, 2)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (self.split_heads(t, b, s) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        mask = torch.full((s, s), float("-inf"), device=x.device).triu(1)
        attn = torch.softmax(scores + mask, dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(b, s, d)
        return self.proj(out)


class SDPASelfAttention(CausalSelfAttention):
    """The same attention through F.scaled_dot_product_attention(is_causal=True)."""

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (self.split_heads(t, b, s) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).contiguous().view(b, s, d))


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(ln(x)), then x + mlp(ln(x)) with a GELU MLP."""

    def __init__(self, dim: int = 64, heads: int = 4, sdpa: bool = False):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = (SDPASelfAttention if sdpa else CausalSelfAttention)(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


# ----------------------------------------------------------------------------- Hugging Face models

def _hf_bert(layers: int, hidden: int, heads: int):
    from transformers import BertConfig, BertModel
    cfg = BertConfig(vocab_size=1000, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=4 * hidden, max_position_embeddings=128, use_cache=False,
                     attn_implementation="sdpa")
    return BertModel(cfg)


def _hf_gpt2():
    from transformers import GPT2Config, GPT2Model
    cfg = GPT2Config(vocab_size=1000, n_positions=128, n_embd=64, n_layer=2, n_head=4, use_cache=False,
                     bos_token_id=0, eos_token_id=0, attn_implementation="sdpa")
    return GPT2Model(cfg)


def _hf_llama():
    """Llama's architecture: RMS norm, rotary embeddings, grouped-query attention, a SiLU-gated MLP."""
    from transformers import LlamaConfig, LlamaModel
    cfg = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, use_cache=False,
                      attn_implementation="sdpa")
    return LlamaModel(cfg)


def _hf_vit():
    from transformers import ViTConfig, ViTModel
    cfg = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=64, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=128, attn_implementation="sdpa")
    return ViTModel(cfg, add_pooling_layer=True)


# ----------------------------------------------------------------------------- the registry

def _tokens(s, with_mask: bool):
    ids = torch.randint(0, 1000, (s["batch"], s["seq"]))
    if not with_mask:
        return (ids,)
    mask = torch.ones(s["batch"], s["seq"], dtype=torch.int64)
    mask[0, s["seq"] // 2:] = 0   # padding on the first row so the mask matters
    return ids, mask


_BATCH = [{0: "batch"}]
_BATCH_SEQ = [{0: "batch", 1: "seq"}]
_RANGES = {"batch": (1, 64), "seq": (1, 128)}

_BUILDERS: dict[str, Callable[[], ZooEntry]] = {
    "mlp": lambda: ZooEntry("mlp", MLP(), {"batch": 8}, lambda s: (torch.randn(s["batch"], 512),),
                            _BATCH, _RANGES),
    "cnn": lambda: ZooEntry("cnn", SmallCNN(), {"batch": 2},
                            lambda s: (torch.randn(s["batch"], 3, 32, 32),), _BATCH, _RANGES),
    "resnet": lambda: ZooEntry("resnet", ResNetSmall(), {"batch": 2},
                               lambda s: (torch.randn(s["batch"], 3, 32, 32),), _BATCH, _RANGES),
    "transformer": lambda: ZooEntry("transformer", TransformerBlock(sdpa=False), {"batch": 2, "seq": 16},
                                    lambda s: (torch.randn(s["batch"], s["seq"], 64),), _BATCH_SEQ, _RANGES),
    "transformer_sdpa": lambda: ZooEntry("transformer_sdpa", TransformerBlock(sdpa=True), {"batch": 2, "seq": 16},
                                         lambda s: (torch.randn(s["batch"], s["seq"], 64),), _BATCH_SEQ, _RANGES),
    "bert": lambda: ZooEntry("bert", _hf_bert(2, 64, 4), {"batch": 2, "seq": 16},
                             lambda s: _tokens(s, with_mask=True), _BATCH_SEQ * 2, _RANGES),
    "bert_small": lambda: ZooEntry("bert_small", _hf_bert(4, 256, 4), {"batch": 2, "seq": 32},
                                   lambda s: _tokens(s, with_mask=True), _BATCH_SEQ * 2, _RANGES),
    "gpt2": lambda: ZooEntry("gpt2", _hf_gpt2(), {"batch": 2, "seq": 16},
                             lambda s: _tokens(s, with_mask=False), _BATCH_SEQ, _RANGES),
    "llama": lambda: ZooEntry("llama", _hf_llama(), {"batch": 2, "seq": 16},
                              lambda s: _tokens(s, with_mask=False), _BATCH_SEQ, _RANGES),
    "vit": lambda: ZooEntry("vit", _hf_vit(), {"batch": 2},
                            lambda s: (torch.randn(s["batch"], 3, 32, 32),), _BATCH, _RANGES),
}


def names() -> list[str]:
    return list(_BUILDERS)


def get(name: str, seed: int = 0) -> ZooEntry:
    """Build a zoo model with weights drawn from `seed` (batch-norm statistics included), in eval mode."""
    if name not in _BUILDERS:
        raise KeyError(f"no zoo model '{name}'; available: {', '.join(_BUILDERS)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        entry = _BUILDERS[name]()
        for m in entry.model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):   # non-trivial running statistics
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.data.uniform_(0.5, 1.5)
                m.bias.data.uniform_(-0.2, 0.2)
    entry.model.eval()
    return entry
