"""The BLAS that generated kernels call: OpenBLAS from scipy-openblas32, pinned to one thread.

Cuvil's thread pool decides parallelism, so BLAS must not start its own threads. JIT modules
declare the routines they call (`declare void @scipy_cblas_sgemm(...)`) and bind them to the
addresses given here (llvmlite's `llvm.add_symbol`).
"""
from __future__ import annotations

import ctypes
import functools
import os

import scipy_openblas32

SGEMM = "scipy_cblas_sgemm"
# CBLAS enum values, for kernels that call scipy_cblas_sgemm.
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


@functools.cache
def library() -> ctypes.CDLL:
    """The OpenBLAS shared library, loaded once, set to one thread."""
    path = os.path.join(scipy_openblas32.get_lib_dir(), scipy_openblas32.get_library(fullname=True))
    lib = ctypes.CDLL(path)
    lib.scipy_openblas_set_num_threads(1)
    return lib


def address(name: str) -> int:
    """Address of one exported BLAS routine, e.g. `address(SGEMM)`."""
    try:
        fn = getattr(library(), name)
    except AttributeError:
        raise ValueError(f"BLAS routine '{name}' is not exported by {library()._name}") from None
    return ctypes.cast(fn, ctypes.c_void_p).value
