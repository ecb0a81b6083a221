"""Differential fuzzing of whole graphs: generated functions that chain elementwise ops with
broadcasting, views (transposes, reshapes, slices, selections), concatenations, reductions,
softmax, layer norm, running sums and matrix products, compiled at the default pipeline and at
O1, against eager PyTorch on the same inputs. What it aims at is the interplay no single-op test
reaches: fusion groups across views and broadcasts, reductions fused with their prologues,
layouts, buffers reused by the memory plan.

A failing seed prints its function; `program(seed)` gives it back, and
`CUVIL_FUZZ_SCALE=N` runs N times as many seeds (a longer, nightly search)."""
from __future__ import annotations

import functools
import random

import pytest
import torch
from conftest import SCALE

import cuvil
from cuvil.passes import Pipeline
from cuvil.runtime import get_num_threads, set_num_threads

SEEDS = 24 * SCALE
# odd sizes reach the vector loops' tails; 16 and 32 their whole vectors
SIZES = (1, 3, 5, 7, 8, 16, 17, 32)
O3_PASSES = [p.name for p in Pipeline.of("O3")]


class Program:
    """A function being generated: lines of Python over named values of known shapes."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.lines: list[str] = []
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.weights: dict[str, tuple[int, ...]] = {}

    def add(self, expr: str, shape: tuple[int, ...]) -> str:
        name = f"v{len(self.shapes)}"
        self.lines.append(f"{name} = {expr}")
        self.shapes[name] = shape
        return name

    def weight(self, shape: tuple[int, ...]) -> str:
        name = f"w{len(self.weights)}"
        self.weights[name] = shape
        return name

    def pick(self, rank: int | None = None) -> str:
        # the recent values more often: longer chains, more fusion
        names = [n for n, s in self.shapes.items() if rank is None or len(s) >= rank]
        return names[-1] if self.rng.random() < 0.5 else self.rng.choice(names)


UNARY = ["torch.relu({a})", "torch.sigmoid({a})", "torch.tanh({a})", "torch.exp({a}.clamp(-4, 4))", "-{a}",
         "{a}.abs()", "torch.sqrt({a}.abs() + 1)", "torch.nn.functional.gelu({a})", "torch.nn.functional.silu({a})",
         "{a} * {a}", "{a} * 0.5 + 0.25", "torch.log({a}.abs() + 0.5)", "{a}.clamp(-1, 1)", "torch.erf({a})",
         "{a}.masked_fill({a} > 0.5, -1.0)", "torch.floor({a} * 4) / 4", "({a} > 0).float() * {a}",
         "{a}.to(torch.int32).float() + {a}", "torch.flip({a}, [-1])", "torch.roll({a}, 1, -1)"]
BINARY = ["{a} + {b}", "{a} * {b}", "{a} - {b}", "torch.maximum({a}, {b})", "torch.where({a} > 0, {a}, {b})",
          "{a} / ({b}.abs() + 1)"]


def _static(d) -> bool:
    return isinstance(d, int)


def _times(a, b):
    """A dim's size times another's: a number, or the expression of a dynamic one (which only
    has to compare equal to itself)."""
    return a * b if _static(a) and _static(b) else f"({a})*({b})"


def _broadcast_partner(p: Program, shape: tuple) -> str:
    """A value that broadcasts to `shape`: another of that shape, or one reduced to size 1 along
    some dims (keepdim), or a weight vector of the last dim."""
    same = [n for n, s in p.shapes.items() if s == shape]
    r = p.rng.random()
    if r < 0.4:
        return p.rng.choice(same)
    if r < 0.6 and _static(shape[-1]):
        return p.weight((shape[-1],))
    dims = sorted(p.rng.sample(range(len(shape)), p.rng.randint(1, len(shape))))
    reduced = tuple(1 if d in dims else n for d, n in enumerate(shape))
    return p.add(f"{p.rng.choice(same)}.mean(dim={dims}, keepdim=True)", reduced)


def _step(p: Program) -> None:
    """One op on a value of rank >= 2 or a vector. A dynamic dim (its size a string in the shape)
    is never written as a number: no weight, slice, selection or narrowing needs its size."""
    rng = p.rng
    a = p.pick()
    s = p.shapes[a]
    kind = rng.random()
    if kind < 0.22:
        p.add(rng.choice(UNARY).format(a=a), s)
    elif kind < 0.40:
        b = _broadcast_partner(p, s)
        p.add(rng.choice(BINARY).format(a=a, b=b), s)
    elif kind < 0.50 and len(s) >= 2:                     # views
        choice = rng.randrange(5)
        if choice == 0:
            p.add(f"{a}.transpose(-1, -2)", s[:-2] + (s[-1], s[-2]))
        elif choice == 1 and _static(s[-1]) and s[-1] > 1:
            lo = rng.randrange(1, s[-1])
            p.add(f"{a}[..., {lo}:]", s[:-1] + (s[-1] - lo,))
        elif choice == 2:
            p.add(f"{a}.flatten(-2)", s[:-2] + (_times(s[-2], s[-1]),))
        elif choice == 3 and len(s) >= 3 and _static(s[0]):
            i = rng.randrange(s[0])
            p.add(f"{a}[{i}]", s[1:])
        elif choice == 3:
            p.add(f"{a}[..., ::2]", s[:-1] + ((s[-1] + 1) // 2 if _static(s[-1]) else f"half({s[-1]})",))
        else:
            p.add(f"{a}.unsqueeze(1).expand(-1, 2{', -1' * (len(s) - 1)})", (s[0], 2) + s[1:])
    elif kind < 0.58:                                      # reductions and normalisations
        d = rng.randrange(len(s))
        choice = rng.randrange(8)
        if choice == 0 and len(s) >= 2:
            p.add(f"{a}.sum(dim={d})", s[:d] + s[d + 1:])
        elif choice == 5:
            p.add(f"{a}.argmax(dim={d}, keepdim=True).float()", s[:d] + (1,) + s[d + 1:])
        elif choice == 6:
            p.add(rng.choice([f"torch.logsumexp({a}, dim={d}, keepdim=True)",
                              f"{a}.var(dim={d}, keepdim=True, correction=0)", f"{a}.norm(dim={d}, keepdim=True)"]),
                  s[:d] + (1,) + s[d + 1:])
        elif choice == 7 and _static(s[d]):
            rows = [rng.randrange(s[d]) for _ in range(rng.randint(1, 5))]
            p.add(f"{a}.index_select({d}, torch.tensor({rows}))", s[:d] + (len(rows),) + s[d + 1:])
        elif choice == 1:
            p.add(f"{a}.amax(dim={d}, keepdim=True)", s[:d] + (1,) + s[d + 1:])
        elif choice == 2:
            p.add(f"torch.softmax({a}, dim={d})", s)
        elif choice == 3 and _static(s[-1]):
            g, b = p.weight((s[-1],)), p.weight((s[-1],))
            p.add(f"torch.nn.functional.layer_norm({a}, ({s[-1]},), {g}, {b})", s)
        else:
            p.add(f"torch.cumsum({a}, dim={d})", s)
    elif kind < 0.63:                                      # sorting, gathers, scatters, integers
        d = rng.randrange(len(s))
        choice = rng.randrange(6)
        # Orders are not continuous: values a rounding apart sort either way. Sorted values are, and
        # so is a permutation that gathers and scatters back the same values.
        if choice == 0:
            p.add(f"torch.gather({a}, {d}, {a}.argsort(dim={d}))", s)
        elif choice == 1 and _static(s[-1]):
            k = rng.randint(1, s[-1])
            p.add(f"torch.topk({a}, {k}, dim=-1).values", s[:-1] + (k,))
        elif choice == 2 and all(map(_static, s)):      # (a scatter of a dynamic size is refused)
            order = f"{a}.argsort(dim={d})"
            p.add(f"torch.zeros_like({a}).scatter_add({d}, {order}, torch.gather({a} * 2, {d}, {order}))", s)
        elif choice == 3 and rng.random() < 0.3:
            p.add(f"({a} > 0).sum(dim={d}, keepdim=True).float()", s[:d] + (1,) + s[d + 1:])
        elif choice == 3:
            p.add(rng.choice([f"(({a} * 10).long() // 3).float()", f"torch.remainder({a}, 0.7)",
                              f"torch.fmod({a}, 0.7)"]), s)
        elif choice == 4:
            p.add(f"torch.pow({a}.abs() + 0.1, 1.5)", s)
        else:
            p.add(f"{a}.sort(dim={d}, descending=True).values", s)
    elif kind < 0.68:                                      # concatenation and splitting
        d = rng.randrange(len(s))
        same = [n for n, t in p.shapes.items() if t == s]
        cat = p.add(f"torch.cat([{a}, {rng.choice(same)}], dim={d})", s[:d] + (_times(2, s[d]),) + s[d + 1:])
        if rng.random() < 0.5 and _static(s[d]) and s[d] > 1:
            cut = rng.randrange(1, 2 * s[d])
            p.add(f"{cat}.narrow({d}, {cut // 2}, {2 * s[d] - cut})", s[:d] + (2 * s[d] - cut,) + s[d + 1:])
    elif kind < 0.85:                                      # matrix products
        n = rng.choice(SIZES[1:])
        if _static(s[-1]) and (rng.random() < 0.6 or len(s) < 2):
            w = p.weight((n, s[-1]))
            bias = p.weight((n,)) if rng.random() < 0.5 else None
            lin = p.add(f"torch.nn.functional.linear({a}, {w}" + (f", {bias})" if bias else ")"), s[:-1] + (n,))
            if len(s) >= 2 and len(p.lines) % 3 == 0:     # transposed, then elementwise: the linear's
                t = p.add(f"{lin}.transpose(-1, -2)", s[:-2] + (n, s[-2]))      # epilogue stores it so
                p.add(rng.choice(BINARY).format(a=t, b=_broadcast_partner(p, p.shapes[t])), p.shapes[t])
        elif len(s) >= 2:
            same = [m for m, t in p.shapes.items() if t == s]
            p.add(f"{a} @ {rng.choice(same)}.transpose(-1, -2)", s[:-1] + (s[-2],))
    elif kind < 0.90 and len(s) >= 3:                      # attention (fuse-attention's patterns)
        same = [m for m, t in p.shapes.items() if t == s]
        k, v = rng.choice(same), rng.choice(same)
        if rng.random() < 0.5:
            causal = rng.random() < 0.5
            p.add(f"torch.nn.functional.scaled_dot_product_attention({a}, {k}, {v}, is_causal={causal})", s)
        else:
            p.add(f"torch.softmax({a} @ {k}.transpose(-1, -2) * 0.25, dim=-1) @ {v}", s)
    else:                                                  # in-place updates of fresh values
        fresh = p.add(f"{a} * 1.5", s)
        p.lines.append(f"{fresh}.add_({_broadcast_partner(p, s)})")


def program(seed: int, dynamic: bool = False) -> tuple[str, dict[str, tuple[int, ...]], tuple[int, ...]]:
    """(the source of `f(x, y, <weights>)`, the weights' shapes, the inputs' shape) of one seed;
    `dynamic`: for inputs whose first dim is dynamic."""
    rng = random.Random(seed)
    p = Program(rng)
    shape = tuple(rng.choice(SIZES[1:]) for _ in range(rng.randint(2, 3)))
    if dynamic:
        shape = (rng.choice([3, 4, 5]),) + shape[1:]      # (2 halved is 1, which torch.export specialises)
    p.shapes["x"] = p.shapes["y"] = ("B",) + shape[1:] if dynamic else shape
    for _ in range(rng.randint(3, 9)):
        _step(p)
    last = list(p.shapes)[-1]
    outputs = [last] + ([p.pick()] if rng.random() < 0.4 else [])
    params = ", ".join(["x", "y", *p.weights])
    body = "\n".join("    " + line for line in p.lines)
    return f"def f({params}):\n{body}\n    return {', '.join(outputs)}\n", p.weights, shape


def _image_step(p: Program) -> None:
    """One op on images [batch, C, H, W]: convolutions (dense, strided, grouped, depthwise, 1x1),
    batch norm, pools, activations, residual adds, channel concatenation, channels-last permutes
    and upsampling. No literal batch size: the batch dim is dynamic."""
    rng = p.rng
    images = [n for n, s in p.shapes.items() if len(s) == 4]
    a = images[-1] if rng.random() < 0.5 else rng.choice(images)
    _, c, h, w = s = p.shapes[a]
    kind = rng.random()
    if kind < 0.35:
        k = rng.choice([1, 1, 3, 3, 5]) if min(h, w) >= 5 else rng.choice([1, 3])
        stride = rng.choice([1, 1, 2]) if min(h, w) > 2 * k else 1
        pad = rng.choice([0, k // 2])
        if min(h, w) + 2 * pad < k:
            k, stride, pad = 1, 1, 0
        out = rng.choice([c, 2 * c, 8, 16, 24])
        groups = rng.choice([g for g in (1, 1, 2, c) if c % g == 0 and out % g == 0])
        if groups == c and rng.random() < 0.7:
            out = c                                     # depthwise
        wt = p.weight((out, c // groups, k, k))
        bias = p.weight((out,)) if rng.random() < 0.6 else None
        ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        p.add(f"F.conv2d({a}, {wt}, {bias or 'None'}, stride={stride}, padding={pad}, groups={groups})",
              (s[0], out, ho, wo))
    elif kind < 0.45:
        mean, var, g, b = (p.weight((c,)) for _ in range(4))
        p.add(f"F.batch_norm({a}, {mean}, {var}.abs() + 0.5, {g}, {b}, False, 0.1, 1e-5)", s)
    elif kind < 0.6:
        p.add(rng.choice(["torch.relu({a})", "F.relu6({a})", "F.silu({a})", "F.gelu({a})", "torch.sigmoid({a}) * {a}",
                          "F.hardswish({a})", "{a} * 0.5 - 0.125"]).format(a=a), s)
    elif kind < 0.7 and min(h, w) >= 2:
        k = rng.choice([2, 3]) if min(h, w) >= 3 else 2
        pool = rng.choice(["max", "avg"])
        p.add(f"F.{pool}_pool2d({a}, {k}, stride=2)", (s[0], c, (h - k) // 2 + 1, (w - k) // 2 + 1))
    elif kind < 0.8:
        same = [n for n in images if p.shapes[n] == s and n != a]
        if same:
            p.add(f"{a} + {rng.choice(same)}", s)
        else:
            p.add(f"torch.cat([{a}, torch.relu({a})], dim=1)", (s[0], 2 * c, h, w))
    elif kind < 0.84:
        p.add(f"{a}.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2) * 2", s)
    elif kind < 0.88 and h * w <= 256:
        mode = rng.choice(["nearest", "bilinear"])
        p.add(f"F.interpolate({a}, scale_factor=2, mode='{mode}')", (s[0], c, 2 * h, 2 * w))
    elif kind < 0.94:
        choice = rng.randrange(6)
        if choice == 0 and min(h, w) > 1:
            mode = rng.choice(["reflect", "replicate", "constant"])
            p.add(f"F.pad({a}, (1, 0, 1, 1), mode='{mode}')", (s[0], c, h + 2, w + 1))
        elif choice == 1 and c % 4 == 0:
            p.add(f"F.pixel_shuffle({a}, 2)", (s[0], c // 4, 2 * h, 2 * w))
        elif choice == 2:
            wt = p.weight((c, rng.choice([4, 8]), 2, 2))
            p.add(f"F.conv_transpose2d({a}, {wt}, stride=2)", (s[0], p.weights[wt][1], 2 * h, 2 * w))
        elif choice == 3 and min(h, w) >= 5:
            wt = p.weight((8, c, 3, 3))
            p.add(f"F.conv2d({a}, {wt}, padding=2, dilation=2)", (s[0], 8, h, w))
        elif choice == 4 and c % 2 == 0:
            g, b = p.weight((c,)), p.weight((c,))
            p.add(f"F.group_norm({a}, 2, {g}, {b})", s)
        elif c % 2 == 0:                                # a channel shuffle (ShuffleNet)
            p.add(f"{a}.reshape(-1, 2, {c // 2}, {h}, {w}).transpose(1, 2).reshape(-1, {c}, {h}, {w})", s)
        else:
            p.add(f"F.adaptive_avg_pool2d({a}, (2, 2))", (s[0], c, 2, 2))
    else:
        same = [n for n in images if p.shapes[n] == s]
        p.add(f"torch.cat([{a}, {rng.choice(same)}], dim=1)", (s[0], 2 * c, h, w))


def image_program(seed: int) -> tuple[str, dict[str, tuple[int, ...]], tuple[int, ...]]:
    """(the source of `f(x, y, <weights>)`, the weights' shapes, the inputs' shape at batch 2) of
    one seed of images; the result pooled and classified, or the last image."""
    rng = random.Random(seed)
    p = Program(rng)
    shape = (2, rng.choice([1, 3, 4, 8, 16]), rng.choice([5, 8, 9, 16]), rng.choice([5, 8, 12, 16]))
    p.shapes["x"] = p.shapes["y"] = shape
    for _ in range(rng.randint(2, 7)):
        _image_step(p)
    last = list(p.shapes)[-1]
    if rng.random() < 0.5:
        classes = p.weight((10, p.shapes[last][1]))
        pool = rng.choice(["adaptive_avg_pool2d", "adaptive_max_pool2d"])    # global: a mean or amax
        last = p.add(f"F.linear(F.{pool}({last}, 1).flatten(1), {classes})", (2, 10))
    params = ", ".join(["x", "y", *p.weights])
    body = "\n".join("    " + line for line in p.lines)
    return f"def f({params}):\n{body}\n    return {last}\n", p.weights, shape


def build(seed: int, generate=program):
    source, weights, shape = generate(seed)
    scope = {"torch": torch, "F": torch.nn.functional}
    exec(compile(source, f"<graph fuzz seed {seed}>", "exec"), scope)
    g = torch.Generator().manual_seed(seed)
    values = {name: torch.randn(s, generator=g) * 0.5 for name, s in weights.items()}
    fn = scope["f"]

    def model(x, y):
        return fn(x, y, **values)
    x, y = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    return source, model, (x, y)


def assert_matches(got, expected, source: str) -> None:
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(expected), source
    for e, o in zip(expected, got):
        assert o.shape == e.shape and o.dtype == e.dtype, source
        scale = float(e.abs().max()) if e.numel() else 0.0
        torch.testing.assert_close(o, e, rtol=1e-4, atol=1e-4 * max(1.0, scale), msg=lambda m: f"{m}\n{source}")


@pytest.mark.parametrize("pipeline", ["O3", "O1", "O3 with passes off"])
@pytest.mark.parametrize("seed", range(SEEDS))
def test_generated_graph_matches_eager(seed, pipeline):
    source, model, inputs = build(seed)
    off = []
    if pipeline == "O3 with passes off":      # a seeded subset of O3's passes switched off
        rng = random.Random(seed)
        off = rng.sample(O3_PASSES, rng.randint(1, len(O3_PASSES)))
    with torch.no_grad():
        got = cuvil.compile(model, pipeline=pipeline.split()[0], disable_passes=off, cache=False)(*inputs)
        assert_matches(got, model(*inputs), f"{source}(passes off: {off})")


@pytest.mark.parametrize("seed", range(SEEDS))
def test_generated_graph_with_a_dynamic_dim_matches_eager(seed):
    # one compiled program for two sizes of the inputs' first dim: broadcasts, reductions,
    # concatenations and views of symbolic sizes, the guards binding the symbol per call
    source, model, (x, y) = build(seed, functools.partial(program, dynamic=True))
    compiled = cuvil.compile(model, dynamic={"x": {0: "n"}, "y": {0: "n"}}, cache=False)
    g = torch.Generator().manual_seed(seed + 1)
    bigger = [torch.randn((x.shape[0] + 2, *x.shape[1:]), generator=g) for _ in range(2)]
    with torch.no_grad():
        assert_matches(compiled(x, y), model(x, y), source)
        assert_matches(compiled(*bigger), model(*bigger), source)
    assert compiled.num_variants == 1, source


@pytest.mark.parametrize("seed", range(SEEDS))
def test_generated_image_graph_with_a_dynamic_batch_matches_eager(seed):
    # one compiled program for batches 2 and 3 (its guards bind the batch symbol per call), on one
    # thread and on two: the parallel loops split at other places
    source, model, (x, y) = build(seed, image_program)
    threads = get_num_threads()
    compiled = cuvil.compile(model, dynamic={"x": {0: "batch"}, "y": {0: "batch"}}, cache=False, threads=1)
    g = torch.Generator().manual_seed(seed + 1)
    x3, y3 = torch.randn((3, *x.shape[1:]), generator=g), torch.randn((3, *y.shape[1:]), generator=g)
    try:
        with torch.no_grad():
            assert_matches(compiled(x, y), model(x, y), source)
            assert_matches(compiled(x3, y3), model(x3, y3), source)
            compiled.set_threads(2)
            assert_matches(compiled(x3, y3), model(x3, y3), source)
    finally:
        set_num_threads(threads)
    assert compiled.num_variants == 1, source
