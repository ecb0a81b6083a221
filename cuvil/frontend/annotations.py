"""String annotations on a plain function's parameters as shape hints: `def f(x: "f32[B,512]")`.

A named dim (`B`) is dynamic and shared by every parameter that uses the same name; an integer
dim is static. The annotations give the dynamic hints, and when no example inputs are passed,
they also give the examples (random data, distinct sizes for distinct symbols).
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass

import torch

from ..errors import CuvilError
from ..ir import DType

_ANNOTATION = re.compile(r"\s*(?P<dtype>[a-z0-9]+)\s*\[(?P<dims>[^\]]*)\]\s*")
# where a string annotation reads as a shape rather than a type hint (`Optional[torch.Tensor]`,
# `list[int]`, `Unpack[Kwargs]` under `from __future__ import annotations` are type hints)
_LOOKS_LIKE_SHAPE = re.compile(r"\s*(?:bool|b?f[0-9]+|[iu][0-9]+)\s*\[")
_DIM = re.compile(r"\s*(?:(?P<int>[0-9]+)|(?P<name>[A-Za-z_][A-Za-z_0-9]*))\s*")
_DTYPE_ALIASES = {"bool": "i1"}
_EXAMPLE_SIZES = (3, 5, 7, 11, 13, 17, 19, 23)   # distinct, and never 0/1 (torch specialises those)


@dataclass(frozen=True)
class TensorAnnotation:
    dtype: DType
    dims: tuple            # int (static) or str (symbol name)

    def hints(self) -> dict[int, str]:
        return {i: d for i, d in enumerate(self.dims) if isinstance(d, str)}

    def example(self, sizes: dict[str, int]) -> torch.Tensor:
        shape = [sizes[d] if isinstance(d, str) else d for d in self.dims]
        if self.dtype.is_float:
            return torch.randn(shape, dtype=self.dtype.torch)
        if self.dtype is DType.bool:
            return torch.ones(shape, dtype=torch.bool)
        return torch.zeros(shape, dtype=self.dtype.torch)


def parse_annotation(text: str, where: str = "annotation") -> TensorAnnotation:
    """Parse `"f32[B,512]"`; `where` names the parameter in error messages."""
    m = _ANNOTATION.fullmatch(text)
    if m is None:
        raise CuvilError(f"{where}: cannot read shape annotation {text!r}; expected e.g. \"f32[B,512]\"")
    name = _DTYPE_ALIASES.get(m["dtype"], m["dtype"])
    try:
        dtype = DType.from_name(name)
    except KeyError:
        raise CuvilError(f"{where}: unknown dtype {m['dtype']!r} in {text!r} "
                         f"(known: {', '.join(d.value for d in DType)})") from None
    dims = []
    for part in m["dims"].split(",") if m["dims"].strip() else []:
        d = _DIM.fullmatch(part)
        if d is None:
            raise CuvilError(f"{where}: dimension {part.strip()!r} in {text!r} is neither an integer nor a name")
        dims.append(int(d["int"]) if d["int"] else d["name"])
    return TensorAnnotation(dtype, tuple(dims))


def signature(fn) -> inspect.Signature:
    """fn's signature; a builtin without one (torch.exp) takes its arguments as `*args`."""
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return inspect.Signature([inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL)])


def function_annotations(fn) -> dict[str, TensorAnnotation]:
    """The parameters of `fn` annotated with shape strings, in order; other parameters are skipped."""
    out = {}
    for name, p in signature(fn).parameters.items():
        if isinstance(p.annotation, str) and _LOOKS_LIKE_SHAPE.match(p.annotation):
            out[name] = parse_annotation(p.annotation, f"parameter '{name}' of {getattr(fn, '__name__', fn)}")
    return out


def examples_from_annotations(annotations: dict[str, TensorAnnotation],
                              ranges: dict[str, tuple[int, int]]) -> tuple[torch.Tensor, ...]:
    """Example inputs for fully annotated parameters, each symbol bound to its own size."""
    sizes: dict[str, int] = {}
    for ann in annotations.values():
        for d in ann.dims:
            if isinstance(d, str) and d not in sizes:
                lo, hi = ranges.get(d, (2, 1 << 30))
                sizes[d] = min(max(_EXAMPLE_SIZES[len(sizes) % len(_EXAMPLE_SIZES)], lo, 2), hi)
    return tuple(ann.example(sizes) for ann in annotations.values())


def check_example(name: str, ann: TensorAnnotation, value) -> None:
    """An example input must agree with its annotation's dtype, rank and static dims."""
    if not isinstance(value, torch.Tensor):
        raise CuvilError(f"parameter '{name}' is annotated {_fmt(ann)} but its example is a {type(value).__name__}")
    problem = None
    if value.dtype != ann.dtype.torch:
        problem = f"dtype {value.dtype}"
    elif value.dim() != len(ann.dims):
        problem = f"rank {value.dim()}"
    else:
        for i, (d, n) in enumerate(zip(ann.dims, value.shape)):
            if isinstance(d, int) and d != n:
                problem = f"size {n} in dim {i}"
    if problem:
        raise CuvilError(f"parameter '{name}' is annotated {_fmt(ann)} but its example has {problem} "
                         f"(shape {list(value.shape)}, {value.dtype})")


def _fmt(ann: TensorAnnotation) -> str:
    return f'"{ann.dtype}[{",".join(map(str, ann.dims))}]"'
