"""The `layout` pass: the zoo CNNs in NHWC (O3) run by the interpreter and natively against eager
PyTorch, its statistics checked by hand against the models' structure, sinking through residual
adds and per-channel parameters, and the `layout` attribute's checks."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cuvil
from cuvil import zoo
from cuvil.compiler import compile_module
from cuvil.errors import CuvilError
from cuvil.ir import interpret, parse, verify
from cuvil.ir.ops.nn import TO_NCHW, TO_NHWC

O3_GRAPH = "verify,shape-infer,fold-constants,fold-batchnorm,layout,canonicalize{fold-constants=false},cse,dce"


@pytest.fixture(scope="module", autouse=True)
def _private_cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUVIL_CACHE_DIR", str(tmp_path_factory.mktemp("cuvil-cache")))
        yield


def layout_statistics(report) -> dict:
    return next(p["statistics"] for p in report.passes if p["name"] == "layout")


def conversions(module) -> list:
    return [op for op in module.main.ops if op.name == "cuvil.permute"
            and tuple(op.attrs["perm"]) in (TO_NCHW, TO_NHWC)]


@pytest.fixture(scope="module", params=["cnn", "resnet"])
def converted(request):
    entry = zoo.get(request.param)
    module = cuvil.import_model(entry.model, entry.example_inputs, dynamic=entry.dynamic,
                                ranges=entry.ranges).module
    return entry, compile_module(module, pipeline=O3_GRAPH, name=request.param, native=False), module


# The small CNN's RGB stem (16 output channels over 32 x 32) and its max pool stay NCHW: the stem
# is computed along the image rows (`columns`), and only the next convolution reads the pool, through
# its conversion, in its copy of the input. ResNet's stem converts: its first residual add reads it.
STAYING = {"cnn": {"conv2d": 1, "max_pool2d": 1}, "resnet": {}}


def test_every_conv_and_pool_runs_in_nhwc_but_a_narrow_stem_with_two_conversions_left(converted):
    entry, compilation, module = converted
    layers = list(entry.model.modules())
    staying = STAYING[entry.name]
    convs = sum(isinstance(m, nn.Conv2d) for m in layers) - staying.get("conv2d", 0)
    pools = sum(isinstance(m, (nn.MaxPool2d, nn.AdaptiveAvgPool2d)) for m in layers) + (entry.name == "resnet") \
        - staying.get("max_pool2d", 0)
    stats = layout_statistics(compilation.report)
    assert stats["converted"].get("conv2d") == convs
    assert sum(stats["converted"].values()) - convs == pools
    assert stats["kept"] == staying
    assert stats["weights-packed"] == convs
    # every converted convolution but a depthwise one gets its weight blocked in GEMM panels (depthwise: HWIO)
    assert stats["conv-panels"] == sum(isinstance(m, nn.Conv2d) and m.in_channels != m.groups for m in layers) \
        - staying.get("conv2d", 0)
    assert stats["conversions-left"] == 2
    images = [op for op in module.main.ops if op.name.endswith(("conv2d", "pool2d"))]
    kept = sum(staying.values())
    assert [op.attrs["layout"] for op in images[:kept]] == ["nchw"] * kept
    assert images[kept:] and all(op.attrs["layout"] == "nhwc" for op in images[kept:])
    # the conversion to NHWC (of the input, or of the stem's pool), and the global pool's back to
    # NCHW for the flatten
    left = conversions(module)
    assert [tuple(op.attrs["perm"]) for op in left] == [TO_NHWC, TO_NCHW]
    assert left[0].operands[0] is (images[1].result if staying else module.main.args[0])


def test_nhwc_graph_interprets_like_eager(converted):
    entry, _, module = converted
    for batch in (1, 3):
        inputs = entry.inputs(batch=batch)
        with torch.no_grad():
            eager = entry.model(*inputs)
        (out,) = interpret(module, *inputs)
        torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["cnn", "resnet"])
def test_o3_native_matches_eager_at_several_batch_sizes(name):
    entry = zoo.get(name)
    model = cuvil.compile(entry.model, dynamic=entry.dynamic, ranges=entry.ranges, pipeline="O3")
    for batch in (1, 2, 5):
        inputs = entry.inputs(batch=batch)
        with torch.no_grad():
            torch.testing.assert_close(model(*inputs), entry.model(*inputs), rtol=1e-4, atol=1e-5)
    assert layout_statistics(model.report)["converted"]["conv2d"] > 0


class ScaledResidual(nn.Module):
    """conv -> per-channel scale (a [C,1,1] parameter) -> + the block's input -> relu -> conv."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1)
        self.scale = nn.Parameter(torch.randn(8, 1, 1))
        self.conv2 = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.conv2(torch.relu(self.conv1(x) * self.scale + x))


def test_conversions_sink_through_broadcasts_and_residual_adds():
    torch.manual_seed(0)
    model = ScaledResidual().eval()
    x = torch.randn(2, 8, 6, 6)
    compiled = cuvil.compile(model, pipeline="O3")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    stats = layout_statistics(compiled.report)
    # mul (by the scale), add (of x, whose conversion is conv1's input one) and relu run in NHWC
    assert stats["sunk"] == 3
    assert stats["conversions-left"] == 2
    ops = [op.name for op in parse(compiled.report.output_ir).main.ops]
    assert ops.count("cuvil.permute") - 1 == 2   # the two conversions, and the scale's (a folded constant view)


def test_single_conv_function_is_converted_but_min_convs_can_keep_it():
    conv = nn.Conv2d(4, 4, 3).eval()
    x = torch.randn(1, 4, 8, 8)
    report = cuvil.explain(conv, x, pipeline="O3")
    assert layout_statistics(report)["converted"] == {"conv2d": 1}
    report = cuvil.explain(conv, x, pipeline="verify,shape-infer,layout{min-convs=2 panel-width=32}", native=False)
    assert layout_statistics(report) == {"converted": {}, "kept": {"conv2d": 1}, "weights-packed": 0,
                                         "conv-panels": 0, "linears-packed": 0, "matmuls-packed": 0, "panel-width": 32,
                                         "regions-converted": 0, "regions-kept": 0, "regions": [],
                                         "channels-last-views": 0, "lifted-through-views": 0, "conversions-inserted": 0,
                                         "sunk": 0, "hoisted": 0, "cancelled": 0, "conversions-left": 0}


def test_unknown_layout_is_a_verify_error_with_its_location():
    text = ('cuvil.func @f(%x: tensor<1x4x4x2xf32>) -> tensor<1x2x2x2xf32> {\n'
            '  %p = cuvil.max_pool2d %x {kernel = [2, 2], layout = "nchwc"} : '
            'tensor<1x4x4x2xf32> -> tensor<1x2x2x2xf32>\n'
            '  cuvil.return %p : tensor<1x2x2x2xf32>\n}\n')
    with pytest.raises(CuvilError) as e:
        verify(parse(text))
    assert "layout must be one of nchw, nhwc, got 'nchwc'" in str(e.value)
    assert ":2:" in str(e.value)


@pytest.mark.parametrize("pipeline", ["O2", "O3"])
def test_pool_over_a_direct_conv_in_one_kernel(pipeline):
    # both window ops reduce over kh and kw: the pool's loops enclose the conv's, so the lowering
    # renames the inner ones (the kernel verifier refused the shadowing before). The conv is a
    # direct one (a 1x1 per-channel one, padded); larger depthwise ones are library calls.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(8, 8, 1, padding=1, groups=8), nn.ReLU(), nn.MaxPool2d(2)).eval()
    x = torch.randn(2, 8, 16, 16)
    compiled = cuvil.compile(model, pipeline=pipeline)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
    (kernel,) = compiled.report.kernels
    assert "kh_1" in kernel["kernel_ir"]


def _depthwise_chain(count, channels=16, pool=False):
    layers = [m for _ in range(count) for m in (nn.Conv2d(channels, channels, 3, padding=1, groups=channels), nn.ReLU6())]
    return nn.Sequential(*layers, *([nn.MaxPool2d(2)] if pool else [])).eval()


class ChannelsLastDepthwise(nn.Module):
    """ConvNeXt's pattern: a depthwise convolution whose result the model itself permutes to
    channels last."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 7, padding=3, groups=16)

    def forward(self, x):
        return torch.relu(self.conv(x)).permute(0, 2, 3, 1)


@pytest.mark.parametrize("model, converted, left", [
    # alone between NCHW tensors, a depthwise convolution over a 56-wide image gains less in NHWC
    # than its two conversions cost (1.7x faster left in NCHW); three in a row pay for them
    (_depthwise_chain(1), False, 0), (_depthwise_chain(2), False, 0), (_depthwise_chain(3), True, 2),
    # a pool converts; so does a region that meets the model's own permute to channels last: the
    # conversion after it cancels that permute, and the one before it is the only one left
    (_depthwise_chain(1, pool=True), True, 2), (ChannelsLastDepthwise(), True, 1 - 1)])
def test_a_region_of_depthwise_convolutions_converts_where_it_pays(model, converted, left):
    torch.manual_seed(0)
    x = torch.randn(1, 16, 56, 56)
    compiled = cuvil.compile(model, cache=False)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    stats = layout_statistics(compiled.report)
    convs = sum(isinstance(m, nn.Conv2d) for m in model.modules())
    assert (stats["regions-converted"], stats["regions-kept"]) == ((1, 0) if converted else (0, 1))
    assert stats["converted" if converted else "kept"]["conv2d"] == convs
    assert stats["conversions-left"] == left     # (after, less before)
    (region,) = stats["regions"]
    assert region["layout"] == ("nhwc" if converted else "nchw") and len(region["ops"]) == convs + (
        isinstance(model, nn.Sequential) and isinstance(model[-1], nn.MaxPool2d))
    if isinstance(model, ChannelsLastDepthwise):
        assert region["why"] == "the model permutes its result to channels last"
    elif not any(isinstance(m, nn.MaxPool2d) for m in model.modules()):
        # 16x56x56 f32 is 0.2 MB: each convolution saves 97 us a MB, a conversion costs 111
        assert region["why"] == (f"NHWC would save {convs} depthwise convolution(s) ~{97 * 0.200704 * convs:.3g} us "
                                 f"for 2 conversion(s) of ~{111 * 2 * 0.200704:.3g} us")


def test_regions_are_decided_apart():
    # a dense convolution's region converts; a depthwise convolution that a softmax over the
    # flattened image separates from it is a region of its own, and stays in NCHW (a flatten and
    # unflatten alone are no separation: the views cancel)
    class TwoRegions(nn.Module):
        def __init__(self):
            super().__init__()
            self.dense = nn.Conv2d(16, 16, 3, padding=1)
            self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)

        def forward(self, x):
            y = torch.relu(self.dense(x))
            return self.dw(y.flatten(2).softmax(-1).unflatten(2, (56, 56)) + 1.0)

    model = TwoRegions().eval()
    x = torch.randn(1, 16, 56, 56)
    compiled = cuvil.compile(model, cache=False)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    stats = layout_statistics(compiled.report)
    assert (stats["regions-converted"], stats["regions-kept"]) == (1, 1)
    assert stats["converted"] == {"conv2d": 1} and stats["kept"] == {"conv2d": 1}


class MixFFN(nn.Module):
    """SegFormer's and PVTv2's feed-forward block: the tokens seen as an image for a depthwise
    convolution, `transpose(1, 2).reshape(B, C, H, W)`, and flattened back."""

    def __init__(self, dim=24, hidden=48, size=(6, 10)):
        super().__init__()
        self.size = size
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.dw = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden)

    def forward(self, x):
        y = self.fc1(x).transpose(1, 2).reshape(x.shape[0], -1, *self.size)
        return self.fc2(F.gelu(self.dw(y).flatten(2).transpose(1, 2)))


class ConformerConvolution(nn.Module):
    """A Conformer's convolution module: 1-d convolutions over the transposed sequence, a GLU
    and a batch norm between them, and the residual in token order."""

    def __init__(self, dim=16, kernel=7):
        super().__init__()
        self.pw1, self.pw2 = nn.Conv1d(dim, 2 * dim, 1), nn.Conv1d(dim, dim, 1)
        self.dw = nn.Conv1d(dim, dim, kernel, padding=kernel // 2, groups=dim)
        self.bn = nn.BatchNorm1d(dim)
        with torch.no_grad():
            self.bn.running_mean.normal_()
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        y = F.glu(self.pw1(x.transpose(1, 2)), dim=1)
        return x + self.pw2(F.silu(self.bn(self.dw(y)))).transpose(1, 2)


def compiled_at_batches(model, name: str, shape: tuple):
    """`model` compiled with a dynamic batch, checked against eager at batches 1 and 3."""
    compiled = cuvil.compile(model, dynamic={name: {0: "batch"}}, cache=False)
    with torch.no_grad():
        for batch in (1, 3):
            x = torch.randn(batch, *shape)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    return compiled


def test_token_views_around_a_depthwise_convolution_are_its_channels_last_layout():
    # the views become the model's own permutes from and to channels last, which the conversions
    # cancel: the convolution reads the first linear's tokens where they lie (in place: no padded
    # copy) and its result is the second's input as it stands; before, it ran in NCHW through two
    # transposing copies (the depthwise step 17x slower at 256 channels of 64 x 64)
    torch.manual_seed(0)
    compiled = compiled_at_batches(MixFFN().eval(), "x", (60, 24))
    stats = layout_statistics(compiled.report)
    assert (stats["channels-last-views"], stats["converted"], stats["cancelled"]) == (2, {"conv2d": 1}, 2)
    (region,) = stats["regions"]
    assert (region["layout"], region["why"]) == ("nhwc", "the model permutes its result to channels last")
    assert "cuvil.permute" not in compiled.report.output_ir
    (conv,) = [k for k in compiled.report.kernels if "conv2d" in k["name"]]
    assert "scratch" not in conv["kernel_ir"]


def test_a_conformer_convolution_module_runs_in_nhwc_from_its_input_to_its_output():
    # the batch norm folds into the depthwise convolution behind its squeeze; the GLU's slices, the
    # silu and the residual add move above the 1-d convolutions' squeezes, the conversions sink
    # through the slices, and the three convolutions are one region that reads the tokens and
    # writes the result in token order: no conversion is left (there were four)
    torch.manual_seed(0)
    model = ConformerConvolution().eval()
    x = torch.randn(2, 40, 16)
    compiled = cuvil.compile(model, cache=False)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    stats = layout_statistics(compiled.report)
    assert stats["channels-last-views"] == 2 and stats["lifted-through-views"] >= 5
    assert stats["converted"] == {"conv2d": 3} and stats["regions-converted"] == 1 and stats["conversions-left"] == 0
    assert next(p["statistics"] for p in compiled.report.passes if p["name"] == "fold-batchnorm")["folded"] == 1
    assert "cuvil.permute" not in compiled.report.output_ir


def test_a_1d_cnn_applies_its_activations_in_the_convolutions():
    # Conv1d, BatchNorm1d, ReLU, depthwise Conv1d, GELU, Conv1d: each activation after a squeeze
    # moves above it, so the chain is one NHWC region whose epilogues apply the activations
    model = nn.Sequential(nn.Conv1d(8, 16, 3, padding=1), nn.BatchNorm1d(16), nn.ReLU(),
                          nn.Conv1d(16, 16, 5, padding=2, groups=16), nn.GELU(), nn.Conv1d(16, 8, 1)).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        model[1].running_mean.normal_()
        model[1].running_var.uniform_(0.5, 2.0)
    compiled = compiled_at_batches(model, "input", (8, 50))
    stats = layout_statistics(compiled.report)
    assert stats["regions-converted"] == 1 and stats["conversions-left"] == 2     # the input's and the output's
    names = [k["name"] for k in compiled.report.kernels]
    assert sum("conv2d" in n for n in names) == 3 and not any("relu" in n and "conv2d" not in n for n in names)
    assert any("conv2d_gelu" in n for n in names)


def test_a_transpose_after_a_lifted_activation_is_the_output_in_channels_last():
    # Whisper's encoder stem: gelu(conv(x)).permute(0, 2, 1). Once the GELU moves above the squeeze
    # the transpose reads the squeeze, and becomes the model's own permute to channels last: only
    # the input's conversion is left
    class Stem(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv1d(8, 16, 3, padding=1), nn.Conv1d(16, 16, 3, stride=2, padding=1)

        def forward(self, x):
            return F.gelu(self.conv2(F.gelu(self.conv1(x)))).permute(0, 2, 1)

    torch.manual_seed(0)
    model = Stem().eval()
    compiled = compiled_at_batches(model, "x", (8, 40))
    stats = layout_statistics(compiled.report)
    assert (stats["channels-last-views"], stats["lifted-through-views"], stats["conversions-left"]) == (1, 2, 1)


@pytest.mark.parametrize("shape, perm, view, moved", [
    ((2, 12, 8), (0, 2, 1), (2, 8, 3, 4), 1),         # tokens -> image: the token dim splits
    ((2, 12, 8), (0, 2, 1), (2, 8, 1, 12), 1),        # a 1-d convolution's row of height 1
    ((2, 12, 8), (0, 2, 1), (2, 4, 2, 12), 1),        # the channels split: a permute of another kind
    ((2, 3, 4, 5), (0, 3, 1, 2), (2, 5, 12, 1), 0),   # a merge: no split, left alone
])
def test_moving_a_permute_past_a_view_keeps_every_element(shape, perm, view, moved):
    # the rewrite next to a convolution, over views that split dims and one that does not: the
    # result equals eager's, whichever order the permute and the view end up in
    class Viewed(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(view[1], view[1], 1)

        def forward(self, x):
            return self.conv(x.permute(*perm).reshape(view))

    torch.manual_seed(0)
    model, x = Viewed().eval(), torch.randn(*shape)
    compiled = cuvil.compile(model, cache=False)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    assert layout_statistics(compiled.report)["channels-last-views"] == moved
