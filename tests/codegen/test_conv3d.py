"""3-d convolution and pooling (`aten_table.conv3d`, `max_pool3d`, `avg_pool3d`,
`adaptive_avg_pool3d`): their 2-d counterparts over every output depth's input slices, one per
depth tap of the window, against eager torch."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cuvil


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class Video(nn.Module):
    """A small 3-d CNN: convolutions with batch norm, both pools, global pooling, a classifier."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv3d(3, 8, 3, padding=1), nn.BatchNorm3d(8), nn.ReLU(), nn.MaxPool3d((1, 2, 2)),
            nn.Conv3d(8, 16, 3, stride=(1, 2, 2), padding=1, bias=False), nn.BatchNorm3d(16), nn.ReLU(),
            nn.AvgPool3d(2), nn.AdaptiveAvgPool3d(1))
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        return self.fc(self.features(x).flatten(1))


def test_a_video_cnn_with_dynamic_batch_and_depth():
    model = Video().eval()
    with torch.no_grad():
        for bn in (model.features[1], model.features[5]):
            bn.running_mean.copy_(rand(bn.num_features, seed=1) * 0.1)
            bn.running_var.copy_(rand(bn.num_features, seed=2).abs() + 0.5)
    compiled = cuvil.compile(model, dynamic={"x": {0: "batch", 2: "depth"}}, ranges={"depth": (4, 64)})
    for batch, depth in ((2, 8), (1, 6), (3, 11)):
        x = rand(batch, 3, depth, 16, 16, seed=batch)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    assert compiled.num_variants == 1


@pytest.mark.parametrize("kw", [
    dict(stride=(2, 1, 2), padding=(1, 0, 2)),
    dict(dilation=(2, 1, 1), padding=2, groups=2),
    dict(stride=2, bias=False),
])
def test_convolutions_with_strides_padding_dilation_and_groups(kw):
    bias = kw.pop("bias", True)
    groups = kw.get("groups", 1)
    w, b = rand(6, 4 // groups, 3, 2, 3, seed=3), rand(6, seed=4) if bias else None
    x = rand(2, 4, 7, 9, 8, seed=5)
    compiled = cuvil.compile(lambda x: F.conv3d(x, w, b, **kw))
    torch.testing.assert_close(compiled(x), F.conv3d(x, w, b, **kw), rtol=1e-4, atol=1e-5)
    # an unbatched volume is a batch of one
    torch.testing.assert_close(cuvil.compile(lambda x: F.conv3d(x, w, b, **kw))(x[0]), F.conv3d(x[0], w, b, **kw),
                               rtol=1e-4, atol=1e-5)


def test_pools_with_padding_ceil_mode_and_uncounted_padding():
    x = rand(2, 3, 7, 9, 10, seed=6)
    x[0, 0, 3, 4, 5] = float("nan")
    cases = [
        lambda x: F.max_pool3d(x, 3, stride=2, padding=1, ceil_mode=True),
        lambda x: F.max_pool3d(x, (2, 3, 3), stride=(1, 2, 2), dilation=(2, 1, 1)),
        lambda x: F.avg_pool3d(x, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
        lambda x: F.avg_pool3d(x, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=True),
        lambda x: F.avg_pool3d(x, 2, divisor_override=3),
        lambda x: F.adaptive_avg_pool3d(x, (3, 2, 4)),
    ]
    for fn in cases:
        torch.testing.assert_close(cuvil.compile(fn)(x), fn(x), rtol=1e-5, atol=1e-6, equal_nan=True)


def test_the_rows_decompositions_reach():
    # what max_pool3d and adaptive_avg_pool3d become when torch.export decomposes a model
    x = rand(2, 3, 6, 7, 8, seed=7)
    pooled = cuvil.compile(lambda x: torch.ops.aten.max_pool3d_with_indices(x, [3, 2, 3], [2, 2, 1], [1, 0, 1])[0])
    torch.testing.assert_close(pooled(x), F.max_pool3d(x, (3, 2, 3), (2, 2, 1), (1, 0, 1)))
    adaptive = cuvil.compile(lambda x: torch.ops.aten._adaptive_avg_pool3d(x, [4, 3, 5]))
    torch.testing.assert_close(adaptive(x), F.adaptive_avg_pool3d(x, (4, 3, 5)), rtol=1e-5, atol=1e-6)
