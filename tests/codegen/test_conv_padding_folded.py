"""A zero pad in front of a convolution (TensorFlow's "same" padding: 0 before, 1 after, as Hugging
Face's MobileNets and EfficientNets write it) folds into the convolution's padding, asymmetric
where it is (`padding_high`), and every convolution algorithm gets the zeros after the image
right: checked against eager through the whole compile, with the layout pass as O3 has it, with
every image op in NHWC, and without it."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cuvil
from cuvil.codegen.library import conv_algorithm
from cuvil.ir.parser import parse
from cuvil.passes.pipeline import Pipeline


class PaddedConv(nn.Module):
    def __init__(self, pad, conv):
        super().__init__()
        self.pad, self.conv = pad, conv

    def forward(self, x):
        return torch.relu(self.conv(F.pad(torch.relu(x), self.pad)))


# (pad (left, right, top, bottom), conv, input size): the algorithm each one gets in NHWC
CASES = {
    "implicit": ((0, 1, 0, 1), nn.Conv2d(16, 24, 3, stride=2), (2, 16, 12, 12)),
    "implicit_1x1": ((1, 0, 2, 1), nn.Conv2d(16, 8, 1), (1, 16, 7, 9)),
    "depthwise_in_place": ((0, 1, 0, 1), nn.Conv2d(32, 32, 3, stride=2, groups=32), (1, 32, 16, 16)),
    "depthwise_copied": ((2, 3, 3, 2), nn.Conv2d(16, 16, 7, groups=16, padding=1), (1, 16, 9, 9)),
    "small_window": ((0, 1, 1, 0), nn.Conv2d(4, 6, 2), (2, 4, 9, 8)),
}


def _model(name):
    torch.manual_seed(0)
    pad, conv, size = CASES[name]
    return PaddedConv(pad, conv).eval(), torch.randn(size)


def _convert_all() -> str:
    """O3 with every image op in NHWC: these small depthwise convolutions alone stay in NCHW in O3
    (the layout pass's cost model), and their in-place NHWC kernel would go untested."""
    return Pipeline(tuple(dataclasses.replace(p, convert_all=True) if p.name == "layout" else p
                          for p in Pipeline.of("O3"))).spec()


LAYOUTS = {"O3": {}, "all-nhwc": {"pipeline": _convert_all()}, "nchw": {"disable_passes": ["layout"]}}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_padded_convolutions_match_eager(name, layout):
    model, x = _model(name)
    compiled = cuvil.compile(model, cache=False, **LAYOUTS[layout])
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    ir = compiled.report.output_ir
    assert "cuvil.pad" not in ir and "padding" in ir


@pytest.mark.parametrize("disable, expected", [
    ([], {"implicit": "implicit", "implicit_1x1": "implicit", "depthwise_in_place": "depthwise",
          "depthwise_copied": "depthwise", "small_window": "implicit"}),
    # in NCHW; a padded 1x1 convolution is not the plain GEMM of an unpadded one
    (["layout"], {"implicit": "im2col", "implicit_1x1": "direct", "depthwise_in_place": "depthwise",
                  "depthwise_copied": "depthwise", "small_window": "direct"})])
def test_each_algorithm_is_covered(disable, expected):
    chosen = {}
    for name in CASES:
        model, x = _model(name)
        compiled = cuvil.compile(model, disable_passes=disable, cache=False)
        compiled.compile_for(x)
        fn = next(iter(parse(compiled.report.output_ir).functions.values()))
        (chosen[name],) = [conv_algorithm(op) for op in fn.ops if op.name == "cuvil.conv2d"]
    assert chosen == expected
