"""Attention: a fully masked row attends to nothing (eager PyTorch gives zeros there, so must Cuvil);
weights below the smallest normal float are 0 (no denormals, which slow every product that reads them); K^T and V packed at run time; a dynamic head dim; keys and values with fewer heads than the queries."""
import math

import pytest
import torch
import torch.nn.functional as F

import cuvil
from cuvil.codegen.target import Target
from cuvil.ir.ops.nn import panel_width


class Attention(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_fully_masked_rows_give_zeros_like_eager():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 2, 4, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    mask = torch.rand(2, 1, 4, 5) > 0.3
    mask[0, :, 1, :] = False                      # row 1 of batch 0 sees no key at all
    mask[1, :, 3, :] = False
    expected = Attention()(q, k, v, mask)
    assert torch.equal(expected[0, :, 1], torch.zeros(2, 8))
    got = cuvil.compile(Attention())(q, k, v, mask)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("e", [20, 16])
@pytest.mark.parametrize("kind", ["plain", "bool", "float", "causal", "scale"])
def test_attention_on_runtime_panels(kind, e):
    """Static shapes of at least 16 query rows and keys: K^T and V are packed in panels per tile
    (as wide as the target's for weights) and the panel GEMM runs both products, the scale applied
    to the logits (40 keys and 40 value columns: partial last panels; 80 query rows: a partial
    second tile), against an fp64 reference. A head dim of 16 packs K^T in whole 8 x 8 tiles,
    which the emitter transposes in registers."""
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(2, 3, 80, e, generator=g), torch.randn(2, 3, 40, e, generator=g), \
        torch.randn(2, 3, 40, 40, generator=g)
    masks = {"bool": torch.rand(2, 1, 80, 40, generator=g) > 0.3, "float": torch.randn(1, 3, 80, 40, generator=g)}
    mask = masks.get(kind)
    opts = {"is_causal": kind == "causal", "scale": 0.3 if kind == "scale" else None}

    def fn(q, k, v, *m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m[0] if m else None, **opts)
    args = (q, k, v) + ((mask,) if mask is not None else ())
    kernels = "\n".join(kr["kernel_ir"] for kr in cuvil.explain(fn, *args).kernels)
    # causal: the second product runs over each tile's keys only, one product per panel of V
    width = panel_width(40, Target.host().panel_width)
    assert kernels.count(f"b_panels={width}") == 1 + (-(-40 // width) if kind == "causal" else 1)
    expected = fn(q.double(), k.double(), v.double(), *(m.double() if m.is_floating_point() else m
                                                         for m in args[3:])).float()
    torch.testing.assert_close(cuvil.compile(fn)(*args), expected, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("seq", [5, 40])         # 40: K^T and V packed in panels at run time
def test_a_dynamic_head_dim_scales_by_its_runtime_size(seq):
    """With the head dim E dynamic, torch's default scale 1/sqrt(E) is known only at run time (its
    compile-time float once raised a bare TypeError)."""
    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    fast = cuvil.compile(f, dynamic=[{3: "e"}, {3: "e"}, {3: "e"}])
    for e in (8, 12, 3):
        q, k, v = (torch.randn(2, 3, seq, e) for _ in range(3))
        torch.testing.assert_close(fast(q, k, v), f(q, k, v))
    assert fast.num_variants == 1


KV = {"multi-query": (1, {}), "grouped-query": (2, {"enable_gqa": True})}


@pytest.mark.parametrize("kind", KV)
@pytest.mark.parametrize("extra", [{}, {"is_causal": True}, {"attn_mask": "mask"}])
def test_keys_and_values_with_fewer_heads(kind, extra):
    """Multi-query attention (one head of k and v, broadcast to q's four: Falcon) and grouped-query
    attention (enable_gqa: each of two k/v heads serves two of q's)."""
    heads, gqa = KV[kind]
    mask = torch.rand(1, 1, 12, 12) > 0.3
    kw = {**gqa, **({"attn_mask": mask} if extra.get("attn_mask") else extra)}

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **kw)

    q, k, v = torch.randn(2, 4, 12, 16), torch.randn(2, heads, 12, 16), torch.randn(2, heads, 12, 8)
    torch.testing.assert_close(cuvil.compile(f)(q, k, v), f(q, k, v))


def test_weights_below_the_smallest_normal_float_are_0():
    """Swin's masks add -100 across windows: exp(-100) is a denormal float (3.7e-44). Cuvil gives 0
    there (mathlib `exp_ftz`), as eager's flash-attention kernel did in Swin (its outputs there
    were exact zeros); here eager gives denormals, less than 2^-126 from Cuvil's 0. Before, a row
    of such weights over values of 0 (Swin's padding) gave denormal outputs, and the linear after
    it ran 75x slower. Softmax likewise."""
    q, k = torch.zeros(1, 1, 3, 4), torch.zeros(1, 1, 3, 4)
    v = torch.tensor([[[[1.0] * 4, [0.0] * 4, [0.0] * 4]]])
    mask = torch.tensor([[[[-100.0, 0.0, 0.0], [-90.0, 0.0, 0.0], [-50.0, 0.0, 0.0]]]])
    got = cuvil.compile(Attention(), cache=False)(q, k, v, mask)
    expected = Attention()(q, k, v, mask)
    assert torch.equal(got[..., :2, :], torch.zeros(1, 1, 2, 4))        # eager's too
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=2.0 ** -126)
    x = torch.tensor([[0.0, -50.0, -87.0, -90.0, -100.0, float("-inf")]])
    softmax = cuvil.compile(lambda x: (torch.softmax(x, -1), torch.log_softmax(x, -1)), cache=False)(x)
    torch.testing.assert_close(softmax[0], torch.tensor([[1.0, math.exp(-50), math.exp(-87), 0, 0, 0]]), rtol=1e-6, atol=0)
    assert not ((softmax[0] > 0) & (softmax[0] < 2.0 ** -126)).any()
    torch.testing.assert_close(softmax[1], torch.log_softmax(x, -1), rtol=0, atol=0)
