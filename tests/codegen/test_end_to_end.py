"""A small transformer imported by the frontend (torch.export, dynamic sequence length), lowered with
the default grouping, compiled into one module and run kernel by kernel against eager PyTorch."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cuvil.codegen.call import call_kernel, evaluate
from cuvil.codegen.jit import compile_function
from cuvil.frontend import import_model


class Block(nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)
                   for t in self.qkv(self.ln1(x)).split(d, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab=50, d=32, layers=3):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.Sequential(*[Block(d) for _ in range(layers)])
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        return torch.log_softmax(self.head(self.blocks(self.emb(ids))), -1)


def run(fn, constants, lowered, compiled, ids):
    sizes = {d.name: n for d, n in zip(fn.args[0].type.shape, ids.shape) if not isinstance(d, int)}
    env = {id(fn.args[0]): ids}
    for op in fn.ops:
        if op.name == "cuvil.const":
            env[id(op.result)] = constants[op.attrs["name"]].contiguous()
    for lk in lowered:
        tensors = []
        for buf, v in zip(lk.kernel.buffers, lk.values):
            if buf.role == "out":
                env[id(v)] = torch.empty([evaluate(d, sizes) for d in buf.shape], dtype=buf.dtype.torch)
            if buf.role in ("in", "out"):
                tensors.append(env[id(v)])
        call_kernel(compiled, lk.kernel.name, tensors, sizes, split=2)
    return env[id(fn.return_op.operands[0])]


def test_tiny_transformer_matches_eager():
    torch.manual_seed(0)
    model = TinyLM().eval()
    imported = import_model(model, (torch.randint(0, 50, (2, 16)),), dynamic={"ids": {1: "seq"}})
    fn = imported.module.main
    lowered, compiled = compile_function(fn, cache=None)
    # the layers' kernels are structurally identical: compiled once, shared
    assert compiled.unique_functions < len(lowered) / 2
    for seq in (16, 3, 37):
        ids = torch.randint(0, 50, (2, seq))
        with torch.no_grad():
            ref = model(ids)
        torch.testing.assert_close(run(fn, imported.module.constants, lowered, compiled, ids), ref,
                                   rtol=1e-4, atol=1e-4)
