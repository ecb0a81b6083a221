"""Passes over the graph IR: the pass base class, registry, pipeline strings, pass manager and
instruments. Built-in passes live one per module and load on first use. See docs/passes.md."""
from .base import ModulePass, PassRecord
from .registry import (all_passes, all_pipelines, get_pass, register_pass, register_pipeline, unregister_pass)
from .pipeline import Pipeline, parse_pipeline
from .manager import PassManager
from .instruments import (ChangeDetector, DebugLog, Instrument, IRSnapshot, NumericCheck, PassTiming, PrintIR,
                          VerifyEach, WallTime, random_inputs)
from . import named_pipelines  # noqa: F401  (registers O0 to O3)

__all__ = [
    "ModulePass", "PassRecord", "all_passes", "all_pipelines", "get_pass", "register_pass", "register_pipeline",
    "unregister_pass", "Pipeline", "parse_pipeline", "PassManager", "Instrument", "ChangeDetector", "DebugLog",
    "IRSnapshot", "NumericCheck", "PassTiming", "PrintIR", "VerifyEach", "WallTime", "random_inputs",
]
