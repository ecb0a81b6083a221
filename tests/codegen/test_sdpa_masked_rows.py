"""A fully masked attention row attends to nothing: eager PyTorch gives zeros there, so must Cuvil."""
import torch
import torch.nn.functional as F

import cuvil


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
