"""The kernel IR: one kernel per fusion group, as loop nests over index spaces.

A kernel has buffer parameters (name, dtype, symbolic shape, optional strides, role), the symbolic
dims it reads, and a body of statements:

- `Loop(var, start, extent, body, parallel)`: `for var in start..start+extent`. At most one loop is
  `parallel`, and only at the top level: the runtime splits its range across threads.
- `Let(var, value)`: names a scalar.
- `Store(buf, index, value)`: writes one element.
- `Check(buf, value)`: an index check; `value` (i32) is 0 where it holds, else the check's bit.
  The kernel's status word `buf` (role `status`) ends the call holding the bits of the checks
  that failed, and the runtime raises the error of the lowest (`program.py`, status slots).
- `Reduce(var, kind, loops, init, body, value)`: folds `value` over the loops' index space with
  `kind` (sum, max, min, prod) starting from `init`; `var` holds the result after the statement,
  so further loops in the same block can use it (softmax, layer norm).
- `Gemm(...)`: one call of the extern single-precision GEMM (row-major).
- `TopK(...)`: one call of the runtime's topk over one row (`native/src/select.h`).

Index expressions (loop bounds, load/store indices, GEMM sizes) are sympy integer expressions over
loop variables and symbols: affine in the common case, with `//`, `%`, `min`, `max` for views and
windows. Scalar expressions are trees of `Const`, `Var`, `Load` (optionally masked), `Index`
(an index expression as an i64 scalar), `Call` (math, compare, select) and `Cast`.

Every statement and expression has an `origin`: the id of the graph op it was lowered from (None
for the kernel's own structure: loops, and kernels parsed from text). The lowering sets it
(`stamp`); the LLVM emitter turns it into debug locations, the report into per-op line ranges. It
is not part of a node's equality, hash or text, so it never changes what code is generated.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

import sympy

from ..errors import CuvilVerifyError
from ..ir.types import DType, Dim, norm_dim, sym
from ..ir.ops.nn import PANEL_WIDTHS
from ..ir.ops.reduction import TOPK_ORDERS
from .index_math import fold_divisions

ROLES = ("in", "out", "scratch", "status", "local")
REDUCE_KINDS = ("sum", "max", "min", "prod")


def loop_var(name: str) -> sympy.Symbol:
    """The sympy symbol of a loop variable (a non-negative integer)."""
    return sympy.Symbol(name, integer=True, nonnegative=True)


def scalar_index(name: str) -> sympy.Symbol:
    """The sympy symbol of an integer scalar used in index expressions (a size read at run time,
    of any sign until clamped)."""
    return sympy.Symbol(name, integer=True)


def as_index(e) -> Dim:
    return norm_dim(e)


def compute_dtype(dt: DType) -> DType:
    """Half-precision values are computed in f32 and rounded when stored."""
    return DType.f32 if dt in (DType.f16, DType.bf16) else dt


# ----------------------------------------------------------------------------- buffers

@dataclass(frozen=True)
class Buffer:
    """A kernel parameter: one pointer in the `bufs` array. `strides=None` means row-major contiguous."""
    name: str
    dtype: DType
    shape: tuple
    role: str = "in"
    strides: tuple | None = None

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"buffer %{self.name}: role must be one of {', '.join(ROLES)}, not '{self.role}'")
        object.__setattr__(self, "shape", tuple(as_index(d) for d in self.shape))
        if self.strides is not None:
            if len(self.strides) != len(self.shape):
                raise ValueError(f"buffer %{self.name}: {len(self.strides)} strides for rank {len(self.shape)}")
            object.__setattr__(self, "strides", tuple(as_index(d) for d in self.strides))

    @property
    def rank(self) -> int:
        return len(self.shape)

    def element_strides(self) -> tuple:
        if self.strides is not None:
            return self.strides
        out, acc = [], sympy.Integer(1)
        for d in reversed(self.shape):
            out.append(as_index(acc))
            acc = acc * d
        return tuple(reversed(out))

    def offset(self, index) -> tuple[Dim, list]:
        """Flat element offset of a multi-dimensional index: (the index-expression part, and
        [(scalar, stride)] for entries that are scalar expressions read from memory)."""
        static, dynamic = sympy.Integer(0), []
        for i, stride in zip(index, self.element_strides()):
            if isinstance(i, Expr):
                dynamic.append((i, stride))
            else:
                static = static + sympy.sympify(i) * stride
        return as_index(fold_divisions(static)), dynamic

    def numel(self) -> Dim:
        n = sympy.Integer(1)
        for d in self.shape:
            n = n * d
        return as_index(n)


# ----------------------------------------------------------------------------- scalar expressions

def _origin():
    return field(default=None, compare=False, repr=False, kw_only=True)


@dataclass(frozen=True)
class Expr:
    """A scalar expression; each kind has a `dtype`, its value type."""
    origin: int | None = _origin()


@dataclass(frozen=True)
class Const(Expr):
    value: Union[int, float, bool]
    dtype: DType

    def __post_init__(self):
        v = self.value
        if self.dtype.is_float:
            v = float(v)
        elif self.dtype == DType.bool:
            v = bool(v)
        else:
            if isinstance(v, float) and not v.is_integer():
                raise ValueError(f"constant {v!r} is not an integer but has type {self.dtype}")
            v = int(v)
        object.__setattr__(self, "value", v)


@dataclass(frozen=True)
class Var(Expr):
    """A scalar defined by `Let` or `Reduce`."""
    name: str
    dtype: DType


@dataclass(frozen=True)
class Load(Expr):
    """`buf[index]`; with a mask, reads only where `mask` is true and gives `other` elsewhere
    (the address is not touched when the mask is false, so out-of-range indices are fine).
    An index entry may also be an integer scalar expression (a gather: `%w[%j, i1]`)."""
    buf: Buffer
    index: tuple
    mask: Expr | None = None
    other: Expr | None = None

    def __post_init__(self):
        object.__setattr__(self, "index", tuple(_load_index(i) for i in self.index))
        if len(self.index) != self.buf.rank:
            raise ValueError(f"%{self.buf.name} has rank {self.buf.rank} but is indexed with {len(self.index)} "
                             f"indices")
        if (self.mask is None) != (self.other is None):
            raise ValueError("a masked load needs both a mask and an 'other' value")
        if self.mask is not None:
            if self.mask.dtype != DType.bool:
                raise ValueError(f"a load mask must be i1, not {self.mask.dtype}")
            if self.other.dtype != self.dtype:
                raise ValueError(f"masked load of %{self.buf.name}: 'other' is {self.other.dtype}, "
                                 f"the buffer is {self.dtype}")

    @property
    def dtype(self) -> DType:
        return self.buf.dtype


def _load_index(i):
    if isinstance(i, Expr):
        if i.dtype not in (DType.i64, DType.i32, DType.i8):
            raise ValueError(f"a scalar used as an index must be an integer, not {i.dtype}")
        return i
    return as_index(i)


@dataclass(frozen=True)
class Index(Expr):
    """The value of an index expression (loop variables, symbols) as an i64 scalar."""
    expr: Dim

    def __post_init__(self):
        object.__setattr__(self, "expr", as_index(self.expr))

    @property
    def dtype(self) -> DType:
        return DType.i64


_FLOAT = frozenset({DType.f32, DType.f16, DType.bf16})
_INT = frozenset({DType.i64, DType.i32, DType.i8})
_NUM = _FLOAT | _INT
_LOGIC = _INT | {DType.bool}
_ANY = _NUM | {DType.bool}


@dataclass(frozen=True)
class FuncSig:
    arity: int
    accepts: frozenset       # dtypes the (non-condition) arguments may have
    result: str              # "same" (the argument dtype) or "bool"


_UNARY_FLOAT = ("exp", "exp_ftz", "log", "log1p", "expm1", "tanh", "erf", "sigmoid", "sqrt", "rsqrt", "sin", "cos", "tan",
                "atan", "asin", "acos", "sinh", "cosh", "asinh", "acosh", "atanh",
                "floor", "ceil", "round", "trunc", "reciprocal")
FUNCS: dict[str, FuncSig] = {
    **{f: FuncSig(1, _FLOAT, "same") for f in _UNARY_FLOAT},
    **{f: FuncSig(1, _NUM, "same") for f in ("neg", "abs", "sign")},
    "not": FuncSig(1, frozenset({DType.bool}), "same"),
    **{f: FuncSig(2, _NUM, "same") for f in ("add", "sub", "mul", "max", "min", "floordiv", "rem", "fmod")},
    **{f: FuncSig(2, _FLOAT, "same") for f in ("div", "pow", "atan2")},
    **{f: FuncSig(2, _LOGIC, "same") for f in ("and", "or", "xor")},
    **{f: FuncSig(2, _ANY, "bool") for f in ("eq", "ne", "lt", "le", "gt", "ge")},
    "select": FuncSig(3, _ANY, "same"),
    "fma": FuncSig(3, _FLOAT, "same"),      # a * b + c, rounded once
}


@dataclass(frozen=True)
class Call(Expr):
    """A scalar function of its arguments; the signatures are in `FUNCS`.
    `select(cond, a, b)` takes an i1 condition; the other functions need equal argument dtypes."""
    fn: str
    args: tuple

    def __post_init__(self):
        object.__setattr__(self, "args", tuple(self.args))
        sig = FUNCS.get(self.fn)
        if sig is None:
            raise ValueError(f"unknown scalar function '{self.fn}'")
        if len(self.args) != sig.arity:
            raise ValueError(f"{self.fn} takes {sig.arity} argument(s), got {len(self.args)}")
        args = self.args
        if self.fn == "select":
            if args[0].dtype != DType.bool:
                raise ValueError(f"select: the condition must be i1, not {args[0].dtype}")
            args = args[1:]
        dts = {a.dtype for a in args}
        if len(dts) != 1:
            raise ValueError(f"{self.fn}: arguments have different dtypes "
                             f"({', '.join(str(a.dtype) for a in args)}); insert a cast")
        if args[0].dtype not in sig.accepts:
            raise ValueError(f"{self.fn} does not accept {args[0].dtype}")

    @property
    def dtype(self) -> DType:
        if FUNCS[self.fn].result == "bool":
            return DType.bool
        return self.args[-1].dtype


@dataclass(frozen=True)
class Cast(Expr):
    value: Expr
    dtype: DType


# ----------------------------------------------------------------------------- statements

@dataclass
class Stmt:
    origin: int | None = _origin()


@dataclass
class Let(Stmt):
    var: Var
    value: Expr

    def __post_init__(self):
        if self.var.dtype != self.value.dtype:
            raise ValueError(f"%{self.var.name} is {self.var.dtype} but its value is {self.value.dtype}")


@dataclass
class Store(Stmt):
    buf: Buffer
    index: tuple
    value: Expr

    def __post_init__(self):
        self.index = tuple(as_index(i) for i in self.index)
        if len(self.index) != self.buf.rank:
            raise ValueError(f"%{self.buf.name} has rank {self.buf.rank} but is indexed with {len(self.index)} "
                             f"indices")
        if self.value.dtype != self.buf.dtype:
            raise ValueError(f"storing a {self.value.dtype} value into %{self.buf.name} of {self.buf.dtype}")


class Check(Store):
    """`buf[0] = or(buf[0], value)` on the kernel's status word (a Store to every pass that walks
    stores: its value is an expression like any other)."""

    def __init__(self, buf: Buffer, value: Expr):
        super().__init__(buf, (0,), value)
        if buf.role != "status" or buf.dtype != DType.i32:
            raise ValueError(f"a check writes the kernel's status word (an i32 buffer of role status), "
                             f"not %{buf.name}")


@dataclass
class Loop(Stmt):
    var: str
    start: Dim
    extent: Dim
    body: list = field(default_factory=list)
    parallel: bool = False

    def __post_init__(self):
        self.start, self.extent = as_index(self.start), as_index(self.extent)


@dataclass(frozen=True)
class Range:
    """One loop of a reduction: `var in start..start+extent`."""
    var: str
    start: Dim
    extent: Dim

    def __post_init__(self):
        object.__setattr__(self, "start", as_index(self.start))
        object.__setattr__(self, "extent", as_index(self.extent))


REDUCE_IDENTITY = {"sum": 0, "prod": 1, "max": float("-inf"), "min": float("inf")}


def identity(kind: str, dtype: DType) -> Const:
    """The neutral start value of a reduction (the dtype's extreme for integer max/min)."""
    v = REDUCE_IDENTITY[kind]
    if not dtype.is_float and kind in ("max", "min"):
        bits = {DType.i64: 63, DType.i32: 31, DType.i8: 7}.get(dtype)
        if bits is None:
            return Const(kind == "min", dtype)
        v = -(1 << bits) if kind == "max" else (1 << bits) - 1
    return Const(v, dtype)


@dataclass
class Reduce(Stmt):
    """`var = fold(kind, init, [value for loops])`; `body` computes per-iteration scalars for `value`."""
    var: Var
    kind: str
    loops: tuple
    init: Expr
    body: list
    value: Expr

    def __post_init__(self):
        self.loops = tuple(self.loops)
        if self.kind not in REDUCE_KINDS:
            raise ValueError(f"unknown reduction '{self.kind}' (expected {', '.join(REDUCE_KINDS)})")
        if not self.loops:
            raise ValueError("a reduction needs at least one loop")
        for what, e in (("init", self.init), ("value", self.value)):
            if e.dtype != self.var.dtype:
                raise ValueError(f"reduction %{self.var.name} is {self.var.dtype} but its {what} is {e.dtype}")


@dataclass(frozen=True)
class BufRef:
    """A buffer plus an element offset: the base pointer of a GEMM operand."""
    buf: Buffer
    offset: Dim = 0

    def __post_init__(self):
        object.__setattr__(self, "offset", as_index(self.offset))


GEMM_INTS = ("m", "n", "k", "lda", "ldb", "ldc")
GEMM_WINDOW = ("a_rows", "a_rows_stride", "k_run", "k_run_stride")
GEMM_TAPS = ("k_row_runs", "k_run_step")      # a dilated window's runs: see Gemm
GEMM_EPILOGUE = ("bias", "relu", "bias_rows")


@dataclass
class Gemm(Stmt):
    """C[m,n] = alpha * op(A)[m,k] @ op(B)[k,n] + beta * C, row-major f32 (cblas_sgemm).

    With `b_panels` (a width from PANEL_WIDTHS; 0 for a plain B), B is pre-packed in panels of
    that many columns (`panel_gemm.py`; `b` points at the first panel the call uses, `ldb` is
    unused) and the call is C = A @ B. Such a call may read A through a window, all four of
    GEMM_WINDOW given: A[r][kk] = a[(r / a_rows) * a_rows_stride + (r % a_rows) * lda +
    (j / k_row_runs) * k_run_stride + (j % k_row_runs) * k_run_step + kk % k_run] with
    j = kk / k_run (a convolution as an implicit GEMM: k_row_runs runs of k_run floats per kernel
    row, k_run_step apart, a dilated row's taps; one run per row unless GEMM_TAPS say). It may also
    finish C in registers before storing it (GEMM_EPILOGUE): add `bias`, a vector of n floats
    (C[i, j] += bias[j]; with `bias_rows`, m floats: C[i, j] += bias[i]), then `relu`
    (C = maximum(C, 0), NaN kept), in that order."""
    c: BufRef
    a: BufRef
    b: BufRef
    m: Dim
    n: Dim
    k: Dim
    lda: Dim
    ldb: Dim
    ldc: Dim
    trans_a: bool = False
    trans_b: bool = False
    alpha: float = 1.0
    beta: float = 0.0
    b_panels: int = 0
    a_rows: Dim | None = None
    a_rows_stride: Dim | None = None
    k_run: Dim | None = None
    k_run_stride: Dim | None = None
    k_row_runs: Dim = 1
    k_run_step: Dim = 0
    bias: BufRef | None = None
    relu: bool = False
    bias_rows: bool = False

    def __post_init__(self):
        if self.b_panels not in (0, *PANEL_WIDTHS):
            raise ValueError(f"b_panels must be 0 or a panel width in {PANEL_WIDTHS}, not {self.b_panels}")
        if self.b_panels and (self.trans_a or self.trans_b or self.alpha != 1.0 or self.beta != 0.0):
            raise ValueError("a gemm with b_panels computes C = A @ B: no transposes, alpha 1, beta 0")
        window = [getattr(self, f) is not None for f in GEMM_WINDOW]
        if any(window) and not (all(window) and self.b_panels):
            raise ValueError(f"a windowed A needs all of {', '.join(GEMM_WINDOW)} and b_panels")
        for name in GEMM_INTS + GEMM_TAPS + (GEMM_WINDOW if all(window) else ()):
            setattr(self, name, as_index(getattr(self, name)))
        if self.dilated and not all(window):
            raise ValueError(f"{' and '.join(GEMM_TAPS)} describe a windowed A: give {', '.join(GEMM_WINDOW)} too")
        if (self.bias is not None or self.relu) and not self.b_panels:
            raise ValueError(f"only a gemm with b_panels applies {' and '.join(GEMM_EPILOGUE[:2])} in registers")
        if self.bias_rows and self.bias is None:
            raise ValueError("bias_rows says how a bias is added: give bias too")
        for name in self.operand_names:
            ref = getattr(self, name)
            if ref.buf.dtype != DType.f32:
                raise ValueError(f"gemm operand {name}=%{ref.buf.name} must be f32, not {ref.buf.dtype}")
        self.alpha, self.beta = float(self.alpha), float(self.beta)

    @property
    def index_fields(self) -> tuple[str, ...]:
        """The names of the integer fields in use (sizes, strides, the window's)."""
        return GEMM_INTS + (GEMM_WINDOW + GEMM_TAPS if self.a_rows is not None else ())

    @property
    def dilated(self) -> bool:
        """A window of more than one run per kernel row (GEMM_TAPS other than 1 and 0)."""
        return sympy.sympify(self.k_row_runs) != 1 or sympy.sympify(self.k_run_step) != 0

    @property
    def operand_names(self) -> tuple[str, ...]:
        """The buffer operands: c, a, b, and bias when there is one."""
        return ("c", "a", "b") + (("bias",) if self.bias is not None else ())


TOPK_DTYPES = (DType.f32, DType.i64, DType.i32, DType.i8)    # the runtime's cuvil_topk_<dtype>
TOPK_INTS = ("n", "stride", "k", "dst_stride")


# the runtime's mode bit of each order of equal values (`cuvil.argtopk`'s; native/src/select.h)
TOPK_ORDER_BITS = dict(zip(TOPK_ORDERS, (0, 2, 4, 8)))


@dataclass
class TopK(Stmt):
    """dst[j * dst_stride] for j < k = the index of the j-th element of the row src[i * stride],
    i < n: the largest first (the smallest with `largest` false), NaN above every number, equal
    values as `order` says (`cuvil.argtopk`'s; `kthvalue` writes dst[0] alone, the k-th smallest).
    One call of the runtime's `cuvil_topk_<dtype>`."""
    dst: BufRef
    src: BufRef
    n: Dim
    stride: Dim
    k: Dim
    dst_stride: Dim
    largest: bool = True
    order: str = "stable"

    def __post_init__(self):
        for name in TOPK_INTS:
            setattr(self, name, as_index(getattr(self, name)))
        if self.order not in TOPK_ORDER_BITS:
            raise ValueError(f"topk order must be one of {', '.join(TOPK_ORDERS)}, not {self.order!r}")
        if self.dst.buf.dtype != DType.i64:
            raise ValueError(f"topk writes i64 indices, not {self.dst.buf.dtype} (%{self.dst.buf.name})")
        if self.src.buf.dtype not in TOPK_DTYPES:
            raise ValueError(f"topk reads {', '.join(d.value for d in TOPK_DTYPES)}, not {self.src.buf.dtype} "
                             f"(%{self.src.buf.name})")

    @property
    def symbol(self) -> str:
        return f"cuvil_topk_{self.src.buf.dtype.value}"

    @property
    def mode(self) -> int:
        """The runtime's mode argument: CUVIL_TOPK_LARGEST and the order's bit."""
        return int(self.largest) | TOPK_ORDER_BITS[self.order]


# ----------------------------------------------------------------------------- kernels

@dataclass
class Kernel:
    """One generated function `void name(char **bufs, const int64_t *dims)`.

    `bufs[i]` is `buffers[i]`. `locals` are buffers of role "local", not parameters: each call of
    the function (a thread's range of the parallel loop) has its own, on its stack, of a size
    known at compile time, so that the iterations of one call reuse one copy while it is in cache
    (a scratch buffer has a region per iteration, all of them in the arena).

    A kernel with a parallel loop is *splittable*: it gets `dims = [begin, end, *dim_values]` and
    runs iterations [begin, end) of `0..parallel_extent` (relative to the loop's start). Any other
    kernel gets `dims = dim_values`. `dim_values` are the values of `dim_exprs`: the symbols in
    order, then, for a splittable kernel, the parallel extent (so the runtime finds the range to
    split among the dims it passes).
    """
    name: str
    buffers: list
    symbols: list
    body: list
    locals: list = field(default_factory=list)

    @property
    def parallel_loop(self) -> Loop | None:
        for s in self.body:
            if isinstance(s, Loop) and s.parallel:
                return s
        return None

    @property
    def parallel_extent(self) -> Dim | None:
        """The number of iterations the runtime may split across threads (None: run it whole)."""
        loop = self.parallel_loop
        return None if loop is None else loop.extent

    @property
    def dim_exprs(self) -> list:
        exprs = [sym(s) for s in self.symbols]
        if self.parallel_loop is not None:
            exprs.append(self.parallel_extent)
        return exprs

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)


def free_symbols(e) -> set[str]:
    return set() if isinstance(e, int) else {s.name for s in sympy.sympify(e).free_symbols}


def symbol(name: str) -> sympy.Symbol:
    return sym(name)


# ----------------------------------------------------------------------------- verifier

def verify_kernel(k: Kernel) -> None:
    """Check scoping and placement rules the constructors cannot see; raises CuvilVerifyError."""
    _KernelVerifier(k).run()


class _KernelVerifier:
    def __init__(self, k: Kernel):
        self.k = k
        self.buffers = {b.name: b for b in k.buffers + k.locals}
        self.symbols = set(k.symbols)

    def fail(self, msg: str):
        return CuvilVerifyError(f"kernel @{self.k.name}: {msg}")

    def run(self) -> None:
        if len(self.buffers) != len(self.k.buffers) + len(self.k.locals):
            raise self.fail("two buffers have the same name")
        for b in self.k.buffers:
            if b.role == "local":
                raise self.fail(f"%{b.name} is a local buffer among the parameters")
            for d in b.shape + (b.strides or ()):
                self.index(d, set(), f"the shape of %{b.name}")
        for b in self.k.locals:
            if b.role != "local" or b.strides is not None or not all(isinstance(d, int) for d in b.shape):
                raise self.fail(f"local buffer %{b.name} needs role local, no strides and a static shape")
        parallel = [s for s in self.k.body if isinstance(s, Loop) and s.parallel]
        if len(parallel) > 1:
            raise self.fail("more than one parallel loop")
        self.block(self.k.body, set(), set(), top=True)

    def index(self, e, loops: set[str], where: str) -> None:
        unknown = free_symbols(e) - loops - self.symbols
        if unknown:
            raise self.fail(f"{where} uses {', '.join(sorted(unknown))}, which is neither a loop variable in "
                            f"scope, an integer scalar defined before it, nor a kernel symbol")

    def buffer(self, b: Buffer, where: str) -> None:
        if self.buffers.get(b.name) != b:
            raise self.fail(f"{where} refers to %{b.name}, which is not a buffer of this kernel")

    def block(self, stmts, loops: set[str], scalars: set[str], top: bool = False) -> None:
        scalars = set(scalars)
        for s in stmts:
            if isinstance(s, Loop):
                if s.parallel and not top:
                    raise self.fail(f"parallel loop {s.var} is not at the top level")
                self.index(s.start, loops | scalars, f"the start of loop {s.var}")
                self.index(s.extent, loops | scalars, f"the extent of loop {s.var}")
                self.define_loop(s.var, loops)
                self.block(s.body, loops | {s.var}, scalars)
            elif isinstance(s, Let):
                self.expr(s.value, loops, scalars)
                self.define_scalar(s.var.name, scalars)
            elif isinstance(s, Store):
                self.buffer(s.buf, "a store")
                if s.buf.role == "in":
                    raise self.fail(f"stores into input buffer %{s.buf.name}")
                for i in s.index:
                    self.index(i, loops | scalars, f"a store into %{s.buf.name}")
                self.expr(s.value, loops, scalars)
            elif isinstance(s, Reduce):
                self.expr(s.init, loops, scalars)
                inner = set(loops)
                for r in s.loops:
                    self.index(r.start, inner, f"the start of reduction loop {r.var}")
                    self.index(r.extent, inner, f"the extent of reduction loop {r.var}")
                    self.define_loop(r.var, inner)
                    inner.add(r.var)
                body_scalars = set(scalars)
                self.block(s.body, inner, body_scalars)
                self.expr(s.value, inner, body_scalars | _defined(s.body))
                self.define_scalar(s.var.name, scalars)
            elif isinstance(s, Gemm):
                for name in s.operand_names:
                    ref = getattr(s, name)
                    self.buffer(ref.buf, f"gemm operand {name}")
                    self.index(ref.offset, loops | scalars, f"the offset of gemm operand {name}")
                if s.c.buf.role == "in":
                    raise self.fail(f"gemm writes into input buffer %{s.c.buf.name}")
                if s.bias is not None and s.bias.buf.strides is not None:
                    raise self.fail(f"gemm bias %{s.bias.buf.name} must be a contiguous buffer")
                for f in s.index_fields:
                    self.index(getattr(s, f), loops | scalars, f"gemm {f}")
            elif isinstance(s, TopK):
                for name in ("dst", "src"):
                    ref = getattr(s, name)
                    self.buffer(ref.buf, f"topk operand {name}")
                    self.index(ref.offset, loops, f"the offset of topk operand {name}")
                if s.dst.buf.role == "in":
                    raise self.fail(f"topk writes into input buffer %{s.dst.buf.name}")
                for f in TOPK_INTS:
                    self.index(getattr(s, f), loops, f"topk {f}")
            else:
                raise self.fail(f"unknown statement {s!r}")

    def define_loop(self, var: str, loops: set[str]) -> None:
        if var in loops or var in self.symbols:
            raise self.fail(f"loop variable {var} shadows an enclosing loop or a symbol")

    def define_scalar(self, name: str, scalars: set[str]) -> None:
        if name in scalars:
            raise self.fail(f"%{name} is defined twice")
        scalars.add(name)

    def expr(self, e: Expr, loops: set[str], scalars: set[str]) -> None:
        if isinstance(e, Var):
            if e.name not in scalars:
                raise self.fail(f"%{e.name} is used before it is defined")
        elif isinstance(e, Load):
            self.buffer(e.buf, "a load")
            for i in e.index:
                if isinstance(i, Expr):
                    self.expr(i, loops, scalars)
                else:
                    self.index(i, loops | scalars, f"a load from %{e.buf.name}")
            for sub in (e.mask, e.other):
                if sub is not None:
                    self.expr(sub, loops, scalars)
        elif isinstance(e, Index):
            self.index(e.expr, loops | scalars, "index(...)")
        elif isinstance(e, Call):
            for a in e.args:
                self.expr(a, loops, scalars)
        elif isinstance(e, Cast):
            self.expr(e.value, loops, scalars)


def _defined(stmts) -> set[str]:
    return {s.var.name for s in stmts if isinstance(s, (Let, Reduce))}


def index_names(stmts) -> set[str]:
    """Every name (symbol or loop variable) used by the index expressions of `stmts`, but the
    integer scalars they define (a size read at run time: `grouped_matmul`'s rows)."""
    out: set[str] = set()
    scalars: set[str] = set()

    def expr(e):
        if isinstance(e, Load):
            for i in e.index:
                if isinstance(i, Expr):
                    expr(i)
                else:
                    out.update(free_symbols(i))
            for sub in (e.mask, e.other):
                if sub is not None:
                    expr(sub)
        elif isinstance(e, Index):
            out.update(free_symbols(e.expr))
        elif isinstance(e, Call):
            for a in e.args:
                expr(a)
        elif isinstance(e, Cast):
            expr(e.value)

    def block(ss):
        for s in ss:
            if isinstance(s, Loop):
                out.update(free_symbols(s.start) | free_symbols(s.extent))
                block(s.body)
            elif isinstance(s, Reduce):
                for r in s.loops:
                    out.update(free_symbols(r.start) | free_symbols(r.extent))
                expr(s.init)
                block(s.body)
                expr(s.value)
            elif isinstance(s, (Let, Store)):
                if isinstance(s, Let):
                    scalars.add(s.var.name)
                if isinstance(s, Store):
                    for i in s.index:
                        out.update(free_symbols(i))
                expr(s.value)
            elif isinstance(s, Gemm):
                for f in s.index_fields:
                    out.update(free_symbols(getattr(s, f)))
                for name in s.operand_names:
                    out.update(free_symbols(getattr(s, name).offset))
            elif isinstance(s, TopK):
                for f in TOPK_INTS:
                    out.update(free_symbols(getattr(s, f)))
                out.update(free_symbols(s.dst.offset) | free_symbols(s.src.offset))
    block(stmts)
    return out - scalars


# ----------------------------------------------------------------------------- origins

def operands(e: Expr) -> list[Expr]:
    """The scalar expressions directly under `e`, in the order they print."""
    if isinstance(e, Load):
        inner = [i for i in e.index if isinstance(i, Expr)]
        return inner + ([e.mask, e.other] if e.mask is not None else [])
    if isinstance(e, Call):
        return list(e.args)
    if isinstance(e, Cast):
        return [e.value]
    return []


def stamp(nodes, origin: int) -> None:
    """Give `origin` (a graph op id) to every statement and expression under `nodes` that has none.
    A node that has one keeps it, and so does everything under it (it was stamped as a whole), so
    stamping what each op built right after it built it, operands first, attributes every node to
    the innermost op that built it. Loops stay the kernel's own."""
    for n in nodes:
        if n.origin is not None:
            continue
        if isinstance(n, Loop):
            stamp(n.body, origin)
            continue
        object.__setattr__(n, "origin", origin)    # frozen expressions too: origin is not part of their value
        if isinstance(n, Expr):
            stamp(operands(n), origin)
        elif isinstance(n, (Let, Store)):
            stamp([n.value], origin)
        elif isinstance(n, Reduce):
            stamp([n.init, *n.body, n.value], origin)
