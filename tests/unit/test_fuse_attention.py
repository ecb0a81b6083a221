"""The `fuse-attention` pass (cuvil/passes/fuse_attention.py): attention written out op by op runs
as one `cuvil.sdpa`, and its results match eager PyTorch's written-out attention, NaN rows and all."""
import math

import pytest
import torch

import cuvil
from cuvil.zoo import CausalSelfAttention

torch.manual_seed(0)


def _stats(compiled) -> dict:
    return next(p["statistics"] for p in compiled.report.passes if p["name"] == "fuse-attention")


def _sdpa_lines(compiled) -> list[str]:
    return [line for line in compiled.report.output_ir.splitlines() if "cuvil.sdpa" in line]


def _heads(b, s, h=4, e=16):
    return [torch.randn(b, h, s, e) for _ in range(3)]


def test_causal_attention_written_out_is_one_causal_sdpa():
    model = CausalSelfAttention(64, 4).eval()
    x = torch.randn(2, 100, 64)     # 100 query rows: a whole tile of 64 and a part one
    compiled = cuvil.compile(model)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    assert _stats(compiled) == {"fused": 1, "causal": 1, "refused": {}}
    (line,) = _sdpa_lines(compiled)
    assert "is_causal = true" in line and "scale = 0.25" in line
    assert "cuvil.softmax" not in compiled.report.output_ir


def test_dynamic_sequence_keeps_the_mask_and_matches_at_each_size():
    # the mask is built from the sequence length at run time: not a constant, so an added mask
    model = CausalSelfAttention(32, 2).eval()
    compiled = cuvil.compile(model, dynamic={"x": {1: "seq"}})
    for s in (7, 64, 131):
        x = torch.randn(1, s, 32)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    assert _stats(compiled)["fused"] == 1 and _stats(compiled)["causal"] == 0


def test_a_row_masked_throughout_is_nan_as_in_eager():
    def attention(q, k, v, mask):
        return torch.softmax(q @ k.transpose(-2, -1) / 4.0 + mask, dim=-1) @ v

    q, k, v = _heads(1, 70)
    mask = torch.zeros(1, 1, 70, 70)
    mask[..., ::3] = -math.inf
    mask[..., 5, :] = -math.inf            # query 5 sees no key: softmax gives NaN
    compiled = cuvil.compile(attention)
    out, ref = compiled(q, k, v, mask), attention(q, k, v, mask)
    assert ref[..., 5, :].isnan().all()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5, equal_nan=True)
    (line,) = _sdpa_lines(compiled)
    assert 'masked_rows = "nan"' in line


@pytest.mark.parametrize("form", ["mul", "mul-left", "no-scale", "scaled-queries"])
def test_scale_forms(form):
    def attention(q, k, v):
        s = q @ k.transpose(-1, -2)
        if form == "mul":
            s = s * 0.3
        elif form == "mul-left":
            s = 0.3 * s
        elif form == "scaled-queries":
            s = (q * 0.3) @ k.transpose(-1, -2)
        return torch.softmax(s, dim=3) @ v

    q, k, v = _heads(2, 40)
    compiled = cuvil.compile(attention)
    torch.testing.assert_close(compiled(q, k, v), attention(q, k, v), rtol=1e-5, atol=1e-5)
    assert _stats(compiled)["fused"] == 1
    (line,) = _sdpa_lines(compiled)
    assert ("scale = 0.3" in line) == (form in ("mul", "mul-left"))


def test_weights_also_returned_are_not_fused():
    def attention(q, k, v):
        weights = torch.softmax(q @ k.transpose(-2, -1) * 0.25, dim=-1)
        return weights @ v, weights

    q, k, v = _heads(1, 20)
    compiled = cuvil.compile(attention)
    for got, want in zip(compiled(q, k, v), attention(q, k, v)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert _stats(compiled) == {"fused": 0, "causal": 0, "refused": {"probabilities-used-elsewhere": 1}}


def test_softmax_over_queries_is_not_attention():
    def not_attention(q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1), dim=-2) @ v

    q, k, v = _heads(1, 20)
    compiled = cuvil.compile(not_attention)
    torch.testing.assert_close(compiled(q, k, v), not_attention(q, k, v), rtol=1e-5, atol=1e-5)
    assert _stats(compiled)["refused"] == {"softmax-not-over-keys": 1}
    assert not _sdpa_lines(compiled)


def test_switched_off_leaves_the_ops_and_the_results():
    model = CausalSelfAttention(64, 4).eval()
    x = torch.randn(1, 128, 64)
    fused = cuvil.compile(model)
    plain = cuvil.compile(model, disable_passes=["fuse-attention"])
    torch.testing.assert_close(plain(x), fused(x), rtol=1e-5, atol=1e-5)
    assert "cuvil.softmax" in plain.report.output_ir and not _sdpa_lines(plain)


@pytest.mark.parametrize("L,S", [(64, 64), (100, 100), (200, 200), (48, 130), (130, 48)])
def test_causal_sdpa_skips_keys_past_each_tile(L, S):
    # the kernel computes scores only up to each tile's last query row (top-left causal alignment)
    def attention(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    q = torch.randn(2, 3, L, 32)
    k, v = torch.randn(2, 3, S, 32), torch.randn(2, 3, S, 24)
    compiled = cuvil.compile(attention)
    torch.testing.assert_close(compiled(q, k, v), attention(q, k, v), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fill,causal", [(torch.finfo(torch.float32).min, True), (-1e9, False)])
def test_a_constant_mask_is_causal_only_when_it_is_exactly_so(fill, causal):
    # Hugging Face fills the causal mask with the lowest float (weighing exactly 0, as -inf does);
    # -1e9 does not (a score of that size would still count), so that mask stays an added one
    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            mask = torch.full((q.shape[-2], k.shape[-2]), fill).triu(1)
            return torch.softmax(q @ k.transpose(-2, -1) * 0.25 + mask, dim=-1) @ v

    q, k, v = _heads(1, 96)
    compiled = cuvil.compile(Attention())
    torch.testing.assert_close(compiled(q, k, v), Attention()(q, k, v), rtol=1e-5, atol=1e-5)
    assert _stats(compiled)["causal"] == int(causal)


@pytest.mark.parametrize("kind", ["tril", "tril-but-one", "float"])
def test_torch_sdpa_with_a_constant_causal_mask_becomes_causal(kind):
    # Hugging Face's "sdpa" attention passes torch's sdpa a causal mask it built from sizes alone
    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
            if kind == "tril-but-one":
                keep[5, 2] = False
            mask = keep if kind != "float" else torch.zeros(keep.shape).masked_fill(~keep, -math.inf)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    q, k, v = _heads(2, 80)
    compiled = cuvil.compile(Attention())
    torch.testing.assert_close(compiled(q, k, v), Attention()(q, k, v), rtol=1e-5, atol=1e-5)
    (line,) = _sdpa_lines(compiled)
    assert ("is_causal = true" in line) == (kind != "tril-but-one")
    assert _stats(compiled) == {"fused": 0, "causal": int(kind != "tril-but-one"), "refused": {}}


@pytest.mark.parametrize("kind", ["ones", "zeros", "ones-but-one"])
def test_torch_sdpa_with_a_mask_that_changes_no_score_runs_without_it(kind):
    # Hugging Face's ViT passes torch's sdpa an all-true mask for unpadded inputs (canonicalize's
    # `sdpa_mask_noop`); a mask with one false stays
    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            if kind == "zeros":
                mask = torch.zeros(q.shape[-2], k.shape[-2])
            else:
                mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool)
                if kind == "ones-but-one":
                    mask[5, 2] = False
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    q, k, v = _heads(2, 80)
    compiled = cuvil.compile(Attention())
    torch.testing.assert_close(compiled(q, k, v), Attention()(q, k, v), rtol=1e-5, atol=1e-5)
    (line,) = _sdpa_lines(compiled)
    operands = line.split("cuvil.sdpa ")[1].split(" :")[0].split(" {")[0]
    assert operands.count("%") == (4 if kind == "ones-but-one" else 3), line


class NanoGPTAttention(torch.nn.Module):
    """nanoGPT's attention: a tril buffer, sliced to the sequence, masked_fill with -inf."""

    def __init__(self, fill=-math.inf):
        super().__init__()
        self.fill = fill
        self.register_buffer("bias", torch.tril(torch.ones(128, 128)).view(1, 1, 128, 128))

    def forward(self, q, k, v):
        T = q.shape[-2]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, self.fill)
        return torch.softmax(att, dim=-1) @ v


@pytest.mark.parametrize("fill,fused", [(-math.inf, True), (torch.finfo(torch.float32).min, False)])
def test_nanogpt_masked_fill(fill, fused):
    # a masked_fill with -inf is sdpa's bool mask (here the causal one); with the lowest float a
    # row masked throughout would be uniform, not NaN: left written out
    q, k, v = _heads(2, 100)
    model = NanoGPTAttention(fill)
    compiled = cuvil.compile(model)
    torch.testing.assert_close(compiled(q, k, v), model(q, k, v), rtol=1e-5, atol=1e-5)
    expected = {"fused": 1, "causal": 1, "refused": {}} if fused else \
        {"fused": 0, "causal": 0, "refused": {"mask-fill-not-minus-inf": 1}}
    assert _stats(compiled) == expected


@pytest.mark.parametrize("form", ["masked_fill", "where-keep"])
def test_a_bool_mask_given_at_run_time(form):
    def attention(q, k, v, m):
        s = q @ k.transpose(-2, -1) * 0.25
        s = s.masked_fill(m, -math.inf) if form == "masked_fill" else torch.where(m, s, -math.inf)
        return torch.softmax(s, dim=-1) @ v

    q, k, v = _heads(1, 50)
    m = torch.rand(1, 1, 50, 50) > 0.6
    m[..., 7, :] = form == "masked_fill"      # query 7 sees no key: NaN in both forms
    compiled = cuvil.compile(attention)
    out, ref = compiled(q, k, v, m), attention(q, k, v, m)
    assert ref[..., 7, :].isnan().all()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert _stats(compiled) == {"fused": 1, "causal": 0, "refused": {}}


@pytest.mark.parametrize("L", [10, 70])
def test_one_head_without_batch_dims(L):
    def attention(q, k, v):
        return torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), dim=-1) @ v

    q, k, v = torch.randn(L, 16), torch.randn(L, 16), torch.randn(L, 24)
    compiled = cuvil.compile(attention)
    torch.testing.assert_close(compiled(q, k, v), attention(q, k, v), rtol=1e-5, atol=1e-5)
    assert _stats(compiled)["fused"] == 1
