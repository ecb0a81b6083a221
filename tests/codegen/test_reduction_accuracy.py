"""Accuracy of Cuvil's float reductions on long rows: sum, mean, var, softmax, layer_norm and a
variance written out as `mean((x - mean(x))**2)` (one fused kernel), over rows of 1 to 100,000
elements of data offset from zero, for 40 seeds each.

The rule (issue #3, DESIGN.md): a reduction's error against an fp64 reference may be at most twice
eager fp32's own error on the same input. The floor added to that bound is one fp32 ulp of the
result's largest magnitude: a sum or mean is rounded to fp32 at least once (a variance twice: the
sum of squares, then its quotient), so eager may be exact by luck where any order of summation
is off by that rounding. One plain vectorised loop (each of 32 or 64 lanes summing a share of the
row in turn) breaks the rule in 5 of these 6 cases; Cuvil sums in blocks added pairwise
(`llvm_emit.KernelEmitter._pairwise_sum`), and var and layer_norm shift the mean
(`reductions._shifted_mean`).

The same reductions down the columns of a matrix (its transpose reduced along rows: every input is
contiguous along the kept dim) run as column reductions (`reductions.ColumnLanes`): a plain sum
down each column breaks the rule too; Cuvil sums blocks of rows and adds the blocks compensated."""
import pytest
import torch
import torch.nn.functional as F

from cuvil.codegen.kernel_text import print_kernel
from cuvil.compiler import compile_module
from cuvil.ir import Builder, DType, Function, Module, TensorType, sym, verify

LENGTHS = [1, 2, 7, 100, 513, 4096, 30000, 100000]
SEEDS = range(40)
ROWS = 3
COLUMNS = 16        # the kept dim of the column cases: at least `reductions.MIN_LANES`
ULP = 2.0 ** -23


def _mean(b, x):
    return b("cuvil.mean", x, dims=[1], keepdim=True)


def _decomposed_var(b, x):
    d = b("cuvil.sub", x, _mean(b, x))
    return _mean(b, b("cuvil.mul", d, d))


def _eager_decomposed_var(x):
    d = x - x.mean(1, keepdim=True)
    return (d * d).mean(1, keepdim=True)


# name: (graph builder, eager function, shortest row, data = randn * scale + offset, constant rows too)
CASES = {
    "sum": (lambda b, x: b("cuvil.sum", x, dims=[1]), lambda x: x.sum(1), 1, (1.0, 100.0), True),
    "mean": (_mean, lambda x: x.mean(1, keepdim=True), 1, (1.0, 100.0), True),
    "var": (lambda b, x: b("cuvil.var", x, dims=[1]), lambda x: x.var(1), 2, (1.0, 100.0), False),
    "softmax": (lambda b, x: b("cuvil.softmax", x, dim=1), lambda x: torch.softmax(x, 1), 1, (4.0, 100.0), True),
    "layer_norm": (lambda b, x: b("cuvil.layer_norm", x, normalized_ndim=1), lambda x: F.layer_norm(x, x.shape[-1:]),
                   1, (1.0, 100.0), False),
    "decomposed_var": (_decomposed_var, _eager_decomposed_var, 1, (1.0, 100.0), False),
}


def compiled_case(build, columns=False):
    """The reduction of the rows of x ([rows, length]), or with `columns`, of the rows of x's
    transpose (x is [length, columns])."""
    if columns:
        fn = Function("forward", [TensorType(DType.f32, (sym("s1"), COLUMNS))], ["x"], {"s1": (0, max(LENGTHS))})
    else:
        fn = Function("forward", [TensorType(DType.f32, (sym("s0"), sym("s1")))], ["x"],
                      {"s0": (1, 8), "s1": (0, max(LENGTHS))})
    b = Builder(fn)
    x = b("cuvil.permute", fn.args[0], perm=[1, 0]) if columns else fn.args[0]
    b.create("cuvil.return", [build(b, x)])
    m = Module()
    m.add_function(fn)
    verify(m)
    return compile_module(m, pipeline="verify,fuse", cache=None, details=False)


def inputs(length, seed, scale, offset, constant, rows=ROWS):
    if seed == 0 and constant:      # a sequential fp32 sum of 0.1s drifts far from length * 0.1
        return torch.full((rows, length), 0.1)
    return torch.randn(rows, length, generator=torch.Generator().manual_seed(seed)) * scale + offset


@pytest.mark.parametrize("columns", [False, True], ids=["rows", "columns"])
@pytest.mark.parametrize("name", list(CASES))
def test_reduction_error_is_within_twice_eager_error(name, columns):
    build, eager_fn, shortest, (scale, offset), constant = CASES[name]
    compiled = compiled_case(build, columns)
    assert len(compiled.native.lowered) == 1            # the whole reduction is one kernel
    assert ("for col in" in print_kernel(compiled.native.lowered[0].kernel)) == columns
    failures, checked = [], 0
    for length in (n for n in LENGTHS if n >= shortest):
        for seed in SEEDS:
            x = inputs(length, seed, scale, offset, constant, COLUMNS if columns else ROWS)
            (out,) = compiled.native(x.T.contiguous() if columns else x)
            ref = eager_fn(x.double())
            eager_err = (eager_fn(x).double() - ref).abs().max().item()
            err = (out.double() - ref).abs().max().item()
            bound = 2 * eager_err + ULP * ref.abs().max().item()
            checked += 1
            if not err <= bound:
                failures.append(f"length {length} seed {seed}: error {err:.3g} > {bound:.3g} "
                                f"(eager's {eager_err:.3g})")
    assert checked >= 40 * 7
    assert not failures, f"{len(failures)} of {checked} inputs:\n" + "\n".join(failures[:10])



@pytest.mark.parametrize("columns", [False, True], ids=["rows", "columns"])
@pytest.mark.parametrize("name", ["sum", "mean", "var", "layer_norm"])
def test_empty_and_non_finite_rows_match_eager(name, columns):
    """The pairwise sum of an empty row is 0 (no blocks); the shifted mean of var and layer_norm
    reads no element of an empty row; inf and NaN, first in the row or not, propagate like eager's.
    So do a column reduction's blocks and compensated total (an inf - inf in it would be NaN)."""
    build, eager_fn, *_ = CASES[name]
    compiled = compiled_case(build, columns)
    rows = torch.randn(COLUMNS if columns else 5, 700, generator=torch.Generator().manual_seed(1)) + 100
    rows[0, 0], rows[1, 0], rows[2, 600], rows[3, 0], rows[3, 1] = float("inf"), float("nan"), -float("inf"), \
        float("inf"), -float("inf")
    for x in [rows] if name == "var" else [rows, rows[:, :0]]:     # (eager's var of nothing warns)
        (out,) = compiled.native(x.T.contiguous() if columns else x)
        eager, ref = eager_fn(x), eager_fn(x.double())
        finite = eager.isfinite()
        torch.testing.assert_close(out[~finite], eager[~finite], equal_nan=True)     # the same infs and NaNs
        if finite.any():        # and the rule above for the finite values
            eager_err = (eager.double() - ref)[finite].abs().max().item()
            err = (out.double() - ref)[finite].abs().max().item()
            assert err <= 2 * eager_err + ULP * ref[finite].abs().max().item(), (err, eager_err)
