"""The pass manager: runs a pipeline over a module, checks preconditions, drives the instruments.

Preconditions are named conditions ("verified", "shapes-inferred"). The set that holds starts from
`assume` (what the caller knows of its input); an input that is not known to be verified is verified
before the first pass that requires it, unless a pass that ran before invalidated "verified". The set
grows by each pass's `provides` and shrinks by its `invalidates`. A pass whose `requires` are not
all in the set is refused with an error that names the pass, the missing condition and the passes
that provide it. Passes are expected to keep the IR valid (the VerifyEach instrument checks).
"""
from __future__ import annotations

import time
from typing import Iterable, Sequence

from ..errors import CuvilError, CuvilPipelineError
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
        self.graph_passes = [p for p in self.pipeline if p.stage == "graph"]
        self.program_passes = [p for p in self.pipeline if p.stage == "program"]
        late = next((p for p in self.pipeline.passes[len(self.graph_passes):] if p.stage == "graph"), None)
        if late is not None:
            raise CuvilPipelineError(
                f"pass '{late.name}' runs on graph IR but comes after '{self.program_passes[0].name}', which runs on "
                f"the program after lowering: put the program passes "
                f"({', '.join(p.name for p in self.program_passes)}) at the end of the pipeline")

    @property
    def spec(self) -> str:
        return str(self.pipeline)

    def run(self, module: Module) -> list[PassRecord]:
        """Run the graph passes (the program passes run later, on the lowered program)."""
        instruments = self.instruments + debug_instruments(debug_level()) + [ChangeDetector(), WallTime()]
        established = set(self.assume)
        lost: set[str] = set()          # conditions a pass that ran invalidated
        records: list[PassRecord] = []
        for inst in instruments:
            inst.run_start(module, self.spec)
        for p in self.graph_passes:
            record = PassRecord(p.name, p.options(), p.spec())
            records.append(record)
            record.skipped = self._skip_reason(p, module, instruments, established, lost)
            if record.skipped is not None:
                for inst in instruments:
                    inst.skipped(p, module, record)
                continue
            self._run_one(p, module, record, instruments)
            established |= p.provides
            established -= p.invalidates
            lost |= p.invalidates
        for inst in instruments:
            inst.run_end(module, records)
        return records

    def _skip_reason(self, p: ModulePass, module: Module, instruments: list[Instrument],
                     established: set[str], lost: set[str]) -> str | None:
        for inst in instruments:
            if not inst.should_run(p, module):
                return f"instrument {type(inst).__name__}"
        if "verified" in p.requires - established and "verified" not in lost:
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


    def run_program(self, draft) -> list[PassRecord]:
        """Run the program passes on `draft` (a `cuvil.program.ProgramDraft`), in pipeline order.
        Each record holds the draft's text before and after, like a graph pass's IR."""
        records = []
        for p in self.program_passes:
            record = PassRecord(p.name, p.options(), p.spec(), ir_before=draft.text(), stage="program")
            t = time.perf_counter()
            try:
                result = p.run_program(draft)
            except CuvilError:
                raise
            except Exception as e:
                raise pass_error(p, f"failed: {type(e).__name__}: {e}") from e
            record.time_s = time.perf_counter() - t
            if isinstance(result, dict):
                record.statistics.update(result)
            record.ir_after = draft.text()
            record.changed = record.ir_after != record.ir_before
            records.append(record)
        return records


def _how_to_establish(condition: str, pipeline: Pipeline, p: ModulePass) -> str:
    providers = [n for n in providers_of(condition) if n != p.name]
    if not providers:
        return f"no registered pass provides it; pass assume={{'{condition}'}} if the input satisfies it"
    return (f"run {' or '.join(repr(n) for n in providers)} earlier in the pipeline "
            f"(e.g. '{providers[0]},{p.spec()}'), or pass assume={{'{condition}'}} if the input satisfies it")
