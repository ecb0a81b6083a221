"""Instruments: the one way to observe or steer the pass manager.

Hooks, in the order the manager calls them: `run_start` once, then per pass `should_run`,
`before`, (the pass), `after` or `after_failed` (or only `skipped`), and `run_end` once. `before` hooks run in list
order and `after` hooks in reverse, so instruments nest around the pass.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Sequence, TextIO

import torch

from ..errors import CuvilPassError, CuvilVerifyError
from ..ir.core import Module
from ..ir.types import sym
from .base import ModulePass, PassRecord
from .fingerprint import fingerprint


class Instrument:
    def run_start(self, module: Module, pipeline: str) -> None: ...

    def should_run(self, p: ModulePass, module: Module) -> bool:
        return True

    def before(self, p: ModulePass, module: Module) -> None: ...

    def after(self, p: ModulePass, module: Module, record: PassRecord) -> None: ...

    def after_failed(self, p: ModulePass, module: Module, error: BaseException) -> None: ...

    def skipped(self, p: ModulePass, module: Module, record: PassRecord) -> None:
        """Called instead of before/after when a pass does not run (`record.skipped` says why)."""

    def run_end(self, module: Module, records: list[PassRecord]) -> None: ...


def pass_error(p: ModulePass, message: str) -> CuvilPassError:
    err = CuvilPassError(f"pass '{p.spec()}' {message}")
    err.pass_name = p.name
    return err


# ----------------------------------------------------------------------------- always installed

class WallTime(Instrument):
    """Fills `record.time_s` (innermost, so it times the pass alone)."""

    def before(self, p, module):
        self._start = time.perf_counter()

    def after(self, p, module, record):
        record.time_s = time.perf_counter() - self._start


class ChangeDetector(Instrument):
    """Fills `record.changed` by comparing structural fingerprints before and after the pass.
    Instruments only observe, so the fingerprint after one pass is the one before the next."""

    def __init__(self):
        self._last: tuple | None = None

    def before(self, p, module):
        self._before = self._last if self._last is not None else fingerprint(module)

    def after(self, p, module, record):
        self._last = fingerprint(module)
        record.changed = self._last != self._before

    def after_failed(self, p, module, error):
        self._last = None


# ----------------------------------------------------------------------------- optional

def _print(module: Module) -> str:
    from ..ir.printer import print_module
    return print_module(module)


class IRSnapshot(Instrument):
    """Stores the IR text before and after every pass that runs in its record. The module is printed
    once at the start and again only after a pass that changed it (ChangeDetector, innermost, has
    set `record.changed` by the time `after` runs here)."""

    def run_start(self, module, pipeline):
        self._text: str | None = None

    def before(self, p, module):
        if self._text is None:
            self._text = _print(module)
        self._before = self._text

    def after(self, p, module, record):
        if record.changed:
            self._text = _print(module)
        record.ir_before, record.ir_after = self._before, self._text

    def after_failed(self, p, module, error):
        self._text = None


class PrintIR(Instrument):
    """Prints the IR to a stream (stderr by default) around passes, with mlir-opt's dump headers."""

    def __init__(self, before_all: bool = False, after_all: bool = False, after_change: bool = False,
                 stream: TextIO | None = None):
        self.before_all, self.after_all, self.after_change = before_all, after_all, after_change
        self.stream = stream

    def _dump(self, when: str, p: ModulePass, module: Module) -> None:
        out = self.stream or sys.stderr
        out.write(f"// -----// IR Dump {when} {p.spec()} //----- //\n{_print(module)}\n")
        out.flush()

    def before(self, p, module):
        if self.before_all:
            self._dump("Before", p, module)

    def after(self, p, module, record):
        if self.after_all or (self.after_change and record.changed):
            self._dump("After", p, module)


class VerifyEach(Instrument):
    """Verifies the input, then the IR after every pass that changed it; names the pass that broke it."""

    def run_start(self, module, pipeline):
        from ..ir.verifier import verify
        try:
            verify(module)
        except CuvilVerifyError as e:
            raise CuvilVerifyError(f"the input to the pipeline is invalid: {e.message}", e.op) from None

    def after(self, p, module, record):
        if not record.changed:
            return
        from ..ir.verifier import verify
        try:
            verify(module)
        except CuvilVerifyError as e:
            raise pass_error(p, f"left invalid IR: {e}") from None
        record.checks["verify"] = "ok"


class NumericCheck(Instrument):
    """Runs the module through the reference interpreter after every pass that changed it and compares
    with the input module's results; raises naming the first pass whose results differ beyond
    `rtol`/`atol` (as `torch.allclose`). Inputs are given, or random (floats ~ N(0,1), ints in
    [0, 4), bools) with every dynamic dim set to `symbol_values[name]`, else to 3 clamped into the
    symbol's range."""

    def __init__(self, inputs: Sequence[torch.Tensor] | None = None, rtol: float = 1e-5, atol: float = 1e-6,
                 seed: int = 0, symbol_values: dict[str, int] | None = None, function: str | None = None,
                 raise_on_mismatch: bool = True):
        self.given_inputs = list(inputs) if inputs is not None else None
        self.inputs: list[torch.Tensor] = []     # what the last run used
        self.rtol, self.atol, self.seed = rtol, atol, seed
        self.symbol_values = dict(symbol_values or {})
        self.function = function
        self.raise_on_mismatch = raise_on_mismatch
        self.first_failure: str | None = None

    def run_start(self, module, pipeline):
        self.first_failure = None
        self.inputs = self.given_inputs or random_inputs(module, self.function, self.seed, self.symbol_values)
        self._reference = self._evaluate(module)

    def _evaluate(self, module: Module) -> list[torch.Tensor]:
        from ..ir.interpreter import interpret
        out = interpret(module, *self.inputs, function=self.function)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    def after(self, p, module, record):
        if not record.changed:
            return
        problem, max_err = compare(self._reference, self._evaluate(module), self.rtol, self.atol)
        record.checks["numeric"] = {"max_abs_err": max_err, "ok": problem is None}
        if problem is None:
            return
        if self.first_failure is None:
            self.first_failure = p.name
        if self.raise_on_mismatch:
            raise pass_error(p, f"changed the results: {problem} (rtol={self.rtol}, atol={self.atol})")


def random_inputs(module: Module, function: str | None, seed: int,
                  symbol_values: dict[str, int]) -> list[torch.Tensor]:
    fn = module.functions[function] if function else module.main
    values = {name: symbol_values.get(name, min(max(lo, 3), hi)) for name, (lo, hi) in fn.symbols.items()}
    gen = torch.Generator().manual_seed(seed)
    out = []
    for arg in fn.args:
        shape = [_concrete(d, values) for d in arg.type.shape]
        dt = arg.type.dtype
        if dt.is_float:
            out.append(torch.randn(shape, generator=gen).to(dt.torch))
        elif dt.torch is torch.bool:
            out.append(torch.randint(0, 2, shape, generator=gen).bool())
        else:
            out.append(torch.randint(0, 4, shape, generator=gen, dtype=dt.torch))
    return out


def _concrete(d, values: dict[str, int]) -> int:
    if isinstance(d, int):
        return d
    missing = {s.name for s in d.free_symbols} - set(values)
    if missing:
        raise ValueError(f"no value for dynamic dim(s) {', '.join(sorted(missing))}; pass symbol_values")
    return int(d.subs({sym(k): v for k, v in values.items()}))


def compare(expected: list[torch.Tensor], actual: list[torch.Tensor], rtol: float, atol: float):
    """(None or a description of the first difference, the largest absolute error)."""
    if len(expected) != len(actual):
        return f"{len(actual)} results instead of {len(expected)}", float("inf")
    worst = 0.0
    for i, (e, a) in enumerate(zip(expected, actual)):
        if e.shape != a.shape or e.dtype != a.dtype:
            return (f"result {i} is {a.dtype} {list(a.shape)} instead of {e.dtype} {list(e.shape)}",
                    float("inf"))
        if not e.is_floating_point():
            if not torch.equal(e, a):
                return f"result {i} differs in {int((e != a).sum())} element(s)", float("inf")
            continue
        err = (e.double() - a.double()).abs().nan_to_num(nan=0.0)
        both_nan = e.isnan() & a.isnan()
        one_nan = e.isnan() ^ a.isnan()
        max_err = float(err.max()) if err.numel() else 0.0
        worst = max(worst, max_err)
        if one_nan.any():
            return f"result {i} has NaN in {int(one_nan.sum())} element(s) where the reference has not", worst
        if not torch.allclose(e[~both_nan], a[~both_nan], rtol=rtol, atol=atol):
            return f"result {i} differs by up to {max_err:.3g} (absolute)", worst
    return None, worst


class PassTiming(Instrument):
    """Prints a table of pass wall times at the end of the run (mlir-opt's --mlir-timing)."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream

    def run_end(self, module, records):
        out = self.stream or sys.stderr
        ran = [r for r in records if r.skipped is None]
        total = sum(r.time_s for r in ran)
        out.write("===" + "-" * 60 + "===\n")
        out.write("  Pass execution timing report\n")
        out.write("===" + "-" * 60 + "===\n")
        out.write(f"  Total: {total:.6f} s\n")
        out.write("   Wall time (s)   (%)  Pass\n")
        for r in records:
            if r.skipped is not None:
                out.write(f"        skipped          {r.spec}  ({r.skipped})\n")
                continue
            share = 100.0 * r.time_s / total if total > 0 else 0.0
            out.write(f"  {r.time_s:12.6f}  {share:5.1f}  {r.spec}\n")
        out.flush()


class DebugLog(Instrument):
    """One line per pass on stderr (CUVIL_DEBUG >= 1): spec, changed or skipped, time, statistics."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream

    def run_start(self, module, pipeline):
        self._write(f"[cuvil] pipeline: {pipeline}")

    def after(self, p, module, r):
        stats = "".join(f" {k}={v}" for k, v in r.statistics.items())
        self._write(f"[cuvil] pass {r.spec}: {'changed' if r.changed else 'unchanged'} "
                    f"{r.time_s * 1e3:.2f} ms{stats}")

    def skipped(self, p, module, r):
        self._write(f"[cuvil] pass {r.spec}: skipped ({r.skipped})")

    def after_failed(self, p, module, error):
        self._write(f"[cuvil] pass {p.spec()}: failed: {type(error).__name__}")

    def _write(self, line: str) -> None:
        out = self.stream or sys.stderr
        out.write(line + "\n")
        out.flush()


# ----------------------------------------------------------------------------- the debug knob

def debug_level() -> int:
    try:
        return int(os.environ.get("CUVIL_DEBUG", "0") or 0)
    except ValueError:
        return 0


def debug_instruments(level: int) -> list[Instrument]:
    """Instruments that CUVIL_DEBUG=level adds (see docs/passes.md)."""
    out: list[Instrument] = []
    if level >= 1:
        out.append(DebugLog())
    if level >= 2:
        out.append(VerifyEach())
    if level >= 5:
        out.append(PrintIR(after_all=True))
    elif level >= 4:
        out.append(PrintIR(after_change=True))
    return out
