"""Alias views (`lower.alias_base`): a reshape, squeeze or unsqueeze of a value in memory that a
gather or a GEMM reads from memory gets no copy kernel; its readers take the operand's buffer at
the view's shape. Compared with eager, with the kernels each compile made."""
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cuvil


@pytest.fixture(scope="module", autouse=True)
def _private_cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUVIL_CACHE_DIR", str(tmp_path_factory.mktemp("cuvil-cache")))
        yield


def copies(compiled) -> list[str]:
    """The kernels that only copy a value to another shape."""
    return [k["name"] for k in compiled.report.kernels if re.search(r"_\d+_(reshape|squeeze|unsqueeze)$", k["name"])]


class RowsOfHidden(nn.Module):
    """A mixture of experts' dispatch, a pooler's last tokens: rows of a flattened hidden state,
    of the input itself, and of a weight viewed as a table."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.table = nn.Parameter(torch.randn(4, 6, 8))

    def forward(self, x, rows, ids):
        h = torch.relu(self.proj(x))
        picked = h.view(-1, 16)[rows] * 2
        raw = x.reshape(-1, 16)[rows]
        emb = F.embedding(ids, self.table.view(-1, 8))
        return picked, raw, emb, h.sum()


def test_rows_of_a_reshaped_value_are_read_from_its_own_buffer():
    model = RowsOfHidden().eval()
    compiled = cuvil.compile(model, dynamic=[{0: "b"}, {0: "r"}, None])
    with torch.no_grad():
        for b in (2, 5):
            x = torch.randn(b, 7, 16)
            rows = torch.tensor([0, b * 7 - 1, 3, -2])
            ids = torch.tensor([[0, 23], [5, 11]])
            for got, want in zip(compiled(x, rows, ids), model(x, rows, ids)):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert compiled.num_variants == 1
        assert copies(compiled) == []
        with pytest.raises(IndexError):         # the table's rows counted at the view's shape
            compiled(torch.randn(2, 7, 16), torch.tensor([14]), ids)


def test_grid_sample_reads_its_input_without_a_copy():
    x = torch.randn(2, 3, 9, 11)
    grid = torch.rand(2, 5, 7, 2) * 2.2 - 1.1
    for mode in ("bilinear", "nearest"):
        def f(x, g):
            return F.grid_sample(x, g, mode=mode, align_corners=False)
        compiled = cuvil.compile(f)
        torch.testing.assert_close(compiled(x, grid), f(x, grid), rtol=1e-5, atol=1e-6)
        assert copies(compiled) == []


def test_a_returned_view_still_gets_its_own_buffer():
    def f(x, idx):
        flat = x.reshape(-1)
        return flat, flat[idx]
    x, idx = torch.randn(3, 4), torch.tensor([11, 0])
    flat, picked = cuvil.compile(f)(x, idx)
    torch.testing.assert_close(picked, x.reshape(-1)[idx])
    torch.testing.assert_close(flat, x.reshape(-1))
    assert flat.data_ptr() != x.data_ptr()
