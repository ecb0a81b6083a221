"""Which output of a kernel may be written over one of its inputs (in-place reuse).

An output O may take the memory of an input I when every element of O is computed only from the
element of I at the same position, read before it is written:
- the kernel has exactly one `Store`, to O, and touches O nowhere else;
- I is touched only by `Load`s at the store's index, with no data-dependent index;
- O and I have the same dtype and shape, and both are contiguous.

Then each iteration reads I[i] and writes O[i] (the stored value depends on the load, so the load
comes first even with `noalias` on the kernel's arguments), and no iteration, in any thread, reads
an element another iteration wrote. Anything else that names a buffer (a GEMM operand, a statement
kind this module does not know) makes the buffer ineligible.
"""
from __future__ import annotations

import dataclasses

from ..ir.types import dims_equal
from .kernel_ir import Buffer, Expr, Kernel, Load, Store


def inplace_candidates(kernel: Kernel) -> dict[str, list[str]]:
    """Output buffer name -> the input buffers it may share memory with (empty when none)."""
    refs: list[tuple[str, str, tuple | None]] = []
    _collect(kernel.body, refs)
    stores = [r for r in refs if r[0] == "store"]
    if len(stores) != 1:
        return {}
    _, out_name, index = stores[0]
    if any(name == out_name for kind, name, _ in refs if kind != "store") or any(isinstance(i, Expr) for i in index):
        return {}
    out = kernel.buffer(out_name)
    found = []
    for buf in kernel.buffers:
        if buf.role != "in" or not _same_layout(buf, out):
            continue
        uses = [(kind, idx) for kind, name, idx in refs if name == buf.name]
        if uses and all(kind == "load" and idx == index for kind, idx in uses):
            found.append(buf.name)
    return {out_name: found} if found else {}


def _same_layout(a: Buffer, b: Buffer) -> bool:
    return (a.dtype == b.dtype and a.strides is None and b.strides is None and len(a.shape) == len(b.shape)
            and all(map(dims_equal, a.shape, b.shape)))


def _collect(node, refs: list) -> None:
    """Every reference to a buffer under `node`: ("load" | "store" | "other", buffer name, index)."""
    if isinstance(node, Load):
        refs.append(("load", node.buf.name, node.index))
        _collect([node.index, node.mask, node.other], refs)
    elif isinstance(node, Store):
        refs.append(("store", node.buf.name, node.index))
        _collect([node.index, node.value], refs)
    elif isinstance(node, Buffer):
        refs.append(("other", node.name, None))
    elif isinstance(node, (list, tuple)):
        for x in node:
            _collect(x, refs)
    elif dataclasses.is_dataclass(node) and not isinstance(node, type):
        for f in dataclasses.fields(node):
            _collect(getattr(node, f.name), refs)
