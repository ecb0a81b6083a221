"""Run PyTorch OpInfo samples through Cuvil and compare with eager.

A sample (`SampleInput(input, args, kwargs)`) becomes a function of its tensors, with every other
argument baked in. All samples of one OpInfo (every tested dtype) are batched into one function:
one torch.export, one native compile, because exporting is the slow part (~0.5 s of fixed cost in
`run_decompositions`). If the batch does not go through, it is split by sample, then by dtype, so
that a refusal or a crash is pinned on the sample that causes it.

Each sample goes the whole way through `cuvil.compile`: `import_model` (torch.export, static
shapes), the O1 pipeline, native code, the native engine. The compile report's IR, before and after
the pipeline, is parsed back and run by the reference interpreter too. All three results are
compared with eager. Wrapping the `ATEN_TABLE` rows records which ones a batch used (and, through
the `Lowering` they get, the module's constants, which the printed IR leaves out).
"""
from __future__ import annotations

import functools
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable
from unittest import mock

import torch
import torch.utils._pytree as pytree

import cuvil
from cuvil.errors import CuvilError
from cuvil.frontend.aten_table import ATEN_TABLE
from cuvil.frontend.importer import op_name
from cuvil.ir import interpret, parse

from skips import Refusal, matching_refusal

MAX_SAMPLES = 8          # the first N samples of each (OpInfo, dtype): deterministic under the seed
SEED = 0
# Inductor's OpInfo test loosens torch.testing's fp32 default (1.3e-6, 1e-5) the same way
RTOL, ATOL = 1.3e-5, 1.5e-5
# A float result that misses those still passes when its error against an fp64 reference is at
# most FP64_FACTOR x eager's own (Dynamo's accuracy rule; reductions accumulate in another order)
FP64_FACTOR = 2.0


@functools.cache
def op_db() -> dict[str, object]:
    """OpInfo key (`name` or `name[variant]`) -> OpInfo; importing op_db takes ~10 s, so once."""
    from torch.testing._internal.common_methods_invocations import op_db as db
    return {opinfo_key(op): op for op in db}


def opinfo_key(op) -> str:
    return op.name + (f"[{op.variant_test_name}]" if op.variant_test_name else "")


def samples_of(op, dtype: torch.dtype) -> list:
    torch.manual_seed(SEED)
    return list(op.sample_inputs("cpu", dtype, requires_grad=False))[:MAX_SAMPLES]


# ----------------------------------------------------------------------------- wrapping samples


@dataclass
class Case:
    """One sample as a call on its tensors (other arguments baked in)."""
    dtype: torch.dtype
    index: int
    sample: object
    leaves: list
    spec: pytree.TreeSpec
    positions: list[int]                 # which leaves are tensors
    outputs: tuple[int, ...] | None      # which outputs of the op are compared (None: all)

    @staticmethod
    def of(dtype: torch.dtype, index: int, sample, outputs: tuple[int, ...] | None = None) -> "Case":
        leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
        positions = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        return Case(dtype, index, sample, leaves, spec, positions, outputs)

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [self.leaves[i] for i in self.positions]

    def call(self, op, tensors) -> list:
        leaves = list(self.leaves)
        for i, t in zip(self.positions, tensors):
            leaves[i] = t
        x, args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        outs = pytree.tree_leaves(op.op(x, *args, **kwargs))
        return outs if self.outputs is None else [outs[i] for i in self.outputs]

    def describe(self) -> str:
        shapes = [tuple(t.shape) for t in self.tensors]
        others = [x for i, x in enumerate(self.leaves) if i not in self.positions]
        return (f"{str(self.dtype).removeprefix('torch.')} sample {self.index} (tensors {shapes}, other args "
                f"{others}, kwargs {list(self.sample.kwargs)})")


def batched(op, cases: list[Case]) -> Callable:
    """One function of all the cases' tensors, returning all their outputs flat."""
    def fn(*tensors):
        outs, k = [], 0
        for c in cases:
            n = len(c.positions)
            outs += c.call(op, tensors[k:k + n])
            k += n
        return tuple(outs)
    return fn


# ----------------------------------------------------------------------------- running and comparing


@dataclass
class CuvilRun:
    """Cuvil's results for a batch: per path, the flat outputs; and the ATEN_TABLE rows it used."""
    results: dict[str, list[torch.Tensor]]
    rows: set[str]


def run_cuvil(fn: Callable, tensors: list[torch.Tensor]) -> CuvilRun:
    """`fn` takes only tensors, so they are the IR function's arguments too."""
    model = cuvil.compile(fn)
    with recording_rows() as seen:
        native = pytree.tree_leaves(model(*tensors))
    report = model.report

    # the importer's constants, and those the passes made (fold-constants' `folded.*`) in the
    # compiled copy of its module
    constants = {**seen.constants, **model.imported.module.constants}

    def interpreted(ir: str) -> list[torch.Tensor]:
        return interpret(parse(ir), *tensors, constants=constants)
    return CuvilRun({"interpreter (imported IR)": interpreted(report.input_ir),
                     "interpreter (after O1)": interpreted(report.output_ir), "native": native}, seen.rows)


@dataclass
class Seen:
    rows: set[str] = field(default_factory=set)
    constants: dict = field(default_factory=dict)


@contextmanager
def recording_rows():
    """The ATEN_TABLE rows the importer calls meanwhile, and the constants of the module it builds."""
    seen = Seen()

    def recorded(name, row):
        def call(L, *args):
            seen.rows.add(name)
            seen.constants = L.module.constants
            return row(L, *args)
        return call
    with mock.patch.dict(ATEN_TABLE, {t: recorded(op_name(t), row) for t, row in ATEN_TABLE.items()}):
        yield seen


def mismatch(actual, expected: torch.Tensor, ref64: Callable[[], torch.Tensor | None]) -> str | None:
    """Why `actual` does not match eager's `expected`, or None when it does."""
    if not isinstance(actual, torch.Tensor):
        return f"returned {type(actual).__name__}, eager a tensor"
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return f"{actual.dtype}{list(actual.shape)}, eager {expected.dtype}{list(expected.shape)}"
    if not expected.is_floating_point():
        return None if torch.equal(actual, expected) else _close_message(actual, expected, 0, 0)
    why = _close_message(actual, expected, RTOL, ATOL)
    if why is None:
        return None
    ref = ref64()
    if ref is None:
        return why
    if not torch.equal(actual.isnan(), expected.isnan()):
        return why + "\n(NaNs differ from eager's)"
    ok = ~expected.isnan()
    err, eager_err = _max_error(actual[ok], ref[ok]), _max_error(expected[ok], ref[ok])
    if err <= FP64_FACTOR * eager_err < float("inf"):
        return None
    return why + f"\n(against fp64: error {err:.3g} > {FP64_FACTOR} x eager's {eager_err:.3g})"


def _close_message(actual, expected, rtol, atol) -> str | None:
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
    except AssertionError as e:
        return str(e)
    return None


def _max_error(a: torch.Tensor, ref: torch.Tensor) -> float:
    if a.numel() == 0:
        return 0.0
    d = (a.double() - ref.double()).abs()
    d[a.isinf() & (a == ref)] = 0        # matching infinities are exact
    return d.max().item()


def fp64_reference(op, case: Case) -> list | None:
    """The case's outputs computed in float64 (None when the op has no float64 support or the
    sample has no float tensor to widen)."""
    if torch.float64 not in op.supported_dtypes("cpu") or not any(t.is_floating_point() for t in case.tensors):
        return None
    return case.call(op, [t.double() if t.is_floating_point() else t for t in case.tensors])


# ----------------------------------------------------------------------------- outcomes


@dataclass
class Outcome:
    case: Case
    status: str                          # "passed" | "refused" | "failed"
    detail: str = ""
    refusal: Refusal | None = None


@dataclass
class OpResult:
    key: str
    dtype: torch.dtype
    outcomes: list[Outcome] = field(default_factory=list)
    rows: set[str] = field(default_factory=set)        # the ATEN_TABLE rows its imports used

    def count(self, status: str) -> int:
        return sum(o.status == status for o in self.outcomes)

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == "failed"]


def run_opinfo(key: str, dtypes: tuple[torch.dtype, ...],
               outputs: tuple[int, ...] | None = None) -> dict[torch.dtype, OpResult]:
    """Every sample of OpInfo `key` in each of `dtypes` through Cuvil; `outputs` picks the op's
    outputs to compare."""
    op = op_db()[key]
    cases = [Case.of(dt, i, s, outputs) for dt in dtypes for i, s in enumerate(samples_of(op, dt))]
    results = {dt: OpResult(key, dt) for dt in dtypes}
    # a sample that fails usually fails in every dtype: split by sample first
    for outcome, rows in _run_batch(op, key, cases, [lambda c: c.index, lambda c: c.dtype]):
        results[outcome.case.dtype].outcomes.append(outcome)
        results[outcome.case.dtype].rows |= rows
    for r in results.values():
        r.outcomes.sort(key=lambda o: o.case.index)
    return results


def _run_batch(op, key: str, cases: list[Case], splits: list[Callable]) -> list[tuple[Outcome, set[str]]]:
    """Run `cases` as one batch; if that fails, again in the groups `splits[0]` makes, and so on."""
    eager = [c.call(op, [t.clone() for t in c.tensors]) for c in cases]
    before = [[t.clone() for t in c.tensors] for c in cases]
    try:
        run = run_cuvil(batched(op, cases), [t for c in cases for t in c.tensors])
    except Exception as e:  # noqa: BLE001 - judged below, once pinned on one sample
        while splits:
            groups: dict = {}
            for c in cases:
                groups.setdefault(splits[0](c), []).append(c)
            splits = splits[1:]
            if len(groups) > 1:
                return [o for g in groups.values() for o in _run_batch(op, key, g, splits)]
        return [(_refused_or_crashed(key, cases[0], e), set())]
    out, k = [], 0
    for c, e, b in zip(cases, eager, before):
        n = len(e)
        outcome = _judge(op, c, e, {path: r[k:k + n] for path, r in run.results.items()})
        if outcome.status == "passed" and not all(map(torch.equal, b, c.tensors)):
            outcome = Outcome(c, "failed", "Cuvil changed an input tensor")
        out.append((outcome, run.rows))
        k += n
    return out


def _judge(op, case: Case, eager: list, results: dict[str, list]) -> Outcome:
    ref64 = functools.cache(lambda: fp64_reference(op, case))
    problems = []
    for path, outs in results.items():
        if len(outs) != len(eager):
            problems.append(f"{path}: {len(outs)} outputs, eager {len(eager)}")
            continue
        for i, (a, e) in enumerate(zip(outs, eager)):
            why = mismatch(a, e, lambda i=i: None if ref64() is None else ref64()[i])
            if why:
                problems.append(f"{path}, output {i}: {why}")
    if problems:
        return Outcome(case, "failed", "wrong result:\n" + "\n".join(problems))
    return Outcome(case, "passed")


def _refused_or_crashed(key: str, case: Case, e: Exception) -> Outcome:
    if not isinstance(e, CuvilError):
        trace = "".join(traceback.format_exception(e, limit=-8))
        return Outcome(case, "failed", "crash (not a CuvilError):\n" + trace)
    entry = matching_refusal(key, case.dtype, str(e))
    if entry is None:
        return Outcome(case, "failed", f"refused with no skip entry: {type(e).__name__}: {e}")
    return Outcome(case, "refused", str(e), entry)


def refusal_of_first_sample(key: str, dtype: torch.dtype) -> str | None:
    """The CuvilError text for the first sample of `key` in `dtype` (None: Cuvil runs it)."""
    op = op_db()[key]
    case = Case.of(dtype, 0, samples_of(op, dtype)[0])
    try:
        run_cuvil(batched(op, [case]), case.tensors)
    except CuvilError as e:
        return str(e)
    return None
