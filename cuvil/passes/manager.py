"""The pass manager: runs a pipeline over a module, checks preconditions, drives the instruments.

Preconditions are named conditions ("verified", "shapes-inferred"). The set that holds starts from
`assume` (what the caller knows of its input); an input that is not known to be verified is verified
before the first pass that requires it, if no pass ran before. The set
grows by each pass's `provides` and shrinks by its `invalidates`. A pass whose `requires` are not
all in the set is refused with an error that names the pass, the missing condition and the passes
that provide it. Passes are expected to keep the IR valid (the VerifyEach instrument checks).
"""
from __future__ import annotations

from typing import Iterable, Sequence

from ..errors import CuvilError
from ..ir.core import Module
from ..ir.verifier import verify
from .base import ModulePass, PassRecord
from .instruments import ChangeDetector, Instrument, WallTime, debug_instruments, debug_level, pass_error
from .pipeline import Pipeline
from .registry import providers_of


class PassManager:
    """`PassManager("canonicalize,cse", instruments=[VerifyEach()]).run(module) -> [PassRecord]`.

    WallTime and ChangeDetector are always installed, innermost; `CUVIL_DEBUG` adds more
    (docs/passes.md). `assume` lists the conditions that hold for the input module.
    """

    def __init__(self, pipeline: Pipeline | str | Iterable[ModulePass | str],
                 instruments: Sequence[Instrument] = (), assume: Iterable[str] = ()):
        self.pipeline = Pipeline.of(pipeline)
        self.instruments = list(instruments)
        self.assume = frozenset(assume)

    @property
    def spec(self) -> str:
        return str(self.pipeline)

    def run(self, module: Module) -> list[PassRecord]:
        instruments = self.instruments + debug_instruments(debug_level()) + [ChangeDetector(), WallTime()]
        established = set(self.assume)
        records: list[PassRecord] = []
        for inst in instruments:
            inst.run_start(module, self.spec)
        for p in self.pipeline:
            record = PassRecord(p.name, p.options(), p.spec())
            records.append(record)
            record.skipped = self._skip_reason(p, module, instruments, established, records[:-1])
            if record.skipped is not None:
                for inst in instruments:
                    inst.skipped(p, module, record)
                continue
            self._run_one(p, module, record, instruments)
            established |= p.provides
            established -= p.invalidates
        for inst in instruments:
            inst.run_end(module, records)
        return records

    def _skip_reason(self, p: ModulePass, module: Module, instruments: list[Instrument],
                     established: set[str], records: list[PassRecord]) -> str | None:
        for inst in instruments:
            if not inst.should_run(p, module):
                return f"instrument {type(inst).__name__}"
        if "verified" in p.requires - established and all(r.skipped for r in records):
            verify(module)   # like mlir-opt, an unverified input is verified before the first pass needing it
            established.add("verified")
        missing = sorted(p.requires - established)
        if missing:
            raise pass_error(p, f"requires '{missing[0]}', which does not hold here: "
                                f"{_how_to_establish(missing[0], self.pipeline, p)}")
        if not p.when(module):
            return "when=False"
        return None

    @staticmethod
    def _run_one(p: ModulePass, module: Module, record: PassRecord, instruments: list[Instrument]) -> None:
        for inst in instruments:
            inst.before(p, module)
        try:
            result = p.run(module)
        except Exception as e:
            for inst in reversed(instruments):
                inst.after_failed(p, module, e)
            if isinstance(e, CuvilError):
                raise
            raise pass_error(p, f"failed: {type(e).__name__}: {e}") from e
        if isinstance(result, dict):
            record.statistics.update(result)
        for inst in reversed(instruments):
            inst.after(p, module, record)
        if result is False and record.changed:
            raise pass_error(p, "reported no change but changed the IR (its run() returned False)")


def _how_to_establish(condition: str, pipeline: Pipeline, p: ModulePass) -> str:
    providers = [n for n in providers_of(condition) if n != p.name]
    if not providers:
        return f"no registered pass provides it; pass assume={{'{condition}'}} if the input satisfies it"
    return (f"run {' or '.join(repr(n) for n in providers)} earlier in the pipeline "
            f"(e.g. '{providers[0]},{p.spec()}'), or pass assume={{'{condition}'}} if the input satisfies it")
