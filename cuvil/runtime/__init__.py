"""Python side of the native runtime: JIT modules, programs, and running them (`cuvil._native`)."""
from cuvil._native import ProgramError, RunError, get_num_threads, set_num_threads
from cuvil.runtime.engine import (Executable, Kernel, Program, Slot, Split, Step, StepTiming, include_dir,
                                  load_module)
from cuvil.runtime.exprs import to_postfix

__all__ = ["Executable", "Kernel", "Program", "ProgramError", "RunError", "Slot", "Split", "Step",
           "StepTiming", "get_num_threads", "include_dir", "load_module", "set_num_threads", "to_postfix"]
