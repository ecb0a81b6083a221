"""Call one compiled kernel from Python with torch tensors (ctypes, the GIL held).

The native runtime is the production path; this is for tests, debugging and the `cuvil-kernel`
tool. Every argument is checked against the kernel's buffer declarations first: a wrong shape,
dtype or layout is a clear error, never a wild write.
"""
from __future__ import annotations

import ctypes
from typing import Sequence

import sympy
import torch

from ..errors import CuvilError, CuvilIndexError
from .jit import CompiledKernels
from .kernel_ir import Kernel

_ABI = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)


def infer_sizes(kernel: Kernel, tensors: Sequence[torch.Tensor]) -> dict[str, int]:
    """Symbol values read off the tensors' shapes (dims that are a bare symbol)."""
    sizes: dict[str, int] = {}
    for buf, t in zip(_parameters(kernel), tensors):
        for d, n in zip(buf.shape, t.shape):
            if isinstance(d, sympy.Symbol):
                sizes.setdefault(d.name, int(n))
    return sizes


def evaluate(expr, sizes: dict[str, int]) -> int:
    if isinstance(expr, int):
        return expr
    missing = {s.name for s in expr.free_symbols} - set(sizes)
    if missing:
        raise CuvilError(f"no value for symbol(s) {', '.join(sorted(missing))}")
    return int(expr.subs({sympy.Symbol(k, integer=True, positive=True): v for k, v in sizes.items()}))


def call_kernel(compiled: CompiledKernels, name: str, tensors: Sequence[torch.Tensor],
                sizes: dict[str, int] | None = None, split: int = 1) -> None:
    """Run kernel `name` on `tensors` (one per input and output buffer, in order; scratch buffers
    and the status word are allocated here). `split` > 1 runs the parallel loop as that many
    consecutive sub-ranges, the way the runtime's threads would. A failed index check raises
    `CuvilIndexError` after the call."""
    kernel = compiled.kernels[name]
    params = _parameters(kernel)
    if len(tensors) != len(params):
        raise CuvilError(f"kernel {name} takes {len(params)} tensors ({', '.join('%' + b.name for b in params)}), "
                         f"got {len(tensors)}")
    sizes = {**infer_sizes(kernel, tensors), **(sizes or {})}
    it = iter(tensors)
    keep, ptrs, status = [], [], None
    for buf in kernel.buffers:
        shape = [evaluate(d, sizes) for d in buf.shape]
        if buf.role == "scratch":
            t = torch.empty(shape, dtype=buf.dtype.torch)
        elif buf.role == "status":
            t = status = torch.zeros(shape, dtype=buf.dtype.torch)
        else:
            t = next(it)
            _check(name, buf, t, shape, sizes)
        keep.append(t)
        ptrs.append(t.data_ptr())
    bufs = (ctypes.c_void_p * max(1, len(ptrs)))(*ptrs)
    values = [evaluate(e, sizes) for e in kernel.dim_exprs]
    fn = _ABI(compiled.address(name))
    if kernel.parallel_loop is None:
        fn(bufs, (ctypes.c_int64 * max(1, len(values)))(*values))
    else:
        extent = values[-1]
        step = max(1, -(-extent // split))
        for begin in range(0, extent, step):
            dims = [begin, min(extent, begin + step)] + values
            fn(bufs, (ctypes.c_int64 * len(dims))(*dims))
    failed = int(status[0]) if status is not None else 0
    if failed:
        bit = (failed & -failed).bit_length() - 1
        raise CuvilIndexError(f"kernel {name}: index check {bit} failed (an index outside its table)")


def _parameters(kernel: Kernel) -> list:
    """The buffers a caller passes: inputs and outputs."""
    return [b for b in kernel.buffers if b.role in ("in", "out")]


def _check(name: str, buf, t: torch.Tensor, shape: list[int], sizes: dict[str, int]) -> None:
    where = f"kernel {name}, buffer %{buf.name}"
    if t.device.type != "cpu":
        raise CuvilError(f"{where}: tensor is on {t.device}, not the CPU")
    if t.dtype != buf.dtype.torch:
        raise CuvilError(f"{where}: expected {buf.dtype.torch}, got {t.dtype}")
    if list(t.shape) != shape:
        raise CuvilError(f"{where}: expected shape {shape}, got {list(t.shape)}")
    strides = [evaluate(s, sizes) for s in buf.element_strides()]
    used = [k for k, n in enumerate(shape) if n > 1]     # the stride of a size-1 dim never matters
    if [t.stride(k) for k in used] != [strides[k] for k in used]:
        raise CuvilError(f"{where}: expected strides {strides}, got {list(t.stride())}")
