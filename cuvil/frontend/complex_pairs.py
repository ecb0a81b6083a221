"""Complex numbers as pairs of floats: the exported graph rewritten so that every complex tensor
is a real one with a trailing dim of 2 (real, imaginary), the layout `torch.view_as_real` gives.

Rotary embeddings written the way Meta's Llama code writes them (Llama 4's, and the many that copy
it) multiply by complex numbers: `torch.polar(ones, angles)` or `torch.exp(1j * angles)`, then
`view_as_complex(q.reshape(..., -1, 2)) * freqs` and `view_as_real(...)`. Here `view_as_complex`
and `view_as_real` become nothing, a complex product the four real products it is, and a view of
a complex tensor the same view with the pair dim kept last. A Fourier transform along dims of static
size (FNet's `torch.fft.fftn(x, dim=(1, 2)).real`) is products by its cosine and sine matrices.
The importer then sees real ops only.
Complex parameters and constants are read as their pairs (`as_pairs`). A complex input or output
of the model, and any other op on complex values, is refused by name with its source line.
"""
from __future__ import annotations

import math
from numbers import Number

import torch
from torch.fx import Graph, Node

from ..errors import CuvilUnsupportedOpError
from .fx_edit import LOCATION_META
from .locations import node_frame

aten = torch.ops.aten
Part = Node | Number        # one half of a complex operand: a real tensor, or a number


def is_complex(node) -> bool:
    val = node.meta.get("val") if isinstance(node, Node) else None
    return isinstance(val, torch.Tensor) and val.is_complex()


def as_pairs(tensor: torch.Tensor) -> torch.Tensor:
    """A parameter or constant as the importer reads it: a complex one as its pairs."""
    return torch.view_as_real(tensor).clone() if tensor.is_complex() else tensor


def complex_as_pairs(ep: torch.export.ExportedProgram) -> bool:
    """Rewrite `ep`'s graph in place so that no node holds a complex tensor; whether it had any."""
    graph = ep.graph
    if not any(is_complex(n) for n in graph.nodes):
        return False
    user_inputs = {s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"}
    pairs: dict[Node, Node] = {}        # each complex node -> the real node of its pairs
    joined: dict[Node, tuple] = {}       # pairs made here -> the (real, imaginary) parts they joined
    rewritten = []
    for node in list(graph.nodes):
        if node.op == "placeholder" and is_complex(node):
            if node.name in user_inputs:
                raise CuvilUnsupportedOpError("complex input", None, f"input '{node.name}' is complex; "
                                              f"pass torch.view_as_real({node.name}) and view_as_complex it inside")
            node.meta["val"] = torch.view_as_real(node.meta["val"])     # its tensor: `as_pairs`
            pairs[node] = node
        elif node.op == "call_function" and (is_complex(node) or any(a in pairs for a in node.all_input_nodes)):
            r = _Rewrite(graph, node, pairs, joined)
            rule = _RULES.get(node.target)
            if rule is None:
                r.refuse("Cuvil computes complex numbers as pairs of floats through polar, complex, exp, "
                         "view_as_complex/view_as_real, +, -, *, /, abs, angle, real/imag, fft/ifft/rfft "
                         "and views; not this op")
            new = rule(r, *node.args, **node.kwargs)
            if is_complex(node):
                pairs[node] = new
            elif new is not None:
                node.replace_all_uses_with(new)
            rewritten.append(node)
        elif node.op == "output":
            for out in node.all_input_nodes:
                if out in pairs:
                    frame = node_frame(out)
                    raise CuvilUnsupportedOpError("complex output", str(frame) if frame else None,
                                                  "the model returns a complex tensor; return torch.view_as_real of it")
    for node in reversed(rewritten):
        graph.erase_node(node)
    _select_parts(joined)
    ep.graph_module.recompile()
    return True


def _select_parts(joined: dict[Node, tuple]) -> None:
    """`.real` and `.imag` (a select of the pair dim) of pairs joined here read the part itself, so
    that a part no one reads is not computed (FNet keeps the real part of its transform)."""
    for pair, parts in joined.items():
        last = pair.meta["val"].dim() - 1
        for user in list(pair.users):
            if user.target is aten.select.int and user.args[1] in (-1, last) and \
                    isinstance(part := parts[user.args[2]], Node):
                user.replace_all_uses_with(part)
                user.graph.erase_node(user)


class _Rewrite:
    """The real nodes that stand for one complex-touching node, emitted before it with its source
    location and with torch's result metadata."""

    def __init__(self, graph: Graph, node: Node, pairs: dict[Node, Node], joined: dict[Node, tuple]):
        self.graph, self.node, self.pairs, self.joined = graph, node, pairs, joined

    def refuse(self, detail: str):
        frame = node_frame(self.node)
        target = self.node.target
        name = str(target) if isinstance(target, torch._ops.OpOverload) else getattr(target, "__name__", str(target))
        raise CuvilUnsupportedOpError(name, str(frame) if frame else None, f"on complex values: {detail}")

    def call(self, target, *args) -> Node:
        vals = torch.fx.node.map_arg(args, lambda n: n.meta["val"])
        with self.graph.inserting_before(self.node):
            new = self.graph.call_function(target, args)
        new.meta.update({k: self.node.meta[k] for k in LOCATION_META if k in self.node.meta})
        new.meta["val"] = target(*vals)
        return new

    def complex(self, a) -> bool:
        return isinstance(a, Node) and a in self.pairs

    def pair(self, a) -> Node:
        if not self.complex(a):
            self.refuse(f"operand {a!r} is not complex")
        return self.pairs[a]

    def parts(self, a, numbers: bool = False) -> tuple[Part, Part]:
        """(real, imaginary) of any operand: a complex or real tensor, or a number. A complex
        tensor's parts are tensors, unless `numbers` (the caller folds numbers): then a part it
        was joined from as a number (a real tensor's imaginary part, 0) comes back as the number."""
        if self.complex(a):
            z = self.pairs[a]
            joined = self.joined.get(z)
            if joined is not None and (numbers or all(isinstance(p, Node) for p in joined)):
                return joined
            return self.call(aten.select.int, z, -1, 0), self.call(aten.select.int, z, -1, 1)
        if isinstance(a, complex):
            return a.real, a.imag
        return a, 0

    def join(self, re: Part, im: Part) -> Node:
        """The pairs of (re, im), either of which may be a number when the other is a tensor."""
        parts = re, im
        re = re if isinstance(re, Node) else self.call(aten.full_like.default, im, re)
        im = im if isinstance(im, Node) else self.call(aten.full_like.default, re, im)
        pair = self.call(aten.cat.default, [self.call(aten.unsqueeze.default, re, -1),
                                            self.call(aten.unsqueeze.default, im, -1)], -1)
        if re.meta["val"].shape == im.meta["val"].shape:      # (parts that broadcast are not its parts)
            self.joined[pair] = parts
        return pair

    def dim(self, d: int, rank: int) -> int:
        """Dim `d` of a complex tensor of `rank` dims as a dim of its pairs (the pair dim stays last)."""
        return d + rank if d < 0 else d

    def rank(self) -> int:
        """The complex rank of the node's first operand."""
        return self.node.args[0].meta["val"].dim()


def _binary(op, r: _Rewrite, a: Part, b: Part) -> Part:
    """op(a, b) with numbers folded and adding 0 or multiplying by 1 kept out of the graph (a
    product by 0 stays: an infinite part makes it NaN, as in torch's complex product)."""
    if not isinstance(a, Node) and not isinstance(b, Node):
        return {aten.add.Tensor: a + b, aten.sub.Tensor: a - b, aten.mul.Tensor: a * b}[op]
    if op is aten.mul.Tensor and isinstance(a, Number) and a == 1:
        return b
    if op is aten.mul.Tensor and isinstance(b, Number) and b == 1 or \
            op in (aten.add.Tensor, aten.sub.Tensor) and isinstance(b, Number) and b == 0:
        return a
    if op is aten.add.Tensor and isinstance(a, Number) and a == 0:
        return b
    if op is aten.sub.Tensor and isinstance(a, Number) and a == 0:
        return r.call(aten.neg.default, b)
    if isinstance(a, Number):       # ATen's scalar operand is the second
        return r.call(aten.add.Tensor, r.call(aten.neg.default, b), a) if op is aten.sub.Tensor else r.call(op, b, a)
    return r.call(op, a, b)


def _polar(r: _Rewrite, magnitude, angle):
    return r.join(r.call(aten.mul.Tensor, magnitude, r.call(aten.cos.default, angle)),
                  r.call(aten.mul.Tensor, magnitude, r.call(aten.sin.default, angle)))


def _complex(r: _Rewrite, real, imag):
    return r.join(real, imag)


def _exp(r: _Rewrite, z):
    re, im = r.parts(z)
    return _polar(r, r.call(aten.exp.default, re), im)


def _add(r: _Rewrite, a, b, alpha=1, op=aten.add.Tensor):
    if isinstance(alpha, complex):
        r.refuse("a complex alpha")
    if r.complex(a) and r.complex(b):       # pairs add as pairs
        b = r.pair(b) if alpha == 1 else r.call(aten.mul.Tensor, r.pair(b), alpha)
        return r.call(op, r.pair(a), b)
    (ar, ai), (br, bi) = r.parts(a, numbers=True), r.parts(b, numbers=True)
    mul = aten.mul.Tensor
    br, bi = _binary(mul, r, br, alpha), _binary(mul, r, bi, alpha)
    return r.join(_binary(op, r, ar, br), _binary(op, r, ai, bi))


def _sub(r: _Rewrite, a, b, alpha=1):
    return _add(r, a, b, alpha, aten.sub.Tensor)


def _rsub(r: _Rewrite, a, b, alpha=1):
    return _add(r, b, a, alpha, aten.sub.Tensor)


def _mul(r: _Rewrite, a, b):
    if r.complex(a) != r.complex(b) and not isinstance(b if r.complex(a) else a, complex):
        z, x = (a, b) if r.complex(a) else (b, a)       # a real factor scales both parts
        return r.call(aten.mul.Tensor, r.pair(z), r.call(aten.unsqueeze.default, x, -1) if isinstance(x, Node) else x)
    (ar, ai), (br, bi) = r.parts(a, numbers=True), r.parts(b, numbers=True)
    m = aten.mul.Tensor
    return r.join(_binary(aten.sub.Tensor, r, _binary(m, r, ar, br), _binary(m, r, ai, bi)),
                  _binary(aten.add.Tensor, r, _binary(m, r, ar, bi), _binary(m, r, ai, br)))


def _div(r: _Rewrite, a, b):
    if not r.complex(b) and not isinstance(b, complex):     # by a real divisor: both parts
        return r.call(aten.div.Tensor, r.pair(a), r.call(aten.unsqueeze.default, b, -1) if isinstance(b, Node) else b)
    if not r.complex(b):
        r.refuse("a division by a complex number")
    (ar, ai), (br, bi) = r.parts(a), r.parts(b)
    m = aten.mul.Tensor
    norm = r.call(aten.add.Tensor, r.call(m, br, br), r.call(m, bi, bi))
    re = _binary(aten.add.Tensor, r, _binary(m, r, ar, br), _binary(m, r, ai, bi))
    im = _binary(aten.sub.Tensor, r, _binary(m, r, ai, br), _binary(m, r, ar, bi))
    return r.join(r.call(aten.div.Tensor, re, norm), r.call(aten.div.Tensor, im, norm))


def _neg(r: _Rewrite, z):
    return r.call(aten.neg.default, r.pair(z))


def _conj(r: _Rewrite, z):
    re, im = r.parts(z)
    return r.join(re, r.call(aten.neg.default, im))


def _abs(r: _Rewrite, z):
    re, im = r.parts(z)
    m = aten.mul.Tensor
    return r.call(aten.sqrt.default, r.call(aten.add.Tensor, r.call(m, re, re), r.call(m, im, im)))


def _angle(r: _Rewrite, z):
    re, im = r.parts(z)
    return r.call(aten.atan2.default, im, re)


def _checked(r: _Rewrite, *args, **kwargs):     # torch.export's dtype check on a complex tensor: its pairs are real
    return None


def _view_as_complex(r: _Rewrite, x):
    return x


def _view_as_real(r: _Rewrite, z):
    return r.pair(z)


def _same(r: _Rewrite, z, *rest, **kwargs):      # clone, alias, a copy to the same complex dtype
    if kwargs.get("dtype", r.node.meta["val"].dtype) != r.node.meta["val"].dtype or not r.complex(z):
        return _to_copy(r, z, **kwargs)
    return r.pair(z)


def _to_copy(r: _Rewrite, x, dtype=None, *_, **__):
    val = r.node.meta["val"]
    if not val.is_complex():                    # complex -> real keeps the real part, as torch does
        return _cast(r, r.parts(x)[0], val.dtype)
    real = torch.view_as_real(val).dtype
    if r.complex(x):
        return _cast(r, r.pair(x), real)
    return r.join(_cast(r, x, real), 0)


def _cast(r: _Rewrite, x: Node, dtype: torch.dtype) -> Node:
    if x.meta["val"].dtype == dtype:
        return x
    with r.graph.inserting_before(r.node):
        new = r.graph.call_function(aten._to_copy.default, (x,), {"dtype": dtype})
    new.meta.update({k: r.node.meta[k] for k in LOCATION_META if k in r.node.meta})
    new.meta["val"] = x.meta["val"].to(dtype)
    return new


def _fft_c2c(r: _Rewrite, z, dims, normalization: int, forward: bool):
    return r.join(*_fft_parts(r, *r.parts(z, numbers=True), dims, normalization, forward))


def _fft_parts(r: _Rewrite, re, im, dims, normalization: int, forward: bool) -> tuple[Node, Node]:
    """The discrete Fourier transform along each of `dims` (static sizes), Y_j = sum_k z_k
    e^(-+2 pi i jk/n), by `_dft_along`."""
    re, im = (p if isinstance(p, Node) or p == 0 else r.call(aten.full_like.default, q, p)
              for p, q in ((re, im), (im, re)))
    shape = (re if isinstance(re, Node) else im).meta["val"].shape
    sign = -1.0 if forward else 1.0
    for d in dims:
        if not isinstance(shape[d], int):
            r.refuse(f"a Fourier transform along a dynamic dim ({shape[d]})")
        re, im = _dft_along(r, re, im, d % len(shape), sign)
    scale = {0: 1.0, 1: 1 / math.sqrt(math.prod(shape[d] for d in dims)), 2: 1 / math.prod(shape[d] for d in dims)}
    if scale[normalization] != 1.0:
        m = aten.mul.Tensor
        re, im = r.call(m, re, scale[normalization]), r.call(m, im, scale[normalization])
    return re, im


def _dft_along(r: _Rewrite, re: Part, im: Part, axis: int, sign: float) -> tuple[Node, Node]:
    """The transform along `axis`: the last dim's by `_dft_last`; another's in place, without
    moving it last (a transpose of the whole tensor, the costliest step of FNet's token mixing),
    as products by its matrices from the left, or for a long one in four steps whose inner
    transforms run along the two factors' axes and whose result's two axes swap back (rows of
    the dims after them move whole)."""
    shape = list((re if isinstance(re, Node) else im).meta["val"].shape)
    n = shape[axis]
    if axis == len(shape) - 1:
        return _dft_last(r, re, im, n, sign)
    n1 = _near_root_factor(n) if n > DIRECT_DFT else None
    if n1 is None:
        lead, trail = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
        rows = [r.call(aten.reshape.default, p, [lead, n, trail]) if isinstance(p, Node) else 0 for p in (re, im)]
        return tuple(r.call(aten.reshape.default, p, shape) for p in _dft_products(r, *rows, n, sign, left=True))
    n2 = n // n1
    split = shape[:axis] + [n1, n2] + shape[axis + 1:]
    re, im = (r.call(aten.reshape.default, p, split) if isinstance(p, Node) else 0 for p in (re, im))
    re, im = _dft_along(r, re, im, axis, sign)                        # [..., k1, j2, ...]
    cos, sin = (r.call(aten.reshape.default, t, [n1, n2] + [1] * (len(shape) - axis - 1))
                for t in _unit_angles(r, n1, n2, n, sign))             # e^(-+2 pi i k1 j2/n)
    re, im = _complex_product(r, re, im, cos, sin)
    re, im = _dft_along(r, re, im, axis + 1, sign)                    # [..., k1, k2, ...]
    return tuple(r.call(aten.reshape.default, r.call(aten.transpose.int, p, axis, axis + 1), shape)
                 for p in (re, im))                                    # [..., k2 * n1 + k1, ...]


def _complex_product(r: _Rewrite, re: Node, im: Node, cos: Node, sin: Node) -> tuple[Node, Node]:
    """(re + i im)(cos + i sin), broadcast."""
    m = aten.mul.Tensor
    return (_binary(aten.sub.Tensor, r, r.call(m, re, cos), _binary(m, r, im, sin)),
            _binary(aten.add.Tensor, r, r.call(m, re, sin), _binary(m, r, im, cos)))


DIRECT_DFT = 128     # a transform this long or shorter is one product by its matrix


def _dft_last(r: _Rewrite, re: Part, im: Part, n: int, sign: float) -> tuple[Node, Node]:
    """The transform of length n along the last dim. Up to DIRECT_DFT, or where n has no factors
    near its square root, products by its cosine and sine matrices (n^2 work per row). Longer ones
    split n = n1 n2 (Cooley-Tukey's four steps): with j = j1 n2 + j2 and k = k1 + n1 k2, transforms
    of length n1 over j1, a twiddle e^(-+2 pi i j2 k1/n), transforms of length n2 over j2: n (n1 +
    n2) work per row (FNet's 768 features: 24 x 32, 14x less than 768^2)."""
    n1 = _near_root_factor(n) if n > DIRECT_DFT else None
    if n1 is None:
        return _dft_products(r, re, im, n, sign)
    n2 = n // n1
    lead = list((re if isinstance(re, Node) else im).meta["val"].shape[:-1])

    def regroup(part, sizes):      # [..., a*b] -> [..., b, a] (the last dim's two factors swapped)
        if not isinstance(part, Node):
            return part
        return r.call(aten.transpose.int, r.call(aten.reshape.default, part, lead + sizes), -1, -2)

    re, im = (regroup(p, [n1, n2]) for p in (re, im))                   # [..., j2, j1]
    re, im = _dft_last(r, re, im, n1, sign)                             # [..., j2, k1]
    re, im = _complex_product(r, re, im, *_unit_angles(r, n2, n1, n, sign))   # e^(-+2 pi i j2 k1/n)
    re, im = (r.call(aten.transpose.int, p, -1, -2) for p in (re, im))  # [..., k1, j2]
    re, im = _dft_last(r, re, im, n2, sign)                             # [..., k1, k2]
    return tuple(r.call(aten.reshape.default, r.call(aten.transpose.int, p, -1, -2), lead + [n])
                 for p in (re, im))                                     # [..., k2 * n1 + k1]


def _near_root_factor(n: int) -> int | None:
    """The factor of n nearest its square root from below, if the split is worth it (both >= 4)."""
    f = max(k for k in range(1, math.isqrt(n) + 1) if n % k == 0)
    return f if f >= 4 else None


def _unit_angles(r: _Rewrite, rows: int, cols: int, n: int, sign: float) -> tuple[Node, Node]:
    """cos and sign * sin of 2 pi (jk mod n)/n for j < rows, k < cols: the angles from integer jk,
    so exact before the one rounding of the division. They depend on no input: `fold-constants`
    computes them at compile time."""
    m = aten.mul.Tensor
    j = r.call(aten.unsqueeze.default, r.call(aten.arange.default, rows), 1)
    angle = r.call(m, r.call(aten.remainder.Scalar, r.call(m, j, r.call(aten.arange.default, cols)), n),
                   2 * math.pi / n)
    return r.call(aten.cos.default, angle), r.call(m, r.call(aten.sin.default, angle), sign)


def _dft_products(r: _Rewrite, re: Part, im: Part, n: int, sign: float, left: bool = False) -> tuple[Node, Node]:
    """The transform along the last dim as products by its cosine and sine matrices (with `left`,
    along the next-to-last, the matrices on the left: they are symmetric); a part that is 0 (a
    real input's imaginary part) takes no product."""
    cos, sin = _unit_angles(r, n, n, n, sign)
    products = {(a, b): (r.call(aten.matmul.default, *((mat, part) if left else (part, mat)))
                         if isinstance(part, Node) else 0)
                for a, part in enumerate((re, im)) for b, mat in enumerate((cos, sin))}
    return (_binary(aten.sub.Tensor, r, products[0, 0], products[1, 1]),      # re cos - im sin
            _binary(aten.add.Tensor, r, products[1, 0], products[0, 1]))      # im cos + re sin


def _fft_r2c(r: _Rewrite, x, dims, normalization: int, onesided: bool):
    """A real input's transform; `onesided` keeps the last dim's first n//2 + 1 (the rest mirror them)."""
    re, im = _fft_parts(r, x, 0, dims, normalization, True)
    if onesided:
        last, n = dims[-1], x.meta["val"].shape[dims[-1]]
        re, im = (r.call(aten.slice.Tensor, part, last, 0, n // 2 + 1) for part in (re, im))
    return r.join(re, im)


def _real(r: _Rewrite, z):
    return r.parts(z)[0]


def _imag(r: _Rewrite, z):
    return r.parts(z)[1]


# views and copies: the same op on the pairs, with the pair dim kept last

def _sized(r: _Rewrite, z, size, *rest):       # view, reshape, expand: one more size
    return r.call(r.node.target, r.pair(z), [*size, 2])


def _unsqueeze(r: _Rewrite, z, d):
    return r.call(aten.unsqueeze.default, r.pair(z), r.dim(d, r.rank() + 1))


def _squeeze(r: _Rewrite, z, dims=None):
    shape = z.meta["val"].shape
    dims = [i for i, n in enumerate(shape) if n == 1] if dims is None else \
        [dims] if isinstance(dims, int) else dims
    return r.call(aten.squeeze.dims, r.pair(z), [r.dim(d, r.rank()) for d in dims])


def _permute(r: _Rewrite, z, dims):
    return r.call(aten.permute.default, r.pair(z), [*(r.dim(d, r.rank()) for d in dims), r.rank()])


def _on_dims(*positions: int):
    """An op whose arguments at `positions` are dims (an int or a list) of its first operand."""
    def rewrite(r: _Rewrite, z, *args):
        args = list(args)
        for p in positions:
            if p - 1 < len(args) and args[p - 1] is not None:
                a = args[p - 1]
                args[p - 1] = [r.dim(d, r.rank()) for d in a] if isinstance(a, (list, tuple)) else r.dim(a, r.rank())
        return r.call(r.node.target, r.pair(z), *args)
    return rewrite


def _reduce(r: _Rewrite, z, dims=None, *rest):     # sum, mean: no dims is every dim but the pair's
    dims = [r.dim(d, r.rank()) for d in dims] if dims else list(range(r.rank()))
    return r.call(r.node.target, r.pair(z), dims, *rest)


def _cat(r: _Rewrite, tensors, dim=0):
    pairs = [r.pair(t) if r.complex(t) else r.join(t, 0) for t in tensors]
    return r.call(aten.cat.default, pairs, r.dim(dim, tensors[0].meta["val"].dim()))


def _where(r: _Rewrite, cond, a, b):
    a, b = (r.pair(x) if r.complex(x) else r.join(*r.parts(x)) if isinstance(x, Node) else x for x in (a, b))
    if not isinstance(a, Node) or not isinstance(b, Node):
        r.refuse("a choice between a complex tensor and a number")
    return r.call(aten.where.self, r.call(aten.unsqueeze.default, cond, -1), a, b)


def _zeros_like(r: _Rewrite, z, **_):
    return r.call(aten.zeros_like.default, r.pair(z))


def _full_like(r: _Rewrite, z, fill, **_):
    re, im = r.parts(fill)
    return r.join(r.call(aten.full_like.default, r.parts(z)[0], re), im)


def _index(r: _Rewrite, z, indices):        # indices take the leading dims; the pair dim is not one
    return r.call(aten.index.Tensor, r.pair(z), indices)


def _repeat(r: _Rewrite, z, repeats):
    return r.call(aten.repeat.default, r.pair(z), [*repeats, 1])


_RULES = {
    aten.polar.default: _polar,
    aten.complex.default: _complex,
    aten.exp.default: _exp,
    aten.add.Tensor: _add,
    aten.sub.Tensor: _sub,
    aten.rsub.Scalar: _rsub,
    aten.rsub.Tensor: _rsub,
    aten.mul.Tensor: _mul,
    aten.div.Tensor: _div,
    aten.neg.default: _neg,
    aten._conj.default: _conj,
    aten.conj_physical.default: _conj,
    aten.abs.default: _abs,
    aten.angle.default: _angle,
    aten._assert_tensor_metadata.default: _checked,
    aten.view_as_complex.default: _view_as_complex,
    aten.view_as_real.default: _view_as_real,
    aten._fft_c2c.default: _fft_c2c,
    aten._fft_r2c.default: _fft_r2c,
    aten.real.default: _real,
    aten.imag.default: _imag,
    aten.clone.default: _same,
    aten.alias.default: _same,
    aten._to_copy.default: _to_copy,
    aten.to.dtype: _to_copy,
    aten.to.dtype_layout: _to_copy,
    aten.view.default: _sized,
    aten._unsafe_view.default: _sized,
    aten.reshape.default: _sized,
    aten.expand.default: _sized,
    aten.unsqueeze.default: _unsqueeze,
    aten.squeeze.default: _squeeze,
    aten.squeeze.dim: _squeeze,
    aten.squeeze.dims: _squeeze,
    aten.permute.default: _permute,
    aten.transpose.int: _on_dims(1, 2),
    aten.slice.Tensor: _on_dims(1),
    aten.select.int: _on_dims(1),
    aten.index_select.default: _on_dims(1),
    aten.flip.default: _on_dims(1),
    aten.sum.dim_IntList: _reduce,
    aten.mean.dim: _reduce,
    aten.cat.default: _cat,
    aten.where.self: _where,
    aten.zeros_like.default: _zeros_like,
    aten.full_like.default: _full_like,
    aten.index.Tensor: _index,
    aten.repeat.default: _repeat,
}
