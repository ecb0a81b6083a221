"""Cuvil: a compiler and native runtime for PyTorch inference that shows everything it does.

    import cuvil
    result = cuvil.import_model(model, (x,), dynamic={"x": {0: "batch"}})   # graph IR
    report = cuvil.explain(model, x)                                         # every pass, before/after
    fast = cuvil.compile(model, dynamic={"x": {0: "batch"}})                 # native code, GIL released
    fast.save("model.cuvil"); cuvil.load("model.cuvil")                      # no recompiling
"""
__version__ = "0.1.0"

from .errors import (CuvilError, CuvilIndexError, CuvilParseError, CuvilPassError, CuvilPipelineError, CuvilUnsupportedOpError,
                     CuvilVerifyError)
from .ir import Module, custom_op, interpret, parse, print_module, verify
from .frontend import import_model
from .passes import ModulePass, PassManager, Pipeline, register_pass, register_pipeline
from .report import CompileReport
from .explain import explain
from .compiled import CompiledModel, compile
from .saved import SavedModel, load

__all__ = [
    "CuvilError", "CuvilIndexError", "CuvilParseError", "CuvilPassError", "CuvilPipelineError", "CuvilUnsupportedOpError",
    "CuvilVerifyError", "Module", "custom_op", "interpret", "parse", "print_module", "verify", "import_model",
    "ModulePass", "PassManager", "Pipeline", "register_pass", "register_pipeline", "CompileReport", "explain",
    "compile", "CompiledModel", "load", "SavedModel",
]
